"""FleetTestWorkflow / ModelTestWorkflow against the real dev server, with the real process runner.

The injection test's docker runner is a recording double (tests/doubles): it proves a rejected
command never reaches a runner. The real docker engine is exercised in test_fleet_docker.py and
test_runners.py.
"""

from __future__ import annotations

import csv
import io
import time
import uuid
from collections.abc import Sequence
from pathlib import Path

import pytest
from temporalio.api.enums.v1 import EventType
from temporalio.client import Client, WorkflowUpdateFailedError
from temporalio.service import RPCError

from activities.containers.activities import ContainerActivities, collect_verdicts, upload_manifest
from activities.storage import ArtifactStore
from client.ids import candidates, kind_of
from contracts.common import JobKind, JobStatus
from contracts.fleet import ErrorCategory, HardwareProfile, RowStatus
from contracts.fleet_job import (
    ApprovalRequest, FleetCarry, FleetProgress, FleetTestRequest, FleetTestResult, ModelTestRequest, ModelTestResult, RunnerKind,
)
from contracts.settings import Settings
from tests.doubles.recording_runner import RecordingRunner
from tests.helpers import SELF_TESTS, assert_eventually, fresh_queues, job_outcome, new_worker, outcome_of
from workflows._visibility import MODEL, STATUS, start_attributes
from workflows.fleet import FleetTestWorkflow, ModelTestWorkflow

PASS = 'python -c "print(\'server ready\')"'
FAIL = 'python -c "raise SystemExit(3)"'
OOM = 'python -c "raise SystemExit(\'torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB\')"'
GATED = 'python -c "raise SystemExit(\'GatedRepoError: Cannot access gated repo for url\')"'
SECOND_TIME = 'python -c "raise SystemExit(max(0, 2 - {attempt}))"'


def manifest(rows: Sequence[tuple[str, str, str]], extra: str = "owner") -> str:
    """CSV with an extra column first (it must survive), then model_name,status,note,command."""
    buf = io.StringIO()
    w = csv.writer(buf, lineterminator="\n")
    w.writerow([extra, "model_name", "status", "note", "command"])
    for i, (model, status, command) in enumerate(rows):
        w.writerow([f"team-{i % 3}", model, status, "", command])
    return buf.getvalue()


def read_csv(store: ArtifactStore, result: FleetTestResult) -> list[dict[str, str]]:
    assert result.csv is not None
    return list(csv.DictReader(io.StringIO(store.get_bytes(result.csv).decode())))


async def run_fleet(client: Client, store: ArtifactStore, settings: Settings, csv_text: str, *,
                    acts: ContainerActivities | None = None, wid: str = "",
                    **kw) -> tuple[FleetTestResult, FleetProgress, str]:
    queues = fresh_queues()
    acts = acts or ContainerActivities(store, settings)
    async with new_worker(client, workflows=[FleetTestWorkflow, ModelTestWorkflow], activities=acts.all(),
                          task_queue=queues.workflows, max_concurrent_activities=16):
        ref = upload_manifest(store, csv_text)
        wid = wid or f"fleet/{uuid.uuid4().hex[:8]}"
        handle = await client.start_workflow(
            FleetTestWorkflow.run, FleetTestRequest(manifest=ref, queues=queues, **{**SELF_TESTS, **kw}),
            id=wid, task_queue=queues.workflows, search_attributes=start_attributes(JobKind.FLEET_TEST))
        result = await outcome_of(handle, FleetTestResult)
        progress = await handle.query(FleetTestWorkflow.progress)
    return result, progress, wid


async def test_process_fleet_records_every_row_once_with_status_and_note(temporal_env, file_store, tmp_path: Path):
    rows = []
    for i in range(20):
        kind = ["pass", "fail", "oom", "gated", "retry"][i % 5]
        command = {"pass": PASS, "fail": FAIL, "oom": OOM, "gated": GATED, "retry": SECOND_TIME}[kind]
        rows.append((f"org/{kind}-{i}", "", command))
    rows.append(("org/already-tested", "Yes", FAIL))
    text = manifest(rows)

    result, progress, wid = await run_fleet(temporal_env.client, file_store, Settings(state_dir=tmp_path / "s"), text,
                                            concurrency=6, max_attempts=3)

    assert result.status is JobStatus.FAILED and result.failure is not None and result.failure.code == "ROWS_FAILED"
    assert "12 of 20 tested rows did not pass (8 No: the model failed; 4 Error" in result.failure.message
    assert "; AUTH 4, CRASHED 4, CUDA_OOM 4; the CSV's notes say why" in result.failure.message, result.failure.message
    assert (result.total, result.skipped, result.passed, result.failed, result.errors) == (21, 1, 8, 8, 4)
    assert result.categories == {"PASSED": 8, "CRASHED": 4, "CUDA_OOM": 4, "AUTH": 4}
    out = read_csv(file_store, result)
    assert [r["model_name"] for r in out] == [r[0] for r in rows], "every row exactly once, in order"
    assert [r["owner"] for r in out] == [f"team-{i % 3}" for i in range(21)], "other columns kept"
    by_kind = {}
    for r in out[:20]:
        by_kind.setdefault(r["model_name"].split("/")[1].split("-")[0], set()).add((r["status"], r["note"].split(":")[0]))
    assert by_kind["pass"] == {("Yes", "passed (attempt 1)")}
    assert by_kind["retry"] == {("Yes", "passed (attempt 2)")}
    assert by_kind["fail"] == {("No", "CRASHED")}
    assert by_kind["oom"] == {("No", "CUDA_OOM")}
    assert by_kind["gated"] == {("Error", "AUTH")}, "missing credentials: we could not test it, the next run retries"
    gated_note = next(r["note"] for r in out if "gated" in r["model_name"])
    assert gated_note.startswith("AUTH: gated model: set HF_TOKEN (with access) for the containers worker, restart it, "
                                 "then rerun fleetforge fleet-test on this CSV"), "a person reads what to do"
    assert out[20]["status"] == "Yes" and out[20]["note"] == "", "a tested row is not touched"
    assert (progress.done, progress.passed, progress.failed, progress.errors, progress.running) == (20, 8, 8, 4, 0)
    rows_in_store = collect_verdicts(file_store, wid.removeprefix("fleet/"))
    assert sorted(rows_in_store) == list(range(20)), "every finished row's verdict is in the store"
    assert rows_in_store[3].row_status is RowStatus.ERROR and rows_in_store[0].fingerprint
    await _replays(temporal_env.client, [wid, f"{wid}/4"])  # the parent and a child that retried


async def test_a_fleet_started_directly_without_a_fleet_id_names_its_rows_as_the_tool_expects(temporal_env, file_store,
                                                                                                tmp_path: Path):
    """A Temporal user's own start (id `fleet-test/X`, no fleet id, continuing as new): the fleet id is
    X, so its rows are `fleet/X/N`, ids every command takes (before, they were `fleet/fleet-test/X/N`)."""
    run = f"direct-{uuid.uuid4().hex[:6]}"
    text = manifest([(f"org/ok-{i}", "", PASS) for i in range(3)])
    result, progress, wid = await run_fleet(temporal_env.client, file_store, Settings(state_dir=tmp_path / "s"), text,
                                            wid=f"fleet-test/{run}", concurrency=1, continue_every=2)

    assert (result.status, result.fleet_id, result.passed, progress.runs) == (JobStatus.COMPLETED, run, 3, 2)
    rows = [f"fleet/{run}/{i}" for i in range(3)]
    assert [candidates(r) for r in rows] == [[r] for r in rows] and {kind_of(r) for r in rows} == {JobKind.MODEL_TEST}
    for row in rows:
        assert (await temporal_env.client.get_workflow_handle(row).describe()).status.name == "COMPLETED"
    assert sorted(collect_verdicts(file_store, run)) == [0, 1, 2]
    first_run = (await temporal_env.client.get_workflow_handle(wid).describe()).raw_description \
        .workflow_execution_info.first_run_id
    await _replays(temporal_env.client, [wid], run_id=first_run)  # the run that took the patch
    await _replays(temporal_env.client, [wid])  # the continuation, which carries the fleet id


async def _replays(client: Client, workflow_ids: Sequence[str], run_id: str | None = None) -> None:
    """The recorded histories replay without nondeterminism against the current code."""
    from temporalio.contrib.pydantic import pydantic_data_converter
    from temporalio.worker import Replayer

    replayer = Replayer(workflows=[FleetTestWorkflow, ModelTestWorkflow], data_converter=pydantic_data_converter)
    for wid in workflow_ids:
        history = await client.get_workflow_handle(wid, run_id=run_id).fetch_history()
        await replayer.replay_workflow(history)


async def test_model_test_retries_with_history_and_reports_attempts(temporal_env, file_store, tmp_path: Path):
    queues = fresh_queues()
    acts = ContainerActivities(file_store, Settings(state_dir=tmp_path / "s"))
    ref = upload_manifest(file_store, manifest([("org/oom", "", OOM), ("org/gated", "", GATED)]))
    async with new_worker(temporal_env.client, workflows=[ModelTestWorkflow], activities=acts.all(), task_queue=queues.workflows):
        oom = await job_outcome(
            temporal_env.client, ModelTestWorkflow.run, result_type=ModelTestResult,
            request=ModelTestRequest(fleet_id="t", manifest=ref, row=0, **SELF_TESTS, max_attempts=3, queues=queues),
            id=f"fleet/t/{uuid.uuid4().hex[:6]}", task_queue=queues.workflows)
        gated = await job_outcome(
            temporal_env.client, ModelTestWorkflow.run, result_type=ModelTestResult,
            request=ModelTestRequest(fleet_id="t", manifest=ref, row=1, **SELF_TESTS, max_attempts=3, queues=queues),
            id=f"fleet/t/{uuid.uuid4().hex[:6]}", task_queue=queues.workflows)
    assert not oom.passed and oom.model_name == "org/oom"
    assert [a.category for a in oom.attempts] == [ErrorCategory.CUDA_OOM] * 3, "retried up to max_attempts"
    assert all(a.log is not None and file_store.exists(a.log) for a in oom.attempts), "full logs are stored"
    assert [a.category for a in gated.attempts] == [ErrorCategory.AUTH], "a HUMAN remedy is not retried"
    assert gated.category == "AUTH" and "gated" in gated.reason


INJECTIONS = [
    "docker run --privileged vllm/vllm-openai:latest",
    "docker run -v /:/host vllm/vllm-openai:latest",
    "docker run --pid=host vllm/vllm-openai:latest",
    "docker run vllm/vllm-openai:latest; rm -rf /",
    "docker run vllm/vllm-openai:latest && curl http://127.0.0.1:1/x",
    "docker run -e X=$(cat /etc/passwd) vllm/vllm-openai:latest",
    "docker run -e X=`id` vllm/vllm-openai:latest",
]


async def test_injected_commands_are_rejected_and_never_reach_the_runner(temporal_env, file_store, tmp_path: Path):
    ok = "docker run --network host vllm/vllm-openai:latest --model org/ok --port {port}"
    rows = [(f"org/bad-{i}", "", cmd) for i, cmd in enumerate(INJECTIONS)] + [("org/ok", "", ok)]
    recorder = RecordingRunner()
    acts = ContainerActivities(file_store, Settings(state_dir=tmp_path / "s"), runners={RunnerKind.DOCKER: recorder})

    result, _, _ = await run_fleet(temporal_env.client, file_store, Settings(state_dir=tmp_path / "s"),
                                   manifest(rows), acts=acts, runner=RunnerKind.DOCKER, concurrency=4)

    assert len(recorder.calls) == 1 and recorder.calls[0].startswith("docker run --network host"), recorder.calls
    assert int(recorder.calls[0].rsplit(" ", 1)[1]) in range(8000, 8004), "the row's {port} is its slot's (concurrency 4)"
    out = read_csv(file_store, result)
    assert [r["status"] for r in out] == ["Error"] * len(INJECTIONS) + ["Yes"], "a refused command is not the model's failure"
    assert all(r["note"].startswith("POLICY_REJECTED: command rejected:") for r in out[:-1]), [r["note"] for r in out]
    assert "--privileged" in out[0]["note"] and "`;`" in out[3]["note"] and "`$(`" in out[5]["note"]
    assert result.categories == {"PASSED": 1, "POLICY_REJECTED": len(INJECTIONS)}


async def test_process_runner_refuses_shell_operators_and_unlisted_programs(temporal_env, file_store, tmp_path: Path):
    quoted = 'python -c "import sys; print(sys.argv[1:])" "two words" --port={port}'
    rows = [("org/a", "", 'python -c "print(1)"; rm -rf /tmp/x'), ("org/b", "", "bash -c id"),
            ("org/c", "", PASS), ("org/d", "", quoted)]
    result, _, _ = await run_fleet(temporal_env.client, file_store, Settings(state_dir=tmp_path / "s"), manifest(rows))
    out = read_csv(file_store, result)
    assert [r["status"] for r in out] == ["Error", "Error", "Yes", "Yes"]
    assert "`;` outside quotes" in out[0]["note"] and "program 'bash' is not allowed" in out[1]["note"]
    row = await temporal_env.client.get_workflow_handle(f"fleet/{result.fleet_id}/3", result_type=ModelTestResult).result()
    log = file_store.get_bytes(row.attempts[0].log).decode()
    assert "['two words', '--port=800" in log and log.startswith("['two words'"), "a quoted argument is one argument, `;` inside quotes is text"


async def test_approval_is_a_durable_wait_with_a_validated_update(temporal_env, file_store, tmp_path: Path):
    queues = fresh_queues()
    acts = ContainerActivities(file_store, Settings(state_dir=tmp_path / "s"))
    ref = upload_manifest(file_store, manifest([("org/needs-ok", "", 'python -c "print({attempt})"')]))
    client = temporal_env.client
    async with new_worker(client, workflows=[ModelTestWorkflow], activities=acts.all(), task_queue=queues.workflows):
        handle = await client.start_workflow(
            ModelTestWorkflow.run, ModelTestRequest(fleet_id="appr", manifest=ref, row=0, **SELF_TESTS,
                                                    require_approval=True, queues=queues),
            id=f"fleet/appr/{uuid.uuid4().hex[:6]}", task_queue=queues.workflows,
            search_attributes=start_attributes(JobKind.MODEL_TEST))

        async def awaiting(attempt: int) -> bool:
            desc = await handle.describe()
            return (desc.typed_search_attributes.get(STATUS) == JobStatus.AWAITING_APPROVAL.value
                    and await handle.query(ModelTestWorkflow.pending_command) == f'python -c "print({attempt})"')

        await assert_eventually(lambda: awaiting(1), message="attempt 1 awaiting approval")
        with pytest.raises(WorkflowUpdateFailedError):
            await handle.execute_update(ModelTestWorkflow.approve_command, ApprovalRequest(attempt=2, approved=True))
        assert await handle.execute_update(
            ModelTestWorkflow.approve_command, ApprovalRequest(attempt=1, approved=False, reason="use fewer GPUs")) == "refused"
        await assert_eventually(lambda: awaiting(2), message="attempt 2 awaiting approval")
        await handle.execute_update(ModelTestWorkflow.approve_command, ApprovalRequest(attempt=2, approved=True))
        result = await outcome_of(handle, FleetTestResult)
        ended = await handle.describe()
    assert result.passed
    assert ended.typed_search_attributes.get(STATUS) is None, "a row carries FleetforgeStatus only while it waits"
    assert [(a.category, a.reason) for a in result.attempts] == [
        (ErrorCategory.POLICY_REJECTED, "refused by reviewer: use fewer GPUs"), (None, "")]


async def _history_sizes(client: Client, wid: str) -> list[int]:
    """Event count of every run of a workflow id, following continue-as-new from the first run."""
    sizes: list[int] = []
    run_id = (await client.get_workflow_handle(wid).describe()).raw_description.workflow_execution_info.first_run_id
    while run_id:
        history = await client.get_workflow_handle(wid, run_id=run_id).fetch_history()
        sizes.append(len(history.events))
        last = history.events[-1]
        run_id = (last.workflow_execution_continued_as_new_event_attributes.new_execution_run_id
                  if last.event_type == EventType.EVENT_TYPE_WORKFLOW_EXECUTION_CONTINUED_AS_NEW else "")
    return sizes


@pytest.mark.slow
async def test_a_fleet_over_four_runs_continues_as_new_reports_progress_and_records_every_row_once(
        temporal_env, file_store, tmp_path: Path):
    # four runs of 30 rows (bench_fleet measures 10,000 rows; this checks every row's bookkeeping)
    n, every, failing = 120, 30, lambda i: i % 7 == 0
    rows = [(f"org/m-{i}", "", "false" if failing(i) else "true") for i in range(n)]
    queues, client = fresh_queues(), temporal_env.client
    acts = ContainerActivities(file_store, Settings(state_dir=tmp_path / "s"), process_programs=("true", "false"))
    t0 = time.monotonic()
    async with new_worker(client, workflows=[FleetTestWorkflow, ModelTestWorkflow], activities=acts.all(),
                          task_queue=queues.workflows):
        wid = f"fleet/{uuid.uuid4().hex[:8]}"
        handle = await client.start_workflow(
            FleetTestWorkflow.run, FleetTestRequest(manifest=upload_manifest(file_store, manifest(rows)), queues=queues,
                                                    **SELF_TESTS, concurrency=16, max_attempts=1,
                                                    continue_every=every, hardware=HardwareProfile(gpu_count=0)),
            id=wid, task_queue=queues.workflows, search_attributes=start_attributes(JobKind.FLEET_TEST))

        async def progress() -> FleetProgress | None:
            try:
                return await handle.query(FleetTestWorkflow.progress)
            except RPCError:  # e.g. the new run's first task not done yet ("Workflow Task in failed state")
                return None

        async def in_second_run() -> FleetProgress | None:
            p = await progress()
            return p if p and p.runs >= 2 and p.done > every else None

        live = await assert_eventually(in_second_run, timeout=300, interval=0.5, message="fleet in its second run")
        await handle.signal(FleetTestWorkflow.pause)  # drain, so the numbers can be checked exactly

        async def drained() -> FleetProgress | None:
            p = await progress()
            return p if p and p.paused and p.running == 0 else None

        paused = await assert_eventually(drained, timeout=60, message="paused and drained")
        await handle.signal(FleetTestWorkflow.resume)
        result = await outcome_of(handle, FleetTestResult)
        final = await handle.query(FleetTestWorkflow.progress)
    elapsed = time.monotonic() - t0
    sizes = await _history_sizes(client, wid)
    for i in (1, every + 1, n - 2):  # passed rows of the first, second and last run start with their model
        row = client.get_workflow_handle(f"{wid}/{i}")
        assert (await row.describe()).typed_search_attributes.get(MODEL) == f"org/m-{i}"
        events = [e.event_type for e in (await row.fetch_history()).events]
        assert EventType.EVENT_TYPE_UPSERT_WORKFLOW_SEARCH_ATTRIBUTES not in events, "a row writes no search attribute"
    print(f"\nfleet of {n} rows: {elapsed:.1f}s, {result.runs} runs, history events per run {sizes}")

    assert live.total == n and live.running <= 16 and live.eta_s is not None and live.done == live.passed + live.failed
    # rows start in CSV order, so a drained fleet has finished exactly its first `done` rows
    assert every < paused.done < n
    assert (paused.passed, paused.failed) == (sum(not failing(i) for i in range(paused.done)),
                                              sum(failing(i) for i in range(paused.done)))
    assert result.status is JobStatus.FAILED and result.runs == len(sizes) >= 4  # some rows fail on purpose
    assert max(sizes) < 10_000
    n_failing = sum(failing(i) for i in range(n))
    assert (result.passed, result.failed) == (n - n_failing, n_failing)
    assert (final.done, final.passed, final.running) == (n, n - n_failing, 0), "no row ran twice across runs"
    out = read_csv(file_store, result)
    assert [r["model_name"] for r in out] == [r[0] for r in rows], "every row exactly once, in order"
    assert [r["status"] for r in out] == ["No" if failing(i) else "Yes" for i in range(n)]
    assert result.table is not None
    table = list(csv.DictReader(io.StringIO(file_store.get_bytes(result.table).decode())))
    assert [int(r["row"]) for r in table] == list(range(n)) and table[1]["commands"] == '["true"]'


async def test_pause_stops_new_children_and_resume_finishes_the_fleet(temporal_env, file_store, tmp_path: Path):
    slow = 'python -c "__import__(\'time\').sleep(0.3)"'
    rows = [(f"org/slow-{i}", "", slow) for i in range(6)]
    queues = fresh_queues()
    client = temporal_env.client
    acts = ContainerActivities(file_store, Settings(state_dir=tmp_path / "s"))
    async with new_worker(client, workflows=[FleetTestWorkflow, ModelTestWorkflow], activities=acts.all(),
                          task_queue=queues.workflows):
        ref = upload_manifest(file_store, manifest(rows))
        fleet_id = uuid.uuid4().hex[:8]
        handle = await client.start_workflow(
            FleetTestWorkflow.run, FleetTestRequest(manifest=ref, queues=queues, **SELF_TESTS, concurrency=1),
            id=f"fleet/{fleet_id}", task_queue=queues.workflows, search_attributes=start_attributes(JobKind.FLEET_TEST))
        await handle.signal(FleetTestWorkflow.pause)

        async def quiet() -> FleetProgress | None:
            p = await handle.query(FleetTestWorkflow.progress)
            return p if p.paused and p.running == 0 and p.total == 6 else None

        paused = await assert_eventually(quiet, message="paused with nothing running")
        assert paused.done < 6, "paused before the fleet finished"
        await handle.signal(FleetTestWorkflow.resume)
        result = await outcome_of(handle, FleetTestResult)
        child = await client.get_workflow_handle(f"fleet/{fleet_id}/0").describe()
    assert result.passed == 6 and result.runs == 1
    assert child.status is not None and child.status.name == "COMPLETED", "children have deterministic ids"


async def test_a_resume_that_reaches_a_run_before_it_starts_is_not_overwritten_by_the_carried_pause(
        temporal_env, file_store, tmp_path: Path):
    """A paused fleet that continues as new carries `paused` to its next run. A resume sent while that run
    starts is handled before run() reads the carry; the carry must not undo it (the fleet would wait forever).
    Signal-with-start delivers the resume exactly there, every time."""
    rows = [(f"org/m-{i}", "", "true") for i in range(3)]
    queues, client = fresh_queues(), temporal_env.client
    acts = ContainerActivities(file_store, Settings(state_dir=tmp_path / "s"), process_programs=("true",))
    async with new_worker(client, workflows=[FleetTestWorkflow, ModelTestWorkflow], activities=acts.all(),
                          task_queue=queues.workflows):
        handle = await client.start_workflow(
            FleetTestWorkflow.run, FleetTestRequest(manifest=upload_manifest(file_store, manifest(rows)), queues=queues,
                                                    **SELF_TESTS, carry=FleetCarry(paused=True, runs=1)),
            id=f"fleet/{uuid.uuid4().hex[:8]}", task_queue=queues.workflows, start_signal="resume",
            search_attributes=start_attributes(JobKind.FLEET_TEST))

        async def finished() -> FleetTestResult | None:
            p = await handle.query(FleetTestWorkflow.progress)
            assert not p.paused, "the resume sent as the run started was lost: the fleet stays paused"
            return await outcome_of(handle, FleetTestResult) if p.done == 3 else None

        result = await assert_eventually(finished, timeout=60, message="the resumed fleet finished")
    assert (result.status, result.passed, result.runs) == (JobStatus.COMPLETED, 3, 2)


async def test_invalid_manifest_fails_the_fleet_with_manifest_invalid(temporal_env, file_store, tmp_path: Path):
    queues = fresh_queues()
    acts = ContainerActivities(file_store, Settings(state_dir=tmp_path / "s"))
    ref = file_store.put_bytes(b"name,state\nfoo,\n", media_type="text/csv")  # bypasses upload_manifest's check
    async with new_worker(temporal_env.client, workflows=[FleetTestWorkflow, ModelTestWorkflow], activities=acts.all(),
                          task_queue=queues.workflows):
        result = await job_outcome(
            temporal_env.client, FleetTestWorkflow.run, FleetTestRequest(manifest=ref, queues=queues, **SELF_TESTS),
            result_type=FleetTestResult,
            id=f"fleet/{uuid.uuid4().hex[:8]}", task_queue=queues.workflows)
    assert result.status is JobStatus.FAILED and result.csv is None
    assert result.failure is not None and result.failure.code == "MANIFEST_INVALID"
    assert "lacks column(s) model_name, status, note" in result.failure.message
