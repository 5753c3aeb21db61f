"""Reductions, and the composites made of them, decomposed here in plain sight: softmax = amax, exp, sum,
div; variance = mean of the squared centred value; vector norms = a pointwise op and a sum or max."""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any

from activities.kernels.compiler.graph import Const, Refused
from activities.kernels.compiler.registry import aten, lowers

if TYPE_CHECKING:
    from activities.kernels.compiler.reader import Call, Reader


@lowers(aten.sum, aten.mean, aten.amax, aten.amin)
def reduce(r: Reader, c: Call) -> int:
    if c.kwargs.get("dtype") is not None:
        raise Refused(f"{c.op} with dtype=")
    return r.reduce(c.op, c.x(), c.arg(1, "dim"), bool(c.arg(2, "keepdim", False)), c.shape, c.dtype)


@lowers(aten.max, aten.min)
def max_min(r: Reader, c: Call) -> Any:
    """max(x) is one value; max(x, dim) is (values, indices)."""
    v = c.x()
    if len(c.args) == 1 and "dim" not in c.kwargs:
        return r.reduce("a" + c.op, v, None, False, c.shape, c.dtype)
    dim, keep = int(c.arg(1, "dim")), bool(c.arg(2, "keepdim", False))
    idx_shape = c.out[1].shape if len(c.out) > 1 else c.shape
    return [r.reduce("a" + c.op, v, [dim], keep, c.shape, c.dtype),
            r.reduce("arg" + c.op, v, [dim], keep, idx_shape, "int64")]


@lowers(aten.argmax, aten.argmin)
def arg(r: Reader, c: Call) -> int:
    dim = c.arg(1, "dim")
    return r.reduce(c.op, c.x(), None if dim is None else [int(dim)], bool(c.arg(2, "keepdim", False)), c.shape,
                    c.dtype)


@lowers(aten.logsumexp)
def logsumexp(r: Reader, c: Call) -> int:
    return r.reduce("logsumexp", c.x(), c.arg(1, "dim"), bool(c.arg(2, "keepdim", False)), c.shape, c.dtype)


def correction_of(c: Call) -> float:
    corr = c.kwargs.get("correction", 1)
    if "unbiased" in c.kwargs:
        corr = 1 if c.kwargs["unbiased"] else 0
    return float(1 if corr is None else corr)


@lowers(aten.var, aten.std)
def var_std(r: Reader, c: Call) -> int:
    var = variance(r, c.x(), c.arg(1, "dim"), bool(c.kwargs.get("keepdim", False)), correction_of(c), c.shape)
    return r.pw("sqrt", [var], c.shape) if c.op == "std" else var


@lowers(aten.var_mean)
def var_mean(r: Reader, c: Call) -> list[int]:
    v, dims, keep = c.x(), c.arg(1, "dim"), bool(c.kwargs.get("keepdim", False))
    rank = len(r.shape(v))
    dims = list(range(rank)) if dims is None or dims == [] else [int(d) % rank for d in dims]
    return [variance(r, v, dims, keep, correction_of(c), c.shape), r.reduce("mean", v, dims, keep, c.shape)]


def variance(r: Reader, v: Any, dims: Any, keep: bool, correction: float, shape: list[int]) -> int:
    """mean((v - mean(v))^2) over `dims`, divided by (n - correction)."""
    rank = len(r.shape(v))
    dims = list(range(rank)) if dims is None or dims == [] else [int(d) % rank for d in dims]
    mean = r.reduce("mean", v, dims, True, r.kept(v, dims))
    d = r.pw("sub", [v, mean], r.shape(v))
    return r.reduce("mean", r.pw("mul", [d, d], r.shape(v)), dims, keep, shape, correction=correction)


@lowers(aten.linalg_vector_norm, aten.norm)
def vector_norm(r: Reader, c: Call) -> int:
    """linalg_vector_norm(x, ord, dim, keepdim) and the older norm(x, p, dim, keepdim) (pairwise_distance, the
    triplet loss): (sum |x|^p)^(1/p), with the 1, 2 and inf orders in their cheaper forms."""
    v = c.x()
    ord_ = c.arg(1, "p" if c.op == "norm" else "ord", 2)
    ord_ = 2 if ord_ is None else ord_
    dims, keep, shape, s = c.arg(2, "dim"), bool(c.arg(3, "keepdim", False)), c.shape, r.shape(v)
    if ord_ in (2, 2.0):
        return r.pw("sqrt", [r.reduce("sum", r.pw("mul", [v, v], s), dims, keep, shape)], shape)
    if ord_ in (1, 1.0):
        return r.reduce("sum", r.pw("abs", [v], s), dims, keep, shape)
    if ord_ == {"float": "inf"}:
        return r.reduce("amax", r.pw("abs", [v], s), dims, keep, shape)
    if isinstance(ord_, (int, float)) and ord_ > 0:
        powered = r.pw("pow", [r.pw("abs", [v], s), Const(float(ord_))], s)
        return r.pw("pow", [r.reduce("sum", powered, dims, keep, shape), Const(1.0 / float(ord_))], shape)
    raise Refused(f"vector norm of order {ord_}")


@lowers(aten._softmax, aten._log_softmax, aten._safe_softmax)
def softmax(r: Reader, c: Call) -> int:
    v, shape = c.x(), c.shape
    log, safe = "log" in c.op, c.op == "_safe_softmax"
    dim = int(c.args[1]) % len(r.shape(v))
    kept = r.kept(v, [dim])
    m = r.reduce("amax", v, [dim], True, kept)
    m0 = r.pw("where", [r.pw("eq", [m, Const(-math.inf)], kept), Const(0.0), m], kept) if safe else m
    shifted = r.pw("sub", [v, m0], shape)
    e = r.pw("exp", [shifted], shape)
    s = r.reduce("sum", e, [dim], True, kept)
    if log:
        return r.pw("sub", [shifted, r.pw("log", [s], kept)], shape)
    y = r.pw("div", [e, s], shape)
    return r.pw("where", [r.pw("eq", [m, Const(-math.inf)], kept), Const(0.0), y], shape) if safe else y
