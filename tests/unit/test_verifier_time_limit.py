"""The verifier's time limit fits the task: a multiple of the reference's own time on the same runs, within a
floor and a ceiling, set in workflow.yaml, on the CLI or in the SDK request. A candidate past it gets a verdict
naming the limit and the reference's time (real children under the Triton interpreter)."""

from __future__ import annotations

import pytest

from activities.kernels.config_loader import load_workflow_config, parse_workflow_config
from activities.kernels.verifier import verify
from client.kernel import kernel_request, time_limit_from
from contracts.errors import Err, FleetforgeError
from contracts.kernel import KernelTask, TimeLimit
from contracts.kernel_job import KernelRequest
from tests.unit.test_conductor_config import VALID
from tests.unit.test_verifier import EXAMPLES, RELU, candidate, offline_candidate


def test_the_limit_is_a_multiple_of_the_reference_time_within_floor_and_ceiling():
    limit = TimeLimit(multiple=40, floor_s=100, ceiling_s=1000)
    assert limit.for_reference(1.0) == 100, "a fast reference: the floor (every child starts torch and triton)"
    assert limit.for_reference(10.0) == 400
    assert limit.for_reference(60.0) == 1000, "a slow reference: the ceiling"
    assert TimeLimit.fixed(12).for_reference(1000.0) == 12
    assert limit.text == "40x the reference's time, at least 100 s, at most 1000 s"
    with pytest.raises(ValueError, match="floor_s .* is above ceiling_s"):
        TimeLimit(floor_s=600, ceiling_s=300)


def test_workflow_yaml_sets_it_and_a_request_overrides_it(tmp_path):
    assert load_workflow_config("default").verifier.time_limit == TimeLimit()
    assert parse_workflow_config(VALID).verifier.time_limit == TimeLimit(), "absent: the defaults"
    cfg = parse_workflow_config(VALID + "verifier:\n  time_limit:\n    multiple: 10\n    ceiling_s: 600\n")
    assert cfg.verifier.time_limit == TimeLimit(multiple=10, floor_s=120, ceiling_s=600)
    with pytest.raises(FleetforgeError, match=r"verifier\.time_limit\.floor_s: Input should be greater than 0"):
        parse_workflow_config(VALID + "verifier:\n  time_limit:\n    floor_s: 0\n")
    task = KernelTask(op_name="relu", task_desc=RELU, task_id="t", arch="cpu")
    assert KernelRequest(task=task, config=cfg).verifier_time_limit == cfg.verifier.time_limit
    own = TimeLimit(multiple=3, floor_s=5, ceiling_s=50)
    assert KernelRequest(task=task, config=cfg, time_limit=own).verifier_time_limit == own


def test_the_cli_s_partial_limit_fills_in_from_the_workflow_yaml():
    base = TimeLimit(multiple=10, floor_s=60, ceiling_s=600)
    assert time_limit_from(base, {"multiple": None, "floor_s": None, "ceiling_s": None}) is None
    assert time_limit_from(base, {"ceiling_s": 3600}) == TimeLimit(multiple=10, floor_s=60, ceiling_s=3600)
    request = kernel_request(EXAMPLES / "relu.py", run_id="r1", arch="a100", time_limit_ceiling_s=600).request
    assert request.time_limit == TimeLimit(ceiling_s=600), "the rest from the shipped default workflow.yaml"
    assert kernel_request(EXAMPLES / "relu.py", run_id="r2", arch="a100").request.time_limit is None
    with pytest.raises(FleetforgeError) as info:
        time_limit_from(base, {"floor_s": 900})
    assert info.value.code is Err.BAD_INPUT
    assert info.value.message == "verifier time limit: floor_s (900) is above ceiling_s (600)"


SLOW = "for _ in range(10**7):\n    out = launch(x)\nreturn out"
"""A right but far too slow forward (ten million launches): a real slow candidate, in its own sandboxed process."""


def test_a_candidate_slower_than_its_limit_gets_a_timeout_verdict_naming_the_limit_and_the_reference_time():
    limit = TimeLimit(multiple=2, floor_s=8, ceiling_s=90)
    report = verify(RELU, candidate(SLOW), time_limit=limit)
    assert not report.passed and report.timed_out
    assert report.reference_s > 0 and report.time_limit_s == limit.for_reference(report.reference_s)
    assert report.time_limit_s < limit.ceiling_s, "the limit followed the reference, not the ceiling"
    assert report.reason == (f"candidate timed out after {report.time_limit_s:g}s (killed), before its first forward "
                             f"call ended: its time limit is 2x the reference's time, at least 8 s, at most 90 s, and "
                             f"the reference took {report.reference_s:.1f} s on the same runs"), report.reason
    assert report.time_limit_s <= report.durations["candidate"] < report.time_limit_s + 10

    # the reference's outputs and its time are cached: the limit is known before the candidate starts
    again = verify(RELU, candidate(SLOW), time_limit=limit)
    assert "reference" not in again.durations and again.reference_s == report.reference_s
    assert again.time_limit_s == report.time_limit_s and again.reason == report.reason


STALLS_AFTER_3 = ("self.calls = getattr(self, 'calls', 0) + 1\nn = 1 if self.calls <= 3 else 10**7\n"
                  "for _ in range(n):\n    out = launch(x)\nreturn out")
"""Fast for three forward calls, then far too slow."""


def test_a_timeout_says_how_many_forward_calls_had_finished_and_when():
    report = verify(RELU, candidate(STALLS_AFTER_3), time_limit=TimeLimit(multiple=2, floor_s=15, ceiling_s=90))
    assert not report.passed
    assert ", after 3 of 8 forward calls (the last ended at " in report.reason, report.reason


def test_a_good_candidate_passes_with_its_limit_in_the_report(tmp_path):
    report = verify(RELU, offline_candidate(RELU, tmp_path), time_limit=TimeLimit(multiple=50, floor_s=60, ceiling_s=600))
    assert report.passed, report.reason
    assert report.time_limit_s == max(60.0, min(600.0, round(50 * report.reference_s, 1)))
