"""A rerun's precision override is a pure plan transform: the earlier plan's precision steps are
replaced by the offline planner's for the new precision and their readers rewired."""

from __future__ import annotations

import pytest

from activities.toolchains.offline_planner import plan_offline
from activities.toolchains.registry import default_registry
from activities.toolchains.rerun import apply_overrides, change_precision
from contracts.common import ArtifactRef
from contracts.convert import ConversionPlan, OutputKind, PlanStatus, PlanStep, Precision
from contracts.convert_job import ConversionRequest
from contracts.errors import FleetforgeError
from contracts.models import ModelFormat, ModelRef

SHA = "0" * 64
QNN, DLC, ORT, QDQ = OutputKind.QNN_CONTEXT_BINARY, OutputKind.DLC, OutputKind.ORT, OutputKind.ONNX_QDQ


def offline(precision: str, output: OutputKind = QNN, preset: str = "balanced") -> ConversionPlan:
    art = ArtifactRef(uri=f"file:///blobs/{SHA}", sha256=SHA, size=4, name="tiny.onnx")
    model = ModelRef(name="tiny", source="/hub/tiny.onnx", format=ModelFormat.ONNX, sha256=SHA, size=4, artifact=art,
                     filename="tiny.onnx")
    req = ConversionRequest(model="/hub/tiny.onnx", target_soc="sm8550", precision=Precision(precision), output=output,
                            preset=preset)
    return plan_offline(req, model, default_registry())


def test_int8_to_fp16_drops_the_quantizer_and_compiles_the_input_model():
    out = change_precision(offline("int8"), "fp16", default_registry())

    assert out.steps == [PlanStep(
        step_id="context_binary", tool_name="ortqnn.context_binary",
        required_args={"model": "input/tiny.onnx", "soc": "sm8550", "output": "converted/tiny_fp16_sm8550_ctx.onnx"},
        optional_args={"precision": "fp16"}, expected_outputs=["converted/tiny_fp16_sm8550_ctx.onnx"], depends_on=[])]
    assert out.intent["precision"] == "fp16" and out.intent["evaluate"] == "converted/tiny_fp16_sm8550_ctx.onnx"
    assert out.intent["warnings"] == [], "the synthetic-calibration warning goes with the quantizer"


def test_fp16_to_int8_inserts_the_quantizer_with_synthetic_calibration_and_its_warning():
    out = change_precision(offline("fp16", preset="fast"), "int8", default_registry())

    quant, ctx = out.steps
    assert quant == PlanStep(
        step_id="quantize", tool_name="ortqnn.quantize_qdq",
        required_args={"model": "input/tiny.onnx", "output": "converted/tiny_int8_qdq.onnx", "precision": "int8"},
        optional_args={"calibration_samples": 2, "seed": 0}, expected_outputs=["converted/tiny_int8_qdq.onnx"])
    assert ctx.required_args == {"model": "converted/tiny_int8_qdq.onnx", "soc": "sm8550",
                                 "output": "converted/tiny_int8_sm8550_ctx.onnx"}
    assert ctx.optional_args == {"precision": "int8", "graph_optimization": "fast"} and ctx.depends_on == ["quantize"]
    assert out.intent["warnings"] == offline("int8", preset="fast").intent["warnings"]
    assert "2 seeded synthetic samples (seed 0)" in out.intent["warnings"][0]


@pytest.mark.parametrize(("output", "before", "after", "preset"), [
    (QNN, "int8", "fp32", "balanced"), (QNN, "int8", "w8a16", "max_perf"), (QNN, "w8a16", "fp16", "fast"),
    (QNN, "fp32", "int8", "balanced"), (DLC, "int8", "fp16", "balanced"), (DLC, "fp16", "w8a16", "fast"),
    (ORT, "int8", "fp16", "balanced"), (ORT, "fp16", "int8", "max_perf"), (ORT, "fp16", "fp32", "fast"),
    (ORT, "fp32", "fp16", "balanced"), (QDQ, "int8", "w8a16", "balanced"),
])
def test_an_offline_plan_becomes_exactly_the_plan_for_the_new_precision(output, before, after, preset):
    out = change_precision(offline(before, output, preset), after, default_registry())
    fresh = offline(after, output, preset)

    assert out.steps == fresh.steps
    assert out.intent == fresh.intent


def test_other_overrides_apply_to_the_transformed_plan():
    out = apply_overrides(offline("fp16"), {"precision": "int8", "calibration_samples": "4", "soc": "sm8650"},
                          default_registry())

    assert [s.step_id for s in out.steps] == ["quantize", "context_binary"]
    assert out.steps[0].optional_args["calibration_samples"] == 4 and out.steps[1].required_args["soc"] == "sm8650"
    assert out.intent["precision"] == "int8" and out.rationale.startswith("rerun with {'precision': 'int8'")


def test_an_llm_plan_is_rewired_by_its_paths_and_dependencies():
    plan = ConversionPlan(status=PlanStatus.OK, intent={"precision": "int8", "reference": "input/net.onnx",
                                                        "evaluate": "converted/compiled.onnx"}, steps=[
        PlanStep(step_id="q8", tool_name="onnx.quantize_static",
                 required_args={"model": "input/net.onnx", "output": "converted/q.onnx"}),
        PlanStep(step_id="compile", tool_name="ortqnn.context_binary", depends_on=["q8"],
                 required_args={"model": "converted/q.onnx", "soc": "sm8650", "output": "converted/compiled.onnx"},
                 optional_args={"precision": "int8", "dump_dlc": True, "dlc_dir": "converted/dlc"}),
    ])
    out = change_precision(plan, "fp16", default_registry())

    assert out.steps == [PlanStep(
        step_id="compile", tool_name="ortqnn.context_binary",
        required_args={"model": "input/net.onnx", "soc": "sm8650", "output": "converted/compiled.onnx"},
        optional_args={"precision": "fp16", "dump_dlc": True, "dlc_dir": "converted/dlc"})]
    assert out.intent["evaluate"] == "converted/compiled.onnx" and out.intent["reference"] == "input/net.onnx"


@pytest.mark.parametrize(("plan", "value", "why"), [
    (offline("int8", QDQ), "fp16", "onnx_qdq output needs int8, w8a16 or w4a16"),
    (offline("int8", ORT), "w8a16", "ort output supports fp32, fp16 or int8"),
    (offline("int8"), "fp8", "unknown precision"),
    (offline("int8").model_copy(update={"intent": {}}), "fp16", "does not record its precision"),
    (offline("int8").model_copy(update={"steps": [
        PlanStep(step_id="convert", tool_name="qairt-converter", required_args={"model": "input/tiny.onnx"})]}),
     "fp16", "uses qairt-converter"),
    (offline("int8").model_copy(update={"steps": offline("int8").steps[1:]}), "fp16", "do not start from the input"),
])
def test_what_the_transform_cannot_do_is_a_bad_input_naming_the_override(plan, value, why):
    with pytest.raises(FleetforgeError, match=why) as e:
        apply_overrides(plan, {"precision": value}, default_registry())
    assert e.value.code == "BAD_INPUT" and f"--set precision={value}" in e.value.message


def test_the_same_precision_leaves_the_steps_alone():
    plan = offline("fp16")
    assert apply_overrides(plan, {"precision": "FP16"}, default_registry()).steps == plan.steps
