"""ConverterWorkflow with the LLM planner (llm="openai") against a scripted OpenAI-compatible server:
the ReAct loop over planner-only tools, compiler feedback → replan, NEEDS_INPUT, the tool-call cap
and the allowlist. Real dev server, real compiler and a real ort-qnn compile for the good plans."""

from __future__ import annotations

import json
import uuid
from pathlib import Path
from typing import Any

import pytest
from temporalio.api.sdk.v1 import WorkflowMetadata
from temporalio.client import Client, WorkflowHandle, WorkflowUpdateFailedError
from temporalio.worker import Replayer

from activities.storage import ArtifactStore, FileStore
from contracts.common import JobKind, JobStatus, TaskQueues
from contracts.convert_job import ConversionRequest, ConversionResult, ProvideInput
from contracts.settings import Settings
from examples.tiny_model import build_tiny_cnn
from tests.doubles.openai_server import Scripted, ScriptedOpenAIServer, json_reply
from tests.helpers import assert_eventually, fresh_queues, new_worker, outcome_of
from worker import build_registry
from workflows._visibility import start_attributes
from workflows.converter import ConverterWorkflow
from workflows.presentation import GUTTER

pytest.importorskip("onnxruntime_qnn")

CTX = "converted/tiny_fp16_sm8550_ctx.onnx"


def step(**over: Any) -> dict[str, Any]:
    s: dict[str, Any] = {"step_id": "context_binary", "tool_name": "ortqnn.context_binary",
                         "required_args": {"model": "input/tiny.onnx", "soc": "sm8550", "output": CTX},
                         "optional_args": {"precision": "fp16"}, "expected_outputs": [CTX], "depends_on": []}
    s.update(over)
    return s


def plan(*steps: dict[str, Any]) -> Scripted:
    doc = {"status": "OK", "intent": {"reference": "input/tiny.onnx", "evaluate": CTX},
           "steps": list(steps) or [step()], "questions": [], "rationale": "fp16 context binary"}
    return json_reply("```json\n" + json.dumps(doc) + "\n```")


def tool_call(name: str, arguments: dict[str, Any] | None = None, call_id: str = "call_1") -> Scripted:
    return json_reply(tool_calls=[{"id": call_id, "type": "function",
                                   "function": {"name": name, "arguments": json.dumps(arguments or {})}}],
                      finish_reason="tool_calls")


@pytest.fixture
def hub(tmp_path: Path) -> tuple[Path, ArtifactStore]:
    return build_tiny_cnn(tmp_path / "hub" / "tiny.onnx"), FileStore(tmp_path / "artifacts")


async def convert(client: Client, server: ScriptedOpenAIServer, tmp_path: Path, store: ArtifactStore, model: Path,
                  *, answers: list[ProvideInput] | None = None, shown: list[WorkflowMetadata] | None = None,
                  **kw: Any) -> tuple[ConversionResult, WorkflowHandle, list[str]]:
    """Run one LLM-planned conversion; `answers` are sent (in order) once the job waits for input.
    Returns the result, the handle and the validator's rejection messages; `shown` gets what the Web UI
    shows of the ended job (its user metadata)."""
    settings = Settings(state_dir=tmp_path / "state", llm="openai", llm_base_url=server.base_url, llm_model="test-model")
    reg = build_registry(settings, store)
    queues: TaskQueues = fresh_queues()
    kw = {"target_soc": "sm8550", "precision": "fp16"} | kw
    req = ConversionRequest(model=str(model), queues=queues, run_id=uuid.uuid4().hex[:8], llm="openai", **kw)
    rejections: list[str] = []
    async with new_worker(client, workflows=[ConverterWorkflow], task_queue=queues.workflows,
                          activities=reg.by_kind["toolchain"] + reg.by_kind["llm"]):
        handle = await client.start_workflow(
            ConverterWorkflow.run, req, id=f"convert-llm/{uuid.uuid4().hex[:8]}", task_queue=queues.workflows,
            search_attributes=start_attributes(JobKind.CONVERT, req.model, req.target_soc or ""))
        for answer in answers or []:
            async def waiting() -> bool:
                return (await handle.query(ConverterWorkflow.status)).status is JobStatus.NEEDS_INPUT
            await assert_eventually(waiting, timeout=30, message="the job never asked for input")
            try:
                await handle.execute_update(ConverterWorkflow.provide_input, answer)
            except WorkflowUpdateFailedError as e:
                rejections.append(str(e.cause))
        result = await outcome_of(handle, ConversionResult)
        if shown is not None:
            shown.append(await handle.query("__temporal_workflow_metadata", result_type=WorkflowMetadata))
        return result, handle, rejections


def sent_messages(server: ScriptedOpenAIServer, i: int = -1) -> list[dict[str, Any]]:
    return server.requests[i]["messages"]


async def scheduled_activities(handle: WorkflowHandle) -> list[str]:
    out = []
    async for ev in handle.fetch_history_events():
        if ev.HasField("activity_task_scheduled_event_attributes"):
            out.append(ev.activity_task_scheduled_event_attributes.activity_type.name)
    return out


async def test_missing_required_arg_is_fed_back_once_and_the_replan_succeeds(temporal_env, hub, tmp_path: Path):
    model, store = hub
    no_soc = step(required_args={"model": "input/tiny.onnx", "output": CTX})
    with ScriptedOpenAIServer([tool_call("list_tools"), tool_call("get_tool_spec", {"name": "ortqnn.context_binary"}),
                               plan(no_soc), plan()]) as server:
        result, handle, _ = await convert(temporal_env.client, server, tmp_path, store, model)

    assert result.status is JobStatus.COMPLETED, result.failure
    assert [a.outcome for a in result.attempts] == ["compile_rejected", "succeeded"]
    assert "soc" in result.attempts[0].feedback and "COMPILER_ERROR" in result.attempts[0].feedback
    assert result.executed_steps == ["context_binary"]
    assert result.evaluation is not None and result.evaluation.cosine > 0.999
    assert len(server.requests) == 4
    # the planner tools ran as activities and their answers went back to the LLM
    tool_msgs = [m for m in sent_messages(server, 1) if m["role"] == "tool"]
    assert tool_msgs and "ortqnn.context_binary" in tool_msgs[0]["content"]
    assert '"name":"soc"' in [m for m in sent_messages(server, 2) if m["role"] == "tool"][-1]["content"].replace(" ", "")
    # the compiler's feedback is in the replan's messages exactly once
    last = sent_messages(server)
    assert sum("previous plan failed" in (m["content"] or "") for m in last) == 1
    assert server.requests[-1]["tools"] and {t["function"]["name"] for t in server.requests[-1]["tools"]} == {
        "list_tools", "get_tool_spec", "dry_run"}
    assert result.tokens.calls == 4 and result.tokens.total_tokens == 60 and result.tokens.latency_s > 0
    assert (await scheduled_activities(handle)).count("planner_tool") == 2
    (planner,) = result.planner
    assert planner.source == "llm" and planner.llm_answers == 2 and len(planner.rejections) == 1
    assert result.accuracy is not None and result.accuracy.verdict == "passed"


async def test_absolute_and_dotdot_paths_are_rejected_before_anything_runs(temporal_env, hub, tmp_path: Path):
    model, store = hub
    absolute = step(required_args={"model": "input/tiny.onnx", "soc": "sm8550", "output": str(tmp_path / "evil.onnx")},
                    expected_outputs=[str(tmp_path / "evil.onnx")])
    dotdot = step(required_args={"model": "../../hub/tiny.onnx", "soc": "sm8550", "output": CTX})
    with ScriptedOpenAIServer([plan(absolute), plan(dotdot), plan()]) as server:
        result, handle, _ = await convert(temporal_env.client, server, tmp_path, store, model)

    assert result.status is JobStatus.COMPLETED, result.failure
    assert [a.outcome for a in result.attempts] == ["compile_rejected", "compile_rejected", "succeeded"]
    assert all("PATH_ESCAPE" in a.feedback for a in result.attempts[:2]), result.attempts
    assert not (tmp_path / "evil.onnx").exists()
    assert (await scheduled_activities(handle)).count("execute_step") == 1, "only the clean plan ran"


async def test_refused_plans_fall_back_to_the_offline_planner_once_the_repairs_are_spent(temporal_env, hub, tmp_path: Path):
    model, store = hub
    unknown = step(tool_name="ortqnn.make_it_fast")
    extra = step(optional_args={"precision": "fp16", "turbo": True})
    with ScriptedOpenAIServer([plan(unknown), plan(extra)]) as server:
        result, handle, _ = await convert(temporal_env.client, server, tmp_path, store, model, max_replans=1)

    assert len(server.requests) == 2, "max_replans=1: the first answer and one repair"
    assert "ortqnn.make_it_fast" in result.attempts[0].feedback
    assert "turbo" in result.attempts[1].feedback
    # the LLM's refusals are not a verdict about the model: the offline planner's plan ran
    assert result.status is JobStatus.COMPLETED, result.failure
    assert [a.outcome for a in result.attempts] == ["compile_rejected", "compile_rejected", "succeeded"]
    (planner,) = result.planner
    assert planner.source == "fallback" and planner.llm_answers == 2 and len(planner.rejections) == 2
    assert "turbo" in planner.fallback_reason and "make_it_fast" in planner.rejections[0]
    assert any("offline planner" in w for w in result.warnings), result.warnings
    activities = await scheduled_activities(handle)
    assert activities.count("offline_planner_answer") == 1 and activities.count("execute_step") == 1, activities
    assert result.executed_steps == ["context_binary"]


async def test_needs_input_from_the_llm_validates_answers_and_completes(temporal_env, hub, tmp_path: Path):
    model, store = hub
    ask = json_reply(json.dumps({"status": "NEEDS_INPUT", "questions": ["Which SoC?"], "rationale": "no SoC"}))
    with ScriptedOpenAIServer([ask, plan()]) as server:
        result, handle, rejections = await convert(
            temporal_env.client, server, tmp_path, store, model, target_soc=None,
            answers=[ProvideInput(soc="sm9999"), ProvideInput(soc="sm8550")])

    assert len(rejections) == 1 and "sm9999" in rejections[0]
    assert result.status is JobStatus.COMPLETED, result.failure
    assert result.executed_steps == ["context_binary"]
    answered = [m["content"] for m in sent_messages(server) if m["role"] == "user" and "user answered" in (m["content"] or "")]
    assert len(answered) == 1 and "SM8550" in answered[0]
    # the LLM-planned history (LLM calls, durable wait, update) replays deterministically
    replayer = Replayer(workflows=[ConverterWorkflow], data_converter=temporal_env.client.data_converter)
    await replayer.replay_workflow(await handle.fetch_history())


async def test_tool_call_loop_stops_at_planner_max_tool_iters_and_falls_back_offline(temporal_env, hub, tmp_path: Path):
    model, store = hub
    with ScriptedOpenAIServer([tool_call("list_tools", call_id=f"c{i}") for i in range(6)]) as server:
        result, handle, _ = await convert(temporal_env.client, server, tmp_path, store, model, planner_max_tool_iters=3,
                                          max_replans=1)

    assert len(server.requests) == 6, "each of the 2 answers asks the LLM at most planner_max_tool_iters times"
    assert (await scheduled_activities(handle)).count("planner_tool") == 6
    (planner,) = result.planner
    assert planner.source == "fallback" and planner.llm_answers == 2
    assert all("planner_max_tool_iters=3" in r for r in planner.rejections), planner.rejections
    assert any("planner_max_tool_iters=3" in w and "offline planner" in w for w in result.warnings), result.warnings
    assert result.status is JobStatus.COMPLETED, result.failure
    assert result.executed_steps == ["context_binary"]


async def test_planner_calling_a_conversion_tool_directly_is_refused(temporal_env, hub, tmp_path: Path):
    model, store = hub
    direct = tool_call("ortqnn.context_binary", {"model": "input/tiny.onnx", "soc": "sm8550", "output": CTX})
    with ScriptedOpenAIServer([direct, plan()]) as server:
        result, handle, _ = await convert(temporal_env.client, server, tmp_path, store, model)

    refused = [m for m in sent_messages(server) if m["role"] == "tool"]
    assert len(refused) == 1 and "refused" in refused[0]["content"] and "not a planner tool" in refused[0]["content"]
    activities = await scheduled_activities(handle)
    assert "planner_tool" not in activities and activities.count("execute_step") == 1
    assert result.status is JobStatus.COMPLETED and result.executed_steps == ["context_binary"]


def build_softmax_head(path: Path) -> Path:
    """A small model ending in a 1000-way softmax of near-zero logits: every output is about 1/1000,
    below one step of an 8-bit output encoding (1/255), so plain int8 rounds it all to zero."""
    import numpy as np
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    w = numpy_helper.from_array((np.random.default_rng(0).standard_normal((16, 1000)) * 0.01).astype(np.float32), "w")
    nodes = [helper.make_node("MatMul", ["x", "w"], ["logits"]), helper.make_node("Softmax", ["logits"], ["prob"], axis=1)]
    g = helper.make_graph(nodes, "softmax_head", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 16])],
                          [helper.make_tensor_value_info("prob", TensorProto.FLOAT, [1, 1000])], initializer=[w])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    m.ir_version = 8
    path.parent.mkdir(parents=True, exist_ok=True)
    onnx.save(m, str(path))
    return path


def int8_plan(float_outputs: list[str] | None = None, precision: str = "int8") -> Scripted:
    src, qdq, ctx = "input/head.onnx", f"converted/head_{precision}_qdq.onnx", f"converted/head_{precision}_sm8550_ctx.onnx"
    quant = {"step_id": "quantize", "tool_name": "ortqnn.quantize_qdq",
             "required_args": {"model": src, "output": qdq, "precision": precision},
             "optional_args": {"float_outputs": float_outputs} if float_outputs else {}, "expected_outputs": [qdq]}
    compile_ = {"step_id": "context_binary", "tool_name": "ortqnn.context_binary", "depends_on": ["quantize"],
                "required_args": {"model": qdq, "soc": "sm8550", "output": ctx},
                "optional_args": {"precision": precision, "graph_optimization": "fast"}, "expected_outputs": [ctx]}
    doc = {"status": "OK", "intent": {"reference": src, "evaluate": ctx, "precision": precision}, "steps": [quant, compile_],
           "rationale": precision + (" with the softmax in float" if float_outputs else "")}
    return json_reply(json.dumps(doc))


async def test_the_llm_gets_the_accuracy_figures_and_its_remedy_passes_the_gate(temporal_env, tmp_path: Path):
    store = FileStore(tmp_path / "artifacts")
    head = build_softmax_head(tmp_path / "hub" / "head.onnx")
    with ScriptedOpenAIServer([int8_plan(), int8_plan(["prob"])]) as server:
        shown: list[WorkflowMetadata] = []
        result, handle, _ = await convert(temporal_env.client, server, tmp_path, store, head, precision="int8",
                                          synthetic_calibration=True, shown=shown)

    assert result.status is JobStatus.COMPLETED, result.failure
    assert [a.outcome for a in result.attempts] == ["below_threshold", "succeeded"]
    details = shown[0].current_details.replace(GUTTER, "")
    assert "| step | completed |" in details and "| replans | 1 |" in details, details
    assert "last error" not in details, "a completed job's details show where it is, not the first attempt's error"
    feedback = [m["content"] for m in sent_messages(server) if m["role"] == "user" and "accuracy gate" in (m["content"] or "")]
    assert len(feedback) == 1 and "prob: lowest per-sample cosine 0.0000" in feedback[0] and "w8a16" in feedback[0], feedback
    assert result.accuracy.verdict == "unverified" and result.accuracy.cosine >= 0.95 and result.offload.full
    assert [p.source for p in result.planner] == ["llm", "llm"]


async def test_an_int8_request_is_never_delivered_as_w8a16_without_the_users_consent(temporal_env, tmp_path: Path):
    from contracts.convert import Precision

    store = FileStore(tmp_path / "artifacts")
    head = build_softmax_head(tmp_path / "hub" / "head.onnx")
    with ScriptedOpenAIServer([int8_plan(precision="w8a16"), int8_plan(["prob"])]) as server:
        kept, handle, _ = await convert(temporal_env.client, server, tmp_path, store, head, precision="int8",
                                        synthetic_calibration=True)
    assert kept.status is JobStatus.COMPLETED, kept.failure
    assert kept.requested_precision is kept.delivered_precision is Precision.INT8
    assert [a.outcome for a in kept.attempts] == ["compile_rejected", "succeeded"], kept.attempts
    assert "delivers w8a16" in kept.attempts[0].feedback and "--precision-fallback" in kept.attempts[0].feedback
    assert (await scheduled_activities(handle)).count("execute_step") == 2, "the w8a16 plan never ran"
    told = [m["content"] for m in sent_messages(server) if m["role"] == "user" and "delivers w8a16" in (m["content"] or "")]
    assert told, "the LLM is told why its plan was refused"

    with ScriptedOpenAIServer([int8_plan(precision="w8a16")]) as server:
        allowed, _, _ = await convert(temporal_env.client, server, tmp_path / "allowed", store, head, precision="int8",
                                      synthetic_calibration=True, precision_fallback=True)
    assert allowed.status is JobStatus.COMPLETED, allowed.failure
    assert (allowed.requested_precision, allowed.delivered_precision) == (Precision.INT8, Precision.W8A16)
    assert allowed.report is not None and allowed.report.delivered_precision is Precision.W8A16
