"""The pointwise block: one kernel computing a fused chain of elementwise functions over several broadcast
inputs (any rank, strided output). `Fused` builds the chain; a reduction's input chain uses it too."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from activities.kernels.compiler.blocks.common import decompose, jit, kernel_name, offset
from activities.kernels.compiler.expr import expression, num
from activities.kernels.compiler.graph import Const, Scalar, Sym, symbolic
from activities.kernels.compiler.registry import emits

if TYPE_CHECKING:
    from activities.kernels.compiler.forward import Forward


def pointwise_kernel(rank: int, leaves: int, flips: list[tuple[int, ...]], scalars: int, body: list[str],
                     result: str, bool_out: bool = False) -> tuple[str, str]:
    """(name, source): out[i] = result(leaf_0[i], ..., scalars) over a broadcast index space of `rank`
    dims; `flips[k]` lists the dims leaf k is read reversed along; `body` lines may use `i0..i{rank-1}`."""
    dims = [f"d{j}" for j in range(rank)]
    idx = [f"i{j}" for j in range(rank)]
    args = ["out_ptr"] + [f"l{k}_ptr" for k in range(leaves)] + [f"s{k}" for k in range(scalars)] + ["n"] + dims
    args += [f"o{j}" for j in range(rank)] + [f"l{k}_{j}" for k in range(leaves) for j in range(rank)]
    lines = ["    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)", "    mask = offs < n"]
    lines += decompose("offs", dims, idx, "    ")
    for k in range(leaves):
        pos = [f"({dims[j]} - 1 - {idx[j]})" if j in flips[k] else idx[j] for j in range(rank)]
        off = offset(pos, [f"l{k}_{j}" for j in range(rank)], "offs")
        lines.append(f"    x{k} = tl.load(l{k}_ptr + {off}, mask=mask, other=0.0).to(tl.float32)")
    lines += ["    " + b for b in body]
    value = f"({result}) != 0" if bool_out else result
    lines.append(f"    tl.store(out_ptr + {offset(idx, [f'o{j}' for j in range(rank)], 'offs')}, {value}, mask=mask)")
    src = "def KERNEL(" + ", ".join(args) + ", BLOCK: tl.constexpr):\n" + "\n".join(lines) + "\n"
    return jit(kernel_name("pointwise", src), src)


LAUNCHER = '''

def _pointwise(leaves, scalars, dtype, shape=None, out=None, device=None, BLOCK=None):
    """(out, grid, args, meta) of a pointwise kernel over the broadcast shape of its leaves (or `out`'s)."""
    if out is not None:
        shape = tuple(out.shape)
    elif leaves:
        shape = tuple(torch.broadcast_shapes(*[t.shape for t in leaves]))
    if out is None:
        out = torch.empty(shape, dtype=dtype, device=leaves[0].device if leaves else device)
    views = [t.expand(shape) for t in leaves]
    n = out.numel()
    strides = [s for v in views for s in v.stride()]
    block = BLOCK or (4096 if out.device.type == "cpu" else 1024)
    return out, (max(1, triton.cdiv(n, block)),), (out, *views, *scalars, n, *shape, *out.stride(), *strides), \\
        {"BLOCK": block}
'''


class Fused:
    """One fused pointwise expression being built: its leaves (materialized tensors, maybe read flipped), the
    scalar inputs it takes, its lines (`v<k> = ...`)."""

    def __init__(self, fw: "Forward"):
        self.fw = fw
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
            return num(v.value)
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
    made = pointwise_kernel(len(n.shape), len(k.leaves), [f for _, f in k.leaves], len(k.scalars), k.lines,
                            result, bool_out=n.dtype == "bool")
    name = fw.kernel(made)
    fw.launcher("_pointwise", LAUNCHER)
    device = f"inputs[{fw.graph.device_input}].device" if fw.graph.device_input is not None else '"cpu"'
    shape = "" if k.leaves else f", shape=[{', '.join(sizes(fw, n))}], device={device}"
    return fw.launch(v, name, f"_pointwise([{k.leaf_vars()}], [{k.scalar_args()}], {fw.dtype(v)}{shape})")


def sizes(fw: "Forward", n: Any) -> list[str]:
    """A node's sizes as forward code: the trace's expressions where they depend on the inputs, else constants."""
    return [fw.size(e) if symbolic(e) else e for e in n.sizes] if n.sizes else [str(s) for s in n.shape]


@emits("pw")
def pointwise(fw: "Forward", v: int) -> str:
    k = Fused(fw)
    return launch(fw, v, k, k.expr(v))


@emits("flip")
def flip(fw: "Forward", v: int) -> str:
    n = fw.nodes[v]
    k = Fused(fw)
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


@emits("cat")
def cat(fw: "Forward", v: int) -> str:
    """The parts copied one by one into their slices of the output (a copy kernel per part)."""
    n = fw.nodes[v]
    parts = [fw.tensor(a) for a in n.args]
    dim = n.attrs["dim"]
    r = len(n.shape)
    copy = fw.kernel(pointwise_kernel(r, 1, [()], 0, [], "x0"))
    fw.launcher("_pointwise", LAUNCHER)
    name, dtype = f"t{v}", fw.dtype(v)
    sizes = " + ".join(f"{p}.shape[{dim}]" for p in parts)
    fw.lines.append(f"{name} = torch.empty([*{parts[0]}.shape[:{dim % r}], {sizes}, "
                    f"*{parts[0]}.shape[{dim % r + 1}:]], dtype={dtype}, device={parts[0]}.device)")
    fw.lines.append("at = 0")
    for p in parts:
        fw.lines.append(f"_, grid, args, meta = _pointwise([{p}], [], {dtype}, out={name}.narrow({dim}, at, "
                        f"{p}.shape[{dim}]))")
        fw.lines.append(f"{copy}[grid](*args, **meta)")
        fw.lines.append(f"at += {p}.shape[{dim}]")
        fw.launches += 1
    fw.names[v] = name
    return name


@emits("pad")
def pad(fw: "Forward", v: int) -> str:
    """The output filled with the value, then the kept part of the input copied into its place."""
    n = fw.nodes[v]
    x, r, dtype, name = fw.tensor(n.args[0]), len(n.shape), fw.dtype(v), f"t{v}"
    fill = fw.kernel(pointwise_kernel(r, 0, [], 0, [], num(n.attrs["value"])))
    copy = fw.kernel(pointwise_kernel(r, 1, [()], 0, [], "x0"))
    fw.launcher("_pointwise", LAUNCHER)
    pads = n.attrs["pads"]
    shape = ", ".join(f"{x}.shape[{d}] + {lo + hi}" for d, (lo, hi) in enumerate(pads))
    src, dst = x, name
    for d, (lo, hi) in enumerate(pads):
        if (lo, hi) != (0, 0):
            width = f"{x}.shape[{d}] + {min(lo, 0) + min(hi, 0)}"
            src, dst = f"{src}.narrow({d}, {max(-lo, 0)}, {width})", f"{dst}.narrow({d}, {max(lo, 0)}, {width})"
    fw.lines += [f"{name} = torch.empty([{shape}], dtype={dtype}, device={x}.device)",
                 f"_, grid, args, meta = _pointwise([], [], {dtype}, out={name})", f"{fill}[grid](*args, **meta)",
                 f"_, grid, args, meta = _pointwise([{src}], [], {dtype}, out={dst})", f"{copy}[grid](*args, **meta)"]
    fw.launches += 2
    fw.names[v] = name
    return name


@emits("fill")
def fill(fw: "Forward", v: int) -> str:
    """One value everywhere, or start + i * step along the last dim (arange)."""
    n = fw.nodes[v]
    k = Fused(fw)
    value = num(n.attrs["value"])
    if "step" in n.attrs:
        value = k.line(f"{value} + i{len(n.shape) - 1} * {num(n.attrs['step'])}")
    return launch(fw, v, k, value)
