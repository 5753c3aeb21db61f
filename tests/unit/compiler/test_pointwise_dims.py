"""The pointwise launcher merges the dims every tensor walks as one (`_coalesce`, blocks/pointwise.py), so a kernel
splits its flat index over fewer dims: a contiguous elementwise launch divides nothing, a per-channel bias over
N x C x D x H x W splits over three dims instead of five. Same elements, same order, same values."""

from __future__ import annotations

import itertools
import math
import random

import pytest
import torch
import triton

from activities.kernels.compiler.blocks.common import GPU_GRID
from activities.kernels.compiler.blocks.pointwise import FLAT_GRID, LAUNCHER, needs_dims, pointwise_kernel
from tests.unit.compiler.cases import interpreted


@pytest.fixture(scope="module")
def launcher():  # noqa: ANN201 - the launcher helpers, as a candidate file defines them
    scope = {"torch": torch, "triton": triton, "math": math}
    exec(GPU_GRID + FLAT_GRID + LAUNCHER, scope)  # noqa: S102 - our own launcher source
    return scope


def addresses(sizes: list[int], strides: list[int]) -> list[int]:
    return [sum(i * s for i, s in zip(index, strides)) for index in itertools.product(*map(range, sizes))]


def test_contiguous_and_broadcast_layouts_merge_to_the_fewest_dims(launcher):
    coalesce = launcher["_coalesce"]
    x = torch.empty(3, 16, 25, 35, 35)
    bias = torch.empty(16, 1, 1, 1).expand(x.shape)
    assert coalesce(list(x.shape), [list(x.stride())] * 2) == ([3 * 16 * 25 * 35 * 35], [[1], [1]])
    assert coalesce(list(x.shape), [list(x.stride()), list(bias.stride())]) == (
        [3, 16, 25 * 35 * 35], [[16 * 30625, 30625, 1], [0, 1, 0]])
    t = torch.empty(6, 5).t()  # a transposed leaf keeps both dims
    assert coalesce([5, 6], [[6, 1], list(t.stride())]) == ([5, 6], [[6, 1], [1, 5]])
    assert coalesce([1, 1, 1], [[1, 1, 1]]) == ([1], [[0]])


def test_merged_dims_walk_every_tensor_through_the_same_addresses_in_the_same_order(launcher):
    coalesce, rng = launcher["_coalesce"], random.Random(0)
    for _ in range(300):
        sizes = [rng.choice((1, 2, 3, 4)) for _ in range(rng.randint(1, 5))]
        strides = []
        for _ in range(rng.randint(1, 3)):  # a tensor: contiguous, permuted, sliced or broadcast
            base = torch.empty([s * rng.choice((1, 1, 2)) for s in sizes])
            view = base[tuple(slice(0, s) for s in sizes)]
            perm = list(range(len(sizes)))
            rng.shuffle(perm)
            view = view.permute(perm).contiguous().permute([perm.index(d) for d in range(len(sizes))]) \
                if rng.random() < 0.3 else view
            stride = [0 if rng.random() < 0.2 else s for s in view.stride()]
            strides.append(stride)
        merged_sizes, merged = coalesce(sizes, strides)
        assert len(merged_sizes) <= len(sizes)
        for before, after in zip(strides, merged):
            assert addresses(merged_sizes, after) == addresses(sizes, before), (sizes, strides)


def test_a_kernel_reading_its_own_dims_keeps_them():
    assert needs_dims([(), (1,)], ["v0 = x0 + x1"], "v0")  # a flipped leaf
    assert needs_dims([()], ["v0 = tl.where(i1 - i0 >= 0, x0, 0.0)"], "v0")  # triu
    assert not needs_dims([(), ()], ["v0 = x0 + x1", "v1 = tl.exp(v0)"], "v1 * 2.0")


PROBE = '''
import json, sys
import torch, triton, triton.language as tl
from triton.runtime import interpreter
from activities.kernels._child import skip_unasserted_overflow_checks

scope = {"torch": torch, "triton": triton, "tl": tl, "math": __import__("math")}
exec(sys.argv[1], scope)
skip_unasserted_overflow_checks()
builder = interpreter.interpreter_builder
divisions = {"n": 0}
for name in ("create_sdiv", "create_srem"):
    def counted(*args, _original=getattr(builder, name)):
        divisions["n"] += 1
        return _original(*args)
    setattr(builder, name, counted)
add = scope[sys.argv[2]]
torch.manual_seed(0)
x = torch.randn(3, 4, 5, 6, 7)
report = {}
for case, y in {"contiguous": torch.randn(3, 4, 5, 6, 7), "bias": torch.randn(4, 1, 1, 1),
                "transposed": torch.randn(3, 4, 5, 7, 6).transpose(3, 4)}.items():
    divisions["n"] = 0
    out, grid, args, meta = scope["_pointwise"]([x, y], [], torch.float32, BLOCK=256)
    add[grid](*args, **meta)
    report[case] = {"rank": meta["RANK"], "divisions": divisions["n"], "programs": grid[0],
                    "right": bool(torch.equal(out, x + y))}
print(json.dumps(report))
'''


def test_a_contiguous_launch_divides_nothing_and_every_layout_adds_right():
    name, source = pointwise_kernel(5, 2, [(), ()], 0, ["v0 = (x0 + x1)"], "v0")
    report = interpreted(PROBE, GPU_GRID + FLAT_GRID + LAUNCHER + "\n" + source, name)
    programs = triton.cdiv(3 * 4 * 5 * 6 * 7, 256)
    assert report["contiguous"] == {"rank": 1, "divisions": 0, "programs": programs, "right": True}
    # x + bias[c]: N | C | D*H*W; one % and one // per merged inner dim, per program
    assert report["bias"] == {"rank": 3, "divisions": 4 * programs, "programs": programs, "right": True}
    # the transposed leaf keeps its last two dims apart: N*C*D | H | W
    assert report["transposed"] == {"rank": 3, "divisions": 4 * programs, "programs": programs, "right": True}
