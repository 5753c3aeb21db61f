"""Harness faults are never a model's No (issue 25), as a benchmark: a docker fleet of good models
while the harness fails under it, then a rerun of the written-back CSV that settles every Error.

Faults, injected once each as the fleet passes 15 %, 35 % and 55 % of its rows:
* the docker daemon unreachable for 3 s (the containers worker's `docker` answers as with a stopped
  daemon: the real CLI pointed at a socket nobody serves; the shared engine itself is never restarted);
* the fleet's image removed for 3 s, then restored (`docker rmi` / `docker tag` of a bench-only tag);
* a port of the fleet's range held by a stranger (a plain socket of this process) for 5 s.

Every model is good, so any `No` is a false No. The first run's Error rows are retested by a second
fleet on the written-back CSV (Yes rows skipped), which must end with every row Yes. Prints the
categories of the first run's Errors, both runs' counts and wall times; exit 0 when there is no No,
every Error was settled by the rerun and every row has its verdict.

    .venv/bin/python -m bench.bench_fleet_faults               # 2,000 rows, concurrency 8
    .venv/bin/python -m bench.bench_fleet_faults --rows 300    # quicker
"""

from __future__ import annotations

import argparse
import asyncio
import csv
import io
import socket
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

from bench.bench_fleet_scaleout import build_image

BENCH_IMAGE = "fleetforge-bench/faults:1"


def manifest(rows: int) -> str:
    buf = io.StringIO()
    w = csv.writer(buf, lineterminator="\n")
    w.writerow(["model_name", "status", "note", "command"])
    for i in range(rows):
        w.writerow([f"org{i % 7}/m-{i}", "", "", f"docker run --network host -e PORT={{port}} -e MODEL_NAME=org{i % 7}/m-{i} "
                                                 f"{BENCH_IMAGE}"])
    return buf.getvalue()


def docker_wrapper(folder: Path, flag: Path) -> Path:
    """The containers worker's `docker`: the real CLI, pointed at a socket nobody serves while `flag` exists."""
    path = folder / "docker"
    path.write_text(f"#!/bin/sh\nif [ -e {flag} ]; then DOCKER_HOST=unix:///nonexistent-dockerd.sock; export DOCKER_HOST; fi\n"
                    "exec docker \"$@\"\n")
    path.chmod(0o755)
    return path


def hold_a_port(first: int, last: int) -> socket.socket | None:
    """A listening socket on a free port of the range (a stranger's server)."""
    for port in range(first, last + 1):
        s = socket.socket()
        try:
            s.bind(("127.0.0.1", port))
            s.listen()
            return s
        except OSError:
            s.close()
    return None


async def inject(fraction_done, flag: Path, port_range: tuple[int, int], log: list[str]) -> None:
    """The three faults, each once, as the fleet passes 15 %, 35 %, 55 %."""
    async def wait_for(f: float) -> None:
        while await fraction_done() < f:
            await asyncio.sleep(0.2)

    await wait_for(0.15)
    flag.touch()
    log.append(f"daemon unreachable at {await fraction_done():.0%}")
    await asyncio.sleep(3)
    flag.unlink()
    await wait_for(0.35)
    subprocess.run(["docker", "rmi", BENCH_IMAGE], capture_output=True, timeout=60)
    log.append(f"image removed at {await fraction_done():.0%}")
    await asyncio.sleep(3)
    subprocess.run(["docker", "tag", build_image(), BENCH_IMAGE], check=True, capture_output=True, timeout=60)
    await wait_for(0.55)
    held = hold_a_port(*port_range)
    log.append(f"port {held.getsockname()[1] if held else '-'} held at {await fraction_done():.0%}")
    await asyncio.sleep(5)
    if held:
        held.close()


async def main_async(rows: int, concurrency: int, workdir: Path) -> int:
    from temporalio.contrib.pydantic import pydantic_data_converter
    from temporalio.testing import WorkflowEnvironment

    from activities.containers.activities import ContainerActivities, collect_verdicts, upload_manifest
    from activities.containers.manifest import apply_verdicts
    from activities.containers.runners import DockerRunner
    from activities.storage import FileStore
    from client.binaries import temporal_binary
    from contracts.fleet import HardwareProfile, RowStatus
    from contracts.fleet_job import FleetTestRequest, FleetTestResult, RunnerKind
    from contracts.settings import Settings
    from tests.helpers import free_port_range, new_worker, outcome_of
    from workflows._visibility import SEARCH_ATTRIBUTES
    from workflows.fleet import FleetTestWorkflow, ModelTestWorkflow

    subprocess.run(["docker", "tag", build_image(), BENCH_IMAGE], check=True, capture_output=True, timeout=60)
    flag = workdir / "daemon-down"
    store = FileStore(workdir / "artifacts")
    runner = DockerRunner(store, docker=str(docker_wrapper(workdir, flag)), poll_s=0.2, marker_dir=workdir / "markers")
    acts = ContainerActivities(store, Settings(state_dir=workdir / "state"), runners={RunnerKind.DOCKER: runner})
    queue = f"faults-{uuid.uuid4().hex[:8]}"
    hw = HardwareProfile(name="cpu", gpu_count=0, gpu_memory_gb=0, port_range=free_port_range(concurrency + 2),
                         model_cache_dir=str(workdir))
    env = await WorkflowEnvironment.start_local(dev_server_existing_path=temporal_binary(), search_attributes=SEARCH_ATTRIBUTES,
                                                data_converter=pydantic_data_converter, dev_server_log_level="error")
    faults: list[str] = []
    try:
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

                chaos_task = asyncio.create_task(inject(fraction_done, flag, hw.port_range, faults)) if chaos else None
                result = await outcome_of(handle, FleetTestResult)  # a fleet with Error rows ends FAILED, carrying it
                if chaos_task:
                    chaos_task.cancel()
                flag.unlink(missing_ok=True)
                return fleet_id, result, time.monotonic() - t0

            text = manifest(rows)
            first_id, first, first_s = await fleet(text, chaos=True)
            verdicts = collect_verdicts(store, first_id)
            after = apply_verdicts(text, verdicts.values())
            error_cats: dict[str, int] = {}
            for v in verdicts.values():
                if v.row_status is RowStatus.ERROR:
                    error_cats[v.category] = error_cats.get(v.category, 0) + 1
            false_no = [(v.row, v.category, v.reason[:80]) for v in verdicts.values() if v.row_status is RowStatus.NO]
            second_id, second, second_s = await fleet(after, chaos=False)
            final = apply_verdicts(after, collect_verdicts(store, second_id).values()) if second.total - second.skipped else after
    finally:
        await env.shutdown()
        subprocess.run(["docker", "rmi", BENCH_IMAGE], capture_output=True, timeout=60)
    statuses = [r["status"] for r in csv.DictReader(io.StringIO(final))]
    left = subprocess.run(f"docker ps -aq --filter label=fleetforge.run={first_id} --filter label=fleetforge.run={second_id}",
                          shell=True, capture_output=True, text=True).stdout.split()
    print(f"rows {rows}, concurrency {concurrency}, docker runner; faults: {'; '.join(faults)}")
    print(f"first run:   {first.passed} Yes, {first.failed} No, {first.errors} Error  ({first_s:.0f} s)")
    print(f"  Errors by category: {error_cats}")
    print(f"  No rows (each a false No): {false_no[:10]}")
    print(f"rerun of the CSV: {second.total - second.skipped} rows retested: {second.passed} Yes, {second.failed} No, "
          f"{second.errors} Error  ({second_s:.0f} s)")
    print(f"final CSV:   {statuses.count('Yes')}/{rows} Yes, {len(statuses)} rows; containers left: {len(left)}")
    ok = not false_no and second.failed == 0 and second.errors == 0 and statuses.count("Yes") == rows and not left
    print("PASS" if ok else "FAIL")
    return 0 if ok else 1


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rows", type=int, default=2000)
    parser.add_argument("--concurrency", type=int, default=8)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="bench-faults-") as tmp:
        return asyncio.run(main_async(args.rows, args.concurrency, Path(tmp)))


if __name__ == "__main__":
    sys.exit(main())
