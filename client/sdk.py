"""The typed client SDK (STYLE G17). It owns every job rule, so every front door (the CLI in
client/cli/, the MCP server, a script) behaves the same:

* start each job kind with checked inputs: `start_inspect`, `start_convert`, `rerun_convert`,
  `start_kernel`, `start_fleet_test` (bad input raises FleetforgeError before anything starts);
* ship what the user points at: a local model (with its `.onnx.data` sidecars, or a SavedModel
  folder) and calibration data are uploaded to the artifact store, content-addressed (a blob the
  store has is not sent again), and the request carries `upload://` references (contracts/uploads.py),
  so workers on other machines read only the store. Paths follow one rule (client/paths.py): relative
  to `cwd` (default: the working directory); s3:// URIs and catalog names go to the worker as given;
* follow and steer a job: `job(id)` / `handle(id)` -> JobHandle (status, snapshot, result, outcome,
  cancel, answer, artifacts, download), `answer`, `approve`, `cancel`, `list_jobs`;
* a fleet's manifest: `fleet_request`, `manifest_mismatch`, `write_back` (verdicts into the CSV).

```python
async with FleetforgeClient.connect() as fc:          # Settings() and its store by default
    handle = await fc.start_convert("model.onnx", soc="sm8550", precision="int8", calibration="calib/")
    result = await handle.outcome()                   # the result contract, COMPLETED or FAILED
    await handle.download("out/")                     # the outputs under their workspace names
```

`fc.upload_progress = fn(name, bytes_done, size)` is told of big uploads (the CLI draws a bar).
Every method that takes a job id takes every id the tool prints (client/ids.py). Rules live in
per-job modules: client/convert.py, client/kernel.py, client/fleet.py, client/uploads.py.
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
from temporalio.client import Client, WorkflowQueryFailedError, WorkflowUpdateFailedError
from temporalio.service import RPCError, RPCStatusCode

from activities.connection import connect
from activities.storage import ArtifactStore, open_store
from client import convert as rules
from client import fleet
from client.fleet import WriteBack
from client.ids import candidates, kind_of, run_id_for
from client.jobs import (  # noqa: F401  (the SDK's public names live here too)
    CANCELLED, JobCancelled, JobFailed, JobFinished, JobHandle, JobNotFound, JobSnapshot, JobSummary, JobView, ResultT,
    _not_found, fleet_label, fleet_step, job_summary, list_query, status_of,
)
from client.kernel import kernel_request, with_source_in_store
from client.paths import local_path
from client.uploads import Uploader, UploadProgress
from contracts.common import JobKind, JobStatus
from contracts.convert_job import ConversionProgress, ConversionRequest, ConversionResult
from contracts.errors import Err, FleetforgeError
from contracts.fleet import HardwareProfile
from contracts.fleet_job import FleetTestRequest, FleetTestResult, ModelTestResult, RunnerKind
from contracts.inspect import InspectRequest, InspectResult
from contracts.kernel_job import KernelRequest, KernelResult
from contracts.settings import Settings
from workflows import _visibility as vis
from workflows import presentation

__all__ = [
    "FleetforgeClient", "JobHandle", "JobSummary", "JobSnapshot", "JobFailed", "JobCancelled", "JobFinished",
    "JobNotFound", "JobView", "WriteBack", "new_run_id", "kind_of",
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
        self.upload_progress: UploadProgress | None = None
        """Told (file name, bytes sent, size) while a big local input uploads; None: silent."""

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

    def uploader(self, progress: UploadProgress | None = None) -> Uploader:
        """What ships local inputs into this client's store (every `start_*` uses one)."""
        return Uploader(self.store, progress if progress is not None else self.upload_progress)

    async def _start(
        self, run: Callable[..., Awaitable[ResultT]], request: BaseModel, *, kind: JobKind, run_id: str,
        result_type: type[ResultT], model: str = "", target: str = "", notes: list[str] | None = None,
    ) -> JobHandle[ResultT]:
        if not model and isinstance(request, FleetTestRequest):
            model = request.manifest.name  # a fleet is named by its CSV
        handle = await self.temporal.start_workflow(
            run, request, id=f"{kind.value}/{run_id}", task_queue=self.settings.queues.workflows,
            search_attributes=vis.start_attributes(kind, model, target), result_type=result_type,
            static_summary=presentation.summary(request), static_details=presentation.details(request),
        )
        return JobHandle(handle, result_type, self, notes)

    async def start_inspect(
        self, model: str | InspectRequest, *, cwd: Path | None = None, **fields: Any,
    ) -> JobHandle[InspectResult]:
        """Inspect a model: a local path (relative to `cwd`, default the working directory; uploaded to
        the store), a file:// or s3:// URI, or a catalog name. A str is checked first (MODEL_NOT_FOUND,
        MODEL_INVALID); a ready InspectRequest is only shipped. `fields`: InspectRequest fields."""
        if isinstance(model, InspectRequest):
            request = model
        else:
            await asyncio.to_thread(rules.check_model, model, self.settings, cwd)
            request = InspectRequest(model=model, **fields)
        shown = rules.resolve_local(request.model)
        shipped = await asyncio.to_thread(self.uploader().ship_model, request.model, cwd)
        req = request.model_copy(update={"model": shipped, "run_id": request.run_id or new_run_id(),
                                         "queues": self.settings.queues})
        from workflows.inspect import InspectModelWorkflow

        return await self._start(InspectModelWorkflow.run, req, kind=JobKind.INSPECT, run_id=req.run_id,
                                 result_type=InspectResult, model=shown)

    async def start_convert(
        self, model: str | ConversionRequest, *, soc: str | None = None, precision: str | None = None,
        calibration: str | None = None, cwd: Path | None = None, **fields: Any,
    ) -> JobHandle[ConversionResult]:
        """Convert a model for a SoC (`soc="sm8550"`) and precision (`"int8"`, `"fp16"`, ...); a missing
        one makes the job ask (NEEDS_INPUT). `model` and `calibration` as in `start_inspect` (local ones
        are uploaded). `fields`: further ConversionRequest fields (output, toolchain, preset, min_cosine,
        ...). A str model is checked before anything starts (BAD_INPUT for an unknown SoC, a combination
        no plan can satisfy or calibration data that does not fit; MODEL_NOT_FOUND, MODEL_INVALID);
        a ready ConversionRequest is only shipped."""
        if isinstance(model, ConversionRequest):
            request = model
        else:
            request = await asyncio.to_thread(rules.convert_request, model, settings=self.settings, soc=soc,
                                              precision=precision, calibration=calibration, cwd=cwd, **fields)
        return await self._start_conversion(request, cwd)

    async def rerun_convert(
        self, run_id: str, *, overrides: dict[str, str] | None = None, model: str | None = None,
        min_cosine: float | None = None, cwd: Path | None = None, **fields: Any,
    ) -> JobHandle[ConversionResult]:
        """Convert again with an earlier conversion's plan (the planner is skipped), its step args changed
        by `overrides` (e.g. {"soc": "sm8650"}). `run_id`: the earlier run's id or job id. `model`, when
        given, must be the earlier run's. BAD_INPUT before anything starts for an unknown run or an
        override no step takes."""
        earlier = run_id_for(JobKind.CONVERT, run_id)
        overrides = dict(overrides or {})
        given = await asyncio.to_thread(rules.rerun_fields, self.store, earlier, model, overrides, min_cosine,
                                        self.uploader())
        request = ConversionRequest(**{**given, **fields}, rerun_of=earlier, overrides=overrides)
        rules.check_request(request)
        return await self._start_conversion(request, cwd)

    async def _start_conversion(self, request: ConversionRequest, cwd: Path | None) -> JobHandle[ConversionResult]:
        shown = rules.resolve_local(request.model)
        shipped = await asyncio.to_thread(rules.shipped_request, request, self.uploader(), cwd)
        update: dict[str, Any] = {"run_id": request.run_id or new_run_id(), "queues": self.settings.queues}
        req = shipped.model_copy(update=_with_llm(ConversionRequest, request, update, self.settings))
        from workflows.converter import ConverterWorkflow

        return await self._start(ConverterWorkflow.run, req, kind=JobKind.CONVERT, run_id=req.run_id,
                                 result_type=ConversionResult, model=shown, target=req.target_soc or "")

    async def start_kernel(
        self, task: str | Path | KernelRequest, *, run_id: str = "", arch: str = "cpu", workflow: str = "default",
        op_name: str | None = None, sets: dict[str, str] | None = None, cwd: Path | None = None, **fields: Any,
    ) -> JobHandle[KernelResult]:
        """Write and verify a Triton kernel for the PyTorch reference in the task file `task` (`arch`
        "cpu": the Triton interpreter). `sets`: module-level constants of the task to change
        ({"batch_size": "16"}). `fields` go to KernelTask (num_candidates, max_step, ...) or
        KernelRequest (max_llm_answers, verify_timeout_s, ...), whichever has them; a KernelRequest is
        used as is. The handle's `notes` carry the verifier's hint for slow sizes."""
        run_id = run_id or new_run_id()
        notes: list[str] = []
        if isinstance(task, KernelRequest):
            request = task
        else:
            start = await asyncio.to_thread(kernel_request, task, run_id=run_id, arch=arch, workflow=workflow,
                                            op_name=op_name, sets=sets, cwd=cwd, **fields)
            request = start.request
            notes = [start.hint] if start.hint else []
        req = request.model_copy(update=_with_llm(KernelRequest, request, {"queues": self.settings.queues}, self.settings))
        req = await asyncio.to_thread(with_source_in_store, req, self.store)
        from workflows.conductor import ConductorWorkflow

        return await self._start(ConductorWorkflow.run, req, kind=JobKind.KERNEL, run_id=run_id,
                                 result_type=KernelResult, model=req.task.op_name, target=req.task.arch, notes=notes)

    async def start_fleet_test(
        self, csv: str | Path, *, name: str = "manifest.csv", run_id: str = "", store: ArtifactStore | None = None,
        hardware: HardwareProfile | Path | None = None, cwd: Path | None = None, **fields: Any,
    ) -> JobHandle[FleetTestResult]:
        """Check and upload the manifest (`csv`: its text, or a Path to the CSV file, relative to
        `cwd`), then start the fleet (MANIFEST_INVALID before anything starts). `hardware`: a
        HardwareProfile or a path to its YAML; without one, this host's GPUs; a profile or row asking for
        GPUs the host lacks is HOST_LACKS_GPUS before anything starts. `fields` are further
        FleetTestRequest fields (runner, concurrency, max_attempts, require_approval, require_tier,
        evidence_columns, max_per_family, process_mode, share, ...); `share` folders (relative to `cwd`)
        are checked and made absolute (BAD_INPUT before anything starts)."""
        from activities.containers.activities import upload_manifest
        from workflows.fleet import FleetTestWorkflow

        if isinstance(csv, Path):
            path = local_path(str(csv), cwd) or csv
            csv_text, name = fleet.read_manifest(path), path.name
        else:
            csv_text = csv
        runner = RunnerKind(fields.get("runner", FleetTestRequest.model_fields["runner"].default))
        fleet.check_manifest(csv_text, runner)
        fields["share"] = fleet.check_process_options(runner, fields.get("share", ()), fields.get("process_mode"), cwd)
        where = "the profile"
        if isinstance(hardware, Path):
            where = str(hardware)
            hardware = fleet.load_hardware(local_path(str(hardware), cwd) or hardware)
        fields["hardware"] = fleet.host_checked_profile(csv_text, hardware, where, fields.get("require_tier"))
        run_id = run_id or new_run_id()
        ref = await asyncio.to_thread(upload_manifest, store or self.store, csv_text, name=name, runner=runner)
        base = FleetTestRequest(manifest=ref, fleet_id=run_id, queues=self.settings.queues, **fields)
        req = base.model_copy(update=_with_llm(FleetTestRequest, base, {}, self.settings))
        return await self._start(FleetTestWorkflow.run, req, kind=JobKind.FLEET_TEST, run_id=run_id,
                                 result_type=FleetTestResult, target=req.runner.value)

    # -- a fleet's manifest ----------------------------------------------------------------

    async def fleet_request(self, job_id: str) -> FleetTestRequest:
        """The request a fleet-test job started with (its manifest ref and fleet id); any fleet id."""
        handle = await self.job(job_id)
        return await fleet.fleet_request(self.temporal, handle.id)

    async def manifest_mismatch(self, job_id: str, csv_path: Path) -> str:
        """Why `csv_path` is not the manifest the fleet started from ("" when it is)."""
        request = await self.fleet_request(job_id)
        return await asyncio.to_thread(fleet.manifest_mismatch, self.store, request, csv_path)

    async def write_back(self, job_id: str, csv_path: Path, *, force: bool = False) -> WriteBack:
        """Merge the fleet's verdicts so far into `csv_path` (see client/fleet.py `write_back`):
        MANIFEST_CHANGED when it is not the fleet's manifest, unless `force`."""
        request = await self.fleet_request(job_id)
        return await asyncio.to_thread(fleet.write_back, self.store, request, csv_path, force=force)

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

    async def show(self, job_id: str) -> JobView:
        """A job as `fleetforge show` (and an MCP `show` tool) presents it: its listing line and, once
        it has finished, its result contract (COMPLETED or FAILED); while it runs, its current step.
        JobCancelled for a cancelled job, JobNotFound for none."""
        handle = await self.job(job_id)
        summary = await handle.summary()
        if summary.status == CANCELLED:
            raise JobCancelled(handle.id)
        if summary.status in (JobStatus.COMPLETED, JobStatus.FAILED):
            return JobView(summary=summary, result=await handle.outcome())
        return JobView(summary=summary, step=await handle.step())

    async def answer(self, job_id: str, **answers: str | bool | None) -> ConversionProgress:
        """Answer a NEEDS_INPUT convert job (see JobHandle.answer)."""
        kind_check = candidates(job_id)
        if len(kind_check) == 1 and kind_of(kind_check[0]) is not JobKind.CONVERT:
            raise FleetforgeError(Err.BAD_INPUT, f"{job_id} is not a convert job; only convert jobs take answers")
        for key in ("calibration", "eval_data"):  # the worker does not share this working directory
            if answers.get(key):
                answers[key] = await asyncio.to_thread(self.uploader().ship_calibration, str(answers[key]))
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
            jobs.append(job_summary(self, ex.id, ex.run_id, ex.status, ex.typed_search_attributes,
                                      ex.start_time, ex.close_time))
        return jobs
