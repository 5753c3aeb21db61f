"""Record fleet histories for the replay tests: `python -m tests.replay.record_fleet LABEL [--direct-only]`.

Writes `fleet_LABEL_run1.json` / `_run2.json` (a fleet of process rows that continues as new once),
`fleet_LABEL-noid_run1.json` / `_run2.json` (the same started as Temporal users may: id
`fleet-test/X`, no fleet id; `--direct-only` writes just these)
and `modeltest_LABEL_{retry,human,llm,approval}.json` (rows: a retry, a failure a person must fix,
the LLM writer with a refused answer, a refused then approved command). Run it from a checkout of
the code whose histories you want; keep the old files when a change is behind a patch, so runs
started before it are still proven replayable, and delete them when the patch is retired
(`workflow.deprecate_patch`). The `modeltest_deprecated_*` files came from a58763e, the release that
recorded the row patches as deprecated; their calls are gone since (a deprecated marker is skipped on
replay), so those files prove that rows started by that release still replay.
"""

from __future__ import annotations

import asyncio
import csv
import io
import sys
import tempfile
import uuid
from pathlib import Path

from temporalio.client import Client
from temporalio.contrib.pydantic import pydantic_data_converter
from temporalio.testing import WorkflowEnvironment

from activities.containers.activities import ContainerActivities, upload_manifest
from activities.llm.activity import LLMActivities
from activities.storage import FileStore
from client.binaries import temporal_binary
from contracts.common import JobKind
from contracts.fleet_job import ApprovalRequest, FleetTestRequest, ModelTestRequest, RunnerKind
from contracts.settings import Settings
from tests.doubles.openai_server import ScriptedOpenAIServer, json_reply
from tests.doubles.recording_runner import RecordingRunner
from tests.helpers import SELF_TESTS, assert_eventually, fresh_queues, new_worker
from workflows._visibility import SEARCH_ATTRIBUTES, start_attributes
from workflows.fleet import FleetTestWorkflow, ModelTestWorkflow

HISTORIES = Path(__file__).parent / "histories"
OK = 'python -c "print(1)"'
RETRY = 'python -c "raise SystemExit(max(0, 2 - {attempt}))"'
GATED = 'python -c "raise SystemExit(\'GatedRepoError: Cannot access gated repo for url\')"'
LLM_REFUSED = "docker run --privileged --network host vllm/vllm-openai:latest --model org/llm --port 8000"
LLM_GOOD = "docker run --network host vllm/vllm-openai:latest --model org/llm --port 8000"


def manifest(rows: list[tuple[str, str]]) -> str:
    buf = io.StringIO()
    w = csv.writer(buf, lineterminator="\n")
    w.writerow(["model_name", "status", "note", "command"])
    for model, command in rows:
        w.writerow([model, "", "", command])
    return buf.getvalue()


async def save(client: Client, workflow_id: str, name: str, run_id: str | None = None) -> None:
    history = await client.get_workflow_handle(workflow_id, run_id=run_id).fetch_history()
    (HISTORIES / f"{name}.json").write_text(history.to_json())
    print(f"wrote {name}.json ({len(history.events)} events)")


async def record(env: WorkflowEnvironment, tmp: Path, label: str) -> None:
    client = env.client
    store = FileStore(tmp / "artifacts")
    settings = Settings(state_dir=tmp / "state")
    recorder = RecordingRunner()
    acts = ContainerActivities(store, settings, runners={RunnerKind.DOCKER: recorder})
    queues = fresh_queues()
    rows = manifest([("org/ok", OK), ("org/retry", RETRY), ("org/gated", GATED), ("org/ok-2", OK)])
    with ScriptedOpenAIServer([json_reply(LLM_REFUSED), json_reply(f"```bash\n{LLM_GOOD}\n```")]) as llm:
        llm_settings = Settings(state_dir=tmp / "state", llm="openai", llm_base_url=llm.base_url, llm_model="m")
        async with new_worker(client, workflows=[FleetTestWorkflow, ModelTestWorkflow], task_queue=queues.workflows,
                              activities=[*acts.all(), LLMActivities(llm_settings, store).complete_chat]):
            fleet_id = f"replay-{uuid.uuid4().hex[:6]}"
            fleet = f"fleet/{fleet_id}"
            handle = await client.start_workflow(
                FleetTestWorkflow.run, FleetTestRequest(manifest=upload_manifest(store, rows), **SELF_TESTS,
                                                        concurrency=2, max_attempts=3, continue_every=2, queues=queues,
                                                        fleet_id=fleet_id),
                id=fleet, task_queue=queues.workflows, search_attributes=start_attributes(JobKind.FLEET_TEST))
            try:
                await handle.result()
            except Exception:  # a fleet with a failed row fails (job-end rule); its history is what we want
                pass
            first_run = (await handle.describe()).raw_description.workflow_execution_info.first_run_id
            await save(client, fleet, f"fleet_{label}_run1", run_id=first_run)
            await save(client, fleet, f"fleet_{label}_run2")
            await save(client, f"{fleet}/1", f"modeltest_{label}_retry")
            await save(client, f"{fleet}/2", f"modeltest_{label}_human")

            llm_row = f"fleet/replay-llm-{uuid.uuid4().hex[:6]}/0"
            ref = upload_manifest(store, manifest([("org/llm", "")]))
            try:
                await client.execute_workflow(
                    ModelTestWorkflow.run, ModelTestRequest(fleet_id="replay-llm", manifest=ref, row=0, llm="openai",
                                                            runner=RunnerKind.DOCKER, queues=queues),
                    id=llm_row, task_queue=queues.workflows)
            except Exception:
                pass
            await save(client, llm_row, f"modeltest_{label}_llm")

            approval_row = f"fleet/replay-appr-{uuid.uuid4().hex[:6]}/0"
            ref = upload_manifest(store, manifest([("org/appr", 'python -c "print({attempt})"')]))
            row = await client.start_workflow(
                ModelTestWorkflow.run, ModelTestRequest(fleet_id="replay-appr", manifest=ref, row=0,
                                                        **SELF_TESTS, require_approval=True, queues=queues),
                id=approval_row, task_queue=queues.workflows)
            for attempt, approved in ((1, False), (2, True)):
                await assert_eventually(lambda: _waiting(row, attempt), timeout=60, message=f"attempt {attempt} waiting")
                await row.execute_update(ModelTestWorkflow.approve_command,
                                         ApprovalRequest(attempt=attempt, approved=approved, reason="not yet"))
            await row.result()
            await save(client, approval_row, f"modeltest_{label}_approval")


async def record_direct(env: WorkflowEnvironment, tmp: Path, label: str) -> None:
    """A fleet started without a fleet id under the CLI's id scheme, continuing as new once."""
    client = env.client
    store = FileStore(tmp / "artifacts")
    acts = ContainerActivities(store, Settings(state_dir=tmp / "state"))
    queues = fresh_queues()
    rows = manifest([("org/ok", OK), ("org/ok-2", OK), ("org/ok-3", OK)])
    async with new_worker(client, workflows=[FleetTestWorkflow, ModelTestWorkflow], task_queue=queues.workflows,
                          activities=acts.all()):
        fleet = f"fleet-test/direct-{uuid.uuid4().hex[:6]}"
        handle = await client.start_workflow(
            FleetTestWorkflow.run, FleetTestRequest(manifest=upload_manifest(store, rows), **SELF_TESTS,
                                                    concurrency=1, continue_every=2, queues=queues),
            id=fleet, task_queue=queues.workflows, search_attributes=start_attributes(JobKind.FLEET_TEST))
        await handle.result()
        first_run = (await handle.describe()).raw_description.workflow_execution_info.first_run_id
        await save(client, fleet, f"fleet_{label}-noid_run1", run_id=first_run)
        await save(client, fleet, f"fleet_{label}-noid_run2")


async def _waiting(handle, attempt: int) -> bool:
    return bool(await handle.query(ModelTestWorkflow.pending_command)) and \
        str(attempt) in (await handle.query(ModelTestWorkflow.pending_command) or "")


async def main(label: str, direct_only: bool = False) -> None:
    env = await WorkflowEnvironment.start_local(dev_server_existing_path=temporal_binary(),
                                                search_attributes=SEARCH_ATTRIBUTES,
                                                data_converter=pydantic_data_converter, dev_server_log_level="error")
    try:
        with tempfile.TemporaryDirectory() as d:
            if not direct_only:
                await record(env, Path(d), label)
            await record_direct(env, Path(d), label)
    finally:
        await env.shutdown()


if __name__ == "__main__":
    args = [a for a in sys.argv[1:] if a != "--direct-only"]
    asyncio.run(main(args[0] if args else "current", direct_only="--direct-only" in sys.argv))
