"""Pure decisions of the fleet test (STYLE G3): retry or finish a model, how many children to start,
when to continue as new, the ETA. No workflow calls, no I/O."""

from __future__ import annotations

from dataclasses import dataclass

from contracts.common import TokenTotals
from contracts.fleet import Classification, ErrorCategory, Remedy
from contracts.fleet_job import AttemptRecord, ModelTestResult


@dataclass(frozen=True)
class Retry:
    """Ask the writer again with this failure appended to the history."""

    failure: Classification


@dataclass(frozen=True)
class Finish:
    passed: bool
    category: str = ""
    reason: str = ""


def next_after_attempt(failure: Classification | None, attempt: int, max_attempts: int) -> Retry | Finish:
    """None = the attempt passed. A HUMAN remedy or a spent budget finishes the row as failed."""
    if failure is None:
        return Finish(passed=True)
    if failure.remedy is Remedy.HUMAN or attempt >= max_attempts:
        return Finish(passed=False, category=failure.category.value, reason=failure.reason)
    return Retry(failure)


def rejection(reason: str) -> Classification:
    """A refused command (policy or reviewer): an attempt whose reason goes back to the writer."""
    return Classification(category=ErrorCategory.POLICY_REJECTED, remedy=Remedy.NEW_COMMAND,
                          reason=reason.splitlines()[0][:200] if reason else "command rejected")


def writer_gave_up(history: list[Classification], reason: str) -> Finish:
    """The writer has no further command: the row fails with its last failure (or the writer's reason)."""
    if history:
        return Finish(passed=False, category=history[-1].category.value, reason=history[-1].reason)
    return Finish(passed=False, category=ErrorCategory.UNKNOWN.value, reason=reason or "no command could be written")


def model_result(row: int, model_name: str, attempts: list[AttemptRecord], finish: Finish,
                 duration_s: float, tokens: TokenTotals | None = None) -> ModelTestResult:
    return ModelTestResult(row=row, model_name=model_name, passed=finish.passed, attempts=attempts,
                           category=finish.category, reason=finish.reason, duration_s=round(duration_s, 3),
                           tokens=tokens or TokenTotals())


def slots_free(running: int, concurrency: int, paused: bool, remaining: int, budget: int) -> int:
    """How many children to start now: the window's free slots, none while paused, never more than the
    rows left or this run's remaining budget before continue-as-new."""
    if paused:
        return 0
    return max(0, min(concurrency - running, remaining, budget - running))


def should_continue_as_new(completed_this_run: int, every: int, suggested: bool, remaining: int) -> bool:
    """Hand over to a new run after `every` completions or when Temporal suggests it, unless done."""
    return remaining > 0 and (completed_this_run >= every or suggested)


def eta_seconds(done: int, todo: int, elapsed_s: float) -> float | None:
    """Linear estimate from the throughput so far; None until something finished."""
    if done <= 0 or elapsed_s <= 0:
        return None
    return round(max(0, todo - done) * elapsed_s / done, 1)


def merge_categories(counts: dict[str, int], verdict_passed: bool, category: str) -> dict[str, int]:
    key = "PASSED" if verdict_passed else (category or ErrorCategory.UNKNOWN.value)
    return {**counts, key: counts.get(key, 0) + 1}
