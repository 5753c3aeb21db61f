"""The offline designer: reads the traced reference (aten ops and their arguments, never the source text) through
the offline compiler (activities.kernels.compiler) and answers with its plan: the lowered graph's label, or one
line naming the op nothing offline can take.

Pure: a ReferenceAnalysis in, a KernelPlan (or the reason) out; the workflow runs it to name the family.
"""

from __future__ import annotations

from activities.kernels import compiler
from contracts.kernel_job import KernelDesign, KernelPlan, ReferenceAnalysis


def choose_plan(a: ReferenceAnalysis) -> KernelPlan | str:
    """The plan for this reference, or one line saying why there is none (naming the aten ops)."""
    lowered = compiler.lower(a)
    if isinstance(lowered, str):
        return f"{lowered} (aten ops: {', '.join(a.aten_ops) or 'none'})" if a.calls else lowered
    return KernelPlan(template="lowered", label=lowered.label, out_dtype="float32")


def design(a: ReferenceAnalysis | None) -> KernelDesign | str:
    """The offline designer's answer: a KernelDesign carrying the plan, or the reason there is none."""
    if a is None:
        return "no traced reference"
    plan = choose_plan(a)
    if isinstance(plan, str):
        return plan
    return KernelDesign(family=plan.template, block_sizes={}, grid="one grid per kernel launch, sized from the "
                        "run-time shapes",
                        tiling="the traced graph lowered op by op: pointwise chains fused into their consumer's "
                               "kernel, reductions over strided rows, matmul / implicit-GEMM convolution with tl.dot, "
                               "pooling and scans as their own kernels; torch only allocates and takes views",
                        notes=f"read from the traced reference: {plan.label}", plan=plan)
