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
                                    llm="openai", queues=wp.queues, run_id=uuid.uuid4().hex[:8], synthetic_calibration=True)
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


LIGHT = Path(__import__("onnx").__file__).parent / "backend" / "test" / "data" / "light"
CRASHER = LIGHT / "light_inception_v1.onnx"
"""At fp16 for SM8550 with the backend's default graph finalization (preset balanced), running this
model's context binary under x86 HTP emulation segfaults inside libQnnHtp.so (seen every time)."""


@pytest.mark.slow
async def test_an_emulator_segfault_during_evaluation_fails_the_job_not_the_worker(temporal_env, tmp_path: Path):
    import time

    from tests.helpers import outcome_of

    client = temporal_env.client
    state = tmp_path / "state"
    async with WorkerProcess(client, state) as wp:
        assert wp.proc is not None
        pid = wp.proc.pid
        req = ConversionRequest(model=str(CRASHER), target_soc="sm8550", precision="fp16", queues=wp.queues,
                                run_id=uuid.uuid4().hex[:8])
        started = time.monotonic()
        handle = await client.start_workflow(ConverterWorkflow.run, req, id=f"convert-segv/{req.run_id}",
                                             task_queue=wp.queues.workflows,
                                             search_attributes=start_attributes(JobKind.CONVERT, req.model, "SM8550"))
        result: ConversionResult = await outcome_of(handle, ConversionResult)
        elapsed = time.monotonic() - started

        # the worker that ran the evaluation is alive, the same process, and still polling
        assert wp.proc.poll() is None and wp.proc.pid == pid and wp.starts == 1
        assert await wp._polling()

    assert elapsed < 60, f"the job took {elapsed:.0f}s"
    assert result.status is JobStatus.FAILED and result.failure is not None
    assert result.failure.code == "EVALUATION_CRASHED" and result.failure.where == "evaluate", result.failure
    assert "SIGSEGV" in result.failure.message and "UNEVALUATED" in result.failure.message, result.failure.message
    assert "onnxruntime" in result.failure.message, "the last log lines say where it crashed"
    # the good compile's artifacts are attached, marked unevaluated
    stem = "converted/light_inception_v1_fp16_sm8550_ctx"
    assert {a.name for a in result.artifacts} == {f"{stem}.onnx", f"{stem}_qnn.bin"}
    assert result.accuracy is not None and result.accuracy.verdict == "unevaluated"
    record = RunStore(FileStore(state / "artifacts")).get(req.run_id)
    assert record.status is JobStatus.FAILED and sorted(a.name for a in record.artifacts) == sorted(a.name for a in result.artifacts)
    # a crash is not retried: one evaluate activity, one attempt
    history = await handle.fetch_history()
    started_evals = [e for e in history.events if e.HasField("activity_task_started_event_attributes")
                     and e.activity_task_started_event_attributes.attempt > 1]
    scheduled = [e.activity_task_scheduled_event_attributes.activity_type.name for e in history.events
                 if e.HasField("activity_task_scheduled_event_attributes")]
    assert scheduled.count("evaluate") == 1 and started_evals == [], scheduled
