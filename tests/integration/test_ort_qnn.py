"""Real compiles with onnxruntime-qnn: tiny CNN → SM8550 HTP context binaries (int8 and fp16),
checked for target, determinism and numerical agreement with the fp32 model (HTP emulation)."""

from __future__ import annotations

import hashlib
from pathlib import Path

import pytest

pytest.importorskip("onnxruntime_qnn")

from activities.toolchains.compiler import compile_plan
from activities.toolchains.evaluate import EvalParams, evaluate
from activities.toolchains.ort_qnn import (ContextBinaryParams, QuantizeQdqParams, context_binary,
                                           context_binary_target, epcontext_attributes, quantize_qdq)
from activities.toolchains.registry import default_registry
from activities.toolchains.steps import run_step
from contracts.convert_job import OffloadReport
from examples.tiny_model import build_tiny_cnn


def _sha(p: Path) -> str:
    return hashlib.sha256(p.read_bytes()).hexdigest()


@pytest.fixture
def ws(tmp_path: Path) -> Path:
    build_tiny_cnn(tmp_path / "input" / "tiny.onnx")
    return tmp_path


def _int8_sm8550(root: Path) -> tuple[Path, Path]:
    quantize_qdq(root, QuantizeQdqParams(model="input/tiny.onnx", output="converted/tiny_qdq.onnx", precision="int8"))
    out = context_binary(root, ContextBinaryParams(model="converted/tiny_qdq.onnx", soc="sm8550",
                                                   output="converted/tiny_ctx.onnx", precision="int8"))
    assert out.outputs == ["converted/tiny_ctx.onnx", "converted/tiny_ctx_qnn.bin"]
    assert out.details["htp_arch"] == 73 and out.details["soc_model"] == 43
    offload = OffloadReport.model_validate(out.details["offload"])
    # the QDQ model's float interface (its input's QuantizeLinear, its output's DequantizeLinear) stays on the CPU
    assert (offload.io_nodes, offload.cpu_nodes, offload.share) == (2, 0, 1.0), offload
    assert offload.model_nodes == offload.nodes_total - 2
    return root / "converted/tiny_ctx.onnx", root / "converted/tiny_ctx_qnn.bin"


def test_int8_sm8550_context_binary_targets_sm8550_and_is_deterministic(ws: Path, tmp_path_factory: pytest.TempPathFactory) -> None:
    ctx, binary = _int8_sm8550(ws)
    assert binary.stat().st_size > 1000
    attrs = epcontext_attributes(ctx)
    assert attrs["source"] == "QNNExecutionProvider"
    assert attrs["ep_cache_context"] == "tiny_ctx_qnn.bin" and attrs["embed_mode"] == 0
    assert context_binary_target(binary) == {"soc_type": "SM8550", "arch": "73"}

    other = tmp_path_factory.mktemp("again")
    build_tiny_cnn(other / "input" / "tiny.onnx")
    ctx2, binary2 = _int8_sm8550(other)
    assert _sha(binary2) == _sha(binary) and _sha(ctx2) == _sha(ctx)

    report = evaluate(ws, EvalParams(reference="input/tiny.onnx", candidate="converted/tiny_ctx.onnx"))
    assert report.candidate_provider == "QNNExecutionProvider"
    assert report.cosine > 0.9, report
    print(f"\nint8 SM8550: {report}")


def test_fp16_context_binary_per_soc_and_close_to_fp32(ws: Path) -> None:
    out = context_binary(ws, ContextBinaryParams(model="input/tiny.onnx", soc="SM8650", output="converted/fp16_ctx.onnx"))
    assert context_binary_target(ws / "converted/fp16_ctx_qnn.bin") == {"soc_type": "SM8650", "arch": "75"}
    assert OffloadReport.model_validate(out.details["offload"]).io_nodes == 0, "a float model has no boundary conversions"
    report = evaluate(ws, EvalParams(reference="input/tiny.onnx", candidate="converted/fp16_ctx.onnx"))
    assert report.cosine > 0.999 and report.max_abs < 1e-2, report
    print(f"\nfp16 SM8650: compile {out.seconds:.2f}s, {report}")


def test_compiled_plan_runs_end_to_end_with_dlc(ws: Path) -> None:
    plan = {
        "status": "OK", "intent": {"target_soc": "sm8550", "precision": "int8"}, "rationale": "QDQ then HTP context",
        "steps": [
            {"step_id": "ctx", "tool_name": "ortqnn.context_binary", "depends_on": ["quant"],
             "required_args": {"model": "converted/q.onnx", "soc": "sm8550", "output": "converted/model_ctx.onnx"},
             "optional_args": {"precision": "int8", "dump_dlc": True, "dlc_dir": "converted/dlc"},
             "expected_outputs": ["converted/model_ctx_qnn.bin"]},
            {"step_id": "quant", "tool_name": "ortqnn.quantize_qdq",
             "required_args": {"model": "input/tiny.onnx", "output": "converted/q.onnx", "precision": "int8"}},
        ],
    }
    result = compile_plan(plan, default_registry(), ws)
    assert result.ok, result.feedback()
    written = []
    for step in result.steps:
        written += run_step(step, ws).outputs
    assert "converted/model_ctx_qnn.bin" in written
    dlcs = [w for w in written if w.endswith(".dlc")]
    assert dlcs and all(w.startswith("converted/dlc/") for w in dlcs)
    assert (ws / dlcs[0]).stat().st_size > 0


def test_onnx_toolchain_steps_run_and_stay_close_to_fp32(ws: Path) -> None:
    plan = {"status": "OK", "steps": [
        {"step_id": "fp16", "tool_name": "onnx.fp16", "required_args": {"model": "input/tiny.onnx", "output": "converted/fp16.onnx"}},
        {"step_id": "dyn", "tool_name": "onnx.quantize_dynamic", "required_args": {"model": "input/tiny.onnx", "output": "converted/dyn.onnx"}},
        {"step_id": "static", "tool_name": "onnx.quantize_static",
         "required_args": {"model": "input/tiny.onnx", "output": "converted/static.onnx"}, "optional_args": {"calibration_samples": 4}},
        {"step_id": "ort", "tool_name": "onnx.to_ort", "depends_on": ["static"],
         "required_args": {"model": "converted/static.onnx", "output": "converted/static.ort"}},
    ]}
    result = compile_plan(plan, default_registry(), ws)
    assert result.ok, result.feedback()
    for step in result.steps:
        assert run_step(step, ws).outputs == [step.params["output"]]
    import onnx

    assert onnx.load(str(ws / "converted/fp16.onnx")).graph.initializer[0].data_type == onnx.TensorProto.FLOAT16
    assert any(n.op_type == "QuantizeLinear" for n in onnx.load(str(ws / "converted/static.onnx")).graph.node)
    assert (ws / "converted/static.ort").read_bytes()[4:8] == b"ORTM"  # flatbuffer file identifier
    for cand, floor in (("converted/fp16.onnx", 0.999), ("converted/static.onnx", 0.95), ("converted/static.ort", 0.95)):
        report = evaluate(ws, EvalParams(reference="input/tiny.onnx", candidate=cand))
        assert report.candidate_provider == "CPUExecutionProvider" and report.cosine > floor, (cand, report)


def test_context_binary_failures_are_structured(ws: Path) -> None:
    from contracts.errors import Err, FleetforgeError

    with pytest.raises(FleetforgeError) as bad_soc:
        context_binary(ws, ContextBinaryParams(model="input/tiny.onnx", soc="sm1234", output="converted/x.onnx"))
    assert bad_soc.value.code is Err.BAD_INPUT and "SM8550" in bad_soc.value.message
    (ws / "input" / "garbage.onnx").write_bytes(b"not a model")
    with pytest.raises(FleetforgeError) as broken:  # raised in the compiler child, carried back as code + message
        context_binary(ws, ContextBinaryParams(model="input/garbage.onnx", soc="sm8550", output="converted/g.onnx"))
    assert broken.value.code is Err.EXECUTOR_ERROR and "input/garbage.onnx" in broken.value.message
    assert not (ws / "converted" / "g_qnn.bin").exists()


def test_int8_context_binary_needs_a_qdq_model(ws: Path) -> None:
    from contracts.errors import Err, FleetforgeError

    with pytest.raises(FleetforgeError) as e:
        context_binary(ws, ContextBinaryParams(model="input/tiny.onnx", soc="sm8550", output="converted/x.onnx", precision="int8"))
    assert e.value.code is Err.BAD_INPUT and "quantize_qdq" in e.value.message
