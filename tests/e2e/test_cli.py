"""The `fleetforge` CLI as a user runs it: subprocesses against a dedicated `fleetforge dev` stack."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from examples.tiny_model import build_tiny_cnn
from tests.helpers import free_ports, wait_until

FLEETFORGE = str(Path(sys.executable).parent / "fleetforge")


def port_open(port: int) -> bool:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=0.3):
            return True
    except OSError:
        return False


@dataclass
class Stack:
    env: dict[str, str]
    port: int
    proc: subprocess.Popen[bytes] | None = None


def stack_env(state_dir: Path, port: int | None = None) -> Stack:
    port = port or free_ports()[0]
    env = {
        **os.environ, "FLEETFORGE_STATE_DIR": str(state_dir), "FLEETFORGE_TEMPORAL_ADDRESS": f"127.0.0.1:{port}",
        "FLEETFORGE_UI_PORT": str(free_ports()[0]), "FLEETFORGE_QUEUE_PREFIX": f"e2e-{uuid.uuid4().hex[:8]}",
        "FLEETFORGE_LLM": "offline",
    }
    env.pop("FLEETFORGE_STORE_URL", None)
    return Stack(env=env, port=port)


def ff(*args: str, env: dict[str, str], timeout: float = 60) -> subprocess.CompletedProcess[str]:
    return subprocess.run([FLEETFORGE, *args], env=env, capture_output=True, text=True, timeout=timeout)


def start_dev(stack: Stack) -> Stack:
    Path(stack.env["FLEETFORGE_STATE_DIR"]).mkdir(parents=True, exist_ok=True)
    log = open(Path(stack.env["FLEETFORGE_STATE_DIR"]) / "dev.log", "ab")
    stack.proc = subprocess.Popen([FLEETFORGE, "dev"], env=stack.env, stdout=log, stderr=log)
    log.close()

    def ready() -> bool:
        assert stack.proc is not None and stack.proc.poll() is None, "fleetforge dev exited early"
        return port_open(stack.port) and ff("list", env=stack.env).returncode == 0

    wait_until(ready, timeout=60, interval=0.3, message="fleetforge dev did not come up")
    return stack


def stop_dev(stack: Stack) -> int:
    """SIGTERM, wait; the exit code (the server subprocess must be gone with it)."""
    assert stack.proc is not None
    stack.proc.send_signal(signal.SIGTERM)
    try:
        rc = stack.proc.wait(timeout=60)
    except subprocess.TimeoutExpired:
        stack.proc.kill()
        raise
    wait_until(lambda: not port_open(stack.port), timeout=10, message="the Temporal dev server outlived fleetforge dev")
    return rc


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    s = start_dev(stack_env(tmp_path_factory.mktemp("dev") / "state"))
    yield s
    assert stop_dev(s) == 0, "fleetforge dev must exit 0 on SIGTERM"


@pytest.fixture(scope="module")
def model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_tiny_cnn(tmp_path_factory.mktemp("hub") / "tiny.onnx")


def assert_one_line_error(done: subprocess.CompletedProcess[str], code: int, *words: str) -> None:
    assert done.returncode == code, (done.returncode, done.stderr)
    assert "Traceback" not in done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), done.stderr
    for w in words:
        assert w in lines[0], lines[0]
    assert done.stdout == ""


def test_inspect_wait_json_prints_exactly_the_result_contract(stack: Stack, model: Path):
    done = ff("inspect", str(model), "--wait", "--json", env=stack.env)

    assert done.returncode == 0, done.stderr
    result = json.loads(done.stdout)  # the whole stdout is one JSON object
    assert result["status"] == "COMPLETED"
    assert result["model"]["onnx"]["inputs"][0]["shape"] == [1, 3, 32, 32]
    assert {a["name"] for a in result["artifacts"]} == {"input/tiny.onnx", "metadata.json"}


def test_inspect_wait_prints_run_artifacts_and_ui_url(stack: Stack, model: Path):
    done = ff("inspect", str(model), "--wait", env=stack.env)

    assert done.returncode == 0, done.stderr
    run_id = done.stdout.split()[1].rstrip(":")
    ui = f"http://127.0.0.1:{stack.env['FLEETFORGE_UI_PORT']}/namespaces/default/workflows/inspect/{run_id}"
    assert ui in done.stdout
    assert done.stdout.count("sha256 ") >= 3  # the model and its two artifacts
    assert "file://" in done.stdout and "COMPLETED" in done.stdout


def test_inspect_without_wait_prints_workflow_id_then_show_and_list_find_it(stack: Stack, model: Path):
    done = ff("inspect", str(model), env=stack.env)
    assert done.returncode == 0, done.stderr
    wid = done.stdout.strip()
    assert wid.startswith("inspect/") and "\n" not in wid

    shown = ff("show", wid, "--wait", "--json", env=stack.env)
    assert shown.returncode == 0, shown.stderr
    assert json.loads(shown.stdout)["run_id"] == wid.split("/", 1)[1]

    listed = ff("list", "--kind", "inspect", "--status", "completed", "--json", env=stack.env)
    assert listed.returncode == 0, listed.stderr
    assert wid in {j["workflow_id"] for j in json.loads(listed.stdout)["jobs"]}


def test_setup_namespace_accepts_already_registered_attributes(stack: Stack):
    done = ff("setup-namespace", env=stack.env)
    assert done.returncode == 0, done.stderr
    assert "FleetforgeStatus" in done.stdout


def test_missing_model_file_exits_2(stack: Stack, tmp_path: Path):
    assert_one_line_error(ff("inspect", str(tmp_path / "nope.onnx"), env=stack.env), 2, "does not exist", "catalog")


def test_unknown_catalog_name_exits_2(stack: Stack):
    assert_one_line_error(ff("inspect", "resnet-nonesuch", env=stack.env), 2, "resnet-nonesuch")


def test_corrupt_onnx_exits_2(stack: Stack, tmp_path: Path):
    bad = tmp_path / "bad.onnx"
    bad.write_bytes(b"\x08\x07garbage-not-a-model" * 10)
    assert_one_line_error(ff("inspect", str(bad), "--wait", env=stack.env), 2, "not a valid ONNX model")


def test_unreachable_temporal_fails_fast_with_remedy(model: Path, tmp_path: Path):
    env = stack_env(tmp_path / "state").env  # nothing listens on this port
    assert_one_line_error(ff("inspect", str(model), "--wait", env=env, timeout=15), 1, "cannot reach Temporal", "fleetforge dev")


def test_bad_store_url_exits_2(model: Path, tmp_path: Path):
    env = {**stack_env(tmp_path / "state").env, "FLEETFORGE_STORE_URL": "ftp://x"}
    assert_one_line_error(ff("inspect", str(model), env=env), 2, "ftp://x", "FLEETFORGE_STORE_URL")


def test_bad_usage_exits_2_with_one_line(tmp_path: Path):
    env = stack_env(tmp_path / "state").env
    assert_one_line_error(ff("no-such-command", env=env), 2, "no-such-command")
    assert_one_line_error(ff("list", "--status", "sleepy", env=env), 2, "--status", "SLEEPY")


def test_unknown_job_exits_2_for_show_and_cancel(stack: Stack):
    assert_one_line_error(ff("show", "inspect/00000000-000000-dead", env=stack.env), 2, "fleetforge list")
    assert_one_line_error(ff("cancel", "inspect/00000000-000000-dead", env=stack.env), 2, "fleetforge list")


def test_dev_reuses_a_running_frontend_and_leaves_it_running(stack: Stack, tmp_path: Path):
    log = tmp_path / "second-dev.log"
    with open(log, "wb") as f:
        second = subprocess.Popen([FLEETFORGE, "dev", "--no-worker"], env=stack.env, stdout=f, stderr=f)
    try:
        wait_until(lambda: "Web UI:" in log.read_text(), timeout=30, message="second dev did not attach")
        assert "using the Temporal frontend" in log.read_text()
    finally:
        second.send_signal(signal.SIGTERM)
        assert second.wait(timeout=30) == 0
    assert port_open(stack.port), "stopping an attached dev must not stop the server it did not start"
    assert ff("list", env=stack.env).returncode == 0
