"""FleetforgeClient against the real dev server: start, wait, list by kind/status, cancel."""

from __future__ import annotations

import contextlib
import re
import uuid
from collections.abc import AsyncIterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
from temporalio.client import WorkflowExecutionStatus

from activities.storage import open_store
from client.sdk import CANCELLED, FleetforgeClient, JobCancelled, JobFailed, JobNotFound
from contracts.common import JobKind, JobStatus
from contracts.errors import Err
from contracts.inspect import InspectRequest, InspectResult
from contracts.settings import Settings
from examples.tiny_model import build_tiny_cnn
from tests.helpers import assert_eventually
from worker import QUEUE_KINDS, build_registry, build_workers, running_workers


@pytest.fixture
def settings(tmp_path: Path) -> Settings:
    return Settings(state_dir=tmp_path / "state", queue_prefix=f"sdk-{uuid.uuid4().hex[:8]}")


@pytest.fixture
async def ff(temporal_env, settings: Settings) -> FleetforgeClient:
    return FleetforgeClient(temporal_env.client, settings)


@contextlib.asynccontextmanager
async def workers(temporal_env, settings: Settings) -> AsyncIterator[None]:
    """Every worker of the deployment on the settings' queues (what `fleetforge worker` runs)."""
    with ThreadPoolExecutor(max_workers=32) as executor:
        ws = build_workers(temporal_env.client, build_registry(settings, open_store(settings)), settings.queues,
                           QUEUE_KINDS, executor)
        async with running_workers(ws):
            yield


@pytest.fixture
async def workers_running(temporal_env, settings: Settings) -> AsyncIterator[None]:
    async with workers(temporal_env, settings):
        yield


async def listed(ff: FleetforgeClient, workflow_id: str, **filters: object) -> bool:
    return workflow_id in {j.workflow_id for j in await ff.list_jobs(**filters)}  # type: ignore[arg-type]


async def test_start_inspect_completes_and_is_listed_by_kind_and_status(ff, workers_running, tmp_path: Path):
    model = build_tiny_cnn(tmp_path / "tiny.onnx")

    handle = await ff.start_inspect(InspectRequest(model=str(model)))
    result = await handle.result()

    assert isinstance(result, InspectResult)
    assert result.status is JobStatus.COMPLETED, result.failure
    assert re.fullmatch(r"inspect/\d{8}-\d{6}-[0-9a-f]{4}", handle.id)
    assert handle.id == f"inspect/{result.run_id}"
    assert {a.name for a in result.artifacts} == {"input/tiny.onnx", "metadata.json"}
    assert await handle.status() == JobStatus.COMPLETED
    await assert_eventually(lambda: listed(ff, handle.id, kind=JobKind.INSPECT, status=JobStatus.COMPLETED))
    assert not await listed(ff, handle.id, kind=JobKind.INSPECT, status=JobStatus.FAILED)
    again = await ff.handle(handle.id).result()
    assert again == result


async def test_failed_job_raises_job_failed_carrying_its_result_and_the_execution_failed(ff, workers_running, tmp_path: Path):
    handle = await ff.start_inspect(InspectRequest(model=str(tmp_path / "missing.onnx")))
    with pytest.raises(JobFailed) as failed:
        await handle.result()

    result = failed.value.result
    assert isinstance(result, InspectResult) and result.status is JobStatus.FAILED
    assert result.failure is not None and result.failure.code == Err.MODEL_NOT_FOUND
    assert failed.value.code == Err.MODEL_NOT_FOUND
    assert await handle.outcome() == result  # the CLI's view: the contract either way
    assert await handle.status() == JobStatus.FAILED
    desc = await ff.temporal.get_workflow_handle(handle.id).describe()
    assert desc.status is WorkflowExecutionStatus.FAILED  # Temporal sees what the verdict says
    await assert_eventually(lambda: listed(ff, handle.id, kind=JobKind.INSPECT, status=JobStatus.FAILED))


async def test_cancel_pending_job_raises_job_cancelled(ff, temporal_env, settings, tmp_path: Path):
    # no worker polls these queues yet: the job stays RUNNING until cancelled
    handle = await ff.start_inspect(InspectRequest(model=str(tmp_path / "whatever.onnx")))
    assert await handle.status() == JobStatus.RUNNING
    await assert_eventually(lambda: listed(ff, handle.id, status=JobStatus.RUNNING))

    await ff.cancel(handle.id)

    with pytest.raises(JobCancelled) as err:  # the workflow sees the request on its first task
        async with workers(temporal_env, settings):
            await handle.result()
    assert err.value.code is Err.JOB_CANCELLED
    assert await handle.status() == CANCELLED
    await assert_eventually(lambda: listed(ff, handle.id, status=CANCELLED))
    assert not await listed(ff, handle.id, status=JobStatus.RUNNING)


async def test_unknown_job_raises_job_not_found(ff):
    with pytest.raises(JobNotFound) as err:
        await ff.handle(f"inspect/{uuid.uuid4().hex[:8]}").status()
    assert err.value.code is Err.JOB_NOT_FOUND
    with pytest.raises(JobNotFound):
        ff.handle("no-such-kind/123")


async def test_convert_needs_input_answer_rejects_bad_soc_then_completes(ff, workers_running, tmp_path: Path):
    from contracts.convert_job import ConversionRequest, ConversionResult
    from contracts.errors import FleetforgeError

    model = build_tiny_cnn(tmp_path / "tiny.onnx")
    handle = await ff.start_convert(ConversionRequest(model=str(model)))
    assert handle.result_type is ConversionResult

    async def waiting() -> bool:
        progress = await handle.progress()
        return progress is not None and progress.status is JobStatus.NEEDS_INPUT

    await assert_eventually(waiting, timeout=30)
    await assert_eventually(lambda: _listed_needs_input(ff, handle.id), timeout=10)

    with pytest.raises(FleetforgeError) as bad:
        await ff.answer(handle.id, soc="sm9999", precision="int8")
    assert bad.value.code == Err.BAD_INPUT and "sm9999" in bad.value.message

    await ff.answer(handle.id, soc="sm8550", precision="int8")
    result = await handle.result()
    assert result.status is JobStatus.COMPLETED, result.failure
    assert result.artifacts and result.evaluation is not None


async def _listed_needs_input(ff: FleetforgeClient, workflow_id: str) -> bool:
    return await listed(ff, workflow_id, kind=JobKind.CONVERT, status=JobStatus.NEEDS_INPUT)


async def test_answer_to_a_non_convert_job_is_bad_input(ff):
    from contracts.errors import FleetforgeError

    with pytest.raises(FleetforgeError) as e:
        await ff.answer("kernel/nope-0000", soc="sm8550")
    assert e.value.code == Err.BAD_INPUT
