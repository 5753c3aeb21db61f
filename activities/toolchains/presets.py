"""Presets → concrete tool arguments, in one table. A preset never changes *what* is built (SoC,
precision, output: those are the request's); it tunes how: calibration effort, per-channel
quantization, graph optimization level. `balanced` is every tool's spec defaults."""

from __future__ import annotations

from typing import Literal

from pydantic import JsonValue

PresetName = Literal["fast", "balanced", "max_perf"]

PRESET_ARGS: dict[str, dict[str, dict[str, JsonValue]]] = {
    "fast": {
        "onnx.quantize_static": {"calibrate_method": "minmax", "calibration_samples": 2},
        "ortqnn.quantize_qdq": {"calibration_samples": 2},
        "ortqnn.context_binary": {"graph_optimization": "fast"},
        "onnx.to_ort": {"optimization_level": "basic"},
    },
    "balanced": {},
    "max_perf": {
        "onnx.quantize_static": {"calibrate_method": "minmax", "per_channel": True, "calibration_samples": 16},
        "ortqnn.quantize_qdq": {"calibration_samples": 16},
        "ortqnn.context_binary": {"graph_optimization": "max"},
        "onnx.to_ort": {"optimization_level": "all"},
    },
}
"""preset → tool name → optional args the offline planner sets for that tool."""


def preset_args(preset: str, tool_name: str) -> dict[str, JsonValue]:
    return dict(PRESET_ARGS.get(preset, {}).get(tool_name, {}))
