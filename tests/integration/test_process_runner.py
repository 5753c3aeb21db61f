"""The process runner's contract (issue 40), with real sandboxed processes (bubblewrap): a command in server
mode is probed like a container while it runs on $PORT, then stopped; a self-test's exit code is its verdict,
SERVES at most; a command that fails on a path our sandbox hides is our Error naming the path and the
`--share` that shows it, never the model's No. The server is tests/doubles/model_server.py."""

from __future__ import annotations

import shutil
import socket
import uuid
from pathlib import Path

import pytest

from activities.containers._ports import port_taken
from activities.containers.runners import ProcessRunner
from activities.containers.taxonomy import classify
from activities.storage import FileStore
from contracts.fleet import ErrorCategory, HardwareProfile, RowStatus, Slot, TestPhase, Tier, row_status
from contracts.fleet_job import ProcessMode, RunnerKind, RunTestRequest, TestOutcome
from tests.doubles import model_server
from tests.helpers import free_ports

SERVER = "python3 -m tests.doubles.model_server"


async def run(tmp_path: Path, command: str, *, model: str = "acme/m", mode: ProcessMode = ProcessMode.SERVER,
              require: Tier = Tier.SERVES, shares: tuple[str, ...] = (), timeout_s: float = 30,
              reference: str | None = None, port: int | None = None) -> TestOutcome:
    given, port = port, port or free_ports()[0]
    req = RunTestRequest(fleet_id=f"p-{uuid.uuid4().hex[:6]}", row=0, model_name=model, attempt=1,
                         command=command.replace("{port}", str(port)), runner=RunnerKind.PROCESS,
                         hardware=HardwareProfile(gpu_count=0), slot=Slot(port=port), timeout_s=timeout_s,
                         require_tier=require, process_mode=mode, shares=shares, reference=reference)
    out = await ProcessRunner(FileStore(tmp_path / "a"), poll_s=0.1, marker_dir=tmp_path / "m").run(req, print)
    assert given or not port_taken(port), "nothing of the test outlives it"
    return out


def verdict(out: TestOutcome) -> tuple[RowStatus, ErrorCategory | None]:
    if out.passed:
        return RowStatus.YES, None
    category = classify(out.exit_code, out.log_tail, out.phase).category
    return row_status(False, category.value), category


async def test_a_long_running_server_on_port_is_yes_at_the_tier_its_answers_earn(tmp_path: Path):
    served = await run(tmp_path, f"{SERVER} --model acme/m")
    assert verdict(served) == (RowStatus.YES, None) and served.tier is Tier.SENSIBLE, served.log_tail
    assert served.evidence is not None and served.evidence.line().startswith(
        "healthy; lists its model as acme/m; asked it 3 prompts: 3/3 answered, 0 errors, 3 sensible")
    assert "POST /v1/completions" in served.log_tail, "the server's own log is the row's log"
    matches = await run(tmp_path, f"{SERVER} --model acme/m", require=Tier.MATCHES, reference="Paris.")
    assert verdict(matches) == (RowStatus.YES, None) and matches.tier is Tier.MATCHES


async def test_the_rows_command_serving_another_model_is_a_mismatch_never_yes(tmp_path: Path):
    """The command's own processes hold the port (seen through the sandbox's PID namespace), so the listing
    is the command's doing: the model's No with the ids seen."""
    liar = await run(tmp_path, f"{SERVER} --model someone/else", model="acme/liar-1b")
    assert verdict(liar) == (RowStatus.NO, ErrorCategory.MODEL_MISMATCH), liar.log_tail
    assert liar.evidence is not None and liar.evidence.owner and liar.evidence.requests == 0
    assert liar.evidence.line() == "healthy; lists someone/else, not its model"
    alias = await run(tmp_path, f"{SERVER} --model acme/m --served-model-name m-chat")
    assert verdict(alias) == (RowStatus.YES, None) and alias.evidence and alias.evidence.asked == "m-chat"


async def test_a_command_that_serves_nothing_is_not_above_the_tier_its_mode_allows(tmp_path: Path):
    """Issue 40: `python3 -c "print(...)"` was `Yes, passed`. As a server it never served: No (NONE), with
    what to do; as a self-test its exit 0 is its verdict, SERVES at most, and more is unprovable (Error)."""
    command = 'python3 -c "print(42)"'
    server = await run(tmp_path, command)
    assert verdict(server) == (RowStatus.NO, ErrorCategory.NOT_HEALTHY) and server.tier is Tier.NONE, server.log_tail
    assert "--process-mode self-test" in classify(server.exit_code, server.log_tail, server.phase).reason
    self_test = await run(tmp_path, command, mode=ProcessMode.SELF_TEST)
    assert verdict(self_test) == (RowStatus.YES, None) and self_test.tier is Tier.SERVES
    assert self_test.evidence is not None and self_test.evidence.line() == "own test passed: exit 0 (self-test)"
    sensible = await run(tmp_path, command, mode=ProcessMode.SELF_TEST, require=Tier.SENSIBLE)
    assert verdict(sensible) == (RowStatus.ERROR, ErrorCategory.TIER_UNPROVABLE)


async def test_a_server_that_never_answers_health_is_not_healthy_and_one_that_crashes_is_crashed(tmp_path: Path):
    slow = await run(tmp_path, 'python3 -c "import time; time.sleep(60)"', timeout_s=2)
    assert verdict(slow) == (RowStatus.NO, ErrorCategory.NOT_HEALTHY) and slow.phase is TestPhase.HEALTH
    assert "not healthy within 2s (--test-timeout) on port" in slow.log_tail
    crashed = await run(tmp_path, 'python3 -c "import sys; sys.exit(3)"')
    assert verdict(crashed) == (RowStatus.NO, ErrorCategory.CRASHED) and crashed.exit_code == 3


async def test_a_port_held_by_another_process_is_our_error_before_the_command_starts(tmp_path: Path):
    with socket.socket() as squatter:
        squatter.bind(("127.0.0.1", 0))
        squatter.listen()
        port = squatter.getsockname()[1]
        out = await run(tmp_path, f"{SERVER} --model acme/m", port=port)
    assert verdict(out) == (RowStatus.ERROR, ErrorCategory.PORT_IN_USE), out.log_tail
    assert "serving acme/m" not in out.log_tail, "the command never started"


@pytest.fixture
def shared(tmp_path: Path) -> Path:
    """The issue's case: the server script in a folder under the host's /tmp, readable by others."""
    folder = tmp_path / "llm"
    folder.mkdir(mode=0o755)
    shutil.copy(model_server.__file__, folder / "fake_llm.py")
    (folder / "fake_llm.py").chmod(0o644)
    assert str(folder).startswith("/tmp/"), folder
    return folder


@pytest.mark.parametrize("mode", [ProcessMode.SERVER, ProcessMode.SELF_TEST])
async def test_a_script_in_an_unshared_tmp_folder_is_our_error_naming_it_and_shared_it_is_yes(
        tmp_path: Path, shared: Path, mode: ProcessMode):
    """Issue 40's false No: `can't open file '/tmp/.../fake_llm.py'` was the model's CRASHED. The sandbox hid
    it: an Error naming the path and the option that shares it; with that option the row is Yes."""
    script = shared / "fake_llm.py"
    command = f"python3 {script} --model acme/m" if mode is ProcessMode.SERVER else f"python3 {script} --help"
    hidden = await run(tmp_path, command, mode=mode)
    assert verdict(hidden) == (RowStatus.ERROR, ErrorCategory.SANDBOX_HIDDEN), hidden.log_tail
    reason = classify(hidden.exit_code, hidden.log_tail, hidden.phase).reason
    assert reason.startswith(f"{script}: rerun with --share {shared} "), reason
    seen = await run(tmp_path, command, mode=mode, shares=(str(shared),))
    assert verdict(seen) == (RowStatus.YES, None), seen.log_tail


async def test_a_file_under_the_worker_home_is_hidden_too_and_a_missing_file_is_the_commands_own(tmp_path: Path):
    home = Path.home() / f".ff-test-{uuid.uuid4().hex[:6]}"
    home.mkdir(mode=0o755)
    try:
        shutil.copy(model_server.__file__, home / "fake_llm.py")
        hidden = await run(tmp_path, f"python3 {home / 'fake_llm.py'} --model acme/m")
    finally:
        shutil.rmtree(home)
    assert verdict(hidden) == (RowStatus.ERROR, ErrorCategory.SANDBOX_HIDDEN), hidden.log_tail
    assert f"--share {home}" in hidden.log_tail
    missing = await run(tmp_path, "python3 /tmp/ff-no-such-dir/fake_llm.py --model acme/m")
    assert verdict(missing) == (RowStatus.NO, ErrorCategory.CRASHED), "not on this host either: the command's mistake"
