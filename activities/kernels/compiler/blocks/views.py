"""Views: no kernel. Each is written as a torch view of the run-time tensor (reshape, permute, unsqueeze,
squeeze, expand, select, slice), its sizes read from the tensors where the trace allows."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

from activities.kernels.compiler.graph import Node, Refused, symbolic
from activities.kernels.compiler.registry import emits

if TYPE_CHECKING:
    from activities.kernels.compiler.forward import Forward


@emits("view")
def view(fw: "Forward", v: int) -> str:
    n = fw.nodes[v]
    write = VIEWS.get(n.attrs["kind"])
    if write is None:
        raise Refused(f"view {n.attrs['kind']}")
    if n.attrs["kind"] == "reshape" and _indexed_in_place(fw, v):  # no copy where torch's reshape would make one
        from activities.kernels.compiler.blocks.matmul import MERGED

        fw.launcher("_merged", MERGED)
        x = fw.tensor(n.args[0])
        return fw.emit(v, f"_merged({x}, [{', '.join(reshape_sizes(fw, x, n.attrs['src'], n.shape, n.sizes))}])")
    return fw.emit(v, write(fw, n, fw.tensor(n.args[0]), n.attrs))


def _indexed_in_place(fw: "Forward", v: int) -> bool:
    """Every node that reads `v` (directly or through permutes) indexes merged dims itself (`_merged`): a matmul
    (or a matmul with its epilogue) reading it as A, or attention reading it as Q, K or V, and only so."""
    users = fw.readers(v)
    for u in users:
        node = fw.nodes[u]
        if node.op == "view" and node.attrs["kind"] == "permute":
            ok = _indexed_in_place(fw, u)
        elif node.op == "attention":
            ok = v not in node.args[3:]
        else:
            main = fw.nodes[node.attrs["main"]] if node.op == "epilogue" else node
            ok = main.op == "matmul" and main.args[0] == v and v not in node.args[1:]
        if not ok:
            return False
    return bool(users) and v not in fw.graph.outputs


def _expand(fw: "Forward", n: Node, x: str, at: dict) -> str:
    """-1 where the input has the size already, else the size (from the trace's expression where it varies)."""
    src, dst = at["src"], n.shape
    sizes = [("-1" if j - len(dst) + len(src) >= 0 and src[j - len(dst) + len(src)] == s else
              fw.size(n.sizes[j]) if n.sizes and symbolic(n.sizes[j]) else str(s)) for j, s in enumerate(dst)]
    return f"{x}.expand([{', '.join(sizes)}])"


def _slice(fw: "Forward", n: Node, x: str, at: dict) -> str:
    """x[..., start:stop:step]; a bound is a size expression, a number, or (a traced end near the size) the size
    less the traced distance to it."""
    start, end, step, size = at["start"], at["end"], at["step"], at["size"]
    start = fw.size(start) if isinstance(start, str) else 0 if start is None else int(start)
    if isinstance(end, str):
        stop = fw.size(end)
    else:
        stop = "" if end is None or int(end) >= size else (
            f"{x}.shape[{at['dim']}] - {size - int(end)}" if int(end) > size // 2 else str(int(end)))
    return f"{x}[{', '.join([':'] * at['dim'] + [f'{start}:{stop}:{step}'])}]"


VIEWS: dict[str, Callable[["Forward", Node, str, dict], str]] = {
    "reshape": lambda fw, n, x, at: f"{x}.reshape([{', '.join(reshape_sizes(fw, x, at['src'], n.shape, n.sizes))}])",
    "permute": lambda fw, n, x, at: f"{x}.permute({at['perm']})",
    "unsqueeze": lambda fw, n, x, at: f"{x}.unsqueeze({at['dim']})",
    "squeeze": lambda fw, n, x, at: f"{x}.squeeze({tuple(at['dims'])})" if at["dims"] else x,
    "expand": _expand,
    "select": lambda fw, n, x, at: f"{x}.select({at['dim']}, {at['index']})",
    "slice": _slice,
    "unfold": lambda fw, n, x, at: f"{x}.unfold({at['dim']}, {at['size']}, {at['step']})",
    "item": lambda fw, n, x, at: f"{x}[{at['index']}]",
    "channel": lambda fw, n, x, at: f"{x}.reshape([-1] + [1] * {at['rank']})",
    "groups": lambda fw, n, x, at: f"{x}.reshape({x}.shape[0], {at['groups']}, -1)",
    "like": lambda fw, n, x, at: f"{x}.reshape({fw.tensor(n.args[1])}.shape)",
}
"""Each kind of view as forward code over the input variable `x`."""


def reshape_sizes(fw: "Forward", x: str, src: list[int], dst: list[int], sizes: list[str]) -> list[str]:
    """A reshape's target: the symbolic trace's size where it depends on the inputs' sizes, else the size read
    from the input `x` at run time (merged dims are products, a split dim -1) where the traced sizes line up."""
    entries = reshape_target(x, src, dst) or [str(d) for d in dst]
    return [fw.size(e) if sizes and symbolic(e) else s for e, s in zip(sizes or entries, entries)]


def reshape_target(x: str, src: list[int], dst: list[int]) -> list[str] | None:
    """A reshape target written from the input's run-time sizes: output dims that merge input dims are
    their product, inserted 1s stay 1, and one dim of a split takes -1 (the rest keep their traced size);
    None where the traced sizes do not line up."""
    out: list[str] = []
    i = j = 0
    minus = False
    while j < len(dst):
        if dst[j] == 1 and (i >= len(src) or src[i] != 1):
            out.append("1")
            j += 1
            continue
        if i < len(src) and src[i] == dst[j]:
            out.append(f"{x}.shape[{i}]")
            i += 1
            j += 1
            continue
        gi, gj = [i], [j]
        ps, pd = src[i] if i < len(src) else 1, dst[j]
        while ps != pd:
            if ps < pd:
                i += 1
                if i >= len(src):
                    break
                gi.append(i)
                ps *= src[i]
            else:
                j += 1
                if j >= len(dst):
                    break
                gj.append(j)
                pd *= dst[j]
        if len(gj) == 1:
            out.append(" * ".join(f"{x}.shape[{k}]" for k in gi))
        else:
            for k in gj:
                out.append("-1" if not minus and k == gj[0] else str(dst[k]))
            minus = True
        i += 1
        j += 1
    while i < len(src) and src[i] == 1:
        i += 1
    return out if i == len(src) and len(out) == len(dst) else None
