"""Recurrent layers (nn.LSTM, nn.GRU, nn.RNN), which the probe traces whole (`fleetforge.rnn`: not unrolled, so
the sequence length stays a run-time size): one `recurrent` node whose emitter loops over the time steps; its
outputs (output, h_n[, c_n]) are `item` views of it."""

from __future__ import annotations

from typing import TYPE_CHECKING

from activities.kernels.compiler.graph import Refused
from activities.kernels.compiler.registry import lowers

if TYPE_CHECKING:
    from activities.kernels.compiler.reader import Call, Reader

MODES = ("lstm", "gru", "rnn_tanh", "rnn_relu")


@lowers("rnn")
def rnn(r: Reader, c: Call) -> list[int]:
    mode, _, hx, params, has_biases, layers, dropout, train, bidirectional, batch_first = c.args
    if mode not in MODES:
        raise Refused(f"recurrent mode {mode}")
    if float(dropout) != 0 and train:
        raise Refused(f"a recurrent layer with dropout={dropout} in training mode: it draws random masks")
    directions = 2 if bidirectional else 1
    per_layer = 4 if has_biases else 2
    if len(params) != int(layers) * directions * per_layer:
        raise Refused("a recurrent layer with projections (proj_size) or an unexpected weight layout")
    states = [r.value(h) for h in hx]
    weights = [r.value(p) for p in params]
    node = r.add("recurrent", [c.value(1), *states, *weights], c.shape, c.dtype, mode=mode, layers=int(layers),
                 bidirectional=bool(bidirectional), batch_first=bool(batch_first), has_biases=bool(has_biases),
                 states=len(states))
    return [r.view(node, "item", spec.shape, spec.dtype, index=k) for k, spec in enumerate(c.out)]
