"""The scan block: cumsum / cumprod along one dim, tile by tile with a carry; rows are the other dims (any strides).
The pointwise chain producing its input is fused in front (`cumsum(x * mask)` is one kernel), and it reads that
input from either end (`reverse`) or one column late (`shift`: an exclusive scan), the forms `passes.scan_forms`
finds."""

from __future__ import annotations

from typing import TYPE_CHECKING

from activities.kernels.compiler.blocks.common import decompose, jit, kernel_name, offset
from activities.kernels.compiler.blocks.pointwise import Fused
from activities.kernels.compiler.registry import emits

if TYPE_CHECKING:
    from activities.kernels.compiler.forward import Forward


def scan_kernel(op: str, others: int, leaves: int, scalars: int, body: list[str], value: str, *,
                reverse: bool = False, shift: int = 0) -> tuple[str, str]:
    """(name, source): out = op along the scan dim of value(leaves), C columns of it from the leaves' C - shift
    (the first `shift` output columns take the op's neutral); `reverse`: from the last column to the first."""
    assert not (reverse and shift)
    os_ = [f"k{j}" for j in range(others)]
    args = ["out_ptr"] + [f"l{k}_ptr" for k in range(leaves)] + [f"s{k}" for k in range(scalars)]
    args += ["R", "C"] + [f"{s}_n" for s in os_] + [f"l{k}_{s}" for k in range(leaves) for s in os_]
    args += [f"o_{s}" for s in os_] + [f"l{k}c" for k in range(leaves)] + ["oc"]
    neutral = "1.0" if op == "cumprod" else "0.0"
    lines = ["    rows = tl.program_id(0) * BR + tl.arange(0, BR)", "    rmask = rows < R"]
    lines += decompose("rows", [f"{s}_n" for s in os_], os_, "    ")
    lines += [f"    base{k} = {offset(os_, [f'l{k}_{s}' for s in os_], 'rows')}" for k in range(leaves)]
    lines += [f"    ob = {offset(os_, [f'o_{s}' for s in os_], 'rows')}",
              f"    carry = tl.full([BR], {neutral}, dtype=tl.float32)",
              "    for c0 in range(0, C, BC):",
              "        cols = c0 + tl.arange(0, BC)",  # in the scan's order
              "        m2 = rmask[:, None] & (cols < C)[None, :]",
              f"        at = {'C - 1 - cols' if reverse else 'cols'}",  # the output's column
              f"        src = at - {shift}"]
    read = "m2 & (src >= 0)[None, :]" if shift else "m2"
    lines += [f"        x{k} = tl.load(l{k}_ptr + base{k}[:, None] + src[None, :] * l{k}c, mask={read}, "
              "other=0.0).to(tl.float32)" for k in range(leaves)]
    lines += ["        " + b for b in body] + [f"        v = tl.where({read}, {value}, {neutral})"]
    lines.append("        c = tl.cumprod(v, axis=1) * carry[:, None]" if op == "cumprod"
                 else "        c = tl.cumsum(v, axis=1) + carry[:, None]")
    lines += ["        tl.store(out_ptr + ob[:, None] + at[None, :] * oc, c, mask=m2)",
              "        last = tl.minimum(c0 + BC, C) - 1",
              "        carry = tl.sum(tl.where(cols[None, :] == last, c, 0.0), axis=1)"]
    src = "def KERNEL(" + ", ".join(args) + ", BR: tl.constexpr, BC: tl.constexpr):\n" + "\n".join(lines) + "\n"
    return jit(kernel_name(op, src), src)


LAUNCHER = '''

def _scan(leaves, scalars, dim, dtype, shift=0, BR=None, BC=None):
    """(out, grid, args, meta) of a cumulative sum / product along `dim` over the broadcast shape of its leaves (with
    `shift` more columns than they have)."""
    shape = list(torch.broadcast_shapes(*[t.shape for t in leaves]))
    r = len(shape)
    dim = dim % r
    others = [i for i in range(r) if i != dim]
    views = [t.expand(shape) for t in leaves]
    out = torch.empty([n + shift if i == dim else n for i, n in enumerate(shape)], dtype=dtype, device=views[0].device)
    R = math.prod(shape[i] for i in others)
    C = out.shape[dim]
    BC = BC or min(128, triton.next_power_of_2(max(C, 1)))
    gpu = BR or _per_program(R, 1, min(256, 2048 // BC))
    BR = BR or (max(1, min(256, 8192 // BC)) if out.device.type == "cpu" else gpu)
    grid = _on_gpu((max(1, triton.cdiv(R, BR)),), (max(1, triton.cdiv(R, gpu)),))
    return out, grid, (out, *views, *scalars, R, C, *[shape[i] for i in others],
                       *[v.stride(i) for v in views for i in others], *[out.stride(i) for i in others],
                       *[v.stride(dim) for v in views], out.stride(dim)), {"BR": BR, "BC": BC}
'''


@emits("scan")
def scan(fw: "Forward", v: int) -> str:
    n = fw.nodes[v]
    k = Fused(fw)
    value = k.expr(n.args[0])
    if not k.leaves:  # a chain of constants and scalars: the launcher takes its shape from a tensor
        k = Fused(fw)
        value = k.leaf(fw.tensor(n.args[0]))
    shift = n.attrs.get("shift", 0)
    name = fw.kernel(scan_kernel(n.attrs["fn"], len(n.shape) - 1, len(k.leaves), len(k.scalars), k.lines, value,
                                 reverse=n.attrs.get("reverse", False), shift=shift))
    fw.launcher("_scan", LAUNCHER)
    return fw.launch(v, name, f"_scan([{k.leaf_vars()}], [{k.scalar_args()}], {n.attrs['dim']}, {fw.dtype(v)}"
                              f"{f', shift={shift}' if shift else ''})")
