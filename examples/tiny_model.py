"""Build a tiny, deterministic CNN as ONNX (seeded RNG: byte-identical across runs).

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


def main() -> None:
    ap = argparse.ArgumentParser(description="Write a tiny CNN (input `input`: 1x3x32x32, output `logits`) as ONNX.")
    ap.add_argument("out", nargs="?", default="tiny_cnn.onnx", type=Path, help="where to write it")
    print(build_tiny_cnn(ap.parse_args().out))


if __name__ == "__main__":
    main()
