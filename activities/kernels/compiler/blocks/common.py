"""Index arithmetic the kernel generators share: names keyed by source, flat index decomposition, strided offsets."""

from __future__ import annotations

import hashlib

IEEE_DOT, TF32_DOT = 'input_precision="ieee"', 'input_precision="tf32"'
"""How the matmul and conv blocks' `tl.dot` computes on fp32 operands: IEEE fp32 as written; TF32 (the tensor cores'
10-bit mantissa, as cuBLAS and cuDNN compute when allowed) where the job's precision policy allows it
(`Forward(tf32=True)` rewrites the one into the other)."""


def kernel_name(prefix: str, source: str) -> str:
    """A kernel name unique to its source (two graphs' kernels never collide, equal ones are written once)."""
    return f"{prefix}_{hashlib.sha256(source.encode()).hexdigest()[:8]}"


def jit(name: str, source: str) -> tuple[str, str]:
    """(name, source) of a generated `def KERNEL(...)` with its name filled in, decorated @triton.jit."""
    return name, "@triton.jit\n" + source.replace("KERNEL", name, 1)


def decompose(var: str, sizes: list[str], names: list[str], indent: str) -> list[str]:
    """Lines splitting flat index `var` into `names` over `sizes` (last fastest)."""
    if not names:
        return []
    rem = f"rem_{var}"  # one name per index: the compiler refuses a variable whose type changes in a loop
    lines = [f"{indent}{rem} = {var}"]
    for k in range(len(names) - 1, 0, -1):
        lines += [f"{indent}{names[k]} = {rem} % {sizes[k]}", f"{indent}{rem} = {rem} // {sizes[k]}"]
    lines.append(f"{indent}{names[0]} = {rem}")
    return lines


def offset(idx: list[str], strides: list[str], zero: str) -> str:
    """sum(idx[k] * strides[k]) (or `zero * 0` for rank 0, keeping the index's shape)."""
    return " + ".join(f"{i} * {s}" for i, s in zip(idx, strides)) or f"{zero} * 0"


GPU_GRID = '''

class _Grid(tuple):
    """A launch's grid that also carries `gpu`: how many programs the same launch takes on a GPU."""


def _on_gpu(grid, gpu_grid):
    """`grid`, the one this launch runs, marked with the program count of `gpu_grid`, the one a GPU runs. The
    interpreter pays per program, so on the CPU the launchers run fewer, larger programs than a GPU's; the cost
    model reads the GPU's count (activities/kernels/traffic.py), which sets the share of the SMs a launch fills."""
    marked = _Grid(grid)
    marked.gpu = math.prod(gpu_grid)
    return marked


def _per_program(n, lo, hi):
    """Units of work per program on a GPU for n units: the largest power of two that still gives each SM of a big
    GPU (132 on an H100) two programs, within [lo, hi]."""
    return max(lo, min(hi, 1 << max(0, (n // 256).bit_length() - 1)))
'''
"""The launchers' shared helpers for the GPU's grid (registered with any launcher that calls `_on_gpu`:
`Forward.launcher`). Block sizes on a GPU come from the shapes at run time, so held-out sizes get theirs too."""


INTERPRETER_TILE = '''

def _interpreter_tile(R, C, BR, BC, budget):
    """(BR, BC) of a row-by-column tile under the CPU interpreter, which pays per block operation whatever its
    width: the rows a program's tile would leave empty (fewer than BR rows in all) go to columns, up to `budget`
    lanes. The grid, cdiv(R, BR) programs, stays the same, and so does the launch's modeled cost."""
    br = min(BR, triton.next_power_of_2(max(R, 1)))
    return br, max(BC, min(triton.next_power_of_2(max(C, 1)), budget // br))
'''
"""A launcher helper the row kernels share (reductions, the optimizer's `rows`): GroupNorm over 24 groups of 61,250
values ran 479 loop steps of 128 columns per pass; with the tile widened, 15 of 4,096."""
