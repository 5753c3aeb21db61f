"""The kernel agents' pure parts: one jinja2 template per agent (activities/kernels/prompts/*.j2)
rendered from the typed request the workflow sent, and the answer → product step after the
registered parser (parsers.py) read the answer's fields.

A refusal is a value (`Rejected`), never an exception: the agent ladder (workflows/agent_ladder.py)
repairs with it or falls back to the offline agent.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import jinja2
from pydantic import ValidationError

from activities.kernels import parsers
from activities.kernels.gpus import roofline_spec
from activities.llm.structured import Rejected
from contracts.kernel import LLMDecision, OutputFormat
from contracts.kernel_job import AnalyzeRequest, CodeRequest, DesignRequest, KernelDesign

PROMPTS_DIR = Path(__file__).resolve().parent / "prompts"
_ENV = jinja2.Environment(loader=jinja2.FileSystemLoader(PROMPTS_DIR), undefined=jinja2.StrictUndefined,
                          keep_trailing_newline=True, autoescape=False)

TEMPLATES = {"designer": "designer.j2", "coder": "coder.j2", "optimizer": "optimizer.j2", "conductor": "analyze.j2"}
_DESIGN_KEYS = ("family", "block_sizes", "grid", "tiling", "notes")


def _fields(fmt: OutputFormat) -> list[dict[str, Any]]:
    return [{"name": name, "type": f.field_type, "mandatory": f.mandatory, "description": f.field_description}
            for name, f in fmt.output_fields.items()]


def design_prompt(req: DesignRequest) -> str:
    fmt = parsers.output_format("designer", req.output)
    return _ENV.get_template(TEMPLATES["designer"]).render(
        task=req.task, suggestion=req.suggestion, fields=_fields(fmt), parser=fmt.parser_name, repair=req.repair)


def code_prompt(req: CodeRequest, sources: list[str], speed: list[str] | None = None) -> str:
    """`sources` are the texts of `req.attempts`' candidates, in the same order; `speed` the optimizer's feedback
    lines on the best candidate (cost_model.feedback: modeled figures per launch)."""
    attempts = [{"step": a.step, "verdict": a.verdict, "source": s} for a, s in zip(req.attempts, sources, strict=True)]
    fmt = parsers.output_format(req.role, req.output)
    template = TEMPLATES["optimizer"] if req.role == "optimizer" else TEMPLATES["coder"]
    return _ENV.get_template(template).render(
        task=req.task, on_cpu=req.task.on_cpu, gpu=roofline_spec(req.task.arch, req.task.roofline_gpu),
        design=req.design, attempts=attempts, feedback=req.feedback,
        log=req.log, input_family=req.input_family, mismatches=req.mismatches, suggestion=req.suggestion,
        repair=req.repair, fields=_fields(fmt), parser=fmt.parser_name, code_field=parsers.code_field(fmt),
        speed=speed or [])


def analyze_prompt(req: AnalyzeRequest, candidate_source: str) -> str:
    return _ENV.get_template(TEMPLATES["conductor"]).render(
        task=req.task, agent=req.agent, step=req.step, options=req.options, last_result=req.last_result,
        recent=req.recent, candidate=candidate_source, report=req.report, repair=req.repair)


def source_from(text: str, fmt: OutputFormat) -> str | Rejected:
    """The candidate source from a coder's or optimizer's answer."""
    fields = parsers.parse(text, fmt)
    if isinstance(fields, Rejected):
        return fields
    source = fields.get(parsers.code_field(fmt))
    if not isinstance(source, str) or not source.strip():
        return Rejected(f"the answer's {parsers.code_field(fmt)!r} field holds no source")
    return source if source.endswith("\n") else source + "\n"


def design_from(text: str, fmt: OutputFormat) -> KernelDesign | Rejected:
    """A designer's answer as a KernelDesign: the known keys structured, a `code`/`sketch` field as the
    free-form sketch (AKG's designer answers pseudocode there), other fields kept as answered."""
    fields = parsers.parse(text, fmt)
    if isinstance(fields, Rejected):
        return fields
    blocks = fields.get("block_sizes") or {}
    if not isinstance(blocks, dict) or not all(isinstance(v, int) and not isinstance(v, bool) for v in blocks.values()):
        return Rejected("field 'block_sizes' must map names to integers")
    sketch = next((fields[k] for k in ("sketch", "code", "design") if isinstance(fields.get(k), str)), "")
    known = {k: fields[k] for k in _DESIGN_KEYS if k in fields and k != "block_sizes"}
    if any(not isinstance(v, str) for v in known.values()):
        return Rejected("fields family, grid, tiling and notes must be strings")
    extra = {k: v for k, v in fields.items() if k not in (*_DESIGN_KEYS, "sketch", "code", "design")}
    return KernelDesign(family=str(known.pop("family", "") or "unspecified"), block_sizes=blocks, sketch=sketch,
                        fields=extra, **known)


def parse_code(text: str) -> str | Rejected:
    """The default coder format (one fenced python block)."""
    return source_from(text, parsers.DEFAULT_FORMATS["coder"])


def parse_decision(answer: str | dict | LLMDecision | None) -> LLMDecision | Rejected:
    """The routing answer as an LLMDecision: a bare agent name, or a JSON object (bare, fenced, or inside
    prose); any case."""
    from activities.llm.structured import extract_json
    from contracts.errors import FleetforgeError

    if isinstance(answer, LLMDecision):
        return answer
    if isinstance(answer, dict):
        try:
            return LLMDecision.model_validate(answer)
        except ValidationError:
            return Rejected('the answer lacks "decision" (one of the options)')
    if not isinstance(answer, str) or not answer.strip():
        return Rejected("empty answer")
    text = answer.strip()
    if re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", text):
        return LLMDecision(next_agent=text)
    if "{" not in text:
        return Rejected('the answer is neither an agent name nor a {"decision": ...} object')
    try:
        return parse_decision(extract_json(text))
    except FleetforgeError as e:
        return Rejected(f"the answer is not valid JSON: {e.message}")


def validate_decision(answer: str | dict | LLMDecision | None, options: list[str]) -> LLMDecision | Rejected:
    """Parse, then check the decision is one of `options` (case-insensitively: `Coder` is `coder`)."""
    parsed = parse_decision(answer)
    if isinstance(parsed, Rejected):
        return parsed
    if parsed.next_agent not in options:
        return Rejected(f"decision {parsed.next_agent!r} not in {options}")
    return parsed
