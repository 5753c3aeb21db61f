"""Ops that build or rearrange whole tensors: flip, triu/tril, zeros, cat."""

from __future__ import annotations

from typing import TYPE_CHECKING

from activities.kernels.compiler.graph import Refused, symbolic
from activities.kernels.compiler.registry import aten, lowers

if TYPE_CHECKING:
    from activities.kernels.compiler.reader import Call, Reader


@lowers(aten.flip)
def flip(r: Reader, c: Call) -> int:
    return r.add("flip", [c.x()], c.shape, c.dtype, dims=[int(d) % len(c.shape) for d in c.args[1]])


@lowers(aten.triu, aten.tril)
def tri(r: Reader, c: Call) -> int:
    return r.add("tri", [c.x()], c.shape, c.dtype, upper=c.op == "triu", diagonal=int(c.arg(1, "diagonal", 0)))


@lowers(aten.zeros_like)
def zeros_like(r: Reader, c: Call) -> int:
    return r.add("zeros", [c.x()], c.shape, c.dtype)


@lowers(aten.cat)
def cat(r: Reader, c: Call) -> int:
    parts = [r.value(t) for t in c.args[0]]
    return r.add("cat", parts, c.shape, c.dtype, sizes=c.sizes, dim=int(c.arg(1, "dim", 0)))


@lowers(aten.stack)
def stack(r: Reader, c: Call) -> int:
    """cat of the parts, each unsqueezed at `dim`."""
    dim = int(c.arg(1, "dim", 0)) % len(c.shape)
    parts = []
    for t in c.args[0]:
        v = r.value(t)
        shape = list(r.shape(v))
        parts.append(r.view(v, "unsqueeze", shape[:dim] + [1] + shape[dim:], r.nodes[v].dtype, dim=dim))
    return r.add("cat", parts, c.shape, c.dtype, dim=dim)


@lowers(aten.randn)
def randn(r: Reader, c: Call) -> int:
    """A draw from the default generator inside forward (an LSTM's random initial state): the candidate draws the
    same numbers by calling torch.randn at the same point with the same sizes."""
    return r.add("random", [], c.shape, c.dtype, sizes=c.sizes, fn="randn")


@lowers(aten.constant_pad_nd)
def pad(r: Reader, c: Call) -> int:
    """F.pad with a constant: pads[(lo, hi)] per dim, from the last dim backwards as torch writes them (a negative
    pad crops)."""
    v = c.x()
    rank = len(r.shape(v))
    flat = [int(p) for p in c.args[1]]
    pads = [(0, 0)] * rank
    for k in range(len(flat) // 2):
        pads[rank - 1 - k] = (flat[2 * k], flat[2 * k + 1])
    value = c.arg(2, "value", 0)
    return r.add("pad", [v], c.shape, c.dtype, pads=pads, value=float(value["float"] if isinstance(value, dict)
                                                                         else value or 0))


@lowers(aten.roll)
def roll(r: Reader, c: Call) -> int:
    """torch.roll as a cat of two slices per rolled dim (Swin's shifted windows): y = cat(x[n-s:], x[:n-s])."""
    v = c.x()
    shifts, dims = c.args[1], c.arg(2, "dims", [])
    shifts = shifts if isinstance(shifts, list) else [shifts]
    dims = dims if isinstance(dims, list) else [dims]
    if not dims:
        raise Refused("torch.roll of the flattened tensor (no dims)")
    sizes = c.sizes
    for shift, dim in zip(shifts, dims):
        dim = int(dim) % len(c.shape)
        n = c.shape[dim]
        s = int(shift) % n
        if s == 0:
            continue
        dynamic = bool(sizes) and symbolic(sizes[dim])
        if -n < int(shift) < 0:
            cut: int | str = -int(shift)
        elif dynamic and 0 < int(shift) < n:
            cut = f"({sizes[dim]} - {int(shift)})"
        elif dynamic:
            raise Refused(f"torch.roll by {shift}, beyond the traced size of a dim whose size varies")
        else:
            cut = n - s
        shape = r.shape(v)
        tail = list(shape)
        tail[dim] = s
        head = list(shape)
        head[dim] = n - s
        a = r.view(v, "slice", tail, c.dtype, dim=dim, start=cut, end=None, step=1, size=n)
        b = r.view(v, "slice", head, c.dtype, dim=dim, start=0, end=cut, step=1, size=n)
        v = r.add("cat", [a, b], shape, c.dtype, dim=dim)
    return v


@lowers(aten.zeros, aten.ones, aten.full, aten.scalar_tensor, aten.ones_like, aten.full_like)
def fill(r: Reader, c: Call) -> int:
    """A tensor of one value, sized from the trace's size expressions (never fused: its shape is its own)."""
    value = {"zeros": 0.0, "ones": 1.0, "ones_like": 1.0}.get(c.op)
    if value is None:
        raw = c.args[0] if c.op == "scalar_tensor" else c.args[1]
        value = float(raw["float"]) if isinstance(raw, dict) and "float" in raw else raw
    if not isinstance(value, (int, float)):
        raise Refused(f"{c.op} with a value computed at run time")
    return r.add("fill", [], c.shape, c.dtype, sizes=c.sizes, value=float(value))


@lowers(aten.arange)
def arange(r: Reader, c: Call) -> int:
    """start + i * step, sized from the trace (`torch.arange(x.size(1))`)."""
    nums = [a for a in c.args if not isinstance(a, dict) or "float" in a or "sym" in a]
    if len(nums) == 1:
        start, step = 0.0, 1.0
    else:
        start = nums[0]
        step = c.kwargs.get("step", nums[2] if len(nums) > 2 else 1)
    if isinstance(start, dict) and "sym" in start or isinstance(step, dict) and "sym" in step:
        raise Refused("torch.arange starting or stepping at a size computed at run time")
    start = float(start["float"]) if isinstance(start, dict) else float(start)
    step = float(step["float"]) if isinstance(step, dict) else float(step)
    return r.add("fill", [], c.shape, c.dtype, sizes=c.sizes, value=start, step=step)
