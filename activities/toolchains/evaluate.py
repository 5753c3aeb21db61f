"""Numerical check of a converted model against the fp32 original on the same inputs: CPU EP for the
original, the QNN EP (HTP emulation on x86) for an EPContext model, CPU otherwise.

Inputs: the run's calibration data when given, else seeded synthetic inputs (activities/toolchains/
feeds.py). Figures per graph output: cosine, max/mean abs error, SQNR, and positions where only one
model gave NaN/Inf. `evaluate` loads both models into native runtimes: the activity runs it in a
child process (`evaluate_in_child`), so an emulator crash is EVALUATION_CRASHED, not a dead worker.
"""

from __future__ import annotations

import hashlib
import json
import math
import time
from pathlib import Path
from typing import Any

from pydantic import BaseModel

from activities.sandbox import safe_join
from contracts.convert_job import EvaluationReport, OutputFigures
from contracts.errors import Err, FleetforgeError

EVALUATOR_VERSION = "2"
"""Part of the evaluation cache key: bump it when the evaluation's inputs or metrics change."""
ZERO_TOLERANCE = 1e-6
"""An all-zero reference output matches a candidate within this (cosine is undefined there)."""


class EvalParams(BaseModel, frozen=True):
    reference: str
    """Workspace-relative fp32 model."""
    candidate: str
    """Workspace-relative converted model (EPContext .onnx, QDQ .onnx, fp16 .onnx)."""
    samples: int = 4
    seed: int = 1234
    calibration: str | None = None
    """Workspace-relative calibration .npz: its first `samples` samples are the inputs."""
    source: str | None = None
    """Workspace-relative PyTorch model `reference` was exported from: its module gives the reference
    outputs (activities/toolchains/torch_export.py); `reference` still defines the inputs."""


def _is_context_model(path: Path) -> bool:
    import onnx

    if path.suffix.lower() == ".ort":  # ORT flatbuffer format: never an EPContext model here
        return False
    m = onnx.load(str(path), load_external_data=False)
    return any(n.op_type == "EPContext" for n in m.graph.node)


def evaluation_cache_key(root: Path, params: EvalParams, toolchain: dict[str, str] | None = None) -> str:
    """sha256 of canonical JSON of the evaluator version, the toolchain versions, samples, seed and
    the content of both models (a context model's sibling `*_qnn.bin` files too: the .onnx names its
    binary, not its hash) and of the calibration data."""
    from activities.storage import sha256_file

    ref, cand = safe_join(root, params.reference), safe_join(root, params.candidate)
    for rel, p in ((params.reference, ref), (params.candidate, cand)):
        if not p.is_file():
            raise FleetforgeError(Err.EVALUATION_ERROR, f"cannot evaluate: {rel!r} is not in the workspace")
    files = {"reference": sha256_file(ref), "candidate": sha256_file(cand)}
    for sibling in sorted(cand.parent.glob(f"{cand.stem}*_qnn.bin")):
        files[sibling.name] = sha256_file(sibling)
    if params.calibration:
        files["calibration"] = sha256_file(safe_join(root, params.calibration))
    if params.source:
        files["source"] = sha256_file(safe_join(root, params.source))
    for name, p in (("reference", ref), ("candidate", cand)):  # an ONNX model's external data is its content too
        for sidecar in sorted(p.parent.glob(f"{p.name}.data")):
            files[f"{name}:{sidecar.name}"] = sha256_file(sidecar)
    doc = {"evaluator": EVALUATOR_VERSION, "samples": params.samples, "seed": params.seed, "files": files,
           "toolchain": toolchain or {}}
    return hashlib.sha256(json.dumps(doc, sort_keys=True, separators=(",", ":")).encode()).hexdigest()


def evaluate_in_child(root: str, params: dict[str, Any]) -> dict[str, Any]:
    """Child-process entry (activities/toolchains/isolate.py)."""
    return evaluate(Path(root), EvalParams.model_validate(params)).model_dump(mode="json")


def evaluate(root: Path, params: EvalParams) -> EvaluationReport:
    import numpy as np
    import onnxruntime as ort

    from activities.toolchains.feeds import calibration_feeds, synthetic_feeds
    from activities.toolchains.ort_qnn import qnn_session

    ref_path, cand_path = safe_join(root, params.reference), safe_join(root, params.candidate)
    t0 = time.monotonic()
    if params.calibration:
        feeds = calibration_feeds(safe_join(root, params.calibration), ref_path, limit=params.samples)
    else:
        feeds = synthetic_feeds(ref_path, samples=params.samples, seed=params.seed)
    try:
        ref = ort.InferenceSession(str(ref_path), providers=["CPUExecutionProvider"])
        if params.source:  # hook: the torch module the reference was exported from answers instead
            from activities.toolchains.torch_export import TorchReference

            ref = TorchReference(safe_join(root, params.source), ref)
        if _is_context_model(cand_path):
            cand = qnn_session(cand_path, {"backend_type": "htp"})
        else:
            cand = ort.InferenceSession(str(cand_path), providers=["CPUExecutionProvider"])
        provider = cand.get_providers()[0]
        cand_inputs = {i.name: i.type for i in cand.get_inputs()}
        names = [o.name for o in ref.get_outputs()]
        cand_names = [o.name for o in cand.get_outputs()]
        order = [cand_names.index(n) if n in cand_names else i for i, n in enumerate(names)]
        a: list[list[Any]] = [[] for _ in names]
        b: list[list[Any]] = [[] for _ in names]
        for feed in feeds:
            cfeed = {k: (v.astype(np.float16) if cand_inputs.get(k) == "tensor(float16)" else v) for k, v in feed.items()}
            ref_out, cand_out = ref.run(None, feed), cand.run(None, cfeed)
            if len(cand_out) != len(ref_out):
                raise FleetforgeError(Err.EVALUATION_ERROR, f"{params.candidate} has {len(cand_out)} outputs, "
                                      f"{params.reference} has {len(ref_out)}")
            for i, j in enumerate(order):
                a[i].append(np.asarray(ref_out[i], dtype=np.float64).ravel())
                b[i].append(np.asarray(cand_out[j], dtype=np.float64).ravel())
    except FleetforgeError:
        raise
    except Exception as e:
        from activities.toolchains.isolate import tidy

        raise FleetforgeError(Err.EVALUATION_ERROR, f"evaluating {params.candidate} against {params.reference} "
                              f"failed: {tidy(str(e))}") from e
    figures = [_figures(name, np.concatenate(x), np.concatenate(y)) for name, x, y in zip(names, a, b)]
    worst = min(figures, key=lambda f: f.cosine)
    total = sum(len(np.concatenate(x)) for x in a)
    mean_abs = sum(f.mean_abs * len(np.concatenate(x)) for f, x in zip(figures, a)) / total if total else 0.0
    return EvaluationReport(
        reference=params.reference, candidate=params.candidate, samples=len(feeds), max_abs=max(f.max_abs for f in figures),
        mean_abs=mean_abs, cosine=worst.cosine, candidate_provider=provider, seconds=time.monotonic() - t0,
        outputs=figures, inputs="calibration" if params.calibration else "synthetic",
        sqnr_db=min(f.sqnr_db for f in figures))


def _figures(name: str, x: Any, y: Any) -> OutputFigures:
    """Cosine, errors and SQNR of one output over the finite positions of both; a position where only
    one side is NaN/Inf (or they differ) is a mismatch."""
    import numpy as np

    if x.shape != y.shape:
        raise FleetforgeError(Err.EVALUATION_ERROR, f"output {name!r} has {y.size} values, the fp32 model's {x.size}")
    fx, fy = np.isfinite(x), np.isfinite(y)
    both = fx & fy
    same_special = ~fx & ~fy & ((x == y) | (np.isnan(x) & np.isnan(y)))
    mismatches = int((~both & ~same_special).sum())
    x, y = x[both], y[both]
    diff = np.abs(x - y)
    max_abs = float(diff.max()) if diff.size else 0.0
    nx, ny = float(np.linalg.norm(x)), float(np.linalg.norm(y))
    if nx == 0.0 or ny == 0.0:
        cosine = 1.0 if max_abs <= ZERO_TOLERANCE else 0.0
    else:
        cosine = float(np.clip(np.dot(x, y) / (nx * ny), -1.0, 1.0))
    return OutputFigures(name=name, cosine=cosine, max_abs=max_abs, mean_abs=float(diff.mean()) if diff.size else 0.0,
                         sqnr_db=sqnr_db(x, y), nonfinite_mismatches=mismatches)


def sqnr_db(x: Any, y: Any) -> float:
    """onnxruntime.quantization.qdq_loss_debug.compute_signal_to_quantization_noice_ratio: 20 log10
    (|x| / |x - y|), each norm floored at float eps (so identical outputs give a large finite value)."""
    from onnxruntime.quantization.qdq_loss_debug import compute_signal_to_quantization_noice_ratio

    value = compute_signal_to_quantization_noice_ratio(x, y) if x.size else 0.0
    return float(value) if math.isfinite(value) else 0.0
