"""The pure interop decisions (activities/llm/interop.py) and the provider error classification
(activities/llm/provider_errors.py), without a server."""

from __future__ import annotations

from datetime import timedelta
from email.utils import format_datetime
from datetime import datetime, timezone

import httpx
import openai
import pytest

from activities.llm import interop
from activities.llm.interop import EndpointQuirks, StructuredMode
from activities.llm.provider_errors import classify, map_openai_error
from contracts.errors import Err
from contracts.messages import Message, TextBlock, TokenUsage
from tests.doubles.openai_server import LLAMA_CPP_JSON_SCHEMA_500

SCHEMA = {"type": "object", "properties": {"n": {"type": "integer"}}, "required": ["n"]}


def test_structured_rungs_go_down_one_at_a_time_and_end() -> None:
    modes, mode = [], StructuredMode.JSON_SCHEMA
    while mode is not None:
        modes.append(mode)
        mode = interop.next_mode(mode)
    assert modes == [StructuredMode.JSON_SCHEMA, StructuredMode.JSON_OBJECT_SCHEMA, StructuredMode.JSON_OBJECT,
                     StructuredMode.PLAIN]
    assert [interop.response_format(m, SCHEMA, "a") for m in modes] == [
        {"type": "json_schema", "json_schema": {"name": "a", "schema": SCHEMA}},
        {"type": "json_object", "schema": SCHEMA},
        {"type": "json_object"},
        None,
    ]


@pytest.mark.parametrize(("status", "message", "refused"), [
    (500, LLAMA_CPP_JSON_SCHEMA_500, True),
    (400, "response_format 'json_schema' is not supported by this model", True),
    (400, "Invalid parameter: 'response_format' of type 'json_object' is not supported with this model.", True),
    (422, "body.response_format.schema: extra fields not permitted", True),
    (500, "CUDA out of memory", False),
    (400, "max_tokens is too large", False),
    (429, "response_format: rate limited", False),
])
def test_refuses_response_format_is_decided_from_the_error(status: int, message: str, refused: bool) -> None:
    assert interop.refuses_response_format(status, message) is refused


def test_schema_name_is_what_openai_accepts() -> None:
    assert interop.schema_name("kernel-designer") == "kernel-designer"
    assert interop.schema_name("fleet command.writer/v2") == "fleet_command_writer_v2"
    assert interop.schema_name("") == "answer" and len(interop.schema_name("x" * 100)) == 64


def test_streams_stop_once_an_endpoint_sent_no_usage() -> None:
    quirks = EndpointQuirks()
    assert interop.should_stream(True, quirks) and not interop.should_stream(False, quirks)
    quirks.stream_usage = True
    assert interop.should_stream(True, quirks)
    quirks.stream_usage = False
    assert not interop.should_stream(True, quirks)


def test_a_cut_off_answer_gets_twice_the_room_once_up_to_the_ceiling() -> None:
    assert interop.larger_max_tokens(256) == 512
    assert interop.larger_max_tokens(interop.LENGTH_RETRY_CEILING - 10) == interop.LENGTH_RETRY_CEILING
    assert interop.larger_max_tokens(interop.LENGTH_RETRY_CEILING) is None
    assert interop.larger_max_tokens(None) is None, "no max_tokens: the server's limit cut it, more room is not ours to give"


@pytest.mark.parametrize(("finish", "metadata", "max_tokens", "reason"), [
    ("stop", {}, None, ""),
    ("tool_calls", {}, 64, ""),
    ("length", {}, 64, "the answer was cut off at max_tokens=64 (finish_reason=length)"),
    ("length", {}, None, "the answer was cut off at the server's limit (context window full?) (finish_reason=length)"),
    ("content_filter", {"refusal": "content_filter"}, None,
     "the provider's content filter stopped the answer (finish_reason=content_filter)"),
    ("refusal", {"refusal": "I can't help with that."}, None, "the model refused: I can't help with that."),
])
def test_unusable_reason_follows_finish_reason(finish: str, metadata: dict, max_tokens: int | None, reason: str) -> None:
    message = Message(content=[TextBlock(text="partial")], finish_reason=finish, metadata=metadata)
    assert interop.unusable_reason(message, max_tokens) == reason


def test_retry_after_in_every_form() -> None:
    now = 1_800_000_000.0
    date = format_datetime(datetime.fromtimestamp(now + 90, tz=timezone.utc), usegmt=True)
    assert interop.retry_after_s({"retry-after-ms": "250", "retry-after": "9"}, now) == 0.25
    assert interop.retry_after_s({"retry-after": "2"}, now) == 2.0
    assert interop.retry_after_s({"retry-after": "1.5"}, now) == 1.5
    assert interop.retry_after_s({"retry-after": date}, now) == pytest.approx(90)
    assert interop.retry_after_s({"retry-after": "Wed, 21 Oct 2015 07:28:00 GMT"}, now) == 0.0, "a past date: now"
    assert interop.retry_after_s({"retry-after": "100000"}, now) == 100000.0, "large values are kept: the cap decides"
    assert interop.retry_after_s({"retry-after": "soon"}, now) is None
    assert interop.retry_after_s({"retry-after-ms": "x", "retry-after": "3"}, now) == 3.0
    assert interop.retry_after_s({}, now) is None and interop.retry_after_s(None, now) is None


@pytest.mark.parametrize(("status", "code", "type_", "message", "err"), [
    (400, "context_length_exceeded", "invalid_request_error", "This model's maximum context length is 4096 tokens.",
     Err.LLM_CONTEXT_LENGTH),
    (400, None, None, "Requested tokens (5031) exceed context window of 4096", Err.LLM_CONTEXT_LENGTH),
    (None, "context_length_exceeded", None, "too long", Err.LLM_CONTEXT_LENGTH),
    (429, "insufficient_quota", "insufficient_quota", "You exceeded your current quota, please check your plan and "
     "billing details.", Err.LLM_QUOTA),
    (None, "insufficient_quota", None, "quota", Err.LLM_QUOTA),
    (429, "rate_limit_exceeded", "requests", "Rate limit reached for requests", Err.LLM_RETRYABLE),
    (None, "rate_limit_exceeded", None, "Rate limit reached", Err.LLM_RETRYABLE),
    (None, "server_error", "server_error", "The server had an error", Err.LLM_RETRYABLE),
    (None, None, "invalid_request_error", "bad tool schema", Err.LLM_BAD_REQUEST),
    (401, None, None, "bad key", Err.LLM_AUTH),
    (403, None, None, "forbidden", Err.LLM_AUTH),
    (404, None, None, "no such model", Err.LLM_BAD_REQUEST),
    (408, None, None, "timeout", Err.LLM_RETRYABLE),
    (503, None, None, "overloaded", Err.LLM_RETRYABLE),
])
def test_classify_by_status_code_and_message(status, code, type_, message, err) -> None:
    assert classify(status, code, type_, message) is err


def _status_error(status: int, body: dict, headers: dict[str, str] | None = None) -> openai.APIStatusError:
    request = httpx.Request("POST", "http://127.0.0.1/v1/chat/completions")
    response = httpx.Response(status, headers=headers or {}, request=request, json={"error": body})
    return openai.APIStatusError(f"Error code: {status} - {body['message']}", response=response, body=body)


def test_retry_after_beyond_the_cap_fails_the_call_with_a_clear_message() -> None:
    body = {"message": "slow down", "type": "requests", "code": "rate_limit_exceeded"}
    within = map_openai_error(_status_error(429, body, {"retry-after": "30"}), max_retry_after_s=60)
    assert within.type == Err.LLM_RETRYABLE and not within.non_retryable
    assert within.next_retry_delay == timedelta(seconds=30)
    beyond = map_openai_error(_status_error(429, body, {"retry-after": "3600"}), max_retry_after_s=60)
    assert beyond.type == Err.LLM_RATE_LIMITED and beyond.non_retryable
    assert "3600 s" in beyond.message and "FLEETFORGE_LLM_MAX_RETRY_AFTER_S=60" in beyond.message


def test_quota_429_is_not_retried_like_a_rate_limit() -> None:
    body = {"message": "You exceeded your current quota", "type": "insufficient_quota", "code": "insufficient_quota"}
    mapped = map_openai_error(_status_error(429, body, {"retry-after": "1"}))
    assert mapped.type == Err.LLM_QUOTA and mapped.non_retryable and "429" in mapped.message


def test_usage_sum_stays_unreported_once_any_part_is() -> None:
    assert (TokenUsage(prompt=3, total=3) + TokenUsage(reported=False)).reported is False
    assert (TokenUsage(prompt=3, total=3) + TokenUsage(completion=1, total=1)).reported is True
