"""KernelBench-format task files as they are (pure `ast`: nothing is executed here).

A task is any Python file that defines `class Model`, `get_inputs()` and `get_init_inputs()`. Its
op name comes from the file name (`19_ReLU.py` -> `ReLU`), and its module-level numeric constants
(`batch_size = 4096`, `M = 1024 * 2`, `height = width = 128`, `height, width = 128, 128`,
`dim: int = 16`) can be set from the command line (`--set batch_size=16`): the value expression in the
source is replaced, so constants derived from it follow, and a comment on the line says what was set. The file on disk is never changed.

Sizes written as literals in `get_inputs()` (`torch.randn(3, 1001)`) are found too (`literal_sizes`) and can be
set the same way under a key that says where they stand (`1001@21:30`: the literal 1001 at line 21, column 30):
the verifier's held-out sizes vary them like constants.
"""

from __future__ import annotations

import ast
import operator
import re
from collections.abc import Callable
from typing import NamedTuple

from activities.kernels.ast_parse import parse
from contracts.errors import Err, FleetforgeError
from contracts.kernel import Number

REQUIRED = ("Model", "get_inputs", "get_init_inputs")
SIZE_FACTORIES = frozenset({"randn", "rand", "zeros", "ones", "empty", "randint", "full"})
"""torch's tensor factories whose size argument `literal_sizes` reads (randint's and full's size only)."""
_LITERAL_KEY = re.compile(r"^(\d+)@(\d+):(\d+)$")
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
    """Module-level numeric constants, evaluated in order (an expression may use earlier constants:
    `K = M * 2`), in every form KernelBench writes them: `a = 1`, `a = b = 128`, `a, b = 128, 64`,
    `a: int = 1`."""
    values: dict[str, Number] = {}
    for statement in _constant_statements(_parse(source, where)):
        found = {name: _evaluate(node, values) for name, node in statement.pairs}  # right side first, as Python
        values.update({name: value for name, value in found.items() if value is not None})
    return values


def literal_constants(source: str, where: str = "<task>") -> dict[str, Number]:
    """The numeric constants written as numbers (`dim = 1024`, `h, w = 32, 32`), not derived from other
    constants (`K = M * 2`): setting these changes the task, the derived ones follow."""
    values = numeric_constants(source, where)
    literal = {name for st in _constant_statements(_parse(source, where)) for name, node in st.pairs
               if not any(isinstance(n, ast.Name) for n in ast.walk(node))}
    derived = {name for st in _constant_statements(_parse(source, where)) for name, node in st.pairs} - literal
    return {k: v for k, v in values.items() if k in literal and k not in derived}


def input_constants(source: str, where: str = "<task>", function: str = "get_inputs") -> set[str]:
    """The module-level constants `get_inputs()` (or `function`) reads, directly or through the constants they
    are derived from (`K = M * 2`): the input sizes. Constants only `get_init_inputs()` reads (kernel size,
    stride, groups, a reduction dim) configure the operation itself."""
    tree = _parse(source, where)
    body = next((n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == function), None)
    if body is None:
        return set()
    values = {name: node for st in _constant_statements(tree) for name, node in st.pairs}
    found: set[str] = set()
    todo = [n.id for n in ast.walk(body) if isinstance(n, ast.Name)]
    while todo:
        name = todo.pop()
        if name in values and name not in found:
            found.add(name)
            todo += [n.id for n in ast.walk(values[name]) if isinstance(n, ast.Name)]
    return found


def literal_sizes(source: str, where: str = "<task>") -> dict[str, int]:
    """The integer literals (> 1) `get_inputs()` passes to a tensor factory as a size (`torch.randn(3, 1001)`,
    `torch.rand((8, 64))`, `size=(...)`, randint's and full's size argument), by key `VALUE@LINE:COL` (COL
    counts from 1), in the file's order. `apply_overrides` takes these keys."""
    tree = _parse(source, where)
    body = next((n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == "get_inputs"), None)
    found: dict[str, int] = {}
    if body is None:
        return found
    lines = source.splitlines()
    for call in ast.walk(body):
        if not isinstance(call, ast.Call):
            continue
        name = call.func.attr if isinstance(call.func, ast.Attribute) else getattr(call.func, "id", "")
        if name not in SIZE_FACTORIES:
            continue
        for node in _size_literals(name, call):
            col = _char_col(lines[node.lineno - 1], node.col_offset) + 1
            found[f"{node.value}@{node.lineno}:{col}"] = node.value
    return dict(sorted(found.items(), key=lambda kv: tuple(map(int, kv[0].split("@")[1].split(":")))))


def _size_literals(name: str, call: ast.Call) -> list[ast.Constant]:
    """The integer literals of a factory call's size argument(s)."""
    args: list[ast.expr] = [k.value for k in call.keywords if k.arg == "size"]
    if not args:
        if name == "randint":
            args = call.args[-1:] if len(call.args) >= 2 else []
        elif name == "full":
            args = call.args[:1]
        else:
            args = list(call.args)
    elts = [e for a in args for e in (a.elts if isinstance(a, (ast.Tuple, ast.List)) else [a])]
    return [e for e in elts if isinstance(e, ast.Constant) and isinstance(e.value, int)
            and not isinstance(e.value, bool) and e.value > 1]


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
    comment saying what it was). A chained `a = b = 128` becomes `a = 64; b = 128` on the same line, so
    only the names set change. A `VALUE@LINE:COL` key (`literal_sizes`) sets that literal of get_inputs().
    Raises KERNEL_TASK_INVALID for a name that is not a module-level numeric constant (or a literal size),
    listing the ones there are."""
    literals = {k: v for k, v in overrides.items() if _LITERAL_KEY.match(k)}
    if literals:
        source = _set_literals(source, literals, where)
        overrides = {k: v for k, v in overrides.items() if k not in literals}
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
    edits = [s for s in _constant_statements(tree) if any(name in overrides for name, _ in s.pairs)]
    for st in sorted(edits, key=lambda e: e.node.lineno, reverse=True):
        node = st.node
        assert node.end_lineno is not None and node.end_col_offset is not None
        first, last = node.lineno - 1, node.end_lineno - 1
        start, end = _char_col(lines[first], node.col_offset), _char_col(lines[last], node.end_col_offset)
        text = "".join(lines[first:last + 1])
        stmt_end = len(text) - len(lines[last]) + end
        set_names = [name for name, _ in st.pairs if name in overrides]
        comment = (f"  # --set {', '.join(f'{n}={overrides[n]!r}' for n in set_names)} "
                   f"(was {' '.join(text[start:stmt_end].split())})")
        tail = text[stmt_end:]
        newline = "\n" if tail.endswith("\n") else ""
        lines[first:last + 1] = [text[:start] + _rewritten(st, text, lines, overrides) + tail.rstrip("\n")
                                 + comment + newline]
    return "".join(lines)


def _set_literals(source: str, literals: dict[str, Number], where: str) -> str:
    known = literal_sizes(source, where)
    unknown = [k for k in literals if k not in known]
    if unknown:
        raise FleetforgeError(Err.KERNEL_TASK_INVALID,
                              f"--set {unknown[0]}: {where} has no literal size {unknown[0]} in get_inputs() "
                              f"(it has: {', '.join(known) or 'none'})")
    lines = source.splitlines(keepends=True)
    for key in sorted(literals, key=lambda k: tuple(int(x) for x in _LITERAL_KEY.match(k).groups()[1:]),  # type: ignore[union-attr]
                      reverse=True):
        value, line, col = (int(x) for x in _LITERAL_KEY.match(key).groups())  # type: ignore[union-attr]
        text = lines[line - 1]
        lines[line - 1] = text[:col - 1] + repr(literals[key]) + text[col - 1 + len(str(value)):]
    return "".join(lines)


def _rewritten(st: "_Statement", text: str, lines: list[str], overrides: dict[str, Number]) -> str:
    """The statement with the overridden values: each its own `name = value` when names share one value
    (chained), else the value expressions replaced where they stand."""
    first = st.node.lineno - 1

    def span(n: ast.AST) -> tuple[int, int]:  # n's start and end in `text` (the statement's lines joined)
        def at(lineno: int, col: int) -> int:
            return sum(len(ln) for ln in lines[first:lineno - 1]) + _char_col(lines[lineno - 1], col)
        return at(n.lineno, n.col_offset), at(n.end_lineno or n.lineno, n.end_col_offset or 0)

    def value(name: str, v: ast.expr) -> str:
        a, b = span(v)
        return repr(overrides[name]) if name in overrides else " ".join(text[a:b].split())

    if st.shared:
        return "; ".join(f"{name} = {value(name, v)}" for name, v in st.pairs)
    start, end = span(st.node)
    out = text[start:end]
    for a, b, name in sorted(((*span(v), name) for name, v in st.pairs if name in overrides), reverse=True):
        out = out[:a - start] + repr(overrides[name]) + out[b - start:]
    return " ".join(out.split())


def _char_col(line: str, byte_col: int) -> int:
    """ast columns count UTF-8 bytes; lines are str."""
    return len(line.encode("utf-8")[:byte_col].decode("utf-8", errors="ignore"))


def _parse(source: str, where: str) -> ast.Module:
    try:
        return parse(source)
    except SyntaxError as e:
        raise FleetforgeError(Err.KERNEL_TASK_INVALID, f"{where}: line {e.lineno}: syntax error: {e.msg}") from None


class _Statement(NamedTuple):
    node: ast.stmt
    pairs: list[tuple[str, ast.expr]]
    """Each name the statement binds and the value expression it gets."""
    shared: bool
    """Several names share one expression (`a = b = 128`)."""


def _constant_statements(tree: ast.Module) -> list[_Statement]:
    """Module-level assignments of names: `a = v`, `a = b = v`, `a, b = v1, v2` (tuple or list on both
    sides), `a: int = v`. Other targets (attributes, starred, unpacking a call) are not constants."""
    found: list[_Statement] = []
    for node in tree.body:
        if isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name) and node.value is not None:
            found.append(_Statement(node, [(node.target.id, node.value)], False))
        elif isinstance(node, ast.Assign):
            pairs: list[tuple[str, ast.expr]] = []
            for target in node.targets:
                if isinstance(target, ast.Name):
                    pairs.append((target.id, node.value))
                elif (isinstance(target, (ast.Tuple, ast.List)) and isinstance(node.value, (ast.Tuple, ast.List))
                      and len(target.elts) == len(node.value.elts)
                      and all(isinstance(t, ast.Name) for t in target.elts)):
                    pairs += [(t.id, v) for t, v in zip(target.elts, node.value.elts) if isinstance(t, ast.Name)]
            if pairs:
                found.append(_Statement(node, pairs, len({id(v) for _, v in pairs}) < len(pairs)))
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
