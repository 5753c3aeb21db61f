"""The offline compiler alone on KernelBench files: per file, what stops it (no Temporal, no agents' ladder).

    .venv/bin/python -m bench.bench_compiler --level 3 --kernelbench KernelBench [--only MLP,LSTM] [--timeout-s 600]
    .venv/bin/python -m bench.bench_compiler --level 1 --only Conv      # the public files in examples/kernelbench

Each file is shrunk as bench_kernelbench shrinks it (`public_jobs`: bench/kernelbench_shrink.py's rules), traced by
the job's own probe child (`trace_reference`: the trace and the held-out sizes), lowered and rendered by the offline
designer and coder, and verified by the job's verifier (children, held-out sizes, provenance) exactly as a job's
first offline candidate is (with `--timeout-s` as the candidate's limit). Prints one row per file: VERIFIED, or the stage that stopped it (trace, lowering,
verifier) with its reason, and the seconds each stage took; `--jsonl FILE` appends the rows. It drives the
compiler's work per file; the conductor's figures come from bench_kernelbench.
"""

from __future__ import annotations

import argparse
import json
import time
from dataclasses import asdict, dataclass
from pathlib import Path




@dataclass
class Row:
    name: str
    stage: str
    """verified | trace | lowering | render | verifier"""
    reason: str = ""
    label: str = ""
    overrides: str = ""
    held_out: str = ""
    trace_s: float = 0.0
    verify_s: float = 0.0


def one(name: str, source: str, made: dict, timeout_s: float) -> Row:
    from activities.kernels import offline_coder, offline_designer
    from activities.kernels.reference import trace_reference
    from activities.kernels.verifier import verify
    from contracts.errors import FleetforgeError

    row = Row(name=name, stage="trace", overrides=" ".join(f"{k}={v}" for k, v in made.items()))
    t0 = time.monotonic()
    try:
        analysis = trace_reference(source, timeout_s=timeout_s)
    except FleetforgeError as e:
        row.reason = e.message[:300]
        return row
    row.trace_s = round(time.monotonic() - t0, 1)
    row.held_out = " ".join(f"{k}={v}" for k, v in analysis.held_out.items()) or analysis.held_out_note[:120]
    plan = offline_designer.choose_plan(analysis)
    if isinstance(plan, str):
        row.stage, row.reason = "lowering", plan[:300]
        return row
    row.label = plan.label[:120]
    candidate = offline_coder.render(plan, source, analysis)
    if candidate.startswith("no offline"):
        row.stage, row.reason = "render", candidate[:300]
        return row
    t1 = time.monotonic()
    report = verify(source, candidate, timeout_s=timeout_s, held_out=analysis.held_out,
                    held_out_note=analysis.held_out_note, reference_ops=analysis.aten_ops)
    row.verify_s = round(time.monotonic() - t1, 1)
    row.stage = "verified" if report.passed else "verifier"
    row.reason = (report.shapes_note if report.passed else report.reason)[:300]
    return row


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--level", type=int, required=True, help="1 or 2 (examples/kernelbench), or 3 (--kernelbench)")
    ap.add_argument("--kernelbench", default="KernelBench", help="a KernelBench checkout, for Level 3")
    ap.add_argument("--only", help="the files whose name contains this (comma-separated: any of them)")
    ap.add_argument("--timeout-s", type=float, default=600.0, help="trace and verifier limit per file (default 600)")
    ap.add_argument("--jsonl", help="append each row to this file")
    args = ap.parse_args()
    from bench.bench_kernelbench import level_dirs, public_jobs

    rows = []
    for job in public_jobs(level_dirs(Path(args.kernelbench), [args.level]), args.only):
        row = one(job.name.split("/")[-1], job.source, job.overrides, args.timeout_s)
        rows.append(row)
        print(f"{row.name:<40} {row.stage:<9} trace {row.trace_s:5.1f}s verify {row.verify_s:6.1f}s  {row.label[:60]}"
              f"{'  | ' + row.reason if row.reason else ''}", flush=True)
        if args.jsonl:
            with open(args.jsonl, "a") as f:
                f.write(json.dumps(asdict(row)) + "\n")
    done = sum(r.stage == "verified" for r in rows)
    print(f"\n{done}/{len(rows)} VERIFIED; stopped at: " + ", ".join(
        f"{s} {sum(r.stage == s for r in rows)}" for s in ("trace", "lowering", "render", "verifier")))


if __name__ == "__main__":
    main()
