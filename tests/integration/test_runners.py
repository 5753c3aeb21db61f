"""The runners on their own: process (timeout kills, probe URL), script (test_models.sh contract),
docker (a real engine: skipped with the reason when `docker info` fails; the command sequence,
naming, labels and cleanup on cancel also against a fake docker CLI from tests/doubles)."""

from __future__ import annotations

import http.server
import os
import shutil
import subprocess
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from activities.containers.runners import DockerRunner, ProcessRunner, ScriptRunner, process_argv
from activities.containers.taxonomy import classify
from activities.storage import FileStore
from contracts.errors import Err, FleetforgeError
from contracts.fleet import ErrorCategory, HardwareProfile, TestPhase
from contracts.fleet_job import RunnerKind, RunTestRequest
from tests.doubles.fake_docker import install_fake_docker


def request(command: str, runner: RunnerKind = RunnerKind.PROCESS, **kw) -> RunTestRequest:
    return RunTestRequest(**{"fleet_id": "t", "row": 0, "model_name": "org/m", "attempt": 1, "command": command,
                             "runner": runner, "hardware": HardwareProfile(gpu_count=0), **kw})


@pytest.fixture
def http_server() -> Iterator[str]:
    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # noqa: N802
            self.send_response(200 if self.path == "/ok" else 503)
            self.end_headers()
            self.wfile.write(b'{"data": []}')

        def log_message(self, *args) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()


def test_process_argv_rejects_operators_and_unlisted_programs_before_anything_runs():
    assert process_argv('python -c "print(1)"')[1:] == ["-c", "print(1)"]
    for bad, fragment in [('python -c "print(1)" && id', "`&&`"), ("python -c `id`", "backtick"),
                          ("rm -rf /tmp/x", "program 'rm' is not allowed"), ("", "empty")]:
        with pytest.raises(FleetforgeError) as e:
            process_argv(bad)
        assert e.value.code is Err.POLICY_REJECTED and fragment in e.value.message


async def test_process_runner_kills_a_command_at_its_deadline(file_store):
    beats: list[str] = []
    t0 = time.monotonic()
    out = await ProcessRunner(file_store).run(
        request('python -c "__import__(\'time\').sleep(60)"', timeout_s=1.5), beats.append)
    assert time.monotonic() - t0 < 10
    assert not out.passed and out.phase is TestPhase.HEALTH and out.exit_code is None
    assert "timed out after 1.5s" in out.log_tail
    assert classify(out.exit_code, out.log_tail, out.phase).category is ErrorCategory.NOT_HEALTHY


async def test_process_runner_passes_only_when_the_probe_answers(file_store, http_server):
    ok = await ProcessRunner(file_store).run(request('python -c "print(7)"', probe_url=f"{http_server}/ok"), print)
    bad = await ProcessRunner(file_store).run(request('python -c "print(7)"', probe_url=f"{http_server}/nope"), print)
    assert ok.passed and ok.log is not None and file_store.get_bytes(ok.log) == b"7\n"
    assert not bad.passed and bad.phase is TestPhase.PROBE and "HTTP 503" in bad.log_tail


SCRIPT = """#!/bin/sh
mkdir -p logs
echo "testing $1 with: $2" > "logs/$(echo "$1" | tr / _).log"
case "$1" in
  *pass*) exit 0 ;;
  *slow*) echo "health check timed out"; exit 2 ;;
  *) echo "CUDA out of memory"; exit 1 ;;
esac
"""


@pytest.mark.parametrize("model, passed, phase, category", [
    ("org/pass-1", True, TestPhase.PROBE, None),
    ("org/oom-1", False, TestPhase.START, ErrorCategory.CUDA_OOM),
    ("org/slow-1", False, TestPhase.HEALTH, ErrorCategory.NOT_HEALTHY),
])
async def test_script_runner_maps_exit_codes_and_reads_the_log_file(tmp_path: Path, model, passed, phase, category):
    script = tmp_path / "test_models.sh"
    script.write_text(SCRIPT)
    script.chmod(0o755)
    store = FileStore(tmp_path / "a")
    out = await ScriptRunner(store, script).run(request("docker run img", RunnerKind.SCRIPT, model_name=model), print)
    assert (out.passed, out.phase) == (passed, phase)
    assert f"testing {model} with: docker run img" in out.log_tail, "the script's log file is part of the log"
    if category:
        assert classify(out.exit_code, out.log_tail, out.phase).category is category


def _docker_up() -> str:
    if shutil.which("docker") is None:
        return "no docker CLI"
    try:
        r = subprocess.run(["docker", "info"], capture_output=True, text=True, timeout=20)
    except (OSError, subprocess.TimeoutExpired) as e:
        return f"docker info failed: {e}"
    return "" if r.returncode == 0 else f"docker engine not running: {r.stderr.strip().splitlines()[-1] if r.stderr.strip() else r.returncode}"


DOCKER_SKIP = _docker_up()
if DOCKER_SKIP and os.geteuid() == 0:
    # CI runs as root and starts an engine (scripts/engines.sh): a missing engine there is a failure, not a skip.
    needs_docker = pytest.mark.usefixtures("_require_docker")
else:
    needs_docker = pytest.mark.skipif(bool(DOCKER_SKIP), reason=DOCKER_SKIP or "docker ok")


@pytest.fixture
def _require_docker() -> None:
    pytest.fail(f"CI (root) requires a running docker engine: {DOCKER_SKIP}")


LOCAL_BUSYBOX = "fleetforge-test/busybox:1"


def _local_busybox() -> str:
    """A busybox image built from the host's /bin/busybox (docker import; no registry pulls)."""
    have = subprocess.run(["docker", "image", "inspect", LOCAL_BUSYBOX], capture_output=True, timeout=30)
    if have.returncode == 0:
        return LOCAL_BUSYBOX
    bb = shutil.which("busybox") or "/bin/busybox"
    if not Path(bb).exists():
        pytest.fail("busybox-static is required to build the local test image (apt-get install busybox-static)")
    import tarfile, io
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        tar.add(bb, arcname="bin/busybox")
        for applet in ("sh", "false", "true", "sleep", "httpd", "echo", "cat"):
            info = tarfile.TarInfo(f"bin/{applet}")
            info.type, info.linkname = tarfile.SYMTYPE, "busybox"
            tar.addfile(info)
    r = subprocess.run(["docker", "import", "-", LOCAL_BUSYBOX], input=buf.getvalue(), capture_output=True, timeout=120)
    if r.returncode != 0:
        pytest.fail(f"docker import of {bb} failed: {r.stderr.decode(errors='replace').strip()}")
    return LOCAL_BUSYBOX


def _containers(label: str) -> list[str]:
    r = subprocess.run(["docker", "ps", "-aq", "--filter", f"label=fleetforge.run={label}"],
                       capture_output=True, text=True, timeout=30)
    return r.stdout.split()


@pytest.mark.docker
@needs_docker
async def test_docker_runner_missing_image_is_image_not_found_and_nothing_is_left(tmp_path: Path):
    fleet = f"t-{uuid.uuid4().hex[:6]}"
    req = request("docker run --network none fleetforge/does-not-exist:0", RunnerKind.DOCKER, fleet_id=fleet)
    out = await DockerRunner(FileStore(tmp_path / "a")).run(req, print)
    assert not out.passed and classify(out.exit_code, out.log_tail, out.phase).category is ErrorCategory.IMAGE_NOT_FOUND
    assert _containers(fleet) == []


@pytest.mark.docker
@needs_docker
async def test_docker_runner_crashing_container_is_classified_and_always_removed(tmp_path: Path):
    image = _local_busybox()
    fleet = f"t-{uuid.uuid4().hex[:6]}"
    req = request(f"docker run --network none {image} false", RunnerKind.DOCKER, fleet_id=fleet, timeout_s=30)
    out = await DockerRunner(FileStore(tmp_path / "a"), poll_s=0.2).run(req, print)
    assert not out.passed and out.phase is TestPhase.START and out.exit_code == 1
    assert _containers(fleet) == [], "docker rm -f in finally"


@pytest.fixture
def fake_docker(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> tuple[str, Path]:
    exe = install_fake_docker(tmp_path)
    log = tmp_path / "docker-calls.jsonl"
    monkeypatch.setenv("FAKE_DOCKER_LOG", str(log))
    return str(exe), log


def _calls(log: Path) -> list[list[str]]:
    import json

    return [json.loads(line) for line in log.read_text().splitlines()] if log.exists() else []


async def test_docker_runner_sequence_names_labels_and_removes_the_container(tmp_path: Path, fake_docker):
    exe, log = fake_docker
    cmd = "docker run --gpus all --network host vllm/vllm-openai:latest --model org/m --port 8011"
    out = await DockerRunner(FileStore(tmp_path / "a"), docker=exe, poll_s=0.05).run(
        request(cmd, RunnerKind.DOCKER, hardware=HardwareProfile()), print)
    calls = _calls(log)
    assert [c[0] for c in calls] == ["image", "rm", "run", "inspect", "logs", "rm"]
    run = calls[2]
    name = run[run.index("--name") + 1]
    assert run[:2] == ["run", "--detach"] and "--label" in run and "fleetforge.run=t" in run
    assert calls[1] == ["rm", "-f", name] and calls[-1] == ["rm", "-f", name], "stale removal first, rm -f last"
    assert not out.passed and out.phase is TestPhase.START and out.exit_code == 137
    assert classify(out.exit_code, out.log_tail, out.phase).category is ErrorCategory.CRASHED


async def test_docker_runner_removes_the_container_when_cancelled(tmp_path: Path, fake_docker, monkeypatch):
    import asyncio

    from tests.helpers import assert_eventually

    exe, log = fake_docker
    monkeypatch.setenv("FAKE_STATE", "true 0")  # running, never healthy (nothing listens on the port)
    cmd = "docker run --network host vllm/vllm-openai:latest --model org/m --port 1"
    task = asyncio.create_task(DockerRunner(FileStore(tmp_path / "a"), docker=exe, poll_s=0.05).run(
        request(cmd, RunnerKind.DOCKER, hardware=HardwareProfile(), timeout_s=300), print))
    await assert_eventually(lambda: any(c[0] == "inspect" for c in _calls(log)), message="health polling started")
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    calls = _calls(log)
    assert calls[-1][:2] == ["rm", "-f"] and calls[-1][2] == calls[2][calls[2].index("--name") + 1]


def test_rejected_docker_command_never_reaches_the_engine(tmp_path: Path, fake_docker):
    import asyncio

    exe, log = fake_docker
    with pytest.raises(FleetforgeError) as e:
        asyncio.run(DockerRunner(FileStore(tmp_path / "a"), docker=exe).run(
            request("docker run --privileged vllm/vllm-openai:latest", RunnerKind.DOCKER), print))
    assert e.value.code is Err.POLICY_REJECTED and _calls(log) == []
