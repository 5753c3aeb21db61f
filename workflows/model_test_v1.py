"""The model-test flow of rows started before slots and the agent ladder (patch `fleet-row-slots`).

Kept so a row that was running when the workers were upgraded replays and finishes: the same
commands in the same order as before (write → [LLM] → check → [approve] → run → classify per
attempt). Such a row runs without a slot (the activities keep their slot-less behaviour for it) and
its verdict is not recorded per row (the fleet's batch still carries it). New rows never come here.
"""

from __future__ import annotations

import asyncio
from datetime import datetime, timedelta

from temporalio import workflow
from temporalio.exceptions import ActivityError

with workflow.unsafe.imports_passed_through():
    import workflows._visibility as ui  # this form is passed through (from-imports of our package run per workflow)
    from activities.containers import llm_writer
    from activities.containers.activities import ContainerActivities
    from contracts.common import Failure, JobStatus
    from contracts.fleet import Classification, ErrorCategory
    from contracts.fleet_job import (
        AttemptRecord, ClassifyRequest, CommandSource, CommandWriterContext, ModelTestRequest, ModelTestResult,
        PolicyCheckRequest, PreviousAttempt, RunnerKind, RunTestRequest, TestOutcome, WriteCommandRequest,
        WriteCommandResult,
    )
    from workflows._call_options import CONTAINER, LOCAL
    from workflows._llm import ask
    from workflows.failures import failure_from
    from workflows.job_end import end_failed, is_cancellation, mark_cancelled
    from workflows.fleet_policy import Finish, Retry, model_result, next_after_attempt, rejection, writer_gave_up

ROW_SLOTS_PATCH = "fleet-row-slots"
"""Rows from here on: slots, the agent ladder, Yes/No/Error, the verdict saved per row."""


def _local(summary: str) -> dict:
    return dict(summary=summary, start_to_close_timeout=LOCAL.start_to_close, retry_policy=LOCAL.retry)


class RowBeforeSlots:
    """Mixin of ModelTestWorkflow: `_v1_run` is the flow rows ran before ROW_SLOTS_PATCH (it uses the
    workflow's own state: attempts, LLM calls, approval)."""

    async def _v1_run(self, req: ModelTestRequest) -> ModelTestResult:
        started = workflow.now()
        history: list[Classification] = []
        finish: Finish | None = None
        try:
            for attempt in range(1, req.max_attempts + 1):
                written = await self._v1_write(req, attempt, history)
                if written.command is None:
                    finish = writer_gave_up(history, written.reason)
                    break
                match next_after_attempt(await self._v1_attempt(req, attempt, written), attempt, req.max_attempts):
                    case Finish() as done:
                        finish = done
                        break
                    case Retry(failure):
                        history.append(failure)
        except (ActivityError, asyncio.CancelledError) as e:
            if is_cancellation(e):
                mark_cancelled()
                raise
            failure = failure_from(e, where=f"attempt {len(self._attempts) + 1}")
            finish = Finish(passed=False, category=ErrorCategory.TRANSIENT.value, reason=f"{failure.code}: {failure.message}")
        assert finish is not None
        self._show("passed" if finish.passed else "failed", f"{finish.category}: {finish.reason}" if finish.category else "")
        await workflow.wait_condition(workflow.all_handlers_finished)
        result = model_result(req.row, self._model, self._attempts, finish,
                              (workflow.now() - started).total_seconds(), self._tokens())
        if finish.passed:
            ui.set_status(JobStatus.COMPLETED)
            return result
        return end_failed(result, Failure(code=finish.category or ErrorCategory.UNKNOWN.value, message=finish.reason,
                                          where=f"row {req.row} attempt {len(self._attempts)}"))

    async def _v1_write(self, req: ModelTestRequest, attempt: int, history: list[Classification]) -> WriteCommandResult:
        self._show(f"writing command, attempt {attempt}")
        written = await workflow.execute_local_activity_method(
            ContainerActivities.write_command,
            WriteCommandRequest(manifest=req.manifest, row=req.row, hardware=req.hardware, runner=req.runner,
                                attempt=attempt, history=history, fixed_command=True),
            **_local(f"row {req.row}: write command, attempt {attempt}"))
        if not self._model:
            self._model = written.model_name
            ui.set_model(written.model_name)
        if req.llm == "openai" and written.source is not CommandSource.FIXED and req.runner is not RunnerKind.PROCESS:
            written = await self._v1_ask_llm(req, attempt, written)
        if written.source is CommandSource.OFFLINE and written.transcript is not None:
            self._offline_answers += 1
        return written

    async def _v1_ask_llm(self, req: ModelTestRequest, attempt: int, offline: WriteCommandResult) -> WriteCommandResult:
        assert offline.row is not None
        ctx = CommandWriterContext(row=offline.row, hardware=req.hardware, runner=req.runner, attempt=attempt,
                                   previous=self._previous)
        try:
            result = await ask(llm_writer.chat_request(ctx), queue=req.queues.llm,
                               summary=f"{self._model}: write command, attempt {attempt}")
        except ActivityError as e:
            failure = failure_from(e, where="command writer")
            return offline.model_copy(update={"note": f"LLM failed ([{failure.code}] {failure.message}); offline writer used"})
        self._llm_calls.append(result)
        match llm_writer.parse_answer(result.message.text):
            case llm_writer.Usable(command):
                return offline.model_copy(update={"command": command, "source": CommandSource.LLM, "reason": "",
                                                  "transcript": result.transcript})
            case llm_writer.Unusable(reason):
                return offline.model_copy(update={"note": f"unusable LLM answer ({reason}); offline writer used"})
        raise AssertionError("unreachable")

    async def _v1_attempt(self, req: ModelTestRequest, attempt: int, written: WriteCommandResult) -> Classification | None:
        command = written.command or ""
        t0 = workflow.now()
        verdict = await workflow.execute_local_activity_method(
            ContainerActivities.check_policy,
            PolicyCheckRequest(command=command, runner=req.runner, hardware=req.hardware),
            **_local(f"{self._model}: policy check, attempt {attempt}"))
        if not verdict.accepted:
            return self._v1_record(attempt, written, t0, rejection(verdict.reason))
        if req.require_approval and not (approval := await self._await_approval(attempt, command)).approved:
            return self._v1_record(attempt, written, t0, rejection(f"refused by reviewer: {approval.reason or 'no reason given'}"))
        self._show(f"testing, attempt {attempt}")
        outcome = await workflow.execute_activity_method(
            ContainerActivities.run_test,
            RunTestRequest(fleet_id=req.fleet_id, row=req.row, model_name=self._model, attempt=attempt, command=command,
                           runner=req.runner, hardware=req.hardware, probe_url=written.probe_url,
                           timeout_s=req.test_timeout_s),
            task_queue=req.queues.containers, summary=f"{self._model}: {req.runner.value} test, attempt {attempt}",
            start_to_close_timeout=max(CONTAINER.start_to_close, timedelta(seconds=req.test_timeout_s + 300)),
            heartbeat_timeout=CONTAINER.heartbeat, retry_policy=CONTAINER.retry,
            cancellation_type=workflow.ActivityCancellationType.WAIT_CANCELLATION_COMPLETED)
        if outcome.passed:
            return self._v1_record(attempt, written, t0, None, outcome)
        failure = await workflow.execute_local_activity_method(
            ContainerActivities.classify,
            ClassifyRequest(exit_code=outcome.exit_code, log_tail=outcome.log_tail, phase=outcome.phase),
            **_local(f"{self._model}: classify failure, attempt {attempt}"))
        return self._v1_record(attempt, written, t0, failure, outcome)

    def _v1_record(self, attempt: int, written: WriteCommandResult, t0: datetime, failure: Classification | None,
                   outcome: TestOutcome | None = None) -> Classification | None:
        command = written.command or ""
        self._attempts.append(AttemptRecord(
            attempt=attempt, command=command, category=failure.category if failure else None,
            reason=failure.reason if failure else "", log=outcome.log if outcome else None,
            duration_s=round((workflow.now() - t0).total_seconds(), 3), source=written.source, writer_note=written.note,
            transcript=written.transcript, activity_attempt=outcome.activity_attempt if outcome else 0,
            test_runs=outcome.test_runs if outcome else 0))
        if failure is not None:
            self._previous.append(PreviousAttempt(command=command, category=failure.category.value, reason=failure.reason,
                                                  log_tail=outcome.log_tail if outcome else ""))
        return failure
