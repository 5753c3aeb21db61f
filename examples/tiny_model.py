"""Build tiny, deterministic models as ONNX (seeded RNG: byte-identical across runs): a CNN, and an MLP
with an outlier activation (mixed precision's case).

    python -m examples.tiny_model out.onnx
"""

from __future__ import annotations

import argparse
from pathlib import Path


def build_tiny_cnn(path: Path, *, seed: int = 0, opset: int = 17) -> Path:
    """Conv(3→8, 3x3) → Relu → Conv(8→8, 3x3) → Relu → GlobalAveragePool → Flatten → Gemm(8→10)."""
    import numpy as np
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(seed)

    def init(name: str, shape: tuple[int, ...], scale: float = 0.2) -> onnx.TensorProto:
        return numpy_helper.from_array((rng.standard_normal(shape) * scale).astype(np.float32), name)

    inits = [
        init("w1", (8, 3, 3, 3)), init("b1", (8,), 0.05),
        init("w2", (8, 8, 3, 3)), init("b2", (8,), 0.05),
        init("w3", (10, 8)), init("b3", (10,), 0.05),
    ]
    nodes = [
        helper.make_node("Conv", ["input", "w1", "b1"], ["c1"], pads=[1, 1, 1, 1]),
        helper.make_node("Relu", ["c1"], ["r1"]),
        helper.make_node("Conv", ["r1", "w2", "b2"], ["c2"], pads=[1, 1, 1, 1]),
        helper.make_node("Relu", ["c2"], ["r2"]),
        helper.make_node("GlobalAveragePool", ["r2"], ["gap"]),
        helper.make_node("Flatten", ["gap"], ["flat"]),
        helper.make_node("Gemm", ["flat", "w3", "b3"], ["logits"], transB=1),
    ]
    graph = helper.make_graph(
        nodes, "tiny_cnn",
        [helper.make_tensor_value_info("input", TensorProto.FLOAT, [1, 3, 32, 32])],
        [helper.make_tensor_value_info("logits", TensorProto.FLOAT, [1, 10])],
        initializer=inits,
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)], producer_name="fleetforge-examples")
    model.ir_version = 8
    onnx.checker.check_model(model)
    path.parent.mkdir(parents=True, exist_ok=True)
    onnx.save(model, str(path))
    return path


def build_outlier_mlp(path: Path, *, seed: int = 0, offset: float = 300.0) -> Path:
    """An MLP whose hidden activation carries one outlier channel (an offset of `offset` where its neighbours
    are about 1), taken off again before the next layer, as the outlier features of trained transformers
    cancel downstream: fp32 does not mind, 8-bit activations spend their range on the outlier and round
    the other channels away, 16 bits keep them (what mixed precision is for).
    x[4, 16] → MatMul+Add → Relu → MatMul+Add → Add(offset) → Sub(offset) → MatMul+Add → Relu → MatMul+Add."""
    import numpy as np
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(seed)

    def init(name: str, shape: tuple[int, ...]) -> onnx.TensorProto:
        return numpy_helper.from_array((rng.standard_normal(shape) / np.sqrt(shape[0])).astype(np.float32), name)

    spike = np.zeros(32, np.float32)
    spike[3] = offset
    inits = [init("w1", (16, 32)), init("b1", (32,)), init("w2", (32, 32)),
             init("b2", (32,)), init("w3", (32, 32)), init("b3", (32,)), init("w4", (32, 10)), init("b4", (10,)),
             numpy_helper.from_array(spike, "spike")]
    nodes = [
        helper.make_node("MatMul", ["x", "w1"], ["m1"], name="fc1"), helper.make_node("Add", ["m1", "b1"], ["h1"], name="fc1_bias"),
        helper.make_node("Relu", ["h1"], ["r1"], name="act1"),
        helper.make_node("MatMul", ["r1", "w2"], ["m2"], name="fc2"), helper.make_node("Add", ["m2", "b2"], ["h2"], name="fc2_bias"),
        helper.make_node("Add", ["h2", "spike"], ["outlier"], name="outlier"),
        helper.make_node("Sub", ["outlier", "spike"], ["back"], name="cancel"),
        helper.make_node("MatMul", ["back", "w3"], ["m3"], name="fc3"), helper.make_node("Add", ["m3", "b3"], ["h3"], name="fc3_bias"),
        helper.make_node("Relu", ["h3"], ["r3"], name="act3"),
        helper.make_node("MatMul", ["r3", "w4"], ["m4"], name="head"), helper.make_node("Add", ["m4", "b4"], ["y"], name="head_bias"),
    ]
    graph = helper.make_graph(nodes, "outlier_mlp", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [4, 16])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [4, 10])], initializer=inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], producer_name="fleetforge-examples")
    model.ir_version = 8
    onnx.checker.check_model(model)
    path.parent.mkdir(parents=True, exist_ok=True)
    onnx.save(model, str(path))
    return path


def main() -> None:
    ap = argparse.ArgumentParser(description="Write a tiny CNN (input `input`: 1x3x32x32, output `logits`) as ONNX.")
    ap.add_argument("out", nargs="?", default="tiny_cnn.onnx", type=Path, help="where to write it")
    print(build_tiny_cnn(ap.parse_args().out))


if __name__ == "__main__":
    main()
