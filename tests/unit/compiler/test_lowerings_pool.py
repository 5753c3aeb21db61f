"""Pooling (activities/kernels/compiler/lowerings/pool.py), and a pool of a pool as one (`pool_chains`)."""

from __future__ import annotations

import pytest

from tests.unit.compiler.cases import Case, candidate, run

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
    # key: a pool of a pool; sizes 2N + 1 and 3N + 2 leave remainders every floor division must drop
    "max_pool3d_with_indices:max_of_max": Case("F.max_pool3d(F.max_pool3d(x, 2), 3)", "torch.randn(1, 2, 2 * N + 1, 3 * N + 2, 7)"),
    "max_pool2d_with_indices:overlapping": Case("F.max_pool2d(F.max_pool2d(x, 3, stride=2), 2, stride=1)",
                                                "torch.randn(2, 3, 2 * N + 1, 11)"),
    "avg_pool3d:avg_of_avg": Case("F.avg_pool3d(F.avg_pool3d(x, 2), 2)", "torch.randn(1, 2, 2 * N + 1, 9, 3 * N + 2)"),
    "avg_pool2d:second_overlaps": Case("F.avg_pool2d(F.avg_pool2d(x, 2), 3, stride=1)", "torch.randn(2, 3, 2 * N + 1, 12)"),
    "avg_pool2d:first_overlaps": Case("F.avg_pool2d(F.avg_pool2d(x, 3, stride=2), 2)", "torch.randn(2, 3, 2 * N + 1, 11)"),
    "avg_pool2d:padded": Case("F.avg_pool2d(F.avg_pool2d(x, 2, padding=1), 2)", "torch.randn(2, 3, 2 * N + 1, 11)"),
    "max_pool2d_with_indices:then_avg": Case("F.avg_pool2d(F.max_pool2d(x, 2), 2)", "torch.randn(2, 3, 2 * N + 1, 11)"),
}
CHAINS = {"max_pool3d_with_indices:max_of_max": 1, "max_pool2d_with_indices:overlapping": 1, "avg_pool3d:avg_of_avg": 1,
          "avg_pool2d:second_overlaps": 1, "avg_pool2d:first_overlaps": 2, "avg_pool2d:padded": 2,
          "max_pool2d_with_indices:then_avg": 2}
"""Launches of each pool of a pool: one where the windows compose exactly (any max of maxes; an average of averages
whose first windows do not overlap), two otherwise (overlapping averages would count elements twice; padding,
kinds that differ)."""


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> dict[str, list[str]]:
    return run(CASES, tmp_path_factory.mktemp("pool"))


@pytest.mark.parametrize("key", list(CASES))
def test_the_lowering_matches_the_reference_at_the_traced_size_and_another(key, runs):
    assert runs[key] == [], runs[key]


@pytest.mark.parametrize("key", list(CHAINS))
def test_a_pool_of_a_pool_is_one_launch_where_the_windows_compose_exactly(key, tmp_path):
    forward = candidate(CASES[key], tmp_path).split("class ModelNew", 1)[1]
    assert forward.count("[grid](") == CHAINS[key], forward
