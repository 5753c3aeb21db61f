"""The offline planner: questions for missing facts, and plans that compile cleanly."""

from __future__ import annotations

from pathlib import Path

import pytest

from activities.toolchains.compiler import compile_plan
from activities.toolchains.offline_planner import evaluation_pair, plan_offline, plan_warnings
from activities.toolchains.registry import default_registry
from contracts.common import ArtifactRef
from contracts.convert import OutputKind, PlanStatus, Precision, Toolchain
from contracts.convert_job import ConversionRequest
from contracts.errors import Err, FleetforgeError
from contracts.models import ModelFormat, ModelRef

SHA = "0" * 64


def model_ref(filename: str = "tiny.onnx", fmt: ModelFormat = ModelFormat.ONNX) -> ModelRef:
    art = ArtifactRef(uri=f"file:///blobs/{SHA}", sha256=SHA, size=4, name=filename)
    return ModelRef(name="tiny", source=f"/hub/{filename}", format=fmt, sha256=SHA, size=4, artifact=art, filename=filename)


@pytest.fixture
def ws(tmp_path: Path) -> Path:
    (tmp_path / "input").mkdir()
    (tmp_path / "input" / "tiny.onnx").write_bytes(b"onnx")
    return tmp_path


def req(**kw: object) -> ConversionRequest:
    return ConversionRequest(model="/hub/tiny.onnx", **kw)


def test_missing_soc_and_precision_become_questions_not_steps():
    plan = plan_offline(req(), model_ref(), default_registry())
    assert plan.status is PlanStatus.NEEDS_INPUT and plan.steps == []
    assert len(plan.questions) == 2
    assert "SM8550" in plan.questions[0] and "int8" in plan.questions[1]


def test_unknown_soc_is_asked_again_with_the_valid_names():
    plan = plan_offline(req(target_soc="sm9999", precision=Precision.INT8), model_ref(), default_registry())
    assert plan.status is PlanStatus.NEEDS_INPUT
    assert len(plan.questions) == 1 and "sm9999" in plan.questions[0] and "SM8650" in plan.questions[0]


def test_onnx_outputs_do_not_ask_for_a_soc():
    plan = plan_offline(req(precision=Precision.INT8, output=OutputKind.ONNX_QDQ), model_ref(), default_registry())
    assert plan.status is PlanStatus.OK and [s.tool_name for s in plan.steps] == ["onnx.quantize_static"]


def test_int8_context_binary_quantizes_then_compiles_for_the_soc(ws: Path):
    plan = plan_offline(req(target_soc="sm8550", precision=Precision.INT8), model_ref(), default_registry())
    assert [s.tool_name for s in plan.steps] == ["ortqnn.quantize_qdq", "ortqnn.context_binary"]
    quant, ctx = plan.steps
    assert quant.required_args == {"model": "input/tiny.onnx", "output": "converted/tiny_int8_qdq.onnx", "precision": "int8"}
    assert quant.optional_args == {"calibration_samples": 8, "seed": 0}
    assert ctx.required_args == {"model": "converted/tiny_int8_qdq.onnx", "soc": "sm8550", "output": "converted/tiny_int8_sm8550_ctx.onnx"}
    assert ctx.optional_args == {"precision": "int8"} and ctx.depends_on == ["quantize"]
    assert any("synthetic" in w for w in plan_warnings(plan))
    assert evaluation_pair(plan) == ("input/tiny.onnx", "converted/tiny_int8_sm8550_ctx.onnx")

    result = compile_plan(plan, default_registry(), ws)
    assert result.ok, result.feedback()
    assert [s.step_id for s in result.steps] == ["quantize", "context_binary"]
    assert result.steps[1].outputs == ["converted/tiny_int8_sm8550_ctx.onnx", "converted/tiny_int8_sm8550_ctx_qnn.bin"]


def test_plans_are_deterministic():
    a = plan_offline(req(target_soc="SM8650", precision=Precision.FP16), model_ref(), default_registry())
    b = plan_offline(req(target_soc="sm8650", precision=Precision.FP16), model_ref(), default_registry())
    assert a == b
    assert [s.tool_name for s in a.steps] == ["ortqnn.context_binary"]
    assert a.steps[0].optional_args == {"precision": "fp16"} and plan_warnings(a) == []


@pytest.mark.parametrize(("output", "precision", "tools"), [
    (OutputKind.QNN_CONTEXT_BINARY, Precision.W8A16, ["ortqnn.quantize_qdq", "ortqnn.context_binary"]),
    (OutputKind.QNN_CONTEXT_BINARY, Precision.FP32, ["ortqnn.context_binary"]),
    (OutputKind.DLC, Precision.FP16, ["ortqnn.context_binary"]),
    (OutputKind.ONNX_QDQ, Precision.INT8, ["onnx.quantize_static"]),
    (OutputKind.ONNX_QDQ, Precision.W8A16, ["ortqnn.quantize_qdq"]),
    (OutputKind.ORT, Precision.FP32, ["onnx.to_ort"]),
    (OutputKind.ORT, Precision.FP16, ["onnx.fp16", "onnx.to_ort"]),
    (OutputKind.ORT, Precision.INT8, ["onnx.quantize_static", "onnx.to_ort"]),
])
def test_every_supported_combination_compiles_cleanly(ws: Path, output: OutputKind, precision: Precision, tools: list[str]):
    plan = plan_offline(req(target_soc="sm8750", precision=precision, output=output), model_ref(), default_registry())
    assert [s.tool_name for s in plan.steps] == tools
    result = compile_plan(plan, default_registry(), ws)
    assert result.ok, result.feedback()


def test_calibration_data_goes_to_a_tool_that_takes_it(ws: Path):
    (ws / "input" / "calib.npz").write_bytes(b"npz")
    plan = plan_offline(req(precision=Precision.INT8, output=OutputKind.ONNX_QDQ, calibration="input/calib.npz"),
                        model_ref(), default_registry())
    assert plan.steps[0].optional_args == {"calibration_data": "input/calib.npz"}
    assert plan_warnings(plan) == []
    assert compile_plan(plan, default_registry(), ws).ok


def test_fp32_context_binary_warns_that_htp_runs_fp16():
    plan = plan_offline(req(target_soc="sm8550", precision=Precision.FP32), model_ref(), default_registry())
    assert any("fp16" in w for w in plan_warnings(plan))


@pytest.mark.parametrize(("kw", "fmt", "code"), [
    ({"toolchain": Toolchain.QAIRT}, ModelFormat.ONNX, Err.TOOLCHAIN_UNAVAILABLE),
    ({"toolchain": Toolchain.ONNX}, ModelFormat.ONNX, Err.BAD_INPUT),
    ({}, ModelFormat.TFLITE, Err.TOOLCHAIN_UNAVAILABLE),
    ({"output": OutputKind.ONNX_QDQ, "precision": Precision.FP16}, ModelFormat.ONNX, Err.BAD_INPUT),
])
def test_impossible_requests_raise_a_coded_error(kw: dict, fmt: ModelFormat, code: Err):
    base = {"target_soc": "sm8550", "precision": Precision.INT8} | kw
    with pytest.raises(FleetforgeError) as e:
        plan_offline(req(**base), model_ref(fmt=fmt), default_registry())
    assert e.value.code is code
