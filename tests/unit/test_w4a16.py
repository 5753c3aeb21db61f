"""w4a16 (4-bit per-channel MatMul weights, 16-bit activations): the plan, the delivered precision, and a
decoder MLP quantized and compiled for the HTP, its 4-bit MatMuls inside the context binary."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from activities.toolchains.offline_planner import plan_offline, request_problems
from activities.toolchains.registry import default_registry
from contracts.common import ArtifactRef
from contracts.convert import CompiledStep, OutputKind, Precision
from contracts.convert_job import ConversionRequest
from contracts.errors import Err
from contracts.models import ModelFormat, ModelRef
from workflows.converter_policy import delivered_precision, failure_hint, min_cosine_for

torch = pytest.importorskip("torch")
onnx = pytest.importorskip("onnx")
ort = pytest.importorskip("onnxruntime")

W4 = ConversionRequest(model="d.onnx", target_soc="sm8550", precision=Precision.W4A16, calibration="input/c.npz")


def test_a_w4a16_plan_quantizes_and_compiles_at_w4a16_and_delivers_it():
    sha = "0" * 64
    ref = ModelRef(name="d", source="/hub/d.onnx", format=ModelFormat.ONNX, sha256=sha, size=1, filename="d.onnx",
                   artifact=ArtifactRef(uri=f"file:///blobs/{sha}", sha256=sha, size=1, name="d.onnx"))
    plan = plan_offline(W4, ref, default_registry())
    quant, ctx = plan.steps
    assert quant.tool_name == "ortqnn.quantize_qdq" and quant.required_args["precision"] == "w4a16"
    assert ctx.optional_args["precision"] == "w4a16" and ctx.required_args["output"].endswith("_w4a16_sm8550_ctx.onnx")
    steps = [CompiledStep(step_id=s.step_id, tool_name=s.tool_name, tool_version="1.0", params=s.required_args | s.optional_args)
             for s in plan.steps]
    assert delivered_precision(steps, Precision.W4A16) is Precision.W4A16
    assert min_cosine_for(W4) == 0.9
    assert request_problems(W4.model_copy(update={"output": OutputKind.ORT})), "ORT format has no w4a16"
    assert "--precision w8a16" in failure_hint(Err.NOT_FULLY_OFFLOADED, W4)


class DecoderMlp(torch.nn.Module):
    """A decoder block's MLP as LLaMA has it: SiLU-gated up projection, down projection."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.gate, self.up, self.down = (torch.nn.Linear(32, 64, bias=False), torch.nn.Linear(32, 64, bias=False),
                                         torch.nn.Linear(64, 32, bias=False))

    def forward(self, x):
        return self.down(torch.nn.functional.silu(self.gate(x)) * self.up(x))


def test_a_decoder_mlp_at_w4a16_has_4_bit_weights_16_bit_activations_and_runs_inside_the_htp(tmp_path: Path):
    pytest.importorskip("onnxruntime_qnn")
    from activities.toolchains.ort_qnn import ContextBinaryParams, QuantizeQdqParams, context_binary, quantize_qdq
    from activities.toolchains.qnn_ep import qnn_session

    rng = np.random.default_rng(0)
    calib, held_out = (rng.standard_normal((n, 1, 8, 32)).astype(np.float32) for n in (32, 16))
    torch.onnx.export(DecoderMlp().eval(), (torch.from_numpy(calib[0]),), str(tmp_path / "d.onnx"), input_names=["x"])
    np.savez(tmp_path / "calib.npz", x=calib)
    out = quantize_qdq(tmp_path, QuantizeQdqParams(model="d.onnx", output="w4.onnx", precision="w4a16", calibration_data="calib.npz"))
    assert out.details["int4_weights"] == 3 and out.details["activation_type"] == "QUInt16"
    q = onnx.load(str(tmp_path / "w4.onnx"))
    assert {i.data_type for i in q.graph.initializer if i.data_type in (21, 22)} == {22}, "signed int4 weights"
    ctx = context_binary(tmp_path, ContextBinaryParams(model="w4.onnx", soc="sm8550", output="ctx/d_ctx.onnx", precision="w4a16"))
    assert ctx.details["offload"]["cpu_nodes"] == 0, ctx.details["offload"]
    fp32 = ort.InferenceSession(str(tmp_path / "d.onnx"), providers=["CPUExecutionProvider"])
    htp = qnn_session(tmp_path / "ctx/d_ctx.onnx", {"backend_type": "htp"})
    cosines = []
    for x in held_out:
        a, b = (s.run(None, {"x": x})[0].ravel().astype(np.float64) for s in (fp32, htp))
        cosines.append(float(a @ b / np.linalg.norm(a) / np.linalg.norm(b)))
    assert min(cosines) >= min_cosine_for(W4), min(cosines)
