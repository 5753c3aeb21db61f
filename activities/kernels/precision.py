"""The precision policies a kernel job declares (contracts.kernel.PrecisionPolicy), as numbers and rules: one
home for the tolerance, whether TF32 may be used, and the refusal of a TF32 dot under the strict policy.

* strict (default): IEEE fp32. rtol = 1e-4 and atol = 1e-4 x max(1, the output's largest magnitude) for fp32
  outputs (1e-2 for fp16/bf16); the reference and the baselines run with TF32 off; a candidate's `tl.dot` on fp32
  operands must say input_precision="ieee" (Triton's default is TF32, which a GPU computes with 10 mantissa bits
  while the CPU interpreter computes exactly: the interpreter is made to round like the GPU, and the strict
  policy refuses the dot outright, naming it).
* kernelbench: KernelBench's own check, atol = rtol = 1e-2 (atol scaled by the output's magnitude like the strict
  one, so the large-input family keeps a relative meaning), TF32 allowed in the candidate, the reference and the
  baselines alike. A TF32 speedup is only ever compared with a TF32 baseline: TF32 on one side only is the
  best-known fake speedup.
"""

from __future__ import annotations

from typing import Any

from contracts.kernel import PrecisionPolicy
from contracts.kernel_job import LaunchCost

HALF_DTYPES = ("float16", "bfloat16")


def tolerance(policy: PrecisionPolicy, dtype: Any) -> float:
    """rtol (and atol before scaling) for an output of `dtype` (a torch dtype or its name)."""
    if policy is PrecisionPolicy.KERNELBENCH:
        return 1e-2
    return 1e-2 if str(dtype).removeprefix("torch.") in HALF_DTYPES else 1e-4


def allows_tf32(policy: PrecisionPolicy) -> bool:
    return policy is PrecisionPolicy.KERNELBENCH


def tf32_problem(launches: list[LaunchCost], policy: PrecisionPolicy) -> str:
    """Why a candidate breaks the policy by computing in TF32 ("" when it does not)."""
    if allows_tf32(policy):
        return ""
    used = [c.kernel for c in launches if c.tf32_flops]
    if not used:
        return ""
    return (f"precision policy strict (IEEE fp32): tl.dot in {', '.join(dict.fromkeys(used))} runs in TF32 on a GPU "
            "(Triton's default input_precision for fp32 operands, 10 mantissa bits); pass input_precision=\"ieee\", "
            "or run the job with --precision kernelbench (atol/rtol 1e-2, TF32 allowed)")
