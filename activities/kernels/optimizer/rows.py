"""The `rows` rewrite: a row computation in one launch. The compiler launches every reduction on its own and every
pointwise node that consumes one (softmax: amax, then sum(exp(x - max)), then exp(x - max) / sum: three launches,
each reading the row from DRAM again). Here the reductions over one set of dims of one shape, and the pointwise
nodes between and after them, become one `rows` node: one kernel whose program owns BR rows and loops over their
columns once per level of dependent reductions, then once more to write the output (re-reads within the launch
hit the cache). Two patterns get one loop for two reductions:

* online softmax (and log-softmax, logsumexp): `amax(e)` and `sum(exp(e - amax(e)))` in one loop, the running
  sum rescaled whenever the running max grows (Milakov & Gimelshein, "Online normalizer calculation for softmax");
* one-read norms: `mean(e)` and `mean((e - mean(e))^2)` in one loop by Welford's update, chunks merged with Chan's
  parallel formula (layer, batch, group, instance norm).

A region qualifies when it has one output (its other values are used only inside it), its reductions keep their
dims (or the reduction is the output), its pointwise nodes have the full shape or the per-row shape, its inputs
broadcast to the full shape, and it replaces at least two launches.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from activities.kernels.compiler.blocks.common import INTERPRETER_TILE, decompose, jit, kernel_name, offset
from activities.kernels.compiler.expr import expression, extreme, maximum, minimum, num
from activities.kernels.compiler.graph import Const, Node, Scalar, Sym
from activities.kernels.compiler.registry import emits
from activities.kernels.optimizer import reaches, rewrite

if TYPE_CHECKING:
    from activities.kernels.compiler.forward import Forward
    from activities.kernels.compiler.graph import Graph

ROW_FNS = frozenset({"sum", "mean", "amax", "amin", "logsumexp"})
INIT = {"sum": "0.0", "mean": "0.0", "amax": '-float("inf")', "amin": 'float("inf")'}


@dataclass
class Region:
    shape: list[int]
    dims: list[int]
    nodes: set[int]
    out: int


@rewrite("rows", order=10, summary="one launch per row computation: online softmax, one-read norms")
def rows(graph: Graph) -> Graph | None:
    """Every qualifying row region becomes one `rows` node (None: the graph has none). A region whose operands,
    once the others are nodes, include a per-row value it cannot broadcast is left as it was."""
    regions = find_regions(graph)
    while regions:
        rewritten = _substitute(copy.deepcopy(graph), regions)
        bad = [r for r in regions if not all(_broadcasts(rewritten.nodes[a].shape, r.shape)
                                             for a in rewritten.nodes[r.out].args)]
        if not bad:
            return rewritten
        regions = [r for r in regions if r not in bad]
    return None


def _substitute(graph: Graph, regions: list[Region]) -> Graph:
    """Each region's output node replaced by its `rows` node, whose operands are read once every region is a
    node: one region's output may be another's operand."""
    originals = {region.out: graph.nodes[region.out] for region in regions}
    for region in regions:
        original = originals[region.out]
        graph.nodes[region.out] = Node(
            op="rows", args=[], shape=list(original.shape), dtype=original.dtype, sizes=list(original.sizes),
            attrs={"region": sorted(region.nodes), "shape": region.shape, "dims": region.dims,
                   "out_node": copy.deepcopy(original)})
    for region in regions:
        node, graph.nodes[region.out] = graph.nodes[region.out], originals[region.out]
        node.args, graph.nodes[region.out] = leaves_of(graph, region), node
    return graph


def find_regions(graph: Graph) -> list[Region]:
    users = graph.users()
    outputs = set(graph.outputs)
    alive = graph.needed()  # an earlier rewrite may have left nodes no output needs
    taken: set[int] = set()
    found = []
    for seed, node in enumerate(graph.nodes):
        if seed in taken or seed not in alive or node.op != "reduce" or node.attrs.get("fn") not in ROW_FNS:
            continue
        src = node.args[0]
        if not isinstance(src, int):
            continue
        shape = list(graph.nodes[src].shape)
        dims = sorted({int(d) % max(len(shape), 1) for d in node.attrs["dims"]})
        region = _grow(graph, seed, shape, dims, taken)
        exits = [n for n in region if n in outputs or any(u not in region for u in users[n])]
        if len(exits) != 1 or not _qualifies(graph, region, exits[0], shape, dims):
            continue
        taken |= region
        found.append(Region(shape=shape, dims=dims, nodes=region, out=exits[0]))
    return found


def _kept(shape: list[int], dims: list[int]) -> list[int]:
    return [1 if j in dims else s for j, s in enumerate(shape)]


def _dropped(shape: list[int], dims: list[int]) -> list[int]:
    return [s for j, s in enumerate(shape) if j not in dims]


def _row_reduce(node: Node, shape: list[int], dims: list[int], graph: Graph) -> bool:
    src = node.args[0] if node.args else None
    return (node.op == "reduce" and node.attrs.get("fn") in ROW_FNS and isinstance(src, int)
            and list(graph.nodes[src].shape) == shape
            and sorted({int(d) % max(len(shape), 1) for d in node.attrs["dims"]}) == dims)


def _grow(graph: Graph, seed: int, shape: list[int], dims: list[int], taken: set[int]) -> set[int]:
    """The seed reduction and every later pointwise node or same-dims reduction that uses the region's values."""
    region = {seed}
    per_row = (_kept(shape, dims), _dropped(shape, dims))
    for i in range(seed + 1, len(graph.nodes)):
        node = graph.nodes[i]
        if i in taken or not any(isinstance(a, int) and a in region for a in node.args):
            continue
        if any(isinstance(a, int) and a not in region and reaches(graph, a, region) for a in node.args):
            continue  # it also needs a value computed from the region outside it (another reduction's): a consumer
        if node.op == "pw" and (list(node.shape) == shape or list(node.shape) in per_row):
            region.add(i)
        elif _row_reduce(node, shape, dims, graph):
            region.add(i)
    return region



def _qualifies(graph: Graph, region: set[int], out: int, shape: list[int], dims: list[int]) -> bool:
    """One launch must replace at least two; a value without its reduced dims (keepdim=False) is only combined
    with per-row values (a full-shape value would broadcast it along the wrong dims), unless nothing is kept (a
    scalar); and every input broadcasts to the full shape."""
    reduces = [n for n in region if graph.nodes[n].op == "reduce"]
    if len(reduces) + (1 if graph.nodes[out].op == "pw" else 0) < 2:  # a pointwise consumer is a launch too
        return False
    dropped, kept = _dropped(shape, dims), _kept(shape, dims)
    if dropped != kept and dropped:
        for n in region:
            node = graph.nodes[n]
            takes_dropped = any(isinstance(a, int) and a in region and list(graph.nodes[a].shape) == dropped
                                for a in node.args)
            if takes_dropped and list(node.shape) != dropped and node.op == "pw":
                return False
            if node.op == "pw" and list(node.shape) == dropped and any(
                    isinstance(a, int) and list(graph.nodes[a].shape) == shape for a in node.args):
                return False
    return all(_broadcasts(graph.nodes[a].shape, shape) for a in leaves_of(graph, Region(shape, dims, region, out)))


def _broadcasts(leaf: list[int], shape: list[int]) -> bool:
    """Does `leaf` broadcast to `shape` by numpy's rules (a per-row value without its reduced dims does not: it
    would line up with the wrong dims)?"""
    return len(leaf) <= len(shape) and all(s in (1, f) for s, f in zip(leaf[::-1], shape[::-1]))


def leaves_of(graph: Graph, region: Region) -> list[int]:
    """The tensors the region reads: every non-pointwise value outside it, through the pointwise chains that
    produce its nodes' operands (those are computed in the kernel)."""
    found: list[int] = []
    seen: set[int] = set()

    def visit(v: Any) -> None:
        if not isinstance(v, int) or v in seen:
            return
        seen.add(v)
        node = graph.nodes[v]
        if v in region.nodes or node.op == "pw":
            for a in node.args:
                visit(a)
        elif v not in found:
            found.append(v)

    for n in sorted(region.nodes):
        for a in graph.nodes[n].args:
            visit(a)
    return found


# --- the emitter ---------------------------------------------------------------------------------------------


@emits("rows")
def emit_rows(fw: Forward, v: int) -> str:
    kernel = _RowKernel(fw, v)
    source = kernel.source()
    name = fw.kernel(jit(kernel_name("rows", source), source))
    fw.launcher("_interpreter_tile", INTERPRETER_TILE)
    fw.launcher("_rows", LAUNCHER)
    at = fw.nodes[v].attrs
    out = at["out_node"]
    per_row = _is_row(list(out.shape), at["shape"], at["dims"]) or out.op == "reduce"
    keepdim = len(out.shape) == len(at["shape"])
    leaves = ", ".join(fw.tensor(leaf) for leaf in kernel.leaves)
    return fw.launch(v, name, f"_rows([{leaves}], [{', '.join(kernel.scalars)}], {at['dims']}, {per_row}, "
                              f"{keepdim}, {fw.dtype(v)})")


def _is_row(shape: list[int], full: list[int], dims: list[int]) -> bool:
    """A per-row shape: the full shape with the reduced dims at 1 (or left out)."""
    return shape != full and (len(shape) != len(full) or all(shape[j] == 1 for j in dims))


class _RowKernel:
    """The source of one `rows` kernel: per level of dependent reductions one loop over the columns, then the
    output loop (an elementwise output) or a per-row store."""

    def __init__(self, fw: Forward, v: int):
        self.fw, self.v = fw, v
        at = fw.nodes[v].attrs
        self.region: set[int] = set(at["region"])
        self.shape, self.dims = list(at["shape"]), list(at["dims"])
        self.out_node: Node = at["out_node"]
        self.leaves: list[int] = list(fw.nodes[v].args)
        self.scalars: list[str] = []
        self.kept = [j for j in range(len(self.shape)) if j not in self.dims]
        self.level: dict[int, int] = {}
        self.lines: list[str] = []
        self.rows_done: dict[int, str] = {}
        """Reductions computed before the current loop: node id -> variable."""
        self.loop = 0
        """The loop being written (its value names are its own: Triton types a name once per scope)."""

    def node(self, i: int) -> Node:
        return self.out_node if i == self.v else self.fw.nodes[i]

    # -- analysis -------------------------------------------------------------------------------------------

    def reduces(self) -> list[int]:
        return sorted(n for n in self.region if self.node(n).op == "reduce")

    def depends(self, v: Any) -> set[int]:
        """The region's reductions value v depends on."""
        if not isinstance(v, int) or (v not in self.region and self.node(v).op != "pw"):
            return set()
        node = self.node(v)
        if node.op == "reduce" and v in self.region:
            return {v}
        return set().union(*(self.depends(a) for a in node.args)) if node.args else set()

    def levels(self) -> dict[int, int]:
        levels: dict[int, int] = {}
        for r in self.reduces():
            deps = self.depends(self.node(r).args[0])
            levels[r] = 1 + max((levels[d] for d in deps), default=0)
        return levels

    def online_pairs(self) -> dict[int, tuple[str, int]]:
        """Reductions computed in the loop of another: sum(exp(e - amax(e))) with its amax ("softmax"), and
        mean((e - mean(e))^2) with its mean ("welford"): reduction id -> (pattern, partner id)."""
        pairs: dict[int, tuple[str, int]] = {}
        for r in self.reduces():
            node = self.node(r)
            inner = node.args[0]
            if node.attrs["fn"] == "sum" and self._is_pw(inner, "exp"):
                sub = self.node(inner).args[0]
                if self._is_pw(sub, "sub"):
                    e, m = self.node(sub).args
                    if self._is_reduce(m, "amax") and self.node(m).args[0] == e and m not in pairs:
                        pairs[r] = ("softmax", m)
            if node.attrs["fn"] == "mean" and self._is_pw(inner, "mul"):
                d1, d2 = self.node(inner).args
                if d1 == d2 and self._is_pw(d1, "sub"):
                    e, m = self.node(d1).args
                    if (self._is_reduce(m, "mean") and self.node(m).args[0] == e
                            and not self.node(m).attrs.get("correction") and m not in pairs):
                        pairs[r] = ("welford", m)
        return pairs

    def _is_pw(self, v: Any, fn: str) -> bool:
        return isinstance(v, int) and self.node(v).op == "pw" and self.node(v).attrs.get("fn") == fn

    def _is_reduce(self, v: Any, fn: str) -> bool:
        return isinstance(v, int) and v in self.region and self.node(v).op == "reduce" and self.node(v).attrs["fn"] == fn

    # -- expressions ------------------------------------------------------------------------------------------

    def expr(self, v: Any, memo: dict, body: list[str], loads: set[int]) -> tuple[str, bool]:
        """(code, per element?) of value v inside a loop over the columns: `memo` holds this loop's lines."""
        if isinstance(v, Const):
            return num(v.value), False
        if isinstance(v, (Scalar, Sym)):
            code = f"inputs[{v.index}]" if isinstance(v, Scalar) else self.fw.size(v.expr)
            if code not in self.scalars:
                self.scalars.append(code)
            return f"s{self.scalars.index(code)}", False
        if v in self.rows_done:
            return self.rows_done[v], False
        if v in memo:
            return memo[v]
        node = self.node(v)
        if node.op == "pw" and (v in self.region or v not in self.leaves):
            parts = [self.expr(a, memo, body, loads) for a in node.args]
            elem = any(p[1] for p in parts)
            codes = [f"{c}[:, None]" if elem and not e and not _const(c) else c for c, e in parts]
            name = f"e{self.loop}_{len(body)}"
            body.append(f"{name} = {expression(node.attrs['fn'], node.attrs.get('attrs', {}), codes, node.args)}")
            memo[v] = (name, elem)
            return memo[v]
        k = self.leaves.index(v)
        loads.add(k)
        memo[v] = (f"x{k}", True)
        return memo[v]

    # -- source -----------------------------------------------------------------------------------------------

    def source(self) -> str:
        nl = len(self.leaves)
        ks = [f"k{j}" for j in range(len(self.kept))]
        rs = [f"r{j}" for j in range(len(self.dims))]
        levels = self.levels()
        pairs = self.online_pairs()
        lines = ["    rows = tl.program_id(0) * BR + tl.arange(0, BR)", "    rmask = rows < R"]
        lines += decompose("rows", [f"{s}_n" for s in ks], ks, "    ")
        for k in range(nl):
            lines.append(f"    base{k} = {offset(ks, [f'l{k}_{s}' for s in ks], 'rows')}")
        lines.append(f"    obase = {offset(ks, [f'o_{s}' for s in ks], 'rows')}")
        for level in sorted(set(levels.values())):
            todo = [r for r in self.reduces() if levels[r] == level and r not in pairs]
            partners = {r: p for r, p in pairs.items() if p[1] in todo}
            if todo:  # a level of online partners only was computed in its partner's loop
                lines += self._loop(todo, partners, rs)
        self._output(lines, rs)
        args = ["out_ptr"] + [f"l{k}_ptr" for k in range(nl)] + [f"s{k}" for k in range(len(self.scalars))]
        args += ["R", "C"] + [f"{s}_n" for s in ks + rs] + [f"l{k}_{s}" for k in range(nl) for s in ks + rs]
        args += [f"o_{s}" for s in ks + rs]
        return ("def KERNEL(" + ", ".join(args) + ", BR: tl.constexpr, BC: tl.constexpr):\n"
                + "\n".join(lines) + "\n")

    def _column_loop_head(self, rs: list[str]) -> list[str]:
        head = ["    for c0 in range(0, C, BC):", "        cols = c0 + tl.arange(0, BC)",
                "        m2 = rmask[:, None] & (cols < C)[None, :]"]
        return head + decompose("cols", [f"{s}_n" for s in rs], rs, "        ")

    def _loads(self, loads: set[int], rs: list[str]) -> list[str]:
        return [f"        x{k} = tl.load(l{k}_ptr + base{k}[:, None] + ({offset(rs, [f'l{k}_{s}' for s in rs], 'cols')})"
                f"[None, :], mask=m2, other=0.0).to(tl.float32)" for k in sorted(loads)]

    def _loop(self, todo: list[int], partners: dict[int, tuple[str, int]], rs: list[str]) -> list[str]:
        """One loop over the columns accumulating `todo` (and their online partners)."""
        self.loop += 1
        memo: dict = {}
        body: list[str] = []
        loads: set[int] = set()
        init: list[str] = []
        step: list[str] = []
        done: list[str] = []
        for r in todo:
            node = self.node(r)
            fn = node.attrs["fn"]
            value, elem = self.expr(node.args[0], memo, body, loads)
            value = value if elem else f"({value})[:, None] + tl.zeros([BR, BC], dtype=tl.float32)"
            partner = next((p for p, (_, m) in partners.items() if m == r), None)
            pattern = partners[partner][0] if partner is not None else ""
            if fn == "logsumexp" or pattern == "softmax":
                init += [f"    m{r} = tl.full([BR], -float(\"inf\"), dtype=tl.float32)",
                         f"    s{r} = tl.zeros([BR], dtype=tl.float32)"]
                step += [f"v{r} = tl.where(m2, {value}, -float(\"inf\"))",
                         f"n{r} = tl.maximum(m{r}, tl.max(v{r}, axis=1))",
                         f"s{r} = s{r} * tl.exp(m{r} - n{r}) + tl.sum(tl.exp(v{r} - n{r}[:, None]), axis=1)",
                         f"m{r} = n{r}"]
                if fn == "logsumexp":
                    done.append(f"    red{r} = m{r} + tl.log(s{r})")
                else:
                    done.append(f"    red{r} = m{r}")
                    done.append(f"    red{partner} = s{r}")
            elif pattern == "welford":
                init += [f"    c{r} = tl.zeros([BR], dtype=tl.float32)", f"    mu{r} = tl.zeros([BR], dtype=tl.float32)",
                         f"    q{r} = tl.zeros([BR], dtype=tl.float32)"]
                step += [f"n{r} = tl.sum(m2.to(tl.float32), axis=1)",
                         f"v{r} = tl.where(m2, {value}, 0.0)",
                         f"b{r} = tl.sum(v{r}, axis=1) / tl.maximum(n{r}, 1.0)",
                         f"d{r} = tl.where(m2, v{r} - b{r}[:, None], 0.0)",
                         f"t{r} = c{r} + n{r}",
                         f"g{r} = b{r} - mu{r}",
                         f"mu{r} = mu{r} + g{r} * n{r} / tl.maximum(t{r}, 1.0)",
                         f"q{r} = q{r} + tl.sum(d{r} * d{r}, axis=1) + g{r} * g{r} * c{r} * n{r} / tl.maximum(t{r}, 1.0)",
                         f"c{r} = t{r}"]
                corr = float(self.node(partner).attrs.get("correction", 0.0))
                done += [f"    red{r} = mu{r}", f"    red{partner} = q{r} / (C - {num(corr)})"]
            elif fn in ("amax", "amin"):  # NaN wins, as in torch (`expr.maximum`)
                op = maximum if fn == "amax" else minimum
                init.append(f"    a{r} = tl.full([BR, BC], {INIT[fn]}, dtype=tl.float32)")
                step.append(f"a{r} = {op(f'a{r}', f'tl.where(m2, {value}, {INIT[fn]})')}")
                done.append(f"    red{r} = {extreme('max' if fn == 'amax' else 'min', f'a{r}', 1)}")
            else:
                init.append(f"    a{r} = tl.zeros([BR, BC], dtype=tl.float32)")
                step.append(f"a{r} += tl.where(m2, {value}, 0.0)")
                scale = f" / (C - {num(float(node.attrs.get('correction', 0.0)))})" if fn == "mean" else ""
                done.append(f"    red{r} = tl.sum(a{r}, axis=1){scale}")
        lines = init + self._column_loop_head(rs) + self._loads(loads, rs)
        lines += ["        " + b for b in body + step] + done
        for r in todo:
            self.rows_done[r] = f"red{r}"
            partner = next((p for p, (_, m) in partners.items() if m == r), None)
            if partner is not None:
                self.rows_done[partner] = f"red{partner}"
        return lines

    def _output(self, lines: list[str], rs: list[str]) -> None:
        out = self.v
        self.loop += 1
        memo: dict = {}
        body: list[str] = []
        loads: set[int] = set()
        if self.node(out).op == "reduce":
            lines.append(f"    tl.store(out_ptr + obase, {self.rows_done[out]}, mask=rmask)")
            return
        value, elem = self.expr(out, memo, body, loads)
        if not elem:  # a per-row value
            lines += ["    " + b for b in body] + [f"    tl.store(out_ptr + obase, {value}, mask=rmask)"]
            return
        lines += self._column_loop_head(rs) + self._loads(loads, rs) + ["        " + b for b in body]
        lines.append(f"        tl.store(out_ptr + obase[:, None] + ({offset(rs, [f'o_{s}' for s in rs], 'cols')})"
                     f"[None, :], {value}, mask=m2)")


def _const(code: str) -> bool:
    return code.replace(".", "", 1).replace("-", "", 1).replace("e", "", 1).isdigit() or code.startswith(("float(", "-float("))


LAUNCHER = '''

def _rows(leaves, scalars, dims, per_row, keepdim, dtype, BR=None, BC=None):
    """(out, grid, args, meta) of a row kernel: rows are the kept dims of the leaves' broadcast shape, columns the
    reduced ones (strided); the output is per element, or per row (keepdim or not)."""
    shape = tuple(torch.broadcast_shapes(*[t.shape for t in leaves]))
    r = len(shape)
    dims = sorted({d % r for d in dims}) if dims else list(range(r))
    kept = [i for i in range(r) if i not in dims]
    views = [t.expand(shape) for t in leaves]
    R = math.prod(shape[i] for i in kept)
    C = math.prod(shape[i] for i in dims)
    cpu = leaves[0].device.type == "cpu"
    if per_row:  # one value per row, rows in order: strides of the kept dims' contiguous layout
        out = torch.empty(R, dtype=dtype, device=leaves[0].device)
        result = out.reshape([1 if i in dims else shape[i] for i in range(r)] if keepdim else [shape[i] for i in kept])
        ostrides = [math.prod(shape[j] for j in kept[k + 1:]) for k in range(len(kept))] + [0] * len(dims)
    else:
        out = torch.empty(shape, dtype=dtype, device=leaves[0].device)
        result = out
        ostrides = [out.stride(i) for i in kept + dims]
    gbc = BC or min(1024, triton.next_power_of_2(max(C, 1)))
    gbr = BR or _per_program(R, 1, max(1, 1024 // gbc))  # the GPU's rows per program: the grid fills the SMs
    if cpu:  # the interpreter pays per program: as many rows as 4096 lanes hold
        BC = BC or min(128, triton.next_power_of_2(max(C, 1)))
        BR, BC = _interpreter_tile(R, C, BR or max(1, 4096 // BC), BC, 4096)
    else:
        BR, BC = gbr, gbc
    strides = [v.stride(i) for v in views for i in kept + dims]
    grid = _on_gpu((max(1, triton.cdiv(R, BR)),), (max(1, triton.cdiv(R, gbr)),))
    return result, grid, (out, *views, *scalars, R, C, *[shape[i] for i in kept + dims], *strides, *ostrides), \\
        {"BR": BR, "BC": BC}
'''
