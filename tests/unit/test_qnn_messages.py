"""What the QNN toolchain's failures say: the op an HTP compile error names, and light (IR 3) models
whose folded constants must stay valid for the quantizer."""

from __future__ import annotations

from pathlib import Path

import onnx
import pytest

from activities.toolchains.ort_qnn import failing_op
from activities.toolchains.qdq_prep import decompose_batchnorm, prepare

LIGHT = Path(onnx.__file__).parent / "backend" / "test" / "data" / "light"


@pytest.mark.parametrize("message, op", [
    ("Node 'n2_token_7' OpType:LRN with domain:com.ms.internal.nhwc was inserted using the NHWC format", "LRN"),
    ("QNN node validation failed: op_type=GridSample unsupported", "GridSample"),
    ("graph finalize failed", None),
])
def test_an_htp_compile_error_names_its_op_when_it_can(message: str, op: str | None):
    assert failing_op(message) == op


def test_a_light_models_prepared_copy_keeps_every_input_it_declares(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    monkeypatch.chdir(tmp_path)  # onnxruntime's symbolic shape inference may drop a debug model into the cwd
    prepared = prepare(LIGHT / "light_squeezenet.onnx", tmp_path / "q.onnx")
    m = onnx.load(str(prepared))
    inits = {i.name for i in m.graph.initializer}
    assert [i.name for i in m.graph.input if i.name not in inits] == ["data_0"]
    assert m.ir_version >= 4 and "Dropout" not in {n.op_type for n in m.graph.node}
    assert all(n.name for n in m.graph.node), "nodes are named (the quantizer excludes nodes by name)"
    onnx.checker.check_model(m)


def test_a_standalone_batchnorm_becomes_a_per_channel_mul_and_add_with_the_same_output():
    import numpy as np
    import onnxruntime as ort
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(0)
    params = [numpy_helper.from_array(a.astype(np.float32), n) for n, a in (
        ("g", rng.uniform(0.5, 2, 4)), ("b", rng.standard_normal(4)), ("mu", rng.standard_normal(4)), ("v", rng.uniform(0.5, 2, 4)))]
    node = helper.make_node("BatchNormalization", ["x", "g", "b", "mu", "v"], ["y"], epsilon=1e-3)
    g = helper.make_graph([node], "bn", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 4, 3, 3])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 4, 3, 3])], initializer=params)
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    m.ir_version = 8
    x = rng.standard_normal((2, 4, 3, 3)).astype(np.float32)
    before = ort.InferenceSession(m.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]
    assert decompose_batchnorm(m) == 1 and [n.op_type for n in m.graph.node] == ["Mul", "Add"]
    after = ort.InferenceSession(m.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]
    assert np.allclose(before, after, atol=1e-5)
