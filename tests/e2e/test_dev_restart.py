"""`fleetforge dev` keeps its jobs in the state dir: a restarted stack still lists earlier runs."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

from client.binaries import temporal_binary
from examples.tiny_model import build_tiny_cnn
from tests.e2e.test_cli import ff, stack_env, start_dev, stop_dev


def test_restarted_dev_stack_still_lists_earlier_runs(tmp_path: Path):
    model = build_tiny_cnn(tmp_path / "hub" / "tiny.onnx")
    first = start_dev(stack_env(tmp_path / "state"))
    try:
        done = ff("inspect", str(model), "--wait", "--json", env=first.env)
        assert done.returncode == 0, done.stderr
        run_id = json.loads(done.stdout)["run_id"]
    finally:
        assert stop_dev(first) == 0
    assert (tmp_path / "state" / "temporal.db").is_file()

    second = start_dev(stack_env(tmp_path / "state", port=first.port))
    try:
        listed = ff("list", "--kind", "inspect", "--json", env=second.env)
        assert listed.returncode == 0, listed.stderr
        jobs = {j["workflow_id"]: j for j in json.loads(listed.stdout)["jobs"]}
        assert jobs[f"inspect/{run_id}"]["status"] == "COMPLETED"

        found = subprocess.run(
            [temporal_binary(), "workflow", "list", "--address", f"127.0.0.1:{second.port}",
             "--query", "FleetforgeJob='inspect'", "--output", "json"],
            capture_output=True, text=True, timeout=30,
        )
        assert found.returncode == 0, found.stderr
        assert f"inspect/{run_id}" in found.stdout
    finally:
        assert stop_dev(second) == 0
