"""Ops that build or rearrange whole tensors: flip, triu/tril, zeros, cat."""

from __future__ import annotations

from typing import TYPE_CHECKING

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
    return r.add("cat", parts, c.shape, c.dtype, dim=int(c.arg(1, "dim", 0)))


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
