"""A fleet survives its worker being SIGKILLed mid-run, and says so: the real `worker.py`
(WorkerProcess) is killed while tests run, a fresh worker takes over, and the retried test attempts
first stop what the dead attempt left (docker: the stale container of the same name; process runner:
the process group recorded in the row's marker). Every row is recorded once, its note and the
per-model table say the test ran twice, and nothing of the first run is left behind."""

from __future__ import annotations

import csv
import http.server
import io
import threading
import subprocess
import uuid
from pathlib import Path

import pytest
from temporalio.api.enums.v1 import EventType
from temporalio.service import RPCError

from activities.containers.activities import upload_manifest
from activities.storage import open_store
from contracts.common import JobStatus
from contracts.fleet import HardwareProfile
from contracts.fleet_job import FleetTestRequest, FleetTestResult, RunnerKind
from tests.conftest import fleet_containers
from tests.helpers import SELF_TESTS, assert_eventually, free_port_range, outcome_of
from tests.reliability.worker_process import WorkerProcess, running_activity
from workflows.fleet import FleetTestWorkflow

pytestmark = [pytest.mark.docker, pytest.mark.slow]

ROWS, SLOW = 10, 2
"""The first SLOW rows serve only after a delay, so their containers are alive when the worker dies."""


def manifest(image: str) -> str:
    buf = io.StringIO()
    w = csv.writer(buf, lineterminator="\n")
    w.writerow(["model_name", "status", "note", "command"])
    for i in range(ROWS):
        delay = 4 if i < SLOW else 0
        w.writerow([f"org/m-{i}", "", "", f"docker run --network host -e PORT={{port}} -e DELAY={delay} -e MODEL_NAME=org/m-{i} {image}"])
    return buf.getvalue()


async def test_fleet_survives_a_worker_kill_with_containers_alive(temporal_env, tmp_path: Path, docker_image: str):
    client = temporal_env.client
    worker = WorkerProcess(client, tmp_path / "state")
    store = open_store(worker.settings)
    fleet_id = f"crash-{uuid.uuid4().hex[:8]}"
    wid = f"fleet/{fleet_id}"
    ref = upload_manifest(store, manifest(docker_image))
    await worker.start()
    try:
        handle = await client.start_workflow(
            FleetTestWorkflow.run,
            FleetTestRequest(manifest=ref, runner=RunnerKind.DOCKER, concurrency=4, max_attempts=1, continue_every=4,
                             test_timeout_s=60, hardware=HardwareProfile(gpu_count=0, port_range=free_port_range(4)),
                             queues=worker.queues),
            id=wid, task_queue=worker.queues.workflows)

        async def slow_rows_alive() -> bool:
            for row in range(SLOW):
                try:
                    if not await running_activity(client, f"{wid}/{row}", "containers.run_test"):
                        return False
                except RPCError:  # the child is not started yet
                    return False
            return len(_running_containers(fleet_id, SLOW)) >= SLOW

        await assert_eventually(slow_rows_alive, timeout=60, interval=0.2, message="slow rows' containers running")
        stale = _running_containers(fleet_id, SLOW)  # fast rows' containers may come and go meanwhile
        worker.kill()
        assert set(stale) <= set(_running_containers(fleet_id, SLOW)), "the containers outlive the killed worker"
        await worker.start()
        result = await outcome_of(handle, FleetTestResult)  # a FAILED result shows its failure message
        progress = await handle.query(FleetTestWorkflow.progress)
    finally:
        worker.stop()

    assert result.status is JobStatus.COMPLETED and (result.passed, result.failed) == (ROWS, 0), result
    assert result.runs >= 3, "continued as new around the crash"
    assert (progress.done, progress.passed) == (ROWS, ROWS), "no row recorded twice"
    out = list(csv.DictReader(io.StringIO(store.get_bytes(result.csv).decode())))
    assert [r["model_name"] for r in out] == [f"org/m-{i}" for i in range(ROWS)] and {r["status"] for r in out} == {"Yes"}
    for row in range(SLOW):  # same attempt, retried by Temporal on the new worker: the stale container was replaced
        assert await _run_test_attempts(client, f"{wid}/{row}") >= 2
        assert out[row]["note"] == "passed (attempt 1, ran twice: an interrupted run was stopped and rerun)", out[row]
    table = list(csv.DictReader(io.StringIO(store.get_bytes(result.table).decode())))
    assert [r["reruns"] for r in table[:SLOW]] == ["1"] * SLOW
    assert fleet_containers(fleet_id) == [], "no orphan containers"


def _running_containers(fleet_id: str, rows: int) -> list[str]:
    """Running containers of the fleet's first `rows` rows."""
    r = subprocess.run(["docker", "ps", "--filter", f"label=fleetforge.run={fleet_id}",
                        "--format", '{{.ID}} {{.Label "fleetforge.key"}}'], capture_output=True, text=True, timeout=30)
    return [cid for cid, key in (line.split() for line in r.stdout.splitlines()) if int(key) < rows]


async def _run_test_attempts(client, workflow_id: str) -> int:
    """The Temporal attempt number of the run_test activity that completed."""
    history = await client.get_workflow_handle(workflow_id).fetch_history()
    return max(e.activity_task_started_event_attributes.attempt for e in history.events
               if e.event_type == EventType.EVENT_TYPE_ACTIVITY_TASK_STARTED)


ONCE_SLOW = ('python -c "import sys, time, urllib.request as u; first = u.urlopen(sys.argv[1] + \'/start\').read() == b\'first\'; '
             'time.sleep(300 if first else 0); u.urlopen(sys.argv[1] + \'/end\')" {base}')
"""A test whose first run hangs and whose later runs pass at once; each run reports its start and end to
the test's HTTP server (the sandboxed test shares the host's network, not its files)."""


class RunCounter:
    """Counts the test's starts and ends; the first start is told to hang."""

    def __init__(self) -> None:
        self.starts = self.ends = 0
        counter = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_GET(self) -> None:  # noqa: N802
                if self.path == "/start":
                    counter.starts += 1
                    body = b"first" if counter.starts == 1 else b"again"
                else:
                    counter.ends += 1
                    body = b"ok"
                self.send_response(200)
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args) -> None:
                pass

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        threading.Thread(target=self.server.serve_forever, daemon=True).start()
        self.base = f"http://127.0.0.1:{self.server.server_address[1]}"


async def test_a_process_test_interrupted_by_a_worker_kill_is_stopped_then_rerun_and_says_it_ran_twice(
        temporal_env, tmp_path: Path):
    """The process runner's test runs in the sandbox (bubblewrap, --die-with-parent): the killed worker
    takes its test along. The row's marker still names the interrupted run, so the retry says it ran twice."""
    client = temporal_env.client
    worker = WorkerProcess(client, tmp_path / "state")
    store = open_store(worker.settings)
    runs = RunCounter()
    buf = io.StringIO()
    w = csv.writer(buf, lineterminator="\n")
    w.writerow(["model_name", "status", "note", "command"])
    w.writerow(["org/interrupted", "", "", ONCE_SLOW.format(base=runs.base)])
    for i in range(3):
        w.writerow([f"org/quick-{i}", "", "", 'python -c "print(1)"'])
    wid = f"fleet/pcrash-{uuid.uuid4().hex[:8]}"
    await worker.start()
    try:
        handle = await client.start_workflow(
            FleetTestWorkflow.run,
            FleetTestRequest(manifest=upload_manifest(store, buf.getvalue()), **SELF_TESTS, concurrency=1,
                             max_attempts=1, hardware=HardwareProfile(gpu_count=0), queues=worker.queues),
            id=wid, task_queue=worker.queues.workflows)  # one row at a time: only the first is interrupted
        await assert_eventually(lambda: runs.starts == 1, timeout=60, message="the first run of the test started")
        worker.kill()
        await worker.start()
        result = await handle.result()
    finally:
        worker.stop()
        runs.server.shutdown()

    assert result.status is JobStatus.COMPLETED and result.passed == 4, result
    assert (runs.starts, runs.ends) == (2, 1), "the test started twice; the interrupted run never finished"
    out = list(csv.DictReader(io.StringIO(store.get_bytes(result.csv).decode())))
    assert out[0]["note"] == "passed (attempt 1, ran twice: an interrupted run was stopped and rerun)", out[0]
    assert [r["note"] for r in out[1:]] == ["passed (attempt 1)"] * 3
    table = list(csv.DictReader(io.StringIO(store.get_bytes(result.table).decode())))
    assert [r["reruns"] for r in table] == ["1", "0", "0", "0"]
    assert await _run_test_attempts(client, f"{wid}/0") == 2
