"""The scale-out of issue 27 as a benchmark: a docker fleet whose containers worker is SIGKILLed
mid-fleet; every (row, attempt) container the engine started more than once must be reported as a
rerun, every row gets its verdict, nothing is left behind.

What runs: the embedded Temporal dev server (what `fleetforge dev --no-worker` serves), three real
`worker.py` processes on split queues (workflows / containers / llm,toolchain,kernels), a `--rows`-row
fleet on the docker runner (`--concurrency` rows at a time, a CPU-only profile, the OpenAI-shaped test
image of tests/conftest.py built with busybox + docker import). `docker events`, started before the
fleet and filtered on the fleet's label, is the judge. Once `--kill-after` rows have finished, the
containers worker is SIGKILLed (with its process group: the `docker run` clients it started live in
sessions of their own and survive, as in a real crash) and a fresh one is started.

Prints: verdicts, Yes count, containers started twice (engine), invisible reruns (engine says
started N times, the verdict says fewer), containers left behind, wall time. Exit 0 when every row has
a verdict, no rerun is invisible and nothing is left.

    .venv/bin/python -m bench.bench_fleet_scaleout                # 120 rows, concurrency 8, kill after 30
    .venv/bin/python -m bench.bench_fleet_scaleout --rows 40 --kill-after 10
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import csv
import io
import os
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

from bench._dev_server import dev_server

REPO = Path(__file__).resolve().parents[1]


def build_image() -> str:
    """The model-server test image of tests/conftest.py (same tag; built only when missing)."""
    from tests.conftest import MODEL_SERVER_IMAGE, import_model_server_image

    if subprocess.run(["docker", "image", "inspect", MODEL_SERVER_IMAGE], capture_output=True).returncode == 0:
        return MODEL_SERVER_IMAGE
    with tempfile.TemporaryDirectory() as tmp:
        return import_model_server_image(Path(tmp))


def manifest(rows: int, image: str) -> str:
    buf = io.StringIO()
    w = csv.writer(buf, lineterminator="\n")
    w.writerow(["model_name", "status", "note", "command"])
    for i in range(rows):
        delay = 1 + i % 3  # the model "loads" for 1-3 s: a kill finds rows in every phase of their start
        w.writerow([f"org/m-{i}", "", "", f"docker run --network host -e PORT={{port}} -e DELAY={delay} "
                                          f"-e MODEL_NAME=org/m-{i} {image}"])
    return buf.getvalue()


class Worker:
    def __init__(self, queues: str, env: dict[str, str], log: Path):
        self.queues, self.env, self.log = queues, env, log
        self.proc: subprocess.Popen | None = None

    def start(self) -> None:
        with self.log.open("a") as log:
            self.proc = subprocess.Popen([sys.executable, str(REPO / "worker.py"), "--queues", self.queues], cwd=REPO,
                                         env=self.env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)

    def kill(self) -> None:
        if self.proc and self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait(timeout=30)

    def stop(self) -> None:
        if self.proc and self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.kill()


def engine_starts(events: subprocess.Popen) -> collections.Counter[tuple[int, int]]:
    events.send_signal(signal.SIGINT)
    out, _ = events.communicate(timeout=60)
    counts: collections.Counter[tuple[int, int]] = collections.Counter()
    for line in out.splitlines():
        parts = line.split()
        if len(parts) == 3 and parts[0] == "start" and parts[1].isdigit() and parts[2].isdigit():
            counts[(int(parts[1]), int(parts[2]))] += 1
    return counts


async def main_async(rows: int, concurrency: int, kill_after: int, workdir: Path) -> int:
    from activities.containers.activities import collect_verdicts, upload_manifest
    from activities.storage import open_store
    from contracts.fleet import HardwareProfile
    from contracts.fleet_job import FleetTestRequest, RunnerKind
    from contracts.settings import Settings
    from tests.helpers import free_port_range
    from workflows.fleet import FleetTestWorkflow

    image = build_image()
    async with dev_server() as env:
        prefix = f"scale-{uuid.uuid4().hex[:6]}"
        state = workdir / "state"
        wenv = {**os.environ, "FLEETFORGE_TEMPORAL_ADDRESS": env.client.service_client.config.target_host,
                "FLEETFORGE_NAMESPACE": env.client.namespace, "FLEETFORGE_QUEUE_PREFIX": prefix,
                "FLEETFORGE_STATE_DIR": str(state), "PYTHONUNBUFFERED": "1", "PYTHONPATH": str(REPO)}
        settings = Settings(queue_prefix=prefix, state_dir=state)
        workers = {q: Worker(q, wenv, workdir / f"worker-{q.split(',')[0]}.log")
                   for q in ("workflows", "containers", "llm,toolchain,kernels")}
        fleet = f"scale-{uuid.uuid4().hex[:8]}"
        events = subprocess.Popen(
            ["docker", "events", "--filter", "type=container", "--filter", f"label=fleetforge.run={fleet}", "--format",
             '{{.Action}} {{index .Actor.Attributes "fleetforge.key"}} {{index .Actor.Attributes "fleetforge.attempt"}}'],
            stdout=subprocess.PIPE, text=True)
        t0 = time.monotonic()
        killed_at = -1
        try:
            for w in workers.values():
                w.start()
            store = open_store(settings)
            hw = HardwareProfile(name="cpu", gpu_count=0, gpu_memory_gb=0, port_range=free_port_range(concurrency))
            handle = await env.client.start_workflow(
                FleetTestWorkflow.run,
                FleetTestRequest(manifest=upload_manifest(store, manifest(rows, image)), runner=RunnerKind.DOCKER,
                                 concurrency=concurrency, max_attempts=2, test_timeout_s=60, hardware=hw,
                                 queues=settings.queues, fleet_id=fleet),
                id=f"fleet-test/{fleet}", task_queue=settings.queues.workflows)
            while killed_at < 0:
                done = (await handle.query(FleetTestWorkflow.progress)).done
                if done >= kill_after:
                    workers["containers"].kill()
                    killed_at = done
                    workers["containers"].start()
                await asyncio.sleep(0.2)
            result = await handle.result()
            wall = time.monotonic() - t0
        finally:
            for w in workers.values():
                w.stop()
            starts = engine_starts(events)
    verdicts = collect_verdicts(store, fleet)
    twice = {k: n for k, n in starts.items() if n > 1}
    invisible = []
    for row in range(rows):
        v = verdicts.get(row)
        engine_reruns = sum(n - 1 for (r, _), n in starts.items() if r == row and n > 1)
        if v is None or v.reruns < engine_reruns:
            invisible.append((row, engine_reruns, v.reruns if v else None))
    left = subprocess.run(["docker", "ps", "-aq", "--filter", f"label=fleetforge.run={fleet}"],
                          capture_output=True, text=True, timeout=60).stdout.split()
    print(f"rows {rows}, concurrency {concurrency}, docker runner, containers worker SIGKILLed after {killed_at} rows")
    print(f"verdicts:             {len(verdicts)}/{rows}  ({result.passed} Yes, {result.failed} No, {result.errors} Error)")
    print(f"started twice:        {len(twice)} (row, attempt) containers per docker events: {sorted(twice)[:10]}")
    print(f"reported reruns:      {sum(v.reruns for v in verdicts.values())} in the verdicts")
    print(f"invisible reruns:     {len(invisible)} {invisible[:10]}")
    print(f"left behind:          {len(left)} containers")
    print(f"wall time:            {wall:.1f} s")
    ok = len(verdicts) == rows and not invisible and not left
    print("PASS" if ok else "FAIL")
    return 0 if ok else 1


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rows", type=int, default=120)
    parser.add_argument("--concurrency", type=int, default=8)
    parser.add_argument("--kill-after", type=int, default=30, help="rows finished before the containers worker is killed")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="bench-scaleout-") as tmp:
        return asyncio.run(main_async(args.rows, args.concurrency, args.kill_after, Path(tmp)))


if __name__ == "__main__":
    sys.exit(main())
