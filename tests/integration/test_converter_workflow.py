"""ConverterWorkflow against the real dev server: the NEEDS_INPUT → provide_input path, a failing
tool ending with its own code (no pointless replan), calibration data, the toolchain version in the
cache key, cancellation killing the running tool, heartbeats. (Real conversions through the S3 store
and the step cache: test_converter_e2e.py.)"""

from __future__ import annotations

import json
import threading
import uuid
from pathlib import Path

import pytest
from temporalio.api.sdk.v1 import WorkflowMetadata
from temporalio.client import Client, WorkflowHandle, WorkflowUpdateFailedError
from temporalio.testing import ActivityEnvironment
from temporalio.worker import Replayer

from activities.experiments import RunStore
from activities.storage import ArtifactStore, FileStore
from activities.heartbeat import heartbeating
from activities.workspace import Workspace
from contracts.common import JobKind, JobStatus, TaskQueues
from contracts.convert import OutputKind, Precision
from contracts.convert_job import ConversionRequest, ConversionResult, ProvideInput
from contracts.settings import Settings
from examples.tiny_model import build_tiny_cnn
from tests.helpers import assert_eventually, fresh_queues, new_worker, outcome_of
from worker import build_registry
from workflows._visibility import STATUS, TARGET, start_attributes
from workflows.converter import ConverterWorkflow
from workflows.presentation import GUTTER

pytest.importorskip("onnxruntime_qnn")


async def start(client: Client, queues: TaskQueues, req: ConversionRequest) -> WorkflowHandle:
    return await client.start_workflow(
        ConverterWorkflow.run, req, id=f"convert/{uuid.uuid4().hex[:8]}", task_queue=queues.workflows,
        search_attributes=start_attributes(JobKind.CONVERT, req.model, req.target_soc or ""),
    )


def request(model: Path, queues: TaskQueues, **kw: object) -> ConversionRequest:
    return ConversionRequest(model=str(model), queues=queues, run_id=uuid.uuid4().hex[:8], **kw)


@pytest.fixture
def env(tmp_path: Path) -> tuple[Settings, ArtifactStore, Path]:
    settings = Settings(state_dir=tmp_path / "state")
    return settings, FileStore(tmp_path / "artifacts"), build_tiny_cnn(tmp_path / "hub" / "tiny.onnx")


async def test_missing_soc_waits_for_input_rejects_bad_answers_and_completes(temporal_env, env):
    settings, store, model = env
    queues = fresh_queues()
    reg = build_registry(settings, store)
    client = temporal_env.client
    async with new_worker(client, workflows=[ConverterWorkflow], activities=reg.by_kind["toolchain"], task_queue=queues.workflows):
        req = request(model, queues, precision=Precision.FP16)
        handle = await start(client, queues, req)

        async def waiting():
            progress = await handle.query(ConverterWorkflow.status)
            return progress if progress.status is JobStatus.NEEDS_INPUT else None

        progress = await assert_eventually(waiting, timeout=30, message="the job never asked for input")
        assert len(progress.questions) == 1 and "SoC" in progress.questions[0]
        assert RunStore(store).get(req.run_id).status is JobStatus.NEEDS_INPUT
        assert (await handle.describe()).typed_search_attributes.get(STATUS) == "NEEDS_INPUT"
        meta = await handle.query("__temporal_workflow_metadata", result_type=WorkflowMetadata)
        assert "needs input" in meta.current_details and "fleetforge answer" in meta.current_details, meta.current_details
        timers = [ev.user_metadata.summary async for ev in handle.fetch_history_events()
                  if ev.HasField("timer_started_event_attributes")]
        assert [client.data_converter.payload_converter.from_payload(t, str) for t in timers] == [
            f"waiting up to 7 days for an answer: fleetforge answer {handle.id} soc=... precision=..."]

        for bad, why in ((ProvideInput(soc="sm9999"), "unknown SoC"), (ProvideInput(), "empty"),
                         (ProvideInput(precision="int4"), "unknown precision")):
            with pytest.raises(WorkflowUpdateFailedError) as e:
                await handle.execute_update(ConverterWorkflow.provide_input, bad)
            assert why in str(e.value.cause)
        assert (await handle.query(ConverterWorkflow.status)).status is JobStatus.NEEDS_INPUT

        await handle.execute_update(ConverterWorkflow.provide_input, ProvideInput(soc="sm8650"))
        result: ConversionResult = await outcome_of(handle, ConversionResult)
        final = await handle.query("__temporal_workflow_metadata", result_type=WorkflowMetadata)

    assert result.status is JobStatus.COMPLETED, result.failure
    assert result.executed_steps == ["context_binary"]
    assert {a.name for a in result.artifacts} == {"converted/tiny_fp16_sm8650_ctx.onnx", "converted/tiny_fp16_sm8650_ctx_qnn.bin",
                                                  "report/conversion_report.md", "report/conversion_report.json"}
    assert result.evaluation is not None and result.evaluation.cosine > 0.999
    assert RunStore(store).get(result.run_id).status is JobStatus.COMPLETED
    # the Web UI's current details show the accuracy verdict and the offload share
    details = final.current_details.replace(GUTTER, "")  # the cells' padding (workflows/presentation.py)
    assert "| accuracy | passed: lowest per-sample cosine 1.0000 (threshold 0.99) on 32 synthetic samples |" in details, details
    assert "| precision | fp16 |" in details and "**op placement**" in details and "**accuracy per output**" in details
    assert "| offload | 100% of 7 nodes in the context binary |" in details, details
    assert "**evaluation**" in details and "**artifacts**" in details and "| target | SM8650 |" in details, details
    assert result.accuracy is not None and result.accuracy.verdict == "passed" and result.offload.share == 1.0
    attrs = (await handle.describe()).typed_search_attributes
    assert attrs.get(STATUS) == "COMPLETED" and attrs.get(TARGET) == "SM8650"
    # both offline planner answers (the questions, then the plan) are counted and kept like LLM answers
    assert result.tokens.calls == 2 and result.tokens.total_tokens == 0 and len(result.transcripts) == 2
    asked, planned = (json.loads(store.get_bytes(ref)) for ref in result.transcripts)
    assert asked["provider"] == planned["provider"] == "offline" and planned["agent"] == "converter-planner"
    assert planned["request"]["request"]["target_soc"] == "SM8650", "the answered request is what it planned from"
    assert json.loads(planned["response"]["content"][0]["text"])["steps"][0]["tool_name"] == "ortqnn.context_binary"
    # the recorded history (update, durable wait, activities) replays deterministically
    replayer = Replayer(workflows=[ConverterWorkflow], data_converter=client.data_converter)
    await replayer.replay_workflow(await handle.fetch_history())


async def test_unanswered_question_ends_failed_needs_input_timeout_with_its_questions(temporal_env, env):
    settings, store, model = env
    queues = fresh_queues()
    reg = build_registry(settings, store)
    client = temporal_env.client
    async with new_worker(client, workflows=[ConverterWorkflow], activities=reg.by_kind["toolchain"], task_queue=queues.workflows):
        handle = await start(client, queues, request(model, queues, target_soc="sm8550", needs_input_timeout_s=1))
        result: ConversionResult = await outcome_of(handle, ConversionResult)
    assert result.status is JobStatus.FAILED  # no longer waiting: not listed as NEEDS_INPUT
    assert len(result.questions) == 1 and "precision" in result.questions[0]
    assert result.failure is not None and result.failure.code == "NEEDS_INPUT_TIMEOUT"
    assert result.artifacts == [] and result.executed_steps == []
    record = RunStore(store).get(result.run_id)
    assert record.status is JobStatus.FAILED and record.error == result.failure


def build_unrunnable_onnx(path: Path) -> Path:
    """A valid ONNX file (the hub accepts it) whose op no runtime knows: every tool run fails."""
    import onnx
    from onnx import TensorProto, helper

    node = helper.make_node("Nope", ["input"], ["out"], domain="ai.fleetforge.test")
    graph = helper.make_graph([node], "unrunnable", [helper.make_tensor_value_info("input", TensorProto.FLOAT, [1, 4])],
                              [helper.make_tensor_value_info("out", TensorProto.FLOAT, [1, 4])])
    m = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("ai.fleetforge.test", 1)])
    m.ir_version = 8
    onnx.checker.check_model(m)
    path.parent.mkdir(parents=True, exist_ok=True)
    onnx.save(m, str(path))
    return path


async def test_a_failing_tool_ends_with_its_own_code_and_the_offline_planner_is_not_asked_again(temporal_env, env,
                                                                                                 tmp_path: Path):
    settings, store, _ = env
    model = build_unrunnable_onnx(tmp_path / "hub" / "nope.onnx")
    queues = fresh_queues()
    reg = build_registry(settings, store)
    async with new_worker(temporal_env.client, workflows=[ConverterWorkflow], activities=reg.by_kind["toolchain"],
                          task_queue=queues.workflows):
        handle = await start(temporal_env.client, queues, request(model, queues, target_soc="sm8550", precision=Precision.INT8,
                                                                  synthetic_calibration=True))
        result: ConversionResult = await outcome_of(handle, ConversionResult)
        progress = await handle.query(ConverterWorkflow.status)
        kinds = [ev.activity_task_scheduled_event_attributes.activity_type.name
                 async for ev in handle.fetch_history_events() if ev.HasField("activity_task_scheduled_event_attributes")]

    assert result.status is JobStatus.FAILED
    # the deterministic planner would answer the same plan: no replan, the step's own code and place
    assert result.failure is not None and result.failure.code == "EXECUTOR_ERROR" and result.failure.where == "quantize"
    assert "Nope" in result.failure.message and "/tmp/" not in result.failure.message, result.failure.message
    assert [a.outcome for a in result.attempts] == ["execution_failed"]
    assert progress.replans == 0 and progress.status is JobStatus.FAILED
    assert kinds.count("offline_planner_answer") == 1 and kinds.count("compile_plan") == 1, kinds
    assert kinds.count("execute_step") == 1, "the step failed once and was not retried (non-retryable)"
    record = RunStore(store).get(result.run_id)
    assert record.status is JobStatus.FAILED and record.error == result.failure
    ws = Workspace(store, settings.cache_dir, result.workspace)
    index = ws.index()
    assert {"logs/last_error.json", "logs/quantize.error.json", "plan.json", "compiled_steps.json"} <= set(index)
    assert "converted/nope_int8_qdq.onnx" not in index
    ws.materialize()
    last = json.loads(ws.path("logs/last_error.json").read_text())
    assert (last["code"], last["where"]) == ("EXECUTOR_ERROR", "quantize") and last["details"]["tool"] == "ortqnn.quantize_qdq"
    assert store.list_docs("cache/steps/") == [], "a failed step is never cached"


def test_heartbeats_flow_while_a_blocking_tool_runs():
    beats: list[object] = []
    enough = threading.Event()
    env = ActivityEnvironment()

    def on_heartbeat(*details: object) -> None:
        beats.append(details)
        if len(beats) >= 3:
            enough.set()

    env.on_heartbeat = on_heartbeat

    def blocking_tool() -> bool:
        with heartbeating("step", every_s=0.01):
            return enough.wait(10)

    assert env.run(blocking_tool) is True
    assert beats[0] == ("step",)


async def test_missing_calibration_data_fails_before_planning_with_calibration_invalid(temporal_env, env, tmp_path: Path):
    settings, store, model = env
    queues = fresh_queues()
    reg = build_registry(settings, store)
    req = request(model, queues, precision=Precision.INT8, output=OutputKind.ONNX_QDQ,
                  calibration=str(tmp_path / "missing.npz"))
    async with new_worker(temporal_env.client, workflows=[ConverterWorkflow], activities=reg.by_kind["toolchain"],
                          task_queue=queues.workflows):
        result: ConversionResult = await outcome_of(await start(temporal_env.client, queues, req), ConversionResult)

    assert result.status is JobStatus.FAILED
    assert result.failure is not None and result.failure.code == "CALIBRATION_INVALID"
    assert "missing.npz" in result.failure.message and "does not exist" in result.failure.message
    assert result.attempts == [] and result.executed_steps == [] and store.list_docs("cache/steps/") == []
    assert "logs/last_error.json" in Workspace(store, settings.cache_dir, result.workspace).index()


def tool_children() -> list[int]:
    """Pids of this process's tool children (activities/toolchains/isolate.py)."""
    import os

    out = []
    for d in Path("/proc").iterdir():
        if not d.name.isdigit():
            continue
        try:
            ppid = int((d / "stat").read_text().rsplit(")", 1)[1].split()[1])
            cmd = (d / "cmdline").read_bytes().replace(b"\0", b" ")
        except (OSError, IndexError, ValueError):
            continue
        if ppid == os.getpid() and b"activities.toolchains.isolate" in cmd:
            out.append(int(d.name))
    return out


@pytest.mark.slow
async def test_cancel_during_a_compile_kills_the_tool_and_ends_cancelled_without_another_activity(temporal_env, env):
    import onnx as onnx_pkg
    from temporalio.api.enums.v1 import EventType, WorkflowExecutionStatus

    from tests.reliability.worker_process import running_activity

    settings, store, _ = env
    # int8: the first tool is the quantizer, tens of seconds on vgg19 (an fp16 HTP compile of it takes ~2 s on an idle
    # machine, too short to cancel reliably in the middle)
    vgg = Path(onnx_pkg.__file__).parent / "backend" / "test" / "data" / "light" / "light_vgg19.onnx"
    queues = fresh_queues()
    reg = build_registry(settings, store)
    client = temporal_env.client
    async with new_worker(client, workflows=[ConverterWorkflow], activities=reg.by_kind["toolchain"], task_queue=queues.workflows):
        handle = await start(client, queues, request(vgg, queues, target_soc="sm8550", precision=Precision.INT8, preset="max_perf",
                                                         synthetic_calibration=True))
        await assert_eventually(lambda: running_activity(client, handle.id, "execute_step"), timeout=60,
                                message="the compile never started")
        children = await assert_eventually(tool_children, timeout=30, message="no compiler child process")
        await handle.cancel()
        await assert_eventually(lambda: not (set(tool_children()) & set(children)), timeout=20,
                                message="the compiler child outlived the cancellation")
        async def cancelled():
            d = await handle.describe()
            return d if d.status == WorkflowExecutionStatus.WORKFLOW_EXECUTION_STATUS_CANCELED else None

        desc = await assert_eventually(cancelled, timeout=20, message="the job did not end CANCELLED")
        events = [e async for e in handle.fetch_history_events()]
        progress = await handle.query(ConverterWorkflow.status)

    assert desc.status == WorkflowExecutionStatus.WORKFLOW_EXECUTION_STATUS_CANCELED
    assert desc.typed_search_attributes.get(STATUS) == "CANCELLED" and progress.status is JobStatus.CANCELLED
    asked = next(i for i, e in enumerate(events) if e.event_type == EventType.EVENT_TYPE_WORKFLOW_EXECUTION_CANCEL_REQUESTED)
    assert not [e for e in events[asked:] if e.event_type == EventType.EVENT_TYPE_ACTIVITY_TASK_SCHEDULED], \
        "nothing is replanned, compiled or recorded after the cancellation"
    assert events[-1].event_type == EventType.EVENT_TYPE_WORKFLOW_EXECUTION_CANCELED
    step = max(i for i, e in enumerate(events) if e.event_type == EventType.EVENT_TYPE_ACTIVITY_TASK_SCHEDULED
               and e.activity_task_scheduled_event_attributes.activity_type.name == "execute_step")
    assert not [e for e in events[step:] if e.event_type == EventType.EVENT_TYPE_ACTIVITY_TASK_COMPLETED], \
        "the running tool was stopped, it did not finish"
    made = [p.name for p in settings.cache_dir.rglob("*") if p.name.endswith(("_qnn.bin", ".qdq.onnx", "_qdq.onnx"))]
    assert not made, ("the tool was killed before it wrote its output", made)


TOOL_METHODS = ("planner_tool", "load_plan", "compile_plan", "execute_step", "evaluate",
                "offline_planner_answer", "prepare_calibration", "record_failure", "write_report")


def activities_with(reg, tools) -> list:  # noqa: ANN001
    """The toolchain queue's activities with `tools` (a ToolchainActivities) in place of the registry's own."""
    from activities.toolchains.activities import ToolchainActivities

    others = [a for a in reg.by_kind["toolchain"] if not isinstance(getattr(a, "__self__", None), ToolchainActivities)]
    return others + [getattr(tools, name) for name in TOOL_METHODS]


async def test_a_cache_entry_made_under_one_toolchain_version_is_not_reused_under_another(temporal_env, env):
    from activities.toolchains.activities import ToolchainActivities
    from activities.toolchains.versions import toolchain_versions

    settings, store, model = env
    reg = build_registry(settings, store)
    installed = toolchain_versions()
    upgraded = installed | {"onnxruntime-qnn": installed["onnxruntime-qnn"] + ".post1", "qnn-sdk": "9.99.0"}
    results = []
    for versions in (installed, upgraded, installed):
        queues = fresh_queues()
        tools = ToolchainActivities(store, settings, toolchain=versions)
        async with new_worker(temporal_env.client, workflows=[ConverterWorkflow], activities=activities_with(reg, tools),
                              task_queue=queues.workflows):
            handle = await start(temporal_env.client, queues, request(model, queues, target_soc="sm8550", precision=Precision.FP16))
            results.append(await outcome_of(handle, ConversionResult))

    first, other, again = results
    assert all(r.status is JobStatus.COMPLETED for r in results), [r.failure for r in results]
    assert first.executed_steps == ["context_binary"] and not first.evaluation.cached
    assert other.executed_steps == ["context_binary"] and other.cached_steps == [], "another toolchain: a miss"
    assert not other.evaluation.cached, "the evaluation cache keys on the toolchain too"
    assert again.cached_steps == ["context_binary"] and again.executed_steps == [] and again.evaluation.cached
    entries = [json.loads(store.get_doc(k)) for k in store.list_docs("cache/steps/")]
    assert sorted(e["toolchain"]["onnxruntime-qnn"] for e in entries) == sorted(
        [installed["onnxruntime-qnn"], upgraded["onnxruntime-qnn"]])


def tiny_calibration(path: Path, scale: float, samples: int = 40) -> Path:
    import numpy as np

    rng = np.random.default_rng(7)
    np.savez(path, input=(rng.uniform(0.0, 1.0, size=(samples, 1, 3, 32, 32)) * scale).astype(np.float32))
    return path


def input_scale(store: ArtifactStore, result: ConversionResult) -> float:
    """The scale of the QuantizeLinear that quantizes the graph input in the run's QDQ model."""
    import onnx
    from onnx import numpy_helper

    (ref,) = [a for a in result.artifacts if a.name.endswith("_qdq.onnx")]
    m = onnx.load_from_string(store.get_bytes(ref))
    q = next(n for n in m.graph.node if n.op_type == "QuantizeLinear" and n.input[0] == "input")
    init = {i.name: i for i in m.graph.initializer}
    return float(numpy_helper.to_array(init[q.input[1]]))


async def test_calibration_data_sets_the_scales_and_a_held_out_part_of_it_grades_the_result(temporal_env, env,
                                                                                            tmp_path: Path):
    """Real data: the quantizer calibrates on one part, the gate grades the other (calibration ∩
    evaluation = ∅, read back from the workspace); synthetic calibration completes `unverified`."""
    import numpy as np

    from activities.toolchains.feeds import overlap, read_npz

    settings, store, model = env
    queues = fresh_queues()
    reg = build_registry(settings, store)
    calib = tiny_calibration(tmp_path / "calib.npz", scale=10.0)
    async with new_worker(temporal_env.client, workflows=[ConverterWorkflow], activities=reg.by_kind["toolchain"],
                          task_queue=queues.workflows):
        synthetic = await outcome_of(await start(temporal_env.client, queues, request(
            model, queues, target_soc="sm8550", precision=Precision.INT8, preset="fast", synthetic_calibration=True)),
            ConversionResult)
        real = await outcome_of(await start(temporal_env.client, queues, request(
            model, queues, target_soc="sm8550", precision=Precision.INT8, preset="fast", calibration=str(calib))), ConversionResult)

    assert synthetic.status is JobStatus.COMPLETED and real.status is JobStatus.COMPLETED, (synthetic.failure, real.failure)
    # the input's range: synthetic standard normal (both signs) vs. the data's [0, 10): another scale
    s_scale, r_scale = input_scale(store, synthetic), input_scale(store, real)
    assert abs(r_scale - 10.0 / 255) < 0.2 * 10.0 / 255 and abs(s_scale - r_scale) > 0.2 * r_scale, (s_scale, r_scale)
    assert synthetic.evaluation.inputs == "synthetic" and real.evaluation.inputs == "held_out"
    assert synthetic.evaluation.samples == 32 and synthetic.evaluation.families == ["natural images", "noise"]
    assert real.evaluation.samples == 20 and real.evaluation.calibration == "data" and real.evaluation.calibration_samples == 20
    assert real.accuracy.verdict == "passed" and real.accuracy.samples == 20
    assert synthetic.accuracy.verdict == "unverified" and "unverified on real data" in synthetic.accuracy.note
    assert not any("synthetic" in w for w in real.warnings), real.warnings
    assert any("unverified on real data" in w for w in synthetic.warnings), synthetic.warnings
    assert real.requested_precision is real.delivered_precision is Precision.INT8

    ws = Workspace(store, settings.cache_dir, real.workspace)
    index = ws.index()
    copies = sorted(k for k in index if k.startswith(("input/calibration_", "input/evaluation_")) and k.endswith(".npz"))
    assert [c.split("_")[0] for c in copies] == ["input/calibration", "input/evaluation"], copies
    assert all(c.rsplit("_", 1)[1][:-4] == index[c].sha256[:16] for c in copies)
    ws.materialize()
    cal, held = (read_npz(ws.path(c))["input"] for c in copies)
    assert len(cal) == len(held) == 20
    everything = np.load(calib)["input"]
    as_feeds = lambda a: [{"input": x} for x in a]  # noqa: E731
    assert overlap(as_feeds(held), as_feeds(cal)) == 0, "the gate never grades a calibration sample"
    assert overlap(as_feeds(everything), as_feeds(np.concatenate([cal, held]))) == 40, "nothing invented, nothing lost"


async def test_a_conversion_whose_tools_ran_unconfined_says_so(temporal_env, env):
    """FLEETFORGE_SANDBOX=off is the operator's loud opt-out: the converted result names it (and a sandboxed
    run says nothing)."""
    from activities import sandbox

    settings, store, model = env
    reg = build_registry(settings, store)
    results = []
    for mode in ("off", "bwrap"):
        sandbox.configure(mode)
        try:
            queues = fresh_queues()
            async with new_worker(temporal_env.client, workflows=[ConverterWorkflow], task_queue=queues.workflows,
                                  activities=reg.by_kind["toolchain"]):
                handle = await start(temporal_env.client, queues, request(model, queues, target_soc="sm8550",
                                                                        precision=Precision.FP16, preset="fast"))
                results.append(await outcome_of(handle, ConversionResult))
        finally:
            sandbox.configure("bwrap")
    unconfined, confined = results
    assert unconfined.status is JobStatus.COMPLETED and any("UNCONFINED" in w for w in unconfined.warnings)
    assert confined.status is JobStatus.COMPLETED and not any("UNCONFINED" in w for w in confined.warnings)
