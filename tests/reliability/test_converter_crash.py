"""Acceptance: the worker running a long converter step is SIGKILLed, a fresh worker takes over, and
the conversion completes once: one run record, each step's outputs once, no duplicate artifacts.

Everything runs in a real `python worker.py` (WorkerProcess). The long step is the fake QAIRT SDK's
`qairt-quantizer` (tests/doubles/fake_qairt_sdk.py), which blocks until the test creates a release
file, after the kill; the plan comes from the scripted OpenAI-compatible server (the offline
planner plans no qairt tools)."""

from __future__ import annotations

import json
import uuid
from pathlib import Path

import pytest
from temporalio.api.enums.v1 import TimeoutType

from activities.experiments import RunStore
from activities.storage import FileStore
from contracts.common import JobKind, JobStatus
from contracts.convert import Toolchain
from contracts.convert_job import ConversionRequest, ConversionResult
from examples.tiny_model import build_tiny_cnn
from tests.doubles.fake_qairt_sdk import build_fake_sdk, calls
from tests.doubles.openai_server import ScriptedOpenAIServer, json_reply
from tests.helpers import assert_eventually
from tests.integration.test_converter_qairt import qairt_plan
from tests.reliability.worker_process import WorkerProcess, running_activity
from workflows._visibility import start_attributes
from workflows.converter import ConverterWorkflow

LONG_TOOL = "qairt-quantizer"


@pytest.mark.slow
async def test_worker_killed_during_a_long_step_is_replaced_and_the_run_completes_once(temporal_env, tmp_path: Path):
    client = temporal_env.client
    release = tmp_path / "release-the-quantizer"
    sdk = build_fake_sdk(tmp_path / "sdk", "2.31", hold=(LONG_TOOL, release))
    model = build_tiny_cnn(tmp_path / "hub" / "tiny.onnx")
    state = tmp_path / "state"
    with ScriptedOpenAIServer([json_reply(json.dumps(qairt_plan()))]) as server:
        env = {"FLEETFORGE_LLM": "openai", "FLEETFORGE_LLM_BASE_URL": server.base_url, "FLEETFORGE_LLM_MODEL": "scripted",
               "QAIRT_SDK_ROOT": str(sdk)}
        async with WorkerProcess(client, state, env=env) as wp:
            req = ConversionRequest(model=str(model), target_soc="sm8550", precision="int8", toolchain=Toolchain.QAIRT,
                                    llm="openai", queues=wp.queues, run_id=uuid.uuid4().hex[:8])
            wf_id = f"convert-crash/{req.run_id}"
            handle = await client.start_workflow(ConverterWorkflow.run, req, id=wf_id, task_queue=wp.queues.workflows,
                                                 search_attributes=start_attributes(JobKind.CONVERT, req.model, "SM8550"))

            def tool_is_running() -> bool:
                return [c["tool"] for c in calls(sdk)] == ["qairt-converter", LONG_TOOL]

            await assert_eventually(tool_is_running, timeout=60, message=f"{LONG_TOOL} started on the worker process")
            assert await running_activity(client, wf_id, "execute_step")
            first_pid = wp.proc.pid
            wp.kill()
            release.touch()  # from now on the tool finishes at once: only a new attempt can run it
            await wp.start()
            second_pid = wp.proc.pid
            result: ConversionResult = await handle.result()

    assert result.status is JobStatus.COMPLETED, result.failure
    assert result.executed_steps == ["convert", "quantize", "context_binary"]
    tools = [c["tool"] for c in calls(sdk)]
    assert tools == ["qairt-converter", LONG_TOOL, LONG_TOOL, "qnn-context-binary-generator"], \
        "only the killed step runs again; the steps before and after it run once"

    names = [a.name for a in result.artifacts]
    assert len(names) == len(set(names)), f"duplicate artifacts: {names}"
    assert names.count("converted/tiny_int8.dlc") == 1, "the killed step's output appears once"
    assert {"converted/tiny.dlc", "converted/tiny_int8.dlc", "converted/ctx/tiny_int8_sm8550.bin"} <= set(names)

    runs = [r for r in RunStore(FileStore(state / "artifacts")).list() if r.run_id == req.run_id]
    assert len(runs) == 1, "one run record"
    assert runs[0].status is JobStatus.COMPLETED
    assert sorted(a.name for a in runs[0].artifacts) == sorted(names), "artifacts attached once"

    history = await handle.fetch_history()
    scheduled = [e.activity_task_scheduled_event_attributes for e in history.events
                 if e.HasField("activity_task_scheduled_event_attributes")]
    assert [a.activity_type.name for a in scheduled].count("execute_step") == 3, "one activity per step, no rerun"
    assert [a.activity_type.name for a in scheduled].count("create_run") == 1
    started = [e.activity_task_started_event_attributes for e in history.events
               if e.HasField("activity_task_started_event_attributes")]
    retried = [s for s in started if s.attempt == 2]
    assert len(retried) == 1 and all(s.attempt == 1 for s in started if s not in retried)
    assert retried[0].identity.startswith(f"{second_pid}@") and second_pid != first_pid
    assert retried[0].last_failure.timeout_failure_info.timeout_type == TimeoutType.TIMEOUT_TYPE_HEARTBEAT
