"""Losses as their pointwise formula and a mean or sum (reduction 0 = none, 1 = mean, 2 = sum); nll_loss
picks x[i, target[i]] with a `gather` node."""

from __future__ import annotations

from typing import TYPE_CHECKING

from activities.kernels.compiler.graph import Const, Refused, broadcast
from activities.kernels.compiler.registry import aten, lowers

if TYPE_CHECKING:
    from activities.kernels.compiler.reader import Call, Reader


def reduced(r: Reader, e: int, reduction: int, shape: list[int]) -> int:
    if reduction == 0:
        return e
    return r.reduce("mean" if reduction == 1 else "sum", e, None, False, shape)


@lowers(aten.mse_loss, aten.smooth_l1_loss, aten.huber_loss)
def pointwise_loss(r: Reader, c: Call) -> int:
    x, y = c.value(0), c.value(1)
    reduction = int(c.kwargs.get("reduction", c.args[2] if len(c.args) > 2 else 1))
    s = broadcast(r.shape(x), r.shape(y))
    d = r.pw("sub", [x, y], s)
    if c.op == "mse_loss":
        e = r.pw("mul", [d, d], s)
    else:
        key = "beta" if c.op == "smooth_l1_loss" else "delta"
        beta = float(c.kwargs.get(key, c.args[3] if len(c.args) > 3 else 1.0))
        a = r.pw("abs", [d], s)
        quad = r.pw("mul", [r.pw("mul", [a, a], s), Const(0.5 / beta if c.op == "smooth_l1_loss" else 0.5)], s)
        lin = r.pw("sub", [a, Const(0.5 * beta)], s)
        if c.op == "huber_loss":
            lin = r.pw("mul", [lin, Const(beta)], s)
        e = r.pw("where", [r.pw("lt", [a, Const(beta)], s), quad, lin], s)
    return reduced(r, e, reduction, c.shape)


@lowers(aten.nll_loss_forward)
def nll_loss(r: Reader, c: Call) -> list:
    x, target = c.value(0), c.value(1)
    if c.args[2] is not None:
        raise Refused("nll_loss with class weights")
    if len(r.shape(x)) != 2:
        raise Refused("nll_loss over more than 2 dims")
    picked = r.add("gather", [x, target], r.shape(target))
    neg = r.pw("neg", [picked], r.shape(target))
    return [reduced(r, neg, int(c.args[3]), []), None]
