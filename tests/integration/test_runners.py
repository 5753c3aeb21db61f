"""The runners on their own: process (timeout kills, probe URL), script (test_models.sh contract),
docker (the real engine: image missing, crash, stale-container replacement, naming, labels and
removal on cancel; these fail, never skip, without an engine)."""

from __future__ import annotations

import asyncio
import http.server
import subprocess
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from activities.containers.policy import container_name
from activities.containers.runners import DockerRunner, ProcessRunner, ScriptRunner, process_argv
from activities.containers.taxonomy import classify
from activities.storage import FileStore
from contracts.errors import Err, FleetforgeError
from contracts.fleet import ErrorCategory, HardwareProfile, TestPhase
from contracts.fleet_job import RunnerKind, RunTestRequest
from tests.conftest import fleet_containers
from tests.helpers import assert_eventually, free_ports


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


@pytest.mark.docker
async def test_docker_runner_missing_image_is_image_not_found_and_nothing_is_left(tmp_path: Path, docker_image: str):
    fleet = f"t-{uuid.uuid4().hex[:6]}"
    req = request("docker run --network none fleetforge/does-not-exist:0", RunnerKind.DOCKER, fleet_id=fleet)
    out = await DockerRunner(FileStore(tmp_path / "a")).run(req, print)
    assert not out.passed and classify(out.exit_code, out.log_tail, out.phase).category is ErrorCategory.IMAGE_NOT_FOUND
    assert fleet_containers(fleet) == []


@pytest.mark.docker
async def test_docker_runner_crashing_container_is_classified_and_always_removed(tmp_path: Path, docker_image: str):
    fleet = f"t-{uuid.uuid4().hex[:6]}"
    req = request(f"docker run --network none {docker_image} false", RunnerKind.DOCKER, fleet_id=fleet, timeout_s=30)
    out = await DockerRunner(FileStore(tmp_path / "a"), poll_s=0.2).run(req, print)
    assert not out.passed and out.phase is TestPhase.START and out.exit_code == 1
    assert fleet_containers(fleet) == [], "docker rm -f in finally"


def _labelled(fleet: str) -> list[str]:
    r = subprocess.run(["docker", "ps", "-a", "--filter", f"label=fleetforge.run={fleet}", "--format",
                        '{{.Names}} {{.Label "fleetforge.key"}} {{.Label "fleetforge.attempt"}} {{.State}}'],
                       capture_output=True, text=True, timeout=30)
    return r.stdout.splitlines()


@pytest.mark.docker
async def test_docker_runner_replaces_a_stale_container_names_labels_and_removes_on_cancel(tmp_path: Path, docker_image: str):
    fleet = f"t-{uuid.uuid4().hex[:6]}"
    req = request(f"docker run --network none {docker_image} sleep 300", RunnerKind.DOCKER, fleet_id=fleet,
                  timeout_s=300, row=4, attempt=2)
    name = container_name(fleet, "4-org/m", 2)
    stale = subprocess.run(["docker", "create", "--name", name, "--label", f"fleetforge.run={fleet}", docker_image, "true"],
                           capture_output=True, text=True, timeout=60)
    assert stale.returncode == 0, stale.stderr
    task = asyncio.create_task(DockerRunner(FileStore(tmp_path / "a"), poll_s=0.2).run(req, print))

    await assert_eventually(lambda: _labelled(fleet) == [f"{name} 4 2 running"], timeout=30,
                            message="the stale container replaced by a running one with our name and labels")
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert fleet_containers(fleet) == [], "removed on cancellation"


def test_rejected_docker_command_never_reaches_the_engine(tmp_path: Path):
    """The docker CLI path does not exist: any call would raise FileNotFoundError, not POLICY_REJECTED."""
    runner = DockerRunner(FileStore(tmp_path / "a"), docker=str(tmp_path / "no-docker-here"))
    with pytest.raises(FleetforgeError) as e:
        asyncio.run(runner.run(request("docker run --privileged vllm/vllm-openai:latest", RunnerKind.DOCKER), print))
    assert e.value.code is Err.POLICY_REJECTED


@pytest.mark.docker
async def test_docker_runner_probes_models_then_a_one_token_completion_or_the_rows_probe(tmp_path: Path, docker_image: str):
    """Healthy is not enough: the server must list a model and answer a tiny completion (or the row's
    own probe URL). Four real containers at once: serves, completion fails, row probe ok, row probe 404."""
    fleet = f"t-{uuid.uuid4().hex[:6]}"
    ports = free_ports(4)
    runner = DockerRunner(FileStore(tmp_path / "a"), poll_s=0.2)

    def run(row: int, env: str = "", probe: str | None = None):
        command = f"docker run --network host -e PORT={ports[row]} -e MODEL_NAME=org/m {env} {docker_image}"
        return runner.run(request(command, RunnerKind.DOCKER, fleet_id=fleet, row=row, timeout_s=30,
                                  probe_url=probe and f"http://127.0.0.1:{ports[row]}{probe}"), print)

    served, broken, own_ok, own_bad = await asyncio.gather(
        run(0), run(1, "-e COMPLETIONS=fail"), run(2, "-e COMPLETIONS=fail", probe="/health"), run(3, probe="/nope"))

    assert served.passed and served.phase is TestPhase.PROBE, served.log_tail
    assert "GET /v1/models -> 200 OK" in served.log_tail and "POST /v1/completions -> 200 OK" in served.log_tail
    assert not broken.passed and broken.phase is TestPhase.PROBE
    assert "POST /v1/completions (model org/m, 1 token): HTTP 500" in broken.log_tail
    assert "the engine failed to generate" in broken.log_tail, "the server's own error goes into the log"
    verdict = classify(broken.exit_code, broken.log_tail, broken.phase)
    assert verdict.category is ErrorCategory.PROBE_FAILED, verdict
    assert own_ok.passed and "/v1/completions" not in own_ok.log_tail, "the row's probe replaces the default one"
    assert not own_bad.passed and classify(own_bad.exit_code, own_bad.log_tail, own_bad.phase).category is ErrorCategory.PROBE_FAILED
    assert "HTTP 404" in own_bad.log_tail
    assert fleet_containers(fleet) == []
