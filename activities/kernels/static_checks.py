"""Reject candidate kernel sources before running them: pure `ast`, nothing is executed.

A candidate must define `class ModelNew` whose `forward` launches (directly or through a helper
it calls) at least one `@triton.jit` kernel as `kernel[grid](...)`, and must not reach for the
process, the network, the file system, or patch torch / builtins to fake a comparison.
"""

from __future__ import annotations

import ast

from contracts.kernel import StaticReport

FORBIDDEN_MODULES = frozenset(
    {"os", "subprocess", "socket", "ctypes", "sys", "shutil", "importlib", "builtins", "multiprocessing", "pty"}
)
FORBIDDEN_CALLS = frozenset({"__import__", "eval", "exec", "open", "compile", "breakpoint"})
PATCH_GUARDED_ROOTS = frozenset({"torch", "builtins", "__builtins__", "triton", "numpy", "np"})
"""Modules whose attributes a candidate may not assign (e.g. `torch.allclose = ...`)."""


def static_check(source: str) -> StaticReport:
    try:
        tree = ast.parse(source)
    except SyntaxError as e:
        return StaticReport(ok=False, reasons=[f"syntax error at line {e.lineno}: {e.msg}"])
    reasons = _forbidden(tree)
    reasons += _structure(tree)
    return StaticReport(ok=not reasons, reasons=reasons)


def _root_name(node: ast.AST) -> str | None:
    while isinstance(node, (ast.Attribute, ast.Subscript)):
        node = node.value
    return node.id if isinstance(node, ast.Name) else None


def _dotted(node: ast.AST) -> str:
    if isinstance(node, ast.Attribute):
        return f"{_dotted(node.value)}.{node.attr}"
    if isinstance(node, ast.Name):
        return node.id
    return "<expr>"


def _forbidden(tree: ast.Module) -> list[str]:
    reasons: list[str] = []
    for node in ast.walk(tree):
        line = getattr(node, "lineno", "?")
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.split(".")[0] in FORBIDDEN_MODULES:
                    reasons.append(f"line {line}: forbidden import '{alias.name}'")
        elif isinstance(node, ast.ImportFrom):
            if node.module and node.module.split(".")[0] in FORBIDDEN_MODULES:
                reasons.append(f"line {line}: forbidden import from '{node.module}'")
        elif isinstance(node, ast.Call):
            if isinstance(node.func, ast.Name) and node.func.id in FORBIDDEN_CALLS:
                reasons.append(f"line {line}: forbidden call '{node.func.id}()'")
            elif isinstance(node.func, ast.Name) and node.func.id in {"setattr", "delattr"} and node.args:
                if _root_name(node.args[0]) in PATCH_GUARDED_ROOTS:
                    reasons.append(f"line {line}: forbidden {node.func.id}() on '{_dotted(node.args[0])}'")
        elif isinstance(node, (ast.Assign, ast.AugAssign, ast.AnnAssign, ast.Delete)):
            targets = node.targets if isinstance(node, (ast.Assign, ast.Delete)) else [node.target]
            for target in _flatten(targets):
                if isinstance(target, (ast.Attribute, ast.Subscript)) and _root_name(target) in PATCH_GUARDED_ROOTS:
                    reasons.append(f"line {line}: forbidden assignment to '{_dotted(target)}' (monkeypatching)")
        elif isinstance(node, ast.Name) and node.id == "__builtins__":
            reasons.append(f"line {line}: forbidden use of '__builtins__'")
    return reasons


def _flatten(targets: list[ast.expr]) -> list[ast.expr]:
    out: list[ast.expr] = []
    for t in targets:
        if isinstance(t, (ast.Tuple, ast.List)):
            out.extend(_flatten(list(t.elts)))
        else:
            out.append(t)
    return out


def _is_triton_jit(decorator: ast.expr) -> bool:
    target = decorator.func if isinstance(decorator, ast.Call) else decorator
    return _dotted(target) in {"triton.jit", "jit"}


def _structure(tree: ast.Module) -> list[str]:
    functions = {n.name: n for n in tree.body if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))}
    kernels = {name for name, fn in functions.items() if any(_is_triton_jit(d) for d in fn.decorator_list)}
    model = next((n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == "ModelNew"), None)
    if model is None:
        return ["no top-level 'class ModelNew'"]
    methods = {n.name: n for n in model.body if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))}
    if "forward" not in methods:
        return ["ModelNew has no 'forward' method"]
    if not kernels:
        return ["no '@triton.jit' kernel defined at module level"]
    if not _launches(methods["forward"], kernels, functions, methods):
        return [f"ModelNew.forward launches no @triton.jit kernel as kernel[grid](...) (kernels: {', '.join(sorted(kernels))})"]
    return []


def _launches(
    fn: ast.AST,
    kernels: set[str],
    functions: dict[str, ast.AST],
    methods: dict[str, ast.AST],
    seen: set[int] | None = None,
) -> bool:
    """Does `fn` launch a kernel, itself or through module functions / `self.` methods it calls?"""
    seen = seen if seen is not None else set()
    if id(fn) in seen:
        return False
    seen.add(id(fn))
    for node in ast.walk(fn):
        if not isinstance(node, ast.Call):
            continue
        callee = node.func
        if isinstance(callee, ast.Subscript) and isinstance(callee.value, ast.Name) and callee.value.id in kernels:
            return True
        nxt = None
        if isinstance(callee, ast.Name) and callee.id in functions and callee.id not in kernels:
            nxt = functions[callee.id]
        elif (
            isinstance(callee, ast.Attribute)
            and isinstance(callee.value, ast.Name)
            and callee.value.id == "self"
            and callee.attr in methods
        ):
            nxt = methods[callee.attr]
        if nxt is not None and _launches(nxt, kernels, functions, methods, seen):
            return True
    return False
