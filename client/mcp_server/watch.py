"""The `watch` tool: a job's live events as progress notifications, and its questions asked natively.

A job that stops to wait (a convert job's NEEDS_INPUT, a fleet row's command awaiting approval) is
asked through the elicitation the negotiated protocol version defines (`how_to_ask`):

* 2025-11-25 and earlier, a client that declared form elicitation: a server-to-client
  `elicitation/create` (form mode) inside the watch call; the answer goes to the job's Update and the
  watch goes on;
* 2026-07-28, a client that declared elicitation: the call answers `input_required` with the form; the
  client retries the call with its `inputResponses`, which go to the job's Update, and the watch goes on;
* a client that declared none: the call returns with the job's questions and says to answer them with
  the `answer` (or `approve`) tool.

Every SDK's request timeout is respected: the call ends after `seconds` (default below the TypeScript
SDK's 60 s), and a quiet job still sends a progress notification every HEARTBEAT_S, which a client that
resets its timeout on progress (`resetTimeoutOnProgress`) keeps the call alive with."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from typing import Any, Literal

from mcp.server.mcpserver import Context
from mcp.server.mcpserver.exceptions import ToolError
from mcp_types import ElicitRequest, ElicitRequestFormParams, InputRequiredResult
from mcp_types.version import MODERN_PROTOCOL_VERSIONS
from pydantic import BaseModel

from client.jobs import CANCELLED, JobHandle
from client.mcp_server.tasks import JobState, input_requests
from contracts.common import JobStatus
from contracts.errors import FleetforgeError
from contracts.events import EventKind, event_line

WATCH_SECONDS = 45.0
"""The default `seconds`: below the TypeScript SDK's default request timeout (60 s)."""
HEARTBEAT_S = 10.0
"""A quiet job still sends a progress notification this often (a client may reset its timeout on it)."""
ENDED = frozenset({JobStatus.COMPLETED.value, JobStatus.FAILED.value, CANCELLED})
WAITING = frozenset({JobStatus.NEEDS_INPUT.value, JobStatus.AWAITING_APPROVAL.value})

Asking = Literal["elicitation_request", "input_required", "tools"]


class Watched(BaseModel):
    """Where a watched job stands when the call ends."""

    job_id: str
    status: str
    events: int = 0
    """Progress notifications sent (the job's events and the heartbeats of a quiet job)."""
    questions: list[str] = []
    """What a waiting job asks (a client without elicitation answers with `next`)."""
    next: str = ""


def how_to_ask(protocol_version: str | None, capabilities: Any) -> Asking:
    """How to ask a client a job's question on its negotiated protocol version (pure)."""
    elicitation = getattr(capabilities, "elicitation", None)
    if elicitation is None or (elicitation.form is None and elicitation.url is not None):
        return "tools"  # none declared, or URL mode only: the form cannot travel
    return "input_required" if protocol_version in MODERN_PROTOCOL_VERSIONS else "elicitation_request"


ReadState = Callable[[str], Awaitable[JobState]]
Answer = Callable[[JobState, str, dict[str, Any]], Awaitable[None]]


async def watch_job(handle: JobHandle[Any], ctx: Context, seconds: float, *, read: ReadState,
                    answer: Answer) -> Watched | InputRequiredResult:
    asking = how_to_ask(ctx.protocol_version, ctx.client_capabilities)
    answered: set[str] = set()
    """Questions answered in this call: one whose answer the job has not shown yet is not asked again."""
    if ctx.input_responses:  # a 2026-07-28 retry: this round's answers first
        responses = {k: v.model_dump(mode="json", exclude_none=True) for k, v in ctx.input_responses.items()}
        if not await _deliver(await read(handle.id), responses, answer, answered):
            return await _declined(handle, read)
    sent = 0
    last_sent = time.monotonic()
    changed = asyncio.Event()

    async def notify(message: str) -> None:
        nonlocal sent, last_sent
        sent, last_sent = sent + 1, time.monotonic()
        await ctx.report_progress(sent, None, message)

    async def forward() -> None:
        async for event in handle.events():
            await notify(event_line(event))
            if event.kind is EventKind.STATUS:
                changed.set()

    forwarding = asyncio.ensure_future(forward())
    deadline = time.monotonic() + seconds
    try:
        while True:
            if forwarding.done() and not forwarding.cancelled() and forwarding.exception() is not None:
                raise forwarding.exception()  # type: ignore[misc]  # reading the job's events failed
            changed.clear()  # before the read: a status event from here on wakes the wait below
            status = await handle.status()
            if status in ENDED:
                await _drain(forwarding)
                return Watched(job_id=handle.id, status=status, events=sent)
            if status in WAITING:
                state = await read(handle.id)
                requests = {k: r for k, r in input_requests(state).items() if k not in answered}
                if requests and asking == "tools":
                    return _ask_with_tools(handle.id, status, sent, requests)
                if requests and asking == "input_required":
                    return InputRequiredResult(input_requests={
                        key: ElicitRequest(params=ElicitRequestFormParams.model_validate(r["params"]))
                        for key, r in requests.items()})
                if requests:
                    responses = {key: await _elicit(ctx, r["params"]) for key, r in requests.items()}
                    if not await _deliver(state, responses, answer, answered):
                        return await _declined(handle, read)
                    continue
            left = deadline - time.monotonic()
            if left <= 0:
                return Watched(job_id=handle.id, status=status, events=sent)
            try:
                await asyncio.wait_for(changed.wait(), timeout=min(left, HEARTBEAT_S))
            except asyncio.TimeoutError:
                if time.monotonic() - last_sent >= HEARTBEAT_S and time.monotonic() < deadline:
                    await notify(f"status: {status}")
    finally:
        forwarding.cancel()


async def _elicit(ctx: Context, params: dict[str, Any]) -> dict[str, Any]:
    result = await ctx.request_context.session.elicit_form(params["message"], params["requestedSchema"],
                                                           related_request_id=ctx.request_context.request_id)
    return result.model_dump(mode="json", exclude_none=True)


async def _deliver(state: JobState, responses: dict[str, dict[str, Any]], answer: Answer, answered: set[str]) -> bool:
    """Answers to the job's outstanding questions go to its Update (others are stale: ignored). False
    when the user declined or cancelled a form (the job keeps waiting); an answer the job's validator
    refuses is the tool's error, saying why."""
    outstanding = input_requests(state)
    for key, response in responses.items():
        if key not in outstanding:
            continue
        if response.get("action") != "accept" and not key.startswith("approve-"):  # declining a command refuses it
            return False
        try:
            await answer(state, key, response)
        except FleetforgeError as e:
            raise ToolError(f"[{e.code}] {e}; {state.job_id} still waits: watch it again to be asked again, "
                            "or use the answer tool") from None
        answered.add(key)
    return True


async def _declined(handle: JobHandle[Any], read: ReadState) -> Watched:
    state = await read(handle.id)
    shown = _ask_with_tools(handle.id, state.status, 0, input_requests(state))
    return shown.model_copy(update={"next": "declined: " + shown.next})


def _ask_with_tools(job_id: str, status: str, sent: int, requests: dict[str, Any]) -> Watched:
    questions = [r["params"]["message"] for r in requests.values()]
    if status == JobStatus.AWAITING_APPROVAL.value:
        attempt = next(iter(requests)).removeprefix("approve-")
        how = f"approve(row_id={job_id!r}, attempt={attempt}, approved=true|false)"
    else:
        how = f"answer(job_id={job_id!r}, ...) with the facts asked for (soc, precision, calibration, ...)"
    return Watched(job_id=job_id, status=status, events=sent, questions=questions,
                   next=f"the job waits: call {how}, then watch it again")


async def _drain(forwarding: asyncio.Future[None]) -> None:
    """A job that has ended: let its last events through (its stream ends with it), for a few seconds."""
    try:
        await asyncio.wait_for(asyncio.shield(forwarding), timeout=5)
    except asyncio.TimeoutError:
        pass
