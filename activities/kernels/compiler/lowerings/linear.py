"""Matrix products: mm, bmm (one `matmul` node: a tiled tl.dot kernel over strided operands, so transposes
stay strides), mv as a matrix times a one-column matrix, addmm/baddbmm as the product plus a fused epilogue."""

from __future__ import annotations

from typing import TYPE_CHECKING

from activities.kernels.compiler.graph import Const
from activities.kernels.compiler.registry import aten, lowers

if TYPE_CHECKING:
    from activities.kernels.compiler.reader import Call, Reader


@lowers(aten.mm, aten.bmm)
def mm(r: Reader, c: Call) -> int:
    return r.add("matmul", [c.value(0), c.value(1)], c.shape, c.dtype)


@lowers(aten.mv)
def mv(r: Reader, c: Call) -> int:
    a, b = c.value(0), c.value(1)
    col = r.view(b, "unsqueeze", r.shape(b) + [1], dim=-1)
    prod = r.add("matmul", [a, col], c.shape + [1], c.dtype)
    return r.view(prod, "squeeze", c.shape, dims=[len(c.shape)])


@lowers(aten.addmm, aten.baddbmm)
def addmm(r: Reader, c: Call) -> int:
    """beta * bias + alpha * (a @ b)."""
    bias, a, b = c.value(0), c.value(1), c.value(2)
    beta, alpha = float(c.kwargs.get("beta", 1)), float(c.kwargs.get("alpha", 1))
    prod = r.add("matmul", [a, b], c.shape, c.dtype)
    if alpha != 1:
        prod = r.pw("mul", [prod, Const(alpha)], c.shape)
    if beta != 1:
        bias = r.pw("mul", [bias, Const(beta)], r.shape(bias))
    return r.pw("add", [prod, bias], c.shape)

