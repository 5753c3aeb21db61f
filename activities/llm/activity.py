"""The chat activity: one provider call, normalised into a ChatResult with a stored transcript.

`AsyncOpenAI(max_retries=0)`: Temporal owns retries; provider errors become ApplicationErrors with
stable types (activities/llm/provider_errors.py). Heartbeats while waiting for the first token (or the
whole non-streamed answer) and on every streamed chunk.

Within one call the activity adapts to the endpoint (activities/llm/interop.py), so a server's
quirks never fail a step: a refused `response_format` is asked again one rung lower (json_schema →
json_object with schema → json_object → plain instructions) and remembered per endpoint; a stream
without usage is marked unreported and later calls to that endpoint are not streamed; a stream that
ends before its first chunk is asked once without streaming (the whole response says why); an answer
cut off at the caller's `max_tokens` is asked again once with twice the room (a request without one
gets the worker's FLEETFORGE_LLM_MAX_TOKENS, a budget, not retried). An answer that stays cut off, is
refused or filtered comes back with `ChatResult.unusable` set and no text, never as a complete one.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import threading
import time
from collections.abc import AsyncIterator
from datetime import timedelta
from typing import Any

from temporalio import activity

from activities.llm import interop
from activities.llm.converters import OpenAIConverter, dump_response, require_openai, to_openai_messages
from activities.llm.interop import EndpointQuirks, StructuredMode
from activities.llm.live import LiveTokens
from activities.llm.provider_errors import error_message, map_openai_error
from activities.llm.structured import render
from activities.storage import ArtifactStore
from contracts.common import ArtifactRef
from contracts.errors import Err, FleetforgeError
from contracts.messages import ChatRequest, ChatResult, Message, TextBlock, TokenUsage
from contracts.settings import Settings

FIRST_TOKEN_HEARTBEAT_S = 5.0
"""Longest pause between heartbeats while the provider has not sent anything yet; shorter when the
caller's heartbeat timeout is short (a quarter of it), so a slow first token never looks like a crash."""


def _heartbeat(*details: Any) -> None:
    if activity.in_activity():
        activity.heartbeat(*details)


def _attempt() -> int:
    return activity.info().attempt if activity.in_activity() else 1


def first_token_heartbeat_interval(heartbeat_timeout: timedelta | None, ceiling_s: float = FIRST_TOKEN_HEARTBEAT_S) -> float:
    """Seconds between heartbeats before the first token: a quarter of the heartbeat timeout, at most `ceiling_s`.
    (The SDK throttles what it sends to the server, so beating often costs nothing.)"""
    if not heartbeat_timeout:
        return ceiling_s
    return min(ceiling_s, heartbeat_timeout.total_seconds() / 4)


def _transcript(store: ArtifactStore, *, agent: str, provider: str, attempt: int, request: dict[str, Any],
                response: dict[str, Any], latency_s: float, **extra: Any) -> ArtifactRef:
    doc = {"agent": agent, "provider": provider, "attempt": attempt, "latency_s": round(latency_s, 3),
           "request": request, "response": response, **extra}
    data = json.dumps(doc, indent=2, sort_keys=True, default=str).encode()
    return store.put_bytes(data, media_type="application/json", name=f"llm/{agent}-transcript.json")


def record_offline_answer(store: ArtifactStore, agent: str, request: dict[str, Any] | ChatRequest, text: str) -> ChatResult:
    """The offline provider's answer in the same shape (and transcript) as a real call; usage zero."""
    req = request.model_dump(mode="json") if isinstance(request, ChatRequest) else request
    message = Message(role="assistant", content=[TextBlock(text=text)], usage=TokenUsage(), finish_reason="stop",
                      metadata={"provider": "offline"})
    attempt = _attempt()
    ref = _transcript(store, agent=agent, provider="offline", attempt=attempt, request=req,
                      response=message.model_dump(mode="json"), latency_s=0.0)
    return ChatResult(message=message, usage=TokenUsage(), latency_s=0.0, transcript=ref, attempt=attempt,
                      provider="offline")


class _EmptyStream(Exception):
    """The stream ended before its first chunk (llama.cpp does this when the prompt overflows its context)."""


class LLMActivities:
    def __init__(self, settings: Settings, store: ArtifactStore, *, first_token_heartbeat_s: float | None = None):
        """`first_token_heartbeat_s`: fixed heartbeat interval before the first token (tests); None derives it
        from the activity's heartbeat timeout (first_token_heartbeat_interval)."""
        self.settings = settings
        self.store = store
        self.first_token_heartbeat_s = first_token_heartbeat_s
        self.converter = OpenAIConverter()
        self._client: Any = None
        self._client_lock = threading.Lock()
        self._quirks: dict[tuple[str, str], EndpointQuirks] = {}
        """Per (base URL, model): what the endpoint has shown it does not support, for this worker's lifetime."""

    def _openai(self) -> Any:
        """The shared client, created on first use (importing `openai` takes a second or more: it runs in a
        thread, so the event loop keeps heartbeating meanwhile)."""
        with self._client_lock:
            if self._client is None:
                openai = require_openai()
                key = self.settings.llm_api_key.get_secret_value() if self.settings.llm_api_key else "unused"
                self._client = openai.AsyncOpenAI(max_retries=0, base_url=self.settings.llm_base_url, api_key=key)
            return self._client

    def quirks(self, model: str) -> EndpointQuirks:
        return self._quirks.setdefault((self.settings.llm_base_url or "", model), EndpointQuirks())

    def _beat_interval(self) -> float:
        if self.first_token_heartbeat_s is not None:
            return self.first_token_heartbeat_s
        return first_token_heartbeat_interval(activity.info().heartbeat_timeout if activity.in_activity() else None)

    def _kwargs(self, req: ChatRequest, quirks: EndpointQuirks, *, stream: bool, max_tokens: int | None) -> dict[str, Any]:
        messages = to_openai_messages(req.messages)
        kw: dict[str, Any] = {"model": self._model(req)}
        if req.tools:
            kw["tools"] = [
                {"type": "function", "function": {"name": t.name, "description": t.description, "parameters": t.parameters}}
                for t in req.tools
            ]
        if req.temperature is not None:
            kw["temperature"] = req.temperature
        if max_tokens is not None:
            kw["max_tokens"] = max_tokens
        if req.response_schema is not None:
            fmt = interop.response_format(quirks.structured, req.response_schema, interop.schema_name(req.agent))
            if fmt is not None:
                kw["response_format"] = fmt
            if quirks.structured is not StructuredMode.JSON_SCHEMA:
                schema = json.dumps(req.response_schema, sort_keys=True)
                messages = [{"role": "system", "content": render("json_instructions.j2", schema=schema)}, *messages]
        kw["messages"] = messages
        if stream:
            kw["stream"] = True
            kw["stream_options"] = {"include_usage": True}
        return kw

    def _model(self, req: ChatRequest) -> str:
        return req.model or self.settings.llm_model

    async def _call(self, kw: dict[str, Any], live: LiveTokens | None = None) -> Message:
        """One HTTP exchange; provider exceptions propagate unmapped (the caller adapts or maps them).
        `live`: where a streamed answer's text deltas go as they arrive."""
        stream = bool(kw.get("stream"))
        first = asyncio.Event()
        interval = self._beat_interval()

        async def beat_until_first_token() -> None:
            while not first.is_set():
                _heartbeat("waiting for first token" if stream else "waiting for the answer")
                with contextlib.suppress(asyncio.TimeoutError):
                    await asyncio.wait_for(first.wait(), interval)

        beater = asyncio.create_task(beat_until_first_token())
        n = 0
        try:
            client = self._client or await asyncio.to_thread(self._openai)
            if not stream:
                response = await client.chat.completions.create(**kw)
                first.set()
                return self.converter.convert_response(response)

            raw = await client.chat.completions.create(**kw)

            async def chunks() -> AsyncIterator[Any]:
                nonlocal n
                async for c in raw:
                    first.set()
                    n += 1
                    _heartbeat(n)
                    yield c

            final: Message | None = None
            async for m in self.converter.convert_streaming_response(chunks()):
                if not m.delta:
                    final = m
                elif live is not None:
                    live.add(m.text)
            assert final is not None  # the converter always ends with one consolidated message or raises
            return final
        except FleetforgeError as e:
            if e.code == Err.LLM_STREAM_INCOMPLETE and n == 0:
                raise _EmptyStream() from e
            raise
        finally:
            first.set()
            beater.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await beater

    async def _answer(self, req: ChatRequest, quirks: EndpointQuirks, max_tokens: int | None,
                      notes: list[str], live: LiveTokens | None = None) -> tuple[Message, dict[str, Any]]:
        """One answer, adapting to what the endpoint refuses (bounded: each adaptation moves one way)."""
        openai = require_openai()
        force_whole = False
        while True:
            stream = interop.should_stream(req.stream, quirks) and not force_whole
            kw = self._kwargs(req, quirks, stream=stream, max_tokens=max_tokens)
            try:
                message = await self._call(kw, live)
            except _EmptyStream:
                if force_whole:
                    raise FleetforgeError(Err.LLM_STREAM_INCOMPLETE, "the stream ended before its first chunk",
                                          retryable=True) from None
                notes.append("the stream ended before its first chunk: asked once more without streaming")
                force_whole = True
                continue
            except openai.APIStatusError as e:
                lower = interop.next_mode(quirks.structured)
                if "response_format" not in kw or lower is None or not interop.refuses_response_format(
                        e.status_code, error_message(e)):
                    raise
                notes.append(f"response_format {kw['response_format']['type']} refused ({e.status_code}: "
                             f"{error_message(e)[:200]}); this endpoint is asked with {lower.name.lower()} from now on")
                quirks.structured = lower
                continue
            if stream:
                reported = message.usage is not None
                if not reported and quirks.stream_usage is not False:
                    notes.append("the stream carried no usage: this call's tokens are unreported, later calls to "
                                 "this endpoint are not streamed")
                quirks.stream_usage = reported
            return message, kw

    async def chat(self, req: ChatRequest) -> ChatResult:
        """One provider call (usable from other activities: structured flows, agents)."""
        if self.settings.llm_provider != "openai":
            raise FleetforgeError(Err.LLM_UNAVAILABLE, "no LLM endpoint configured (provider is offline)")
        if self.settings.llm == "local" and not self.settings.llm_base_url:
            raise FleetforgeError(Err.LLM_UNAVAILABLE, "FLEETFORGE_LLM=local: the local server is started by "
                                  "`fleetforge dev`; a separate worker needs FLEETFORGE_LLM_BASE_URL")
        quirks = self.quirks(self._model(req))
        attempt = _attempt()
        started = time.monotonic()
        notes: list[str] = []
        usage: TokenUsage | None = None
        max_tokens = req.max_tokens or self.settings.llm_max_tokens
        live = LiveTokens(req.agent) if req.live and activity.in_activity() else None
        try:
            async with live or contextlib.nullcontext():
                message, kw = await self._answer(req, quirks, max_tokens, notes, live)
            usage = _add(usage, message.usage)
            # once, and only for the caller's own max_tokens: the worker's default is a budget, not a guess
            larger = interop.larger_max_tokens(req.max_tokens) if message.finish_reason == "length" else None
            if larger is not None:
                notes.append(f"the answer was cut off at max_tokens={max_tokens}: asked again with {larger}")
                max_tokens = larger
                async with live or contextlib.nullcontext():
                    message, kw = await self._answer(req, quirks, max_tokens, notes, live)
                usage = _add(usage, message.usage)
        except FleetforgeError:
            raise
        except Exception as e:
            mapped = map_openai_error(e, max_retry_after_s=self.settings.llm_max_retry_after_s)
            if mapped is e:
                raise
            raise mapped from e
        latency = time.monotonic() - started
        assert usage is not None
        message.metadata.setdefault("provider", "openai")
        unusable = interop.unusable_reason(message, max_tokens)
        ref = _transcript(self.store, agent=req.agent, provider="openai", attempt=attempt, request=dump_response(kw),
                          response=message.model_dump(mode="json"), latency_s=latency,
                          usage=usage.model_dump(), unusable=unusable, interop=notes)
        if unusable:
            message = message.model_copy(update={"content": [], "tool_calls": []})
        return ChatResult(message=message, usage=usage, latency_s=latency, transcript=ref, attempt=attempt,
                          provider="openai", unusable=unusable)

    @activity.defn(name="complete_chat")
    async def complete_chat(self, req: ChatRequest) -> ChatResult:
        return await self.chat(req)


def _add(total: TokenUsage | None, usage: TokenUsage | None) -> TokenUsage:
    """Sum the usage of this call's answers; an answer without usage makes the sum unreported."""
    part = usage if usage is not None else TokenUsage(reported=False)
    return part if total is None else total + part
