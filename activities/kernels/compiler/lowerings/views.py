"""Views and renames: no data moves, so no kernel; the emitter writes them as torch views whose sizes come from
the run-time tensors (`compute=False`: they stay out of the graph's label)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from activities.kernels.compiler.graph import Sym
from activities.kernels.compiler.registry import aten, lowers

if TYPE_CHECKING:
    from activities.kernels.compiler.reader import Call, Reader


@lowers(aten.clone, aten.detach, compute=False)
def identity(r: Reader, c: Call) -> Any:
    """Copies compute nothing new (`.contiguous()` traces as clone; eval-mode dropout traces as nothing)."""
    return c.x()


@lowers(aten.view, aten._unsafe_view, compute=False)
def reshape(r: Reader, c: Call) -> int:
    v = c.x()
    return r.view(v, "reshape", c.shape, c.dtype, sizes=c.sizes, src=r.shape(v))


@lowers(aten.permute, aten.t, aten.transpose, compute=False)
def permute(r: Reader, c: Call) -> int:
    v = c.x()
    rank = len(r.shape(v))
    if c.op == "t":
        perm = [1, 0] if rank == 2 else list(range(rank))
    elif c.op == "transpose":
        perm = list(range(rank))
        d0, d1 = int(c.args[1]) % rank, int(c.args[2]) % rank
        perm[d0], perm[d1] = perm[d1], perm[d0]
    else:
        perm = [int(d) % rank for d in c.args[1]]
    return r.view(v, "permute", c.shape, c.dtype, perm=perm)


@lowers(aten.unsqueeze, compute=False)
def unsqueeze(r: Reader, c: Call) -> int:
    return r.view(c.x(), "unsqueeze", c.shape, c.dtype, dim=int(c.args[1]))


@lowers(aten.squeeze, compute=False)
def squeeze(r: Reader, c: Call) -> int:
    v = c.x()
    dims = c.arg(1, "dim")
    src = r.shape(v)
    if dims is None:
        dims = [j for j, s in enumerate(src) if s == 1]
    dims = [int(d) % max(len(src), 1) for d in (dims if isinstance(dims, list) else [dims])]
    return r.view(v, "squeeze", c.shape, c.dtype, dims=dims)


@lowers(aten.expand, compute=False)
def expand(r: Reader, c: Call) -> int:
    v = c.x()
    return r.view(v, "expand", c.shape, c.dtype, sizes=c.sizes, src=r.shape(v))


@lowers(aten.select, compute=False)
def select(r: Reader, c: Call) -> int:
    return r.view(c.x(), "select", c.shape, c.dtype, dim=int(c.args[1]), index=int(c.args[2]))


@lowers(aten.slice, compute=False)
def slice_(r: Reader, c: Call) -> int:
    v = c.x()
    src = r.shape(v)
    dim = int(c.arg(1, "dim", 0)) % len(src)
    return r.view(v, "slice", c.shape, c.dtype, dim=dim, start=bound(r, c.arg(2, "start")),
                  end=bound(r, c.arg(3, "end")), step=int(c.arg(4, "step", 1)), size=src[dim])


def bound(r: Reader, raw: Any) -> int | str | None:
    """A slice bound: None, an int, or a size expression (`x[:, :T]` with T from the input's size)."""
    value = r.value(raw) if isinstance(raw, dict) else raw
    return value.expr if isinstance(value, Sym) else None if raw is None else int(raw)


@lowers(aten.split, aten.split_with_sizes, aten.unsafe_split, compute=False)
def split(r: Reader, c: Call) -> list[int]:
    """Consecutive slices along `dim` (`x.split(n)`, `x.chunk(k)`, an LSTM's gates)."""
    v = c.x()
    src = r.shape(v)
    dim = int(c.arg(2, "dim", 0)) % len(src)
    size = c.arg(1, "split_size" if c.op != "split_with_sizes" else "split_sizes")
    starts: list[int | str] = [0]
    for k, spec in enumerate(c.out):
        step = size[k] if isinstance(size, list) else size
        step = r.value(step).expr if isinstance(step, dict) else int(step)
        prev = starts[-1]
        starts.append(f"({prev} + {step})" if isinstance(prev, str) or isinstance(step, str) else prev + step)
    parts = []
    for k, spec in enumerate(c.out):
        last = k == len(c.out) - 1
        parts.append(r.view(v, "slice", spec.shape, spec.dtype, dim=dim, start=starts[k],
                            end=None if last else starts[k + 1], step=1, size=src[dim]))
    return parts


@lowers(aten.unbind, compute=False)
def unbind(r: Reader, c: Call) -> list[int]:
    """One select per index along `dim` (a recurrent layer's time steps)."""
    v = c.x()
    dim = int(c.arg(1, "dim", 0)) % len(r.shape(v))
    return [r.view(v, "select", spec.shape, spec.dtype, dim=dim, index=k) for k, spec in enumerate(c.out)]


@lowers(aten.unfold, compute=False)
def unfold(r: Reader, c: Call) -> int:
    """Sliding windows along `dim` as a new last dim (ViT's patches): a strided view."""
    v = c.x()
    dim = int(c.args[1]) % len(r.shape(v))
    return r.view(v, "unfold", c.shape, c.dtype, dim=dim, size=int(c.args[2]), step=int(c.args[3]))


@lowers(aten.copy, compute=False)
def copy(r: Reader, c: Call) -> int:
    """dst.copy_(src) holds src's values (a recurrent model's state set from its input): src, broadcast to dst.
    Where dst is a tensor attribute, later reads of the attribute see it (the calls are read in trace order)."""
    src = c.value(1)
    if r.shape(src) != c.shape:
        src = r.view(src, "expand", c.shape, c.dtype, sizes=c.sizes, src=r.shape(src))
    dst = c.args[0]
    if isinstance(dst, dict) and dst.get("ref") == "node" and r.a.calls[int(dst["index"])].op.startswith("get_attr"):
        r.assigned[r.a.calls[int(dst["index"])].op.split(" ", 1)[-1]] = src
    return src
