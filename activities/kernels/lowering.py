"""The offline lowering: the reference's traced aten graph, rewritten into a few primitive steps and then
into Triton kernels (the building blocks in `lowering_blocks`), for any graph made of the ops below.

Two passes, both pure (no torch: the workflow runs `lower` to name the family):

1. `_Reader` turns aten calls into primitive nodes. Composite ops are decomposed here, in plain sight:
   softmax = amax, exp, sum, div; layer/batch/group/instance norm = mean, variance (means of squares of
   the centred value), then a pointwise normalise with the affine parameters; addmm = matmul + bias;
   losses = their pointwise formula + a mean or sum. Views (view, permute, expand, select, ...) stay
   views. An op it does not know makes the whole graph refuse, naming the op.
2. `_Emitter` walks back from the outputs and writes the candidate's forward: pointwise nodes are not
   launched one by one but fused into the kernel of whoever consumes them (a pointwise chain, a
   reduction's input), so `relu(x + b) * s` is one kernel; everything else is one block launch.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

from contracts.kernel_job import Operand, PlanOp, ReferenceAnalysis
from activities.kernels import lowering_blocks as blocks

IDENTITY = frozenset({"clone", "contiguous", "alias", "detach", "lift_fresh_copy", "dropout"})
UNARY: dict[str, tuple[str, list[tuple[str, Any]]]] = {
    "relu": ("relu", []), "sigmoid": ("sigmoid", []), "tanh": ("tanh", []), "exp": ("exp", []),
    "log": ("log", []), "sqrt": ("sqrt", []), "rsqrt": ("rsqrt", []), "abs": ("abs", []), "neg": ("neg", []),
    "reciprocal": ("reciprocal", []), "sin": ("sin", []), "cos": ("cos", []), "erf": ("erf", []),
    "exp2": ("exp2", []), "log2": ("log2", []), "floor": ("floor", []), "ceil": ("ceil", []),
    "silu": ("silu", []), "hardsigmoid": ("hardsigmoid", []), "hardswish": ("hardswish", []),
    "mish": ("mish", []), "square": ("square", []), "log1p": ("log1p", []), "expm1": ("expm1", []),
    "sign": ("sign", []), "logical_not": ("logical_not", []),
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
          "pow": "pow", "rsub": "rsub", "xlogy": "xlogy", "gt": "gt", "lt": "lt", "ge": "ge", "le": "le",
          "eq": "eq", "ne": "ne", "fmax": "maximum", "fmin": "minimum"}


class Refused(Exception):
    """The graph has an op (or a use of one) the lowering does not take; the message names it."""


@dataclass
class Const:
    value: float


@dataclass
class Scalar:
    index: int


@dataclass
class Node:
    """One primitive step: `op` is input, param, pw, reduce, view, matmul, conv, pool, scan, gather, cat,
    zeros, flip or tri; `args` are node ids, Const or Scalar; shapes are the traced ones (decisions only,
    never written into the candidate)."""

    op: str
    args: list[Any]
    attrs: dict[str, Any] = field(default_factory=dict)
    shape: list[int] = field(default_factory=list)
    dtype: str = "float32"


@dataclass
class Lowered:
    """A lowered graph: its nodes and the forward's outputs (node ids)."""

    nodes: list[Node]
    outputs: list[int]
    label: str


def lower(a: ReferenceAnalysis) -> Lowered | str:
    """The lowered graph, or one line saying which op (or use of it) cannot be lowered."""
    if a.trace_error:
        return f"the reference could not be traced ({a.trace_error})"
    try:
        return _Reader(a).read()
    except Refused as e:
        return str(e)


def packet(op: str) -> str:
    """`aten.add_.Scalar` -> `add` (in-place variants on traced intermediates compute the same)."""
    if op == "getitem" or not op.startswith("aten."):
        return op
    name = op.split(".")[1]
    return name[:-1] if name.endswith("_") and not name.startswith("_") else name


def broadcast(*shapes: list[int]) -> list[int]:
    rank = max((len(s) for s in shapes), default=0)
    out = []
    for j in range(rank):
        sizes = {s[j - rank + len(s)] for s in shapes if j - rank + len(s) >= 0} - {1}
        out.append(max(sizes) if sizes else 1)
    return out


# --- pass 1: aten calls -> primitive nodes ------------------------------------------------------


class _Reader:
    def __init__(self, a: ReferenceAnalysis):
        self.a = a
        self.nodes: list[Node] = []
        self.memo: dict[tuple, Any] = {}
        self.seen_ops: list[tuple[int, str]] = []
        """(call index, op) of the compute ops lowered, for the label."""

    def read(self) -> Lowered:
        outs = []
        for ref in self.a.outputs:
            v = self.value(ref)
            if not isinstance(v, int):
                raise Refused("forward returns a constant, not a tensor")
            outs.append(v)
        ops = [op for _, op in sorted(self.seen_ops)]
        label = "lowered: " + " → ".join(dict.fromkeys(o.lstrip("_") for o in ops)) if ops else "lowered: copy"
        return Lowered(nodes=self.nodes, outputs=outs, label=label)

    # -- values --------------------------------------------------------------------------------

    def add(self, op: str, args: list[Any], shape: list[int], dtype: str = "float32", **attrs: Any) -> int:
        self.nodes.append(Node(op=op, args=args, attrs=attrs, shape=list(shape), dtype=dtype))
        return len(self.nodes) - 1

    def shape(self, v: Any) -> list[int]:
        return self.nodes[v].shape if isinstance(v, int) else []

    def value(self, arg: Any) -> Any:
        if isinstance(arg, bool):
            return Const(float(arg))
        if isinstance(arg, (int, float)):
            return Const(float(arg))
        if isinstance(arg, dict) and "float" in arg:
            return Const(float(arg["float"]))
        if not isinstance(arg, dict) or "ref" not in arg:
            raise Refused(f"an operand the lowering cannot take ({str(arg)[:60]})")
        ref, index = arg["ref"], int(arg.get("index", 0))
        if ref == "scalar":
            return Scalar(index)
        key = (ref, index)
        if key in self.memo:
            return self.memo[key]
        if ref == "input":
            spec = self.a.inputs[index].tensor
            if spec is None:
                raise Refused(f"forward input {index} is not a tensor")
            result: Any = self.add("input", [], spec.shape, spec.dtype, index=index)
        elif ref == "param":
            spec = self.a.params[index].tensor
            result = self.add("param", [], spec.shape, spec.dtype, name=self.a.params[index].name)
        else:
            result = self.call(index)
        self.memo[key] = result
        return result

    def item(self, index: int, item: int) -> Any:
        results = self.value({"ref": "node", "index": index})
        if not isinstance(results, list) or item >= len(results) or results[item] is None:
            raise Refused(f"output {item} of {packet(self.a.calls[index].op)}")
        return results[item]

    # -- one aten call ---------------------------------------------------------------------------

    def call(self, i: int) -> Any:
        c = self.a.calls[i]
        p = packet(c.op)
        if p == "getitem":
            return self.item(int(c.args[0]["index"]), int(c.args[1]))  # type: ignore[index,arg-type]
        if p.startswith("get_attr"):
            raise Refused("a tensor constant built inside forward (get_attr): its value is not in the trace")
        if p not in ("view", "_unsafe_view", "reshape", "permute", "t", "transpose", "unsqueeze", "squeeze",
                     "expand", "select", "slice", *IDENTITY):
            self.seen_ops.append((i, p))
        out = c.out[0] if c.out else None
        shape, dtype = (out.shape, out.dtype) if out else ([], "float32")
        args = c.args
        kw = c.kwargs

        def arg(pos: int, name: str, default: Any = None) -> Any:
            if name in kw:
                return kw[name]
            return args[pos] if len(args) > pos else default

        x = lambda: self.value(args[0])  # noqa: E731
        if p in IDENTITY:
            return x()
        if p == "_to_copy":
            return self.add("pw", [x()], shape, dtype, fn="copy")
        if p in ("view", "_unsafe_view", "reshape"):
            v = x()
            return self.add("view", [v], shape, dtype, kind="reshape", src=self.shape(v))
        if p in ("permute", "t", "transpose"):
            v = x()
            rank = len(self.shape(v))
            if p == "t":
                perm = [1, 0] if rank == 2 else list(range(rank))
            elif p == "transpose":
                perm = list(range(rank))
                d0, d1 = int(args[1]) % rank, int(args[2]) % rank  # type: ignore[arg-type]
                perm[d0], perm[d1] = perm[d1], perm[d0]
            else:
                perm = [int(d) % rank for d in args[1]]  # type: ignore[union-attr]
            return self.add("view", [v], shape, dtype, kind="permute", perm=perm)
        if p == "unsqueeze":
            return self.add("view", [x()], shape, dtype, kind="unsqueeze", dim=int(args[1]))  # type: ignore[arg-type]
        if p == "squeeze":
            v = x()
            dims = arg(1, "dim")
            src = self.shape(v)
            if dims is None:
                dims = [j for j, s in enumerate(src) if s == 1]
            dims = [int(d) % max(len(src), 1) for d in (dims if isinstance(dims, list) else [dims])]
            return self.add("view", [v], shape, dtype, kind="squeeze", dims=dims)
        if p == "expand":
            v = x()
            return self.add("view", [v], shape, dtype, kind="expand", src=self.shape(v))
        if p == "select":
            v = x()
            return self.add("view", [v], shape, dtype, kind="select", dim=int(args[1]), index=int(args[2]))  # type: ignore[arg-type]
        if p == "slice":
            v = x()
            src = self.shape(v)
            dim = int(arg(1, "dim", 0)) % len(src)
            return self.add("view", [v], shape, dtype, kind="slice", dim=dim, start=arg(2, "start"), end=arg(3, "end"),
                            step=int(arg(4, "step", 1)), size=src[dim])
        if p == "flip":
            return self.add("flip", [x()], shape, dtype, dims=[int(d) % len(shape) for d in args[1]])  # type: ignore[union-attr]
        if p in ("triu", "tril"):
            return self.add("tri", [x()], shape, dtype, upper=p == "triu", diagonal=int(arg(1, "diagonal", 0)))
        if p in ("zeros_like", "zeros", "new_zeros"):
            if p == "zeros_like":
                return self.add("zeros", [x()], shape, dtype)
            raise Refused(f"{p} with a traced size")
        if p in UNARY:
            return self.unary(p, c, shape, dtype)
        if p in BINARY:
            a0, b0 = self.value(args[0]), self.value(args[1])
            alpha = kw.get("alpha", args[2] if len(args) > 2 else 1)
            if p == "div" and kw.get("rounding_mode") is not None:
                raise Refused(f"div rounding_mode={kw.get('rounding_mode')!r}")
            if alpha != 1 and p in ("add", "sub", "rsub"):
                b0 = self.pw("mul", [b0, Const(float(alpha))], self.shape(b0))  # type: ignore[arg-type]
            return self.add("pw", [a0, b0], shape, dtype, fn=BINARY[p])
        if p == "where":
            return self.add("pw", [self.value(args[0]), self.value(args[1]), self.value(args[2])], shape, dtype,
                            fn="where")
        if p in ("sum", "mean", "amax", "amin"):
            dims = arg(1, "dim")
            keep = bool(arg(2, "keepdim", False))
            if kw.get("dtype") is not None:
                raise Refused(f"{p} with dtype=")
            return self.reduce("sum" if p == "sum" else p, x(), dims, keep, shape, dtype)
        if p in ("max", "min"):
            v = x()
            if len(args) == 1 and "dim" not in kw:
                return self.reduce("a" + p, v, None, False, shape, dtype)
            dim, keep = int(arg(1, "dim")), bool(arg(2, "keepdim", False))
            idx_shape = c.out[1].shape if len(c.out) > 1 else shape
            return [self.reduce("a" + p, v, [dim], keep, shape, dtype),
                    self.reduce("arg" + p, v, [dim], keep, idx_shape, "int64")]
        if p in ("argmax", "argmin"):
            dim = arg(1, "dim")
            return self.reduce(p, x(), None if dim is None else [int(dim)], bool(arg(2, "keepdim", False)), shape,
                               dtype)
        if p == "logsumexp":
            return self.reduce("logsumexp", x(), arg(1, "dim"), bool(arg(2, "keepdim", False)), shape, dtype)
        if p in ("var", "std"):
            corr = kw.get("correction", 1)
            if "unbiased" in kw:
                corr = 1 if kw["unbiased"] else 0
            corr = 1 if corr is None else corr
            var = self.variance(x(), arg(1, "dim"), bool(kw.get("keepdim", False)), float(corr), shape)  # type: ignore[arg-type]
            return self.pw("sqrt", [var], shape) if p == "std" else var
        if p in ("linalg_vector_norm", "norm"):
            ord_ = arg(1, "ord" if p == "linalg_vector_norm" else "p", 2)
            return self.norm(x(), ord_, arg(2, "dim"), bool(arg(3, "keepdim", False)), shape)
        if p in ("_softmax", "_log_softmax", "_safe_softmax", "softmax", "log_softmax"):
            return self.softmax(x(), int(args[1]), log="log" in p, safe=p == "_safe_softmax", shape=shape)  # type: ignore[arg-type]
        if p == "native_layer_norm":
            v = x()
            n = len(args[1])  # type: ignore[arg-type]
            rank = len(self.shape(v))
            dims = list(range(rank - n, rank))
            w, b = (self.value(args[k]) if args[k] is not None else None for k in (2, 3))
            return [self.normalize(v, dims, float(args[4]), w, b, per_channel=False), None, None]  # type: ignore[arg-type]
        if p in ("native_batch_norm", "_native_batch_norm_legit", "_native_batch_norm_legit_no_training"):
            return [self.batch_norm(p, args), None, None]
        if p == "native_group_norm":
            return [self.group_norm(args), None, None]
        if p in ("mm", "bmm", "mv", "addmm", "baddbmm", "matmul"):
            return self.matmul(p, args, kw, shape, dtype)
        if p == "convolution":
            w = self.value(args[1])
            bias = self.value(args[2]) if args[2] is not None else None
            return self.add("conv", [x(), w] + ([bias] if bias is not None else []), shape, dtype,
                            stride=list(args[3]), padding=list(args[4]), dilation=list(args[5]),  # type: ignore[arg-type]
                            transposed=bool(args[6]), output_padding=list(args[7]), groups=int(args[8]))  # type: ignore[arg-type]
        if p in ("max_pool1d_with_indices", "max_pool2d_with_indices", "max_pool3d_with_indices",
                 "max_pool1d", "max_pool2d", "max_pool3d"):
            d = int(p[8])
            k = _tup(args[1], d)
            attrs = dict(kernel=k, stride=_tup(arg(2, "stride") or k, d), padding=_tup(arg(3, "padding", 0), d),
                         dilation=_tup(arg(4, "dilation", 1), d), ceil_mode=bool(arg(5, "ceil_mode", False)),
                         kind="max")
            out = self.add("pool", [x()], shape, dtype, **attrs)
            return [out, None] if "indices" in p else out
        if p in ("avg_pool1d", "avg_pool2d", "avg_pool3d"):
            d = int(p[8])
            k = _tup(args[1], d)
            return self.add("pool", [x()], shape, dtype, kernel=k, stride=_tup(arg(2, "stride") or k, d),
                            padding=_tup(arg(3, "padding", 0), d), dilation=[1] * d,
                            ceil_mode=bool(arg(4, "ceil_mode", False)),
                            count_include_pad=bool(arg(5, "count_include_pad", True)),
                            divisor=arg(6, "divisor_override") or 0, kind="avg")
        if p in ("cumsum", "cumprod"):
            if kw.get("dtype") is not None:
                raise Refused(f"{p} with dtype=")
            return self.add("scan", [x()], shape, dtype, fn=p, dim=int(args[1]))  # type: ignore[arg-type]
        if p == "cat":
            parts = [self.value(t) for t in args[0]]  # type: ignore[union-attr]
            return self.add("cat", parts, shape, dtype, dim=int(arg(1, "dim", 0)))
        if p in ("mse_loss", "l1_loss", "smooth_l1_loss", "huber_loss"):
            return self.loss(p, args, kw, shape)
        if p == "nll_loss_forward":
            return [self.nll(args), None]
        raise Refused(f"no lowering for {p}")

    # -- pointwise and reductions ----------------------------------------------------------------

    def pw(self, fn: str, args: list[Any], shape: list[int], **attrs: Any) -> int:
        return self.add("pw", args, shape, "float32", fn=fn, attrs=attrs)

    def unary(self, p: str, c: Any, shape: list[int], dtype: str) -> int:
        name, spec = UNARY[p]
        values = {k: d for k, d in spec}
        for (k, _), v in zip(spec, c.args[1:]):
            values[k] = v
        values.update({k: v for k, v in c.kwargs.items() if k in values})
        for k, v in values.items():
            if isinstance(v, dict):
                if "float" not in v:
                    raise Refused(f"{p}'s {k} comes from a tensor or an input at run time")
                values[k] = float(v["float"])
        if p == "gelu" and values.get("approximate") not in ("none", "tanh"):
            raise Refused(f"gelu approximate={values.get('approximate')!r}")
        return self.add("pw", [self.value(c.args[0])], shape, dtype, fn=name, attrs=values)

    def reduce(self, fn: str, v: Any, dims: Any, keep: bool, shape: list[int], dtype: str,
               correction: float = 0.0) -> int:
        rank = len(self.shape(v))
        if dims is None or dims == []:
            dims = list(range(rank))
        dims = [int(d) % max(rank, 1) for d in (dims if isinstance(dims, list) else [dims])]
        return self.add("reduce", [v], shape, dtype, fn=fn, dims=dims, keepdim=keep, correction=correction)

    def kept(self, v: Any, dims: list[int]) -> list[int]:
        return [1 if j in dims else s for j, s in enumerate(self.shape(v))]

    def variance(self, v: Any, dims: Any, keep: bool, correction: float, shape: list[int]) -> int:
        rank = len(self.shape(v))
        dims = list(range(rank)) if dims is None or dims == [] else [int(d) % rank for d in dims]
        mean = self.reduce("mean", v, dims, True, self.kept(v, dims), "float32")
        d = self.pw("sub", [v, mean], self.shape(v))
        return self.reduce("mean", self.pw("mul", [d, d], self.shape(v)), dims, keep, shape, "float32",
                           correction=correction)

    def norm(self, v: Any, ord_: Any, dims: Any, keep: bool, shape: list[int]) -> int:
        s = self.shape(v)
        if ord_ in (2, 2.0):
            sq = self.pw("mul", [v, v], s)
            return self.pw("sqrt", [self.reduce("sum", sq, dims, keep, shape, "float32")], shape)
        if ord_ in (1, 1.0):
            return self.reduce("sum", self.pw("abs", [v], s), dims, keep, shape, "float32")
        if ord_ == {"float": "inf"}:
            return self.reduce("amax", self.pw("abs", [v], s), dims, keep, shape, "float32")
        raise Refused(f"vector norm of order {ord_}")

    def softmax(self, v: Any, dim: int, *, log: bool, safe: bool, shape: list[int]) -> int:
        dim = dim % len(self.shape(v))
        kept = self.kept(v, [dim])
        m = self.reduce("amax", v, [dim], True, kept, "float32")
        m0 = self.pw("where", [self.pw("eq", [m, Const(-math.inf)], kept), Const(0.0), m], kept) if safe else m
        shifted = self.pw("sub", [v, m0], shape)
        e = self.pw("exp", [shifted], shape)
        s = self.reduce("sum", e, [dim], True, kept, "float32")
        if log:
            return self.pw("sub", [shifted, self.pw("log", [s], kept)], shape)
        y = self.pw("div", [e, s], shape)
        return self.pw("where", [self.pw("eq", [m, Const(-math.inf)], kept), Const(0.0), y], shape) if safe else y

    def normalize(self, v: Any, dims: list[int], eps: float, w: Any, b: Any, *, per_channel: bool) -> int:
        """(v - mean) * rsqrt(var + eps) [* w + b] over `dims` (biased variance, as torch's norms).
        `per_channel`: w and b run along dim 1 (batch/instance norm), else along the trailing dims."""
        shape = self.shape(v)
        kept = self.kept(v, dims)
        mean = self.reduce("mean", v, dims, True, kept, "float32")
        d = self.pw("sub", [v, mean], shape)
        var = self.reduce("mean", self.pw("mul", [d, d], shape), dims, True, kept, "float32")
        y = self.pw("mul", [d, self.pw("rsqrt", [self.pw("add", [var, Const(eps)], kept)], kept)], shape)
        for param, fn in ((w, "mul"), (b, "add")):
            if param is None:
                continue
            if per_channel:
                c_shape = [shape[1]] + [1] * (len(shape) - 2)
                param = self.add("view", [param], c_shape, kind="channel", rank=len(shape) - 2)
            y = self.pw(fn, [y, param], shape)
        return y

    def batch_norm(self, p: str, args: list[Any]) -> int:
        x = self.value(args[0])
        w, b = (self.value(args[k]) if args[k] is not None else None for k in (1, 2))
        training = p == "_native_batch_norm_legit" or (p == "native_batch_norm" and bool(args[5]))
        eps = float(args[-1])  # type: ignore[arg-type]
        shape = self.shape(x)
        if training:
            dims = [0] + list(range(2, len(shape)))
            return self.normalize(x, dims, eps, w, b, per_channel=True)
        rm, rv = self.value(args[3]), self.value(args[4])
        c_shape = [shape[1]] + [1] * (len(shape) - 2)
        mean = self.add("view", [rm], c_shape, kind="channel", rank=len(shape) - 2)
        var = self.add("view", [rv], c_shape, kind="channel", rank=len(shape) - 2)
        y = self.pw("mul", [self.pw("sub", [x, mean], shape),
                            self.pw("rsqrt", [self.pw("add", [var, Const(eps)], c_shape)], c_shape)], shape)
        for param, fn in ((w, "mul"), (b, "add")):
            if param is not None:
                y = self.pw(fn, [y, self.add("view", [param], c_shape, kind="channel", rank=len(shape) - 2)], shape)
        return y

    def group_norm(self, args: list[Any]) -> int:
        x = self.value(args[0])
        w, b = (self.value(args[k]) if args[k] is not None else None for k in (1, 2))
        groups, eps = int(args[6]), float(args[7])  # type: ignore[arg-type]
        shape = self.shape(x)
        gshape = [shape[0], groups, math.prod(shape[1:]) // groups]
        xg = self.add("view", [x], gshape, kind="groups", groups=groups)
        y = self.normalize(xg, [2], eps, None, None, per_channel=False)
        y = self.add("view", [y], shape, kind="like", like=x)
        return self.normalize_affine(y, w, b, shape)

    def normalize_affine(self, y: int, w: Any, b: Any, shape: list[int]) -> int:
        c_shape = [shape[1]] + [1] * (len(shape) - 2)
        for param, fn in ((w, "mul"), (b, "add")):
            if param is not None:
                y = self.pw(fn, [y, self.add("view", [param], c_shape, kind="channel", rank=len(shape) - 2)], shape)
        return y

    def matmul(self, p: str, args: list[Any], kw: dict, shape: list[int], dtype: str) -> int:
        if p in ("addmm", "baddbmm"):
            bias, a, b = (self.value(args[k]) for k in range(3))
            beta, alpha = float(kw.get("beta", 1)), float(kw.get("alpha", 1))  # type: ignore[arg-type]
            prod = self.add("matmul", [a, b], shape, dtype)
            if alpha != 1:
                prod = self.pw("mul", [prod, Const(alpha)], shape)
            if beta != 1:
                bias = self.pw("mul", [bias, Const(beta)], self.shape(bias))
            return self.pw("add", [prod, bias], shape)
        a, b = self.value(args[0]), self.value(args[1])
        if p == "matmul":
            raise Refused("aten.matmul (not decomposed)")
        if p == "mv":
            col = self.add("view", [b], self.shape(b) + [1], kind="unsqueeze", dim=-1)
            prod = self.add("matmul", [a, col], shape + [1], dtype)
            return self.add("view", [prod], shape, kind="squeeze", dims=[len(shape)])
        return self.add("matmul", [a, b], shape, dtype)

    def loss(self, p: str, args: list[Any], kw: dict, shape: list[int]) -> int:
        x, y = self.value(args[0]), self.value(args[1])
        reduction = int(kw.get("reduction", args[2] if len(args) > 2 else 1))  # type: ignore[arg-type]
        s = broadcast(self.shape(x), self.shape(y))
        d = self.pw("sub", [x, y], s)
        if p == "mse_loss":
            e = self.pw("mul", [d, d], s)
        elif p == "l1_loss":
            e = self.pw("abs", [d], s)
        else:
            default = 1.0
            key = "beta" if p == "smooth_l1_loss" else "delta"
            beta = float(kw.get(key, args[3] if len(args) > 3 else default))  # type: ignore[arg-type]
            a = self.pw("abs", [d], s)
            quad = self.pw("mul", [self.pw("mul", [a, a], s), Const(0.5 / beta if p == "smooth_l1_loss" else 0.5)], s)
            lin = self.pw("sub", [a, Const(0.5 * beta)], s)
            if p == "huber_loss":
                lin = self.pw("mul", [lin, Const(beta)], s)
            e = self.pw("where", [self.pw("lt", [a, Const(beta)], s), quad, lin], s)
        if reduction == 0:
            return e
        return self.reduce("mean" if reduction == 1 else "sum", e, None, False, shape, "float32")

    def nll(self, args: list[Any]) -> int:
        x, target = self.value(args[0]), self.value(args[1])
        if args[2] is not None:
            raise Refused("nll_loss with class weights")
        reduction = int(args[3])  # type: ignore[arg-type]
        if len(self.shape(x)) != 2:
            raise Refused("nll_loss over more than 2 dims")
        picked = self.add("gather", [x, target], self.shape(target), "float32")
        neg = self.pw("neg", [picked], self.shape(target))
        if reduction == 0:
            return neg
        return self.reduce("mean" if reduction == 1 else "sum", neg, None, False, [], "float32")


def _tup(v: Any, d: int) -> list[int]:
    if isinstance(v, list):
        return [int(x) for x in v] * (d if len(v) == 1 else 1)
    return [int(v)] * d


# --- pass 2: primitive nodes -> the candidate's forward -----------------------------------------

TORCH_DTYPES = {"float32": "torch.float32", "float16": "torch.float16", "bfloat16": "torch.bfloat16",
                "float64": "torch.float64", "int64": "torch.int64", "int32": "torch.int32", "bool": "torch.bool"}


class _Kernel:
    """One fused pointwise expression being built: its leaves (materialized tensors), scalars, lines."""

    def __init__(self, emitter: "_Emitter"):
        self.e = emitter
        self.leaves: list[tuple[str, tuple[int, ...]]] = []
        self.scalars: list[int] = []
        self.lines: list[str] = []
        self.memo: dict[int, str] = {}

    def leaf(self, var: str, flips: tuple[int, ...] = ()) -> str:
        if (var, flips) not in self.leaves:
            self.leaves.append((var, flips))
        return f"x{self.leaves.index((var, flips))}"

    def expr(self, v: Any) -> str:
        if isinstance(v, Const):
            return _num(v.value)
        if isinstance(v, Scalar):
            if v.index not in self.scalars:
                self.scalars.append(v.index)
            return f"s{self.scalars.index(v.index)}"
        if v in self.memo:
            return self.memo[v]
        node = self.e.nodes[v]
        if node.op != "pw":
            return self.leaf(self.e.tensor(v))
        parts = [self.expr(a) for a in node.args]
        line = f"v{len(self.lines)}"
        self.lines.append(f"{line} = {_expr(node, parts)}")
        self.memo[v] = line
        return line


class _Emitter:
    def __init__(self, lowered: Lowered):
        self.nodes = lowered.nodes
        self.lowered = lowered
        self.kernels: dict[str, str] = {}
        self.lines: list[str] = []
        self.names: dict[int, str] = {}
        self.launches = 0

    def kernel(self, made: tuple[str, str]) -> str:
        self.kernels.setdefault(made[0], made[1])
        return made[0]

    def emit(self, v: int, code: str) -> str:
        name = f"t{v}"
        self.lines.append(f"{name} = {code}")
        self.names[v] = name
        return name

    def launch(self, v: int, kernel: str, helper: str) -> str:
        """`t, grid, args, meta = helper` then the launch of `kernel` (the forward shows every launch)."""
        name = f"t{v}"
        self.lines += [f"{name}, grid, args, meta = {helper}", f"{kernel}[grid](*args, **meta)"]
        self.names[v] = name
        self.launches += 1
        return name

    def tensor(self, v: int) -> str:
        """The forward variable holding node v, emitting what computes it (once)."""
        if v in self.names:
            return self.names[v]
        n = self.nodes[v]
        dtype = TORCH_DTYPES.get(n.dtype, "torch.float32")
        if n.op == "input":
            self.names[v] = f"inputs[{n.attrs['index']}]"
            return self.names[v]
        if n.op == "param":
            return self.emit(v, f"_state(self, {n.attrs['name']!r})")
        if n.op == "pw":
            return self.pointwise(v, dtype)
        if n.op == "view":
            return self.view(v)
        if n.op == "reduce":
            return self.reduce(v, dtype)
        if n.op == "flip":
            k = _Kernel(self)
            x = k.leaf(self.tensor(n.args[0]), tuple(n.attrs["dims"]))
            return self.launch_pointwise(v, k, x, dtype)
        if n.op == "tri":
            k = _Kernel(self)
            x = k.expr(n.args[0])
            r = len(n.shape)
            cmp = ">=" if n.attrs["upper"] else "<="
            k.lines.append(f"v{len(k.lines)} = tl.where(i{r - 1} - i{r - 2} {cmp} {n.attrs['diagonal']}, {x}, 0.0)")
            return self.launch_pointwise(v, k, f"v{len(k.lines) - 1}", dtype)
        if n.op == "zeros":
            return self.emit(v, f"torch.zeros_like({self.tensor(n.args[0])}, dtype={dtype})")
        if n.op == "matmul":
            a, b = (self.tensor(x) for x in n.args)
            return self.launch(v, "matmul_kernel", f"_matmul({a}, {b})")
        if n.op == "conv":
            t = [self.tensor(x) for x in n.args]
            name = self.kernel(blocks.conv_kernel(len(n.shape) - 2, n.attrs["transposed"]))
            bias = t[2] if len(t) > 2 else "None"
            at = n.attrs
            return self.launch(v, name, f"_conv({t[0]}, {t[1]}, {bias}, {at['stride']}, {at['padding']}, "
                                        f"{at['dilation']}, {at['transposed']}, {at['output_padding']}, {at['groups']})")
        if n.op == "pool":
            at = n.attrs
            name = self.kernel(blocks.pool_kernel(len(at["kernel"]), at["kind"]))
            extra = f", {at['count_include_pad']}, {at['divisor']}" if at["kind"] == "avg" else ""
            return self.launch(v, name, f"_pool({self.tensor(n.args[0])}, {at['kernel']}, {at['stride']}, "
                                        f"{at['padding']}, {at['dilation']}, {at['ceil_mode']}{extra})")
        if n.op == "scan":
            name = self.kernel(blocks.scan_kernel(n.attrs["fn"], len(n.shape) - 1))
            return self.launch(v, name, f"_scan({self.tensor(n.args[0])}, {n.attrs['dim']}, {dtype})")
        if n.op == "gather":
            x, idx = (self.tensor(a) for a in n.args)
            return self.launch(v, "gather_kernel", f"_gather({x}, {idx})")
        if n.op == "cat":
            parts = [self.tensor(a) for a in n.args]
            dim = n.attrs["dim"]
            r = len(n.shape)
            copy = self.kernel(blocks.pointwise_kernel(r, 1, [()], 0, [], "x0"))
            name = f"t{v}"
            sizes = " + ".join(f"{p}.shape[{dim}]" for p in parts)
            self.lines.append(f"{name} = torch.empty([*{parts[0]}.shape[:{dim % r}], {sizes}, "
                              f"*{parts[0]}.shape[{dim % r + 1}:]], dtype={dtype}, device={parts[0]}.device)")
            self.lines.append("at = 0")
            for p in parts:
                self.lines.append(f"_, grid, args, meta = _pointwise([{p}], [], {dtype}, out={name}.narrow({dim}, at, "
                                  f"{p}.shape[{dim}]))")
                self.lines.append(f"{copy}[grid](*args, **meta)")
                self.lines.append(f"at += {p}.shape[{dim}]")
                self.launches += 1
            self.names[v] = name
            return name
        raise Refused(f"cannot emit {n.op}")

    def launch_pointwise(self, v: int, k: _Kernel, result: str, dtype: str) -> str:
        n = self.nodes[v]
        made = blocks.pointwise_kernel(len(n.shape), len(k.leaves), [f for _, f in k.leaves], len(k.scalars), k.lines,
                                       result, bool_out=n.dtype == "bool")
        name = self.kernel(made)
        leaves = ", ".join(var for var, _ in k.leaves)
        scalars = ", ".join(f"inputs[{i}]" for i in k.scalars)
        shape = "" if k.leaves else f", shape={tuple(n.shape)!r}"
        return self.launch(v, name, f"_pointwise([{leaves}], [{scalars}], {dtype}{shape})")

    def pointwise(self, v: int, dtype: str) -> str:
        k = _Kernel(self)
        result = k.expr(v)
        return self.launch_pointwise(v, k, result, dtype)

    def reduce(self, v: int, dtype: str) -> str:
        n = self.nodes[v]
        k = _Kernel(self)
        value = k.expr(n.args[0])
        src = self.nodes[n.args[0]] if isinstance(n.args[0], int) else None
        rank = len(src.shape) if src else 0
        dims = n.attrs["dims"]
        made = blocks.reduce_kernel(n.attrs["fn"], rank - len(dims), len(dims), len(k.leaves), len(k.scalars),
                                    k.lines, value)
        name = self.kernel(made)
        leaves = ", ".join(var for var, _ in k.leaves)
        scalars = ", ".join(f"inputs[{i}]" for i in k.scalars)
        corr = n.attrs.get("correction", 0.0)
        return self.launch(v, name, f"_reduce([{leaves}], [{scalars}], {dims}, {n.attrs['keepdim']}, {dtype}, {corr})")

    def view(self, v: int) -> str:
        n = self.nodes[v]
        x = self.tensor(n.args[0])
        at = n.attrs
        kind = at["kind"]
        if kind == "reshape":
            return self.emit(v, f"{x}.reshape({_reshape_expr(x, at['src'], n.shape)})")
        if kind == "permute":
            return self.emit(v, f"{x}.permute({at['perm']})")
        if kind == "unsqueeze":
            return self.emit(v, f"{x}.unsqueeze({at['dim']})")
        if kind == "squeeze":
            return self.emit(v, f"{x}.squeeze({tuple(at['dims'])})" if at["dims"] else x)
        if kind == "expand":
            src, dst = at["src"], n.shape
            sizes = [(-1 if j - len(dst) + len(src) >= 0 and src[j - len(dst) + len(src)] == s else s)
                     for j, s in enumerate(dst)]
            return self.emit(v, f"{x}.expand({sizes})")
        if kind == "select":
            return self.emit(v, f"{x}.select({at['dim']}, {at['index']})")
        if kind == "slice":
            start, end, step, size = at["start"], at["end"], at["step"], at["size"]
            start = 0 if start is None else int(start)
            stop = "None" if end is None or int(end) >= size else (
                f"{x}.shape[{at['dim']}] - {size - int(end)}" if int(end) > size // 2 else str(int(end)))
            index = ", ".join([":"] * at["dim"] + [f"{start}:{stop}:{step}"]).replace("None", "")
            return self.emit(v, f"{x}[{index}]")
        if kind == "channel":
            return self.emit(v, f"{x}.reshape([-1] + [1] * {at['rank']})")
        if kind == "groups":
            return self.emit(v, f"{x}.reshape({x}.shape[0], {at['groups']}, -1)")
        if kind == "like":
            return self.emit(v, f"{x}.reshape({self.tensor(at['like'])}.shape)")
        raise Refused(f"view {kind}")


def _reshape_expr(x: str, src: list[int], dst: list[int]) -> str:
    """A reshape target written from the input's run-time sizes: output dims that merge input dims are
    their product, inserted 1s stay 1, and one dim of a split takes -1 (the rest keep their traced size)."""
    out: list[str] = []
    i = j = 0
    minus = False
    while j < len(dst):
        if dst[j] == 1 and (i >= len(src) or src[i] != 1):
            out.append("1")
            j += 1
            continue
        if i < len(src) and src[i] == dst[j]:
            out.append(f"{x}.shape[{i}]")
            i += 1
            j += 1
            continue
        gi, gj = [i], [j]
        ps, pd = src[i] if i < len(src) else 1, dst[j]
        while ps != pd:
            if ps < pd:
                i += 1
                if i >= len(src):
                    break
                gi.append(i)
                ps *= src[i]
            else:
                j += 1
                if j >= len(dst):
                    break
                gj.append(j)
                pd *= dst[j]
        if len(gj) == 1:
            out.append(" * ".join(f"{x}.shape[{k}]" for k in gi))
        else:
            for k in gj:
                out.append("-1" if not minus and k == gj[0] else str(dst[k]))
            minus = True
        i += 1
        j += 1
    while i < len(src) and src[i] == 1:
        i += 1
    if i != len(src) or len(out) != len(dst):
        return repr(list(dst))
    return "[" + ", ".join(out) + "]"


def _num(v: float) -> str:
    if v != v:
        return 'float("nan")'
    if v in (float("inf"), float("-inf")):
        return 'float("inf")' if v > 0 else '-float("inf")'
    return repr(float(v))


def _expr(node: Node, parts: list[str]) -> str:
    """A pointwise node as a Triton expression (fp32), reusing the template coder's op table."""
    from activities.kernels.offline_coder import _expr as template_expr

    fn = node.attrs["fn"]
    a = parts
    cmp = {"gt": ">", "lt": "<", "ge": ">=", "le": "<=", "eq": "==", "ne": "!="}
    if fn in cmp:
        return f"tl.where({a[0]} {cmp[fn]} {a[1]}, 1.0, 0.0)"
    match fn:
        case "copy":
            return a[0]
        case "where":
            return f"tl.where({a[0]} != 0, {a[1]}, {a[2]})"
        case "xlogy":
            return f"tl.where({a[0]} == 0, 0.0, {a[0]} * tl.log({a[1]}))"
        case "log1p":
            return f"tl.log(1.0 + {a[0]})"
        case "expm1":
            return f"(tl.exp({a[0]}) - 1.0)"
        case "sign":
            return f"tl.where({a[0]} > 0, 1.0, tl.where({a[0]} < 0, -1.0, 0.0))"
        case "logical_not":
            return f"tl.where({a[0]} == 0, 1.0, 0.0)"
    operands = [Operand(kind="const", value=x.value) if isinstance(x, Const) else Operand(kind="value")
                for x in node.args]
    attrs = {k: (str(v) if isinstance(v, float) and not math.isfinite(v) else v)
             for k, v in node.attrs.get("attrs", {}).items()}
    return template_expr(PlanOp(op=fn, args=operands, attrs=attrs), a)


# --- rendering ----------------------------------------------------------------------------------


def render(lowered: Lowered, init: str, header: str, helpers: str) -> str:
    """The full candidate: header, helpers, the generated kernels, the launchers, and ModelNew whose
    __init__ is the reference's (`init`, already indented) and whose forward runs the lowered graph."""
    em = _Emitter(lowered)
    outs = [em.tensor(o) for o in lowered.outputs]
    ret = outs[0] if len(outs) == 1 else "(" + ", ".join(outs) + ",)"
    body = "\n".join("        " + ln for ln in em.lines + [f"return {ret}"])
    uses = "\n".join(em.lines)
    kernels = [src for src in em.kernels.values()]
    if "_matmul(" in uses:
        kernels.append(blocks.MATMUL)
    if "_gather(" in uses:
        kernels.append(blocks.GATHER)
    return (header + helpers + "\n\n" + "\n\n".join(kernels) + blocks.LAUNCHERS
            + f"\n\nclass ModelNew(nn.Module):\n{init}\n    def forward(self, *inputs):\n{body}\n")


def launches(lowered: Lowered) -> int:
    em = _Emitter(lowered)
    for o in lowered.outputs:
        em.tensor(o)
    return em.launches
