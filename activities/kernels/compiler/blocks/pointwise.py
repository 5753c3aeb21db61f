"""The pointwise block: one kernel computing a fused chain of elementwise functions over several broadcast
inputs (any rank, strided output). `Fused` builds the chain; a reduction's input chain uses it too."""

from __future__ import annotations

import re
from typing import TYPE_CHECKING, Any

from activities.kernels.compiler.blocks.common import jit, kernel_name
from activities.kernels.compiler.expr import COMPARE, expression, num
from activities.kernels.compiler.graph import Const, Scalar, Sym, symbolic
from activities.kernels.compiler.registry import emits

if TYPE_CHECKING:
    from activities.kernels.compiler.forward import Forward


def flat_kernel(prefix: str, args: list[str], body: list[str]) -> tuple[str, str]:
    """(name, source) of a kernel with a program per BLOCK elements of the output's flat index (`offs`, `mask`
    for the body; the launcher's grid is `_flat_grid`), split over RANK dims by `addresses`."""
    lines = ["    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)", "    mask = offs < n", *body]
    src = "def KERNEL(" + ", ".join(args) + ", BLOCK: tl.constexpr, RANK: tl.constexpr):\n" + "\n".join(lines) + "\n"
    return jit(kernel_name(prefix, src), src)


def pointwise_kernel(rank: int, leaves: int, flips: list[tuple[int, ...]], scalars: int, body: list[str],
                     result: str, bool_out: bool = False, exact: bool = False) -> tuple[str, str]:
    """(name, source): out[i] = result(leaf_0[i], ..., scalars) over a broadcast index space of `rank`
    dims; `flips[k]` lists the dims leaf k is read reversed along; `body` lines may use `i0..i{rank-1}`
    (a kernel that does is launched with `keep_dims`). The flat index is split over the innermost RANK dims
    only: the launcher merges the dims every tensor walks as one (`_coalesce`) and pads the rest with size 1.
    The leaves are computed on in fp32, or, `exact`, in their own dtype (`integral`: int64 beyond 2^24 exact)."""
    args = ["out_ptr"] + [f"l{k}_ptr" for k in range(leaves)] + [f"s{k}" for k in range(scalars)] + ["n"]
    args += [f"d{j}" for j in range(rank)] + [f"o{j}" for j in range(rank)]
    args += [f"l{k}_{j}" for k in range(leaves) for j in range(rank)]
    lines = addresses(rank, [("at_out", "o", ())] + [(f"at{k}", f"l{k}_", flips[k]) for k in range(leaves)])
    for k in range(leaves):
        load = f"tl.load(l{k}_ptr + at{k}, mask=mask, other={0 if exact else 0.0})"
        lines.append(f"    x{k} = {load}" if exact else f"    x{k} = {load}.to(tl.float32)")
    lines += ["    " + b for b in body]
    value = f"({result}) != 0" if bool_out else result
    lines.append(f"    tl.store(out_ptr + at_out, {value}, mask=mask)")
    return flat_kernel("pointwise", args, lines)


def addresses(rank: int, tensors: list[tuple[str, str, tuple[int, ...]]]) -> list[str]:
    """Lines giving each tensor's element offset from `offs`: `tensors` holds (offset name, stride prefix: strides
    `<prefix><dim>`, the dims it is read reversed along). The index is split over the innermost RANK dims
    (constexpr: the other branches are never compiled nor run); a contiguous elementwise launch (RANK 1) does no
    division at all."""
    names = [name for name, _, _ in tensors]
    if rank == 0:
        return [f"    {name} = offs * 0" for name in names]
    lines = ["    rem_offs = offs"]
    for p, j in enumerate(range(rank - 1, -1, -1)):  # p: how many dims lie inside dim j
        split = [f"i{j} = rem_offs % d{j}", f"rem_offs = rem_offs // d{j}"]
        index = ([f"if RANK > {p + 1}:", *("    " + x for x in split), "else:", f"    i{j} = rem_offs"]
                 if j > 0 else [f"i{j} = rem_offs"])
        terms = [(name, f"(d{j} - 1 - i{j})" if j in flips else f"i{j}", f"{prefix}{j}")
                 for name, prefix, flips in tensors]
        step = index + [f"{name} {'=' if p == 0 else '+='} {pos} * {stride}" for name, pos, stride in terms]
        lines += ["    " + x for x in step] if p == 0 else [f"    if RANK > {p}:"] + ["        " + x for x in step]
    return lines


def needs_dims(flips: list[tuple[int, ...]], body: list[str], result: str) -> bool:
    """Whether a kernel reads its output's own dims (a flipped leaf, `i<j>` in its body), so that its launch may
    not merge them."""
    return any(flips) or any(re.search(r"\bi\d+\b", line) for line in [*body, result])


FLAT_GRID = '''

def _flat_grid(out, BLOCK=None, lo=128, hi=1024):
    """(grid, BLOCK) of a flat-index kernel over `out`: a program per BLOCK elements, on a GPU lo to hi from the
    count (`_per_program`), on the interpreter, which runs the programs one by one, 4096 (the grid then carries the
    GPU's program count: `_on_gpu`)."""
    n = out.numel()
    gpu = BLOCK or _per_program(n, lo, hi)
    block = BLOCK or (4096 if out.device.type == "cpu" else gpu)
    return _on_gpu((max(1, triton.cdiv(n, block)),), (max(1, triton.cdiv(n, gpu)),)), block
'''


LAUNCHER = '''

def _coalesce(sizes, strides):
    """(sizes, per-tensor strides) with size-1 dims dropped and each dim merged into the one outside it wherever
    every tensor walks the two as one (outer stride = inner stride x inner size): the same elements in the same
    order, split over fewer dims (a contiguous elementwise op over one)."""
    merged_sizes, merged = [], [[] for _ in strides]
    for j, size in enumerate(sizes):
        if size == 1:
            continue
        if merged_sizes and all(m[-1] == st[j] * size for m, st in zip(merged, strides)):
            merged_sizes[-1] *= size
            for m, st in zip(merged, strides):
                m[-1] = st[j]
        else:
            merged_sizes.append(size)
            for m, st in zip(merged, strides):
                m.append(st[j])
    return merged_sizes or [1], [m or [0] for m in merged]


def _pointwise(leaves, scalars, dtype, shape=None, out=None, device=None, BLOCK=None, keep_dims=False):
    """(out, grid, args, meta) of a pointwise kernel over the broadcast shape of its leaves (or `out`'s); its dims
    merged where the tensors allow (`_coalesce`) unless the kernel reads them (`keep_dims`)."""
    if out is not None:
        shape = tuple(out.shape)
    elif leaves:
        shape = tuple(torch.broadcast_shapes(*[t.shape for t in leaves]))
    if out is None:
        out = torch.empty(shape, dtype=dtype, device=leaves[0].device if leaves else device)
    views = [t.expand(shape) for t in leaves]
    sizes, strides = list(shape), [list(t.stride()) for t in (out, *views)]
    if not keep_dims and sizes:
        sizes, strides = _coalesce(sizes, strides)
    pad = len(shape) - len(sizes)
    grid, block = _flat_grid(out, BLOCK)
    args = (out, *views, *scalars, out.numel(), *[1] * pad, *sizes, *[s for st in strides for s in [0] * pad + st])
    return out, grid, args, {"BLOCK": block, "RANK": len(sizes)}
'''


INTEGER_FNS = ("add", "sub", "rsub", "mul", "neg", "abs", "maximum", "minimum", "where", "copy")
"""Pointwise functions whose Triton expression (`expression`) is exact on integers: no float literal, no division."""


def _integer(dtype: str) -> bool:
    return dtype == "bool" or "int" in dtype


def integral(fw: "Forward", v: int) -> bool:
    """Whether node v's fused chain (what `Fused.expr` inlines) can be computed in its own integer dtypes: an
    integer (or bool) result of integer leaves, integral constants and INTEGER_FNS, comparisons (of those or of
    any stored tensor) only as a `where`'s condition or the result. Through fp32 an int64 above 2^24 (a large id,
    index arithmetic) is inexact."""
    def exact(u: Any, compared: bool) -> bool:
        if isinstance(u, Const):
            return isinstance(u.value, bool | int) or (isinstance(u.value, float) and u.value.is_integer())
        if isinstance(u, Sym):
            return True
        if isinstance(u, Scalar):
            return False  # a forward argument: its Python type is known only at run time
        node = fw.nodes[u]
        if node.op != "pw":
            return _integer(node.dtype)
        fn, args = node.attrs["fn"], node.args
        if fn in COMPARE:  # a tensor compared is read as it is stored (an fp16 one compares as in fp32)
            return compared and all(exact(a, False) or (isinstance(a, int) and fw.nodes[a].op != "pw") for a in args)
        if fn == "where":
            return exact(args[0], True) and all(exact(a, False) for a in args[1:])
        return fn in INTEGER_FNS and _integer(node.dtype) and all(exact(a, False) for a in args)

    return _integer(fw.nodes[v].dtype) and exact(v, fw.nodes[v].dtype == "bool")


class Fused:
    """One fused pointwise expression being built: its leaves (materialized tensors, maybe read flipped), the
    scalar inputs it takes, its lines (`v<k> = ...`). `exact`: computed in the leaves' own integer dtypes
    (`integral`), its constants written as integers."""

    def __init__(self, fw: "Forward", exact: bool = False):
        self.fw = fw
        self.exact = exact
        self.leaves: list[tuple[str, tuple[int, ...]]] = []
        self.scalars: list[str] = []
        """Run-time scalars the kernel takes (a scalar forward input, a size), as forward code."""
        self.lines: list[str] = []
        self.memo: dict[int, str] = {}

    def leaf(self, var: str, flips: tuple[int, ...] = ()) -> str:
        if (var, flips) not in self.leaves:
            self.leaves.append((var, flips))
        return f"x{self.leaves.index((var, flips))}"

    def expr(self, v: Any) -> str:
        """The expression for graph value v: pointwise nodes inlined, anything else read as a leaf."""
        if isinstance(v, Const):
            return str(int(v.value)) if self.exact else num(v.value)
        if isinstance(v, (Scalar, Sym)):
            code = f"inputs[{v.index}]" if isinstance(v, Scalar) else self.fw.size(v.expr)
            if code not in self.scalars:
                self.scalars.append(code)
            return f"s{self.scalars.index(code)}"
        if v in self.memo:
            return self.memo[v]
        node = self.fw.nodes[v]
        if node.op != "pw":
            return self.leaf(self.fw.tensor(v))
        parts = [self.expr(a) for a in node.args]
        line = f"v{len(self.lines)}"
        self.lines.append(f"{line} = {expression(node.attrs['fn'], node.attrs.get('attrs', {}), parts, node.args)}")
        self.memo[v] = line
        return line

    def line(self, code: str) -> str:
        """Append `v<k> = code`; returns v<k>."""
        name = f"v{len(self.lines)}"
        self.lines.append(f"{name} = {code}")
        return name

    def leaf_vars(self) -> str:
        return ", ".join(var for var, _ in self.leaves)

    def scalar_args(self) -> str:
        return ", ".join(self.scalars)


def launch(fw: "Forward", v: int, k: Fused, result: str) -> str:
    """Launch the pointwise kernel computing `result` (built in `k`) as node v."""
    n = fw.nodes[v]
    flips = [f for _, f in k.leaves]
    made = pointwise_kernel(len(n.shape), len(k.leaves), flips, len(k.scalars), k.lines, result,
                            bool_out=n.dtype == "bool", exact=k.exact)
    name = fw.kernel(made)
    fw.launcher("_flat_grid", FLAT_GRID)
    fw.launcher("_pointwise", LAUNCHER)
    device = f"inputs[{fw.graph.device_input}].device" if fw.graph.device_input is not None else '"cpu"'
    shape = "" if k.leaves else f", shape=[{', '.join(sizes(fw, n))}], device={device}"
    keep = ", keep_dims=True" if needs_dims(flips, k.lines, result) else ""
    return fw.launch(v, name, f"_pointwise([{k.leaf_vars()}], [{k.scalar_args()}], {fw.dtype(v)}{shape}{keep})")


def sizes(fw: "Forward", n: Any) -> list[str]:
    """A node's sizes as forward code: the trace's expressions where they depend on the inputs, else constants."""
    return [fw.size(e) if symbolic(e) else e for e in n.sizes] if n.sizes else [str(s) for s in n.shape]


@emits("pw")
def pointwise(fw: "Forward", v: int) -> str:
    k = Fused(fw, exact=integral(fw, v))
    return launch(fw, v, k, k.expr(v))


@emits("flip")
def flip(fw: "Forward", v: int) -> str:
    """A copy: in the tensor's own dtype, whatever it is."""
    n = fw.nodes[v]
    k = Fused(fw, exact=True)
    return launch(fw, v, k, k.leaf(fw.tensor(n.args[0]), tuple(n.attrs["dims"])))


@emits("tri")
def tri(fw: "Forward", v: int) -> str:
    n = fw.nodes[v]
    k = Fused(fw)
    x = k.expr(n.args[0])
    r = len(n.shape)
    cmp = ">=" if n.attrs["upper"] else "<="
    return launch(fw, v, k, k.line(f"tl.where(i{r - 1} - i{r - 2} {cmp} {n.attrs['diagonal']}, {x}, 0.0)"))


@emits("zeros")
def zeros(fw: "Forward", v: int) -> str:
    return fw.emit(v, f"torch.zeros_like({fw.tensor(fw.nodes[v].args[0])}, dtype={fw.dtype(v)})")


def cat_kernel(rank: int, parts: int, dim: int) -> tuple[str, str]:
    """(name, source): out = the parts one after the other along `dim`, in one launch over the output: a lane
    loads from the one part its index falls in (`c<k>`: where part k starts), in the parts' own dtype (no float
    round trip: int64 stays exact)."""
    args = ["out_ptr"] + [f"p{k}_ptr" for k in range(parts)] + [f"c{k}" for k in range(1, parts)] + ["n"]
    args += [f"d{j}" for j in range(rank)] + [f"o{j}" for j in range(rank)]
    args += [f"l{k}_{j}" for k in range(parts) for j in range(rank)]
    lines = addresses(rank, [("at_out", "o", ())] + [(f"at{k}", f"l{k}_", ()) for k in range(parts)])
    for k in range(parts):
        shift, after = (f" - c{k} * l{k}_{dim}", f" & (i{dim} >= c{k})") if k else ("", "")
        before = f" & (i{dim} < c{k + 1})" if k + 1 < parts else ""
        lines.append(f"    x{k} = tl.load(p{k}_ptr + at{k}{shift}, mask=mask{after}{before}, other=0)")
    value = f"x{parts - 1}"
    for k in range(parts - 2, -1, -1):
        value = f"tl.where(i{dim} < c{k + 1}, x{k}, {value})"
    lines.append(f"    tl.store(out_ptr + at_out, {value}, mask=mask)")
    return flat_kernel("cat", args, lines)


CAT_LAUNCHER = '''

def _cat(parts, dim, dtype, out=None, BLOCK=None):
    """(out, grid, args, meta) of a cat kernel: `parts` along `dim` into `out` (a slice of a longer cat's buffer),
    else into a new tensor; every dim kept."""
    if out is None:
        shape = list(parts[0].shape)
        shape[dim] = sum(p.shape[dim] for p in parts)
        out = torch.empty(shape, dtype=dtype, device=parts[0].device)
    cuts = [sum(p.shape[dim] for p in parts[:k]) for k in range(1, len(parts))]
    grid, block = _flat_grid(out, BLOCK)
    args = (out, *parts, *cuts, out.numel(), *out.shape, *out.stride(), *[s for p in parts for s in p.stride()])
    return out, grid, args, {"BLOCK": block, "RANK": out.dim()}
'''


def _growing(fw: "Forward", v: int) -> int:
    """The longest cat (same dim, same dtype) whose parts start with v's, else v. DenseNet's
    `x = torch.cat(features, 1)` after each layer makes every cat of a block a prefix of its last one."""
    n = fw.nodes[v]
    best = v
    for u in fw.needed():
        m = fw.nodes[u]
        if (m.op == "cat" and len(m.args) > len(fw.nodes[best].args) and m.args[:len(n.args)] == n.args
                and m.dtype == n.dtype and m.attrs["dim"] % len(m.shape) == n.attrs["dim"] % len(n.shape)):
            best = u
    return best


@emits("cat")
def cat(fw: "Forward", v: int) -> str:
    """One launch over the output, each lane reading the part its index falls in. A cat whose parts begin a
    longer cat's is a view of that one's buffer, allocated at the first of them: each writes only the parts the
    one before did not, so a dense block copies every feature map once, not once per later layer."""
    n = fw.nodes[v]
    dim = n.attrs["dim"] % len(n.shape)
    fw.launcher("_flat_grid", FLAT_GRID)
    fw.launcher("_cat", CAT_LAUNCHER)
    parts = [fw.tensor(a) for a in n.args]

    def extent(names: list[str]) -> str:
        return " + ".join(f"{p}.shape[{dim}]" for p in names) or "0"

    whole = _growing(fw, v)
    if not fw.nodes[whole].sizes:  # the buffer's size needs the trace's expressions (a concrete trace's bakes sizes in)
        whole = v
    if whole == v and v not in fw.cat_buffers:
        kernel = fw.kernel(cat_kernel(len(n.shape), len(parts), dim))
        return fw.launch(v, kernel, f"_cat([{', '.join(parts)}], {dim}, {fw.dtype(v)})")
    buffer = f"t{whole}_buffer"
    if whole not in fw.cat_buffers:
        fw.lines.append(f"{buffer} = torch.empty([{', '.join(sizes(fw, fw.nodes[whole]))}], dtype={fw.dtype(whole)}, "
                        f"device={parts[0]}.device)")
        fw.cat_buffers[whole] = 0
    done = fw.cat_buffers[whole]
    if done < len(parts):
        new = parts[done:]
        kernel = fw.kernel(cat_kernel(len(n.shape), len(new), dim))
        fw.lines += [f"_, grid, args, meta = _cat([{', '.join(new)}], {dim}, {fw.dtype(v)}, "
                     f"out={buffer}.narrow({dim}, {extent(parts[:done])}, {extent(new)}))",
                     f"{kernel}[grid](*args, **meta)"]
        fw.launches += 1
        fw.cat_buffers[whole] = len(parts)
    return fw.emit(v, buffer if v == whole else f"{buffer}.narrow({dim}, 0, {extent(parts)})")


def pad_kernel(rank: int, padded: list[int], value: str) -> tuple[str, str]:
    """(name, source): out = x placed `b<j>` further along each padded dim j (negative: cropped), `value` where no
    element of x lands, in one launch over the output."""
    args = ["out_ptr", "x_ptr", "n"] + [f"d{j}" for j in range(rank)] + [f"o{j}" for j in range(rank)]
    args += [f"l0_{j}" for j in range(rank)] + [f"b{j}" for j in padded] + [f"e{j}" for j in padded]
    lines = addresses(rank, [("at_out", "o", ()), ("at0", "l0_", ())])
    inside = " & ".join(["mask", *(f"(i{j} >= b{j}) & (i{j} < b{j} + e{j})" for j in padded)])
    shift = " - ".join(["at0", *(f"b{j} * l0_{j}" for j in padded)])
    lines += [f"    inside = {inside}", f"    x = tl.load(x_ptr + {shift}, mask=inside, other=0)",
              f"    tl.store(out_ptr + at_out, tl.where(inside, x, {value}), mask=mask)"]
    return flat_kernel("pad", args, lines)


PAD_LAUNCHER = '''

def _pad(x, pads, dtype, BLOCK=None):
    """(out, grid, args, meta) of a pad kernel: `pads` (before, after) per dim, every dim kept."""
    shape = [size + lo + hi for size, (lo, hi) in zip(x.shape, pads)]
    out = torch.empty(shape, dtype=dtype, device=x.device)
    padded = [j for j, p in enumerate(pads) if p != (0, 0)]
    grid, block = _flat_grid(out, BLOCK)
    args = (out, x, out.numel(), *shape, *out.stride(), *x.stride(), *[pads[j][0] for j in padded],
            *[x.shape[j] for j in padded])
    return out, grid, args, {"BLOCK": block, "RANK": len(shape)}
'''


@emits("pad")
def pad(fw: "Forward", v: int) -> str:
    """One launch over the output: the input's element where one lands, else the value."""
    n = fw.nodes[v]
    pads = [tuple(p) for p in n.attrs["pads"]]
    padded = [j for j, p in enumerate(pads) if p != (0, 0)]
    value = str(int(n.attrs["value"])) if _integer(n.dtype) else num(n.attrs["value"])  # no float round trip
    name = fw.kernel(pad_kernel(len(n.shape), padded, value))
    fw.launcher("_flat_grid", FLAT_GRID)
    fw.launcher("_pad", PAD_LAUNCHER)
    return fw.launch(v, name, f"_pad({fw.tensor(n.args[0])}, {pads}, {fw.dtype(v)})")


@emits("fill")
def fill(fw: "Forward", v: int) -> str:
    """One value everywhere, or start + i * step along the last dim (arange)."""
    n = fw.nodes[v]
    k = Fused(fw)
    value = num(n.attrs["value"])
    if "step" in n.attrs:
        value = k.line(f"{value} + i{len(n.shape) - 1} * {num(n.attrs['step'])}")
    return launch(fw, v, k, value)
