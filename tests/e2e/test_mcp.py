"""`fleetforge mcp` as coding agents' clients see it, against one real `fleetforge dev` stack (this module's).

The conformance suite: the official clients, used as they are, each through the same six checks (the
tools listed, a job to completion, its artifact read back, a question answered by elicitation, a
cancel, bad input), each over stdio with the launch command docs/mcp.md gives agents:

* @modelcontextprotocol/sdk 1.x: protocol 2025-11-25, job ids, `watch` (elicitation/create mid-call);
* @modelcontextprotocol/client 2.x with @modelcontextprotocol/ext-tasks: protocol 2026-07-28, jobs as
  tasks (the package validates every task message), and `watch` answered `input_required`;
* the Python `mcp` SDK: protocol 2026-07-28 negotiated by its probe, tasks held to the extension's schema.

The TypeScript clients are scripts in tests/e2e/mcp_clients/ (installed, pinned, by scripts/mcp_clients.sh)
that print a JSON transcript; every transcript is kept in test-artifacts/mcp/. Then: a server killed
mid-task replaced by another that finishes it (HTTP, bearer token), and the MCP Inspector CLI."""

from __future__ import annotations

import base64
import hashlib
import json
import shutil
import subprocess
from pathlib import Path
from typing import Any

import httpx2
import pytest
from mcp import Client, StdioServerParameters
from mcp.client.streamable_http import streamable_http_client
from mcp.shared.exceptions import MCPError

from client import fleetforge_version
from tests.conftest import ARTIFACTS_DIR
from tests.e2e.mcp_tasks import (
    CompletedTask, CreatedTask, TasksExtension, cancel_task, get_task, poll_until, start_task, update_task,
)
from tests.e2e.test_cli import FLEETFORGE, Stack, port_open
from tests.e2e.test_cli import model, stack  # noqa: F401  (module fixtures)
from tests.helpers import free_ports, wait_until

ROOT = Path(__file__).resolve().parents[2]
TRANSCRIPTS = ARTIFACTS_DIR / "mcp"
ANSWERS = {"soc": "sm8550", "precision": "fp16"}
TOOLS = {"convert", "kernel", "fleet_test", "inspect", "list_jobs", "show", "answer", "approve", "cancel", "watch"}
PROTOCOL = {"ts-sdk1": "2025-11-25", "ts-sdk2-tasks": "2026-07-28", "python-sdk": "2026-07-28"}
AGENTS = ROOT / "examples/agents"
CLAUDE_CODE = json.loads((AGENTS / ".mcp.json").read_text())["mcpServers"]["fleetforge"]
LAUNCH = [str(Path(FLEETFORGE).parent / CLAUDE_CODE["command"]), *CLAUDE_CODE["args"]]
"""How every client here starts the server: Claude Code's configuration (examples/agents/.mcp.json, shown in
docs/mcp.md), its command found where an activated virtual environment puts it on PATH."""


def test_the_documented_agent_configurations_launch_what_the_suite_launches():
    cursor = json.loads((AGENTS / ".cursor/mcp.json").read_text())["mcpServers"]["fleetforge"]
    assert (cursor["command"], cursor["args"]) == (CLAUDE_CODE["command"], CLAUDE_CODE["args"]) == ("fleetforge", ["mcp"])
    docs = (ROOT / "docs/mcp.md").read_text()
    for config in (AGENTS / ".mcp.json", AGENTS / ".cursor/mcp.json"):
        assert config.read_text().strip() in docs, f"docs/mcp.md shows {config.relative_to(ROOT)} as it is"


def stdio_client(stack: Stack, **kw: Any) -> Client:  # noqa: F811
    return Client(StdioServerParameters(command=LAUNCH[0], args=LAUNCH[1:], env=stack.env), read_timeout_seconds=180,
                  **kw)


@pytest.fixture(scope="module")
def scenario(stack: Stack, model: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:  # noqa: F811
    return {"command": LAUNCH[0], "args": LAUNCH[1:], "env": stack.env, "model": str(model), "answers": ANSWERS,
            "missing_model": str(tmp_path_factory.mktemp("none") / "absent.onnx"),
            "missing_artifact": "fleetforge://jobs/convert%2F20000101-000000-dead/artifacts/x.bin",
            "kernel_task": str(ROOT / "examples/kernels/softmax.py")}


@pytest.fixture(scope="module", params=list(PROTOCOL))
async def session(request: pytest.FixtureRequest, scenario: dict[str, Any], stack: Stack,  # noqa: F811
                  tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """One client's run through every check (once per client); its transcript kept in test-artifacts/mcp/."""
    if request.param == "python-sdk":
        transcript = {"client": "mcp (Python SDK)", "steps": await python_steps(stack, scenario)}
    else:
        path = tmp_path_factory.mktemp("scenario") / "scenario.json"
        path.write_text(json.dumps(scenario))
        script = {"ts-sdk1": "sdk1.mjs", "ts-sdk2-tasks": "sdk2_tasks.mjs"}[request.param]
        done = subprocess.run(["node", script, str(path)], cwd=node_clients(), capture_output=True, text=True, timeout=900)
        assert done.returncode == 0, done.stderr[-4000:]
        transcript = json.loads(done.stdout)
    TRANSCRIPTS.mkdir(parents=True, exist_ok=True)
    (TRANSCRIPTS / f"{request.param}.json").write_text(json.dumps(transcript, indent=1))
    return {"name": request.param, **transcript["steps"]}


def node_clients() -> str:
    done = subprocess.run(["bash", str(ROOT / "scripts/mcp_clients.sh")], capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr
    return done.stdout.strip()


def passed(step: dict[str, Any]) -> dict[str, Any]:
    assert step["ok"], step.get("error")
    return step


def test_the_tools_are_listed_with_the_servers_version_on_the_negotiated_protocol(session: dict[str, Any]):
    listed = passed(session["list"])
    assert TOOLS <= set(listed["tools"])
    assert listed["server"] == {"name": "fleetforge", "version": fleetforge_version()} != ""
    assert listed["protocol"] == PROTOCOL[session["name"]]


def test_a_job_runs_to_completion(session: dict[str, Any]):
    done = passed(session["complete"])
    assert done["job_id"].startswith("inspect/") and done["status"] == "COMPLETED", done
    if session["name"] == "ts-sdk2-tasks":  # the package's own view of the task: created working, settled completed
        assert (done["seen"][0]["status"], done["seen"][-1]["status"]) == ("working", "completed"), done["seen"]
        assert done["outcome"]["result"]["structuredContent"]["status"] == "COMPLETED"
    if session["name"] == "ts-sdk1":  # within the SDK's default 60 s request timeout, progress on the way
        assert done["watched"][-1]["result"]["status"] == "COMPLETED" and "step: completed" in done["watched"][-1]["progress"]


def test_its_artifact_reads_back_with_its_sha256(session: dict[str, Any]):
    read = passed(session["artifact"])
    assert read["artifact"]["uri"].startswith("fleetforge://jobs/")
    assert read["read_sha256"] == read["artifact"]["sha256"] and read["read_size"] == read["artifact"]["size"] > 0


def test_a_question_is_answered_by_elicitation_and_the_job_completes(session: dict[str, Any]):
    paths = [p for p in ("elicit", "elicit_mrtr") if p in session]  # 2026-07-28 TS: the task's, and watch's
    for path in paths:
        asked = passed(session[path])
        [form] = asked["asked"]
        assert "Which Snapdragon SoC" in form["message"], form
        assert form["requestedSchema"]["properties"]["precision"]["enum"] == ["fp32", "fp16", "int8", "w8a16", "w4a16"]
        assert asked["status"] == "COMPLETED", asked
        report = asked["result"]["report"]  # built for what the form answered
        assert (report["target_soc"], report["delivered_precision"]) == ("SM8550", "fp16"), report
        if "refused" in asked:  # an answer the job's validator refuses says why, and the task still waits
            assert "sm9999" in asked["refused"], asked["refused"]
        if session["name"] == "python-sdk":  # no elicitation declared: watch says what to call instead
            watched = asked["watched"]
            assert watched["status"] == "NEEDS_INPUT" and "Which Snapdragon SoC" in watched["questions"][0], watched
            assert f"answer(job_id={asked['job_id']!r}" in watched["next"], watched


def test_a_job_is_cancelled(session: dict[str, Any]):
    cancelled = passed(session["cancel"])
    assert cancelled["status"] == "CANCELLED", cancelled
    task = cancelled.get("task_status") or cancelled.get("task", {}).get("status")  # the task clients' view
    assert task in (None, "cancelled"), cancelled


def test_bad_input_is_a_clear_error_and_the_server_goes_on_serving(session: dict[str, Any]):
    bad = passed(session["bad_input"])
    assert "MODEL_NOT_FOUND" in tool_error(bad["missing_model"]) and "absent.onnx" in tool_error(bad["missing_model"])
    assert "min_cosine" in tool_error(bad["out_of_bounds"]) and "less than or equal to 1" in tool_error(bad["out_of_bounds"])
    assert bad["unknown_tool"]["error"]["code"] == -32602 and "no_such_tool" in bad["unknown_tool"]["error"]["message"]
    missing = bad["missing_artifact"]["error"]
    assert missing["code"] == -32602 and missing["data"] == {"uri": "fleetforge://jobs/convert%2F20000101-000000-dead/artifacts/x.bin"}
    if "unknown_task" in bad:
        assert unknown_task_code(bad["unknown_task"]) == -32602
    assert bad["still_serving"] >= len(TOOLS)


def tool_error(entry: dict[str, Any]) -> str:
    """The text of a tool result that is an error (a task client's: the call's own result, no task)."""
    assert "result" in entry, entry
    result = entry["result"]
    if "outcome" in result:
        assert result["kind"] == "immediate", result
        result = result["outcome"]["result"]
    assert result["isError"] is True, result
    return result["content"][0]["text"]


def unknown_task_code(entry: dict[str, Any]) -> int:
    error = entry.get("error") or entry["result"]["error"]
    return error["code"]


async def python_steps(stack: Stack, s: dict[str, Any]) -> dict[str, Any]:  # noqa: F811
    """The Python SDK's run through the six checks, observed as the TypeScript scripts observe theirs."""
    steps: dict[str, Any] = {}

    async def step(name: str, run: Any) -> None:
        try:
            steps[name] = {"ok": True, **await run()}
        except Exception as e:  # recorded, judged by the tests: one failing check does not hide the others
            steps[name] = {"ok": False, "error": {"name": type(e).__name__, "message": str(e)}}

    async def outcome(run: Any) -> dict[str, Any]:
        try:
            got = await run()
            return {"result": got.model_dump(mode="json", by_alias=True, exclude_none=True)}
        except MCPError as e:
            return {"error": {"code": e.error.code, "message": e.error.message, "data": e.error.data}}

    async with stdio_client(stack, extensions=[TasksExtension()]) as client:
        async def listed() -> dict[str, Any]:
            return {"tools": [t.name for t in (await client.list_tools()).tools], "protocol": client.protocol_version,
                    "server": client.server_info.model_dump(include={"name", "version"})}

        async def complete() -> dict[str, Any]:
            created = await start_task(client, "inspect", {"model": s["model"]})
            assert isinstance(created, CreatedTask), created
            done = await poll_until(client, created.task_id, {"completed", "failed", "cancelled"})
            assert isinstance(done, CompletedTask) and done.result.is_error is False, done
            shown = (await client.call_tool("show", {"job_id": created.task_id})).structured_content
            return {"job_id": created.task_id, "status": shown["status"], "artifacts": shown["artifacts"]}

        async def artifact() -> dict[str, Any]:
            ref = steps["complete"]["artifacts"][0]
            data = base64.b64decode((await client.read_resource(ref["uri"])).contents[0].blob)
            return {"artifact": ref, "read_sha256": hashlib.sha256(data).hexdigest(), "read_size": len(data)}

        async def elicit() -> dict[str, Any]:
            created = await start_task(client, "convert", {"model": s["model"]})
            waiting = await poll_until(client, created.task_id, {"input_required", "completed", "failed"})
            [(key, request)] = waiting.input_requests.items()
            # this client declares no elicitation: `watch` returns the question and how to answer it, at once
            watched = (await client.call_tool("watch", {"job_id": created.task_id})).structured_content
            try:
                await update_task(client, created.task_id, {key: {"action": "accept", "content": {"soc": "sm9999"}}})
                refused = ""
            except MCPError as e:
                refused = e.error.message
            assert (await get_task(client, created.task_id)).status == "input_required"
            await update_task(client, created.task_id, {key: {"action": "accept", "content": s["answers"]}})
            done = await poll_until(client, created.task_id, {"completed", "failed", "cancelled"}, answered=frozenset({key}))
            result = done.result.structured_content if isinstance(done, CompletedTask) else None
            return {"job_id": created.task_id, "asked": [request.params], "refused": refused, "watched": watched,
                    "status": result and result["status"], "result": result}

        async def cancel() -> dict[str, Any]:  # a kernel job: its task is built on the meta device first (torch)
            created = await start_task(client, "kernel", {"task_file": s["kernel_task"]})
            await cancel_task(client, created.task_id)
            done = await poll_until(client, created.task_id, {"completed", "cancelled"})
            shown = (await client.call_tool("show", {"job_id": created.task_id})).structured_content
            return {"job_id": created.task_id, "task_status": done.status, "status": shown["status"]}

        async def bad_input() -> dict[str, Any]:
            return {
                "missing_model": await outcome(lambda: start_task(client, "convert", {"model": s["missing_model"]})),
                "out_of_bounds": await outcome(lambda: start_task(client, "convert", {"model": s["model"], "min_cosine": 2})),
                "unknown_tool": await outcome(lambda: client.call_tool("no_such_tool", {})),
                "unknown_task": await outcome(lambda: get_task(client, "convert/20000101-000000-dead")),
                "missing_artifact": await outcome(lambda: client.read_resource(s["missing_artifact"])),
                "still_serving": len((await client.list_tools()).tools),
            }

        for name, run in [("list", listed), ("complete", complete), ("artifact", artifact), ("elicit", elicit),
                          ("cancel", cancel), ("bad_input", bad_input)]:
            await step(name, run)
    return steps


def http_server(stack: Stack, port: int, token: str) -> subprocess.Popen[bytes]:  # noqa: F811
    proc = subprocess.Popen([FLEETFORGE, "mcp", "--transport", "http", "--port", str(port)],
                            env={**stack.env, "FLEETFORGE_MCP_TOKEN": token},
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    wait_until(lambda: proc.poll() is None and port_open(port), timeout=30, message="fleetforge mcp did not listen")
    return proc


def http_client(port: int, token: str, **kw: Any) -> Client:
    auth = httpx2.AsyncClient(headers={"Authorization": f"Bearer {token}"}, timeout=60)
    return Client(streamable_http_client(f"http://127.0.0.1:{port}/mcp", http_client=auth), **kw)


async def test_a_server_killed_mid_task_is_replaced_and_the_new_one_finishes_the_task(stack: Stack, model: Path,  # noqa: F811
                                                                                     tmp_path: Path):
    own = Path(shutil.copy(model, tmp_path / "http_tiny.onnx"))
    first_port, second_port = free_ports(2)
    first = http_server(stack, first_port, "s3cret")
    try:
        async with http_client(first_port, "s3cret", extensions=[TasksExtension()]) as client:
            created = await start_task(client, "convert", {"model": str(own), "precision": "int8",
                                                           "synthetic_calibration": True})
            waiting = await poll_until(client, created.task_id, {"input_required", "completed", "failed"})
            assert waiting.status == "input_required", waiting
    finally:
        first.kill()  # SIGKILL: nothing of the task can be saved on the way out
        first.wait(timeout=10)

    second = http_server(stack, second_port, "s3cret")
    try:
        assert httpx2.post(f"http://127.0.0.1:{second_port}/mcp", json={}).status_code == 401  # no token, no entry
        async with http_client(second_port, "s3cret") as plain:  # no tasks extension declared: no task methods
            with pytest.raises(MCPError) as refused:
                await get_task(plain, created.task_id)
            assert refused.value.error.code == -32021, refused.value.error
        async with http_client(second_port, "s3cret", extensions=[TasksExtension()]) as client:
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
    done = subprocess.run([exe, "--cli", "--connect-timeout", "120000", *passed, *LAUNCH, *args],
                          capture_output=True, text=True, timeout=180, cwd=ROOT)
    assert done.returncode == 0, (done.stdout, done.stderr)
    return json.loads(done.stdout)


def test_the_mcp_inspector_cli_lists_and_calls_the_tools(stack: Stack, model: Path):  # noqa: F811
    tools = {t["name"]: t for t in inspector(stack, "--method", "tools/list")["tools"]}
    assert TOOLS <= set(tools)
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
