"""The compiler's one intermediate form: a graph of primitive nodes, the reader's output and the emitters' input.

A node is one primitive step (`op`, one of NODE_OPS). Its `args` are node ids, `Const` (a number), `Scalar` (a
Python scalar forward input) or `Sym` (a size computed from the inputs' sizes); the last two are passed to the
kernel at run time. `shape` is the traced one: the emitters use it for decisions only and never write it into a
candidate; `sizes`, where a symbolic trace gave them, are the sizes as expressions over the graph's `symbols`
(the forward inputs' sizes), which the emitters write instead.

Pure data: no torch, so the workflow can run the reader to name a task's family.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any


class Refused(Exception):
    """The graph has an op (or a use of one) the compiler does not take; the message names it."""


@dataclass(frozen=True)
class Const:
    value: float


@dataclass(frozen=True)
class Scalar:
    index: int


@dataclass(frozen=True)
class Sym:
    """A size the forward computed from its inputs' sizes: a Python expression over the graph's symbols."""

    expr: str
    hint: int


NODE_OPS = ("input", "param", "pw", "reduce", "view", "matmul", "conv", "pool", "scan", "gather", "cat", "zeros",
            "flip", "tri", "random", "recurrent", "adaptive_pool", "pad", "fill")
"""Every kind of node; each but input and param has its emitter (`registry.emits`)."""


@dataclass
class Node:
    op: str
    args: list[Any]
    attrs: dict[str, Any] = field(default_factory=dict)
    shape: list[int] = field(default_factory=list)
    dtype: str = "float32"
    sizes: list[str] = field(default_factory=list)
    """The sizes as expressions over the graph's symbols (`s0*s1`, `64`); empty: constants, or unknown."""


@dataclass
class Graph:
    """A lowered forward: its nodes (in creation order: every arg precedes its user) and outputs (node ids)."""

    nodes: list[Node]
    outputs: list[int]
    label: str
    symbols: dict[str, tuple[int, int]] = field(default_factory=dict)
    """Size symbol -> (forward input, dim) it is read from at run time."""
    device_input: int | None = None
    """The forward input whose device new tensors go on (the first tensor input)."""

    def needed(self) -> set[int]:
        """The ids of the nodes the outputs depend on (through any chain of arguments)."""
        todo, seen = list(self.outputs), set()
        while todo:
            v = todo.pop()
            if v not in seen:
                seen.add(v)
                todo += [a for a in self.nodes[v].args if isinstance(a, int)]
        return seen

    def users(self) -> dict[int, list[int]]:
        """Node id -> the ids of the nodes that take it as an argument."""
        found: dict[int, list[int]] = {i: [] for i in range(len(self.nodes))}
        for i, n in enumerate(self.nodes):
            for a in n.args:
                if isinstance(a, int):
                    found[a].append(i)
        return found


TORCH_DTYPES = {"float32": "torch.float32", "float16": "torch.float16", "bfloat16": "torch.bfloat16",
                "float64": "torch.float64", "int64": "torch.int64", "int32": "torch.int32", "bool": "torch.bool"}


SIZE_EXPR = re.compile(r"[\w\s()+*/%,-]*")


def symbolic(expr: str) -> bool:
    """Does a size expression depend on a symbol (not only on constants)?"""
    return any(not t.isdigit() for t in re.findall(r"\w+", expr))


def packet(op: str) -> str:
    """`aten.add_.Scalar` -> `add` (in-place variants on traced intermediates compute the same);
    `fleetforge.rnn.default` (the probe's whole recurrent layer) -> `rnn`."""
    if op == "getitem" or not op.startswith(("aten.", "fleetforge.")):
        return op
    name = op.split(".")[1]
    return name[:-1] if name.endswith("_") and not name.startswith("_") else name


def broadcast(*shapes: list[int]) -> list[int]:
    """The broadcast shape of `shapes` (numpy rules)."""
    rank = max((len(s) for s in shapes), default=0)
    out = []
    for j in range(rank):
        sizes = {s[j - rank + len(s)] for s in shapes if j - rank + len(s) >= 0} - {1}
        out.append(max(sizes) if sizes else 1)
    return out


def ints(v: Any, d: int) -> list[int]:
    """An int-or-list argument as `d` ints (`kernel_size=3` -> [3, 3])."""
    if isinstance(v, list):
        return [int(x) for x in v] * (d if len(v) == 1 else 1)
    return [int(v)] * d
