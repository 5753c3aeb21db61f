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
from typing import Any

from pydantic import BaseModel
from temporalio.client import Client, WorkflowExecutionStatus, WorkflowQueryFailedError, WorkflowUpdateFailedError
from temporalio.common import TypedSearchAttributes
from temporalio.service import RPCError, RPCStatusCode

from activities.connection import connect
from activities.storage import ArtifactStore, open_store
from client.ids import candidates, kind_of
from client.jobs import (  # noqa: F401  (the SDK's public names live here too)
    CANCELLED, JobCancelled, JobFailed, JobFinished, JobHandle, JobNotFound, JobSnapshot, JobSummary, ResultT,
    _not_found, fleet_label, fleet_step, list_query, status_of,
)
from contracts.common import JobKind, JobStatus
from contracts.convert_job import ConversionProgress, ConversionRequest, ConversionResult
from contracts.errors import Err, FleetforgeError
from contracts.fleet_job import FleetTestRequest, FleetTestResult, ModelTestResult
from contracts.inspect import InspectRequest, InspectResult
from contracts.kernel import CPU_ARCHES
from contracts.kernel_job import KernelRequest, KernelResult
from contracts.settings import Settings
from workflows import _visibility as vis
from workflows import presentation
from workflows.conductor import ConductorWorkflow
from workflows.converter import ConverterWorkflow
from workflows.fleet import FleetTestWorkflow
from workflows.inspect import InspectModelWorkflow

__all__ = [
    "FleetforgeClient", "JobHandle", "JobSummary", "JobSnapshot", "JobFailed", "JobCancelled", "JobFinished",
    "JobNotFound", "new_run_id", "kind_of",
]

RESULT_TYPES: dict[JobKind, type[BaseModel]] = {
    JobKind.INSPECT: InspectResult, JobKind.CONVERT: ConversionResult, JobKind.KERNEL: KernelResult,
    JobKind.FLEET_TEST: FleetTestResult, JobKind.MODEL_TEST: ModelTestResult,
}
"""Result contract per job kind (a new kind adds one entry here and one `start_*` method)."""

def new_run_id(now: datetime | None = None) -> str:
    """Readable, sortable run id: `YYYYmmdd-HHMMSS-xxxx`."""
    now = now or datetime.now(timezone.utc)
    return f"{now:%Y%m%d-%H%M%S}-{secrets.token_hex(2)}"


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

    async def approve(self, workflow_id: str, attempt: int, *, approved: bool = True, reason: str = "") -> tuple[str, str]:
        """Approve (or refuse) a model-test row's pending command of `attempt` (the `approve_command`
        update); returns ("approved" | "refused", the command decided on). A row with no command
        waiting, or waiting with another attempt, is FleetforgeError(BAD_INPUT) saying which."""
        from contracts.fleet_job import ApprovalRequest
        from workflows.model_test import ModelTestWorkflow

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
