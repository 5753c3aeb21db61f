"""No traced size in a lowered candidate (issue 36, item 4): every view, reshape and grid is computed from the
run-time tensors (the trace's size symbols), so a candidate traced at one size is right at several."""

from __future__ import annotations

import re

import pytest

from tests.unit.compiler.cases import Case, analyse, candidate, run, source

ATTENTION = '''
class Attention(nn.Module):
    """Multi-head self-attention, as model code writes it: sizes from x.size(), heads from the constructor."""

    def __init__(self, d, heads):
        super().__init__()
        self.qkv = nn.Linear(d, 3 * d)
        self.proj = nn.Linear(d, d)
        self.heads = heads

    def forward(self, x):
        B, T, C = x.size()
        q, k, v = self.qkv(x).split(C, dim=2)
        q = q.view(B, T, self.heads, C // self.heads).transpose(1, 2)
        k = k.view(B, T, self.heads, C // self.heads).transpose(1, 2)
        v = v.view(B, T, self.heads, C // self.heads).transpose(1, 2)
        att = F.softmax((q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(k.size(-1))), dim=-1)
        y = (att @ v).transpose(1, 2).contiguous().view(B, T, C)
        return self.proj(y)
'''
CASES = {
    "linear_gelu_layernorm_3d": Case("self.ln(F.gelu(self.fc(x)))", "torch.randn(2, N, 16)",
                                     init=("self.fc = nn.Linear(16, 24)", "self.ln = nn.LayerNorm(24)")),
    "attention": Case("self.attn(x)", "torch.randn(2, N, 16)", init=("self.attn = Attention(16, 4)",),
                      helpers=ATTENTION),
    "merge_then_split": Case("(x.view(-1, x.size(-1)) * 2).view(x.size(0), -1, x.size(-1))", "torch.randn(3, N, 4)"),
    "size_as_operand": Case("x / x.size(1) + x.sum(1, keepdim=True) / x.shape[1]", "torch.randn(3, N)"),
    "slice_to_a_size": Case("x[:, : y.size(1)] * 2", "torch.randn(3, 2 * N), torch.randn(3, N)", args="x, y"),
}
SIZES = (10, 13)


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> dict[str, list[str]]:
    return run(CASES, tmp_path_factory.mktemp("sizes"), sizes=SIZES, keyed_by_op=False)


@pytest.mark.parametrize("key", list(CASES))
def test_a_candidate_traced_at_one_size_is_right_at_several(key, runs):
    assert runs[key] == [], runs[key]


def test_the_trace_gives_sizes_as_expressions_over_the_inputs_sizes(tmp_path):
    analysis = analyse(source(CASES["linear_gelu_layernorm_3d"], 7), tmp_path)
    assert {(s.input, s.dim) for s in analysis.symbols.values()} == {(0, 0), (0, 1), (0, 2)}, \
        "the features too, although the Linear's weight fixes them: read from the input, they follow a model built at other sizes"
    view = analysis.calls[0]
    assert view.op == "aten.view.default" and view.out[0].shape == [14, 16]
    assert view.out[0].sizes[0].replace(" ", "") in {f"({a}*{b})" for a in analysis.symbols for b in analysis.symbols}


def test_no_traced_size_is_written_into_the_candidates_views(tmp_path):
    """Traced at N=7: the sequence length (7) and everything made of it (14, 28, 49) come from the tensors; the
    model's own constants (4 heads, 16 features) may stay."""
    forward = candidate(CASES["attention"], tmp_path).split("class ModelNew", 1)[1]
    targets = re.findall(r"\.(?:reshape|expand)\(\[(.*)\]\)", forward)
    literals = [int(e) for t in targets for e in t.split(", ") if e.strip().isdigit()]
    assert len(targets) >= 10 and 4 in literals
    assert not [n for n in literals if n % 7 == 0], targets
