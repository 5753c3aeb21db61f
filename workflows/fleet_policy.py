"""Pure decisions of the fleet test (STYLE G3): retry or finish a model, whose failure a verdict is,
which slot (port, GPUs) a row gets, how many children to start, when to continue as new, the ETA.
No workflow calls, no I/O."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass

from temporalio.common import Priority

from contracts.common import TokenTotals
from contracts.errors import Err
from contracts.fleet import Classification, ErrorCategory, HardwareProfile, Remedy, Slot, row_status
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


def next_after_attempt(failure: Classification | None, attempts_used: int, max_attempts: int) -> Retry | Finish:
    """None = the attempt passed. A HUMAN remedy or a spent budget (refused commands count) finishes the
    row as failed."""
    if failure is None:
        return Finish(passed=True)
    if failure.remedy is Remedy.HUMAN or attempts_used >= max_attempts:
        return Finish(passed=False, category=failure.category.value, reason=failure.reason)
    return Retry(failure)


def rejection(reason: str, category: ErrorCategory = ErrorCategory.POLICY_REJECTED) -> Classification:
    """A refused command (policy or reviewer) or an unusable writer answer: an attempt whose reason goes
    back to the writer."""
    return Classification(category=category, remedy=Remedy.NEW_COMMAND,
                          reason=reason.splitlines()[0][:200] if reason else "command rejected")


def writer_gave_up(failures: list[Classification], reason: str) -> Finish:
    """The writers have no further command. The verdict is the last test that ran (a refused command is
    never the model's failure); without any test, the row is an Error: its commands were refused
    (POLICY_REJECTED) or nobody could write one (NO_COMMAND)."""
    tested = [f for f in failures if f.category not in (ErrorCategory.POLICY_REJECTED, ErrorCategory.NO_COMMAND)]
    if tested:
        return Finish(passed=False, category=tested[-1].category.value, reason=tested[-1].reason)
    why = reason or "no command could be written"
    if failures and failures[-1].category is ErrorCategory.POLICY_REJECTED:
        return Finish(passed=False, category=ErrorCategory.POLICY_REJECTED.value, reason=f"{failures[-1].reason}; {why}")
    return Finish(passed=False, category=ErrorCategory.NO_COMMAND.value, reason=why)


_HARNESS_CODES = {Err.RUNNER_UNAVAILABLE.value: ErrorCategory.RUNNER_UNAVAILABLE,
                  Err.POLICY_REJECTED.value: ErrorCategory.POLICY_REJECTED}


def harness_failure(code: str, message: str) -> Finish:
    """A step of the test itself failed (its retries spent): the row is an Error with a category that
    says whose (runner missing, command refused by the runner's own re-check, the LLM, else TRANSIENT)."""
    if code.startswith("LLM_"):
        category = ErrorCategory.NO_COMMAND
    else:
        category = _HARNESS_CODES.get(code, ErrorCategory.TRANSIENT)
    return Finish(passed=False, category=category.value, reason=f"[{code}] {message}"[:300])


def model_result(row: int, model_name: str, attempts: list[AttemptRecord], finish: Finish,
                 duration_s: float, tokens: TokenTotals | None = None, fingerprint: str = "") -> ModelTestResult:
    return ModelTestResult(row=row, model_name=model_name, passed=finish.passed,
                           status=row_status(finish.passed, finish.category), fingerprint=fingerprint,
                           attempts=attempts, category=finish.category, reason=finish.reason,
                           duration_s=round(duration_s, 3), tokens=tokens or TokenTotals())


def render_fixed(template: str, attempt: int, slot: Slot) -> str:
    """A row's own command (or probe URL) for one attempt: `{attempt}`, `{port}` and `{devices}` (the
    slot's GPU indices, comma-separated) filled in."""
    return (template.replace("{attempt}", str(attempt)).replace("{port}", str(slot.port))
            .replace("{devices}", ",".join(map(str, slot.devices))))


def allocate(gpus: int, hw: HardwareProfile, taken: Iterable[Slot]) -> Slot | None:
    """A free slot for a row that needs `gpus` GPUs: the lowest free port of the range and the lowest
    free GPUs; None while the running rows hold what it needs."""
    taken = list(taken)
    ports = {s.port for s in taken}
    busy = {d for s in taken for d in s.devices}
    port = next((p for p in range(hw.port_range[0], hw.port_range[1] + 1) if p not in ports), None)
    free = [d for d in range(hw.gpu_count) if d not in busy]
    if port is None or len(free) < gpus:
        return None
    return Slot(port=port, devices=tuple(free[:gpus]))


def capacity(concurrency: int, hw: HardwareProfile, gpus_per_row: int) -> int:
    """Rows that can run at once: the window, the port range, and the GPUs (rows of the host's default size)."""
    by_gpus = hw.gpu_count // gpus_per_row if gpus_per_row else concurrency
    return max(1, min(concurrency, hw.port_count, by_gpus))


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


def next_startable(cursor: int, total: int, ahead: set[int], family_of: Callable[[int], int | None],
                   running: Mapping[int, int], cap: int, lookahead: int) -> int | None:
    """Position (in the plan's pending rows) of the next row to start: the cursor's; with a per-family
    `cap`, the first within `lookahead` positions whose family runs fewer than `cap` rows (so one family's
    slow rows and retries cannot hold the whole window); None when no row may start now."""
    for pos in range(cursor, min(total, cursor + (lookahead if cap else 1))):
        if pos in ahead:
            continue
        family = family_of(pos)
        if not cap or family is None or running.get(family, 0) < cap:
            return pos
    return None


def attempt_priority(attempt: int, family: str) -> Priority:
    """A test activity's priority: first attempts before retries (retries keyed 4, a step after the default
    3), families dispatched fairly. A first attempt carries no priority key: a keyed task costs the
    server's matcher more CPU (bench/bench_row_costs.py), and the default already runs it before every retry."""
    return Priority(priority_key=None if attempt == 1 else 4, fairness_key=family or None)
