"""The offline optimizer's rewrites (activities/kernels/optimizer/rows.py, epilogue.py) on tiny tasks: each case is
traced at N=7, lowered, rewritten and rendered; the candidate runs under the Triton interpreter against the
reference at N=7 and N=10 (the compiler's own harness, tests/unit/compiler/cases.py), and launches fewer kernels
than the compiler's candidate."""

from __future__ import annotations

import copy

import pytest

from activities.kernels import compiler
from activities.kernels.optimizer import REWRITES, load
from tests.unit.compiler.cases import OTHER_N, RUNNER, TRACED_N, Case, interpreted, lowered, source
from tests.unit.compiler.test_lowerings_recurrent import NET

load()
LN = ("self.ln = nn.LayerNorm(6)",)
CAUSAL_SCORES = ("(q @ k.transpose(-2, -1) * 0.5).masked_fill(self.mask[:, :, :q.size(2), :q.size(2)] == 0, "
                 "float('-inf'))")
"""minGPT's attention scores: a scale and a causal mask over [batch, heads, tokens, tokens]."""


QKV = "torch.randn(2, N, 4), torch.randn(2, 4, N), torch.randn(2, N, 3)"
"""Batched q [2, N, 4], k^T [2, 4, N] and v [2, N, 3]."""


def _causal_heads(body: str) -> Case:
    """`body` over CAUSAL_SCORES, two heads of 40 * N tokens (several blocks of keys)."""
    return Case(body, ", ".join(["torch.randn(1, 2, 40 * N, 4)"] * 3), args="q, k, v",
                init=("self.register_buffer('mask', torch.tril(torch.ones(512, 512)).view(1, 1, 512, 512))",))


CASES: dict[str, tuple[str, Case, int, int]] = {
    # key: (rewrite, case, launches before, launches after)
    "softmax (online)": ("rows", Case("torch.softmax(x, dim=1)", "torch.randn(4, N)"), 3, 1),
    "log_softmax (online)": ("rows", Case("torch.log_softmax(x, dim=0)", "torch.randn(N, 5)"), 3, 1),
    "layer norm (Welford)": ("rows", Case("self.ln(x) * 2.0", "torch.randn(N, 6)", init=LN), 3, 1),
    "batch norm, training": ("rows", Case("self.bn(x)", "torch.randn(2, 3, N, 5)", init=("self.bn = nn.BatchNorm2d(3)",)),
                             3, 1),
    "instance norm": ("rows", Case("self.inorm(x)", "torch.randn(2, 3, N, 4)",
                                   init=("self.inorm = nn.InstanceNorm2d(3)",)), 3, 1),
    "group norm": ("rows", Case("self.gn(x)", "torch.randn(2, 4, N)", init=("self.gn = nn.GroupNorm(2, 4)",)), 4, 2),
    "group norm, few long rows (tiles wider than 128 columns)": (
        "rows", Case("self.gn(x)", "torch.randn(2, 4, 60 * N)", init=("self.gn = nn.GroupNorm(2, 4)",)), 4, 2),
    "rms norm over a middle dim": ("rows", Case("x / torch.sqrt(torch.mean(x * x, dim=1, keepdim=True) + 1e-5)",
                                                "torch.randn(2, N, 3)"), 2, 1),
    "frobenius norm (a scalar)": ("rows", Case("x / torch.norm(x, p='fro')", "torch.randn(3, N)"), 2, 1),
    "logsumexp then its consumer": ("rows", Case("x - torch.logsumexp(x, dim=1, keepdim=True)", "torch.randn(3, N)"),
                                    2, 1),
    "variance (Welford, one output per row)": ("rows", Case("torch.var(x, dim=1)", "torch.randn(3, N)"), 2, 1),
    "softmax whose max is also returned (the max stays its own launch)": (
        "rows", Case("(torch.softmax(x, dim=1), x.amax(dim=1, keepdim=True))", "torch.randn(3, N)"), 3, 2),
    "batch norm over dim 0, then softmax over dim 1 (two regions, one launch each)": (
        "rows", Case("torch.softmax(self.bn(x), dim=1)", "torch.randn(N, 5)", init=("self.bn = nn.BatchNorm1d(5)",)),
        5, 2),
    "softmax then the max over the same dim, its indices unread (L2 89)": (
        "rows", Case("torch.max(torch.softmax(x, dim=1) * 2.0, dim=1)[0]", "torch.randn(2, 5, N)"), 3, 1),
    "the same on rows with a NaN (NaN as torch has it: the max of a NaN row is NaN)": (
        "rows", Case("torch.max(torch.softmax(x, dim=0) * 2.0, dim=0)[0]",
                     "torch.tensor([[1.0, float('nan'), 3.0], [2.0, -1.0, 0.5]]).repeat(N, 1).T"), 3, 1),
    "linear + relu + scale": ("epilogue", Case("torch.relu(self.fc(x)) * 2.0", "torch.randn(N, 5)",
                                               init=("self.fc = nn.Linear(5, 6)",)), 2, 1),
    "bmm + sigmoid": ("epilogue", Case("torch.sigmoid(torch.bmm(x, y) + 1.0)", "torch.randn(2, N, 3), torch.randn(2, 3, 4)",
                                       args="x, y"), 2, 1),
    "conv2d + relu + channel bias": ("epilogue", Case(
        "torch.relu(self.conv(x)) + self.b", "torch.randn(1, 2, N, 6)",
        init=("self.conv = nn.Conv2d(2, 3, 3)", "self.b = nn.Parameter(torch.randn(3, 1, 1))")), 2, 1),
    "conv transposed + tanh": ("epilogue", Case("torch.tanh(self.conv(x) - 0.5)", "torch.randn(1, 2, N, 5)",
                                                init=("self.conv = nn.ConvTranspose2d(2, 3, 3, stride=2)",)), 2, 1),
    "linear on tokens + gelu + residual (the chain passes the view back to 3-D)": ("epilogue", Case(
        "x + F.gelu(self.fc(x))", "torch.randn(2, N, 6)", init=("self.fc = nn.Linear(6, 6)",)), 3, 1),
    "a transformer MLP block: both linears take their epilogues through the views": ("epilogue", Case(
        "x + self.down(F.gelu(self.up(self.ln(x))))", "torch.randn(2, N, 6)",
        init=("self.ln = nn.LayerNorm(6)", "self.up = nn.Linear(6, 12)", "self.down = nn.Linear(12, 6)")), 9, 5),
    "conv flattened + relu + per-channel bias (a view that merges the spatial dims)": ("epilogue", Case(
        "torch.relu(self.conv(x).flatten(2)) + self.b", "torch.randn(2, 2, N, 6)",
        init=("self.conv = nn.Conv2d(2, 3, 3)", "self.b = nn.Parameter(torch.randn(3, 1))")), 2, 1),
    "linear on tokens times a per-batch scale (no view of its broadcast: the bias alone joins)": ("epilogue", Case(
        "self.fc(x) * s", "torch.randn(2, N, 6), torch.randn(2, 1, 6)", args="x, s",
        init=("self.fc = nn.Linear(6, 6)",)), 3, 2),
    "attention: softmax of the scores, then V": ("attention", Case(
        "torch.softmax(torch.bmm(q, k), dim=-1) @ v", QKV, args="q, k, v"), 5, 1),
    "attention: heads, a scale and a causal mask (minGPT's), over several blocks of keys": (
        "attention", _causal_heads(f"torch.softmax({CAUSAL_SCORES}, dim=-1) @ v"), 5, 1),
    "attention: a mask hiding the first keys (a row's first blocks see nothing)": ("attention", Case(
        "torch.softmax((q @ k.transpose(-2, -1)).masked_fill(self.mask[:, :, :q.size(2), :q.size(2)] == 0, "
        "float('-inf')), dim=-1) @ v", ", ".join(["torch.randn(1, 1, 40 * N, 4)"] * 3), args="q, k, v",
        init=("self.register_buffer('mask', torch.triu(torch.ones(512, 512)).view(1, 1, 512, 512))",)), 5, 1),
    "attention: scaled_dot_product_attention (its safe softmax), causal, over several blocks of keys": (
        "attention", Case("F.scaled_dot_product_attention(q, k, v, is_causal=True)",
                          ", ".join(["torch.randn(1, 2, 40 * N, 8)"] * 3), args="q, k, v"), 8, 4),
    "attention: scaled_dot_product_attention, a mask hiding every key from the first query (its row is 0)": (
        "attention", Case("F.scaled_dot_product_attention(q, k, v, attn_mask=m)",
                          ", ".join(["torch.randn(2, 3 * N, 4)"] * 3) + ", torch.ones(3 * N, 3 * N).tril(-1).bool()",
                          args="q, k, v, m"), 6, 2),
    "attention: q scaled before the scores (the kernel scales its Q tile as it loads it)": ("attention", Case(
        "torch.softmax(torch.bmm(q * 0.35, k), dim=-1) @ v", QKV, args="q, k, v"), 6, 1),
    "attention: a scaled q also returned (it is written, and the kernel reads it)": ("attention", Case(
        "(q * 0.35, torch.softmax(torch.bmm(q * 0.35, k), dim=-1) @ v)", QKV, args="q, k, v"), 6, 2),
    "attention: nn.MultiheadAttention (in-projection, heads, q's scale, out-projection)": ("attention", Case(
        "self.mha(x, x, x)[0]", "torch.randn(N, 2, 8)", init=("self.mha = nn.MultiheadAttention(8, 2)",)), 10, 5),
    "attention: nn.MultiheadAttention's fast path (scaled_dot_product_attention: q and k each scaled in the kernel)": (
        "attention", Case("self.mha(x, x, x, need_weights=False)[0]", "torch.randn(N, 2, 8)",
                          init=("self.mha = nn.MultiheadAttention(8, 2)",)), 11, 5),
    "attention without a softmax: ReLU of the masked, scaled scores, then V (KernelBench L3 50's)": (
        "attention", _causal_heads(f"torch.relu({CAUSAL_SCORES}) @ v"), 3, 1),
    "recurrent: a 2-layer LSTM, batch first": ("recurrent", Case(
        "self.net(x)", "torch.randn(2, N, 6)", init=("self.net = Net('lstm', False, True)",), helpers=NET), 5, 5),
    "recurrent: a 2-layer bidirectional GRU": ("recurrent", Case(
        "self.net(x)", "torch.randn(N, 2, 6)", init=("self.net = Net('gru', True, False)",), helpers=NET), 5, 5),
    "recurrent: a tanh RNN without biases": ("recurrent", Case(
        "self.net(x)", "torch.randn(2, N, 6)", init=("self.net = Net('rnn', False, True, bias=False)",), helpers=NET),
        5, 5),
    "recurrent: a 2-layer ReLU RNN": ("recurrent", Case(
        "self.rnn(x)[0]", "torch.randn(N, 2, 6)", init=("self.rnn = nn.RNN(6, 8, 2, nonlinearity='relu')",)), 2, 2),
}
UNTOUCHED: dict[str, tuple[str, Case]] = {
    "a reduction broadcast along the wrong dims (keepdim=False on a square tensor)": (
        "rows", Case("x - x.mean(dim=1)", "torch.randn(N, N)")),
    "a lone reduction": ("rows", Case("x.sum(dim=1)", "torch.randn(3, N)")),
    "a per-row value read along the wrong dims (triplet margin loss: two norms, their difference; the emitter "
    "crashed on it)": ("rows", Case("F.triplet_margin_loss(a, p, n, margin=1.0)",
                                    "torch.randn(N, 8), torch.randn(N, 8), torch.randn(N, 8)", args="a, p, n")),
    "attention whose probabilities are returned too (they must be written)": ("attention", Case(
        "(torch.softmax(torch.bmm(q, k), dim=-1), torch.softmax(torch.bmm(q, k), dim=-1) @ v)",
        QKV, args="q, k, v")),
    "scores without a softmax also returned (they must be written)": ("attention", Case(
        "(torch.relu(torch.bmm(q, k)), torch.relu(torch.bmm(q, k)) @ v)",
        QKV, args="q, k, v")),
    "a plain product of three matrices (no chain between: the compiler's matmuls)": ("attention", Case(
        "torch.bmm(q, k) @ v", QKV, args="q, k, v")),
    "a product also returned": ("epilogue", Case("(x @ y, torch.relu(x @ y))", "torch.randn(N, 3), torch.randn(3, 4)",
                                                 args="x, y")),
}


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> dict[str, dict]:
    """Every case's launches before and after its rewrite, and the rewritten candidate's problems at N=7 and N=10
    ([] = right), all run in one interpreter child."""
    root = tmp_path_factory.mktemp("rewrites")
    found: dict[str, dict] = {}
    folders = []
    for i, (key, (name, case, _, _)) in enumerate(CASES.items()):
        graph = lowered(case, root / f"trace{i}")
        rewritten = REWRITES[name].fn(copy.deepcopy(graph))
        found[key] = {"before": compiler.launches(graph),
                      "after": compiler.launches(rewritten) if rewritten is not None else None}
        if rewritten is None:
            continue
        folder = root / f"case{i}"
        folder.mkdir()
        (folder / "task.py").write_text(source(case, TRACED_N))
        (folder / f"size_{OTHER_N}.py").write_text(source(case, OTHER_N))
        (folder / "candidate.py").write_text(compiler.render(rewritten, source(case, TRACED_N)))
        folders.append(str(folder))
        found[key]["folder"] = folder.name
    notes = interpreted(RUNNER, *folders, timeout=1200, cwd=root)
    for got in found.values():
        got["problems"] = notes.get(got.get("folder", ""), ["not run"])
    return found


@pytest.mark.parametrize("key", list(CASES))
def test_the_rewrite_launches_the_kernels_expected_and_stays_right_at_two_sizes(key, runs):
    _, _, before, after = CASES[key]
    got = runs[key]
    assert (got["before"], got["after"]) == (before, after), got
    assert got["problems"] == [], got["problems"]


@pytest.mark.parametrize("key", list(UNTOUCHED))
def test_a_graph_the_rewrite_cannot_keep_exact_is_left_alone(key, tmp_path):
    name, case = UNTOUCHED[key]
    assert REWRITES[name].fn(lowered(case, tmp_path)) is None


def test_the_recurrent_rewrite_runs_every_step_layer_and_direction_of_a_stacked_layer_in_one_launch(tmp_path):
    case = CASES["recurrent: a 2-layer bidirectional GRU"][1]
    graph = REWRITES["recurrent"].fn(lowered(case, tmp_path))
    source = compiler.render(graph, source_of(case))
    launches = [line.strip() for line in source.split("class ModelNew")[1].splitlines() if "[grid](" in line]
    assert len([line for line in launches if line.startswith("rnn_stack_")]) == 1, launches  # one launch, 4 layers
    assert "rnn_cell_kernel" not in source and "_recurrent(" not in source and "_matmul(seq" not in source
    stack = source[source.index("def rnn_stack_"):]
    assert stack.split("\n\n")[0].count("rnn_layer(") == 4 and stack.count("tl.debug_barrier()") == 1


def source_of(case: Case) -> str:
    return source(case, TRACED_N)
