"""Normalisations as (v - mean) * rsqrt(var + eps) [* w + b] over their dims (the biased variance, as torch's
norms): layer norm over the trailing dims, batch norm per channel (batch statistics when training, the running
ones in eval), group norm over the groups of a (batch, groups, rest) view."""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any

from activities.kernels.compiler.graph import Const
from activities.kernels.compiler.registry import aten, lowers

if TYPE_CHECKING:
    from activities.kernels.compiler.reader import Call, Reader


def normalize(r: Reader, v: Any, dims: list[int], eps: float, w: Any, b: Any, *, per_channel: bool) -> int:
    """`per_channel`: w and b run along dim 1 (batch/instance norm), else along the trailing dims."""
    shape = r.shape(v)
    kept = r.kept(v, dims)
    mean = r.reduce("mean", v, dims, True, kept)
    d = r.pw("sub", [v, mean], shape)
    var = r.reduce("mean", r.pw("mul", [d, d], shape), dims, True, kept)
    y = r.pw("mul", [d, r.pw("rsqrt", [r.pw("add", [var, Const(eps)], kept)], kept)], shape)
    if per_channel:
        return affine(r, y, w, b, shape)
    for param, fn in ((w, "mul"), (b, "add")):
        if param is not None:
            y = r.pw(fn, [y, param], shape)
    return y


def channel(r: Reader, param: Any, shape: list[int]) -> int:
    """A per-channel vector viewed as (C, 1, ..., 1) against a (N, C, ...) tensor."""
    return r.view(param, "channel", [shape[1]] + [1] * (len(shape) - 2), rank=len(shape) - 2)


def affine(r: Reader, y: int, w: Any, b: Any, shape: list[int]) -> int:
    for param, fn in ((w, "mul"), (b, "add")):
        if param is not None:
            y = r.pw(fn, [y, channel(r, param, shape)], shape)
    return y


def optional(c: Call, pos: int) -> Any:
    return c.value(pos) if c.args[pos] is not None else None


@lowers(aten.native_layer_norm)
def layer_norm(r: Reader, c: Call) -> list[Any]:
    v = c.x()
    rank = len(r.shape(v))
    dims = list(range(rank - len(c.args[1]), rank))
    return [normalize(r, v, dims, float(c.args[4]), optional(c, 2), optional(c, 3), per_channel=False), None, None]


@lowers(aten.native_batch_norm, aten._native_batch_norm_legit, aten._native_batch_norm_legit_no_training)
def batch_norm(r: Reader, c: Call) -> list[Any]:
    """Batch statistics in training (the running ones are updated on the side: no output reads them), else the
    running statistics; `_native_batch_norm_legit` without running stats is instance norm's."""
    x = c.x()
    w, b = optional(c, 1), optional(c, 2)
    training = c.op == "_native_batch_norm_legit" or c.op == "native_batch_norm" and bool(c.args[5])
    eps = float(c.args[-1])
    shape = r.shape(x)
    if training:
        return [normalize(r, x, [0] + list(range(2, len(shape))), eps, w, b, per_channel=True), None, None]
    mean, var = channel(r, c.value(3), shape), channel(r, c.value(4), shape)
    c_shape = [shape[1]] + [1] * (len(shape) - 2)
    y = r.pw("mul", [r.pw("sub", [x, mean], shape),
                     r.pw("rsqrt", [r.pw("add", [var, Const(eps)], c_shape)], c_shape)], shape)
    return [affine(r, y, w, b, shape), None, None]


@lowers(aten.native_group_norm)
def group_norm(r: Reader, c: Call) -> list[Any]:
    x = c.x()
    groups, eps = int(c.args[6]), float(c.args[7])
    shape = r.shape(x)
    xg = r.view(x, "groups", [shape[0], groups, math.prod(shape[1:]) // groups], groups=groups)
    y = normalize(r, xg, [2], eps, None, None, per_channel=False)
    y = r.add("view", [y, x], shape, kind="like")
    return [affine(r, y, optional(c, 1), optional(c, 2), shape), None, None]
