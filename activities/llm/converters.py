"""Normalise provider responses (whole or streamed) into one `contracts.messages.Message`."""

from __future__ import annotations

import json
from abc import ABC, abstractmethod
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

from contracts.errors import Err, FleetforgeError
from contracts.messages import ContentBlock, Message, ReasoningBlock, TextBlock, TokenUsage, ToolCallBlock


def require_openai() -> Any:
    """Import the `openai` package or fail with a typed, actionable error."""
    try:
        import openai
    except ImportError as e:  # pragma: no cover - openai is a dependency, but keep the message clear
        raise FleetforgeError(
            Err.LLM_UNAVAILABLE, "the `openai` package is not installed (pip install openai), or use FLEETFORGE_LLM=offline"
        ) from e
    return openai


class BaseConverter(ABC):
    """One per provider API. Streams yield delta=True partials, then exactly one delta=False message."""

    @abstractmethod
    def convert_response(self, response: Any) -> Message: ...

    @abstractmethod
    def convert_streaming_response(self, chunks: AsyncIterator[Any]) -> AsyncIterator[Message]: ...


def _extra(obj: Any, name: str) -> Any:
    """A field that OpenAI-compatible servers add (not in the SDK's model): attribute or model_extra."""
    value = getattr(obj, name, None)
    if value is None:
        extra = getattr(obj, "model_extra", None) or {}
        value = extra.get(name)
    return value


def _usage(u: Any) -> TokenUsage | None:
    if u is None:
        return None
    details = getattr(u, "completion_tokens_details", None)
    pdetails = getattr(u, "prompt_tokens_details", None)
    prompt = getattr(u, "prompt_tokens", 0) or 0
    completion = getattr(u, "completion_tokens", 0) or 0
    return TokenUsage(
        prompt=prompt, completion=completion, total=getattr(u, "total_tokens", 0) or prompt + completion,
        reasoning=(getattr(details, "reasoning_tokens", 0) or 0) if details else 0,
        cache_read=(getattr(pdetails, "cached_tokens", 0) or 0) if pdetails else 0,
        cache_write=int(_extra(u, "cache_creation_input_tokens") or 0),
    )


def _blocks(reasoning: str, text: str, refusal: str, tool_calls: list[ToolCallBlock]) -> list[ContentBlock]:
    blocks: list[ContentBlock] = []
    if reasoning:
        blocks.append(ReasoningBlock(text=reasoning))
    if text:
        blocks.append(TextBlock(text=text))
    if refusal and not text:
        blocks.append(TextBlock(text=refusal))
    blocks.extend(tool_calls)
    return blocks


def _finish(finish_reason: str | None, refusal: str, metadata: dict[str, str]) -> str | None:
    if refusal:
        metadata["refusal"] = refusal
        return "refusal"
    if finish_reason == "content_filter":
        metadata["refusal"] = "content_filter"
    return finish_reason


@dataclass
class _ToolAcc:
    id: str = ""
    name: str = ""
    arguments: list[str] = field(default_factory=list)


class OpenAIConverter(BaseConverter):
    """Chat Completions (OpenAI and compatible servers: vLLM, Ollama, llama.cpp, ...)."""

    def convert_response(self, response: Any) -> Message:
        if not response.choices:
            raise FleetforgeError(Err.LLM_OUTPUT_INVALID, "the response has no choices")
        choice = response.choices[0]
        msg = choice.message
        reasoning = _extra(msg, "reasoning_content") or _extra(msg, "reasoning") or ""
        refusal = getattr(msg, "refusal", None) or ""
        calls = [
            ToolCallBlock(id=tc.id, name=tc.function.name, arguments=tc.function.arguments or "")
            for tc in (msg.tool_calls or [])
        ]
        metadata: dict[str, str] = {"model": response.model or "", "id": response.id or ""}
        return Message(
            role="assistant", content=_blocks(reasoning, msg.content or "", refusal, calls), tool_calls=calls,
            usage=_usage(response.usage), finish_reason=_finish(choice.finish_reason, refusal, metadata),
            metadata=metadata,
        )

    async def convert_streaming_response(self, chunks: AsyncIterator[Any]) -> AsyncIterator[Message]:
        text: list[str] = []
        reasoning: list[str] = []
        refusal: list[str] = []
        tools: dict[int, _ToolAcc] = {}
        finish_reason: str | None = None
        usage: TokenUsage | None = None
        metadata: dict[str, str] = {}
        async for chunk in chunks:
            if getattr(chunk, "model", None):
                metadata["model"] = chunk.model
            if getattr(chunk, "id", None):
                metadata["id"] = chunk.id
            if getattr(chunk, "usage", None) is not None:
                usage = _usage(chunk.usage)
            if not chunk.choices:
                continue  # the usage-only chunk at the end of a stream
            choice = chunk.choices[0]
            d = choice.delta
            partial: list[ContentBlock] = []
            r = _extra(d, "reasoning_content") or _extra(d, "reasoning")
            if r:
                reasoning.append(r)
                partial.append(ReasoningBlock(text=r))
            if d.content:
                text.append(d.content)
                partial.append(TextBlock(text=d.content))
            if getattr(d, "refusal", None):
                refusal.append(d.refusal)
            for tc in d.tool_calls or []:
                acc = tools.setdefault(tc.index, _ToolAcc())
                if tc.id:
                    acc.id = tc.id
                if tc.function is not None:
                    if tc.function.name:
                        acc.name += tc.function.name
                    if tc.function.arguments:
                        acc.arguments.append(tc.function.arguments)
            if choice.finish_reason:
                finish_reason = choice.finish_reason
            if partial:
                yield Message(role="assistant", content=partial, delta=True)
        if finish_reason is None:
            raise FleetforgeError(
                Err.LLM_STREAM_INCOMPLETE, "the stream ended without a finish_reason (connection cut?)", retryable=True
            )
        calls = [
            ToolCallBlock(id=a.id or f"call_{i}", name=a.name, arguments="".join(a.arguments))
            for i, a in sorted(tools.items())
        ]
        ref = "".join(refusal)
        yield Message(
            role="assistant", content=_blocks("".join(reasoning), "".join(text), ref, calls), delta=False,
            tool_calls=calls, usage=usage, finish_reason=_finish(finish_reason, ref, metadata), metadata=metadata,
        )


def to_openai_messages(messages: list[Message]) -> list[dict[str, Any]]:
    """Our Messages as Chat Completions request messages."""
    out: list[dict[str, Any]] = []
    for m in messages:
        results = [b for b in m.content if b.type == "tool_result"]
        for r in results:
            out.append({"role": "tool", "tool_call_id": r.tool_call_id, "content": r.content})
        if results and m.role == "tool":
            continue
        item: dict[str, Any] = {"role": m.role, "content": m.text}
        calls = m.tool_calls or [b for b in m.content if isinstance(b, ToolCallBlock)]
        if calls:
            item["tool_calls"] = [
                {"id": c.id, "type": "function", "function": {"name": c.name, "arguments": c.arguments}} for c in calls
            ]
        out.append(item)
    return out


def dump_response(obj: Any) -> Any:
    """A provider object as JSON-able data (for transcripts)."""
    if hasattr(obj, "model_dump"):
        return obj.model_dump(mode="json")
    return json.loads(json.dumps(obj, default=str))
