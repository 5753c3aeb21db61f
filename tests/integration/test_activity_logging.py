"""Every log line from an activity carries workflow id, run id, activity type and attempt, and a
FleetforgeError leaves the activity as an ApplicationError with its stable code as the type."""

from __future__ import annotations

import uuid
from datetime import timedelta

from temporalio import activity, workflow
from temporalio.common import RetryPolicy

with workflow.unsafe.imports_passed_through():
    import pytest
    import structlog
    from structlog.testing import LogCapture
    from temporalio.client import WorkflowFailureError
    from temporalio.exceptions import ActivityError, ApplicationError

    from activities.logs import get_logger
    from contracts.errors import Err, FleetforgeError
    from tests.helpers import new_worker


@activity.defn
def log_something(fail: bool) -> str:
    get_logger("test").info("inside activity")
    if fail:
        raise FleetforgeError(Err.MODEL_NOT_FOUND, "no such model")
    return "ok"


@workflow.defn
class LogWorkflow:
    @workflow.run
    async def run(self, fail: bool) -> str:
        return await workflow.execute_activity(
            log_something, fail, start_to_close_timeout=timedelta(seconds=10),
            retry_policy=RetryPolicy(maximum_attempts=3, initial_interval=timedelta(milliseconds=10)),
        )


@pytest.fixture
def captured():
    cap = LogCapture()
    old = structlog.get_config()
    structlog.configure(processors=[structlog.contextvars.merge_contextvars, cap])
    try:
        yield cap
    finally:
        structlog.configure(**old)


async def test_activity_log_lines_carry_temporal_context(temporal_env, captured: LogCapture):
    async with new_worker(temporal_env.client, workflows=[LogWorkflow], activities=[log_something]) as w:
        wf_id = f"log/{uuid.uuid4().hex[:8]}"
        assert await temporal_env.client.execute_workflow(LogWorkflow.run, False, id=wf_id, task_queue=w.task_queue) == "ok"
    [entry] = [e for e in captured.entries if e["event"] == "inside activity"]
    assert entry["workflow_id"] == wf_id
    assert entry["activity"] == "log_something" and entry["attempt"] == 1 and entry["run_id"]


async def test_fleetforge_error_becomes_non_retryable_application_error(temporal_env, captured: LogCapture):
    async with new_worker(temporal_env.client, workflows=[LogWorkflow], activities=[log_something]) as w:
        with pytest.raises(WorkflowFailureError) as info:
            await temporal_env.client.execute_workflow(
                LogWorkflow.run, True, id=f"log/{uuid.uuid4().hex[:8]}", task_queue=w.task_queue
            )
    activity_error = info.value.cause
    assert isinstance(activity_error, ActivityError)
    app = activity_error.cause
    assert isinstance(app, ApplicationError) and app.type == Err.MODEL_NOT_FOUND and app.non_retryable
    assert len([e for e in captured.entries if e["event"] == "inside activity"]) == 1, "non-retryable: one attempt"


async def test_a_classified_failure_logs_one_line_and_no_traceback(temporal_env, captured: LogCapture, caplog):
    caplog.set_level("DEBUG", logger="temporalio")
    async with new_worker(temporal_env.client, workflows=[LogWorkflow], activities=[log_something]) as w:
        with pytest.raises(WorkflowFailureError):
            await temporal_env.client.execute_workflow(
                LogWorkflow.run, True, id=f"log/{uuid.uuid4().hex[:8]}", task_queue=w.task_queue
            )
    failed = [r for r in caplog.records if "Completing activity as failed" in r.getMessage()]
    assert failed and all(r.levelname == "DEBUG" for r in failed), "an expected verdict is not a worker warning"
    assert not any(r.exc_info and r.levelno >= 30 for r in caplog.records), "no traceback at warning level or above"
    [line] = [e for e in captured.entries if e["event"] == "activity failed"]
    assert line["code"] == "MODEL_NOT_FOUND" and line["message"] == "no such model"
