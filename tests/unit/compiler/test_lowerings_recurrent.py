"""Recurrent layers (activities/kernels/compiler/lowerings/recurrent.py): traced whole, so the candidate loops over
the sequence length it finds at run time (the cases run at sequence lengths 7 and 10)."""

from __future__ import annotations

import copy

import pytest

from activities.kernels import compiler
from activities.kernels.optimizer import REWRITES, load
from activities.kernels.static_checks import static_check
from tests.unit.compiler.cases import TRACED_N, Case, lowered, run, source

NET = '''
class Net(nn.Module):
    def __init__(self, mode, bidirectional, batch_first, bias=True):
        super().__init__()
        cls = {"lstm": nn.LSTM, "gru": nn.GRU, "rnn": nn.RNN}[mode]
        self.rnn = cls(6, 8, 2, batch_first=batch_first, bidirectional=bidirectional, bias=bias)
        self.fc = nn.Linear(8 * (2 if bidirectional else 1), 3)
        self.mode, self.d = mode, 2 if bidirectional else 1

    def forward(self, x):
        b = x.size(0) if self.rnn.batch_first else x.size(1)
        h0 = torch.randn(2 * self.d, b, 8, device=x.device)
        if self.mode == "lstm":
            out, (h, c) = self.rnn(x, (h0, torch.randn(2 * self.d, b, 8, device=x.device)))
            h = h + c
        else:
            out, h = self.rnn(x, h0)
        return self.fc(out[:, -1, :] if self.rnn.batch_first else out[-1]) + h.sum(0).mean()
'''
CASES = {
    "rnn:lstm_batch_first": Case("self.net(x)", "torch.randn(2, N, 6)", init=("self.net = Net('lstm', False, True)",),
                                 helpers=NET),
    "rnn:lstm_bidirectional": Case("self.net(x)", "torch.randn(N, 2, 6)", init=("self.net = Net('lstm', True, False)",),
                                   helpers=NET),
    "rnn:gru_bidirectional": Case("self.net(x)", "torch.randn(N, 2, 6)", init=("self.net = Net('gru', True, False)",),
                                  helpers=NET),
    "rnn:tanh_without_bias": Case("self.net(x)", "torch.randn(2, N, 6)",
                                  init=("self.net = Net('rnn', False, True, bias=False)",), helpers=NET),
    "rnn:relu": Case("self.rnn(x)[0]", "torch.randn(N, 2, 6)", init=("self.rnn = nn.RNN(6, 8, 2, nonlinearity='relu')",)),
}


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> dict[str, list[str]]:
    return run(CASES, tmp_path_factory.mktemp("recurrent"))


@pytest.mark.parametrize("key", list(CASES))
def test_the_lowering_matches_the_reference_at_the_traced_size_and_another(key, runs):
    assert runs[key] == [], runs[key]


BARE_GRU = Case("self.gru(x)[0]", "torch.randn(N, 2, 6)", init=("self.gru = nn.GRU(6, 8, 2)",))
"""A model that is only a recurrent layer: every launch of its forward is inside the layer's launcher."""


def test_a_model_that_is_only_a_recurrent_layer_passes_the_static_check_compiled_and_rewritten(tmp_path):
    load()
    task = source(BARE_GRU, TRACED_N)
    graph = lowered(BARE_GRU, tmp_path)
    persistent = REWRITES["recurrent"].fn(copy.deepcopy(graph))
    for candidate in (compiler.render(graph, task), compiler.render(persistent, task)):
        assert static_check(candidate).reasons == []
