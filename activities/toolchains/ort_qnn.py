"""The `ort-qnn` toolchain: real QNN HTP context binaries compiled on x86 with onnxruntime-qnn.

* `quantize_qdq`: QDQ quantization configured for QNN (`get_qnn_qdq_config` + `quantize`): int8, w8a16
  (16-bit activations) or w4a16 (4-bit per-channel MatMul weights, 16-bit activations), calibrated on the run's calibration data or a seeded synthetic set
  that respects each input's role (activities/toolchains/feeds.py); outputs can stay in float.
* `context_binary`: an ORT session with the QNN plugin EP and `ep.context_enable=1` writes an
  EPContext model `<out>.onnx` plus the HTP context binary `<out>_qnn.bin` for one SoC
  (`soc_model`, `htp_arch` from socs.py), and reports which nodes fell back to the CPU.
  Optionally a QNN IR `.dlc` too.

onnxruntime / onnxruntime_qnn are imported inside functions (DESIGN: heavy imports stay lazy).
"""

from __future__ import annotations

import re
import time
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, model_validator

from activities.sandbox import safe_join
from activities.toolchains.isolate import DEFAULT_LIMITS, ChildLimits, run_isolated
from activities.toolchains.qnn_ep import qnn_session
from activities.toolchains.socs import lookup_soc
from contracts.convert import StepOutput
from contracts.convert_job import OffloadReport
from contracts.errors import Err, FleetforgeError


class QuantizeQdqParams(BaseModel, frozen=True):
    model_config = ConfigDict(extra="forbid", frozen=True)

    model: str
    output: str
    precision: Literal["int8", "w8a16", "w4a16"]
    """int8: 8-bit weights and activations; w8a16: 8-bit weights, 16-bit activations (QUInt16); w4a16: the
    MatMuls' constant weights 4-bit per output channel (QDQ int4, symmetric), other weights 8-bit, 16-bit
    activations (AI Hub's and Olive's recipe for on-device LLMs)."""
    per_channel: bool = False
    calibration_samples: int = 8
    """Synthetic samples (ignored with calibration_data: every sample of the data is used)."""
    calibration_data: str | None = None
    """Workspace-relative calibration .npz (activities/toolchains/feeds.py)."""
    float_outputs: list[str] = []
    """Graph outputs whose producing nodes stay in float (not quantized)."""
    seed: int = 0
    sixteen_bit: list[str] = []
    """int8: nodes whose output activations are quantized at 16 bits (onnxruntime makes them, their
    producers' conversions and their consumers 16-bit ops)."""
    mixed_precision: bool = False
    """int8: find the fewest most sensitive layers to keep at 16 bits so the model reaches `min_cosine` on
    the calibration samples (activities/toolchains/mixed_precision.py), added to `sixteen_bit`."""
    min_cosine: float = 0.95
    """The accuracy gate's threshold the mixed-precision search aims above."""

    @model_validator(mode="after")
    def _mixed_is_int8(self) -> "QuantizeQdqParams":
        if (self.mixed_precision or self.sixteen_bit) and self.precision != "int8":
            raise ValueError(f"sixteen_bit / mixed_precision choose 16-bit layers of an int8 model; {self.precision} "
                             "is not int8")
        return self


class ContextBinaryParams(BaseModel, frozen=True):
    model_config = ConfigDict(extra="forbid", frozen=True)

    model: str
    soc: str
    output: str
    precision: Literal["fp16", "int8", "w8a16", "w4a16"] = "fp16"
    graph_optimization: Literal["default", "fast", "max"] = "default"
    dump_dlc: bool = False
    dlc_dir: str | None = None


def synthetic_feeds(model: Path, *, samples: int, seed: int) -> list[dict[str, Any]]:
    """Seeded inputs valid for each input's dtype and role (activities/toolchains/feeds.py)."""
    from activities.toolchains.feeds import synthetic_feeds as feeds

    return feeds(model, samples=samples, seed=seed)


def calibration_reader(feeds: list[dict[str, Any]]) -> Any:
    """onnxruntime's CalibrationDataReader over a list of feeds."""
    from onnxruntime.quantization import CalibrationDataReader

    class _Reader(CalibrationDataReader):
        def __init__(self) -> None:
            self._it = iter(feeds)

        def get_next(self) -> dict[str, Any] | None:
            return next(self._it, None)

    return _Reader()


def producers(model: Path, outputs: list[str]) -> list[str]:
    """Names of the nodes that produce the given graph outputs (nameless nodes get none)."""
    import onnx

    if not outputs:
        return []
    m = onnx.load(str(model), load_external_data=False)
    wanted = set(outputs)
    missing = wanted - {o.name for o in m.graph.output}
    if missing:
        raise FleetforgeError(Err.BAD_INPUT, f"float_outputs names no graph output: {sorted(missing)}")
    return [n.name for n in m.graph.node if n.name and wanted & set(n.output)]


def quantize_qdq(root: Path, params: QuantizeQdqParams) -> StepOutput:
    from onnxruntime.quantization import QuantType

    from activities.toolchains.feeds import calibration_feeds

    src, dst = safe_join(root, params.model), safe_join(root, params.output)
    if params.calibration_data:
        feeds = calibration_feeds(safe_join(root, params.calibration_data), src)
    else:
        feeds = synthetic_feeds(src, samples=params.calibration_samples, seed=params.seed)
    source = _load_model(src, params.model)
    if not _has_float(source):
        raise FleetforgeError(Err.NOTHING_TO_QUANTIZE, f"{params.model} computes nothing in float (integer/boolean "
                              "inputs and constants only): there is nothing to quantize")
    from activities.toolchains.qdq_prep import prepare

    prepared = prepare(src, dst)
    activation = QuantType.QUInt8 if params.precision == "int8" else QuantType.QUInt16
    t0 = time.monotonic()
    mixed = None
    try:
        sixteen = _output_tensors(prepared, params.sixteen_bit)
        if params.mixed_precision:
            import onnx

            from activities.toolchains.mixed_precision import probe_split, search

            # a probe model calibrated on half the samples, measured on the other half: on its own
            # calibration samples a model shows no clipping error, and the gate grades samples it never saw
            probe_cal, probe_eval = probe_split(feeds)
            _quantize(prepared, dst, probe_cal, params, activation, sixteen)
            mixed = search(onnx.load(str(prepared)), onnx.load(str(dst)), probe_eval, params.min_cosine)
            sixteen += [layer.tensor for layer in mixed.sixteen_bit if layer.tensor not in sixteen]
        _quantize(prepared, dst, feeds, params, activation, sixteen)
    except FleetforgeError:
        raise
    except Exception as e:
        raise FleetforgeError(Err.EXECUTOR_ERROR, f"QDQ quantization of {params.model} failed: "
                              f"{_tidy(str(e), 600) or type(e).__name__}") from e
    finally:
        prepared.unlink(missing_ok=True)
    quantized = _load_graph(dst.read_bytes(), params.output)
    check_scales(quantized, params.output, source)
    if not any(n.op_type == "QuantizeLinear" for n in quantized.graph.node):
        kept = f" (kept in float: {', '.join(params.float_outputs)})" if params.float_outputs else ""
        raise FleetforgeError(Err.NOTHING_TO_QUANTIZE, f"the quantizer found nothing to quantize in {params.model} "
                              f"(ops: {', '.join(_op_types(quantized))}){kept}")
    details = {"activation_type": activation.name, "calibration": "data" if params.calibration_data else "synthetic",
               "calibration_samples": len(feeds), "float_outputs": list(params.float_outputs),
               "sixteen_bit": list(params.sixteen_bit)}
    if params.precision == "w4a16":
        int4 = {i.name for i in quantized.graph.initializer if i.data_type in (21, 22)}  # UINT4, INT4
        details["int4_weights"] = sum(n.op_type == "DequantizeLinear" and n.input[0] in int4 for n in quantized.graph.node)
    if mixed is not None:
        details["mixed_precision"] = mixed.model_dump(mode="json")
    return StepOutput(outputs=[params.output], seconds=time.monotonic() - t0, details=details)


def _quantize(prepared: Path, dst: Path, feeds: list[dict[str, Any]], params: QuantizeQdqParams, activation: Any,
              sixteen_bit: list[str]) -> None:
    """One QDQ quantization of the prepared model into `dst`, with these activations at 16 bits."""
    from onnxruntime.quantization import QuantType, quantize
    from onnxruntime.quantization.execution_providers.qnn import get_qnn_qdq_config

    overrides = {t: [{"quant_type": QuantType.QUInt16}] for t in sixteen_bit}
    if params.precision == "int8":
        overrides |= {w: [{"quant_type": QuantType.QInt8, "symmetric": True, "axis": 0}] for w in conv_weights(prepared)}
    if params.precision == "w4a16":
        overrides |= {w: [{"quant_type": QuantType.QInt4, "axis": 1, "symmetric": True}] for w in matmul_weights(prepared)}
    config = get_qnn_qdq_config(str(prepared), calibration_reader(feeds), activation_type=activation,
                                weight_type=QuantType.QUInt8, per_channel=params.per_channel,
                                init_overrides=overrides or None,
                                nodes_to_exclude=producers(prepared, params.float_outputs) or None)
    # quantize every op HTP takes quantized, also one whose input is not quantized yet (pooling, Tan,
    # GatherElements, ...): the default skips them, leaving float ops in an "int8" graph
    config.extra_options["ForceQuantizeNoInputCheck"] = True
    quantize(str(prepared), str(dst), config)


def conv_weights(model: Path) -> list[str]:
    """The constant weights of the model's Conv nodes: at int8 they are signed and symmetric (zero point 0),
    one scale per output channel (AIMET's configuration for the HTP). With the quantizer's default (unsigned,
    asymmetric, one scale per tensor) the HTP's result strays from what the QDQ model computes on the CPU,
    which the gate's verdicts and the mixed-precision search read: the sweep's trained MobileNetV2, lowest
    held-out per-sample cosine 0.9418 on the HTP against 0.9768 on the CPU; with these weights 0.9918 on the
    HTP (0.9966 on the CPU). Signed symmetric weights one scale per tensor lost EfficientNet (0.9553 ->
    0.9307); other ops' weights keep the default: the HTP leaves a LayerNormalization with a signed scale on
    the CPU. Below opset 13 QuantizeLinear/DequantizeLinear have no `axis` (one scale per channel cannot be
    written), so an older model keeps the quantizer's default there."""
    import onnx

    m = onnx.load(str(model), load_external_data=False)
    if next((o.version for o in m.opset_import if o.domain in ("", "ai.onnx")), 0) < 13:
        return []
    inits = {i.name for i in m.graph.initializer}
    return sorted({n.input[1] for n in m.graph.node if n.op_type == "Conv" and len(n.input) > 1 and n.input[1] in inits})


def matmul_weights(model: Path) -> list[str]:
    """The constant 2-D second inputs of the model's MatMuls (a decoder's projections: what w4a16 stores in
    4 bits, per output channel: axis 1 of [K, N])."""
    import onnx

    m = onnx.load(str(model), load_external_data=False)
    inits = {i.name: i for i in m.graph.initializer}
    return sorted({n.input[1] for n in m.graph.node if n.op_type == "MatMul" and n.input[1] in inits
                   and len(inits[n.input[1]].dims) == 2})


def _output_tensors(model: Path, nodes: list[str]) -> list[str]:
    """The output activations of the named nodes (BAD_INPUT naming a node the model lacks)."""
    import onnx

    if not nodes:
        return []
    m = onnx.load(str(model), load_external_data=False)
    outputs = {n.name: n.output[0] for n in m.graph.node if n.name and n.output}
    missing = [n for n in nodes if n not in outputs]
    if missing:
        raise FleetforgeError(Err.BAD_INPUT, f"sixteen_bit names no node of {model.name}: {missing}")
    return [outputs[n] for n in nodes]


GRAPH_REJECTED = "Failed to finalize QNN graph"
"""The HTP backend took every op, then could not build the graph (HTP_GRAPH_REJECTED)."""
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


def context_binary(root: Path, params: ContextBinaryParams, *, isolate: bool = True,
                   limits: ChildLimits = DEFAULT_LIMITS) -> StepOutput:
    """Compile `model` into `<output>` (EPContext) + `<output stem>_qnn.bin` for `soc`.

    The QNN HTP backend numbers objects with process-global counters that end up in the binary
    (a second compile in one process differs in ~60 bytes), so each compile runs in a fresh
    interpreter (activities/toolchains/isolate.py): the output is then byte-identical across runs
    and workers, and a crash of the backend is TOOL_CRASHED, not a dead worker. The model is
    passed as bytes, so the EPContext partition name does not depend on the workspace path.
    """
    root = root.resolve()
    lookup_soc(params.soc)  # BAD_INPUT before paying for a process
    if not isolate:
        return _context_binary(root, params)
    reply = run_isolated("activities.toolchains.ort_qnn:context_binary_in_child",
                         {"root": str(root), "params": params.model_dump(mode="json")},
                         what=f"the QNN HTP compiler on {params.model}", crash_code=Err.TOOL_CRASHED,
                         fallback_code=Err.EXECUTOR_ERROR, limits=limits, writable=[root])
    return StepOutput.model_validate(reply)


def context_binary_in_child(root: str, params: dict[str, Any]) -> dict[str, Any]:
    """Child-process entry (activities/toolchains/isolate.py)."""
    return _context_binary(Path(root), ContextBinaryParams.model_validate(params)).model_dump(mode="json")


def _context_binary(root: Path, params: ContextBinaryParams) -> StepOutput:
    src, out = safe_join(root, params.model), safe_join(root, params.output)
    if out.suffix != ".onnx":
        raise FleetforgeError(Err.BAD_INPUT, f"context model output must end in .onnx, got {params.output!r}")
    opts = context_provider_options(params.soc, params.precision, params.graph_optimization)
    outputs = [params.output, params.output[: -len(".onnx")] + "_qnn.bin"]
    out.parent.mkdir(parents=True, exist_ok=True)
    for stale in (out, out.with_name(out.stem + "_qnn.bin")):
        stale.unlink(missing_ok=True)  # ORT refuses to overwrite an existing context model
    t0 = time.monotonic()
    model_bytes, source = _model_bytes(src, params.model)
    if params.precision != "fp16" and not any(n.op_type == "QuantizeLinear" for n in source.graph.node):
        raise FleetforgeError(Err.BAD_INPUT, f"precision {params.precision} needs a QDQ model; {params.model} has no "
                              "QuantizeLinear node: add an ortqnn.quantize_qdq step before this one")
    log = out.with_name(out.stem + ".compile.log")
    try:
        with native_log(log):  # the QNN EP logs the failing node at error level, not in the exception
            qnn_session(model_bytes, opts, {"ep.context_enable": "1", "ep.context_file_path": str(out)}, log_level=2)
        raise_if_backend_unavailable(log)
    except FleetforgeError:
        raise
    except Exception as e:
        raise_if_backend_unavailable(log)
        node = failing_node(log.read_text(errors="replace") if log.is_file() else "", source)
        op = failing_op(str(e)) or (node[1] if node else None)
        if node is not None and op is not None:
            node = (node[0], op, node[2])
        where = f" at node {node[0]!r} (op {node[1]}{', QNN ' + node[2] if node[2] != node[1] else ''})" if node else ""
        if op is not None and failing_op(str(e)) is not None:
            raise FleetforgeError(Err.UNSUPPORTED_OP, f"op {op} cannot run on the QNN HTP backend for "
                                  f"{lookup_soc(params.soc).name} at {params.precision}{where}: {_tidy(str(e), 300)}") from e
        code = Err.HTP_GRAPH_REJECTED if GRAPH_REJECTED in str(e) else Err.EXECUTOR_ERROR
        raise FleetforgeError(code, f"the QNN HTP compile of {params.model} for {params.soc} failed{where}: "
                              f"{_tidy(str(e), 600)}") from e
    finally:
        log.unlink(missing_ok=True)
    seconds = time.monotonic() - t0
    if not out.is_file() or not out.with_name(out.stem + "_qnn.bin").is_file():
        raise FleetforgeError(Err.UNSUPPORTED_OP, f"no node of {params.model} runs on the QNN HTP backend for "
                              f"{lookup_soc(params.soc).name} (unsupported op(s): {', '.join(_op_types(source))}); "
                              "nothing was compiled")
    offload = offload_report(source, out)
    if params.dump_dlc:
        # The IR (DLC) dump is a separate backend pass: it cannot be combined with context generation.
        dlc_dir = safe_join(root, params.dlc_dir or str(Path(params.output).parent))
        dlc_dir.mkdir(parents=True, exist_ok=True)
        before = set(dlc_dir.glob("*.dlc"))
        try:
            qnn_session(model_bytes, opts | {"dump_qnn_ir_dlc": "1", "dump_qnn_ir_dlc_dir": str(dlc_dir)})
        except Exception as e:
            from activities.toolchains.isolate import tidy

            raise FleetforgeError(Err.EXECUTOR_ERROR, f"QNN DLC dump of {params.model} failed: {tidy(str(e))}") from e
        new = sorted(set(dlc_dir.glob("*.dlc")) - before)
        if not new:
            raise FleetforgeError(Err.EXECUTOR_ERROR, f"QNN DLC dump wrote no .dlc into {dlc_dir.relative_to(root)}")
        outputs += [p.relative_to(root).as_posix() for p in new]
    soc = lookup_soc(params.soc)
    return StepOutput(outputs=outputs, seconds=seconds,
                      details={"soc": soc.name, "soc_model": soc.soc_model, "htp_arch": soc.htp_arch,
                               "precision": params.precision, "offload": offload.model_dump(mode="json")})


ABSURD_SCALE = 1e6
"""A QDQ scale above this spans a range of ~1e8 (8-bit) or more: a constant such as float32 min is in the
calibrated range, and the tensor's real values all quantize to one step."""


def check_scales(model: Any, name: str, source: Any) -> None:
    """QUANT_SCALE_INVALID naming the first tensor whose quantization scale is non-finite, <= 0 or, when
    the float `source` holds a huge constant (a mask of float32 min), absurd: the HTP compile fails on
    it ("Failed to compose Qnn graph") or the output is noise. Without such a constant a large scale is
    the data's own range (random weights grow activations to 1e9) and the accuracy gate judges it."""
    import numpy as np
    from onnx import numpy_helper

    from activities.toolchains.graph_passes import has_huge_constant

    limit = ABSURD_SCALE if has_huge_constant(source) else np.inf

    inits = {i.name: i for i in model.graph.initializer}
    producer = {o: n for n in model.graph.node for o in n.output}
    for node in model.graph.node:
        if node.op_type != "QuantizeLinear" or len(node.input) < 2 or node.input[1] not in inits:
            continue
        scale = numpy_helper.to_array(inits[node.input[1]]).astype(np.float64)
        bad = ~np.isfinite(scale) | (scale <= 0) | (scale > limit)
        if not bad.any():
            continue
        tensor = node.input[0]
        src = producer.get(tensor)
        made_by = f" (output of {src.op_type} node {src.name!r})" if src is not None else ""
        raise FleetforgeError(Err.QUANT_SCALE_INVALID, f"the quantization scale of tensor {tensor!r}{made_by} in {name} is "
                              f"{float(scale[bad].ravel()[0]):g}: its calibrated range spans a constant far outside the "
                              "data (an attention mask of float32 min or inf); the clamp_mask_constants graph pass "
                              "clamps such constants")


def _model_bytes(path: Path, name: str) -> tuple[bytes, Any]:
    """The model as one serialized proto, and its graph: external data (m.onnx.data) read in, since the
    session gets bytes (the EPContext partition name must not depend on the workspace path)."""
    from activities.modelhub import external_data_files

    data = path.read_bytes()
    m = _load_graph(data, name)
    if not external_data_files(m):
        return data, m
    return _load_model(path, name).SerializeToString(), m


def _load_model(path: Path, name: str) -> Any:
    """The model with its external data (m.onnx.data) read in from beside it: checks that read a
    tensor's values need them, and the worker's cwd is not the model's folder."""
    import onnx

    from activities.modelhub import external_data_files

    m = _load_graph(path.read_bytes(), name)
    if external_data_files(m):
        onnx.load_external_data_for_model(m, str(path.parent))
    return m


def _tidy(text: str, limit: int) -> str:
    from activities.toolchains.isolate import tidy
    from contracts.errors import clip

    return clip(tidy(text, len(text) + 1), limit)


class native_log:
    """Send this process's stderr (file descriptor 2, where onnxruntime's native logger writes) to a file
    while the block runs, so the failing node the QNN EP logs can be read back."""

    def __init__(self, path: Path):
        self.path = path

    def __enter__(self) -> Path:
        import os
        import sys

        sys.stderr.flush()
        self._saved = os.dup(2)
        self._file = open(self.path, "wb")
        os.dup2(self._file.fileno(), 2)
        return self.path

    def __exit__(self, *exc: object) -> None:
        import os

        os.dup2(self._saved, 2)
        os.close(self._saved)
        self._file.close()


_BACKEND_NOT_LOADED = re.compile(r"Unable to load backend, error:\s*([^\n\x1b]+)")
_LIBRARY_PACKAGES = {"libatomic.so.1": "libatomic1"}
"""Debian packages of the system libraries the QNN backend libraries load (ldd of onnxruntime_qnn/*.so)."""


def backend_unavailable(log: str) -> str | None:
    """Why the QNN EP could not load its backend library, from its log, or None. The EP then claims no
    node at all, which would read as a model no op of which the HTP supports: it is the worker's fault."""
    m = _BACKEND_NOT_LOADED.search(log)
    if m is None:
        return None
    why = m.group(1).strip()
    missing = next((lib for lib in _LIBRARY_PACKAGES if lib in why), None)
    fix = (f"install the system package that provides {missing} on the worker (Debian: apt-get install "
           f"{_LIBRARY_PACKAGES[missing]}; `make demo` does)") if missing else "install what it names on the worker"
    return f"the QNN HTP backend could not be loaded on this worker ({why}): {fix}, then rerun"


def raise_if_backend_unavailable(log: Path) -> None:
    why = backend_unavailable(log.read_text(errors="replace") if log.is_file() else "")
    if why is not None:
        raise FleetforgeError(Err.TOOLCHAIN_UNAVAILABLE, why)


_NODE_FAILED = re.compile(r"failed for node `([^`]+)` of type `([^`]+)`")


def failing_node(log: str, source: Any) -> tuple[str, str, str] | None:
    """(ONNX node name, its ONNX op type, the QNN op type) of the node the QNN EP log says failed, or None.
    ORT fuses before the EP sees the graph ("scores/MatMulAddFusion" from MatMul+Add): a name not in the
    source keeps the logged type."""
    m = _NODE_FAILED.search(log)
    if m is None:
        return None
    name, qnn_type = m.group(1), m.group(2)
    ops = {n.name: n.op_type for n in source.graph.node}
    base = name.split("/")[0] if name not in ops else name
    onnx_op = ops.get(name) or next((t for n, t in ops.items() if n == base), qnn_type)
    return name, onnx_op, qnn_type


_OP_IN_ERROR = re.compile(r"OpType\s*:\s*([A-Za-z][A-Za-z0-9_]*)|[Oo]p(?:erator)?[ _]?type[:= ]+['\"]?([A-Za-z][A-Za-z0-9_]*)")


def failing_op(message: str) -> str | None:
    """The op type a QNN EP / HTP compile error names ("Node 'n2' OpType:LRN ... was not selected"),
    or None when it names none."""
    m = _OP_IN_ERROR.search(message)
    return (m.group(1) or m.group(2)) if m else None


def _load_graph(model_bytes: bytes, name: str) -> Any:
    import onnx

    try:
        return onnx.load_from_string(model_bytes)
    except Exception as e:  # protobuf's DecodeError and friends
        raise FleetforgeError(Err.EXECUTOR_ERROR, f"{name} is not a readable ONNX model: {_tidy(str(e), 200)}") from e


FLOAT_TYPES = frozenset({1, 10, 11, 16})
"""onnx TensorProto float, float16, double, bfloat16."""


def _has_float(model: Any) -> bool:
    """Whether any graph input, constant or typed intermediate is a float tensor."""
    g = model.graph
    typed = [*g.input, *g.value_info, *g.output]
    return (any(v.type.tensor_type.elem_type in FLOAT_TYPES for v in typed)
            or any(i.data_type in FLOAT_TYPES for i in g.initializer))


def _op_types(model: Any) -> list[str]:
    return sorted({n.op_type for n in model.graph.node} - {"QuantizeLinear", "DequantizeLinear"}) or ["none"]


def offload_report(source: Any, context_model: Path) -> OffloadReport:
    """Which nodes of `source` run inside the context binary: every node of the context model that
    is not an EPContext node runs on the CPU EP, except the QuantizeLinear/DequantizeLinear that
    convert the float graph inputs and outputs of a QDQ model at its boundary."""
    import onnx

    ctx = onnx.load(str(context_model), load_external_data=False)
    inputs = {i.name for i in ctx.graph.input}
    outputs = {o.name for o in ctx.graph.output}

    def boundary(node: Any) -> bool:
        if node.op_type == "QuantizeLinear":
            return node.input[0] in inputs
        return node.op_type == "DequantizeLinear" and all(o in outputs for o in node.output)

    cpu = [n for n in ctx.graph.node if n.op_type != "EPContext" and not boundary(n)]
    return OffloadReport(nodes_total=len(source.graph.node), context_nodes=sum(n.op_type == "EPContext" for n in ctx.graph.node),
                         cpu_nodes=len(cpu), cpu_ops=sorted({n.op_type for n in cpu}),
                         io_nodes=sum(boundary(n) for n in ctx.graph.node))


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
