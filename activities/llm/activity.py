"""The chat activity: one provider call, normalised into a ChatResult with a stored transcript.

`AsyncOpenAI(max_retries=0)`: Temporal owns retries. Provider errors become ApplicationErrors with
stable types (408/409/429/5xx and connection errors retryable, honouring retry-after; 401/403 and
other 4xx not). Heartbeats while waiting for the first token and on every streamed chunk.
An endpoint that rejects `response_format` json_schema is asked again with the schema as plain
instructions (and this worker keeps doing so).
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
from temporalio.exceptions import ApplicationError

from activities.llm.converters import OpenAIConverter, dump_response, require_openai, to_openai_messages
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


def retry_after(headers: Any) -> timedelta | None:
    """The server's requested back-off: `retry-after-ms`, else `retry-after` (seconds)."""
    if headers is None:
        return None
    for name, scale in (("retry-after-ms", 0.001), ("retry-after", 1.0)):
        raw = headers.get(name)
        if raw is None:
            continue
        try:
            seconds = float(raw) * scale
        except ValueError:
            continue  # an HTTP date: let the retry policy decide
        if 0 <= seconds <= 600:
            return timedelta(seconds=seconds)
    return None


def map_openai_error(e: Exception) -> Exception:
    """A provider exception as an ApplicationError with a stable type (or the exception unchanged)."""
    openai = require_openai()
    if isinstance(e, openai.APIStatusError):
        status = e.status_code
        message = f"LLM endpoint answered {status}: {e.message}"
        if status in (408, 409, 429) or status >= 500:
            return ApplicationError(
                message, type=Err.LLM_RETRYABLE, non_retryable=False, next_retry_delay=retry_after(e.response.headers)
            )
        if status in (401, 403):
            return ApplicationError(message, type=Err.LLM_AUTH, non_retryable=True)
        return ApplicationError(message, type=Err.LLM_BAD_REQUEST, non_retryable=True)
    if isinstance(e, (openai.APIConnectionError, openai.APIError)):
        return ApplicationError(f"LLM endpoint unreachable: {e}", type=Err.LLM_RETRYABLE, non_retryable=False)
    try:
        import httpx
    except ImportError:  # pragma: no cover
        return e
    if isinstance(e, httpx.TransportError):
        return ApplicationError(f"LLM stream broken: {e!r}", type=Err.LLM_RETRYABLE, non_retryable=False)
    return e


def rejects_response_format(error: ApplicationError, kw: dict[str, Any]) -> bool:
    """The endpoint refused our `response_format` (no json_schema support): worth asking again with plain
    instructions, unlike any other 400."""
    return "response_format" in kw and error.type == Err.LLM_BAD_REQUEST and "response_format" in error.message


def with_plain_json_instructions(kw: dict[str, Any]) -> dict[str, Any]:
    """The same request without `response_format`: the schema goes into a leading system instruction."""
    schema = json.dumps(kw["response_format"]["json_schema"]["schema"], sort_keys=True)
    instruction = {"role": "system", "content": render("json_instructions.j2", schema=schema)}
    plain = {k: v for k, v in kw.items() if k != "response_format"}
    return {**plain, "messages": [instruction, *kw["messages"]]}


def _transcript(store: ArtifactStore, *, agent: str, provider: str, attempt: int, request: dict[str, Any],
                response: dict[str, Any], latency_s: float) -> ArtifactRef:
    doc = {"agent": agent, "provider": provider, "attempt": attempt, "latency_s": round(latency_s, 3),
           "request": request, "response": response}
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
        self._json_schema_supported = True
        """Cleared the first time the endpoint rejects response_format; later calls use plain instructions."""

    def _openai(self) -> Any:
        """The shared client, created on first use (importing `openai` takes a second or more: it runs in a
        thread, so the event loop keeps heartbeating meanwhile)."""
        with self._client_lock:
            if self._client is None:
                openai = require_openai()
                key = self.settings.llm_api_key.get_secret_value() if self.settings.llm_api_key else "unused"
                self._client = openai.AsyncOpenAI(max_retries=0, base_url=self.settings.llm_base_url, api_key=key)
            return self._client

    def _beat_interval(self) -> float:
        if self.first_token_heartbeat_s is not None:
            return self.first_token_heartbeat_s
        return first_token_heartbeat_interval(activity.info().heartbeat_timeout if activity.in_activity() else None)

    def _kwargs(self, req: ChatRequest) -> dict[str, Any]:
        kw: dict[str, Any] = {"model": req.model or self.settings.llm_model, "messages": to_openai_messages(req.messages)}
        if req.tools:
            kw["tools"] = [
                {"type": "function", "function": {"name": t.name, "description": t.description, "parameters": t.parameters}}
                for t in req.tools
            ]
        if req.temperature is not None:
            kw["temperature"] = req.temperature
        if req.max_tokens is not None:
            kw["max_tokens"] = req.max_tokens
        if req.response_schema is not None:
            kw["response_format"] = {
                "type": "json_schema",
                "json_schema": {"name": req.agent.replace("-", "_") or "answer", "schema": req.response_schema},
            }
        if req.response_schema is not None and not self._json_schema_supported:
            kw = with_plain_json_instructions(kw)
        if req.stream:
            kw["stream"] = True
            kw["stream_options"] = {"include_usage": True}
        return kw

    async def _call(self, kw: dict[str, Any], stream: bool) -> Message:
        first = asyncio.Event()
        interval = self._beat_interval()

        async def beat_until_first_token() -> None:
            while not first.is_set():
                _heartbeat("waiting for first token")
                with contextlib.suppress(asyncio.TimeoutError):
                    await asyncio.wait_for(first.wait(), interval)

        beater = asyncio.create_task(beat_until_first_token())
        try:
            client = self._client or await asyncio.to_thread(self._openai)
            if not stream:
                response = await client.chat.completions.create(**kw)
                first.set()
                return self.converter.convert_response(response)

            raw = await client.chat.completions.create(**kw)

            async def chunks() -> AsyncIterator[Any]:
                n = 0
                async for c in raw:
                    first.set()
                    n += 1
                    _heartbeat(n)
                    yield c

            final: Message | None = None
            async for m in self.converter.convert_streaming_response(chunks()):
                if not m.delta:
                    final = m
            assert final is not None  # the converter always ends with one consolidated message or raises
            return final
        except FleetforgeError:
            raise
        except Exception as e:
            mapped = map_openai_error(e)
            if mapped is e:
                raise
            raise mapped from e
        finally:
            first.set()
            beater.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await beater

    async def chat(self, req: ChatRequest) -> ChatResult:
        """One provider call (usable from other activities: structured flows, agents)."""
        if self.settings.llm_provider != "openai":
            raise FleetforgeError(Err.LLM_UNAVAILABLE, "no LLM endpoint configured (provider is offline)")
        kw = self._kwargs(req)
        attempt = _attempt()
        started = time.monotonic()
        try:
            message = await self._call(kw, req.stream)
        except ApplicationError as e:
            if not rejects_response_format(e, kw):
                raise
            self._json_schema_supported = False
            kw = with_plain_json_instructions(kw)
            message = await self._call(kw, req.stream)
        latency = time.monotonic() - started
        usage = message.usage or TokenUsage()
        message.metadata.setdefault("provider", "openai")
        ref = _transcript(self.store, agent=req.agent, provider="openai", attempt=attempt, request=dump_response(kw),
                          response=message.model_dump(mode="json"), latency_s=latency)
        return ChatResult(message=message, usage=usage, latency_s=latency, transcript=ref, attempt=attempt,
                          provider="openai")

    @activity.defn(name="complete_chat")
    async def complete_chat(self, req: ChatRequest) -> ChatResult:
        return await self.chat(req)
