"""The typed client SDK: start jobs, follow them, list, cancel and answer them, fetch their outputs
(STYLE G17). The CLI is a thin layer on top of this.

```python
async with FleetforgeClient.connect() as fc:          # Settings() and its store by default
    handle = await fc.start_convert("model.onnx", soc="sm8550", precision="int8")
    result = await handle.result()                    # raises JobFailed (carrying the result)
    await handle.download("out/")                     # the outputs under their workspace names
```

Every method that takes a job id takes every id the tool prints (client/ids.py).
"""

from __future__ import annotations

import asyncio
import atexit
import gc
import secrets
from collections.abc import Awaitable, Callable, Generator
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any, Generic, TypeVar

from pydantic import BaseModel, Field
from temporalio.client import (
    Client, WorkflowExecutionDescription, WorkflowExecutionStatus, WorkflowFailureError, WorkflowHandle,
    WorkflowQueryFailedError, WorkflowQueryRejectedError, WorkflowUpdateFailedError,
)
from temporalio.common import TypedSearchAttributes
from temporalio.exceptions import CancelledError, TerminatedError
from temporalio.service import RPCError, RPCStatusCode

from activities.connection import connect
from activities.storage import ArtifactStore, open_store
from client import artifacts as outputs
from client.ids import candidates, kind_of
from contracts.common import ArtifactRef, JobKind, JobStatus
from contracts.convert_job import ConversionProgress, ConversionRequest, ConversionResult, ProvideInput
from contracts.errors import Err, FleetforgeError
from contracts.fleet_job import AttemptRecord, FleetProgress, FleetTestRequest, FleetTestResult, ModelTestResult
from contracts.inspect import InspectRequest, InspectResult
from contracts.kernel import CPU_ARCHES
from contracts.kernel_job import KernelRequest, KernelResult, TraceEntry
from contracts.settings import Settings
from workflows import _visibility as vis
from workflows import presentation
from workflows.conductor import ConductorWorkflow
from workflows.converter import ConverterWorkflow
from workflows.failures import result_from_failure
from workflows.fleet import FleetTestWorkflow, ModelTestWorkflow
from workflows.inspect import InspectModelWorkflow

__all__ = [
    "FleetforgeClient", "JobHandle", "JobSummary", "JobSnapshot", "JobFailed", "JobCancelled", "JobFinished",
    "JobNotFound", "new_run_id", "kind_of",
]

ResultT = TypeVar("ResultT", bound=BaseModel)

RESULT_TYPES: dict[JobKind, type[BaseModel]] = {
    JobKind.INSPECT: InspectResult, JobKind.CONVERT: ConversionResult, JobKind.KERNEL: KernelResult,
    JobKind.FLEET_TEST: FleetTestResult, JobKind.MODEL_TEST: ModelTestResult,
}
"""Result contract per job kind (a new kind adds one entry here and one `start_*` method)."""

CANCELLED = JobStatus.CANCELLED.value
"""Status shown for a job that was cancelled or terminated."""

_QUERY_ERRORS = (RPCError, WorkflowQueryFailedError, WorkflowQueryRejectedError, asyncio.TimeoutError)
_QUERY_TIMEOUT = timedelta(seconds=2)


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


class JobSnapshot(BaseModel):
    """A running job as a follower sees it (`JobHandle.snapshot`)."""

    step: str = ""
    finished: list[str] = Field(default_factory=list)
    """The steps it has passed, oldest first (convert: executed steps; kernel: one per trace entry)."""
    convert: ConversionProgress | None = None
    """A convert job's `status` (NEEDS_INPUT and its questions live here)."""
    fleet: FleetProgress | None = None


def new_run_id(now: datetime | None = None) -> str:
    """Readable, sortable run id: `YYYYmmdd-HHMMSS-xxxx`."""
    now = now or datetime.now(timezone.utc)
    return f"{now:%Y%m%d-%H%M%S}-{secrets.token_hex(2)}"


def status_of(execution_status: WorkflowExecutionStatus | None, attrs: TypedSearchAttributes) -> str:
    """A job's status: the execution status decides once the job is closed (a job cancelled or
    terminated while it waited for input is CANCELLED, whatever FleetforgeStatus last said);
    while it runs, FleetforgeStatus says what it is doing."""
    recorded = attrs.get(vis.STATUS) or JobStatus.RUNNING.value
    match execution_status:
        case WorkflowExecutionStatus.CANCELED | WorkflowExecutionStatus.TERMINATED:
            return CANCELLED
        case WorkflowExecutionStatus.FAILED | WorkflowExecutionStatus.TIMED_OUT:
            return JobStatus.FAILED.value
        case WorkflowExecutionStatus.COMPLETED:  # FAILED: a job recorded before failures failed the execution
            return recorded if recorded in (JobStatus.COMPLETED, JobStatus.FAILED) else JobStatus.COMPLETED.value
    return recorded


def _not_found(e: RPCError) -> bool:
    return e.status == RPCStatusCode.NOT_FOUND


def _quote(value: str) -> str:
    return "'" + value.replace("\\", "\\\\").replace("'", "\\'") + "'"


STATUS_QUERY: dict[str, str] = {
    JobStatus.RUNNING: "ExecutionStatus = 'Running' AND FleetforgeStatus = 'RUNNING'",
    JobStatus.NEEDS_INPUT: "ExecutionStatus = 'Running' AND FleetforgeStatus = 'NEEDS_INPUT'",
    JobStatus.AWAITING_APPROVAL: "ExecutionStatus = 'Running' AND FleetforgeStatus = 'AWAITING_APPROVAL'",
    JobStatus.COMPLETED: "ExecutionStatus = 'Completed' AND FleetforgeStatus = 'COMPLETED'",
    JobStatus.FAILED: "(ExecutionStatus IN ('Failed', 'TimedOut') OR "
                      "(ExecutionStatus = 'Completed' AND FleetforgeStatus = 'FAILED'))",
    JobStatus.CANCELLED: "ExecutionStatus IN ('Canceled', 'Terminated')",
}
"""Visibility filter per job status, the same mapping as `status_of` (so a cancelled job that was
waiting for input is never listed as NEEDS_INPUT)."""


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


class JobHandle(Generic[ResultT]):
    """A job. `id` is its workflow id (`<kind>/<run_id>`, a fleet row `fleet/<fleet_id>/<row>`)."""

    def __init__(self, handle: WorkflowHandle[Any, ResultT], result_type: type[ResultT],
                 client: "FleetforgeClient | None" = None):
        self._handle = handle
        self.result_type = result_type
        self._client = client

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
        return self._fc._summary(desc.id, desc.run_id, desc.status, desc.typed_search_attributes,
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
                    attempts: list[AttemptRecord] = await self._handle.query(
                        ModelTestWorkflow.attempts, rpc_timeout=_QUERY_TIMEOUT)
                    pending = await self._handle.query(ModelTestWorkflow.pending_command, rpc_timeout=_QUERY_TIMEOUT)
                    lines = [f"attempt {a.attempt}: {a.category.value if a.category else 'passed'}"
                             + (f" ({a.reason})" if a.reason else "") for a in attempts]
                    step = f"awaiting approval: {pending}" if pending else (lines[-1] if lines else "")
                    return JobSnapshot(step=step, finished=lines)
            return JobSnapshot(step=str(await self._handle.query("step", rpc_timeout=_QUERY_TIMEOUT)))
        except _QUERY_ERRORS:  # no worker yet
            return JobSnapshot()

    async def progress(self) -> ConversionProgress | None:
        """A convert job's `status` query (None for other kinds or when no worker answers)."""
        if self.kind is not JobKind.CONVERT:
            return None
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
        try:
            return await self._handle.query(FleetTestWorkflow.progress, rpc_timeout=_QUERY_TIMEOUT)
        except _QUERY_ERRORS:
            return None

    async def trace(self) -> list[TraceEntry]:
        """A kernel job's `trace` query (empty for other kinds or when no worker answers)."""
        if self.kind is not JobKind.KERNEL:
            return []
        try:
            return list(await self._handle.query(ConductorWorkflow.trace, rpc_timeout=_QUERY_TIMEOUT))
        except _QUERY_ERRORS:
            return []

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

    async def answer(self, **answers: str | None) -> ConversionProgress:
        """Answer a NEEDS_INPUT convert job (`provide_input` update). A rejected answer raises
        FleetforgeError(BAD_INPUT) with the validator's message; a finished job raises JobFinished."""
        if self.kind is not JobKind.CONVERT:
            raise FleetforgeError(Err.BAD_INPUT, f"{self.id} is a {self.kind.value} job; only convert jobs take answers")
        unknown = set(answers) - set(ProvideInput.model_fields)
        if unknown:
            raise FleetforgeError(
                Err.BAD_INPUT, f"unknown answer {', '.join(sorted(unknown))}: give {', '.join(ProvideInput.model_fields)}")
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
    def _fc(self) -> "FleetforgeClient":
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


def _with_llm(model: type[BaseModel], request: BaseModel, update: dict[str, Any], settings: Settings) -> dict[str, Any]:
    """Fill `llm` from the settings when the contract has the field and the caller did not set it."""
    if "llm" in model.model_fields and "llm" not in request.model_fields_set:
        update["llm"] = settings.llm_provider
    return update


_collect_at_exit = False


def _collect_garbage_at_exit() -> None:
    """Collect the Temporal client's garbage before the interpreter finalises: native objects freed
    during finalisation can abort the process (PyGILState_Release, exit 134 or 139; sdk-python #300).
    Measured here with a short connect/start/list/cancel script: 7 of 100 runs aborted without a
    collection, 0 of 260 with one in the event loop (`close`), 0 of 80 with this atexit hook alone."""
    global _collect_at_exit
    if not _collect_at_exit:
        atexit.register(gc.collect)
        _collect_at_exit = True


class _Connecting:
    """What `FleetforgeClient.connect()` returns: await it for a client, or use it as
    `async with FleetforgeClient.connect() as fc:` to have the client closed at the end."""

    def __init__(self, connect: Callable[[], Awaitable["FleetforgeClient"]]):
        self._connect = connect
        self._client: FleetforgeClient | None = None

    def __await__(self) -> Generator[Any, None, "FleetforgeClient"]:
        return self._connect().__await__()

    async def __aenter__(self) -> "FleetforgeClient":
        self._client = await self._connect()
        return self._client

    async def __aexit__(self, *exc: object) -> None:
        if self._client is not None:
            await self._client.close()


class FleetforgeClient:
    """Typed access to fleetforge jobs on one Temporal namespace."""

    def __init__(self, client: Client, settings: Settings, store: ArtifactStore | None = None):
        self.temporal = client
        self.settings = settings
        self._store = store

    @classmethod
    def connect(cls, settings: Settings | None = None, store: ArtifactStore | None = None) -> _Connecting:
        """Connect with the same configuration and data converter as the workers: Settings() (the
        Temporal environment and profile, FLEETFORGE_*) unless given. STORE_URL_INVALID,
        TEMPORAL_UNAVAILABLE. Await it, or `async with` it to close the client at the end."""
        async def go() -> FleetforgeClient:
            s = settings or Settings()
            st = store or open_store(s)
            _collect_garbage_at_exit()
            clients_serve_no_metrics = s.model_copy(update={"metrics_port": None})  # the port is the worker's
            return cls(await connect(clients_serve_no_metrics, st), s, st)

        return _Connecting(go)

    async def close(self) -> None:
        """Let go of the Temporal connection while the event loop still runs, so the process exits
        cleanly (`async with FleetforgeClient.connect()` calls it). Use the client no more after it."""
        self.temporal = None  # type: ignore[assignment]
        gc.collect()
        await asyncio.sleep(0)

    async def __aenter__(self) -> "FleetforgeClient":
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    @property
    def store(self) -> ArtifactStore:
        """The artifact store the client uploads to and downloads from (the settings' by default)."""
        if self._store is None:
            self._store = open_store(self.settings)
        return self._store

    def ui_url(self, workflow_id: str = "", run_id: str = "", *, query: str = "") -> str:
        """A Web UI link: a job's page (with its run id when known) or the filtered job list."""
        return vis.web_ui_link(self.settings.ui_url, self.settings.namespace, workflow_id, run_id, query=query)

    # -- starting jobs ---------------------------------------------------------------------

    async def _start(
        self, run: Callable[..., Awaitable[ResultT]], request: BaseModel, *, kind: JobKind, run_id: str,
        result_type: type[ResultT], model: str = "", target: str = "",
    ) -> JobHandle[ResultT]:
        if not model and isinstance(request, FleetTestRequest):
            model = request.manifest.name  # a fleet is named by its CSV
        handle = await self.temporal.start_workflow(
            run, request, id=f"{kind.value}/{run_id}", task_queue=self.settings.queues.workflows,
            search_attributes=vis.start_attributes(kind, model, target), result_type=result_type,
            static_summary=presentation.summary(request), static_details=presentation.details(request),
        )
        return JobHandle(handle, result_type, self)

    async def start_inspect(self, model: str | InspectRequest, **fields: Any) -> JobHandle[InspectResult]:
        """Inspect a model (path, file:// or s3:// URI, catalog name); `fields`: InspectRequest fields."""
        request = model if isinstance(model, InspectRequest) else InspectRequest(model=local_model(model), **fields)
        req = request.model_copy(update={"run_id": request.run_id or new_run_id(), "queues": self.settings.queues})
        return await self._start(InspectModelWorkflow.run, req, kind=JobKind.INSPECT, run_id=req.run_id,
                                 result_type=InspectResult, model=req.model)

    async def start_convert(
        self, model: str | ConversionRequest, *, soc: str | None = None, precision: str | None = None, **fields: Any,
    ) -> JobHandle[ConversionResult]:
        """Convert a model for a SoC (`soc="sm8550"`) and precision (`"int8"`, `"fp16"`, ...); a missing
        one makes the job ask (NEEDS_INPUT). `fields`: further ConversionRequest fields (output, preset, ...)."""
        if isinstance(model, ConversionRequest):
            request = model
        else:
            request = ConversionRequest(model=local_model(model), target_soc=soc, precision=precision, **fields)
        update: dict[str, Any] = {"run_id": request.run_id or new_run_id(), "queues": self.settings.queues}
        req = request.model_copy(update=_with_llm(ConversionRequest, request, update, self.settings))
        return await self._start(ConverterWorkflow.run, req, kind=JobKind.CONVERT, run_id=req.run_id,
                                 result_type=ConversionResult, model=req.model, target=req.target_soc or "")

    async def start_kernel(
        self, task: str | Path | KernelRequest, *, run_id: str = "", arch: str = "cpu", workflow: str = "default",
        **fields: Any,
    ) -> JobHandle[KernelResult]:
        """Write and verify a Triton kernel for the PyTorch reference in the task file `task` (`arch`
        "cpu": the Triton interpreter). `fields` go to KernelTask (op_name, num_candidates, max_step,
        ...) or KernelRequest (verify_timeout_s, ...), whichever has them; a KernelRequest is used as is."""
        run_id = run_id or new_run_id()
        request = task if isinstance(task, KernelRequest) else _kernel_request(Path(task), run_id, arch, workflow, fields)
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

    async def approve(self, workflow_id: str, attempt: int, *, approved: bool = True, reason: str = "") -> str:
        """Approve (or refuse) a model-test's pending command of `attempt` (the `approve_command` update)."""
        from contracts.fleet_job import ApprovalRequest
        from workflows.fleet import ModelTestWorkflow

        handle = self.temporal.get_workflow_handle(workflow_id)
        try:
            return await handle.execute_update(
                ModelTestWorkflow.approve_command, ApprovalRequest(attempt=attempt, approved=approved, reason=reason))
        except WorkflowUpdateFailedError as e:
            message = getattr(e.cause, "message", None) or str(e.cause)
            raise FleetforgeError(Err.BAD_INPUT, f"approval rejected: {message}") from None
        except RPCError as e:
            if _not_found(e):
                raise JobNotFound(workflow_id) from None
            raise

    # -- existing jobs ---------------------------------------------------------------------

    def handle(self, job_id: str) -> JobHandle[Any]:
        """A handle on a job named by a full id (`kind/run_id`, `fleet/FLEET_ID/ROW`, `fleet/FLEET_ID`,
        a Web UI link). A bare run id needs a lookup: use `await job(...)`."""
        found = candidates(job_id)
        if len(found) != 1:
            raise FleetforgeError(Err.BAD_INPUT, f"{job_id!r} is a bare run id: give KIND/{job_id.strip()} "
                                                 f"(the SDK's `await client.job(...)` looks it up)")
        return self._handle_for(found[0])

    async def job(self, job_id: str) -> JobHandle[Any]:
        """A handle on the job named by any id the tool prints (client/ids.py). JobNotFound when
        none exists; BAD_INPUT when a bare run id names jobs of several kinds."""
        found = candidates(job_id)
        if len(found) == 1:
            return self._handle_for(found[0])
        exists = await asyncio.gather(*(self._exists(w) for w in found))
        matching = [w for w, ok in zip(found, exists) if ok]
        if not matching:
            raise JobNotFound(job_id)
        if len(matching) > 1:
            raise FleetforgeError(Err.BAD_INPUT, f"{job_id!r} names {len(matching)} jobs: use one of {', '.join(matching)}")
        return self._handle_for(matching[0])

    def _handle_for(self, workflow_id: str) -> JobHandle[Any]:
        result_type = RESULT_TYPES[kind_of(workflow_id)]
        return JobHandle(self.temporal.get_workflow_handle(workflow_id, result_type=result_type), result_type, self)

    async def _exists(self, workflow_id: str) -> bool:
        try:
            await self.temporal.get_workflow_handle(workflow_id).describe()
            return True
        except RPCError as e:
            if _not_found(e):
                return False
            raise

    async def answer(self, job_id: str, **answers: str | None) -> ConversionProgress:
        """Answer a NEEDS_INPUT convert job (see JobHandle.answer)."""
        kind_check = candidates(job_id)
        if len(kind_check) == 1 and kind_of(kind_check[0]) is not JobKind.CONVERT:
            raise FleetforgeError(Err.BAD_INPUT, f"{job_id} is not a convert job; only convert jobs take answers")
        return await (await self.job(job_id)).answer(**answers)

    async def cancel(self, job_id: str) -> None:
        await (await self.job(job_id)).cancel()

    async def list_jobs(
        self, kind: JobKind | None = None, status: JobStatus | str | None = None, limit: int = 50, *, rows: bool = False,
    ) -> list[JobSummary]:
        """Newest first, one entry per job (a fleet's continue-as-new runs are one job; its rows
        only with `rows`). `status` is a JobStatus value, matched as `status_of` reports it."""
        jobs: list[JobSummary] = []
        query = list_query(kind, str(status) if status else None, rows=rows)
        async for ex in self.temporal.list_workflows(query, limit=limit):
            jobs.append(self._summary(ex.id, ex.run_id, ex.status, ex.typed_search_attributes,
                                      ex.start_time, ex.close_time))
        return jobs

    def _summary(
        self, workflow_id: str, run_id: str, status: WorkflowExecutionStatus | None, attrs: TypedSearchAttributes,
        start: datetime | None, close: datetime | None,
    ) -> JobSummary:
        return JobSummary(
            workflow_id=workflow_id, kind=attrs.get(vis.JOB) or kind_of(workflow_id).value,
            status=status_of(status, attrs), model=attrs.get(vis.MODEL) or "", target=attrs.get(vis.TARGET) or "",
            start_time=start, close_time=close, run_id=run_id, ui_url=self.ui_url(workflow_id, run_id),
        )


def local_model(model: str) -> str:
    """A model reference as the worker must see it: a relative path that exists here made absolute
    (the worker runs elsewhere); URIs and catalog names unchanged."""
    path = Path(model)
    if "://" not in model and not path.is_absolute() and path.exists():
        return str(path.resolve())
    return model


def _kernel_request(path: Path, run_id: str, arch: str, workflow: str, fields: dict[str, Any]) -> KernelRequest:
    """A KernelRequest from a task file: op name = the file's stem, the shipped (or given) workflow."""
    from activities.kernels.config_loader import config_for_task
    from contracts.kernel import KernelTask

    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as e:
        raise FleetforgeError(Err.BAD_INPUT, f"{path}: cannot read the kernel task: {e}") from None
    request_fields = {k: fields.pop(k) for k in list(fields) if k in KernelRequest.model_fields}
    task_fields = {"op_name": path.stem, "task_id": f"{path.stem}-{run_id}", **fields}
    kt = KernelTask(task_desc=text, arch="cpu" if arch in CPU_ARCHES else arch, workflow=workflow, **task_fields)
    return KernelRequest(task=kt, config=config_for_task(kt), **request_fields)
