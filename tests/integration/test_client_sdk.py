"""FleetforgeClient against the real dev server: start, wait, list by kind/status, cancel, answer,
resolve every id the tool prints, download outputs."""

from __future__ import annotations

import contextlib
import re
import uuid
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from temporalio.client import WorkflowExecutionStatus

from activities.storage import open_store
import os
import stat

from activities.storage import sha256_file
from client.sdk import CANCELLED, FleetforgeClient, JobCancelled, JobFailed, JobFinished, JobNotFound
from contracts.common import JobKind, JobStatus
from contracts.errors import Err, FleetforgeError
from contracts.inspect import InspectRequest, InspectResult
from contracts.settings import Settings
from examples.tiny_model import build_tiny_cnn
from tests.helpers import SELF_TESTS, assert_eventually
from worker import QUEUE_KINDS, activity_executor, build_registry, build_workers, running_workers


@pytest.fixture
def settings(tmp_path: Path) -> Settings:
    return Settings(state_dir=tmp_path / "state", queue_prefix=f"sdk-{uuid.uuid4().hex[:8]}")


@pytest.fixture
async def ff(temporal_env, settings: Settings) -> FleetforgeClient:
    return FleetforgeClient(temporal_env.client, settings, open_store(settings))


@contextlib.asynccontextmanager
async def workers(temporal_env, settings: Settings) -> AsyncIterator[None]:
    """Every worker of the deployment on the settings' queues (what `fleetforge worker` runs)."""
    with activity_executor() as executor:
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
    with pytest.raises(FleetforgeError) as bad:
        ff.handle("no-such-kind/123")
    assert bad.value.code is Err.BAD_INPUT and "KIND/RUN_ID" in bad.value.message
    with pytest.raises(JobNotFound):
        await ff.job("00000000-000000-dead")  # a bare run id of no job


async def test_convert_needs_input_answer_rejects_bad_soc_then_completes(ff, workers_running, tmp_path: Path):
    from contracts.convert_job import ConversionRequest, ConversionResult

    model = build_tiny_cnn(tmp_path / "tiny.onnx")
    handle = await ff.start_convert(ConversionRequest(model=str(model)))
    assert handle.result_type is ConversionResult

    async def waiting() -> bool:
        progress = await handle.progress()
        return progress is not None and progress.status is JobStatus.NEEDS_INPUT

    await assert_eventually(waiting, timeout=30)
    await assert_eventually(lambda: _listed_needs_input(ff, handle.id), timeout=30)

    with pytest.raises(FleetforgeError) as bad:
        await ff.answer(handle.id, soc="sm9999", precision="int8")
    assert bad.value.code == Err.BAD_INPUT and "sm9999" in bad.value.message

    await ff.answer(handle.id, soc="sm8550", precision="int8", synthetic_calibration="yes")
    result = await handle.result()
    assert result.status is JobStatus.COMPLETED, result.failure
    assert result.artifacts and result.evaluation is not None


async def _listed_needs_input(ff: FleetforgeClient, workflow_id: str) -> bool:
    return await listed(ff, workflow_id, kind=JobKind.CONVERT, status=JobStatus.NEEDS_INPUT)


async def test_answer_to_a_non_convert_job_is_bad_input(ff):
    with pytest.raises(FleetforgeError) as e:
        await ff.answer("kernel/nope-0000", soc="sm8550")
    assert e.value.code == Err.BAD_INPUT


async def _waiting_for_input(handle) -> bool:
    progress = await handle.progress()
    return progress is not None and progress.status is JobStatus.NEEDS_INPUT


async def test_a_cancelled_waiting_job_is_cancelled_everywhere_and_no_longer_waiting(ff, workers_running, tmp_path: Path):
    from workflows._visibility import STATUS

    handle = await ff.start_convert(str(build_tiny_cnn(tmp_path / "tiny.onnx")))  # no SoC/precision: it asks
    await assert_eventually(lambda: _waiting_for_input(handle), timeout=30)
    await assert_eventually(lambda: _listed_needs_input(ff, handle.id), timeout=30)

    await (await ff.job(handle.id.split("/", 1)[1])).cancel()  # the bare run id names it
    with pytest.raises(JobCancelled):
        await handle.result()

    desc = await ff.temporal.get_workflow_handle(handle.id).describe()
    assert desc.status is WorkflowExecutionStatus.CANCELED
    assert desc.typed_search_attributes.get(STATUS) == CANCELLED
    assert await handle.status() == CANCELLED
    await assert_eventually(lambda: listed(ff, handle.id, status=CANCELLED))
    assert not await _listed_needs_input(ff, handle.id)
    with pytest.raises(JobFinished) as again:
        await handle.cancel()
    assert again.value.code is Err.JOB_FINISHED and "CANCELLED" in again.value.message
    with pytest.raises(JobFinished) as answered:
        await ff.answer(handle.id, soc="sm8550", precision="int8")
    assert "finished" in answered.value.message


async def test_typed_convert_helper_downloads_the_outputs_under_their_names(ff, workers_running, tmp_path: Path):
    from workflows._visibility import TARGET

    handle = await ff.start_convert(str(build_tiny_cnn(tmp_path / "tiny.onnx")), soc="sm8550", precision="fp16")
    result = await handle.result()
    assert result.status is JobStatus.COMPLETED, result.failure
    attrs = (await ff.temporal.get_workflow_handle(handle.id).describe()).typed_search_attributes
    assert attrs.get(TARGET) == "SM8550"  # one spelling, whatever the caller typed

    paths = await handle.download(tmp_path / "out")
    by_name = {a.name: a for a in result.artifacts}
    assert sorted(str(p.relative_to(tmp_path / "out")) for p in paths) == sorted(by_name)
    umask = os.umask(0)
    os.umask(umask)
    for path in paths:
        ref = by_name[str(path.relative_to(tmp_path / "out"))]
        assert sha256_file(path) == ref.sha256 and path.stat().st_size == ref.size
        assert stat.S_IMODE(path.stat().st_mode) == 0o666 & ~umask, "outputs get normal permissions"
    with pytest.raises(JobFinished):
        await handle.cancel()


async def test_a_failing_kernel_job_raises_job_failed_carrying_its_result(ff, workers_running):
    from contracts.kernel_job import KernelResult

    task = Path(__file__).resolve().parents[2] / "examples" / "kernels" / "relu.py"
    handle = await ff.start_kernel(task, max_step=1)  # one step cannot verify anything
    with pytest.raises(JobFailed) as failed:
        await handle.result()
    assert isinstance(failed.value.result, KernelResult) and failed.value.result.status is JobStatus.FAILED
    assert failed.value.code == failed.value.result.failure.code
    desc = await ff.temporal.get_workflow_handle(handle.id).describe()
    assert desc.status is WorkflowExecutionStatus.FAILED
    await assert_eventually(lambda: listed(ff, handle.id, kind=JobKind.KERNEL, status=JobStatus.FAILED))


async def test_fleet_rows_are_listed_by_how_they_ended_without_a_status_attribute(ff, workers_running):
    """A row carries no FleetforgeStatus (one visibility write fewer per row of thousands): `list --rows
    --status` and a row's status come from its execution status."""
    from workflows._visibility import STATUS

    csv = "model_name,status,note,command\nok,,,\"python -c \"\"print(1)\"\"\"\nbad,,,\"python -c \"\"raise SystemExit(3)\"\"\"\n"
    handle = await ff.start_fleet_test(csv, **SELF_TESTS, concurrency=2, max_attempts=1)
    with pytest.raises(JobFailed):
        await handle.result()
    fleet_id = handle.id.split("/", 1)[1]
    ok, bad = f"fleet/{fleet_id}/0", f"fleet/{fleet_id}/1"
    for row in (ok, bad):
        assert (await ff.temporal.get_workflow_handle(row).describe()).typed_search_attributes.get(STATUS) is None
    assert await (await ff.job(ok)).status() == JobStatus.COMPLETED
    assert await (await ff.job(bad)).status() == JobStatus.FAILED

    async def by_status() -> bool:
        completed = {j.workflow_id for j in await ff.list_jobs(status=JobStatus.COMPLETED, limit=200, rows=True)}
        failed = {j.workflow_id for j in await ff.list_jobs(status=JobStatus.FAILED, limit=200, rows=True)}
        running = {j.workflow_id for j in await ff.list_jobs(status=JobStatus.RUNNING, limit=200, rows=True)}
        return (ok in completed and bad not in completed and bad in failed and ok not in failed
                and handle.id in failed and not {ok, bad} & running)

    await assert_eventually(by_status, timeout=20, message="rows are not listed by how they ended")


async def test_a_fleet_is_one_job_in_the_list_across_continue_as_new_and_its_rows_are_reachable(ff, workers_running):
    csv = "model_name,status,note,command\n" + "".join(f"m{i},,,\"python -c \"\"print({i})\"\"\"\n" for i in range(3))
    handle = await ff.start_fleet_test(csv, **SELF_TESTS, concurrency=1, continue_every=1)
    result = await handle.result()
    assert result.runs >= 3, "the fleet must have continued as new for this test to mean anything"

    async def one_line() -> bool:
        jobs = [j for j in await ff.list_jobs(kind=JobKind.FLEET_TEST, limit=200) if j.workflow_id == handle.id]
        return len(jobs) == 1 and jobs[0].status == JobStatus.COMPLETED

    await assert_eventually(one_line, timeout=20)
    assert all(j.kind != JobKind.MODEL_TEST.value for j in await ff.list_jobs(limit=200))
    fleet_id = handle.id.split("/", 1)[1]
    rows = [j.workflow_id for j in await ff.list_jobs(limit=200, rows=True) if j.workflow_id.startswith(f"fleet/{fleet_id}/")]
    assert sorted(rows) == [f"fleet/{fleet_id}/{i}" for i in range(3)]

    row = await ff.job(f"fleet/{fleet_id}/1")
    assert row.id == f"fleet/{fleet_id}/1" and await row.status() == JobStatus.COMPLETED
    assert (await row.outcome()).passed
    assert (await ff.job(f"fleet/{fleet_id}")).id == handle.id
    assert "fleet%2F" in await row.ui_url()
