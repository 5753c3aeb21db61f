"""`fleetforge dev` keeps its jobs in the state dir (a restarted stack still lists earlier runs),
supervises its worker (restarts it; gives up cleanly) and never leaves a process behind."""

from __future__ import annotations

import json
import os
import signal
import subprocess
from pathlib import Path

from client.binaries import temporal_binary
from examples.tiny_model import build_tiny_cnn
from tests.e2e.test_cli import ff, port_open, stack_env, start_dev, stop_dev
from tests.helpers import alive, free_ports, wait_until


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
            [temporal_binary(), "workflow", "list",  # TEMPORAL_ADDRESS, as fleetforge dev's
             "--query", "FleetforgeJob='inspect'", "--output", "json"],
            env=second.env, capture_output=True, text=True, timeout=30,
        )
        assert found.returncode == 0, found.stderr
        assert f"inspect/{run_id}" in found.stdout
    finally:
        assert stop_dev(second) == 0


def worker_pids(log: Path) -> list[int]:
    return [int(line.rsplit("pid ", 1)[1].rstrip(")")) for line in log.read_text().splitlines()
            if line.startswith("worker started (pid ")]


def metrics_served(port: int) -> bool:
    import httpx

    try:
        return "temporal_" in httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=2).text
    except httpx.HTTPError:
        return False


def test_dev_restarts_a_dead_worker_and_jobs_still_run(tmp_path: Path):
    model = build_tiny_cnn(tmp_path / "hub" / "tiny.onnx")
    env = stack_env(tmp_path / "state")
    metrics = free_ports()[0]
    env.env["FLEETFORGE_METRICS_PORT"] = str(metrics)  # served by the worker process, again after a restart
    stack = start_dev(env)
    log = Path(stack.env["FLEETFORGE_STATE_DIR"]) / "dev.log"
    try:
        first = wait_until(lambda: worker_pids(log), timeout=30, message="no worker started")[0]
        os.kill(first, signal.SIGKILL)
        second = wait_until(lambda: worker_pids(log)[1:], timeout=30, message="the dead worker was not restarted")[0]
        assert second != first and alive(second) and not alive(first)
        assert "restarting it" in log.read_text()

        done = ff("inspect", str(model), "--wait", "--json", env=stack.env, timeout=120)
        assert done.returncode == 0, done.stderr
        assert json.loads(done.stdout)["status"] == "COMPLETED"
        wait_until(lambda: metrics_served(metrics), timeout=30, message="the restarted worker serves no metrics")
    finally:
        assert stop_dev(stack) == 0
    assert not any(alive(p) for p in worker_pids(log)), "stopping dev stops its worker"


def test_a_worker_that_keeps_dying_stops_everything_cleanly(tmp_path: Path):
    stack = start_dev(stack_env(tmp_path / "state"))
    log = Path(stack.env["FLEETFORGE_STATE_DIR"]) / "dev.log"
    assert stack.proc is not None
    killed: list[int] = []
    try:
        while stack.proc.poll() is None and len(killed) < 10:
            pid = wait_until(lambda: [p for p in worker_pids(log) if p not in killed] or stack.proc.poll() is not None,
                             timeout=60, message="no new worker")
            if pid is True:
                break
            os.kill(pid[0], signal.SIGKILL)
            killed.append(pid[0])
        assert stack.proc.wait(timeout=60) == 1
    finally:
        if stack.proc.poll() is None:
            stack.proc.kill()
    assert len(killed) == 5 and "stopping fleetforge dev" in log.read_text()
    wait_until(lambda: not port_open(stack.port), timeout=10, message="the Temporal server outlived fleetforge dev")


def test_a_killed_dev_leaves_no_orphaned_server_or_worker(tmp_path: Path):
    stack = start_dev(stack_env(tmp_path / "state"))
    log = Path(stack.env["FLEETFORGE_STATE_DIR"]) / "dev.log"
    assert stack.proc is not None
    worker = wait_until(lambda: worker_pids(log), timeout=30, message="no worker started")[0]
    stack.proc.kill()  # SIGKILL: no chance to clean up; the kernel tells its children
    stack.proc.wait(timeout=30)
    wait_until(lambda: not port_open(stack.port), timeout=30, message="the Temporal server was orphaned")
    wait_until(lambda: not alive(worker), timeout=30, message="the worker was orphaned")
