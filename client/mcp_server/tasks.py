"""Long jobs as MCP tasks (SEP-2663, the `io.modelcontextprotocol/tasks` extension of protocol
2026-07-28): the task id IS the job id, and every answer is read from Temporal, so no task state
lives in this process: kill the server, start another (or ten), and the task is there.

    tools/call convert|kernel|fleet_test|inspect  ->  the workflow is started, then {resultType: "task"}
    tasks/get     describe + query  ->  working | input_required (+ inputRequests) | completed | cancelled
    tasks/update  inputResponses    ->  the workflow's Update (provide_input, approve_command)
    tasks/cancel                    ->  workflow cancellation

`task_view` (pure) maps a job's state onto a task; the extension does the I/O around it."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Awaitable, Callable, Sequence
from datetime import datetime, timezone
from typing import Any, get_args

from mcp.server.mcpserver import Extension, MethodBinding
from mcp.shared.exceptions import MCPError
from mcp_types import INVALID_PARAMS, RequestParams
from pydantic import BaseModel, ConfigDict, Field

from client.jobs import CANCELLED, JobHandle, JobSnapshot
from contracts.common import JobStatus
from contracts.convert import Precision
from contracts.convert_job import ProvideInput
from contracts.errors import FleetforgeError

TASKS_EXTENSION = "io.modelcontextprotocol/tasks"
TASK_PROTOCOL_VERSIONS = frozenset({"2026-07-28"})
"""The wire the tasks are served on: SEP-2663 lives on the 2026-07-28 protocol (the 2025-11-25
in-core tasks are types-only in the installed `mcp` SDK and not wire-compatible with SEP-2663)."""
POLL_INTERVAL_MS = 2000


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
    """A job as a SEP-2663 DetailedTask (pure). A FAILED job is a `completed` task whose tool result
    has isError (the spec keeps `failed` for JSON-RPC errors); CANCELLED is `cancelled`."""
    task: dict[str, Any] = {"taskId": state.job_id, "createdAt": _iso(state.created_at),
                            "lastUpdatedAt": _iso(state.updated_at or state.created_at), "ttlSeconds": None,
                            "pollIntervalMilliseconds": POLL_INTERVAL_MS}
    requests = input_requests(state)
    if state.status == CANCELLED:
        return {**task, "status": "cancelled", "statusMessage": "the job was cancelled"}
    if state.status in (JobStatus.COMPLETED, JobStatus.FAILED) and state.result is not None:
        failed = state.status == JobStatus.FAILED
        text = state.summary or f"{state.job_id} {state.status}"
        return {**task, "status": "completed", "statusMessage": text,
                "result": {"content": [{"type": "text", "text": text}], "structuredContent": state.result,
                           "isError": failed}}
    if requests:
        message = next(iter(requests.values()))["params"]["message"]
        return {**task, "status": "input_required", "statusMessage": message, "inputRequests": requests}
    return {**task, "status": "working", "statusMessage": state.snapshot.step or state.status}


def created(job_id: str, created_at: datetime | None, step: str = "started") -> dict[str, Any]:
    """The CreateTaskResult of a job just started (`resultType: "task"`, no result/inputRequests)."""
    return {"resultType": "task", "taskId": job_id, "status": "working", "statusMessage": step,
            "createdAt": _iso(created_at), "lastUpdatedAt": _iso(created_at), "ttlSeconds": None,
            "pollIntervalMilliseconds": POLL_INTERVAL_MS}


StartJob = Callable[[str, dict[str, Any]], Awaitable[JobHandle[Any]]]
"""Start the job behind a tool: (tool name, validated arguments) -> its handle."""


class JobTasks(Extension):
    identifier = TASKS_EXTENSION

    def __init__(self, *, job_tools: frozenset[str], start: StartJob,
                 read: Callable[[str], Awaitable[JobState]], answer: Callable[[JobState, str, dict[str, Any]], Awaitable[None]],
                 cancel: Callable[[str], Awaitable[None]]):
        self.job_tools = job_tools
        self._start, self._read, self._answer, self._cancel = start, read, answer, cancel

    def methods(self) -> Sequence[MethodBinding]:
        return [
            MethodBinding("tasks/get", TaskParams, self._get, protocol_versions=TASK_PROTOCOL_VERSIONS),
            MethodBinding("tasks/update", UpdateParams, self._update, protocol_versions=TASK_PROTOCOL_VERSIONS),
            MethodBinding("tasks/cancel", TaskParams, self._cancel_task, protocol_versions=TASK_PROTOCOL_VERSIONS),
        ]

    async def intercept_tool_call(self, params: Any, ctx: Any, call_next: Any) -> Any:
        """A job tool called by a client that declared the extension becomes a task; everyone else
        gets the tool's ordinary result (the job id and how to follow it)."""
        if params.name not in self.job_tools or not _declares_tasks(ctx):
            return await call_next(ctx)
        try:
            handle = await self._start(params.name, params.arguments or {})
        except (FleetforgeError, ValueError) as e:  # bad arguments or input: the tool's error result
            return {"content": [{"type": "text", "text": str(e)}], "isError": True}
        desc = await handle.describe()
        return created(handle.id, desc.start_time)

    async def _get(self, ctx: Any, params: TaskParams) -> dict[str, Any]:
        return task_view(await self._state(params.task_id))

    async def _update(self, ctx: Any, params: UpdateParams) -> dict[str, Any]:
        """Deliver answers through the job's Update. Unknown or already answered keys are ignored (spec);
        an answer the workflow's validator rejects is an error saying why, never a silent drop."""
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
        try:
            await self._cancel(params.task_id)
        except FleetforgeError:
            pass  # finished or unknown: the spec asks for an acknowledgement all the same
        return {}

    async def _state(self, task_id: str) -> JobState:
        try:
            return await self._read(task_id)
        except FleetforgeError as e:
            raise MCPError(code=INVALID_PARAMS, message=f"no task {task_id!r}: {e}") from None


def _declares_tasks(ctx: Any) -> bool:
    """The client declared the extension on a protocol version that carries it (a handshake-era client
    that advertises it anyway gets the ordinary result: a task shape cannot travel on its wire)."""
    if getattr(ctx.session, "protocol_version", None) not in TASK_PROTOCOL_VERSIONS:
        return False
    capabilities = getattr(ctx.session, "client_capabilities", None)
    declared = getattr(capabilities, "extensions", None) or {}
    return TASKS_EXTENSION in declared
