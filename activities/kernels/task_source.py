"""KernelBench-format task files as they are (pure `ast`: nothing is executed here).

A task is any Python file that defines `class Model`, `get_inputs()` and `get_init_inputs()`. Its
op name comes from the file name (`19_ReLU.py` -> `ReLU`), and its module-level numeric constants
(`batch_size = 4096`, `M = 1024 * 2`) can be set from the command line (`--set batch_size=16`): the
value expression in the source is replaced, so constants derived from it follow, and a comment on
the line says what was set. The file on disk is never changed.
"""

from __future__ import annotations

import ast
import operator
import re
from collections.abc import Callable

from contracts.errors import Err, FleetforgeError
from contracts.kernel import Number

REQUIRED = ("Model", "get_inputs", "get_init_inputs")
_BINOPS: dict[type, Callable[[Number, Number], Number]] = {
    ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul, ast.Div: operator.truediv,
    ast.FloorDiv: operator.floordiv, ast.Mod: operator.mod, ast.Pow: operator.pow,
}


def check_task(source: str, where: str) -> None:
    """Raise KERNEL_TASK_INVALID unless `source` parses and defines Model, get_inputs, get_init_inputs."""
    tree = _parse(source, where)
    defined = {n.name for n in tree.body if isinstance(n, (ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef))}
    defined |= {t.id for n in tree.body if isinstance(n, ast.Assign) for t in n.targets if isinstance(t, ast.Name)}
    missing = [name for name in REQUIRED if name not in defined]
    if missing:
        raise FleetforgeError(Err.KERNEL_TASK_INVALID,
                              f"{where}: not a KernelBench-format task: no {', '.join(missing)} at module level "
                              "(a task defines class Model, get_inputs() and get_init_inputs())")


def op_name_for(stem: str) -> str:
    """The op name a file name stands for: KernelBench's leading problem number and stray
    punctuation go (`19_ReLU` -> `ReLU`, `36_RMSNorm_` -> `RMSNorm`, `3d-conv` -> `op_3d_conv`)."""
    name = re.sub(r"[^A-Za-z0-9_]+", "_", stem)
    name = re.sub(r"^\d+_+", "", name)
    name = re.sub(r"_+", "_", name).strip("_")
    if not name:
        return "op"
    return name if re.match(r"[A-Za-z_]", name) else f"op_{name}"


def check_op_name(name: str) -> str:
    """An op name given by the user (`--op-name`): an identifier, or BAD_INPUT."""
    if not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", name):
        raise FleetforgeError(Err.BAD_INPUT, f"--op-name {name!r}: letters, digits and _ only, not starting with a digit")
    return name


def numeric_constants(source: str, where: str = "<task>") -> dict[str, Number]:
    """Module-level `NAME = <numeric expression>` assignments, evaluated in order (an expression may use
    earlier constants: `K = M * 2`)."""
    values: dict[str, Number] = {}
    for name, node in _constant_assignments(_parse(source, where)):
        value = _evaluate(node, values)
        if value is not None:
            values[name] = value
    return values


def parse_value(name: str, text: str) -> Number:
    """`--set NAME=VALUE`: VALUE is an int or a float literal."""
    text = text.strip()
    try:
        return int(text)
    except ValueError:
        pass
    try:
        return float(text)
    except ValueError:
        raise FleetforgeError(Err.BAD_INPUT, f"--set {name}={text}: VALUE must be a number") from None


def apply_overrides(source: str, overrides: dict[str, Number], where: str = "<task>") -> str:
    """The source with each overridden constant's value expression replaced by the new value (and a
    comment saying what it was). Raises KERNEL_TASK_INVALID for a name that is not a module-level
    numeric constant, listing the ones there are."""
    if not overrides:
        return source
    tree = _parse(source, where)
    known = numeric_constants(source, where)
    unknown = [n for n in overrides if n not in known]
    if unknown:
        have = ", ".join(f"{k}={v}" for k, v in known.items()) or "none"
        raise FleetforgeError(Err.KERNEL_TASK_INVALID,
                              f"--set {unknown[0]}: {where} has no module-level numeric constant '{unknown[0]}' "
                              f"(it has: {have})")
    lines = source.splitlines(keepends=True)
    edits = [(node, name) for name, node in _constant_assignments(tree) if name in overrides]
    for node, name in sorted(edits, key=lambda e: (e[0].lineno, e[0].col_offset), reverse=True):
        assert node.end_lineno is not None and node.end_col_offset is not None
        first, last = node.lineno - 1, node.end_lineno - 1
        was = ast.get_source_segment(source, node) or "?"
        tail = lines[last][node.end_col_offset:]
        newline = "\n" if tail.endswith("\n") else ""
        rest = tail.rstrip("\n")
        comment = f"  # --set {name}={overrides[name]!r} (was {' '.join(was.split())})"
        lines[first:last + 1] = [lines[first][:node.col_offset] + repr(overrides[name]) + rest + comment + newline]
    return "".join(lines)


def _parse(source: str, where: str) -> ast.Module:
    try:
        return ast.parse(source)
    except SyntaxError as e:
        raise FleetforgeError(Err.KERNEL_TASK_INVALID, f"{where}: line {e.lineno}: syntax error: {e.msg}") from None


def _constant_assignments(tree: ast.Module) -> list[tuple[str, ast.expr]]:
    found: list[tuple[str, ast.expr]] = []
    for node in tree.body:
        if isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name):
            found.append((node.targets[0].id, node.value))
        elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name) and node.value is not None:
            found.append((node.target.id, node.value))
    return found


def _evaluate(node: ast.expr, names: dict[str, Number]) -> Number | None:
    """A numeric constant expression's value, or None when it is anything else."""
    if isinstance(node, ast.Constant) and isinstance(node.value, (int, float)) and not isinstance(node.value, bool):
        return node.value
    if isinstance(node, ast.Name):
        return names.get(node.id)
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, (ast.USub, ast.UAdd)):
        inner = _evaluate(node.operand, names)
        return None if inner is None else (-inner if isinstance(node.op, ast.USub) else inner)
    if isinstance(node, ast.BinOp) and type(node.op) in _BINOPS:
        left, right = _evaluate(node.left, names), _evaluate(node.right, names)
        if left is None or right is None:
            return None
        try:
            return _BINOPS[type(node.op)](left, right)
        except (ArithmeticError, ValueError):
            return None
    return None
