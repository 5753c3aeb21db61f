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


@graph_pass("view_chains", order=30)
def view_chains(graph: Graph) -> Graph:
    """A run of reshapes and permutes that starts with a reshape, passes a permute and ends with a reshape is
    written as x split into every factor the run needs, one permute of those factors, and one reshape merging them.
    The split and the permute are always views, so torch copies at most once, at the merge, and only where no view
    exists (where a kernel reads the result, `_merged` indexes it in place). nn.MultiheadAttention's fast path
    splits heads as `q.reshape(T, B * H, hd).transpose(0, 1).view(B, H, T, hd)`: a copy at the first reshape,
    though the whole run is the view `q.view(T, B, H, hd).permute(1, 2, 0, 3)`."""
    users = graph.users()
    done: set[int] = set()
    for last in reversed(range(len(graph.nodes))):
        chain = _view_run(graph, last, users) if last not in done else None
        if chain is None or not _is_kind(graph.nodes[chain[0]], "reshape"):
            continue
        permutes = [v for v in chain if _is_kind(graph.nodes[v], "permute")]
        x = graph.nodes[chain[0]].args[0]
        steps = [(n.attrs["kind"], n.attrs.get("perm") or n.shape, n.sizes) for n in (graph.nodes[v] for v in chain)]
        composed = compose_views(graph.nodes[x].shape, graph.nodes[x].sizes, steps) if permutes else None
        if composed is None:
            continue
        split, split_sizes, perm = composed
        first, middle, end = graph.nodes[chain[0]], graph.nodes[permutes[0]], graph.nodes[last]
        first.shape, first.sizes = split, split_sizes
        first.attrs = {"kind": "reshape", "src": list(graph.nodes[x].shape)}
        middle.args, middle.shape = [chain[0]], [split[p] for p in perm]
        middle.sizes = [split_sizes[p] for p in perm] if split_sizes else []
        middle.attrs = {"kind": "permute", "perm": perm}
        end.args, end.attrs = [permutes[0]], {"kind": "reshape", "src": list(middle.shape)}
        done |= set(chain)
    return graph


@graph_pass("pool_chains", order=35)
def pool_chains(graph: Graph) -> Graph:
    """A pool of a pool, both unpadded and undilated and of one kind, is one pool of kernel s1 * (k2 - 1) + k1 and
    stride s1 * s2 over the first one's input (the same output sizes, floor division throughout): a max of maxes is
    the max over the union of their windows; an average of averages is the average over it where the first pool's
    windows do not overlap (k1 = s1), so every element counts once. L2 72 and 78 pool twice after a convolution:
    one launch and one intermediate tensor less."""
    users = graph.users()
    for i, n in enumerate(graph.nodes):
        first = graph.nodes[n.args[0]] if n.op == "pool" and isinstance(n.args[0], int) else None
        if (first is None or first.op != "pool" or users[n.args[0]] != [i] or n.args[0] in graph.outputs
                or first.attrs["kind"] != n.attrs["kind"] or not (_plain_pool(first) and _plain_pool(n))):
            continue
        (k1, s1), (k2, s2) = ((p.attrs["kernel"], p.attrs["stride"]) for p in (first, n))
        if n.attrs["kind"] == "avg" and k1 != s1:
            continue
        n.args = list(first.args)
        n.attrs = {**n.attrs, "kernel": [a * (b - 1) + c for a, b, c in zip(s1, k2, k1)],
                   "stride": [a * b for a, b in zip(s1, s2)]}
    return graph


def _plain_pool(node) -> bool:  # noqa: ANN001 - a graph Node
    a = node.attrs
    return (not any(a["padding"]) and all(x == 1 for x in a["dilation"]) and not a["ceil_mode"]
            and not a.get("divisor"))


@graph_pass("scan_forms", order=40)
def scan_forms(graph: Graph) -> Graph:
    """A reversed or an exclusive cumulative sum written in torch's ops becomes one scan that reads its input that
    way: `cumsum(x.flip(d), d).flip(d)` sums from the end (`reverse`), `cat([zeros, cumsum(x[..., :-1], d)], d)`
    starts one place later (`shift`). Each form was two or three launches, every one a pass over the tensor."""
    users = graph.users()

    def only_for(v: object, user: int) -> bool:
        return isinstance(v, int) and users[v] == [user] and v not in graph.outputs

    def plain_scan(v: int, d: int) -> bool:
        s = graph.nodes[v]
        return (s.op == "scan" and s.attrs["dim"] % len(s.shape) == d and not s.attrs.get("reverse")
                and not s.attrs.get("shift"))

    def flips_only(node, d: int) -> bool:  # noqa: ANN001 - a graph Node
        return node.op == "flip" and [x % len(node.shape) for x in node.attrs["dims"]] == [d]

    for i, n in enumerate(graph.nodes):
        if n.op == "flip" and len(n.attrs["dims"]) == 1:
            d, scan = n.attrs["dims"][0] % len(n.shape), n.args[0]
            if not (only_for(scan, i) and plain_scan(scan, d) and only_for(graph.nodes[scan].args[0], scan)):
                continue
            s, inner = graph.nodes[scan], graph.nodes[graph.nodes[scan].args[0]]
            if flips_only(inner, d):
                n.op, n.args, n.attrs = "scan", list(inner.args), {**s.attrs, "dim": d, "reverse": True}
        elif n.op == "cat" and len(n.args) == 2 and all(isinstance(a, int) for a in n.args):
            d, (zeros, scan) = n.attrs["dim"] % len(n.shape), n.args
            z, s = graph.nodes[zeros], graph.nodes[scan]
            if (z.op == "zeros" and z.shape == [*n.shape[:d], 1, *n.shape[d + 1:]] and only_for(scan, i)
                    and plain_scan(scan, d) and s.attrs["fn"] == "cumsum" and s.dtype == n.dtype):
                n.op, n.args, n.attrs = "scan", list(s.args), {**s.attrs, "dim": d, "shift": 1}
    return graph


@graph_pass("unit_reductions", order=45)
def unit_reductions(graph: Graph) -> Graph:
    """A sum, mean, max, min or logsumexp that keeps its dims, over dims that are always 1, is its input: each
    reduces one element (x / 1, log(exp(x)) with x's own infinities and NaN). A dim is always 1 where the
    trace's size expression says so or an earlier reduction kept it (L2 44's second global average pool, L2 51's
    logsumexp over the channel the mean before it kept). A forward input stays behind its reduction: an output
    must not be the caller's own tensor."""
    same: dict[int, int] = {}
    for i, n in enumerate(graph.nodes):
        n.args = [same.get(a, a) if isinstance(a, int) else a for a in n.args]
        x = n.args[0] if n.op == "reduce" and n.args and isinstance(n.args[0], int) else None
        if (x is not None and graph.nodes[x].op not in ("input", "param") and n.attrs["keepdim"]
                and n.attrs["fn"] in ("sum", "mean", "amax", "amin", "logsumexp") and n.dtype == graph.nodes[x].dtype
                and all(_always_one(graph.nodes[x], d) for d in n.attrs["dims"])):
            same[i] = x
    graph.outputs = [same.get(o, o) for o in graph.outputs]
    return graph


def _always_one(node, d: int) -> bool:  # noqa: ANN001 - a graph Node
    if node.sizes:
        return node.sizes[d] == "1"
    return node.op == "reduce" and node.attrs["keepdim"] and d in node.attrs["dims"]


@graph_pass("dead_nodes", order=90)
def dead_nodes(graph: Graph) -> Graph:
    """Only the nodes an output needs are kept (renumbered in order): `torch.max(x, dim)` reads as values and indices
    though the forward keeps one, and a pass leaves what it replaced. The emitter writes only those already, but the
    optimizer's rewrites ask who reads a value, and a dead reader would make a value look used outside its region."""
    needed = graph.needed()
    if len(needed) == len(graph.nodes):
        return graph
    kept = sorted(needed)
    new = {old: i for i, old in enumerate(kept)}
    for old in kept:
        node = graph.nodes[old]
        node.args = [new[a] if isinstance(a, int) else a for a in node.args]
    graph.nodes = [graph.nodes[old] for old in kept]
    graph.outputs = [new[o] for o in graph.outputs]
    return graph


def _is_kind(node, kind: str) -> bool:  # noqa: ANN001 - a graph Node
    return node.op == "view" and node.attrs.get("kind") == kind


def _view_run(graph: Graph, last: int, users: dict[int, list[int]]) -> list[int] | None:
    """The reshapes and permutes that reshape `last` reads through, each read only by the next (oldest first), or
    None when `last` is not a reshape or the run is shorter than three."""
    if not _is_kind(graph.nodes[last], "reshape"):
        return None
    chain = [last]
    while True:
        v = graph.nodes[chain[0]].args[0]
        node = graph.nodes[v] if isinstance(v, int) else None
        if node is None or not (_is_kind(node, "reshape") or _is_kind(node, "permute")):
            break
        if users[v] != [chain[0]] or v in graph.outputs:
            break
        chain.insert(0, v)
    return chain if len(chain) >= 3 else None


def compose_views(src: list[int], src_sizes: list[str],
                  steps: list[tuple[str, list[int], list[str]]]) -> tuple[list[int], list[str], list[int]] | None:
    """A run of views over a tensor of shape `src` as (the split of `src` into factors, in its order; their size
    expressions, [] where none are known; the permutation of the factors), whose merge in that order gives the run's
    result. `steps` are (`permute`, perm, _) or (`reshape`, shape, its size expressions). None where a reshape cuts
    a factor unevenly, or a split factor's size expression is unknown while the trace has them (a size that varies
    with the inputs must not be written as the traced one)."""
    size: dict[int, int] = {}
    exprs: dict[int, str] = {}
    factors: list[list[int]] = []  # per dim of src, its factors in order
    for d, n in enumerate(src):
        factors.append([len(size)] if n != 1 else [])
        if n != 1:
            size[len(size)] = n
            if src_sizes:
                exprs[len(size) - 1] = src_sizes[d]
    dims = [list(f) for f in factors]
    for kind, arg, sizes in steps:
        if kind == "permute":
            dims = [dims[p] for p in arg]
            continue
        flat = [f for d in dims for f in d]
        dims = []
        for n in arg:
            mine: list[int] = []
            while n > 1:
                if not flat:
                    return None
                f = flat.pop(0)
                if size[f] <= n:
                    if n % size[f]:
                        return None
                    mine.append(f)
                    n //= size[f]
                    continue
                if size[f] % n:
                    return None
                outer, inner = len(size), len(size) + 1  # the new dim ends inside f: its outer part
                size[outer], size[inner] = n, size[f] // n
                group = next(g for g in factors if f in g)
                group[group.index(f):group.index(f) + 1] = [outer, inner]
                flat.insert(0, inner)
                mine.append(outer)
                n = 1
            dims.append(mine)
        if flat:
            return None
        for d, expr in zip(dims, sizes):
            if len(d) == 1:
                exprs[d[0]] = expr
    order = [f for g in factors for f in g]
    known = any(s for *_, s in steps) or bool(src_sizes)
    if known and any(len(g) > 1 and f not in exprs for g in factors for f in g):
        return None
    return ([size[f] for f in order], [exprs.get(f, str(size[f])) for f in order] if known else [],
            [order.index(f) for d in dims for f in d])
