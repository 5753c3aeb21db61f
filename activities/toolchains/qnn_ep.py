"""The QNN execution provider of onnxruntime-qnn: registered once per process, and a session on it (the HTP
backend emulated on x86). Its own module so that the steps and the evaluation that open sessions do not
import each other; onnxruntime is imported inside the functions (DESIGN: heavy imports stay lazy)."""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

from contracts.errors import Err, FleetforgeError

EP_NAME = "QNNExecutionProvider"
_register_lock = threading.Lock()
_registered = False


def ensure_qnn_registered() -> list[Any]:
    """Register the QNN plugin EP once per process; returns its EP devices."""
    global _registered
    try:
        import onnxruntime as ort
        import onnxruntime_qnn
    except ImportError as e:
        raise FleetforgeError(Err.TOOLCHAIN_UNAVAILABLE, f"onnxruntime-qnn is not installed ({e}): install the toolchains extra "
                              "where the worker runs (pip install 'fleetforge[toolchains]')") from e
    with _register_lock:
        if not _registered and not any(d.ep_name == EP_NAME for d in ort.get_ep_devices()):
            ort.register_execution_provider_library(EP_NAME, onnxruntime_qnn.get_library_path())
        _registered = True
        devices = [d for d in ort.get_ep_devices() if d.ep_name == EP_NAME]
    if not devices:
        raise FleetforgeError(Err.TOOLCHAIN_UNAVAILABLE, "the QNN execution provider exposes no device")
    return devices


def qnn_session(model: Path | bytes, provider_options: dict[str, str], config: dict[str, str] | None = None,
                log_level: int = 3) -> Any:
    import onnxruntime as ort

    devices = ensure_qnn_registered()
    so = ort.SessionOptions()
    so.log_severity_level = log_level
    # only the basic (semantics-preserving) rewrites: the extended ones fuse QDQ groups into CPU-EP
    # kernels (QLinearAveragePool, ...) that reject valid attributes and would keep nodes off HTP
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_BASIC
    for k, v in (config or {}).items():
        so.add_session_config_entry(k, v)
    so.add_provider_for_devices(devices, provider_options)
    return ort.InferenceSession(model if isinstance(model, bytes) else str(model), sess_options=so)
