"""Mixed precision by per-layer sensitivity: which few layers of an int8 QDQ model need 16-bit activations
for the model to reach the accuracy gate (the search AIMET's quantization analyzer and AI Hub's / Olive's
mixed-precision recipes run; here on onnxruntime's CPU, where a QDQ model computes as fake quantization).

1. Sensitivity: a probe all-int8 model is calibrated on every other calibration sample and measured on
   the others (`probe_split`: on its own calibration samples a model shows no clipping error, where the
   gate's held-out samples do). Each layer's output rounding is undone alone in the probe model (its
   DequantizeLinear made a Clip of the float tensor to the quantized range: float within the same range
   stands in for 16 bits, whose step is 256 times finer) and the outputs are compared with the fp32
   model's. What that layer alone gives back (the mean per-sample cosine of the worst output, against the
   all-int8 probe's) is its contribution to the error.
2. Selection (`fewest_layers`): layers in order of contribution; the smallest k whose top k together
   reach the target, found by doubling then bisection (about 2 log2 N measurements, each a real run).
   The target sits between the gate's threshold and 1 (`search_target`): a margin for the HTP's own
   arithmetic and for samples the search never saw. Where the all-int8 model already reaches it on the CPU
   (the HTP's arithmetic missed the gate, not the simulated one), the target halves the error that 16-bit
   activations take away here (every layer at 16 bits shows how much: the 8-bit weights keep the rest).
3. The quantizer runs again, on every calibration sample, with those layers' outputs at 16 bits (onnxruntime's
   TensorQuantOverrides; its mixed-precision fixer makes each such layer's producer and consumers 16-bit
   ops and inserts the 8 <-> 16-bit conversions the HTP takes).

The choice is fitted on the calibration samples only, never on the samples the gate grades. A model that
even with every layer at 16 bits stays below the target cannot be rescued this way: NO_MIXED_PRECISION
says so with the figure (16-bit activations cannot fix what the 8-bit weights lost), or, where the CPU
shows no error 16-bit activations would take away, that it has nothing to rank the layers by.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from contracts.convert_job import MixedPrecisionReport, SensitiveLayer
from contracts.errors import Err, FleetforgeError

DATA_MOVEMENT = frozenset({"Reshape", "Transpose", "Squeeze", "Unsqueeze", "Flatten", "Identity", "Slice", "Split",
                           "Gather", "GatherElements", "Concat", "Expand", "Tile", "Pad", "DepthToSpace", "SpaceToDepth",
                           "MaxPool", "Relu", "Clip", "Resize", "Cast"})
"""Ops whose output shares its input's quantization (the same values moved, or clipped): not layers whose
precision is chosen."""
SENSITIVITY_SAMPLES = 16
"""Calibration samples each sensitivity measurement runs (the first ones)."""


@dataclass(frozen=True)
class Layer:
    node: str
    op_type: str
    tensor: str
    """Its output activation, quantized by a QuantizeLinear in the QDQ model."""


def probe_split(feeds: list[dict[str, Any]]) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """(samples the probe model calibrates on, samples the search measures it on): every other sample, so
    the measurement sees clipping as the gate's held-out samples do (on its own calibration samples a
    model shows none). One sample: it does both."""
    if len(feeds) < 2:
        return feeds, feeds
    return feeds[::2], feeds[1::2]


def search_target(threshold: float) -> float:
    """The cosine the search aims at on the calibration samples: half way from the gate's threshold to 1
    (0.95 -> 0.975)."""
    return threshold + (1.0 - threshold) / 2


def layers(qdq: Any) -> list[Layer]:
    """The QDQ model's layers: compute nodes whose output activation is quantized."""
    quantized = {n.input[0] for n in qdq.graph.node if n.op_type == "QuantizeLinear"}
    return [Layer(n.name, n.op_type, n.output[0]) for n in qdq.graph.node
            if n.op_type not in DATA_MOVEMENT | {"QuantizeLinear", "DequantizeLinear"} and n.output and n.output[0] in quantized]


def with_float(qdq: Any, tensors: set[str]) -> Any:
    """A copy of the QDQ model in which these activations are not rounded: every DequantizeLinear of a
    QuantizeLinear of one of them becomes a Clip of the float tensor to the range the quantization
    represents (its output name kept). The range stays: the quantizer folds a Relu or Clip into it, and a
    16-bit quantization of the same calibrated range keeps it too; only the rounding goes."""
    import numpy as np
    import onnx
    from onnx import helper, numpy_helper

    out = onnx.ModelProto()
    out.CopyFrom(qdq)
    inits = {i.name: i for i in out.graph.initializer}
    ranges: dict[str, tuple[str, float, float]] = {}
    for n in out.graph.node:
        if n.op_type != "QuantizeLinear" or n.input[0] not in tensors or len(n.input) < 3 or n.input[1] not in inits:
            continue
        scale = float(numpy_helper.to_array(inits[n.input[1]]).ravel()[0])
        zero = numpy_helper.to_array(inits[n.input[2]]) if n.input[2] in inits else np.zeros((), np.uint8)
        info = np.iinfo(zero.dtype)
        z = float(zero.ravel()[0])
        ranges[n.output[0]] = (n.input[0], (info.min - z) * scale, (info.max - z) * scale)
    nodes = []
    for n in out.graph.node:
        if n.op_type == "DequantizeLinear" and n.input[0] in ranges:
            tensor, lo, hi = ranges[n.input[0]]
            bounds = [f"{n.name}_float_lo", f"{n.name}_float_hi"]
            out.graph.initializer.extend(numpy_helper.from_array(np.array(v, np.float32), b) for v, b in zip((lo, hi), bounds))
            nodes.append(helper.make_node("Clip", [tensor, *bounds], list(n.output), name=n.name + "_float"))
        else:
            nodes.append(n)
    del out.graph.node[:]
    out.graph.node.extend(nodes)
    return out


def fewest_layers(count: int, reaches: Callable[[int], bool]) -> int | None:
    """The smallest k in 1..count for which `reaches(k)` (the top k layers at 16 bits reach the target),
    assuming more layers never hurt: doubling finds a k that reaches, bisection the smallest. None when
    even all `count` do not."""
    if count == 0 or not reaches(count):
        return None
    hi = 1
    while hi < count and not reaches(hi):
        hi *= 2
    hi = min(hi, count)
    lo = hi // 2  # reaches(lo) is False (or lo == 0)
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if reaches(mid):
            hi = mid
        else:
            lo = mid
    return hi


def search(float_model: Any, qdq: Any, feeds: list[dict[str, Any]], threshold: float,
           progress: Callable[[str], None] = lambda _: None) -> MixedPrecisionReport:
    """Which layers of `qdq` (the all-int8 model of `float_model`) to keep at 16 bits (see the module doc)."""
    import numpy as np

    feeds = feeds[:SENSITIVITY_SAMPLES]
    target = search_target(threshold)
    reference = _outputs(float_model, feeds)
    candidates = layers(qdq)

    def score(tensors: set[str]) -> tuple[float, float]:
        """(the gate's figure: lowest per-sample or pooled cosine of the worst output, mean per-sample cosine)."""
        return _agreement(reference, _outputs(with_float(qdq, tensors), feeds))

    base, base_mean = score(set())
    measured: dict[int, float] = {}
    if base >= target:  # the HTP missed the gate where fake quantization on the CPU did not
        measured[len(candidates)] = ceiling = score({layer.tensor for layer in candidates})[0]
        if ceiling <= base:
            raise FleetforgeError(Err.NO_MIXED_PRECISION, f"the all-int8 model reaches {base:.4f} on {len(feeds)} "
                                  f"calibration samples on the CPU, and every layer at 16-bit activations gives nothing "
                                  f"back ({ceiling:.4f}): the miss is the HTP's own arithmetic, which the CPU cannot rank "
                                  "the layers by")
        target = base + (ceiling - base) / 2  # halve the error 16-bit activations take away here
    gains = []
    for i, layer in enumerate(candidates):
        if i % 10 == 0:
            progress(f"sensitivity of layer {i + 1}/{len(candidates)}")
        gains.append(score({layer.tensor})[1] - base_mean)
    order = [candidates[i] for i in np.argsort(-np.array(gains), kind="stable")]
    gain_of = {layer.tensor: g for layer, g in zip(candidates, gains)}

    def reaches(k: int) -> bool:
        if k not in measured:
            progress(f"the {k} most sensitive layers at 16 bits")
            measured[k] = score({layer.tensor for layer in order[:k]})[0]
        return measured[k] >= target

    k = fewest_layers(len(order), reaches)
    if k is None:
        best = measured.get(len(order), base)
        raise FleetforgeError(Err.NO_MIXED_PRECISION, f"even with all {len(order)} layers at 16-bit activations the "
                              f"cosine to the fp32 model is {best:.4f} on {len(feeds)} calibration samples (the all-int8 "
                              f"model: {base:.4f}; target {target:.4f}): the 8-bit weights lose what 16-bit activations "
                              "cannot give back")
    chosen = [SensitiveLayer(node=layer.node, op_type=layer.op_type, tensor=layer.tensor,
                             cosine_gain=round(float(gain_of[layer.tensor]), 6)) for layer in order[:k]]
    return MixedPrecisionReport(layers_total=len(order), sixteen_bit=chosen, cosine_int8=round(base, 6),
                                cosine_mixed=round(measured[k], 6), target=round(target, 6), samples=len(feeds))


def _outputs(model: Any, feeds: list[dict[str, Any]]) -> list[list[Any]]:
    """Per sample, every output of `model` on onnxruntime's CPU (QDQ computed as fake quantization)."""
    import onnxruntime as ort

    so = ort.SessionOptions()
    so.log_severity_level = 3
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_BASIC
    sess = ort.InferenceSession(model.SerializeToString(), so, providers=["CPUExecutionProvider"])
    return [sess.run(None, feed) for feed in feeds]


def _agreement(reference: list[list[Any]], candidate: list[list[Any]]) -> tuple[float, float]:
    """(min over outputs of min(lowest per-sample cosine, pooled cosine), min over outputs of the mean
    per-sample cosine): the gate's figure and the ranking's."""
    import numpy as np

    from activities.toolchains.evaluate import sample_cosine

    gate, mean = 1.0, 1.0
    for j in range(len(reference[0])):
        x = [np.asarray(r[j], np.float64).ravel() for r in reference]
        y = [np.asarray(c[j], np.float64).ravel() for c in candidate]
        per_sample = [sample_cosine(a, b) for a, b in zip(x, y)]
        pooled = sample_cosine(np.concatenate(x), np.concatenate(y))
        gate = min(gate, min(per_sample), pooled)
        mean = min(mean, float(np.mean(per_sample)))
    return gate, mean
