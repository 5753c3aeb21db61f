"""The recurrent block: LSTM / GRU / tanh-RNN / relu-RNN layers, stacked and bidirectional, as torch computes
them. Per layer and direction, one batched matmul projects every time step's input at once; then, step by step
(a loop over the run-time sequence length), a matmul projects the hidden state and one fused cell kernel adds the
biases, applies the gates and writes the new state and that step's output slice."""

from __future__ import annotations

from typing import TYPE_CHECKING

from activities.kernels.compiler.blocks import matmul
from activities.kernels.compiler.registry import emits

if TYPE_CHECKING:
    from activities.kernels.compiler.forward import Forward

KERNEL = '''@triton.jit
def rnn_gate(xg_ptr, hg_ptr, bih_ptr, bhh_ptr, row, j, k, H, mask, HAS_BIAS: tl.constexpr):
    # gate k's input and hidden projections (B, G*H rows), biases added
    x = tl.load(xg_ptr + row + k * H, mask=mask, other=0.0).to(tl.float32)
    h = tl.load(hg_ptr + row + k * H, mask=mask, other=0.0).to(tl.float32)
    if HAS_BIAS:
        x += tl.load(bih_ptr + k * H + j, mask=mask, other=0.0).to(tl.float32)
        h += tl.load(bhh_ptr + k * H + j, mask=mask, other=0.0).to(tl.float32)
    return x, h


@triton.jit
def rnn_cell_kernel(xg_ptr, hg_ptr, bih_ptr, bhh_ptr, h_ptr, c_ptr, h_out_ptr, c_out_ptr, out_ptr, out_sb, out_sh,
                    B, H, MODE: tl.constexpr, G: tl.constexpr, HAS_BIAS: tl.constexpr, BLOCK: tl.constexpr):
    # one time step for B x H hidden units: xg (B, G*H) the input projection, hg (B, G*H) the hidden one;
    # MODE 0 LSTM (gates i, f, g, o), 1 GRU (r, z, n), 2 tanh RNN, 3 relu RNN
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < B * H
    b = offs // H
    j = offs % H
    row = b * (G * H) + j
    x0, h0 = rnn_gate(xg_ptr, hg_ptr, bih_ptr, bhh_ptr, row, j, 0, H, mask, HAS_BIAS)
    h_prev = tl.load(h_ptr + offs, mask=mask, other=0.0).to(tl.float32)
    if MODE == 0:
        x1, h1 = rnn_gate(xg_ptr, hg_ptr, bih_ptr, bhh_ptr, row, j, 1, H, mask, HAS_BIAS)
        x2, h2 = rnn_gate(xg_ptr, hg_ptr, bih_ptr, bhh_ptr, row, j, 2, H, mask, HAS_BIAS)
        x3, h3 = rnn_gate(xg_ptr, hg_ptr, bih_ptr, bhh_ptr, row, j, 3, H, mask, HAS_BIAS)
        c = tl.sigmoid(x1 + h1) * tl.load(c_ptr + offs, mask=mask, other=0.0).to(tl.float32) \\
            + tl.sigmoid(x0 + h0) * _tanh(x2 + h2)
        h = tl.sigmoid(x3 + h3) * _tanh(c)
        tl.store(c_out_ptr + offs, c, mask=mask)
    elif MODE == 1:
        x1, h1 = rnn_gate(xg_ptr, hg_ptr, bih_ptr, bhh_ptr, row, j, 1, H, mask, HAS_BIAS)
        x2, h2 = rnn_gate(xg_ptr, hg_ptr, bih_ptr, bhh_ptr, row, j, 2, H, mask, HAS_BIAS)
        z = tl.sigmoid(x1 + h1)
        n = _tanh(x2 + tl.sigmoid(x0 + h0) * h2)
        h = (1.0 - z) * n + z * h_prev
    elif MODE == 2:
        h = _tanh(x0 + h0)
    else:
        h = tl.maximum(x0 + h0, 0.0, propagate_nan=tl.PropagateNan.ALL)  # relu as torch has it
    tl.store(h_out_ptr + offs, h, mask=mask)
    tl.store(out_ptr + b * out_sb + j * out_sh, h, mask=mask)
'''

LAUNCHER = '''

def _recurrent(mode, x, states, weights, layers, bidirectional, batch_first, has_biases):
    """(output, h_n[, c_n]) of a stacked (bi)directional recurrent layer: per layer and direction, `_rnn_steps`
    steps through the layer's input sequence from the initial state into h_n, c_n and that direction's output
    slice."""
    code = ("lstm", "gru", "rnn_tanh", "rnn_relu").index(mode)
    seq = x.transpose(0, 1) if batch_first else x
    T = seq.shape[0]
    H = states[0].shape[2]
    D = 2 if bidirectional else 1
    per = 4 if has_biases else 2
    hn = torch.empty(states[0].shape, dtype=x.dtype, device=x.device)
    cn = torch.empty(states[0].shape, dtype=x.dtype, device=x.device) if code == 0 else None
    for layer in range(layers):
        out = torch.empty((T, seq.shape[1], D * H), dtype=x.dtype, device=x.device)
        for d in range(D):
            k = layer * D + d
            w = weights[k * per:(k + 1) * per]
            w_ih, w_hh = w[0], w[1]
            b_ih, b_hh = (w[2], w[3]) if has_biases else (w_ih, w_hh)
            _rnn_steps(code, seq, w_ih, w_hh, b_ih, b_hh, states[0][k], states[1][k] if code == 0 else states[0][k],
                       hn[k], cn[k] if code == 0 else None, out[:, :, d * H:(d + 1) * H], d == 1, has_biases)
        seq = out
    output = seq.transpose(0, 1) if batch_first else seq
    return (output, hn, cn) if code == 0 else (output, hn)
'''

STEPS = '''

def _rnn_steps(code, seq, w_ih, w_hh, b_ih, b_hh, h, c, h_n, c_n, out, reverse, has_biases):
    """One layer and direction: one batched matmul projects every step's input, then step by step a matmul of the
    hidden state and the fused cell kernel writing the new state and that step's output; the last step writes h_n
    (and c_n)."""
    T, B, H = out.shape
    xg, grid, args, meta = _matmul(seq, w_ih.t().expand(T, -1, -1))
    matmul_kernel[grid](*args, **meta)
    block = 1024
    for step in range(T):
        t = T - 1 - step if reverse else step
        hg, grid, args, meta = _matmul(h, w_hh.t())
        matmul_kernel[grid](*args, **meta)
        h_new = h_n if step == T - 1 else torch.empty((B, H), dtype=h_n.dtype, device=h_n.device)
        c_new = (c_n if step == T - 1 else torch.empty((B, H), dtype=h_n.dtype, device=h_n.device)) \\
            if code == 0 else h_new
        o = out[t]
        rnn_cell_kernel[(triton.cdiv(B * H, block),)](
            xg[t], hg, b_ih, b_hh, h, c, h_new, c_new, o, o.stride(0), o.stride(1), B, H,
            MODE=code, G=(4, 3, 1, 1)[code], HAS_BIAS=has_biases, BLOCK=block)
        h, c = h_new, c_new
'''


@emits("recurrent")
def recurrent(fw: "Forward", v: int) -> str:
    at = fw.nodes[v].attrs
    args = [fw.tensor(a) for a in fw.nodes[v].args]
    x, states, weights = args[0], args[1:1 + at["states"]], args[1 + at["states"]:]
    fw.kernel(("matmul_kernel", matmul.KERNEL))
    fw.kernel(("rnn_cell_kernel", KERNEL))
    fw.launcher("_matmul", matmul.LAUNCHER)
    fw.launcher("_recurrent", LAUNCHER)
    fw.launcher("_rnn_steps", STEPS)
    fw.launches += 1
    return fw.emit(v, f"_recurrent({at['mode']!r}, {x}, [{', '.join(states)}], [{', '.join(weights)}], {at['layers']}, "
                      f"{at['bidirectional']}, {at['batch_first']}, {at['has_biases']})")
