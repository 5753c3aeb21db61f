"""The registered answer parsers a workflow.yaml's `output_format.parser_name` selects (pure).

A parser turns an agent's raw answer into its output fields, checking the mandatory ones the
workflow.yaml declares (`parser_definition.output_fields`), or refuses it with a reason the agent
can act on in its repair round:

* code_parser (also coder_parser, optimizer_parser): exactly one fenced ```python block, which becomes
  the one mandatory field (`code` unless the file names it otherwise);
* designer_parser, json_parser: one JSON object (bare, fenced, or the first balanced `{...}`), with
  every mandatory field present and non-empty.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

from activities.llm.structured import Rejected
from contracts.errors import FleetforgeError
from contracts.kernel import PARSER_FIELDS, OutputField, OutputFormat

_FENCED_PY = re.compile(r"```(?:python|py)[ \t]*\n(.*?)```", re.DOTALL)
_FENCED_ANY = re.compile(r"```[ \t]*\n(.*?)```", re.DOTALL)

DEFAULT_FORMATS = {
    "designer": OutputFormat(parser_name="designer_parser", fields={"family": "the kernel family"}),
    "coder": OutputFormat(parser_name="coder_parser", fields={"code": "the complete candidate source"}),
    "optimizer": OutputFormat(parser_name="optimizer_parser", fields={"code": "the faster candidate source"}),
}
"""What an agent answers when the workflow.yaml gives it no output_format."""

Fields = dict[str, Any]


def output_format(agent: str, configured: OutputFormat | None) -> OutputFormat:
    return configured if configured is not None else DEFAULT_FORMATS[agent]


def parse(text: str, fmt: OutputFormat) -> Fields | Rejected:
    return PARSERS[fmt.parser_name](text or "", fmt)


def code_field(fmt: OutputFormat) -> str:
    """The field a code parser fills: the one mandatory field, else `code`."""
    mandatory = fmt.mandatory_fields
    return mandatory[0] if mandatory else "code"


def _code(text: str, fmt: OutputFormat) -> Fields | Rejected:
    blocks = _FENCED_PY.findall(text) or _FENCED_ANY.findall(text)
    if not blocks:
        return Rejected("the answer has no fenced ```python block with the candidate")
    if len(blocks) > 1:
        return Rejected(f"the answer has {len(blocks)} fenced python blocks; expected exactly one with the whole candidate")
    source = blocks[0].strip()
    if not source:
        return Rejected("the fenced python block is empty")
    return {code_field(fmt): source + "\n"}


def _json(text: str, fmt: OutputFormat) -> Fields | Rejected:
    from activities.llm.structured import extract_json

    try:
        data = extract_json(text)
    except FleetforgeError as e:
        return Rejected(e.message)
    for name, spec in fmt.output_fields.items():
        if not spec.mandatory:
            continue
        if name not in data or data[name] in (None, "", [], {}):
            desc = f" ({spec.field_description})" if spec.field_description else ""
            return Rejected(f"the answer lacks the mandatory field {name!r}{desc}")
        if not _typed(data[name], spec):
            return Rejected(f"field {name!r} must be a {spec.field_type}, got {type(data[name]).__name__}")
    return data


def _typed(value: Any, spec: OutputField) -> bool:
    expected = {"str": str, "int": int, "float": (int, float), "bool": bool, "dict": dict, "list": list}[spec.field_type]
    return isinstance(value, expected)


PARSERS: dict[str, Callable[[str, OutputFormat], Fields | Rejected]] = {
    "code_parser": _code, "coder_parser": _code, "optimizer_parser": _code,
    "designer_parser": _json, "json_parser": _json,
}
assert set(PARSERS) == set(PARSER_FIELDS), "contracts.kernel.PARSER_FIELDS names the registered parsers"
