"""Convolution (1-3D, strided, padded, dilated, grouped, transposed): one `conv` node, an implicit GEMM."""

from __future__ import annotations

from typing import TYPE_CHECKING

from activities.kernels.compiler.registry import aten, lowers

if TYPE_CHECKING:
    from activities.kernels.compiler.reader import Call, Reader


@lowers(aten.convolution)
def convolution(r: Reader, c: Call) -> int:
    w = c.value(1)
    bias = c.value(2) if c.args[2] is not None else None
    x = c.x()
    return r.add("conv", [x, w] + ([bias] if bias is not None else []), c.shape, c.dtype,
                 stride=list(c.args[3]), padding=list(c.args[4]), dilation=list(c.args[5]),
                 transposed=bool(c.args[6]), output_padding=list(c.args[7]), groups=int(c.args[8]))
