"""The README's `temporal ...` commands, run as written (no --address: TEMPORAL_ADDRESS is the one
setting both tools read) against a `fleetforge dev` stack with a job of each kind in the state the
command needs: a conversion waiting for input, a failed kernel job, a finished SM8550 conversion, a
fleet whose row waits for approval."""

from __future__ import annotations

import json
import shlex
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from client.binaries import temporal_binary
from contracts.fleet_job import ProcessMode, RunnerKind
from examples.tiny_model import build_tiny_cnn
from tests.e2e.test_cli import DOCS, Stack, ff, stack_env, start_dev, stop_dev
from tests.helpers import wait_until

pytestmark = pytest.mark.slow
ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def stack(tmp_path: Path) -> Iterator[Stack]:
    s = start_dev(stack_env(tmp_path / "state"))
    try:
        yield s
    finally:
        assert stop_dev(s) == 0


def documented_temporal_commands() -> list[str]:
    """Every `temporal ...` command of docs/inspecting.md's Temporal CLI section (continuation lines
    joined, comments dropped)."""
    section = (DOCS / "inspecting.md").read_text().split("### Temporal CLI", 1)[1].split("\n### ", 1)[0]
    blocks = [block.split("```", 1)[0] for block in section.split("```sh\n")[1:]]
    lines = "\n".join(blocks).replace("\\\n", " ").splitlines()
    return [" ".join(line.partition(" #")[0].split()) for line in lines if line.startswith("temporal ")]


def temporal(command: str, env: dict[str, str], ids: dict[str, str]) -> subprocess.CompletedProcess[str]:
    for placeholder, value in ids.items():
        command = command.replace(placeholder, value)
    argv = shlex.split(command)
    assert "--address" not in argv
    return subprocess.run([temporal_binary(), *argv[1:]], env=env, capture_output=True, text=True, timeout=60)


def start_fleet_awaiting_approval(stack: Stack) -> str:
    """A one-row process fleet that asks for approval of its command (through the SDK, in a child
    process so this test's loop stays free); its fleet id. The command serves nothing, so it runs in
    self-test mode (its exit code is the verdict)."""
    script = (
        "import asyncio\n"
        "from client.sdk import FleetforgeClient\n"
        "from contracts.fleet_job import ProcessMode, RunnerKind\n"
        "async def main():\n"
        "    async with FleetforgeClient.connect() as fc:\n"
        "        h = await fc.start_fleet_test('model_name,status,note,command\\nfirst,,,\"python -c \"\"print(1)\"\"\"\\n',\n"
        f"                                      runner=RunnerKind('{RunnerKind.PROCESS.value}'), require_approval=True,\n"
        f"                                      process_mode=ProcessMode('{ProcessMode.SELF_TEST.value}'))\n"
        "        print(h.id)\n"
        "asyncio.run(main())\n")
    done = subprocess.run([sys.executable, "-c", script], env=stack.env, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    return done.stdout.strip().split("/", 1)[1]


def test_the_documented_temporal_commands_work_as_written_against_fleetforge_dev(stack: Stack, tmp_path: Path):
    env = stack.env
    model = build_tiny_cnn(tmp_path / "tiny.onnx")
    commands = documented_temporal_commands()
    assert len(commands) >= 9 and any("ExecutionStatus='Failed'" in c for c in commands)

    waiting = ff("convert", str(model), env=env).stdout.strip()  # no SoC/precision: it asks
    sort_task = tmp_path / "sort.py"  # sorting: nothing offline lowers it, so it fails after its designer step
    sort_task.write_text((ROOT / "examples/kernelbench/36_Cumsum.py").read_text()
                         .replace("torch.cumsum(x, dim=self.dim)", "torch.sort(x, dim=self.dim)[0]"))
    failed_kernel = ff("kernel", str(sort_task), "--set", "batch_size=16", "--set", "length=64",
                       "--wait", "--json", env=env, timeout=120)
    assert failed_kernel.returncode == 1, failed_kernel.stderr  # a FAILED job exits 1
    kernel_result = json.loads(failed_kernel.stdout)
    assert kernel_result["status"] == "FAILED" and kernel_result["failure"]["code"]
    kernel_id = json.loads(ff("list", "--kind", "kernel", "--json", env=env).stdout)["jobs"][0]["workflow_id"]
    converted = ff("convert", str(model), "--soc", "sm8550", "--precision", "fp16", "--wait", "--json", env=env,
                   timeout=120)
    assert converted.returncode == 0, converted.stderr
    sm8550 = "convert/" + json.loads(converted.stdout)["run_id"]
    fleet_id = start_fleet_awaiting_approval(stack)
    row = f"fleet/{fleet_id}/0"
    wait_until(lambda: row in ff("list", "--rows", "--status", "AWAITING_APPROVAL", "--json", env=env).stdout,
               timeout=60, message="the fleet row never waited for approval")
    wait_until(lambda: waiting in ff("list", "--status", "NEEDS_INPUT", "--json", env=env).stdout, timeout=30,
               message="the conversion never waited for input")

    inspected = ff("inspect", str(model), "--wait", env=env, timeout=120)
    assert inspected.returncode == 0, inspected.stderr
    inspect_id = json.loads(ff("list", "--kind", "inspect", "--json", env=env).stdout)["jobs"][0]["workflow_id"]
    ids = {"convert/RUN_ID": waiting, "inspect/RUN_ID": inspect_id, "kernel/RUN_ID": kernel_id, "fleet-test/RUN_ID": f"fleet-test/{fleet_id}",
           "fleet/FLEET_ID/ROW": row}
    expect = {  # what each command must show (beyond exit 0)
        "FleetforgeStatus='NEEDS_INPUT'": [waiting],
        "ExecutionStatus='Failed'": [kernel_id],
        "FleetforgeTarget='SM8550'": [sm8550],
        "--name status": ["NEEDS_INPUT"],
        "--name trace": ["designer"],
        "--name step": ["completed"],
        "--name progress": ["total"],
    }
    assert [key for key in expect if not any(key in c for c in commands)] == [], "an expectation no command checks"
    for command in commands:
        done = temporal(command, env, ids)
        assert done.returncode == 0, (command, done.stdout, done.stderr)
        for key, words in expect.items():
            if key in command:
                for word in words:
                    assert word in done.stdout, (command, done.stdout)
    assert waiting not in temporal("temporal workflow list --query \"ExecutionStatus='Failed'\"", env, {}).stdout

    wait_until(lambda: json.loads(ff("show", waiting, "--json", env=env).stdout).get("status") == "COMPLETED",
               timeout=120, message="the answered conversion did not complete")
    wait_until(lambda: json.loads(ff("show", f"fleet-test/{fleet_id}", "--json", env=env).stdout).get("status")
               == "COMPLETED", timeout=120, message="the approved fleet did not complete")
