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

Level 3 files are whole models whose sizes also sit in lists (`layer_sizes = [16384, 16384]`), in
`get_inputs()` (`torch.rand(batch_size, 3, 224, 224)`) and in the model code itself (`nn.Linear(512 * 7 * 7,
4096)`, `InceptionModule(480, 192, ...)`). Halving each size to a bound would break the sums and products
that tie them together (an Inception block's branch widths add up to the next block's input), so Level 3
has its own rule (`scale`): batch constants become 2, and every integer literal of at least LEVEL3_MIN (32)
anywhere in the file is divided by one factor (floor, at least 1); smaller ones (kernel sizes, strides,
layer and head counts, patch sizes, RGB's 3) stay. `ladder3` tries the factors 16, 8, 4, 2, then the same
with the input's own sizes kept (the literals of `get_inputs()` and the constants only it reads: a classifier
sized for 224x224 images, VGG's `512 * 7 * 7`, MobileNet's `AvgPool2d(7)`); the first that builds and traces
wins.

Pure text in, text out (nothing is executed here); `ladder` and `ladder3` list the tries in order.
"""

from __future__ import annotations

import ast
import operator

from activities.kernels.task_source import input_constants

BATCH_NAMES = frozenset({"batch_size", "batch", "b"})
LEVEL3_MIN = 32
"""Level 3: integer literals from this size up are sizes the rule scales; smaller ones configure the model."""
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


def ladder3() -> list[tuple[int, bool]]:
    """Level 3: the (factor, scale get_inputs() literals too) settings tried in order."""
    return [(f, True) for f in (16, 8, 4, 2)] + [(f, False) for f in (16, 8, 4, 2)]


def scale(source: str, factor: int, inputs_too: bool = True) -> tuple[str, dict[str, object]]:
    """Level 3's rule: the source with module-level batch constants set to 2 and every integer literal
    >= LEVEL3_MIN divided by `factor` (the input's own sizes, those inside `get_inputs()` and the constants
    only it reads, only when `inputs_too`), and the settings made (`batch_size` -> 2, `factor`, `inputs`)."""
    tree = ast.parse(source)
    batch = {id(node.value) for node in tree.body if isinstance(node, ast.Assign)
             and isinstance(node.value, ast.Constant) and any(isinstance(t, ast.Name) and t.id in BATCH_NAMES
                                                               for t in node.targets)}
    kept: set[int] = set()
    if not inputs_too:  # get_inputs()'s literals, and the constants only it reads (an image's height and width)
        only_inputs = input_constants(source) - input_constants(source, function="get_init_inputs") - BATCH_NAMES
        kept = {id(n) for node in tree.body if (isinstance(node, ast.FunctionDef) and node.name == "get_inputs")
                or (isinstance(node, ast.Assign) and any(isinstance(t, ast.Name) and t.id in only_inputs
                                                         for t in node.targets)) for n in ast.walk(node)}
    made: dict[str, object] = {"factor": factor, "inputs": inputs_too}
    edits: list[tuple[int, int, int, str]] = []
    for node in ast.walk(tree):
        if not isinstance(node, ast.Constant) or isinstance(node.value, bool) or not isinstance(node.value, int):
            continue
        if id(node) in batch:
            new = min(node.value, 2)
            made["batch_size"] = new
        elif node.value >= LEVEL3_MIN and id(node) not in kept:
            new = max(1, node.value // factor)
        else:
            continue
        edits.append((node.lineno, node.col_offset, node.end_col_offset or node.col_offset, str(new)))
    lines = source.splitlines(keepends=True)
    for lineno, start, end, text in sorted(edits, reverse=True):
        raw = lines[lineno - 1].encode("utf-8")  # ast columns count UTF-8 bytes
        lines[lineno - 1] = (raw[:start] + text.encode() + raw[end:]).decode("utf-8")
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
