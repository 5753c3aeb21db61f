"""Matrix products (activities/kernels/compiler/lowerings/linear.py)."""

from __future__ import annotations

import pytest

from tests.unit.compiler.cases import Case, run

X = "torch.randn(3, N)"
CASES: dict[str, Case] = {
    "mm": Case("a @ b.t()", "torch.randn(N, 6), torch.randn(5, 6)", args="a, b"),
    "bmm": Case("torch.bmm(a, b.transpose(1, 2))", "torch.randn(2, N, 6), torch.randn(2, 5, 6)", args="a, b"),
    "mv": Case("torch.mv(a, b)", "torch.randn(N, 6), torch.randn(6)", args="a, b"),
    "addmm": Case("torch.sigmoid(self.fc(x)) * 3.0", "torch.randn(N, 8)", init=("self.fc = nn.Linear(8, 5)",)),
    "addmm:alpha_beta": Case("torch.addmm(c, a, b, beta=0.5, alpha=2.0)", "torch.randn(N, 4), torch.randn(N, 6), torch.randn(6, 4)", args="c, a, b"),
    "baddbmm": Case("torch.baddbmm(c, a, b, alpha=0.5)", "torch.randn(2, N, 4), torch.randn(2, N, 6), torch.randn(2, 6, 4)", args="c, a, b"),
}


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> dict[str, list[str]]:
    return run(CASES, tmp_path_factory.mktemp("linear"))


@pytest.mark.parametrize("key", list(CASES))
def test_the_lowering_matches_the_reference_at_the_traced_size_and_another(key, runs):
    assert runs[key] == [], runs[key]
