"""Losses (activities/kernels/compiler/lowerings/losses.py)."""

from __future__ import annotations

import pytest

from tests.unit.compiler.cases import Case, run

X = "torch.randn(3, N)"
CASES: dict[str, Case] = {
    "mse_loss": Case("F.mse_loss(x, y)", "torch.randn(N, 5), torch.randn(N, 5)", args="x, y"),
    "smooth_l1_loss": Case("F.smooth_l1_loss(x, y)", "torch.randn(N, 5), torch.randn(N, 5)", args="x, y"),
    "huber_loss": Case("F.huber_loss(x, y, reduction=\"sum\", delta=0.5)", "torch.randn(N, 5), torch.randn(N, 5)", args="x, y"),
    "nll_loss_forward": Case("F.cross_entropy(x, t)", "torch.randn(N, 5), torch.randint(0, 5, (N,))", args="x, t"),
}


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> dict[str, list[str]]:
    return run(CASES, tmp_path_factory.mktemp("losses"))


@pytest.mark.parametrize("key", list(CASES))
def test_the_lowering_matches_the_reference_at_the_traced_size_and_another(key, runs):
    assert runs[key] == [], runs[key]
