"""Fleet-test throughput (models/s) against a bare Temporal parent/child baseline, in one run.

Starts the embedded Temporal dev server (127.0.0.1) and one in-process worker, then:

1. warms both paths up, untimed: a fleet and a bare parent of WARM_UP_ROWS rows each (first imports,
   caches and the server's tables would otherwise be charged to whichever runs first); the warm-up
   fleet's first child tells how many activities and local activities a row runs (from its history);
2. runs `--rounds` rounds, each timing both, alternating which goes first:
   * FleetTestWorkflow over `--rows` rows with the process runner, instant tests (`true`, in the
     sandbox), `--concurrency` children at a time and one attempt per row;
   * a bare parent workflow with the same sliding window of bare children, each running that many
     no-op activities and local activities (no policy, no store, no sandbox, no presentation): what
     Temporal itself costs.

Prints each round's rates and ratio, their median (target >= 0.7), the CPU each side cost per row in the
worker process, the Temporal server and the whole machine (where a gap comes from), and the largest history (events) of
any fleet workflow run. Exit code 0 when the median meets the target. `--no-baseline` runs the fleet
alone, once (a 10,000-row run: its wall time, rows/s and largest history).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import csv
import io
import os
import statistics
import tempfile
import time
import uuid
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from typing import TypeVar

from pydantic import BaseModel
from temporalio import activity, workflow

from bench._dev_server import dev_server

with workflow.unsafe.imports_passed_through():  # the sandbox re-imports this module for every bare child
    from activities.sandbox import proc_stat

T = TypeVar("T")
TARGET_RATIO = 0.7
ROUNDS = 3
WARM_UP_ROWS = 64


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


async def sliding_window(rows: int, concurrency: int, run_row: Callable[[int], Awaitable[object]]) -> int:
    """Workflow code: run `run_row(row)` for every row, `concurrency` at a time; the rows done."""
    running = done = 0

    async def one(row: int) -> None:
        nonlocal running, done
        await run_row(row)
        done += 1
        running -= 1

    for row in range(rows):
        await workflow.wait_condition(lambda: running < concurrency)
        running += 1
        asyncio.create_task(one(row))
    await workflow.wait_condition(lambda: done == rows)
    return done


@workflow.defn
class BareParent:
    """The sliding window without anything of fleetforge's: start children, keep `concurrency` running."""

    @workflow.run
    async def run(self, req: BareRequest) -> int:
        return await sliding_window(req.rows, req.concurrency, lambda row: workflow.execute_child_workflow(
            BareChild.run, req, id=f"{workflow.info().workflow_id}/{row}", task_queue=req.queue))


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


async def largest_run_history(client, workflow_id: str) -> tuple[int, int]:
    """(runs, largest event count of any run) of a workflow id, following continue-as-new."""
    from temporalio.api.enums.v1 import EventType

    handle = client.get_workflow_handle(workflow_id)
    run_id = (await handle.describe()).raw_description.workflow_execution_info.first_run_id
    runs, largest = 0, 0
    while run_id:
        history = await client.get_workflow_handle(workflow_id, run_id=run_id).fetch_history()
        runs, largest = runs + 1, max(largest, len(history.events))
        last = history.events[-1]
        run_id = (last.workflow_execution_continued_as_new_event_attributes.new_execution_run_id
                  if last.event_type == EventType.EVENT_TYPE_WORKFLOW_EXECUTION_CONTINUED_AS_NEW else "")
    return runs, largest


def server_pid() -> int | None:
    """The embedded Temporal server: this process's child named `temporal`."""
    for entry in os.scandir("/proc"):
        if entry.name.isdigit() and (fields := proc_stat(int(entry.name))) and int(fields[1]) == os.getpid():
            with contextlib.suppress(OSError):
                if Path(f"/proc/{entry.name}/comm").read_text().strip() == "temporal":
                    return int(entry.name)
    return None


def cpu_s(server: int | None) -> tuple[float, float, float]:
    """(this process's CPU seconds, the server's, the whole machine's): user + system (the machine's also
    counts what the sandboxed children and the kernel spend on them)."""
    mine = os.times()
    serving = 0.0
    if server is not None and (fields := proc_stat(server)):
        serving = (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    user, nice, system, _idle, _iowait, irq, softirq, *_ = map(int, Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:])
    machine = (user + nice + system + irq + softirq) / os.sysconf("SC_CLK_TCK")
    return mine.user + mine.system, serving, machine


@dataclass
class Timed:
    """One timed run: its wall seconds and the CPU seconds the worker process, the server and the whole
    machine spent in it."""

    wall_s: float
    worker_cpu_s: float
    server_cpu_s: float
    machine_cpu_s: float


@dataclass
class Round:
    fleet: Timed
    bare: Timed
    bare_first: bool

    def ratio(self) -> float:
        """fleet rate / bare rate for the same rows: bare time / fleet time."""
        return self.bare.wall_s / self.fleet.wall_s


async def main_async(rows: int, concurrency: int, workdir: Path, baseline: bool = True, rounds: int = ROUNDS) -> int:
    from activities.containers.activities import ContainerActivities, upload_manifest
    from activities.storage import FileStore
    from contracts.common import JobStatus, TaskQueues
    from contracts.fleet import HardwareProfile
    from contracts.fleet_job import FleetTestRequest, ProcessMode, RunnerKind
    from contracts.settings import Settings
    from tests.helpers import new_worker
    from worker import cache_bytecode
    from workflows.fleet import FleetTestWorkflow, ModelTestWorkflow

    # the sandbox imports each run's module afresh: the bare children's module (this file) gets the
    # bytecode the worker writes for fleetforge's workflow modules, so neither side compiles per run
    cache_bytecode(Path(__file__))

    store = FileStore(workdir / "artifacts")
    acts = ContainerActivities(store, Settings(state_dir=workdir / "state"), process_programs=("true",))
    queue = f"bench-{uuid.uuid4().hex[:8]}"
    # instant tests need no GPU: a GPU-less host whose port range does not cap the window
    hardware = HardwareProfile(gpu_count=0, port_range=(20000, 20000 + concurrency - 1))
    async with dev_server() as env:
        client = env.client

        server = server_pid()

        async def timed(run: Awaitable[T]) -> tuple[Timed, T]:
            wall, before = time.monotonic(), cpu_s(server)
            result = await run
            after = cpu_s(server)
            return Timed(time.monotonic() - wall, *(a - b for a, b in zip(after, before, strict=True))), result

        async def fleet(n: int) -> tuple[Timed, str, int]:
            """(time, fleet id, workflow runs) of a fleet of n instant rows."""
            fleet_id = uuid.uuid4().hex[:8]
            req = FleetTestRequest(manifest=upload_manifest(store, manifest(n)), runner=RunnerKind.PROCESS,
                                   process_mode=ProcessMode.SELF_TEST,
                                   concurrency=concurrency, max_attempts=1, queues=TaskQueues.single(queue),
                                   hardware=hardware)
            took, result = await timed(client.execute_workflow(FleetTestWorkflow.run, req, id=f"fleet/{fleet_id}",
                                                               task_queue=queue))
            if result.status is not JobStatus.COMPLETED or result.passed != n:
                raise SystemExit(f"fleet did not pass every row: {result}")
            return took, fleet_id, result.runs

        async def bare(n: int) -> Timed:
            req = BareRequest(rows=n, concurrency=concurrency, activities_per_row=per_row,
                              local_activities_per_row=local_per_row, queue=queue)
            took, _ = await timed(client.execute_workflow(BareParent.run, req, id=f"bare/{uuid.uuid4().hex[:8]}",
                                                          task_queue=queue))
            return took

        async with new_worker(client, workflows=[FleetTestWorkflow, ModelTestWorkflow, BareParent, BareChild],
                              activities=[*acts.all(), noop], task_queue=queue, max_concurrent_activities=64,
                              max_concurrent_workflow_tasks=64):
            if not baseline:  # the fleet alone, once
                alone, fleet_id, runs = await fleet(rows)
                per_row, local_per_row = await activities_of(client, f"fleet/{fleet_id}/0")
                results: list[Round] = []
            else:
                _, warm_id, _ = await fleet(WARM_UP_ROWS)  # first imports, caches, the server's tables: untimed
                per_row, local_per_row = await activities_of(client, f"fleet/{warm_id}/0")
                await bare(WARM_UP_ROWS)
                results = []
                for r in range(rounds):  # alternate which goes first: neither gains from the other's leftovers
                    bare_first = r % 2 == 1
                    first = await bare(rows) if bare_first else None
                    took, fleet_id, runs = await fleet(rows)
                    results.append(Round(took, first or await bare(rows), bare_first))
            history_runs, largest = await largest_run_history(client, f"fleet/{fleet_id}")
            _, child_events = await largest_run_history(client, f"fleet/{fleet_id}/0")

    print(f"rows {rows}, concurrency {concurrency}, process runner, instant tests, per row {per_row} activities + "
          f"{local_per_row} local activities, {runs} fleet workflow runs")
    print(f"largest history:     {largest} events in one of the fleet's {history_runs} runs; a row's history {child_events} events")
    if not baseline:
        print(f"fleet-test:          {alone.wall_s:7.2f} s  {rows / alone.wall_s:7.1f} models/s; CPU per row: "
              f"worker {alone.worker_cpu_s / rows * 1000:.1f} ms, server {alone.server_cpu_s / rows * 1000:.1f} ms, "
              f"machine {alone.machine_cpu_s / rows * 1000:.1f} ms")
        return 0
    print(f"warm-up:             {WARM_UP_ROWS} rows of each, untimed")
    for i, r in enumerate(results, 1):
        print(f"round {i}{' (bare first)' if r.bare_first else '             '}: fleet-test {r.fleet.wall_s:6.2f} s {rows / r.fleet.wall_s:6.1f} "
              f"models/s, bare parent/child {r.bare.wall_s:6.2f} s {rows / r.bare.wall_s:6.1f} rows/s: ratio {r.ratio():.2f}")
    for side, runs_of_side in (("fleet-test", [r.fleet for r in results]), ("bare", [r.bare for r in results])):
        worker = statistics.median(t.worker_cpu_s for t in runs_of_side) / rows * 1000
        serving = statistics.median(t.server_cpu_s for t in runs_of_side) / rows * 1000
        machine = statistics.median(t.machine_cpu_s for t in runs_of_side) / rows * 1000
        print(f"CPU per row, {side + ':':11s} worker {worker:5.1f} ms, server {serving:5.1f} ms, "
              f"machine {machine:5.1f} ms (medians)")
    ratio = statistics.median(r.ratio() for r in results)
    print(f"ratio fleet / bare:  {ratio:.2f}, the median of {len(results)} rounds "
          f"(target >= {TARGET_RATIO}): {'PASS' if ratio >= TARGET_RATIO else 'FAIL'}")
    return 0 if ratio >= TARGET_RATIO else 1


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rows", type=int, default=1000)
    ap.add_argument("--concurrency", type=int, default=32)
    ap.add_argument("--workdir", help="state and artifacts folder (default: a temp dir)")
    ap.add_argument("--rounds", type=int, default=ROUNDS, help="fleet + bare rounds (the ratio is their median)")
    ap.add_argument("--no-baseline", action="store_true", help="run the fleet only (no bare parent/child run, no ratio)")
    args = ap.parse_args()
    if args.workdir:
        raise SystemExit(asyncio.run(main_async(args.rows, args.concurrency, Path(args.workdir), not args.no_baseline,
                                                args.rounds)))
    with tempfile.TemporaryDirectory() as d:
        raise SystemExit(asyncio.run(main_async(args.rows, args.concurrency, Path(d), not args.no_baseline, args.rounds)))


if __name__ == "__main__":
    main()
