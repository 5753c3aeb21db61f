"""A bench killed with SIGTERM (a CI runner's cancel, `timeout`) stops its Temporal dev server too.

The dev server is a child process that outlives a killed parent: before bench/_dev_server.py, every killed
bench run left one running."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

from tests.helpers import alive, assert_eventually

REPO = Path(__file__).resolve().parents[2]

BENCH = """
import asyncio, pathlib
from bench._dev_server import dev_server

async def main():
    async with dev_server():
        kids = [k for t in pathlib.Path("/proc/self/task").iterdir() for k in (t / "children").read_text().split()]
        print("server", *kids, flush=True)
        await asyncio.sleep(300)  # a long bench run

asyncio.run(main())
"""


async def test_sigterm_to_a_bench_stops_its_dev_server() -> None:
    servers: list[int] = []
    bench = subprocess.Popen([sys.executable, "-c", BENCH], cwd=REPO, stdout=subprocess.PIPE, text=True,
                             env={**os.environ, "PYTHONPATH": str(REPO)})
    try:
        line = bench.stdout.readline().split()  # type: ignore[union-attr]
        assert line[:1] == ["server"] and len(line) > 1, f"the bench did not start its dev server: {line}"
        servers += [int(p) for p in line[1:]]
        assert all(alive(p) for p in servers)
        bench.send_signal(signal.SIGTERM)
        bench.wait(timeout=60)
        await assert_eventually(lambda: not any(alive(p) for p in servers), timeout=30,
                                message=f"dev server {servers} still running after its bench was sent SIGTERM")
    finally:
        bench.kill()
        bench.wait()
        for pid in filter(alive, servers):  # an orphan from a failed run
            os.kill(pid, signal.SIGKILL)
