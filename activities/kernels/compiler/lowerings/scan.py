"""Cumulative sum and product along one dim: one `scan` node (tile by tile with a carry)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from activities.kernels.compiler.graph import Refused
from activities.kernels.compiler.registry import aten, lowers

if TYPE_CHECKING:
    from activities.kernels.compiler.reader import Call, Reader


@lowers(aten.cumsum, aten.cumprod)
def cumulative(r: Reader, c: Call) -> int:
    if c.kwargs.get("dtype") is not None:
        raise Refused(f"{c.op} with dtype=")
    return r.add("scan", [c.x()], c.shape, c.dtype, fn=c.op, dim=int(c.args[1]))
