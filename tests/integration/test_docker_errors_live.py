"""The docker error table (tests/unit/test_docker_error_table.py) against the running engine: each
capturable refusal is produced for real here and must still classify as its entry says (an engine whose
texts changed fails this first), and a row asking for GPUs on this GPU-less host, run by the real docker
runner with the old default profile (8 GPUs), ends Error GPU_UNAVAILABLE, never No."""

from __future__ import annotations

import asyncio
import os
import shutil
import subprocess
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from activities.containers.runners import DOCKER_REFUSED, DockerRunner
from activities.containers.taxonomy import classify
from activities.storage import FileStore
from contracts.fleet import ErrorCategory, HardwareProfile, RowStatus, Slot, TestPhase, row_status
from contracts.fleet_job import RunnerKind, RunTestRequest
from tests.conftest import fleet_containers, import_model_server_image
from tests.helpers import free_ports
from tests.private_dockerd import PrivateDockerd
from tests.unit.test_docker_error_table import TABLE

pytestmark = pytest.mark.docker


def _entry(what: str):
    return next(e for e in TABLE if e.what == what)


def _refusal(argv: list[str], env: dict[str, str] | None = None, user: bool = False) -> tuple[int, str]:
    if user:
        argv = ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", *argv]
    r = subprocess.run(argv, capture_output=True, text=True, timeout=60, env={**os.environ, **(env or {})})
    return r.returncode, r.stdout + r.stderr


CASES = [
    ("GPU asked, no GPU runtime", ["--gpus", "all"], [], {}),
    ("NVIDIA runtime missing", ["--runtime", "nvidia"], [], {}),
    ("GPU device node missing", ["--device", "/dev/nvidia0"], [], {}),
    ("program not in the image", [], ["/nonexistent"], {}),
    ("program not executable", [], ["/"], {}),
    ("daemon not running", [], ["true"], {"DOCKER_HOST": "unix:///nonexistent.sock"}),
    ("invalid option value", ["--shm-size", "1x"], ["true"], {}),
    ("memory limit below the engine's minimum", ["--memory", "1k"], ["true"], {}),
    ("more CPUs than the host", ["--cpus", str(os.cpu_count() * 50)], ["true"], {}),
]


@pytest.mark.parametrize("what, options, args, env", CASES, ids=[c[0] for c in CASES])
def test_the_engine_still_refuses_with_the_tables_text(docker_image: str, what, options, args, env):
    fleet = f"e-{uuid.uuid4().hex[:6]}"
    entry = _entry(what)
    try:
        code, text = _refusal(["docker", "run", "--detach", "--network", "none", "--label", f"fleetforge.run={fleet}",
                               *options, docker_image, *args], env)
    finally:
        subprocess.run(f"docker ps -aq --filter label=fleetforge.run={fleet} | xargs -r docker rm -f", shell=True,
                       capture_output=True, timeout=60)
    assert code in (125, 126, 127), (code, text)
    c = classify(code, text + "\n" + DOCKER_REFUSED.format(code=code), TestPhase.START)
    assert c.category is entry.category, (text, c)
    assert row_status(False, c.category.value) is RowStatus.ERROR


def test_a_name_conflict_and_a_socket_without_permission_are_the_tables_too(docker_image: str):
    name = f"ff-conflict-{uuid.uuid4().hex[:6]}"
    subprocess.run(["docker", "create", "--name", name, docker_image, "true"], check=True, capture_output=True, timeout=60)
    try:
        code, text = _refusal(["docker", "run", "--detach", "--network", "none", "--name", name, docker_image, "true"])
    finally:
        subprocess.run(["docker", "rm", "-f", name], capture_output=True, timeout=60)
    assert classify(code, text, TestPhase.START).category is _entry("name conflict").category
    code, text = _refusal(["docker", "ps"], user=True)
    assert code != 0 and classify(code, text, TestPhase.START).category is _entry("no permission on the socket").category


async def test_a_gpu_row_on_this_gpu_less_host_is_an_error_not_a_no(tmp_path: Path, docker_image: str):
    """The measured false No of issue 25: the default profile claimed 8 GPUs on a host with none."""
    fleet = f"g-{uuid.uuid4().hex[:6]}"
    port = free_ports()[0]
    req = RunTestRequest(fleet_id=fleet, row=0, model_name="org/m", attempt=1, runner=RunnerKind.DOCKER, timeout_s=20,
                         command=f"docker run --network host --gpus '\"device=0\"' -e PORT={port} {docker_image}",
                         hardware=HardwareProfile(gpu_count=8), slot=Slot(port=port, devices=(0,)))
    out = await DockerRunner(FileStore(tmp_path / "a"), poll_s=0.2, marker_dir=tmp_path / "m").run(req, print)
    c = classify(out.exit_code, out.log_tail, out.phase)
    assert not out.passed and c.category is ErrorCategory.GPU_UNAVAILABLE, out.log_tail
    assert row_status(False, c.category.value) is RowStatus.ERROR and "GPU host" in c.reason
    assert fleet_containers(fleet) == []


@pytest.fixture
def private_daemon(tmp_path: Path) -> Iterator[tuple[PrivateDockerd, str]]:
    """A docker daemon of the test's own (stopped and restarted under its rows) with the model-server image."""
    (tmp_path / "rootfs").mkdir()
    with PrivateDockerd(shutdown_timeout_s=1) as daemon:
        yield daemon, import_model_server_image(tmp_path / "rootfs", ("docker", "-H", daemon.host))


async def test_a_daemon_restarted_while_the_model_loads_is_an_error_not_a_crash(
        tmp_path: Path, private_daemon: tuple[PrivateDockerd, str]):
    """A real daemon (the test's own) restarted mid-test: it SIGKILLs the loading container (exit 137, as the
    host OOM killer would), and the runner saw the daemon go away, so the row is an Error, never a No."""
    fleet, port = f"r-{uuid.uuid4().hex[:6]}", free_ports()[0]
    daemon, image = private_daemon
    req = RunTestRequest(fleet_id=fleet, row=0, model_name="org/m", attempt=1, runner=RunnerKind.DOCKER,
                         timeout_s=60, hardware=HardwareProfile(gpu_count=0), slot=Slot(port=port),
                         command=f"docker run --network host -e PORT={port} -e DELAY=40 {image}")
    runner = DockerRunner(FileStore(tmp_path / "a"), docker=str(daemon.cli(tmp_path)), poll_s=0.2,
                          marker_dir=tmp_path / "m")
    test = asyncio.create_task(runner.run(req, lambda _: None))

    def loading() -> bool:
        return bool(daemon.docker("ps", "-q", "--filter", f"label=fleetforge.run={fleet}").stdout.split())

    deadline = asyncio.get_running_loop().time() + 60
    while not await asyncio.to_thread(loading):
        assert not test.done() and asyncio.get_running_loop().time() < deadline, "the container never started"
        await asyncio.sleep(0.2)
    await asyncio.to_thread(daemon.restart)
    out = await asyncio.wait_for(test, 120)
    left = daemon.docker("ps", "-aq", "--filter", f"label=fleetforge.run={fleet}").stdout.split()
    assert not out.passed and out.exit_code == 137, out.log_tail
    c = classify(out.exit_code, out.log_tail, out.phase)
    assert c.category is ErrorCategory.DOCKER_UNREACHABLE and "went away" in c.reason, (c, out.log_tail)
    assert row_status(False, c.category.value) is RowStatus.ERROR
    assert left == []


async def test_a_daemon_restart_is_waited_out_and_a_daemon_that_stays_away_fails_rows_at_once(
        tmp_path: Path, private_daemon: tuple[PrivateDockerd, str]):
    """Rows that start while the daemon restarts wait for it (a restart is not an Error row); once it has been
    away past the patience, every row is told at once (DOCKER_UNREACHABLE), not after a wait of its own."""
    daemon, image = private_daemon

    def request(row: int) -> RunTestRequest:
        port = free_ports()[0]
        return RunTestRequest(fleet_id=f"w-{uuid.uuid4().hex[:6]}", row=row, model_name=f"org/m{row}", attempt=1,
                              runner=RunnerKind.DOCKER, timeout_s=30, hardware=HardwareProfile(gpu_count=0),
                              slot=Slot(port=port), command=f"docker run --network host -e PORT={port} "
                                                            f"-e MODEL_NAME=org/m{row} {image}")

    runner = DockerRunner(FileStore(tmp_path / "a"), docker=str(daemon.cli(tmp_path)), poll_s=0.2,
                          daemon_patience_s=20)
    daemon.stop()
    test = asyncio.create_task(runner.run(request(0), lambda _: None))
    await asyncio.sleep(2)  # the row is waiting for the daemon, not failing
    assert not test.done()
    await asyncio.to_thread(daemon.start)
    out = await asyncio.wait_for(test, 90)
    assert out.passed, out.log_tail

    daemon.stop()
    runner.daemon_patience_s = 2
    out = await runner.run(request(1), lambda _: None)
    assert not out.passed
    c = classify(out.exit_code, out.log_tail, out.phase)
    assert c.category is ErrorCategory.DOCKER_UNREACHABLE and row_status(False, c.category.value) is RowStatus.ERROR
    t0 = time.monotonic()
    out = await runner.run(request(2), lambda _: None)
    assert not out.passed and time.monotonic() - t0 < 1.5, "an outage older than the patience is not waited again"


def test_an_image_that_runs_nothing_by_default_is_an_error_asking_for_the_rows_command(tmp_path: Path):
    """Issue 40: a row without a command whose image has no CMD was `DOCKER_ENGINE` ("the docker engine refused
    the container"); it is NO_COMMAND, and the note says to give the row a command."""
    image = f"fleetforge-test/no-cmd:{uuid.uuid4().hex[:6]}"
    (tmp_path / "bin").mkdir()
    shutil.copy2("/bin/busybox", tmp_path / "bin" / "busybox")
    tar = subprocess.Popen(["tar", "-C", str(tmp_path), "-c", "."], stdout=subprocess.PIPE)
    subprocess.run(["docker", "import", "-", image], stdin=tar.stdout, check=True, capture_output=True, timeout=120)
    tar.wait(timeout=60)
    try:
        code, text = _refusal(["docker", "run", "--detach", "--network", "none", "--name", f"ff-nocmd-{uuid.uuid4().hex[:6]}",
                               "--label", "fleetforge.run=e-nocmd", image])
    finally:
        subprocess.run("docker ps -aq --filter label=fleetforge.run=e-nocmd | xargs -r docker rm -f", shell=True,
                       capture_output=True, timeout=60)
        subprocess.run(["docker", "rmi", image], capture_output=True, timeout=60)
    c = classify(code, text + "\n" + DOCKER_REFUSED.format(code=code), TestPhase.START)
    assert c.category is _entry("image without a default command").category, (text, c)
    assert "give the row a `command`" in c.reason and row_status(False, c.category.value) is RowStatus.ERROR
