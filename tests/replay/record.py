"""Record workflow histories for the replay tests: `python -m tests.replay.record`.

Re-run after a deliberate change to a workflow's commands (and keep the old history too when the
change is behind `workflow.patched`, so old runs are still proven replayable)."""

from __future__ import annotations

import asyncio
import tempfile
import uuid
from pathlib import Path

from temporalio.contrib.pydantic import pydantic_data_converter
from temporalio.testing import WorkflowEnvironment

from activities.storage import FileStore
from client.binaries import temporal_binary
from contracts.common import JobKind
from contracts.inspect import InspectRequest
from contracts.settings import Settings
from examples.tiny_model import build_tiny_cnn
from tests.helpers import fresh_queues, new_worker
from worker import build_registry
from workflows._visibility import SEARCH_ATTRIBUTES, start_attributes
from workflows.inspect import InspectModelWorkflow

HISTORIES = Path(__file__).parent / "histories"


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


async def main() -> None:
    env = await WorkflowEnvironment.start_local(
        dev_server_existing_path=temporal_binary(), search_attributes=SEARCH_ATTRIBUTES,
        data_converter=pydantic_data_converter,
    )
    try:
        with tempfile.TemporaryDirectory() as tmp:
            await record_inspect(env, Path(tmp))
    finally:
        await env.shutdown()


if __name__ == "__main__":
    asyncio.run(main())
