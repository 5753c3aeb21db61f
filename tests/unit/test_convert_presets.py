"""Presets map to concrete tool args (one table), and rerun overrides are typed and checked."""

from __future__ import annotations

import pytest

from activities.toolchains.offline_planner import plan_offline
from activities.toolchains.presets import PRESET_ARGS
from activities.toolchains.registry import default_registry
from activities.toolchains.rerun import apply_overrides
from contracts.common import ArtifactRef
from contracts.convert import OutputKind, Precision
from contracts.convert_job import ConversionRequest
from contracts.errors import FleetforgeError
from contracts.models import ModelFormat, ModelRef


def _model() -> ModelRef:
    sha = "0" * 64
    art = ArtifactRef(uri=f"file:///blobs/{sha}", sha256=sha, size=4, name="tiny.onnx")
    return ModelRef(name="tiny", source="/hub/tiny.onnx", format=ModelFormat.ONNX, sha256=sha, size=4, artifact=art,
                    filename="tiny.onnx")


def _plan(preset: str, output: OutputKind = OutputKind.QNN_CONTEXT_BINARY):
    req = ConversionRequest(model="tiny.onnx", target_soc="sm8550", precision=Precision.INT8, output=output, preset=preset)
    return plan_offline(req, _model(), default_registry())


def test_every_preset_arg_exists_in_the_tool_spec():
    reg = default_registry()
    for preset, tools in PRESET_ARGS.items():
        for tool, args in tools.items():
            spec = reg.get_tool_spec(tool)
            assert all(spec.arg(a) is not None for a in args), (preset, tool, args)


def test_presets_change_the_plans_args_and_the_warning():
    fast, balanced, best = _plan("fast"), _plan("balanced"), _plan("max_perf")
    assert fast.steps[0].optional_args["calibration_samples"] == 2
    assert balanced.steps[0].optional_args["calibration_samples"] == 8
    assert best.steps[0].optional_args["calibration_samples"] == 16
    assert "2 seeded synthetic" in fast.intent["warnings"][0]
    assert _plan("max_perf", OutputKind.ORT).steps[-1].optional_args == {"optimization_level": "all"}
    ctx = [p.steps[1].optional_args.get("graph_optimization") for p in (fast, balanced, best)]
    assert ctx == ["fast", None, "max"], "the HTP graph finalization effort follows the preset"


def test_unknown_preset_is_rejected_by_the_request():
    with pytest.raises(ValueError, match="max_perf"):
        ConversionRequest(model="m.onnx", preset="turbo")


def test_overrides_are_typed_and_an_unknown_arg_is_an_error():
    plan = _plan("balanced")
    out = apply_overrides(plan, {"soc": "sm8650", "calibration_samples": "4"}, default_registry())
    assert out.steps[1].required_args["soc"] == "sm8650" and out.steps[0].optional_args["calibration_samples"] == 4
    assert out.intent["soc"] == "sm8650"
    with pytest.raises(FleetforgeError, match="calibration_samples") as e:
        apply_overrides(plan, {"calibration_samples": "many"}, default_registry())
    assert e.value.code == "BAD_INPUT"
    with pytest.raises(FleetforgeError, match="turbo"):
        apply_overrides(plan, {"turbo": "1"}, default_registry())


def test_a_soc_override_names_every_output_for_the_new_soc():
    plan = _plan("balanced")
    out = apply_overrides(plan, {"soc": "SM8650"}, default_registry())
    ctx = out.steps[1]
    assert ctx.required_args["soc"] == "sm8650"
    assert ctx.required_args["output"] == "converted/tiny_int8_sm8650_ctx.onnx"
    assert ctx.expected_outputs == ["converted/tiny_int8_sm8650_ctx.onnx"]
    assert out.intent["evaluate"] == "converted/tiny_int8_sm8650_ctx.onnx"
    assert out.steps[0] == plan.steps[0], "the quantizer does not depend on the SoC"
    with pytest.raises(FleetforgeError, match="sm8850"):
        apply_overrides(plan, {"soc": "sm1"}, default_registry())
