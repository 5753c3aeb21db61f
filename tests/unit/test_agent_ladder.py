"""The one fallback ladder every agent climbs: validate → bounded repair → offline (no server)."""

from __future__ import annotations

import asyncio

import pytest
from temporalio.exceptions import ActivityError, ApplicationError, CancelledError, RetryState

from activities.llm.structured import Rejected
from contracts.agents import AnswerSource
from contracts.common import Failure
from workflows.agent_ladder import Accepted, Ask, Fallback, NoAnswer, climb, next_rung


def activity_error(cause: BaseException) -> ActivityError:
    err = ActivityError("activity failed", scheduled_event_id=1, started_event_id=2, identity="test",
                        activity_type="complete_chat", activity_id="1", retry_state=RetryState.NON_RETRYABLE_FAILURE)
    err.__cause__ = cause
    return err


class Script:
    """An LLM that answers from a list: a str is refused with that reason, an int accepted, an
    exception raised. Records the feedback it was given."""

    def __init__(self, *answers: object):
        self.answers = list(answers)
        self.feedback: list[list[str]] = []

    async def __call__(self, rejections: list[str]) -> Accepted[int] | Rejected:
        self.feedback.append(rejections)
        answer = self.answers.pop(0)
        if isinstance(answer, BaseException):
            raise answer
        return Accepted(answer) if isinstance(answer, int) else Rejected(str(answer))


async def offline_42(reason: str) -> Accepted[int]:
    return Accepted(42)


def test_next_rung_asks_until_the_budget_then_falls_back() -> None:
    kw = dict(llm_configured=True, has_offline=True, llm_error=None, max_llm_answers=2)
    assert next_rung(answers=0, rejections=[], **kw) == Ask("")
    assert next_rung(answers=1, rejections=["bad json"], **kw) == Ask("bad json")
    rung = next_rung(answers=2, rejections=["bad json", "no plan"], **kw)
    assert isinstance(rung, Fallback) and "2 LLM answer(s) refused" in rung.reason and "no plan" in rung.reason


def test_next_rung_without_llm_or_offline() -> None:
    assert isinstance(next_rung(llm_configured=False, has_offline=True, answers=0, rejections=[], llm_error=None,
                                max_llm_answers=3), Fallback)
    assert isinstance(next_rung(llm_configured=False, has_offline=False, answers=0, rejections=[], llm_error=None,
                                max_llm_answers=3), NoAnswer)
    failed = Failure(code="LLM_QUOTA", message="insufficient_quota", where="planner")
    rung = next_rung(llm_configured=True, has_offline=False, answers=1, rejections=[], llm_error=failed, max_llm_answers=3)
    assert isinstance(rung, NoAnswer) and "LLM_QUOTA" in rung.reason


async def test_a_repaired_answer_is_the_llms_with_the_refusals_recorded() -> None:
    llm = Script("no fenced block", 7)
    got = await climb("coder", llm=llm, offline=offline_42, max_llm_answers=3)
    assert got.value == 7
    assert got.provenance.source is AnswerSource.LLM and got.provenance.llm_answers == 2
    assert got.provenance.rejections == ["no fenced block"]
    assert llm.feedback == [[], ["no fenced block"]]  # the repair round saw the concrete error


async def test_refused_answers_fall_back_to_the_offline_agent_and_say_so() -> None:
    rejected: list[str] = []

    async def record(reason: str) -> None:
        rejected.append(reason)

    got = await climb("writer", llm=Script("policy: --privileged", "policy: --pid=host"), offline=offline_42,
                      max_llm_answers=2, on_rejected=record)
    assert got.value == 42 and got.provenance.source is AnswerSource.FALLBACK
    assert rejected == ["policy: --privileged", "policy: --pid=host"]
    assert "--pid=host" in got.provenance.fallback_reason


async def test_an_llm_failure_goes_straight_to_the_fallback() -> None:
    llm = Script(activity_error(ApplicationError("context too long", type="LLM_CONTEXT_LENGTH", non_retryable=True)))
    got = await climb("planner", llm=llm, offline=offline_42, max_llm_answers=3)
    assert got.value == 42 and got.provenance.source is AnswerSource.FALLBACK
    assert got.provenance.llm_answers == 1 and "LLM_CONTEXT_LENGTH" in got.provenance.fallback_reason


async def test_no_usable_answer_anywhere_is_no_answer_not_a_verdict() -> None:
    async def offline_gap(reason: str) -> Rejected:
        return Rejected("no template for this op")

    got = await climb("coder", llm=Script("x", "y"), offline=offline_gap, max_llm_answers=2)
    assert got.value is None and got.provenance.source is AnswerSource.NONE
    assert "no template for this op" in got.provenance.fallback_reason


async def test_offline_provider_is_recorded_as_offline() -> None:
    got = await climb("designer", llm=None, offline=offline_42)
    assert got.value == 42 and got.provenance.source is AnswerSource.OFFLINE and got.provenance.fallback_reason == ""


async def test_cancellation_and_non_llm_failures_propagate() -> None:
    with pytest.raises(ActivityError):
        await climb("coder", llm=Script(activity_error(CancelledError("cancelled"))), offline=offline_42)
    with pytest.raises(ActivityError):
        await climb("writer", llm=Script(activity_error(ApplicationError("store down", type="STORE_UNAVAILABLE"))),
                    offline=offline_42)
    with pytest.raises(asyncio.CancelledError):
        await climb("coder", llm=Script(asyncio.CancelledError()), offline=offline_42)
