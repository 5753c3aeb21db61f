"""The `recurrent` rewrite: a recurrent layer's time loop inside one kernel per layer and direction (a persistent
RNN). The compiler's recurrent block launches, per layer and direction, one matmul for every step's input
projection and then, per time step, a matmul of the hidden state and a cell kernel: 2 launches a step, and the
hidden state goes to DRAM and back between them (an LSTM of 6 layers over 512 steps: 6,000 launches).

A batch row's hidden state depends on that row alone, so here a program owns BB batch rows and the whole hidden
size, keeps the state in registers across the steps, and per step computes each gate's `h @ W_hh[gate]^T` with
`tl.dot` (the weights reread from cache), adds the step's input projection and the biases, applies the cell (LSTM,
GRU, tanh or relu RNN, as torch computes them) and writes that step's output slice. The hidden lanes beyond H hold 0
and stay 0 through every cell, so the padded `tl.dot` is exact.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from activities.kernels.compiler.blocks import matmul
from activities.kernels.compiler.blocks.common import IEEE_DOT
from activities.kernels.compiler.registry import emits
from activities.kernels.optimizer import live, rewrite

if TYPE_CHECKING:
    from activities.kernels.compiler.forward import Forward
    from activities.kernels.compiler.graph import Graph


@rewrite("recurrent", order=40, summary="a recurrent layer's time loop in one kernel per layer and direction")
def recurrent(graph: Graph) -> Graph | None:
    """Every recurrent node runs persistent (None: the graph has none)."""
    found = [i for i in sorted(live(graph)) if graph.nodes[i].op == "recurrent"]
    for i in found:
        graph.nodes[i].op = "persistent_recurrent"
    return graph if found else None


KERNEL = f'''@triton.jit
def rnn_persistent_gate(xrow, whh_ptr, bih_ptr, bhh_ptr, h, j, k, H, swr, swc, m2, jmask, wmask,
                        HAS_BIAS: tl.constexpr):
    # gate k: this step's input projection and h @ W_hh[k*H:(k+1)*H]^T, biases added
    x = tl.load(xrow + k * H, mask=m2, other=0.0).to(tl.float32)
    w = tl.load(whh_ptr + (k * H + j[None, :]) * swr + j[:, None] * swc, mask=wmask, other=0.0).to(tl.float32)
    hg = tl.dot(h, w, {IEEE_DOT})
    if HAS_BIAS:
        x += tl.load(bih_ptr + k * H + j, mask=jmask, other=0.0).to(tl.float32)[None, :]
        hg += tl.load(bhh_ptr + k * H + j, mask=jmask, other=0.0).to(tl.float32)[None, :]
    return x, hg


@triton.jit
def rnn_persistent_kernel(xg_ptr, whh_ptr, bih_ptr, bhh_ptr, h0_ptr, c0_ptr, hn_ptr, cn_ptr, out_ptr,
                          T, B, H, sxt, sxb, swr, swc, sot, sob, soh, REVERSE: tl.constexpr, MODE: tl.constexpr,
                          HAS_BIAS: tl.constexpr, BB: tl.constexpr, BH: tl.constexpr):
    # every time step of one layer and direction for BB batch rows (MODE 0 LSTM, 1 GRU, 2 tanh RNN, 3 relu RNN);
    # the hidden (and cell) state stays in registers
    rb = tl.program_id(0) * BB + tl.arange(0, BB)
    j = tl.arange(0, BH)
    jmask = j < H
    m2 = (rb < B)[:, None] & jmask[None, :]
    wmask = jmask[:, None] & jmask[None, :]
    state = rb[:, None] * H + j[None, :]
    h = tl.load(h0_ptr + state, mask=m2, other=0.0).to(tl.float32)
    c = tl.load(c0_ptr + state, mask=m2, other=0.0).to(tl.float32)
    for step in range(T):
        t = step
        if REVERSE:
            t = T - 1 - step
        xrow = xg_ptr + t * sxt + rb[:, None] * sxb + j[None, :]
        x0, h0 = rnn_persistent_gate(xrow, whh_ptr, bih_ptr, bhh_ptr, h, j, 0, H, swr, swc, m2, jmask, wmask,
                                     HAS_BIAS)
        if MODE == 0:
            x1, h1 = rnn_persistent_gate(xrow, whh_ptr, bih_ptr, bhh_ptr, h, j, 1, H, swr, swc, m2, jmask, wmask,
                                         HAS_BIAS)
            x2, h2 = rnn_persistent_gate(xrow, whh_ptr, bih_ptr, bhh_ptr, h, j, 2, H, swr, swc, m2, jmask, wmask,
                                         HAS_BIAS)
            x3, h3 = rnn_persistent_gate(xrow, whh_ptr, bih_ptr, bhh_ptr, h, j, 3, H, swr, swc, m2, jmask, wmask,
                                         HAS_BIAS)
            c = tl.sigmoid(x1 + h1) * c + tl.sigmoid(x0 + h0) * _tanh(x2 + h2)
            h = tl.sigmoid(x3 + h3) * _tanh(c)
        elif MODE == 1:
            x1, h1 = rnn_persistent_gate(xrow, whh_ptr, bih_ptr, bhh_ptr, h, j, 1, H, swr, swc, m2, jmask, wmask,
                                         HAS_BIAS)
            x2, h2 = rnn_persistent_gate(xrow, whh_ptr, bih_ptr, bhh_ptr, h, j, 2, H, swr, swc, m2, jmask, wmask,
                                         HAS_BIAS)
            z = tl.sigmoid(x1 + h1)
            h = (1.0 - z) * _tanh(x2 + tl.sigmoid(x0 + h0) * h2) + z * h
        elif MODE == 2:
            h = _tanh(x0 + h0)
        else:
            h = tl.maximum(x0 + h0, 0.0)
        tl.store(out_ptr + t * sot + rb[:, None] * sob + j[None, :] * soh, h, mask=m2)
    tl.store(hn_ptr + state, h, mask=m2)
    if MODE == 0:
        tl.store(cn_ptr + state, c, mask=m2)
'''

LAUNCHER = '''

def _recurrent_persistent(mode, x, states, weights, layers, bidirectional, batch_first, has_biases):
    """(output, h_n[, c_n]) of a stacked (bi)directional recurrent layer: per layer and direction one batched matmul
    projects all time steps, then one launch runs every step (the state in registers, BB batch rows a program)."""
    code = ("lstm", "gru", "rnn_tanh", "rnn_relu").index(mode)
    seq = x.transpose(0, 1) if batch_first else x
    T, B = seq.shape[0], seq.shape[1]
    H = states[0].shape[2]
    D = 2 if bidirectional else 1
    per = 4 if has_biases else 2
    hn = torch.empty(states[0].shape, dtype=x.dtype, device=x.device)
    cn = torch.empty(states[0].shape, dtype=x.dtype, device=x.device) if code == 0 else hn
    BB, BH = 16, max(16, triton.next_power_of_2(H))
    for layer in range(layers):
        out = torch.empty((T, B, D * H), dtype=x.dtype, device=x.device)
        for d in range(D):
            k = layer * D + d
            w = weights[k * per:(k + 1) * per]
            w_ih, w_hh = w[0], w[1]
            b_ih, b_hh = (w[2], w[3]) if has_biases else (w_ih, w_hh)
            xg, grid, args, meta = _matmul(seq, w_ih.t().expand(T, -1, -1))
            matmul_kernel[grid](*args, **meta)
            h0 = states[0][k].contiguous()
            c0 = states[1][k].contiguous() if code == 0 else h0
            o = out[:, :, d * H:(d + 1) * H]
            rnn_persistent_kernel[(triton.cdiv(B, BB),)](
                xg, w_hh, b_ih, b_hh, h0, c0, hn[k], cn[k], o, T, B, H, xg.stride(0), xg.stride(1),
                w_hh.stride(0), w_hh.stride(1), o.stride(0), o.stride(1), o.stride(2),
                REVERSE=d == 1, MODE=code, HAS_BIAS=has_biases, BB=BB, BH=BH)
        seq = out
    output = seq.transpose(0, 1) if batch_first else seq
    return (output, hn, cn) if code == 0 else (output, hn)
'''


@emits("persistent_recurrent")
def emit_persistent(fw: Forward, v: int) -> str:
    n = fw.nodes[v]
    at = n.attrs
    args = [fw.tensor(a) for a in n.args]
    x, states, weights = args[0], args[1:1 + at["states"]], args[1 + at["states"]:]
    fw.kernel(("matmul_kernel", matmul.KERNEL))
    fw.kernel(("rnn_persistent_kernel", KERNEL))
    fw.launcher("_matmul", matmul.LAUNCHER)
    fw.launcher("_recurrent_persistent", LAUNCHER)
    fw.launches += 1
    return fw.emit(v, f"_recurrent_persistent({at['mode']!r}, {x}, [{', '.join(states)}], [{', '.join(weights)}], "
                      f"{at['layers']}, {at['bidirectional']}, {at['batch_first']}, {at['has_biases']})")
