"""LLM text → validated pydantic model, or a typed rejection (STYLE G10).

`complete_structured` asks (response_format json_schema; the activity climbs down to json_object or
plain instructions, prompts/json_instructions.j2, where the endpoint refuses it), validates, and on
failure re-asks once with the validation error and a stricter instruction (prompts/repair_json.j2);
a second failure raises FleetforgeError(LLM_OUTPUT_INVALID). An answer the activity marked unusable
(cut off, refused, filtered) is a rejection like any other, with its reason (`usable_text`).
"""

from __future__ import annotations

import json
import re
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Generic, TypeVar

import jinja2
from pydantic import BaseModel, ValidationError

from contracts.errors import Err, FleetforgeError
from contracts.messages import ChatRequest, ChatResult, Message, TextBlock

M = TypeVar("M", bound=BaseModel)

PROMPTS = Path(__file__).resolve().parent / "prompts"
_ENV = jinja2.Environment(
    loader=jinja2.DictLoader({p.name: p.read_text() for p in sorted(PROMPTS.glob("*.j2"))}),
    undefined=jinja2.StrictUndefined, keep_trailing_newline=True, autoescape=False,
)
_TEMPLATES = {name: _ENV.get_template(name) for name in _ENV.list_templates()}
"""Read and compiled once at import: workflows render the repair prompt (ask_structured), and workflow
code may do no file I/O, no compile and create no lock; a replay renders exactly what the run rendered."""
_FENCE = re.compile(r"```(?:json|JSON)?\s*\n?(.*?)```", re.DOTALL)


def render(template: str, **context: Any) -> str:
    """Render a prompt template from activities/llm/prompts (StrictUndefined: a missing key is a bug)."""
    return _TEMPLATES[template].render(**context)


def _first_balanced(text: str) -> str | None:
    """The first balanced {...} in text (string literals and escapes respected)."""
    start = text.find("{")
    while start != -1:
        depth, in_str, esc = 0, False, False
        for i in range(start, len(text)):
            ch = text[i]
            if in_str:
                if esc:
                    esc = False
                elif ch == "\\":
                    esc = True
                elif ch == '"':
                    in_str = False
            elif ch == '"':
                in_str = True
            elif ch == "{":
                depth += 1
            elif ch == "}":
                depth -= 1
                if depth == 0:
                    return text[start:i + 1]
        start = text.find("{", start + 1)
    return None


def extract_json(text: str) -> dict[str, Any]:
    """A JSON object from a model's answer: the bare text, a fenced ```json block, or the first
    balanced {...}. Raises FleetforgeError(LLM_OUTPUT_INVALID) when there is none."""
    candidates: list[str] = [text.strip()]
    candidates += [m.group(1).strip() for m in _FENCE.finditer(text)]
    balanced = _first_balanced(text)
    if balanced:
        candidates.append(balanced)
    last = "no JSON object in the answer"
    for c in candidates:
        if not c:
            continue
        try:
            value = json.loads(c)
        except json.JSONDecodeError as e:
            last = f"invalid JSON: {e}"
            continue
        if isinstance(value, dict):
            return value
        last = f"expected a JSON object, got {type(value).__name__}"
    raise FleetforgeError(Err.LLM_OUTPUT_INVALID, last)


@dataclass(frozen=True)
class Parsed(Generic[M]):
    value: M


@dataclass(frozen=True)
class Rejected:
    reason: str


def usable_text(result: ChatResult) -> str | Rejected:
    """The answer's text, or a Rejected when the activity marked the answer unusable (cut off at
    max_tokens, refused, stopped by a content filter): such an answer is never parsed as complete."""
    if result.unusable:
        return Rejected(result.unusable)
    return result.message.text


def parse_answer(result: ChatResult, model_cls: type[M]) -> Parsed[M] | Rejected:
    """`parse_structured` of a whole ChatResult (an unusable answer is rejected with its reason)."""
    text = usable_text(result)
    return text if isinstance(text, Rejected) else parse_structured(text, model_cls)


def parse_structured(text: str, model_cls: type[M]) -> Parsed[M] | Rejected:
    """The answer as `model_cls`, or a Rejected with a reason fit to show the model."""
    try:
        data = extract_json(text)
    except FleetforgeError as e:
        return Rejected(e.message)
    try:
        return Parsed(model_cls.model_validate(data))
    except ValidationError as e:
        errs = "; ".join(f"{'.'.join(map(str, x['loc'])) or '<root>'}: {x['msg']}" for x in e.errors()[:10])
        return Rejected(f"the JSON does not match the schema: {errs}")


async def complete_structured(
    chat: Callable[[ChatRequest], Awaitable[ChatResult]], req: ChatRequest, model_cls: type[M],
) -> tuple[M, list[ChatResult]]:
    """Ask, validate, re-ask once with the error; returns the model and every call's result."""
    if req.response_schema is None:
        req = req.model_copy(update={"response_schema": model_cls.model_json_schema()})
    results: list[ChatResult] = []
    first = await chat(req)
    results.append(first)
    outcome = parse_answer(first, model_cls)
    if isinstance(outcome, Parsed):
        return outcome.value, results
    repair = render("repair_json.j2", error=outcome.reason, schema=json.dumps(req.response_schema, sort_keys=True))
    retry_req = req.model_copy(update={"messages": [
        *req.messages,
        Message(role="assistant", content=[TextBlock(text=first.message.text or "(empty)")]),
        Message.user(repair),
    ]})
    second = await chat(retry_req)
    results.append(second)
    outcome = parse_answer(second, model_cls)
    if isinstance(outcome, Parsed):
        return outcome.value, results
    raise FleetforgeError(Err.LLM_OUTPUT_INVALID, f"{req.agent}: unusable answer after one repair: {outcome.reason}")
