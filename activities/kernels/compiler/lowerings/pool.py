"""Max and average pooling, 2-3D (1-D pooling traces as 2-D over an unsqueezed input; dilation, ceil mode,
count_include_pad, divisor override): one `pool` node."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from activities.kernels.compiler.graph import ints
from activities.kernels.compiler.registry import aten, lowers

if TYPE_CHECKING:
    from activities.kernels.compiler.reader import Call, Reader


@lowers(aten.max_pool2d_with_indices, aten.max_pool3d_with_indices)
def max_pool(r: Reader, c: Call) -> Any:
    d = int(c.op[8])
    k = ints(c.args[1], d)
    out = r.add("pool", [c.x()], c.shape, c.dtype, kernel=k, stride=ints(c.arg(2, "stride") or k, d),
                padding=ints(c.arg(3, "padding", 0), d), dilation=ints(c.arg(4, "dilation", 1), d),
                ceil_mode=bool(c.arg(5, "ceil_mode", False)), kind="max")
    return [out, None]


@lowers(aten.avg_pool2d, aten.avg_pool3d)
def avg_pool(r: Reader, c: Call) -> int:
    d = int(c.op[8])
    k = ints(c.args[1], d)
    return r.add("pool", [c.x()], c.shape, c.dtype, kernel=k, stride=ints(c.arg(2, "stride") or k, d),
                 padding=ints(c.arg(3, "padding", 0), d), dilation=[1] * d,
                 ceil_mode=bool(c.arg(4, "ceil_mode", False)), count_include_pad=bool(c.arg(5, "count_include_pad", True)),
                 divisor=c.arg(6, "divisor_override") or 0, kind="avg")


@lowers(aten._adaptive_avg_pool2d, aten._adaptive_avg_pool3d, aten.adaptive_max_pool2d, aten.adaptive_max_pool3d)
def adaptive_pool(r: Reader, c: Call) -> Any:
    """Adaptive pooling to a given output size (nn.AdaptiveAvgPool2d((1, 1)) of a classifier head)."""
    size = [None if s is None else int(s) for s in c.args[1]]
    kind = "max" if "max" in c.op else "avg"
    out = r.add("adaptive_pool", [c.x()], c.shape, c.dtype, output_size=size, kind=kind)
    return [out, None] if kind == "max" else out
