"""Who gave an agent's answer: the record the fallback ladder (workflows/agent_ladder.py) leaves
in every job's trace and result, so a person can tell the LLM's work from the offline agent's."""

from __future__ import annotations

from enum import StrEnum

from pydantic import BaseModel, Field

MAX_REJECTIONS_KEPT = 5
REJECTION_CHARS = 300


class AnswerSource(StrEnum):
    LLM = "llm"
    """The LLM's answer, validated."""
    OFFLINE = "offline"
    """The offline agent answered without the LLM being asked: it is the configured provider, or a policy puts it
    first (the offline optimizer's rewrites; `fallback_reason` says so)."""
    FALLBACK = "fallback"
    """The LLM failed or its answers stayed unusable after the repair rounds: the offline agent answered."""
    NONE = "none"
    """Nobody produced a usable answer. A harness/LLM failure, never a verdict about the model or kernel."""


class AgentProvenance(BaseModel, frozen=True):
    """How one agent decision was reached on the ladder: validate → bounded repair → offline."""

    agent: str
    source: AnswerSource
    llm_answers: int = 0
    """LLM answers asked for this decision (the first and its repairs)."""
    rejections: list[str] = Field(default_factory=list)
    """Why each refused LLM answer was refused, oldest first (the last few, each one line)."""
    fallback_reason: str = ""
    """Why the offline agent answered (FALLBACK, or OFFLINE by policy) or why nobody could (NONE)."""

    @property
    def by_llm(self) -> bool:
        return self.source is AnswerSource.LLM
