"""Graph surgery as typed, registered passes (Olive's model): each pass has a name, the pattern it
matches, a precondition, and the ops or error codes whose failure it fixes (the offline planner reads
those to pick a pass when a placement or compile failure names them; the LLM planner sees the list in
`list_tools`, in the `onnx.graph_passes` spec).

Contract of every pass: `apply(model, ctx) -> int` rewrites each match in place and returns how many it
rewrote; with no match (or the precondition false) it returns 0 and leaves the ModelProto untouched, so
the `onnx.graph_passes` step then copies its input byte for byte. Numerics are the evaluation's job:
the plan's reference stays the original model, so a pass that changed what the graph computes fails
the accuracy gate like any other step.

onnxruntime's transformer optimizer does the GELU fusion (FusionGelu); the rest it lacks.
"""

from __future__ import annotations

import math
import shutil
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict

from activities.sandbox import safe_join
from contracts.convert import StepOutput
from contracts.errors import Err, FleetforgeError

MASK_FLOOR = -100.0
"""What `clamp_mask_constants` clamps a huge negative mask constant to. A masked score's softmax weight
is then at most exp(d - 100) of the largest, d the amount by which it exceeds every unmasked score:
below float32's resolution unless d > 84, so the softmax computes the same. Small on purpose: the
mask lands in the masked scores' quantization range, and 8-bit steps over [-1e4, max] (the first
choice) erased the scores themselves (DistilBERT int8 cosine 0.90 at -1e4, 0.997 at -100; GPT-2 0.94,
0.992)."""
HUGE = 1e30
"""A constant at or beyond this magnitude is a mask value (float32 min/max, inf), not a weight."""


@dataclass
class PassContext:
    input_shapes: dict[str, list[int]] = field(default_factory=dict)
    """NAME -> dims from --input-shape (fix_input_dims)."""
    notes: list[str] = field(default_factory=list)
    """What a pass decided on the user's behalf (said out loud in the step's details and the result)."""
    folded: int = 0
    """Nodes `fold_constants` folded so that a pass matching on static shapes could fire."""


@dataclass(frozen=True)
class GraphPass:
    name: str
    pattern: str
    """What it matches, in words (list_tools and the docs show it)."""
    fixes_ops: frozenset[str]
    """Op types whose placement/compile failure this pass can remove."""
    fixes_codes: frozenset[str]
    """Error codes (contracts.errors.Err) this pass is the remedy for."""
    apply: Callable[[Any, PassContext], int]
    static_shapes: bool = False
    """It matches on inferred static shapes: when it finds nothing, `apply_pass` tries it once more after
    `fold_constants` (a Pad whose amounts the graph computes leaves every shape after it unknown to onnx's
    shape inference)."""


PASSES: dict[str, GraphPass] = {}


def graph_pass(name: str, *, pattern: str, fixes_ops: tuple[str, ...] = (), fixes_codes: tuple[Err, ...] = (),
               static_shapes: bool = False) -> Callable[[Callable[[Any, PassContext], int]], Callable[[Any, PassContext], int]]:
    def register(fn: Callable[[Any, PassContext], int]) -> Callable[[Any, PassContext], int]:
        if name in PASSES:
            raise FleetforgeError(Err.INTERNAL, f"graph pass {name!r} registered twice")
        PASSES[name] = GraphPass(name, pattern, frozenset(fixes_ops), frozenset(c.value for c in fixes_codes), fn,
                                 static_shapes)
        return fn
    return register


def catalog() -> str:
    """The passes as the `onnx.graph_passes` spec describes them to a planner (its JSON holds this text;
    a unit test keeps the two in step)."""
    def fixes(p: GraphPass) -> str:
        said = ([f"ops {', '.join(sorted(p.fixes_ops))}"] if p.fixes_ops else []) + sorted(p.fixes_codes)
        return f" (fixes {'; '.join(said)})" if said else ""

    return "; ".join(f"{p.name}: {p.pattern}{fixes(p)}" for p in PASSES.values())


def passes_for(ops: list[str] | set[str], codes: list[str] | set[str] = ()) -> list[str]:
    """Names of the passes that fix any of these failing ops or error codes, in registry order (pure)."""
    ops, codes = set(ops), set(codes)
    return [p.name for p in PASSES.values() if p.fixes_ops & ops or p.fixes_codes & codes]


# ---- helpers --------------------------------------------------------------------------------------


def _opset(model: Any) -> int:
    return next((o.version for o in model.opset_import if o.domain in ("", "ai.onnx")), 0)


def _shapes(model: Any) -> dict[str, list[int | None]]:
    """Static shapes of every typed value (inference on a copy: the model itself is not touched)."""
    import onnx

    try:
        inferred = onnx.shape_inference.infer_shapes(model)
    except Exception:  # shape inference refuses some graphs: the passes then match fewer nodes
        inferred = model
    g = inferred.graph
    out: dict[str, list[int | None]] = {}
    for v in [*g.input, *g.value_info, *g.output]:
        t = v.type.tensor_type
        if t.HasField("shape"):
            out[v.name] = [d.dim_value if d.HasField("dim_value") else None for d in t.shape.dim]
    for init in g.initializer:
        out[init.name] = list(init.dims)
    return out


def _constants(model: Any) -> dict[str, Any]:
    """Initializers and Constant-node values by name, as numpy arrays."""
    from onnx import numpy_helper

    out = {i.name: numpy_helper.to_array(i) for i in model.graph.initializer}
    for n in model.graph.node:
        if n.op_type == "Constant" and n.attribute and n.attribute[0].name == "value":
            out[n.output[0]] = numpy_helper.to_array(n.attribute[0].t)
    return out


def _attr(node: Any, name: str, default: Any = None) -> Any:
    import onnx

    return next((onnx.helper.get_attribute_value(a) for a in node.attribute if a.name == name), default)


def _replace_nodes(model: Any, replacements: dict[int, list[Any]]) -> int:
    """Put each node whose id() is a key in place of its replacement nodes, graph order kept; returns
    how many were replaced (0: the graph is untouched)."""
    if not replacements:
        return 0
    nodes = [m for n in model.graph.node for m in replacements.get(id(n), [n])]
    del model.graph.node[:]
    model.graph.node.extend(nodes)
    return len(replacements)


# ---- the passes -----------------------------------------------------------------------------------

NEVER_FOLD = frozenset({"QuantizeLinear", "DequantizeLinear", "RandomNormal", "RandomNormalLike", "RandomUniform",
                        "RandomUniformLike", "Multinomial", "Bernoulli", "If", "Loop", "Scan"})
"""Ops whose value is not a constant of their inputs (random), whose constant form would undo a QDQ
model's quantization, or that carry subgraphs."""
FOLD_ROUNDS = 8
"""Folding makes more shapes static, which makes more Shape nodes foldable: at most this many rounds."""


@graph_pass("fold_constants", pattern="a subgraph computed from constants and static shapes only (TorchScript's "
            "Shape -> Gather -> Concat -> Cast chains feeding Pad, Reshape, Expand) -> its value as an initializer; tried "
            "by itself when a pass that matches on static shapes found nothing")
def fold_constants(model: Any, ctx: PassContext) -> int:
    """What onnx-simplifier does for shape arithmetic: each Shape of a tensor whose shape inference knows
    statically becomes its value, then every node all of whose inputs are constants is evaluated once
    (onnxruntime on the constant subgraph alone) and replaced by its outputs. Exact: the graph computes
    the same values, only earlier. Returns how many nodes went."""
    total = 0
    for _ in range(FOLD_ROUNDS):
        done = _fold_once(model)
        if not done:
            break
        total += done
    return total


def _fold_once(model: Any) -> int:
    import numpy as np
    from onnx import numpy_helper

    g = model.graph
    shapes = _shapes(model)
    graph_outputs = {o.name for o in g.output}
    const = {i.name for i in g.initializer} | {n.output[0] for n in g.node if n.op_type == "Constant"}
    static: dict[str, Any] = {}
    folded: list[Any] = []
    for n in g.node:
        if (n.op_type == "Constant" or n.domain not in ("", "ai.onnx") or n.op_type in NEVER_FOLD
                or graph_outputs & set(n.output) or any(a.type in (5, 10) for a in n.attribute)):  # 5, 10: GRAPH(S)
            continue
        if n.op_type == "Shape":
            dims = shapes.get(n.input[0])
            if dims is not None and None not in dims:
                static[n.output[0]] = np.array(dims[_attr(n, "start", 0):_attr(n, "end", len(dims))], np.int64)
                folded.append(n)
                const.add(n.output[0])
        elif all(i == "" or i in const for i in n.input):
            folded.append(n)
            const.update(o for o in n.output if o)
    values = _evaluate(model, [n for n in folded if n.op_type != "Shape"], static)
    if values is None:  # onnxruntime cannot evaluate the subgraph alone: fold the static Shape nodes only
        folded = [n for n in folded if n.op_type == "Shape"]
        values = static
    if not folded:
        return 0
    gone = {id(n) for n in folded}
    made = {o for n in folded for o in n.output if o}
    needed = sorted({i for n in g.node if id(n) not in gone for i in n.input if i in made})
    kept = [n for n in g.node if id(n) not in gone]
    del g.node[:]
    g.node.extend(kept)
    g.initializer.extend(numpy_helper.from_array(np.asarray(values[name]), name) for name in needed)
    _drop_unused(model)
    return len(folded)


def _evaluate(model: Any, nodes: list[Any], static: dict[str, Any]) -> dict[str, Any] | None:
    """Every output of `nodes` (computed from constants and the `static` Shape values only), by
    onnxruntime on that subgraph alone; None when it cannot run it."""
    import onnx
    import onnxruntime as ort
    from onnx import helper

    out = dict(static)
    if not nodes:
        return out
    g = model.graph
    constants = [n for n in g.node if n.op_type == "Constant"]
    used = {i for n in nodes for i in n.input}
    names = [o for n in nodes for o in n.output if o]
    inputs = [helper.make_tensor_value_info(k, onnx.TensorProto.INT64, list(v.shape)) for k, v in static.items() if k in used]
    sub = helper.make_graph([*constants, *nodes], "constants", inputs, [onnx.ValueInfoProto(name=o) for o in names],
                            initializer=[i for i in g.initializer if i.name in used])
    try:
        so = ort.SessionOptions()
        so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
        so.log_severity_level = 3
        sess = ort.InferenceSession(helper.make_model(sub, opset_imports=list(model.opset_import),
                                                      ir_version=model.ir_version).SerializeToString(),
                                    so, providers=["CPUExecutionProvider"])
        out.update(zip(names, sess.run(names, {k: v for k, v in static.items() if k in used})))
    except Exception:  # an op onnxruntime lacks, a subgraph it refuses on its own
        return None
    return out


def _drop_unused(model: Any) -> None:
    """Initializers and Constant nodes nothing reads any more (what folding left behind)."""
    g = model.graph
    while True:
        read = {i for n in g.node for i in n.input} | {o.name for o in g.output}
        dead = [n for n in g.node if n.op_type == "Constant" and n.output[0] not in read]
        if not dead:
            break
        for n in dead:
            g.node.remove(n)
    read = {i for n in g.node for i in n.input} | {o.name for o in g.output}
    dead_inits = [i for i in g.initializer if i.name not in read]
    dead_names = {i.name for i in dead_inits}
    for init in dead_inits:
        g.initializer.remove(init)
    for vi in [vi for vi in g.input if vi.name in dead_names]:  # IR 3 lists initializers as inputs too
        g.input.remove(vi)



@graph_pass("gelu_fusion", pattern="exact GELU as x * 0.5 * (1 + Erf(x / sqrt(2))) (opset < 20 exports) -> one Gelu node",
            fixes_ops=("Erf",))
def gelu_fusion(model: Any, ctx: PassContext) -> int:
    """onnxruntime's FusionGelu finds the Erf chains; the fused node is ai.onnx Gelu from opset 20 on,
    com.microsoft Gelu before (both run on the QNN HTP backend, quantized too)."""
    if not any(n.op_type == "Erf" for n in model.graph.node):
        return 0
    import onnx
    from onnxruntime.transformers.fusion_gelu import FusionGelu
    from onnxruntime.transformers.onnx_model import OnnxModel

    work = onnx.ModelProto()
    work.CopyFrom(model)
    om = OnnxModel(work)
    FusionGelu(om).apply()
    fused = [n for n in om.model.graph.node if n.op_type == "Gelu"]
    before = sum(n.op_type == "Gelu" for n in model.graph.node)
    if len(fused) <= before:
        return 0
    om.prune_graph()
    if _opset(om.model) >= 20:
        for n in om.model.graph.node:
            if n.op_type == "Gelu" and n.domain == "com.microsoft":
                n.domain = ""
    elif not any(o.domain == "com.microsoft" for o in om.model.opset_import):
        om.model.opset_import.append(onnx.helper.make_opsetid("com.microsoft", 1))
    type_gelu_outputs(om.model)
    model.CopyFrom(om.model)
    return len(fused) - before


def type_gelu_outputs(model: Any) -> None:
    """Give each Gelu output the type and shape of its input (Gelu is elementwise). onnx's shape inference
    does not know com.microsoft Gelu: without this every tensor after it is untyped wherever the
    quantizer's pre-processing falls back to onnx's inference, and the QDQ quantizer then skips them
    (no scale for the LayerNormalization after the Gelu, no calibration of a Softmax further on) or
    loops forever in onnxruntime 1.32 (`_quantize_sharing_param_tensors`). The quantizer's preparation
    calls it again (qdq_prep): its graph optimization renames Gelu outputs it moves."""
    import onnx

    gelus = [n for n in model.graph.node if n.op_type == "Gelu" and n.input and n.output]
    for _ in range(len(gelus)):  # a Gelu after another one is typed once inference passes the first
        try:
            inferred = onnx.shape_inference.infer_shapes(model)
        except Exception:  # a graph onnx cannot infer: the quantizer's own inference is all there is
            return
        typed = {v.name: v for v in [*inferred.graph.input, *inferred.graph.value_info, *inferred.graph.output]}
        todo = [n for n in gelus if n.output[0] not in typed and n.input[0] in typed]
        for n in todo:
            vi = onnx.ValueInfoProto()
            vi.CopyFrom(typed[n.input[0]])
            vi.name = n.output[0]
            model.graph.value_info.append(vi)
        if not todo:
            return


@graph_pass("avgpool_to_global", pattern="AveragePool whose kernel covers the whole (static) spatial input with one "
            "output position, no padding -> GlobalAveragePool", fixes_ops=("AveragePool",), static_shapes=True)
def avgpool_to_global(model: Any, ctx: PassContext) -> int:
    """A kernel at least as large as the input with one output position averages the whole input (a
    window past the edge is clipped, not padded, when pads are 0): that is GlobalAveragePool, which the
    HTP backend has. EfficientNet's pooler is AvgPool2d(1280-ish, ceil_mode=True) over a 1x1 map, which
    the backend rejects."""
    pools = [n for n in model.graph.node if n.op_type == "AveragePool"]
    if not pools:
        return 0
    shapes = _shapes(model)
    done = 0
    for n in pools:
        dims = shapes.get(n.input[0])
        kernel = list(_attr(n, "kernel_shape", []))
        pads = list(_attr(n, "pads", []) or [])
        auto = _attr(n, "auto_pad", b"NOTSET")
        auto = auto.decode() if isinstance(auto, bytes) else auto
        strides = list(_attr(n, "strides", []) or [1] * len(kernel))
        rounding = math.ceil if _attr(n, "ceil_mode", 0) else math.floor
        if (dims is None or None in dims or len(dims) != len(kernel) + 2 or any(p != 0 for p in pads)
                or auto not in ("NOTSET", "VALID") or _attr(n, "dilations") not in (None, [1] * len(kernel))
                or any(k < d for k, d in zip(kernel, dims[2:]))
                or any(rounding((d - k) / s) + 1 != 1 for d, k, s in zip(dims[2:], kernel, strides))):
            continue
        del n.attribute[:]
        n.op_type = "GlobalAveragePool"
        done += 1
    return done


@graph_pass("avgpool_exclude_pad", pattern="AveragePool with count_include_pad=0 and padding over a static input -> "
            "the same pool counting the padding, times a constant per-position kernel/valid-count map",
            fixes_codes=(Err.ACCURACY_BELOW_THRESHOLD,), static_shapes=True)
def avgpool_exclude_pad(model: Any, ctx: PassContext) -> int:
    """The HTP backend at fp16 averages a padded window wrongly when the padding is not counted (a
    single 3x3 pool on [1,16,16,16]: cosine 0.10; PoolFormer's token mixer, 0.78 at the model's output),
    and right when it is. Excluding the padding divides each window's sum by its number of valid
    positions instead of the kernel size, a constant of the position: count_include_pad=1 then x
    kernel/valid is the same average (exact up to float rounding)."""
    import numpy as np
    from onnx import helper, numpy_helper

    pools = [n for n in model.graph.node if n.op_type == "AveragePool" and not _attr(n, "count_include_pad", 0)
             and any(_attr(n, "pads", []) or [])]
    if not pools:
        return 0
    shapes = _shapes(model)
    replacements = {}
    for n in pools:
        dims, kernel = shapes.get(n.input[0]), list(_attr(n, "kernel_shape", []))
        pads, auto = list(_attr(n, "pads", [])), _attr(n, "auto_pad", b"NOTSET")
        strides = list(_attr(n, "strides", []) or [1] * len(kernel))
        if (dims is None or None in dims or len(dims) != len(kernel) + 2 or _attr(n, "ceil_mode", 0)
                or (auto.decode() if isinstance(auto, bytes) else auto) != "NOTSET"
                or _attr(n, "dilations") not in (None, [1] * len(kernel))):
            continue
        counts = [_valid_counts(d, k, s, pads[i], pads[i + len(kernel)])
                  for i, (d, k, s) in enumerate(zip(dims[2:], kernel, strides))]
        valid = counts[0]
        for c in counts[1:]:
            valid = np.multiply.outer(valid, c)
        scale = (math.prod(kernel) / valid).astype(np.float32).reshape(1, 1, *valid.shape)
        stem = n.name or n.output[0]
        model.graph.initializer.append(numpy_helper.from_array(scale, f"{stem}_exclude_pad_scale"))
        counted = helper.make_node("AveragePool", [n.input[0]], [f"{stem}_counted"], name=f"{stem}_counted",
                                   kernel_shape=kernel, pads=pads, strides=strides, count_include_pad=1)
        replacements[id(n)] = [counted, helper.make_node("Mul", [f"{stem}_counted", f"{stem}_exclude_pad_scale"],
                                                         [n.output[0]], name=f"{stem}_exclude_pad")]
    return _replace_nodes(model, replacements)


def _valid_counts(size: int, kernel: int, stride: int, begin: int, end: int) -> Any:
    """Per output position along one axis: how many of the window's positions lie inside the input."""
    import numpy as np

    starts = np.arange(0, size + begin + end - kernel + 1, stride) - begin
    return (np.minimum(starts + kernel, size) - np.maximum(starts, 0)).astype(np.float64)


@graph_pass("fix_input_dims", pattern="graph input with a symbolic dim (a dynamic batch or length) -> the size from "
            "--input-shape, or 1")
def fix_input_dims(model: Any, ctx: PassContext) -> int:
    """The HTP backend compiles static shapes only (a dynamic batch is reported as UNSUPPORTED_OP on
    Conv/Add/...). A named input takes --input-shape's dims; any other symbolic dim becomes 1, said in
    ctx.notes. Symbolic dims of intermediate values and outputs go too (the session infers them)."""
    inits = {i.name for i in model.graph.initializer}
    inputs = [i for i in model.graph.input if i.name not in inits]
    todo = [(i, d) for i in inputs for d in i.type.tensor_type.shape.dim if not d.HasField("dim_value")]
    given = {i.name: ctx.input_shapes[i.name] for i in inputs if i.name in ctx.input_shapes}
    mismatched = [i for i in inputs if i.name in given and list(given[i.name]) != _static(i)]
    if not todo and not mismatched:
        return 0
    for name, dims in given.items():
        vi = next(i for i in inputs if i.name == name)
        have = vi.type.tensor_type.shape.dim
        if len(have) != len(dims):
            raise FleetforgeError(Err.BAD_INPUT, f"--input-shape {name}={','.join(map(str, dims))} has {len(dims)} dims; "
                                  f"the model's input {name} has {len(have)}")
        for d, value in zip(have, dims):
            if d.HasField("dim_value") and d.dim_value != value:
                raise FleetforgeError(Err.BAD_INPUT, f"--input-shape {name}: dim {d.dim_value} of the model cannot "
                                      f"become {value} (only symbolic dims are fixed)")
            d.ClearField("dim_param")
            d.dim_value = value
    changed = len(given)
    for vi, d in todo:
        if vi.name in given:
            continue
        ctx.notes.append(f"input {vi.name}: symbolic dim {d.dim_param or '?'!r} fixed to 1 (give --input-shape "
                         f"{vi.name}=... to choose)")
        d.ClearField("dim_param")
        d.dim_value = 1
        changed += 1
    del model.graph.value_info[:]  # stale symbolic shapes: onnxruntime infers them again
    for o in model.graph.output:
        for d in o.type.tensor_type.shape.dim:
            if not d.HasField("dim_value"):
                d.ClearField("dim_param")
    return changed


def _static(vi: Any) -> list[int | None]:
    return [d.dim_value if d.HasField("dim_value") else None for d in vi.type.tensor_type.shape.dim]


@graph_pass("clamp_mask_constants", pattern=f"float constant at or beyond +-{HUGE:g} (an attention mask's float32 "
            f"min, inf) -> clamped to +-{-MASK_FLOOR:g}", fixes_codes=(Err.QUANT_SCALE_INVALID,))
def clamp_mask_constants(model: Any, ctx: PassContext) -> int:
    """A causal/padding mask built from float32 min gets a quantization scale of ~1e36 or infinity and
    the HTP compile fails ("Failed to compose Qnn graph"); softmax(x - 100) is softmax(x + -3.4e38)
    (MASK_FLOOR says why 100)."""
    import numpy as np
    from onnx import numpy_helper

    def clamp(tensor: Any) -> bool:
        if tensor.data_type not in (1, 10, 11):  # float, float16, double
            return False
        a = numpy_helper.to_array(tensor)
        huge = np.abs(a.astype(np.float64)) >= HUGE
        if not huge.any():
            return False
        fixed = np.where(huge, np.sign(a) * -MASK_FLOOR, a).astype(a.dtype)
        tensor.CopyFrom(numpy_helper.from_array(fixed, tensor.name))
        return True

    return sum(clamp(t) for t in _constant_tensors(model))


def has_huge_constant(model: Any) -> bool:
    """Whether a float constant lies at or beyond +-HUGE (what `clamp_mask_constants` clamps)."""
    import numpy as np
    from onnx import numpy_helper

    return any(t.data_type in (1, 10, 11) and bool((np.abs(numpy_helper.to_array(t).astype(np.float64)) >= HUGE).any())
               for t in _constant_tensors(model))


def _constant_tensors(model: Any) -> list[Any]:
    """The graph's initializers and its Constant nodes' values."""
    return [*model.graph.initializer,
            *(a.t for n in model.graph.node if n.op_type == "Constant" for a in n.attribute if a.name == "value")]


@graph_pass("gathernd_to_gather", pattern="GatherND with constant indices over a static input (transformers' mask "
            "building) -> Reshape (+ Gather of the flat positions)", fixes_ops=("GatherND",), static_shapes=True)
def gathernd_to_gather(model: Any, ctx: PassContext) -> int:
    """The HTP backend leaves GatherND on the CPU (splitting the graph in two); with constant indices
    it is a Reshape when the indices enumerate the input in order, else a Gather on the flattened input."""
    import numpy as np
    from onnx import helper, numpy_helper

    candidates = [n for n in model.graph.node if n.op_type == "GatherND" and _attr(n, "batch_dims", 0) == 0]
    if not candidates:
        return 0
    consts, shapes = _constants(model), _shapes(model)
    plans = []
    for n in candidates:
        idx, dims = consts.get(n.input[1]), shapes.get(n.input[0])
        if idx is None or dims is None or None in dims or idx.shape[-1] != len(dims):
            continue
        flat = np.ravel_multi_index(tuple(np.moveaxis(idx.astype(np.int64) % np.array(dims), -1, 0)), dims)
        plans.append((n, flat, list(idx.shape[:-1]), int(math.prod(dims))))
    replacements = {}
    for n, flat, out_shape, size in plans:
        stem = n.name or n.output[0]
        shape_name = f"{stem}_shape"
        if flat.size == size and np.array_equal(flat.ravel(), np.arange(size)):
            model.graph.initializer.append(numpy_helper.from_array(np.array(out_shape, np.int64), shape_name))
            replacements[id(n)] = [helper.make_node("Reshape", [n.input[0], shape_name], [n.output[0]], name=f"{stem}_reshape")]
            continue
        model.graph.initializer.extend([numpy_helper.from_array(np.array([-1], np.int64), shape_name),
                                        numpy_helper.from_array(flat.astype(np.int64), f"{stem}_flat_idx")])
        replacements[id(n)] = [
            helper.make_node("Reshape", [n.input[0], shape_name], [f"{stem}_flat"], name=f"{stem}_flatten"),
            helper.make_node("Gather", [f"{stem}_flat", f"{stem}_flat_idx"], [n.output[0]], axis=0, name=f"{stem}_gather")]
    return _replace_nodes(model, replacements)


@graph_pass("flatten_matmul_input", pattern="MatMul of a constant 2-D weight whose rank >= 3 input is a Reshape that "
            "changes the last axis -> the same MatMul on the input flattened to 2-D, reshaped back after",
            fixes_codes=(Err.ACCURACY_BELOW_THRESHOLD,), static_shapes=True)
def flatten_matmul_input(model: Any, ctx: PassContext) -> int:
    """The HTP backend at fp16 computes MatMul(Reshape(x) -> [..., K], W[K, N]) wrong when the Reshape
    merges x's trailing axes (cosine 0.03 on a 4x4x4x8 -> 4x4x32 case; MobileViT's attention output
    projection, 0.24 at the model's output). The 2-D form [-1, K] @ W is computed right; the result is
    the same numbers in the same order, so this rewrite is exact."""
    import numpy as np
    from onnx import helper, numpy_helper

    matmuls = [n for n in model.graph.node if n.op_type == "MatMul"]
    if not matmuls:
        return 0
    producer = {o: n for n in model.graph.node for o in n.output}
    consts, shapes = _constants(model), _shapes(model)
    plans = []
    for n in matmuls:
        a, w = n.input[0], consts.get(n.input[1])
        src = producer.get(a)
        if w is None or w.ndim != 2 or src is None or src.op_type != "Reshape":
            continue
        a_dims, x_dims = shapes.get(a), shapes.get(src.input[0])
        if (a_dims is None or x_dims is None or None in a_dims or None in x_dims or len(a_dims) < 3
                or not x_dims or a_dims[-1] == x_dims[-1] or a_dims[-1] != w.shape[0]):
            continue
        plans.append((n, a_dims[:-1] + [int(w.shape[1])]))
    replacements = {}
    for n, out in plans:
        stem = n.name or n.output[0]
        k = int(consts[n.input[1]].shape[0])
        model.graph.initializer.extend([numpy_helper.from_array(np.array([-1, k], np.int64), f"{stem}_flat_shape"),
                                        numpy_helper.from_array(np.array(out, np.int64), f"{stem}_out_shape")])
        replacements[id(n)] = [
            helper.make_node("Reshape", [n.input[0], f"{stem}_flat_shape"], [f"{stem}_flat_in"], name=f"{stem}_flatten"),
            helper.make_node("MatMul", [f"{stem}_flat_in", n.input[1]], [f"{stem}_flat_out"], name=f"{stem}_2d"),
            helper.make_node("Reshape", [f"{stem}_flat_out", f"{stem}_out_shape"], [n.output[0]], name=f"{stem}_unflatten")]
    return _replace_nodes(model, replacements)


COMMUTATIVE = frozenset({"Add", "Mul", "Max", "Min", "Sum", "Mean"})


@graph_pass("constant_second", pattern="Add/Mul (or another commutative op) whose first input is a constant and whose "
            "second is computed -> the same op with its inputs swapped", fixes_codes=(Err.HTP_GRAPH_REJECTED,))
def constant_second(model: Any, ctx: PassContext) -> int:
    """The HTP backend at fp16 fails to finalize a graph (QNN_COMMON_ERROR_MEM_ALLOC) on a constant times a
    computed tensor when the constant comes first: LLaMA's RMSNorm `weight * hidden` as torch exports it.
    Addition and multiplication commute exactly in IEEE arithmetic, so the swap changes no value."""
    consts = set(_constants(model)) | {i.name for i in model.graph.initializer}
    done = 0
    for n in model.graph.node:
        if (n.op_type in COMMUTATIVE and n.domain in ("", "ai.onnx") and len(n.input) == 2 and n.input[0] in consts
                and n.input[1] not in consts):
            n.input[0], n.input[1] = n.input[1], n.input[0]
            done += 1
    return done


@graph_pass("rsqrt_to_div", pattern="Reciprocal(Sqrt(x)) (RMSNorm's rsqrt as torch exports it) -> Div(1, Sqrt(x)); "
            "applied by the QDQ quantizer's preparation of every model")
def rsqrt_to_div(model: Any, ctx: PassContext) -> int:
    """The HTP backend computes a quantized Reciprocal of a Sqrt wrongly inside a larger graph (a small LLaMA
    at int8: held-out cosine 0.42 against onnxruntime's 0.99 on the same QDQ model; alone, or with its
    output exposed, it computes it right): each RMSNorm's rsqrt. 1 / x is what Reciprocal computes, so the
    Div gives the same values to float rounding (onnxruntime's CPU rounds the last bit of a few differently);
    the HTP then scores 0.987."""
    import numpy as np
    from onnx import helper, numpy_helper

    producer = {o: n for n in model.graph.node for o in n.output}
    found = [n for n in model.graph.node if n.op_type == "Reciprocal" and n.input and producer.get(n.input[0]) is not None
             and producer[n.input[0]].op_type == "Sqrt"]
    if not found:
        return 0
    one = "fleetforge_one"
    if one not in {i.name for i in model.graph.initializer}:
        model.graph.initializer.append(numpy_helper.from_array(np.array(1.0, np.float32), one))
    return _replace_nodes(model, {id(n): [helper.make_node("Div", [one, n.input[0]], list(n.output), name=f"{n.name or n.output[0]}_div")]
                                  for n in found})


# ---- the tool step --------------------------------------------------------------------------------


class GraphPassesParams(BaseModel, frozen=True):
    model_config = ConfigDict(extra="forbid", frozen=True)

    model: str
    output: str
    passes: list[str]
    """Pass names, applied in this order."""
    input_shapes: list[str] = []
    """NAME=d1,d2,... (fix_input_dims)."""


def parse_shapes(items: list[str]) -> dict[str, list[int]]:
    """["x=1,3,224,224", "ids=1,128:int64"] -> {"x": [1, 3, 224, 224], "ids": [1, 128]} (a dtype suffix is
    for the torch exporter; here only the dims count)."""
    from contracts.convert_job import parse_input_shape

    return {name: spec.dims for name, spec in map(parse_input_shape, items)}


def apply_pass(name: str, model: Any, ctx: PassContext) -> int:
    """Apply one pass; a pass that matches on static shapes and found nothing is tried once more on the
    model with its constants folded (`fold_constants`), which is kept only when the pass then matched:
    folding is done where it lets a pass see the shapes, not everywhere."""
    import onnx

    p = PASSES[name]
    count = p.apply(model, ctx)
    if count or not p.static_shapes:
        return count
    work = onnx.ModelProto()
    work.CopyFrom(model)
    folded = fold_constants(work, ctx)
    count = p.apply(work, ctx) if folded else 0
    if count:
        model.CopyFrom(work)
        ctx.folded += folded
    return count


def run_passes(root: Path, params: GraphPassesParams) -> StepOutput:
    """Apply the named passes; with no match at all the output is a byte copy of the input."""
    import onnx

    unknown = [p for p in params.passes if p not in PASSES]
    if unknown:
        raise FleetforgeError(Err.BAD_INPUT, f"unknown graph pass(es) {unknown}; known: {', '.join(PASSES)}")
    src, dst = safe_join(root, params.model), safe_join(root, params.output)
    dst.parent.mkdir(parents=True, exist_ok=True)
    t0 = time.monotonic()
    model = onnx.load(str(src))
    ctx = PassContext(input_shapes=parse_shapes(params.input_shapes))
    applied: dict[str, int] = {}
    for name in params.passes:
        applied[name] = apply_pass(name, model, ctx)
    if ctx.folded:
        applied["fold_constants"] = applied.get("fold_constants", 0) + ctx.folded
    if any(applied.values()):
        onnx.save(model, str(dst))
    else:
        shutil.copyfile(src, dst)
    return StepOutput(outputs=[params.output], seconds=time.monotonic() - t0,
                      details={"applied": applied, "notes": ctx.notes})
