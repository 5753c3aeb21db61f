"""ModelTestWorkflow: one fleet row (write → check → [approve] → run → classify → retry, then its
verdict saved at once), on the slot (port, GPUs) its fleet gave it.

Whose failure a verdict is: `Yes` the model served; `No` the model itself failed (it crashed, never
became healthy, did not answer, did not finish in time); `Error` we failed to test it (no usable
command, the policy, the runner, the LLM, credentials, the port). A refused command is one attempt of
the row, fed back to the writer; the offline writer's command is the last resort (a fallback).
Decisions live in workflows/fleet_policy.py. Its own module: the sandbox re-imports a workflow's
module for every run, and a fleet starts one of these per row.
"""

from __future__ import annotations

import asyncio
from dataclasses import replace
from datetime import datetime, timedelta

from temporalio import workflow
from temporalio.exceptions import ActivityError

with workflow.unsafe.imports_passed_through():
    import workflows._visibility as ui  # this form is passed through (from-imports of our package run per workflow)
    from activities.containers import llm_writer
    from activities.containers.activities import ContainerActivities
    from activities.llm.structured import Rejected
    from contracts.agents import AnswerSource
    from contracts.common import ArtifactRef, Failure, JobStatus, TokenTotals
    from contracts.fleet import Classification, ErrorCategory, Slot
    from contracts.fleet_job import (
        ApprovalRequest, AttemptRecord, ClassifyRequest, CommandSource, CommandWriterContext, ManifestRow,
        ModelTestRequest, ModelTestResult, PolicyCheckRequest, PolicyCheckResult, PreviousAttempt,
        RecordVerdictRequest, RowRequest, RunnerKind, RunTestRequest, TestOutcome, WriteCommandRequest, Written,
    )
    from contracts.messages import ChatResult
    from workflows._call_options import CONTAINER, LOCAL
    from workflows._llm import ask, token_totals
    from workflows.agent_ladder import Accepted, climb
    from workflows.failures import failure_from
    from workflows.job_end import end_failed, is_cancellation, mark_cancelled
    from workflows.fleet_policy import (
        Finish, Retry, harness_failure, model_result, next_after_attempt, rejection, render_fixed, attempt_priority,
        writer_gave_up,
    )

_SOURCES = {AnswerSource.LLM: CommandSource.LLM, AnswerSource.OFFLINE: CommandSource.OFFLINE,
            AnswerSource.FALLBACK: CommandSource.FALLBACK}


_LOCAL = dict(start_to_close_timeout=LOCAL.start_to_close, retry_policy=LOCAL.retry)
"""Options of the per-attempt bookkeeping steps (read, write, check, classify, record): local activities
on the workflow's own worker, recorded in history like any activity but without a task-queue round trip,
which is most of a fleet row's orchestration cost. No summary: each is a payload the worker encodes and
the server stores, for every row of thousands, and the step's name (read_row, check_policy, ...) with
the row's own summary already says what it did; the test activity, the step that takes time, has one."""


@workflow.defn
class ModelTestWorkflow:
    def __init__(self) -> None:
        self._attempts: list[AttemptRecord] = []
        self._failures: list[Classification] = []
        """Every failed attempt, refusals included, oldest first: the offline writer's history."""
        self._previous: list[PreviousAttempt] = []
        """The same with commands and log tails: what the LLM writer is told on its next answer."""
        self._refused: tuple[str, ArtifactRef | None] = ("", None)
        """The LLM answer the ladder is about to report refused (its command and transcript)."""
        self._gave_up = ""
        self._offline_said = ""
        self._awaiting: tuple[int, str] | None = None
        self._approval: ApprovalRequest | None = None
        self._model = ""
        self._family = ""
        self._llm_calls: list[ChatResult] = []
        self._offline_answers = 0
        """Offline writer decisions that gave an attempt's command (recorded like LLM answers, 0 tokens)."""

    @workflow.run
    async def run(self, req: ModelTestRequest) -> ModelTestResult:
        started = workflow.now()
        row: ManifestRow | None = None
        try:
            row = await self._read(req)
            finish = await self._test(req, row, req.slot or req.hardware.first_slot(row.gpus))
        except (ActivityError, asyncio.CancelledError) as e:
            if is_cancellation(e):  # the row was cancelled: its container is gone, end cancelled
                mark_cancelled()
                raise
            failure = failure_from(e, where=f"attempt {len(self._attempts) + 1}")
            finish = harness_failure(failure.code, failure.message)
        return await self._end(req, row, finish, started)

    async def _test(self, req: ModelTestRequest, row: ManifestRow, slot: Slot) -> Finish:
        """Attempts until one passes, a failure needs a person, the budget is spent or nobody can write
        another command."""
        while True:
            written = await self._write(req, row, slot)
            if written is None:
                return writer_gave_up(self._failures, self._gave_up)
            failure = await self._attempt(req, row, slot, written)
            match next_after_attempt(failure, len(self._attempts), req.max_attempts):
                case Finish() as done:
                    return done
                case Retry():
                    continue

    async def _read(self, req: ModelTestRequest) -> ManifestRow:
        row = await workflow.execute_local_activity_method(
            ContainerActivities.read_row, RowRequest(manifest=req.manifest, row=req.row), **_LOCAL)
        self._model = row.model_name
        self._family = row.family_key()
        ui.set_model(row.model_name)
        return row

    async def _write(self, req: ModelTestRequest, row: ManifestRow, slot: Slot) -> Written | None:
        """The next attempt's command: the row's own, else the agent ladder's (LLM answers checked by the
        policy, each refusal an attempt, the offline writer as the last resort); None when there is none."""
        attempt = len(self._attempts) + 1
        self._show(f"writing command, attempt {attempt}")
        if row.command:
            refused = self._failures and self._failures[-1].category is ErrorCategory.POLICY_REJECTED
            if refused and "{attempt}" not in row.command:
                self._gave_up = "the row's own command was refused; it needs a person"
                return None
            return Written(render_fixed(row.command, attempt, slot), CommandSource.FIXED)
        use_llm = req.llm == "openai" and req.runner is not RunnerKind.PROCESS
        climbed = await climb(
            llm_writer.AGENT, llm=(lambda _: self._ask_llm(req, row, slot)) if use_llm else None,
            offline=lambda why: self._ask_offline(req, row, slot), on_rejected=self._refusal,
            max_llm_answers=max(1, req.max_attempts - len(self._attempts)))
        if climbed.value is None:  # with the LLM, the ladder says what each rung answered
            self._gave_up = climbed.provenance.fallback_reason if use_llm else self._offline_said
            return None
        source = _SOURCES.get(climbed.provenance.source, CommandSource.OFFLINE)
        if source is not CommandSource.LLM:
            self._offline_answers += 1
        note = climbed.provenance.fallback_reason if source is CommandSource.FALLBACK else ""
        return replace(climbed.value, source=source, note=note, provenance=climbed.provenance)

    async def _ask_llm(self, req: ModelTestRequest, row: ManifestRow, slot: Slot) -> Accepted[Written] | Rejected:
        """One LLM answer, parsed and checked against the policy and the slot."""
        ctx = CommandWriterContext(row=row, hardware=req.hardware, runner=req.runner, attempt=len(self._attempts) + 1,
                                   previous=self._previous, slot=slot)
        result = await ask(llm_writer.chat_request(ctx), queue=req.queues.llm,
                           summary=f"{self._model}: write command, attempt {ctx.attempt}")
        self._llm_calls.append(result)
        match llm_writer.parse_answer(result.message.text):
            case llm_writer.Unusable(reason):
                self._refused = ("", result.transcript)
                return Rejected(f"unusable answer: {reason}")
            case llm_writer.Usable(command):
                verdict = await self._check(req, row, command, slot)
                if not verdict.accepted:
                    self._refused = (command, result.transcript)
                    return Rejected(verdict.reason)
                return Accepted(Written(command, CommandSource.LLM, result.transcript))
        raise AssertionError("unreachable")

    async def _refusal(self, reason: str) -> None:
        """An LLM answer the ladder refused is one failed attempt of the row (within its budget)."""
        command, transcript = self._refused
        category = ErrorCategory.POLICY_REJECTED if command else ErrorCategory.NO_COMMAND
        written = Written(command, CommandSource.LLM, transcript)
        self._record(len(self._attempts) + 1, written, workflow.now(), rejection(reason, category))

    async def _ask_offline(self, req: ModelTestRequest, row: ManifestRow, slot: Slot) -> Accepted[Written] | Rejected:
        """The offline writer's command (it always passes the policy and the slot), or why it has none."""
        written = await workflow.execute_local_activity_method(
            ContainerActivities.write_command,
            WriteCommandRequest(manifest=req.manifest, row=req.row, hardware=req.hardware, runner=req.runner,
                                attempt=len(self._attempts) + 1, history=self._failures, slot=slot), **_LOCAL)
        if written.command is None:
            self._offline_said = f"the offline writer has no command: {written.reason}"
            return Rejected(self._offline_said)
        return Accepted(Written(written.command, CommandSource.OFFLINE, written.transcript))

    async def _check(self, req: ModelTestRequest, row: ManifestRow, command: str, slot: Slot) -> PolicyCheckResult:
        return await workflow.execute_local_activity_method(
            ContainerActivities.check_policy,
            PolicyCheckRequest(command=command, runner=req.runner, hardware=req.hardware, slot=slot,
                               row=row.model_row()), **_LOCAL)

    def _tokens(self) -> TokenTotals:
        return token_totals(self._llm_calls, extra_calls=self._offline_answers)

    async def _attempt(self, req: ModelTestRequest, row: ManifestRow, slot: Slot, written: Written) -> Classification | None:
        """One attempt; None when it passed, else the failure the writer sees next."""
        attempt = len(self._attempts) + 1
        t0 = workflow.now()
        if written.source is CommandSource.FIXED:  # the ladder's commands were checked as they were written
            verdict = await self._check(req, row, written.command, slot)
            if not verdict.accepted:
                return self._record(attempt, written, t0, rejection(verdict.reason))
        if req.require_approval and not (approval := await self._await_approval(attempt, written.command)).approved:
            return self._record(attempt, written, t0, rejection(f"refused by reviewer: {approval.reason or 'no reason given'}"))
        probe = render_fixed(row.probe_url, attempt, slot) if row.probe_url else None
        outcome = await self._run(req, attempt, written.command, probe, slot, row.reference)
        if outcome.passed:
            return self._record(attempt, written, t0, None, outcome)
        failure = await workflow.execute_local_activity_method(
            ContainerActivities.classify,
            ClassifyRequest(exit_code=outcome.exit_code, log_tail=outcome.log_tail, phase=outcome.phase), **_LOCAL)
        return self._record(attempt, written, t0, failure, outcome)

    async def _run(self, req: ModelTestRequest, attempt: int, command: str, probe_url: str | None, slot: Slot,
                   reference: str | None = None) -> TestOutcome:
        self._show(f"testing on port {slot.port}, attempt {attempt}")
        return await workflow.execute_activity_method(
            ContainerActivities.run_test,
            RunTestRequest(fleet_id=req.fleet_id, row=req.row, model_name=self._model, attempt=attempt, command=command,
                           runner=req.runner, hardware=req.hardware, probe_url=probe_url, timeout_s=req.test_timeout_s,
                           slot=slot, require_tier=req.require_tier, reference=reference,
                           process_mode=req.process_mode, shares=req.shares),
            task_queue=req.queues.containers, summary=f"{self._model}: {req.runner.value} test, attempt {attempt}",
            start_to_close_timeout=max(CONTAINER.start_to_close, timedelta(seconds=req.test_timeout_s + 300)),
            heartbeat_timeout=CONTAINER.heartbeat, retry_policy=CONTAINER.retry,
            # a cancelled row ends only after the runner removed its container
            cancellation_type=workflow.ActivityCancellationType.WAIT_CANCELLATION_COMPLETED,
            priority=attempt_priority(attempt, self._family))

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

    def _record(self, attempt: int, written: Written, t0: datetime, failure: Classification | None,
                outcome: TestOutcome | None = None) -> Classification | None:
        self._attempts.append(AttemptRecord(
            attempt=attempt, command=written.command, category=failure.category if failure else None,
            reason=failure.reason if failure else "", log=outcome.log if outcome else None,
            duration_s=round((workflow.now() - t0).total_seconds(), 3), source=written.source, writer_note=written.note,
            transcript=written.transcript, provenance=written.provenance,
            activity_attempt=outcome.activity_attempt if outcome else 0, test_runs=outcome.test_runs if outcome else 0,
            tier=outcome.tier if outcome else None, evidence=outcome.evidence if outcome else None))
        if failure is not None:
            self._failures.append(failure)
            self._previous.append(PreviousAttempt(command=written.command or "(no command in the answer)",
                                                  category=failure.category.value, reason=failure.reason,
                                                  log_tail=outcome.log_tail if outcome else ""))
        return failure

    async def _end(self, req: ModelTestRequest, row: ManifestRow | None, finish: Finish, started: datetime) -> ModelTestResult:
        """Record the verdict in the store at once (a cancelled fleet's `--resume` writes it back), then end
        by the job-end rule: COMPLETED returns the result, anything else fails the run carrying it."""
        self._show("passed" if finish.passed else "failed", f"{finish.category}: {finish.reason}" if finish.category else "")
        await workflow.wait_condition(workflow.all_handlers_finished)  # let an in-flight update reply first
        result = model_result(req.row, self._model, self._attempts, finish, (workflow.now() - started).total_seconds(),
                              self._tokens(), row.fingerprint() if row else "")
        try:
            await workflow.execute_local_activity_method(
                ContainerActivities.record_verdict, RecordVerdictRequest(fleet_id=req.fleet_id, verdict=result.verdict()),
                **_LOCAL)
        except ActivityError as e:  # the parent's batch still carries it; never lose the verdict itself
            if is_cancellation(e):
                raise
            workflow.logger.warning("could not record the verdict of row %s: %s", req.row, e)
        if finish.passed:
            ui.set_status(JobStatus.COMPLETED)
            return result
        return end_failed(result, Failure(code=finish.category or ErrorCategory.UNKNOWN.value, message=finish.reason,
                                          where=f"row {req.row} attempt {len(self._attempts)}"))

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
        reruns = sum(max(0, a.test_runs - 1) for a in self._attempts)
        ui.details("model test", {"model": self._model, "step": step, "attempts": len(self._attempts),
                                  "reruns": f"{reruns} (a test ran again after an interrupted run)" if reruns else "",
                                  "tier": f"{last.tier.value}: {last.evidence.line()}" if last and last.tier and last.evidence else "",
                                  "last error": error or (f"{last.category}: {last.reason}" if last and last.category else "")})
