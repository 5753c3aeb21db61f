"""Cumulative sums and products (activities/kernels/compiler/lowerings/scan.py), and the forms the `scan_forms`
pass makes one scan of: reversed (a flip, the scan, a flip) and exclusive (zeros, then the scan of all but the
last), each with the pointwise chain before it fused in."""

from __future__ import annotations

import pytest

from tests.unit.compiler.cases import Case, candidate, run

X = "torch.randn(3, N)"
LONG = "torch.randn(2, 20 * N)"  # 140 and 200 columns: more than one 128-column tile, so the carry is tested
EXCLUSIVE = ("torch.cat((torch.zeros_like(x.select({d}, 0).unsqueeze({d})), "
             "torch.cumsum(x.narrow(dim={d}, start=0, length=x.size({d}) - 1), dim={d})), dim={d})")
CASES: dict[str, Case] = {
    "cumsum": Case("torch.cumsum(x, dim=1)", X),
    "cumsum:reverse": Case("torch.cumsum(x.flip(1), dim=1).flip(1)", X),
    "cumsum:reverse_long": Case("torch.cumsum(x.flip(-1), dim=-1).flip(-1)", LONG),
    "cumsum:reverse_dim0": Case("torch.cumsum(x.flip(0), dim=0).flip(0)", "torch.randn(N, 3, 4)"),
    "cumsum:exclusive": Case(EXCLUSIVE.format(d=1), X),
    "cumsum:exclusive_long": Case(EXCLUSIVE.format(d=1), LONG),
    "cumsum:exclusive_middle": Case(EXCLUSIVE.format(d=1), "torch.randn(2, N, 3)"),
    "cumsum:masked": Case("torch.cumsum(x * m, dim=1)", "torch.randn(3, N), torch.randint(0, 2, (3, N)).bool()", args="x, m"),
    "cumsum:chain_broadcast": Case("torch.cumsum(torch.relu(x - b) * 0.5, dim=1)", "torch.randn(2, 20 * N), torch.randn(2, 1)",
                                   args="x, b"),
    "cumsum:flip_other_dim": Case("torch.cumsum(x.flip(0), dim=1).flip(0)", X),  # not a reversed scan
    "cumprod": Case("torch.cumprod(x, dim=0)", "torch.rand(N, 3) + 0.5"),
    "cumprod:reverse_fused": Case("torch.cumprod((x * 0.5 + 0.8).flip(1), dim=1).flip(1)", "torch.rand(3, 20 * N)"),
}
ONE_LAUNCH = ["cumsum:reverse", "cumsum:reverse_long", "cumsum:reverse_dim0", "cumsum:exclusive", "cumsum:exclusive_long",
              "cumsum:exclusive_middle", "cumsum:masked", "cumsum:chain_broadcast", "cumprod:reverse_fused"]


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> dict[str, list[str]]:
    return run(CASES, tmp_path_factory.mktemp("scan"))


@pytest.mark.parametrize("key", list(CASES))
def test_the_lowering_matches_the_reference_at_the_traced_size_and_another(key, runs):
    assert runs[key] == [], runs[key]


@pytest.mark.parametrize("key", ONE_LAUNCH)
def test_a_reversed_exclusive_or_fused_scan_is_one_launch(key, tmp_path):
    forward = candidate(CASES[key], tmp_path).split("class ModelNew", 1)[1]
    assert forward.count("[grid](") == 1 and "_scan(" in forward, forward


def test_a_flip_along_another_dim_stays_a_flip(tmp_path):
    forward = candidate(CASES["cumsum:flip_other_dim"], tmp_path).split("class ModelNew", 1)[1]
    assert forward.count("[grid](") == 3, forward
