"""ConductorWorkflow against the real dev server: offline designer/coder, real verifier children."""

from __future__ import annotations

import json
import uuid
from pathlib import Path

import pytest
from temporalio.client import Client
from temporalio.contrib.pydantic import pydantic_data_converter
from temporalio.worker import Replayer

from activities.kernels.config_loader import load_workflow_config
from activities.kernels.task_source import apply_overrides
from activities.storage import ArtifactStore
from client.artifacts import kernel_trace
from client.kernel import with_source_in_store
from contracts.common import JobKind, JobStatus
from contracts.kernel import FinishReason, KernelTask
from contracts.kernel_job import KernelOutcome, KernelRequest, KernelResult
from contracts.settings import Settings
from tests.helpers import fresh_queues, new_worker, outcome_of
from worker import build_registry
from workflows._visibility import start_attributes
from workflows.conductor import ConductorWorkflow

EXAMPLES = Path(__file__).resolve().parents[2] / "examples" / "kernels"
KERNELBENCH = EXAMPLES.parent / "kernelbench"


ALL_EXAMPLES = ["relu", "leaky_relu", "gelu", "softmax", "log_softmax", "sum_dim", "rmsnorm", "matmul"]


def task_for(name: str, **kw: object) -> KernelTask:
    return KernelTask(op_name=name, task_desc=(EXAMPLES / f"{name}.py").read_text(), task_id=f"{name}-{uuid.uuid4().hex[:6]}",
                      arch="cpu-interpreter", **kw)


def kernel_activities(settings: Settings, store: ArtifactStore) -> list:
    """The kernel agents (llm queue) and the verifier/trace (kernels queue), for a one-queue test worker."""
    reg = build_registry(settings, store)
    return reg.by_kind["llm"] + reg.by_kind["kernels"]


async def run_conductor(client: Client, store: ArtifactStore, settings: Settings, task: KernelTask,
                        workflow: str = "default", histories: list | None = None) -> tuple[KernelResult, list]:
    queues = fresh_queues()
    req = KernelRequest(task=task, config=load_workflow_config(workflow), queues=queues, verify_timeout_s=90)
    async with new_worker(client, workflows=[ConductorWorkflow], activities=kernel_activities(settings, store),
                          task_queue=queues.workflows):
        handle = await client.start_workflow(
            ConductorWorkflow.run, req, id=f"kernel/{task.task_id}", task_queue=queues.workflows,
            search_attributes=start_attributes(JobKind.KERNEL, task.op_name),
        )
        result = await outcome_of(handle, KernelResult)
        trace = await handle.query(ConductorWorkflow.trace)
        if histories is not None:
            histories.append(await handle.fetch_history())
    return result, trace


@pytest.mark.slow
async def test_all_eight_examples_end_verified_offline_through_one_worker(temporal_env, file_store, settings):
    """Acceptance: relu, leaky_relu, gelu, softmax, log_softmax, sum over a dim, rmsnorm and matmul
    (non-power-of-two sizes) end VERIFIED under the Triton interpreter, all through one worker (first_verified:
    the optimizer's rounds have their own tests), and each kernel compiles for the H100 the speed is modeled on."""
    client = temporal_env.client
    queues = fresh_queues()
    tasks = [task_for(op) for op in ALL_EXAMPLES]
    async with new_worker(client, workflows=[ConductorWorkflow], activities=kernel_activities(settings, file_store),
                          task_queue=queues.workflows):
        handles = [await client.start_workflow(
            ConductorWorkflow.run, KernelRequest(task=t, config=load_workflow_config("first_verified"), queues=queues,
                                                 verify_timeout_s=120),
            id=f"kernel/{t.task_id}", task_queue=queues.workflows,
            search_attributes=start_attributes(JobKind.KERNEL, t.op_name)) for t in tasks]
        results: list[KernelResult] = [await outcome_of(h, KernelResult) for h in handles]
        first_trace = await handles[0].query(ConductorWorkflow.trace)

    assert {t.op_name: r.outcome for t, r in zip(tasks, results)} == {op: KernelOutcome.VERIFIED for op in ALL_EXAMPLES}, \
        [r.report.reason for r in results if r.report and not r.report.passed]
    traces = [kernel_trace(file_store, r) for r in results]
    for result, trace in zip(results, traces):
        assert result.status is JobStatus.COMPLETED and result.finish_reason is FinishReason.VERIFIED
        assert result.report is not None and result.report.passed and result.report.static.ok
        compiled = result.report.gpu_compile  # the roofline GPU's compiler took every kernel of the job
        assert compiled is not None and compiled.compiles is True and compiled.target == "sm_90 (H100 SXM5 80GB)"
        assert compiled.kernels and compiled.summary in trace[-1].summary
        assert [(e.agent, e.ok, e.provider) for e in trace] == [
            ("designer", True, "offline"), ("coder", True, "offline"), ("verifier", True, None)]
        assert result.speedup is None and result.timing is None  # nothing measured on CPU: modeled only
        modeled = result.modeled
        assert modeled is not None and result.speed == modeled.summary and result.speed.startswith("modeled on H100")
        assert modeled.launches >= 1 and modeled.sol_ms <= modeled.modeled_ms and modeled.breakdown is not None
        assert trace[-1].modeled == modeled and result.precision_used == "strict"
        assert json.loads(file_store.get_bytes(modeled.breakdown))["label"] == "modeled, not measured"
        assert (result.tokens.calls, result.tokens.total_tokens) == (2, 0), "designer + coder answers, offline"
        source = file_store.get_bytes(result.best_candidate).decode()
        assert "@triton.jit" in source and "class ModelNew" in source
        assert [e.provenance.source for e in trace[:2]] == ["offline", "offline"]
        assert result.fallbacks == [] and result.duplicates_refused == 0 and result.aten_ops
        for entry in trace[:2]:  # offline answers are recorded exactly like LLM answers
            assert entry.transcript is not None, entry
            transcript = json.loads(file_store.get_bytes(entry.transcript))
            assert (transcript["provider"], transcript["agent"]) == ("offline", f"kernel-{entry.agent}")
            assert transcript["response"]["usage"]["total"] == 0
            assert transcript["response"]["content"][0]["text"] == file_store.get_bytes(entry.output).decode()
    assert first_trace == traces[0], "the stored trace is the one the job queried"
    assert [r.op_family for r in results] == [
        "lowered: relu", "lowered: leaky_relu", "lowered: gelu", "lowered: softmax",
        "lowered: log_softmax", "lowered: sum", "lowered: mul → mean → add → sqrt → div", "lowered: mm"]
    replay = await Replayer(workflows=[ConductorWorkflow], data_converter=pydantic_data_converter).replay_workflow(
        await handles[0].fetch_history(), raise_on_replay_failure=False)
    assert replay.replay_failure is None, "the conductor's history must replay deterministically"


async def test_on_cpu_a_candidate_modeled_at_the_speed_of_light_is_delivered_without_optimizer_rounds(
        temporal_env, file_store, settings):
    """On the Triton interpreter the modeled speed is the one to beat. The coder's relu runs on the interpreter's
    large blocks but is modeled on the grid a GPU launch of it takes (its launcher declares it), which fills the
    SMs: at >= 95 % of SOL there is nothing for the optimizer to win, and no round runs."""
    result, trace = await run_conductor(temporal_env.client, file_store, settings, task_for("relu"), "default")

    assert result.outcome is KernelOutcome.VERIFIED and result.finish_reason is FinishReason.VERIFIED
    assert [(e.agent, e.ok) for e in trace] == [("designer", True), ("coder", True), ("verifier", True)]
    assert result.speedup is None and result.speed.startswith("modeled on H100")
    assert result.modeled is not None and result.modeled.sol_fraction >= 0.95 and result.modeled == trace[2].modeled
    assert result.best_candidate == trace[1].artifact and result.report is not None and result.report.passed


async def test_a_max_step_without_room_to_verify_ends_before_any_agent_runs(temporal_env, file_store, settings):
    result, trace = await run_conductor(temporal_env.client, file_store, settings, task_for("relu", max_step=2))

    assert result.outcome is KernelOutcome.MAX_STEPS and result.status is JobStatus.FAILED
    assert result.finish_reason is FinishReason.MAX_STEPS and result.steps == 0 and trace == []
    assert result.failure is not None and result.failure.code == "MAX_STEPS"
    assert "max_step 2 leaves no room to verify a candidate" in result.failure.message
    assert result.op_family == "lowered: relu" and result.aten_ops == ["aten.relu.default"]


async def test_a_job_that_fails_after_some_steps_keeps_its_trace_in_the_store(temporal_env, file_store, settings):
    import torch

    if torch.cuda.is_available():
        pytest.skip("needs a kernels worker without a GPU (the verifier refuses an h100 task there)")
    histories: list = []
    task = task_for("relu").model_copy(update={"arch": "h100"})
    result, trace = await run_conductor(temporal_env.client, file_store, settings, task, histories=histories)

    assert result.status is JobStatus.FAILED and result.failure is not None and result.failure.code == "VERIFIER_ERROR"
    assert "needs a GPU" in result.failure.message
    assert [(e.agent, e.ok) for e in trace] == [("designer", True), ("coder", True)]
    assert kernel_trace(file_store, result) == trace, "the steps before the failure are recorded like a finished job's"
    replay = await Replayer(workflows=[ConductorWorkflow], data_converter=pydantic_data_converter).replay_workflow(
        histories[0], raise_on_replay_failure=False)
    assert replay.replay_failure is None


async def test_a_worker_with_another_triton_fails_the_job_as_its_own_problem_not_the_candidates(
        temporal_env, file_store, settings, monkeypatch):
    """Under Triton 3.6 with numpy 2.4 (a GPU box's own torch), every interpreted candidate crashed and was
    blamed; the verifier hooks the interpreters of Triton 3.7-3.9, so another release is the worker's failure."""
    import importlib.metadata

    real = importlib.metadata.version
    monkeypatch.setattr(importlib.metadata, "version", lambda name: "3.6.0" if name == "triton" else real(name))
    result, trace = await run_conductor(temporal_env.client, file_store, settings, task_for("relu"))

    assert result.status is JobStatus.FAILED and result.failure is not None and result.failure.code == "VERIFIER_ERROR"
    assert "this kernels worker has Triton 3.6.0" in result.failure.message
    assert "triton>=3.7.1,<3.10" in result.failure.message
    assert not [e for e in trace if e.agent == "verifier"], "no candidate got a verdict from a worker that cannot judge it"


SORT = (KERNELBENCH / "36_Cumsum.py").read_text().replace("torch.cumsum(x, dim=self.dim)", "torch.sort(x, dim=self.dim)[0]")
"""An op nothing offline lowers (sorting)."""


async def test_an_op_without_offline_template_ends_at_once_naming_its_aten_ops(temporal_env, file_store, settings):
    source = apply_overrides(SORT, {"batch_size": 4, "length": 10})
    task = KernelTask(op_name="Sort", task_desc=source, task_id=f"sort-{uuid.uuid4().hex[:6]}", arch="cpu",
                      overrides={"batch_size": 4, "length": 10})
    for workflow in ("default", "coder_only"):
        result, trace = await run_conductor(temporal_env.client, file_store, settings, task, workflow=workflow)
        assert result.outcome is KernelOutcome.FAILED and result.finish_reason is FinishReason.NO_OFFLINE_TEMPLATE
        assert [(e.agent, e.ok) for e in trace] == [("designer" if workflow == "default" else "coder", False)]
        assert result.failure is not None and result.failure.code == "NO_OFFLINE_TEMPLATE"
        assert "no lowering for sort" in result.failure.message and "(aten ops: aten.sort.default)" in result.failure.message
        assert "configure an LLM" in result.failure.message
        assert result.overrides == {"batch_size": 4, "length": 10}


async def test_a_task_too_big_for_the_verifier_is_refused_before_any_agent(temporal_env, file_store, settings):
    task = KernelTask(op_name="ReLU", task_desc=(KERNELBENCH / "01_ReLU.py").read_text(),
                      task_id=f"relu-big-{uuid.uuid4().hex[:6]}", arch="cpu-interpreter")
    result, trace = await run_conductor(temporal_env.client, file_store, settings, task)

    assert result.status is JobStatus.FAILED and trace == [] and result.steps == 0
    assert result.failure is not None and result.failure.code == "KERNEL_TASK_INVALID"
    assert "the task's inputs take 2.0 GiB (2048x262144 float32)" in result.failure.message
    assert "--set batch_size=N --set dim=N (now batch_size=2048, dim=262144)" in result.failure.message


async def test_the_task_source_and_the_trace_stay_out_of_the_history_after_the_start(temporal_env, file_store, settings):
    # A whole model's file is kilobytes and its trace hundreds of KiB: the history holds the source in the job's
    # start and the trace_reference request only; every later request carries a store ref.
    marker = "# " + "a long docstring of a whole model " * 200 + "\n"
    task = task_for("relu").model_copy(update={"task_desc": marker + (EXAMPLES / "relu.py").read_text()})
    histories: list = []
    result, _ = await run_conductor(temporal_env.client, file_store, settings, task, histories=histories)

    assert result.outcome is KernelOutcome.VERIFIED and result.aten_ops == ["aten.relu.default"]
    assert result.op_family and not result.op_family.startswith("no offline template")
    events = histories[0].events
    holding = [e.event_type for e in events if marker[:200].encode() in e.SerializeToString()]
    assert len(holding) == 2, f"the start and the trace_reference request only, not {holding}"
    traced = next(e for e in events if e.HasField("activity_task_completed_event_attributes"))
    assert b'"calls":[]' in traced.SerializeToString(), "the trace stays in the store"
    stored = [e.activity_task_scheduled_event_attributes for e in events
              if e.HasField("activity_task_scheduled_event_attributes")][1:]
    assert stored and all(b"KernelTask.source" in a.input.SerializeToString() for a in stored
                          if a.activity_type.name in ("design", "code", "verify"))
    verifier = kernel_trace(file_store, result)[-1]
    entry = f'"step":{verifier.step},"agent":"verifier"'.encode()  # how a TraceEntry is serialized, and nothing else
    recorded = [e.activity_task_scheduled_event_attributes.activity_type.name for e in events if entry in e.SerializeToString()]
    assert recorded == ["record_trace"], "the trace is in the history once: record_trace's input, not the result"


async def test_a_job_started_as_the_sdk_starts_it_holds_no_source_in_its_history(temporal_env, file_store, settings):
    # The SDK puts the task's source in the store before the start (with_source_in_store): no event holds it, and
    # the job reads it back from there.
    marker = "# " + "a long docstring of a whole model " * 200 + "\n"
    task = task_for("relu").model_copy(update={"task_desc": marker + (EXAMPLES / "relu.py").read_text()})
    stored = with_source_in_store(KernelRequest(task=task, config=load_workflow_config("default")), file_store).task
    histories: list = []
    result, _ = await run_conductor(temporal_env.client, file_store, settings, stored, histories=histories)

    assert result.outcome is KernelOutcome.VERIFIED and result.aten_ops == ["aten.relu.default"]
    assert file_store.get_bytes(stored.source).decode() == task.task_desc
    assert not [e.event_type for e in histories[0].events if marker[:200].encode() in e.SerializeToString()]
