"""The fallback ladder every agent climbs (seed 003: validate → retry → fallback), built once.

    ask the LLM ──▶ validate ──ok──▶ the LLM's answer
        ▲              │ refused (the concrete reason)
        └── repair ◀───┘  at most `max_llm_answers` answers in all
                       │ still refused, or the LLM call failed (down, auth, quota, context length)
                       ▼
                 the offline agent's answer (recorded as a fallback), or no answer at all

Used by the converter planner, the kernel designer/coder/optimizer, the conductor's routing analysis
and the fleet command writer. The callers bring the three parts: `llm(rejections)` asks once (with
the earlier refusals as repair feedback) and validates (parse, policy, static checks) into
`Accepted` or `Rejected`; `offline(reason)` is the deterministic agent; `on_rejected` lets a caller
record a refusal as it happens (the fleet counts a refused command as a failed attempt).

An LLM's failure never becomes a verdict: with no usable answer on any rung the caller gets
`value=None` and a provenance with source NONE, and reports a harness/LLM error.

`next_rung` is the pure decision (unit-tested without a server); `climb` drives it. Neither calls
`workflow.*`, so both run in tests as plain coroutines.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Generic, TypeVar

from temporalio import workflow
from temporalio.exceptions import ActivityError, is_cancelled_exception

with workflow.unsafe.imports_passed_through():
    from activities.llm.structured import Rejected
    from contracts.agents import MAX_REJECTIONS_KEPT, REJECTION_CHARS, AgentProvenance, AnswerSource
    from contracts.common import Failure
    from workflows.failures import failure_from

T = TypeVar("T")

DEFAULT_MAX_LLM_ANSWERS = 3
"""The first answer and two repairs."""


@dataclass(frozen=True)
class Accepted(Generic[T]):
    """A validated answer."""

    value: T


Answer = Accepted[T] | Rejected


@dataclass(frozen=True)
class Ask:
    """Ask the LLM (again): `feedback` is the last refusal, empty for the first answer."""

    feedback: str = ""


@dataclass(frozen=True)
class Fallback:
    """Ask the offline agent, and say why."""

    reason: str


@dataclass(frozen=True)
class NoAnswer:
    reason: str


def next_rung(*, llm_configured: bool, has_offline: bool, answers: int, rejections: list[str],
              llm_error: Failure | None, max_llm_answers: int) -> Ask | Fallback | NoAnswer:
    """Where the ladder goes next (pure)."""
    if not llm_configured:
        why = "the offline agent is the configured provider"
        return Fallback(why) if has_offline else NoAnswer("no LLM is configured and this agent has no offline answer")
    if llm_error is not None:
        why = f"the LLM call failed: [{llm_error.code}] {llm_error.message}"
    elif answers < max_llm_answers:
        return Ask(rejections[-1] if rejections else "")
    else:
        last = rejections[-1] if rejections else "no answer"
        why = f"{answers} LLM answer(s) refused; the last: {last}"
    why = why[:REJECTION_CHARS * 2]
    return Fallback(why) if has_offline else NoAnswer(why + "; this agent has no offline answer")


@dataclass(frozen=True)
class Climbed(Generic[T]):
    value: T | None
    """None when no rung gave a usable answer (see provenance.fallback_reason)."""
    provenance: AgentProvenance


async def climb(
    agent: str, *,
    llm: Callable[[list[str]], Awaitable[Answer[T]]] | None,
    offline: Callable[[str], Awaitable[Answer[T]]] | None,
    max_llm_answers: int = DEFAULT_MAX_LLM_ANSWERS,
    on_rejected: Callable[[str], Awaitable[None]] | None = None,
) -> Climbed[T]:
    """Climb the ladder for one decision. `llm` is None when no LLM is configured.

    An LLM call that fails with an LLM_* error (its retries spent, or not retryable) goes straight to
    the fallback; any other activity failure and a cancellation propagate."""
    rejections: list[str] = []
    answers = 0
    llm_error: Failure | None = None
    while True:
        rung = next_rung(llm_configured=llm is not None, has_offline=offline is not None, answers=answers,
                         rejections=rejections, llm_error=llm_error, max_llm_answers=max_llm_answers)
        match rung:
            case Ask():
                assert llm is not None
                answers += 1
                try:
                    outcome = await llm(list(rejections))
                except ActivityError as e:
                    llm_error = _llm_failure(e, agent)
                    continue
                if isinstance(outcome, Accepted):
                    return Climbed(outcome.value, _provenance(agent, AnswerSource.LLM, answers, rejections))
                rejections.append(_one_line(outcome.reason))
                if on_rejected is not None:
                    await on_rejected(outcome.reason)
            case Fallback(reason):
                assert offline is not None
                outcome = await offline(reason)
                source = AnswerSource.OFFLINE if llm is None else AnswerSource.FALLBACK
                if isinstance(outcome, Accepted):
                    return Climbed(outcome.value, _provenance(agent, source, answers, rejections,
                                                              "" if llm is None else reason))
                return Climbed(None, _provenance(agent, AnswerSource.NONE, answers, rejections,
                                                 f"{reason}; the offline agent: {outcome.reason}"))
            case NoAnswer(reason):
                return Climbed(None, _provenance(agent, AnswerSource.NONE, answers, rejections, reason))


def _llm_failure(error: ActivityError, agent: str) -> Failure:
    """The failure of an LLM call, or re-raise what is not the LLM's (a cancellation, a store error)."""
    if is_cancelled_exception(error):
        raise error
    failure = failure_from(error, where=agent)
    if not failure.code.startswith("LLM_"):
        raise error
    return failure


def _one_line(reason: str) -> str:
    return " ".join(reason.split())[:REJECTION_CHARS] or "unusable answer"


def _provenance(agent: str, source: AnswerSource, answers: int, rejections: list[str], why: str = "") -> AgentProvenance:
    return AgentProvenance(agent=agent, source=source, llm_answers=answers,
                           rejections=rejections[-MAX_REJECTIONS_KEPT:], fallback_reason=why)
