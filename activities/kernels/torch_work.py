"""Which torch ops a candidate's `forward` may run outside its Triton launches, and the verdict when torch
did the work instead of the kernel (pure: no torch import; the child records, the verifier decides).

A candidate whose forward computes `torch.relu(x)` and launches a kernel that only copies the result into
the output has matching numbers and an output a kernel wrote, yet torch did the task (KernelBench's
"PyTorch wrapping"). So every aten op a forward call runs as a torch op (outside a launch) must be one
of the ALLOWED ops below; anything else (relu, addmm, _softmax, sum, mul, cat, ...) is torch doing
arithmetic or data movement the kernel should do, and is named with the candidate's line. The ops the
reference's traced graph computes are named first ("the reference's relu"), since that is the task.

A workflow.yaml may allow mixed kernels (`allow_mixed_kernels: true`): then torch may do part of the work,
and only the kernel-derived provenance check (`_child.LaunchRecorder`) still applies.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:  # the candidate's child imports this module: pydantic's contracts would cost it 0.3 s of CPU
    from contracts.kernel_job import TorchOpUse

ALLOCATION = frozenset({
    "empty", "empty_like", "empty_strided", "new_empty", "new_empty_strided", "zeros", "zeros_like", "new_zeros",
    "ones", "ones_like", "new_ones", "full", "full_like", "new_full", "scalar_tensor", "lift_fresh",
    "lift_fresh_copy", "fill_", "zero_",
})
"""Output and scratch buffers (and their initial fill, e.g. an accumulator's zeros): a kernel needs memory
to write into, and a constant fill computes nothing from the inputs."""
RANDOM = frozenset({"randn", "rand", "randn_like", "rand_like", "normal_", "uniform_"})
"""Random draws where the reference draws them (an LSTM's random initial state in forward): the same numbers
come from the same generator only if the candidate draws at the same point; they read no input values."""
VIEWS = frozenset({
    "view", "_unsafe_view", "_reshape_alias", "reshape", "view_as", "alias", "detach", "t", "transpose",
    "permute", "expand", "expand_as", "unsqueeze", "squeeze", "flatten", "unflatten", "slice", "select",
    "narrow", "as_strided", "split", "split_with_sizes", "unbind", "chunk", "unfold",
})
"""Views and reshapes: new shapes and strides over the same storage, no arithmetic (a transposed operand
is a kernel's strides)."""
CASTS_AND_COPIES = frozenset({"_to_copy", "clone", "contiguous", "copy_", "_local_scalar_dense"})
"""dtype casts (fp32 accumulation returned as fp16), contiguity (`.contiguous()` is a clone), copies into
outputs, and reading one value (`.item()` for a launch argument): they move values, they do not compute."""
ALLOWED = ALLOCATION | RANDOM | VIEWS | CASTS_AND_COPIES

MAX_REPORTED = 10


def op_name(overload: str) -> str:
    """`aten.relu.default` -> `relu`; `relu` stays."""
    parts = overload.split(".")
    if parts[0] == "aten" and len(parts) >= 2:
        return parts[1]
    return parts[0]


def is_allowed(name: str) -> bool:
    return op_name(name) in ALLOWED


def reference_compute_ops(aten_ops: list[str]) -> set[str]:
    """The ops of the reference's traced graph that do arithmetic (its allowed glue left out)."""
    return {op_name(o) for o in aten_ops if o != "getitem" and not o.startswith("get_attr") and not is_allowed(o)}


def torch_work(used: list[TorchOpUse], reference_ops: list[str]) -> tuple[str, list[TorchOpUse]]:
    """("", []) when torch only allocated, viewed, cast and copied; otherwise the reason (one line the coder
    can act on, the reference's own ops first) and the uses, each marked whether the reference computes it."""
    ref = reference_compute_ops(reference_ops)
    flagged = [u.model_copy(update={"in_reference": op_name(u.op) in ref}) for u in used if not is_allowed(u.op)]
    if not flagged:
        return "", []
    flagged.sort(key=lambda u: not u.in_reference)  # stable: the reference's ops first, then in order of use
    flagged = flagged[:MAX_REPORTED]
    parts = [_where(u) for u in flagged[:3]]
    more = f" (+{len(flagged) - 3} more)" if len(flagged) > 3 else ""
    names = ", ".join(dict.fromkeys(u.op for u in flagged))
    return (f"torch did the work, not the Triton kernel: {'; '.join(parts)}{more}. Compute {names} inside the "
            "kernel: outside its launches forward may only allocate, view/reshape, cast and copy tensors "
            "(a workflow.yaml can allow mixed kernels with allow_mixed_kernels: true)", flagged)


def _where(u: TorchOpUse) -> str:
    what = f"the reference's {u.op}" if u.in_reference else u.op
    at = f" at candidate.py:{u.line}" if u.line else ""
    code = f" `{u.code[:120]}`" if u.code else ""
    return f"{what} ran as torch op {u.overload or u.op}{at}{code}"
