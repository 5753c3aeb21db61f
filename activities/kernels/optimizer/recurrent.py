"""The `recurrent` rewrite: a recurrent layer's time loop inside one kernel per layer and direction (a persistent
RNN). The compiler's recurrent block launches, per layer and direction, one matmul for every step's input
projection and then, per time step, a matmul of the hidden state and a cell kernel: 2 launches a step, and the
hidden state goes to DRAM and back between them (an LSTM of 6 layers over 512 steps: 6,000 launches).

A batch row's hidden state depends on that row alone, so here a program owns BB batch rows and the whole hidden
size, keeps the state in registers across the steps, and per step computes each gate's `x_t @ W_ih[gate]^T` and
`h @ W_hh[gate]^T` with `tl.dot` (the weights reread from cache; the input projection is not a launch of its own,
and the projected sequence is never written), adds the biases, applies the cell (LSTM, GRU, tanh or relu RNN, as
torch computes them) and writes that step's output slice. The hidden lanes beyond H hold 0 and stay 0 through every
cell, so the padded `tl.dot` is exact.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from activities.kernels.compiler.blocks.common import IEEE_DOT
from activities.kernels.compiler.blocks.recurrent import emit_recurrent
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
def rnn_persistent_gate(xrow, rmask, wih_ptr, whh_ptr, bih_ptr, bhh_ptr, h, j, k, I, H, sxi, swir, swic, swr, swc,
                        jmask, wmask, HAS_BIAS: tl.constexpr, BI: tl.constexpr):
    # gate k: this step's input times W_ih[k*H:(k+1)*H]^T (over the input in blocks of BI) plus
    # h @ W_hh[k*H:(k+1)*H]^T, biases added
    x = tl.zeros_like(h)
    for i0 in range(0, I, BI):
        i = i0 + tl.arange(0, BI)
        imask = i < I
        xt = tl.load(xrow + i[None, :] * sxi, mask=rmask[:, None] & imask[None, :], other=0.0).to(tl.float32)
        wi = tl.load(wih_ptr + (k * H + j[None, :]) * swir + i[:, None] * swic, mask=imask[:, None] & jmask[None, :],
                     other=0.0).to(tl.float32)
        x += tl.dot(xt, wi, {IEEE_DOT})
    w = tl.load(whh_ptr + (k * H + j[None, :]) * swr + j[:, None] * swc, mask=wmask, other=0.0).to(tl.float32)
    hg = tl.dot(h, w, {IEEE_DOT})
    if HAS_BIAS:
        x += tl.load(bih_ptr + k * H + j, mask=jmask, other=0.0).to(tl.float32)[None, :]
        hg += tl.load(bhh_ptr + k * H + j, mask=jmask, other=0.0).to(tl.float32)[None, :]
    return x, hg


@triton.jit
def rnn_persistent_kernel(x_ptr, wih_ptr, whh_ptr, bih_ptr, bhh_ptr, h0_ptr, c0_ptr, hn_ptr, cn_ptr, out_ptr,
                          T, B, I, H, sxt, sxb, sxi, swir, swic, swr, swc, sot, sob, soh, REVERSE: tl.constexpr,
                          MODE: tl.constexpr, HAS_BIAS: tl.constexpr, BB: tl.constexpr, BH: tl.constexpr,
                          BI: tl.constexpr):
    # every time step of one layer and direction for BB batch rows (MODE 0 LSTM, 1 GRU, 2 tanh RNN, 3 relu RNN);
    # the hidden (and cell) state stays in registers
    rb = tl.program_id(0) * BB + tl.arange(0, BB)
    rmask = rb < B
    j = tl.arange(0, BH)
    jmask = j < H
    m2 = rmask[:, None] & jmask[None, :]
    wmask = jmask[:, None] & jmask[None, :]
    state = rb[:, None] * H + j[None, :]
    h = tl.load(h0_ptr + state, mask=m2, other=0.0).to(tl.float32)
    c = tl.load(c0_ptr + state, mask=m2, other=0.0).to(tl.float32)
    for step in range(T):
        t = step
        if REVERSE:
            t = T - 1 - step
        xrow = x_ptr + t * sxt + rb[:, None] * sxb
        x0, h0 = rnn_persistent_gate(xrow, rmask, wih_ptr, whh_ptr, bih_ptr, bhh_ptr, h, j, 0, I, H, sxi, swir, swic,
                                     swr, swc, jmask, wmask, HAS_BIAS, BI)
        if MODE == 0:
            x1, h1 = rnn_persistent_gate(xrow, rmask, wih_ptr, whh_ptr, bih_ptr, bhh_ptr, h, j, 1, I, H, sxi, swir,
                                         swic, swr, swc, jmask, wmask, HAS_BIAS, BI)
            x2, h2 = rnn_persistent_gate(xrow, rmask, wih_ptr, whh_ptr, bih_ptr, bhh_ptr, h, j, 2, I, H, sxi, swir,
                                         swic, swr, swc, jmask, wmask, HAS_BIAS, BI)
            x3, h3 = rnn_persistent_gate(xrow, rmask, wih_ptr, whh_ptr, bih_ptr, bhh_ptr, h, j, 3, I, H, sxi, swir,
                                         swic, swr, swc, jmask, wmask, HAS_BIAS, BI)
            c = tl.sigmoid(x1 + h1) * c + tl.sigmoid(x0 + h0) * _tanh(x2 + h2)
            h = tl.sigmoid(x3 + h3) * _tanh(c)
        elif MODE == 1:
            x1, h1 = rnn_persistent_gate(xrow, rmask, wih_ptr, whh_ptr, bih_ptr, bhh_ptr, h, j, 1, I, H, sxi, swir,
                                         swic, swr, swc, jmask, wmask, HAS_BIAS, BI)
            x2, h2 = rnn_persistent_gate(xrow, rmask, wih_ptr, whh_ptr, bih_ptr, bhh_ptr, h, j, 2, I, H, sxi, swir,
                                         swic, swr, swc, jmask, wmask, HAS_BIAS, BI)
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

RUN = '''

def _rnn_persistent(code, seq, w_ih, w_hh, b_ih, b_hh, h, c, h_n, c_n, out, reverse, has_biases):
    \"\"\"One layer and direction in one launch: every step, its input projection included, the state in registers
    (BB batch rows a program).\"\"\"
    T, B, H = out.shape
    I = seq.shape[2]
    BB, BH, BI = 16, max(16, triton.next_power_of_2(H)), max(16, min(64, triton.next_power_of_2(I)))
    rnn_persistent_kernel[(triton.cdiv(B, BB),)](
        seq, w_ih, w_hh, b_ih, b_hh, h.contiguous(), c.contiguous(), h_n, h_n if c_n is None else c_n, out, T, B, I, H,
        *seq.stride(), *w_ih.stride(), *w_hh.stride(), *out.stride(), REVERSE=reverse, MODE=code,
        HAS_BIAS=has_biases, BB=BB, BH=BH, BI=BI)
'''


@emits("persistent_recurrent")
def emit_persistent(fw: Forward, v: int) -> str:
    return emit_recurrent(fw, v, ("rnn_persistent_kernel", KERNEL), "_rnn_persistent", RUN)
