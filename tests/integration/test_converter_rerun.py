"""Rerun with modifications: the earlier run's plan.json with overrides, no planner."""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path

import pytest

from activities.storage import FileStore
from contracts.common import JobKind, JobStatus
from contracts.convert import Precision
from contracts.convert_job import ConversionRequest, ConversionResult
from contracts.settings import Settings
from examples.tiny_model import build_tiny_cnn
from tests.helpers import fresh_queues, new_worker, outcome_of
from worker import build_registry
from workflows._visibility import start_attributes
from workflows.converter import ConverterWorkflow

pytest.importorskip("onnxruntime_qnn")


PLANNERS = {"offline_planner_answer", "complete_chat"}
Run = Callable[..., Awaitable[tuple[ConversionResult, list[str]]]]


@pytest.fixture
async def converter(temporal_env, tmp_path: Path) -> AsyncIterator[Run]:
    """`await run(**request fields)` → (result, scheduled activity types), on a worker of its own."""
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
        result = await outcome_of(handle, ConversionResult)
        kinds = [ev.activity_task_scheduled_event_attributes.activity_type.name
                 async for ev in handle.fetch_history_events() if ev.HasField("activity_task_scheduled_event_attributes")]
        return result, kinds

    async with new_worker(client, workflows=[ConverterWorkflow], activities=reg.by_kind["toolchain"], task_queue=queues.workflows):
        yield run


async def test_rerun_reuses_the_plan_with_overrides_and_skips_the_planner(converter: Run):
    run = converter
    first, _ = await run(target_soc="sm8550", precision=Precision.FP16)
    rerun, kinds = await run(rerun_of=first.run_id, overrides={"soc": "sm8650"})
    bad, _ = await run(rerun_of=first.run_id, overrides={"turbo": "true"})

    assert first.status is JobStatus.COMPLETED, first.failure
    assert rerun.status is JobStatus.COMPLETED, rerun.failure
    assert not PLANNERS & set(kinds) and "load_plan" in kinds, kinds
    assert rerun.executed_steps == ["context_binary"], "a different SoC is a different step: not a cache hit"
    # every output is named for what it is: the SM8650 binary is not called ..._sm8550_...
    report = {"report/conversion_report.md", "report/conversion_report.json"}
    assert {a.name for a in first.artifacts} == {"converted/tiny_fp16_sm8550_ctx.onnx", "converted/tiny_fp16_sm8550_ctx_qnn.bin"} | report
    assert {a.name for a in rerun.artifacts} == {"converted/tiny_fp16_sm8650_ctx.onnx", "converted/tiny_fp16_sm8650_ctx_qnn.bin"} | report
    assert {a.sha256 for a in rerun.artifacts}.isdisjoint({a.sha256 for a in first.artifacts})
    assert rerun.evaluation is not None and rerun.evaluation.cosine > 0.999
    assert rerun.evaluation.candidate == "converted/tiny_fp16_sm8650_ctx.onnx"
    assert rerun.accuracy is not None and rerun.accuracy.verdict == "passed"
    assert bad.status is JobStatus.FAILED and bad.failure is not None and bad.failure.code == "BAD_INPUT"
    assert "turbo" in bad.failure.message and "soc" in bad.failure.message


async def test_rerun_of_an_int8_run_at_fp16_drops_the_quantizer_and_compiles_fp16(converter: Run):
    run = converter
    first, _ = await run(target_soc="sm8550", precision=Precision.INT8, preset="fast", synthetic_calibration=True)
    rerun, kinds = await run(rerun_of=first.run_id, overrides={"precision": "fp16"})
    fresh, _ = await run(target_soc="sm8550", precision=Precision.FP16, preset="fast")

    assert first.status is JobStatus.COMPLETED and first.executed_steps == ["quantize", "context_binary"], first.failure
    assert rerun.status is JobStatus.COMPLETED, rerun.failure
    assert not PLANNERS & set(kinds) and "load_plan" in kinds and rerun.tokens.calls == 0, kinds
    assert rerun.executed_steps == ["context_binary"] and rerun.cached_steps == [], "the quantizer did not run"
    assert not any("synthetic" in w for w in rerun.warnings), rerun.warnings
    # the fp16 binary: exactly the step a fresh fp16 conversion runs (same tool, params, input: a cache hit)
    assert "converted/tiny_fp16_sm8550_ctx_qnn.bin" in {a.name for a in rerun.artifacts}
    assert fresh.status is JobStatus.COMPLETED and fresh.cached_steps == ["context_binary"] and fresh.executed_steps == []
    assert {a.sha256 for a in fresh.artifacts if a.name.startswith("converted/")} == \
        {a.sha256 for a in rerun.artifacts if a.name.startswith("converted/")}
    assert rerun.evaluation is not None and rerun.evaluation.candidate == "converted/tiny_fp16_sm8550_ctx.onnx"
    assert rerun.evaluation.cosine > first.evaluation.cosine, "fp16 is closer to fp32 than int8"
