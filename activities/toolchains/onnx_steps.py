"""The `onnx` toolchain: fp16 conversion, dynamic/static int8 quantization, ORT format (CPU,
onnxruntime only). Each step reads and writes workspace-relative paths."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict

from activities.sandbox import safe_join
from activities.toolchains.ort_qnn import calibration_reader, synthetic_feeds
from contracts.convert import StepOutput
from contracts.errors import Err, FleetforgeError


class _Params(BaseModel, frozen=True):
    model_config = ConfigDict(extra="forbid", frozen=True)
    model: str
    output: str


class Fp16Params(_Params, frozen=True):
    keep_io_types: bool = True


class QuantizeDynamicParams(_Params, frozen=True):
    weight_type: Literal["qint8", "quint8"] = "qint8"
    per_channel: bool = False


class QuantizeStaticParams(_Params, frozen=True):
    calibrate_method: Literal["minmax", "entropy", "percentile"] = "minmax"
    per_channel: bool = False
    calibration_samples: int | None = 8
    calibration_data: str | None = None
    seed: int = 0


class ToOrtParams(_Params, frozen=True):
    optimization_level: Literal["basic", "extended", "all"] = "basic"


def _paths(root: Path, p: _Params) -> tuple[Path, Path]:
    src, dst = safe_join(root, p.model), safe_join(root, p.output)
    dst.parent.mkdir(parents=True, exist_ok=True)
    return src, dst


def _guard(what: str, fn: Any) -> float:
    t0 = time.monotonic()
    try:
        fn()
    except FleetforgeError:
        raise
    except Exception as e:
        from activities.toolchains.ort_qnn import _tidy

        raise FleetforgeError(Err.EXECUTOR_ERROR, f"{what} failed: {_tidy(str(e), 600) or type(e).__name__}") from e
    return time.monotonic() - t0


def fp16(root: Path, p: Fp16Params) -> StepOutput:
    import onnx
    from onnxruntime.transformers.float16 import convert_float_to_float16

    src, dst = _paths(root, p)
    secs = _guard("fp16 conversion", lambda: onnx.save(
        convert_float_to_float16(onnx.load(str(src)), keep_io_types=p.keep_io_types), str(dst)))
    return StepOutput(outputs=[p.output], seconds=secs)


def quantize_dynamic(root: Path, p: QuantizeDynamicParams) -> StepOutput:
    from onnxruntime.quantization import QuantType
    from onnxruntime.quantization import quantize_dynamic as qd

    src, dst = _paths(root, p)
    wt = QuantType.QInt8 if p.weight_type == "qint8" else QuantType.QUInt8
    secs = _guard("dynamic quantization", lambda: qd(str(src), str(dst), weight_type=wt, per_channel=p.per_channel))
    return StepOutput(outputs=[p.output], seconds=secs)


def quantize_static(root: Path, p: QuantizeStaticParams) -> StepOutput:
    from onnxruntime.quantization import CalibrationMethod, QuantFormat
    from onnxruntime.quantization import quantize_static as qs

    from activities.toolchains.feeds import calibration_feeds

    src, dst = _paths(root, p)
    if p.calibration_data:
        feeds = calibration_feeds(safe_join(root, p.calibration_data), src)
    else:
        feeds = synthetic_feeds(src, samples=p.calibration_samples or 8, seed=p.seed)
    method = {"minmax": CalibrationMethod.MinMax, "entropy": CalibrationMethod.Entropy,
              "percentile": CalibrationMethod.Percentile}[p.calibrate_method]
    secs = _guard("static quantization", lambda: qs(str(src), str(dst), calibration_reader(feeds), quant_format=QuantFormat.QDQ,
                                                     per_channel=p.per_channel, calibrate_method=method))
    return StepOutput(outputs=[p.output], seconds=secs,
                      details={"calibration": "data" if p.calibration_data else "synthetic", "calibration_samples": len(feeds)})


def to_ort(root: Path, p: ToOrtParams) -> StepOutput:
    import onnxruntime as ort

    src, dst = _paths(root, p)
    level = {"basic": ort.GraphOptimizationLevel.ORT_ENABLE_BASIC, "extended": ort.GraphOptimizationLevel.ORT_ENABLE_EXTENDED,
             "all": ort.GraphOptimizationLevel.ORT_ENABLE_ALL}[p.optimization_level]

    def run() -> None:
        so = ort.SessionOptions()
        so.graph_optimization_level = level
        so.optimized_model_filepath = str(dst)
        so.add_session_config_entry("session.save_model_format", "ORT")
        ort.InferenceSession(str(src), sess_options=so, providers=["CPUExecutionProvider"])

    return StepOutput(outputs=[p.output], seconds=_guard("ORT format conversion", run))
