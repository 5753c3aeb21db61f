"""complete_chat against the real dev server and a scripted OpenAI-compatible HTTP server."""

from __future__ import annotations

import json
import time
import uuid
from datetime import timedelta
from pathlib import Path

import pytest
from pydantic import BaseModel
from temporalio import activity, workflow
from temporalio.client import WorkflowFailureError, WorkflowHandle
from temporalio.common import RetryPolicy
from temporalio.exceptions import ActivityError, ApplicationError, CancelledError, TimeoutError
from temporalio.workflow import ActivityCancellationType

with workflow.unsafe.imports_passed_through():
    from activities.llm.activity import LLMActivities, first_token_heartbeat_interval, record_offline_answer
    from activities.llm.interop import StructuredMode
    from activities.llm.structured import Rejected, complete_structured, usable_text
    from activities.storage import FileStore
    from contracts.common import TokenTotals
    from contracts.errors import Err, FleetforgeError
    from contracts.messages import ChatRequest, ChatResult, Message, TokenUsage, ToolCallBlock, ToolDefinition
    from contracts.settings import Settings
    from tests.doubles.openai_server import (
        Scripted, ScriptedOpenAIServer, chunk, cut_stream, empty_stream, error, json_reply, llama_cpp_json_schema_refusal,
        stream_error_event, text_stream,
    )
    from tests.helpers import assert_eventually, new_worker
    from workflows._llm import ask_structured, token_totals

_RETRY = RetryPolicy(
    initial_interval=timedelta(seconds=0.1), backoff_coefficient=1.0, maximum_attempts=4,
    non_retryable_error_types=[Err.LLM_BAD_REQUEST, Err.LLM_AUTH, Err.LLM_OUTPUT_INVALID, Err.LLM_UNAVAILABLE,
                               Err.LLM_CONTEXT_LENGTH, Err.LLM_QUOTA, Err.LLM_RATE_LIMITED],
)


class Verdict(BaseModel):
    name: str
    score: int


@workflow.defn(sandboxed=False)
class ChatTestWorkflow:
    @workflow.run
    async def run(self, req: ChatRequest) -> ChatResult:
        return await workflow.execute_activity_method(
            LLMActivities.complete_chat, req, start_to_close_timeout=timedelta(seconds=20),
            heartbeat_timeout=timedelta(seconds=10), retry_policy=_RETRY,
        )


@workflow.defn(sandboxed=False)
class VerdictTestWorkflow:
    @workflow.run
    async def run(self, req: ChatRequest) -> Verdict:
        return await workflow.execute_activity(
            "ask_verdict", req, result_type=Verdict, start_to_close_timeout=timedelta(seconds=20), retry_policy=_RETRY,
        )


@workflow.defn(sandboxed=False)
class ImpatientChatTestWorkflow:
    """One attempt, a 1 s heartbeat timeout: only a heartbeating activity survives a slow first token."""

    @workflow.run
    async def run(self, req: ChatRequest) -> ChatResult:
        return await workflow.execute_activity_method(
            LLMActivities.complete_chat, req, start_to_close_timeout=timedelta(seconds=20),
            heartbeat_timeout=timedelta(seconds=1), retry_policy=RetryPolicy(maximum_attempts=1),
        )


@workflow.defn(sandboxed=False)
class CancellableChatTestWorkflow:
    """Waits for the activity to acknowledge cancellation, so the test sees when the call really stopped."""

    @workflow.run
    async def run(self, req: ChatRequest) -> ChatResult:
        return await workflow.execute_activity_method(
            LLMActivities.complete_chat, req, start_to_close_timeout=timedelta(seconds=30),
            heartbeat_timeout=timedelta(seconds=1), retry_policy=RetryPolicy(maximum_attempts=1),
            cancellation_type=ActivityCancellationType.WAIT_CANCELLATION_COMPLETED,
        )


class VerdictWithUsage(BaseModel):
    verdict: Verdict
    tokens: TokenTotals


@workflow.defn
class AskStructuredTestWorkflow:
    """Sandboxed, as job workflows are: the repair prompt is rendered in workflow code."""

    @workflow.run
    async def run(self, req: ChatRequest) -> VerdictWithUsage:
        verdict, calls = await ask_structured(req, Verdict, queue=workflow.info().task_queue)
        return VerdictWithUsage(verdict=verdict, tokens=token_totals(calls))


def _acts(tmp_path: Path, server: ScriptedOpenAIServer, **kw) -> tuple[LLMActivities, FileStore]:
    store = FileStore(tmp_path / "artifacts")
    settings = Settings(state_dir=tmp_path / "state", llm="openai", llm_base_url=server.base_url, llm_model="test-model")
    return LLMActivities(settings, store, **kw), store


async def _run_chat(client, llm: LLMActivities, req: ChatRequest) -> ChatResult:
    return (await _run_chat_handle(client, llm, req))[0]


async def _run_chat_handle(client, llm: LLMActivities, req: ChatRequest) -> tuple[ChatResult, WorkflowHandle]:
    async with new_worker(client, workflows=[ChatTestWorkflow], activities=[llm.complete_chat]) as w:
        handle = await client.start_workflow(
            ChatTestWorkflow.run, req, id=f"llm-test/{uuid.uuid4().hex[:8]}", task_queue=w.task_queue,
        )
        return await handle.result(), handle


async def _activity_attempts(handle: WorkflowHandle) -> list[int]:
    """The final attempt number of every activity the workflow scheduled (one entry per activity)."""
    history = await handle.fetch_history()
    return [e.activity_task_started_event_attributes.attempt for e in history.events
            if e.HasField("activity_task_started_event_attributes")]


def _req(**kw) -> ChatRequest:
    return ChatRequest(messages=[Message.system("be brief"), Message.user("hi")], agent="tester", **kw)


async def test_plain_text_stream_and_transcript(temporal_env, tmp_path: Path):
    with ScriptedOpenAIServer([text_stream(["Hel", "lo"])]) as server:
        llm, store = _acts(tmp_path, server)
        result = await _run_chat(temporal_env.client, llm, _req(temperature=0.2))
    assert result.message.text == "Hello" and result.message.finish_reason == "stop"
    assert result.usage == TokenUsage(prompt=10, completion=2, total=12)
    assert result.attempt == 1 and result.provider == "openai"
    sent = server.requests[0]
    assert sent["model"] == "test-model" and sent["stream"] is True
    assert sent["stream_options"] == {"include_usage": True} and sent["temperature"] == 0.2
    assert sent["messages"] == [{"role": "system", "content": "be brief"}, {"role": "user", "content": "hi"}]
    transcript = json.loads(store.get_bytes(result.transcript))
    assert result.transcript.media_type == "application/json"
    assert transcript["agent"] == "tester" and transcript["request"]["messages"] == sent["messages"]
    assert transcript["response"]["content"] == [{"type": "text", "text": "Hello"}]


async def test_streamed_tool_calls(temporal_env, tmp_path: Path):
    tc = lambda i, **kw: {"index": i, **({"id": kw["id"], "type": "function"} if "id" in kw else {}),  # noqa: E731
                          "function": {k: v for k, v in (("name", kw.get("name")), ("arguments", kw.get("args"))) if v is not None}}
    chunks = [
        chunk({"role": "assistant", "tool_calls": [tc(0, id="call_1", name="ls", args="")]}),
        chunk({"tool_calls": [tc(1, id="call_2", name="cat", args='{"p')]}),
        chunk({"tool_calls": [tc(0, args='{"d": "."}')]}),
        chunk({"tool_calls": [tc(1, args='": "x"}')]}),
        chunk({}, "tool_calls"),
        chunk(no_choices=True, usage={"prompt_tokens": 3, "completion_tokens": 4, "total_tokens": 7}),
    ]
    tools = [ToolDefinition(name="ls", description="list"), ToolDefinition(name="cat", description="read")]
    with ScriptedOpenAIServer([Scripted("sse", chunks=chunks)]) as server:
        llm, _ = _acts(tmp_path, server)
        result = await _run_chat(temporal_env.client, llm, _req(tools=tools))
    assert result.message.tool_calls == [
        ToolCallBlock(id="call_1", name="ls", arguments='{"d": "."}'),
        ToolCallBlock(id="call_2", name="cat", arguments='{"p": "x"}'),
    ]
    assert result.message.finish_reason == "tool_calls"
    assert [t["function"]["name"] for t in server.requests[0]["tools"]] == ["ls", "cat"]


async def test_streamed_reasoning_content_and_usage_details(temporal_env, tmp_path: Path):
    """DeepSeek-style `reasoning_content` and the usage-only chunk with token details, through the real client."""
    chunks = [
        chunk({"role": "assistant", "content": "", "reasoning_content": "The user "}),
        chunk({"reasoning_content": "greets me."}),
        chunk({"content": "Hi!"}),
        chunk({}, "stop"),
        chunk(no_choices=True, usage={
            "prompt_tokens": 30, "completion_tokens": 9, "total_tokens": 39,
            "completion_tokens_details": {"reasoning_tokens": 6}, "prompt_tokens_details": {"cached_tokens": 16}}),
    ]
    with ScriptedOpenAIServer([Scripted("sse", chunks=chunks)]) as server:
        llm, store = _acts(tmp_path, server)
        result = await _run_chat(temporal_env.client, llm, _req())
    assert result.message.reasoning == "The user greets me." and result.message.text == "Hi!"
    assert result.usage == TokenUsage(prompt=30, completion=9, total=39, reasoning=6, cache_read=16)
    assert result.message.usage == result.usage
    transcript = json.loads(store.get_bytes(result.transcript))
    assert transcript["response"]["content"][0] == {"type": "reasoning", "text": "The user greets me."}


async def test_429_honours_retry_after_then_succeeds(temporal_env, tmp_path: Path):
    with ScriptedOpenAIServer([error(429, "slow down", {"retry-after": "1"}), text_stream(["ok"])]) as server:
        llm, _ = _acts(tmp_path, server)
        result, handle = await _run_chat_handle(temporal_env.client, llm, _req())
    assert result.message.text == "ok" and result.attempt == 2
    assert await _activity_attempts(handle) == [2], "the workflow sees one activity with two attempts"
    assert len(server.requests) == 2
    gap = server.received_at[1] - server.received_at[0]
    assert gap >= 0.9, f"retry-after: 1 must override the 0.1 s policy interval (retried after {gap:.2f}s)"


async def test_5xx_twice_then_succeeds(temporal_env, tmp_path: Path):
    with ScriptedOpenAIServer([error(500, "boom"), error(503, "busy"), text_stream(["fine"])]) as server:
        llm, _ = _acts(tmp_path, server)
        result = await _run_chat(temporal_env.client, llm, _req())
    assert result.message.text == "fine" and result.attempt == 3 and len(server.requests) == 3


async def test_400_is_not_retried(temporal_env, tmp_path: Path):
    with ScriptedOpenAIServer([error(400, "unknown parameter: top_k"), text_stream(["never"])]) as server:
        llm, _ = _acts(tmp_path, server)
        with pytest.raises(WorkflowFailureError) as ei:
            await _run_chat(temporal_env.client, llm, _req())
    cause = ei.value.cause
    assert isinstance(cause, ActivityError)
    app = cause.cause
    assert isinstance(app, ApplicationError)
    assert app.type == Err.LLM_BAD_REQUEST and app.non_retryable
    assert "unknown parameter: top_k" in app.message
    assert len(server.requests) == 1


async def test_401_is_auth_error(temporal_env, tmp_path: Path):
    with ScriptedOpenAIServer([error(401, "bad key")]) as server:
        llm, _ = _acts(tmp_path, server)
        with pytest.raises(WorkflowFailureError) as ei:
            await _run_chat(temporal_env.client, llm, _req())
    app = ei.value.cause.cause
    assert isinstance(app, ApplicationError) and app.type == Err.LLM_AUTH and app.non_retryable


async def test_stream_cut_midway_is_retried(temporal_env, tmp_path: Path):
    with ScriptedOpenAIServer([cut_stream(["par", "tial"]), text_stream(["complete"])]) as server:
        llm, _ = _acts(tmp_path, server)
        result = await _run_chat(temporal_env.client, llm, _req())
    assert result.message.text == "complete" and result.attempt == 2 and len(server.requests) == 2


async def test_cancellation_stops_the_stream(temporal_env, tmp_path: Path):
    parts = [f"t{i} " for i in range(40)]
    with ScriptedOpenAIServer([text_stream(parts, chunk_delay_s=0.1)]) as server:
        llm, _ = _acts(tmp_path, server)
        async with new_worker(temporal_env.client, workflows=[CancellableChatTestWorkflow],
                              activities=[llm.complete_chat]) as w:
            handle = await temporal_env.client.start_workflow(
                CancellableChatTestWorkflow.run, _req(), id=f"llm-test/{uuid.uuid4().hex[:8]}", task_queue=w.task_queue,
            )
            await assert_eventually(lambda: server.chunks_sent >= 5, timeout=10, message="stream under way")
            await handle.cancel()
            with pytest.raises(WorkflowFailureError) as ei:
                await handle.result()
            stopped_at = server.chunks_sent
    assert isinstance(ei.value.cause, CancelledError)
    assert stopped_at < len(parts), f"the activity kept reading {stopped_at} chunks after cancellation"


async def _run_verdict(client, llm: LLMActivities, req: ChatRequest) -> Verdict:
    @activity.defn(name="ask_verdict")
    async def ask_verdict(r: ChatRequest) -> Verdict:
        value, _ = await complete_structured(llm.chat, r, Verdict)
        return value

    async with new_worker(client, workflows=[VerdictTestWorkflow], activities=[ask_verdict]) as w:
        return await client.execute_workflow(
            VerdictTestWorkflow.run, req, id=f"llm-test/{uuid.uuid4().hex[:8]}", task_queue=w.task_queue,
        )


async def test_malformed_structured_output_is_repaired_once(temporal_env, tmp_path: Path):
    script = [json_reply('{"name": "a", "score": '), json_reply('```json\n{"name": "a", "score": 7}\n```')]
    with ScriptedOpenAIServer(script) as server:
        llm, _ = _acts(tmp_path, server)
        verdict = await _run_verdict(temporal_env.client, llm, _req(stream=False))
    assert verdict == Verdict(name="a", score=7)
    assert len(server.requests) == 2
    first, second = server.requests
    assert first["response_format"]["type"] == "json_schema"
    assert first["response_format"]["json_schema"]["schema"]["required"] == ["name", "score"]
    assert second["messages"][:2] == first["messages"]
    assert second["messages"][2] == {"role": "assistant", "content": '{"name": "a", "score": '}
    repair = second["messages"][3]["content"]
    assert second["messages"][3]["role"] == "user" and "invalid JSON" in repair and "ONLY one JSON object" in repair


async def test_ask_structured_in_a_workflow_repairs_once_and_sums_usage(temporal_env, tmp_path: Path):
    script = [json_reply("I think the name is a"), json_reply('{"name": "a", "score": 3}')]
    with ScriptedOpenAIServer(script) as server:
        llm, _ = _acts(tmp_path, server)
        async with new_worker(temporal_env.client, workflows=[AskStructuredTestWorkflow],
                              activities=[llm.complete_chat]) as w:
            out = await temporal_env.client.execute_workflow(
                AskStructuredTestWorkflow.run, _req(stream=False), id=f"llm-test/{uuid.uuid4().hex[:8]}",
                task_queue=w.task_queue, execution_timeout=timedelta(seconds=30),
            )
    assert out.verdict == Verdict(name="a", score=3)
    assert out.tokens.model_dump(exclude={"latency_s"}) == {"calls": 2, "prompt_tokens": 20, "completion_tokens": 10,
                                                            "total_tokens": 30, "unreported_calls": 0}
    assert out.tokens.latency_s > 0
    assert "ONLY one JSON object" in server.requests[1]["messages"][-1]["content"]


async def test_endpoint_without_json_schema_support_climbs_down_to_plain_instructions(temporal_env, tmp_path: Path):
    """Each refusal of our response_format moves the endpoint one rung down, within the same call (no failed
    step, no activity retry), and the next call starts where the last one ended."""
    script = [error(400, "response_format 'json_schema' is not supported by this model"),
              error(400, "Unrecognized request argument supplied: response_format.schema"),
              error(400, "'messages' must contain the word 'json' in some form, to use 'response_format' of type 'json_object'."),
              json_reply('{"name": "b", "score": 2}'), json_reply('{"name": "c", "score": 3}')]
    with ScriptedOpenAIServer(script) as server:
        llm, store = _acts(tmp_path, server)
        first = await _run_verdict(temporal_env.client, llm, _req(stream=False))
        later = await _run_verdict(temporal_env.client, llm, _req(stream=False))
    assert (first, later) == (Verdict(name="b", score=2), Verdict(name="c", score=3))
    assert len(server.requests) == 5, "three refusals, then plain instructions (remembered for the next call)"
    assert [r.get("response_format") for r in server.requests[:3]] == [
        {"type": "json_schema", "json_schema": {"name": "tester", "schema": Verdict.model_json_schema()}},
        {"type": "json_object", "schema": Verdict.model_json_schema()},
        {"type": "json_object"},
    ]
    for sent in server.requests[1:]:
        instruction = sent["messages"][0]
        assert instruction["role"] == "system" and "ONLY one JSON object" in instruction["content"]
        assert json.loads(instruction["content"].split("\n")[1])["required"] == ["name", "score"]
        assert sent["messages"][1:] == server.requests[0]["messages"]
    for sent in server.requests[3:]:
        assert "response_format" not in sent
    assert llm.quirks("test-model").structured is StructuredMode.PLAIN


async def test_llama_cpp_500_on_json_schema_is_answered_with_json_object_and_its_schema(temporal_env, tmp_path: Path):
    """llama-cpp-python's server refuses json_schema with HTTP 500 (a pydantic literal error): that is not a
    server fault to retry but a refused response_format; its json_object + schema rung is a grammar."""
    schema = Verdict.model_json_schema()
    script = [llama_cpp_json_schema_refusal(), json_reply('{"name": "d", "score": 4}'), json_reply('{"name": "e", "score": 5}')]
    with ScriptedOpenAIServer(script) as server:
        llm, store = _acts(tmp_path, server)
        result = await _run_chat(temporal_env.client, llm, _req(stream=False, response_schema=schema))
        again = await _run_chat(temporal_env.client, llm, _req(stream=False, response_schema=schema))
    assert (result.message.text, again.message.text) == ('{"name": "d", "score": 4}', '{"name": "e", "score": 5}')
    assert result.attempt == 1 and len(server.requests) == 3, "adapted inside the first call; the second starts there"
    assert [r["response_format"]["type"] for r in server.requests] == ["json_schema", "json_object", "json_object"]
    assert server.requests[2]["response_format"]["schema"] == schema
    transcript = json.loads(store.get_bytes(result.transcript))
    assert transcript["request"]["response_format"] == {"type": "json_object", "schema": schema}
    assert "response_format json_schema refused (500" in transcript["interop"][0]
    assert result.usage == TokenUsage(prompt=10, completion=5, total=15), "the refused request cost nothing"


async def test_a_500_that_is_not_about_response_format_is_still_retried(temporal_env, tmp_path: Path):
    schema = Verdict.model_json_schema()
    with ScriptedOpenAIServer([error(500, "CUDA out of memory"), json_reply('{"name": "f", "score": 6}')]) as server:
        llm, _ = _acts(tmp_path, server)
        result = await _run_chat(temporal_env.client, llm, _req(stream=False, response_schema=schema))
    assert result.attempt == 2 and [r["response_format"]["type"] for r in server.requests] == ["json_schema"] * 2
    assert llm.quirks("test-model").structured is StructuredMode.JSON_SCHEMA


async def test_structured_output_invalid_twice_fails_typed(temporal_env, tmp_path: Path):
    script = [json_reply("no idea"), json_reply('{"name": "a", "score": "high"}'), json_reply('{"name": "a", "score": 1}')]
    with ScriptedOpenAIServer(script) as server:
        llm, _ = _acts(tmp_path, server)
        with pytest.raises(WorkflowFailureError) as ei:
            await _run_verdict(temporal_env.client, llm, _req(stream=False))
    app = ei.value.cause.cause
    assert isinstance(app, ApplicationError) and app.type == Err.LLM_OUTPUT_INVALID and app.non_retryable
    assert "score" in app.message
    assert len(server.requests) == 2, "one ask plus one repair, then a typed failure (no activity retry)"


async def _run_impatient(client, llm: LLMActivities) -> ChatResult:
    async with new_worker(client, workflows=[ImpatientChatTestWorkflow], activities=[llm.complete_chat]) as w:
        return await client.execute_workflow(
            ImpatientChatTestWorkflow.run, _req(), id=f"llm-test/{uuid.uuid4().hex[:8]}", task_queue=w.task_queue,
        )


async def test_heartbeats_while_waiting_for_first_token(temporal_env, tmp_path: Path):
    with ScriptedOpenAIServer([text_stream(["late"], delay_s=2.0)]) as server:
        llm, _ = _acts(tmp_path, server, first_token_heartbeat_s=0.2)
        result = await _run_impatient(temporal_env.client, llm)
    assert result.message.text == "late" and result.attempt == 1


def test_first_token_heartbeat_interval_follows_the_heartbeat_timeout() -> None:
    assert first_token_heartbeat_interval(timedelta(seconds=2)) == 0.5
    assert first_token_heartbeat_interval(timedelta(seconds=30)) == 5.0
    assert first_token_heartbeat_interval(None) == 5.0


async def test_default_first_token_heartbeats_follow_a_short_heartbeat_timeout(temporal_env, tmp_path: Path):
    """No explicit interval (as worker.py builds it): a 1 s heartbeat timeout still survives a 2 s first token."""
    with ScriptedOpenAIServer([text_stream(["late"], delay_s=2.0)]) as server:
        llm, _ = _acts(tmp_path, server)
        result = await _run_impatient(temporal_env.client, llm)
    assert result.message.text == "late" and result.attempt == 1


async def test_without_first_token_heartbeats_the_call_times_out(temporal_env, tmp_path: Path):
    """Control for the test above: the same slow server, heartbeats too rare -> heartbeat timeout."""
    with ScriptedOpenAIServer([text_stream(["late"], delay_s=2.0)]) as server:
        llm, _ = _acts(tmp_path, server, first_token_heartbeat_s=30)
        with pytest.raises(WorkflowFailureError) as ei:
            await _run_impatient(temporal_env.client, llm)
    assert isinstance(ei.value.cause, ActivityError)
    assert isinstance(ei.value.cause.cause, TimeoutError)


async def test_offline_provider_refuses_and_offline_answers_are_recorded(tmp_path: Path):
    store = FileStore(tmp_path / "artifacts")
    llm = LLMActivities(Settings(state_dir=tmp_path / "state"), store)
    with pytest.raises(FleetforgeError) as ei:
        await llm.chat(_req())
    assert ei.value.code == Err.LLM_UNAVAILABLE and not ei.value.retryable

    result = record_offline_answer(store, "planner", _req(), '{"plan": []}')
    assert result.provider == "offline" and result.usage == TokenUsage() and result.message.text == '{"plan": []}'
    transcript = json.loads(store.get_bytes(result.transcript))
    assert set(transcript) == {"agent", "provider", "attempt", "latency_s", "request", "response"}
    assert transcript["agent"] == "planner" and transcript["response"]["content"][0]["text"] == '{"plan": []}'


# -- what real servers do that a plain double did not: usage, finish_reason, error events, retry-after --

def _app_error(ei: pytest.ExceptionInfo[WorkflowFailureError]) -> ApplicationError:
    cause = ei.value.cause
    assert isinstance(cause, ActivityError), cause
    assert isinstance(cause.cause, ApplicationError), cause.cause
    return cause.cause


async def test_a_stream_without_usage_is_marked_unreported_and_the_endpoint_is_then_asked_unstreamed(
        temporal_env, tmp_path: Path):
    script = [text_stream(["Hel", "lo"], with_usage=False),
              json_reply("again", usage={"prompt_tokens": 21, "completion_tokens": 2, "total_tokens": 23})]
    with ScriptedOpenAIServer(script) as server:
        llm, store = _acts(tmp_path, server)
        first = await _run_chat(temporal_env.client, llm, _req())
        second = await _run_chat(temporal_env.client, llm, _req())
    assert first.message.text == "Hello" and not first.usage_reported
    assert first.usage == TokenUsage(reported=False), "zero because unknown, and it says so"
    assert server.requests[0]["stream"] is True and "stream" not in server.requests[1]
    assert second.usage_reported and second.usage == TokenUsage(prompt=21, completion=2, total=23)
    totals = token_totals([first, second])
    assert (totals.calls, totals.prompt_tokens, totals.unreported_calls) == (2, 21, 1)
    notes = json.loads(store.get_bytes(first.transcript))["interop"]
    assert notes == ["the stream carried no usage: this call's tokens are unreported, later calls to this endpoint "
                     "are not streamed"]


async def test_a_stream_ending_before_its_first_chunk_is_asked_once_unstreamed_in_the_same_call(
        temporal_env, tmp_path: Path):
    """llama.cpp answers a streamed request whose prompt overflows its context with 200 and an empty
    stream; the unstreamed request gets the real answer (here: the context-length error, typed)."""
    too_long = error(400, "This model's maximum context length is 4096 tokens. However, you requested 5036 tokens",
                     code="context_length_exceeded")
    with ScriptedOpenAIServer([empty_stream(), too_long, text_stream(["never"])]) as server:
        llm, _ = _acts(tmp_path, server)
        with pytest.raises(WorkflowFailureError) as ei:
            await _run_chat(temporal_env.client, llm, _req())
    app = _app_error(ei)
    assert app.type == Err.LLM_CONTEXT_LENGTH and app.non_retryable and "maximum context length" in app.message
    assert [r.get("stream", False) for r in server.requests] == [True, False], "no Temporal retry after that"

    with ScriptedOpenAIServer([empty_stream(), json_reply("fine")]) as server:
        llm, _ = _acts(tmp_path, server)
        result = await _run_chat(temporal_env.client, llm, _req())
    assert result.message.text == "fine" and result.attempt == 1 and result.usage_reported


async def test_finish_reason_length_asks_again_with_twice_max_tokens(temporal_env, tmp_path: Path):
    script = [json_reply('{"name": "a", "sc', finish_reason="length",
                         usage={"prompt_tokens": 30, "completion_tokens": 8, "total_tokens": 38}),
              json_reply('{"name": "a", "score": 1}', usage={"prompt_tokens": 30, "completion_tokens": 12, "total_tokens": 42})]
    with ScriptedOpenAIServer(script) as server:
        llm, _ = _acts(tmp_path, server)
        result = await _run_chat(temporal_env.client, llm, _req(stream=False, max_tokens=8))
    assert [r["max_tokens"] for r in server.requests] == [8, 16]
    assert result.message.text == '{"name": "a", "score": 1}' and not result.unusable
    assert result.usage == TokenUsage(prompt=60, completion=20, total=80), "both answers were paid for"


async def test_an_answer_still_cut_off_is_unusable_never_complete(temporal_env, tmp_path: Path):
    cut = lambda text: json_reply(text, finish_reason="length")  # noqa: E731
    with ScriptedOpenAIServer([cut("docker run --net"), cut("docker run --network host -e PO")]) as server:
        llm, store = _acts(tmp_path, server)
        result = await _run_chat(temporal_env.client, llm, _req(stream=False, max_tokens=6))
    assert [r["max_tokens"] for r in server.requests] == [6, 12], "asked again once, not doubled to the ceiling"
    assert result.unusable == "the answer was cut off at max_tokens=12 (finish_reason=length)"
    assert result.message.text == "" and result.message.finish_reason == "length"
    assert usable_text(result) == Rejected(result.unusable)
    assert result.usage == TokenUsage(prompt=20, completion=10, total=30)
    transcript = json.loads(store.get_bytes(result.transcript))
    assert transcript["response"]["content"] == [{"type": "text", "text": "docker run --network host -e PO"}], \
        "the raw answer stays in the transcript"

    with ScriptedOpenAIServer([text_stream(["def kernel(x):", "  return"], finish_reason="length")]) as server:
        llm, _ = _acts(tmp_path, server)
        streamed = await _run_chat(temporal_env.client, llm, _req())
    assert len(server.requests) == 1, "no max_tokens: the server's limit cut it, more room is not ours to give"
    assert streamed.unusable.startswith("the answer was cut off at the server's limit") and streamed.message.text == ""


async def test_content_filter_and_refusal_are_recorded_as_such(temporal_env, tmp_path: Path):
    refusal = Scripted("sse", chunks=[chunk({"refusal": "I can't help with that."}), chunk({}, "stop"),
                                      chunk(no_choices=True, usage={"prompt_tokens": 5, "completion_tokens": 6, "total_tokens": 11})])
    with ScriptedOpenAIServer([json_reply("partial", finish_reason="content_filter"), refusal]) as server:
        llm, _ = _acts(tmp_path, server)
        filtered = await _run_chat(temporal_env.client, llm, _req(stream=False))
        refused = await _run_chat(temporal_env.client, llm, _req())
    assert filtered.message.finish_reason == "content_filter" and filtered.message.metadata["refusal"] == "content_filter"
    assert filtered.unusable.startswith("the provider's content filter stopped the answer") and filtered.message.text == ""
    assert refused.message.finish_reason == "refusal" and refused.unusable == "the model refused: I can't help with that."
    assert refused.usage == TokenUsage(prompt=5, completion=6, total=11)


async def test_structured_answer_cut_off_is_repaired_with_the_reason(temporal_env, tmp_path: Path):
    script = [json_reply('{"name": "a", ', finish_reason="length"), json_reply('{"name": "a", "score": 2}')]
    with ScriptedOpenAIServer(script) as server:
        llm, _ = _acts(tmp_path, server)
        verdict = await _run_verdict(temporal_env.client, llm, _req(stream=False))
    assert verdict == Verdict(name="a", score=2)
    repair = server.requests[1]["messages"][-1]["content"]
    assert "cut off at the server's limit" in repair and server.requests[1]["messages"][-2]["content"] == "(empty)"


@pytest.mark.parametrize(("code", "message", "err"), [
    ("context_length_exceeded", "This model's maximum context length is 8192 tokens", Err.LLM_CONTEXT_LENGTH),
    ("insufficient_quota", "You exceeded your current quota", Err.LLM_QUOTA),
])
async def test_in_stream_error_events_that_asking_again_cannot_fix_are_not_retried(
        temporal_env, tmp_path: Path, code: str, message: str, err: Err):
    with ScriptedOpenAIServer([stream_error_event(["par"], code=code, message=message), text_stream(["never"])]) as server:
        llm, _ = _acts(tmp_path, server)
        with pytest.raises(WorkflowFailureError) as ei:
            await _run_chat(temporal_env.client, llm, _req())
    app = _app_error(ei)
    assert app.type == err and app.non_retryable and message in app.message and "stream error event" in app.message
    assert len(server.requests) == 1


async def test_an_in_stream_server_error_event_is_retried(temporal_env, tmp_path: Path):
    script = [stream_error_event(["par"], code="server_error", message="The server had an error"), text_stream(["ok"])]
    with ScriptedOpenAIServer(script) as server:
        llm, _ = _acts(tmp_path, server)
        result = await _run_chat(temporal_env.client, llm, _req())
    assert result.message.text == "ok" and result.attempt == 2 and len(server.requests) == 2


async def test_429_insufficient_quota_is_not_retried_like_a_rate_limit(temporal_env, tmp_path: Path):
    quota = error(429, "You exceeded your current quota, please check your plan and billing details.",
                  {"retry-after": "1"}, code="insufficient_quota", type="insufficient_quota")
    with ScriptedOpenAIServer([quota, text_stream(["never"])]) as server:
        llm, _ = _acts(tmp_path, server)
        with pytest.raises(WorkflowFailureError) as ei:
            await _run_chat(temporal_env.client, llm, _req())
    app = _app_error(ei)
    assert app.type == Err.LLM_QUOTA and app.non_retryable and len(server.requests) == 1


async def test_context_length_400_is_typed_and_not_retried(temporal_env, tmp_path: Path):
    too_long = error(400, "This model's maximum context length is 4096 tokens. However, you requested 5036 tokens "
                          "(5031 in the messages, 5 in the completion).", code="context_length_exceeded")
    with ScriptedOpenAIServer([too_long, text_stream(["never"])]) as server:
        llm, _ = _acts(tmp_path, server)
        with pytest.raises(WorkflowFailureError) as ei:
            await _run_chat(temporal_env.client, llm, _req(stream=False))
    assert _app_error(ei).type == Err.LLM_CONTEXT_LENGTH and len(server.requests) == 1


@pytest.mark.parametrize("form", ["ms", "http-date"])
async def test_retry_after_as_ms_or_http_date_is_honoured(temporal_env, tmp_path: Path, form: str):
    from email.utils import formatdate

    headers = {"retry-after-ms": "1200"} if form == "ms" else {"retry-after": formatdate(time.time() + 2.5, usegmt=True)}
    with ScriptedOpenAIServer([error(429, "slow down", headers, code="rate_limit_exceeded"), text_stream(["ok"])]) as server:
        llm, _ = _acts(tmp_path, server)
        result = await _run_chat(temporal_env.client, llm, _req())
    assert result.message.text == "ok" and result.attempt == 2
    gap = server.received_at[1] - server.received_at[0]
    assert gap >= 1.0, f"the retry came {gap:.2f}s later, before the server's retry-after ({form})"


async def test_retry_after_beyond_the_cap_fails_the_call_with_a_clear_message(temporal_env, tmp_path: Path):
    with ScriptedOpenAIServer([error(429, "slow down", {"retry-after": "3600"}), text_stream(["never"])]) as server:
        store = FileStore(tmp_path / "artifacts")
        settings = Settings(state_dir=tmp_path / "state", llm="openai", llm_base_url=server.base_url,
                            llm_model="test-model", llm_max_retry_after_s=120)
        with pytest.raises(WorkflowFailureError) as ei:
            await _run_chat(temporal_env.client, LLMActivities(settings, store), _req())
    app = _app_error(ei)
    assert app.type == Err.LLM_RATE_LIMITED and app.non_retryable and len(server.requests) == 1
    assert "retry after 3600 s" in app.message and "FLEETFORGE_LLM_MAX_RETRY_AFTER_S=120" in app.message


async def test_local_provider_without_a_started_server_says_what_to_do(tmp_path: Path):
    llm = LLMActivities(Settings(state_dir=tmp_path / "state", llm="local"), FileStore(tmp_path / "artifacts"))
    with pytest.raises(FleetforgeError) as ei:
        await llm.chat(_req())
    assert ei.value.code == Err.LLM_UNAVAILABLE and "fleetforge dev" in ei.value.message


async def test_the_workers_max_tokens_is_a_budget_for_requests_without_one(temporal_env, tmp_path: Path):
    with ScriptedOpenAIServer([json_reply("ramble " * 10, finish_reason="length"), json_reply("short")]) as server:
        store = FileStore(tmp_path / "artifacts")
        settings = Settings(state_dir=tmp_path / "state", llm="openai", llm_base_url=server.base_url,
                            llm_model="test-model", llm_max_tokens=64)
        llm = LLMActivities(settings, store)
        rambled = await _run_chat(temporal_env.client, llm, _req(stream=False))
        own = await _run_chat(temporal_env.client, llm, _req(stream=False, max_tokens=10))
    assert [r["max_tokens"] for r in server.requests] == [64, 10], "the budget, not retried; the caller's own wins"
    assert rambled.unusable == "the answer was cut off at max_tokens=64 (finish_reason=length)"
    assert own.message.text == "short"
