"""The `recurrent` rewrite: a whole stacked (bi)directional recurrent layer in one launch (a persistent RNN). The
compiler's recurrent block launches, per layer and direction, one matmul for every step's input projection and
then, per time step, a matmul of the hidden state and a cell kernel: 2 launches a step, and the hidden state goes
to DRAM and back between them (an LSTM of 6 layers over 512 steps: 6,000 launches).

A batch row's hidden state depends on that row alone, at every layer, so here a program owns BB batch rows and the
whole hidden size and runs every layer and direction for them, one after the other, as the stream would run their
launches. Per layer and direction (`rnn_layer`) it keeps the state in registers across the steps and per step
computes each gate's `x_t @ W_ih[gate]^T` and `h @ W_hh[gate]^T` with `tl.dot` over blocks of 32 of the input and
hidden size (`rnn_project`: the weights reread from cache, tiles of 32 x H whatever the sizes; the projected sequence
is never written), adds the biases, applies the cell (LSTM, GRU, tanh or relu RNN, as torch computes them) and writes
that step's output slice. The blocks of h come from memory: h0, then the output slice the last step wrote; and the
next layer reads those slices too. Both were written by this program's own threads, so a barrier comes between
(`tl.debug_barrier`, CUDA's `__syncthreads`, which makes a block's global writes visible to the whole block). With
h @ W_hh^T as one register tile, hidden size 256 needed 272 KB of shared memory, beyond an H100's 227 KB. The
padded lanes (hidden units beyond H, depth beyond the input or hidden size) load as 0, so the padded `tl.dot` is
exact. The kernel is generated per layer count and direction count: each layer's weights are arguments of their
own.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from activities.kernels.compiler.blocks.common import IEEE_DOT, jit, kernel_name
from activities.kernels.compiler.registry import emits
from activities.kernels.optimizer import rewrite

if TYPE_CHECKING:
    from activities.kernels.compiler.forward import Forward
    from activities.kernels.compiler.graph import Graph


@rewrite("recurrent", order=40, summary="a stacked recurrent layer's every step, layer and direction in one launch")
def recurrent(graph: Graph) -> Graph | None:
    """Every recurrent node runs persistent (None: the graph has none)."""
    found = [i for i in sorted(graph.needed()) if graph.nodes[i].op == "recurrent"]
    for i in found:
        graph.nodes[i].op = "persistent_recurrent"
    return graph if found else None


LAYER = f'''@triton.jit
def rnn_project(acc, rows, rmask, w_ptr, k, H, K, sk, j, jmask, BK: tl.constexpr):
    # acc + rows[:, :K] @ W[k*H:(k+1)*H, :K]^T over K in blocks of BK (W contiguous [G*H, K]; rows: a [BB, 1]
    # block of row pointers, sk the stride along K): tiles of BK x BH, whatever the hidden size
    for k0 in range(0, K, BK):
        kk = k0 + tl.arange(0, BK)
        kmask = kk < K
        a = tl.load(rows + kk[None, :] * sk, mask=rmask[:, None] & kmask[None, :], other=0.0).to(tl.float32)
        w = tl.load(w_ptr + (k * H + j[None, :]) * K + kk[:, None], mask=kmask[:, None] & jmask[None, :],
                    other=0.0).to(tl.float32)
        acc += tl.dot(a, w, {IEEE_DOT})
    return acc


@triton.jit
def rnn_persistent_gate(xrow, hrow, rmask, wih_ptr, whh_ptr, bih_ptr, bhh_ptr, h, j, k, I, H, sxi, jmask,
                        HAS_BIAS: tl.constexpr, BK: tl.constexpr):
    # gate k: this step's input times W_ih[k*H:(k+1)*H]^T plus the last hidden state times W_hh[k*H:(k+1)*H]^T,
    # biases added (the weights contiguous: W_ih [G*H, I], W_hh [G*H, H])
    x = rnn_project(tl.zeros_like(h), xrow, rmask, wih_ptr, k, H, I, sxi, j, jmask, BK)
    hg = rnn_project(tl.zeros_like(h), hrow, rmask, whh_ptr, k, H, H, 1, j, jmask, BK)
    if HAS_BIAS:
        x += tl.load(bih_ptr + k * H + j, mask=jmask, other=0.0).to(tl.float32)[None, :]
        hg += tl.load(bhh_ptr + k * H + j, mask=jmask, other=0.0).to(tl.float32)[None, :]
    return x, hg


@triton.jit(noinline=True)
def rnn_layer(x_ptr, sxt, sxb, sxi, I, wih_ptr, whh_ptr, bih_ptr, bhh_ptr, h0_ptr, c0_ptr, hn_ptr, cn_ptr, out_ptr,
              sot, sob, T, B, H, REVERSE: tl.constexpr, MODE: tl.constexpr, HAS_BIAS: tl.constexpr,
              BB: tl.constexpr, BH: tl.constexpr, BK: tl.constexpr):
    # every time step of one layer and direction for this program's BB batch rows (MODE 0 LSTM, 1 GRU, 2 tanh RNN,
    # 3 relu RNN); the hidden (and cell) state stays in registers, and the last hidden state is read back in blocks
    # for its projection from where it was stored (h0, then the last step's output slice)
    rb = tl.program_id(0) * BB + tl.arange(0, BB)
    rmask = rb < B
    j = tl.arange(0, BH)
    jmask = j < H
    m2 = rmask[:, None] & jmask[None, :]
    state = rb[:, None] * H + j[None, :]
    h = tl.load(h0_ptr + state, mask=m2, other=0.0).to(tl.float32)
    c = tl.load(c0_ptr + state, mask=m2, other=0.0).to(tl.float32)
    hrow = h0_ptr + rb[:, None] * H
    for step in range(T):
        t = step
        if REVERSE:
            t = T - 1 - step
        xrow = x_ptr + t * sxt + rb[:, None] * sxb
        x0, h0 = rnn_persistent_gate(xrow, hrow, rmask, wih_ptr, whh_ptr, bih_ptr, bhh_ptr, h, j, 0, I, H, sxi,
                                     jmask, HAS_BIAS, BK)
        if MODE == 0:
            x1, h1 = rnn_persistent_gate(xrow, hrow, rmask, wih_ptr, whh_ptr, bih_ptr, bhh_ptr, h, j, 1, I, H, sxi,
                                         jmask, HAS_BIAS, BK)
            x2, h2 = rnn_persistent_gate(xrow, hrow, rmask, wih_ptr, whh_ptr, bih_ptr, bhh_ptr, h, j, 2, I, H, sxi,
                                         jmask, HAS_BIAS, BK)
            x3, h3 = rnn_persistent_gate(xrow, hrow, rmask, wih_ptr, whh_ptr, bih_ptr, bhh_ptr, h, j, 3, I, H, sxi,
                                         jmask, HAS_BIAS, BK)
            c = tl.sigmoid(x1 + h1) * c + tl.sigmoid(x0 + h0) * _tanh(x2 + h2)
            h = tl.sigmoid(x3 + h3) * _tanh(c)
        elif MODE == 1:
            x1, h1 = rnn_persistent_gate(xrow, hrow, rmask, wih_ptr, whh_ptr, bih_ptr, bhh_ptr, h, j, 1, I, H, sxi,
                                         jmask, HAS_BIAS, BK)
            x2, h2 = rnn_persistent_gate(xrow, hrow, rmask, wih_ptr, whh_ptr, bih_ptr, bhh_ptr, h, j, 2, I, H, sxi,
                                         jmask, HAS_BIAS, BK)
            z = tl.sigmoid(x1 + h1)
            h = (1.0 - z) * _tanh(x2 + tl.sigmoid(x0 + h0) * h2) + z * h
        elif MODE == 2:
            h = _tanh(x0 + h0)
        else:
            h = tl.maximum(x0 + h0, 0.0, propagate_nan=tl.PropagateNan.ALL)  # relu as torch has it
        tl.store(out_ptr + t * sot + rb[:, None] * sob + j[None, :], h, mask=m2)
        hrow = out_ptr + t * sot + rb[:, None] * sob
        tl.debug_barrier()  # this step's h, stored by this program's threads, is read back by all of them next
    tl.store(hn_ptr + state, h, mask=m2)
    if MODE == 0:
        tl.store(cn_ptr + state, c, mask=m2)
'''
"""One layer and direction's steps (`rnn_layer`) and a gate of one step (`rnn_persistent_gate`): the stack kernel's
helpers. `rnn_layer` is a function of its own in the compiled kernel (`noinline`), called per layer and direction:
inlined, 6 layers x 2 directions at hidden size 256 took ptxas past the compile check's 10 minutes."""


def stack_kernel(layers: int, directions: int) -> tuple[str, str]:
    """(name, source) of the kernel running `layers` layers of `directions` directions for BB batch rows a program:
    `rnn_layer` per layer and direction, a barrier between layers. Layer 0 reads the input (any strides); layer l
    writes its [T, B, directions * H] buffer `o<l>`, which layer l + 1 reads."""
    weights = [f"w{k}_{n}" for k in range(layers * directions) for n in ("ih", "hh", "bih", "bhh")]
    args = ["x_ptr", "sxt", "sxb", "sxi", "I", *[f"o{layer}_ptr" for layer in range(layers)], *weights,
            "h0_ptr", "c0_ptr", "hn_ptr", "cn_ptr", "T", "B", "H"]
    row = f"{directions} * H"
    lines = []
    for layer in range(layers):
        if layer:
            lines.append("    tl.debug_barrier()  # the last layer's outputs, written by this program, are read next")
        source = "x_ptr, sxt, sxb, sxi, I" if layer == 0 else f"o{layer - 1}_ptr, B * {row}, {row}, 1, {row}"
        for d in range(directions):
            k = layer * directions + d
            lines.append(f"    rnn_layer({source}, w{k}_ih, w{k}_hh, w{k}_bih, w{k}_bhh, h0_ptr + {k} * B * H, "
                         f"c0_ptr + {k} * B * H, hn_ptr + {k} * B * H, cn_ptr + {k} * B * H, o{layer}_ptr + {d} * H, "
                         f"B * {row}, {row}, T, B, H, {d == 1}, MODE, HAS_BIAS, BB, BH, BK)")
    src = ("def KERNEL(" + ", ".join(args) + ", MODE: tl.constexpr, HAS_BIAS: tl.constexpr, BB: tl.constexpr, "
           "BH: tl.constexpr, BK: tl.constexpr):\n" + "\n".join(lines) + "\n")
    return jit(kernel_name("rnn_stack", src), src)


LAUNCHER = '''

def _rnn_stack(mode, x, states, weights, layers, bidirectional, batch_first, has_biases):
    """((output, h_n[, c_n]), grid, args, meta) of a stacked (bi)directional recurrent layer in one launch: BB batch
    rows a program, every layer and direction; layer l's output goes to a [T, B, D * H] buffer of its own, the last
    one's is the output."""
    code = ("lstm", "gru", "rnn_tanh", "rnn_relu").index(mode)
    seq = x.transpose(0, 1) if batch_first else x
    T, B, I = seq.shape
    H = states[0].shape[2]
    D = 2 if bidirectional else 1
    outs = [torch.empty((T, B, D * H), dtype=x.dtype, device=x.device) for _ in range(layers)]
    hn = torch.empty(states[0].shape, dtype=x.dtype, device=x.device)
    cn = torch.empty(states[0].shape, dtype=x.dtype, device=x.device) if code == 0 else hn
    per = 4 if has_biases else 2
    ws = []
    for k in range(layers * D):
        w = [t.contiguous() for t in weights[k * per:(k + 1) * per]]
        ws += w if has_biases else [w[0], w[1], w[0], w[1]]
    h0 = states[0].contiguous()
    c0 = states[1].contiguous() if code == 0 else h0
    BB, BH = 16, max(16, triton.next_power_of_2(H))
    output = outs[-1].transpose(0, 1) if batch_first else outs[-1]
    return (output, hn, cn) if code == 0 else (output, hn), (triton.cdiv(B, BB),), \\
        (seq, *seq.stride(), I, *outs, *ws, h0, c0, hn, cn, T, B, H), \\
        {"MODE": code, "HAS_BIAS": has_biases, "BB": BB, "BH": BH, "BK": 32}
'''


@emits("persistent_recurrent")
def emit_persistent(fw: Forward, v: int) -> str:
    at = fw.nodes[v].attrs
    args = [fw.tensor(a) for a in fw.nodes[v].args]
    x, states, weights = args[0], args[1:1 + at["states"]], args[1 + at["states"]:]
    fw.kernel(("rnn_layer", LAYER))
    name = fw.kernel(stack_kernel(at["layers"], 2 if at["bidirectional"] else 1))
    fw.launcher("_rnn_stack", LAUNCHER)
    return fw.launch(v, name, f"_rnn_stack({at['mode']!r}, {x}, [{', '.join(states)}], [{', '.join(weights)}], "
                              f"{at['layers']}, {at['bidirectional']}, {at['batch_first']}, {at['has_biases']})")
