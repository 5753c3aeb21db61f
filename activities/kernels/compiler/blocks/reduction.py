"""The reduction block: sum / mean / amax / amin / argmax / argmin / logsumexp over any set of dims, rows (the
kept dims) by columns (the reduced ones), both strided; the pointwise chain producing its input is fused in front
(so `mean(x * x)` is one kernel)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from activities.kernels.compiler.blocks.common import INTERPRETER_TILE, decompose, jit, kernel_name, offset
from activities.kernels.compiler.blocks.pointwise import Fused
from activities.kernels.compiler.expr import extreme, maximum, minimum
from activities.kernels.compiler.registry import emits

if TYPE_CHECKING:
    from activities.kernels.compiler.forward import Forward

REDUCE_OPS = ("sum", "mean", "amax", "amin", "argmax", "argmin", "logsumexp")
SPLITTABLE = ("sum", "mean")
"""Reductions whose partial results over column ranges add up (`split`: several programs per row, atomically)."""


def reduce_kernel(op: str, kept: int, reduced: int, leaves: int, scalars: int, body: list[str],
                  value: str, split: bool = False) -> tuple[str, str]:
    """(name, source): out[row] = op over the reduced dims of value(leaves) (rows = the kept dims, in
    order); `mean` divides by (C - correction). A program reduces BR rows over one range of `chunk` columns
    (program_id 1); `split` (SPLITTABLE ops): the launch may give a row several ranges, each adding its part
    (`SPLIT`: atomically, into a zeroed output), so few rows of many columns (a batch norm's statistics: a row
    per channel) still fill the GPU instead of one program reading everything."""
    assert op in REDUCE_OPS and (not split or op in SPLITTABLE)
    ks, rs = [f"k{j}" for j in range(kept)], [f"r{j}" for j in range(reduced)]
    args = ["out_ptr"] + [f"l{k}_ptr" for k in range(leaves)] + [f"s{k}" for k in range(scalars)]
    args += ["R", "C", "correction", "chunk"] + [f"{s}_n" for s in ks + rs]
    args += [f"l{k}_{s}" for k in range(leaves) for s in ks + rs]
    lines = ["    rows = tl.program_id(0) * BR + tl.arange(0, BR)", "    rmask = rows < R",
             "    lo = tl.program_id(1) * chunk", "    hi = tl.minimum(lo + chunk, C)"]
    lines += decompose("rows", [f"{s}_n" for s in ks], ks, "    ")
    for k in range(leaves):
        lines.append(f"    base{k} = {offset(ks, [f'l{k}_{s}' for s in ks], 'rows')}")
    init = {"sum": "0.0", "mean": "0.0", "amax": '-float("inf")', "argmax": '-float("inf")',
            "amin": 'float("inf")', "argmin": 'float("inf")', "logsumexp": '-float("inf")'}[op]

    def loop(combine: list[str]) -> list[str]:
        out = ["    for c0 in range(lo, hi, BC):", "        cols = c0 + tl.arange(0, BC)", "        cmask = cols < hi",
               "        m2 = rmask[:, None] & cmask[None, :]"]
        out += decompose("cols", [f"{s}_n" for s in rs], rs, "        ")
        for k in range(leaves):
            off = offset(rs, [f"l{k}_{s}" for s in rs], "cols")
            out.append(f"        x{k} = tl.load(l{k}_ptr + base{k}[:, None] + ({off})[None, :], mask=m2, "
                       "other=0.0).to(tl.float32)")
        out += ["        " + b for b in body] + [f"        v = {value}"]
        return out + ["        " + c for c in combine]

    fill = init
    lines.append(f"    acc = tl.full([BR, BC], {init}, dtype=tl.float32)")
    if op in ("argmax", "argmin"):  # torch's: the first NaN, else the first extreme value
        cmp = ">" if op == "argmax" else "<"
        lines.append("    best = tl.zeros([BR, BC], dtype=tl.int32)")
        lines += loop([f"v = tl.where(m2, v, {fill})", f"take = (v {cmp} acc) | ((v != v) & (acc == acc))",
                       "acc = tl.where(take, v, acc)", "best = tl.where(take, cols[None, :], best)"])
        top = "max" if op == "argmax" else "min"
        lines += [f"    top = tl.{top}(acc, axis=1)", "    nan = acc != acc",
                  "    res = tl.min(tl.where(acc == top[:, None], best, 2147483647), axis=1)",
                  "    res = tl.where(tl.max(nan.to(tl.int32), axis=1) > 0, "
                  "tl.min(tl.where(nan, best, 2147483647), axis=1), res)"]
    elif op in ("amax", "amin", "logsumexp"):
        fn = minimum if op == "amin" else maximum
        lines += loop([f"acc = {fn('acc', f'tl.where(m2, v, {fill})')}"])
        lines.append(f"    res = {extreme('min' if op == 'amin' else 'max', 'acc', 1)}")
        if op == "logsumexp":
            # torch's: an infinite max shifts by 0, so a row with +inf sums to +inf, not inf - inf = NaN
            lines += ["    mx = tl.where(tl.abs(res) == float(\"inf\"), 0.0, res)",
                      "    acc = tl.zeros([BR, BC], dtype=tl.float32)"]
            lines += loop(["acc += tl.where(m2, tl.exp(v - mx[:, None]), 0.0)"])
            lines.append("    res = mx + tl.log(tl.sum(acc, axis=1))")
    else:
        lines += loop(["acc += tl.where(m2, v, 0.0)"])
        lines.append("    res = tl.sum(acc, axis=1)")
        if op == "mean":
            lines.append("    res = res / (C - correction)")
    if split:
        lines += ["    if SPLIT:", "        tl.atomic_add(out_ptr + rows, res, mask=rmask)", "    else:",
                  "        tl.store(out_ptr + rows, res, mask=rmask)"]
    else:
        lines.append("    tl.store(out_ptr + rows, res, mask=rmask)")
    meta = ", BR: tl.constexpr, BC: tl.constexpr" + (", SPLIT: tl.constexpr" if split else "")
    src = "def KERNEL(" + ", ".join(args) + meta + "):\n" + "\n".join(lines) + "\n"
    return jit(kernel_name(f"reduce_{op}", src), src)


LAUNCHER = '''

SPLIT_PROGRAMS = 256
"""A split reduction's programs in all (two per SM of an H100): enough to fill the GPU, few enough to add up."""
SPLIT_COLUMNS = 256
"""The fewest columns one program of a split reduction reads per row."""
SPLIT_BYTES = 128 * 1024
"""A block of rows is split only when one program would read at least this much: then its read alone (an SM's
share of DRAM bandwidth, ~25 GB/s on an H100) outlasts the launch that zeroes the output."""


def _reduce_tile(R, C, cpu, BR=None, BC=None):
    """(BR, BC) a reduction of R rows over C columns takes: on a GPU, rows per program from R (`_per_program`); under
    the interpreter, which pays per program, the widest tile."""
    BC = BC or min(128 if cpu else 64, triton.next_power_of_2(max(C, 1)))
    most = max(1, min(256, (8192 if cpu else 2048) // BC))
    return BR or (most if cpu else _per_program(R, 1, most)), BC


def _reduce(leaves, scalars, dims, keepdim, dtype, correction=0, split=False, BR=None, BC=None):
    """(out, grid, args, meta) of a reduction: rows are the kept dims, columns the reduced ones (strided).
    `split` (a SPLITTABLE kernel): when the rows' programs are too few to fill the GPU, each row's columns are
    cut into ranges of a power-of-two number of column blocks, a program each (the same cut under the
    interpreter, so what runs on the CPU is what a GPU runs)."""
    shape = tuple(torch.broadcast_shapes(*[t.shape for t in leaves]))
    r = len(shape)
    dims = sorted({d % r for d in dims}) if dims else list(range(r))
    kept = [i for i in range(r) if i not in dims]
    views = [t.expand(shape) for t in leaves]
    R = math.prod(shape[i] for i in kept)
    C = math.prod(shape[i] for i in dims)
    device = leaves[0].device
    cpu = device.type == "cpu"
    gbr, gbc = _reduce_tile(R, C, False, BR, BC)  # the GPU's tile: its grid, and the split's cut on any device
    BR, BC = _reduce_tile(R, C, cpu, BR, BC)
    chunk = C
    if split:
        want = min(triton.cdiv(C, SPLIT_COLUMNS), SPLIT_PROGRAMS // triton.cdiv(R, gbr))
        if want > 1 and min(R, gbr) * C * 4 >= SPLIT_BYTES:
            chunk = gbc * triton.next_power_of_2(triton.cdiv(triton.cdiv(C, want), gbc))
    if cpu:
        BR, BC = _interpreter_tile(R, C, BR, BC, 8192)
        BC = min(BC, triton.next_power_of_2(max(chunk, 1)))  # a range holds whole column blocks
    splits = max(1, triton.cdiv(C, max(chunk, 1)))
    out = (torch.zeros if splits > 1 else torch.empty)(R, dtype=dtype, device=device)
    strides = [v.stride(i) for v in views for i in kept + dims]
    result = out.reshape([1 if i in dims else shape[i] for i in range(r)] if keepdim else [shape[i] for i in kept])
    meta = {"BR": BR, "BC": BC, **({"SPLIT": splits > 1} if split else {})}
    grid = _on_gpu((max(1, triton.cdiv(R, BR)), splits), (max(1, triton.cdiv(R, gbr)), splits))
    return result, grid, (out, *views, *scalars, R, C, correction, max(chunk, 1), *[shape[i] for i in kept + dims],
                          *strides), meta
'''


@emits("reduce")
def reduce(fw: "Forward", v: int) -> str:
    n = fw.nodes[v]
    k = Fused(fw)
    value = k.expr(n.args[0])
    src = fw.nodes[n.args[0]] if isinstance(n.args[0], int) else None
    rank = len(src.shape) if src else 0
    dims = n.attrs["dims"]
    split = n.attrs["fn"] in SPLITTABLE and n.dtype == "float32"  # an fp32 atomic add
    name = fw.kernel(reduce_kernel(n.attrs["fn"], rank - len(dims), len(dims), len(k.leaves), len(k.scalars),
                                   k.lines, value, split=split))
    fw.launcher("_interpreter_tile", INTERPRETER_TILE)
    fw.launcher("_reduce", LAUNCHER)
    corr = n.attrs.get("correction", 0.0)
    return fw.launch(v, name, f"_reduce([{k.leaf_vars()}], [{k.scalar_args()}], {dims}, {n.attrs['keepdim']}, "
                              f"{fw.dtype(v)}, {corr}{', split=True' if split else ''})")
