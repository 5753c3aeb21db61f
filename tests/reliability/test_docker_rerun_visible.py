"""A docker row whose worker is SIGKILLed at any point of its start says it ran twice when, and only
when, the engine started its container twice (issue 27): the runner records the container it is about
to start before `docker run`, and the retry asks the engine. The worker here is a real process running
the DockerRunner (tests/reliability/docker_row_process.py), killed with its process group (its
`docker run` client, in a session of its own, survives the kill as it would in a real crash) at four
points: while `docker run` has not returned, right after the container exists, during the health wait,
during the probe. The judge is the engine's own event stream (`docker events`, started before the
first run, filtered on the fleet's label): every (row, attempt) container started more than once is
reported as a rerun with the exact count, and nothing is left behind."""

from __future__ import annotations

import asyncio
import collections
import http.server
import os
import signal
import subprocess
import sys
import threading
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from activities.containers.policy import container_name
from activities.containers.runners import DockerRunner
from activities.storage import FileStore
from contracts.fleet import HardwareProfile, Slot
from contracts.fleet_job import RunnerKind, RunTestRequest
from tests.conftest import fleet_containers
from tests.helpers import assert_eventually, free_ports, proc_bytes

pytestmark = [pytest.mark.docker, pytest.mark.slow]

REPO = Path(__file__).resolve().parents[2]

SLOW_CLIENT = "#!/bin/sh\n# the docker CLI, a moment late for `run`: the kill lands before `docker run` returns\n" \
              "[ \"$1\" = run ] && sleep 1\nexec docker \"$@\"\n"


class HeldProbe:
    """A probe URL whose first request is held until released (the worker is killed meanwhile); later
    requests are answered 200 at once."""

    def __init__(self) -> None:
        self.first = threading.Event()
        self.release = threading.Event()
        self.hits = 0
        probe = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_GET(self) -> None:  # noqa: N802
                probe.hits += 1
                if probe.hits == 1:
                    probe.first.set()
                    probe.release.wait(60)
                self.send_response(200)
                self.end_headers()
                self.wfile.write(b"ok")

            def log_message(self, *args) -> None:
                pass

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        threading.Thread(target=self.server.serve_forever, daemon=True).start()
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/probe"

    def close(self) -> None:
        self.release.set()
        self.server.shutdown()


@pytest.fixture
def held_probe() -> Iterator[HeldProbe]:
    probe = HeldProbe()
    try:
        yield probe
    finally:
        probe.close()


class EngineEvents:
    """`docker events` for one fleet's containers, started before anything runs."""

    def __init__(self, fleet: str):
        self.proc = subprocess.Popen(
            ["docker", "events", "--filter", "type=container", "--filter", f"label=fleetforge.run={fleet}", "--format",
             '{{.Action}} {{.ID}} {{index .Actor.Attributes "fleetforge.key"}} '
             '{{index .Actor.Attributes "fleetforge.attempt"}}'],
            stdout=subprocess.PIPE, text=True)

    def starts(self) -> collections.Counter[tuple[str, str]]:
        """Container starts per (row, attempt), read after the runs."""
        self.proc.send_signal(signal.SIGINT)
        out, _ = self.proc.communicate(timeout=30)
        counts: collections.Counter[tuple[str, str]] = collections.Counter()
        for line in out.splitlines():
            action, _cid, key, attempt = (line.split() + ["", "", "", ""])[:4]
            if action == "start":
                counts[(key, attempt)] += 1
        return counts


def _spawn(req: RunTestRequest, tmp: Path, docker: str) -> subprocess.Popen:
    path = tmp / f"req-{req.row}.json"
    path.write_text(req.model_dump_json())
    return subprocess.Popen([sys.executable, "-m", "tests.reliability.docker_row_process", str(path), str(tmp / "markers"),
                             str(tmp / "store"), docker], cwd=REPO, env={**os.environ, "PYTHONPATH": str(REPO)},
                            stdout=subprocess.PIPE, text=True, start_new_session=True)


def _lines_until(proc: subprocess.Popen, wanted: Callable[[str], bool]) -> None:
    assert proc.stdout is not None
    for line in proc.stdout:
        if wanted(line):
            return
    raise AssertionError(f"the worker ended before the kill point (exit {proc.wait()})")


def _container_exists(name: str) -> bool:
    r = subprocess.run(["docker", "ps", "-aq", "--filter", f"name=^{name}$"], capture_output=True, text=True, timeout=30)
    return bool(r.stdout.split())


async def test_a_row_killed_at_any_point_of_its_start_reports_every_second_container_start(
        tmp_path: Path, docker_image: str, held_probe: HeldProbe):
    fleet = f"k-{uuid.uuid4().hex[:6]}"
    client = tmp_path / "docker-slow"
    client.write_text(SLOW_CLIENT)
    client.chmod(0o755)
    events = EngineEvents(fleet)
    ports = free_ports(4)

    def req(row: int, delay: int, probe: str | None = None) -> RunTestRequest:
        return RunTestRequest(
            fleet_id=fleet, row=row, model_name=f"org/m{row}", attempt=1, runner=RunnerKind.DOCKER, timeout_s=40,
            command=f"docker run --network host -e PORT={ports[row]} -e DELAY={delay} -e MODEL_NAME=org/m{row} {docker_image}",
            hardware=HardwareProfile(gpu_count=0), slot=Slot(port=ports[row]), probe_url=probe)

    rows = [req(0, 0), req(1, 3), req(2, 3), req(3, 0, held_probe.url)]
    name = {r.row: container_name(fleet, f"{r.row}-{r.model_name}", 1) for r in rows}
    killed: list[subprocess.Popen] = []

    def kill(proc: subprocess.Popen) -> None:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=30)
        killed.append(proc)

    try:
        # 0: before `docker run` returns (its client is alive and has not reached the engine yet)
        p = _spawn(rows[0], tmp_path, str(client))
        await assert_eventually(lambda: (tmp_path / "markers").is_dir() and any(
            f"--name\0{name[0]}".encode() in proc_bytes(pid, "cmdline") for pid in _pids()), timeout=30, interval=0.01,
            message="row 0's docker run client started")
        kill(p)
        # 1: right after the container exists (the health wait has not begun answering)
        p = _spawn(rows[1], tmp_path, "docker")
        await assert_eventually(lambda: _container_exists(name[1]), timeout=30, interval=0.02,
                                message="row 1's container exists")
        kill(p)
        # 2: during the health wait (the server sleeps DELAY seconds before listening)
        p = _spawn(rows[2], tmp_path, "docker")
        await asyncio.to_thread(_lines_until, p, lambda line: line.startswith("waiting for http"))
        kill(p)
        # 3: during the probe (the row's probe URL holds the first request)
        p = _spawn(rows[3], tmp_path, "docker")
        assert await asyncio.to_thread(held_probe.first.wait, 60), "row 3's probe reached the probe URL"
        kill(p)
        held_probe.release.set()

        runner = DockerRunner(FileStore(tmp_path / "store"), poll_s=0.2, marker_dir=tmp_path / "markers")
        outcomes = {r.row: await runner.run(r, lambda _: None) for r in rows}  # the retries, as Temporal would
    finally:
        starts = events.starts()
        for proc in killed:
            assert proc.poll() is not None
    assert all(o.passed for o in outcomes.values()), {r: o.log_tail for r, o in outcomes.items()}
    for row, outcome in outcomes.items():
        engine = starts[(str(row), "1")]
        assert outcome.test_runs == engine, (row, engine, outcome.log_tail)
        if engine > 1:
            assert "ran" in outcome.log_tail or "interrupted" in outcome.log_tail
    assert all(starts[(str(r), "1")] == 2 for r in (1, 2, 3)), starts  # these rows' first container surely started
    assert fleet_containers(fleet) == [], "nothing of the killed runs is left"
    assert not any(f"--name\0{name[0]}".encode() in proc_bytes(pid, "cmdline") for pid in _pids()), "no docker run client left"


def _pids() -> list[int]:
    return [int(e.name) for e in os.scandir("/proc") if e.name.isdigit()]
