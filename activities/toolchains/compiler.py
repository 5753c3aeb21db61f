"""The plan compiler: a pure function from the planner's plan to executable steps.

`compile_plan` never raises for a bad plan: every rejection is a structured `Failure`
(code PLAN_INVALID / COMPILER_ERROR / PATH_ESCAPE, `where` = step id, or `step.arg`), so the
workflow can hand the list back to the planner. It reads the filesystem only to resolve
symlinks and to check that a step's inputs exist (or are produced by a step it depends on).
"""

from __future__ import annotations

import json
import re
from pathlib import Path, PurePosixPath
from typing import Any

from pydantic import ValidationError

from activities.sandbox import safe_join
from activities.toolchains._argv import build_argv
from activities.toolchains.registry import ToolRegistry
from contracts.common import Failure
from contracts.convert import PATH_TYPES, ArgSpec, CompiledStep, CompileResult, ConversionPlan, PlanStatus, PlanStep, ToolSpec
from contracts.errors import Err, FleetforgeError

STEP_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$")
READ_ONLY_DIRS = ("input",)
"""Workspace folders no step may write into (the model as the user gave it)."""
_STEM = re.compile(r"\{([A-Za-z0-9_]+)_stem\}")


class _Errors:
    def __init__(self) -> None:
        self.items: list[Failure] = []

    def add(self, code: Err, where: str, message: str) -> None:
        self.items.append(Failure(code=code.value, message=message, where=where))


def compile_plan(plan: ConversionPlan | dict | str | bytes, registry: ToolRegistry, workspace_root: Path) -> CompileResult:
    """Validate `plan` against the registry and the workspace; steps come back in dependency order."""
    try:
        return _compile(plan, registry, Path(workspace_root))
    except FleetforgeError as e:  # defensive: anything we raise ourselves stays structured
        return CompileResult(ok=False, errors=[Failure(code=e.code.value, message=e.message, where="plan")])
    except Exception as e:  # a compiler bug must still not crash the workflow's loop
        return CompileResult(ok=False, errors=[Failure(code=Err.INTERNAL.value, message=f"compiler bug: {type(e).__name__}: {e}", where="plan")])


def _parse(plan: ConversionPlan | dict | str | bytes, errors: _Errors) -> ConversionPlan | None:
    try:
        if isinstance(plan, ConversionPlan):
            return plan
        if isinstance(plan, (str, bytes)):
            return ConversionPlan.model_validate_json(plan)
        return ConversionPlan.model_validate(plan)
    except ValidationError as e:
        for err in e.errors(include_url=False)[:20]:
            loc = "plan" + "".join(f"[{p}]" if isinstance(p, int) else f".{p}" for p in err["loc"])
            errors.add(Err.PLAN_INVALID, loc, err["msg"])
        return None


def _compile(raw: ConversionPlan | dict | str | bytes, registry: ToolRegistry, root: Path) -> CompileResult:
    errors = _Errors()
    plan = _parse(raw, errors)
    if plan is None:
        return CompileResult(ok=False, errors=errors.items)
    if plan.status is PlanStatus.NEEDS_INPUT:
        errors.add(Err.PLAN_INVALID, "plan", "the plan needs input (status NEEDS_INPUT); nothing to compile")
        return CompileResult(ok=False, errors=errors.items)
    if not plan.steps:
        errors.add(Err.PLAN_INVALID, "plan", "status OK but the plan has no steps")
        return CompileResult(ok=False, errors=errors.items)

    order = _graph(plan.steps, errors)
    root = root.resolve()
    by_id = {s.step_id: s for s in plan.steps}
    ancestors = _ancestors(plan.steps) if order is not None else None
    compiled: dict[str, CompiledStep] = {}
    writers: dict[str, str] = {}
    for step in (by_id[i] for i in order) if order is not None else plan.steps:
        spec = registry.get(step.tool_name)
        if spec is None:
            known = ", ".join(t.name for t in registry.list_tools())
            errors.add(Err.COMPILER_ERROR, step.step_id, f"unknown tool {step.tool_name!r}; known tools: {known}")
            continue
        c = _compile_step(step, spec, root, errors)
        if c is None:
            continue
        for out in c.outputs:
            if out in writers:
                errors.add(Err.COMPILER_ERROR, step.step_id, f"output {out!r} is also written by step {writers[out]!r}")
            writers.setdefault(out, step.step_id)
        compiled[step.step_id] = c

    if ancestors is not None:  # every input exists already or is produced by a step this one waits for
        for sid, c in compiled.items():
            for rel in c.inputs:
                producer = writers.get(rel)
                if producer is not None and producer != sid:
                    if producer not in ancestors[sid]:
                        errors.add(Err.COMPILER_ERROR, sid, f"input {rel!r} is produced by step {producer!r}; add it to depends_on")
                elif producer == sid:
                    errors.add(Err.COMPILER_ERROR, sid, f"step reads its own output {rel!r}")
                elif not (root / rel).is_file():
                    errors.add(Err.COMPILER_ERROR, sid, f"input {rel!r} does not exist in the workspace and no step produces it")

    if errors.items:
        return CompileResult(ok=False, errors=errors.items)
    return CompileResult(ok=True, steps=[compiled[i] for i in order or []])


def _graph(steps: list[PlanStep], errors: _Errors) -> list[str] | None:
    """Topological order (plan order among ready steps), or None with errors."""
    ok = True
    ids: list[str] = []
    for s in steps:
        if not STEP_ID.match(s.step_id):
            errors.add(Err.PLAN_INVALID, s.step_id, "step_id must match [A-Za-z0-9][A-Za-z0-9_.-]{0,63}")
            ok = False
        if s.step_id in ids:
            errors.add(Err.PLAN_INVALID, s.step_id, "duplicate step_id")
            ok = False
        ids.append(s.step_id)
    known = set(ids)
    for s in steps:
        for d in s.depends_on:
            if d == s.step_id:
                errors.add(Err.PLAN_INVALID, s.step_id, "step depends on itself")
                ok = False
            elif d not in known:
                errors.add(Err.PLAN_INVALID, s.step_id, f"depends_on names unknown step {d!r}")
                ok = False
    if not ok:
        return None
    deps = {s.step_id: set(s.depends_on) for s in steps}
    order: list[str] = []
    done: set[str] = set()
    while len(order) < len(ids):
        ready = [i for i in ids if i not in done and deps[i] <= done]
        if not ready:
            stuck = [i for i in ids if i not in done]
            errors.add(Err.PLAN_INVALID, stuck[0], f"depends_on has a cycle among steps {stuck}")
            return None
        order.append(ready[0])
        done.add(ready[0])
    return order


def _ancestors(steps: list[PlanStep]) -> dict[str, set[str]]:
    deps = {s.step_id: list(s.depends_on) for s in steps}
    out: dict[str, set[str]] = {}
    for sid in deps:
        seen: set[str] = set()
        todo = list(deps[sid])
        while todo:
            d = todo.pop()
            if d not in seen:
                seen.add(d)
                todo += deps.get(d, [])
        out[sid] = seen
    return out


def _check_value(arg: ArgSpec, value: Any) -> tuple[Any, str | None]:
    """(normalised value, None) or (None, why not)."""
    t = arg.type
    if t == "bool":
        return (value, None) if isinstance(value, bool) else (None, f"expected a boolean, got {_show(value)}")
    if t == "int":
        ok = isinstance(value, int) and not isinstance(value, bool)
        return (value, None) if ok else (None, f"expected an integer, got {_show(value)}")
    if t == "float":
        ok = isinstance(value, (int, float)) and not isinstance(value, bool) and value == value and abs(value) != float("inf")
        return (float(value), None) if ok else (None, f"expected a finite number, got {_show(value)}")
    if t == "list":
        ok = (isinstance(value, list) and len(value) <= 64
              and all(isinstance(v, str) and 0 < len(v) <= 256 and "\x00" not in v for v in value))
        return (list(value), None) if ok else (None, f"expected a list of at most 64 names, got {_show(value)}")
    if not isinstance(value, str):
        return None, f"expected a string, got {_show(value)}"
    if t in PATH_TYPES:
        return value, None  # safe_join decides (PATH_ESCAPE)
    if "\x00" in value or len(value) > 4096:
        return None, "string contains a NUL byte or is too long"
    if t == "enum":
        for allowed in arg.enum_values:
            if value.strip().lower() == allowed.lower():
                return allowed, None
        return None, f"{value!r} is not one of {arg.enum_values}"
    return value, None


def _show(value: Any) -> str:
    text = json.dumps(value, default=str)
    return text if len(text) <= 60 else text[:57] + "..."


def _condition_holds(arg: ArgSpec, effective: dict[str, Any]) -> bool:
    return all(effective.get(k) == v for k, v in arg.requires.items())


def _compile_step(step: PlanStep, spec: ToolSpec, root: Path, errors: _Errors) -> CompiledStep | None:
    sid = step.step_id
    n_errors = len(errors.items)
    given: dict[str, Any] = {}
    for source in (step.required_args, step.optional_args):
        for name, value in source.items():
            if name in given:
                errors.add(Err.PLAN_INVALID, f"{sid}.{name}", "argument given in both required_args and optional_args")
                continue
            given[name] = value

    params: dict[str, Any] = {}
    for name, value in given.items():
        arg = spec.arg(name)
        if arg is None:
            errors.add(Err.COMPILER_ERROR, f"{sid}.{name}",
                       f"tool {spec.name} does not support argument {name!r}; supported: {[a.name for a in spec.args]}")
            continue
        norm, why = _check_value(arg, value)
        if why is not None:
            errors.add(Err.COMPILER_ERROR, f"{sid}.{name}", why)
            continue
        if spec.program and any(isinstance(v, str) and v.startswith("-") for v in (norm if isinstance(norm, list) else [norm])):
            errors.add(Err.COMPILER_ERROR, f"{sid}.{name}", "values may not start with '-' (they would read as flags)")
            continue
        params[name] = norm

    # effective values (given or default) decide conditional requirements
    effective = {a.name: a.default for a in spec.args if a.default is not None} | params
    for arg in spec.args:
        applies = _condition_holds(arg, effective)
        if arg.name in given and not applies:
            errors.add(Err.COMPILER_ERROR, f"{sid}.{arg.name}", f"argument {arg.name!r} is only allowed when {arg.requires}")
        elif arg.required and applies and arg.name not in given:
            cond = f" (when {arg.requires})" if arg.requires else ""
            errors.add(Err.COMPILER_ERROR, f"{sid}.{arg.name}", f"missing required argument {arg.name!r} of tool {spec.name}{cond}")
        elif arg.name not in params and arg.default is not None and applies:
            params[arg.name] = arg.default

    groups: dict[str, list[str]] = {}
    for arg in spec.args:
        if arg.exclusive_group and arg.name in given:
            groups.setdefault(arg.exclusive_group, []).append(arg.name)
    for group, names in groups.items():
        if len(names) > 1:
            errors.add(Err.COMPILER_ERROR, sid, f"arguments {names} are mutually exclusive (group {group!r}); give one")

    inputs: list[str] = []
    outputs: list[str] = []
    out_dirs: list[str] = []
    for arg in spec.args:
        if arg.type not in PATH_TYPES or arg.name not in params or arg.name not in given:
            continue
        rel = _rel(root, params[arg.name], f"{sid}.{arg.name}", errors)
        if rel is None:
            continue
        if arg.type == "path_out" and PurePosixPath(rel).parts[0] in READ_ONLY_DIRS:
            errors.add(Err.COMPILER_ERROR, f"{sid}.{arg.name}", f"{rel!r} is under a read-only folder {READ_ONLY_DIRS}")
            continue
        params[arg.name] = rel
        if arg.type == "path_in":
            inputs.append(rel)
        elif arg.name in spec.outputs:
            outputs.append(rel)
        else:
            out_dirs.append(rel)
    if len(errors.items) > n_errors:
        return None

    for template in spec.derived_outputs:
        derived = _STEM.sub(lambda m: str(PurePosixPath(params[m.group(1)]).with_suffix("")), template)
        rel = _rel(root, derived, f"{sid}.derived", errors)
        if rel is not None:
            outputs.append(rel)
    for exp in step.expected_outputs:
        rel = _rel(root, exp, f"{sid}.expected_outputs", errors)
        if rel is not None and rel not in outputs and not any(PurePosixPath(rel).is_relative_to(d) for d in out_dirs):
            errors.add(Err.COMPILER_ERROR, f"{sid}.expected_outputs", f"{rel!r} is not written by tool {spec.name} (it writes {outputs + out_dirs})")
    if len(errors.items) > n_errors:
        return None
    return CompiledStep(
        step_id=sid, tool_name=spec.name, tool_version=spec.version,
        argv=build_argv(spec, params) if spec.program else None, params=params,
        inputs=inputs, outputs=outputs + out_dirs, depends_on=list(step.depends_on),
    )


def _rel(root: Path, value: str, where: str, errors: _Errors) -> str | None:
    """Normalised workspace-relative POSIX path, or None with a PATH_ESCAPE error."""
    try:
        resolved = safe_join(root, value)
    except FleetforgeError as e:
        errors.add(Err.PATH_ESCAPE, where, e.message)
        return None
    if resolved == root:
        errors.add(Err.PATH_ESCAPE, where, f"path {value!r} names the workspace root, not a file in it")
        return None
    return resolved.relative_to(root).as_posix()
