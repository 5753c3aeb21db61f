"""Load benchmark: 20 kernel jobs and 2 conversions submitted at once to one worker process held to
2 cores (tests/reliability/load_scenario.py). How long the last job waited, and what the waiting was.

    .venv/bin/python -m bench.bench_load [--cpus 2] [--also-unthrottled] [--workdir DIR]

Starts the embedded Temporal dev server (the `temporal` binary, 127.0.0.1, random port) and a real
`python worker.py --queues all` (offline agents, file store), pinned to `--cpus` cores. Prints, per
job, its verdict and when it ended (seconds after every job was submitted) and the longest time one
of its activities waited for a worker slot; then the last job's end. PASS when no job ended INTERNAL,
no activity needed a second attempt and every job got the verdict it gets alone.

`--also-unthrottled` runs the same jobs a second time with FLEETFORGE_CPU_SLOTS=32 (every activity
admitted at once, as before the CPU slots), in the same run, and prints both side by side.
Exit code 0 on PASS (of the throttled run), 1 on FAIL.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import tempfile
from pathlib import Path

from bench._dev_server import dev_server


def summary(label: str, run) -> tuple[bool, str]:  # noqa: ANN001 - LoadRun
    internal = [j.job_id for j in run.jobs if j.failure_code == "INTERNAL"]
    retried = [f"{j.job_id}: {', '.join(j.retried)}" for j in run.jobs if j.retried]
    wrong = [f"{j.job_id}: {j.verdict} (alone: {j.expected}) {j.failure_code} {j.failure_message}"
             for j in run.jobs if j.verdict != j.expected]
    ends = [j.ended_s for j in run.jobs]
    waits = [j.slot_wait_s for j in run.jobs]
    ok = not internal and not retried and not wrong
    lines = [f"{label}: {len(run.jobs)} jobs on {run.cpus} cores (submitted in {run.submit_s:.1f} s)",
             f"  last job ended {run.last_end_s:.1f} s after submission (median job {statistics.median(ends):.1f} s)",
             f"  longest wait for a worker slot: {max(waits):.1f} s (median {statistics.median(waits):.1f} s)",
             f"  INTERNAL: {len(internal)}  retried activities: {len(retried)}  verdicts unlike alone: {len(wrong)}"]
    lines += [f"    retried {r}" for r in retried] + [f"    wrong {w}" for w in wrong] + [f"    INTERNAL {i}" for i in internal]
    return ok, "\n".join(lines)


async def main_async(workdir: Path, cpus: int, also_unthrottled: bool) -> int:
    from tests.reliability.load_scenario import run_load

    async with dev_server() as env:
        run = await run_load(env.client, workdir / "throttled", cpus=cpus)
        loose = await run_load(env.client, workdir / "unthrottled", cpus=cpus, cpu_slots=32) if also_unthrottled else None

    print(f"{'job':<44} {'verdict':<20} {'ended s':>8} {'slot wait s':>12}")
    for j in sorted(run.jobs, key=lambda j: j.ended_s):
        print(f"{j.job_id[:44]:<44} {j.verdict[:20]:<20} {j.ended_s:8.1f} {j.slot_wait_s:12.1f}")
    ok, text = summary(f"one activity per core on the CPU queues ({run.cpus} slots)", run)
    print(text)
    if loose is not None:
        print(summary("every activity admitted at once (FLEETFORGE_CPU_SLOTS=32)", loose)[1])
        print(f"last job's end, throttled / unthrottled: {run.last_end_s / loose.last_end_s:.2f}")
    print(f"load: {'PASS' if ok else 'FAIL'}")
    return 0 if ok else 1


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--cpus", type=int, default=2, help="cores the worker process is held to (default 2)")
    ap.add_argument("--also-unthrottled", action="store_true", help="run the jobs again with FLEETFORGE_CPU_SLOTS=32")
    ap.add_argument("--workdir", help="state and artifacts folder (default: a temp dir)")
    args = ap.parse_args()
    if args.workdir:
        raise SystemExit(asyncio.run(main_async(Path(args.workdir), args.cpus, args.also_unthrottled)))
    with tempfile.TemporaryDirectory() as d:
        raise SystemExit(asyncio.run(main_async(Path(d), args.cpus, args.also_unthrottled)))


if __name__ == "__main__":
    main()
