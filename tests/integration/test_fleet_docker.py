"""ModelTestWorkflow with the docker runner on the REAL docker engine (no fake CLI): a local busybox
image serving the probe on a loopback port passes; a container that exits 137 is `crashed`; a busy
port is `port in use` and the offline writer's retry on the next port passes; the LLM writer (a
scripted OpenAI-compatible server) gets the classified error and the log tail on its retry; a
cancelled fleet cancels its rows and removes their containers. Every test leaves no container
behind. Without a running engine these tests fail (tests/conftest.py)."""

from __future__ import annotations

import asyncio
import contextlib
import csv
import http.server
import io
import json
import socket
import threading
import uuid
from datetime import timedelta
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest
from temporalio.client import Client, WorkflowExecutionStatus

from activities.containers.activities import ContainerActivities, upload_manifest
from activities.containers.runners import DockerRunner
from activities.llm.activity import LLMActivities
from activities.storage import ArtifactStore
from client.sdk import FleetforgeClient, JobCancelled
from contracts.common import TaskQueues
from contracts.fleet import ErrorCategory, HardwareProfile
from contracts.fleet_job import CommandSource, ModelTestRequest, ModelTestResult, RunnerKind
from contracts.settings import Settings
from tests.conftest import fleet_containers
from tests.doubles.openai_server import ScriptedOpenAIServer, json_reply
from tests.helpers import assert_eventually, fresh_queues, new_worker, job_outcome
from workflows.fleet import FleetTestWorkflow, ModelTestWorkflow

pytestmark = pytest.mark.docker


def free_port_pair() -> int:
    """A port P with P and P+1 free on 127.0.0.1 (the offline writer's port-in-use repair uses P+1)."""
    for _ in range(50):
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        try:
            with socket.socket() as a, socket.socket() as b:
                a.bind(("127.0.0.1", port))
                b.bind(("127.0.0.1", port + 1))
            return port
        except OSError:
            continue
    raise AssertionError("no free port pair")


@pytest.fixture
def squatter() -> Iterator[int]:
    """Another HTTP server holding a loopback port (it answers 503 to everything)."""
    class Busy(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # noqa: N802
            self.send_response(503)
            self.end_headers()

        def log_message(self, *args: object) -> None:
            pass

    port = free_port_pair()
    server = http.server.ThreadingHTTPServer(("127.0.0.1", port), Busy)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield port
    finally:
        server.shutdown()
        server.server_close()


def manifest(rows: list[dict[str, str]]) -> str:
    cols = ["model_name", "status", "note", "runtime", "image", "port", "command"]
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


async def model_test(client: Client, queues: TaskQueues, fleet_id: str, ref, row: int, hw: HardwareProfile,
                     **kw: object) -> ModelTestResult:
    req = ModelTestRequest(fleet_id=fleet_id, manifest=ref, row=row, hardware=hw, runner=RunnerKind.DOCKER,
                           test_timeout_s=30, queues=queues, **kw)
    return await job_outcome(client, ModelTestWorkflow.run, req, result_type=ModelTestResult,
                             id=f"fleet/{fleet_id}/{row}", task_queue=queues.workflows)


@contextlib.asynccontextmanager
async def fleet_workers(client: Client, store: ArtifactStore, tmp_path: Path) -> AsyncIterator[FleetforgeClient]:
    """A client plus the two workers a fleet needs (workflows with local activities, containers),
    on queues of their own."""
    settings = Settings(state_dir=tmp_path / "s", queue_prefix=f"test-{uuid.uuid4().hex[:10]}")
    acts = containers(store, tmp_path)
    async with new_worker(client, workflows=[FleetTestWorkflow, ModelTestWorkflow], task_queue=settings.queues.workflows,
                          activities=acts.local()), \
            new_worker(client, task_queue=settings.queues.containers, activities=acts.all()):
        yield FleetforgeClient(client, settings)


@pytest.mark.slow
async def test_docker_serve_passes_exit_137_is_crashed_busy_port_retries_on_the_next_port(
        temporal_env, file_store, tmp_path: Path, docker_image: str, squatter: int):
    serve_port = free_port_pair()
    rows = [
        {"model_name": "org/served", "runtime": "http", "image": docker_image, "port": str(serve_port)},
        {"model_name": "org/killed", "command": f'docker run --network none {docker_image} sh -c "exit 137"'},
        {"model_name": "org/busy-port", "runtime": "http", "image": docker_image, "port": str(squatter)},
    ]
    ref = upload_manifest(file_store, manifest(rows))
    hw = HardwareProfile(name="ci", gpu_count=0, gpu_memory_gb=0, model_cache_dir=str(tmp_path / "hf-cache"))
    (tmp_path / "hf-cache").mkdir()
    fleet_id = f"dock-{uuid.uuid4().hex[:8]}"
    queues = fresh_queues()
    async with new_worker(temporal_env.client, workflows=[ModelTestWorkflow], task_queue=queues.workflows,
                          activities=containers(file_store, tmp_path).all()):
        served, killed, busy = await asyncio.gather(
            model_test(temporal_env.client, queues, fleet_id, ref, 0, hw),
            model_test(temporal_env.client, queues, fleet_id, ref, 1, hw, max_attempts=1),
            model_test(temporal_env.client, queues, fleet_id, ref, 2, hw))

    assert served.passed and [a.category for a in served.attempts] == [None], served
    assert f"PORT={serve_port}" in served.attempts[0].command and "--network host" in served.attempts[0].command

    assert not killed.passed and killed.category == ErrorCategory.CRASHED.value
    assert "exit 137" in killed.reason, killed.reason

    assert busy.passed, busy
    assert [a.category for a in busy.attempts] == [ErrorCategory.PORT_IN_USE, None]
    assert f"PORT={squatter}" in busy.attempts[0].command and f"PORT={squatter + 1}" in busy.attempts[1].command
    assert file_store.get_bytes(busy.attempts[0].log).decode().count("in use") >= 1, "the full log is stored"

    # every offline decision is recorded like an LLM answer: a transcript per attempt, a call, 0 tokens
    for attempt in busy.attempts:
        transcript = json.loads(file_store.get_bytes(attempt.transcript))
        assert (transcript["agent"], transcript["provider"]) == ("fleet-command-writer", "offline")
        assert transcript["response"]["content"][0]["text"] == attempt.command
    assert json.loads(file_store.get_bytes(busy.attempts[1].transcript))["request"]["history"][0]["category"] == "PORT_IN_USE"
    assert (busy.tokens.calls, busy.tokens.total_tokens) == (2, 0) and busy.verdict().tokens == busy.tokens
    assert killed.attempts[0].transcript is None and killed.tokens.calls == 0, "a fixed command is nobody's answer"

    assert fleet_containers(fleet_id) == [], "every container is removed"


@pytest.mark.slow
async def test_llm_writer_retries_with_the_classified_error_and_log_tail(
        temporal_env, file_store, tmp_path: Path, docker_image: str):
    port = free_port_pair()
    first = f"Here is the command:\n```bash\ndocker run --network none {docker_image} cat /models/org/chat/config.json\n```\n"
    second = f"docker run --network host -e PORT={port} {docker_image}"
    ref = upload_manifest(file_store, manifest([{"model_name": "org/chat", "runtime": "http", "image": docker_image}]))
    hw = HardwareProfile(name="ci", gpu_count=0, gpu_memory_gb=0, model_cache_dir=str(tmp_path / "hf-cache"))
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
    assert f"cat /models/org/chat/config.json" in retry_prompt, "and the failed command"
    assert "Attempt 1" not in llm.requests[0]["messages"][-1]["content"]
    assert (result.tokens.calls, result.tokens.total_tokens) == (2, 30)
    assert result.verdict().tokens == result.tokens
    assert fleet_containers(fleet_id) == []


async def test_unusable_llm_answer_falls_back_to_the_offline_writer_and_says_so(
        temporal_env, file_store, tmp_path: Path, docker_image: str):
    port = free_port_pair()
    ref = upload_manifest(file_store, manifest(
        [{"model_name": "org/chat", "runtime": "http", "image": docker_image, "port": str(port)}]))
    hw = HardwareProfile(name="ci", gpu_count=0, gpu_memory_gb=0, model_cache_dir=str(tmp_path / "hf-cache"))
    (tmp_path / "hf-cache").mkdir()
    fleet_id = f"llm-{uuid.uuid4().hex[:8]}"
    queues = fresh_queues()
    with ScriptedOpenAIServer([json_reply("I would rather not write a command.")]) as llm:
        settings = Settings(state_dir=tmp_path / "s", llm="openai", llm_base_url=llm.base_url, llm_model="test-model")
        async with new_worker(temporal_env.client, workflows=[ModelTestWorkflow], task_queue=queues.workflows,
                              activities=[*containers(file_store, tmp_path).all(),
                                          LLMActivities(settings, file_store).complete_chat]):
            result = await model_test(temporal_env.client, queues, fleet_id, ref, 0, hw, llm="openai")

    assert result.passed, result
    [attempt] = result.attempts
    assert attempt.source is CommandSource.OFFLINE and f"PORT={port}" in attempt.command
    assert attempt.writer_note.startswith("unusable LLM answer (the answer contains no `docker run` command)")
    assert json.loads(file_store.get_bytes(attempt.transcript))["provider"] == "offline", "the command's own answer"
    assert (result.tokens.calls, result.tokens.total_tokens) == (2, 15), "the LLM call and the offline decision"
    assert fleet_containers(fleet_id) == []


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
    rows = [{"model_name": f"org/slow-{i}", "command": f"docker run --network host -e PORT={port} -e DELAY=300 {docker_image}"}
            for i, port in enumerate((free_port_pair(), free_port_pair()))]
    async with fleet_workers(temporal_env.client, file_store, tmp_path) as ff:
        handle = await ff.start_fleet_test(manifest(rows), store=file_store, runner=RunnerKind.DOCKER, concurrency=4,
                                           max_attempts=1, test_timeout_s=120, hardware=HardwareProfile(gpu_count=0))
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
    rows = [{"model_name": f"org/served-{i}", "runtime": "http", "image": docker_image, "port": str(free_port_pair())}
            for i in range(3)]
    async with fleet_workers(temporal_env.client, file_store, tmp_path) as ff:
        handle = await ff.start_fleet_test(manifest(rows), store=file_store, runner=RunnerKind.DOCKER, concurrency=2,
                                           continue_every=2, test_timeout_s=60, hardware=HardwareProfile(gpu_count=0))
        result = await handle.result(timeout=timedelta(seconds=120))

    assert result.passed == 3 and result.runs == 2, result
    assert (result.tokens.calls, result.tokens.total_tokens) == (3, 0)
    table = list(csv.DictReader(io.StringIO(file_store.get_bytes(result.table).decode())))
    assert [(r["calls"], r["tokens"]) for r in table] == [("1", "0")] * 3
    assert fleet_containers(handle.id.removeprefix("fleet-test/")) == []
