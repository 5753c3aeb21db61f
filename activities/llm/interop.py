"""What differs between OpenAI-compatible servers, decided from what they answer and remembered per
endpoint (pure functions over small values; the activity applies them).

* Structured output climbs down one rung each time a server refuses our `response_format`:
  json_schema → json_object carrying the schema (llama.cpp turns it into a grammar) → json_object →
  no response_format. Below the first rung the schema also goes into a system instruction, and the
  caller validates the answer on every rung, so a weaker rung costs accuracy, never a failed step.
* Streams ask for usage (`stream_options.include_usage`). A server whose stream carried none is asked
  without streaming from then on (a whole response carries usage); that first call is marked unreported.
* `finish_reason` `length` / `content_filter` / refusal make an answer unusable; a cut-off answer is
  asked again once with a larger `max_tokens` when the caller set one.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from email.utils import parsedate_to_datetime
from enum import IntEnum
from typing import Any, Mapping

from contracts.messages import Message


class StructuredMode(IntEnum):
    """Rungs of structured output, best first."""

    JSON_SCHEMA = 0
    JSON_OBJECT_SCHEMA = 1
    JSON_OBJECT = 2
    PLAIN = 3


@dataclass
class EndpointQuirks:
    """What one endpoint (base URL + model) has shown it does not support; starts optimistic."""

    structured: StructuredMode = StructuredMode.JSON_SCHEMA
    stream_usage: bool | None = None
    """None until a stream has ended; False once a stream ended without a usage chunk."""


def response_format(mode: StructuredMode, schema: dict[str, Any], name: str) -> dict[str, Any] | None:
    """The `response_format` to send on this rung (None: send none)."""
    if mode is StructuredMode.JSON_SCHEMA:
        return {"type": "json_schema", "json_schema": {"name": name, "schema": schema}}
    if mode is StructuredMode.JSON_OBJECT_SCHEMA:
        return {"type": "json_object", "schema": schema}
    if mode is StructuredMode.JSON_OBJECT:
        return {"type": "json_object"}
    return None


def schema_name(agent: str) -> str:
    """A json_schema name OpenAI accepts (letters, digits, `_`, `-`; at most 64)."""
    cleaned = "".join(c if c.isalnum() or c in "_-" else "_" for c in agent)[:64]
    return cleaned or "answer"


def refuses_response_format(status: int | None, message: str) -> bool:
    """The server refused the request because of our response_format: 400/422 from servers that validate
    it, 500 from llama-cpp-python (its pydantic literal error: "Input should be 'text' or 'json_object'")."""
    if status not in (400, 415, 422, 500, 501):
        return False
    text = message.lower()
    return "response_format" in text or "json_schema" in text or "json_object" in text


def next_mode(mode: StructuredMode) -> StructuredMode | None:
    """The rung below, or None when there is none left."""
    return StructuredMode(mode + 1) if mode < StructuredMode.PLAIN else None


def should_stream(requested: bool, quirks: EndpointQuirks) -> bool:
    """Stream unless this endpoint's streams have shown they carry no usage."""
    return requested and quirks.stream_usage is not False


LENGTH_RETRY_CEILING = 8192
"""A cut-off answer is asked again with twice its max_tokens, up to this."""


def larger_max_tokens(current: int | None) -> int | None:
    """max_tokens for one more try after finish_reason `length`, or None when there is no room to grow
    (the caller set none: the server's own limit or the context window cut it)."""
    if current is None or current >= LENGTH_RETRY_CEILING:
        return None
    return min(current * 2, LENGTH_RETRY_CEILING)


def unusable_reason(message: Message, max_tokens: int | None) -> str:
    """Why this answer must not be used as a complete answer ("" when it may)."""
    match message.finish_reason:
        case "length":
            limit = f"max_tokens={max_tokens}" if max_tokens else "the server's limit (context window full?)"
            return f"the answer was cut off at {limit} (finish_reason=length)"
        case "content_filter":
            return "the provider's content filter stopped the answer (finish_reason=content_filter)"
        case "refusal":
            return f"the model refused: {message.metadata.get('refusal', '')}".strip()
    return ""


def retry_after_s(headers: Mapping[str, str] | None, now: float | None = None) -> float | None:
    """The back-off the server asked for, in seconds: `retry-after-ms`, else `retry-after` as seconds or
    as an HTTP date (RFC 9110). None when absent or unreadable. Never negative."""
    if headers is None:
        return None
    raw_ms = headers.get("retry-after-ms")
    if raw_ms is not None:
        try:
            return max(0.0, float(raw_ms) / 1000)
        except ValueError:
            pass
    raw = headers.get("retry-after")
    if raw is None:
        return None
    try:
        return max(0.0, float(raw))
    except ValueError:
        pass
    try:
        when = parsedate_to_datetime(raw)
    except (TypeError, ValueError, IndexError):
        return None
    if when.tzinfo is None:
        return None
    return max(0.0, when.timestamp() - (time.time() if now is None else now))
