"""Tool name → in-process runner and its parameter model (the executor's dispatch table).
Runners are imported lazily so listing tools never loads onnxruntime."""

from __future__ import annotations

import importlib
from pathlib import Path

from pydantic import ValidationError

from contracts.convert import CompiledStep
from contracts.errors import Err, FleetforgeError

RUNNERS: dict[str, tuple[str, str, str]] = {
    "onnx.fp16": ("activities.toolchains.onnx_steps", "fp16", "Fp16Params"),
    "onnx.quantize_dynamic": ("activities.toolchains.onnx_steps", "quantize_dynamic", "QuantizeDynamicParams"),
    "onnx.quantize_static": ("activities.toolchains.onnx_steps", "quantize_static", "QuantizeStaticParams"),
    "onnx.to_ort": ("activities.toolchains.onnx_steps", "to_ort", "ToOrtParams"),
    "ortqnn.quantize_qdq": ("activities.toolchains.ort_qnn", "quantize_qdq", "QuantizeQdqParams"),
    "ortqnn.context_binary": ("activities.toolchains.ort_qnn", "context_binary", "ContextBinaryParams"),
}


def run_step(step: CompiledStep, root: Path, qairt_sdk_root: Path | None = None):  # -> StepOutput
    """Run one compiled step in the workspace `root`: an argv step with the QAIRT SDK, else in-process."""
    if step.argv is not None:
        from activities.toolchains.qairt import detect_sdk, run_argv

        return run_argv(step, root, detect_sdk(qairt_sdk_root))
    entry = RUNNERS.get(step.tool_name)
    if entry is None:
        raise FleetforgeError(Err.TOOLCHAIN_UNAVAILABLE, f"no in-process runner for tool {step.tool_name!r}")
    module = importlib.import_module(entry[0])
    try:
        params = getattr(module, entry[2]).model_validate(step.params)
    except ValidationError as e:
        raise FleetforgeError(Err.COMPILER_ERROR, f"step {step.step_id}: params do not fit {step.tool_name}: {e}") from e
    return getattr(module, entry[1])(root, params)
