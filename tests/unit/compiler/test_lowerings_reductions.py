"""The reductions and their composites (activities/kernels/compiler/lowerings/reductions.py), and a reduction
over dims an earlier one kept as its input (`unit_reductions`)."""

from __future__ import annotations

import pytest

from tests.unit.compiler.cases import OTHER_N, TRACED_N, Case, candidate, run

X = "torch.randn(3, N)"
CASES: dict[str, Case] = {
    "sum": Case("x.sum(dim=1)", "torch.randn(3, N, 4)"),
    "sum:keepdim_all": Case("x.sum(dim=(0, 2), keepdim=True)", "torch.randn(3, N, 4)"),
    "mean": Case("x.mean(dim=-1)", "torch.randn(3, 4, N)"),
    "mean:split_over_columns": Case("x.mean(dim=(0, 2, 3))", "torch.randn(16, 3, 512, N)"),  # a batch norm's statistics
    "sum:split_keepdim": Case("(x * x).sum(dim=(0, 2), keepdim=True)", "torch.randn(16, 2, 512 * N)"),
    "amax": Case("torch.amax(x, dim=0)", "torch.randn(N, 4)"),
    "amin": Case("torch.amin(x, dim=1)", "torch.randn(N, 4)"),
    "max": Case("torch.max(x, dim=1)[0]", "torch.randn(3, N)"),
    "max:all": Case("torch.max(x)", "torch.randn(3, N)"),
    "min": Case("torch.min(x, dim=1)", "torch.randn(3, N)"),
    "argmax": Case("torch.argmax(x, dim=1)", "torch.randn(3, N, 4)"),
    "argmin": Case("torch.argmin(x, dim=1)", "torch.randn(3, N, 4)"),
    "logsumexp": Case("F.gelu(torch.logsumexp(x, dim=1, keepdim=True))", "torch.randn(N, 7)"),
    "var": Case("torch.var(x, dim=(0, 2))", "torch.randn(3, N, 5)"),
    "std": Case("torch.std(x, dim=1, unbiased=False)", X),
    "var_mean": Case("torch.var_mean(x, dim=1)", X),
    "linalg_vector_norm": Case("torch.norm(x, dim=1) + torch.linalg.vector_norm(x, 1, dim=0).sum() + torch.linalg.vector_norm(x, float(\"inf\"))", X),
    "linalg_vector_norm:order_3": Case("torch.linalg.vector_norm(x, 3, dim=1, keepdim=True) * x", X),
    "norm": Case("F.pairwise_distance(x, y) + torch.ops.aten.norm.ScalarOpt_dim(x, 3.0, [1])",
                 "torch.randn(3, N), torch.randn(3, N)", args="x, y"),
    "_softmax": Case("torch.softmax(x, dim=0) * x", "torch.randn(N, 4)"),
    "_safe_softmax": Case("F.scaled_dot_product_attention(x, x, x)", "torch.randn(2, 3, N, 4)"),
    "_safe_softmax:causal": Case("F.scaled_dot_product_attention(q, k, v, is_causal=True)",
                                 "torch.randn(2, 3, N, 4), torch.randn(2, 3, N, 4), torch.randn(2, 3, N, 4)",
                                 args="q, k, v"),
    "_safe_softmax:head_size_varies": Case("F.scaled_dot_product_attention(q, k, v)",
                                           "torch.randn(2, 3, 5, N), torch.randn(2, 3, 6, N), torch.randn(2, 3, 6, 4)",
                                           args="q, k, v"),
    "_safe_softmax:causal_head_size_varies": Case("F.scaled_dot_product_attention(x, x, x, is_causal=True)",
                                                  "torch.randn(2, 3, 4, N)"),
    "_safe_softmax:float_mask": Case("F.scaled_dot_product_attention(x, x, x, attn_mask=m)",
                                     "torch.randn(2, 3, 4, N), torch.randn(4, 4)", args="x, m"),
    "_safe_softmax:given_scale": Case("F.scaled_dot_product_attention(x, x, x, scale=0.3)", "torch.randn(2, 3, 4, N)"),
    "_log_softmax": Case("F.log_softmax(x, dim=1)", X),
    "mean:of_a_kept_mean": Case("torch.mean(torch.mean(x * 0.5, dim=[2, 3], keepdim=True), dim=[2, 3], keepdim=True)",
                                "torch.randn(2, 3, N, 5)"),
    "logsumexp:over_a_kept_mean_with_infinities": Case(
        "torch.logsumexp(torch.mean(x, dim=1, keepdim=True), dim=1, keepdim=True)",
        "torch.tensor([[float('inf'), 1.0], [float('-inf'), 2.0], [float('nan'), 0.0], [3.0, 4.0]]).repeat(1, N)"),
    "sum:of_an_input_size_1_dim": Case("torch.sum(x, dim=1, keepdim=True)", "torch.randn(N, 1)"),
    "mean:not_kept": Case("torch.mean(torch.mean(x, dim=1, keepdim=True), dim=1)", "torch.randn(3, N)"),
}
UNIT = {"mean:of_a_kept_mean": 1, "logsumexp:over_a_kept_mean_with_infinities": 1, "sum:of_an_input_size_1_dim": 1,
        "mean:not_kept": 2}
"""Launches: a reduction over dims the one before it kept is that one (the first two: the first mean's launch only);
over an input's dim of size 1 it stays (an output must not be the caller's tensor); one that drops the dims stays."""


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> dict[str, list[str]]:
    return run(CASES, tmp_path_factory.mktemp("reductions"))


@pytest.mark.parametrize("key", list(CASES))
def test_the_lowering_matches_the_reference_at_the_traced_size_and_another(key, runs):
    assert runs[key] == [], runs[key]


SPLIT = """
import json, sys
import torch, triton, triton.language as tl
scope = {"torch": torch, "triton": triton, "tl": tl, "math": __import__("math")}
exec(sys.argv[1], scope)
kernel = scope[sys.argv[2]]
torch.manual_seed(0)
x = torch.randn(3, 20000, 5)
out, grid, args, meta = scope["_reduce"]([x], [], [1, 2], False, torch.float32, 0, split=True)
kernel[grid](*args, **meta)
_, gpu_grid, _, _ = scope["_reduce"]([x.to("meta")], [], [1, 2], False, torch.float32, 0, split=True)
# 100 rows of 200,000: 100 row blocks of a GPU's tile (2 of the interpreter's), so 2 ranges, of 131,072
grids = [list(scope["_reduce"]([torch.empty(100, 200000, device=d)], [], [1], False, torch.float32, 0, split=True)[1])
         for d in ("cpu", "meta")]
small = list(scope["_reduce"]([torch.empty(3, 1000)], [], [1], False, torch.float32, 0, split=True)[1])
print(json.dumps({"grid": list(grid), "declared": grid.gpu, "gpu_grid": list(gpu_grid), "split": meta["SPLIT"], "many": grids, "small": small,
                  "error": (out - x.mean((1, 2))).abs().max().item()}))
"""


@pytest.mark.parametrize("n", [TRACED_N, OTHER_N])
def test_the_split_cases_are_sized_to_split_at_both_sizes(n):
    """The two `split` cases above exercise the atomic path only if their launches split: a block of a GPU's rows
    must read at least SPLIT_BYTES (a GPU's row block is sized from the rows, so few rows make small blocks)."""
    import math

    import torch
    import triton

    from activities.kernels.compiler.blocks.common import GPU_GRID, INTERPRETER_TILE
    from activities.kernels.compiler.blocks.reduction import LAUNCHER

    scope = {"torch": torch, "triton": triton, "math": math}
    exec(GPU_GRID + INTERPRETER_TILE + LAUNCHER, scope)  # noqa: S102 - our own launcher source
    for shape, dims in (((16, 3, 512, n), [0, 2, 3]), ((16, 2, 512 * n), [0, 2])):
        grid = scope["_reduce"]([torch.empty(shape)], [], dims, False, torch.float32, 0, split=True)[1]
        assert grid[1] > 1, (shape, tuple(grid))


def test_few_rows_of_many_columns_are_split_across_programs_that_add_up():
    """A batch norm's statistics (a row per channel, batch x height x width columns) were one program on a GPU of
    132 SMs; the columns are now cut into ranges, a program each, adding atomically into a zeroed output. The cut
    is the same under the interpreter as for a GPU tensor, so what the verifier runs is what the GPU runs."""
    from activities.kernels.compiler.blocks.common import GPU_GRID, INTERPRETER_TILE
    from activities.kernels.compiler.blocks.reduction import LAUNCHER, reduce_kernel
    from tests.unit.compiler.cases import interpreted

    name, source = reduce_kernel("mean", 1, 2, 1, 0, [], "x0", split=True)
    seen = interpreted(SPLIT, source + GPU_GRID + INTERPRETER_TILE + LAUNCHER, name)
    # 3 rows of 100,000: a GPU takes a row per program, 85 ranges wanted, 49 of 2,048; the interpreter all 3 rows
    assert seen["split"] and seen["grid"] == [1, 49] and seen["gpu_grid"] == [3, 49], seen
    assert seen["declared"] == 3 * 49, seen  # what the cost model reads: the GPU's programs
    assert seen["many"] == [[2, 2], [100, 2]], seen  # the rows' blocks are each device's own, the cut is one
    assert seen["small"] == [1, 1], seen  # 3 rows of 1,000: one program reads 12 KB, less than a launch costs
    assert seen["error"] < 1e-6, seen


@pytest.mark.parametrize("key", list(UNIT))
def test_a_reduction_over_dims_an_earlier_one_kept_is_that_one(key, tmp_path):
    forward = candidate(CASES[key], tmp_path).split("class ModelNew", 1)[1]
    assert forward.count("[grid](") == UNIT[key], forward
