"""Record workflow histories for the replay tests:
`python -m tests.replay.record [inspect|convert_gate|kernel_failed|kernel_llm_optimizer ...]`.

Re-run after a deliberate change to a workflow's commands (and keep the old history too when the
change is behind `workflow.patched`, so old runs are still proven replayable). When a patch is
retired (`workflow.deprecate_patch`), delete the histories recorded before it: nothing replays them."""

from __future__ import annotations

import asyncio
import tempfile
import uuid
from pathlib import Path

from temporalio.contrib.pydantic import pydantic_data_converter
from temporalio.testing import WorkflowEnvironment

from activities.kernels.config_loader import load_workflow_config
from activities.storage import FileStore
from client.binaries import temporal_binary
from contracts.common import JobKind, JobStatus
from contracts.convert import Precision
from contracts.convert_job import ConversionRequest, ProvideInput
from contracts.inspect import InspectRequest
from contracts.kernel import KernelTask
from contracts.kernel_job import KernelRequest, KernelResult
from contracts.settings import Settings
from examples.tiny_model import build_tiny_cnn
from tests.helpers import assert_eventually, fresh_queues, new_worker, outcome_of
from worker import build_registry
from workflows._visibility import SEARCH_ATTRIBUTES, start_attributes
from workflows.conductor import ConductorWorkflow
from workflows.converter import ConverterWorkflow
from workflows.inspect import InspectModelWorkflow

HISTORIES = Path(__file__).parent / "histories"
EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


async def record_inspect(env: WorkflowEnvironment, tmp: Path) -> None:
    settings = Settings(state_dir=tmp / "state")
    store = FileStore(tmp / "artifacts")
    queues = fresh_queues()
    model = build_tiny_cnn(tmp / "tiny.onnx")
    async with new_worker(env.client, workflows=[InspectModelWorkflow],
                          activities=build_registry(settings, store).by_kind["toolchain"], task_queue=queues.workflows):
        handle = await env.client.start_workflow(
            InspectModelWorkflow.run, InspectRequest(model=str(model), queues=queues, run_id="replay"),
            id=f"inspect/{uuid.uuid4().hex[:8]}", task_queue=queues.workflows,
            search_attributes=start_attributes(JobKind.INSPECT, "tiny.onnx"),
        )
        await handle.result()
    history = await handle.fetch_history()
    (HISTORIES / "inspect_completed.json").write_text(history.to_json())


async def record_convert_gate(env: WorkflowEnvironment, tmp: Path) -> None:
    """The held-out gate: int8 without calibration data asks for it; the synthetic opt-in answers; the
    gate grades 32 synthetic samples of other families (verdict unverified) and the report is written."""
    settings = Settings(state_dir=tmp / "state-gate")
    store = FileStore(tmp / "artifacts-gate")
    queues = fresh_queues()
    model = build_tiny_cnn(tmp / "tiny.onnx")
    async with new_worker(env.client, workflows=[ConverterWorkflow],
                          activities=build_registry(settings, store).by_kind["toolchain"], task_queue=queues.workflows):
        handle = await env.client.start_workflow(
            ConverterWorkflow.run, ConversionRequest(model=str(model), target_soc="sm8550", precision=Precision.INT8,
                                                     preset="fast", queues=queues, run_id="replay-gate"),
            id=f"convert/{uuid.uuid4().hex[:8]}", task_queue=queues.workflows,
            search_attributes=start_attributes(JobKind.CONVERT, "tiny.onnx", "SM8550"),
        )

        async def waiting() -> bool:
            return (await handle.query(ConverterWorkflow.status)).status is JobStatus.NEEDS_INPUT

        await assert_eventually(waiting, timeout=30)
        await handle.execute_update(ConverterWorkflow.provide_input, ProvideInput(synthetic_calibration=True))
        result = await handle.result()
        assert result.status is JobStatus.COMPLETED and result.accuracy.verdict == "unverified", result
        assert result.report is not None
    history = await handle.fetch_history()
    (HISTORIES / "convert_held_out_gate_int8.json").write_text(history.to_json())


async def record_kernel_failed(env: WorkflowEnvironment, tmp: Path, name: str = "kernel_failed-after-steps.json") -> None:
    """A kernel job that fails after its designer and coder ran: an h100 task on a kernels worker without a
    GPU (the verifier refuses it, VERIFIER_ERROR); the steps before are recorded in the store."""
    import torch

    assert not torch.cuda.is_available(), "record this on a machine without a GPU (the verifier must refuse h100)"
    settings = Settings(state_dir=tmp / "state-kernel", llm="offline")
    store = FileStore(tmp / "artifacts-kernel")
    queues = fresh_queues()
    reg = build_registry(settings, store)
    task = KernelTask(op_name="relu", task_desc=(EXAMPLES / "kernels" / "relu.py").read_text(), task_id="relu-replay",
                      arch="h100")
    async with new_worker(env.client, workflows=[ConductorWorkflow], activities=reg.by_kind["llm"] + reg.by_kind["kernels"],
                          task_queue=queues.workflows):
        handle = await env.client.start_workflow(
            ConductorWorkflow.run, KernelRequest(task=task, config=load_workflow_config("default"), queues=queues),
            id=f"kernel/{uuid.uuid4().hex[:8]}", task_queue=queues.workflows,
            search_attributes=start_attributes(JobKind.KERNEL, "relu"),
        )
        result = await outcome_of(handle, KernelResult)
        assert result.failure is not None and result.failure.code == "VERIFIER_ERROR" and result.steps == 2, result
    history = await handle.fetch_history()
    (HISTORIES / name).write_text(history.to_json())


async def record_kernel_llm_optimizer(env: WorkflowEnvironment, tmp: Path,
                                      name: str = "kernel_llm-optimizer-rounds.json") -> None:
    """A softmax job with an LLM configured (the scripted test double, every answer unusable) through the default
    workflow's optimizer rounds: each agent falls back to its offline answer, the rows rewrite is kept."""
    from tests.doubles.openai_server import ScriptedOpenAIServer, text_stream

    unusable = text_stream(["```python\nclass ModelNew(:\n```"])
    with ScriptedOpenAIServer([unusable] * 12) as server:
        settings = Settings(state_dir=tmp / "state-llm", llm="openai", llm_base_url=server.base_url,
                            llm_model="scripted")
        store = FileStore(tmp / "artifacts-llm")
        queues = fresh_queues()
        reg = build_registry(settings, store)
        task = KernelTask(op_name="softmax", task_desc=(EXAMPLES / "kernels" / "softmax.py").read_text(),
                          task_id="softmax-replay", arch="cpu-interpreter")
        async with new_worker(env.client, workflows=[ConductorWorkflow], task_queue=queues.workflows,
                              activities=reg.by_kind["llm"] + reg.by_kind["kernels"]):
            handle = await env.client.start_workflow(
                ConductorWorkflow.run, KernelRequest(task=task, config=load_workflow_config("default"), queues=queues,
                                                     llm="openai", verify_timeout_s=120),
                id=f"kernel/{uuid.uuid4().hex[:8]}", task_queue=queues.workflows,
                search_attributes=start_attributes(JobKind.KERNEL, "softmax"),
            )
            result = await outcome_of(handle, KernelResult)
            assert result.outcome.value == "VERIFIED" and result.steps >= 5, result
    history = await handle.fetch_history()
    (HISTORIES / name).write_text(history.to_json())


async def main(which: tuple[str, ...] = ("inspect", "convert_gate", "kernel_failed", "kernel_llm_optimizer")) -> None:
    env = await WorkflowEnvironment.start_local(
        dev_server_existing_path=temporal_binary(), search_attributes=SEARCH_ATTRIBUTES,
        data_converter=pydantic_data_converter,
    )
    try:
        with tempfile.TemporaryDirectory() as tmp:
            if "inspect" in which:
                await record_inspect(env, Path(tmp))
            if "convert_gate" in which:
                await record_convert_gate(env, Path(tmp))
            if "kernel_failed" in which:
                await record_kernel_failed(env, Path(tmp))
            if "kernel_llm_optimizer" in which:
                await record_kernel_llm_optimizer(env, Path(tmp))
    finally:
        await env.shutdown()


if __name__ == "__main__":
    import sys

    asyncio.run(main(tuple(sys.argv[1:]) or ("inspect", "convert_gate", "kernel_failed", "kernel_llm_optimizer")))
