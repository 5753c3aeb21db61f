"""The lowerings that build or rearrange whole tensors (activities/kernels/compiler/lowerings/tensors.py)."""

from __future__ import annotations

import pytest

from tests.unit.compiler.cases import Case, run

X = "torch.randn(3, N)"
CASES: dict[str, Case] = {
    "flip": Case("torch.flip(x, [1]) * 2", X),
    "triu": Case("torch.triu(x, 1) * 2", "torch.randn(N, N)"),
    "tril": Case("torch.tril(x) * 2", "torch.randn(N, N)"),
    "zeros_like": Case("torch.zeros_like(x) + 1", X),
    "stack": Case("torch.stack([x, x * 2], dim=1)", X),
    "randn": Case("x + torch.randn(x.size(0), 1, device=x.device)", X),
    "cat": Case("torch.cat([x, x * 2, y], dim=1)", "torch.randn(3, N), torch.randn(3, 2)", args="x, y"),
    "cat:exclusive_cumsum": Case("torch.cumsum(torch.cat((torch.zeros_like(x.select(1, 0).unsqueeze(1)), x), dim=1)[:, :-1], dim=1)", X),
}


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> dict[str, list[str]]:
    return run(CASES, tmp_path_factory.mktemp("tensors"))


@pytest.mark.parametrize("key", list(CASES))
def test_the_lowering_matches_the_reference_at_the_traced_size_and_another(key, runs):
    assert runs[key] == [], runs[key]
