"""`fleetforge mcp`: fleetforge's MCP front door, thin over the SDK (client/sdk.py owns every job rule).

Tools: inspect, convert, kernel, fleet_test (long jobs: MCP tasks for clients that declare the tasks
extension, else they return the job id at once), list_jobs, show, answer, approve, cancel, watch (a
job's live events as progress notifications). Resources: a finished job's outputs,
`fleetforge://jobs/{job}/artifacts/{name}` (both URL-encoded), read from the artifact store with their
sha256 checked. Nothing about a job is kept here: every answer comes from Temporal."""

from __future__ import annotations

import asyncio
import functools
import inspect
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Annotated, Any
from urllib.parse import quote, unquote

from mcp.server.mcpserver import Context, MCPServer
from mcp.server.mcpserver.exceptions import ResourceError, ResourceNotFoundError, ToolError
from mcp_types import InputRequiredResult
from pydantic import BaseModel, Field

from client import fleetforge_version
from client.jobs import CANCELLED, JobCancelled, JobHandle
from client.mcp_server.args import (
    AnswerArgs, ConvertArgs, FleetTestArgs, InspectArgs, KernelArgs, ListArgs,
)
from client.mcp_server.tasks import JobState, JobTasks, answers_from
from client.mcp_server.watch import WATCH_SECONDS, Watched, watch_job
from client.sdk import FleetforgeClient
from contracts.common import ArtifactRef, JobStatus
from contracts.errors import Err, FleetforgeError
from contracts.settings import Settings

ARTIFACT_TEMPLATE = "fleetforge://jobs/{job}/artifacts/{name}"


def artifact_uri(job_id: str, name: str) -> str:
    return ARTIFACT_TEMPLATE.format(job=quote(job_id, safe=""), name=quote(name, safe=""))


class JobStarted(BaseModel):
    """A job tool's answer to a client that does not take tasks: the job runs on; follow it by id."""

    job_id: str
    status: str
    ui_url: str
    next: str


class ArtifactLink(BaseModel):
    name: str
    uri: str
    """The MCP resource to read it from."""
    sha256: str
    size: int


class ShownJob(BaseModel):
    """`show`: the SDK's view of a job (FleetforgeClient.show), its questions, its outputs as resources."""

    job_id: str
    status: str
    step: str = ""
    questions: list[str] = []
    ui_url: str = ""
    result: dict[str, Any] | None = None
    artifacts: list[ArtifactLink] = []


class Backend:
    """One FleetforgeClient for the server's life, connected on first use (a server that cannot reach
    Temporal still starts and answers tools/list; each call says TEMPORAL_UNAVAILABLE)."""

    def __init__(self, settings: Settings | None = None):
        self.settings = settings
        self._fc: FleetforgeClient | None = None
        self._lock = asyncio.Lock()

    async def client(self) -> FleetforgeClient:
        async with self._lock:
            if self._fc is None:
                self._fc = await FleetforgeClient.connect(self.settings)
            return self._fc

    async def job(self, job_id: str) -> JobHandle[Any]:
        return await (await self.client()).job(job_id)

    # -- starting jobs (the SDK's calls; this module adds no rule) ------------------------------

    async def start(self, tool: str, arguments: dict[str, Any]) -> JobHandle[Any]:
        """Start the job behind a job tool: its arguments are the SDK's keywords (client/job_options.py)."""
        fc = await self.client()
        args = JOB_TOOLS[tool].model_validate(arguments).model_dump()
        match tool:
            case "inspect":
                return await fc.start_inspect(args.pop("model"))
            case "convert":
                return await fc.start_convert(args.pop("model"), **args)
            case "kernel":
                return await fc.start_kernel(Path(args.pop("task_file")), sets=args.pop("sets") or None, **args)
            case "fleet_test":
                return await fc.start_fleet_test(Path(args.pop("manifest")), **args)
        raise FleetforgeError(Err.BAD_INPUT, f"{tool} is not a job tool")

    # -- reading a job (for tasks/get and show) -------------------------------------------------

    async def state(self, job_id: str, *, with_result: bool = True) -> JobState:
        handle = await self.job(job_id)
        desc = await handle.describe()
        summary = await handle.summary()
        snap = await handle.snapshot()
        state = JobState(job_id=handle.id, status=summary.status, created_at=desc.start_time,
                         updated_at=desc.close_time or desc.start_time, snapshot=snap)
        if summary.status == JobStatus.AWAITING_APPROVAL and snap.pending_command:
            state.pending_command = snap.pending_command
            state.pending_attempt = len(snap.finished) + 1
        if with_result and summary.status in (JobStatus.COMPLETED, JobStatus.FAILED):
            try:
                result = await handle.outcome()
            except FleetforgeError as e:  # ended without a result contract (its workflow crashed)
                state.crashed = f"[{e.code}] {e}"
                return state
            failure = getattr(result, "failure", None)
            state.result = result.model_dump(mode="json")
            state.summary = (f"{handle.id} {summary.status}"
                             + (f": {failure.code} in {failure.where}: {failure.message}" if failure else "")
                             + (f" (what to do: {failure.hint})" if getattr(failure, "hint", "") else ""))
        return state

    async def answer_task(self, state: JobState, key: str, response: dict[str, Any]) -> None:
        """One elicitation response, delivered through the job's Update (SDK calls)."""
        content = response.get("content") or {}
        accepted = response.get("action") == "accept"
        fc = await self.client()
        if key.startswith("approve-"):
            approved = accepted and bool(content.get("approved"))
            await fc.approve(state.job_id, state.pending_attempt, approved=approved,
                             reason=str(content.get("reason") or ("" if accepted else "declined")))
            return
        if not accepted:
            return  # declined: the job keeps waiting (it ends at its needs-input timeout)
        await fc.answer(state.job_id, **answers_from(content))

    async def cancel(self, job_id: str) -> None:
        await (await self.job(job_id)).cancel()


def said(fn: Callable[..., Awaitable[Any]]) -> Callable[..., Awaitable[Any]]:
    """A fleetforge error reaches the MCP client as the tool's error text: its code, what was wrong and
    what to do (not the SDK's bare "Error executing tool")."""
    @functools.wraps(fn)
    async def wrapped(*args: Any, **kwargs: Any) -> Any:
        try:
            return await fn(*args, **kwargs)
        except FleetforgeError as e:
            raise ToolError(f"[{e.code}] {e}") from None

    return wrapped


def _tool(model: type[BaseModel], call: Callable[[Any, Context], Awaitable[Any]], name: str,
          returns: Any) -> Callable[..., Awaitable[Any]]:
    """A tool function whose parameters are `model`'s fields (types, defaults, bounds, descriptions),
    so the tool's input schema is the model's."""
    params = [inspect.Parameter(n, inspect.Parameter.KEYWORD_ONLY, annotation=Annotated[f.annotation, f],
                                default=inspect.Parameter.empty if f.is_required() else f.default)
              for n, f in model.model_fields.items()]
    params.append(inspect.Parameter("ctx", inspect.Parameter.KEYWORD_ONLY, annotation=Context))

    async def tool(ctx: Context, **kw: Any) -> Any:
        try:
            return await call(model.model_validate(kw), ctx)
        except FleetforgeError as e:
            raise ToolError(f"[{e.code}] {e}") from None

    tool.__signature__ = inspect.Signature(params, return_annotation=returns)  # type: ignore[attr-defined]
    tool.__name__ = name
    tool.__doc__ = model.__doc__
    tool.__annotations__ = {**{p.name: p.annotation for p in params}, "return": returns}
    return tool


JOB_TOOLS = {"inspect": InspectArgs, "convert": ConvertArgs, "kernel": KernelArgs, "fleet_test": FleetTestArgs}


def build_server(settings: Settings | None = None, backend: Backend | None = None) -> MCPServer:
    be = backend or Backend(settings)

    async def tool_names() -> set[str]:
        return {t.name for t in await server.list_tools()}

    tasks = JobTasks(job_tools=frozenset(JOB_TOOLS), start=be.start, read=be.state, answer=be.answer_task,
                     cancel=be.cancel, tools=tool_names)
    server = MCPServer("fleetforge", version=fleetforge_version(), instructions=INSTRUCTIONS, extensions=[tasks])

    for name, model in JOB_TOOLS.items():
        async def start_job(args: BaseModel, ctx: Context, name: str = name) -> JobStarted:
            handle = await be.start(name, args.model_dump(mode="json"))
            return JobStarted(job_id=handle.id, status=await handle.status(), ui_url=await handle.ui_url(),
                              next=f"poll it with show(job_id={handle.id!r}); follow it live with watch")
        server.add_tool(_tool(model, start_job, name, JobStarted), name=name)

    async def list_jobs(args: ListArgs, ctx: Context) -> list[dict[str, Any]]:
        jobs = await (await be.client()).list_jobs(args.kind, args.status, args.limit)
        return [j.model_dump(mode="json") for j in jobs]
    server.add_tool(_tool(ListArgs, list_jobs, "list_jobs", list[dict[str, Any]]), name="list_jobs",
                    description="Jobs newest first, one line each (kind, status, model, target, Web UI link).")

    @server.tool(description="Where a job is: status, current step, questions it waits on, and once it has "
                             "ended its result contract and its artifacts as MCP resources (sha256 given).")
    @said
    async def show(job_id: str) -> ShownJob:
        handle = await be.job(job_id)
        try:
            view = await (await be.client()).show(handle.id)
        except JobCancelled:
            return ShownJob(job_id=handle.id, status=CANCELLED, ui_url=await handle.ui_url())
        shown = ShownJob(job_id=handle.id, status=view.summary.status, step=view.step, ui_url=view.summary.ui_url,
                         result=view.result.model_dump(mode="json") if view.result is not None else None)
        progress = await handle.progress() if view.summary.status == JobStatus.NEEDS_INPUT else None
        shown.questions = progress.questions if progress is not None else []
        if view.result is not None:
            shown.artifacts = [ArtifactLink(name=a.name, uri=artifact_uri(handle.id, a.name), sha256=a.sha256,
                                            size=a.size) for a in await handle.artifacts()]
        return shown

    async def answer(args: AnswerArgs, ctx: Context) -> dict[str, Any]:
        progress = await (await be.client()).answer(args.job_id, soc=args.soc, precision=args.precision,
                                                    calibration=args.calibration)
        return {"job_id": args.job_id, "status": progress.status.value, "step": progress.step}
    server.add_tool(_tool(AnswerArgs, answer, "answer", dict[str, Any]), name="answer")

    @server.tool(description="Approve (or refuse) a fleet row's pending command: row id fleet/FLEET_ID/ROW, "
                             "the attempt it waits on (see list_jobs with status AWAITING_APPROVAL).")
    @said
    async def approve(row_id: str, attempt: int, approved: bool = True, reason: str = "") -> dict[str, str]:
        verdict, command = await (await be.client()).approve(row_id, attempt, approved=approved, reason=reason)
        return {"row_id": row_id, "verdict": verdict, "command": command}

    @server.tool(description="Cancel a running job (a finished one says so).")
    @said
    async def cancel(job_id: str) -> dict[str, str]:
        handle = await be.job(job_id)
        await handle.cancel()
        return {"job_id": handle.id, "status": "cancellation requested"}

    @server.tool(description="Follow a job: its live events (steps, agent tool calls, LLM tokens, status) as "
                             "progress notifications until it ends or `seconds` pass (default below a client's "
                             "usual 60 s timeout; call it again to follow on). A question the job waits on is asked "
                             "as a form (elicitation) when the client takes them, else returned with how to answer.")
    @said
    async def watch(job_id: str, ctx: Context, seconds: Annotated[float, Field(gt=0, le=3600)] = WATCH_SECONDS,
                    ) -> Watched | InputRequiredResult:
        handle = await be.job(job_id)
        return await watch_job(handle, ctx, seconds, read=functools.partial(be.state, with_result=False),
                               answer=be.answer_task)

    @server.resource(ARTIFACT_TEMPLATE, mime_type="application/octet-stream",
                     description="A finished job's output by workspace name (job id and name URL-encoded); "
                                 "the bytes are checked against their sha256 before they are sent.")
    async def artifact(job: str, name: str) -> bytes:
        """No such job or output (yet) is "resource not found" (-32602 with the uri, as both SDKs define it);
        anything else (a sha256 mismatch, the store unreachable) is an error that says what happened."""
        try:
            handle = await be.job(unquote(job))
            ref = _named(await handle.artifacts(), unquote(name))
            return await asyncio.to_thread((await be.client()).store.get_bytes, ref)  # INTEGRITY_ERROR on a mismatch
        except FleetforgeError as e:
            missing = e.code in (Err.JOB_NOT_FOUND, Err.JOB_CANCELLED, Err.BAD_INPUT)
            raise (ResourceNotFoundError if missing else ResourceError)(f"[{e.code}] {e}") from None

    return server


def _named(refs: list[ArtifactRef], name: str) -> ArtifactRef:
    for ref in refs:
        if ref.name == name:
            return ref
    raise FleetforgeError(Err.BAD_INPUT, f"no artifact {name!r}; the job has: {', '.join(r.name for r in refs) or 'none'}")


INSTRUCTIONS = """fleetforge runs durable deep-learning engineering jobs on Temporal: convert (ONNX -> Qualcomm
QNN/SNPE artifacts), kernel (write and verify a Triton kernel), fleet_test (deploy every model of a CSV in a
container), inspect. Job tools return a task (tasks extension) or a job id; poll with tasks/get or `show`, follow
live with `watch` (it asks a waiting job's questions as a form when the client takes elicitation), else answer them
with tasks/update, `answer` or `approve`; read outputs as resources."""

__all__ = ["build_server", "Backend", "artifact_uri", "CANCELLED"]
