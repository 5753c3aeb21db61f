"""Fleet decisions without a server: retry budget, whose failure a verdict is, slots (port, GPUs),
window, continue-as-new, ETA."""

from __future__ import annotations

import pytest

from contracts.fleet import HARNESS_CATEGORIES, Classification, ErrorCategory, HardwareProfile, Remedy, RowStatus, Slot, row_status
from workflows.fleet_policy import (
    Finish, Retry, allocate, capacity, eta_seconds, harness_failure, merge_categories, next_after_attempt, rejection,
    render_fixed, should_continue_as_new, slots_free, attempt_priority, writer_gave_up,
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


def test_writer_giving_up_reports_the_last_test_that_ran_never_a_refusal():
    refused = rejection("command rejected: port 8000 is not this row's: use port 8003 only")
    assert writer_gave_up([OOM], "no repair") == Finish(passed=False, category="CUDA_OOM", reason="oom")
    assert writer_gave_up([OOM, refused, refused], "3 LLM answers refused") == Finish(
        passed=False, category="CUDA_OOM", reason="oom"), "the model's own failure, not the LLM's refusals"


def test_writer_giving_up_without_any_test_is_an_error_of_the_harness():
    refused = rejection("command rejected: --privileged is not allowed")
    assert writer_gave_up([], "needs a command column") == Finish(
        passed=False, category="NO_COMMAND", reason="needs a command column")
    gave_up = writer_gave_up([refused], "the row's own command was refused; it needs a person")
    assert gave_up.category == "POLICY_REJECTED" and gave_up.reason.startswith("command rejected: --privileged")
    for finish in (gave_up, writer_gave_up([], "x")):
        assert row_status(finish.passed, finish.category) is RowStatus.ERROR


def test_refused_commands_spend_the_attempt_budget():
    refused = rejection("command rejected: `;`")
    assert next_after_attempt(refused, 2, 3) == Retry(refused)
    assert next_after_attempt(refused, 3, 3) == Finish(passed=False, category="POLICY_REJECTED",
                                                       reason="command rejected: `;`")
    assert next_after_attempt(None, 4, 3) == Finish(passed=True), "the offline fallback after the budget may pass"


@pytest.mark.parametrize("category, status", [
    ("CUDA_OOM", RowStatus.NO), ("CRASHED", RowStatus.NO), ("NOT_HEALTHY", RowStatus.NO), ("TIMEOUT", RowStatus.NO),
    ("PROBE_FAILED", RowStatus.NO), ("UNSUPPORTED_ARCH", RowStatus.NO), ("TRUST_REMOTE_CODE", RowStatus.NO),
    ("POLICY_REJECTED", RowStatus.ERROR), ("NO_COMMAND", RowStatus.ERROR), ("RUNNER_UNAVAILABLE", RowStatus.ERROR),
    ("TRANSIENT", RowStatus.ERROR), ("AUTH", RowStatus.ERROR), ("IMAGE_NOT_FOUND", RowStatus.ERROR),
    ("PORT_IN_USE", RowStatus.ERROR), ("FOREIGN_SERVER", RowStatus.ERROR), ("UNKNOWN", RowStatus.ERROR),
    ("MODEL_MISMATCH", RowStatus.NO), ("SANDBOX_HIDDEN", RowStatus.ERROR),
    ("SOMETHING_NEW", RowStatus.ERROR),
])
def test_no_is_the_models_failure_and_error_is_ours(category, status):
    assert row_status(False, category) is status
    assert row_status(True, "") is RowStatus.YES


def test_every_category_is_either_the_models_or_the_harness():
    model = set(ErrorCategory) - HARNESS_CATEGORIES
    assert model == {ErrorCategory.CUDA_OOM, ErrorCategory.UNSUPPORTED_ARCH, ErrorCategory.TRUST_REMOTE_CODE,
                     ErrorCategory.NOT_HEALTHY, ErrorCategory.CRASHED, ErrorCategory.PROBE_FAILED, ErrorCategory.TIMEOUT,
                     ErrorCategory.MODEL_MISMATCH}


@pytest.mark.parametrize("code, category", [
    ("RUNNER_UNAVAILABLE", "RUNNER_UNAVAILABLE"), ("POLICY_REJECTED", "POLICY_REJECTED"),
    ("LLM_UNAVAILABLE", "NO_COMMAND"), ("STORE_UNAVAILABLE", "TRANSIENT"), ("INTERNAL", "TRANSIENT"),
])
def test_a_failed_step_of_the_test_is_a_harness_error(code, category):
    finish = harness_failure(code, "no docker runner on this worker")
    assert (finish.passed, finish.category) == (False, category)
    assert finish.reason == f"[{code}] no docker runner on this worker"
    assert row_status(False, finish.category) is RowStatus.ERROR


HOST = HardwareProfile(gpu_count=4, port_range=(9000, 9003))


def test_slots_give_every_running_row_its_own_port_and_gpus():
    a = allocate(1, HOST, [])
    b = allocate(2, HOST, [a])
    c = allocate(1, HOST, [a, b])
    assert (a, b, c) == (Slot(port=9000, devices=(0,)), Slot(port=9001, devices=(1, 2)), Slot(port=9002, devices=(3,)))
    assert allocate(1, HOST, [a, b, c]) is None, "every GPU is taken"
    assert allocate(0, HOST, [a, b, c]) == Slot(port=9003, devices=()), "a row without GPUs needs only a port"
    assert allocate(0, HOST, [a, b, c, Slot(port=9003)]) is None, "every port is taken"
    assert allocate(2, HOST, [b]) == Slot(port=9000, devices=(0, 3)), "freed ports and GPUs are handed out again"


def test_capacity_is_the_smallest_of_window_ports_and_gpus():
    assert capacity(32, HOST, 1) == 4
    assert capacity(32, HOST, 2) == 2
    assert capacity(2, HOST, 1) == 2
    assert capacity(32, HardwareProfile(gpu_count=0, port_range=(9000, 9009)), 0) == 10


def test_fixed_commands_get_the_attempt_and_the_slot():
    slot = Slot(port=9001, devices=(1, 2))
    assert render_fixed("docker run -e PORT={port} --gpus '\"device={devices}\"' img --try {attempt}", 2, slot) == (
        "docker run -e PORT=9001 --gpus '\"device=1,2\"' img --try 2")


def test_the_hardware_profile_gives_rows_one_gpu_unless_they_ask():
    assert HOST.gpus_for(None) == 1 and HOST.gpus_for(2) == 2 and HOST.gpus_for(16) == 4 and HOST.gpus_for(0) == 0
    assert HardwareProfile(gpu_count=0).gpus_for(None) == 0
    with pytest.raises(ValueError):
        HardwareProfile(port_range=(9000, 8000))


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


def test_next_startable_skips_a_capped_family_within_the_lookahead_and_never_reruns_a_started_row():
    from workflows.fleet_policy import next_startable

    fam = {0: 0, 1: 0, 2: 1, 3: 0, 4: 2}.get
    assert next_startable(0, 5, set(), fam, {}, cap=0, lookahead=8) == 0, "no cap: the cursor's row"
    assert next_startable(0, 5, set(), fam, {0: 1}, cap=0, lookahead=8) == 0
    assert next_startable(0, 5, set(), fam, {0: 1}, cap=1, lookahead=8) == 2, "family 0 is at its cap"
    assert next_startable(0, 5, {2}, fam, {0: 1, 1: 1}, cap=1, lookahead=8) == 4, "row 2 already started"
    assert next_startable(0, 5, {2}, fam, {0: 1, 1: 1}, cap=1, lookahead=3) is None, "nothing within the lookahead"


def test_first_attempts_go_before_retries_without_a_priority_key_and_families_are_fair():
    first, retry = attempt_priority(1, "org"), attempt_priority(2, "org")
    assert first.priority_key is None, "the default key (3): a keyed task costs the server more per row"
    assert retry.priority_key is not None and retry.priority_key > 3, "a retry runs after every first attempt"
    assert first.fairness_key == retry.fairness_key == "org"
    assert attempt_priority(1, "").fairness_key is None
