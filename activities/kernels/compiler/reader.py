"""The one aten-graph reader: the traced reference (ReferenceAnalysis: aten calls with JSON arguments) in, the
compiler's Graph out.

It walks back from the forward's outputs, reads each call's operands (tensor references, numbers, scalar
inputs) and hands the call to the lowering registered for its op (`registry.lowers`), which adds primitive
nodes through the builders here (`add`, `pw`, `reduce`, `view`). An op nothing lowers refuses the whole
graph, naming the op. Pure: no torch.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from activities.kernels.compiler import lowerings  # noqa: F401 - registers every lowering
from activities.kernels.compiler.graph import NODE_OPS, SIZE_EXPR, Const, Graph, Node, Refused, Scalar, Sym, packet
from activities.kernels.compiler.registry import lowering_for
from contracts.kernel_job import AtenCall, ReferenceAnalysis, TensorSpec


@dataclass(frozen=True)
class _Refusal:
    reason: str


def _refs(values: list[Any]) -> list[dict]:
    """The tensor references in JSON arguments (nested in lists)."""
    found: list[dict] = []
    for v in values:
        if isinstance(v, dict) and "ref" in v:
            found.append(v)
        elif isinstance(v, list):
            found += _refs(v)
    return found


NOT_LOWERED = {
    "native_dropout": "dropout with p > 0 in training mode draws a random mask; in eval mode or with p = 0 it "
                      "traces as nothing",
    "bernoulli": "a random mask (dropout in training mode)",
}
"""Ops that are not lowered on purpose, with the reason the refusal gives."""


def specialized(a: ReferenceAnalysis) -> str:
    """Why a trace whose forward turned an input's size into a plain number is not lowered: the graph traced past
    that point (a loop unrolled that many times, a size baked in) holds at the traced size only."""
    sources = {name: f"input {src.input}'s dim {src.dim}" for name, src in a.symbols.items()}
    parts = []
    for expr, value in a.specialized.items():
        named = [sources[n] for n in dict.fromkeys(re.findall(r"[A-Za-z_]\w*", expr)) if n in sources]
        parts.append(f"{expr} = {value} at the trace" + (f" ({expr} is {', '.join(named)})" if named else ""))
    return ("forward turns a size of its inputs into a plain Python number (" + "; ".join(parts) + "): a loop "
            "over it such as `for t in range(x.size(0))` is unrolled that many times, and int() of it is a constant, "
            "so the traced graph holds at that size only and a kernel lowered from it would bake the size in")


def read(a: ReferenceAnalysis) -> Graph:
    """The lowered graph of the traced forward; raises Refused naming what cannot be lowered."""
    return Reader(a).read()


@dataclass
class Call:
    """One aten call as its lowering sees it: the op's name, its JSON arguments, its traced output."""

    r: Reader
    index: int
    op: str
    args: list[Any]
    kwargs: dict[str, Any]
    out: list[TensorSpec]

    @property
    def shape(self) -> list[int]:
        return self.out[0].shape if self.out else []

    @property
    def dtype(self) -> str:
        return self.out[0].dtype if self.out else "float32"

    @property
    def sizes(self) -> list[str]:
        """The output's sizes as expressions over the symbols (a symbolic trace), else []."""
        return self.r.sizes(self.out[0]) if self.out else []

    def arg(self, pos: int, name: str, default: Any = None) -> Any:
        """The raw argument by keyword `name`, else at position `pos`, else `default`."""
        if name in self.kwargs:
            return self.kwargs[name]
        return self.args[pos] if len(self.args) > pos else default

    def value(self, pos: int, name: str = "") -> Any:
        """The argument at `pos` (or keyword `name`) read as a graph value (node id, Const or Scalar)."""
        return self.r.value(self.arg(pos, name) if name else self.args[pos])

    def x(self) -> Any:
        return self.r.value(self.args[0])


class Reader:
    def __init__(self, a: ReferenceAnalysis):
        self.a = a
        self.nodes: list[Node] = []
        self.memo: dict[tuple, Any] = {}
        self.seen_ops: list[tuple[int, str]] = []
        """(call index, op) of the compute ops lowered, for the label."""
        self.assigned: dict[str, Any] = {}
        """Tensor attributes (get_attr targets) forward overwrote with copy_: later reads see the copied value."""

    def read(self) -> Graph:
        """Lowers the calls the outputs need in trace order (so a deep model never recurses deeply: every
        operand is lowered before its user); a call whose lowering refuses refuses the graph only if used."""
        if self.a.trace_error:
            raise Refused(f"the reference could not be traced ({self.a.trace_error})")
        if self.a.specialized:
            raise Refused(specialized(self.a))
        for i in self.needed():
            try:
                self.memo[("node", i)] = self.call(i)
            except Refused as e:
                self.memo[("node", i)] = _Refusal(str(e))
        outs = []
        for ref in self.a.outputs:
            v = self.value(ref)
            if not isinstance(v, int):
                raise Refused("forward returns a constant, not a tensor")
            outs.append(v)
        ops = [op for _, op in sorted(self.seen_ops)]
        label = "lowered: " + " → ".join(dict.fromkeys(o.lstrip("_") for o in ops)) if ops else "lowered: copy"
        symbols = {name: (src.input, src.dim) for name, src in self.a.symbols.items()}
        device = next((i for i, spec in enumerate(self.a.inputs) if spec.tensor is not None), None)
        return Graph(nodes=self.nodes, outputs=outs, label=label, symbols=symbols, device_input=device)

    # -- builders --------------------------------------------------------------------------------

    def add(self, op: str, args: list[Any], shape: list[int], dtype: str = "float32", *,
            sizes: list[str] | None = None, **attrs: Any) -> int:
        """A node; `sizes`: its shape as symbolic expressions (where a lowering writes sizes, e.g. a view)."""
        assert op in NODE_OPS, op
        self.nodes.append(Node(op=op, args=args, attrs=attrs, shape=list(shape), dtype=dtype, sizes=list(sizes or [])))
        return len(self.nodes) - 1

    def pw(self, fn: str, args: list[Any], shape: list[int], dtype: str = "float32", **attrs: Any) -> int:
        """One pointwise function of `args` (fused into its consumer's kernel by the emitter)."""
        return self.add("pw", args, shape, dtype, fn=fn, attrs=attrs)

    def reduce(self, fn: str, v: Any, dims: Any, keep: bool, shape: list[int], dtype: str = "float32",
               correction: float = 0.0) -> int:
        """`fn` (sum, mean, amax, amin, argmax, argmin, logsumexp) of `v` over `dims` (None or []: all)."""
        rank = len(self.shape(v))
        if dims is None or dims == []:
            dims = list(range(rank))
        dims = [int(d) % max(rank, 1) for d in (dims if isinstance(dims, list) else [dims])]
        return self.add("reduce", [v], shape, dtype, fn=fn, dims=dims, keepdim=keep, correction=correction)

    def view(self, v: Any, kind: str, shape: list[int], dtype: str = "float32", *, sizes: list[str] | None = None,
             **attrs: Any) -> int:
        """A view of `v` (no data moves): reshape, permute, unsqueeze, squeeze, expand, select, slice, ..."""
        return self.add("view", [v], shape, dtype, sizes=sizes, kind=kind, **attrs)

    def shape(self, v: Any) -> list[int]:
        return self.nodes[v].shape if isinstance(v, int) else []

    def sizes(self, spec: TensorSpec) -> list[str]:
        """A traced tensor's sizes as expressions over the symbols, checked to be nothing else."""
        for e in spec.sizes:
            self.check(e)
        return list(spec.sizes)

    def check(self, expr: str) -> str:
        """A size expression from the trace, refused unless it is arithmetic over the trace's symbols."""
        names = set(re.findall(r"[A-Za-z_]\w*", expr)) - {"max", "min"}
        if not SIZE_EXPR.fullmatch(expr) or not names <= set(self.a.symbols):
            raise Refused(f"a size expression the compiler does not take ({expr[:60]})")
        return expr

    def kept(self, v: Any, dims: list[int]) -> list[int]:
        """`v`'s shape with `dims` reduced to 1 (keepdim)."""
        return [1 if j in dims else s for j, s in enumerate(self.shape(v))]

    # -- values ----------------------------------------------------------------------------------

    def value(self, arg: Any) -> Any:
        """A JSON argument as a graph value: a node id (lowering its call first), a Const or a Scalar."""
        if isinstance(arg, (bool, int, float)):
            return Const(float(arg))
        if isinstance(arg, dict) and "float" in arg:
            return Const(float(arg["float"]))
        if isinstance(arg, dict) and "sym" in arg:
            return Sym(self.check(str(arg["sym"])), int(arg.get("hint", 0)))  # type: ignore[arg-type]
        if not isinstance(arg, dict) or "ref" not in arg:
            raise Refused(f"an operand the lowering cannot take ({str(arg)[:60]})")
        ref, index = arg["ref"], int(arg.get("index", 0))
        if ref == "scalar":
            return Scalar(index)
        key = (ref, index)
        if key in self.memo:
            if isinstance(self.memo[key], _Refusal):
                raise Refused(self.memo[key].reason)
            return self.memo[key]
        if ref == "input":
            spec = self.a.inputs[index].tensor
            if spec is None:
                raise Refused(f"forward input {index} is not a tensor")
            result: Any = self.add("input", [], spec.shape, spec.dtype, index=index)
        elif ref == "param":
            spec = self.a.params[index].tensor
            result = self.add("param", [], spec.shape, spec.dtype, name=self.a.params[index].name)
        else:
            result = self.call(index)
        self.memo[key] = result
        return result

    def needed(self) -> list[int]:
        """The calls the outputs depend on, in trace order (and the copies into tensor attributes, which later
        reads of the attribute depend on)."""
        seen: set[int] = set()
        todo = [r["index"] for r in _refs(self.a.outputs) if r.get("ref") == "node"]
        todo += [i for i, c in enumerate(self.a.calls) if packet(c.op) == "copy" and c.args
                 and isinstance(c.args[0], dict) and c.args[0].get("ref") == "node"
                 and self.a.calls[int(c.args[0]["index"])].op.startswith("get_attr")]
        while todo:
            i = int(todo.pop())
            if i in seen:
                continue
            seen.add(i)
            c = self.a.calls[i]
            todo += [r["index"] for r in _refs([*c.args, *c.kwargs.values()]) if r.get("ref") == "node"]
        return sorted(seen)

    def item(self, index: int, item: int) -> Any:
        results = self.value({"ref": "node", "index": index})
        if not isinstance(results, list) or item >= len(results) or results[item] is None:
            raise Refused(f"output {item} of {packet(self.a.calls[index].op)}")
        return results[item]

    def call(self, i: int) -> Any:
        c: AtenCall = self.a.calls[i]
        p = packet(c.op)
        if p == "getitem":
            return self.item(int(c.args[0]["index"]), int(c.args[1]))  # type: ignore[index,arg-type]
        if p.startswith("get_attr"):
            target = c.op.split(" ", 1)[-1]
            if target in self.assigned:  # a tensor attribute forward filled with copy_ (a recurrent model's state)
                return self.assigned[target]
            if c.args and c.out and not c.out[0].shape:  # a 0-d constant built from a number: its value
                return self.value(c.args[0])
            raise Refused("a tensor constant built inside forward (get_attr): its value is not in the trace")
        if p in ("lift_fresh_copy", "alias"):  # the trace's own bookkeeping: a constant's wrapper, a no-op view
            return self.value(c.args[0])
        lowering = lowering_for(p)
        if lowering is None:
            raise Refused(f"no lowering for {p}" + (f" ({NOT_LOWERED[p]})" if p in NOT_LOWERED else ""))
        if lowering.compute:
            self.seen_ops.append((i, p))
        return lowering.fn(self, Call(self, i, p, list(c.args), dict(c.kwargs), list(c.out)))


__all__ = ["Call", "Const", "Reader", "Refused", "Scalar", "read"]
