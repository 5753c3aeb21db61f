"""Numerical check of a converted model against the fp32 original on the same seeded inputs:
CPU EP for the original, the QNN EP (HTP emulation on x86) for an EPContext model, CPU otherwise."""

from __future__ import annotations

import time
from pathlib import Path

from pydantic import BaseModel

from activities.sandbox import safe_join
from contracts.errors import Err, FleetforgeError


class EvalParams(BaseModel, frozen=True):
    reference: str
    """Workspace-relative fp32 model."""
    candidate: str
    """Workspace-relative converted model (EPContext .onnx, QDQ .onnx, fp16 .onnx)."""
    samples: int = 4
    seed: int = 1234


class EvalReport(BaseModel, frozen=True):
    samples: int
    max_abs: float
    mean_abs: float
    cosine: float
    """Cosine similarity of the flattened outputs (all samples, all outputs)."""
    candidate_provider: str
    seconds: float


def _is_context_model(path: Path) -> bool:
    import onnx

    if path.suffix.lower() == ".ort":  # ORT flatbuffer format: never an EPContext model here
        return False
    m = onnx.load(str(path), load_external_data=False)
    return any(n.op_type == "EPContext" for n in m.graph.node)


EVALUATOR_VERSION = "1"
"""Part of the evaluation cache key: bump it when the evaluation's inputs or metrics change."""


def evaluation_cache_key(root: Path, params: EvalParams) -> str:
    """sha256 of canonical JSON of the evaluator version, samples, seed and the content of both models,
    including a context model's sibling `*_qnn.bin` files (the .onnx names its binary, not its hash)."""
    import hashlib
    import json

    from activities.storage import sha256_file

    ref, cand = safe_join(root, params.reference), safe_join(root, params.candidate)
    for rel, p in ((params.reference, ref), (params.candidate, cand)):
        if not p.is_file():
            raise FleetforgeError(Err.EVALUATION_ERROR, f"cannot evaluate: {rel!r} is not in the workspace")
    files = {"reference": sha256_file(ref), "candidate": sha256_file(cand)}
    for sibling in sorted(cand.parent.glob(f"{cand.stem}*_qnn.bin")):
        files[sibling.name] = sha256_file(sibling)
    doc = {"evaluator": EVALUATOR_VERSION, "samples": params.samples, "seed": params.seed, "files": files}
    return hashlib.sha256(json.dumps(doc, sort_keys=True, separators=(",", ":")).encode()).hexdigest()


def evaluate(root: Path, params: EvalParams) -> EvalReport:
    import numpy as np
    import onnxruntime as ort

    from activities.toolchains.ort_qnn import qnn_session, synthetic_feeds

    ref_path, cand_path = safe_join(root, params.reference), safe_join(root, params.candidate)
    t0 = time.monotonic()
    try:
        feeds = synthetic_feeds(ref_path, samples=params.samples, seed=params.seed)
        ref = ort.InferenceSession(str(ref_path), providers=["CPUExecutionProvider"])
        if _is_context_model(cand_path):
            cand = qnn_session(cand_path, {"backend_type": "htp"})
        else:
            cand = ort.InferenceSession(str(cand_path), providers=["CPUExecutionProvider"])
        provider = cand.get_providers()[0]
        cand_inputs = {i.name: i.type for i in cand.get_inputs()}
        a, b = [], []
        for feed in feeds:
            cfeed = {k: (v.astype(np.float16) if cand_inputs.get(k) == "tensor(float16)" else v) for k, v in feed.items()}
            a += [np.asarray(x, dtype=np.float64).ravel() for x in ref.run(None, feed)]
            b += [np.asarray(x, dtype=np.float64).ravel() for x in cand.run(None, cfeed)]
    except FleetforgeError:
        raise
    except Exception as e:
        raise FleetforgeError(Err.EVALUATION_ERROR, f"evaluating {params.candidate} against {params.reference} failed: {e}") from e
    x, y = np.concatenate(a), np.concatenate(b)
    if x.shape != y.shape:
        raise FleetforgeError(Err.EVALUATION_ERROR, f"output sizes differ: {x.shape} vs {y.shape}")
    diff = np.abs(x - y)
    denom = float(np.linalg.norm(x) * np.linalg.norm(y))
    cosine = float(np.dot(x, y) / denom) if denom > 0 else (1.0 if not diff.any() else 0.0)
    return EvalReport(samples=params.samples, max_abs=float(diff.max()), mean_abs=float(diff.mean()), cosine=cosine,
                      candidate_provider=provider, seconds=time.monotonic() - t0)
