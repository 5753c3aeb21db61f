"""The script runner across a killed worker (issue 27): the worker (a real process running the
ScriptRunner, killed with its process group; the script, in a session of its own, survives as in a real
crash) is killed while the script runs; the retry kills the script still running, runs it again and says
the test ran twice. The script itself counts its starts: that count is the judge."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

from activities.containers.runners import ScriptRunner
from activities.storage import FileStore
from contracts.fleet import HardwareProfile
from contracts.fleet_job import RunnerKind, RunTestRequest
from tests.helpers import alive, assert_eventually

REPO = Path(__file__).resolve().parents[2]

SCRIPT = """#!/bin/sh
# test_models.sh MODEL COMMAND: the first run hangs (a model loading), later runs pass at once
echo $$ >> {starts}
[ "$(wc -l < {starts})" -gt 1 ] && exit 0
exec sleep 300
"""


async def test_a_script_test_interrupted_by_a_killed_worker_is_stopped_rerun_and_reported(tmp_path: Path):
    starts = tmp_path / "starts.txt"
    script = tmp_path / "test_models.sh"
    script.write_text(SCRIPT.format(starts=starts))
    script.chmod(0o755)
    req = RunTestRequest(fleet_id="script-kill", row=2, model_name="org/m", attempt=1, command="serve org/m",
                         runner=RunnerKind.SCRIPT, hardware=HardwareProfile(gpu_count=0), timeout_s=60)
    (tmp_path / "req.json").write_text(req.model_dump_json())
    worker = subprocess.Popen([sys.executable, "-m", "tests.reliability.script_row_process", str(tmp_path / "req.json"),
                               str(script), str(tmp_path / "markers"), str(tmp_path / "store")], cwd=REPO,
                              env={**os.environ, "PYTHONPATH": str(REPO)}, start_new_session=True)
    await assert_eventually(lambda: starts.exists() and starts.read_text().endswith("\n"), timeout=60,
                            message="the script's first run started")
    first = int(starts.read_text().split()[0])
    os.killpg(worker.pid, signal.SIGKILL)
    worker.wait(timeout=30)
    assert alive(first), "the script outlives the killed worker (its own session)"
    out = await ScriptRunner(FileStore(tmp_path / "store"), script, marker_dir=tmp_path / "markers").run(req, print)
    assert not alive(first), "the interrupted run was killed before the rerun"
    assert len(starts.read_text().split()) == 2, "the script ran exactly twice"
    assert out.passed and out.test_runs == 2, out.log_tail
    assert "1 earlier run(s) of this test were interrupted (1 still running and killed first)" in out.log_tail
