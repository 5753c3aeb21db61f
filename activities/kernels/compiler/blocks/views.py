"""Views: no kernel. Each is written as a torch view of the run-time tensor (reshape, permute, unsqueeze,
squeeze, expand, select, slice), its sizes read from the tensors where the trace allows."""

from __future__ import annotations

from typing import TYPE_CHECKING

from activities.kernels.compiler.graph import Refused, symbolic
from activities.kernels.compiler.registry import emits

if TYPE_CHECKING:
    from activities.kernels.compiler.forward import Forward


@emits("view")
def view(fw: "Forward", v: int) -> str:
    n = fw.nodes[v]
    x = fw.tensor(n.args[0])
    at = n.attrs
    kind = at["kind"]
    if kind == "reshape":
        return fw.emit(v, f"{x}.reshape([{', '.join(reshape_sizes(fw, x, at['src'], n.shape, n.sizes))}])")
    if kind == "permute":
        return fw.emit(v, f"{x}.permute({at['perm']})")
    if kind == "unsqueeze":
        return fw.emit(v, f"{x}.unsqueeze({at['dim']})")
    if kind == "squeeze":
        return fw.emit(v, f"{x}.squeeze({tuple(at['dims'])})" if at["dims"] else x)
    if kind == "expand":
        src, dst = at["src"], n.shape
        sizes = [("-1" if j - len(dst) + len(src) >= 0 and src[j - len(dst) + len(src)] == s else
                  fw.size(n.sizes[j]) if n.sizes and symbolic(n.sizes[j]) else str(s)) for j, s in enumerate(dst)]
        return fw.emit(v, f"{x}.expand([{', '.join(sizes)}])")
    if kind == "select":
        return fw.emit(v, f"{x}.select({at['dim']}, {at['index']})")
    if kind == "slice":
        start, end, step, size = at["start"], at["end"], at["step"], at["size"]
        start = fw.size(start) if isinstance(start, str) else 0 if start is None else int(start)
        if isinstance(end, str):
            stop = fw.size(end)
        else:
            stop = "None" if end is None or int(end) >= size else (
                f"{x}.shape[{at['dim']}] - {size - int(end)}" if int(end) > size // 2 else str(int(end)))
        index = ", ".join([":"] * at["dim"] + [f"{start}:{stop}:{step}"]).replace("None", "")
        return fw.emit(v, f"{x}[{index}]")
    if kind == "channel":
        return fw.emit(v, f"{x}.reshape([-1] + [1] * {at['rank']})")
    if kind == "groups":
        return fw.emit(v, f"{x}.reshape({x}.shape[0], {at['groups']}, -1)")
    if kind == "unfold":
        return fw.emit(v, f"{x}.unfold({at['dim']}, {at['size']}, {at['step']})")
    if kind == "item":
        return fw.emit(v, f"{x}[{at['index']}]")
    if kind == "like":
        return fw.emit(v, f"{x}.reshape({fw.tensor(n.args[1])}.shape)")
    raise Refused(f"view {kind}")


def reshape_sizes(fw: "Forward", x: str, src: list[int], dst: list[int], sizes: list[str]) -> list[str]:
    """A reshape's target: the symbolic trace's size where it depends on the inputs' sizes, else the size read
    from the input `x` at run time (merged dims are products, a split dim -1) where the traced sizes line up."""
    structural = reshape_target(x, src, dst)
    entries = structural[1:-1].split(", ") if structural.startswith("[") else [str(d) for d in dst]
    if len(entries) != len(dst):
        entries = [str(d) for d in dst]
    return [fw.size(e) if sizes and symbolic(e) else s for e, s in zip(sizes or entries, entries)]


def reshape_target(x: str, src: list[int], dst: list[int]) -> str:
    """A reshape target written from the input's run-time sizes: output dims that merge input dims are
    their product, inserted 1s stay 1, and one dim of a split takes -1 (the rest keep their traced size)."""
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
    if i != len(src) or len(out) != len(dst):
        return repr(list(dst))
    return "[" + ", ".join(out) + "]"
