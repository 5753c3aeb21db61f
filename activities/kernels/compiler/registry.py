"""The registries: which function lowers which aten op (after Inductor's `register_lowering`), and which
building block emits which kind of graph node.

    @lowers(aten.relu, aten.sigmoid)
    def unary(r: Reader, c: Call) -> int: ...

`aten.relu` is the op's name without overload (`aten.relu.default` and `aten.relu_.default` are both
`relu`): the reader stays free of torch, so the workflow can run it. A lowering that only renames or reshapes
(a view) registers with `compute=False`: it is left out of the graph's label. Every registered op has a case in
tests/unit/compiler/ (a test checks the tables agree).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from activities.kernels.compiler.reader import Call, Reader


class _Aten:
    """`aten.relu` -> `"relu"`: op names written as Inductor writes them, without importing torch."""

    def __getattr__(self, name: str) -> str:
        return name


aten = _Aten()


@dataclass(frozen=True)
class Lowering:
    op: str
    fn: Callable[["Reader", "Call"], Any]
    compute: bool
    """False for views and renames: they move no data, and the graph's label leaves them out."""
    module: str


LOWERINGS: dict[str, Lowering] = {}


def lowers(*ops: str, compute: bool = True) -> Callable:
    """Register the decorated function as the lowering of each of `ops` (an op is registered once)."""

    def register(fn: Callable) -> Callable:
        for op in ops:
            if op in LOWERINGS:
                raise ValueError(f"aten.{op} is lowered twice ({LOWERINGS[op].module} and {fn.__module__})")
            LOWERINGS[op] = Lowering(op=op, fn=fn, compute=compute, module=fn.__module__)
        return fn

    return register


def lowering_for(op: str) -> Lowering | None:
    """The registered lowering of `op` (the reader imports `compiler.lowerings`, which registers them all)."""
    return LOWERINGS.get(op)


# --- the emitter registry: which building block writes a node of which op ------------------------------------


@dataclass(frozen=True)
class Emitter:
    op: str
    fn: Callable[..., str]
    module: str


EMITTERS: dict[str, Emitter] = {}


def emits(*ops: str) -> Callable:
    """Register the decorated function as the writer of graph nodes of each of `ops` (`fn(forward, v) -> var`)."""

    def register(fn: Callable) -> Callable:
        for op in ops:
            if op in EMITTERS:
                raise ValueError(f"node op {op} has two emitters ({EMITTERS[op].module} and {fn.__module__})")
            EMITTERS[op] = Emitter(op=op, fn=fn, module=fn.__module__)
        return fn

    return register
