"""The `blocks` rewrite: block sizes chosen from the shapes for a GPU. The compiler's launchers pick their block sizes
by device: large ones under the CPU interpreter (fewer, bigger programs run faster there), their GPU defaults on a
GPU. So a candidate verified on the CPU runs, and is modeled, with grids of a few programs, where a GPU spreads
the same work over its ~128 SMs. This rewrite writes each launch's sizes into its node (`attrs["blocks"]`, the
launcher's keyword overrides: `Forward.launch` passes them), sized so the grid fills the SMs before a program takes
more work, within the blocks' GPU ranges. It applies where that grows some launch's grid at least twofold.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

from activities.kernels.optimizer import live, rewrite

if TYPE_CHECKING:
    from activities.kernels.compiler.graph import Graph, Node

SMS = 128
"""About a datacenter GPU's SM count (H100 132, A100 108, L40S 142, B200 148)."""
GROWTH = 2
"""A launch's grid must grow this much for the rewrite to apply."""


def _pow2(n: float) -> int:
    return 1 << max(0, math.ceil(math.log2(max(1.0, n))))


def _clamp(v: int, lo: int, hi: int) -> int:
    return max(lo, min(hi, v))


def _cdiv(a: int, b: int) -> int:
    return -(-a // b)


def sizes(graph: Graph, node: Node) -> tuple[dict[str, int], int, int] | None:
    """(the launcher's block overrides, programs with them, programs with the interpreter's defaults) for a node
    whose block sizes matter, from its traced shapes; None for the others."""
    shape = list(node.shape)
    n = math.prod(shape) if shape else 1
    if node.op == "pw":
        block = _clamp(_pow2(n / SMS), 128, 1024)
        return {"BLOCK": block}, _cdiv(n, block), _cdiv(n, 4096)
    if node.op == "pool":
        block = _clamp(_pow2(n / SMS), 64, 256)
        return {"BLOCK": block}, _cdiv(n, block), _cdiv(n, 4096)
    if node.op in ("reduce", "scan"):
        src = graph.nodes[node.args[0]].shape if isinstance(node.args[0], int) else shape
        dims = node.attrs["dims"] if node.op == "reduce" else [node.attrs["dim"]]
        dims = {int(d) % max(len(src), 1) for d in dims}
        c = math.prod(s for j, s in enumerate(src) if j in dims) or 1
        r = max(1, math.prod(src) // c) if src else 1
        bc = min(64 if node.op == "reduce" else 128, _pow2(c))
        br = _clamp(_pow2(r / SMS), 1, max(1, 2048 // bc))
        cpu_bc = min(128, _pow2(c))
        return {"BR": br, "BC": bc}, _cdiv(r, br), _cdiv(r, max(1, min(256, 8192 // cpu_bc)))
    if node.op == "conv" and len(shape) > 2:
        m = shape[0] * math.prod(shape[2:])
        bm = _clamp(_pow2(m / SMS), 16, 64)
        return {"BM": bm, "BK": 32}, _cdiv(m, bm), _cdiv(m, _clamp(_pow2(m), 16, 512))
    return None


@rewrite("blocks", order=30, summary="block sizes from the shapes: grids that fill a GPU's SMs")
def blocks(graph: Graph) -> Graph | None:
    """Every launch's block sizes for a GPU (None: no grid would grow GROWTH-fold)."""
    grows = False
    for i in sorted(live(graph)):
        node = graph.nodes[i]
        target = graph.nodes[node.attrs["main"]] if node.op == "epilogue" else node
        chosen = sizes(graph, target)
        if chosen is None:
            continue
        overrides, gpu, cpu = chosen
        node.attrs["inner_blocks" if node.op == "epilogue" else "blocks"] = overrides  # an epilogue's are its product's
        grows = grows or gpu >= GROWTH * cpu
    return graph if grows else None
