"""The typed client SDK: start jobs, follow them, list and cancel them (STYLE G17).

Every job kind is one `start_*` method over `_start`; the CLI is a thin layer on top of this.
"""

from __future__ import annotations

import asyncio
import secrets
from collections.abc import Awaitable, Callable
from datetime import datetime, timedelta, timezone
from typing import Any, Generic, TypeVar

from pydantic import BaseModel, Field
from temporalio.client import (
    Client, WorkflowExecutionStatus, WorkflowFailureError, WorkflowHandle, WorkflowQueryFailedError,
    WorkflowQueryRejectedError, WorkflowUpdateFailedError,
)
from temporalio.common import TypedSearchAttributes
from temporalio.exceptions import CancelledError, TerminatedError
from temporalio.service import RPCError, RPCStatusCode

from activities.connection import connect
from activities.storage import ArtifactStore, open_store
from contracts.common import JobKind, JobStatus
from contracts.convert_job import ConversionProgress, ConversionRequest, ConversionResult, ProvideInput
from contracts.errors import Err, FleetforgeError
from contracts.fleet_job import FleetProgress, FleetTestRequest, FleetTestResult
from contracts.inspect import InspectRequest, InspectResult
from contracts.kernel_job import KernelRequest, KernelResult, TraceEntry
from contracts.settings import Settings
from workflows import _visibility as vis
from workflows import presentation
from workflows.conductor import ConductorWorkflow
from workflows.failures import result_from_failure
from workflows.converter import ConverterWorkflow
from workflows.fleet import FleetTestWorkflow
from workflows.inspect import InspectModelWorkflow

ResultT = TypeVar("ResultT", bound=BaseModel)

RESULT_TYPES: dict[JobKind, type[BaseModel]] = {
    JobKind.INSPECT: InspectResult, JobKind.CONVERT: ConversionResult, JobKind.KERNEL: KernelResult,
    JobKind.FLEET_TEST: FleetTestResult,
}
"""Result contract per job kind (a new kind adds one entry here and one `start_*` method)."""

CANCELLED = JobStatus.CANCELLED.value
"""Status shown for a job that was cancelled or terminated."""


class JobNotFound(FleetforgeError):
    def __init__(self, workflow_id: str):
        super().__init__(Err.JOB_NOT_FOUND, f"no job with workflow id {workflow_id!r}")


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


class JobSummary(BaseModel):
    """One row of `fleetforge list`: what visibility knows about a job."""

    workflow_id: str
    kind: str
    status: str
    """A JobStatus value, or CANCELLED."""
    model: str = ""
    target: str = ""
    start_time: datetime | None = None
    close_time: datetime | None = None


def new_run_id(now: datetime | None = None) -> str:
    """Readable, sortable run id: `YYYYmmdd-HHMMSS-xxxx`."""
    now = now or datetime.now(timezone.utc)
    return f"{now:%Y%m%d-%H%M%S}-{secrets.token_hex(2)}"


def kind_of(workflow_id: str) -> JobKind:
    """Job kind from a workflow id `<kind>/<run_id>`; JOB_NOT_FOUND for anything else."""
    try:
        return JobKind(workflow_id.split("/", 1)[0])
    except ValueError:
        raise JobNotFound(workflow_id) from None


def _status_of(execution_status: WorkflowExecutionStatus | None, attrs: TypedSearchAttributes) -> str:
    if execution_status in (WorkflowExecutionStatus.CANCELED, WorkflowExecutionStatus.TERMINATED):
        return CANCELLED
    if execution_status in (WorkflowExecutionStatus.FAILED, WorkflowExecutionStatus.TIMED_OUT):
        return JobStatus.FAILED.value
    return attrs.get(vis.STATUS) or JobStatus.RUNNING.value


def _not_found(e: RPCError) -> bool:
    return e.status == RPCStatusCode.NOT_FOUND


class JobSnapshot(BaseModel):
    """A running job as a follower sees it (`JobHandle.snapshot`)."""

    step: str = ""
    finished: list[str] = Field(default_factory=list)
    """The steps it has passed, oldest first (convert: executed steps; kernel: one per trace entry)."""
    convert: ConversionProgress | None = None
    """A convert job's `status` (NEEDS_INPUT and its questions live here)."""
    fleet: FleetProgress | None = None


class JobHandle(Generic[ResultT]):
    """A started job. `id` is its workflow id (`<kind>/<run_id>`)."""

    def __init__(self, handle: WorkflowHandle[Any, ResultT], result_type: type[ResultT]):
        self._handle = handle
        self.result_type = result_type

    @property
    def id(self) -> str:
        return self._handle.id

    async def status(self) -> str:
        """The job's status: a JobStatus value (kept current in FleetforgeStatus), or CANCELLED."""
        try:
            desc = await self._handle.describe()
        except RPCError as e:
            if _not_found(e):
                raise JobNotFound(self.id) from None
            raise
        return _status_of(desc.status, desc.typed_search_attributes)

    async def summary(self) -> JobSummary:
        try:
            desc = await self._handle.describe()
        except RPCError as e:
            if _not_found(e):
                raise JobNotFound(self.id) from None
            raise
        return _summary(desc.id, desc.status, desc.typed_search_attributes, desc.start_time, desc.close_time)

    async def step(self) -> str:
        """What the job is doing now; empty when it cannot say (no worker answers yet)."""
        return (await self.snapshot()).step

    async def snapshot(self) -> JobSnapshot:
        """Where the job is, from one query: its current step, the steps it has finished (so a
        follower misses none between two polls) and, for a fleet, its counts."""
        try:
            if self.id.startswith(JobKind.FLEET_TEST.value + "/"):
                fp = await self.fleet_progress()
                if fp is None:
                    return JobSnapshot()
                return JobSnapshot(fleet=fp, step=f"{fp.done}/{fp.total} tested ({fp.passed} passed, {fp.failed} failed, "
                                                  f"{fp.running} running)" + (" PAUSED" if fp.paused else ""))
            if self.id.startswith(JobKind.KERNEL.value + "/"):
                lines = [f"step {e.step}: {_entry_text(e)}" for e in await self.trace()]
                return JobSnapshot(step=lines[-1] if lines else "", finished=lines)
            if self.id.startswith(JobKind.CONVERT.value + "/"):
                p = await self.progress()
                if p is None:
                    return JobSnapshot()
                extra = f" (attempt {p.attempt}, replans {p.replans})" if p.replans else ""
                return JobSnapshot(step=p.step + extra, finished=[f"run {s}" for s in p.steps_done], convert=p)
            return JobSnapshot(step=str(await self._handle.query("step", rpc_timeout=timedelta(seconds=2))))
        except (RPCError, WorkflowQueryFailedError, WorkflowQueryRejectedError, asyncio.TimeoutError):  # no worker yet
            return JobSnapshot()

    async def progress(self) -> ConversionProgress | None:
        """A convert job's `status` query (None for other kinds or when no worker answers)."""
        if not self.id.startswith(JobKind.CONVERT.value + "/"):
            return None
        try:
            return await self._handle.query(
                ConverterWorkflow.status, rpc_timeout=timedelta(seconds=2),
            )
        except (RPCError, WorkflowQueryFailedError, WorkflowQueryRejectedError, asyncio.TimeoutError):
            return None

    async def result(self, *, timeout: timedelta | None = None) -> ResultT:
        """Wait for the job's result contract of a COMPLETED job. Raises JobFailed (carrying the
        FAILED job's result contract), JobCancelled (cancelled or terminated), JobNotFound,
        TimeoutError (after `timeout`), or FleetforgeError(INTERNAL) when the workflow crashed."""
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
        if not self.id.startswith(JobKind.FLEET_TEST.value + "/"):
            return None
        try:
            return await self._handle.query(FleetTestWorkflow.progress, rpc_timeout=timedelta(seconds=2))
        except (RPCError, WorkflowQueryFailedError, WorkflowQueryRejectedError, asyncio.TimeoutError):
            return None

    async def trace(self) -> list[TraceEntry]:
        """A kernel job's `trace` query (empty for other kinds or when no worker answers)."""
        if not self.id.startswith(JobKind.KERNEL.value + "/"):
            return []
        try:
            return list(await self._handle.query(ConductorWorkflow.trace, rpc_timeout=timedelta(seconds=2)))
        except (RPCError, WorkflowQueryFailedError, WorkflowQueryRejectedError, asyncio.TimeoutError):
            return []

    async def cancel(self) -> None:
        try:
            await self._handle.cancel()
        except RPCError as e:
            if _not_found(e):
                raise JobNotFound(self.id) from None
            raise


def _entry_text(entry: TraceEntry) -> str:
    return f"{entry.agent} {'ok' if entry.ok else 'failed'}: {entry.summary}"[:160]


def _with_llm(model: type[BaseModel], request: BaseModel, update: dict[str, Any], settings: Settings) -> dict[str, Any]:
    """Fill `llm` from the settings when the contract has the field and the caller did not set it."""
    if "llm" in model.model_fields and "llm" not in request.model_fields_set:
        update["llm"] = settings.llm_provider
    return update


def _summary(
    workflow_id: str, status: WorkflowExecutionStatus | None, attrs: TypedSearchAttributes,
    start: datetime | None, close: datetime | None,
) -> JobSummary:
    return JobSummary(
        workflow_id=workflow_id, kind=attrs.get(vis.JOB) or workflow_id.split("/", 1)[0],
        status=_status_of(status, attrs), model=attrs.get(vis.MODEL) or "", target=attrs.get(vis.TARGET) or "",
        start_time=start, close_time=close,
    )


def _quote(value: str) -> str:
    return "'" + value.replace("\\", "\\\\").replace("'", "\\'") + "'"


class FleetforgeClient:
    """Typed access to fleetforge jobs on one Temporal namespace."""

    def __init__(self, client: Client, settings: Settings):
        self.temporal = client
        self.settings = settings

    @classmethod
    async def connect(cls, settings: Settings, store: ArtifactStore | None = None) -> "FleetforgeClient":
        """Connect with the same data converter as the workers (STORE_URL_INVALID, TEMPORAL_UNAVAILABLE)."""
        store = store or open_store(settings)
        return cls(await connect(settings, store), settings)

    def ui_url(self, workflow_id: str) -> str:
        return f"{self.settings.ui_url}/namespaces/{self.settings.namespace}/workflows/{workflow_id}"

    async def _start(
        self, run: Callable[..., Awaitable[ResultT]], request: BaseModel, *, kind: JobKind, run_id: str,
        result_type: type[ResultT], model: str = "", target: str = "",
    ) -> JobHandle[ResultT]:
        handle = await self.temporal.start_workflow(
            run, request, id=f"{kind.value}/{run_id}", task_queue=self.settings.queues.workflows,
            search_attributes=vis.start_attributes(kind, model, target), result_type=result_type,
            static_summary=presentation.summary(request), static_details=presentation.details(request),
        )
        return JobHandle(handle, result_type)

    async def start_inspect(self, request: InspectRequest) -> JobHandle[InspectResult]:
        req = request.model_copy(update={"run_id": request.run_id or new_run_id(), "queues": self.settings.queues})
        return await self._start(InspectModelWorkflow.run, req, kind=JobKind.INSPECT, run_id=req.run_id,
                                 result_type=InspectResult, model=req.model)

    async def start_convert(self, request: ConversionRequest) -> JobHandle[ConversionResult]:
        update: dict[str, Any] = {"run_id": request.run_id or new_run_id(), "queues": self.settings.queues}
        req = request.model_copy(update=_with_llm(ConversionRequest, request, update, self.settings))
        return await self._start(ConverterWorkflow.run, req, kind=JobKind.CONVERT, run_id=req.run_id,
                                 result_type=ConversionResult, model=req.model, target=req.target_soc or "")

    async def start_kernel(self, request: KernelRequest, *, run_id: str = "") -> JobHandle[KernelResult]:
        run_id = run_id or new_run_id()
        req = request.model_copy(update=_with_llm(KernelRequest, request, {"queues": self.settings.queues}, self.settings))
        return await self._start(ConductorWorkflow.run, req, kind=JobKind.KERNEL, run_id=run_id,
                                 result_type=KernelResult, model=req.task.op_name, target=req.task.arch)

    async def start_fleet_test(
        self, csv_text: str, *, name: str = "manifest.csv", run_id: str = "", store: ArtifactStore | None = None,
        **fields: Any,
    ) -> JobHandle[FleetTestResult]:
        """Validate and upload the manifest CSV to the artifact store, then start the fleet
        (MANIFEST_INVALID before anything starts). `fields` are further FleetTestRequest fields."""
        from activities.containers.activities import upload_manifest

        run_id = run_id or new_run_id()
        runner = fields.get("runner", FleetTestRequest.model_fields["runner"].default)
        ref = upload_manifest(store or open_store(self.settings), csv_text, name=name, runner=runner)
        base = FleetTestRequest(manifest=ref, fleet_id=run_id, queues=self.settings.queues, **fields)
        req = base.model_copy(update=_with_llm(FleetTestRequest, base, {}, self.settings))
        return await self._start(FleetTestWorkflow.run, req, kind=JobKind.FLEET_TEST, run_id=run_id,
                                 result_type=FleetTestResult, target=req.runner.value)

    async def approve(self, workflow_id: str, attempt: int, *, approved: bool = True, reason: str = "") -> tuple[str, str]:
        """Approve (or refuse) a model-test row's pending command of `attempt` (the `approve_command`
        update); returns ("approved" | "refused", the command decided on). A row with no command
        waiting, or waiting with another attempt, is FleetforgeError(BAD_INPUT) saying which."""
        from contracts.fleet_job import ApprovalRequest
        from workflows.fleet import ModelTestWorkflow

        if not workflow_id.startswith("fleet/"):
            raise FleetforgeError(Err.BAD_INPUT, f"{workflow_id} is not a fleet row: give the row's id fleet/FLEET_ID/ROW "
                                  "(fleetforge list --status AWAITING_APPROVAL)")
        handle = self.temporal.get_workflow_handle(workflow_id)
        try:
            command = await handle.query(ModelTestWorkflow.pending_command, rpc_timeout=timedelta(seconds=5)) or ""
            verdict = await handle.execute_update(
                ModelTestWorkflow.approve_command, ApprovalRequest(attempt=attempt, approved=approved, reason=reason))
        except WorkflowUpdateFailedError as e:
            message = getattr(e.cause, "message", None) or str(e.cause)
            raise FleetforgeError(Err.BAD_INPUT, f"approval rejected: {message}") from None
        except WorkflowQueryFailedError as e:
            raise FleetforgeError(Err.BAD_INPUT, f"{workflow_id} cannot take an approval: {e}") from None
        except RPCError as e:
            if _not_found(e):
                raise JobNotFound(workflow_id) from None
            if e.status == RPCStatusCode.FAILED_PRECONDITION or "completed" in e.message.lower():
                raise FleetforgeError(Err.BAD_INPUT, f"approval rejected: {workflow_id} is no longer running") from None
            raise
        return verdict, command

    async def answer(self, workflow_id: str, **answers: str | None) -> ConversionProgress:
        """Answer a NEEDS_INPUT convert job (`provide_input` update). A rejected answer raises
        FleetforgeError(BAD_INPUT) with the validator's message."""
        if kind_of(workflow_id) is not JobKind.CONVERT:
            raise FleetforgeError(Err.BAD_INPUT, f"{workflow_id} is not a convert job; only convert jobs take answers")
        unknown = set(answers) - set(ProvideInput.model_fields)
        if unknown:
            raise FleetforgeError(
                Err.BAD_INPUT, f"unknown answer {', '.join(sorted(unknown))}: give {', '.join(ProvideInput.model_fields)}")
        handle = self.temporal.get_workflow_handle(workflow_id)
        try:
            return await handle.execute_update(
                ConverterWorkflow.provide_input, ProvideInput(**answers), result_type=ConversionProgress)
        except WorkflowUpdateFailedError as e:
            cause = e.cause
            message = getattr(cause, "message", None) or str(cause)
            raise FleetforgeError(Err.BAD_INPUT, f"answer rejected: {message}") from None
        except RPCError as e:
            if _not_found(e):
                raise JobNotFound(workflow_id) from None
            if e.status == RPCStatusCode.FAILED_PRECONDITION or "completed" in e.message.lower():
                raise FleetforgeError(Err.BAD_INPUT, f"answer rejected: {workflow_id} is no longer running") from None
            raise

    def handle(self, workflow_id: str) -> JobHandle[Any]:
        result_type = RESULT_TYPES[kind_of(workflow_id)]
        return JobHandle(self.temporal.get_workflow_handle(workflow_id, result_type=result_type), result_type)

    async def list_jobs(
        self, kind: JobKind | None = None, status: JobStatus | str | None = None, limit: int = 50
    ) -> list[JobSummary]:
        """Newest first. `status` filters on FleetforgeStatus (CANCELLED: cancelled/terminated jobs)."""
        clauses = [f"FleetforgeJob = {_quote(kind.value)}" if kind else "FleetforgeJob IS NOT NULL"]
        if status == CANCELLED:
            clauses.append("ExecutionStatus IN ('Canceled', 'Terminated')")
        elif status:
            clauses.append(f"FleetforgeStatus = {_quote(str(status))}")
            if status == JobStatus.RUNNING:  # a cancelled job keeps its last FleetforgeStatus
                clauses.append("ExecutionStatus = 'Running'")
        jobs: list[JobSummary] = []
        async for ex in self.temporal.list_workflows(" AND ".join(clauses), limit=limit):
            jobs.append(_summary(ex.id, ex.status, ex.typed_search_attributes, ex.start_time, ex.close_time))
        return jobs

    async def cancel(self, workflow_id: str) -> None:
        await self.handle(workflow_id).cancel()
