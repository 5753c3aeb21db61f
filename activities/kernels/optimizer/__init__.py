"""The offline optimizer: deterministic rewrites of the compiler's lowered graph (the `optimizer` agent of
workflow.yaml when no LLM answers), registered like the compiler's passes. Unlike those exact passes, a rewrite
changes how the graph is computed (one launch per row, an epilogue inside a matmul's tile loop), so its candidate
is verified again, and it replaces the best one only when it is faster (measured on a GPU, modeled elsewhere): the
conductor's stop rules decide how many rounds run (workflows/conductor_policy.py). Block sizes are not a rewrite:
each launcher picks a GPU's from the run-time shapes (compiler/blocks/common.py, `GPU_GRID`).

    @rewrite("rows", order=10, summary="one launch per row: online softmax, one-read norms")
    def rows(graph) -> graph | None: ...     # None: nothing to rewrite in this graph

Each round proposes the next untried combination (`plan`): every applicable rewrite at once first (one
verification when it works), then each alone. The candidate says which rewrites it applies (`Proposal.rewrite`),
and the trace shows each with its modeled figures.
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

Lower = Callable[[Any], Any]
"""The compiler's lowering: a ReferenceAnalysis to a graph (`nodes`, `outputs`), or a string saying why not."""
Render = Callable[[Any], str]
"""The compiler's rendering of a graph into the candidate's source."""


@dataclass(frozen=True)
class Rewrite:
    name: str
    order: int
    summary: str
    fn: Callable[[Any], Any]
    """graph -> the rewritten graph, or None when the graph has nothing this rewrite applies to."""


REWRITES: dict[str, Rewrite] = {}
NODE_OPS = ("rows", "epilogue", "attention", "persistent_recurrent")
"""The graph node kinds the rewrites introduce (beyond the compiler's NODE_OPS), each with its emitter registered
through the compiler's `registry.emits` when `load()` imports the rewrite modules."""


def load() -> None:
    """Import the rewrite modules: their rewrites register here, their nodes' emitters in the compiler (lazily: they
    import the compiler, which a workflow-side import of this package must not pay for)."""
    from activities.kernels.optimizer import attention, epilogue, recurrent, rows  # noqa: F401


def rewrite(name: str, *, order: int, summary: str) -> Callable:
    """Register the decorated graph -> graph | None function as the optimizer's rewrite `name`."""

    def register(fn: Callable[[Any], Any]) -> Callable[[Any], Any]:
        if name in REWRITES:
            raise ValueError(f"optimizer rewrite {name} registered twice")
        REWRITES[name] = Rewrite(name=name, order=order, summary=summary, fn=fn)
        return fn

    return register


def reaches(graph: Any, v: int, nodes: set[int]) -> bool:
    """Does graph value v depend on one of `nodes` (through any chain of arguments)?"""
    todo, seen = [v], set()
    while todo:
        n = todo.pop()
        if n in nodes:
            return True
        if n not in seen:
            seen.add(n)
            todo += [a for a in graph.nodes[n].args if isinstance(a, int)]
    return False


@dataclass(frozen=True)
class Proposal:
    source: str
    rewrite: str
    """`+`-joined names of the rewrites the candidate applies, in order."""


def plan(full: list[str], singles: list[str], tried: list[str]) -> list[str] | None:
    """The next combination of rewrites to try: `full` (every rewrite that still changes the graph after the ones
    before it) first, then, unless that one was kept (a part of it would only undo some of the gain), each applicable
    rewrite alone; None when none is left. `tried` holds the `+`-joined combinations of earlier rounds, each with its
    verdict once verified (`rows+epilogue=kept`)."""
    verdicts = dict(t.split("=", 1) if "=" in t else (t, "") for t in tried)
    if verdicts.get("+".join(full)) == "kept":
        return None
    combos = [full] + [[name] for name in singles if [name] != full]
    return next((c for c in combos if "+".join(c) not in verdicts), None)


def propose(reference: Any, tried: list[str], lower: Lower, render: Render) -> Proposal | str:
    """The next rewritten candidate for the traced reference, or why there is none."""
    graph = lower(reference)
    if isinstance(graph, str):
        return f"no rewrite: the reference does not lower ({graph})"
    ordered = sorted(REWRITES.values(), key=lambda r: (r.order, r.name))
    singles = [r.name for r in ordered if r.fn(copy.deepcopy(graph)) is not None]
    if not singles:
        return "no registered rewrite applies to this graph" if REWRITES else "no optimizer rewrite is registered"
    full, rewritten = _apply(copy.deepcopy(graph), singles)
    combo = plan(full, singles, tried)
    if combo is None:
        return f"every applicable rewrite was tried ({', '.join(tried)})"
    applied, rewritten = (full, rewritten) if combo == full else _apply(graph, combo)
    try:
        return Proposal(source=render(rewritten), rewrite="+".join(applied))
    except Exception as e:  # noqa: BLE001 - a rewrite's emitter bug must not cost the job its verified kernel
        return (f"the rewrite {'+'.join(applied)} could not be written out ({type(e).__name__}: {e}): a bug in "
                "fleetforge's optimizer, to report; the verified candidate stands")


def _apply(graph: Any, names: list[str]) -> tuple[list[str], Any]:
    """The rewrites applied in order (a rewrite that finds nothing left to do after the ones before it is left out)
    and the graph they made."""
    applied = []
    for name in names:
        rewritten = REWRITES[name].fn(graph)
        if rewritten is not None:
            graph = rewritten
            applied.append(name)
    return applied, graph


def offline_answer(task_source: str, reference: Any, tried: list[str], *, tf32: bool = False) -> Proposal | str:
    """The offline optimizer's answer for a task: the next rewritten candidate from the offline compiler, or why
    there is none (no rewrite registered or applicable, every one tried, the reference does not lower); `tf32`: the
    job's precision policy allows TF32 dots."""
    load()
    if not REWRITES:
        return "no optimizer rewrite is registered"
    if reference is None:
        return "no rewrite: the traced reference is missing"
    from activities.kernels import compiler

    return propose(reference, tried, compiler.lower, lambda graph: compiler.render(graph, task_source, tf32=tf32))
