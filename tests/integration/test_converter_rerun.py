"""Rerun with modifications: the earlier run's plan.json with overrides, no planner."""

from __future__ import annotations

import uuid
from pathlib import Path

import pytest

from activities.storage import FileStore
from contracts.common import JobKind, JobStatus
from contracts.convert import Precision
from contracts.convert_job import ConversionRequest, ConversionResult
from contracts.settings import Settings
from examples.tiny_model import build_tiny_cnn
from tests.helpers import fresh_queues, new_worker
from worker import build_registry
from workflows._visibility import start_attributes
from workflows.converter import ConverterWorkflow

pytest.importorskip("onnxruntime_qnn")


async def test_rerun_reuses_the_plan_with_overrides_and_skips_the_planner(temporal_env, tmp_path: Path):
    settings, store = Settings(state_dir=tmp_path / "state"), FileStore(tmp_path / "artifacts")
    model = build_tiny_cnn(tmp_path / "hub" / "tiny.onnx")
    queues = fresh_queues()
    reg = build_registry(settings, store)
    client = temporal_env.client

    async def run(**kw: object) -> tuple[ConversionResult, list[str]]:
        req = ConversionRequest(model=str(model), queues=queues, run_id=uuid.uuid4().hex[:8], **kw)
        handle = await client.start_workflow(ConverterWorkflow.run, req, id=f"convert/{uuid.uuid4().hex[:8]}",
                                             task_queue=queues.workflows,
                                             search_attributes=start_attributes(JobKind.CONVERT, req.model, ""))
        result = await handle.result()
        kinds = [ev.activity_task_scheduled_event_attributes.activity_type.name
                 async for ev in handle.fetch_history_events() if ev.HasField("activity_task_scheduled_event_attributes")]
        return result, kinds

    async with new_worker(client, workflows=[ConverterWorkflow], activities=reg.by_kind["toolchain"], task_queue=queues.workflows):
        first, _ = await run(target_soc="sm8550", precision=Precision.FP16)
        rerun, kinds = await run(rerun_of=first.run_id, overrides={"soc": "sm8650"})
        bad, _ = await run(rerun_of=first.run_id, overrides={"turbo": "true"})

    assert first.status is JobStatus.COMPLETED, first.failure
    assert rerun.status is JobStatus.COMPLETED, rerun.failure
    assert "plan_offline" not in kinds and "load_plan" in kinds, kinds
    assert rerun.executed_steps == ["context_binary"], "a different SoC is a different step: not a cache hit"
    # the file name came from the earlier plan; the binary inside is compiled for the overridden SoC
    assert {a.name for a in rerun.artifacts} == {a.name for a in first.artifacts}
    bins = {a.name: a.sha256 for a in rerun.artifacts if a.name.endswith("_qnn.bin")}
    assert bins and bins != {a.name: a.sha256 for a in first.artifacts if a.name.endswith("_qnn.bin")}
    assert rerun.evaluation is not None and rerun.evaluation.cosine > 0.999
    assert bad.status is JobStatus.FAILED and bad.failure is not None and bad.failure.code == "BAD_INPUT"
    assert "turbo" in bad.failure.message and "soc" in bad.failure.message
