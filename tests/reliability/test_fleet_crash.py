"""A fleet survives its worker being SIGKILLed mid-run: the real `worker.py` (WorkerProcess) runs a
docker-runner fleet on the real engine; it is killed while two containers are alive, a fresh worker
takes over, the retried test attempts replace the stale containers of the same name, and the fleet
completes with every row exactly once and no container left behind."""

from __future__ import annotations

import csv
import io
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
from contracts.fleet_job import FleetTestRequest, RunnerKind
from tests.conftest import fleet_containers
from tests.helpers import assert_eventually, free_ports
from tests.reliability.worker_process import WorkerProcess, running_activity
from workflows.fleet import FleetTestWorkflow

pytestmark = [pytest.mark.docker, pytest.mark.slow]

ROWS, SLOW = 10, 2
"""The first SLOW rows serve only after a delay, so their containers are alive when the worker dies."""


def manifest(image: str, ports: list[int]) -> str:
    buf = io.StringIO()
    w = csv.writer(buf, lineterminator="\n")
    w.writerow(["model_name", "status", "note", "command"])
    for i, port in enumerate(ports):
        delay = 4 if i < SLOW else 0
        w.writerow([f"org/m-{i}", "", "", f"docker run --network host -e PORT={port} -e DELAY={delay} {image}"])
    return buf.getvalue()


async def test_fleet_survives_a_worker_kill_with_containers_alive(temporal_env, tmp_path: Path, docker_image: str):
    client = temporal_env.client
    worker = WorkerProcess(client, tmp_path / "state")
    store = open_store(worker.settings)
    fleet_id = f"crash-{uuid.uuid4().hex[:8]}"
    wid = f"fleet/{fleet_id}"
    ref = upload_manifest(store, manifest(docker_image, free_ports(ROWS)))
    await worker.start()
    try:
        handle = await client.start_workflow(
            FleetTestWorkflow.run,
            FleetTestRequest(manifest=ref, runner=RunnerKind.DOCKER, concurrency=4, max_attempts=1, continue_every=4,
                             test_timeout_s=60, hardware=HardwareProfile(gpu_count=0), queues=worker.queues),
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
        result = await handle.result()
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
