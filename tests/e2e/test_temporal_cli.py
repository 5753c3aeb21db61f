"""The real `temporal` CLI against a converter run waiting for input: list it by search
attribute, query `status`, answer it with `temporal workflow update execute`, watch it complete.
These are the commands docs/inspecting.md tells users to copy."""

from __future__ import annotations

import asyncio
import json
import uuid
from pathlib import Path

import pytest
from temporalio.testing import WorkflowEnvironment

from client.binaries import temporal_binary
from contracts.common import JobKind, JobStatus
from contracts.convert_job import ConversionRequest, ConversionResult
from contracts.settings import Settings
from activities.storage import FileStore
from examples.tiny_model import build_tiny_cnn
from tests.helpers import assert_eventually, fresh_queues, new_worker
from worker import build_registry
from workflows._visibility import STATUS, TARGET, start_attributes
from workflows.converter import ConverterWorkflow

pytest.importorskip("onnxruntime_qnn")
pytestmark = pytest.mark.slow


async def temporal(env: WorkflowEnvironment, *args: str) -> tuple[int, str, str]:
    """Run the `temporal` CLI without blocking the event loop (the worker runs in this loop)."""
    proc = await asyncio.create_subprocess_exec(
        temporal_binary(), *args, "--address", env.client.service_client.config.target_host,
        "--namespace", env.client.namespace, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
    out, err = await asyncio.wait_for(proc.communicate(), timeout=30)
    assert proc.returncode is not None
    return proc.returncode, out.decode(), err.decode()


async def test_temporal_cli_lists_queries_and_answers_a_waiting_conversion(temporal_env, tmp_path: Path):
    settings, store = Settings(state_dir=tmp_path / "state"), FileStore(tmp_path / "artifacts")
    model = build_tiny_cnn(tmp_path / "hub" / "tiny.onnx")
    queues = fresh_queues()
    client = temporal_env.client
    req = ConversionRequest(model=str(model), queues=queues, run_id=uuid.uuid4().hex[:8])
    wf_id = f"convert/cli-{uuid.uuid4().hex[:8]}"
    reg = build_registry(settings, store)
    async with new_worker(client, workflows=[ConverterWorkflow], activities=reg.by_kind["toolchain"],
                          task_queue=queues.workflows):
        handle = await client.start_workflow(ConverterWorkflow.run, req, id=wf_id, task_queue=queues.workflows,
                                             search_attributes=start_attributes(JobKind.CONVERT, req.model))

        async def listed() -> list[dict] | None:
            code, out, err = await temporal(temporal_env, "workflow", "list", "--query",
                                            f"FleetforgeStatus='NEEDS_INPUT' AND WorkflowId='{wf_id}'", "-o", "json")
            assert code == 0, err
            rows = json.loads(out) if out.strip() else []
            return rows or None

        rows = await assert_eventually(listed, timeout=40, interval=0.3,
                                       message="the job never showed up as NEEDS_INPUT")
        assert [r["execution"]["workflowId"] for r in rows] == [wf_id]

        code, out, err = await temporal(temporal_env, "workflow", "query", "--workflow-id", wf_id,
                                        "--name", "status", "-o", "json")
        assert code == 0, err
        status = json.loads(out)["queryResult"][0]
        assert status["status"] == "NEEDS_INPUT"
        assert status["questions"] and any("SoC" in q for q in status["questions"])

        code, out, err = await temporal(temporal_env, "workflow", "update", "execute", "--workflow-id", wf_id,
                                        "--name", "provide_input", "--input", '{"soc":"bogus"}')
        assert code != 0 and "bogus" in (out + err), (out, err)

        code, out, err = await temporal(temporal_env, "workflow", "update", "execute", "--workflow-id", wf_id,
                                        "--name", "provide_input", "--input", '{"soc":"sm8550","precision":"int8"}')
        assert code == 0, (out, err)

        result: ConversionResult = await asyncio.wait_for(handle.result(), timeout=120)

    assert result.status is JobStatus.COMPLETED, result.failure
    attrs = (await handle.describe()).typed_search_attributes
    assert attrs.get(STATUS) == "COMPLETED" and attrs.get(TARGET) == "SM8550"
    code, out, err = await temporal(temporal_env, "workflow", "list", "--query",
                                    f"FleetforgeStatus='NEEDS_INPUT' AND WorkflowId='{wf_id}'", "-o", "json")
    assert code == 0 and not (json.loads(out) if out.strip() else []), out
