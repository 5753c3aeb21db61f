"""int8 Conv weights as the HTP computes them: signed, symmetric, one scale per output channel. With the
quantizer's default (unsigned 8-bit, asymmetric, one scale per tensor) the HTP's result strayed from what
the same QDQ model computes on the CPU, which the gate and the mixed-precision search read (a trained
MobileNetV2: 0.9418 on the HTP, 0.9768 on the CPU)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from examples.tiny_model import build_tiny_cnn

onnx = pytest.importorskip("onnx")
ort = pytest.importorskip("onnxruntime")


def test_int8_conv_weights_are_signed_symmetric_per_channel_and_the_htp_runs_them_as_the_cpu_does(tmp_path: Path):
    pytest.importorskip("onnxruntime_qnn")
    from onnx import numpy_helper

    from activities.toolchains.ort_qnn import ContextBinaryParams, QuantizeQdqParams, context_binary, quantize_qdq
    from activities.toolchains.qnn_ep import qnn_session

    build_tiny_cnn(tmp_path / "cnn.onnx")
    rng = np.random.default_rng(3)
    np.savez(tmp_path / "calib.npz", input=rng.standard_normal((16, 1, 3, 32, 32)).astype(np.float32))
    quantize_qdq(tmp_path, QuantizeQdqParams(model="cnn.onnx", output="q.onnx", precision="int8", calibration_data="calib.npz"))
    q = onnx.load(str(tmp_path / "q.onnx"))
    inits = {i.name: numpy_helper.to_array(i) for i in q.graph.initializer}
    producer = {o: n for n in q.graph.node for o in n.output}

    def weight(node: "onnx.NodeProto") -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        dq = producer[node.input[1]]
        assert dq.op_type == "DequantizeLinear"
        return inits[dq.input[0]], inits[dq.input[1]], inits[dq.input[2]]

    convs = [n for n in q.graph.node if n.op_type == "Conv"]
    assert len(convs) == 2
    for conv in convs:
        data, scale, zero = weight(conv)
        assert data.dtype == np.int8 and not zero.any(), "signed and symmetric"
        assert scale.shape == (data.shape[0],), "one scale per output channel"
    gemm_data, _, _ = weight(next(n for n in q.graph.node if n.op_type == "Gemm"))
    assert gemm_data.dtype == np.uint8, "the other weights as before"

    out = context_binary(tmp_path, ContextBinaryParams(model="q.onnx", soc="sm8550", output="ctx/q_ctx.onnx", precision="int8"))
    assert out.details["offload"]["cpu_nodes"] == 0
    cpu = ort.InferenceSession(str(tmp_path / "q.onnx"), providers=["CPUExecutionProvider"])
    htp = qnn_session(tmp_path / "ctx/q_ctx.onnx", {"backend_type": "htp"})
    for x in rng.standard_normal((8, 1, 3, 32, 32)).astype(np.float32):
        a, b = (s.run(None, {"input": x})[0].ravel().astype(np.float64) for s in (cpu, htp))
        assert float(a @ b / np.linalg.norm(a) / np.linalg.norm(b)) > 0.999


def test_below_opset_13_conv_weights_keep_the_default_and_the_model_still_compiles(tmp_path: Path):
    """Per-channel Q/DQ needs `axis`, which opset 13 introduced: an opset-11 model (the onnx model zoo's
    SqueezeNet) with per-channel weights was an invalid model the HTP compile refused."""
    pytest.importorskip("onnxruntime_qnn")
    from onnx import numpy_helper

    from activities.toolchains.ort_qnn import ContextBinaryParams, QuantizeQdqParams, context_binary, quantize_qdq

    build_tiny_cnn(tmp_path / "cnn.onnx", opset=11)
    rng = np.random.default_rng(3)
    np.savez(tmp_path / "calib.npz", input=rng.standard_normal((8, 1, 3, 32, 32)).astype(np.float32))
    quantize_qdq(tmp_path, QuantizeQdqParams(model="cnn.onnx", output="q.onnx", precision="int8", calibration_data="calib.npz"))
    q = onnx.load(str(tmp_path / "q.onnx"))
    weights = {i.name: numpy_helper.to_array(i) for i in q.graph.initializer}
    conv_weights = [n.input[1] for n in q.graph.node if n.op_type == "Conv"]
    producer = {o: n for n in q.graph.node for o in n.output}
    assert all(weights[producer[w].input[0]].dtype == np.uint8 for w in conv_weights)
    out = context_binary(tmp_path, ContextBinaryParams(model="q.onnx", soc="sm8550", output="ctx/q_ctx.onnx", precision="int8"))
    assert out.details["offload"]["cpu_nodes"] == 0
