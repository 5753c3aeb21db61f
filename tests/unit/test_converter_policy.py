"""The converter's replan policy and answer handling, without a server."""

from __future__ import annotations

import pytest

from contracts.common import Failure
from contracts.convert import CompiledStep, CompileResult, Precision
from contracts.convert_job import ConversionRequest, ProvideInput
from contracts.errors import Err
from workflows.converter_policy import (
    Evaluate, Execute, GiveUp, Replan, answer_problems, apply_answer, fingerprint, next_after_compile, rerun_gives_up,
    next_after_execution, wait_summary,
)

STEP = CompiledStep(step_id="quantize", tool_name="ortqnn.quantize_qdq", tool_version="1.0",
                    params={"model": "input/m.onnx", "output": "converted/q.onnx", "precision": "int8"})
REJECTED = CompileResult(ok=False, errors=[Failure(code=Err.COMPILER_ERROR, message="unknown tool 'x'", where="s1")])


def test_clean_compile_executes_its_steps():
    verdict = next_after_compile(CompileResult(ok=True, steps=[STEP]), attempt=0, replans=0, max_replans=2)
    assert isinstance(verdict, Execute) and verdict.steps == [STEP] and verdict.fingerprint == fingerprint([STEP])


def test_rejected_compile_replans_with_the_compiler_feedback_while_budget_lasts():
    verdict = next_after_compile(REJECTED, attempt=1, replans=1, max_replans=2)
    assert isinstance(verdict, Replan)
    assert verdict.feedback == "[COMPILER_ERROR] s1: unknown tool 'x'"
    assert verdict.record.outcome == "compile_rejected" and verdict.record.attempt == 1


def test_rejected_compile_gives_up_when_replans_are_exhausted():
    verdict = next_after_compile(REJECTED, attempt=2, replans=2, max_replans=2)
    assert isinstance(verdict, GiveUp)
    assert verdict.failure.code == Err.REPLANS_EXHAUSTED and "unknown tool" in verdict.failure.message


def test_steps_that_already_ran_and_failed_are_never_run_twice():
    tried = frozenset({fingerprint([STEP])})
    verdict = next_after_compile(CompileResult(ok=True, steps=[STEP]), attempt=1, replans=1, max_replans=5,
                                 tried=tried, last_feedback="[EXECUTOR_ERROR] quantize: boom")
    assert isinstance(verdict, GiveUp) and verdict.record.outcome == "repeated_plan"
    assert verdict.failure.code == Err.REPLANS_EXHAUSTED and "boom" in verdict.failure.message


def test_fingerprint_changes_with_params_and_version():
    other = STEP.model_copy(update={"params": STEP.params | {"precision": "w8a16"}})
    newer = STEP.model_copy(update={"tool_version": "1.1"})
    assert len({fingerprint([STEP]), fingerprint([other]), fingerprint([newer])}) == 3


def test_clean_execution_goes_on_to_evaluate():
    assert isinstance(next_after_execution(None, attempt=0, replans=0, max_replans=2), Evaluate)


def test_executor_failure_replans_then_gives_up():
    f = Failure(code=Err.EXECUTOR_ERROR, message="QNN compile failed", where="context_binary")
    first = next_after_execution(f, attempt=0, replans=0, max_replans=1)
    assert isinstance(first, Replan) and "QNN compile failed" in first.feedback
    last = next_after_execution(f, attempt=1, replans=1, max_replans=1)
    assert isinstance(last, GiveUp) and last.failure.code == Err.REPLANS_EXHAUSTED
    assert last.failure.where == "context_binary"


def test_a_rerun_gives_up_instead_of_replanning_and_names_the_failing_step():
    f = Failure(code=Err.EXECUTOR_ERROR, message="QNN compile failed", where="context_binary")
    replan = next_after_execution(f, attempt=0, replans=0, max_replans=2)
    assert isinstance(replan, Replan) and replan.where == "context_binary"
    verdict = rerun_gives_up(replan, "run-1", {"soc": "sm8650"})
    assert verdict.failure.code == Err.EXECUTOR_ERROR and verdict.failure.where == "context_binary"
    assert "rerun of run-1 with {'soc': 'sm8650'}" in verdict.failure.message and "QNN compile failed" in verdict.failure.message
    assert verdict.record == replan.record


def test_missing_toolchain_is_not_replanned():
    f = Failure(code=Err.TOOLCHAIN_UNAVAILABLE, message="onnxruntime-qnn is not installed", where="context_binary")
    verdict = next_after_execution(f, attempt=0, replans=0, max_replans=5)
    assert isinstance(verdict, GiveUp) and verdict.failure == f


@pytest.mark.parametrize(("answer", "fragment"), [
    (ProvideInput(), "empty"),
    (ProvideInput(soc="  ", precision=""), "empty"),
    (ProvideInput(soc="sm9999"), "unknown SoC"),
    (ProvideInput(precision="int4"), "unknown precision"),
])
def test_bad_answers_are_rejected_with_a_reason(answer: ProvideInput, fragment: str):
    problems = answer_problems(answer)
    assert problems and fragment in problems[0]


def test_good_answer_fills_in_only_what_was_answered():
    req = ConversionRequest(model="m.onnx", precision=Precision.FP16)
    assert answer_problems(ProvideInput(soc="sm8550")) == []
    updated = apply_answer(req, ProvideInput(soc="sm8550"))
    assert updated.target_soc == "SM8550" and updated.precision is Precision.FP16
    updated = apply_answer(updated, ProvideInput(precision="INT8"))
    assert updated.precision is Precision.INT8 and updated.target_soc == "SM8550"


@pytest.mark.parametrize(("seconds", "words"), [(604800, "7 days"), (86400, "1 day"), (5400, "1 h 30 min"),
                                                 (90061, "1 d 1 h"), (90, "1 min 30 s"), (1, "1 s")])
def test_the_needs_input_wait_summary_says_how_long_and_how_to_answer(seconds: int, words: str):
    assert wait_summary(seconds, "convert/r-1") == \
        f"waiting up to {words} for an answer: fleetforge answer convert/r-1 soc=... precision=..."


# ---- a deterministic planner never replans a failure it cannot change ------------------------


def test_a_deterministic_planner_ends_with_the_failing_steps_own_code():
    f = Failure(code=Err.TOOL_CRASHED, message="the QNN HTP compiler crashed (signal SIGSEGV)", where="context_binary")
    verdict = next_after_execution(f, attempt=0, replans=0, max_replans=2, can_replan=False)
    assert isinstance(verdict, GiveUp) and verdict.failure == f and verdict.record.outcome == "execution_failed"


def test_an_offline_plan_the_compiler_rejects_ends_compiler_error_at_once():
    verdict = next_after_compile(REJECTED, attempt=0, replans=0, max_replans=2, can_replan=False)
    assert isinstance(verdict, GiveUp) and verdict.failure.code == Err.COMPILER_ERROR and verdict.failure.where == "compile"
    assert "unknown tool 'x'" in verdict.failure.message


def test_the_same_plan_again_ends_with_the_last_failure_not_replans_exhausted():
    last = Failure(code=Err.UNSUPPORTED_OP, message="op Det", where="context_binary")
    verdict = next_after_compile(CompileResult(ok=True, steps=[STEP]), attempt=1, replans=1, max_replans=5,
                                 tried=frozenset({fingerprint([STEP])}), last_failure=last)
    assert isinstance(verdict, GiveUp) and verdict.failure == last and verdict.record.outcome == "repeated_plan"


# ---- the accuracy gate -----------------------------------------------------------------------

from contracts.convert import OutputKind  # noqa: E402
from contracts.convert_job import EvaluationReport, OffloadReport, OutputFigures, PlanFeedback  # noqa: E402
from workflows.converter_policy import Complete, gate, min_cosine_for  # noqa: E402


def report(*cosines: float, nonfinite: int = 0, inputs: str = "held_out") -> EvaluationReport:
    outs = [OutputFigures(name=f"out{i}", cosine=c, max_abs=1 - c, mean_abs=(1 - c) / 2, sqnr_db=20.0,
                          nonfinite_mismatches=nonfinite if i == 0 else 0) for i, c in enumerate(cosines)]
    return EvaluationReport(reference="input/m.onnx", candidate="converted/m_ctx.onnx", samples=16, max_abs=1.0, mean_abs=0.5,
                            cosine=min(cosines), candidate_provider="QNNExecutionProvider", seconds=1.0, outputs=outs,
                            sqnr_db=20.0, inputs=inputs)


FULL = OffloadReport(nodes_total=10, context_nodes=1, cpu_nodes=0)
INT8 = ConversionRequest(model="m.onnx", target_soc="sm8550", precision=Precision.INT8)


def judge(ev: EvaluationReport | None, offload: OffloadReport | None = FULL, *, request: ConversionRequest = INT8,
          replans: int = 0, remedies: list[str] | None = None, can: bool = True):
    return gate(ev, offload, request=request, attempt=replans, replans=replans, max_replans=2, remedies=remedies or [],
                float_outputs=[], can_remedy=lambda fb: can)


def test_default_thresholds_per_precision_and_the_requests_own():
    assert min_cosine_for(INT8) == 0.95 and min_cosine_for(INT8.model_copy(update={"precision": Precision.FP16})) == 0.99
    assert min_cosine_for(INT8.model_copy(update={"min_cosine": 0.5})) == 0.5


def test_a_result_at_the_threshold_on_held_out_data_completes_passed_with_its_figures():
    verdict = judge(report(0.97, 0.999))
    assert isinstance(verdict, Complete)
    assert verdict.accuracy.verdict == "passed" and verdict.accuracy.cosine == 0.97 and verdict.accuracy.offload_share == 1.0
    assert verdict.accuracy.samples == 16 and verdict.accuracy.inputs == "held_out"


def test_below_the_threshold_goes_back_to_the_planner_with_the_figures():
    verdict = judge(report(0.0, 0.99))
    assert isinstance(verdict, Replan) and verdict.where == "evaluate" and verdict.record.outcome == "below_threshold"
    assert verdict.remedy is not None and verdict.remedy.kind == "accuracy" and verdict.remedy.min_cosine == 0.95
    assert verdict.failure.code == Err.ACCURACY_BELOW_THRESHOLD and "out0 cosine 0.0000" in verdict.failure.message


@pytest.mark.parametrize("replans, can, ending", [(2, True, "replan budget (2) is spent"), (0, False, "no further remedy")])
def test_below_the_threshold_with_nothing_left_to_try_fails_with_figures_and_remedies(replans: int, can: bool, ending: str):
    verdict = judge(report(0.5), replans=replans, remedies=["float_outputs", "w8a16"], can=can)
    assert isinstance(verdict, GiveUp) and verdict.failure.code == Err.ACCURACY_BELOW_THRESHOLD
    assert "cosine 0.5000 < 0.95" in verdict.failure.message and "remedies tried: float_outputs, w8a16" in verdict.failure.message
    assert verdict.failure.message.endswith(ending) and verdict.accuracy.verdict == "below_threshold"


def test_nan_where_fp32_has_a_number_fails_even_with_a_good_cosine():
    assert isinstance(judge(report(0.999, nonfinite=3), can=False), GiveUp)


def test_min_cosine_zero_accepts_a_lossy_result_and_says_so():
    verdict = judge(report(0.1), request=INT8.model_copy(update={"min_cosine": 0.0}))
    assert isinstance(verdict, Complete) and verdict.accuracy.verdict == "accepted_lossy" and "0.1000" in verdict.accuracy.note


def test_a_context_binary_with_cpu_nodes_is_not_offloaded():
    partial = OffloadReport(nodes_total=10, context_nodes=2, cpu_nodes=1, cpu_ops=["Det"])
    verdict = judge(report(1.0), partial, can=False)
    assert isinstance(verdict, GiveUp) and verdict.failure.code == Err.NOT_FULLY_OFFLOADED
    assert "Det" in verdict.failure.message and "offload 90%" in verdict.failure.message
    assert verdict.accuracy.verdict == "not_offloaded" and verdict.accuracy.cpu_ops == ["Det"]
    onnx_qdq = INT8.model_copy(update={"output": OutputKind.ONNX_QDQ})
    assert isinstance(judge(report(1.0), partial, request=onnx_qdq), Complete), "only a context binary must be offloaded"


def test_offload_counts_the_models_nodes_and_says_the_boundary_conversions_run_on_the_cpu():
    """A QDQ model's float input and output are converted by a QuantizeLinear / DequantizeLinear that stay on the
    CPU: neither "inside the binary" (the line said "100% of 23 nodes inside" for 21 inside) nor a failure."""
    from workflows.converter import offload_row

    full = OffloadReport(nodes_total=23, context_nodes=1, cpu_nodes=0, io_nodes=2)
    assert full.full and full.share == 1.0
    assert offload_row(full) == "100% of 21 nodes in the context binary; 2 more convert its float inputs/outputs on the CPU"
    partial = OffloadReport(nodes_total=12, context_nodes=2, cpu_nodes=1, cpu_ops=["Det"], io_nodes=2)
    assert partial.share == 0.9
    verdict = judge(report(1.0), partial, can=False)
    assert isinstance(verdict, GiveUp) and "1 of 10 nodes run on the CPU" in verdict.failure.message
    assert "offload 90%" in verdict.failure.message
    old = OffloadReport.model_validate({"nodes_total": 16, "context_nodes": 1, "cpu_nodes": 0})
    assert offload_row(old) == "100% of 16 nodes in the context binary", "a result recorded before io_nodes reads as it did"


def test_a_rerun_that_misses_the_gate_keeps_the_gates_code():
    replan = judge(report(0.2))
    assert isinstance(replan, Replan)
    verdict = rerun_gives_up(replan, "run-1", {"soc": "sm8650"})
    assert verdict.failure.code == Err.ACCURACY_BELOW_THRESHOLD and "a rerun is not replanned" in verdict.failure.message


def test_feedback_kinds_are_typed():
    assert PlanFeedback(kind="offload").remedies == []


def test_a_remedy_that_cannot_run_moves_on_to_the_next_or_ends_with_the_gates_code():
    from workflows.converter_policy import next_after_failed_remedy

    previous = judge(report(0.6))
    assert isinstance(previous, Replan)
    nothing = Failure(code=Err.NOTHING_TO_QUANTIZE, message="the quantizer found nothing to quantize", where="quantize")
    onward = next_after_failed_remedy(nothing, previous, remedies=["float_outputs"], float_outputs=["out0"], attempt=1,
                                      replans=1, max_replans=2, can_remedy=lambda fb: True)
    assert isinstance(onward, Replan) and onward.remedy.evaluation is not None
    assert onward.remedy.remedies == [] and onward.remedy.failed == ["float_outputs"], "dropped, and not tried again"
    assert onward.record.outcome == "remedy_failed" and "remedy float_outputs could not run" in onward.failure.message
    ended = next_after_failed_remedy(nothing, previous, remedies=["float_outputs"], float_outputs=["out0"], attempt=1,
                                     replans=1, max_replans=2, can_remedy=lambda fb: False)
    assert isinstance(ended, GiveUp) and ended.failure.code == Err.ACCURACY_BELOW_THRESHOLD
    assert "NOTHING_TO_QUANTIZE" in ended.failure.message and ended.failure.message.endswith("no further remedy")
    store = Failure(code=Err.STORE_UNAVAILABLE, message="S3 down", where="quantize")
    assert next_after_failed_remedy(store, previous, remedies=[], float_outputs=[], attempt=1, replans=1, max_replans=2,
                                    can_remedy=lambda fb: True).failure == store
