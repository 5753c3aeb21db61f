"""OpenAIConverter on recorded chunk sequences, plus the structured-answer parser."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import pytest
from openai.types.chat import ChatCompletion, ChatCompletionChunk
from pydantic import BaseModel

from activities.llm.converters import OpenAIConverter, to_openai_messages
from activities.llm.structured import Parsed, Rejected, extract_json, parse_structured
from contracts.errors import Err, FleetforgeError
from contracts.messages import Message, ReasoningBlock, TextBlock, TokenUsage, ToolCallBlock, ToolResultBlock


def _chunk(delta: dict[str, Any] | None = None, finish: str | None = None, *, usage: dict[str, Any] | None = None,
           no_choices: bool = False) -> ChatCompletionChunk:
    d: dict[str, Any] = {"id": "c1", "object": "chat.completion.chunk", "created": 1, "model": "m",
                         "choices": [] if no_choices else [{"index": 0, "delta": delta or {}, "finish_reason": finish}]}
    if usage is not None:
        d["usage"] = usage
    return ChatCompletionChunk.model_validate(d)


async def _aiter(items: list[Any]) -> AsyncIterator[Any]:
    for i in items:
        yield i


async def _collect(chunks: list[ChatCompletionChunk]) -> list[Message]:
    return [m async for m in OpenAIConverter().convert_streaming_response(_aiter(chunks))]


def _tc(index: int, *, id: str | None = None, name: str | None = None, args: str | None = None) -> dict[str, Any]:
    fn: dict[str, Any] = {}
    if name is not None:
        fn["name"] = name
    if args is not None:
        fn["arguments"] = args
    d: dict[str, Any] = {"index": index, "function": fn}
    if id is not None:
        d["id"] = id
        d["type"] = "function"
    return d


USAGE = {
    "prompt_tokens": 120, "completion_tokens": 40, "total_tokens": 160,
    "completion_tokens_details": {"reasoning_tokens": 12}, "prompt_tokens_details": {"cached_tokens": 64},
}


async def test_plain_text_stream_partials_then_one_consolidated_message() -> None:
    chunks = [
        _chunk({"role": "assistant", "content": ""}),
        _chunk({"content": "Hel"}),
        _chunk({"content": "lo"}),
        _chunk({}, "stop"),
        _chunk(no_choices=True, usage={"prompt_tokens": 9, "completion_tokens": 2, "total_tokens": 11}),
    ]
    out = await _collect(chunks)
    assert out == [
        Message(content=[TextBlock(text="Hel")], delta=True),
        Message(content=[TextBlock(text="lo")], delta=True),
        Message(content=[TextBlock(text="Hello")], delta=False, finish_reason="stop",
                usage=TokenUsage(prompt=9, completion=2, total=11), metadata={"model": "m", "id": "c1"}),
    ]


async def test_vllm_reasoning_field_streams_reasoning_partials() -> None:
    """vLLM and others send `reasoning` (DeepSeek: `reasoning_content`); both are reasoning, never text."""
    chunks = [
        _chunk({"role": "assistant", "reasoning": "2+2 "}),
        _chunk({"reasoning": "is 4"}),
        _chunk({"content": "4"}),
        _chunk({}, "stop"),
        _chunk(no_choices=True, usage=USAGE),
    ]
    out = await _collect(chunks)
    assert [m.content for m in out[:-1]] == [[ReasoningBlock(text="2+2 ")], [ReasoningBlock(text="is 4")], [TextBlock(text="4")]]
    final = out[-1]
    assert final.content == [ReasoningBlock(text="2+2 is 4"), TextBlock(text="4")]
    assert final.reasoning == "2+2 is 4" and final.text == "4"
    assert final.usage == TokenUsage(prompt=120, completion=40, total=160, reasoning=12, cache_read=64)


async def test_usage_on_the_finish_chunk_and_length_finish() -> None:
    """Some servers put usage on the last choice chunk instead of a separate usage-only chunk."""
    chunks = [
        _chunk({"content": "cut by max_tokens"}),
        _chunk({}, "length", usage={"prompt_tokens": 4, "completion_tokens": 3, "total_tokens": 7,
                                    "prompt_tokens_details": {"cached_tokens": 2}}),
    ]
    final = (await _collect(chunks))[-1]
    assert final.text == "cut by max_tokens" and final.finish_reason == "length"
    assert final.usage == TokenUsage(prompt=4, completion=3, total=7, cache_read=2)


async def test_text_then_tool_call_in_one_stream() -> None:
    chunks = [
        _chunk({"role": "assistant", "content": "Let me look."}),
        _chunk({"tool_calls": [_tc(0, id="call_x", name="ls", args='{"d":')]}),
        _chunk({"tool_calls": [_tc(0, args=' "."}')]}),
        _chunk({}, "tool_calls"),
    ]
    final = (await _collect(chunks))[-1]
    call = ToolCallBlock(id="call_x", name="ls", arguments='{"d": "."}')
    assert final.content == [TextBlock(text="Let me look."), call]
    assert final.tool_calls == [call] and final.finish_reason == "tool_calls" and final.usage is None


async def test_text_stream_with_reasoning_and_usage_chunk() -> None:
    chunks = [
        _chunk({"role": "assistant", "content": ""}),
        _chunk({"reasoning_content": "think "}),
        _chunk({"reasoning": "more"}),
        _chunk({"content": "Hello"}),
        _chunk({"content": ", world"}),
        _chunk({}, "stop"),
        _chunk(no_choices=True, usage=USAGE),
    ]
    out = await _collect(chunks)
    assert all(m.delta for m in out[:-1]) and len(out) == 5
    final = out[-1]
    assert final.delta is False
    assert final.content == [ReasoningBlock(text="think more"), TextBlock(text="Hello, world")]
    assert final.text == "Hello, world"
    assert final.finish_reason == "stop"
    assert final.usage == TokenUsage(prompt=120, completion=40, total=160, reasoning=12, cache_read=64)
    assert final.metadata["model"] == "m"


async def test_two_parallel_tool_calls_split_across_chunks() -> None:
    chunks = [
        _chunk({"role": "assistant", "tool_calls": [_tc(0, id="call_a", name="read_file", args="")]}),
        _chunk({"tool_calls": [_tc(0, args='{"pa')]}),
        _chunk({"tool_calls": [_tc(1, id="call_b", name="list_dir", args='{"di')]}),
        _chunk({"tool_calls": [_tc(0, args='th": "a.')]}),
        _chunk({"tool_calls": [_tc(1, args='r": "/w"}')]}),
        _chunk({"tool_calls": [_tc(0, args='txt"}')]}),
        _chunk({}, "tool_calls"),
        _chunk(no_choices=True, usage={"prompt_tokens": 5, "completion_tokens": 7, "total_tokens": 12}),
    ]
    final = (await _collect(chunks))[-1]
    expected = [
        ToolCallBlock(id="call_a", name="read_file", arguments='{"path": "a.txt"}'),
        ToolCallBlock(id="call_b", name="list_dir", arguments='{"dir": "/w"}'),
    ]
    assert final.tool_calls == expected
    assert final.content == expected
    assert final.finish_reason == "tool_calls"
    assert final.usage == TokenUsage(prompt=5, completion=7, total=12)


async def test_stream_without_finish_reason_is_an_error() -> None:
    chunks = [_chunk({"role": "assistant", "content": ""}), _chunk({"content": "partial ans"})]
    seen: list[Message] = []
    with pytest.raises(FleetforgeError) as ei:
        async for m in OpenAIConverter().convert_streaming_response(_aiter(chunks)):
            seen.append(m)
    assert seen == [Message(content=[TextBlock(text="partial ans")], delta=True)], "never a consolidated short answer"
    assert ei.value.code == Err.LLM_STREAM_INCOMPLETE and ei.value.retryable
    assert "finish_reason" in ei.value.message


async def test_refusal_in_stream() -> None:
    chunks = [_chunk({"refusal": "I can't "}), _chunk({"refusal": "help with that."}), _chunk({}, "stop")]
    final = (await _collect(chunks))[-1]
    assert final.finish_reason == "refusal"
    assert final.metadata["refusal"] == "I can't help with that."
    assert final.text == "I can't help with that."
    assert final.usage is None


def test_convert_whole_response() -> None:
    resp = ChatCompletion.model_validate({
        "id": "x", "object": "chat.completion", "created": 1, "model": "m",
        "choices": [{"index": 0, "finish_reason": "tool_calls", "message": {
            "role": "assistant", "content": "ok", "reasoning_content": "because",
            "tool_calls": [{"id": "t1", "type": "function", "function": {"name": "f", "arguments": "{}"}}]}}],
        "usage": USAGE,
    })
    m = OpenAIConverter().convert_response(resp)
    assert m.content == [ReasoningBlock(text="because"), TextBlock(text="ok"), ToolCallBlock(id="t1", name="f", arguments="{}")]
    assert m.usage == TokenUsage(prompt=120, completion=40, total=160, reasoning=12, cache_read=64)
    assert m.finish_reason == "tool_calls" and not m.delta


def test_whole_response_refusal_and_reasoning_field() -> None:
    resp = ChatCompletion.model_validate({
        "id": "r", "object": "chat.completion", "created": 1, "model": "m",
        "choices": [{"index": 0, "finish_reason": "stop", "message": {
            "role": "assistant", "content": None, "refusal": "I can't help with that.", "reasoning": "policy"}}],
        "usage": {"prompt_tokens": 8, "completion_tokens": 6, "total_tokens": 14},
    })
    m = OpenAIConverter().convert_response(resp)
    assert m.content == [ReasoningBlock(text="policy"), TextBlock(text="I can't help with that.")]
    assert m.finish_reason == "refusal" and m.metadata == {"model": "m", "id": "r", "refusal": "I can't help with that."}
    assert m.usage == TokenUsage(prompt=8, completion=6, total=14) and m.tool_calls == []


def test_whole_response_without_choices_is_an_error() -> None:
    resp = ChatCompletion.model_validate({"id": "e", "object": "chat.completion", "created": 1, "model": "m", "choices": []})
    with pytest.raises(FleetforgeError) as ei:
        OpenAIConverter().convert_response(resp)
    assert ei.value.code == Err.LLM_OUTPUT_INVALID


def test_message_roundtrip_and_usage_sum() -> None:
    m = Message(content=[TextBlock(text="a"), ToolCallBlock(id="1", name="n")])
    again = Message.model_validate_json(m.model_dump_json())
    assert isinstance(again.content[1], ToolCallBlock) and again == m
    assert TokenUsage(prompt=1, total=1) + TokenUsage(completion=2, total=2, cache_read=3) == TokenUsage(
        prompt=1, completion=2, total=3, cache_read=3)


class _Answer(BaseModel):
    name: str
    n: int


@pytest.mark.parametrize("text", [
    '{"name": "a", "n": 1}',
    'Here:\n```json\n{"name": "a", "n": 1}\n```\nthanks',
    'Sure! {"name": "a", "n": 1} and {"other": 2}',
    'x {"name": "a}", "n": 1} y',
])
def test_extract_json_forms(text: str) -> None:
    assert extract_json(text)["n"] == 1


def test_parse_structured_rejections() -> None:
    assert parse_structured('{"name": "a", "n": 1}', _Answer) == Parsed(_Answer(name="a", n=1))
    r = parse_structured('{"name": "a", "n": "many"}', _Answer)
    assert isinstance(r, Rejected) and "n:" in r.reason
    r = parse_structured("no json here", _Answer)
    assert isinstance(r, Rejected)
    with pytest.raises(FleetforgeError) as ei:
        extract_json("[1, 2]")
    assert ei.value.code == Err.LLM_OUTPUT_INVALID


def test_to_openai_messages_with_tool_round_trip() -> None:
    call = ToolCallBlock(id="t1", name="ls", arguments='{"d": "."}')
    msgs = [
        Message.user("list"),
        Message(role="assistant", content=[call], tool_calls=[call]),
        Message(role="tool", content=[ToolResultBlock(tool_call_id="t1", content="a.txt")]),
    ]
    assert to_openai_messages(msgs) == [
        {"role": "user", "content": "list"},
        {"role": "assistant", "content": "",
         "tool_calls": [{"id": "t1", "type": "function", "function": {"name": "ls", "arguments": '{"d": "."}'}}]},
        {"role": "tool", "tool_call_id": "t1", "content": "a.txt"},
    ]
