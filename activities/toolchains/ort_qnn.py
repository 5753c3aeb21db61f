"""The `ort-qnn` toolchain: real QNN HTP context binaries compiled on x86 with onnxruntime-qnn.

* `quantize_qdq`: QDQ quantization configured for QNN (`get_qnn_qdq_config` + `quantize`), with a
  seeded synthetic calibration set (deterministic).
* `context_binary`: an ORT session with the QNN plugin EP and `ep.context_enable=1` writes an
  EPContext model `<out>.onnx` plus the HTP context binary `<out>_qnn.bin` for one SoC
  (`soc_model`, `htp_arch` from socs.py). Optionally a QNN IR `.dlc` too.

onnxruntime / onnxruntime_qnn are imported inside functions (DESIGN: heavy imports stay lazy).
"""

from __future__ import annotations

import threading
import time
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict

from activities.sandbox import safe_join
from activities.toolchains.socs import lookup_soc
from contracts.errors import Err, FleetforgeError

EP_NAME = "QNNExecutionProvider"
_register_lock = threading.Lock()
_registered = False


class QuantizeQdqParams(BaseModel, frozen=True):
    model_config = ConfigDict(extra="forbid", frozen=True)

    model: str
    output: str
    precision: Literal["int8", "w8a16"]
    per_channel: bool = False
    calibration_samples: int = 8
    seed: int = 0


class ContextBinaryParams(BaseModel, frozen=True):
    model_config = ConfigDict(extra="forbid", frozen=True)

    model: str
    soc: str
    output: str
    precision: Literal["fp16", "int8", "w8a16"] = "fp16"
    graph_optimization: Literal["default", "fast", "max"] = "default"
    dump_dlc: bool = False
    dlc_dir: str | None = None


class StepOutput(BaseModel, frozen=True):
    outputs: list[str]
    """Workspace-relative files the step wrote."""
    seconds: float
    details: dict[str, Any] = {}


def ensure_qnn_registered() -> list[Any]:
    """Register the QNN plugin EP once per process; returns its EP devices."""
    global _registered
    try:
        import onnxruntime as ort
        import onnxruntime_qnn
    except ImportError as e:
        raise FleetforgeError(Err.TOOLCHAIN_UNAVAILABLE, f"onnxruntime-qnn is not installed: {e}") from e
    with _register_lock:
        if not _registered and not any(d.ep_name == EP_NAME for d in ort.get_ep_devices()):
            ort.register_execution_provider_library(EP_NAME, onnxruntime_qnn.get_library_path())
        _registered = True
        devices = [d for d in ort.get_ep_devices() if d.ep_name == EP_NAME]
    if not devices:
        raise FleetforgeError(Err.TOOLCHAIN_UNAVAILABLE, "the QNN execution provider exposes no device")
    return devices


def qnn_session(model: Path | bytes, provider_options: dict[str, str], config: dict[str, str] | None = None) -> Any:
    import onnxruntime as ort

    devices = ensure_qnn_registered()
    so = ort.SessionOptions()
    so.log_severity_level = 3
    for k, v in (config or {}).items():
        so.add_session_config_entry(k, v)
    so.add_provider_for_devices(devices, provider_options)
    return ort.InferenceSession(model if isinstance(model, bytes) else str(model), sess_options=so)


def synthetic_feeds(model: Path, *, samples: int, seed: int) -> list[dict[str, Any]]:
    """Seeded standard-normal inputs for every graph input (symbolic dims → 1)."""
    import numpy as np
    import onnx

    m = onnx.load(str(model), load_external_data=False)
    init_names = {i.name for i in m.graph.initializer}
    rng = np.random.default_rng(seed)
    specs = []
    for vi in m.graph.input:
        if vi.name in init_names:
            continue
        tt = vi.type.tensor_type
        shape = [d.dim_value if d.HasField("dim_value") and d.dim_value > 0 else 1 for d in tt.shape.dim]
        dtype = onnx.helper.tensor_dtype_to_np_dtype(tt.elem_type)
        specs.append((vi.name, shape, dtype))
    feeds = []
    for _ in range(samples):
        feed = {}
        for name, shape, dtype in specs:
            if np.issubdtype(dtype, np.floating):
                feed[name] = rng.standard_normal(shape).astype(dtype)
            else:
                feed[name] = rng.integers(0, 8, size=shape).astype(dtype)
        feeds.append(feed)
    return feeds


def quantize_qdq(root: Path, params: QuantizeQdqParams) -> StepOutput:
    from onnxruntime.quantization import CalibrationDataReader, QuantType, quantize
    from onnxruntime.quantization.execution_providers.qnn import get_qnn_qdq_config

    src, dst = safe_join(root, params.model), safe_join(root, params.output)
    feeds = synthetic_feeds(src, samples=params.calibration_samples, seed=params.seed)

    class _Reader(CalibrationDataReader):
        def __init__(self) -> None:
            self._it = iter(feeds)

        def get_next(self) -> dict[str, Any] | None:
            return next(self._it, None)

    activation = QuantType.QUInt16 if params.precision == "w8a16" else QuantType.QUInt8
    t0 = time.monotonic()
    try:
        config = get_qnn_qdq_config(str(src), _Reader(), activation_type=activation, weight_type=QuantType.QUInt8,
                                    per_channel=params.per_channel)
        dst.parent.mkdir(parents=True, exist_ok=True)
        quantize(str(src), str(dst), config)
    except FleetforgeError:
        raise
    except Exception as e:
        raise FleetforgeError(Err.EXECUTOR_ERROR, f"QDQ quantization of {params.model} failed: {e}") from e
    return StepOutput(outputs=[params.output], seconds=time.monotonic() - t0, details={"activation_type": activation.name})


GRAPH_FINALIZATION_MODE = {"fast": "1", "max": "3"}
"""graph_optimization → the QNN EP's htp_graph_finalization_optimization_mode ("default": not set).
Mode 1 compiles light_squeezenet int8 in ~0.5 s where the backend default takes ~45 s here."""


def context_provider_options(soc_name: str, precision: str, graph_optimization: str = "default") -> dict[str, str]:
    soc = lookup_soc(soc_name)
    opts = {"backend_type": "htp", "soc_model": str(soc.soc_model), "htp_arch": str(soc.htp_arch)}
    if precision == "fp16":
        opts["enable_htp_fp16_precision"] = "1"
    if graph_optimization in GRAPH_FINALIZATION_MODE:
        opts["htp_graph_finalization_optimization_mode"] = GRAPH_FINALIZATION_MODE[graph_optimization]
    return opts


def context_binary(root: Path, params: ContextBinaryParams, *, isolate: bool = True) -> StepOutput:
    """Compile `model` into `<output>` (EPContext) + `<output stem>_qnn.bin` for `soc`.

    The QNN HTP backend numbers objects with process-global counters that end up in the binary
    (a second compile in one process differs in ~60 bytes), so each compile runs in a fresh
    interpreter: the output is then byte-identical across runs and workers. The model is
    passed as bytes, so the EPContext partition name does not depend on the workspace path.
    """
    root = root.resolve()
    lookup_soc(params.soc)  # BAD_INPUT before paying for a process
    if not isolate:
        return _context_binary(str(root), params)
    return _in_child(str(root), params)


def _in_child(root: str, params: ContextBinaryParams, timeout_s: float = 1800.0) -> StepOutput:
    """Run `_context_binary` in a fresh interpreter (`python -m activities.toolchains.ort_qnn`):
    argv list, JSON over stdin/stdout. A plain subprocess, not multiprocessing, so the caller's
    __main__ is never re-imported."""
    import json
    import os
    import subprocess
    import sys

    repo = str(Path(__file__).resolve().parents[2])
    env = dict(os.environ)
    env["PYTHONPATH"] = repo + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    request = json.dumps({"root": root, "params": params.model_dump(mode="json")})
    try:
        proc = subprocess.run([sys.executable, "-m", "activities.toolchains.ort_qnn"], input=request, capture_output=True,
                              text=True, env=env, cwd=repo, timeout=timeout_s, check=False)
    except subprocess.TimeoutExpired as e:
        raise FleetforgeError(Err.EXECUTOR_ERROR, f"QNN compile of {params.model} timed out after {timeout_s:.0f}s") from e
    last = proc.stdout.strip().splitlines()[-1] if proc.stdout.strip() else ""
    try:
        reply = json.loads(last)
    except ValueError:
        reply = None
    if proc.returncode != 0 or not isinstance(reply, dict):
        tail = (proc.stderr or "").strip()[-800:]
        raise FleetforgeError(Err.EXECUTOR_ERROR, f"the QNN compiler process failed (exit {proc.returncode}) on {params.model}: {tail}")
    if "error" in reply:
        raise FleetforgeError(Err(reply["error"]["code"]), reply["error"]["message"])
    return StepOutput.model_validate(reply["ok"])


def _child_main() -> int:
    import json
    import sys

    request = json.loads(sys.stdin.read())
    try:
        out = _context_binary(request["root"], ContextBinaryParams.model_validate(request["params"]))
        reply: dict[str, Any] = {"ok": out.model_dump(mode="json")}
    except FleetforgeError as e:
        reply = {"error": {"code": e.code.value, "message": e.message}}
    sys.stdout.write("\n" + json.dumps(reply) + "\n")
    sys.stdout.flush()
    return 0


def _context_binary(root_s: str, params: ContextBinaryParams) -> StepOutput:
    root = Path(root_s)
    src, out = safe_join(root, params.model), safe_join(root, params.output)
    if out.suffix != ".onnx":
        raise FleetforgeError(Err.BAD_INPUT, f"context model output must end in .onnx, got {params.output!r}")
    opts = context_provider_options(params.soc, params.precision, params.graph_optimization)
    outputs = [params.output, params.output[: -len(".onnx")] + "_qnn.bin"]
    out.parent.mkdir(parents=True, exist_ok=True)
    for stale in (out, out.with_name(out.stem + "_qnn.bin")):
        stale.unlink(missing_ok=True)  # ORT refuses to overwrite an existing context model
    t0 = time.monotonic()
    try:
        model_bytes = src.read_bytes()
        if params.precision in ("int8", "w8a16") and not _has_qdq(model_bytes):
            raise FleetforgeError(Err.BAD_INPUT, f"precision {params.precision} needs a QDQ model; {params.model} has no "
                                  "QuantizeLinear nodes (run ortqnn.quantize_qdq first)")
        qnn_session(model_bytes, opts, {"ep.context_enable": "1", "ep.context_file_path": str(out)})
    except FleetforgeError:
        raise
    except Exception as e:
        raise FleetforgeError(Err.EXECUTOR_ERROR, f"QNN context compile of {params.model} for {params.soc} failed: {e}") from e
    seconds = time.monotonic() - t0
    for rel in outputs:
        if not safe_join(root, rel).is_file():
            raise FleetforgeError(Err.EXECUTOR_ERROR, f"QNN compile did not write {rel!r} (is every op supported on HTP?)")
    if params.dump_dlc:
        # The IR (DLC) dump is a separate backend pass: it cannot be combined with context generation.
        dlc_dir = safe_join(root, params.dlc_dir or str(Path(params.output).parent))
        dlc_dir.mkdir(parents=True, exist_ok=True)
        before = set(dlc_dir.glob("*.dlc"))
        try:
            qnn_session(model_bytes, opts | {"dump_qnn_ir_dlc": "1", "dump_qnn_ir_dlc_dir": str(dlc_dir)})
        except Exception as e:
            raise FleetforgeError(Err.EXECUTOR_ERROR, f"QNN DLC dump of {params.model} failed: {e}") from e
        new = sorted(set(dlc_dir.glob("*.dlc")) - before)
        if not new:
            raise FleetforgeError(Err.EXECUTOR_ERROR, f"QNN DLC dump wrote no .dlc into {dlc_dir.relative_to(root)}")
        outputs += [p.relative_to(root).as_posix() for p in new]
    soc = lookup_soc(params.soc)
    return StepOutput(outputs=outputs, seconds=seconds,
                      details={"soc": soc.name, "soc_model": soc.soc_model, "htp_arch": soc.htp_arch, "precision": params.precision})


def _has_qdq(model_bytes: bytes) -> bool:
    import onnx

    return any(n.op_type == "QuantizeLinear" for n in onnx.load_from_string(model_bytes).graph.node)


def context_binary_target(bin_path: Path) -> dict[str, str]:
    """What the HTP context binary says about its target: `soc_type` and `arch` from the
    compiler configuration string the QNN HTP backend embeds (e.g. "soc_type=SM8550;arch=73")."""
    import re

    data = bin_path.read_bytes()
    found: dict[str, str] = {}
    for key in (b"soc_type", b"arch"):
        m = re.search(rb"(?<![A-Za-z_])" + key + rb"=([A-Za-z0-9]+);", data)
        if m:
            found[key.decode()] = m.group(1).decode()
    return found


def epcontext_attributes(model: Path) -> dict[str, Any]:
    """Attributes of the (first) EPContext node of a context model."""
    import onnx

    m = onnx.load(str(model), load_external_data=False)
    for node in m.graph.node:
        if node.op_type == "EPContext":
            out = {}
            for a in node.attribute:
                v = onnx.helper.get_attribute_value(a)
                out[a.name] = v.decode() if isinstance(v, bytes) else v
            return out
    raise FleetforgeError(Err.EXECUTOR_ERROR, f"{model.name} has no EPContext node")


if __name__ == "__main__":
    raise SystemExit(_child_main())
