"""The whole candidate file: the task's own model code (its imports, helper functions and modules, class attributes:
everything the reference's construction needs), the jit helpers, the generated kernels and their launchers, and
`class ModelNew(Model)`: the reference's construction as it is (parameters created in the same seeded order, with
the same names, bound by name in forward) with only `forward(*inputs)` replaced by the lowered graph."""

from __future__ import annotations

import ast

from activities.kernels.ast_parse import parse
from activities.kernels.compiler.expr import HELPERS
from activities.kernels.compiler.forward import STATE, Forward
from activities.kernels.compiler.graph import Graph, Refused

HEADER = '''import math

import torch
import torch.nn as nn
import triton
import triton.language as tl

'''
TASK_ONLY = frozenset({"get_inputs", "get_init_inputs"})
"""Top-level functions of the task file that only the harness calls: left out of the candidate."""


def render(graph: Graph, task_source: str, *, tf32: bool = False) -> str:
    """The candidate source for `graph`, lowered from the task in `task_source` (Refused when the task's model
    code cannot be carried over: no `class Model`, or a name the candidate's own code uses); `tf32`: the job's
    precision policy allows TF32 dots."""
    fw = Forward(graph, tf32=tf32)
    outs = fw.write()
    ret = outs[0] if len(outs) == 1 else "(" + ", ".join(outs) + ",)"
    body = "\n".join("        " + ln for ln in fw.prologue() + fw.lines + [f"return {ret}"])
    generated = HELPERS + "\n\n" + "\n\n".join(fw.kernels.values()) + STATE + "".join(fw.launchers.values())
    future, model = model_code(task_source, _defined(generated))
    return (future + HEADER + model + generated
            + f"\n\nclass ModelNew(Model):\n    def forward(self, *inputs):\n{body}\n")


def launches(graph: Graph) -> int:
    """How many kernel launches the candidate's forward makes."""
    fw = Forward(graph)
    fw.write()
    return fw.launches


def model_code(source: str, ours: set[str]) -> tuple[str, str]:
    """(its `from __future__` imports, which must open the file; the rest of the task file without what only the
    harness runs: get_inputs, get_init_inputs, a __main__ block)."""
    try:
        tree = parse(source)
    except SyntaxError as e:
        raise Refused(f"the task does not parse ({e.msg}, line {e.lineno})") from None
    if not any(isinstance(n, ast.ClassDef) and n.name == "Model" for n in tree.body):
        raise Refused("the task defines no top-level class Model to build the candidate on")
    clash = sorted(_defined(source) & ours)
    if clash:
        raise Refused(f"the task defines {', '.join(clash)}, which the candidate's generated code defines too")
    lines = source.splitlines()
    future = []
    for node in reversed(tree.body):
        harness = isinstance(node, ast.FunctionDef) and node.name in TASK_ONLY
        main = isinstance(node, ast.If) and "__name__" in ast.unparse(node.test)
        first = isinstance(node, ast.ImportFrom) and node.module == "__future__"
        if harness or main or first:
            start = node.decorator_list[0].lineno if getattr(node, "decorator_list", None) else node.lineno
            if first:
                future.insert(0, "\n".join(lines[start - 1: node.end_lineno]))
            del lines[start - 1: node.end_lineno]
    return "".join(f"{line}\n" for line in future), "\n".join(lines).rstrip() + "\n\n"


def _defined(source: str) -> set[str]:
    tree = parse(source)
    return {n.name for n in tree.body if isinstance(n, (ast.FunctionDef, ast.ClassDef))} | {
        t.id for n in tree.body if isinstance(n, ast.Assign) for t in n.targets if isinstance(t, ast.Name)}
