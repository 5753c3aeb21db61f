"""The gather block: out[i] = x[i, idx[i]] (the pick of nll_loss)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from activities.kernels.compiler.registry import emits

if TYPE_CHECKING:
    from activities.kernels.compiler.forward import Forward

KERNEL = '''@triton.jit
def gather_kernel(x_ptr, idx_ptr, out_ptr, R, xs0, xs1, is0, BLOCK: tl.constexpr):
    rows = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = rows < R
    t = tl.load(idx_ptr + rows * is0, mask=mask, other=0)
    tl.store(out_ptr + rows, tl.load(x_ptr + rows * xs0 + t * xs1, mask=mask, other=0.0), mask=mask)
'''

LAUNCHER = '''

def _gather(x, idx, BLOCK=256):
    """(out, grid, args, meta) of x[i, idx[i]] for a 2-D x."""
    out = torch.empty(x.shape[0], dtype=x.dtype, device=x.device)
    return out, (triton.cdiv(x.shape[0], BLOCK),), (x, idx, out, x.shape[0], *x.stride(), idx.stride(0)), {"BLOCK": BLOCK}
'''


@emits("gather")
def gather(fw: "Forward", v: int) -> str:
    x, idx = (fw.tensor(a) for a in fw.nodes[v].args)
    fw.kernel(("gather_kernel", KERNEL))
    fw.launcher("_gather", LAUNCHER)
    return fw.launch(v, "gather_kernel", f"_gather({x}, {idx})")
