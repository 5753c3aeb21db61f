"""Live events of an LLM-planned conversion, with the scripted LLM streaming its plan slowly: the
planner's tokens reach `fleetforge watch` (a subprocess) while the LLM is still writing them, and the
same events reach an MCP client as progress notifications of the `watch` tool."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from mcp import Client

from activities.storage import FileStore
from client.mcp_server.server import Backend, build_server
from client.sdk import FleetforgeClient
from contracts.settings import Settings
from examples.tiny_model import build_tiny_cnn
from tests.doubles.openai_server import ScriptedOpenAIServer, json_reply, text_stream
from tests.helpers import SELF_TESTS, assert_eventually
from worker import activity_executor, build_registry, build_workers, running_workers

pytest.importorskip("onnxruntime_qnn")

FLEETFORGE = str(Path(sys.executable).parent / "fleetforge")
CTX = "converted/tiny_fp16_sm8550_ctx.onnx"
PLAN = json.dumps({
    "status": "OK", "intent": {"reference": "input/tiny.onnx", "evaluate": CTX}, "questions": [],
    "rationale": "streamed-fp16-context-binary",
    "steps": [{"step_id": "context_binary", "tool_name": "ortqnn.context_binary",
               "required_args": {"model": "input/tiny.onnx", "soc": "sm8550", "output": CTX},
               "optional_args": {"precision": "fp16"}, "expected_outputs": [CTX], "depends_on": []}]})
PARTS = [PLAN[i:i + 12] for i in range(0, len(PLAN), 12)]
AGENT = "converter-planner"
MARK = "streamed-fp16"  # a piece of the plan only the token deltas carry


class Stderr:
    """Everything a subprocess writes on stderr, read as it comes (token deltas end no line)."""

    def __init__(self, proc: subprocess.Popen[bytes]):
        self.text = ""
        self.first_seen: dict[str, float] = {}
        self._proc = proc
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        assert self._proc.stderr is not None
        fd = self._proc.stderr.fileno()
        while chunk := os.read(fd, 4096):
            self.text += chunk.decode(errors="replace")


async def test_watch_and_mcp_progress_show_the_planner_tokens_before_the_llm_has_finished(temporal_env, tmp_path: Path):
    model = build_tiny_cnn(tmp_path / "hub" / "tiny.onnx")
    store = FileStore(tmp_path / "artifacts")
    slow_plan = text_stream(PARTS, chunk_delay_s=0.25)  # ~45 chunks: about 11 s of writing
    with ScriptedOpenAIServer([json_reply(tool_calls=[{"id": "c1", "type": "function", "function": {
            "name": "list_tools", "arguments": "{}"}}], finish_reason="tool_calls"), slow_plan]) as server:
        target = temporal_env.client.service_client.config.target_host
        settings = Settings(state_dir=tmp_path / "state", llm="openai", llm_base_url=server.base_url,
                            llm_model="test-model", temporal_address=target, store_url=f"file://{tmp_path / 'artifacts'}",
                            queue_prefix=f"live-{time.monotonic_ns()}")
        env = {**os.environ, "TEMPORAL_ADDRESS": target, "FLEETFORGE_STATE_DIR": str(tmp_path / "state"),
               "FLEETFORGE_STORE_URL": f"file://{tmp_path / 'artifacts'}", "FLEETFORGE_QUEUE_PREFIX": settings.queue_prefix,
               "TEMPORAL_CONFIG_FILE": str(tmp_path / "no-profiles.toml")}
        with activity_executor() as executor:
            workers = build_workers(temporal_env.client, build_registry(settings, store), settings.queues,
                                    ["workflows", "llm", "toolchain"], executor)
            async with running_workers(workers):
                fc = FleetforgeClient(temporal_env.client, settings, store)
                handle = await fc.start_convert(str(model), soc="sm8550", precision="fp16", llm="openai")
                watch = subprocess.Popen([FLEETFORGE, "watch", handle.id], env=env, stdout=subprocess.PIPE,
                                         stderr=subprocess.PIPE)
                seen = Stderr(watch)
                progress: list[str] = []

                async def on_progress(p: float, total: float | None, message: str | None) -> None:
                    progress.append(message or "")

                async with Client(build_server(settings, Backend(settings))) as mcp:
                    follow = mcp.call_tool("watch", {"job_id": handle.id, "seconds": 90}, progress_callback=on_progress)

                    async def tokens_shown_while_streaming() -> bool:
                        if MARK not in seen.text:
                            return False
                        assert server.chunks_sent < len(slow_plan.chunks) + 2, "the plan was already fully sent"
                        return True

                    following = asyncio.ensure_future(follow)
                    await assert_eventually(tokens_shown_while_streaming, timeout=60,
                                            message="the planner's tokens never reached fleetforge watch")
                    chunks_when_seen = server.chunks_sent
                    result = await following
                # off the event loop: the workers in this process answer the query that gives watch the last events
                assert await asyncio.to_thread(watch.wait, 60) == 0, seen.text
        assert chunks_when_seen < len(slow_plan.chunks)  # seen mid-stream, not after the answer

    assert f"[{AGENT}] " in seen.text and "step: compile" in seen.text and "status: COMPLETED" in seen.text, seen.text
    assert "tool list_tools" in seen.text
    said = [m.split("] ", 1)[1] for m in progress if m.startswith(f"[{AGENT}] ")]
    tokens = "".join(t for t in said if not t.startswith(("tool ", "answered (")))
    assert MARK in tokens and PLAN in tokens, progress  # every delta, in order
    assert "step: compile" in progress and "status: COMPLETED" in progress, progress
    assert result.structured_content["status"] == "COMPLETED", result


async def test_a_fleets_events_follow_it_across_continue_as_new_each_row_once_in_order(temporal_env, tmp_path: Path):
    import uuid

    from activities.containers.activities import ContainerActivities, upload_manifest
    from contracts.common import JobKind
    from contracts.events import EventKind
    from contracts.fleet import HardwareProfile
    from contracts.fleet_job import FleetTestRequest, FleetTestResult
    from tests.helpers import fresh_queues, new_worker
    from tests.integration.test_fleet_workflow import manifest
    from workflows._visibility import start_attributes
    from workflows.fleet import FleetTestWorkflow, ModelTestWorkflow

    store = FileStore(tmp_path / "artifacts")
    settings = Settings(state_dir=tmp_path / "s")
    acts = ContainerActivities(store, settings, process_programs=("true",))
    queues = fresh_queues()
    rows = [(f"org/m-{i}", "", "true") for i in range(5)]
    async with new_worker(temporal_env.client, workflows=[FleetTestWorkflow, ModelTestWorkflow], activities=acts.all(),
                          task_queue=queues.workflows):
        wid = f"fleet-test/events-{uuid.uuid4().hex[:8]}"
        await temporal_env.client.start_workflow(
            FleetTestWorkflow.run, FleetTestRequest(manifest=upload_manifest(store, manifest(rows)), queues=queues,
                                                    **SELF_TESTS, concurrency=1, max_attempts=1,
                                                    continue_every=2, hardware=HardwareProfile(gpu_count=0)),
            id=wid, task_queue=queues.workflows, search_attributes=start_attributes(JobKind.FLEET_TEST))
        handle = await FleetforgeClient(temporal_env.client, settings, store).job(wid)
        events = [e async for e in handle.events()]  # ends once the fleet's last run has closed
        result = await handle.result()
        # a follower that comes after the end reads the closed last run, which starts with the runs before it
        later = [e async for e in handle.events()]

    assert isinstance(result, FleetTestResult)
    for seen in (events, later):
        progress = [e for e in seen if e.kind is EventKind.PROGRESS]
        assert [e.done for e in progress] == [1, 2, 3, 4, 5] and {e.total for e in progress} == {5}, progress
        assert sorted(e.text.split()[1] for e in progress) == ["0", "1", "2", "3", "4"], progress  # each row once
    history_runs = 0
    async for execution in temporal_env.client.list_workflows(f"WorkflowId = '{wid}'"):
        history_runs += 1
    assert history_runs >= 3, "the fleet continued as new (2 rows per run)"
