"""Rerun with modifications: an earlier run's plan with step arguments overridden. Pure."""

from __future__ import annotations

from pydantic import JsonValue

from contracts.convert import ConversionPlan, PlanStep
from contracts.errors import Err, FleetforgeError


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


def apply_overrides(plan: ConversionPlan, overrides: dict[str, str]) -> ConversionPlan:
    """Every step arg named in `overrides` gets the new value (intent too); a name that no step
    has is an error that lists the args there are. The compiler validates the result as usual."""
    used: set[str] = set()
    steps: list[PlanStep] = []
    for step in plan.steps:
        req, opt = dict(step.required_args), dict(step.optional_args)
        for key, value in overrides.items():
            for args in (req, opt):
                if key in args:
                    args[key] = _coerce(key, args[key], value)
                    used.add(key)
        steps.append(step.model_copy(update={"required_args": req, "optional_args": opt}))
    unknown = sorted(set(overrides) - used)
    if unknown:
        known = sorted({k for s in plan.steps for k in (*s.required_args, *s.optional_args)})
        raise FleetforgeError(Err.BAD_INPUT, f"no step of the earlier plan has the arg(s) {', '.join(unknown)}; "
                                             f"args you can --set: {', '.join(known)}")
    intent = dict(plan.intent) | {k: v for k, v in overrides.items() if k in plan.intent}
    return plan.model_copy(update={"steps": steps, "intent": intent,
                                   "rationale": f"rerun with {overrides}: {plan.rationale}"[:2000]})
