"""Registered rewrites over the lowered graph, run in order after the reader (after Olive's registered passes).
A pass takes the Graph and returns it (rewritten in place or new); it must keep what the graph computes.
Rewrites that need to see a kernel run (block sizes, one-pass rows) belong to the optimizer, which verifies
each again; a pass here is exact by construction.

    @graph_pass("common_subexpressions", order=10)
    def cse(graph: Graph) -> Graph: ...
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from activities.kernels.compiler.graph import Graph

IMPURE = frozenset({"random"})
"""Node ops that are never merged: two draws are two draws."""


@dataclass(frozen=True)
class GraphPass:
    name: str
    order: int
    fn: Callable[[Graph], Graph]


PASSES: dict[str, GraphPass] = {}


def graph_pass(name: str, *, order: int) -> Callable:
    def register(fn: Callable[[Graph], Graph]) -> Callable[[Graph], Graph]:
        if name in PASSES:
            raise ValueError(f"graph pass {name} registered twice")
        PASSES[name] = GraphPass(name=name, order=order, fn=fn)
        return fn

    return register


def run(graph: Graph) -> Graph:
    """Every registered pass, lowest order first."""
    for p in sorted(PASSES.values(), key=lambda p: (p.order, p.name)):
        graph = p.fn(graph)
    return graph


@graph_pass("common_subexpressions", order=10)
def common_subexpressions(graph: Graph) -> Graph:
    """Nodes computing the same op of the same args (decompositions repeat themselves: a norm's mean, the
    reference's own repeats) become one, so the emitter writes and launches it once."""
    same: dict[int, int] = {}
    seen: dict[str, int] = {}
    for i, n in enumerate(graph.nodes):
        n.args = [same.get(a, a) if isinstance(a, int) else a for a in n.args]
        if n.op in IMPURE:
            continue
        key = repr((n.op, n.args, sorted(n.attrs.items()), n.shape, n.dtype))
        if key in seen:
            same[i] = seen[key]
        else:
            seen[key] = i
    graph.outputs = [same.get(o, o) for o in graph.outputs]
    return graph


@graph_pass("reshape_chains", order=20)
def reshape_chains(graph: Graph) -> Graph:
    """A reshape of a reshape reads the first one's input (the elements keep their order, so it is the same
    reshape): minGPT's `y.transpose(1, 2).contiguous().view(B, T, C)` then a Linear's `view(-1, C)` is one
    reshape of the permuted heads, which the matmul can read in place (`_merged`) where two would copy."""
    for n in graph.nodes:
        while n.op == "view" and n.attrs.get("kind") == "reshape" and isinstance(n.args[0], int):
            src = graph.nodes[n.args[0]]
            if not (src.op == "view" and src.attrs.get("kind") == "reshape"):
                break
            n.args = [src.args[0], *n.args[1:]]
            n.attrs = {**n.attrs, "src": list(src.attrs["src"])}
    return graph
