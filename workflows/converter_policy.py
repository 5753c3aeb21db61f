"""The converter's decisions as pure functions (STYLE G3): what to do after a compile, after an
execution, after an evaluation (the accuracy gate), and whether a human answer is acceptable.
No workflow.* calls, no I/O.

A deterministic planner (offline, or a rerun's fixed plan) is never asked to replan a failure it
cannot change: the job ends with the failing step's own code. It is asked again only with accuracy
or offload figures it has a remedy for (offline_planner.next_remedy)."""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Callable
from dataclasses import dataclass

from activities.toolchains.socs import lookup_soc
from contracts.common import Failure
from contracts.convert import CompiledStep, CompileResult, OutputKind, Precision
from contracts.convert_job import (
    DEFAULT_MIN_COSINE, AccuracyVerdict, AttemptRecord, CalibrationSource, ConversionRequest, EvaluationReport,
    OffloadReport, PlanFeedback, ProvideInput,
)
from contracts.errors import Err, FleetforgeError, clip

NOT_REPLANNABLE = frozenset({Err.TOOLCHAIN_UNAVAILABLE, Err.STORE_UNAVAILABLE, Err.INTEGRITY_ERROR, Err.STORE_URL_INVALID,
                             Err.CALIBRATION_INVALID, Err.CALIBRATION_NEEDED})
"""Execution failures a different plan cannot fix."""

CONTEXT_OUTPUTS = frozenset({OutputKind.QNN_CONTEXT_BINARY, OutputKind.DLC})
QUANTIZED = frozenset({Precision.INT8, Precision.W8A16, Precision.W4A16})
REAL_INPUTS = frozenset({"held_out", "eval_data"})
"""Evaluation inputs that are the user's data the candidate never calibrated on."""
EVAL_SEED = 1234
"""Synthetic evaluation inputs: another seed than any calibration's (the offline planner's is 0)."""
QUANTIZE_DEFAULTS = {"ortqnn.quantize_qdq": (8, 0), "onnx.quantize_static": (8, 0)}
"""Tools that calibrate → their (calibration_samples, seed) defaults when the plan leaves them out."""
MIN_GRADED_SAMPLES = 8
"""The fewest graded samples whose verdict can be `passed` (fewer: `unverified`, with the count). The gate
reads the lowest per-sample cosine, so a model that misses the threshold on one input in four still
passes n graded samples with probability (3/4)^n: 56 % at 2, 10 % at 8, 0.01 % at the default 32."""
WIDER = {Precision.INT8: (Precision.W8A16, Precision.FP16, Precision.FP32), Precision.W8A16: (Precision.FP16, Precision.FP32),
         Precision.W4A16: (Precision.W8A16, Precision.FP16, Precision.FP32), Precision.FP16: (Precision.FP32,)}


@dataclass(frozen=True)
class Execute:
    steps: list[CompiledStep]
    fingerprint: str


@dataclass(frozen=True)
class Replan:
    feedback: str
    record: AttemptRecord
    where: str = "compile"
    """Where the attempt failed: "compile", or the failing step."""
    failure: Failure | None = None
    """The failure that ends the job if no different plan comes (a repeated plan, a rerun)."""
    remedy: PlanFeedback | None = None
    """Accuracy/offload figures for the planner's remedies."""
    accuracy: AccuracyVerdict | None = None


@dataclass(frozen=True)
class GiveUp:
    failure: Failure
    record: AttemptRecord
    accuracy: AccuracyVerdict | None = None
    """The gate's verdict when the gate ended the job."""


@dataclass(frozen=True)
class Evaluate:
    record: AttemptRecord


@dataclass(frozen=True)
class Complete:
    record: AttemptRecord
    accuracy: AccuracyVerdict


def fingerprint(steps: list[CompiledStep]) -> str:
    """Identity of what would run: tool, version, argv and params of every step, in order."""
    doc = [{"tool": s.tool_name, "version": s.tool_version, "argv": s.argv, "params": s.params} for s in steps]
    return hashlib.sha256(json.dumps(doc, sort_keys=True, separators=(",", ":"), default=str).encode()).hexdigest()


def next_after_compile(result: CompileResult, *, attempt: int, replans: int, max_replans: int,
                       tried: frozenset[str] = frozenset(), last_feedback: str = "", last_failure: Failure | None = None,
                       can_replan: bool = True) -> Execute | Replan | GiveUp:
    """Run a clean compile unless exactly these steps already ran; replan a rejected plan while the
    budget lasts (never for a deterministic planner: it would answer the same plan)."""
    if result.ok:
        fp = fingerprint(result.steps)
        if fp in tried:
            why = "the planner proposed steps that already ran; they are not run twice"
            if last_failure is not None:  # the same plan again: the job ends with its own failure
                return GiveUp(last_failure, AttemptRecord(attempt=attempt, outcome="repeated_plan", feedback=why))
            msg = why + (f". Last error: {last_feedback}" if last_feedback else "")
            return GiveUp(Failure(code=Err.REPLANS_EXHAUSTED, message=msg, where="plan"),
                          AttemptRecord(attempt=attempt, outcome="repeated_plan", feedback=why))
        return Execute(steps=result.steps, fingerprint=fp)
    feedback = result.feedback()
    record = AttemptRecord(attempt=attempt, outcome="compile_rejected", feedback=feedback)
    if not can_replan:
        first = result.errors[0] if result.errors else None
        code = Err.COMPILER_ERROR if first is None or first.code == Err.INTERNAL else first.code
        return GiveUp(Failure(code=code, where="compile", message=f"the plan was rejected: {_one_line(feedback)}"), record)
    if replans < max_replans:
        return Replan(feedback=feedback, record=record)
    return GiveUp(Failure(code=Err.REPLANS_EXHAUSTED, where="compile",
                          message=f"the plan was still rejected after {replans} replan(s): {feedback}"), record)


def next_after_execution(failure: Failure | None, *, attempt: int, replans: int, max_replans: int,
                         can_replan: bool = True, can_remedy: Callable[[PlanFeedback], bool] | None = None,
                         remedies: list[str] | None = None) -> Evaluate | Replan | GiveUp:
    """Evaluate after a clean run; after a tool failure replan while the budget lasts, unless the
    planner is deterministic (it would answer the same plan): then the step's own failure ends the job,
    except when it names an op or a code a remedy fixes (`can_remedy`, a graph pass): then the planner
    gets it as compile feedback."""
    if failure is None:
        return Evaluate(AttemptRecord(attempt=attempt, outcome="succeeded"))
    feedback = f"[{failure.code}] {failure.where}: {failure.message}"
    record = AttemptRecord(attempt=attempt, outcome="execution_failed", feedback=feedback)
    remedy = compile_feedback(failure, remedies or [])
    if can_remedy is not None and failure.code not in NOT_REPLANNABLE and can_remedy(remedy):
        if replans < max_replans:
            return Replan(feedback=feedback, record=record, where=failure.where, failure=failure, remedy=remedy)
        return GiveUp(failure.model_copy(update={"message": failure.message + f"; the replan budget ({max_replans}) "
                                                 "is spent"}), record)
    if failure.code in NOT_REPLANNABLE or not can_replan:
        return GiveUp(failure, record)
    if replans < max_replans:
        return Replan(feedback=feedback, record=record, where=failure.where, failure=failure)
    return GiveUp(Failure(code=Err.REPLANS_EXHAUSTED, where=failure.where,
                          message=f"execution still failed after {replans} replan(s): {feedback}"), record)


_OP_NAMED = re.compile(r"\bop(?:erator)? (?:type )?([A-Z][A-Za-z0-9_]*)|OpType\s*:\s*([A-Z][A-Za-z0-9_]*)")


def compile_feedback(failure: Failure, remedies: list[str]) -> PlanFeedback:
    """A step's failure as remedy feedback: the op types its message names and its code."""
    ops = sorted({a or b for a, b in _OP_NAMED.findall(failure.message)})
    return PlanFeedback(kind="compile", remedies=list(remedies), failing_ops=ops, code=failure.code)


def next_after_failed_remedy(failure: Failure, previous: Replan, *, remedies: list[str], float_outputs: list[str],
                             attempt: int, replans: int, max_replans: int,
                             can_remedy: Callable[[PlanFeedback], bool]) -> Replan | GiveUp:
    """A remedy's plan did not run (keeping the only op in float leaves nothing to quantize, a tool
    crashed on it): drop that remedy and try the next one on the same figures, or end with the gate's
    own failure, saying which remedy could not run. Infrastructure failures end the job as they are.
    `remedies` are the ones the failed plan applied, the new one last."""
    assert previous.remedy is not None and previous.failure is not None
    record = AttemptRecord(attempt=attempt, outcome="remedy_failed", remedies=list(remedies),
                           feedback=f"[{failure.code}] {failure.where}: {failure.message}")
    if failure.code in NOT_REPLANNABLE:
        return GiveUp(failure, record)
    new = remedies[-1] if remedies else "?"
    note = f"; remedy {new} could not run ([{failure.code}] {_one_line(failure.message, 200)})"
    gate_failure = previous.failure.model_copy(update={"message": previous.failure.message + note})
    feedback = previous.remedy.model_copy(update={"remedies": list(remedies[:-1]), "failed": [*previous.remedy.failed, new],
                                                  "float_outputs": list(float_outputs)})
    if not can_remedy(feedback):
        ended = gate_failure.model_copy(update={"message": gate_failure.message + "; the planner has no further remedy"})
        return GiveUp(ended, record, previous.accuracy)
    if replans < max_replans:
        return Replan(feedback=previous.feedback + note, record=record, where=previous.where, failure=gate_failure,
                      remedy=feedback, accuracy=previous.accuracy)
    ended = gate_failure.model_copy(update={"message": gate_failure.message + f"; the replan budget ({max_replans}) is spent"})
    return GiveUp(ended, record, previous.accuracy)


def min_cosine_for(request: ConversionRequest) -> float:
    """The request's threshold, or its precision's default."""
    if request.min_cosine is not None:
        return request.min_cosine
    return DEFAULT_MIN_COSINE.get(request.precision or Precision.FP16, 0.99)


def gate(report: EvaluationReport | None, offload: OffloadReport | None, *, request: ConversionRequest,
         attempt: int, replans: int, max_replans: int, remedies: list[str], float_outputs: list[str],
         can_remedy: Callable[[PlanFeedback], bool], failed: list[str] | None = None,
         delivered: Precision | None = None) -> Complete | Replan | GiveUp:
    """The accuracy gate: a context binary must run entirely inside the binary, and every output's
    lowest per-sample cosine and its pooled cosine must reach the threshold (NaN/Inf where fp32 has
    none is a failure), else
    the planner gets the figures as feedback while the budget lasts and `can_remedy` says it has a
    remedy, else the job fails with the figures, the remedies tried and the ones it may not apply.
    `min_cosine` 0 accepts a lossy result (the verdict says so). A quantized model that passes only on
    synthetic inputs completes `unverified` (accuracy: unverified on real data), never `passed`."""
    threshold = min_cosine_for(request)
    figures = AccuracyVerdict(verdict="passed", min_cosine=threshold, cosine=report.cosine if report else None,
                              sqnr_db=report.sqnr_db if report else None, offload_share=offload.share if offload else None,
                              cpu_ops=list(offload.cpu_ops) if offload else [], remedies=list(remedies),
                              samples=report.samples if report else None, inputs=report.inputs if report else "",
                              min_samples=MIN_GRADED_SAMPLES)
    record = AttemptRecord(attempt=attempt, outcome="succeeded", remedies=list(remedies))
    failed = list(failed or [])
    tried = f"; remedies tried: {', '.join(remedies)}" if remedies else ""
    tried += f"; remedies that could not run: {', '.join(failed)}" if failed else ""
    if offload is not None and request.output in CONTEXT_OUTPUTS and not offload.full:
        verdict = figures.model_copy(update={"verdict": "not_offloaded"})
        message = (f"{offload.cpu_nodes} of {offload.model_nodes} nodes run on the CPU outside the HTP context binary "
                   f"(ops: {', '.join(offload.cpu_ops)}; offload {offload.share:.0%}){tried}")
        feedback = PlanFeedback(kind="offload", remedies=remedies, failed=failed, float_outputs=float_outputs,
                                evaluation=report, offload=offload, min_cosine=threshold)
        return _below(Failure(code=Err.NOT_FULLY_OFFLOADED, where="evaluate", message=message), verdict, feedback,
                      attempt=attempt, replans=replans, max_replans=max_replans, can_remedy=can_remedy)
    if report is None:
        note = "nothing to evaluate: the output is the fp32 model in another file format"
        return Complete(record, figures.model_copy(update={"verdict": "not_evaluable", "note": note}))
    missed = [o for o in report.outputs if o.misses(threshold)]
    if threshold <= 0.0:
        note = f"accepted as lossy (--min-cosine 0): worst cosine {report.cosine:.4f}"
        return Complete(record, figures.model_copy(update={"verdict": "accepted_lossy", "note": note}))
    if report.cosine >= threshold and not missed:
        return Complete(record, passing_verdict(figures, report, request, delivered))
    worst = ", ".join(f"{o.name} cosine {o.cosine:.4f}" + _spread(o) + f" sqnr {o.sqnr_db:.1f} dB"
                      + (f" {o.nonfinite_mismatches} NaN/Inf mismatches" if o.nonfinite_mismatches else "")
                      for o in sorted(missed or report.outputs, key=lambda o: o.cosine)[:3])
    tried += proposal(request, delivered)
    if report.cosine >= threshold and not any(o.cosine < threshold or o.nonfinite_mismatches for o in missed):
        pooled = min(o.cosine_pooled for o in missed if o.cosine_pooled is not None)
        what = (f"pooled cosine {pooled:.4f} < {threshold:g} on {report.samples} {report.inputs} samples: every sample's "
                f"output points the right way (lowest per-sample cosine {report.cosine:.4f}) but their sizes are off, "
                "as when a large sample is clipped to a calibrated range")
    else:
        what = f"lowest per-sample cosine {report.cosine:.4f} < {threshold:g} on {report.samples} {report.inputs} samples"
    message = f"{what} ({worst}){tried}"
    feedback = PlanFeedback(kind="accuracy", remedies=remedies, failed=failed, float_outputs=float_outputs,
                            evaluation=report, offload=offload, min_cosine=threshold)
    verdict = figures.model_copy(update={"verdict": "below_threshold"})
    return _below(Failure(code=Err.ACCURACY_BELOW_THRESHOLD, where="evaluate", message=message), verdict, feedback,
                  attempt=attempt, replans=replans, max_replans=max_replans, can_remedy=can_remedy)


def passing_verdict(figures: AccuracyVerdict, report: EvaluationReport, request: ConversionRequest,
                    delivered: Precision | None) -> AccuracyVerdict:
    """Figures that reach the threshold are `passed` only on enough real samples: a quantized model graded
    on synthetic inputs, or any model graded on fewer than MIN_GRADED_SAMPLES, is `unverified`, its note
    saying why with the count and its hint what would verify it."""
    quantized = (delivered or request.precision) in QUANTIZED
    synthetic = quantized and report.inputs not in REAL_INPUTS
    few = report.samples < MIN_GRADED_SAMPLES
    if not synthetic and not few:
        return figures
    shown = f"lowest per-sample cosine {report.cosine:.4f} >= {figures.min_cosine:g} on"
    if synthetic:
        note = f"accuracy: unverified on real data: {shown} {report.samples} {report.inputs} samples only"
        hint = "give real inputs with --calibration (a held-out part grades the result) or --eval-data to verify it"
    else:
        note = (f"accuracy: unverified: {shown} only {report.samples} {report.inputs.replace('_', '-')} sample(s), fewer "
                f"than the gate's minimum of {MIN_GRADED_SAMPLES}")
        hint = more_samples_hint(request, report.inputs)
    if synthetic and few:
        note += f" (and fewer than the gate's minimum of {MIN_GRADED_SAMPLES})"
    return figures.model_copy(update={"verdict": "unverified", "note": f"{note}; {hint}", "hint": hint})


def more_samples_hint(request: ConversionRequest, inputs: str) -> str:
    """What grades at least MIN_GRADED_SAMPLES samples, for where this job's samples came from."""
    n = MIN_GRADED_SAMPLES
    if request.eval_samples < n:
        return f"grade at least {n} samples: --eval-samples {n} or more"
    if inputs == "held_out":
        return (f"give at least {2 * n} calibration samples (up to half of them, at most --eval-samples, are held out to "
                f"grade the result), or a separate --eval-data set of at least {n}")
    if inputs == "eval_data":
        return f"give --eval-data with at least {n} samples"
    return f"grade at least {n} samples: --eval-samples {n} or more"


def _spread(o: object) -> str:
    """` (p5 X, median Y over N samples, pooled Z)` for per-sample figures; empty for a report from before them."""
    p05, median, n = getattr(o, "cosine_p05", None), getattr(o, "cosine_median", None), getattr(o, "samples", 0)
    pooled = getattr(o, "cosine_pooled", None)
    if p05 is None or median is None:
        return ""
    return f" (p5 {p05:.4f}, median {median:.4f} over {n} samples" + (f", pooled {pooled:.4f})" if pooled is not None else ")")


def proposal(request: ConversionRequest, delivered: Precision | None) -> str:
    """The wider precision the gate may not apply by itself (no --precision-fallback), as advice."""
    current = delivered or request.precision
    if request.precision_fallback or current is not Precision.INT8 or request.output is OutputKind.ORT:
        return ""
    return ("; not applied (the delivered precision stays the requested one): 16-bit activations might reach the "
            "threshold: convert with --precision w8a16, or allow it with --precision-fallback")


FLOAT_HINTS: dict[str, str] = {
    Err.CALIBRATION_INVALID: "--eval-data takes an .npz (input name -> [N, *shape]) or a folder of them, matching the "
                             "model's inputs",
    Err.CALIBRATION_NEEDED: "give real inputs for the named inputs with --eval-data FILE.npz (input name -> array): a "
                            "float build is graded on them",
    Err.EVALUATION_NOT_HELD_OUT: "give --eval-data whose samples are not in the other data given",
    Err.EXECUTOR_ERROR: "see logs/last_error.json in the run's workspace; try another --preset, or --output ort (the CPU)",
}
"""A float (fp16/fp32) job's hint for the codes whose general remedy is about calibration data."""
QUANTIZED_HINTS: dict[str, str] = {
    Err.EXECUTOR_ERROR: "see logs/last_error.json in the run's workspace; try --precision fp16, or another --preset",
    Err.TOOL_CRASHED: "a native tool crashed (the worker is fine): try --precision fp16, or another --soc",
}


def failure_hint(code: str, request: ConversionRequest, delivered: Precision | None = None) -> str:
    """What to do about a failed conversion, for its code *and* its precision (contracts.errors.REMEDY is
    one line per code, whatever the job): a float build's accuracy is never a calibration matter, a
    quantized one's is, with or without real data. Empty: the code's general remedy fits as it is."""
    precision = delivered or request.precision
    if precision is None:
        return ""
    quantized = precision in QUANTIZED
    if code == Err.NOT_FULLY_OFFLOADED and precision is Precision.W4A16:
        return ("the HTP of this QNN SDK leaves 4-bit MatMuls on the CPU (the message names the ops and the share): use "
                "--precision w8a16 for a fully offloaded decoder, or --output onnx_qdq to ship the 4-bit QDQ model")
    if code != Err.ACCURACY_BELOW_THRESHOLD:
        return (QUANTIZED_HINTS if quantized else FLOAT_HINTS).get(code, "")
    accept = "or accept the result as it is with --min-cosine below its figure (0: lossy)"
    if not quantized:
        where = ("the HTP has no fp32 math (it computed fp16): keep fp32 on the CPU with --output ort --precision fp32"
                 if request.output in CONTEXT_OUTPUTS else "convert with --precision fp32")
        return f"fp16 cannot hold what this model computes closely enough: {where}, {accept}"
    wider = {Precision.INT8: "16-bit activations: --precision w8a16 (or allow it with --precision-fallback)",
             Precision.W8A16: "float math: --precision fp16",
             Precision.W4A16: "8-bit weights: --precision w8a16 (or allow it with --precision-fallback)"}.get(precision, "")
    data = "" if request.calibration or request.eval_data else \
        "give real inputs with --calibration FILE.npz (synthetic calibration misses real ranges); "
    return f"{data}{'try ' + wider + ', ' if wider else ''}{accept}"


def calibration_question(request: ConversionRequest) -> str | None:
    """int8/w8a16 without calibration data and without the synthetic opt-in: ask for the data (a job
    must not quietly calibrate on noise and call the result passed). None: nothing to ask."""
    if request.precision not in QUANTIZED or request.calibration or request.synthetic_calibration or request.rerun_of:
        return None
    return (f"Which real inputs should calibrate the {request.precision.value} quantization? Answer "
            "calibration=FILE.npz (input name -> [N, *shape]; a held-out part of it grades the result, or add "
            "eval_data=FILE.npz), or synthetic_calibration=yes to calibrate on synthetic inputs (the accuracy "
            "verdict will then say: unverified on real data).")


def calibration_sources(steps: list[CompiledStep]) -> list[CalibrationSource]:
    """What each calibrating step of a plan calibrates on (its own params, the tool's defaults)."""
    out = []
    for s in steps:
        defaults = QUANTIZE_DEFAULTS.get(s.tool_name)
        if defaults is None or not isinstance(s.params.get("model"), str):
            continue
        data = s.params.get("calibration_data")
        out.append(CalibrationSource(step_id=s.step_id, model=s.params["model"], data=data if isinstance(data, str) else None,
                                     samples=0 if data else int(s.params.get("calibration_samples") or defaults[0]),
                                     seed=int(s.params.get("seed", defaults[1]) or 0)))
    return out


def delivered_precision(steps: list[CompiledStep], requested: Precision | None) -> Precision | None:
    """What the built model computes in, read from the steps: a QDQ quantizer's precision (16-bit
    activations = w8a16), onnx's static quantizer (int8), an fp16 cast or an HTP compile at fp16;
    otherwise the requested precision (a plan without a precision step keeps the source's)."""
    found: list[Precision] = []
    for s in steps:
        p = s.params.get("precision")
        if s.tool_name in ("onnx.quantize_static", "onnx.quantize_dynamic"):
            found.append(Precision.INT8)
        elif s.tool_name == "onnx.fp16":
            found.append(Precision.FP16)
        elif isinstance(p, str) and p in {x.value for x in Precision}:
            found.append(Precision(p))
        elif s.params.get("act_bitwidth") is not None:  # QAIRT quantizer: 16-bit activations = w8a16
            found.append(Precision.W8A16 if str(s.params["act_bitwidth"]) == "16" else Precision.INT8)
        elif s.argv and any(a.startswith("--act_bitwidth") or a.startswith("--act_bw") for a in s.argv):
            i = next(i for i, a in enumerate(s.argv) if a.startswith("--act_bitwidth") or a.startswith("--act_bw"))
            value = s.argv[i].split("=", 1)[1] if "=" in s.argv[i] else (s.argv[i + 1] if i + 1 < len(s.argv) else "")
            found.append(Precision.W8A16 if value == "16" else Precision.INT8)
    quantized = [p for p in found if p in QUANTIZED]
    if quantized:
        return next(p for p in (Precision.W4A16, Precision.W8A16, Precision.INT8) if p in quantized)
    if found:
        return Precision.FP16 if Precision.FP16 in found and requested is not Precision.FP32 else found[0]
    return requested


def precision_refusal(request: ConversionRequest, delivered: Precision | None) -> str | None:
    """Why a plan may not run: it delivers a wider precision than the requested one and the request
    did not allow a fallback. The HTP's fp16 math for an fp32 request is the target's, not a fallback."""
    wanted = request.precision
    if wanted is None or delivered is None or delivered == wanted or request.precision_fallback:
        return None
    if wanted is Precision.FP32 and delivered is Precision.FP16:
        return None
    if delivered in WIDER.get(wanted, ()) or delivered in QUANTIZED:
        return (f"the plan delivers {delivered.value}, but {wanted.value} was requested and no fallback was allowed: "
                f"build {wanted.value}, or the user may allow it with --precision-fallback")
    return None


def check_precision(result: CompileResult, request: ConversionRequest) -> CompileResult:
    """A clean compile whose plan delivers another precision than the request allows becomes a rejection
    (PLAN_INVALID, where "plan"): an LLM planner is told why, a deterministic one ends with it."""
    if not result.ok:
        return result
    why = precision_refusal(request, delivered_precision(result.steps, request.precision))
    if why is None:
        return result
    return CompileResult(ok=False, errors=[Failure(code=Err.PLAN_INVALID, where="plan", message=why)])


def _below(failure: Failure, verdict: AccuracyVerdict, feedback: PlanFeedback, *, attempt: int, replans: int,
           max_replans: int, can_remedy: Callable[[PlanFeedback], bool]) -> Replan | GiveUp:
    record = AttemptRecord(attempt=attempt, outcome=verdict.verdict, feedback=failure.message, remedies=verdict.remedies)
    if not can_remedy(feedback):
        return GiveUp(failure.model_copy(update={"message": failure.message + "; the planner has no further remedy"}),
                      record, verdict)
    if replans < max_replans:
        return Replan(feedback=f"[{failure.code}] {failure.message}", record=record, where="evaluate", failure=failure,
                      remedy=feedback, accuracy=verdict)
    return GiveUp(failure.model_copy(update={"message": failure.message + f"; the replan budget ({max_replans}) is spent"}),
                  record, verdict)


def rerun_gives_up(replan: Replan, rerun_of: str, overrides: dict[str, str]) -> GiveUp:
    """A rerun reuses an earlier plan and is never replanned: it ends with the failure's own code
    (compiler, tool, accuracy gate), saying what to change."""
    code = Err.COMPILER_ERROR if replan.record.outcome == "compile_rejected" else Err.EXECUTOR_ERROR
    if replan.failure is not None and replan.failure.code in {e.value for e in Err}:
        code = Err(replan.failure.code)
    return GiveUp(Failure(code=code, where=replan.where,
                          message=f"the rerun of {rerun_of} with {overrides} failed (a rerun is not replanned; change "
                                  f"the overrides or start a new conversion): {replan.feedback}"), replan.record)


def _one_line(text: str, limit: int = 600) -> str:
    return clip(" / ".join(line.strip() for line in text.splitlines() if line.strip()), limit)


def answer_problems(answer: ProvideInput) -> list[str]:
    """Why an answer cannot be accepted (empty: acceptable)."""
    if answer.is_empty():
        return ["the answer is empty: give soc, precision, calibration, eval_data or synthetic_calibration"]
    problems = []
    if answer.soc is not None:
        try:
            lookup_soc(answer.soc)
        except FleetforgeError as e:
            problems.append(e.message)
    if answer.precision is not None and answer.precision.strip().lower() not in {p.value for p in Precision}:
        problems.append(f"unknown precision {answer.precision!r}; valid: {', '.join(p.value for p in Precision)}")
    return problems


def answer_hint(workflow_id: str) -> str:
    """The command that answers a waiting job (the details and the timer summary show it)."""
    return f"fleetforge answer {workflow_id} soc=... precision=..."


def wait_summary(timeout_s: int, workflow_id: str) -> str:
    """The NEEDS_INPUT timer's summary, in words a person reads in the Web UI's timeline."""
    return f"waiting up to {_duration(timeout_s)} for an answer: {answer_hint(workflow_id)}"


def _duration(seconds: int) -> str:
    """604800 → "7 days", 5400 → "1 h 30 min", 90 → "1 min 30 s" (the two largest units)."""
    if seconds % 86400 == 0:
        days = seconds // 86400
        return f"{days} day{'s' if days != 1 else ''}"
    parts = [(seconds // 86400, "d"), (seconds % 86400 // 3600, "h"), (seconds % 3600 // 60, "min"), (seconds % 60, "s")]
    shown = [f"{n} {unit}" for n, unit in parts if n][:2]
    return " ".join(shown) or "0 s"


def apply_answer(request: ConversionRequest, answer: ProvideInput) -> ConversionRequest:
    """The request with the answered facts filled in (unanswered ones unchanged)."""
    update: dict[str, object] = {}
    if answer.soc and answer.soc.strip():
        update["target_soc"] = lookup_soc(answer.soc).name
    if answer.precision and answer.precision.strip():
        update["precision"] = Precision(answer.precision.strip().lower())
    if answer.calibration and answer.calibration.strip():
        update["calibration"] = answer.calibration.strip()
    if answer.eval_data and answer.eval_data.strip():
        update["eval_data"] = answer.eval_data.strip()
    if answer.synthetic_calibration is not None:
        update["synthetic_calibration"] = answer.synthetic_calibration
    return request.model_copy(update=update)
