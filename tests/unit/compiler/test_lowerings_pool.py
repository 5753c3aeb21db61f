"""Pooling (activities/kernels/compiler/lowerings/pool.py)."""

from __future__ import annotations

import pytest

from tests.unit.compiler.cases import Case, run

X = "torch.randn(3, N)"
CASES: dict[str, Case] = {
    "max_pool2d_with_indices": Case("self.p(x)", "torch.randn(2, 3, N, 11)", init=("self.p = nn.MaxPool2d(3, stride=2, padding=1, dilation=2, ceil_mode=True)",)),
    "max_pool2d_with_indices:1d": Case("F.max_pool1d(x, 2)", "torch.randn(2, 3, N)"),
    "max_pool3d_with_indices": Case("F.max_pool3d(x, 2)", "torch.randn(1, 2, 4, N, 4)"),
    "_adaptive_avg_pool2d": Case("F.adaptive_avg_pool2d(x, (3, 2))", "torch.randn(2, 3, N, 5)"),
    "_adaptive_avg_pool2d:1d": Case("F.adaptive_avg_pool1d(x, 3)", "torch.randn(2, 3, N)"),
    "_adaptive_avg_pool3d": Case("F.adaptive_avg_pool3d(x, (2, 1, 3))", "torch.randn(1, 2, 4, N, 5)"),
    "adaptive_max_pool2d": Case("F.adaptive_max_pool2d(x, (2, 3))", "torch.randn(2, 3, N, 5)"),
    "adaptive_max_pool3d": Case("F.adaptive_max_pool3d(x, (2, 2, 1))", "torch.randn(1, 2, 4, N, 5)"),
    "avg_pool2d": Case("self.p(x)", "torch.randn(2, 3, N)", init=("self.p = nn.AvgPool1d(4, stride=2, padding=2, count_include_pad=False)",)),
    "avg_pool3d": Case("self.p(x)", "torch.randn(1, 2, 4, N, 4)", init=("self.p = nn.AvgPool3d(2)",)),
}


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> dict[str, list[str]]:
    return run(CASES, tmp_path_factory.mktemp("pool"))


@pytest.mark.parametrize("key", list(CASES))
def test_the_lowering_matches_the_reference_at_the_traced_size_and_another(key, runs):
    assert runs[key] == [], runs[key]
