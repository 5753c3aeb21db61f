"""Fleet-test throughput (models/s) against a bare Temporal parent/child baseline, in one run.

Starts the embedded Temporal dev server (127.0.0.1) and one in-process worker, then:

1. runs FleetTestWorkflow over `--rows` rows with the process runner, instant tests (`true`),
   `--concurrency` children at a time and one attempt per row;
2. counts the activities one ModelTestWorkflow child ran (from its history);
3. runs a bare parent workflow with the same sliding window of bare children, each running that
   many no-op activities and local activities (no policy, no store, no presentation): what
   Temporal itself costs.

Prints both rates and fleet / baseline (target >= 0.5). Exit code 0 when the target is met.
"""

from __future__ import annotations

import argparse
import asyncio
import csv
import io
import tempfile
import time
import uuid
from datetime import timedelta
from pathlib import Path

from pydantic import BaseModel
from temporalio import activity, workflow

TARGET_RATIO = 0.5


class BareRequest(BaseModel):
    rows: int
    concurrency: int
    activities_per_row: int
    local_activities_per_row: int
    queue: str


@activity.defn(name="bench.noop")
def noop(i: int) -> int:
    return i


@workflow.defn
class BareChild:
    @workflow.run
    async def run(self, req: BareRequest) -> int:
        for i in range(req.local_activities_per_row):
            await workflow.execute_local_activity(noop, i, start_to_close_timeout=timedelta(seconds=30))
        for i in range(req.activities_per_row):
            await workflow.execute_activity(noop, i, task_queue=req.queue, start_to_close_timeout=timedelta(seconds=30))
        return req.activities_per_row + req.local_activities_per_row


@workflow.defn
class BareParent:
    """The sliding window without anything of fleetforge's: start children, keep `concurrency` running."""

    def __init__(self) -> None:
        self._running = 0

    @workflow.run
    async def run(self, req: BareRequest) -> int:
        done = 0

        async def child(row: int) -> None:
            nonlocal done
            await workflow.execute_child_workflow(BareChild.run, req, id=f"{workflow.info().workflow_id}/{row}",
                                                  task_queue=req.queue)
            done += 1
            self._running -= 1

        for row in range(req.rows):
            await workflow.wait_condition(lambda: self._running < req.concurrency)
            self._running += 1
            asyncio.create_task(child(row))
        await workflow.wait_condition(lambda: done == req.rows)
        return done


def manifest(rows: int) -> str:
    buf = io.StringIO()
    w = csv.writer(buf, lineterminator="\n")
    w.writerow(["model_name", "status", "note", "command"])
    for i in range(rows):
        w.writerow([f"org/bench-{i}", "", "", "true"])
    return buf.getvalue()


async def activities_of(client, workflow_id: str) -> tuple[int, int]:
    """(activities, local activities) one workflow ran, from its history."""
    from temporalio.api.enums.v1 import EventType

    history = await client.get_workflow_handle(workflow_id).fetch_history()
    kinds = [e.event_type for e in history.events]
    return kinds.count(EventType.EVENT_TYPE_ACTIVITY_TASK_SCHEDULED), kinds.count(EventType.EVENT_TYPE_MARKER_RECORDED)


async def main_async(rows: int, concurrency: int, workdir: Path) -> int:
    from temporalio.contrib.pydantic import pydantic_data_converter
    from temporalio.testing import WorkflowEnvironment

    from activities.containers.activities import ContainerActivities, upload_manifest
    from activities.storage import FileStore
    from client.binaries import temporal_binary
    from contracts.common import JobStatus, TaskQueues
    from contracts.fleet_job import FleetTestRequest, RunnerKind
    from contracts.settings import Settings
    from tests.helpers import new_worker
    from workflows._visibility import SEARCH_ATTRIBUTES
    from workflows.fleet import FleetTestWorkflow, ModelTestWorkflow

    store = FileStore(workdir / "artifacts")
    acts = ContainerActivities(store, Settings(state_dir=workdir / "state"), process_programs=("true",))
    queue = f"bench-{uuid.uuid4().hex[:8]}"
    env = await WorkflowEnvironment.start_local(dev_server_existing_path=temporal_binary(), search_attributes=SEARCH_ATTRIBUTES,
                                                data_converter=pydantic_data_converter, dev_server_log_level="error")
    try:
        client = env.client
        async with new_worker(client, workflows=[FleetTestWorkflow, ModelTestWorkflow, BareParent, BareChild],
                              activities=[*acts.all(), noop], task_queue=queue, max_concurrent_activities=64,
                              max_concurrent_workflow_tasks=64):
            fleet_id = uuid.uuid4().hex[:8]
            req = FleetTestRequest(manifest=upload_manifest(store, manifest(rows)), runner=RunnerKind.PROCESS,
                                   concurrency=concurrency, max_attempts=1, queues=TaskQueues.single(queue))
            t0 = time.monotonic()
            result = await client.execute_workflow(FleetTestWorkflow.run, req, id=f"fleet/{fleet_id}", task_queue=queue)
            fleet_s = time.monotonic() - t0
            if result.status is not JobStatus.COMPLETED or result.passed != rows:
                raise SystemExit(f"fleet did not pass every row: {result}")
            per_row, local_per_row = await activities_of(client, f"fleet/{fleet_id}/0")

            bare = BareRequest(rows=rows, concurrency=concurrency, activities_per_row=per_row,
                               local_activities_per_row=local_per_row, queue=queue)
            t0 = time.monotonic()
            await client.execute_workflow(BareParent.run, bare, id=f"bare/{uuid.uuid4().hex[:8]}", task_queue=queue)
            bare_s = time.monotonic() - t0
    finally:
        await env.shutdown()

    fleet_rate, bare_rate = rows / fleet_s, rows / bare_s
    ratio = fleet_rate / bare_rate
    print(f"rows {rows}, concurrency {concurrency}, process runner, instant tests, per row {per_row} activities + "
          f"{local_per_row} local activities, {result.runs} fleet workflow runs")
    print(f"fleet-test:          {fleet_s:7.2f} s  {fleet_rate:7.1f} models/s")
    print(f"bare parent/child:   {bare_s:7.2f} s  {bare_rate:7.1f} rows/s  (the same no-op activities per child)")
    print(f"ratio fleet / bare:  {ratio:.2f}  (target >= {TARGET_RATIO}): {'PASS' if ratio >= TARGET_RATIO else 'FAIL'}")
    return 0 if ratio >= TARGET_RATIO else 1


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rows", type=int, default=1000)
    ap.add_argument("--concurrency", type=int, default=32)
    ap.add_argument("--workdir", help="state and artifacts folder (default: a temp dir)")
    args = ap.parse_args()
    if args.workdir:
        raise SystemExit(asyncio.run(main_async(args.rows, args.concurrency, Path(args.workdir))))
    with tempfile.TemporaryDirectory() as d:
        raise SystemExit(asyncio.run(main_async(args.rows, args.concurrency, Path(d))))


if __name__ == "__main__":
    main()
