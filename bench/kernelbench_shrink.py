"""The one shrink rule bench_kernelbench applies to the public KernelBench files (sizes meant for a GPU;
the Triton interpreter runs on CPU).

1. Module-level size constants written several names at once (`height = width = 128`,
   `depth, height, width = 16, 32, 32`, `D, H, W = (16, 32, 32)`) are first split into one assignment
   per name (same values), because `--set` takes single names (the CLI's own reader of those forms is
   being added separately).
2. Then the sizes are set the way a user does with `--set NAME=VALUE`: `batch_size` (and `batch`, `b`)
   becomes 2; every other integer constant above CAP (8) is halved until it is at most CAP (an odd
   size keeps odd through floor division: 4095 -> 7); integers inside tuple constants the same way
   (`input_shape = (32768,)` -> `(8,)`). Kernel sizes, strides, paddings, dilations and group counts
   (<= 8) stay as they are.
3. A task that no longer builds or traces at those sizes (the batch shared with another dimension, a
   dilated kernel wider than the input, channels no longer divisible by the groups) is tried again
   with the batch treated like any other size, then with CAP 16, 32, 64; the first that builds wins.
   Sizes written as literals inside get_inputs() (not constants) are not changed: a user could not --set them.

Pure text in, text out (nothing is executed here); `ladder` lists the tries in order.
"""

from __future__ import annotations

import ast
import operator

BATCH_NAMES = frozenset({"batch_size", "batch", "b"})
_OPS = {ast.Mult: operator.mul, ast.Add: operator.add, ast.Sub: operator.sub, ast.FloorDiv: operator.floordiv}


def ladder() -> list[tuple[int, bool]]:
    """The (cap, batch to 2) settings tried in order."""
    return [(8, True), (8, False), (16, True), (32, True), (64, True)]


def shrink(source: str, cap: int = 8, batch_to_two: bool = True) -> tuple[str, dict[str, object]]:
    """The task source with its module-level sizes split and shrunk, and the settings made (name -> value)."""
    tree = ast.parse(source)
    lines = source.splitlines(keepends=True)
    known: dict[str, object] = {}
    made: dict[str, object] = {}
    edits: dict[int, tuple[int, list[str]]] = {}
    for node in tree.body:
        if not isinstance(node, ast.Assign):
            continue
        value = _eval(node.value, known)
        pairs = _targets(node.targets, value)
        if pairs is None:
            continue
        texts = []
        for name, v in pairs:
            known[name] = v
            new = tuple(_small(name, x, cap, batch_to_two) for x in v) if isinstance(v, tuple) \
                else _small(name, v, cap, batch_to_two)
            if new != v:
                made[name] = new
            texts.append(f"{name} = {new!r}")
        start, end = edits.get(node.lineno, (node.end_lineno or node.lineno, []))
        edits[node.lineno] = (max(start, node.end_lineno or node.lineno), end + texts)
    for first in sorted(edits, reverse=True):
        last, texts = edits[first]
        lines[first - 1:last] = ["\n".join(texts) + "\n"]
    return "".join(lines), made


def _small(name: str, v: object, cap: int, batch_to_two: bool) -> object:
    if isinstance(v, bool) or not isinstance(v, int):
        return v
    if batch_to_two and name in BATCH_NAMES:
        return min(v, 2)
    while v > cap:
        v //= 2
    return v


def _targets(targets: list[ast.expr], value: object) -> list[tuple[str, object]] | None:
    if value is None:
        return None
    pairs: list[tuple[str, object]] = []
    for t in targets:
        if isinstance(t, ast.Name):
            pairs.append((t.id, value))
        elif isinstance(t, ast.Tuple) and isinstance(value, tuple) and len(t.elts) == len(value) \
                and all(isinstance(e, ast.Name) for e in t.elts):
            pairs += [(e.id, v) for e, v in zip(t.elts, value)]  # type: ignore[attr-defined]
        else:
            return None
    return pairs


def _eval(node: ast.expr, names: dict[str, object]) -> object:
    if isinstance(node, ast.Constant) and isinstance(node.value, (int, float)) and not isinstance(node.value, bool):
        return node.value
    if isinstance(node, ast.Tuple):
        vals = [_eval(e, names) for e in node.elts]
        return None if any(not isinstance(v, (int, float)) for v in vals) else tuple(vals)
    if isinstance(node, ast.BinOp) and type(node.op) in _OPS:
        left, right = _eval(node.left, names), _eval(node.right, names)
        if isinstance(left, (int, float)) and isinstance(right, (int, float)):
            return _OPS[type(node.op)](left, right)
    return None
