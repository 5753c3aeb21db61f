"""Reject candidate kernel sources before running them: pure `ast`, nothing is executed.

A candidate must define `class ModelNew` whose `forward` launches (directly or through a helper
it calls) at least one `@triton.jit` kernel as `kernel[grid](...)`, may import only what a Triton
kernel needs (ALLOWED_IMPORTS), and must not patch torch / builtins to fake a comparison.

This is fast feedback for the coder, not the guarantee: the candidate runs in the sandbox
(activities/sandbox), which contains whatever gets past these checks.
"""

from __future__ import annotations

import ast

from activities.kernels.ast_parse import parse
from contracts.kernel import StaticReport

ALLOWED_IMPORTS = frozenset({"torch", "triton", "math", "typing", "__future__"})
"""What a Triton kernel module needs: torch (tensors, nn.Module, allocation), triton and triton.language (the
kernel DSL, `triton.cdiv`), math (constants, ceil/log2 for block sizes), typing and __future__ (annotations).
Nothing else: numpy, pickle, io, pathlib, os, urllib, ... have no place in a kernel."""
FORBIDDEN_SUBMODULES = frozenset({"torch.utils.cpp_extension", "torch.hub", "torch.multiprocessing",
                                  "torch.distributed", "torch.utils.data", "torch.package", "torch.serialization"})
"""Parts of torch that compile native code, download, spawn processes or unpickle: not kernel code."""
FORBIDDEN_ATTRIBUTES = frozenset({"torch.save", "torch.load", "torch.from_file", "torch.ops.load_library",
                                  "torch.classes.load_library", *FORBIDDEN_SUBMODULES})
"""torch entry points that touch files or load native code, refused wherever they are referenced."""
FORBIDDEN_CALLS = frozenset({"__import__", "eval", "exec", "open", "compile", "breakpoint"})
PATCH_GUARDED_ROOTS = frozenset({"torch", "builtins", "__builtins__", "triton", "numpy", "np"})
"""Modules whose attributes a candidate may not assign (e.g. `torch.allclose = ...`)."""


def static_check(source: str, task_source: str = "") -> StaticReport:
    """`task_source`: the task the candidate is for; the modules it imports may be imported by the candidate too
    (a whole-model candidate carries the task's model code: a helper from einops, a transformers layer). The task
    runs them already, in the same sandbox."""
    try:
        tree = parse(source)
    except SyntaxError as e:
        return StaticReport(ok=False, reasons=[f"syntax error at line {e.lineno}: {e.msg}"])
    reasons = _forbidden(tree, task_imports(task_source))
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


def task_imports(task_source: str) -> frozenset[str]:
    """The top-level modules a task file imports (none when it does not parse)."""
    try:
        tree = parse(task_source)
    except SyntaxError:
        return frozenset()
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found |= {a.name.split(".")[0] for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            found.add(node.module.split(".")[0])
    return frozenset(found)


def _forbidden(tree: ast.Module, allowed: frozenset[str] = frozenset()) -> list[str]:
    reasons: list[str] = []
    for node in ast.walk(tree):
        line = getattr(node, "lineno", "?")
        if isinstance(node, ast.Import):
            for alias in node.names:
                if problem := _import_problem(alias.name, allowed):
                    reasons.append(f"line {line}: {problem}")
        elif isinstance(node, ast.ImportFrom):
            module = "." * node.level + (node.module or "")
            names = [f"{module}.{a.name}" for a in node.names] if module == "torch" or module.startswith("torch.") else []
            for name in [module, *names]:
                if problem := _import_problem(name, allowed):
                    reasons.append(f"line {line}: {problem}")
                    break
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
        elif isinstance(node, ast.Attribute) and (dotted := _dotted(node)) in FORBIDDEN_ATTRIBUTES:
            reasons.append(f"line {line}: '{dotted}' is not allowed in a kernel candidate (files, native code)")
        elif isinstance(node, ast.Name) and node.id == "__builtins__":
            reasons.append(f"line {line}: forbidden use of '__builtins__'")
    return reasons


def _import_problem(name: str, allowed: frozenset[str] = frozenset()) -> str:
    if name.split(".")[0] not in ALLOWED_IMPORTS | allowed:
        return (f"import '{name}' is not allowed: a kernel candidate may import only "
                f"{', '.join(sorted(ALLOWED_IMPORTS - {'__future__'}))}")
    if any(name == m or name.startswith(m + ".") for m in FORBIDDEN_SUBMODULES):
        return f"import '{name}' is not allowed: it is not kernel code (native builds, downloads, processes, pickles)"
    return ""


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
    """Does `fn` launch a kernel, itself or through module functions / `self.` methods it calls (or passes to a call:
    `_each_layer(x, run=_steps)` runs the function it is given: an LLM's launcher passed as a callback)?"""
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
        passed = [a for a in [*node.args, *(k.value for k in node.keywords)]
                  if isinstance(a, ast.Name) and a.id in functions and a.id not in kernels]
        if any(_launches(functions[a.id], kernels, functions, methods, seen) for a in passed):
            return True
    return False
