"""`fleetforge fleet-test --resume WORKFLOW_ID` reattaches to a running fleet: the CLI (a subprocess)
starts a fleet while no worker runs, a second CLI call reattaches with --wait while the real
worker (worker.py) works it off, and the verdicts are written back into the CSV."""

from __future__ import annotations

import asyncio
import csv
import json
import subprocess
import sys
from pathlib import Path

from tests.reliability.worker_process import WorkerProcess

FLEETFORGE = str(Path(sys.executable).parent / "fleetforge")


def ff(*args: str, env: dict[str, str], timeout: float = 120) -> subprocess.CompletedProcess[str]:
    return subprocess.run([FLEETFORGE, *args], env=env, capture_output=True, text=True, timeout=timeout)


async def test_fleet_test_resume_reattaches_and_writes_the_verdicts_back(temporal_env, tmp_path: Path):
    csv_path = tmp_path / "models.csv"
    with csv_path.open("w", newline="") as f:
        w = csv.writer(f, lineterminator="\n")
        w.writerow(["model_name", "status", "note", "command", "owner"])
        w.writerow(["org/pass", "", "", 'python -c "print(1)"', "team-a"])
        w.writerow(["org/fail", "", "", 'python -c "raise SystemExit(3)"', "team-b"])
        w.writerow(["org/done", "Yes", "kept", 'python -c "print(1)"', "team-c"])
    worker = WorkerProcess(temporal_env.client, tmp_path / "state")
    env = {**worker.env, "FLEETFORGE_LLM": "offline"}

    started = await asyncio.to_thread(ff, "fleet-test", str(csv_path), "--runner", "process", "--max-attempts", "1",
                                      "--json", env=env)
    assert started.returncode == 0, started.stderr
    wid = json.loads(started.stdout)["workflow_id"]
    assert wid.startswith("fleet-test/") and csv_path.read_text().count("Yes") == 1, "nothing ran yet (no worker)"

    async with worker:
        done = await asyncio.to_thread(ff, "fleet-test", str(csv_path), "--resume", wid, "--wait", "--json", env=env)
    assert done.returncode == 1, done.stderr  # a row failed: the fleet's verdict is FAILED (CI can gate on it)
    result = json.loads(done.stdout)
    assert result["status"] == "FAILED" and result["failure"]["code"] == "ROWS_FAILED"
    assert (result["total"], result["skipped"], result["passed"], result["failed"]) == (3, 1, 1, 1), result
    assert wid.endswith(result["fleet_id"]), "the same fleet, not a new one"
    rows = list(csv.DictReader(csv_path.open()))
    assert [(r["model_name"], r["status"], r["owner"]) for r in rows] == [
        ("org/pass", "Yes", "team-a"), ("org/fail", "No", "team-b"), ("org/done", "Yes", "team-c")]
    assert rows[1]["note"].startswith("CRASHED: ") and rows[2]["note"] == "kept"

    again = await asyncio.to_thread(ff, "fleet-test", str(csv_path), "--resume", "fleet-test/nope-0000", env=env)
    assert again.returncode == 2 and "nope-0000" in again.stderr
