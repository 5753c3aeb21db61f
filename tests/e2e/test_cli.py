"""The `fleetforge` CLI as a user runs it: subprocesses against a dedicated `fleetforge dev` stack."""

from __future__ import annotations

import json
import os
import re
import shutil
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
from tests.helpers import SELF_TESTS_CLI, free_ports, wait_until

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
    """The environment the README gives a stack of its own: TEMPORAL_ADDRESS (read by fleetforge and
    the `temporal` CLI alike), a UI port, a state dir; no user profile, no deprecated variables."""
    port = port or free_ports()[0]
    env = {
        **os.environ, "FLEETFORGE_STATE_DIR": str(state_dir), "TEMPORAL_ADDRESS": f"127.0.0.1:{port}",
        "FLEETFORGE_UI_PORT": str(free_ports()[0]), "FLEETFORGE_QUEUE_PREFIX": f"e2e-{uuid.uuid4().hex[:8]}",
        "FLEETFORGE_LLM": "offline", "TEMPORAL_CONFIG_FILE": str(state_dir.parent / "no-temporal-profiles.toml"),
    }
    for var in ("FLEETFORGE_STORE_URL", "FLEETFORGE_TEMPORAL_ADDRESS", "FLEETFORGE_NAMESPACE", "TEMPORAL_NAMESPACE",
                "TEMPORAL_PROFILE", "TEMPORAL_API_KEY"):
        env.pop(var, None)
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
    ui = f"http://127.0.0.1:{stack.env['FLEETFORGE_UI_PORT']}/namespaces/default/workflows/inspect%2F{run_id}/"
    assert ui in done.stdout, "the link carries the URL-encoded workflow id and the run id"
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
    assert_one_line_error(ff("show", "not a job", env=env), 2, "KIND/RUN_ID")


def test_unknown_job_exits_2_for_show_and_cancel(stack: Stack):
    assert_one_line_error(ff("show", "inspect/00000000-000000-dead", env=stack.env), 2, "fleetforge list")
    assert_one_line_error(ff("cancel", "inspect/00000000-000000-dead", env=stack.env), 2, "fleetforge list")


def test_dev_reuses_a_running_frontend_and_leaves_it_running(stack: Stack, tmp_path: Path):
    log = tmp_path / "second-dev.log"
    with open(log, "wb") as f:
        second = subprocess.Popen([FLEETFORGE, "dev", "--no-worker"], env=stack.env, stdout=f, stderr=f)
    try:
        wait_until(lambda: "Web UI:" in log.read_text(), timeout=30, message="second dev did not attach")
        assert "joined the Temporal server" in log.read_text() and "started for this store" in log.read_text()
    finally:
        second.send_signal(signal.SIGTERM)
        assert second.wait(timeout=30) == 0
    assert port_open(stack.port), "stopping an attached dev must not stop the server it did not start"
    assert ff("list", env=stack.env).returncode == 0


def test_dev_refuses_to_join_a_server_that_serves_another_store(stack: Stack, tmp_path: Path):
    other = {**stack.env, "FLEETFORGE_STATE_DIR": str(tmp_path / "other-state")}  # same address, another store
    done = subprocess.run([FLEETFORGE, "dev", "--no-worker"], env=other, capture_output=True, text=True, timeout=60)
    assert done.returncode == 2, done.stderr
    assert "another `fleetforge dev`" in done.stderr and str(tmp_path / "other-state") in done.stderr
    assert port_open(stack.port) and ff("list", env=stack.env).returncode == 0


def test_version_and_help_show_real_metavars():
    done = subprocess.run([FLEETFORGE, "--version"], capture_output=True, text=True, timeout=30)
    assert done.returncode == 0 and done.stdout.startswith("fleetforge ") and "temporalio" in done.stdout
    for command in ("list", "convert", "kernel", "fleet-test", "artifacts", "cancel", "dev", "worker"):
        shown = subprocess.run([FLEETFORGE, command, "--help"], capture_output=True, text=True, timeout=30)
        assert shown.returncode == 0, shown.stderr
        options = shown.stdout.split("Options:", 1)[1]
        assert "<bool>" not in options and "<str>" not in options and "<int" not in options, (command, options)
    assert "--limit N" in subprocess.run([FLEETFORGE, "list", "--help"], capture_output=True, text=True).stdout


def test_every_option_of_every_command_says_what_it_is_for():
    import typer

    from client.cli import app

    group = typer.main.get_command(app)
    options = [(name, param) for name, command in group.commands.items() for param in command.params  # type: ignore[attr-defined]
               if param.param_type_name == "option"]
    assert len(options) > 30
    assert [f"{name} {param.opts[0]}" for name, param in options if not (param.help or "").strip()] == []


def test_shell_completion_installs_shows_and_completes(tmp_path: Path):
    env = {**os.environ, "HOME": str(tmp_path), "SHELL": "/bin/bash"}
    shown = subprocess.run([FLEETFORGE, "--show-completion", "bash"], env=env, capture_output=True, text=True, timeout=30)
    assert shown.returncode == 0 and "_FLEETFORGE_COMPLETE=complete_bash" in shown.stdout
    installed = subprocess.run([FLEETFORGE, "--install-completion", "bash"], env=env, capture_output=True, text=True,
                               timeout=30)
    assert installed.returncode == 0, installed.stderr
    script = tmp_path / ".bash_completions" / "fleetforge.sh"
    assert script.is_file() and str(script) in (tmp_path / ".bashrc").read_text()

    def complete(words: str) -> list[str]:
        cword = str(len(words.split()) - 1)
        done = subprocess.run([FLEETFORGE], env={**env, "_FLEETFORGE_COMPLETE": "complete_bash", "COMP_WORDS": words,
                                                 "COMP_CWORD": cword}, capture_output=True, text=True, timeout=30)
        return done.stdout.split()

    assert complete("fleetforge arti") == ["artifacts"]
    assert complete("fleetforge list --status NEE") == ["NEEDS_INPUT"]


def fleet_of_two(stack: Stack, tmp_path: Path) -> tuple[str, str]:
    """A process-runner fleet of two rows that pass; (fleet workflow id, its first row's id)."""
    csv = tmp_path / "models.csv"
    csv.write_text('model_name,status,note,command\nfirst,,,"python -c ""print(1)"""\nsecond,,,"python -c ""print(2)"""\n')
    done = ff("fleet-test", str(csv), *SELF_TESTS_CLI, "--concurrency", "2", "--wait", "--json", env=stack.env,
              timeout=120)
    assert done.returncode == 0, done.stderr
    fleet_id = json.loads(done.stdout)["fleet_id"]
    return f"fleet-test/{fleet_id}", f"fleet/{fleet_id}/0"


@pytest.mark.docker
def test_a_docker_fleet_on_the_hosts_own_profile_discovers_no_gpu_and_good_images_are_yes(
        stack: Stack, tmp_path: Path, docker_image: str):
    """Issue 25 on this GPU-less machine: no --hardware, good images: the discovered profile (0 GPUs) is printed
    before any row starts, every row is Yes (never the host's No) and the verdicts land in the CSV."""
    csv = tmp_path / "models.csv"
    csv.write_text("model_name,status,note,command\n" + "".join(
        f"org/m{i},,,docker run --network host -e PORT={{port}} -e MODEL_NAME=org/m{i} {docker_image}\n" for i in range(2)))
    done = ff("fleet-test", str(csv), "--runner", "docker", "--concurrency", "2", "--wait", "--json", env=stack.env,
              timeout=240)
    assert done.returncode == 0, done.stderr
    assert re.search(r"hardware: 0 GPU\(s\), .*discovered on", done.stderr), done.stderr
    result = json.loads(done.stdout)
    assert (result["passed"], result["failed"], result["errors"]) == (2, 0, 0), result
    assert [line.split(",")[1] for line in csv.read_text().splitlines()[1:]] == ["Yes", "Yes"]


def test_show_watch_cancel_and_artifacts_take_a_fleet_row_id(stack: Stack, tmp_path: Path):
    fleet, row = fleet_of_two(stack, tmp_path)

    listed = ff("list", "--kind", "fleet-test", env=stack.env)
    assert listed.returncode == 0 and listed.stdout.splitlines()[0].split()[:5] == ["JOB", "KIND", "STATUS", "MODEL", "TARGET"]
    assert sum(1 for ln in listed.stdout.splitlines() if ln.startswith(fleet)) == 1
    assert row not in listed.stdout, "rows only with --rows"
    with_rows = ff("list", "--rows", "--json", env=stack.env)
    assert row in {j["workflow_id"] for j in json.loads(with_rows.stdout)["jobs"]}

    shown = ff("show", row, "--json", env=stack.env)
    assert shown.returncode == 0, (shown.stdout, shown.stderr)
    assert json.loads(shown.stdout)["passed"] is True and json.loads(shown.stdout)["row"] == 0
    watched = ff("watch", row, env=stack.env)
    assert watched.returncode == 0 and "row 0 first: passed" in watched.stdout, watched.stderr
    assert "fleet%2F" in watched.stdout  # its Web UI page
    logs = ff("artifacts", row, "--out", str(tmp_path / "logs"), env=stack.env)
    assert logs.returncode == 0, logs.stderr
    assert (tmp_path / "logs" / row / "attempt-1.log").is_file()
    assert_one_line_error(ff("cancel", row, env=stack.env), 2, row, "already finished", "COMPLETED")
    assert_one_line_error(ff("cancel", fleet.replace("fleet-test/", "fleet/"), env=stack.env), 2, "already finished")


def test_artifacts_downloads_a_conversion_under_its_names_sha256_checked(stack: Stack, model: Path, tmp_path: Path):
    import hashlib

    done = ff("convert", str(model), "--soc", "sm8550", "--precision", "fp16", "--wait", "--json", env=stack.env,
              timeout=120)
    assert done.returncode == 0, done.stderr
    result = json.loads(done.stdout)
    wid = f"convert/{result['run_id']}"

    listed = ff("artifacts", result["run_id"], env=stack.env)  # the bare run id names it too
    assert listed.returncode == 0, listed.stderr
    lines = listed.stdout.splitlines()
    assert [ln.split()[0] for ln in lines] == [a["name"] for a in result["artifacts"]], "names first"

    out_dir = tmp_path / "d"
    umask = 0o027
    fetched = subprocess.run(["sh", "-c", f"umask {umask:o} && exec {FLEETFORGE} artifacts {wid} --out {out_dir} --json"],
                             env=stack.env, capture_output=True, text=True, timeout=60)
    assert fetched.returncode == 0, fetched.stderr
    written = json.loads(fetched.stdout)["written"]
    assert sorted(written) == sorted(str(out_dir / a["name"]) for a in result["artifacts"])
    for a in result["artifacts"]:
        path = out_dir / a["name"]
        assert hashlib.sha256(path.read_bytes()).hexdigest() == a["sha256"]
        assert path.stat().st_mode & 0o777 == 0o666 & ~umask, "permissions like any file the user writes"
    assert any(name.endswith("_qnn.bin") for name in (a["name"] for a in result["artifacts"]))
    assert_one_line_error(ff("cancel", wid, env=stack.env), 2, "already finished", "COMPLETED")
    assert_one_line_error(ff("answer", wid, "soc=sm8550", env=stack.env), 2, "already finished", "no answers")


DOCS = Path(__file__).resolve().parents[2] / "docs"


def doc_block(page: str, after: str, lang: str) -> str:
    """The first ```lang block after the text `after` in docs/<page>; a moved or renamed section fails here."""
    text = (DOCS / page).read_text()
    assert after in text, f"docs/{page} no longer has {after!r}: point the test at where the example went"
    return text.split(after, 1)[1].split(f"```{lang}\n", 1)[1].split("```", 1)[0]


def test_the_documented_sdk_example_runs_as_written_and_exits_cleanly(stack: Stack, model: Path, tmp_path: Path):
    example = doc_block("sdk.md", "# The SDK", "python")
    assert 12 <= len([ln for ln in example.splitlines() if ln.strip()]) <= 20, "a ~15-line example"
    shutil.copy(model, tmp_path / "model.onnx")
    (tmp_path / "example.py").write_text(example)
    done = subprocess.run([sys.executable, "example.py"], cwd=tmp_path, env=stack.env, capture_output=True, text=True,
                          timeout=180)
    assert done.returncode == 0, (done.returncode, done.stderr[-2000:])
    cosine = re.search(r"^cosine (\d\.\d{6}) ", done.stdout, re.M)
    assert cosine and float(cosine.group(1)) >= 0.95, done.stdout  # int8's accuracy gate passed
    assert "%2F" in done.stdout  # the job's Web UI page
    assert any(p.name.endswith("_qnn.bin") for p in (tmp_path / "out" / "converted").iterdir())


def test_short_sdk_scripts_exit_cleanly_every_time(stack: Stack, tmp_path: Path):
    """No exit 134/139 (PyGILState_Release in interpreter finalisation) from a script that connects,
    lists and leaves, with or without `async with`: 10 runs (before: about 7 in 100 aborted)."""
    script = tmp_path / "short.py"
    script.write_text(
        "import asyncio, sys\n"
        "from client.sdk import FleetforgeClient\n"
        "async def main():\n"
        "    if sys.argv[1] == 'with':\n"
        "        async with FleetforgeClient.connect() as fc:\n"
        "            await fc.list_jobs(limit=5)\n"
        "    else:\n"
        "        fc = await FleetforgeClient.connect()\n"
        "        await fc.list_jobs(limit=5)\n"
        "asyncio.run(main())\n")
    codes = [subprocess.run([sys.executable, str(script), mode], env=stack.env, capture_output=True, timeout=60).returncode
             for mode in ["with", "plain"] * 5]
    assert codes == [0] * 10, codes


def test_cancel_takes_a_running_fleet_row_id(stack: Stack):
    from tests.e2e.test_temporal_cli import start_fleet_awaiting_approval

    row = f"fleet/{start_fleet_awaiting_approval(stack)}/0"  # waits for a person: running until cancelled
    wait_until(lambda: row in ff("list", "--rows", "--status", "AWAITING_APPROVAL", "--json", env=stack.env).stdout,
               timeout=60, message="the row never waited for approval")
    assert ff("show", row, env=stack.env).stdout.split()[:3] == [row, "model-test", "AWAITING_APPROVAL"]

    cancelled = ff("cancel", row, "--wait", "--json", env=stack.env)
    assert cancelled.returncode == 0, cancelled.stderr
    assert json.loads(cancelled.stdout)["status"] == "CANCELLED"
    assert_one_line_error(ff("show", row, env=stack.env), 1, row, "cancelled")
    wait_until(lambda: row in ff("list", "--rows", "--status", "CANCELLED", "--json", env=stack.env).stdout,
               timeout=20, message="the cancelled row is not listed as CANCELLED")
    assert row not in ff("list", "--rows", "--status", "AWAITING_APPROVAL", "--json", env=stack.env).stdout
