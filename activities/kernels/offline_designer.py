"""The offline designer: reads the traced reference (aten ops and their arguments, never the source
text) and chooses a plan: one of two single-kernel templates when the graph is that simple, otherwise
the general lowering (activities.kernels.lowering: the traced graph lowered op by op into fused Triton
kernels), or says which op nothing offline can take.

Order: the elementwise and matmul templates first (one fused kernel each); a rowwise graph goes to the
lowering (many rows per program: far faster under the interpreter than the template's program per
row), with the rowwise template kept only for a graph the lowering refuses.

* elementwise: every op is pointwise on the one tensor input (relu, gelu in both forms, x*sigmoid(x),
  x/(1+|x|), A*s, ...): the plan is the op chain itself, so composed activations are covered too;
* rowwise: reductions (sum, mean, amax/amin, max/min.dim, argmax/argmin, vector norms, softmax,
  log_softmax, layer norm, var) over one set of adjacent dims of the input, mixed with pointwise ops
  (rms/L1/L2/layer norms, softmax): per-element or per-row output;
* matmul: mm / bmm / mv of two inputs, each possibly transposed.

Pure: a ReferenceAnalysis in, a KernelPlan (or the reason) out.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

from activities.kernels import lowering
from contracts.kernel_job import KernelDesign, KernelPlan, Operand, PlanOp, ReferenceAnalysis, TensorSpec

VIEW_OPS = frozenset({"view", "_unsafe_view", "reshape", "clone", "contiguous", "alias", "detach", "lift_fresh_copy"})
MATMUL_OPS = frozenset({"mm", "bmm", "mv"})
FLOAT_DTYPES = frozenset({"float32", "float16", "bfloat16", "float64"})

# aten op -> (our op, tensor-or-scalar operands, [(attr, default), ...] read from the remaining args/kwargs)
UNARY: dict[str, tuple[str, list[tuple[str, Any]]]] = {
    "relu": ("relu", []), "sigmoid": ("sigmoid", []), "tanh": ("tanh", []), "exp": ("exp", []),
    "log": ("log", []), "sqrt": ("sqrt", []), "rsqrt": ("rsqrt", []), "abs": ("abs", []), "neg": ("neg", []),
    "reciprocal": ("reciprocal", []), "sin": ("sin", []), "cos": ("cos", []), "erf": ("erf", []),
    "exp2": ("exp2", []), "log2": ("log2", []), "floor": ("floor", []), "ceil": ("ceil", []),
    "silu": ("silu", []), "hardsigmoid": ("hardsigmoid", []), "hardswish": ("hardswish", []),
    "mish": ("mish", []), "square": ("square", []),
    "gelu": ("gelu", [("approximate", "none")]),
    "leaky_relu": ("leaky_relu", [("negative_slope", 0.01)]),
    "elu": ("elu", [("alpha", 1.0), ("scale", 1.0), ("input_scale", 1.0)]),
    "celu": ("celu", [("alpha", 1.0)]),
    "hardtanh": ("hardtanh", [("min_val", -1.0), ("max_val", 1.0)]),
    "softplus": ("softplus", [("beta", 1.0), ("threshold", 20.0)]),
    "clamp": ("clamp", [("min", None), ("max", None)]),
    "clamp_min": ("clamp", [("min", None)]), "clamp_max": ("clamp", [("max", None)]),
}
BINARY = {"add": "add", "sub": "sub", "mul": "mul", "div": "div", "maximum": "maximum", "minimum": "minimum",
          "pow": "pow", "rsub": "rsub"}
REDUCTIONS = frozenset({"sum", "mean", "amax", "amin", "max", "min", "argmax", "argmin", "linalg_vector_norm",
                        "_softmax", "_log_softmax", "native_layer_norm", "var", "std", "var_mean", "prod", "norm"})


def choose_plan(a: ReferenceAnalysis) -> KernelPlan | str:
    """The template for this reference, or one line saying why none fits (naming the aten ops)."""
    if a.trace_error:
        return f"the reference could not be traced ({a.trace_error})"
    try:
        plan = _Reader(a).plan()
        if plan.template != "rowwise":
            return plan
        template_refusal = ""
    except _NoTemplate as e:
        plan, template_refusal = None, str(e)
    lowered = lowering.lower(a)
    if isinstance(lowered, str) and plan is not None:
        return plan
    if isinstance(lowered, str):
        return f"{lowered}; templates: {template_refusal} (aten ops: {', '.join(a.aten_ops) or 'none'})"
    return KernelPlan(template="lowered", label=lowered.label, out_dtype="float32")


def design(a: ReferenceAnalysis | None) -> KernelDesign | str:
    """The offline designer's answer: a KernelDesign carrying the plan, or the reason there is none."""
    if a is None:
        return "no traced reference"
    plan = choose_plan(a)
    if isinstance(plan, str):
        return plan
    tiling = {
        "elementwise": "flat 1-D tiles over the contiguous input, masked tail; the op chain fused in registers",
        "rowwise": "one program per row (the reduced dims, addressed with strides); one pass over the row per "
                   "reduction, then a pass that writes per-element outputs (or one value per row)",
        "matmul": "2-D output tiles, K loop with tl.dot (ieee fp32), fp32 accumulator, masked edges; "
                  "transposes are strides, not copies",
        "lowered": "the traced graph lowered op by op: pointwise chains fused into their consumer's kernel, "
                   "reductions over strided rows, matmul / implicit-GEMM convolution with tl.dot, pooling and "
                   "scans as their own kernels; torch only allocates and takes views",
    }[plan.template]
    blocks = {"matmul": {"BLOCK_M": 32, "BLOCK_N": 32, "BLOCK_K": 32}, "elementwise": {"BLOCK": 1024},
              "rowwise": {"BLOCK": 1024}, "lowered": {}}[plan.template]
    grid = {"elementwise": "cdiv(numel, BLOCK)", "rowwise": "(rows,)",
            "matmul": "(cdiv(M, BLOCK_M), cdiv(N, BLOCK_N)" + (", batch)" if plan.batched else ")"),
            "lowered": "one grid per kernel launch, sized from the run-time shapes"}[plan.template]
    return KernelDesign(family=plan.template, block_sizes=blocks, grid=grid, tiling=tiling,
                        notes=f"read from the traced reference: {plan.label}", plan=plan)


class _NoTemplate(Exception):
    pass


@dataclass
class _Value:
    """A traced value: where it comes from and its shape."""

    kind: str  # input | param | scalar | node | const
    index: int = 0
    item: int = 0
    name: str = ""
    const: float = 0.0
    spec: TensorSpec | None = None


@dataclass
class _Built:
    ops: list[PlanOp] = field(default_factory=list)
    memo: dict[tuple, Operand] = field(default_factory=dict)


class _Reader:
    def __init__(self, a: ReferenceAnalysis):
        self.a = a
        self.packets = [_packet(c.op) for c in a.calls]

    # -- the graph ---------------------------------------------------------------------------------

    def value(self, arg: Any) -> _Value:
        if isinstance(arg, (int, float)) and not isinstance(arg, bool):
            return _Value("const", const=float(arg))
        if isinstance(arg, dict) and "float" in arg:
            return _Value("const", const=float(arg["float"]))
        if not isinstance(arg, dict) or "ref" not in arg:
            raise _NoTemplate(f"an operand the templates cannot take ({arg!r})")
        ref, index = arg["ref"], int(arg.get("index", 0))
        if ref == "input":
            return _Value("input", index=index, spec=self.a.inputs[index].tensor)
        if ref == "param":
            return _Value("param", name=str(arg.get("name", "")), spec=self.a.params[index].tensor)
        if ref == "scalar":
            return _Value("scalar", index=index)
        call = self.a.calls[index]
        if self.packets[index] == "getitem":
            src, item = call.args[0], int(call.args[1])  # type: ignore[arg-type]
            inner = self.value(src)
            return _Value("node", index=inner.index, item=item,
                          spec=self.a.calls[inner.index].out[item] if item < len(self.a.calls[inner.index].out) else None)
        return _Value("node", index=index, spec=call.out[0] if call.out else None)

    def through_views(self, v: _Value) -> _Value:
        """Skip view-like ops that keep the shape (clone, alias, a view to the same shape)."""
        while v.kind == "node" and self.packets[v.index] in VIEW_OPS:
            inner = self.value(self.a.calls[v.index].args[0])
            if inner.spec is not None and v.spec is not None and inner.spec.shape != v.spec.shape:
                break
            v = inner
        return v

    def reachable(self, roots: list[_Value]) -> list[int]:
        seen: set[int] = set()
        todo = [r.index for r in roots if r.kind == "node"]
        while todo:
            i = todo.pop()
            if i in seen:
                continue
            seen.add(i)
            for arg in _refs(self.a.calls[i].args) + _refs(list(self.a.calls[i].kwargs.values())):
                if arg.get("ref") == "node":
                    todo.append(int(arg["index"]))
        return sorted(seen)

    # -- choosing ------------------------------------------------------------------------------------

    def plan(self) -> KernelPlan:
        if len(self.a.outputs) != 1:
            raise _NoTemplate(f"forward returns {len(self.a.outputs)} outputs; the templates write one")
        out = self.through_views(self.value(self.a.outputs[0]))
        if out.kind != "node" or out.spec is None:
            raise _NoTemplate("forward returns an input or a constant, not a computed tensor")
        nodes = self.reachable([out])
        packets = {self.packets[i] for i in nodes} - {"getitem"}
        unknown = sorted(p for p in packets if p not in VIEW_OPS | MATMUL_OPS | REDUCTIONS | set(UNARY) | set(BINARY)
                         | {"permute", "t", "transpose"})
        if unknown:
            raise _NoTemplate(f"no template for {', '.join(unknown)}")
        if packets & MATMUL_OPS:
            return self.matmul(out, nodes)
        tensors = self.tensor_inputs(nodes)
        if len(tensors) != 1:
            raise _NoTemplate(f"the templates take one tensor input; this forward reads {len(tensors)}")
        x = tensors[0]
        spec = self.a.inputs[x].tensor
        assert spec is not None
        if spec.dtype not in FLOAT_DTYPES:
            raise _NoTemplate(f"input dtype {spec.dtype} (the templates take floating point)")
        if packets & REDUCTIONS:
            return self.rowwise(out, x, spec)
        return self.elementwise(out, x, spec)

    def tensor_inputs(self, nodes: list[int]) -> list[int]:
        found: list[int] = []
        for i in nodes:
            for arg in _refs(self.a.calls[i].args):
                if arg.get("ref") == "input" and int(arg["index"]) not in found:
                    found.append(int(arg["index"]))
        return found

    def scalars(self, nodes: list[int]) -> list[int]:
        found: list[int] = []
        for i in nodes:
            for arg in _refs(self.a.calls[i].args):
                if arg.get("ref") == "scalar" and int(arg["index"]) not in found:
                    found.append(int(arg["index"]))
        return sorted(found)

    # -- elementwise ---------------------------------------------------------------------------------

    def elementwise(self, out: _Value, x: int, spec: TensorSpec) -> KernelPlan:
        assert out.spec is not None
        if out.spec.shape != spec.shape:
            raise _NoTemplate(f"output shape {out.spec.shape} differs from the input's {spec.shape} "
                              "without a reduction (broadcast or reshape)")
        built = _Built()
        result = self.pointwise(out, built, rowwise=None)
        built.ops.append(PlanOp(op="out", args=[result]))
        label = ", ".join(_describe(op) for op in built.ops[:-1]) or "copy"
        return KernelPlan(template="elementwise", label=f"elementwise({label})", x=x, inputs=[x],
                          scalars=self.scalars(self.reachable([out])), ops=built.ops, out_dtype=out.spec.dtype)

    def pointwise(self, v: _Value, built: _Built, rowwise: "_Rows | None") -> Operand:
        """The plan operand computing `v` (adding ops to `built`), for elementwise or rowwise plans."""
        v = self.through_views(v)
        key = (v.kind, v.index, v.item, v.name, v.const)
        if key in built.memo:
            return built.memo[key]
        if v.kind == "const":
            return Operand(kind="const", value=v.const)
        if v.kind == "scalar":
            return Operand(kind="scalar", index=v.index)
        if v.kind == "input":
            return Operand(kind="x", index=v.index)
        if v.kind == "param":
            if rowwise is None:
                raise _NoTemplate(f"the elementwise template takes no parameters (uses {v.name})")
            return rowwise.param(v)
        call = self.a.calls[v.index]
        packet = self.packets[v.index]
        if packet in REDUCTIONS:
            if rowwise is None:
                raise _NoTemplate(f"{packet} is a reduction")
            result = rowwise.reduction(v, built)
        elif packet in UNARY:
            name, attrs = UNARY[packet]
            vals = self.args_of(call, [a for a, _ in attrs], [d for _, d in attrs], first=1)
            if packet == "gelu" and vals.get("approximate") not in ("none", "tanh"):
                raise _NoTemplate(f"gelu approximate={vals.get('approximate')!r}")
            arg = self.pointwise(self.value(call.args[0]), built, rowwise)
            result = _emit(built, PlanOp(op=name, args=[arg], attrs={k: _plain(v2) for k, v2 in vals.items()}))
        elif packet in BINARY:
            if len(call.args) < 2:
                raise _NoTemplate(f"{packet} with {len(call.args)} operands")
            a_op = self.pointwise(self.value(call.args[0]), built, rowwise)
            b_op = self.pointwise(self.value(call.args[1]), built, rowwise)
            alpha = call.kwargs.get("alpha", call.args[2] if len(call.args) > 2 else 1)
            if packet == "div" and call.kwargs.get("rounding_mode") not in (None,):
                raise _NoTemplate(f"div rounding_mode={call.kwargs.get('rounding_mode')!r}")
            if alpha != 1 and packet in ("add", "sub", "rsub"):
                scale = Operand(kind="const", value=float(alpha))  # type: ignore[arg-type]
                b_op = _emit(built, PlanOp(op="mul", args=[b_op, scale]))
            result = _emit(built, PlanOp(op=BINARY[packet], args=[a_op, b_op]))
        else:
            raise _NoTemplate(f"{packet} in an elementwise chain")
        built.memo[key] = result
        return result

    def args_of(self, call: Any, names: list[str], defaults: list[Any], first: int) -> dict[str, Any]:
        values = dict(zip(names, defaults))
        for name, arg in zip(names, call.args[first:]):
            values[name] = arg
        for name in names:
            if name in call.kwargs:
                values[name] = call.kwargs[name]
        for name, v in values.items():
            if isinstance(v, dict):
                if "float" in v:
                    values[name] = float(v["float"])
                else:
                    raise _NoTemplate(f"{name} comes from a tensor or an input at run time")
        return values

    # -- rowwise -------------------------------------------------------------------------------------

    def rowwise(self, out: _Value, x: int, spec: TensorSpec) -> KernelPlan:
        rows = _Rows(self, spec)
        built = _Built()
        result = self.pointwise(out, built, rows)
        assert out.spec is not None and rows.dims is not None
        rows.check_params()
        reduced = [s for i, s in enumerate(spec.shape) if i not in rows.dims]
        kept = [1 if i in rows.dims else s for i, s in enumerate(spec.shape)]
        if out.spec.shape == spec.shape:
            keepdim, per_row = False, False
        elif out.spec.shape == kept:
            keepdim, per_row = True, True
        elif out.spec.shape == reduced:
            keepdim, per_row = False, True
        else:
            raise _NoTemplate(f"output shape {out.spec.shape} is neither the input's {spec.shape} nor reduced "
                              f"over dims {rows.dims}")
        if per_row != (rows.kind(result, built) == "stat"):
            raise _NoTemplate("the output mixes per-row and per-element values in a way the template cannot write")
        built.ops.append(PlanOp(op="out", args=[result]))
        nodes = self.reachable([out])
        label = ", ".join(dict.fromkeys(self.packets[i].lstrip("_") for i in nodes
                                        if self.packets[i] not in VIEW_OPS | {"getitem"}))
        return KernelPlan(template="rowwise", label=f"rowwise dims={rows.dims}: {label}", x=x, inputs=[x],
                          scalars=self.scalars(self.reachable([out])), params=rows.params, ops=built.ops,
                          dims=rows.dims, keepdim=keepdim, out_dtype=out.spec.dtype)

    # -- matmul --------------------------------------------------------------------------------------

    def matmul(self, out: _Value, nodes: list[int]) -> KernelPlan:
        mms = [i for i in nodes if self.packets[i] in MATMUL_OPS]
        if len(mms) != 1:
            raise _NoTemplate(f"{len(mms)} matrix products (the template does one)")
        i = mms[0]
        if self.through_views(out).index != i:
            raise _NoTemplate("ops after the matrix product (the template returns the product itself)")
        extra = [self.packets[j] for j in nodes if j != i and self.packets[j] not in ("permute", "t", "transpose")]
        if extra:
            raise _NoTemplate(f"{', '.join(extra)} around the matrix product")
        call, packet = self.a.calls[i], self.packets[i]
        a, ta = self.operand_input(call.args[0], batched=packet == "bmm")
        b, tb = self.operand_input(call.args[1], batched=packet == "bmm")
        for idx in (a, b):
            spec = self.a.inputs[idx].tensor
            if spec is None or spec.dtype not in FLOAT_DTYPES:
                raise _NoTemplate("matrix product of non-floating inputs")
        form = {"mm": "matmul", "bmm": "bmm", "mv": "matvec"}[packet]
        if packet == "mm" and call.out and call.out[0].shape[1] == 1:
            form = "matvec"
        label = f"{form}({'A^T' if ta else 'A'}, {'B^T' if tb else 'B'})"
        assert call.out
        return KernelPlan(template="matmul", label=label, inputs=[a, b], transpose_a=ta, transpose_b=tb,
                          batched=packet == "bmm", vector=packet == "mv", out_dtype=call.out[0].dtype)

    def operand_input(self, arg: Any, *, batched: bool) -> tuple[int, bool]:
        """(input index, transposed) for a matrix-product operand: an input, or a transpose of one."""
        v = self.through_views(self.value(arg))
        transposed = False
        while v.kind == "node" and self.packets[v.index] in ("permute", "t", "transpose"):
            call = self.a.calls[v.index]
            rank = len(call.out[0].shape) if call.out else 0
            if self.packets[v.index] == "permute":
                perm = [int(d) % rank for d in call.args[1]]  # type: ignore[union-attr]
                swap = list(range(rank - 2)) + [rank - 1, rank - 2]
                if perm != swap:
                    raise _NoTemplate(f"permute {perm} of a matrix-product operand")
            elif self.packets[v.index] == "transpose":
                d0, d1 = sorted(int(d) % rank for d in call.args[1:3])  # type: ignore[arg-type]
                if (d0, d1) != (rank - 2, rank - 1):
                    raise _NoTemplate(f"transpose({d0}, {d1}) of a matrix-product operand")
            transposed = not transposed
            v = self.through_views(self.value(call.args[0]))
        if v.kind != "input":
            raise _NoTemplate("a matrix-product operand that is computed, not a forward input")
        return v.index, transposed


class _Rows:
    """Rowwise bookkeeping: the one set of reduced dims, which values are per row, the parameters."""

    def __init__(self, reader: _Reader, spec: TensorSpec):
        self.r = reader
        self.spec = spec
        self.dims: list[int] | None = None
        self.params: list[str] = []
        self.param_specs: list[TensorSpec] = []

    def set_dims(self, dims: list[int] | None) -> None:
        rank = len(self.spec.shape)
        norm = sorted({int(d) % rank for d in dims}) if dims else list(range(rank))
        if norm != list(range(norm[0], norm[-1] + 1)):
            raise _NoTemplate(f"reduction over non-adjacent dims {norm}")
        if self.dims is not None and self.dims != norm:
            raise _NoTemplate(f"reductions over different dims ({self.dims} and {norm})")
        self.dims = norm

    def row_shape(self) -> list[int]:
        assert self.dims is not None
        return [self.spec.shape[d] for d in self.dims]

    def param(self, v: _Value) -> Operand:
        """A parameter operand; `check_params` validates it once the reduced dims are known."""
        assert v.spec is not None
        if v.name not in self.params:
            self.params.append(v.name)
            self.param_specs.append(v.spec)
        return Operand(kind="param", name=v.name)

    def check_params(self) -> None:
        assert self.dims is not None
        for name, spec in zip(self.params, self.param_specs):
            if self.dims[-1] != len(self.spec.shape) - 1 or spec.shape != self.row_shape():
                raise _NoTemplate(f"parameter {name} of shape {spec.shape} does not run along the reduced "
                                  f"trailing dims {self.dims}")

    def kind(self, operand: Operand, built: _Built) -> str:
        if operand.kind in ("x", "param"):
            return "row"
        if operand.kind != "value":
            return "stat"
        op = built.ops[operand.index]
        if op.op in ("sum", "amax", "amin", "argmax", "argmin", "numel"):
            return "stat"
        return "row" if any(self.kind(a, built) == "row" for a in op.args) else "stat"

    def operand_of_x(self, arg: Any, built: _Built) -> Operand:
        """A reduction's operand: must have the input's full shape."""
        v = self.r.through_views(self.r.value(arg))
        if v.spec is None or v.spec.shape != self.spec.shape:
            raise _NoTemplate("a reduction of a value shaped unlike the input")
        return self.r.pointwise(v, built, self)

    def reduction(self, v: _Value, built: _Built) -> Operand:
        call = self.r.a.calls[v.index]
        packet = self.r.packets[v.index]
        args = call.args
        opnd = lambda: self.operand_of_x(args[0], built)  # noqa: E731
        numel = lambda: _emit(built, PlanOp(op="numel"))  # noqa: E731

        def dims_arg(pos: int, name: str = "dim") -> list[int] | None:
            raw = call.kwargs.get(name, args[pos] if len(args) > pos else None)
            if raw is None or raw == []:
                return None
            return [int(d) for d in raw] if isinstance(raw, list) else [int(raw)]  # type: ignore[arg-type]

        def check_keepdim(item_spec: TensorSpec | None) -> None:
            if item_spec is None:
                return
            if item_spec.shape not in (self.spec.shape, self._kept(), self._reduced()):
                raise _NoTemplate(f"{packet} result shape {item_spec.shape}")

        if packet in ("sum", "mean", "amax", "amin", "prod"):
            if packet == "prod":
                raise _NoTemplate("prod (no template for products)")
            dims = dims_arg(1)
            self.set_dims(dims)
            check_keepdim(v.spec)
            if call.kwargs.get("dtype") not in (None,):
                raise _NoTemplate(f"{packet} with dtype=")
            s = _emit(built, PlanOp(op="sum" if packet in ("sum", "mean") else packet, args=[opnd()]))
            return _emit(built, PlanOp(op="div", args=[s, numel()])) if packet == "mean" else s
        if packet in ("max", "min", "argmax", "argmin"):
            if packet in ("max", "min") and len(args) == 1:
                self.set_dims(None)
                return _emit(built, PlanOp(op="a" + packet, args=[opnd()]))
            dims = dims_arg(1)
            self.set_dims(dims)
            base = packet.removeprefix("arg")
            if packet.startswith("arg") or v.item == 1:
                return _emit(built, PlanOp(op="arg" + base, args=[opnd()]))
            return _emit(built, PlanOp(op="a" + base, args=[opnd()]))
        if packet in ("linalg_vector_norm", "norm"):
            ord_ = call.kwargs.get("ord", args[1] if len(args) > 1 else 2)
            self.set_dims(dims_arg(2))
            x = opnd()
            if ord_ in (2, 2.0):
                s = _emit(built, PlanOp(op="sum", args=[_emit(built, PlanOp(op="mul", args=[x, x]))]))
                return _emit(built, PlanOp(op="sqrt", args=[s]))
            if ord_ in (1, 1.0):
                return _emit(built, PlanOp(op="sum", args=[_emit(built, PlanOp(op="abs", args=[x]))]))
            if ord_ == {"float": "inf"}:
                return _emit(built, PlanOp(op="amax", args=[_emit(built, PlanOp(op="abs", args=[x]))]))
            raise _NoTemplate(f"vector norm of order {ord_}")
        if packet in ("_softmax", "_log_softmax"):
            self.set_dims([int(args[1])])  # type: ignore[arg-type]
            x = opnd()
            m = _emit(built, PlanOp(op="amax", args=[x]))
            shifted = _emit(built, PlanOp(op="sub", args=[x, m]))
            e = _emit(built, PlanOp(op="exp", args=[shifted]))
            s = _emit(built, PlanOp(op="sum", args=[e]))
            if packet == "_softmax":
                return _emit(built, PlanOp(op="div", args=[e, s]))
            return _emit(built, PlanOp(op="sub", args=[shifted, _emit(built, PlanOp(op="log", args=[s]))]))
        if packet in ("var", "std", "var_mean"):
            correction = call.kwargs.get("correction", 1)
            if "unbiased" in call.kwargs:
                correction = 1 if call.kwargs["unbiased"] else 0
            self.set_dims(dims_arg(1))
            x = opnd()
            mean = _emit(built, PlanOp(op="div", args=[_emit(built, PlanOp(op="sum", args=[x])), numel()]))
            if packet == "var_mean" and v.item == 1:
                return mean
            d = _emit(built, PlanOp(op="sub", args=[x, mean]))
            ss = _emit(built, PlanOp(op="sum", args=[_emit(built, PlanOp(op="mul", args=[d, d]))]))
            dof = Operand(kind="const", value=float(correction))  # type: ignore[arg-type]
            n = _emit(built, PlanOp(op="sub", args=[numel(), dof]))
            var = _emit(built, PlanOp(op="div", args=[ss, n]))
            return _emit(built, PlanOp(op="sqrt", args=[var])) if packet == "std" else var
        if packet == "native_layer_norm":
            if v.item != 0:
                raise _NoTemplate("layer norm's mean/rstd outputs")
            shape = [int(s) for s in args[1]]  # type: ignore[union-attr]
            rank = len(self.spec.shape)
            self.set_dims(list(range(rank - len(shape), rank)))
            x = opnd()
            mean = _emit(built, PlanOp(op="div", args=[_emit(built, PlanOp(op="sum", args=[x])), numel()]))
            d = _emit(built, PlanOp(op="sub", args=[x, mean]))
            var = _emit(built, PlanOp(op="div", args=[
                _emit(built, PlanOp(op="sum", args=[_emit(built, PlanOp(op="mul", args=[d, d]))])), numel()]))
            eps = float(args[4]) if len(args) > 4 else 1e-5  # type: ignore[arg-type]
            rstd = _emit(built, PlanOp(op="rsqrt", args=[
                _emit(built, PlanOp(op="add", args=[var, Operand(kind="const", value=eps)]))]))
            y = _emit(built, PlanOp(op="mul", args=[d, rstd]))
            if len(args) > 2 and args[2] is not None:
                y = _emit(built, PlanOp(op="mul", args=[y, self.r.pointwise(self.r.value(args[2]), built, self)]))
            if len(args) > 3 and args[3] is not None:
                y = _emit(built, PlanOp(op="add", args=[y, self.r.pointwise(self.r.value(args[3]), built, self)]))
            return y
        raise _NoTemplate(f"{packet} (no rowwise template)")

    def _kept(self) -> list[int]:
        assert self.dims is not None
        return [1 if i in self.dims else s for i, s in enumerate(self.spec.shape)]

    def _reduced(self) -> list[int]:
        assert self.dims is not None
        return [s for i, s in enumerate(self.spec.shape) if i not in self.dims]


def _emit(built: _Built, op: PlanOp) -> Operand:
    built.ops.append(op)
    return Operand(kind="value", index=len(built.ops) - 1)


def _packet(op: str) -> str:
    """`aten.add_.Scalar` -> `add` (in-place variants on traced intermediates compute the same)."""
    if op == "getitem" or not op.startswith("aten."):
        return op
    name = op.split(".")[1]
    return name[:-1] if name.endswith("_") and not name.startswith("_") else name


def _refs(values: list[Any]) -> list[dict]:
    found: list[dict] = []
    for v in values:
        if isinstance(v, dict) and "ref" in v:
            found.append(v)
        elif isinstance(v, list):
            found += _refs(v)
    return found


def _plain(value: Any) -> Any:
    if isinstance(value, float) and not math.isfinite(value):
        return str(value)
    return value


def _describe(op: PlanOp) -> str:
    if op.op == "gelu":
        return "gelu " + ("tanh" if op.attrs.get("approximate") == "tanh" else "erf")
    if op.op == "elu" and op.attrs.get("scale", 1.0) != 1.0:
        return "selu"
    if any(a.kind == "scalar" for a in op.args):
        return f"{op.op} scalar"
    return op.op
