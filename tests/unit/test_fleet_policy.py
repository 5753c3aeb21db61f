"""Fleet decisions without a server: retry budget, window slots, continue-as-new, ETA."""

from __future__ import annotations

from contracts.fleet import Classification, ErrorCategory, Remedy
from workflows.fleet_policy import (
    Finish, Retry, eta_seconds, merge_categories, next_after_attempt, rejection, should_continue_as_new,
    slots_free, writer_gave_up,
)

OOM = Classification(category=ErrorCategory.CUDA_OOM, remedy=Remedy.NEW_COMMAND, reason="oom")
GATED = Classification(category=ErrorCategory.AUTH, remedy=Remedy.HUMAN, reason="gated repo")


def test_a_passing_attempt_finishes_the_row_as_passed():
    assert next_after_attempt(None, 1, 3) == Finish(passed=True)


def test_a_fixable_failure_retries_until_the_budget_is_spent():
    assert next_after_attempt(OOM, 1, 3) == Retry(OOM)
    assert next_after_attempt(OOM, 2, 3) == Retry(OOM)
    assert next_after_attempt(OOM, 3, 3) == Finish(passed=False, category="CUDA_OOM", reason="oom")


def test_a_human_remedy_finishes_at_once():
    assert next_after_attempt(GATED, 1, 3) == Finish(passed=False, category="AUTH", reason="gated repo")


def test_a_rejection_is_a_retryable_policy_failure_with_one_line():
    r = rejection("command rejected: `;`\nsecond line")
    assert r.category is ErrorCategory.POLICY_REJECTED and r.remedy is Remedy.NEW_COMMAND
    assert r.reason == "command rejected: `;`"
    assert next_after_attempt(r, 1, 3) == Retry(r)


def test_writer_giving_up_reports_the_last_failure_or_its_reason():
    assert writer_gave_up([OOM], "no repair") == Finish(passed=False, category="CUDA_OOM", reason="oom")
    assert writer_gave_up([], "needs a command column") == Finish(
        passed=False, category="UNKNOWN", reason="needs a command column")


def test_slots_respect_window_pause_rows_left_and_run_budget():
    assert slots_free(running=0, concurrency=8, paused=False, remaining=100, budget=500) == 8
    assert slots_free(running=5, concurrency=8, paused=False, remaining=100, budget=500) == 3
    assert slots_free(running=0, concurrency=8, paused=True, remaining=100, budget=500) == 0
    assert slots_free(running=0, concurrency=8, paused=False, remaining=2, budget=500) == 2
    assert slots_free(running=6, concurrency=8, paused=False, remaining=100, budget=7) == 1
    assert slots_free(running=8, concurrency=8, paused=False, remaining=100, budget=7) == 0


def test_continue_as_new_after_k_completions_or_when_suggested_but_never_when_done():
    assert should_continue_as_new(500, 500, False, remaining=10)
    assert should_continue_as_new(3, 500, True, remaining=10)
    assert not should_continue_as_new(499, 500, False, remaining=10)
    assert not should_continue_as_new(500, 500, True, remaining=0)


def test_eta_is_linear_in_throughput_and_unknown_before_the_first_row():
    assert eta_seconds(0, 100, 30.0) is None
    assert eta_seconds(25, 100, 50.0) == 150.0
    assert eta_seconds(100, 100, 50.0) == 0.0


def test_merge_categories_counts_passes_and_failure_categories():
    counts = merge_categories({}, True, "")
    counts = merge_categories(counts, False, "CUDA_OOM")
    counts = merge_categories(counts, False, "CUDA_OOM")
    assert counts == {"PASSED": 1, "CUDA_OOM": 2}
