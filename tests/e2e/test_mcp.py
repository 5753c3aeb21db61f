"""`fleetforge mcp` with the official `mcp` client against a real `fleetforge dev` stack: jobs as
SEP-2663 tasks (task id = job id, every state read from Temporal), answers through tasks/update,
cancellation, artifacts as resources with their sha256, and a server killed mid-task replaced by
another that finishes the task."""

from __future__ import annotations

import base64
import hashlib
import json
import shutil
import subprocess
from pathlib import Path

import httpx2
import pytest
from mcp import Client, StdioServerParameters
from mcp.client.streamable_http import streamable_http_client

from tests.e2e.mcp_tasks import TasksExtension, cancel_task, get_task, poll_until, start_task, update_task
from tests.e2e.test_cli import FLEETFORGE, Stack, port_open
from tests.e2e.test_cli import model, stack  # noqa: F401  (module fixtures)
from tests.helpers import free_ports, wait_until

ROOT = Path(__file__).resolve().parents[2]


def stdio_client(stack: Stack) -> Client:  # noqa: F811
    return Client(StdioServerParameters(command=FLEETFORGE, args=["mcp"], env=stack.env),
                  extensions=[TasksExtension()], read_timeout_seconds=180)  # a kernel task is built on the meta device first (torch)


async def test_convert_task_is_polled_to_completed_and_its_artifact_reads_back_with_its_sha256(
        stack: Stack, model: Path, tmp_path: Path):  # noqa: F811
    own = Path(shutil.copy(model, tmp_path / "mcp_tiny.onnx"))
    async with stdio_client(stack) as client:
        created = await start_task(client, "convert", {"model": str(own), "soc": "sm8550", "precision": "fp16"})
        assert created.task_id.startswith("convert/") and created.status == "working"

        done = await poll_until(client, created.task_id, {"completed", "failed", "cancelled"})
        assert done.status == "completed", done
        result = done.result["structuredContent"]
        assert result["status"] == "COMPLETED" and done.result["isError"] is False, result

        shown = await client.call_tool("show", {"job_id": created.task_id})
        links = shown.structured_content["artifacts"]
        binary = next(a for a in links if a["name"].endswith("_ctx_qnn.bin"))
        read = await client.read_resource(binary["uri"])
        data = base64.b64decode(read.contents[0].blob)
        assert len(data) == binary["size"] > 0
        assert hashlib.sha256(data).hexdigest() == binary["sha256"]
        assert binary["sha256"] in {a["sha256"] for a in result["artifacts"]}  # the job's own record

        missing = await client.call_tool("show", {"job_id": "convert/20000101-000000-dead"})
        assert missing.is_error and "no job" in missing.content[0].text


async def test_convert_without_soc_is_input_required_and_tasks_update_completes_it(stack: Stack, model: Path):  # noqa: F811
    async with stdio_client(stack) as client:
        created = await start_task(client, "convert", {"model": str(model)})
        waiting = await poll_until(client, created.task_id, {"input_required", "completed", "failed"})
        assert waiting.status == "input_required", waiting
        [(key, request)] = waiting.input_requests.items()
        assert request["method"] == "elicitation/create" and "soc" in request["params"]["requestedSchema"]["properties"]

        with pytest.raises(Exception, match="sm9999"):  # the workflow's validator refuses it, and says so
            await update_task(client, created.task_id, {key: {"action": "accept",
                                                              "content": {"soc": "sm9999", "precision": "int8"}}})
        assert (await get_task(client, created.task_id)).status == "input_required"

        await update_task(client, created.task_id, {key: {"action": "accept",
                                                          "content": {"soc": "sm8550", "precision": "int8"}}})
        asked = await poll_until(client, created.task_id, {"input_required", "completed", "failed"},
                                 answered={key})  # int8 without calibration data: a second round asks for it
        [(second, request)] = asked.input_requests.items()
        assert second != key and "calibration" in request["params"]["message"], request
        assert request["params"]["requestedSchema"]["properties"]["synthetic_calibration"]["type"] == "boolean"
        await update_task(client, created.task_id, {second: {"action": "accept",
                                                             "content": {"synthetic_calibration": True}}})
        done = await poll_until(client, created.task_id, {"completed", "failed", "cancelled"})
        assert done.status == "completed" and done.result["structuredContent"]["status"] == "COMPLETED", done
        assert "unverified on real data" in json.dumps(done.result["structuredContent"]), done


async def test_kernel_task_is_cancelled(stack: Stack):  # noqa: F811
    async with stdio_client(stack) as client:
        created = await start_task(client, "kernel", {"task_file": str(ROOT / "examples/kernels/softmax.py"),
                                                      "arch": "cpu"})
        assert created.task_id.startswith("kernel/")
        await cancel_task(client, created.task_id)
        done = await poll_until(client, created.task_id, {"completed", "cancelled"})
        assert done.status == "cancelled", done
        listed = await client.call_tool("list_jobs", {"kind": "kernel", "status": "CANCELLED"})
        assert created.task_id in {j["workflow_id"] for j in listed.structured_content["result"]}


def http_server(stack: Stack, port: int, token: str) -> subprocess.Popen[bytes]:  # noqa: F811
    proc = subprocess.Popen([FLEETFORGE, "mcp", "--transport", "http", "--port", str(port)],
                            env={**stack.env, "FLEETFORGE_MCP_TOKEN": token},
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    wait_until(lambda: proc.poll() is None and port_open(port), timeout=30, message="fleetforge mcp did not listen")
    return proc


def http_client(port: int, token: str) -> Client:
    auth = httpx2.AsyncClient(headers={"Authorization": f"Bearer {token}"}, timeout=60)
    return Client(streamable_http_client(f"http://127.0.0.1:{port}/mcp", http_client=auth),
                  extensions=[TasksExtension()])


async def test_a_server_killed_mid_task_is_replaced_and_the_new_one_finishes_the_task(stack: Stack, model: Path):  # noqa: F811
    first_port, second_port = free_ports(2)
    first = http_server(stack, first_port, "s3cret")
    try:
        async with http_client(first_port, "s3cret") as client:
            created = await start_task(client, "convert", {"model": str(model), "precision": "int8",
                                                           "synthetic_calibration": True})
            waiting = await poll_until(client, created.task_id, {"input_required", "completed", "failed"})
            assert waiting.status == "input_required", waiting
    finally:
        first.kill()  # SIGKILL: nothing of the task can be saved on the way out
        first.wait(timeout=10)

    second = http_server(stack, second_port, "s3cret")
    try:
        assert httpx2.post(f"http://127.0.0.1:{second_port}/mcp", json={}).status_code == 401  # no token, no entry
        async with http_client(second_port, "s3cret") as client:
            task = await get_task(client, created.task_id)
            assert task.status == "input_required" and task.input_requests, task
            [key] = task.input_requests
            await update_task(client, created.task_id, {key: {"action": "accept", "content": {"soc": "sm8550"}}})
            done = await poll_until(client, created.task_id, {"completed", "failed", "cancelled"})
            assert done.status == "completed", done
    finally:
        second.terminate()
        second.wait(timeout=10)


def test_binding_beyond_loopback_without_a_token_is_refused(stack: Stack):  # noqa: F811
    done = subprocess.run([FLEETFORGE, "mcp", "--transport", "http", "--host", "0.0.0.0"],
                          env={k: v for k, v in stack.env.items() if k != "FLEETFORGE_MCP_TOKEN"},
                          capture_output=True, text=True, timeout=30)
    assert done.returncode == 2 and "FLEETFORGE_MCP_TOKEN" in done.stderr, done.stderr


def inspector(stack: Stack, *args: str) -> dict:  # noqa: F811
    """The MCP Inspector CLI (npm, scripts/mcp_inspector.sh) driving `fleetforge mcp` over stdio."""
    exe = subprocess.run(["bash", str(ROOT / "scripts/mcp_inspector.sh")], capture_output=True, text=True,
                         timeout=600, check=True).stdout.strip()
    passed = [arg for k, v in stack.env.items() if k.startswith(("FLEETFORGE_", "TEMPORAL_")) or k == "PYTHONPATH"
              for arg in ("-e", f"{k}={v}")]  # the Inspector starts its server with a bare environment
    done = subprocess.run([exe, "--cli", "--connect-timeout", "120000", *passed, FLEETFORGE, "mcp", *args],
                          capture_output=True, text=True, timeout=180, cwd=ROOT)
    assert done.returncode == 0, (done.stdout, done.stderr)
    return json.loads(done.stdout)


def test_the_mcp_inspector_cli_lists_and_calls_the_tools(stack: Stack, model: Path):  # noqa: F811
    tools = {t["name"]: t for t in inspector(stack, "--method", "tools/list")["tools"]}
    assert {"convert", "kernel", "fleet_test", "inspect", "list_jobs", "show", "answer", "approve", "cancel",
            "watch"} <= set(tools)
    assert tools["convert"]["inputSchema"]["properties"]["precision"]["anyOf"][0]["$ref"].endswith("Precision")

    started = inspector(stack, "--method", "tools/call", "--tool-name", "convert", "--tool-arg", f"model={model}",
                        "--tool-arg", "soc=sm8550", "--tool-arg", "precision=fp16")
    job_id = started["structuredContent"]["job_id"]  # a client without tasks gets the job id at once
    assert job_id.startswith("convert/") and not started.get("isError"), started

    listed = inspector(stack, "--method", "tools/call", "--tool-name", "list_jobs", "--tool-arg", "kind=convert")
    assert job_id in {j["workflow_id"] for j in listed["structuredContent"]["result"]}
    shown = inspector(stack, "--method", "tools/call", "--tool-name", "show", "--tool-arg", f"job_id={job_id}")
    assert shown["structuredContent"]["job_id"] == job_id and shown["structuredContent"]["status"] in (
        "RUNNING", "COMPLETED"), shown
