"""The pooling block: 1-3D max or average pooling (dilation, ceil mode, count_include_pad, divisor override), and
adaptive pooling (output size given, windows [floor(o*I/O), ceil((o+1)*I/O)) as torch's), one output element per
lane, the window walked with run-time loops."""

from __future__ import annotations

from typing import TYPE_CHECKING

from activities.kernels.compiler.blocks.common import decompose, jit
from activities.kernels.compiler.blocks.pointwise import FLAT_GRID
from activities.kernels.compiler.expr import maximum
from activities.kernels.compiler.registry import emits

if TYPE_CHECKING:
    from activities.kernels.compiler.forward import Forward


def _pooling(d: int, kind: str, args: list[str], window: list[str], index: str, inside: str, average: list[str],
             constexprs: str, name: str) -> tuple[str, str]:
    """(name, source) of a d-dim pooling kernel, one output element per lane: `window` lines set up each output's
    window, `index` gives input index i{j} from loop index q{j}, `inside` says i{j} is in the window, `average`
    divides the sum (kind avg)."""
    sp = range(d)
    lines = ["    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)", "    mask = offs < total"]
    lines += decompose("offs", ["0"] + [f"O{j}" for j in sp], ["row"] + [f"o{j}" for j in sp], "    ")
    lines += ["    " + w.format(j=j) for w in window for j in sp]
    fill = '-float("inf")' if kind == "max" else "0.0"
    lines.append(f"    acc = tl.full([BLOCK], {fill}, dtype=tl.float32)")
    indent = "    "
    for j in sp:
        lines.append(f"{indent}for q{j} in range(0, K{j}):")
        indent += "    "
    lines += [f"{indent}i{j} = {index.format(j=j)}" for j in sp]
    lines += [f"{indent}ok = {' & '.join(['mask'] + [inside.format(j=j) for j in sp])}",
              f"{indent}v = tl.load(x_ptr + row * xs0 + {' + '.join(f'i{j} * xs{j + 1}' for j in sp)}, mask=ok, "
              f"other={fill}).to(tl.float32)"]
    lines.append(f"{indent}acc = {maximum('acc', 'v')}" if kind == "max" else f"{indent}acc += v")
    if kind == "avg":
        lines += ["    " + a for a in average]
    lines.append("    tl.store(out_ptr + offs, acc, mask=mask)")
    src = f"def KERNEL({', '.join(args)}, {constexprs}BLOCK: tl.constexpr):\n" + "\n".join(lines) + "\n"
    return jit(name, src)


def _sizes(d: int, *groups: str) -> list[str]:
    return ["x_ptr", "out_ptr", "total", "xs0"] + [f"xs{j + 1}" for j in range(d)] + [
        f"{g}{j}" for g in ("I", "O", "K", *groups) for j in range(d)]


def pool_kernel(d: int, kind: str) -> tuple[str, str]:
    """(name, source): d-dim max or average pooling over (rows, spatial...) input; the window walked with
    run-time loops, count_include_pad and a divisor override for the average."""
    average = ["inc = tl.full([BLOCK], 1.0, dtype=tl.float32)", "exc = tl.full([BLOCK], 1.0, dtype=tl.float32)"]
    for j in range(d):
        average += [f"st{j} = o{j} * S{j} - P{j}", f"en{j} = tl.minimum(st{j} + K{j}, I{j} + P{j})",
                    f"inc = inc * (en{j} - st{j})", f"exc = exc * (tl.minimum(en{j}, I{j}) - tl.maximum(st{j}, 0))"]
    average += ["div = tl.where(divisor > 0, divisor, tl.where(COUNT_PAD, inc, exc))", "acc = acc / div"]
    return _pooling(d, kind, _sizes(d, "S", "P", "D") + ["divisor"], [], "o{j} * S{j} - P{j} + q{j} * D{j}",
                    "(i{j} >= 0) & (i{j} < I{j})", average, "COUNT_PAD: tl.constexpr, ", f"{kind}_pool{d}d_kernel")


def adaptive_kernel(d: int, kind: str) -> tuple[str, str]:
    """(name, source): d-dim adaptive max or average pooling over windows [floor(o*I/O), ceil((o+1)*I/O));
    K{j} bounds the window (the launcher's ceil(I/O)+1)."""
    window = ["st{j} = (o{j} * I{j}) // O{j}", "en{j} = ((o{j} + 1) * I{j} + O{j} - 1) // O{j}"]
    average = [f"acc = acc / ({' * '.join(f'(en{j} - st{j})' for j in range(d))})"]
    return _pooling(d, kind, _sizes(d), window, "st{j} + q{j}", "(i{j} < en{j})", average, "",
                    f"adaptive_{kind}_pool{d}d_kernel")


ADAPTIVE_LAUNCHER = '''

def _adaptive_pool(x, output_size, BLOCK=None):
    """(out, grid, args, meta) of adaptive pooling of the last len(output_size) dims (None: keep that size)."""
    d = len(output_size)
    lead, I = list(x.shape[:-d]), list(x.shape[-d:])
    O = [I[j] if output_size[j] is None else output_size[j] for j in range(d)]
    K = [-(-I[j] // O[j]) + 1 for j in range(d)]
    rows = x.reshape(-1, *I)
    out = torch.empty((rows.shape[0], *O), dtype=x.dtype, device=x.device)
    grid, block = _flat_grid(out, BLOCK, 64, 256)
    return out.reshape(*lead, *O), grid, (rows, out, out.numel(), *rows.stride(), *I, *O, *K), {"BLOCK": block}
'''

LAUNCHER = '''

def _pool(x, kernel_size, stride, padding, dilation, ceil_mode, count_include_pad=True, divisor=0, BLOCK=None):
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
    grid, block = _flat_grid(out, BLOCK, 64, 256)
    return out.reshape(*lead, *O), grid, (
        rows, out, out.numel(), *rows.stride(), *I, *O, *kernel_size, *stride, *padding, *dilation, float(divisor or 0)), \
        {"COUNT_PAD": bool(count_include_pad), "BLOCK": block}
'''


@emits("pool")
def pool(fw: "Forward", v: int) -> str:
    n = fw.nodes[v]
    at = n.attrs
    name = fw.kernel(pool_kernel(len(at["kernel"]), at["kind"]))
    fw.launcher("_flat_grid", FLAT_GRID)
    fw.launcher("_pool", LAUNCHER)
    extra = f", {at['count_include_pad']}, {at['divisor']}" if at["kind"] == "avg" else ""
    return fw.launch(v, name, f"_pool({fw.tensor(n.args[0])}, {at['kernel']}, {at['stride']}, "
                              f"{at['padding']}, {at['dilation']}, {at['ceil_mode']}{extra})")


@emits("adaptive_pool")
def adaptive_pool(fw: "Forward", v: int) -> str:
    n = fw.nodes[v]
    size = n.attrs["output_size"]
    name = fw.kernel(adaptive_kernel(len(size), n.attrs["kind"]))
    fw.launcher("_flat_grid", FLAT_GRID)
    fw.launcher("_adaptive_pool", ADAPTIVE_LAUNCHER)
    return fw.launch(v, name, f"_adaptive_pool({fw.tensor(n.args[0])}, {size})")
