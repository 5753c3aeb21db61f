"""The LLM conversion planner's pure parts: prompts (jinja2 templates read at import time, so a
replay renders the same text), the planner-only tool definitions and their allowlist, and the
planner tools themselves (run by the `planner_tool` activity).

The allowlist is enforced in code twice: the workflow refuses any other tool name without
running anything, and `run_planner_tool` refuses it again.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import jinja2

from activities.toolchains.compiler import compile_plan
from activities.toolchains.registry import ToolRegistry
from contracts.convert_job import ConversionRequest, PlanFeedback
from contracts.messages import ToolDefinition
from contracts.models import ModelRef

PROMPTS_DIR = Path(__file__).resolve().parent / "prompts"
_TEMPLATES = {p.name: p.read_text() for p in sorted(PROMPTS_DIR.glob("*.j2"))}
_ENV = jinja2.Environment(loader=jinja2.DictLoader(_TEMPLATES), undefined=jinja2.StrictUndefined,
                          keep_trailing_newline=True, autoescape=False)
_COMPILED = {name: _ENV.get_template(name) for name in _TEMPLATES}
"""Compiled at import time: the workflow sandbox forbids the loader's locks, and replays see the same text."""

AGENT = "converter-planner"
LIST_TOOLS, GET_TOOL_SPEC, DRY_RUN = "list_tools", "get_tool_spec", "dry_run"
PLANNER_TOOLS = (LIST_TOOLS, GET_TOOL_SPEC, DRY_RUN)
"""The only tools the planner may call. None of them converts anything."""

TOOL_DEFINITIONS = [
    ToolDefinition(name=LIST_TOOLS, description="List the conversion tools (name, toolchain, version, description).",
                   parameters={"type": "object", "properties": {}}),
    ToolDefinition(name=GET_TOOL_SPEC, description="One conversion tool's spec: arguments, types, enums, outputs.",
                   parameters={"type": "object", "properties": {"name": {"type": "string"}}, "required": ["name"]}),
    ToolDefinition(name=DRY_RUN, description="Compile a plan without running it; returns the compiler's verdict.",
                   parameters={"type": "object", "properties": {"plan": {"type": "object"}}, "required": ["plan"]}),
]


def render(template: str, **context: Any) -> str:
    return _COMPILED[template].render(**context)


def source_path(model: ModelRef) -> str:
    return f"input/{model.filename}"


def system_prompt(model: ModelRef) -> str:
    return render("planner_system.j2", tools=list(PLANNER_TOOLS), source=source_path(model))


def request_prompt(request: ConversionRequest, model: ModelRef) -> str:
    return render("planner_request.j2", model_name=model.name, model_format=model.format.value,
                  source=source_path(model), soc=request.target_soc, output=request.output.value,
                  precision=request.precision.value if request.precision else None,
                  toolchain=request.toolchain.value, preset=request.preset, calibration=request.calibration)


def feedback_prompt(feedback: str) -> str:
    return render("planner_feedback.j2", feedback=feedback)


def gate_feedback(remedy: PlanFeedback, feedback: str, *, allow_wider: bool = True) -> str:
    """The accuracy gate's figures and the remedies the LLM may apply (a wider precision only when
    the user allowed a fallback)."""
    outputs = sorted(remedy.evaluation.outputs, key=lambda o: o.cosine)[:8] if remedy.evaluation else []
    return render("planner_gate.j2", feedback=feedback, evaluation=remedy.evaluation, outputs=outputs,
                  offload=remedy.offload, min_cosine=remedy.min_cosine, remedies=remedy.remedies, allow_wider=allow_wider)


def repair_prompt(reason: str) -> str:
    return render("planner_repair.j2", reason=reason)


def refusal(name: str) -> str:
    """The error tool result for a call outside the allowlist (nothing was run)."""
    return (f"refused: {name!r} is not a planner tool and was not run. The planner may only call "
            f"{', '.join(PLANNER_TOOLS)}; put conversion tools into plan steps instead.")


def run_planner_tool(name: str, arguments: str, registry: ToolRegistry, workspace_root: Path) -> tuple[str, bool]:
    """(content, is_error) of one planner tool call. Never runs a conversion tool."""
    if name not in PLANNER_TOOLS:
        return refusal(name), True
    try:
        args = json.loads(arguments) if arguments.strip() else {}
    except json.JSONDecodeError as e:
        return f"the arguments are not valid JSON ({e}); send a JSON object", True
    if not isinstance(args, dict):
        return "the arguments must be a JSON object", True
    if name == LIST_TOOLS:
        tools = [{"name": s.name, "toolchain": s.toolchain.value, "version": s.version, "description": s.description}
                 for s in registry.list_tools(planner_only=True)]
        return json.dumps(tools, sort_keys=True), False
    if name == GET_TOOL_SPEC:
        tool = args.get("name")
        spec = registry.get(tool) if isinstance(tool, str) else None
        if spec is None or not spec.planner_visible:
            known = ", ".join(s.name for s in registry.list_tools(planner_only=True))
            return f"unknown tool {tool!r}; known tools: {known}", True
        return spec.model_dump_json(exclude_none=True), False
    plan = args.get("plan")
    if not isinstance(plan, dict):
        return 'dry_run needs {"plan": {...}} with the plan JSON object', True
    result = compile_plan(plan, registry, workspace_root)
    if result.ok:
        return json.dumps({"ok": True, "steps": [s.step_id for s in result.steps]}), False
    return json.dumps({"ok": False, "errors": result.feedback()}), True
