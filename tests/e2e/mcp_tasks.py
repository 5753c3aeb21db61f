"""The client half of SEP-2663 tasks for tests, on the official `mcp` client (its 2.3 SDK carries
the task types but no tasks runtime): the extension ad and the `resultType: "task"` claim, plus
tasks/get, tasks/update and tasks/cancel sent through `ClientSession.send_request`."""

from __future__ import annotations

import time
from typing import Any, Literal

import anyio
from mcp import Client
from mcp.client import ClientExtension, ResultClaim
from mcp_types import CallToolResult, EmptyResult, Request, RequestParams, Result
from pydantic import ConfigDict

TASKS = "io.modelcontextprotocol/tasks"


class CreatedTask(Result):
    model_config = ConfigDict(extra="allow")
    result_type: Literal["task"] = "task"
    task_id: str
    status: str


class TaskResult(Result):
    model_config = ConfigDict(extra="allow")
    task_id: str
    status: str
    status_message: str | None = None
    input_requests: dict[str, Any] | None = None
    result: dict[str, Any] | None = None


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


async def start_task(client: Client, tool: str, arguments: dict[str, Any]) -> CreatedTask:
    created = await client.session.call_tool(tool, arguments, allow_claimed=True, allow_input_required=False)
    assert isinstance(created, CreatedTask), created
    return created


async def get_task(client: Client, task_id: str) -> TaskResult:
    return await client.session.send_request(_Get(params=_TaskParams(task_id=task_id)), TaskResult)


async def update_task(client: Client, task_id: str, responses: dict[str, Any]) -> None:
    await client.session.send_request(_Update(params=_TaskParams(task_id=task_id, inputResponses=responses)), EmptyResult)


async def cancel_task(client: Client, task_id: str) -> None:
    await client.session.send_request(_Cancel(params=_TaskParams(task_id=task_id)), EmptyResult)


async def poll_until(client: Client, task_id: str, statuses: set[str], *, timeout: float = 120.0,
                     answered: set[str] = frozenset()) -> TaskResult:
    """tasks/get until the task is in one of `statuses` (a deadline, never a fixed sleep); an
    input_required task that still shows only the `answered` input keys does not count yet."""
    deadline = time.monotonic() + timeout
    while True:
        task = await get_task(client, task_id)
        stale = bool(answered) and task.status == "input_required" and set(task.input_requests or {}) <= answered
        if task.status in statuses and not stale:
            return task
        assert time.monotonic() < deadline, f"task {task_id} still {task.status}: {task.status_message}"
        await anyio.sleep(0.3)
