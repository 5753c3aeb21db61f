"""Acceptance: a 5 MiB activity result passes through external storage when the store is S3
(no PayloadsTooLarge, history stays small), including a 5 MiB streamed LLM answer."""

from __future__ import annotations

import uuid
from datetime import timedelta
from pathlib import Path

from pydantic import BaseModel
from temporalio import activity, workflow
from temporalio.client import Client
from temporalio.testing import WorkflowEnvironment
from temporalio.worker import UnsandboxedWorkflowRunner

from activities.connection import EXTERNAL_THRESHOLD, data_converter
from activities.llm.activity import LLMActivities
from activities.storage import S3Store
from contracts.messages import ChatRequest, ChatResult, Message
from contracts.settings import Settings
from tests.doubles.openai_server import ScriptedOpenAIServer, text_stream
from tests.helpers import new_worker
from workflows._llm import ask

SIZE = 5 * 1024 * 1024


class BigResult(BaseModel):
    text: str


def _big_text() -> str:
    line = "fleetforge external storage payload line 0123456789abcdef\n"
    return (line * (SIZE // len(line) + 1))[:SIZE]


@activity.defn
async def make_big_result() -> BigResult:
    return BigResult(text=_big_text())


@workflow.defn(sandboxed=False)
class BigResultWorkflow:
    @workflow.run
    async def run(self) -> BigResult:
        return await workflow.execute_activity(
            make_big_result, start_to_close_timeout=timedelta(seconds=60), result_type=BigResult,
        )


@workflow.defn(sandboxed=False)
class BigAnswerWorkflow:
    @workflow.run
    async def run(self, req: ChatRequest) -> ChatResult:
        return await ask(req, queue=workflow.info().task_queue, summary="a 5 MiB answer")


def _bucket_objects(store: S3Store) -> list[dict]:
    resp = store.client.list_objects_v2(Bucket=store.bucket)
    return list(resp.get("Contents", []))


async def test_big_activity_result_goes_through_s3(temporal_env: WorkflowEnvironment, s3_store: S3Store) -> None:
    client = await _s3_client(temporal_env, s3_store)
    assert client.data_converter.external_storage is not None
    assert _bucket_objects(s3_store) == []

    async with new_worker(
        client, workflows=[BigResultWorkflow], activities=[make_big_result], workflow_runner=UnsandboxedWorkflowRunner(),
    ) as worker:
        handle = await client.start_workflow(
            BigResultWorkflow.run, id=f"ext-{uuid.uuid4().hex[:8]}", task_queue=worker.task_queue,
            execution_timeout=timedelta(seconds=60),
        )
        result = await handle.result()

    assert result == BigResult(text=_big_text())

    history = await handle.fetch_history()
    size = sum(e.ByteSize() for e in history.events)
    assert size < 100 * 1024, f"history is {size} bytes; large payloads should live in S3"
    assert len(history.to_json()) < 100 * 1024

    objects = _bucket_objects(s3_store)
    big = [o for o in objects if o["Size"] > EXTERNAL_THRESHOLD]
    assert big, f"no large object in bucket {s3_store.bucket}: {objects}"
    assert max(o["Size"] for o in big) >= SIZE


async def _s3_client(temporal_env: WorkflowEnvironment, store: S3Store) -> Client:
    target = temporal_env.client.service_client.config.target_host
    return await Client.connect(target, namespace=temporal_env.client.namespace, data_converter=data_converter(store))


async def test_5mib_llm_answer_keeps_history_small(
    temporal_env: WorkflowEnvironment, s3_store: S3Store, tmp_path: Path,
) -> None:
    client = await _s3_client(temporal_env, s3_store)
    text = _big_text()
    parts = [text[i:i + 64 * 1024] for i in range(0, len(text), 64 * 1024)]
    with ScriptedOpenAIServer([text_stream(parts)]) as server:
        settings = Settings(state_dir=tmp_path / "state", llm="openai", llm_base_url=server.base_url, llm_model="big")
        llm = LLMActivities(settings, s3_store)
        async with new_worker(client, workflows=[BigAnswerWorkflow], activities=[llm.complete_chat],
                              workflow_runner=UnsandboxedWorkflowRunner()) as worker:
            handle = await client.start_workflow(
                BigAnswerWorkflow.run, ChatRequest(messages=[Message.user("write a lot")], agent="big"),
                id=f"ext-llm-{uuid.uuid4().hex[:8]}", task_queue=worker.task_queue, execution_timeout=timedelta(seconds=60),
            )
            result = await handle.result()

    assert len(result.message.text) == SIZE and result.message.text == text
    assert result.attempt == 1 and result.usage.completion == len(parts)

    history = await handle.fetch_history()
    size = sum(e.ByteSize() for e in history.events)
    assert size < 100 * 1024, f"history is {size} bytes for a {SIZE}-byte answer; it should live in S3"
    assert any(e.HasField("activity_task_completed_event_attributes") for e in history.events)
    big = [o for o in _bucket_objects(s3_store) if o["Size"] >= SIZE]
    assert len(big) >= 2, "the activity result and the workflow result (plus the transcript) are stored in S3"
    assert s3_store.get_bytes(result.transcript).count(b"fleetforge external storage payload line") > 1000


def test_file_store_gets_plain_converter(file_store: object) -> None:
    from temporalio.contrib.pydantic import pydantic_data_converter

    assert data_converter(file_store) is pydantic_data_converter  # type: ignore[arg-type]
    assert data_converter(None) is pydantic_data_converter
