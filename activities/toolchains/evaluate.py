"""Numerical check of a converted model against the fp32 original on the same inputs: CPU EP for the
original, the QNN EP (HTP emulation on x86) for an EPContext model, CPU otherwise.

Inputs: samples the candidate was never calibrated on: a held-out part of the user's data, the user's
separate evaluation set, or seeded synthetic inputs of other families and another seed than the
calibration's (activities/toolchains/feeds.py). Before anything runs, every evaluation sample is checked
against the samples the plan calibrated on (regenerated from the steps' own parameters): one shared
sample is EVALUATION_NOT_HELD_OUT, so a gate on in-sample data cannot happen.

Figures per graph output, per sample: cosine (the gate reads the lowest), its 5th percentile, median,
mean and spread; max/mean abs error and SQNR over every sample; positions where only one model gave
NaN/Inf; for a classifier-like output, top-1 agreement with the fp32 model. `evaluate` loads both
models into native runtimes: the activity runs it in a child process (`evaluate_in_child`), so an
emulator crash is EVALUATION_CRASHED, not a dead worker.
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
from contracts.convert_job import CalibrationSource, EvaluationReport, OutputFigures
from contracts.errors import Err, FleetforgeError

EVALUATOR_VERSION = "3"
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
    """Before held-out evaluation: the calibration .npz whose first `samples` samples are the inputs."""
    source: str | None = None
    """Workspace-relative PyTorch model `reference` was exported from: its module gives the reference
    outputs (activities/toolchains/torch_export.py); `reference` still defines the inputs."""
    evaluation: str | None = None
    """Workspace-relative .npz of evaluation samples (held out or separate); None: synthetic."""
    held_out: bool = False
    calibrated_on: list[CalibrationSource] | None = None
    """What the candidate calibrated on; None (an old request): not checked."""


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
    if params.evaluation:
        files["evaluation"] = sha256_file(safe_join(root, params.evaluation))
    for src in params.calibrated_on or []:
        if src.data:
            files[f"calibrated_on:{src.step_id}"] = sha256_file(safe_join(root, src.data))
    doc = {"evaluator": EVALUATOR_VERSION, "samples": params.samples, "seed": params.seed, "files": files,
           "toolchain": toolchain or {}, "held_out": params.held_out,
           "calibrated_on": [s.model_dump(mode="json") for s in params.calibrated_on or []]}
    return hashlib.sha256(json.dumps(doc, sort_keys=True, separators=(",", ":")).encode()).hexdigest()


def evaluate_in_child(root: str, params: dict[str, Any]) -> dict[str, Any]:
    """Child-process entry (activities/toolchains/isolate.py)."""
    return evaluate(Path(root), EvalParams.model_validate(params)).model_dump(mode="json")


def evaluation_feeds(root: Path, params: EvalParams, reference: Path) -> tuple[list[Any], str, list[str]]:
    """(samples, where they came from, synthetic families) for the evaluation."""
    from activities.toolchains.feeds import calibration_feeds, families_used, synthetic_feeds

    if params.evaluation:
        feeds = calibration_feeds(safe_join(root, params.evaluation), reference, limit=params.samples)
        return feeds, "held_out" if params.held_out else "eval_data", []
    if params.calibration:  # a request from before held-out evaluation
        return calibration_feeds(safe_join(root, params.calibration), reference, limit=params.samples), "calibration", []
    feeds = synthetic_feeds(reference, samples=params.samples, seed=params.seed, purpose="evaluation")
    return feeds, "synthetic", families_used(reference, "evaluation", params.samples)


def calibration_samples(root: Path, sources: list[CalibrationSource]) -> tuple[list[Any], str]:
    """Every sample the plan calibrated on, regenerated from the steps' own parameters, and its kind."""
    from activities.toolchains.feeds import calibration_feeds, synthetic_feeds

    feeds: list[Any] = []
    kinds = set()
    for src in sources:
        model = safe_join(root, src.model)
        if src.data:
            feeds += calibration_feeds(safe_join(root, src.data), model)
            kinds.add("data")
        elif src.samples:
            feeds += synthetic_feeds(model, samples=src.samples, seed=src.seed, purpose="calibration")
            kinds.add("synthetic")
    kind = "none" if not kinds else kinds.pop() if len(kinds) == 1 else "synthetic"
    return feeds, kind


def check_held_out(evaluation: list[Any], calibration: list[Any], where: str) -> None:
    """EVALUATION_NOT_HELD_OUT when any evaluation sample is a calibration sample."""
    from activities.toolchains.feeds import overlap

    shared = overlap(evaluation, calibration)
    if shared:
        raise FleetforgeError(Err.EVALUATION_NOT_HELD_OUT, f"{shared} of {len(evaluation)} evaluation samples ({where}) "
                              f"are samples the candidate was calibrated on: a gate on in-sample data proves nothing; "
                              "evaluate on held-out data (--eval-data, or more calibration samples to hold some out)")


def evaluate(root: Path, params: EvalParams) -> EvaluationReport:
    import numpy as np
    import onnxruntime as ort

    from activities.toolchains.qnn_ep import qnn_session

    ref_path, cand_path = safe_join(root, params.reference), safe_join(root, params.candidate)
    t0 = time.monotonic()
    feeds, inputs, families = evaluation_feeds(root, params, ref_path)
    calibrated, calibration_kind = calibration_samples(root, params.calibrated_on or [])
    if params.calibrated_on is not None:
        check_held_out(feeds, calibrated, inputs)
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
                a[i].append(np.asarray(ref_out[i], dtype=np.float64))
                b[i].append(np.asarray(cand_out[j], dtype=np.float64))
    except FleetforgeError:
        raise
    except Exception as e:
        from activities.toolchains.isolate import tidy

        raise FleetforgeError(Err.EVALUATION_ERROR, f"evaluating {params.candidate} against {params.reference} "
                              f"failed: {tidy(str(e))}") from e
    figures = [output_figures(name, x, y) for name, x, y in zip(names, a, b)]
    worst = min(figures, key=lambda f: f.cosine)
    sizes = [sum(v.size for v in x) for x in a]
    total = sum(sizes)
    mean_abs = sum(f.mean_abs * n for f, n in zip(figures, sizes)) / total if total else 0.0
    return EvaluationReport(
        reference=params.reference, candidate=params.candidate, samples=len(feeds), max_abs=max(f.max_abs for f in figures),
        mean_abs=mean_abs, cosine=worst.cosine, candidate_provider=provider, seconds=time.monotonic() - t0,
        outputs=figures, inputs=inputs, sqnr_db=min(f.sqnr_db for f in figures), families=families,
        calibration=calibration_kind if params.calibrated_on is not None else "unknown",
        calibration_samples=len(calibrated))


def output_figures(name: str, ref: list[Any], cand: list[Any]) -> OutputFigures:
    """One output's figures over its samples (each an array of the output's shape): per-sample cosines
    and their spread, the gate's figure (the lowest), errors and SQNR over everything, top-1 agreement
    for a classifier-like output."""
    import numpy as np

    pooled = _figures(name, np.concatenate([x.ravel() for x in ref]), np.concatenate([y.ravel() for y in cand]))
    per_sample = np.array([sample_cosine(x.ravel(), y.ravel()) for x, y in zip(ref, cand)])
    top1 = None
    if ref and _is_classifier(ref[0].shape):
        top1 = float(np.mean([int(np.argmax(x)) == int(np.argmax(y)) for x, y in zip(ref, cand)]))
    return pooled.model_copy(update={
        "cosine": float(per_sample.min()), "samples": len(per_sample), "cosine_pooled": pooled.cosine,
        "cosine_p05": float(np.quantile(per_sample, 0.05, method="lower")), "cosine_median": float(np.median(per_sample)),
        "cosine_mean": float(per_sample.mean()), "cosine_std": float(per_sample.std()), "top1_agreement": top1})


def _is_classifier(shape: tuple[int, ...]) -> bool:
    """Logits of one sample: exactly one axis of two or more classes ([1, 1000], [10])."""
    return sum(d > 1 for d in shape) == 1 and len(shape) <= 2


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


def sample_cosine(x: Any, y: Any) -> float:
    """One sample's cosine (NaN/Inf positions left out; an all-zero pair within tolerance is 1)."""
    import numpy as np

    both = np.isfinite(x) & np.isfinite(y)
    if not both.all() and (~np.isfinite(x) != ~np.isfinite(y)).any():
        return 0.0  # NaN/Inf where the other model has a number: this sample is wrong
    x, y = x[both], y[both]
    nx, ny = float(np.linalg.norm(x)), float(np.linalg.norm(y))
    if nx == 0.0 or ny == 0.0:
        return 1.0 if (float(np.abs(x - y).max()) if x.size else 0.0) <= ZERO_TOLERANCE else 0.0
    return float(np.clip(np.dot(x, y) / (nx * ny), -1.0, 1.0))


def sqnr_db(x: Any, y: Any) -> float:
    """onnxruntime.quantization.qdq_loss_debug.compute_signal_to_quantization_noice_ratio: 20 log10
    (|x| / |x - y|), each norm floored at float eps (so identical outputs give a large finite value)."""
    from onnxruntime.quantization.qdq_loss_debug import compute_signal_to_quantization_noice_ratio

    value = compute_signal_to_quantization_noice_ratio(x, y) if x.size else 0.0
    return float(value) if math.isfinite(value) else 0.0
