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
