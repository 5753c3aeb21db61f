"""The scan block: cumsum / cumprod along one dim, tile by tile with a carry; rows are the other dims (any strides)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from activities.kernels.compiler.blocks.common import decompose, jit, offset
from activities.kernels.compiler.registry import emits

if TYPE_CHECKING:
    from activities.kernels.compiler.forward import Forward


def scan_kernel(op: str, others: int) -> tuple[str, str]:
    """(name, source): cumsum / cumprod along one dim; rows are the other dims (any strides)."""
    os_ = [f"k{j}" for j in range(others)]
    args = ["out_ptr", "x_ptr", "R", "C"] + [f"{s}_n" for s in os_] + [f"x_{s}" for s in os_]
    args += [f"o_{s}" for s in os_] + ["xc", "oc"]
    neutral = "1.0" if op == "cumprod" else "0.0"
    lines = ["    rows = tl.program_id(0) * BR + tl.arange(0, BR)", "    rmask = rows < R"]
    lines += decompose("rows", [f"{s}_n" for s in os_], os_, "    ")
    lines += [f"    xb = {offset(os_, [f'x_{s}' for s in os_], 'rows')}",
              f"    ob = {offset(os_, [f'o_{s}' for s in os_], 'rows')}",
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
    return jit(name, src)


LAUNCHER = '''

def _scan(x, dim, dtype, BR=None, BC=None):
    """(out, grid, args, meta) of a cumulative sum / product along `dim`."""
    r = x.dim()
    dim = dim % r
    others = [i for i in range(r) if i != dim]
    out = torch.empty(x.shape, dtype=dtype, device=x.device)
    R = math.prod(x.shape[i] for i in others)
    C = x.shape[dim]
    BC = BC or min(128, triton.next_power_of_2(max(C, 1)))
    gpu = BR or _per_program(R, 1, min(256, 2048 // BC))
    BR = BR or (max(1, min(256, 8192 // BC)) if x.device.type == "cpu" else gpu)
    grid = _on_gpu((max(1, triton.cdiv(R, BR)),), (max(1, triton.cdiv(R, gpu)),))
    return out, grid, (out, x, R, C, *[x.shape[i] for i in others], *[x.stride(i) for i in others],
                       *[out.stride(i) for i in others], x.stride(dim), out.stride(dim)), {"BR": BR, "BC": BC}
'''


@emits("scan")
def scan(fw: "Forward", v: int) -> str:
    n = fw.nodes[v]
    name = fw.kernel(scan_kernel(n.attrs["fn"], len(n.shape) - 1))
    fw.launcher("_scan", LAUNCHER)
    return fw.launch(v, name, f"_scan({fw.tensor(n.args[0])}, {n.attrs['dim']}, {fw.dtype(v)})")
