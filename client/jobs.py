"""A job as the SDK sees it: its handle (status, progress, result, cancel, answer, outputs), its
line in a listing, and the errors that say how it ended. `FleetforgeClient` (client/sdk.py) makes them;
this module does not import it (a handle needs only a `JobContext`: the store and the Web UI address).

How a closed job's status is read (`status_of`) and how `fleetforge list` filters (`list_query`)
are one mapping: the execution status decides once the job is closed, FleetforgeStatus while it runs.

The workflow classes (for their queries and updates) are imported where they are used: through them
come the activities' modules, 0.6 s that `--help`, `--version`, `list` and shell completion skip.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any, Generic, Protocol, TypeVar

from pydantic import BaseModel, Field, SerializeAsAny
from temporalio.client import (
    Client, WorkflowExecutionDescription, WorkflowExecutionStatus, WorkflowFailureError, WorkflowHandle,
    WorkflowQueryFailedError, WorkflowQueryRejectedError, WorkflowUpdateFailedError,
)
from temporalio.common import TypedSearchAttributes
from temporalio.exceptions import CancelledError, TerminatedError
from temporalio.service import RPCError, RPCStatusCode

from activities.storage import ArtifactStore
from client import artifacts as outputs
from client.ids import kind_of
from contracts.common import ArtifactRef, JobKind, JobStatus
from contracts.convert_job import ConversionProgress, ProvideInput
from contracts.errors import Err, FleetforgeError
from contracts.events import EVENTS_TOPIC, EventKind, JobEvent
from contracts.fleet_job import AttemptRecord, FleetProgress
from contracts.kernel_job import KernelResult, TraceEntry
from workflows import _visibility as vis
from workflows._events import HANDOVER_EVENTS
from workflows.failures import result_from_failure

ResultT = TypeVar("ResultT", bound=BaseModel)

CANCELLED = JobStatus.CANCELLED.value
"""Status shown for a job that was cancelled or terminated."""

_QUERY_ERRORS = (RPCError, WorkflowQueryFailedError, WorkflowQueryRejectedError, asyncio.TimeoutError)
_QUERY_TIMEOUT = timedelta(seconds=2)
_TRANSIENT = (RPCStatusCode.DEADLINE_EXCEEDED, RPCStatusCode.UNAVAILABLE, RPCStatusCode.RESOURCE_EXHAUSTED)
_EVENT_READ_RETRIES = 5
SKIPPED_WHY = (f"a job that continues as new keeps only its latest {HANDOVER_EVENTS} events; its result and history "
               "have what they said (a fleet's rows: its CSV)")


class JobNotFound(FleetforgeError):
    def __init__(self, job_id: str):
        super().__init__(Err.JOB_NOT_FOUND, f"no job {job_id!r}")


class JobFailed(FleetforgeError):
    """The job ended FAILED. `result` is its whole result contract (`result.failure` says why);
    `code` is the failure code (the type of the workflow's ApplicationError)."""

    def __init__(self, workflow_id: str, result: BaseModel):
        failure = getattr(result, "failure", None)
        code = str(failure.code) if failure is not None else Err.INTERNAL.value
        where = f" in {failure.where}" if failure is not None and failure.where else ""
        message = failure.message if failure is not None else "failed"
        super().__init__(Err.INTERNAL, f"job {workflow_id} failed: {code}{where}: {message}")
        self.code = code  # type: ignore[assignment]  # any failure code, not only Err members
        self.workflow_id = workflow_id
        self.result = result


class JobCancelled(FleetforgeError):
    def __init__(self, workflow_id: str):
        super().__init__(Err.JOB_CANCELLED, f"job {workflow_id} was cancelled")


class JobFinished(FleetforgeError):
    """The job has already ended, so it takes no cancellation or answer (`status` says how it ended)."""

    def __init__(self, workflow_id: str, status: str, action: str):
        super().__init__(Err.JOB_FINISHED, f"{workflow_id} has already finished ({status}); {action}")
        self.workflow_id = workflow_id
        self.status = status


class JobSummary(BaseModel):
    """One row of `fleetforge list`: what visibility knows about a job."""

    workflow_id: str
    kind: str
    status: str
    """A JobStatus value (CANCELLED for a cancelled or terminated job)."""
    model: str = ""
    target: str = ""
    start_time: datetime | None = None
    close_time: datetime | None = None
    run_id: str = ""
    """The Temporal run id of the job's current (latest) run."""
    ui_url: str = ""


class JobView(BaseModel):
    """`FleetforgeClient.show`: a job's listing line, and its result contract once it has finished."""

    summary: JobSummary
    result: SerializeAsAny[BaseModel] | None = None
    """The result contract (InspectResult, ConversionResult, ...) of a COMPLETED or FAILED job."""
    step: str = ""
    """What a running job is doing now (empty when no worker answers yet)."""


class JobSnapshot(BaseModel):
    """A running job as a follower sees it (`JobHandle.snapshot`)."""

    step: str = ""
    finished: list[str] = Field(default_factory=list)
    """The steps it has passed, oldest first (convert: executed steps; kernel: one per trace entry)."""
    convert: ConversionProgress | None = None
    """A convert job's `status` (NEEDS_INPUT and its questions live here)."""
    fleet: FleetProgress | None = None
    pending_command: str = ""
    """A fleet row's command waiting for approval (AWAITING_APPROVAL); its attempt is len(finished) + 1."""


def status_of(execution_status: WorkflowExecutionStatus | None, attrs: TypedSearchAttributes) -> str:
    """A job's status: the execution status decides once the job is closed (a job cancelled or
    terminated while it waited for input is CANCELLED, whatever FleetforgeStatus last said);
    while it runs, FleetforgeStatus says what it is doing (none: RUNNING, as for a fleet row)."""
    recorded = attrs.get(vis.STATUS) or JobStatus.RUNNING.value
    match execution_status:
        case WorkflowExecutionStatus.CANCELED | WorkflowExecutionStatus.TERMINATED:
            return CANCELLED
        case WorkflowExecutionStatus.FAILED | WorkflowExecutionStatus.TIMED_OUT:
            return JobStatus.FAILED.value
        case WorkflowExecutionStatus.COMPLETED:  # FAILED: a job recorded before failures failed the execution
            return recorded if recorded in (JobStatus.COMPLETED, JobStatus.FAILED) else JobStatus.COMPLETED.value
    return recorded


def _unknown_handler(e: Exception) -> bool:
    """A workflow without the events stream's handlers (one from before events, a fleet row)."""
    text = f"{e} {getattr(e, 'cause', '')}".lower()
    return "unknown" in text or "not found" in text or "no handler" in text


def _not_found(e: RPCError) -> bool:
    return e.status == RPCStatusCode.NOT_FOUND


def _quote(value: str) -> str:
    return "'" + value.replace("\\", "\\\\").replace("'", "\\'") + "'"


STATUS_QUERY: dict[str, str] = {
    JobStatus.RUNNING: "ExecutionStatus = 'Running' AND (FleetforgeStatus = 'RUNNING' OR FleetforgeStatus IS NULL)",
    JobStatus.NEEDS_INPUT: "ExecutionStatus = 'Running' AND FleetforgeStatus = 'NEEDS_INPUT'",
    JobStatus.AWAITING_APPROVAL: "ExecutionStatus = 'Running' AND FleetforgeStatus = 'AWAITING_APPROVAL'",
    JobStatus.COMPLETED: "ExecutionStatus = 'Completed' AND (FleetforgeStatus IS NULL OR FleetforgeStatus != 'FAILED')",
    JobStatus.FAILED: "(ExecutionStatus IN ('Failed', 'TimedOut') OR "
                      "(ExecutionStatus = 'Completed' AND FleetforgeStatus = 'FAILED'))",
    JobStatus.CANCELLED: "ExecutionStatus IN ('Canceled', 'Terminated')",
}
"""Visibility filter per job status, the same mapping as `status_of` (so a cancelled job that was
waiting for input is never listed as NEEDS_INPUT; a fleet row, which has no FleetforgeStatus unless it
waits for approval, is listed by its execution status)."""


def list_query(kind: JobKind | None = None, status: str | None = None, *, rows: bool = False) -> str:
    """The visibility query of `fleetforge list`: one line per job (a fleet's earlier
    continue-as-new runs and, unless `rows`, its rows' model-test children left out)."""
    clauses = [f"FleetforgeJob = {_quote(kind.value)}" if kind else "FleetforgeJob IS NOT NULL",
               "ExecutionStatus != 'ContinuedAsNew'"]
    if not rows and kind is not JobKind.MODEL_TEST:
        clauses.append(f"FleetforgeJob != {_quote(JobKind.MODEL_TEST.value)}")
    if status:
        clauses.append(STATUS_QUERY[JobStatus(status)])
    return " AND ".join(clauses)


class JobContext(Protocol):
    """What a handle needs from its client (FleetforgeClient is one)."""

    @property
    def store(self) -> ArtifactStore: ...

    temporal: Client
    """The Temporal client (its data converter decodes the job's live events)."""

    def ui_url(self, workflow_id: str = "", run_id: str = "", *, query: str = "") -> str: ...


def job_summary(
    ctx: JobContext, workflow_id: str, run_id: str, status: WorkflowExecutionStatus | None,
    attrs: TypedSearchAttributes, start: datetime | None, close: datetime | None,
) -> JobSummary:
    return JobSummary(
        workflow_id=workflow_id, kind=attrs.get(vis.JOB) or kind_of(workflow_id).value,
        status=status_of(status, attrs), model=attrs.get(vis.MODEL) or "", target=attrs.get(vis.TARGET) or "",
        start_time=start, close_time=close, run_id=run_id, ui_url=ctx.ui_url(workflow_id, run_id),
    )


class JobHandle(Generic[ResultT]):
    """A job. `id` is its workflow id (`<kind>/<run_id>`, a fleet row `fleet/<fleet_id>/<row>`)."""

    def __init__(self, handle: WorkflowHandle[Any, ResultT], result_type: type[ResultT],
                 client: JobContext | None = None, notes: list[str] | None = None):
        self._handle = handle
        self.result_type = result_type
        self._client = client
        self.notes: list[str] = list(notes or [])
        """What the SDK wants the user told about this start (e.g. a slow verifier); empty: nothing."""

    def __repr__(self) -> str:
        """What it is, for `print(job)` in a script or a REPL: its id, kind and result contract."""
        return f"JobHandle({self.id!r}, kind={self.kind.value}, result={self.result_type.__name__})"

    @property
    def id(self) -> str:
        return self._handle.id

    @property
    def kind(self) -> JobKind:
        return kind_of(self.id)

    async def describe(self) -> WorkflowExecutionDescription:
        """The latest run's description (JobNotFound when there is no such job)."""
        try:
            return await self._handle.describe()
        except RPCError as e:
            if _not_found(e):
                raise JobNotFound(self.id) from None
            raise

    async def status(self) -> str:
        """The job's status: a JobStatus value (CANCELLED for a cancelled or terminated job)."""
        desc = await self.describe()
        return status_of(desc.status, desc.typed_search_attributes)

    async def summary(self) -> JobSummary:
        desc = await self.describe()
        return job_summary(self._fc, desc.id, desc.run_id, desc.status, desc.typed_search_attributes,
                           desc.start_time, desc.close_time)

    async def ui_url(self) -> str:
        """The Web UI page of the job's latest run (the namespace, the URL-encoded id and the run id)."""
        try:
            run_id = (await self.describe()).run_id
        except (JobNotFound, RPCError):
            run_id = ""
        return self._fc.ui_url(self.id, run_id)

    async def step(self) -> str:
        """What the job is doing now; empty when it cannot say (no worker answers yet)."""
        return (await self.snapshot()).step

    async def snapshot(self) -> JobSnapshot:
        """Where the job is, from one query: its current step, the steps it has finished (so a
        follower misses none between two polls) and, for a fleet, its counts."""
        try:
            match self.kind:
                case JobKind.FLEET_TEST:
                    fp = await self.fleet_progress()
                    if fp is None:
                        return JobSnapshot()
                    return JobSnapshot(fleet=fp, step=fleet_step(fp))
                case JobKind.KERNEL:
                    lines = [f"step {e.step}: {_entry_text(e)}" for e in await self.trace()]
                    return JobSnapshot(step=lines[-1] if lines else "", finished=lines)
                case JobKind.CONVERT:
                    p = await self.progress()
                    if p is None:
                        return JobSnapshot()
                    extra = f" (attempt {p.attempt}, replans {p.replans})" if p.replans else ""
                    return JobSnapshot(step=p.step + extra, finished=[f"run {s}" for s in p.steps_done], convert=p)
                case JobKind.MODEL_TEST:
                    from workflows.model_test import ModelTestWorkflow

                    attempts: list[AttemptRecord] = await self._handle.query(
                        ModelTestWorkflow.attempts, rpc_timeout=_QUERY_TIMEOUT)
                    pending = await self._handle.query(ModelTestWorkflow.pending_command, rpc_timeout=_QUERY_TIMEOUT)
                    lines = [f"attempt {a.attempt}: {a.category.value if a.category else 'passed'}"
                             + (f" ({a.reason})" if a.reason else "") for a in attempts]
                    step = f"awaiting approval: {pending}" if pending else (lines[-1] if lines else "")
                    return JobSnapshot(step=step, finished=lines, pending_command=pending or "")
            return JobSnapshot(step=str(await self._handle.query("step", rpc_timeout=_QUERY_TIMEOUT)))
        except _QUERY_ERRORS:  # no worker yet
            return JobSnapshot()

    async def progress(self) -> ConversionProgress | None:
        """A convert job's `status` query (None for other kinds or when no worker answers)."""
        if self.kind is not JobKind.CONVERT:
            return None
        from workflows.converter import ConverterWorkflow

        try:
            return await self._handle.query(ConverterWorkflow.status, rpc_timeout=_QUERY_TIMEOUT)
        except _QUERY_ERRORS:
            return None

    async def result(self, *, timeout: timedelta | None = None) -> ResultT:
        """Wait for the result contract of a COMPLETED job. Raises JobFailed (carrying the FAILED
        job's result contract), JobCancelled (cancelled or terminated), JobNotFound, TimeoutError
        (after `timeout`), or FleetforgeError(INTERNAL) when the workflow crashed."""
        try:
            wait = self._handle.result()
            if timeout is None:
                return await wait
            return await asyncio.wait_for(wait, timeout.total_seconds())
        except WorkflowFailureError as e:
            if isinstance(e.cause, (CancelledError, TerminatedError)):
                raise JobCancelled(self.id) from None
            failed = result_from_failure(e, self.result_type)
            if failed is not None:
                raise JobFailed(self.id, failed) from None
            raise FleetforgeError(Err.INTERNAL, f"job {self.id} crashed: {e.cause}") from None
        except RPCError as e:
            if _not_found(e):
                raise JobNotFound(self.id) from None
            raise

    async def outcome(self, *, timeout: timedelta | None = None) -> ResultT:
        """The result contract of a finished job, COMPLETED or FAILED alike (what the CLI prints).
        Raises like `result` for anything that has no contract."""
        try:
            return await self.result(timeout=timeout)
        except JobFailed as e:
            return e.result  # type: ignore[return-value]

    async def fleet_progress(self) -> FleetProgress | None:
        """A fleet-test job's `progress` query (None for other kinds or when no worker answers)."""
        if self.kind is not JobKind.FLEET_TEST:
            return None
        from workflows.fleet import FleetTestWorkflow

        try:
            return await self._handle.query(FleetTestWorkflow.progress, rpc_timeout=_QUERY_TIMEOUT)
        except _QUERY_ERRORS:
            return None

    async def trace(self) -> list[TraceEntry]:
        """A kernel job's `trace` query (empty for other kinds or when no worker answers)."""
        if self.kind is not JobKind.KERNEL:
            return []
        from workflows.conductor import ConductorWorkflow

        try:
            return list(await self._handle.query(ConductorWorkflow.trace, rpc_timeout=_QUERY_TIMEOUT))
        except _QUERY_ERRORS:
            return []

    async def kernel_trace(self, result: KernelResult | None = None) -> list[TraceEntry]:
        """A finished kernel job's trace, read from the artifact store (`result`: its contract, when you
        have it already; else the job's outcome; empty for other kinds). `trace()` is a running job's view."""
        if self.kind is not JobKind.KERNEL:
            return []
        result = result if result is not None else await self.outcome()
        return await asyncio.to_thread(outputs.kernel_trace, self._fc.store, result)

    async def events(self, *, from_offset: int = 0) -> AsyncIterator[JobEvent]:
        """The job's live events (contracts/events.py) as they happen: steps, agents' tool calls and
        answers, LLM token deltas, status changes. Starts at the job's first event (`from_offset`: a
        later one); follows continue-as-new; ends once the job has closed and its last events are
        read. Events a continue-as-new run no longer keeps (a follower far behind) come as one SKIPPED
        event with their count, before the first event that is still there. A job whose workflow
        publishes no events (one started before they existed, a fleet row) ends at once. A read that
        times out or finds the server unavailable resumes after the last event seen (a few times);
        other transport errors raise."""
        from temporalio.contrib.workflow_streams import WorkflowStreamClient

        stream = WorkflowStreamClient.create(self._fc.temporal, self.id)
        offset, retries = from_offset, 0
        while True:
            try:
                async for item in stream.subscribe([EVENTS_TOPIC], offset, result_type=JobEvent):
                    if item.offset > offset:  # the stream restarted us at its first kept event (one topic: no other gaps)
                        yield JobEvent(kind=EventKind.SKIPPED, done=item.offset - offset, text=SKIPPED_WHY)
                    offset = item.offset + 1
                    yield item.data
                return
            except (WorkflowUpdateFailedError, WorkflowQueryFailedError) as e:
                if not _unknown_handler(e):
                    raise
                return
            except RPCError as e:
                # a closed job's last events come from a query its worker answers by replaying the
                # history; a busy worker can let it expire: read on from the last event seen
                if e.status not in _TRANSIENT or retries >= _EVENT_READ_RETRIES:
                    raise
                retries += 1

    async def cancel(self) -> None:
        """Request cancellation. JobFinished when the job has already ended (nothing to cancel)."""
        desc = await self.describe()
        if desc.status is not WorkflowExecutionStatus.RUNNING:
            raise JobFinished(self.id, status_of(desc.status, desc.typed_search_attributes), "nothing to cancel")
        try:
            await self._handle.cancel()
        except RPCError as e:
            if not _not_found(e):
                raise
            desc = await self.describe()  # it ended between the two calls
            raise JobFinished(self.id, status_of(desc.status, desc.typed_search_attributes), "nothing to cancel") from None

    async def answer(self, **answers: str | bool | None) -> ConversionProgress:
        """Answer a NEEDS_INPUT convert job (`provide_input` update). A rejected answer raises
        FleetforgeError(BAD_INPUT) with the validator's message; a finished job raises JobFinished."""
        if self.kind is not JobKind.CONVERT:
            raise FleetforgeError(Err.BAD_INPUT, f"{self.id} is a {self.kind.value} job; only convert jobs take answers")
        unknown = set(answers) - set(ProvideInput.model_fields)
        if unknown:
            raise FleetforgeError(
                Err.BAD_INPUT, f"unknown answer {', '.join(sorted(unknown))}: give {', '.join(ProvideInput.model_fields)}")
        from workflows.converter import ConverterWorkflow

        try:
            return await self._handle.execute_update(
                ConverterWorkflow.provide_input, ProvideInput(**answers), result_type=ConversionProgress)
        except WorkflowUpdateFailedError as e:
            message = getattr(e.cause, "message", None) or str(e.cause)
            raise FleetforgeError(Err.BAD_INPUT, f"answer rejected: {message}") from None
        except RPCError as e:
            if e.status not in (RPCStatusCode.NOT_FOUND, RPCStatusCode.FAILED_PRECONDITION):
                raise
            desc = await self.describe()  # JobNotFound when there is no such job at all
            if desc.status is not WorkflowExecutionStatus.RUNNING:
                raise JobFinished(self.id, status_of(desc.status, desc.typed_search_attributes),
                                  "it takes no answers") from None
            raise FleetforgeError(Err.BAD_INPUT, f"answer rejected: {e.message}") from None

    async def artifacts(self) -> list[ArtifactRef]:
        """The finished job's outputs, each named by its workspace-relative name (a FAILED job's too).
        BAD_INPUT while the job still runs; JobCancelled for a cancelled job."""
        desc = await self.describe()
        if desc.status is WorkflowExecutionStatus.RUNNING:
            raise FleetforgeError(Err.BAD_INPUT, f"{self.id} is still running; its artifacts are listed once it "
                                                 f"ends (fleetforge watch {self.id})")
        return outputs.job_outputs(await self.outcome())

    async def download(self, out_dir: str | Path) -> list[Path]:
        """Download the job's outputs into `out_dir` under their names (sha256-checked, normal
        file permissions); returns the paths written."""
        refs = await self.artifacts()
        store = self._fc.store
        return await asyncio.to_thread(outputs.download, store, refs, Path(out_dir))

    @property
    def _fc(self) -> JobContext:
        if self._client is None:
            raise FleetforgeError(Err.INTERNAL, "this handle was made without a FleetforgeClient")
        return self._client


def fleet_label(fp: FleetProgress) -> str:
    """What a fleet's counts mean, for beside its `done/to test` figure."""
    return (f"rows tested: {fp.passed} passed, {fp.failed} failed, {fp.running} running"
            + (f", {fp.skipped} skipped" if fp.skipped else "") + (" (paused)" if fp.paused else ""))


def fleet_step(fp: FleetProgress) -> str:
    """A fleet's progress in words: `3/6 rows tested: 2 passed, 1 failed, 2 running`."""
    if not fp.total:
        return "reading the manifest"
    return f"{fp.done}/{fp.total - fp.skipped} {fleet_label(fp)}"


def _entry_text(entry: TraceEntry) -> str:
    return f"{entry.agent} {'ok' if entry.ok else 'failed'}: {entry.summary}"[:160]
