"""bench_kernel_gpu's report joins a GPU run's rows with a CPU model run's and states the model's error."""

from __future__ import annotations

import json

from bench.bench_kernel_gpu import joined, levels_in_turn, model_report, verdict


def test_rows_of_a_gpu_run_and_a_model_run_join_by_kernel(tmp_path) -> None:
    gpu = tmp_path / "gpu.jsonl"
    model = tmp_path / "model.jsonl"
    gpu.write_text("\n".join(json.dumps(r) for r in [
        {"name": "level1_19_ReLU", "verified": True, "candidate_ms": 0.02, "eager_ms": 0.01, "speedup": 0.5},
        {"name": "level1_24_LogSoftmax", "verified": False, "reason": "wrong"}]) + "\n")
    model.write_text(json.dumps({"name": "level1_19_ReLU", "modeled_ms": 0.01, "modeled_eager_ms": 0.01,
                                 "modeled_speedup": 1.0}) + "\n")
    rows = joined([str(gpu), str(model)])
    assert [r["name"] for r in rows] == ["level1_19_ReLU", "level1_24_LogSoftmax"]
    assert rows[0]["modeled_ms"] == 0.01 and rows[0]["candidate_ms"] == 0.02
    assert rows[1]["verified"] is False


def test_model_report_states_measured_over_modeled_and_the_verdicts(capsys) -> None:
    model_report([
        {"name": "a", "candidate_ms": 0.02, "eager_ms": 0.01, "modeled_ms": 0.01, "modeled_eager_ms": 0.01,
         "modeled_speedup": 1.0},   # measured 0.5x, modeled 1.0x: slower against on par
        {"name": "b", "candidate_ms": 0.03, "eager_ms": 0.06, "modeled_ms": 0.01, "modeled_eager_ms": 0.02,
         "modeled_speedup": 2.0},   # measured 2x, modeled 2x
        {"name": "c", "candidate_ms": 1.0, "eager_ms": 1.0}])  # timed, not modeled
    out = capsys.readouterr().out
    assert "2 of 3 timed kernels modeled" in out
    assert "median 2.50, range 2.00-3.00, within 2x: 1/2" in out
    assert "modeled and measured: 1/2" in out
    assert [verdict(x) for x in (0.94, 0.99, 1.04, 1.2)] == ["slower", "on par", "on par", "faster"]


def test_levels_take_turns_so_a_deadline_cuts_each_alike() -> None:
    assert levels_in_turn(["level1_a", "level1_b", "level2_x"]) == ["level1_a", "level2_x", "level1_b"]
