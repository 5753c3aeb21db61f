"""The model as the QNN quantizer should see it (a copy next to the quantizer's output).

1. onnxruntime's quantization pre-processing: shape inference, then graph optimization, which folds
   constants and drops inference no-ops such as Dropout (the HTP backend would leave them on the CPU);
2. a BatchNormalization that no Conv absorbed (a pre-activation block: BN → ReLU → Conv) becomes a
   per-channel Mul and Add: the HTP backend runs those quantized, a quantized BatchNormalization it
   leaves on the CPU;
3. initializers listed as graph inputs (IR 3) made constants, so the HTP backend sees static weights;
   nodes named (the quantizer excludes nodes by name);
4. each Reciprocal of a Sqrt (RMSNorm's rsqrt) a Div of 1 (graph pass `rsqrt_to_div`, exact): the HTP
   computes the quantized form wrongly inside a decoder (a small LLaMA at int8: 0.42 -> 0.987);
5. each Gelu output typed again (graph_passes.type_gelu_outputs): the pre-processing's transpose optimizer
   cancels the Transpose pair around a fused Gelu (Data2Vec-audio's conv layers: LayerNorm -> Transpose ->
   Gelu -> Transpose -> LayerNorm) under a new output name, which its onnx shape inference cannot type
   (com.microsoft Gelu); the QDQ quantizer skips an untyped tensor and then fails on the next bias.

If pre-processing changed what the model takes as inputs, the model is quantized as it was given.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any


def prepare(src: Path, dst: Path) -> Path:
    """Write the prepared model next to `dst` and return its path (the caller deletes it)."""
    import onnx
    from onnxruntime.quantization.shape_inference import quant_pre_process

    prepared = dst.with_name(dst.stem + ".prepared.onnx")
    prepared.parent.mkdir(parents=True, exist_ok=True)
    try:
        quant_pre_process(str(src), str(prepared))
    except Exception:  # symbolic shape inference fails on some graphs; the rest still helps
        try:
            quant_pre_process(str(src), str(prepared), skip_symbolic_shape=True)
        except Exception:  # as given, with any external data (m.onnx.data) read in: the copy sits elsewhere
            onnx.save(onnx.load(str(src)), str(prepared))
    m = onnx.load(str(prepared))
    used = {name for node in m.graph.node for name in node.input} | {o.name for o in m.graph.output}
    inits = {i.name for i in m.graph.initializer}
    # an initializer listed as a graph input (IR 3 requires it) is an overridable input to onnxruntime,
    # not a constant: the QNN EP then leaves the ops that read it (BatchNormalization, ...) on the CPU.
    # Nobody feeds them, so they become plain constants (IR 4); inputs of folded-away constants go.
    for vi in [vi for vi in m.graph.input if vi.name in inits or vi.name not in used]:
        m.graph.input.remove(vi)
    m.ir_version = max(m.ir_version, 4)
    if feed_names(m) != feed_names(onnx.load(str(src), load_external_data=False)):
        m = onnx.load(str(src))  # the pre-processing changed what the model takes: quantize it as it is
    decompose_batchnorm(m)
    from activities.toolchains.graph_passes import PASSES, PassContext, type_gelu_outputs

    PASSES["rsqrt_to_div"].apply(m, PassContext())
    type_gelu_outputs(m)
    for i, node in enumerate(m.graph.node):
        if not node.name:
            node.name = f"fleetforge_node_{i}"
    onnx.save(m, str(prepared))
    return prepared


def feed_names(m: Any) -> list[str]:
    inits = {i.name for i in m.graph.initializer}
    return [i.name for i in m.graph.input if i.name not in inits]


def decompose_batchnorm(m: Any) -> int:
    """Rewrite each inference BatchNormalization with constant parameters and a known input rank as
    `x * s + t` (s = scale / sqrt(var + eps), t = B - mean * s, shaped [C, 1, ...]); returns how many."""
    import numpy as np
    import onnx
    from onnx import helper, numpy_helper

    inits = {i.name: i for i in m.graph.initializer}
    ranks = {v.name: len(v.type.tensor_type.shape.dim) for v in [*m.graph.input, *m.graph.value_info, *m.graph.output]
             if v.type.tensor_type.HasField("shape")}
    nodes, done = [], 0
    for node in m.graph.node:
        params = node.input[1:5]
        training = any(a.name == "training_mode" and onnx.helper.get_attribute_value(a) for a in node.attribute)
        if (node.op_type != "BatchNormalization" or len(node.output) != 1 or training or len(params) != 4
                or not all(p in inits for p in params) or ranks.get(node.input[0], 0) < 2):
            nodes.append(node)
            continue
        scale, bias, mean, var = (numpy_helper.to_array(inits[p]).astype(np.float64) for p in params)
        eps = next((onnx.helper.get_attribute_value(a) for a in node.attribute if a.name == "epsilon"), 1e-5)
        s = scale / np.sqrt(var + eps)
        t = bias - mean * s
        shape = (-1,) + (1,) * (ranks[node.input[0]] - 2)
        stem = f"{node.name or node.output[0]}_bn"
        m.graph.initializer.extend([numpy_helper.from_array(s.reshape(shape).astype(np.float32), f"{stem}_scale"),
                                    numpy_helper.from_array(t.reshape(shape).astype(np.float32), f"{stem}_shift")])
        nodes += [helper.make_node("Mul", [node.input[0], f"{stem}_scale"], [f"{stem}_scaled"], name=f"{stem}_mul"),
                  helper.make_node("Add", [f"{stem}_scaled", f"{stem}_shift"], [node.output[0]], name=f"{stem}_add")]
        done += 1
    if done:
        del m.graph.node[:]
        m.graph.node.extend(nodes)
    return done
