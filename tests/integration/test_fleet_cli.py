"""`fleetforge fleet-test` as a user runs it (subprocesses, the real worker.py): `--resume` reattaches
and writes the verdicts back; the manifest is never lost (hostile CSVs are exit 2 with the file
untouched, another CSV is refused, rows appended meanwhile survive, a cancelled fleet's finished rows
reach the CSV and a rerun skips them); `--require-approval` with `fleetforge approve`; `--test-timeout`."""

from __future__ import annotations

import asyncio
import csv
import io
import json
import subprocess
import sys
from pathlib import Path

from temporalio.service import RPCError

from tests.helpers import SELF_TESTS_CLI, assert_eventually
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

    started = await asyncio.to_thread(ff, "fleet-test", str(csv_path), *SELF_TESTS_CLI, "--max-attempts", "1",
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


def process_csv(path: Path, rows: list[tuple[str, str, str]], *, eol: str = "\n") -> bytes:
    """A process-runner manifest (model_name, status, command + an extra column) written as bytes."""
    buf = io.StringIO()
    w = csv.writer(buf, lineterminator=eol)
    w.writerow(["model_name", "status", "note", "command", "owner"])
    for i, (model, status, command) in enumerate(rows):
        w.writerow([model, status, "", command, f"team-{i}"])
    data = buf.getvalue().encode()
    path.write_bytes(data)
    return data


def rows_of(path: Path) -> list[dict[str, str]]:
    return list(csv.DictReader(io.StringIO(path.read_bytes().decode())))


OK = 'python -c "print(1)"'
HEADER = b"model_name,status,note,command\n"
HOSTILE = {
    "unclosed quote": (HEADER + b'org/a,,"the note never ends,python x.py\norg/b,,,python y.py\norg/c,,,python z.py\n',
                       "line 2: a quoted cell is never closed"),
    "10 MB cell": (HEADER + b"org/a,,," + b"x" * 10_000_000 + b"\norg/b,,,python y.py\n",
                   "line 2: a cell is longer than 65536 characters"),
    "NUL byte": (HEADER + b"org/a,,,python x.py\norg/b\x00evil,,,python y.py\n", "line 3: contains a NUL byte"),
    "duplicate model": (HEADER + b"org/a,,,python x.py\norg/b,,,python y.py\norg/a,,,python z.py\n",
                        "line 4: model 'org/a' is already on line 2"),
}


async def test_hostile_csvs_exit_2_before_anything_starts_and_the_file_is_untouched(temporal_env, tmp_path: Path):
    worker = WorkerProcess(temporal_env.client, tmp_path / "state")  # never started: nothing may reach a worker
    for case, (data, message) in HOSTILE.items():
        path = tmp_path / f"{case.replace(' ', '-')}.csv"
        path.write_bytes(data)
        done = await asyncio.to_thread(ff, "fleet-test", str(path), *SELF_TESTS_CLI, "--wait", env=worker.env)
        assert done.returncode == 2, (case, done.stderr)
        assert message in done.stderr and done.stderr.count("\n") == 1, (case, done.stderr)
        assert path.read_bytes() == data, f"{case}: the file is byte-identical"
        assert not path.with_name(path.name + ".bak").exists()
    listed = await temporal_env.client.count_workflows(f"TaskQueue = '{worker.queues.workflows}'")
    assert listed.count == 0, "no fleet was started"


async def test_resume_with_another_csv_is_refused_and_the_file_is_unchanged(temporal_env, tmp_path: Path):
    worker = WorkerProcess(temporal_env.client, tmp_path / "state")
    ours, other = tmp_path / "ours.csv", tmp_path / "unrelated.csv"
    process_csv(ours, [("org/a", "", OK)])
    before = process_csv(other, [(f"org/other-{i}", "", OK) for i in range(5)])
    started = await asyncio.to_thread(ff, "fleet-test", str(ours), *SELF_TESTS_CLI, "--json", env=worker.env)
    wid = json.loads(started.stdout)["workflow_id"]
    async with worker:
        await asyncio.to_thread(ff, "fleet-test", str(ours), "--resume", wid, "--wait", env=worker.env)
        refused = await asyncio.to_thread(ff, "fleet-test", str(other), "--resume", wid, "--wait", env=worker.env)
    assert refused.returncode == 2, refused.stderr
    assert "unrelated.csv is not the manifest fleet" in refused.stderr and "--force" in refused.stderr
    assert other.read_bytes() == before and not other.with_name("unrelated.csv.bak").exists()
    assert rows_of(ours)[0]["status"] == "Yes", "the fleet's own CSV got its verdict"


async def test_rows_appended_during_the_run_survive_the_write_back_and_error_rows_are_retested(
        temporal_env, tmp_path: Path):
    """The CSV grows while the fleet runs: the write-back merges by row identity, keeps the new row byte
    for byte and a backup of the previous version. A refused command is Error (exit 1, not a verdict
    about the model): the next run on the CSV tests it again, with the new row, and skips Yes/No."""
    worker = WorkerProcess(temporal_env.client, tmp_path / "state")
    path = tmp_path / "models.csv"
    process_csv(path, [("org/ok", "", OK), ("org/refused", "", "bash -c id"), ("org/crash", "", 'python -c "raise SystemExit(3)"')],
                eol="\r\n")
    started = await asyncio.to_thread(ff, "fleet-test", str(path), *SELF_TESTS_CLI, "--max-attempts", "1",
                                      "--json", env=worker.env)
    wid = json.loads(started.stdout)["workflow_id"]
    appended = b'org/late,,,"python -c ""print(2)""",team-x\r\n'
    with path.open("ab") as f:
        f.write(appended)
    grown = path.read_bytes()
    async with worker:
        done = await asyncio.to_thread(ff, "fleet-test", str(path), "--resume", wid, "--wait", "--json", env=worker.env)
        assert done.returncode == 1, done.stderr
        result = json.loads(done.stdout)
        assert (result["passed"], result["failed"], result["errors"]) == (1, 1, 1), result
        rows = rows_of(path)
        assert [(r["model_name"], r["status"]) for r in rows] == [
            ("org/ok", "Yes"), ("org/refused", "Error"), ("org/crash", "No"), ("org/late", "")]
        assert rows[1]["note"].startswith("POLICY_REJECTED: command rejected: program 'bash' is not allowed")
        assert path.read_bytes().endswith(appended) and path.read_bytes().count(b"\r\n") == 5
        assert path.with_name("models.csv.bak").read_bytes() == grown, "the previous version is kept"

        again = await asyncio.to_thread(ff, "fleet-test", str(path), *SELF_TESTS_CLI, "--max-attempts", "1",
                                        "--wait", "--json", env=worker.env)
    result = json.loads(again.stdout)
    assert (result["total"], result["skipped"], result["passed"], result["errors"]) == (4, 2, 1, 1), result
    assert [r["status"] for r in rows_of(path)] == ["Yes", "Error", "No", "Yes"]


async def test_a_cancelled_fleets_finished_rows_reach_the_csv_on_resume_and_a_rerun_skips_them(
        temporal_env, tmp_path: Path):
    from workflows.fleet import FleetTestWorkflow

    worker = WorkerProcess(temporal_env.client, tmp_path / "state")
    path = tmp_path / "models.csv"
    n = 10
    process_csv(path, [(f"org/m-{i}", "", 'python -c "import time; time.sleep(1.5)"') for i in range(n)])
    async with worker:
        started = await asyncio.to_thread(ff, "fleet-test", str(path), *SELF_TESTS_CLI, "--concurrency", "1",
                                          "--json", env=worker.env)
        wid = json.loads(started.stdout)["workflow_id"]
        handle = temporal_env.client.get_workflow_handle(wid)

        async def forty_percent() -> bool:
            return (await handle.query(FleetTestWorkflow.progress)).done >= 4

        await assert_eventually(forty_percent, timeout=120, interval=0.2, message="4 of 10 rows done")
        await handle.cancel()  # what `fleetforge cancel` does (a subprocess would start too late on a loaded machine)
        resumed = await asyncio.to_thread(ff, "fleet-test", str(path), "--resume", wid, "--wait", env=worker.env)
        assert resumed.returncode == 1 and "cancelled" in resumed.stderr, resumed.stderr
        finished = [r for r in rows_of(path) if r["status"]]
        assert 4 <= len(finished) < n and {r["status"] for r in finished} == {"Yes"}
        assert [r["model_name"] for r in finished] == [f"org/m-{i}" for i in range(len(finished))]

        rerun = await asyncio.to_thread(ff, "fleet-test", str(path), *SELF_TESTS_CLI, "--wait", "--json",
                                        env=worker.env)
    assert rerun.returncode == 0, rerun.stderr
    result = json.loads(rerun.stdout)
    assert (result["skipped"], result["passed"]) == (len(finished), n - len(finished)), "finished rows are not retested"
    assert {r["status"] for r in rows_of(path)} == {"Yes"}


async def test_require_approval_approve_refuse_and_the_test_timeout_from_the_cli(temporal_env, tmp_path: Path):
    from workflows.fleet import ModelTestWorkflow

    worker = WorkerProcess(temporal_env.client, tmp_path / "state")
    path = tmp_path / "models.csv"
    slow = 'python -c "import time; time.sleep(60)"'
    process_csv(path, [("org/slow", "", slow), ("org/nope", "", OK)])
    async with worker:
        started = await asyncio.to_thread(ff, "fleet-test", str(path), *SELF_TESTS_CLI, "--require-approval",
                                          "--test-timeout", "2", "--max-attempts", "1", "--json", env=worker.env)
        assert started.returncode == 0, started.stderr
        fleet = json.loads(started.stdout)["workflow_id"].removeprefix("fleet-test/")

        async def waiting(row: int) -> bool:
            try:
                return bool(await temporal_env.client.get_workflow_handle(f"fleet/{fleet}/{row}").query(
                    ModelTestWorkflow.pending_command))
            except RPCError:  # the row's child is not started yet
                return False

        for row in (0, 1):
            await assert_eventually(lambda: waiting(row), timeout=60, message=f"row {row} awaiting approval")
        early = await asyncio.to_thread(ff, "approve", f"fleet/{fleet}/0", "--attempt", "2", env=worker.env)
        assert early.returncode == 2 and "attempt 1 is awaiting approval, not attempt 2" in early.stderr
        ok = await asyncio.to_thread(ff, "approve", f"fleet/{fleet}/0", "--attempt", "1", env=worker.env)
        assert ok.returncode == 0 and f"fleet/{fleet}/0 attempt 1: approved: {slow}" in ok.stdout, ok.stderr
        no = await asyncio.to_thread(ff, "approve", f"fleet/{fleet}/1", "--attempt", "1", "--refuse", "--reason",
                                     "not on this host", "--json", env=worker.env)
        assert no.returncode == 0 and json.loads(no.stdout)["verdict"] == "refused", no.stderr
        done = await asyncio.to_thread(ff, "fleet-test", str(path), "--resume", f"fleet-test/{fleet}", "--wait",
                                       env=worker.env)
    assert done.returncode == 1, done.stderr
    rows = rows_of(path)
    assert rows[0]["status"] == "No" and rows[0]["note"].startswith("TIMEOUT: the test did not finish within --test-timeout")
    assert (rows[1]["status"], rows[1]["note"]) == ("Error", "POLICY_REJECTED: refused by reviewer: not on this host")
