"""Fleets and model tests with the docker runner on the REAL docker engine (no fake CLI): concurrent
rows each on their own slot port, a never-healthy row never borrowing another row's pass; a container
that exits 137 is `crashed`; the LLM writer (a scripted OpenAI-compatible server) on the agent ladder:
classified errors and log tails on its retry, refused commands as attempts fed back, the offline
writer as the recorded fallback, Error (not No) when nobody writes a usable command; a cancelled
fleet cancels its rows and removes their containers. Every test leaves no container behind. Without
a running engine these tests fail (tests/conftest.py)."""

from __future__ import annotations

import asyncio

import contextlib
import csv
import io
import json
import uuid
from datetime import timedelta
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from temporalio.client import Client, WorkflowExecutionStatus

from activities.containers.activities import ContainerActivities, upload_manifest
from activities.containers.manifest import verdict_note
from activities.containers.runners import DockerRunner
from activities.llm.activity import LLMActivities
from activities.storage import ArtifactStore
from client.sdk import FleetforgeClient, JobCancelled
from contracts.common import JobStatus, TaskQueues
from contracts.fleet import ErrorCategory, HardwareProfile, RowStatus
from contracts.fleet_job import CommandSource, ModelTestRequest, ModelTestResult, RunnerKind
from contracts.settings import Settings
from tests.conftest import fleet_containers
from tests.doubles.openai_server import ScriptedOpenAIServer, json_reply
from tests.helpers import assert_eventually, free_port_range, fresh_queues, new_worker, job_outcome, outcome_of
from workflows.fleet import FleetTestWorkflow, ModelTestWorkflow

pytestmark = pytest.mark.docker


def manifest(rows: list[dict[str, str]]) -> str:
    cols = ["model_name", "status", "note", "runtime", "image", "command"]
    buf = io.StringIO()
    w = csv.DictWriter(buf, fieldnames=cols, lineterminator="\n")
    w.writeheader()
    for r in rows:
        w.writerow({"status": "", "note": "", **r})
    return buf.getvalue()


def containers(store: ArtifactStore, tmp_path: Path, **kw: object) -> ContainerActivities:
    """The real docker runner, polling health every 0.2 s."""
    return ContainerActivities(store, Settings(state_dir=tmp_path / "s"),
                               runners={RunnerKind.DOCKER: DockerRunner(store, poll_s=0.2)}, **kw)


def ci_host(tmp_path: Path, ports: int = 4) -> HardwareProfile:
    """A GPU-less docker host whose fleet ports are `ports` free loopback ports."""
    (tmp_path / "hf-cache").mkdir(exist_ok=True)
    return HardwareProfile(name="ci", gpu_count=0, gpu_memory_gb=0, model_cache_dir=str(tmp_path / "hf-cache"),
                           port_range=free_port_range(ports))


async def model_test(client: Client, queues: TaskQueues, fleet_id: str, ref, row: int, hw: HardwareProfile,
                     **kw: object) -> ModelTestResult:
    req = ModelTestRequest(fleet_id=fleet_id, manifest=ref, row=row, hardware=hw, runner=RunnerKind.DOCKER,
                           test_timeout_s=30, queues=queues, **kw)
    return await job_outcome(client, ModelTestWorkflow.run, req, result_type=ModelTestResult,
                             id=f"fleet/{fleet_id}/{row}", task_queue=queues.workflows)


@contextlib.asynccontextmanager
async def fleet_workers(client: Client, store: ArtifactStore, tmp_path: Path,
                        llm: ScriptedOpenAIServer | None = None) -> AsyncIterator[FleetforgeClient]:
    """A client plus the workers a fleet needs (workflows with local activities, containers, and the LLM
    when a scripted one is given), on queues of their own."""
    settings = Settings(state_dir=tmp_path / "s", queue_prefix=f"test-{uuid.uuid4().hex[:10]}",
                        **({"llm": "openai", "llm_base_url": llm.base_url, "llm_model": "test-model"} if llm else {}))
    acts = containers(store, tmp_path)
    llm_acts = [LLMActivities(settings, store).complete_chat] if llm else []
    async with contextlib.AsyncExitStack() as stack:
        await stack.enter_async_context(new_worker(client, workflows=[FleetTestWorkflow, ModelTestWorkflow],
                                                   task_queue=settings.queues.workflows, activities=acts.local()))
        await stack.enter_async_context(new_worker(client, task_queue=settings.queues.containers, activities=acts.all()))
        if llm_acts:
            await stack.enter_async_context(new_worker(client, task_queue=settings.queues.llm, activities=llm_acts))
        yield FleetforgeClient(client, settings)


def _port(command: str) -> int:
    return int(command.split("PORT=", 1)[1].split()[0])


@pytest.mark.slow
async def test_concurrent_rows_each_get_their_own_port_and_a_never_healthy_row_is_never_yes(
        temporal_env, file_store, tmp_path: Path, docker_image: str):
    """The acceptance test of the slot allocator: --concurrency 4, rows that would all serve on the
    default port. One row's server never becomes healthy: it is No (NOT_HEALTHY, on its own port), never
    a pass borrowed from another row's server; the three others are Yes, each on a port of its own; a
    fifth row whose container exits 137 is a CRASHED No once a slot is free."""
    hw = ci_host(tmp_path, ports=4)
    rows = [{"model_name": f"org/served-{i}", "runtime": "http", "image": docker_image} for i in range(3)]
    rows.insert(1, {"model_name": "org/never-healthy", "command": f"docker run --network host -e PORT={{port}} -e DELAY=600 {docker_image}"})
    rows.append({"model_name": "org/killed", "command": f'docker run --network host -e PORT={{port}} {docker_image} sh -c "exit 137"'})
    async with fleet_workers(temporal_env.client, file_store, tmp_path) as ff:
        handle = await ff.start_fleet_test(manifest(rows), store=file_store, runner=RunnerKind.DOCKER, concurrency=4,
                                           max_attempts=1, test_timeout_s=15, hardware=hw)
        fleet_id = handle.id.removeprefix("fleet-test/")
        async def side_by_side_on_distinct_ports() -> bool:
            # the never-healthy row's container runs 15 s; a served row's only a second or two, so a
            # poll on a loaded machine may miss some: two at once is the evidence here, the commands'
            # ports (below) show all four rows had distinct slots
            return len(await asyncio.to_thread(_running_ports, fleet_id)) >= 2

        await assert_eventually(side_by_side_on_distinct_ports, timeout=60, interval=0.2,
                                message="two of the fleet's containers serving on distinct ports at the same time")
        result = await handle.outcome(timeout=timedelta(seconds=180))
        children = {i: await outcome_of(temporal_env.client.get_workflow_handle(f"fleet/{fleet_id}/{i}", result_type=ModelTestResult), ModelTestResult)
                    for i in range(5)}

    out = list(csv.DictReader(io.StringIO(file_store.get_bytes(result.csv).decode())))
    assert [r["status"] for r in out] == ["Yes", "No", "Yes", "Yes", "No"], [(r["model_name"], r["note"]) for r in out]
    assert out[1]["note"].startswith("NOT_HEALTHY: server did not become healthy in time"), out[1]["note"]
    assert out[4]["note"].startswith("CRASHED: container was killed (exit 137"), out[4]["note"]
    ports = {i: _port(c.attempts[0].command) for i, c in children.items()}
    assert len(set(ports[i] for i in range(4))) == 4, ports
    assert set(ports.values()) <= set(range(hw.port_range[0], hw.port_range[1] + 1))
    broken_log = file_store.get_bytes(children[1].attempts[0].log).decode()
    assert f"not healthy within 15s (--test-timeout) on port {ports[1]}" in broken_log
    assert result.status is JobStatus.FAILED and (result.passed, result.failed, result.errors) == (3, 2, 0)

    served = children[0]
    assert "MODEL_NAME=org/served-0" in served.attempts[0].command, "the server names its model: the probe checks it"
    transcript = json.loads(file_store.get_bytes(served.attempts[0].transcript))
    assert (transcript["agent"], transcript["provider"]) == ("fleet-command-writer", "offline")
    assert transcript["response"]["content"][0]["text"] == served.attempts[0].command
    assert transcript["request"]["slot"]["port"] == ports[0], "the writer was told the row's slot"
    assert (served.tokens.calls, served.tokens.total_tokens) == (1, 0)
    assert children[1].attempts[0].transcript is None and children[1].tokens.calls == 0, "a fixed command is nobody's answer"
    assert fleet_containers(fleet_id) == [], "every container is removed"


def _running_ports(fleet_id: str) -> set[str]:
    """PORT of every running container of the fleet (from its environment)."""
    import subprocess

    ids = _running(fleet_id)
    if not ids:
        return set()
    r = subprocess.run(["docker", "inspect", "--format", "{{range .Config.Env}}{{println .}}{{end}}", *ids],
                       capture_output=True, text=True, timeout=30)
    return {line.split("=", 1)[1] for line in r.stdout.splitlines() if line.startswith("PORT=")}


@pytest.mark.slow
async def test_llm_writer_retries_with_the_classified_error_and_log_tail(
        temporal_env, file_store, tmp_path: Path, docker_image: str):
    hw = ci_host(tmp_path, ports=1)
    port = hw.port_range[0]
    first = (f"Here is the command:\n```bash\ndocker run --network host -e PORT={port} {docker_image} "
             "cat /models/org/chat/config.json\n```\n")
    second = f"docker run --network host -e PORT={port} -e MODEL_NAME=org/chat {docker_image}"
    ref = upload_manifest(file_store, manifest([{"model_name": "org/chat", "runtime": "http", "image": docker_image}]))
    fleet_id = f"llm-{uuid.uuid4().hex[:8]}"
    queues = fresh_queues()
    with ScriptedOpenAIServer([json_reply(first), json_reply(second)]) as llm:
        settings = Settings(state_dir=tmp_path / "s", llm="openai", llm_base_url=llm.base_url, llm_model="test-model")
        async with new_worker(temporal_env.client, workflows=[ModelTestWorkflow], task_queue=queues.workflows,
                              activities=[*containers(file_store, tmp_path).all(),
                                          LLMActivities(settings, file_store).complete_chat]):
            result = await model_test(temporal_env.client, queues, fleet_id, ref, 0, hw, llm="openai")

    assert result.passed, result
    assert [(a.source, a.category) for a in result.attempts] == [
        (CommandSource.LLM, ErrorCategory.CRASHED), (CommandSource.LLM, None)]
    assert result.attempts[1].command == second
    assert [json.loads(file_store.get_bytes(a.transcript))["provider"] for a in result.attempts] == ["openai"] * 2
    retry_prompt = llm.requests[1]["messages"][-1]["content"]
    assert "CRASHED: container exited with code 1" in retry_prompt
    assert "can't open '/models/org/chat/config.json'" in retry_prompt, "the log tail goes back to the LLM"
    assert "cat /models/org/chat/config.json" in retry_prompt, "and the failed command"
    assert f"port: {port}" in llm.requests[0]["messages"][-1]["content"], "the LLM is told the row's port"
    assert "Attempt 1" not in llm.requests[0]["messages"][-1]["content"]
    assert (result.tokens.calls, result.tokens.total_tokens) == (2, 30)
    assert result.verdict().tokens == result.tokens
    assert result.attempts[1].provenance is not None and result.attempts[1].provenance.source == "llm"
    assert fleet_containers(fleet_id) == []


async def _llm_row(temporal_env, file_store, tmp_path: Path, row: dict[str, str], answers: list[str]) -> tuple[ModelTestResult, ScriptedOpenAIServer, int]:
    hw = ci_host(tmp_path, ports=1)
    ref = upload_manifest(file_store, manifest([row]))
    queues = fresh_queues()
    port = hw.port_range[0]
    with ScriptedOpenAIServer([json_reply(a.replace("{port}", str(port))) for a in answers]) as llm:
        settings = Settings(state_dir=tmp_path / "s", llm="openai", llm_base_url=llm.base_url, llm_model="test-model")
        async with new_worker(temporal_env.client, workflows=[ModelTestWorkflow], task_queue=queues.workflows,
                              activities=[*containers(file_store, tmp_path).all(),
                                          LLMActivities(settings, file_store).complete_chat]):
            result = await model_test(temporal_env.client, queues, f"llm-{uuid.uuid4().hex[:8]}", ref, 0, hw, llm="openai")
    return result, llm, port


async def test_two_refused_commands_then_a_good_one_pass_on_attempt_3_without_an_offline_template(
        temporal_env, file_store, tmp_path: Path, docker_image: str):
    """The row has no image (the offline writer cannot template it): the LLM is still asked. Its first
    command is refused by the policy, its second by the slot check; each refusal is an attempt whose
    reason goes back to the LLM; its third command passes."""
    result, llm, port = await _llm_row(temporal_env, file_store, tmp_path, {"model_name": "org/chat", "runtime": "http"}, [
        f"docker run --privileged --network host -e PORT={{port}} {docker_image}",
        f"docker run --network host -e PORT=8000 -e MODEL_NAME=org/chat {docker_image}",
        f"docker run --network host -e PORT={{port}} -e MODEL_NAME=org/chat {docker_image}",
    ])
    assert result.passed and result.status is RowStatus.YES, result
    assert [(a.attempt, a.source, a.category) for a in result.attempts] == [
        (1, CommandSource.LLM, ErrorCategory.POLICY_REJECTED), (2, CommandSource.LLM, ErrorCategory.POLICY_REJECTED),
        (3, CommandSource.LLM, None)]
    assert "--privileged is not allowed" in result.attempts[0].reason
    assert "port 8000 is not this row's" in result.attempts[1].reason
    assert "--privileged is not allowed" in llm.requests[1]["messages"][-1]["content"], "the refusal goes back"
    assert "port 8000 is not this row's" in llm.requests[2]["messages"][-1]["content"]
    assert [a.activity_attempt for a in result.attempts] == [0, 0, 1] and result.attempts[2].test_runs == 1
    assert result.attempts[2].provenance.llm_answers == 3 and len(result.attempts[2].provenance.rejections) == 2
    assert verdict_note(result.verdict()) == "passed (attempt 3)"


async def test_an_llm_that_never_writes_an_acceptable_command_is_an_error_with_the_fallback_recorded(
        temporal_env, file_store, tmp_path: Path, docker_image: str):
    """Three refused commands spend the row's budget; the offline writer is the last resort, and for a
    row it cannot template the row ends Error (not No): nobody could test the model."""
    bad = f"docker run --network none {docker_image}"
    result, llm, _ = await _llm_row(temporal_env, file_store, tmp_path, {"model_name": "org/chat", "runtime": "http"},
                                    [bad, bad, bad])
    assert not result.passed and result.status is RowStatus.ERROR, result
    assert result.category == "POLICY_REJECTED" and len(llm.requests) == 3
    assert [a.category for a in result.attempts] == [ErrorCategory.POLICY_REJECTED] * 3
    assert "3 LLM answer(s) refused" in result.reason
    assert "the offline writer has no command: runtime 'http' needs an image" in result.reason, "the fallback was tried"
    assert verdict_note(result.verdict()).startswith("POLICY_REJECTED: command rejected: a model server must use --network host")


async def test_after_refused_llm_commands_the_offline_writers_command_runs_as_a_fallback(
        temporal_env, file_store, tmp_path: Path, docker_image: str):
    """The issue's real-LLM case: every LLM command refused, although the offline writer's command works.
    The fallback runs (attempt 4, recorded as such) and the model is Yes."""
    unusable = "I would rather not write a command."
    result, llm, port = await _llm_row(temporal_env, file_store, tmp_path,
                                       {"model_name": "org/chat", "runtime": "http", "image": docker_image},
                                       [unusable, f"docker run --network host --pid=host -e PORT={{port}} {docker_image}",
                                        unusable])
    assert result.passed and result.status is RowStatus.YES, result
    assert [(a.source, a.category) for a in result.attempts] == [
        (CommandSource.LLM, ErrorCategory.NO_COMMAND), (CommandSource.LLM, ErrorCategory.POLICY_REJECTED),
        (CommandSource.LLM, ErrorCategory.NO_COMMAND), (CommandSource.FALLBACK, None)]
    fallback = result.attempts[3]
    assert f"PORT={port}" in fallback.command and fallback.writer_note.startswith("3 LLM answer(s) refused")
    assert json.loads(file_store.get_bytes(fallback.transcript))["provider"] == "offline", "the command's own answer"
    assert (result.tokens.calls, result.tokens.total_tokens) == (4, 45), "three LLM calls and the offline decision"


def _running(fleet_id: str) -> list[str]:
    import subprocess

    r = subprocess.run(["docker", "ps", "-q", "--filter", f"label=fleetforge.run={fleet_id}"],
                       capture_output=True, text=True, timeout=30)
    return r.stdout.split()


@pytest.mark.slow
async def test_cancelling_a_fleet_cancels_every_row_and_removes_their_containers(
        temporal_env, file_store, tmp_path: Path, docker_image: str):
    """`fleetforge cancel fleet-test/ID` (FleetforgeClient.cancel) while two rows' containers are
    loading a model (DELAY=300): every child ends CANCELLED, then the fleet, and nothing is left."""
    rows = [{"model_name": f"org/slow-{i}", "command": f"docker run --network host -e PORT={{port}} -e DELAY=300 {docker_image}"}
            for i in range(2)]
    async with fleet_workers(temporal_env.client, file_store, tmp_path) as ff:
        handle = await ff.start_fleet_test(manifest(rows), store=file_store, runner=RunnerKind.DOCKER, concurrency=4,
                                           max_attempts=1, test_timeout_s=120, hardware=ci_host(tmp_path))
        fleet_id = handle.id.removeprefix("fleet-test/")
        await assert_eventually(lambda: len(_running(fleet_id)) == 2, timeout=30, message="both rows' containers running")
        await ff.cancel(handle.id)
        with pytest.raises(JobCancelled):
            await handle.result(timeout=timedelta(seconds=60))

    statuses = [(await temporal_env.client.get_workflow_handle(wid).describe()).status
                for wid in (handle.id, f"fleet/{fleet_id}/0", f"fleet/{fleet_id}/1")]
    assert statuses == [WorkflowExecutionStatus.CANCELED] * 3, statuses
    await assert_eventually(lambda: fleet_containers(fleet_id) == [], timeout=30, message="no container left")


@pytest.mark.slow
async def test_fleet_result_sums_every_rows_writer_answers_across_runs(
        temporal_env, file_store, tmp_path: Path, docker_image: str):
    """Three rows written by the offline writer, one continue-as-new between them: the fleet's
    tokens count each row's recorded answer (0 tokens), carried through the new run; the per-model
    table has the same calls per row."""
    rows = [{"model_name": f"org/served-{i}", "runtime": "http", "image": docker_image} for i in range(3)]
    async with fleet_workers(temporal_env.client, file_store, tmp_path) as ff:
        handle = await ff.start_fleet_test(manifest(rows), store=file_store, runner=RunnerKind.DOCKER, concurrency=2,
                                           continue_every=2, test_timeout_s=60, hardware=ci_host(tmp_path))
        result = await handle.result(timeout=timedelta(seconds=120))

    assert result.passed == 3 and result.runs == 2, result
    assert (result.tokens.calls, result.tokens.total_tokens) == (3, 0)
    table = list(csv.DictReader(io.StringIO(file_store.get_bytes(result.table).decode())))
    assert [(r["calls"], r["tokens"]) for r in table] == [("1", "0")] * 3
    assert fleet_containers(handle.id.removeprefix("fleet-test/")) == []
