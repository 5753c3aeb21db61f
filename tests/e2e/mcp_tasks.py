"""The client half of the tasks extension (io.modelcontextprotocol/tasks, protocol 2026-07-28) on the
official Python `mcp` client, which carries no tasks runtime: the extension's ad and its
`resultType: "task"` claim, tasks/get, tasks/update and tasks/cancel sent through
`ClientSession.send_request`. Every task message is held to the extension's published schema (the
shapes @modelcontextprotocol/ext-tasks 0.2 validates): its field names and types, `resultType` on
every result, a field it does not define is an error, and a task's tool result is a 2026-07-28
CallToolResult (`resultType: "complete"`)."""

from __future__ import annotations

import time
from typing import Annotated, Any, Literal

import anyio
from mcp import Client
from mcp.client import ClientExtension, ResultClaim
from mcp_types import CallToolResult, Request, RequestParams, Result
from pydantic import BaseModel, ConfigDict, Field, RootModel
from pydantic.alias_generators import to_camel

TASKS = "io.modelcontextprotocol/tasks"


class _Wire(BaseModel):
    model_config = ConfigDict(alias_generator=to_camel, populate_by_name=True, extra="forbid")
    meta: dict[str, Any] | None = Field(None, alias="_meta")


class _Task(_Wire):
    task_id: str
    status_message: str | None = None
    created_at: str
    last_updated_at: str
    ttl_ms: int | None  # required: null is unlimited
    poll_interval_ms: int | None = None


class CreatedTask(_Task, Result):
    """CreateTaskResult: `resultType: "task"` and the task's seed state."""

    result_type: Literal["task"]
    status: Literal["working", "input_required", "completed", "failed", "cancelled"]


class ToolResult(_Wire):
    """A completed task's result: the CallToolResult the call would have returned."""

    result_type: Literal["complete"]
    content: list[dict[str, Any]]
    structured_content: Any = None
    is_error: bool | None = None


class _Elicitation(_Wire):
    method: Literal["elicitation/create"]
    params: dict[str, Any]


class _Detailed(_Task):
    result_type: Literal["complete"]  # tasks/get answers with its standard result shape


class WorkingTask(_Detailed):
    status: Literal["working"]


class InputRequiredTask(_Detailed):
    status: Literal["input_required"]
    input_requests: dict[str, _Elicitation]


class CompletedTask(_Detailed):
    status: Literal["completed"]
    result: ToolResult


class _Error(_Wire):
    code: int
    message: str
    data: Any = None


class FailedTask(_Detailed):
    status: Literal["failed"]
    error: _Error


class CancelledTask(_Detailed):
    status: Literal["cancelled"]


class TaskResult(RootModel[Annotated[WorkingTask | InputRequiredTask | CompletedTask | FailedTask | CancelledTask,
                                     Field(discriminator="status")]]):
    """GetTaskResult: a DetailedTask by its status."""


class Ack(_Wire):
    """tasks/update and tasks/cancel acknowledge with an empty `complete` result."""

    result_type: Literal["complete"]


class _TaskParams(RequestParams):
    model_config = ConfigDict(extra="allow")
    task_id: str


class _Get(Request[_TaskParams, Literal["tasks/get"]]):
    method: Literal["tasks/get"] = "tasks/get"
    name_param = "taskId"


class _Update(Request[_TaskParams, Literal["tasks/update"]]):
    method: Literal["tasks/update"] = "tasks/update"
    name_param = "taskId"


class _Cancel(Request[_TaskParams, Literal["tasks/cancel"]]):
    method: Literal["tasks/cancel"] = "tasks/cancel"
    name_param = "taskId"


async def _unresolved(task: CreatedTask, ctx: Any) -> CallToolResult:
    raise AssertionError("tests drive the task themselves (call_tool(..., allow_claimed=True))")


class TasksExtension(ClientExtension):
    identifier = TASKS

    def claims(self) -> list[ResultClaim[Any]]:
        return [ResultClaim(result_type="task", model=CreatedTask, resolve=_unresolved)]


async def start_task(client: Client, tool: str, arguments: dict[str, Any]) -> CreatedTask | CallToolResult:
    """A job tool through the extension: its task, or (bad input: no task) the call's own result."""
    return await client.session.call_tool(tool, arguments, allow_claimed=True, allow_input_required=False)


async def get_task(client: Client, task_id: str) -> Any:
    got = await client.session.send_request(_Get(params=_TaskParams(task_id=task_id)), TaskResult)
    return got.root


async def update_task(client: Client, task_id: str, responses: dict[str, Any]) -> None:
    await client.session.send_request(_Update(params=_TaskParams(task_id=task_id, inputResponses=responses)), Ack)


async def cancel_task(client: Client, task_id: str) -> None:
    await client.session.send_request(_Cancel(params=_TaskParams(task_id=task_id)), Ack)


async def poll_until(client: Client, task_id: str, statuses: set[str], *, timeout: float = 180.0,
                     answered: frozenset[str] = frozenset()) -> Any:
    """tasks/get until the task is in one of `statuses` (a deadline, never a fixed sleep); an
    input_required task that still shows only the `answered` input keys does not count yet."""
    deadline = time.monotonic() + timeout
    while True:
        task = await get_task(client, task_id)
        stale = bool(answered) and task.status == "input_required" and set(task.input_requests) <= answered
        if task.status in statuses and not stale:
            return task
        assert time.monotonic() < deadline, f"task {task_id} still {task.status}: {task.status_message}"
        await anyio.sleep(0.3)
