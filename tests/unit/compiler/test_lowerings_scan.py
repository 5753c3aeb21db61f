"""Cumulative sums and products (activities/kernels/compiler/lowerings/scan.py)."""

from __future__ import annotations

import pytest

from tests.unit.compiler.cases import Case, run

X = "torch.randn(3, N)"
CASES: dict[str, Case] = {
    "cumsum": Case("torch.cumsum(x.flip(1), dim=1).flip(1)", X),
    "cumsum:masked": Case("torch.cumsum(x * m, dim=1)", "torch.randn(3, N), torch.randint(0, 2, (3, N)).bool()", args="x, m"),
    "cumprod": Case("torch.cumprod(x, dim=0)", "torch.rand(N, 3) + 0.5"),
}


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> dict[str, list[str]]:
    return run(CASES, tmp_path_factory.mktemp("scan"))


@pytest.mark.parametrize("key", list(CASES))
def test_the_lowering_matches_the_reference_at_the_traced_size_and_another(key, runs):
    assert runs[key] == [], runs[key]
