"""The `attention` rewrite: `softmax(chain(Q @ K)) @ V`, or `chain(Q @ K) @ V` with no softmax (ReLU attention), in
one kernel that never writes the scores (flash attention: Dao et al., "FlashAttention", 2022). The compiler launches
the scores' matmul, the softmax's three row kernels (or one after `rows`) and the second matmul, and the [batch,
queries, keys] scores go to DRAM and back between each: at a sequence of 1,024 that is 4 MiB per head where Q, K and
V are 256 KiB each.

Here a program owns a block of queries of one batch and loops over the keys in blocks: the score tile comes from a
`tl.dot`, gets the chain between the first matmul and the softmax (a scale, a causal mask: the epilogue rewrite's
`ChainExpr`, operands attached through the same reshapes), then the online softmax (running max and sum, the output
accumulator rescaled as the max grows) and the tile's `tl.dot` with V. A masked lane is -inf, so a block of keys a
query cannot see adds nothing; a row with no visible key ends 0/0 = NaN, as torch's softmax of an all -inf row (0 for
the safe softmax below).

The pattern is matched exactly: a batched matmul [B, M, N] whose chain ends in the value `x` a softmax over its last
dim reads (`amax`, `sub`, `exp`, `sum`, `div`: how softmax traces; `scaled_dot_product_attention` traces torch's safe
softmax, the max and the result guarded by `where(amax == -inf, 0, ...)`, so a row with no visible key is 0 there),
whose result, through reshapes, is the left operand of a batched matmul [B, M, D]; every value in between used only
there. The reshapes keep the last dim N, so softmax rows are the score matrix's rows. Without a softmax the chain's
last value is that operand itself (`relu(masked_fill(Q @ K * scale, ...))`, KernelBench L3 50), and each key block's
tile times V is summed, nothing rescaled. A Q or K that is `x * c` or `x / c` (a constant), perhaps through views,
used only by the first matmul (nn.MultiheadAttention scales q before `bmm(q, k^T)`; scaled_dot_product_attention's
math path scales both by sqrt(scale)) is read as `x`, and the kernel scales its tile as it loads it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING

from activities.kernels.compiler.blocks.common import IEEE_DOT, jit, kernel_name
from activities.kernels.compiler.graph import Const, Node
from activities.kernels.compiler.registry import emits
from activities.kernels.optimizer import reaches, rewrite
from activities.kernels.optimizer.epilogue import ChainExpr, chain_operands, product_chain

if TYPE_CHECKING:
    from activities.kernels.compiler.forward import Forward
    from activities.kernels.compiler.graph import Graph

REARRANGING = ("reshape", "permute", "expand", "unsqueeze", "squeeze", "select", "slice")
"""Views that only rearrange (or repeat) their input's elements: a constant scale commutes with each."""
PASSTHROUGH = ("reshape", "expand")
"""The views between the softmax and the second matmul (torch.bmm traces an expand to the same shape, then a
reshape to [B, M, N])."""


@rewrite("attention", order=5, summary="attention in one launch: the scores never leave the kernel")
def attention(graph: Graph) -> Graph | None:
    """Every matched `softmax(chain(Q @ K)) @ V` becomes one `attention` node (None: the graph has none)."""
    alive = graph.needed()
    users = {v: {u for u in us if u in alive} for v, us in graph.users().items()}
    """Each value's users among the nodes an output needs (an earlier pass can leave a dead twin of a guard)."""
    done = False
    for second, node in enumerate(graph.nodes):
        found = _match(graph, second, users) if node.op == "matmul" and second in alive else None
        if found is None:
            continue
        q, k = graph.nodes[found.first].args
        (q, qs), (k, ks) = (_prescaled(graph, t, found.first, users) for t in (q, k))
        prescale = {name: s for name, s in (("q", qs), ("k", ks)) if s}
        leaves = chain_operands(graph, found.chain, found.first)
        graph.nodes[second] = Node(op="attention", args=[q, k, node.args[1], *leaves], shape=list(node.shape),
                                   dtype=node.dtype, sizes=list(node.sizes),
                                   attrs={"first": found.first, "chain": sorted(found.chain), "score": found.score,
                                          "norm": found.norm, "prescale": prescale})
        done = True
    return graph if done else None


@dataclass(frozen=True)
class Match:
    first: int
    """The scores' matmul."""
    chain: set[int]
    score: int
    """The value the softmax reads; without a softmax, the second matmul's operand itself."""
    norm: str
    """`softmax`; `safe`: torch's safe softmax (scaled_dot_product_attention), a row with no visible key gives 0,
    not NaN; `none`: no softmax, the chain's value goes into the second matmul as it is."""


def _match(graph: Graph, second: int, users: dict[int, set[int]]) -> Match | None:
    """How matmul `second` computes softmax(chain(first matmul)) @ V or chain(first matmul) @ V, as the module
    docstring says; None when it does not (exactly)."""
    nodes = graph.nodes
    if len(nodes[second].shape) != 3 or nodes[second].dtype != "float32":
        return None
    pattern: set[int] = set()
    p = nodes[second].args[0]
    while isinstance(p, int) and nodes[p].op == "view" and nodes[p].attrs.get("kind") in PASSTHROUGH:
        if nodes[p].attrs["kind"] == "expand" and list(nodes[p].attrs["src"]) != list(nodes[p].shape):
            return None  # a broadcast, not a no-op
        pattern.add(p)
        p = nodes[p].args[0]
    if not isinstance(p, int):
        return None
    return _softmax(graph, second, p, pattern | {p}, users) or _plain(graph, second, p, pattern, users)


def _softmax(graph: Graph, second: int, p: int, pattern: set[int], users: dict[int, set[int]]) -> Match | None:
    """`softmax(chain(first matmul))` read by matmul `second` (through the views in `pattern`), or None."""
    nodes = graph.nodes
    guard = _guarded(nodes, p)  # the safe softmax: where(amax == -inf, 0, softmax)
    div = guard[1] if guard else p
    if not _pw(nodes[div], "div"):
        return None
    last = [len(nodes[div].shape) - 1]
    e, total = nodes[div].args
    if not (isinstance(e, int) and isinstance(total, int) and _pw(nodes[e], "exp")
            and _reduce(nodes[total], "sum", last) and nodes[total].args == [e]):
        return None
    sub = nodes[e].args[0]
    if not (isinstance(sub, int) and _pw(nodes[sub], "sub")):
        return None
    score, shift = nodes[sub].args
    shifted = _guarded(nodes, shift) if isinstance(shift, int) else None  # where(amax == -inf, 0, amax)
    top = shifted[1] if shifted else shift
    if not (isinstance(score, int) and isinstance(top, int) and _reduce(nodes[top], "amax", last)
            and nodes[top].args == [score]):
        return None
    if bool(guard) != bool(shifted) or any(nodes[g[0]].args[0] != top for g in (guard, shifted) if g):
        return None
    pattern |= {div, e, total, sub, shift, top} | {g[0] for g in (guard, shifted) if g}
    if any(users[v] - pattern - {second} for v in pattern) or pattern & set(graph.outputs):
        return None  # a value of the softmax is needed elsewhere
    found = _scores(graph, second, score, pattern, users)
    return Match(*found, score=score, norm="safe" if guard else "softmax") if found else None


def _plain(graph: Graph, second: int, p: int, pattern: set[int], users: dict[int, set[int]]) -> Match | None:
    """`chain(first matmul)` read by matmul `second` with no softmax between (ReLU attention), or None. The chain
    must not be empty: a plain product of three matrices is the compiler's to launch."""
    if any(users[v] - pattern - {second} for v in pattern) or pattern & set(graph.outputs):
        return None  # a view of the operand is needed elsewhere
    found = _scores(graph, second, p, pattern | {second}, users)
    return Match(*found, score=p, norm="none") if found and p in found[1] else None


def _scores(graph: Graph, second: int, score: int, pattern: set[int],
            users: dict[int, set[int]]) -> tuple[int, set[int]] | None:
    """(the first matmul, the chain from it to `score`) when every value of them is used only there or in `pattern`
    (the normalisation and the views before `second`); None otherwise."""
    nodes = graph.nodes
    first = _first(graph, score)
    if first is None or nodes[first].dtype != "float32":
        return None
    product = list(nodes[first].shape)
    if len(product) != 3 or product[:2] != nodes[second].shape[:2] or nodes[score].shape[-1] != product[-1]:
        return None
    chain = {v for v in product_chain(graph, first, through_views=True) | _views_back(graph, score, first)
             if reaches(graph, score, {v})}
    if score != first and score not in chain:
        return None
    inside = chain | {first}
    if any(users[v] - inside - pattern for v in inside) or inside & set(graph.outputs):
        return None  # a value of the scores is needed elsewhere: it must be written, so no fusion
    return first, chain


def _prescaled(graph: Graph, t: int, first: int, users: dict[int, set[int]]) -> tuple[int, list | None]:
    """(operand `t` of the scores' matmul, None), or, when `t` is `x * c` or `x / c` (a constant), directly or
    through views each read only by the next, and read only there, (what reads x now, [op, c]): the kernel scales
    its Q or K tile as it loads it, the same operation on the same values, so the scaled tensor is never written
    (nn.MultiheadAttention scales q before `bmm(q, k^T)`; scaled_dot_product_attention's math path scales q and k
    by sqrt(scale)). A scale commutes with a view, so the view that read the scaled tensor reads x instead."""
    reader, v = first, t
    while graph.nodes[v].op == "view" and graph.nodes[v].attrs.get("kind") in REARRANGING and users[v] == {reader} \
            and v not in graph.outputs:
        reader, v = v, graph.nodes[v].args[0]
    node = graph.nodes[v]
    if node.op != "pw" or node.attrs.get("fn") not in ("mul", "div") or users[v] != {reader} or v in graph.outputs:
        return t, None
    x, c = node.args if len(node.args) == 2 else (None, None)
    if node.attrs["fn"] == "mul" and isinstance(x, Const):
        x, c = c, x
    if not (isinstance(x, int) and isinstance(c, Const) and graph.nodes[x].shape == node.shape
            and graph.nodes[x].dtype == node.dtype == "float32"):
        return t, None
    users[v], users[x] = set(), users[x] - {v} | {reader}
    if reader == first:
        return x, [node.attrs["fn"], float(c.value)]
    graph.nodes[reader].args[0] = x
    return t, [node.attrs["fn"], float(c.value)]


def _guarded(nodes: list[Node], v: int) -> tuple[int, int] | None:
    """(the test, the value) of `where(x == -inf, 0, value)`, or None."""
    node = nodes[v]
    if not _pw(node, "where") or len(node.args) != 3 or node.args[1] != Const(0.0) or not isinstance(node.args[0], int):
        return None
    test = nodes[node.args[0]]
    if not (_pw(test, "eq") and test.args[1:] == [Const(-math.inf)] and isinstance(node.args[2], int)):
        return None
    return node.args[0], node.args[2]


def _pw(node: Node, fn: str) -> bool:
    return node.op == "pw" and node.attrs.get("fn") == fn


def _reduce(node: Node, fn: str, dims: list[int]) -> bool:
    return (node.op == "reduce" and node.attrs.get("fn") == fn and list(node.attrs.get("dims", [])) == dims
            and bool(node.attrs.get("keepdim")))


def _first(graph: Graph, score: int) -> int | None:
    """The batched matmul the score value comes from (through pointwise nodes and reshapes), or None."""
    todo, seen = [score], set()
    while todo:
        v = todo.pop()
        if v in seen:
            continue
        seen.add(v)
        node = graph.nodes[v]
        if node.op == "matmul":
            return v
        if node.op == "pw" or (node.op == "view" and node.attrs.get("kind") == "reshape"):
            todo += [a for a in node.args if isinstance(a, int)]
    return None


def _views_back(graph: Graph, score: int, first: int) -> set[int]:
    """The reshapes just before the score value (the chain leaves out a reshape that only the softmax reads)."""
    found, v = set(), score
    while v != first and graph.nodes[v].op == "view" and graph.nodes[v].attrs.get("kind") == "reshape":
        found.add(v)
        v = graph.nodes[v].args[0]
    return found


def attention_kernel(leaves: int, scalars: int, body: list[str], result: str, norm: str,
                     prescale: dict | None = None) -> tuple[str, str]:
    """(name, source): one program per (block of BM queries, batch), looping over the keys in blocks of BN; `norm`
    (`Match.norm`): the online softmax, where a row that sees no key is NaN (`softmax`: an all -inf row) or 0
    (`safe`), or none (the chain's value times V, summed); `prescale` (`_prescaled`): per operand (`q`, `k`), its
    tile times or over a constant as it is loaded."""
    prescale = prescale or {}
    args = ["q_ptr", "k_ptr", "v_ptr", "out_ptr", "M", "N", "DK", "DV", "sqb", "sqm", "sqk", "skb", "skk", "skn",
            "svb", "svn", "svd", "sob", "som", "sod", "QB", "sqb2", "KB", "skb2", "VB", "svb2"]
    args += [a for k in range(leaves) for a in (f"l{k}_ptr", f"l{k}_sb", f"l{k}_sm", f"l{k}_sn")]
    args += [f"s{k}" for k in range(scalars)]
    lines = [
        "    b = tl.program_id(1)",
        "    rm = tl.program_id(0) * BM + tl.arange(0, BM)",
        "    mmask = rm < M",
        "    dk = tl.arange(0, BDK)",
        "    dv = tl.arange(0, BDV)",
        "    q = tl.load(q_ptr + (b // QB) * sqb + (b % QB) * sqb2 + rm[:, None] * sqm + dk[None, :] * sqk,",
        "                mask=mmask[:, None] & (dk[None, :] < DK), other=0.0).to(tl.float32)",
        *_scaled("q", prescale, "    "),
        *([] if norm == "none" else ['    mi = tl.full([BM], -float("inf"), dtype=tl.float32)',
                                     "    li = tl.zeros([BM], dtype=tl.float32)"]),
        "    o = tl.zeros([BM, BDV], dtype=tl.float32)",
        "    for n0 in range(0, N, BN):",
        "        rn = n0 + tl.arange(0, BN)",
        "        nmask = rn < N",
        "        k = tl.load(k_ptr + (b // KB) * skb + (b % KB) * skb2 + dk[:, None] * skk + rn[None, :] * skn,",
        "                    mask=(dk[:, None] < DK) & nmask[None, :], other=0.0).to(tl.float32)",
        *_scaled("k", prescale, "        "),
        f"        acc = tl.dot(q, k, {IEEE_DOT})",
        "        em = mmask[:, None] & nmask[None, :]",
    ]
    lines += [f"        x{k} = tl.load(l{k}_ptr + b * l{k}_sb + rm[:, None] * l{k}_sm + rn[None, :] * l{k}_sn, "
              "mask=em, other=0.0).to(tl.float32)" for k in range(leaves)]
    lines += ["        " + line for line in body]
    load_v = ["        v = tl.load(v_ptr + (b // VB) * svb + (b % VB) * svb2 + rn[:, None] * svn + dv[None, :] * svd,",
              "                    mask=nmask[:, None] & (dv[None, :] < DV), other=0.0).to(tl.float32)"]
    if norm == "none":
        lines += [f"        p = tl.where(em, {result}, 0.0)", *load_v, f"        o += tl.dot(p, v, {IEEE_DOT})"]
    else:
        lines += _online_softmax(result, norm == "safe", load_v)
    lines += [
        "    tl.store(out_ptr + b * sob + rm[:, None] * som + dv[None, :] * sod, o,",
        "             mask=mmask[:, None] & (dv[None, :] < DV))",
    ]
    src = ("def KERNEL(" + ", ".join(args) + ", BM: tl.constexpr, BN: tl.constexpr, BDK: tl.constexpr, "
           "BDV: tl.constexpr):\n" + "\n".join(lines) + "\n")
    return jit(kernel_name("attention", src), src)


def _scaled(name: str, prescale: dict, indent: str) -> list[str]:
    """The line scaling a loaded Q or K tile (`_prescaled`), if it is scaled."""
    if name not in prescale:
        return []
    op, c = prescale[name]
    return [f"{indent}{name} = {name} {'*' if op == 'mul' else '/'} {c!r}"]


def _online_softmax(result: str, safe: bool, load_v: list[str]) -> list[str]:
    """The key loop's softmax part: running max and sum, the accumulator rescaled as the max grows; then the
    division after the loop."""
    return [
        f'        s = tl.where(em, {result}, -float("inf"))',
        "        mnew = tl.maximum(mi, tl.max(s, axis=1))",
        '        msafe = tl.where(mnew == -float("inf"), 0.0, mnew)  # a row that sees no key yet adds nothing',
        "        p = tl.exp(s - msafe[:, None])",
        "        alpha = tl.exp(mi - msafe)",
        "        li = li * alpha + tl.sum(p, axis=1)",
        *load_v,
        f"        o = o * alpha[:, None] + tl.dot(p, v, {IEEE_DOT})",
        "        mi = mnew",
        '    o = tl.where((mi == -float("inf"))[:, None], 0.0, o / li[:, None])' if safe else "    o = o / li[:, None]",
    ]


@emits("attention")
def emit_attention(fw: Forward, v: int) -> str:
    at = fw.nodes[v].attrs
    q, k, val = (fw.tensor(a) for a in fw.nodes[v].args[:3])
    chain = ChainExpr(fw, at["first"], at["chain"], at["score"], fw.nodes[at["score"]])
    result = chain.expr(at["score"])
    name = fw.kernel(attention_kernel(len(chain.leaves), len(chain.scalars), chain.lines, result, at["norm"],
                                      at.get("prescale")))
    fw.launcher("_attention", LAUNCHER)
    shapes = ", ".join("None" if s is None else f"lambda out: {chain.target(s, 'out')}" for s in chain.shapes)
    return fw.launch(v, name, f"_attention({q}, {k}, {val}, [{chain.leaf_vars()}], [{chain.scalar_args()}], "
                              f"[{shapes}])")


LAUNCHER = '''

def _attention(q, k, v, leaves, scalars, shapes, BM=None, BN=None):
    """(out, grid, args, meta) of softmax(chain(q @ k)) @ v (or chain(q @ k) @ v) for batched [B, M, DK],
    [B, DK, N], [B, N, DV] operands (each may be `_merged`: its batch dim, batch x heads, read in place as
    `b // QB * sqb + b % QB * sqb2`); each leaf of the chain with its strides over the [B, M, N] scores (one attached
    after a reshape of the scores, `shapes`: that reshape as a function of them, is broadcast to it and reshaped
    back)."""
    B, M, DK = q.shape
    N, DV = k.shape[2], v.shape[2]
    (q, qs, qb), (k, ks, kb), (v, vs, vb) = (_batch_merged(t) for t in (q, k, v))
    out = torch.empty((B, M, DV), dtype=q.dtype, device=q.device)
    scores = torch.empty((B, M, N), device="meta")
    extra = []
    for t, shape in zip(leaves, shapes):
        if shape is not None:
            t = t.expand(scores.view(shape(scores)).shape).reshape(scores.shape)
        extra += [t, *t.expand(scores.shape).stride()]
    BDK, BDV = max(16, triton.next_power_of_2(DK)), max(16, triton.next_power_of_2(DV))
    # on a GPU: fp32 tiles staged in shared memory, sized by the head dim to need at most ~100 KB (an L40S allows 99 KB)
    wide = max(BDK, BDV)
    bm, bn, stages = (64, 64, 2) if wide <= 64 else (32, 32, 2) if wide <= 128 else (32, 32, 1) if wide <= 256 \\
        else (16, 16, 1)
    gpu = BM or max(16, min(bm, triton.next_power_of_2(M)))
    if q.device.type == "cpu":  # the interpreter: fewer, larger tiles run faster
        meta = {"BDK": BDK, "BDV": BDV, "BM": BM or max(16, min(64, triton.next_power_of_2(M))),
                "BN": BN or max(16, min(128, triton.next_power_of_2(N)))}
    else:
        meta = {"BDK": BDK, "BDV": BDV, "num_stages": stages, "BM": gpu,
                "BN": BN or max(16, min(bn, triton.next_power_of_2(N)))}
    grid = _on_gpu((triton.cdiv(M, meta["BM"]), B), (triton.cdiv(M, gpu), B))
    return out, grid, (q, k, v, out, M, N, DK, DV, *qs, *ks, *vs, *out.stride(), *qb, *kb, *vb, *extra, *scalars), \\
        meta


def _batch_merged(t):
    """(data, strides, (inner size, inner stride) of the batch dim) of an attention operand: a `_merged` one whose
    batch dim alone covers two factors is read in place; another is copied (torch's reshape)."""
    if hasattr(t, "factors") and all(inner == 1 for _, inner, _ in t.factors[1:]):
        (sb, inner, sb2), (s1, _, _), (s2, _, _) = t.factors
        return t.data, (sb, s1, s2), (inner, sb2)
    t = t.copy() if hasattr(t, "factors") else t
    return t, t.stride(), (1, 0)
'''
