"""The building blocks of the offline lowering: Triton kernel sources, generated for a rank, plus the
small Python launchers the candidate's forward calls (they only compute sizes, allocate, take views and
launch: every arithmetic step on tensor data happens inside a @triton.jit kernel).

One block per kind of work:

* pointwise: a fused chain of elementwise ops over several broadcast inputs (any rank, strided output);
* reduce: sum / mean / amax / amin / argmax / argmin / logsumexp over any set of dims, with the chain
  that produces its input fused in front (so `mean(x * x)` is one kernel);
* matmul: (batched) A @ B on strided operands, tl.dot with an fp32 accumulator;
* conv: 1-3D convolution as an implicit GEMM (stride, padding, dilation, groups, transposed);
* pool: 1-3D max / average pooling (dilation, ceil mode, count_include_pad, divisor override);
* scan: cumsum / cumprod along one dim, tile by tile with a carry;
* gather: x[i, idx[i]] (the pick of nll_loss).

Sizes are never baked in: kernels take them as arguments and the launchers read them from the tensors,
so a candidate works at any batch or spatial size.
"""

from __future__ import annotations

import hashlib


def _name(prefix: str, source: str) -> str:
    return f"{prefix}_{hashlib.sha256(source.encode()).hexdigest()[:8]}"


def _decompose(var: str, sizes: list[str], names: list[str], indent: str) -> list[str]:
    """Lines splitting flat index `var` into `names` over `sizes` (last fastest)."""
    if not names:
        return []
    rem = f"rem_{var}"  # one name per index: the compiler refuses a variable whose type changes in a loop
    lines = [f"{indent}{rem} = {var}"]
    for k in range(len(names) - 1, 0, -1):
        lines += [f"{indent}{names[k]} = {rem} % {sizes[k]}", f"{indent}{rem} = {rem} // {sizes[k]}"]
    lines.append(f"{indent}{names[0]} = {rem}")
    return lines


def _offset(idx: list[str], strides: list[str], zero: str) -> str:
    return " + ".join(f"{i} * {s}" for i, s in zip(idx, strides)) or f"{zero} * 0"


# --- pointwise --------------------------------------------------------------------------------


def pointwise_kernel(rank: int, leaves: int, flips: list[tuple[int, ...]], scalars: int, body: list[str],
                     result: str, bool_out: bool = False) -> tuple[str, str]:
    """(name, source): out[i] = result(leaf_0[i], ..., scalars) over a broadcast index space of `rank`
    dims; `flips[k]` lists the dims leaf k is read reversed along; `body` lines may use `i0..i{rank-1}`."""
    dims = [f"d{j}" for j in range(rank)]
    idx = [f"i{j}" for j in range(rank)]
    args = ["out_ptr"] + [f"l{k}_ptr" for k in range(leaves)] + [f"s{k}" for k in range(scalars)] + ["n"] + dims
    args += [f"o{j}" for j in range(rank)] + [f"l{k}_{j}" for k in range(leaves) for j in range(rank)]
    lines = ["    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)", "    mask = offs < n"]
    lines += _decompose("offs", dims, idx, "    ")
    for k in range(leaves):
        pos = [f"({dims[j]} - 1 - {idx[j]})" if j in flips[k] else idx[j] for j in range(rank)]
        off = _offset(pos, [f"l{k}_{j}" for j in range(rank)], "offs")
        lines.append(f"    x{k} = tl.load(l{k}_ptr + {off}, mask=mask, other=0.0).to(tl.float32)")
    lines += ["    " + b for b in body]
    value = f"({result}) != 0" if bool_out else result
    lines.append(f"    tl.store(out_ptr + {_offset(idx, [f'o{j}' for j in range(rank)], 'offs')}, {value}, mask=mask)")
    src = "def KERNEL(" + ", ".join(args) + ", BLOCK: tl.constexpr):\n" + "\n".join(lines) + "\n"
    name = _name("pointwise", src)
    return name, "@triton.jit\n" + src.replace("KERNEL", name, 1)


# --- reduce -----------------------------------------------------------------------------------

REDUCE_OPS = ("sum", "mean", "amax", "amin", "argmax", "argmin", "logsumexp")


def reduce_kernel(op: str, kept: int, reduced: int, leaves: int, scalars: int, body: list[str],
                  value: str) -> tuple[str, str]:
    """(name, source): out[row] = op over the reduced dims of value(leaves) (rows = the kept dims, in
    order); `mean` divides by (C - correction)."""
    assert op in REDUCE_OPS
    ks, rs = [f"k{j}" for j in range(kept)], [f"r{j}" for j in range(reduced)]
    args = ["out_ptr"] + [f"l{k}_ptr" for k in range(leaves)] + [f"s{k}" for k in range(scalars)]
    args += ["R", "C", "correction"] + [f"{s}_n" for s in ks + rs]
    args += [f"l{k}_{s}" for k in range(leaves) for s in ks + rs]
    lines = ["    rows = tl.program_id(0) * BR + tl.arange(0, BR)", "    rmask = rows < R"]
    lines += _decompose("rows", [f"{s}_n" for s in ks], ks, "    ")
    for k in range(leaves):
        lines.append(f"    base{k} = {_offset(ks, [f'l{k}_{s}' for s in ks], 'rows')}")
    init = {"sum": "0.0", "mean": "0.0", "amax": '-float("inf")', "argmax": '-float("inf")',
            "amin": 'float("inf")', "argmin": 'float("inf")', "logsumexp": '-float("inf")'}[op]

    def loop(combine: list[str]) -> list[str]:
        out = ["    for c0 in range(0, C, BC):", "        cols = c0 + tl.arange(0, BC)", "        cmask = cols < C",
               "        m2 = rmask[:, None] & cmask[None, :]"]
        out += _decompose("cols", [f"{s}_n" for s in rs], rs, "        ")
        for k in range(leaves):
            off = _offset(rs, [f"l{k}_{s}" for s in rs], "cols")
            out.append(f"        x{k} = tl.load(l{k}_ptr + base{k}[:, None] + ({off})[None, :], mask=m2, "
                       "other=0.0).to(tl.float32)")
        out += ["        " + b for b in body] + [f"        v = {value}"]
        return out + ["        " + c for c in combine]

    fill = init
    lines.append(f"    acc = tl.full([BR, BC], {init}, dtype=tl.float32)")
    if op in ("argmax", "argmin"):
        cmp = ">" if op == "argmax" else "<"
        lines.append("    best = tl.zeros([BR, BC], dtype=tl.int32)")
        lines += loop([f"v = tl.where(m2, v, {fill})", f"take = v {cmp} acc", "acc = tl.where(take, v, acc)",
                       "best = tl.where(take, cols[None, :], best)"])
        top = "max" if op == "argmax" else "min"
        lines += [f"    top = tl.{top}(acc, axis=1)",
                  "    res = tl.min(tl.where(acc == top[:, None], best, 2147483647), axis=1)"]
    elif op in ("amax", "amin", "logsumexp"):
        fn = "minimum" if op == "amin" else "maximum"
        lines += loop([f"acc = tl.{fn}(acc, tl.where(m2, v, {fill}))"])
        lines.append(f"    res = tl.{fn[:3]}(acc, axis=1)")
        if op == "logsumexp":
            lines += ["    mx = tl.where(res == -float(\"inf\"), 0.0, res)",
                      "    acc = tl.zeros([BR, BC], dtype=tl.float32)"]
            lines += loop(["acc += tl.where(m2, tl.exp(v - mx[:, None]), 0.0)"])
            lines.append("    res = mx + tl.log(tl.sum(acc, axis=1))")
    else:
        lines += loop(["acc += tl.where(m2, v, 0.0)"])
        lines.append("    res = tl.sum(acc, axis=1)")
        if op == "mean":
            lines.append("    res = res / (C - correction)")
    lines.append("    tl.store(out_ptr + rows, res, mask=rmask)")
    src = ("def KERNEL(" + ", ".join(args) + ", BR: tl.constexpr, BC: tl.constexpr):\n" + "\n".join(lines) + "\n")
    name = _name(f"reduce_{op}", src)
    return name, "@triton.jit\n" + src.replace("KERNEL", name, 1)


# --- matmul -----------------------------------------------------------------------------------

MATMUL = '''@triton.jit
def matmul_kernel(a_ptr, b_ptr, c_ptr, M, N, K, sab, sam, sak, sbb, sbk, sbn, scb, scm, scn,
                  BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr):
    pid_m = tl.program_id(0)
    pid_n = tl.program_id(1)
    pid_b = tl.program_id(2)
    rm = pid_m * BM + tl.arange(0, BM)
    rn = pid_n * BN + tl.arange(0, BN)
    rk = tl.arange(0, BK)
    acc = tl.zeros((BM, BN), dtype=tl.float32)
    for k0 in range(0, K, BK):
        kk = k0 + rk
        a = tl.load(a_ptr + pid_b * sab + rm[:, None] * sam + kk[None, :] * sak,
                    mask=(rm[:, None] < M) & (kk[None, :] < K), other=0.0)
        b = tl.load(b_ptr + pid_b * sbb + kk[:, None] * sbk + rn[None, :] * sbn,
                    mask=(kk[:, None] < K) & (rn[None, :] < N), other=0.0)
        acc += tl.dot(a.to(tl.float32), b.to(tl.float32), input_precision="ieee")
    tl.store(c_ptr + pid_b * scb + rm[:, None] * scm + rn[None, :] * scn, acc, mask=(rm[:, None] < M) & (rn[None, :] < N))
'''


# --- convolution ------------------------------------------------------------------------------


def conv_kernel(d: int, transposed: bool) -> tuple[str, str]:
    """(name, source): a d-dim convolution (or transposed convolution) as an implicit GEMM: rows are
    (batch, output position), columns the output channels of one group (grid axis 2), K runs over
    (input channel of the group, kernel offset)."""
    sp = range(d)
    args = ["x_ptr", "w_ptr", "b_ptr", "out_ptr", "M", "KTOT", "CI_G", "CO_G"]
    args += [f"I{j}" for j in sp] + [f"O{j}" for j in sp] + [f"K{j}" for j in sp] + [f"S{j}" for j in sp]
    args += [f"P{j}" for j in sp] + [f"D{j}" for j in sp] + ["xs0", "xs1"] + [f"xs{j + 2}" for j in sp]
    args += ["ws0", "ws1"] + [f"ws{j + 2}" for j in sp] + ["os0", "os1"] + [f"os{j + 2}" for j in sp]
    lines = ["    rm = tl.program_id(0) * BM + tl.arange(0, BM)", "    rn = tl.program_id(1) * BN + tl.arange(0, BN)",
             "    g = tl.program_id(2)", "    mmask = rm < M", "    nmask = rn < CO_G"]
    lines += _decompose("rm", ["0"] + [f"O{j}" for j in sp], ["nb"] + [f"o{j}" for j in sp], "    ")
    lines += ["    acc = tl.zeros((BM, BN), dtype=tl.float32)", "    for k0 in range(0, KTOT, BK):",
              "        rk = k0 + tl.arange(0, BK)", "        kmask = rk < KTOT"]
    lines += _decompose("rk", ["0"] + [f"K{j}" for j in sp], ["ci"] + [f"q{j}" for j in sp], "        ")
    lines.append("        ok = mmask[:, None] & kmask[None, :]")
    for j in sp:
        if transposed:
            lines += [f"        t{j} = o{j}[:, None] + P{j} - q{j}[None, :] * D{j}",
                      f"        u{j} = tl.where(t{j} >= 0, t{j}, 0)",
                      f"        i{j} = u{j} // S{j}",
                      f"        ok = ok & (t{j} >= 0) & (u{j} % S{j} == 0) & (i{j} < I{j})"]
        else:
            lines += [f"        i{j} = o{j}[:, None] * S{j} - P{j} + q{j}[None, :] * D{j}",
                      f"        ok = ok & (i{j} >= 0) & (i{j} < I{j})"]
    xoff = " + ".join(["nb[:, None] * xs0", "(g * CI_G + ci)[None, :] * xs1"] + [f"i{j} * xs{j + 2}" for j in sp])
    lines.append(f"        a = tl.load(x_ptr + {xoff}, mask=ok, other=0.0)")
    if transposed:
        woff = " + ".join(["(g * CI_G + ci)[:, None] * ws0", "rn[None, :] * ws1"] + [f"q{j}[:, None] * ws{j + 2}" for j in sp])
    else:
        woff = " + ".join(["(g * CO_G + rn)[None, :] * ws0", "ci[:, None] * ws1"] + [f"q{j}[:, None] * ws{j + 2}" for j in sp])
    lines += [f"        b = tl.load(w_ptr + {woff}, mask=kmask[:, None] & nmask[None, :], other=0.0)",
              '        acc += tl.dot(a.to(tl.float32), b.to(tl.float32), input_precision="ieee")',
              "    if HAS_BIAS:",
              "        acc += tl.load(b_ptr + g * CO_G + rn, mask=nmask, other=0.0).to(tl.float32)[None, :]"]
    ooff = " + ".join(["nb[:, None] * os0", "(g * CO_G + rn)[None, :] * os1"] + [f"o{j}[:, None] * os{j + 2}" for j in sp])
    lines.append(f"    tl.store(out_ptr + {ooff}, acc, mask=mmask[:, None] & nmask[None, :])")
    src = ("def KERNEL(" + ", ".join(args) + ", HAS_BIAS: tl.constexpr, BM: tl.constexpr, BN: tl.constexpr, "
           "BK: tl.constexpr):\n" + "\n".join(lines) + "\n")
    name = f"conv{d}d_{'transposed_' if transposed else ''}kernel"
    return name, "@triton.jit\n" + src.replace("KERNEL", name, 1)


# --- pooling ----------------------------------------------------------------------------------


def pool_kernel(d: int, kind: str) -> tuple[str, str]:
    """(name, source): d-dim max or average pooling over (rows, spatial...) input, one output element
    per lane; the window is walked with runtime loops."""
    sp = range(d)
    args = ["x_ptr", "out_ptr", "total", "xs0"] + [f"xs{j + 1}" for j in sp] + [f"I{j}" for j in sp]
    args += [f"O{j}" for j in sp] + [f"K{j}" for j in sp] + [f"S{j}" for j in sp] + [f"P{j}" for j in sp]
    args += [f"D{j}" for j in sp] + ["divisor"]
    lines = ["    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)", "    mask = offs < total"]
    lines += _decompose("offs", ["0"] + [f"O{j}" for j in sp], ["row"] + [f"o{j}" for j in sp], "    ")
    fill = '-float("inf")' if kind == "max" else "0.0"
    lines.append(f"    acc = tl.full([BLOCK], {fill}, dtype=tl.float32)")
    indent = "    "
    for j in sp:
        lines.append(f"{indent}for q{j} in range(0, K{j}):")
        indent += "    "
    cond = " & ".join(["mask"] + [f"(i{j} >= 0) & (i{j} < I{j})" for j in sp])
    lines += [f"{indent}i{j} = o{j} * S{j} - P{j} + q{j} * D{j}" for j in sp]
    lines += [f"{indent}ok = {cond}",
              f"{indent}v = tl.load(x_ptr + row * xs0 + {' + '.join(f'i{j} * xs{j + 1}' for j in sp)}, mask=ok, "
              f"other={fill}).to(tl.float32)"]
    lines.append(f"{indent}acc = tl.maximum(acc, v)" if kind == "max" else f"{indent}acc += v")
    if kind == "avg":
        lines.append("    inc = tl.full([BLOCK], 1.0, dtype=tl.float32)")
        lines.append("    exc = tl.full([BLOCK], 1.0, dtype=tl.float32)")
        for j in sp:
            lines += [f"    st{j} = o{j} * S{j} - P{j}", f"    en{j} = tl.minimum(st{j} + K{j}, I{j} + P{j})",
                      f"    inc = inc * (en{j} - st{j})",
                      f"    exc = exc * (tl.minimum(en{j}, I{j}) - tl.maximum(st{j}, 0))"]
        lines.append("    div = tl.where(divisor > 0, divisor, tl.where(COUNT_PAD, inc, exc))")
        lines.append("    acc = acc / div")
    lines.append("    tl.store(out_ptr + offs, acc, mask=mask)")
    src = ("def KERNEL(" + ", ".join(args) + ", COUNT_PAD: tl.constexpr, BLOCK: tl.constexpr):\n"
           + "\n".join(lines) + "\n")
    name = f"{kind}_pool{d}d_kernel"
    return name, "@triton.jit\n" + src.replace("KERNEL", name, 1)


# --- scan -------------------------------------------------------------------------------------


def scan_kernel(op: str, others: int) -> tuple[str, str]:
    """(name, source): cumsum / cumprod along one dim; rows are the other dims (any strides)."""
    os_ = [f"k{j}" for j in range(others)]
    args = ["out_ptr", "x_ptr", "R", "C"] + [f"{s}_n" for s in os_] + [f"x_{s}" for s in os_]
    args += [f"o_{s}" for s in os_] + ["xc", "oc"]
    neutral = "1.0" if op == "cumprod" else "0.0"
    lines = ["    rows = tl.program_id(0) * BR + tl.arange(0, BR)", "    rmask = rows < R"]
    lines += _decompose("rows", [f"{s}_n" for s in os_], os_, "    ")
    lines += [f"    xb = {_offset(os_, [f'x_{s}' for s in os_], 'rows')}",
              f"    ob = {_offset(os_, [f'o_{s}' for s in os_], 'rows')}",
              f"    carry = tl.full([BR], {neutral}, dtype=tl.float32)",
              "    for c0 in range(0, C, BC):", "        cols = c0 + tl.arange(0, BC)",
              "        m2 = rmask[:, None] & (cols < C)[None, :]",
              f"        v = tl.load(x_ptr + xb[:, None] + cols[None, :] * xc, mask=m2, other={neutral}).to(tl.float32)"]
    if op == "cumprod":
        lines.append("        c = tl.cumprod(v, axis=1) * carry[:, None]")
    else:
        lines.append("        c = tl.cumsum(v, axis=1) + carry[:, None]")
    lines += ["        tl.store(out_ptr + ob[:, None] + cols[None, :] * oc, c, mask=m2)",
              "        last = tl.minimum(c0 + BC, C) - 1",
              "        carry = tl.sum(tl.where(cols[None, :] == last, c, 0.0), axis=1)"]
    src = ("def KERNEL(" + ", ".join(args) + ", BR: tl.constexpr, BC: tl.constexpr):\n" + "\n".join(lines) + "\n")
    name = f"{op}_{others}_kernel"
    return name, "@triton.jit\n" + src.replace("KERNEL", name, 1)


GATHER = '''@triton.jit
def gather_kernel(x_ptr, idx_ptr, out_ptr, R, xs0, xs1, is0, BLOCK: tl.constexpr):
    rows = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = rows < R
    t = tl.load(idx_ptr + rows * is0, mask=mask, other=0)
    tl.store(out_ptr + rows, tl.load(x_ptr + rows * xs0 + t * xs1, mask=mask, other=0.0), mask=mask)
'''

# --- the launch helpers the candidate's forward calls (plain Python: sizes, allocation, views). Each returns
# (output, grid, args, meta); the forward launches `kernel[grid](*args, **meta)` itself, in plain sight. -----

LAUNCHERS = '''

def _state(module, name):
    """A parameter or buffer of the model by its dotted name."""
    tensors = dict(module.named_parameters())
    tensors.update(dict(module.named_buffers()))
    return tensors[name].detach()


def _pointwise(leaves, scalars, dtype, shape=None, out=None):
    """(out, grid, args, meta) of a pointwise kernel over the broadcast shape of its leaves (or `out`'s)."""
    if out is not None:
        shape = tuple(out.shape)
    elif leaves:
        shape = tuple(torch.broadcast_shapes(*[t.shape for t in leaves]))
    if out is None:
        out = torch.empty(shape, dtype=dtype, device=leaves[0].device if leaves else "cpu")
    views = [t.expand(shape) for t in leaves]
    n = out.numel()
    strides = [s for v in views for s in v.stride()]
    block = 4096 if out.device.type == "cpu" else 1024
    return out, (max(1, triton.cdiv(n, block)),), (out, *views, *scalars, n, *shape, *out.stride(), *strides), \
        {"BLOCK": block}


def _reduce(leaves, scalars, dims, keepdim, dtype, correction=0):
    """(out, grid, args, meta) of a reduction: rows are the kept dims, columns the reduced ones (strided)."""
    shape = tuple(torch.broadcast_shapes(*[t.shape for t in leaves]))
    r = len(shape)
    dims = sorted({d % r for d in dims}) if dims else list(range(r))
    kept = [i for i in range(r) if i not in dims]
    views = [t.expand(shape) for t in leaves]
    R = math.prod(shape[i] for i in kept)
    C = math.prod(shape[i] for i in dims)
    out = torch.empty(R, dtype=dtype, device=leaves[0].device)
    BC = min(128 if out.device.type == "cpu" else 64, triton.next_power_of_2(max(C, 1)))
    BR = max(1, min(256, (8192 if out.device.type == "cpu" else 2048) // BC))
    strides = [v.stride(i) for v in views for i in kept + dims]
    result = out.reshape([1 if i in dims else shape[i] for i in range(r)] if keepdim else [shape[i] for i in kept])
    return result, (max(1, triton.cdiv(R, BR)),), (out, *views, *scalars, R, C, correction,
                                                   *[shape[i] for i in kept + dims], *strides), {"BR": BR, "BC": BC}


def _matmul(a, b):
    """(C, grid, args, meta) of A @ B for 2-D or 3-D (batched) strided operands."""
    batched = a.dim() == 3
    a3, b3 = (a, b) if batched else (a.unsqueeze(0), b.unsqueeze(0))
    B, M, K = a3.shape
    N = b3.shape[2]
    c = torch.empty((B, M, N), dtype=a.dtype, device=a.device)
    BM = 64 if M > 32 else (32 if M > 16 else 16)
    BN = 64 if N > 32 else (32 if N > 16 else 16)
    BK = 64 if a.device.type == "cpu" and K > 32 else 32
    return c if batched else c[0], (triton.cdiv(M, BM), triton.cdiv(N, BN), B), \
        (a3, b3, c, M, N, K, *a3.stride(), *b3.stride(), *c.stride()), {"BM": BM, "BN": BN, "BK": BK}


def _conv(x, w, b, stride, padding, dilation, transposed, output_padding, groups):
    """(out, grid, args, meta) of the implicit-GEMM convolution; output sizes from the input and weight."""
    d = x.dim() - 2
    NB, CI = x.shape[0], x.shape[1]
    I, K = list(x.shape[2:]), list(w.shape[2:])
    if transposed:
        CO_G = w.shape[1]
        O = [(I[j] - 1) * stride[j] - 2 * padding[j] + dilation[j] * (K[j] - 1) + output_padding[j] + 1 for j in range(d)]
    else:
        groups = CI // w.shape[1]
        CO_G = w.shape[0] // groups
        O = [(I[j] + 2 * padding[j] - dilation[j] * (K[j] - 1) - 1) // stride[j] + 1 for j in range(d)]
    out = torch.empty((NB, CO_G * groups, *O), dtype=x.dtype, device=x.device)
    M = NB * math.prod(O)
    KTOT = (CI // groups) * math.prod(K)
    cpu = x.device.type == "cpu"  # the Triton interpreter: fewer, larger tiles run faster
    BM = max(16, min(512, triton.next_power_of_2(M))) if cpu else 64
    BN = max(16, min(64, triton.next_power_of_2(CO_G)))
    BK = max(16, min(128 if cpu else 32, triton.next_power_of_2(KTOT)))
    return out, (triton.cdiv(M, BM), triton.cdiv(CO_G, BN), groups), (
        x, w, b if b is not None else w, out, M, KTOT, CI // groups, CO_G, *I, *O, *K, *stride, *padding, *dilation,
        *x.stride(), *w.stride(), *out.stride()), {"HAS_BIAS": b is not None, "BM": BM, "BN": BN, "BK": BK}


def _pool(x, kernel_size, stride, padding, dilation, ceil_mode, count_include_pad=True, divisor=0):
    """(out, grid, args, meta) of pooling over the last len(kernel_size) dims."""
    d = len(kernel_size)
    lead, I = list(x.shape[:-d]), list(x.shape[-d:])
    O = []
    for j in range(d):
        span = I[j] + 2 * padding[j] - dilation[j] * (kernel_size[j] - 1) - 1
        o = (span + (stride[j] - 1 if ceil_mode else 0)) // stride[j] + 1
        if ceil_mode and (o - 1) * stride[j] >= I[j] + padding[j]:
            o -= 1
        O.append(o)
    rows = x.reshape(-1, *I)
    out = torch.empty((rows.shape[0], *O), dtype=x.dtype, device=x.device)
    total = out.numel()
    block = 4096 if x.device.type == "cpu" else 256
    return out.reshape(*lead, *O), (triton.cdiv(total, block),), (
        rows, out, total, *rows.stride(), *I, *O, *kernel_size, *stride, *padding, *dilation, float(divisor or 0)), \
        {"COUNT_PAD": bool(count_include_pad), "BLOCK": block}


def _scan(x, dim, dtype):
    """(out, grid, args, meta) of a cumulative sum / product along `dim`."""
    r = x.dim()
    dim = dim % r
    others = [i for i in range(r) if i != dim]
    out = torch.empty(x.shape, dtype=dtype, device=x.device)
    R = math.prod(x.shape[i] for i in others)
    C = x.shape[dim]
    BC = min(128, triton.next_power_of_2(max(C, 1)))
    BR = max(1, min(256, (8192 if x.device.type == "cpu" else 2048) // BC))
    return out, (max(1, triton.cdiv(R, BR)),), (out, x, R, C, *[x.shape[i] for i in others],
                                                *[x.stride(i) for i in others], *[out.stride(i) for i in others],
                                                x.stride(dim), out.stride(dim)), {"BR": BR, "BC": BC}


def _gather(x, idx):
    """(out, grid, args, meta) of x[i, idx[i]] for a 2-D x."""
    out = torch.empty(x.shape[0], dtype=x.dtype, device=x.device)
    return out, (triton.cdiv(x.shape[0], 256),), (x, idx, out, x.shape[0], *x.stride(), idx.stride(0)), {"BLOCK": 256}
'''
