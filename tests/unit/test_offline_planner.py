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


# ---- remedies for the accuracy gate ------------------------------------------------------------

from contracts.convert_job import EvaluationReport, OutputFigures, PlanFeedback  # noqa: E402
from activities.toolchains.offline_planner import (  # noqa: E402
    FLOAT_OUTPUTS, MIXED, MORE_CALIBRATION, W8A16, next_remedy, plan_remedies, request_problems,
)


def below(*remedies: str, outputs: dict[str, float] | None = None, kind: str = "accuracy") -> PlanFeedback:
    outputs = outputs or {"prob": 0.0}
    figures = [OutputFigures(name=n, cosine=c, max_abs=0.001, mean_abs=0.001, sqnr_db=0.0) for n, c in outputs.items()]
    ev = EvaluationReport(reference="input/tiny.onnx", candidate="converted/x.onnx", samples=4, max_abs=0.001,
                          mean_abs=0.001, cosine=min(outputs.values()), candidate_provider="QNNExecutionProvider",
                          seconds=1.0, outputs=figures)
    return PlanFeedback(kind=kind, remedies=list(remedies), evaluation=ev, min_cosine=0.95)  # type: ignore[arg-type]


INT8_CTX = dict(target_soc="sm8550", precision=Precision.INT8)


def test_the_remedies_come_in_order_and_stop_when_spent():
    r = req(precision_fallback=True, **INT8_CTX)
    assert next_remedy(req(**INT8_CTX), below(FLOAT_OUTPUTS)) == MIXED, "a few 16-bit layers keep the model int8"
    assert next_remedy(req(**INT8_CTX), below(FLOAT_OUTPUTS, MIXED)) == MORE_CALIBRATION, "w8a16 only with consent"
    assert next_remedy(req(**INT8_CTX), below(FLOAT_OUTPUTS, MIXED, MORE_CALIBRATION)) is None
    assert next_remedy(r, below()) == FLOAT_OUTPUTS
    assert next_remedy(r, below(FLOAT_OUTPUTS)) == MIXED, "the fewest 16-bit layers before a whole-model w8a16"
    assert next_remedy(r, below(FLOAT_OUTPUTS, MIXED)) == W8A16
    assert next_remedy(r, below(FLOAT_OUTPUTS, MIXED, W8A16)) == MORE_CALIBRATION
    assert next_remedy(r, below(FLOAT_OUTPUTS, MIXED, W8A16, MORE_CALIBRATION)) is None
    assert next_remedy(req(precision=Precision.W8A16, target_soc="sm8550"), below(FLOAT_OUTPUTS)) != MIXED, \
        "w8a16 has every activation at 16 bits already"
    fp16 = req(target_soc="sm8550", precision=Precision.FP16)
    assert next_remedy(fp16, below()) == "pass:avgpool_exclude_pad+flatten_matmul_input", \
        "fp16: the exact rewrites around backend defects"
    assert next_remedy(fp16, below("pass:avgpool_exclude_pad+flatten_matmul_input")) is None, "then fp16 has nothing to give"
    assert next_remedy(req(output=OutputKind.ORT, precision=Precision.FP16), below()) is None, "no HTP, no HTP defect"
    assert next_remedy(req(calibration="input/c.npz", precision_fallback=True, **INT8_CTX),
                       below(FLOAT_OUTPUTS, MIXED, W8A16)) is None, \
        "real calibration data: more synthetic samples would not help"
    assert next_remedy(r, below(kind="offload")) is None, "nodes on the CPU: a precision change keeps them there"


def offload(*cpu_ops: str, remedies: tuple[str, ...] = ()) -> PlanFeedback:
    from contracts.convert_job import OffloadReport

    report = OffloadReport(nodes_total=10, context_nodes=2, cpu_nodes=len(cpu_ops), cpu_ops=sorted(cpu_ops))
    return PlanFeedback(kind="offload", remedies=list(remedies), offload=report, min_cosine=0.95)


def test_a_placement_failure_gets_the_graph_pass_for_its_op_never_w8a16():
    r = req(**INT8_CTX)
    assert next_remedy(r, offload("Erf", "QuantizeLinear", "DequantizeLinear")) == "pass:gelu_fusion"
    assert next_remedy(r, offload("Erf", "GatherND")) == "pass:gelu_fusion+gathernd_to_gather", "one replan for both"
    assert next_remedy(r, offload("Erf", remedies=("pass:gelu_fusion",))) is None, "a pass is not applied twice"
    assert next_remedy(r, offload("Det")) is None, "no pass rewrites Det, and w8a16 would leave it on the CPU"
    compile_failure = PlanFeedback(kind="compile", code="QUANT_SCALE_INVALID")
    assert next_remedy(r, compile_failure) == "pass:clamp_mask_constants"
    assert next_remedy(r, PlanFeedback(kind="compile", failing_ops=["AveragePool"], code="UNSUPPORTED_OP")) \
        == "pass:avgpool_to_global"


def test_a_pass_remedy_puts_a_graph_passes_step_before_quantization_and_keeps_the_original_as_reference(ws: Path):
    plan = plan_offline(req(**INT8_CTX), model_ref(), default_registry(), remedy=offload("Erf", "GatherND"))
    passes, quant, ctx = plan.steps
    assert passes.tool_name == "onnx.graph_passes" and passes.required_args["passes"] == ["gelu_fusion", "gathernd_to_gather"]
    assert quant.required_args["model"] == passes.required_args["output"] and quant.depends_on == [passes.step_id]
    assert plan.intent["reference"] == "input/tiny.onnx", "the evaluation judges the passes too"
    assert "graph pass(es) gelu_fusion, gathernd_to_gather" in plan.rationale


def test_each_remedy_changes_the_plan_and_the_plan_says_which(ws: Path):
    r = req(precision_fallback=True, **INT8_CTX)
    first = plan_offline(r, model_ref(), default_registry(), remedy=below(outputs={"prob": 0.0, "feat": 0.99}))
    quant, ctx = first.steps
    assert quant.optional_args["float_outputs"] == ["prob"], "only the failing output stays in float"
    assert plan_remedies(first) == ([FLOAT_OUTPUTS], ["prob"], []) and first.intent["precision"] == "int8"

    fb = below(FLOAT_OUTPUTS).model_copy(update={"float_outputs": ["prob"]})
    mixed = plan_offline(r, model_ref(), default_registry(), remedy=fb)
    quant, ctx = mixed.steps
    assert quant.required_args["precision"] == "int8" and quant.optional_args["mixed_precision"] is True
    assert quant.optional_args["min_cosine"] == 0.95 and quant.optional_args["float_outputs"] == ["prob"]
    assert plan_remedies(mixed)[0] == [FLOAT_OUTPUTS, MIXED] and mixed.intent["precision"] == "int8"

    fb = below(FLOAT_OUTPUTS, MIXED).model_copy(update={"float_outputs": ["prob"]})
    second = plan_offline(r, model_ref(), default_registry(), remedy=fb)
    quant, ctx = second.steps
    assert quant.required_args["precision"] == "w8a16" and ctx.optional_args["precision"] == "w8a16"
    assert "mixed_precision" not in quant.optional_args, "w8a16 has every activation at 16 bits"
    assert ctx.required_args["output"] == "converted/tiny_w8a16_sm8550_ctx.onnx", "named for what it is"
    assert quant.optional_args["float_outputs"] == ["prob"], "earlier remedies stay applied"
    assert second.intent["requested_precision"] == "int8" and second.intent["precision"] == "w8a16"

    third = plan_offline(r, model_ref(), default_registry(), remedy=below(FLOAT_OUTPUTS, MIXED, W8A16))
    assert third.steps[0].optional_args["calibration_samples"] == 32 and third.steps[0].optional_args["per_channel"] is True
    for plan in (first, mixed, second, third):
        assert compile_plan(plan, default_registry(), ws).ok


def test_calibration_data_reaches_the_qnn_quantizer_and_the_evaluation(ws: Path):
    (ws / "input" / "calibration_abc.npz").write_bytes(b"npz")
    plan = plan_offline(req(calibration="input/calibration_abc.npz", **INT8_CTX), model_ref(), default_registry())
    assert plan.steps[0].optional_args == {"calibration_data": "input/calibration_abc.npz"}
    assert plan.intent["calibration"] == "input/calibration_abc.npz" and plan_warnings(plan) == []
    assert compile_plan(plan, default_registry(), ws).ok
    fast = plan_offline(req(calibration="input/calibration_abc.npz", preset="fast", **INT8_CTX), model_ref(), default_registry())
    assert "calibration_samples" not in fast.steps[0].optional_args and compile_plan(fast, default_registry(), ws).ok


@pytest.mark.parametrize("kw, fragment", [
    ({"output": OutputKind.ORT, "precision": Precision.W8A16}, "not w8a16"),
    ({"output": OutputKind.ONNX_QDQ, "precision": Precision.FP16}, "needs --precision int8, w8a16 or w4a16"),
    ({"toolchain": Toolchain.ONNX}, "cannot build qnn_context_binary"),
])
def test_impossible_combinations_are_named_before_anything_runs(kw: dict, fragment: str):
    problems = request_problems(req(**({"precision": Precision.INT8} | kw)))
    assert len(problems) == 1 and fragment in problems[0]
    assert request_problems(req(**INT8_CTX)) == []


def test_a_remedy_that_could_not_run_is_dropped_and_not_tried_again():
    r = req(precision_fallback=True, **INT8_CTX)
    fb = below().model_copy(update={"failed": [FLOAT_OUTPUTS, MIXED],
                                    "float_outputs": ["prob"]})
    assert next_remedy(r, fb) == W8A16
    plan = plan_offline(r, model_ref(), default_registry(), remedy=fb)
    quant = plan.steps[0]
    assert quant.required_args["precision"] == "w8a16" and "float_outputs" not in quant.optional_args
    assert plan_remedies(plan) == ([W8A16], [], [FLOAT_OUTPUTS, MIXED])


def test_the_cli_says_whether_an_llm_planned_when_no_token_was_spent():
    """The demo printed 'tokens: 0 ... in 1 agent answer(s)' and nothing about who answered."""
    from client.cli.render import planner_line
    from contracts.agents import AgentProvenance, AnswerSource

    offline = planner_line(AgentProvenance(agent="planner", source=AnswerSource.OFFLINE))
    assert offline.startswith("planner: offline (the worker has no LLM") and "FLEETFORGE_LLM" in offline
    stood_in = planner_line(AgentProvenance(agent="planner", source=AnswerSource.FALLBACK, llm_answers=3,
                                            rejections=["a", "b", "c"], fallback_reason="no valid plan"))
    assert stood_in == "planner: fallback (3 LLM answer(s), 3 refused): no valid plan"
