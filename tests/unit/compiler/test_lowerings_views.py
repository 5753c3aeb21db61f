"""The view lowerings (activities/kernels/compiler/lowerings/views.py): no kernel of their own, so each case\nfeeds the view to a pointwise op and checks the view's sizes come from the run-time tensors."""

from __future__ import annotations

import pytest

from tests.unit.compiler.cases import Case, run

X = "torch.randn(3, N)"
CELL = '''
class Cell(nn.Module):
    """A plain tensor attribute set from an input each call (KernelBench L3 33's hidden state)."""

    def __init__(self):
        super().__init__()
        self.hidden = torch.randn(3, 4)

    def forward(self, x, h):
        self.hidden.copy_(h)
        self.hidden = torch.tanh(torch.cat((x, self.hidden), dim=1))
        return self.hidden * 2
'''
CASES: dict[str, Case] = {
    "clone": Case("x.t().contiguous() * 2", X),
    "detach": Case("x.detach() * 2", X),
    "view": Case("x.view(-1) * 2", "torch.randn(3, N, 4)"),
    "_unsafe_view": Case("x.t().reshape(-1) * 2", X),
    "permute": Case("x.permute(2, 0, 1) * 2", "torch.randn(3, N, 4)"),
    "t": Case("x.t() * 2", X),
    "transpose": Case("x.transpose(0, 2) * 2", "torch.randn(3, N, 4)"),
    "unsqueeze": Case("x.unsqueeze(1) * 2", X),
    "squeeze": Case("x.squeeze(1) * 2", "torch.randn(3, 1, N)"),
    "expand": Case("x.expand(2, 3, N) * 2", X),
    "select": Case("x[:, 1] * 2", "torch.randn(3, N, 4)"),
    "split": Case("x.split(2, dim=1)[0] * 2 + x.split(2, dim=1)[2]", "torch.randn(3, 7, N)"),
    "split:chunks_of_a_size": Case("x.split(x.size(1) // 2, dim=1)[1] * 2", "torch.randn(3, 2 * N)"),
    "split_with_sizes": Case("torch.split(x, [2, x.size(1) - 2], dim=1)[1] * 2", "torch.randn(3, N)"),
    "unsafe_split": Case("torch.unsafe_split(x, 3, 1)[1] * 2", "torch.randn(N, 9)"),
    "unbind": Case("x.unbind(0)[0] * x.unbind(0)[2]", "torch.randn(3, N)"),
    "unfold": Case("x.unfold(2, 2, 2).unfold(3, 3, 3) * 2", "torch.randn(2, 3, 2 * N, 9)"),
    "copy": Case("torch.zeros(3, 1, device=x.device).copy_(y) * x", "torch.randn(3, N), torch.randn(1)", args="x, y"),
    "copy:state_attribute": Case("self.cell(x, h)", "torch.randn(3, N), torch.randn(3, 4)", args="x, h",
                                 init=("self.cell = Cell()",), helpers=CELL),
    "slice": Case("x[:, 1:-1] * 2", "torch.randn(3, N, 4)"),
}


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> dict[str, list[str]]:
    return run(CASES, tmp_path_factory.mktemp("views"))


@pytest.mark.parametrize("key", list(CASES))
def test_the_lowering_matches_the_reference_at_the_traced_size_and_another(key, runs):
    assert runs[key] == [], runs[key]
