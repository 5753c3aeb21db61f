"""The runners on their own: process (timeout kills, probe URL, an interrupted earlier run killed
first), script (test_models.sh contract), docker (the real engine: image missing, crash,
stale-container replacement, naming, labels and removal on cancel, the row's port only, the server
must be the row's own; these fail, never skip, without an engine)."""

from __future__ import annotations

import asyncio
import http.server
import json
import shutil
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
from contracts.fleet import ErrorCategory, HardwareProfile, Slot, TestPhase
from contracts.fleet_job import ProcessMode, RunnerKind, RunTestRequest
from tests.conftest import fleet_containers
from tests.helpers import assert_eventually, free_ports, proc_bytes


def request(command: str, runner: RunnerKind = RunnerKind.PROCESS, **kw) -> RunTestRequest:
    """A test of `command`; the process runner's in self-test mode (its exit code is the verdict), which is what
    these lifecycle tests (deadline, markers, sandbox) run: its server mode is tested in test_process_runner.py."""
    mode = ProcessMode.SELF_TEST if runner is RunnerKind.PROCESS else ProcessMode.SERVER
    return RunTestRequest(**{"fleet_id": "t", "row": 0, "model_name": "org/m", "attempt": 1, "command": command,
                             "runner": runner, "hardware": HardwareProfile(gpu_count=0), "process_mode": mode, **kw})


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


def docker_request(command: str, port: int, **kw) -> RunTestRequest:
    """A docker test on its own slot (a free loopback port, no GPU); `{port}` in the command is that port."""
    return request(command.replace("{port}", str(port)), RunnerKind.DOCKER, slot=Slot(port=port), **kw)


def test_process_argv_rejects_operators_and_unlisted_programs_before_anything_runs():
    assert process_argv('python -c "print(1)"')[1:] == ["-c", "print(1)"]
    assert process_argv('python -c "import time; time.sleep(6)"')[1:] == ["-c", "import time; time.sleep(6)"]
    for bad, fragment in [('python -c "print(1)" && id', "`&&` outside quotes"), ("python a.py | tee x", "`|`"),
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
    assert not out.passed and out.phase is TestPhase.TIMEOUT and out.exit_code is None
    assert "did not finish within 1.5s (--test-timeout)" in out.log_tail
    assert classify(out.exit_code, out.log_tail, out.phase).category is ErrorCategory.TIMEOUT


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
    ("org/slow-1", False, TestPhase.TIMEOUT, ErrorCategory.TIMEOUT),
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
    req = docker_request("docker run --network host -e PORT={port} fleetforge/does-not-exist:0", free_ports()[0], fleet_id=fleet)
    out = await DockerRunner(FileStore(tmp_path / "a")).run(req, print)
    assert not out.passed and classify(out.exit_code, out.log_tail, out.phase).category is ErrorCategory.IMAGE_NOT_FOUND
    assert fleet_containers(fleet) == []


@pytest.mark.docker
async def test_docker_runner_crashing_container_is_classified_and_always_removed(tmp_path: Path, docker_image: str):
    fleet = f"t-{uuid.uuid4().hex[:6]}"
    req = docker_request(f"docker run --network host -e PORT={{port}} {docker_image} false", free_ports()[0],
                         fleet_id=fleet, timeout_s=30)
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
    req = docker_request(f"docker run --network host -e PORT={{port}} {docker_image} sleep 300", free_ports()[0],
                         fleet_id=fleet, timeout_s=300, row=4, attempt=2)
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
        return runner.run(request(command, RunnerKind.DOCKER, fleet_id=fleet, row=row, timeout_s=30, slot=Slot(port=ports[row]),
                                  probe_url=probe and f"http://127.0.0.1:{ports[row]}{probe}"), print)

    served, broken, own_ok, own_bad = await asyncio.gather(
        run(0), run(1, "-e COMPLETIONS=fail"), run(2, "-e COMPLETIONS=fail", probe="/health"), run(3, probe="/nope"))

    assert served.passed and served.phase is TestPhase.PROBE, served.log_tail
    assert "GET /v1/models -> 200 OK" in served.log_tail and "POST /v1/completions -> 200 OK" in served.log_tail
    assert not broken.passed and broken.phase is TestPhase.PROBE
    assert "POST /v1/completions (model org/m): reached BOOTS" in broken.log_tail and "HTTP 500" in broken.log_tail
    assert "the engine failed to generate" in broken.log_tail, "the server's own error goes into the log"
    verdict = classify(broken.exit_code, broken.log_tail, broken.phase)
    assert verdict.category is ErrorCategory.PROBE_FAILED, verdict
    assert own_ok.passed and "/v1/completions" not in own_ok.log_tail, "the row's probe replaces the default one"
    assert not own_bad.passed and classify(own_bad.exit_code, own_bad.log_tail, own_bad.phase).category is ErrorCategory.PROBE_FAILED
    assert "HTTP 404" in own_bad.log_tail
    assert fleet_containers(fleet) == []


async def test_process_runner_kills_an_interrupted_earlier_run_of_the_row_before_it_starts(tmp_path: Path):
    """What a worker crash leaves behind: the row's marker names a live process group (its own session,
    so the worker's death did not take it). The retry kills that group first, then runs the test."""
    import os
    import signal
    import sys

    from activities.containers._marker import RowMarker, group_members

    markers = tmp_path / "fleet-rows"
    orphan = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(300)"], start_new_session=True)
    try:
        RowMarker(markers, "crashy", 3).started(orphan.pid, attempt=1)
        runner = ProcessRunner(FileStore(tmp_path / "a"), marker_dir=markers)
        out = await runner.run(request('python -c "print(42)"', fleet_id="crashy", row=3), print)
        assert orphan.wait(timeout=10) == -signal.SIGKILL, "the earlier run was killed"
        assert out.passed and out.test_runs == 2
        assert "1 earlier run(s) of this test were interrupted (1 still running and killed first)" in out.log_tail
        assert not (markers / "crashy-3.json").exists(), "a run that ended clears the marker"
        again = await runner.run(request('python -c "print(42)"', fleet_id="crashy", row=3), print)
        assert again.test_runs == 1 and "interrupted" not in again.log_tail
        assert group_members(orphan.pid) == []
    finally:
        if orphan.poll() is None:
            os.killpg(orphan.pid, signal.SIGKILL)


async def test_process_runner_finds_a_run_whose_worker_died_between_intent_and_pid_by_its_tag(tmp_path: Path):
    """The marker records the intent (a tag the child carries in FLEETFORGE_RUN_TAG) before the spawn; a
    worker killed before it wrote the pid leaves an intent only. The retry finds the run by its tag in
    /proc/PID/environ, kills it, and counts the rerun."""
    import os
    import signal
    import sys

    from activities.containers._marker import TAG_VAR, RowMarker

    markers = tmp_path / "fleet-rows"
    tag = RowMarker(markers, "crashy", 4).intend(attempt=1)
    orphan = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(300)"], start_new_session=True,
                              env={**os.environ, TAG_VAR: tag})
    try:
        out = await ProcessRunner(FileStore(tmp_path / "a"), marker_dir=markers).run(
            request('python -c "print(42)"', fleet_id="crashy", row=4), print)
        assert out.passed and out.test_runs == 2, out.log_tail
        assert "(1 still running and killed first)" in out.log_tail
        assert orphan.wait(timeout=30) == -signal.SIGKILL, "the run found by its tag was killed"
    finally:
        if orphan.poll() is None:
            os.killpg(orphan.pid, signal.SIGKILL)


async def test_a_tagged_run_that_the_first_scan_of_proc_missed_is_killed_by_the_next(tmp_path: Path, monkeypatch):
    """Each scan of /proc kills what it finds and only two empty scans end the search: a run that the first
    scan missed (a process in the middle of an exec shows no environment for a moment: the likely cause of
    a CI failure where a just-spawned run outlived the retry) is killed by the next. Before, an empty first
    scan killed nothing and the later scans only waited 10 s for what they found to end."""
    import os
    import signal
    import sys

    from activities.containers import _marker

    real_scan, scans = _marker.tagged_processes, []

    def missing_once(tag: str) -> list[int]:
        scans.append(tag)
        return [] if len(scans) == 1 else real_scan(tag)

    monkeypatch.setattr(_marker, "tagged_processes", missing_once)
    markers = tmp_path / "fleet-rows"
    tag = _marker.RowMarker(markers, "crashy", 6).intend(attempt=1)
    orphan = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(300)"], start_new_session=True,
                              env={**os.environ, _marker.TAG_VAR: tag})
    try:
        started = time.monotonic()
        leftovers = await _marker.RowMarker(markers, "crashy", 6).stop_leftovers(print)
        assert orphan.wait(timeout=30) == -signal.SIGKILL, "the second scan killed the run the first one missed"
        assert time.monotonic() - started < _marker.KILL_WAIT_S, "killed, not waited out"
        assert [(lo.pid, lo.killed) for lo in leftovers] == [(orphan.pid, True)]
    finally:
        if orphan.poll() is None:
            os.killpg(orphan.pid, signal.SIGKILL)


async def test_a_sandboxed_run_is_found_by_its_tag_alone_even_when_its_command_clears_its_environment(tmp_path: Path):
    """The process runner records no pid: its marker holds the intent's tag only, which bubblewrap's own
    argv carries. A command that re-executes itself with an empty environment (no tag left in it) is still
    found through bubblewrap, and killing bubblewrap's init ends everything in its namespace."""
    import os
    import sys

    from activities.containers._marker import TAG_VAR, RowMarker, tagged_processes
    from activities.sandbox import Limits, SandboxPolicy, spawn_child

    markers = tmp_path / "fleet-rows"
    tag = RowMarker(markers, "crashy", 5).intend(attempt=1)
    token = uuid.uuid4().hex
    # the token appears in an argv only once the command re-executed itself (spelled backwards before)
    hide = (f"import os, sys; os.execve(sys.executable, [sys.executable, '-c', 'import time; time.sleep(300)', "
            f"'{token[::-1]}'[::-1]], {{}})")

    def hidden_command() -> list[int]:
        return [int(e.name) for e in os.scandir("/proc") if e.name.isdigit() and token.encode() in proc_bytes(e.name, "cmdline")]

    (tmp_path / "scratch").mkdir()
    orphan = spawn_child([sys.executable, "-c", hide], scratch=tmp_path / "scratch", policy=SandboxPolicy(network=True),
                         limits=Limits(timeout_s=300, memory_bytes=0), env={TAG_VAR: tag})
    try:
        await assert_eventually(lambda: len(tagged_processes(tag)) >= 2 and hidden_command(),
                                message="the command runs without the tag; bubblewrap and its init carry it")
        assert not any(tag.encode() in proc_bytes(pid, "environ") for pid in hidden_command()), "the command's environment is empty"
        out = await ProcessRunner(FileStore(tmp_path / "a"), marker_dir=markers).run(
            request('python -c "print(42)"', fleet_id="crashy", row=5), print)
        assert out.passed and out.test_runs == 2, out.log_tail
        assert "(1 still running and killed first)" in out.log_tail
        assert orphan.proc.wait(timeout=10) is not None, "bubblewrap was killed"
        assert tagged_processes(tag) == [], "and nothing of the sandbox is left"
        await assert_eventually(lambda: hidden_command() == [], message="the command ended with its namespace")
    finally:
        orphan.kill()
    assert not (markers / "crashy-5.json").exists()


async def test_process_runner_leaves_no_process_of_the_test_behind(tmp_path: Path, file_store):
    """A test that starts a background server and exits: nothing of it outlives the test. The test runs in
    the sandbox (its own PID namespace), so its folder, not a pid, identifies it from outside."""
    from tests.unit.test_isolate import host_processes_in

    command = ('python -c "import os, subprocess, sys; subprocess.Popen([sys.executable, \'-c\', '
               '\'import time; time.sleep(300)\']); print(os.getcwd())"')
    out = await ProcessRunner(file_store, marker_dir=tmp_path / "m").run(request(command), print)
    assert out.passed, out.log_tail
    folder = out.log_tail.strip()
    assert folder.startswith("/") and "fleetforge-row-" in folder
    assert host_processes_in(folder) == [], "the test's background child is gone when the row ends"
    assert not Path(folder).exists(), "and so is its scratch folder"


async def test_a_row_ends_when_its_command_exits_not_at_the_next_poll(file_store, monkeypatch):
    """The runner learns of the exit from the child's pidfd: with polls 60 s apart, a command that exits at
    once still ends its row at once. Without a pidfd (an old kernel) the polls find the exit."""
    from activities.containers import runners

    monkeypatch.setattr(runners, "EXIT_POLL_S", 60.0)
    out = await asyncio.wait_for(ProcessRunner(file_store).run(request('python -c "print(42)"'), print), 30)
    assert out.passed and out.log_tail.strip() == "42"

    def no_pidfd(pid: int) -> int:
        raise OSError(38, "Function not implemented")

    monkeypatch.setattr(runners, "EXIT_POLL_S", 0.05)
    monkeypatch.setattr(runners.os, "pidfd_open", no_pidfd)
    out = await ProcessRunner(file_store).run(request('python -c "print(43)"'), print)
    assert out.passed and out.log_tail.strip() == "43"


async def test_the_process_runner_tells_the_test_its_slot(file_store):
    out = await ProcessRunner(file_store).run(request(
        'python -c "import os; print(os.environ[\'PORT\'], os.environ[\'CUDA_VISIBLE_DEVICES\'])"',
        slot=Slot(port=9123, devices=(2, 3))), print)
    assert out.passed and out.log_tail.strip() == "9123 2,3"


@pytest.mark.docker
async def test_docker_runner_reports_a_rerun_when_it_replaces_a_stale_container(tmp_path: Path, docker_image: str):
    fleet = f"t-{uuid.uuid4().hex[:6]}"
    port = free_ports()[0]
    req = docker_request(f"docker run --network host -e PORT={{port}} -e MODEL_NAME=org/m {docker_image}", port,
                         fleet_id=fleet, timeout_s=30)
    name = container_name(fleet, "0-org/m", 1)
    stale = subprocess.run(["docker", "create", "--name", name, docker_image, "true"], capture_output=True, text=True,
                           timeout=60)
    assert stale.returncode == 0, stale.stderr
    out = await DockerRunner(FileStore(tmp_path / "a"), poll_s=0.2).run(req, print)
    assert out.passed and out.test_runs == 2, out.log_tail
    assert "1 earlier run(s) of this test were interrupted (its container was removed)" in out.log_tail
    assert fleet_containers(fleet) == []


@pytest.mark.docker
async def test_docker_runner_probes_only_the_rows_port_and_only_its_own_server(tmp_path: Path, docker_image: str):
    """Three rows: a busy slot port is PORT_IN_USE before anything starts; the row's own container (it
    provably holds the port) listing another model name is MODEL_MISMATCH, the model's No, never a pass (owning
    the port says whose server it is, not which model it serves); a foreign server that answers on the row's
    port while the row's own container never serves is FOREIGN_SERVER, never a pass."""
    fleet = f"t-{uuid.uuid4().hex[:6]}"
    busy_port, alias_port, foreign_port = free_ports(3)
    runner = DockerRunner(FileStore(tmp_path / "a"), poll_s=0.2)

    class Models(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # noqa: N802
            body = b'{"data": [{"id": "org/other"}]}' if self.path == "/v1/models" else b"{}"
            self.send_response(200)
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args) -> None:
            pass

    squatter = http.server.ThreadingHTTPServer(("127.0.0.1", busy_port), Models)
    threading.Thread(target=squatter.serve_forever, daemon=True).start()
    foreign: list[http.server.ThreadingHTTPServer] = []

    def start_foreign_once_the_container_runs(msg: str) -> None:
        if msg.startswith("waiting for") and not foreign:  # after the free-port check and `docker run`
            foreign.append(http.server.ThreadingHTTPServer(("127.0.0.1", foreign_port), Models))
            threading.Thread(target=foreign[0].serve_forever, daemon=True).start()

    try:
        busy = await runner.run(docker_request(f"docker run --network host -e PORT={{port}} {docker_image}", busy_port,
                                               fleet_id=fleet, row=0, timeout_s=30), print)
        alias = await runner.run(docker_request(f"docker run --network host -e PORT={{port}} -e MODEL_NAME=served-alias "
                                                f"{docker_image}", alias_port, fleet_id=fleet, row=1, timeout_s=30), print)
        stranger = await runner.run(docker_request(f"docker run --network host -e PORT={{port}} -e DELAY=300 {docker_image}",
                                                   foreign_port, fleet_id=fleet, row=2, timeout_s=30),
                                    start_foreign_once_the_container_runs)
    finally:
        squatter.shutdown()
        for server in foreign:
            server.shutdown()

    assert not busy.passed and classify(busy.exit_code, busy.log_tail, busy.phase).category is ErrorCategory.PORT_IN_USE
    assert "GET /" not in busy.log_tail, "the container never started"
    assert not alias.passed and alias.phase is TestPhase.MISMATCH, alias.log_tail
    mismatch = classify(alias.exit_code, alias.log_tail, alias.phase)
    assert mismatch.category is ErrorCategory.MODEL_MISMATCH and "lists ['served-alias'], not 'org/m'" in mismatch.reason
    assert alias.evidence is not None and alias.evidence.owner and alias.evidence.listed == ("served-alias",)
    assert not stranger.passed and stranger.phase is TestPhase.IDENTITY, stranger.log_tail
    verdict = classify(stranger.exit_code, stranger.log_tail, stranger.phase)
    assert verdict.category is ErrorCategory.FOREIGN_SERVER and "lists ['org/other'], not 'org/m'" in verdict.reason
    assert fleet_containers(fleet) == []


def test_listening_pids_names_the_owner_of_a_port():
    import os
    import socket

    from activities.containers._ports import listening_pids, port_taken

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        port = s.getsockname()[1]
        assert port_taken(port)
        assert listening_pids(port, [os.getpid()]) == {os.getpid()}
        assert listening_pids(port, [1]) in (set(), None), "pid 1 does not hold it"
    assert listening_pids(port, [os.getpid()]) is None, "nobody listens any more"
    assert not port_taken(port)


async def test_a_process_runner_command_runs_in_the_sandbox(tmp_path: Path, file_store, monkeypatch):
    """An LLM wrote the command: it runs through the one sandbox. It shares the host's network (its server
    must answer on 127.0.0.1) but sees no other process, none of the worker's files or secrets, and is not root."""
    from activities import sandbox

    monkeypatch.setenv("FLEETFORGE_LLM_API_KEY", "sk-planted-runner")
    state = Path(__file__).resolve().parents[2] / "test-artifacts" / f"state-{uuid.uuid4().hex[:8]}"
    (state / "artifacts").mkdir(parents=True)
    (state / "artifacts" / "model.onnx").write_bytes(b"x")
    probe = ("import json, os; h = sys.argv[1]; print(json.dumps({'uid': os.getuid(), 'env': sorted(os.environ), "
             "'processes': len([p for p in os.listdir('/proc') if p.isdigit()]), "
             "'hidden': os.listdir(h) if os.path.isdir(h) else 'absent'}))")
    sandbox.configure("bwrap", hidden=[state])
    try:
        out = await ProcessRunner(file_store).run(request(f'python -c "import sys; {probe}" {state / "artifacts"}'), print)
    finally:
        sandbox.configure("bwrap")
        shutil.rmtree(state)
    assert out.passed, out.log_tail
    found = json.loads(out.log_tail.strip().splitlines()[-1])
    assert found["hidden"] in ("absent", []) and found["processes"] <= 3
    assert found["uid"] != 0 and "FLEETFORGE_LLM_API_KEY" not in found["env"] and "PORT" not in found["env"]


async def test_a_row_cancelled_while_its_command_starts_leaves_nothing_running(tmp_path: Path, file_store, monkeypatch):
    """The spawn and the marker's durable record happen in a worker thread; a cancellation that arrives
    meanwhile must still kill the command once it exists (it would otherwise run on, unowned)."""
    from activities.containers import _marker, runners

    started, release = threading.Event(), threading.Event()
    tags: list[str] = []
    spawn = runners.spawn_child

    def slow_spawn(*args, **kwargs):
        child = spawn(*args, **kwargs)
        tags.append(kwargs["env"][_marker.TAG_VAR])
        started.set()
        release.wait(30)  # the row is cancelled while its start is still under way
        return child

    monkeypatch.setattr(runners, "spawn_child", slow_spawn)
    runner = ProcessRunner(file_store, marker_dir=tmp_path / "m")
    task = asyncio.create_task(runner.run(request('python -c "import time; time.sleep(300)"'), print))
    try:
        assert await asyncio.to_thread(started.wait, 30), "the command started"
        # a child in the middle of its exec shows no environment for a moment: look until it does
        await assert_eventually(lambda: _marker.tagged_processes(tags[0]), timeout=10,
                                message="it runs while its start is under way")
        task.cancel()  # the task's await of the start is cancelled now, whenever the start returns
    finally:
        release.set()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert _marker.tagged_processes(tags[0]) == [], "the cancelled row's command is gone"
