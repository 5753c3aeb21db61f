"""InspectModelWorkflow against the real dev server and both stores."""

from __future__ import annotations

import uuid
from pathlib import Path

from temporalio.client import Client

from activities.experiments import RunStore
from activities.storage import ArtifactStore
from contracts.common import JobKind, JobStatus
from contracts.errors import Err
from contracts.inspect import InspectRequest, InspectResult
from contracts.settings import Settings
from examples.tiny_model import build_tiny_cnn
from tests.helpers import fresh_queues, job_outcome, new_worker
from worker import build_registry
from workflows._visibility import start_attributes
from workflows.inspect import InspectModelWorkflow


async def run_inspect(client: Client, settings: Settings, store: ArtifactStore, model: str) -> InspectResult:
    queues = fresh_queues()
    reg = build_registry(settings, store)
    async with new_worker(client, workflows=[InspectModelWorkflow], activities=reg.by_kind["toolchain"], task_queue=queues.workflows):
        return await job_outcome(
            client, InspectModelWorkflow.run, InspectRequest(model=model, queues=queues, run_id=uuid.uuid4().hex[:8]),
            result_type=InspectResult,
            id=f"inspect/{uuid.uuid4().hex[:8]}", task_queue=queues.workflows,
            search_attributes=start_attributes(JobKind.INSPECT, model),
        )


async def test_inspect_records_run_workspace_and_artifacts(temporal_env, store, tmp_path: Path):
    settings = Settings(state_dir=tmp_path / "state")
    model = build_tiny_cnn(tmp_path / "hub" / "tiny.onnx")
    before = model.read_bytes()

    result = await run_inspect(temporal_env.client, settings, store, str(model))

    assert result.status is JobStatus.COMPLETED, result.failure
    assert result.model is not None and result.model.onnx is not None
    assert [t.name for t in result.model.onnx.inputs] == ["input"]
    assert result.model.onnx.inputs[0].shape == [1, 3, 32, 32]
    assert {a.name for a in result.artifacts} == {"input/tiny.onnx", "metadata.json"}
    record = RunStore(store).get(result.run_id)
    assert record.status is JobStatus.COMPLETED and record.kind is JobKind.INSPECT
    assert sorted(a.name for a in record.artifacts) == ["input/tiny.onnx", "metadata.json"]
    assert model.read_bytes() == before, "the hub must stay read-only"
    assert sorted(p.name for p in model.parent.iterdir()) == ["tiny.onnx"]


async def test_inspect_missing_model_fails_with_code(temporal_env, file_store, tmp_path: Path):
    settings = Settings(state_dir=tmp_path / "state")
    result = await run_inspect(temporal_env.client, settings, file_store, str(tmp_path / "nope.onnx"))
    assert result.status is JobStatus.FAILED
    assert result.failure is not None and result.failure.code == Err.MODEL_NOT_FOUND
    assert result.failure.where == "resolve"
    assert "does not exist" in result.failure.message


async def test_inspect_corrupt_onnx_fails_as_model_invalid(temporal_env, file_store, tmp_path: Path):
    bad = tmp_path / "bad.onnx"
    bad.write_bytes(b"\x08\x07garbage-not-a-model" * 10)
    result = await run_inspect(temporal_env.client, Settings(state_dir=tmp_path / "s"), file_store, str(bad))
    assert result.failure is not None and result.failure.code == Err.MODEL_INVALID
