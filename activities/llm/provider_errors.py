"""Provider failures as ApplicationErrors with stable types; the type says whose failure it is and
whether asking again can help.

| what the server said                                   | type                 | retried |
|--------------------------------------------------------|----------------------|---------|
| 408 / 409 / 429 (rate limit) / 5xx, connection errors  | LLM_RETRYABLE        | yes, after `retry-after` when given |
| `retry-after` longer than the worker's cap             | LLM_RATE_LIMITED     | no      |
| 429 `insufficient_quota` (also as a stream error event) | LLM_QUOTA            | no      |
| context length exceeded (status or stream error event) | LLM_CONTEXT_LENGTH   | no      |
| 401 / 403                                              | LLM_AUTH             | no      |
| any other 4xx, an `invalid_request_error` event        | LLM_BAD_REQUEST      | no      |
| another error event inside a stream (server_error ...) | LLM_RETRYABLE        | yes     |
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from temporalio.exceptions import ApplicationError

from activities.llm.converters import require_openai
from activities.llm.interop import retry_after_s
from contracts.errors import Err

_CONTEXT = ("context_length_exceeded", "maximum context length", "context window", "context length",
            "prompt is too long", "too many tokens")
_QUOTA = ("insufficient_quota", "exceeded your current quota", "check your plan and billing")


def classify(status: int | None, code: str | None, type_: str | None, message: str) -> Err:
    """The error type for a provider failure; `status` None for an error event inside a stream."""
    said = " ".join(x for x in (code, type_, message) if x).lower()
    if any(p in said for p in _CONTEXT):
        return Err.LLM_CONTEXT_LENGTH
    if any(p in said for p in _QUOTA):
        return Err.LLM_QUOTA
    if status is None:
        return Err.LLM_BAD_REQUEST if type_ == "invalid_request_error" else Err.LLM_RETRYABLE
    if status in (401, 403):
        return Err.LLM_AUTH
    if status in (408, 409, 429) or status >= 500:
        return Err.LLM_RETRYABLE
    return Err.LLM_BAD_REQUEST


def error_message(e: Any) -> str:
    """The server's own message (the SDK prefixes `Error code: N - `)."""
    body = getattr(e, "body", None)
    if isinstance(body, dict) and isinstance(body.get("message"), str):
        return body["message"]
    return str(getattr(e, "message", e))


def map_openai_error(e: Exception, *, max_retry_after_s: float = 600.0) -> Exception:
    """A provider exception as an ApplicationError with a stable type (or the exception unchanged)."""
    openai = require_openai()
    if isinstance(e, openai.APIStatusError):
        status = e.status_code
        err = classify(status, e.code, e.type, error_message(e))
        message = f"LLM endpoint answered {status}: {error_message(e)}"
        if err is not Err.LLM_RETRYABLE:
            return ApplicationError(message, type=err, non_retryable=True)
        wait = retry_after_s(e.response.headers)
        if wait is not None and wait > max_retry_after_s:
            return ApplicationError(
                f"{message}; it asks to retry after {wait:.0f} s, longer than this worker waits "
                f"(FLEETFORGE_LLM_MAX_RETRY_AFTER_S={max_retry_after_s:.0f})",
                type=Err.LLM_RATE_LIMITED, non_retryable=True)
        return ApplicationError(message, type=err, non_retryable=False,
                                next_retry_delay=None if wait is None else timedelta(seconds=wait))
    if isinstance(e, openai.APIConnectionError):
        return ApplicationError(f"LLM endpoint unreachable: {e}", type=Err.LLM_RETRYABLE, non_retryable=False)
    if isinstance(e, openai.APIError):  # an error event inside a stream: no status, a code in the body
        err = classify(None, e.code, e.type, error_message(e))
        message = f"LLM stream error event ({e.code or e.type or 'no code'}): {error_message(e)}"
        return ApplicationError(message, type=err, non_retryable=err is not Err.LLM_RETRYABLE)
    if _is_transport_error(e):
        return ApplicationError(f"LLM stream broken: {e!r}", type=Err.LLM_RETRYABLE, non_retryable=False)
    return e


def _is_transport_error(e: Exception) -> bool:
    """httpx (or the httpx2 the openai SDK may use) transport failures raised while reading a stream."""
    for name in ("httpx", "httpx2"):
        try:
            mod = __import__(name)
        except ImportError:
            continue
        if isinstance(e, mod.TransportError):
            return True
    return False
