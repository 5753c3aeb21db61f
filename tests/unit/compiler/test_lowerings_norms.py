"""The normalisations (activities/kernels/compiler/lowerings/norms.py)."""

from __future__ import annotations

import pytest

from tests.unit.compiler.cases import Case, run

X = "torch.randn(3, N)"
BN_EVAL = ("self.bn = nn.BatchNorm1d(3)", "self.bn.running_mean.uniform_()", "self.bn.running_var.uniform_(0.5, 2)",
           "self.eval()")
CASES: dict[str, Case] = {
    "native_layer_norm": Case("self.ln(x) * 2.0", "torch.randn(N, 6)", init=("self.ln = nn.LayerNorm(6)",)),
    "_native_batch_norm_legit": Case("self.bn(x)", "torch.randn(2, 3, N, 5)", init=("self.bn = nn.BatchNorm2d(3)",)),
    "_native_batch_norm_legit:instance": Case("self.inorm(x)", "torch.randn(2, 3, N, 4)", init=("self.inorm = nn.InstanceNorm2d(3)",)),
    "_native_batch_norm_legit_no_training": Case("self.bn(x)", "torch.randn(2, 3, N)", init=BN_EVAL),
    "native_batch_norm": Case("self.bn(x)", "torch.randn(2, 3, N, 5)", init=("self.bn = nn.BatchNorm2d(3)",), concrete=True),
    "native_batch_norm:eval": Case("self.bn(x)", "torch.randn(2, 3, N)", init=BN_EVAL, concrete=True),
    "native_group_norm": Case("self.gn(x)", "torch.randn(2, 4, N)", init=("self.gn = nn.GroupNorm(2, 4)",)),
    "native_group_norm:few long rows": Case("self.gn(x)", "torch.randn(2, 4, 60 * N)",  # tiles wider than 128
                                            init=("self.gn = nn.GroupNorm(2, 4)",)),
}


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> dict[str, list[str]]:
    return run(CASES, tmp_path_factory.mktemp("norms"))


@pytest.mark.parametrize("key", list(CASES))
def test_the_lowering_matches_the_reference_at_the_traced_size_and_another(key, runs):
    assert runs[key] == [], runs[key]
