"""Build tiny, deterministic models as ONNX (seeded RNG: byte-identical across runs): a CNN, and an MLP
and a Vision Transformer with an outlier activation (mixed precision's case).

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


def build_outlier_vit(path: Path, *, seed: int = 0, offset: float = 1000.0, dim: int = 32) -> Path:
    """A two-block Vision Transformer whose residual stream carries one outlier channel (an offset of
    `offset` on one hidden channel added at the end of block 1, taken off again as block 2 starts; its
    neighbours are about 1, at most about 4, and 300 still left all-int8 at cosine 0.974), as the massive
    activations of trained ViTs sit in a few residual channels: what build_outlier_mlp shows for an
    MLP, with a transformer's ops around it (patch Conv, LayerNormalization, MatMul/Softmax attention, an
    Erf GELU, residual Adds, mean pool). Built with onnx.helper, not exported from torch, so no torch is
    needed and the node names are stable.
    x[1, 3, 16, 16] → Conv 4x4/4 (16 patches of `dim`) → +pos → 2 x (LN → attention → +, LN → MLP → +) →
    LN → mean over patches → MatMul+Add → y[1, 10]."""
    import numpy as np
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(seed)
    inits: list[onnx.TensorProto] = []
    nodes: list[onnx.NodeProto] = []

    def init(name: str, shape: tuple[int, ...], scale: float | None = None) -> str:
        fan_in = int(np.prod(shape[1:])) if len(shape) == 4 else shape[0]
        w = rng.standard_normal(shape) * (scale if scale is not None else 1 / np.sqrt(fan_in))
        inits.append(numpy_helper.from_array(w.astype(np.float32), name))
        return name

    def const(name: str, value: np.ndarray) -> str:
        inits.append(numpy_helper.from_array(np.asarray(value), name))
        return name

    def node(op: str, inputs: list[str], name: str, **attrs: object) -> str:
        nodes.append(helper.make_node(op, inputs, [name], name=name, **attrs))
        return name

    def dense(x: str, name: str, n_in: int, n_out: int) -> str:
        return node("Add", [node("MatMul", [x, init(f"{name}_w", (n_in, n_out))], name), init(f"{name}_b", (n_out,), 0.02)],
                    f"{name}_bias")

    def layer_norm(x: str, name: str) -> str:
        return node("LayerNormalization", [x, const(f"{name}_g", np.ones(dim, np.float32)),
                                           const(f"{name}_beta", np.zeros(dim, np.float32))], name, axis=-1)

    def block(x: str, i: int) -> str:
        h = layer_norm(x, f"b{i}_ln1")
        q, k, v = (dense(h, f"b{i}_{t}", dim, dim) for t in "qkv")
        scores = node("Mul", [node("MatMul", [q, node("Transpose", [k], f"b{i}_kT", perm=[0, 2, 1])], f"b{i}_qk"),
                              const(f"b{i}_scale", np.array(1 / np.sqrt(dim), np.float32))], f"b{i}_scaled")
        attn = node("MatMul", [node("Softmax", [scores], f"b{i}_softmax", axis=-1), v], f"b{i}_attn")
        x = node("Add", [x, dense(attn, f"b{i}_proj", dim, dim)], f"b{i}_res1")
        h = dense(layer_norm(x, f"b{i}_ln2"), f"b{i}_fc1", dim, 2 * dim)
        erf = node("Erf", [node("Mul", [h, const(f"b{i}_rsqrt2", np.array(1 / np.sqrt(2), np.float32))], f"b{i}_gelu_in")],
                   f"b{i}_erf")
        half = node("Mul", [node("Add", [erf, const(f"b{i}_one", np.array(1, np.float32))], f"b{i}_gelu_1p"),
                            const(f"b{i}_half", np.array(0.5, np.float32))], f"b{i}_gelu_half")
        return node("Add", [x, dense(node("Mul", [h, half], f"b{i}_gelu"), f"b{i}_fc2", 2 * dim, dim)], f"b{i}_res2")

    spike = np.zeros(dim, np.float32)
    spike[3] = offset
    x = node("Conv", ["x", init("patch_w", (dim, 3, 4, 4)), init("patch_b", (dim,), 0.02)], "patch_embed",
             kernel_shape=[4, 4], strides=[4, 4])
    x = node("Transpose", [node("Reshape", [x, const("tokens_shape", np.array([1, dim, 16], np.int64))], "tokens")],
             "tokens_t", perm=[0, 2, 1])
    x = node("Add", [x, init("pos", (1, 16, dim), 0.02)], "pos_embed")
    x = node("Add", [block(x, 1), const("spike", spike)], "outlier")
    x = block(node("Sub", [x, "spike"], "cancel"), 2)
    pooled = node("ReduceMean", [layer_norm(x, "ln_f")], "pool", axes=[1], keepdims=0)
    dense(pooled, "head", dim, 10)
    nodes[-1].output[0] = "y"
    graph = helper.make_graph(nodes, "outlier_vit", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 16, 16])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 10])], initializer=inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], producer_name="fleetforge-examples")
    model.ir_version = 8
    onnx.checker.check_model(model, full_check=True)
    path.parent.mkdir(parents=True, exist_ok=True)
    onnx.save(model, str(path))
    return path


def main() -> None:
    ap = argparse.ArgumentParser(description="Write a tiny CNN (input `input`: 1x3x32x32, output `logits`) as ONNX.")
    ap.add_argument("out", nargs="?", default="tiny_cnn.onnx", type=Path, help="where to write it")
    print(build_tiny_cnn(ap.parse_args().out))


if __name__ == "__main__":
    main()
