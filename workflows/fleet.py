"""FleetTestWorkflow (a sliding window of ModelTestWorkflow children over a manifest CSV, with
continue-as-new) and ModelTestWorkflow (one row: write → check → [approve] → run → classify → retry).

Decisions live in workflows/fleet_policy.py. History carries row indices, compact verdicts and
artifact refs; a run hands the next one counters and verdict-batch refs only.
"""

from __future__ import annotations

import asyncio
from datetime import datetime, timedelta

from temporalio import workflow
from temporalio.exceptions import (
    ActivityError, ChildWorkflowError, WorkflowAlreadyStartedError,
)

with workflow.unsafe.imports_passed_through():
    from activities.containers import llm_writer
    from activities.containers.activities import ContainerActivities
    from contracts.common import ArtifactRef, Failure, JobKind, JobStatus, TokenTotals
    from contracts.errors import Err
    from contracts.fleet import Classification, ErrorCategory
    from contracts.fleet_job import (
        ApprovalRequest, AttemptRecord, ClassifyRequest, CommandSource, CommandWriterContext, FinishFleetRequest,
        FleetCarry, FleetPlan, FleetProgress, FleetTestRequest, FleetTestResult, ModelTestRequest, ModelTestResult,
        PolicyCheckRequest, PreviousAttempt, RowVerdict, RunnerKind, RunTestRequest, SaveVerdictsRequest, TestOutcome,
        WriteCommandRequest, WriteCommandResult,
    )
    from contracts.messages import ChatResult
    from workflows import _visibility as ui
    from workflows import presentation
    from workflows._call_options import CONTAINER, LOCAL, STORAGE
    from workflows._llm import ask, token_totals
    from workflows.failures import failure_from, result_from_failure
    from workflows.job_end import end_failed, is_cancellation, mark_cancelled
    from workflows.fleet_policy import (
        Finish, Retry, eta_seconds, merge_categories, model_result, next_after_attempt, rejection,
        should_continue_as_new, slots_free, writer_gave_up,
    )


def _cheap(summary: str) -> dict:
    return dict(summary=summary, start_to_close_timeout=STORAGE.start_to_close,
                heartbeat_timeout=STORAGE.heartbeat, retry_policy=STORAGE.retry)


def _local(summary: str) -> dict:
    """Options of the per-attempt bookkeeping steps (write, check, classify): local activities on the
    workflow's own worker, recorded in history like any activity but without a task-queue round trip,
    which is most of a fleet row's orchestration cost."""
    return dict(summary=summary, start_to_close_timeout=LOCAL.start_to_close, retry_policy=LOCAL.retry)


@workflow.defn
class ModelTestWorkflow:
    def __init__(self) -> None:
        self._attempts: list[AttemptRecord] = []
        self._awaiting: tuple[int, str] | None = None
        self._approval: ApprovalRequest | None = None
        self._model = ""
        self._previous: list[PreviousAttempt] = []
        """Failed attempts with their log tails: what the LLM writer is told on a retry."""
        self._llm_calls: list[ChatResult] = []
        self._offline_answers = 0
        """Offline writer decisions that gave an attempt's command (recorded like LLM answers, 0 tokens)."""

    @workflow.run
    async def run(self, req: ModelTestRequest) -> ModelTestResult:
        started = workflow.now()
        history: list[Classification] = []
        finish: Finish | None = None
        try:
            for attempt in range(1, req.max_attempts + 1):
                written = await self._write(req, attempt, history)
                if written.command is None:
                    finish = writer_gave_up(history, written.reason)
                    break
                match next_after_attempt(await self._attempt(req, attempt, written), attempt, req.max_attempts):
                    case Finish() as done:
                        finish = done
                        break
                    case Retry(failure):
                        history.append(failure)
        except (ActivityError, asyncio.CancelledError) as e:
            if is_cancellation(e):  # the row was cancelled: its container is gone, end cancelled
                mark_cancelled()
                raise
            failure = failure_from(e, where=f"attempt {len(self._attempts) + 1}")
            finish = Finish(passed=False, category=ErrorCategory.TRANSIENT.value, reason=f"{failure.code}: {failure.message}")
        assert finish is not None
        self._show("passed" if finish.passed else "failed", f"{finish.category}: {finish.reason}" if finish.category else "")
        await workflow.wait_condition(workflow.all_handlers_finished)  # let an in-flight update reply first
        result = model_result(req.row, self._model, self._attempts, finish,
                              (workflow.now() - started).total_seconds(), self._tokens())
        if finish.passed:
            ui.set_status(JobStatus.COMPLETED)
            return result
        return end_failed(result, Failure(code=finish.category or ErrorCategory.UNKNOWN.value, message=finish.reason,
                                          where=f"row {req.row} attempt {len(self._attempts)}"))

    async def _write(self, req: ModelTestRequest, attempt: int, history: list[Classification]) -> WriteCommandResult:
        self._show(f"writing command, attempt {attempt}")
        written = await workflow.execute_local_activity_method(
            ContainerActivities.write_command,
            WriteCommandRequest(manifest=req.manifest, row=req.row, hardware=req.hardware, runner=req.runner,
                                attempt=attempt, history=history),
            **_local(f"row {req.row}: write command, attempt {attempt}"))
        if not self._model:
            self._model = written.model_name
            ui.set_model(written.model_name)
        if req.llm == "openai" and written.source is not CommandSource.FIXED and req.runner is not RunnerKind.PROCESS:
            written = await self._ask_llm(req, attempt, written)
        if written.source is CommandSource.OFFLINE and written.transcript is not None:
            self._offline_answers += 1
        return written

    async def _ask_llm(self, req: ModelTestRequest, attempt: int, offline: WriteCommandResult) -> WriteCommandResult:
        """The LLM's command for this attempt; the offline writer's (`offline`) when the LLM fails or
        its answer holds no command, with the reason kept in the attempt record."""
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

    def _tokens(self) -> TokenTotals:
        return token_totals(self._llm_calls, extra_calls=self._offline_answers)

    async def _attempt(self, req: ModelTestRequest, attempt: int, written: WriteCommandResult) -> Classification | None:
        """One attempt; None when it passed, else the failure the writer sees next."""
        command = written.command or ""
        t0 = workflow.now()
        verdict = await workflow.execute_local_activity_method(
            ContainerActivities.check_policy,
            PolicyCheckRequest(command=command, runner=req.runner, hardware=req.hardware),
            **_local(f"{self._model}: policy check, attempt {attempt}"))
        if not verdict.accepted:
            return self._record(attempt, written, t0, rejection(verdict.reason))
        if req.require_approval and not (approval := await self._await_approval(attempt, command)).approved:
            return self._record(attempt, written, t0, rejection(f"refused by reviewer: {approval.reason or 'no reason given'}"))
        outcome = await self._run(req, attempt, command, written.probe_url)
        if outcome.passed:
            return self._record(attempt, written, t0, None, outcome)
        failure = await workflow.execute_local_activity_method(
            ContainerActivities.classify,
            ClassifyRequest(exit_code=outcome.exit_code, log_tail=outcome.log_tail, phase=outcome.phase),
            **_local(f"{self._model}: classify failure, attempt {attempt}"))
        return self._record(attempt, written, t0, failure, outcome)

    async def _run(self, req: ModelTestRequest, attempt: int, command: str, probe_url: str | None) -> TestOutcome:
        self._show(f"testing, attempt {attempt}")
        return await workflow.execute_activity_method(
            ContainerActivities.run_test,
            RunTestRequest(fleet_id=req.fleet_id, row=req.row, model_name=self._model, attempt=attempt, command=command,
                           runner=req.runner, hardware=req.hardware, probe_url=probe_url, timeout_s=req.test_timeout_s),
            task_queue=req.queues.containers, summary=f"{self._model}: {req.runner.value} test, attempt {attempt}",
            start_to_close_timeout=max(CONTAINER.start_to_close, timedelta(seconds=req.test_timeout_s + 300)),
            heartbeat_timeout=CONTAINER.heartbeat, retry_policy=CONTAINER.retry,
            # a cancelled row ends only after the runner removed its container
            cancellation_type=workflow.ActivityCancellationType.WAIT_CANCELLATION_COMPLETED)

    async def _await_approval(self, attempt: int, command: str) -> ApprovalRequest:
        """Durable wait for `approve_command` (no timer: the fleet waits for a person)."""
        self._awaiting = (attempt, command)
        ui.set_status(JobStatus.AWAITING_APPROVAL)
        self._show(f"awaiting approval, attempt {attempt}")
        await workflow.wait_condition(lambda: self._approval is not None and self._approval.attempt == attempt)
        self._awaiting = None
        ui.set_status(JobStatus.RUNNING)
        assert self._approval is not None
        return self._approval

    def _record(self, attempt: int, written: WriteCommandResult, t0: datetime, failure: Classification | None,
                outcome: TestOutcome | None = None) -> Classification | None:
        command = written.command or ""
        self._attempts.append(AttemptRecord(
            attempt=attempt, command=command, category=failure.category if failure else None,
            reason=failure.reason if failure else "", log=outcome.log if outcome else None,
            duration_s=round((workflow.now() - t0).total_seconds(), 3), source=written.source, writer_note=written.note,
            transcript=written.transcript))
        if failure is not None:
            self._previous.append(PreviousAttempt(command=command, category=failure.category.value, reason=failure.reason,
                                                  log_tail=outcome.log_tail if outcome else ""))
        return failure

    @workflow.update
    async def approve_command(self, req: ApprovalRequest) -> str:
        self._approval = req
        return "approved" if req.approved else "refused"

    @approve_command.validator
    def _check_approval(self, req: ApprovalRequest) -> None:
        if self._awaiting is None:
            raise ValueError("no command is awaiting approval")
        if req.attempt != self._awaiting[0]:
            raise ValueError(f"attempt {self._awaiting[0]} is awaiting approval, not attempt {req.attempt}")

    @workflow.query
    def pending_command(self) -> str | None:
        """The command waiting for approval, if any."""
        return self._awaiting[1] if self._awaiting else None

    @workflow.query
    def attempts(self) -> list[AttemptRecord]:
        return self._attempts

    def _show(self, step: str, error: str = "") -> None:
        last = self._attempts[-1] if self._attempts else None
        ui.details("model test", {"model": self._model, "step": step, "attempts": len(self._attempts),
                                  "last error": error or (f"{last.category}: {last.reason}" if last and last.category else "")})


@workflow.defn
class FleetTestWorkflow:
    def __init__(self) -> None:
        self._carry = FleetCarry()
        self._plan = FleetPlan(total=0, pending=[], skipped=0)
        self._running: dict[int, asyncio.Task[None]] = {}
        """The rows whose child is running, with the task that awaits it."""
        self._verdicts: list[RowVerdict] = []
        self._paused = False

    @workflow.run
    async def run(self, req: FleetTestRequest) -> FleetTestResult:
        fleet_id = req.fleet_id or workflow.info().workflow_id.removeprefix("fleet/")
        self._carry = req.carry or FleetCarry(started_at=workflow.now())
        self._paused = self._paused or self._carry.paused  # a pause signal may arrive before run() starts
        try:
            self._plan = await self._load(req)
            cursor = await self._window(req, fleet_id)
            batches = await self._save_batch(req, fleet_id)
            if cursor < len(self._plan.pending):
                await workflow.wait_condition(workflow.all_handlers_finished)
                workflow.continue_as_new(req.model_copy(update={"carry": self._next_carry(cursor, batches)}))
            return await self._finish(req, fleet_id, batches)
        except (ActivityError, asyncio.CancelledError) as e:
            if is_cancellation(e):
                mark_cancelled()
                await self._stop_children(fleet_id)
                raise
            failure = failure_from(e, where="fleet")
            ui.details("fleet test", {"fleet": fleet_id, "step": "failed", "last error": f"{failure.code}: {failure.message}"})
            return end_failed(FleetTestResult(status=JobStatus.FAILED, fleet_id=fleet_id, failure=failure,
                                              runs=self._carry.runs + 1), failure)

    async def _load(self, req: FleetTestRequest) -> FleetPlan:
        return await workflow.execute_activity_method(
            ContainerActivities.plan_fleet, req.manifest, task_queue=req.queues.containers,
            **_cheap(f"read manifest {req.manifest.name or req.manifest.sha256[:12]}"))

    async def _window(self, req: FleetTestRequest, fleet_id: str) -> int:
        """Keep `concurrency` children running until the rows or this run's budget are used up;
        then drain (every child this run started finishes in this run). Returns the new cursor."""
        pending, cursor = self._plan.pending, self._carry.cursor
        while cursor < len(pending) and not self._hand_over(req, len(pending) - cursor):
            for _ in range(self._free(req, len(pending) - cursor)):
                self._start_child(req, fleet_id, pending[cursor])
                cursor += 1
            self._show(fleet_id)
            left = len(pending) - cursor
            await workflow.wait_condition(lambda: self._free(req, left) > 0 or self._hand_over(req, left) or not left)
        await workflow.wait_condition(lambda: not self._running)
        return cursor

    def _free(self, req: FleetTestRequest, remaining: int) -> int:
        return slots_free(len(self._running), req.concurrency, self._paused, remaining,
                          req.continue_every - len(self._verdicts))

    def _hand_over(self, req: FleetTestRequest, remaining: int) -> bool:
        return should_continue_as_new(len(self._verdicts), req.continue_every,
                                      workflow.info().is_continue_as_new_suggested(), remaining)

    def _start_child(self, req: FleetTestRequest, fleet_id: str, row: int) -> None:
        self._running[row] = asyncio.create_task(self._child(req, fleet_id, row))

    async def _stop_children(self, fleet_id: str) -> None:
        """The fleet was cancelled. Only run() receives the cancellation, and a parent that simply ended
        would terminate its children (no cleanup): cancel each running child instead and wait until it
        has ended (its test activity removes its container first), then the fleet ends cancelled."""
        ui.details("fleet test", {"fleet": fleet_id, "step": "cancelling", "running": len(self._running)})
        running = list(self._running.values())
        for task in running:
            task.cancel()
        await asyncio.gather(*running, return_exceptions=True)

    async def _child(self, req: FleetTestRequest, fleet_id: str, row: int) -> None:
        child = ModelTestRequest(fleet_id=fleet_id, manifest=req.manifest, row=row, hardware=req.hardware,
                                 runner=req.runner, max_attempts=req.max_attempts, require_approval=req.require_approval,
                                 test_timeout_s=req.test_timeout_s, llm=req.llm, queues=req.queues)
        try:
            result = await workflow.execute_child_workflow(
                ModelTestWorkflow.run, child, id=f"fleet/{fleet_id}/{row}", task_queue=req.queues.workflows,
                search_attributes=ui.start_attributes(JobKind.MODEL_TEST),
                static_summary=presentation.summary(child), static_details=presentation.details(child))
            verdict = result.verdict()
        except (ChildWorkflowError, WorkflowAlreadyStartedError) as e:
            if is_cancellation(e):  # the fleet is being cancelled: the row has no verdict
                self._running.pop(row, None)
                return
            failed = result_from_failure(e, ModelTestResult)  # a row that failed carries its result
            if failed is not None:
                verdict = failed.verdict()
            else:  # e.g. the same fleet id still running
                failure = failure_from(e, where=f"row {row}")
                verdict = RowVerdict(row=row, model_name="", passed=False, category=ErrorCategory.UNKNOWN.value,
                                     reason=f"{failure.code}: {failure.message}")
        self._verdicts.append(verdict)
        self._carry = self._carry.model_copy(update={
            "passed": self._carry.passed + verdict.passed, "failed": self._carry.failed + (not verdict.passed),
            "categories": merge_categories(self._carry.categories, verdict.passed, verdict.category),
            "tokens": self._carry.tokens + verdict.tokens})
        self._running.pop(row, None)

    async def _save_batch(self, req: FleetTestRequest, fleet_id: str) -> list[ArtifactRef]:
        if not self._verdicts:
            return list(self._carry.batches)
        ref = await workflow.execute_activity_method(
            ContainerActivities.save_verdicts,
            SaveVerdictsRequest(fleet_id=fleet_id, batch=len(self._carry.batches), verdicts=self._verdicts),
            task_queue=req.queues.containers, **_cheap(f"save {len(self._verdicts)} verdicts"))
        return [*self._carry.batches, ref]

    def _next_carry(self, cursor: int, batches: list[ArtifactRef]) -> FleetCarry:
        return self._carry.model_copy(update={"cursor": cursor, "batches": batches, "runs": self._carry.runs + 1,
                                              "paused": self._paused})

    async def _finish(self, req: FleetTestRequest, fleet_id: str, batches: list[ArtifactRef]) -> FleetTestResult:
        done = await workflow.execute_activity_method(
            ContainerActivities.finish_fleet, FinishFleetRequest(fleet_id=fleet_id, manifest=req.manifest, batches=batches),
            task_queue=req.queues.containers, **_cheap("write the results CSV"))
        status = JobStatus.FAILED if done.failed else JobStatus.COMPLETED
        self._show(fleet_id, step=status.value.lower())
        result = FleetTestResult(status=status, fleet_id=fleet_id, csv=done.csv, table=done.table,
                                 total=self._plan.total,
                                 skipped=self._plan.skipped, passed=done.passed, failed=done.failed,
                                 categories=done.categories, runs=self._carry.runs + 1, tokens=self._carry.tokens)
        if status is JobStatus.COMPLETED:
            ui.set_status(status)
            return result
        failure = Failure(code=Err.ROWS_FAILED, where="fleet",
                          message=f"{done.failed} of {done.passed + done.failed} tested rows did not pass")
        return end_failed(result.model_copy(update={"failure": failure}), failure)

    @workflow.signal
    def pause(self) -> None:
        """Start no new children (running ones finish)."""
        self._paused = True

    @workflow.signal
    def resume(self) -> None:
        self._paused = False

    @workflow.query
    def progress(self) -> FleetProgress:
        c = self._carry
        elapsed = (workflow.now() - c.started_at).total_seconds() if c.started_at else 0.0
        return FleetProgress(total=self._plan.total, skipped=self._plan.skipped, done=c.passed + c.failed,
                             passed=c.passed, failed=c.failed, running=len(self._running), paused=self._paused,
                             runs=c.runs + 1, eta_s=eta_seconds(c.passed + c.failed, len(self._plan.pending), elapsed))

    def _show(self, fleet_id: str, step: str = "testing") -> None:
        p = self.progress()
        ui.details("fleet test", {"fleet": fleet_id, "step": "paused" if p.paused else step,
                                  "progress": f"{p.done}/{len(self._plan.pending)} ({p.passed} passed, {p.failed} failed)",
                                  "running": p.running, "run": p.runs, "eta": f"{p.eta_s:.0f}s" if p.eta_s else ""})
