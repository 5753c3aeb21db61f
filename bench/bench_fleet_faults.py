"""Harness faults are never a model's No (issue 25), as a benchmark: a docker fleet of good models
while the harness fails under it, then a rerun of the written-back CSV that settles every Error.

The fleet runs on a docker daemon of the bench's own (tests/private_dockerd.py: its own socket and roots;
the shared engine is never touched). Faults, injected once each as the fleet passes 15 %, 35 % and 55 % of
its rows:
* that daemon restarted for real (SIGTERM as a service manager sends it: it stops every running container,
  SIGKILL after its 10 s shutdown timeout, then starts again);
* the fleet's image removed for 3 s, then restored (`docker rmi` / `docker tag` of a bench-only tag);
* a port of the fleet's range held by a stranger (a plain socket of this process) for 5 s.

Every model is good (it "loads" for 1-3 s, so a fault finds rows in every phase), so any `No` is a false
No. The first run's Error rows are retested by a second fleet on the written-back CSV (Yes rows skipped),
which must end with every row Yes. Prints the
categories of the first run's Errors, both runs' counts and wall times; exit 0 when there is no No,
every Error was settled by the rerun and every row has its verdict.

    .venv/bin/python -m bench.bench_fleet_faults               # 2,000 rows, concurrency 8
    .venv/bin/python -m bench.bench_fleet_faults --rows 300    # quicker
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import csv
import io
import socket
import sys
import tempfile
import time
import uuid
from pathlib import Path

from tests.conftest import MODEL_SERVER_IMAGE, import_model_server_image
from tests.private_dockerd import PrivateDockerd

from bench._dev_server import dev_server

BENCH_IMAGE = "fleetforge-bench/faults:1"


def manifest(rows: int) -> str:
    buf = io.StringIO()
    w = csv.writer(buf, lineterminator="\n")
    w.writerow(["model_name", "status", "note", "command"])
    for i in range(rows):
        w.writerow([f"org{i % 7}/m-{i}", "", "", f"docker run --network host -e PORT={{port}} -e DELAY={1 + i % 3} "
                                                 f"-e MODEL_NAME=org{i % 7}/m-{i} {BENCH_IMAGE}"])
    return buf.getvalue()


def hold_a_port(ports: range, patience_s: float = 10.0) -> socket.socket | None:
    """A listening socket on one of `ports` (a stranger's server), taken in the moment between two rows
    when a slot's container has let it go: the allocator hands out the lowest free ports, so a spare port
    at the top of the range would never be asked for."""
    deadline = time.monotonic() + patience_s
    while time.monotonic() < deadline:
        for port in ports:
            s = socket.socket()
            s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as servers do: the last row's TIME_WAITs
            try:
                s.bind(("127.0.0.1", port))
                s.listen()
                return s
            except OSError:
                s.close()
        time.sleep(0.005)
    return None


async def inject(fraction_done, daemon: PrivateDockerd, port_range: tuple[int, int], slots: int, log: list[str]) -> None:
    """The three faults, each once, as the fleet passes 15 %, 35 %, 55 %."""
    async def wait_for(f: float) -> None:
        while await fraction_done() < f:
            await asyncio.sleep(0.2)

    await wait_for(0.15)
    at, running = await fraction_done(), len(daemon.docker("ps", "-q").stdout.split())
    t0 = time.monotonic()
    await asyncio.to_thread(daemon.restart)
    log.append(f"daemon restarted at {at:.0%} ({running} containers running, {time.monotonic() - t0:.0f} s away)")
    await wait_for(0.35)
    daemon.docker("rmi", BENCH_IMAGE, check=False)
    log.append(f"image removed at {await fraction_done():.0%}")
    try:
        await asyncio.sleep(3)
    finally:  # also when the fleet ends first: the rerun needs the image
        daemon.docker("tag", MODEL_SERVER_IMAGE, BENCH_IMAGE)
    await wait_for(0.55)
    held = await asyncio.to_thread(hold_a_port, range(port_range[0], port_range[0] + slots))
    log.append(f"port {held.getsockname()[1] if held else '-'} held at {await fraction_done():.0%}")
    try:
        await asyncio.sleep(5)
    finally:
        if held:
            held.close()


def errors_by_category(verdicts) -> dict[str, int]:
    from contracts.fleet import RowStatus

    return dict(collections.Counter(v.category for v in verdicts if v.row_status is RowStatus.ERROR))


async def main_async(rows: int, concurrency: int, workdir: Path, daemon: PrivateDockerd) -> int:
    from activities.containers.activities import ContainerActivities, collect_verdicts, upload_manifest
    from activities.containers.manifest import apply_verdicts
    from activities.containers.runners import DockerRunner
    from activities.storage import FileStore
    from contracts.fleet import HardwareProfile, RowStatus
    from contracts.fleet_job import FleetTestRequest, FleetTestResult, RunnerKind
    from contracts.settings import Settings
    from tests.helpers import free_port_range, new_worker, outcome_of
    from workflows.fleet import FleetTestWorkflow, ModelTestWorkflow

    (workdir / "rootfs").mkdir()
    import_model_server_image(workdir / "rootfs", ("docker", "-H", daemon.host))
    daemon.docker("tag", MODEL_SERVER_IMAGE, BENCH_IMAGE)
    store = FileStore(workdir / "artifacts")
    runner = DockerRunner(store, docker=str(daemon.cli(workdir)), poll_s=0.2, marker_dir=workdir / "markers")
    acts = ContainerActivities(store, Settings(state_dir=workdir / "state"), runners={RunnerKind.DOCKER: runner})
    queue = f"faults-{uuid.uuid4().hex[:8]}"
    hw = HardwareProfile(name="cpu", gpu_count=0, gpu_memory_gb=0, port_range=free_port_range(concurrency + 2),
                         model_cache_dir=str(workdir))
    faults: list[str] = []
    async with dev_server() as env:
        async with new_worker(env.client, workflows=[FleetTestWorkflow, ModelTestWorkflow], activities=acts.all(),
                              task_queue=queue, max_concurrent_activities=32):
            from contracts.common import TaskQueues

            queues = TaskQueues(workflows=queue, llm=queue, toolchain=queue, kernels=queue, containers=queue)

            async def fleet(csv_text: str, *, chaos: bool) -> tuple[str, object, float]:
                fleet_id = f"faults-{uuid.uuid4().hex[:8]}"
                t0 = time.monotonic()
                handle = await env.client.start_workflow(
                    FleetTestWorkflow.run, FleetTestRequest(
                        manifest=upload_manifest(store, csv_text), runner=RunnerKind.DOCKER, concurrency=concurrency,
                        max_attempts=2, test_timeout_s=60, hardware=hw, queues=queues, fleet_id=fleet_id),
                    id=f"fleet-test/{fleet_id}", task_queue=queue)

                async def fraction_done() -> float:
                    p = await handle.query(FleetTestWorkflow.progress)
                    return p.done / max(1, p.total - p.skipped)

                chaos_task = asyncio.create_task(inject(fraction_done, daemon, hw.port_range, concurrency, faults)) if chaos else None
                result = await outcome_of(handle, FleetTestResult)  # a fleet with Error rows ends FAILED, carrying it
                if chaos_task:
                    chaos_task.cancel()
                return fleet_id, result, time.monotonic() - t0

            text = manifest(rows)
            first_id, first, first_s = await fleet(text, chaos=True)
            verdicts = collect_verdicts(store, first_id)
            after = apply_verdicts(text, verdicts.values())
            error_cats = errors_by_category(verdicts.values())
            false_no = [(v.row, v.category, v.reason[:80]) for v in verdicts.values() if v.row_status is RowStatus.NO]
            second_id, second, second_s = await fleet(after, chaos=False)
            second_verdicts = collect_verdicts(store, second_id).values() if second.total - second.skipped else []
            final = apply_verdicts(after, second_verdicts)
    statuses = [r["status"] for r in csv.DictReader(io.StringIO(final))]
    left = [cid for fleet_id in (first_id, second_id)
            for cid in daemon.docker("ps", "-aq", "--filter", f"label=fleetforge.run={fleet_id}").stdout.split()]
    print(f"rows {rows}, concurrency {concurrency}, docker runner; faults: {'; '.join(faults)}")
    print(f"first run:   {first.passed} Yes, {first.failed} No, {first.errors} Error  ({first_s:.0f} s)")
    print(f"  Errors by category: {error_cats}")
    print(f"  No rows (each a false No): {false_no[:10]}")
    print(f"rerun of the CSV: {second.total - second.skipped} rows retested: {second.passed} Yes, {second.failed} No, "
          f"{second.errors} Error  ({second_s:.0f} s)")
    if second.errors:
        print(f"  Errors by category: {errors_by_category(second_verdicts)}; first: "
              f"{next(v.reason for v in second_verdicts if v.row_status is RowStatus.ERROR)[:200]}")
    print(f"final CSV:   {statuses.count('Yes')}/{rows} Yes, {len(statuses)} rows; containers left: {len(left)}")
    ok = not false_no and second.failed == 0 and second.errors == 0 and statuses.count("Yes") == rows and not left
    print("PASS" if ok else "FAIL")
    return 0 if ok else 1


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rows", type=int, default=2000)
    parser.add_argument("--concurrency", type=int, default=8)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="bench-faults-") as tmp, PrivateDockerd(shutdown_timeout_s=10) as daemon:
        return asyncio.run(main_async(args.rows, args.concurrency, Path(tmp), daemon))


if __name__ == "__main__":
    sys.exit(main())
