"""Long jobs as MCP tasks, as the `io.modelcontextprotocol/tasks` extension of protocol 2026-07-28
(SEP-2663) publishes them (field names and types as @modelcontextprotocol/ext-tasks 0.2 validates
them: `ttlMs`, `pollIntervalMs`, `resultType` on every result). The task id IS the job id, and every
answer is read from Temporal, so no task state lives in this process: kill the server, start another
(or ten), and the task is there. The public SDKs' own task stores create a task once the tool has
returned; here the task is `working` while its workflow runs.

    tools/call convert|kernel|fleet_test|inspect  ->  the workflow is started, then {resultType: "task"}
    tasks/get     describe + query  ->  working | input_required (+ inputRequests) | completed | failed | cancelled
    tasks/update  inputResponses    ->  the workflow's Update (provide_input, approve_command)
    tasks/cancel                    ->  workflow cancellation

Errors are the spec's: an unknown tool or task id -32602, a task method from a client that did not
declare the extension -32021, bad tool arguments a tool result with isError (no task is created).
`task_view` (pure) maps a job's state onto a task; the extension does the I/O around it.

Task ids are job ids, readable and listable (`list_jobs`) by any client that may connect: fleetforge
serves one tenant, whose boundary is the bearer token (serve.py), not the ids' entropy."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Awaitable, Callable, Sequence
from datetime import datetime, timezone
from typing import Any, get_args

from mcp.server.mcpserver import Extension, MethodBinding
from mcp.shared.exceptions import MCPError
from mcp_types import (
    INTERNAL_ERROR, INVALID_PARAMS, MISSING_REQUIRED_CLIENT_CAPABILITY, CallToolResult, RequestParams, TextContent,
)
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from client.jobs import CANCELLED, JobFinished, JobHandle, JobSnapshot
from contracts.common import JobStatus
from contracts.convert import Precision
from contracts.convert_job import ProvideInput
from contracts.errors import Err, FleetforgeError

TASKS_EXTENSION = "io.modelcontextprotocol/tasks"
TASK_PROTOCOL_VERSIONS = frozenset({"2026-07-28"})
"""The wire the tasks are served on: SEP-2663 lives on the 2026-07-28 protocol (the 2025-11-25
in-core tasks are types-only in the installed `mcp` SDK and not wire-compatible with SEP-2663)."""
POLL_INTERVAL_MS = 2000
"""`pollIntervalMs`: a job's steps take seconds, its answers come from Temporal queries."""
TTL_MS = None
"""`ttlMs`: null (unlimited): a job stays in Temporal for the namespace's retention, finished or not."""


class TaskParams(RequestParams):
    model_config = ConfigDict(populate_by_name=True, extra="allow")
    task_id: str = Field(alias="taskId")
    request_state: str | None = Field(default=None, alias="requestState")


class UpdateParams(TaskParams):
    input_responses: dict[str, dict[str, Any]] = Field(default_factory=dict, alias="inputResponses")


class JobState(BaseModel):
    """What Temporal says about a job at one moment (gathered by `read_job`)."""

    job_id: str
    status: str
    created_at: datetime | None = None
    updated_at: datetime | None = None
    snapshot: JobSnapshot = Field(default_factory=JobSnapshot)
    pending_command: str = ""
    pending_attempt: int = 0
    result: dict[str, Any] | None = None
    """The result contract (COMPLETED or FAILED), as JSON."""
    summary: str = ""
    crashed: str = ""
    """Why a job that ended without a result contract did (its workflow failed): the task is `failed`."""


def _iso(t: datetime | None) -> str:
    return (t or datetime.now(timezone.utc)).astimezone(timezone.utc).isoformat().replace("+00:00", "Z")


def input_key(job_id: str, questions: Sequence[str], round_: str) -> str:
    """A key unique to one question round of one job (SEP-2663: keys are never reused in a task)."""
    digest = hashlib.sha256(json.dumps([job_id, list(questions), round_]).encode()).hexdigest()[:12]
    return f"answer-{digest}"


def answer_schema() -> dict[str, Any]:
    """The form a convert job's questions are answered with: ProvideInput's fields, typed and described."""
    props: dict[str, dict[str, Any]] = {
        name: {"type": "boolean" if _is_flag(field) else "string", "description": field.description or name}
        for name, field in ProvideInput.model_fields.items()}
    props["precision"]["enum"] = [p.value for p in Precision]
    return {"type": "object", "properties": props}


def answers_from(content: dict[str, Any]) -> dict[str, str | bool]:
    """An accepted form's answers as ProvideInput takes them: text fields as text (empty ones left out),
    a flag only when the client sent a boolean."""
    out: dict[str, str | bool] = {}
    for name, field in ProvideInput.model_fields.items():
        value = content.get(name)
        if _is_flag(field):
            if isinstance(value, bool):
                out[name] = value
        elif value not in (None, ""):
            out[name] = str(value)
    return out


def _is_flag(field: Any) -> bool:
    return bool in get_args(field.annotation)


def input_requests(state: JobState) -> dict[str, Any]:
    """The elicitations a waiting job needs: a convert job's questions, a fleet row's command approval."""
    p = state.snapshot.convert
    if state.status == JobStatus.NEEDS_INPUT and p is not None:
        key = input_key(state.job_id, p.questions, f"{p.attempt}/{p.replans}/{len(p.steps_done)}")
        return {key: {"method": "elicitation/create", "params": {
            "mode": "form", "message": " / ".join(p.questions) or "the job needs input", "requestedSchema": answer_schema()}}}
    if state.status == JobStatus.AWAITING_APPROVAL and state.pending_command:
        key = f"approve-{state.pending_attempt}"
        schema = {"type": "object", "properties": {
            "approved": {"type": "boolean", "description": "run this command"},
            "reason": {"type": "string", "description": "why (kept with the verdict)"}}, "required": ["approved"]}
        return {key: {"method": "elicitation/create", "params": {
            "mode": "form", "message": f"approve attempt {state.pending_attempt}: {state.pending_command}",
            "requestedSchema": schema}}}
    return {}


def task_view(state: JobState) -> dict[str, Any]:
    """A job as a DetailedTask (pure). A FAILED job is a `completed` task whose tool result has isError
    (the spec keeps `failed` for JSON-RPC errors: a workflow that ended without a result); CANCELLED is
    `cancelled`."""
    task: dict[str, Any] = {"taskId": state.job_id, "createdAt": _iso(state.created_at),
                            "lastUpdatedAt": _iso(state.updated_at or state.created_at), "ttlMs": TTL_MS,
                            "pollIntervalMs": POLL_INTERVAL_MS}
    requests = input_requests(state)
    if state.status == CANCELLED:
        return {**task, "status": "cancelled", "statusMessage": "the job was cancelled"}
    if state.crashed:
        return {**task, "status": "failed", "statusMessage": state.crashed,
                "error": {"code": INTERNAL_ERROR, "message": state.crashed}}
    if state.status in (JobStatus.COMPLETED, JobStatus.FAILED) and state.result is not None:
        text = state.summary or f"{state.job_id} {state.status}"
        return {**task, "status": "completed", "statusMessage": text,
                "result": tool_result(text, state.result, is_error=state.status == JobStatus.FAILED)}
    if requests:
        message = next(iter(requests.values()))["params"]["message"]
        return {**task, "status": "input_required", "statusMessage": message, "inputRequests": requests}
    return {**task, "status": "working", "statusMessage": state.snapshot.step or state.status}


def tool_result(text: str, structured: dict[str, Any] | None = None, *, is_error: bool = False) -> dict[str, Any]:
    """A CallToolResult as the 2026-07-28 wire carries it (a task's `result` is one: `resultType` included)."""
    result: dict[str, Any] = {"resultType": "complete", "content": [{"type": "text", "text": text}], "isError": is_error}
    if structured is not None:
        result["structuredContent"] = structured
    return result


def created(job_id: str, created_at: datetime | None, step: str = "started") -> dict[str, Any]:
    """The CreateTaskResult of a job just started (`resultType: "task"`, no result/inputRequests)."""
    return {"resultType": "task", "taskId": job_id, "status": "working", "statusMessage": step,
            "createdAt": _iso(created_at), "lastUpdatedAt": _iso(created_at), "ttlMs": TTL_MS,
            "pollIntervalMs": POLL_INTERVAL_MS}


def argument_error(tool: str, e: ValidationError) -> str:
    """Bad tool arguments in one line per field: what was wrong with which argument."""
    problems = "; ".join(f"{'.'.join(str(p) for p in err['loc']) or 'arguments'}: {err['msg']}" for err in e.errors())
    return f"[BAD_INPUT] invalid arguments for {tool}: {problems}"


StartJob = Callable[[str, dict[str, Any]], Awaitable[JobHandle[Any]]]
"""Start the job behind a tool: (tool name, validated arguments) -> its handle."""


class JobTasks(Extension):
    identifier = TASKS_EXTENSION

    def __init__(self, *, job_tools: frozenset[str], start: StartJob,
                 read: Callable[[str], Awaitable[JobState]], answer: Callable[[JobState, str, dict[str, Any]], Awaitable[None]],
                 cancel: Callable[[str], Awaitable[None]], tools: Callable[[], Awaitable[set[str]]]):
        self.job_tools = job_tools
        self._start, self._read, self._answer, self._cancel, self._tools = start, read, answer, cancel, tools

    def methods(self) -> Sequence[MethodBinding]:
        return [
            MethodBinding("tasks/get", TaskParams, self._get, protocol_versions=TASK_PROTOCOL_VERSIONS),
            MethodBinding("tasks/update", UpdateParams, self._update, protocol_versions=TASK_PROTOCOL_VERSIONS),
            MethodBinding("tasks/cancel", TaskParams, self._cancel_task, protocol_versions=TASK_PROTOCOL_VERSIONS),
        ]

    async def intercept_tool_call(self, params: Any, ctx: Any, call_next: Any) -> Any:
        """An unknown tool is a protocol error (-32602) for every client. A job tool called by a client
        that declared the extension becomes a task; everyone else gets the tool's ordinary result."""
        if params.name not in await self._tools():
            raise MCPError(code=INVALID_PARAMS, message=f"Unknown tool: {params.name} (tools/list names them)")
        if params.name not in self.job_tools or not _declares_tasks(ctx):
            return await call_next(ctx)
        try:
            handle = await self._start(params.name, params.arguments or {})
        except ValidationError as e:  # no task was created: the call's own result says what was wrong
            return _error_result(argument_error(params.name, e))
        except FleetforgeError as e:
            return _error_result(f"[{e.code}] {e}")
        desc = await handle.describe()
        return created(handle.id, desc.start_time)

    async def _get(self, ctx: Any, params: TaskParams) -> dict[str, Any]:
        _require_declared(ctx)
        return task_view(await self._state(params.task_id))

    async def _update(self, ctx: Any, params: UpdateParams) -> dict[str, Any]:
        """Deliver answers through the job's Update. Unknown or already answered keys are ignored (spec);
        an answer the workflow's validator rejects is an error saying why, never a silent drop."""
        _require_declared(ctx)
        state = await self._state(params.task_id)
        outstanding = input_requests(state)
        for key, response in params.input_responses.items():
            if key in outstanding:
                try:
                    await self._answer(state, key, response)
                except FleetforgeError as e:
                    raise MCPError(code=INVALID_PARAMS, message=str(e)) from None
        return {}

    async def _cancel_task(self, ctx: Any, params: TaskParams) -> dict[str, Any]:
        """Acknowledged for a running or finished job alike (cancellation is eventually consistent and a
        finished task keeps its status); an unknown one is -32602."""
        _require_declared(ctx)
        try:
            await self._cancel(params.task_id)
        except JobFinished:
            pass
        except FleetforgeError as e:
            raise _task_error(params.task_id, e) from None
        return {}

    async def _state(self, task_id: str) -> JobState:
        try:
            return await self._read(task_id)
        except FleetforgeError as e:
            raise _task_error(task_id, e) from None


def _error_result(text: str) -> CallToolResult:
    return CallToolResult(content=[TextContent(type="text", text=text)], is_error=True)


def _task_error(task_id: str, e: FleetforgeError) -> MCPError:
    """No such task (a job id that names none, or no job at all) is the spec's -32602; anything else
    (Temporal unreachable) is an internal error that says what happened."""
    if e.code in (Err.JOB_NOT_FOUND, Err.BAD_INPUT):
        return MCPError(code=INVALID_PARAMS, message=f"Failed to retrieve task {task_id!r}: {e}")
    return MCPError(code=INTERNAL_ERROR, message=f"[{e.code}] {e}")


def _require_declared(ctx: Any) -> None:
    """Task methods are for clients that declared the extension on this request (spec: -32021)."""
    if not _declares_tasks(ctx):
        raise MCPError(code=MISSING_REQUIRED_CLIENT_CAPABILITY, message="Missing required client capability",
                       data={"requiredCapabilities": {"extensions": {TASKS_EXTENSION: {}}}})


def _declares_tasks(ctx: Any) -> bool:
    """The client declared the extension on a protocol version that carries it (a handshake-era client
    that advertises it anyway gets the ordinary result: a task shape cannot travel on its wire)."""
    if getattr(ctx.session, "protocol_version", None) not in TASK_PROTOCOL_VERSIONS:
        return False
    capabilities = getattr(ctx.session, "client_capabilities", None)
    declared = getattr(capabilities, "extensions", None) or {}
    return TASKS_EXTENSION in declared
