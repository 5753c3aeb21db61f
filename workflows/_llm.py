"""How a workflow talks to an LLM: one `complete_chat` activity per call on the llm queue.

Every agent loop (converter planner, conductor agents, fleet command writer) goes through
`ask` (free text / tool calls) or `ask_structured` (validated pydantic answer with one repair
re-ask). Parsing is pure code and runs in the workflow; only the provider call is a side effect.
Prompts are rendered from jinja2 templates loaded at import time, so replays see the same text.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol, TypeVar

from pydantic import BaseModel
from temporalio import workflow

with workflow.unsafe.imports_passed_through():
    from activities.llm.structured import complete_structured
    from contracts.common import TokenTotals
    from contracts.messages import ChatRequest, ChatResult, TokenUsage
    from workflows._call_options import LLM, CallOptions

M = TypeVar("M", bound=BaseModel)


async def ask(req: ChatRequest, *, queue: str, summary: str = "", options: CallOptions = LLM) -> ChatResult:
    """One durable LLM call (retries, heartbeats and the transcript artifact are the activity's job).

    A cut-off, refused or filtered answer comes back with `unusable` set and no text: read the answer
    with `activities.llm.structured.usable_text` / `parse_answer` so it reaches the agent ladder as a
    rejection with its reason. Failures that asking again cannot fix (LLM_CONTEXT_LENGTH, LLM_QUOTA,
    LLM_AUTH, ...) raise at once, typed, for the ladder's fallback.

    `options` defaults to the LLM call options; a caller passes others only when it needs a different
    crash-detection time (the heartbeat timeout bounds how long a dead worker holds a call)."""
    return await workflow.execute_activity(
        "complete_chat", req, task_queue=queue, result_type=ChatResult,
        summary=summary or f"{req.agent}: ask the LLM",
        start_to_close_timeout=options.start_to_close, heartbeat_timeout=options.heartbeat, retry_policy=options.retry,
    )


async def ask_structured(
    req: ChatRequest, model_cls: type[M], *, queue: str, summary: str = "", options: CallOptions = LLM,
) -> tuple[M, list[ChatResult]]:
    """Ask for JSON matching `model_cls`; re-ask once with the validation error; else LLM_OUTPUT_INVALID."""
    return await complete_structured(lambda r: ask(r, queue=queue, summary=summary, options=options), req, model_cls)


class Costed(Protocol):
    """An agent answer with its LLM cost (ChatResult, the kernel agents' AgentCall)."""

    usage: TokenUsage
    latency_s: float


def token_totals(calls: Sequence[Costed], *, extra_calls: int = 0) -> TokenTotals:
    """A job's LLM cost for its result: how many agent answers (`extra_calls`: answers recorded
    elsewhere, e.g. offline decisions), their summed token usage and latency, and how many calls the
    server did not report usage for (their tokens are unknown, so a result can say so instead of 0)."""
    usage = sum((c.usage for c in calls), TokenUsage())
    return TokenTotals(calls=len(calls) + extra_calls, prompt_tokens=usage.prompt, completion_tokens=usage.completion,
                       total_tokens=usage.total, latency_s=round(sum(c.latency_s for c in calls), 3),
                       unreported_calls=sum(1 for c in calls if not c.usage.reported))
