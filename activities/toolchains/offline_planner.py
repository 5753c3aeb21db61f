"""The deterministic offline conversion planner: request facts + model facts + tool registry →
ConversionPlan. Pure (no I/O): the same inputs always give the same plan, so a replay, a retry
or a second worker plans identically. The LLM planner's fallback and the default offline.

Paths are workspace-relative: the model is `input/<file>`, everything produced goes to
`converted/`. Facts the planner cannot guess (target SoC, precision) become questions.

Accuracy remedies: when the converted model misses the accuracy threshold (or leaves nodes on the
CPU), the workflow asks again with the figures (`PlanFeedback`). The planner then applies its next
remedy on top of the ones already tried, in the order of REMEDIES: the failing outputs' last nodes
kept in float (the cheapest: the rest stays int8; a softmax whose values sit below one 8-bit step
needs no more), the fewest most sensitive layers at 16-bit activations (mixed precision: the model
stays int8), 16-bit activations everywhere (int8 → w8a16, with the user's consent), more calibration
samples with per-channel weights. A float build for the HTP below the gate gets the exact graph passes
registered for ACCURACY_BELOW_THRESHOLD instead (rewrites around backend defects: avgpool_exclude_pad,
flatten_matmul_input). With no remedy left the workflow ends with the gate's own code (next_remedy says so without asking the
planner).
"""

from __future__ import annotations

import re
from pathlib import PurePosixPath

from pydantic import JsonValue

from activities.toolchains.graph_passes import PASSES, passes_for
from activities.toolchains.presets import preset_args
from activities.toolchains.registry import ToolRegistry
from activities.toolchains.socs import SOCS, lookup_soc
from contracts.convert import ConversionPlan, OutputKind, PlanStatus, PlanStep, Precision, Toolchain
from contracts.convert_job import ConversionRequest, PlanFeedback
from contracts.errors import Err, FleetforgeError, clip
from contracts.models import ModelFormat, ModelRef

QNN_OUTPUTS = frozenset({OutputKind.QNN_CONTEXT_BINARY, OutputKind.DLC})
"""Outputs compiled for one SoC (the planner must know which)."""
QUANTIZED = frozenset({Precision.INT8, Precision.W8A16, Precision.W4A16})
SYNTHETIC_SAMPLES = 8
SYNTHETIC_SEED = 0
MORE_SAMPLES_FACTOR = 4
MAX_SAMPLES = 64

W8A16, FLOAT_OUTPUTS, MORE_CALIBRATION, MIXED = "w8a16", "float_outputs", "more_calibration", "mixed_precision"
REMEDIES = (FLOAT_OUTPUTS, MIXED, W8A16, MORE_CALIBRATION)
"""The offline planner's accuracy remedies, tried in this order (each on top of the earlier ones): the
fewest layers at 16 bits before a whole-model w8a16."""
PASS_PREFIX = "pass:"
"""A graph-surgery remedy: "pass:NAME[+NAME...]" (activities/toolchains/graph_passes.py), chosen when a
placement or compile failure names an op or a code a registered pass fixes."""
REMEDY_WORDS = {
    W8A16: "16-bit activations (w8a16)",
    MIXED: "the most sensitive layers at 16-bit activations (mixed precision)",
    FLOAT_OUTPUTS: "the failing outputs kept in float",
    MORE_CALIBRATION: "more calibration samples with per-channel weights",
}
TORCH_FORMATS = frozenset({ModelFormat.TORCH, ModelFormat.TORCH_EXPORT})


def remedy_words(remedy: str) -> str:
    if remedy.startswith(PASS_PREFIX):
        return "graph pass(es) " + ", ".join(remedy_passes([remedy]))
    return REMEDY_WORDS.get(remedy, remedy)


def remedy_passes(remedies: list[str]) -> list[str]:
    """The graph passes a list of remedies names, in registry order, each once."""
    named = {p for r in remedies if r.startswith(PASS_PREFIX) for p in r[len(PASS_PREFIX):].split("+")}
    return [p for p in PASSES if p in named]


def request_problems(request: ConversionRequest) -> list[str]:
    """Combinations no plan can satisfy (the CLI refuses them with exit 2 before a job starts)."""
    out: list[str] = []
    p = request.precision
    if request.output is OutputKind.ORT and p in (Precision.W8A16, Precision.W4A16):
        out.append(f"--output ort supports fp32, fp16 or int8, not {p.value} (use --output qnn_context_binary or onnx_qdq)")
    if request.output is OutputKind.ONNX_QDQ and p is not None and p not in QUANTIZED:
        out.append(f"--output onnx_qdq needs --precision int8, w8a16 or w4a16, not {p.value}")
    if request.toolchain is Toolchain.ONNX and request.output in QNN_OUTPUTS:
        out.append(f"the onnx toolchain cannot build {request.output.value}; use --toolchain auto or ort-qnn")
    return out


def questions_for(request: ConversionRequest) -> list[str]:
    """What the planner must ask before it can plan (empty: nothing to ask)."""
    out: list[str] = []
    if request.output in QNN_OUTPUTS:
        socs = ", ".join(s.name for s in SOCS)
        if not request.target_soc:
            out.append(f"Which Snapdragon SoC should the {request.output.value} target? One of: {socs}.")
        else:
            try:
                lookup_soc(request.target_soc)
            except FleetforgeError:
                out.append(f"Unknown SoC {request.target_soc!r}. Which SoC should it target? One of: {socs}.")
    if request.precision is None:
        out.append(f"Which precision: {', '.join(p.value for p in Precision)}? (int8 is smallest and fastest on HTP; fp16 is closest to the original.)")
    return out


def plan_offline(request: ConversionRequest, model: ModelRef, registry: ToolRegistry, *, feedback: str = "",
                 remedy: PlanFeedback | None = None) -> ConversionPlan:
    """The plan for `request` on `model`, or a NEEDS_INPUT plan with questions; with accuracy/offload
    feedback, the plan with the next remedy applied (or the same plan when none is left)."""
    questions = questions_for(request)
    if questions:
        return ConversionPlan(status=PlanStatus.NEEDS_INPUT, questions=questions,
                              intent={"output": request.output.value}, rationale="missing facts")
    if model.format is not ModelFormat.ONNX and model.format not in TORCH_FORMATS:
        raise FleetforgeError(Err.TOOLCHAIN_UNAVAILABLE,
                              f"the offline planner converts ONNX and PyTorch (.pt TorchScript, .pt2 ExportedProgram) "
                              f"models; {model.name} is {model.format.value}")
    if request.toolchain is Toolchain.QAIRT:
        raise FleetforgeError(Err.TOOLCHAIN_UNAVAILABLE, "the offline planner has no qairt tools; use toolchain auto or ort-qnn")
    if request.toolchain is Toolchain.ONNX and request.output in QNN_OUTPUTS:
        raise FleetforgeError(Err.BAD_INPUT, f"the onnx toolchain cannot build {request.output.value}; use auto or ort-qnn")
    assert request.precision is not None  # questions_for asked otherwise
    remedies = [r for r in remedy.remedies if r not in remedy.failed] if remedy else []
    float_outputs = list(remedy.float_outputs) if remedy and FLOAT_OUTPUTS in remedies else []
    if remedy is not None:
        step = next_remedy(request, remedy)
        if step is not None:
            remedies.append(step)
            if step == FLOAT_OUTPUTS:
                float_outputs = failing_outputs(remedy)
    b = _Builder(registry, f"input/{model.filename}", _stem(model.filename), request.preset, remedies, float_outputs,
                 remedy.min_cosine if remedy else None)
    source_model = _export_and_passes(b, request, model)
    if request.output in QNN_OUTPUTS:
        candidate = _plan_qnn(b, request)
    elif request.output is OutputKind.ONNX_QDQ:
        candidate = _plan_onnx_qdq(b, request)
    else:
        candidate = _plan_ort(b, request)
    intent: dict[str, JsonValue] = {
        "model": model.name, "output": request.output.value, "precision": b.precision(request).value,
        "soc": lookup_soc(request.target_soc).name if request.target_soc and request.output in QNN_OUTPUTS else None,
        "reference": b.source, "evaluate": candidate, "warnings": list(b.warnings), "preset": request.preset,
    }
    if request.calibration:
        intent["calibration"] = request.calibration
    if source_model is not None:
        intent["source_model"] = source_model
    if remedies or (remedy and remedy.failed):
        intent |= {"requested_precision": request.precision.value, "remedies": list(remedies),
                   "float_outputs": list(float_outputs), "failed_remedies": list(remedy.failed if remedy else [])}
    rationale = " → ".join(s.tool_name for s in b.steps)
    if remedies:
        rationale += "; remedies: " + ", ".join(remedy_words(r) for r in remedies)
    if feedback:
        rationale += " (previous attempt: " + clip(feedback.splitlines()[0], 200) + ")"
    return ConversionPlan(status=PlanStatus.OK, intent=intent, steps=b.steps, rationale=rationale)


def next_remedy(request: ConversionRequest, feedback: PlanFeedback) -> str | None:
    """The first remedy of REMEDIES not tried yet that can help with this feedback (pure)."""
    tried = set(feedback.remedies) | set(feedback.failed)
    precision = Precision.W8A16 if W8A16 in set(feedback.remedies) - set(feedback.failed) else request.precision
    qnn_quantizer = precision in QUANTIZED and (request.output in QNN_OUTPUTS or precision is Precision.W8A16)
    if feedback.kind in ("offload", "compile"):
        # placement and compile failures: a graph pass that rewrites the named op, never a precision
        # change (w8a16 keeps the same ops where they were)
        ops = feedback.offload.cpu_ops if feedback.kind == "offload" and feedback.offload else feedback.failing_ops
        return _fresh_passes(set(ops) - {"QuantizeLinear", "DequantizeLinear"}, {feedback.code} - {""}, tried)
    if precision not in QUANTIZED:
        # a float build below the gate: fp16 should match fp32 closely, so the cure is an exact
        # rewrite around a backend defect (on quantized builds they measured no better)
        return _fresh_passes(set(), {Err.ACCURACY_BELOW_THRESHOLD.value}, tried) if request.output in QNN_OUTPUTS else None
    for r in REMEDIES:
        if r in tried:
            continue
        if (r == W8A16 and precision in (Precision.INT8, Precision.W4A16) and request.precision_fallback
                and request.output in QNN_OUTPUTS | {OutputKind.ONNX_QDQ}):  # without consent the gate only proposes it
            return r
        if r == FLOAT_OUTPUTS and qnn_quantizer and failing_outputs(feedback):
            return r
        if r == MIXED and precision is Precision.INT8 and request.output in QNN_OUTPUTS:
            return r
        if r == MORE_CALIBRATION and not request.calibration:
            return r
    return None


def _fresh_passes(ops: set[str], codes: set[str], tried: set[str]) -> str | None:
    """The pass remedy of the registered passes that fix these ops or codes and were not tried yet."""
    done = set(remedy_passes(list(tried)))
    fresh = [p for p in passes_for(ops, codes) if p not in done]
    return PASS_PREFIX + "+".join(fresh) if fresh else None


def failing_outputs(feedback: PlanFeedback) -> list[str]:
    """Outputs below the threshold (or with NaN/Inf where the fp32 model has none), sorted."""
    ev = feedback.evaluation
    if ev is None:
        return []
    return sorted(o.name for o in ev.outputs if o.misses(feedback.min_cosine))


def plan_remedies(plan: ConversionPlan) -> tuple[list[str], list[str], list[str]]:
    """(remedies applied, float outputs, remedies that could not run) of a plan (its intent says so)."""
    def names(key: str) -> list[str]:
        raw = plan.intent.get(key)
        return [str(v) for v in raw] if isinstance(raw, list) else []

    return names("remedies"), names("float_outputs"), names("failed_remedies")


def plan_warnings(plan: ConversionPlan) -> list[str]:
    raw = plan.intent.get("warnings")
    return [str(w) for w in raw] if isinstance(raw, list) else []


def evaluation_pair(plan: ConversionPlan) -> tuple[str, str] | None:
    """(reference, candidate) to evaluate, or None when the output cannot be evaluated."""
    ref, cand = plan.intent.get("reference"), plan.intent.get("evaluate")
    return (ref, cand) if isinstance(ref, str) and isinstance(cand, str) else None


def _stem(filename: str) -> str:
    stem = PurePosixPath(filename).stem
    return re.sub(r"[^A-Za-z0-9_.-]", "_", stem) or "model"


def symbolic_inputs(model: ModelRef) -> dict[str, list[int | str]]:
    """An ONNX model's inputs that have a symbolic dim, with their shapes."""
    info = model.onnx
    if info is None:
        return {}
    return {t.name: list(t.shape) for t in info.inputs if any(not isinstance(d, int) or d <= 0 for d in t.shape)}


def _export_and_passes(b: "_Builder", request: ConversionRequest, model: ModelRef) -> str | None:
    """A PyTorch model's export step (the exported ONNX becomes the plan's reference and source; the
    torch file is returned: the evaluation compares with it), then the graph passes: fix_input_dims when
    an ONNX input has a symbolic dim or --input-shape names it, and the passes the remedies chose."""
    shapes = [spec.spec(name) for name, spec in sorted(request.input_shapes.items())]
    torch_source = None
    if model.format in TORCH_FORMATS:
        torch_source = b.source
        exported = f"converted/{b.stem}.onnx"
        optional: dict[str, JsonValue] = {"input_shapes": list(shapes)} if shapes else {}
        b.add("export", "torch.export_onnx", {"model": b.source, "output": exported}, optional)
        b.source = b.model = exported
    passes = remedy_passes(b.remedies)
    symbolic = symbolic_inputs(model) if model.format is ModelFormat.ONNX else {}
    if symbolic or (request.input_shapes and model.format is ModelFormat.ONNX):
        passes = ["fix_input_dims", *[p for p in passes if p != "fix_input_dims"]]
        for name, dims in sorted(symbolic.items()):
            if name not in request.input_shapes:
                b.warnings.append(f"input {name} has symbolic dims {dims}: fixed to 1 where symbolic (the HTP backend "
                                  f"compiles static shapes; give --input-shape {name}=... to choose)")
    if passes:
        out = f"converted/{b.stem}_passes.onnx"
        optional = {"input_shapes": list(shapes)} if shapes and "fix_input_dims" in passes else {}
        b.add("graph_passes", "onnx.graph_passes", {"model": b.model, "output": out, "passes": list(passes)}, optional)
        b.model = out
    return torch_source


class _Builder:
    def __init__(self, registry: ToolRegistry, source: str, stem: str, preset: str = "balanced",
                 remedies: list[str] | None = None, float_outputs: list[str] | None = None, min_cosine: float | None = None):
        self.registry = registry
        self.preset = preset
        self.source = source
        """The evaluation's reference (the model as given, or its export)."""
        self.model = source
        """What the next step reads (the source, or the graph passes' output)."""
        self.stem = stem
        self.steps: list[PlanStep] = []
        self.warnings: list[str] = []
        self.remedies = list(remedies or [])
        self.float_outputs = list(float_outputs or [])
        self.min_cosine = min_cosine
        """The gate's threshold the remedies aim at (the mixed-precision search)."""

    def precision(self, request: ConversionRequest) -> Precision:
        """What is built: the request's precision, raised to w8a16 by that remedy."""
        assert request.precision is not None
        raised = W8A16 in self.remedies and request.precision in (Precision.INT8, Precision.W4A16)
        return Precision.W8A16 if raised else request.precision

    def has_arg(self, tool: str, arg: str) -> bool:
        spec = self.registry.get(tool)
        return spec is not None and spec.arg(arg) is not None

    def samples(self, tool: str) -> int:
        """Synthetic calibration samples for `tool`: the preset's, times MORE_SAMPLES_FACTOR with that remedy."""
        base = int(preset_args(self.preset, tool).get("calibration_samples", SYNTHETIC_SAMPLES))  # type: ignore[arg-type]
        return min(MAX_SAMPLES, base * MORE_SAMPLES_FACTOR) if MORE_CALIBRATION in self.remedies else base

    def calibration(self, tool: str, request: ConversionRequest) -> dict[str, JsonValue]:
        if request.calibration and self.has_arg(tool, "calibration_data"):
            return {"calibration_data": request.calibration}
        samples = self.samples(tool)
        if request.calibration:
            self.warnings.append(f"{tool} takes no calibration data; ignored {request.calibration!r} and used "
                                 f"{samples} seeded synthetic samples (seed {SYNTHETIC_SEED})")
        else:
            self.warnings.append(f"no calibration data given: quantized with {samples} seeded synthetic "
                                 f"samples (seed {SYNTHETIC_SEED}); accuracy on real inputs may differ")
        return {"calibration_samples": SYNTHETIC_SAMPLES, "seed": SYNTHETIC_SEED}

    def add(self, step_id: str, tool: str, required: dict[str, JsonValue], optional: dict[str, JsonValue] | None = None,
            expected: list[str] | None = None) -> None:
        if self.registry.get(tool) is None:
            raise FleetforgeError(Err.TOOLCHAIN_UNAVAILABLE, f"tool {tool!r} is not in the registry")
        deps = [self.steps[-1].step_id] if self.steps else []
        preset = preset_args(self.preset, tool)
        if "calibration_data" in (optional or {}):
            preset.pop("calibration_samples", None)  # real data: every sample is used
        optional = (optional or {}) | preset
        if MORE_CALIBRATION in self.remedies and "calibration_samples" in optional:
            optional["calibration_samples"] = self.samples(tool)
            if self.has_arg(tool, "per_channel"):
                optional["per_channel"] = True
        self.steps.append(PlanStep(step_id=step_id, tool_name=tool, required_args=required, optional_args=optional,
                                   expected_outputs=expected or [str(required["output"])], depends_on=deps))


def _plan_qnn(b: _Builder, request: ConversionRequest) -> str:
    soc = lookup_soc(request.target_soc or "").name.lower()
    model = _precision_stage(b, request, request.output)
    ctx_precision = htp_precision(b.precision(request)).value
    out = f"converted/{b.stem}_{ctx_precision}_{soc}_ctx.onnx"
    optional: dict[str, JsonValue] = {"precision": ctx_precision}
    if request.output is OutputKind.DLC:
        optional |= {"dump_dlc": True, "dlc_dir": "converted/dlc"}
    b.add("context_binary", "ortqnn.context_binary", {"model": model, "soc": soc, "output": out}, optional)
    return out


def _plan_onnx_qdq(b: _Builder, request: ConversionRequest) -> str:
    return _precision_stage(b, request, OutputKind.ONNX_QDQ)


def _plan_ort(b: _Builder, request: ConversionRequest) -> str | None:
    assert request.precision is not None
    model = _precision_stage(b, request, OutputKind.ORT)
    b.add("to_ort", "onnx.to_ort", {"model": model, "output": f"converted/{b.stem}_{b.precision(request).value}.ort"})
    return model if model != b.source else None  # an .ort file itself is not evaluated


def htp_precision(precision: Precision) -> Precision:
    """What the HTP backend computes in: quantized stays quantized, float becomes fp16 (no fp32 math)."""
    return precision if precision in QUANTIZED else Precision.FP16


def _precision_stage(b: _Builder, request: ConversionRequest, output: OutputKind) -> str:
    """Add the steps that bring the source model to `request.precision` for `output` (none when the
    source already is what the next step takes); returns the model path the next step reads."""
    problems = request_problems(request)
    if problems:
        raise FleetforgeError(Err.BAD_INPUT, problems[0])
    precision = b.precision(request)
    if output in QNN_OUTPUTS:  # the HTP compiler takes fp32 (computed at fp16) or a QDQ model
        if precision in QUANTIZED:
            return _quantize(b, request, "ortqnn.quantize_qdq")
        if precision is Precision.FP32:
            b.warnings.append("the HTP backend has no fp32 math: compiled at fp16 precision")
        return b.model
    if output is OutputKind.ONNX_QDQ:
        if precision not in QUANTIZED:
            raise FleetforgeError(Err.BAD_INPUT, f"onnx_qdq output needs int8, w8a16 or w4a16 precision, not {precision.value}")
        return _quantize(b, request, "onnx.quantize_static" if precision is Precision.INT8 else "ortqnn.quantize_qdq")
    if precision in (Precision.W8A16, Precision.W4A16):
        raise FleetforgeError(Err.BAD_INPUT, f"ort output supports fp32, fp16 or int8, not {precision.value}")
    if precision is Precision.FP16:
        out = f"converted/{b.stem}_fp16.onnx"
        b.add("fp16", "onnx.fp16", {"model": b.model, "output": out})
        return out
    if precision is Precision.INT8:
        return _quantize(b, request, "onnx.quantize_static")
    return b.model


def _quantize(b: _Builder, request: ConversionRequest, tool: str) -> str:
    precision = b.precision(request)
    out = f"converted/{b.stem}_{precision.value}_qdq.onnx"
    required: dict[str, JsonValue] = {"model": b.model, "output": out}
    optional = b.calibration(tool, request)
    if tool == "ortqnn.quantize_qdq":
        required["precision"] = precision.value
        if b.float_outputs:
            optional["float_outputs"] = list(b.float_outputs)
        if MIXED in b.remedies and precision is Precision.INT8:
            optional["mixed_precision"] = True
            if b.min_cosine is not None:
                optional["min_cosine"] = b.min_cosine
    b.add("quantize", tool, required, optional)
    return out


def precision_stage(registry: ToolRegistry, request: ConversionRequest, source: str,
                    output: OutputKind) -> tuple[list[PlanStep], str, list[str]]:
    """The offline planner's precision steps for `source` (steps, the model they leave, warnings):
    what a rerun with a precision override puts in place of the earlier plan's."""
    b = _Builder(registry, source, _stem(source), request.preset)
    model = _precision_stage(b, request, output)
    return b.steps, model, b.warnings
