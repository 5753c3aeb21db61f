"""Acceptance: the worker is SIGKILLed while it verifies a candidate; a fresh worker retries the
verification and the kernel job completes with exactly one trace entry per step, and the scratch folder the
killed verification left in the temp dir is gone once the fresh worker has started (activities/scratch.py).

The whole job (workflow, agents, verifier) runs in a real `python worker.py` (WorkerProcess), so
the kill takes the workflow worker, the activity and the verifier's children down together.
"""

from __future__ import annotations

import os
import uuid
from pathlib import Path

import pytest

from activities.kernels.config_loader import load_workflow_config
from activities.storage import open_store
from client.artifacts import kernel_trace
from contracts.common import JobKind
from contracts.kernel import KernelTask
from contracts.kernel_job import KernelOutcome, KernelRequest, KernelResult
from tests.helpers import assert_eventually
from tests.reliability.worker_process import WorkerProcess, running_activity
from workflows._visibility import start_attributes
from workflows.conductor import ConductorWorkflow

RELU = (Path(__file__).resolve().parents[2] / "examples" / "kernels" / "relu.py").read_text()
LARGER_RELU = RELU.replace("batch_size = 7", "batch_size = 64").replace("dim = 1000", "dim = 4099")
"""A larger input so the candidate child is busy for a while (the kill must land mid-verification)."""


@pytest.mark.slow
async def test_worker_killed_mid_verification_completes_after_restart_with_one_entry_per_step(temporal_env, tmp_path):
    client = temporal_env.client
    wp = WorkerProcess(client, tmp_path / "state")
    task = KernelTask(op_name="relu", task_desc=LARGER_RELU, task_id=f"relu-crash-{uuid.uuid4().hex[:6]}",
                      arch="cpu-interpreter", workflow="coder_only")
    req = KernelRequest(task=task, config=load_workflow_config("coder_only"), queues=wp.queues, verify_timeout_s=120)
    wf_id = f"kernel/{task.task_id}"
    async with wp:
        handle = await client.start_workflow(ConductorWorkflow.run, req, id=wf_id, task_queue=wp.queues.workflows,
                                             search_attributes=start_attributes(JobKind.KERNEL, task.op_name))
        await assert_eventually(lambda: running_activity(client, wf_id, "verify"), timeout=60, interval=0.2,
                                message="the verifier started on the worker process")
        left = await assert_eventually(lambda: scratch_folders(wp.proc.pid), timeout=60, interval=0.1,
                                       message="the verification made its scratch folder")
        wp.kill()
        assert all(folder.is_dir() for folder in left), "a SIGKILLed worker removes nothing"
        await wp.start()
        assert [folder for folder in left if folder.exists()] == [], "the fresh worker swept the killed one's folder"
        result: KernelResult = await handle.result()

    assert result.outcome is KernelOutcome.VERIFIED, result.report
    trace = kernel_trace(open_store(wp.settings), result)
    assert [(e.step, e.agent, e.ok) for e in trace] == [(1, "coder", True), (2, "verifier", True)]

    history = await handle.fetch_history()
    scheduled = {e.event_id: e.activity_task_scheduled_event_attributes.activity_type.name
                 for e in history.events if e.HasField("activity_task_scheduled_event_attributes")}
    verify_starts = [e.activity_task_started_event_attributes.attempt for e in history.events
                     if e.HasField("activity_task_started_event_attributes")
                     and scheduled[e.activity_task_started_event_attributes.scheduled_event_id] == "verify"]
    assert verify_starts == [2], "one verification, completed by its second attempt (the first died with the worker)"
    assert list(scheduled.values()).count("verify") == 1


def scratch_folders(pid: int) -> list[Path]:
    """The scratch folders process `pid` holds open (and locked): a verification's, while it runs."""
    fds = Path(f"/proc/{pid}/fd")
    paths = []
    for fd in fds.iterdir():
        try:
            paths.append(Path(os.readlink(fd)))
        except OSError:  # closed meanwhile
            continue
    return [p for p in paths if p.name.startswith("fleetforge-verify-")]
