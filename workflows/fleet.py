"""FleetTestWorkflow: a sliding window of ModelTestWorkflow children (workflows/model_test.py) over a
manifest CSV, each on its own slot of the host (a port, its GPUs), with continue-as-new.

Decisions live in workflows/fleet_policy.py. History carries row indices, slots, compact verdicts and
artifact refs; a run hands the next one counters and verdict-batch refs only.
"""

from __future__ import annotations

import asyncio

from temporalio import workflow
from temporalio.exceptions import ActivityError, ChildWorkflowError, WorkflowAlreadyStartedError

with workflow.unsafe.imports_passed_through():
    import workflows._visibility as ui  # this form is passed through (from-imports of our package run per workflow)
    import workflows.presentation as presentation
    from activities.containers.activities import ContainerActivities
    from contracts.common import ArtifactRef, Failure, JobKind, JobStatus
    from contracts.errors import Err
    from contracts.fleet import ErrorCategory, RowStatus, Slot
    from contracts.fleet_job import (
        FinishFleetRequest, FleetCarry, FleetPlan, FleetProgress, FleetTestRequest, FleetTestResult, ModelTestRequest,
        ModelTestResult, PlanFleetRequest, RowVerdict, SaveVerdictsRequest, default_fleet_id,
    )
    from workflows._call_options import STORAGE
    from workflows._events import JobEvents
    from contracts.events import EventKind, JobEvent
    from workflows.failures import failure_from, result_from_failure
    from workflows.job_end import end_failed, is_cancellation, mark_cancelled
    from workflows.fleet_policy import (
        allocate, capacity, eta_seconds, merge_categories, next_startable, should_continue_as_new, slots_free,
    )
    from workflows.model_test import ModelTestWorkflow

__all__ = ["FleetTestWorkflow", "ModelTestWorkflow"]

def _lookahead(req: FleetTestRequest) -> int:
    """How far past the cursor a family cap may start rows."""
    return 4 * req.concurrency


def _cheap(summary: str) -> dict:
    return dict(summary=summary, start_to_close_timeout=STORAGE.start_to_close,
                heartbeat_timeout=STORAGE.heartbeat, retry_policy=STORAGE.retry)


def _by_category(categories: dict[str, int]) -> str:
    """The failed rows' categories, most frequent first ("PORT_IN_USE 3, CRASHED 1")."""
    failed = sorted(((n, c) for c, n in categories.items() if c != "PASSED"), key=lambda nc: (-nc[0], nc[1]))
    return ", ".join(f"{c} {n}" for n, c in failed)


@workflow.defn
class FleetTestWorkflow:
    @workflow.init
    def __init__(self, req: FleetTestRequest) -> None:
        self._events = JobEvents(req.carry.events if req.carry else None)
        """Live events (row verdicts, progress, status); their offsets go on across continue-as-new."""
        self._carry = FleetCarry()
        self._plan = FleetPlan(total=0, pending=[], skipped=0)
        self._running: dict[int, asyncio.Task[None]] = {}
        """The rows whose child is running, with the task that awaits it."""
        self._slots: dict[int, Slot] = {}
        """The port and GPUs each running row holds (released when its child ends)."""
        self._verdicts: list[RowVerdict] = []
        self._ended = 0
        """Children that ended in this run (the window wakes on a change)."""
        self._paused = False
        self._pause_signalled = False
        """A pause or resume reached this run; one sent as the run starts is handled before run() reads the carry."""
        self._capacity = 0
        self._ahead: set[int] = set()
        """Positions past the cursor already started (a family cap let them go first)."""
        self._family_running: dict[int, int] = {}
        self._row_family: dict[int, int] = {}

    @workflow.run
    async def run(self, req: FleetTestRequest) -> FleetTestResult:
        fleet_id = self._fleet_id(req)
        self._carry = req.carry or FleetCarry(started_at=workflow.now())
        if not self._pause_signalled:  # else the signal is newer than the carried state
            self._paused = self._carry.paused
        self._ahead = set(self._carry.ahead)
        try:
            self._plan = await self._load(req, fleet_id)
            cursor = await self._window(req, fleet_id)
            batches = await self._save_batch(req, fleet_id)
            if cursor < len(self._plan.pending):
                self._events.detach()  # followers' polls are update handlers: release them, or this waits on them
                await workflow.wait_condition(workflow.all_handlers_finished)
                workflow.continue_as_new(req.model_copy(update={"carry": self._next_carry(cursor, batches), "fleet_id": fleet_id}))
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

    @staticmethod
    def _fleet_id(req: FleetTestRequest) -> str:
        """The request's fleet id, else the default (every continuation carries the id its first run used)."""
        if req.fleet_id:
            return req.fleet_id
        return default_fleet_id(workflow.info().workflow_id)

    async def _load(self, req: FleetTestRequest, fleet_id: str) -> FleetPlan:
        plan = await workflow.execute_activity_method(
            ContainerActivities.plan_fleet, PlanFleetRequest(fleet_id=fleet_id, manifest=req.manifest, hardware=req.hardware,
                                                             families=req.max_per_family > 0,
                                                             models=(self._carry.cursor, req.continue_every + _lookahead(req))),
            task_queue=req.queues.containers, **_cheap(f"read manifest {req.manifest.name or req.manifest.sha256[:12]}"))
        self._capacity = capacity(req.concurrency, req.hardware, plan.default_gpus)
        return plan

    async def _window(self, req: FleetTestRequest, fleet_id: str) -> int:
        """Keep up to `concurrency` children running, each on a slot of its own, until the rows or this
        run's budget are used up; then drain (every child this run started finishes in this run).
        Rows start in CSV order: a row waits until the host has a slot with the GPUs it needs."""
        pending, cursor = self._plan.pending, self._carry.cursor
        while cursor < len(pending) and not self._hand_over(req, len(pending) - cursor):
            cursor = self._start_ready(req, fleet_id, cursor)
            self._show(fleet_id)
            ended, paused, left = self._ended, self._paused, len(pending) - cursor
            await workflow.wait_condition(
                lambda: self._ended != ended or self._paused != paused or self._hand_over(req, left))
        await workflow.wait_condition(lambda: not self._running)
        return cursor

    def _start_ready(self, req: FleetTestRequest, fleet_id: str, cursor: int) -> int:
        """Start the next rows while the window has room and the host has their slots (with a family cap,
        the next rows whose family is under it); the new cursor."""
        pending, plan = self._plan.pending, self._plan
        for _ in range(self._free(req, len(pending) - cursor)):
            pos = next_startable(cursor, len(pending), self._ahead, lambda p: plan.family_of.get(pending[p]),
                                 self._family_running, req.max_per_family, lookahead=_lookahead(req))
            if pos is None:
                break
            row = pending[pos]
            slot = allocate(self._plan.gpus.get(row, self._plan.default_gpus), req.hardware, self._slots.values())
            if slot is None:
                break
            self._slots[row] = slot
            if (family := plan.family_of.get(row)) is not None:
                self._row_family[row] = family
                self._family_running[family] = self._family_running.get(family, 0) + 1
            self._running[row] = asyncio.create_task(self._child(req, fleet_id, row, slot))
            if pos != cursor:
                self._ahead.add(pos)
                continue
            cursor += 1
            while cursor in self._ahead:
                self._ahead.discard(cursor)
                cursor += 1
        return cursor

    def _free(self, req: FleetTestRequest, remaining: int) -> int:
        return slots_free(len(self._running), req.concurrency, self._paused, remaining,
                          req.continue_every - len(self._verdicts))

    def _hand_over(self, req: FleetTestRequest, remaining: int) -> bool:
        return should_continue_as_new(len(self._verdicts), req.continue_every,
                                      workflow.info().is_continue_as_new_suggested(), remaining)

    async def _stop_children(self, fleet_id: str) -> None:
        """The fleet was cancelled. Only run() receives the cancellation, and a parent that simply ended
        would terminate its children (no cleanup): cancel each running child instead and wait until it
        has ended (its test activity removes its container first), then the fleet ends cancelled."""
        ui.details("fleet test", {"fleet": fleet_id, "step": "cancelling", "running": len(self._running)})
        running = list(self._running.values())
        for task in running:
            task.cancel()
        await asyncio.gather(*running, return_exceptions=True)

    async def _child(self, req: FleetTestRequest, fleet_id: str, row: int, slot: Slot) -> None:
        child = ModelTestRequest(fleet_id=fleet_id, manifest=req.manifest, row=row, hardware=req.hardware,
                                 runner=req.runner, max_attempts=req.max_attempts, require_approval=req.require_approval,
                                 test_timeout_s=req.test_timeout_s, llm=req.llm, queues=req.queues, slot=slot,
                                 require_tier=req.require_tier, process_mode=req.process_mode, shares=req.share)
        try:
            result = await workflow.execute_child_workflow(
                ModelTestWorkflow.run, child, id=f"fleet/{fleet_id}/{row}", task_queue=req.queues.workflows,
                search_attributes=ui.start_attributes(JobKind.MODEL_TEST, model=self._plan.models.get(row, "")),
                static_summary=presentation.summary(child))  # no static details: the fleet's show its request once
            verdict = result.verdict()
        except (ChildWorkflowError, WorkflowAlreadyStartedError) as e:
            if is_cancellation(e):  # the fleet is being cancelled: the row has no verdict
                self._release(row)
                return
            failed = result_from_failure(e, ModelTestResult)  # a row that failed carries its result
            if failed is not None:
                verdict = failed.verdict()
            else:  # e.g. the same fleet id still running
                failure = failure_from(e, where=f"row {row}")
                verdict = RowVerdict(row=row, model_name="", passed=False, status=RowStatus.ERROR,
                                     category=ErrorCategory.UNKNOWN.value, reason=f"{failure.code}: {failure.message}")
        self._verdicts.append(verdict)
        status = verdict.row_status
        self._events.publish(JobEvent(kind=EventKind.PROGRESS, text=f"row {row} {verdict.model_name}: {status.value}",
                                      done=self._carry.passed + self._carry.failed + self._carry.errors + 1,
                                      total=self._plan.total - self._plan.skipped))
        self._carry = self._carry.model_copy(update={
            "passed": self._carry.passed + (status is RowStatus.YES), "failed": self._carry.failed + (status is RowStatus.NO),
            "errors": self._carry.errors + (status is RowStatus.ERROR),
            "categories": merge_categories(self._carry.categories, verdict.passed, verdict.category),
            "tokens": self._carry.tokens + verdict.tokens})
        self._release(row)

    def _release(self, row: int) -> None:
        self._running.pop(row, None)
        self._slots.pop(row, None)
        if (family := self._row_family.pop(row, None)) is not None:
            self._family_running[family] -= 1
        self._ended += 1

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
                                              "paused": self._paused, "ahead": sorted(self._ahead),
                                              "events": self._events.handover()})

    async def _finish(self, req: FleetTestRequest, fleet_id: str, batches: list[ArtifactRef]) -> FleetTestResult:
        done = await workflow.execute_activity_method(
            ContainerActivities.finish_fleet, FinishFleetRequest(fleet_id=fleet_id, manifest=req.manifest, batches=batches,
                                                             evidence_columns=req.evidence_columns),
            task_queue=req.queues.containers, **_cheap("write the results CSV"))
        status = JobStatus.FAILED if done.failed or done.errors else JobStatus.COMPLETED
        self._show(fleet_id, step=status.value.lower())
        result = FleetTestResult(status=status, fleet_id=fleet_id, csv=done.csv, table=done.table,
                                 total=self._plan.total, skipped=self._plan.skipped, passed=done.passed,
                                 failed=done.failed, errors=done.errors, categories=done.categories,
                                 runs=self._carry.runs + 1, tokens=self._carry.tokens)
        if status is JobStatus.COMPLETED:
            ui.set_status(status)
            return result
        tested = done.passed + done.failed + done.errors
        failure = Failure(code=Err.ROWS_FAILED, where="fleet",
                          message=f"{done.failed + done.errors} of {tested} tested rows did not pass "
                                  f"({done.failed} No: the model failed; {done.errors} Error: not tested, rerun retests them; "
                                  f"{_by_category(done.categories)}; the CSV's notes say why, row by row)")
        return end_failed(result.model_copy(update={"failure": failure}), failure)

    @workflow.signal
    def pause(self) -> None:
        """Start no new children (running ones finish)."""
        self._paused, self._pause_signalled = True, True

    @workflow.signal
    def resume(self) -> None:
        self._paused, self._pause_signalled = False, True

    @workflow.query
    def progress(self) -> FleetProgress:
        c = self._carry
        elapsed = (workflow.now() - c.started_at).total_seconds() if c.started_at else 0.0
        done = c.passed + c.failed + c.errors
        return FleetProgress(total=self._plan.total, skipped=self._plan.skipped, done=done, passed=c.passed,
                             failed=c.failed, errors=c.errors, running=len(self._running), paused=self._paused,
                             runs=c.runs + 1, capacity=self._capacity,
                             eta_s=eta_seconds(done, len(self._plan.pending), elapsed))

    def _show(self, fleet_id: str, step: str = "testing") -> None:
        p = self.progress()
        ui.details("fleet test", {"fleet": fleet_id, "step": "paused" if p.paused else step,
                                  "progress": f"{p.done}/{len(self._plan.pending)} ({p.passed} Yes, {p.failed} No, "
                                              f"{p.errors} Error)",
                                  "running": f"{p.running} of {p.capacity} slots", "run": p.runs,
                                  "eta": f"{p.eta_s:.0f}s" if p.eta_s else "",
                                  "latest rows": self._verdicts[::-1]})
