"""Tool name → runner and its parameter model (the executor's dispatch table).

In-process runners load models into onnxruntime / the QNN backend, so `run_step` runs them in a
child process (activities/toolchains/isolate.py): a native crash is TOOL_CRASHED, a hang is
TOOL_TIMEOUT, and a cancelled activity kills the child. Runners are imported lazily so listing
tools never loads onnxruntime."""

from __future__ import annotations

import importlib
from collections.abc import Callable
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from activities.toolchains.isolate import DEFAULT_LIMITS, ChildLimits, run_isolated
from contracts.convert import CompiledStep, StepOutput
from contracts.errors import Err, FleetforgeError

RUNNERS: dict[str, tuple[str, str, str]] = {
    "onnx.fp16": ("activities.toolchains.onnx_steps", "fp16", "Fp16Params"),
    "onnx.quantize_dynamic": ("activities.toolchains.onnx_steps", "quantize_dynamic", "QuantizeDynamicParams"),
    "onnx.quantize_static": ("activities.toolchains.onnx_steps", "quantize_static", "QuantizeStaticParams"),
    "onnx.to_ort": ("activities.toolchains.onnx_steps", "to_ort", "ToOrtParams"),
    "ortqnn.quantize_qdq": ("activities.toolchains.ort_qnn", "quantize_qdq", "QuantizeQdqParams"),
    "ortqnn.context_binary": ("activities.toolchains.ort_qnn", "_context_binary", "ContextBinaryParams"),
    "onnx.graph_passes": ("activities.toolchains.graph_passes", "run_passes", "GraphPassesParams"),
    "torch.export_onnx": ("activities.toolchains.torch_export", "export_onnx", "TorchExportParams"),
}


def run_step(step: CompiledStep, root: Path, qairt_sdk_root: Path | None = None, *, limits: ChildLimits = DEFAULT_LIMITS,
             cancelled: Callable[[], bool] | None = None) -> StepOutput:
    """Run one compiled step in the workspace `root`: an argv step with the QAIRT SDK, else the
    in-process runner in a child process."""
    if step.argv is not None:
        from activities.toolchains.qairt import detect_sdk, run_argv

        return run_argv(step, root, detect_sdk(qairt_sdk_root))
    if step.tool_name not in RUNNERS:
        raise FleetforgeError(Err.TOOLCHAIN_UNAVAILABLE, f"no in-process runner for tool {step.tool_name!r}")
    reply = run_isolated("activities.toolchains.steps:run_here", {"step": step.model_dump(mode="json"), "root": str(root.resolve())},
                         what=f"step {step.step_id} ({step.tool_name})", crash_code=Err.TOOL_CRASHED,
                         fallback_code=Err.EXECUTOR_ERROR, limits=limits, cancelled=cancelled,
                         writable=[root])
    return StepOutput.model_validate(reply)


def run_here(step: dict[str, Any], root: str) -> dict[str, Any]:
    """Child-process entry: run the step's runner in this process."""
    compiled = CompiledStep.model_validate(step)
    module_name, fn_name, params_name = RUNNERS[compiled.tool_name]
    module = importlib.import_module(module_name)
    try:
        params = getattr(module, params_name).model_validate(compiled.params)
    except ValidationError as e:
        raise FleetforgeError(Err.COMPILER_ERROR, f"step {compiled.step_id}: params do not fit {compiled.tool_name}: {e}") from e
    return getattr(module, fn_name)(Path(root), params).model_dump(mode="json")
