"""The lowerings that build or rearrange whole tensors (activities/kernels/compiler/lowerings/tensors.py)."""

from __future__ import annotations

import pytest

from activities.kernels import compiler
from tests.unit.compiler.cases import Case, candidate, lowered, run

X = "torch.randn(3, N)"
DENSE = """
def dense(x):
    features = [x]
    for k in range(3):  # DenseNet's block: each layer reads the cat of every earlier output
        features.append((x * (k + 1)).sum(1, keepdim=True).tanh())
        x = torch.cat(features, 1)
    return x
"""
CASES: dict[str, Case] = {
    "flip": Case("torch.flip(x, [1]) * 2", X),
    "flip:int64_exact": Case("torch.flip(i, [1])", "torch.randint(2**40, (3, N))", args="i"),
    "triu": Case("torch.triu(x, 1) * 2", "torch.randn(N, N)"),
    "tril": Case("torch.tril(x) * 2", "torch.randn(N, N)"),
    "zeros_like": Case("torch.zeros_like(x) + 1", X),
    "stack": Case("torch.stack([x, x * 2], dim=1)", X),
    "randn": Case("x + torch.randn(x.size(0), 1, device=x.device)", X),
    "constant_pad_nd": Case("F.pad(x, (1, 2, 0, 3), value=0.5) * 2", "torch.randn(2, 3, N)"),
    "constant_pad_nd:crop": Case("F.pad(x, (-1, 2)) * 2", "torch.randn(2, N)"),
    "constant_pad_nd:int64_exact": Case("F.pad(i, (1, 0, 0, 2), value=7)", "torch.randint(2**40, (3, N))", args="i"),
    "constant_pad_nd:transposed": Case("F.pad(x.t(), (2, 1), value=float('-inf')).amax(1)", X),
    "roll": Case("torch.roll(x, shifts=(-2, 3), dims=(1, 2)) * 2", "torch.randn(2, N, 5)"),
    "roll:forward_along_a_varying_dim": Case("torch.roll(x, 2, 1) * 2", "torch.randn(2, N)"),
    "zeros": Case("torch.zeros(x.size(0), 3, device=x.device) + x[:, :3]", X),
    "ones": Case("torch.tril(torch.ones(x.size(1), x.size(1), device=x.device)) @ x.t()", X),
    "ones_like": Case("torch.ones_like(x) * 2 + x", X),
    "full": Case("torch.full((x.size(0), 2), 3.0, device=x.device) + x[:, :2]", X),
    "full_like": Case("torch.full_like(x, 0.5) + x", X),
    "scalar_tensor": Case("torch.where(x > 0, x, torch.scalar_tensor(-1.5))", X),
    "arange": Case("x + torch.arange(x.size(1), device=x.device)", X),
    "arange:start_step": Case("x[:, :3] * torch.arange(1, 7, 2, device=x.device)", X),
    "cat": Case("torch.cat([x, x * 2, y], dim=1)", "torch.randn(3, N), torch.randn(3, 2)", args="x, y"),
    "cat:rows_of_transposed_parts": Case("torch.cat([x.t(), y.t(), x.t() * 2], dim=0)", "torch.randn(3, N), torch.randn(3, 2)",
                                         args="x, y"),
    "cat:int64_exact": Case("torch.cat([i, i], dim=1)", "torch.randint(2**40, (3, N))", args="i"),
    "cat:growing_features": Case("dense(x)", "torch.randn(2, 3, N)", helpers=DENSE),
    "cat:exclusive_cumsum": Case("torch.cumsum(torch.cat((torch.zeros_like(x.select(1, 0).unsqueeze(1)), x), dim=1)[:, :-1], dim=1)", X),
}


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> dict[str, list[str]]:
    return run(CASES, tmp_path_factory.mktemp("tensors"))


@pytest.mark.parametrize("key", list(CASES))
def test_the_lowering_matches_the_reference_at_the_traced_size_and_another(key, runs):
    assert runs[key] == [], runs[key]


def test_a_cat_and_a_pad_are_one_launch_each(tmp_path):
    """Each lane of the output reads the part its index falls in, or the pad value: a launch per part, and a fill
    then a copy, before."""
    assert compiler.launches(lowered(CASES["cat"], tmp_path / "cat")) == 2, "x * 2, then the cat"
    assert compiler.launches(lowered(CASES["constant_pad_nd"], tmp_path / "pad")) == 2, "the pad, then * 2"


def test_growing_cats_share_one_buffer_and_copy_each_part_once(tmp_path):
    """DenseNet's cats (each a prefix of the next) are views of the last one's buffer: each writes only its new part
    (the numbers: the `cat:growing_features` case above)."""
    source = candidate(CASES["cat:growing_features"], tmp_path)
    assert source.count("_buffer = torch.empty(") == 1, source
    copied = [line.split("_cat([")[1].split(", out=")[0].rsplit("], ", 1)[0].split(", ")
              for line in source.splitlines() if "= _cat(" in line]
    assert [len(parts) for parts in copied] == [2, 1, 1], copied  # x and the first layer's output, then one a layer
    assert source.count("out=t") == 3, source
