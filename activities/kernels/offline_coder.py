"""The offline coder: the candidate for the offline designer's plan, written by the offline compiler
(activities.kernels.compiler) from the traced reference (no LLM)."""

from __future__ import annotations

from activities.kernels import compiler, offline_designer
from activities.kernels.precision import allows_tf32
from contracts.kernel import KernelTask
from contracts.kernel_job import KernelDesign, KernelPlan, ReferenceAnalysis


def plan_for(task: KernelTask, design: KernelDesign | None, reference: ReferenceAnalysis | None) -> KernelPlan | str:
    """The plan to render: the offline designer's (carried by its design), else chosen now from the
    traced reference (an LLM designer's sketch is not a plan)."""
    if design is not None and design.plan is not None:
        return design.plan
    if reference is None:
        return f"no traced reference for '{task.op_name}'"
    return offline_designer.choose_plan(reference)


def code(task: KernelTask, design: KernelDesign | None, reference: ReferenceAnalysis | None) -> str | None:
    """A full candidate source, or None when there is none (`plan_for` says why)."""
    plan = plan_for(task, design, reference)
    if isinstance(plan, str):
        return None
    source = render(plan, task.task_desc, reference, tf32=allows_tf32(task.precision))
    return source if not source.startswith("no offline") else None


def render(plan: KernelPlan, task_source: str, reference: ReferenceAnalysis | None = None, *,
           tf32: bool = False) -> str:
    """The candidate for a plan, lowered again from the traced reference (the plan carries only its label, so
    history stays small); without a reference the answer is a refusal line starting "no offline". `tf32`: the
    job's precision policy allows TF32 dots (precision.allows_tf32)."""
    lowered = compiler.lower(reference) if reference is not None else "no traced reference"
    if isinstance(lowered, str):
        return f"no offline lowering: {lowered}"
    return compiler.render(lowered, task_source, tf32=tf32)


def render_answer(source: str) -> str:
    """The offline coder's answer in the agreed format: one fenced python block (parsed by the same
    code parser as an LLM's)."""
    return f"```python\n{source.rstrip()}\n```\n"
