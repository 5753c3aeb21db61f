"""Rerun with modifications: an earlier run's plan with step arguments overridden. Pure.

A precision override changes which steps the plan has (int8 quantizes before compiling, fp16 does
not), so it is a plan transform, not an argument edit: the earlier plan's precision steps are
replaced by the ones the offline planner builds for the new precision, and the steps that read
their result are rewired. Every other override sets the step arguments of that name."""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from pathlib import PurePosixPath
from typing import TYPE_CHECKING

from pydantic import JsonValue

from activities.toolchains.offline_planner import htp_precision, precision_stage
from activities.toolchains.registry import ToolRegistry
from contracts.convert import ConversionPlan, OutputKind, PlanStep, Precision, ToolSpec
from contracts.convert_job import ConversionRequest
from contracts.errors import Err, FleetforgeError

if TYPE_CHECKING:
    from activities.storage import ArtifactStore

PRECISION_TOOLS = frozenset({"ortqnn.quantize_qdq", "onnx.quantize_static", "onnx.quantize_dynamic", "onnx.fp16"})
"""Tools whose only job is to change the model's numeric precision."""
CONSUMERS = {"ortqnn.context_binary": OutputKind.QNN_CONTEXT_BINARY, "onnx.to_ort": OutputKind.ORT}
"""Tools that read the precision steps' model, and the output kind whose precision steps they take."""


def earlier_plan(store: "ArtifactStore", run_id: str) -> ConversionPlan:
    """The plan an earlier conversion ran: `plan.json` at its workspace root (`logs/plan.json` for runs
    recorded before it moved there), read from the store alone (nothing else is downloaded)."""
    from activities.experiments import RunStore
    from contracts.runs import WorkspaceFiles

    record = RunStore(store).get(run_id)
    raw = store.get_doc(f"runs/{run_id}/workspace.json")
    files = WorkspaceFiles.model_validate_json(raw).files if raw is not None else {}
    ref = files.get("plan.json") or files.get("logs/plan.json")
    if ref is None:
        state = record.status.value.lower()
        raise FleetforgeError(Err.BAD_INPUT, f"run {run_id} ({state}) has no plan.json (it ended before planning); "
                                             "start a new conversion instead of a rerun")
    doc = json.loads(store.get_bytes(ref))
    doc.pop("attempt", None)
    return ConversionPlan.model_validate(doc)


def _coerce(key: str, old: JsonValue, new: str) -> JsonValue:
    """The override in the type of the value it replaces ("true" → True for a bool arg, ...)."""
    if isinstance(old, bool):
        if new.lower() not in {"true", "false", "1", "0", "yes", "no"}:
            raise FleetforgeError(Err.BAD_INPUT, f"override {key}={new!r} must be true or false")
        return new.lower() in {"true", "1", "yes"}
    if isinstance(old, int):
        try:
            return int(new)
        except ValueError:
            raise FleetforgeError(Err.BAD_INPUT, f"override {key}={new!r} must be an integer") from None
    if isinstance(old, float):
        try:
            return float(new)
        except ValueError:
            raise FleetforgeError(Err.BAD_INPUT, f"override {key}={new!r} must be a number") from None
    return new


def apply_overrides(plan: ConversionPlan, overrides: dict[str, str], registry: ToolRegistry) -> ConversionPlan:
    """`precision` first (a plan transform), then every step arg named in the other overrides gets
    the new value (intent too); a name that no step has is an error that lists the args there are.
    The compiler validates the result as usual."""
    rest = dict(overrides)
    if "precision" in rest:
        plan = change_precision(plan, rest.pop("precision"), registry)
    used: set[str] = set()
    renamed: dict[str, str] = {}
    steps: list[PlanStep] = []
    for step in plan.steps:
        spec = registry.get(step.tool_name)
        req, opt = dict(step.required_args), dict(step.optional_args)
        for key, value in rest.items():
            for args in (req, opt):
                if key in args:
                    old, args[key] = args[key], _coerce(key, args[key], _enum_value(spec, key, value))
                    used.add(key)
                    if isinstance(old, str) and old != args[key]:
                        renamed |= _relabel_outputs(spec, (req, opt), old, str(args[key]))
        steps.append(step.model_copy(update={"required_args": req, "optional_args": opt}))
    unknown = sorted(set(rest) - used)
    if unknown:
        known = sorted({k for s in plan.steps for k in (*s.required_args, *s.optional_args)} | {"precision"})
        raise FleetforgeError(Err.BAD_INPUT, f"no step of the earlier plan has the arg(s) {', '.join(unknown)}; "
                                             f"args you can --set: {', '.join(known)}")
    steps = [_renamed(s, renamed) for s in steps]
    intent = dict(plan.intent) | {k: v for k, v in rest.items() if k in plan.intent}
    intent = {k: renamed.get(v, v) if isinstance(v, str) else v for k, v in intent.items()}
    return plan.model_copy(update={"steps": steps, "intent": intent,
                                   "rationale": f"rerun with {overrides}: {plan.rationale}"[:2000]})


def _enum_value(spec: "ToolSpec | None", key: str, value: str) -> str:
    """An enum override as the tool spells it ("SM8650" → "sm8650"), so file names use one spelling;
    a value the tool does not take is bad input."""
    arg = spec.arg(key) if spec is not None else None
    if arg is not None and arg.type == "enum":
        found = next((v for v in arg.enum_values if v.lower() == value.strip().lower()), None)
        if found is None:
            raise FleetforgeError(Err.BAD_INPUT, f"--set {key}={value}: not one of {', '.join(arg.enum_values)}")
        return found
    return value


def _relabel_outputs(spec: "ToolSpec | None", arg_maps: tuple[dict[str, JsonValue], ...], before: str,
                     after: str) -> dict[str, str]:
    """Rename the step's output files that carry the overridden value as a `_`-separated label
    (`tiny_fp16_sm8550_ctx.onnx` with soc sm8550 → sm8650), so every output says what it is."""
    renamed: dict[str, str] = {}
    if spec is None:
        return renamed
    for args in arg_maps:
        for name, value in args.items():
            arg = spec.arg(name)
            if arg is not None and arg.type == "path_out" and isinstance(value, str):
                new = _relabel(value, before, after)
                if new != value:
                    renamed[value] = args[name] = new
    for template in spec.derived_outputs:  # e.g. "{output_stem}_qnn.bin" follows its output
        m = re.fullmatch(r"\{([A-Za-z0-9_]+)_stem\}(.*)", template)
        if m:
            for old, new in list(renamed.items()):
                if any(a.get(m.group(1)) == new for a in arg_maps):
                    renamed[_stem(old) + m.group(2)] = _stem(new) + m.group(2)
    return renamed


def _stem(path: str) -> str:
    return str(PurePosixPath(path).with_suffix(""))


def _renamed(step: PlanStep, renamed: dict[str, str]) -> PlanStep:
    """The step reading and expecting the renamed files."""
    if not renamed:
        return step
    req = {k: renamed.get(v, v) if isinstance(v, str) else v for k, v in step.required_args.items()}
    opt = {k: renamed.get(v, v) if isinstance(v, str) else v for k, v in step.optional_args.items()}
    expected = [renamed.get(p, p) for p in step.expected_outputs]
    return step.model_copy(update={"required_args": req, "optional_args": opt, "expected_outputs": expected})


def change_precision(plan: ConversionPlan, value: str, registry: ToolRegistry) -> ConversionPlan:
    """The plan at precision `value`: its precision steps replaced by the offline planner's for that
    precision (seeded synthetic calibration when it quantizes), the steps that read them rewired,
    their precision arg and the precision in their output names updated. For a plan the offline
    planner made, the result has exactly the steps it would plan for `value`."""
    def bad(why: str) -> FleetforgeError:
        return FleetforgeError(Err.BAD_INPUT, f"--set precision={value}: {why}")

    try:
        new = Precision(value.strip().lower())
    except ValueError:
        raise bad(f"unknown precision; valid: {', '.join(p.value for p in Precision)}") from None
    if plan.intent.get("precision") == new.value:
        return plan
    try:
        old = Precision(str(plan.intent.get("precision")))
    except ValueError:
        raise bad("the earlier plan does not record its precision (intent.precision); "
                  "start a new conversion with --precision instead") from None
    others = sorted({s.tool_name for s in plan.steps} - PRECISION_TOOLS - set(CONSUMERS))
    if others:
        raise bad(f"the earlier plan uses {', '.join(others)}, which a precision override cannot rewrite; "
                  f"start a new conversion with --precision {new.value} instead")
    stage = [s for s in plan.steps if s.tool_name in PRECISION_TOOLS]
    consumers = [s for s in plan.steps if s.tool_name in CONSUMERS]
    source, model = _stage_ends(stage, consumers, plan.intent.get("reference"), bad)
    kinds = {CONSUMERS[s.tool_name] for s in consumers} or {OutputKind.ONNX_QDQ}
    if len(kinds) > 1:
        raise bad("the earlier plan builds both an ORT file and a context binary; start a new conversion instead")
    request = ConversionRequest(model=source, precision=new, preset=str(plan.intent.get("preset") or "balanced"))
    try:
        new_stage, new_model, warnings = precision_stage(registry, request, source, kinds.pop())
    except FleetforgeError as e:
        raise bad(e.message) from None

    renamed = {model: new_model}
    rewired = []
    for step in consumers:
        step, names = _rewire(step, old, new, registry)
        renamed |= names
        rewired.append(step)
    gone, last = {s.step_id for s in stage}, [s.step_id for s in new_stage[-1:]]
    steps = new_stage + [_follow(s, renamed, model, gone, last) for s in rewired]
    intent = dict(plan.intent) | {"precision": new.value, "warnings": list(warnings)}
    if "evaluate" in intent:  # None: the precision steps left the input itself (an .ort of an fp32 model)
        evaluate = intent["evaluate"]
        evaluate = new_model if evaluate is None and model == source else renamed.get(str(evaluate), evaluate)
        intent["evaluate"] = None if evaluate == source else evaluate
    return plan.model_copy(update={"steps": steps, "intent": intent})


def _stage_ends(stage: list[PlanStep], consumers: list[PlanStep], reference: object,
                bad: Callable[[str], FleetforgeError]) -> tuple[str, str]:
    """(source, model): the model the precision steps read and the one they leave. They must be one
    chain from the input model (the plan's reference), and every consumer that reads a model must
    read that chain's end."""
    produced = {str(s.required_args.get("output")) for s in stage + consumers}
    firsts = stage[:1] or consumers[:1]
    source = str(firsts[0].required_args.get("model", "")) if firsts else ""
    if not source or source in produced or (isinstance(reference, str) and source != reference):
        raise bad("the earlier plan's precision steps do not start from the input model; start a new conversion instead")
    model = source
    for step in stage:
        if step.required_args.get("model") != model:
            raise bad(f"step {step.step_id} does not read {model}: the precision steps are not one chain")
        model = str(step.required_args.get("output"))
    readers = [s for s in consumers if s.required_args.get("model") not in produced - {model}]
    if any(s.required_args.get("model") != model for s in readers):
        raise bad("a step reads the model from the middle of the precision steps; start a new conversion instead")
    return source, model


def _rewire(step: PlanStep, old: Precision, new: Precision, registry: ToolRegistry) -> tuple[PlanStep, dict[str, str]]:
    """The consumer at the new precision: its precision arg (if its tool has one) and the precision
    label in the names of the files it writes; returns the renamed paths too."""
    spec = registry.get(step.tool_name)
    assert spec is not None  # CONSUMERS are registry tools
    req, opt = dict(step.required_args), dict(step.optional_args)
    before, after = old.value, new.value
    if spec.arg("precision") is not None:
        before, after = htp_precision(old).value, htp_precision(new).value
        (req if "precision" in req else opt)["precision"] = after
    renamed: dict[str, str] = {}
    for args in (req, opt):
        for name, value in args.items():
            arg = spec.arg(name)
            if arg is not None and arg.type == "path_out" and isinstance(value, str):
                renamed[value] = args[name] = _relabel(value, before, after)
    expected = [renamed.get(p, p) for p in step.expected_outputs]
    return step.model_copy(update={"required_args": req, "optional_args": opt, "expected_outputs": expected}), renamed


def _relabel(path: str, before: str, after: str) -> str:
    """`converted/tiny_int8_sm8550_ctx.onnx` → `converted/tiny_fp16_sm8550_ctx.onnx` (file name only)."""
    p = PurePosixPath(path)
    return str(p.with_name(re.sub(rf"(?<=_){re.escape(before)}(?=[_.])", after, p.name, count=1)))


def _follow(step: PlanStep, renamed: dict[str, str], model: str, gone: set[str], last: list[str]) -> PlanStep:
    """A consumer reading the renamed files; one that read the old precision steps' `model` now
    depends on the new steps' last one instead."""
    req = {k: renamed.get(v, v) if isinstance(v, str) else v for k, v in step.required_args.items()}
    opt = {k: renamed.get(v, v) if isinstance(v, str) else v for k, v in step.optional_args.items()}
    deps = [d for d in step.depends_on if d not in gone]
    if step.required_args.get("model") == model:
        deps = last + [d for d in deps if d not in last]
    return step.model_copy(update={"required_args": req, "optional_args": opt, "depends_on": deps})
