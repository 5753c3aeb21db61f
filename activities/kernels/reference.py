"""Read a task's reference without running its computation (the `_probe` child: meta tensors and an
aten trace), and decide whether the verifier can hold it.

`trace_reference` is the worker side (the conductor's first activity); the CLI runs it too, before
anything starts, to refuse a task that cannot fit and say which `--set` names shrink it.
"""

from __future__ import annotations

import hashlib
import importlib.util
import math
from collections.abc import Callable

from activities.kernels._proc import MEMORY_LIMIT_BYTES, spawn, wait_all
from activities.kernels.lru import LRU
from activities.scratch import Scratch
from contracts.errors import Err, FleetforgeError
from contracts.kernel_job import ReferenceAnalysis, TensorSpec

CHILD_BASELINE_BYTES = int(1.5 * 1024**3)
"""Address space torch and triton take in a child before any data (measured: about 0.9 GiB, plus margin)."""
WORKING_SET_FACTOR = 4
"""The candidate child holds the inputs, the interpreter's copies of every launch argument, the
launch recorder's before-images and the outputs: about four times inputs, parameters and outputs."""
PRECHECK_TIMEOUT_S = 300
"""The CLI's reading of the task (build and trace on the meta device): a whole model's trace takes seconds."""
SLOW_INPUT_BYTES = 64 * 1024**2
"""Above this the Triton interpreter takes minutes per trial: worth a hint, not a refusal."""
_ANALYSES: LRU[ReferenceAnalysis] = LRU(64)
"""The probe's analyses by (task source, seed, held-out): a rerun of a task in this worker skips the child
(about 4 s of CPU for torch's import and the trace)."""


def trace_reference(task_source: str, *, timeout_s: float, seed: int = 0,
                    heartbeat: Callable[[str], None] | None = None, held_out: bool = True) -> ReferenceAnalysis:
    """The probe's ReferenceAnalysis, with its held-out sizes unless `held_out` is false (then only what the
    task is: the CLI's size check). A task that cannot be built or traced on the meta device comes back
    with `trace_error` set (sizes unknown, no offline template; the verifier still runs it for real); a
    probe that crashes or times out raises KERNEL_TASK_INVALID with the task's own error (not remembered)."""
    key = hashlib.sha256(f"{seed}:{held_out}:{task_source}".encode()).hexdigest()
    if (known := _ANALYSES.get(key)) is not None:
        return known.model_copy(deep=True)
    with Scratch("probe") as root:
        (root / "task.py").write_text(task_source, encoding="utf-8")
        args = ["task.py", "analysis.json", str(seed)] + ([] if held_out else ["--no-held-out"])
        child = spawn("activities.kernels._probe", root, args, gpu=False, timeout_s=timeout_s)
        try:
            wait_all({"probe": child}, timeout_s, heartbeat or (lambda _m: None))
        finally:
            child.kill()
        if child.error:
            detail = child.log_excerpt.replace("candidate.py", "task.py") or child.error
            raise FleetforgeError(Err.KERNEL_TASK_INVALID,
                                  f"reading the task failed ({child.error.split(':')[0]}): "
                                  + " | ".join(detail.splitlines()[-6:]))
        analysis = ReferenceAnalysis.model_validate_json((root / "analysis.json").read_text(encoding="utf-8"))
    _ANALYSES.put(key, analysis)
    return analysis.model_copy(deep=True)


def precheck(source: str, name: str) -> str:
    """Before a job starts (the CLI): KERNEL_TASK_INVALID when the task cannot be built or the verifier
    cannot hold its inputs (with the --set names that shrink it); else a hint when the interpreter will be
    slow, or "". Needs torch (the kernels extra): without it the worker checks, and this returns "". The
    probe child imports torch; this process only looks for it (importing it here would cost the CLI 2 s)."""
    if importlib.util.find_spec("torch") is None:
        return ""
    try:
        analysis = trace_reference(source, timeout_s=PRECHECK_TIMEOUT_S, held_out=False)
    except FleetforgeError as e:
        raise FleetforgeError(e.code, f"{name}: {e.message}") from None
    problem = size_problem(analysis)
    if problem:
        raise FleetforgeError(Err.KERNEL_TASK_INVALID, f"{name}: {problem}")
    hint = slow_hint(analysis) or (f"{analysis.trace_error}: its size is unknown and the offline agents have no "
                                   "template; the job still runs it" if analysis.trace_error.startswith("the task")
                                   else "")
    return f"{name}: {hint}" if hint else ""


def output_bytes(analysis: ReferenceAnalysis) -> int:
    total = 0
    for ref in analysis.outputs:
        if isinstance(ref, dict) and ref.get("ref") == "node":
            for spec in analysis.calls[int(ref["index"])].out[:1]:
                total += spec_bytes(spec)
        elif isinstance(ref, dict) and ref.get("ref") == "input":
            spec = analysis.inputs[int(ref["index"])].tensor
            total += spec_bytes(spec) if spec is not None else 0
    return total


def needed_bytes(analysis: ReferenceAnalysis) -> int:
    data = analysis.input_bytes + analysis.param_bytes + output_bytes(analysis)
    return CHILD_BASELINE_BYTES + WORKING_SET_FACTOR * data


def size_problem(analysis: ReferenceAnalysis, limit: int = MEMORY_LIMIT_BYTES) -> str:
    """Empty when the verifier's children can hold the task; otherwise one line: the estimate, what it
    is made of, and the `--set` names that control the sizes."""
    need = needed_bytes(analysis)
    if need <= limit:
        return ""
    shapes = ", ".join(f"{'x'.join(map(str, i.tensor.shape))} {i.tensor.dtype}"
                       for i in analysis.inputs if i.tensor is not None)
    return (f"the task's inputs take {_gib(analysis.input_bytes)} ({shapes}); the verifier needs about "
            f"{_gib(need)} (inputs, parameters and outputs x{WORKING_SET_FACTOR} working set, plus "
            f"{_gib(CHILD_BASELINE_BYTES)} for torch and triton), over its {_gib(limit)} memory limit; "
            f"shrink it with {size_knobs(analysis)}")


def slow_hint(analysis: ReferenceAnalysis) -> str:
    """A hint when the Triton interpreter will be slow on these sizes (CPU only)."""
    if analysis.input_bytes <= SLOW_INPUT_BYTES:
        return ""
    return (f"the inputs take {_gib(analysis.input_bytes)}: the Triton interpreter will take long on CPU; "
            f"shrink them with {size_knobs(analysis)}")


def size_knobs(analysis: ReferenceAnalysis) -> str:
    """`--set NAME=VALUE` for the constants whose values are dimensions of the inputs or parameters
    (all integer constants when none match)."""
    dims = {d for i in analysis.inputs if i.tensor is not None for d in i.tensor.shape}
    dims |= {d for p in analysis.params for d in p.tensor.shape}
    ints = {k: v for k, v in analysis.constants.items() if isinstance(v, int) and not isinstance(v, bool)}
    knobs = {k: v for k, v in ints.items() if v > 1 and v in dims} or ints
    if not knobs:
        return "smaller sizes in the task file (it has no module-level size constants to --set)"
    return " ".join(f"--set {k}=N" for k in knobs) + " (now " + ", ".join(f"{k}={v}" for k, v in knobs.items()) + ")"


def spec_bytes(spec: TensorSpec) -> int:
    """A traced tensor's size in bytes (its dtype's width times its elements)."""
    size = {"float64": 8, "int64": 8, "complex64": 8, "float16": 2, "bfloat16": 2, "int16": 2,
            "int8": 1, "uint8": 1, "bool": 1}.get(spec.dtype, 4)
    return math.prod(spec.shape) * size


def _gib(n: int) -> str:
    return f"{n / 1024**3:.1f} GiB" if n >= 1024**3 else f"{n / 1024**2:.1f} MiB"
