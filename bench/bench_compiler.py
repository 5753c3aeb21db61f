"""The offline compiler alone on KernelBench files: per file, what stops it (no Temporal, no agents' ladder).

    .venv/bin/python -m bench.bench_compiler --dir /path/to/KernelBench/level3 [--only MLP] [--timeout-s 600]
    .venv/bin/python -m bench.bench_compiler --level 1 --only Conv      # the public files in examples/kernelbench

Each file is shrunk by the one rule (bench/kernelbench_shrink.py, the first setting at which it builds), traced by
the job's own probe child (`trace_reference`: the trace and the held-out sizes), lowered and rendered by the offline
designer and coder, and verified by the job's verifier (children, held-out sizes, provenance) exactly as a job's
first offline candidate is. Prints one row per file: VERIFIED, or the stage that stopped it (trace, lowering,
verifier) with its reason, and the seconds each stage took; `--jsonl FILE` appends the rows. It drives the
compiler's work per file; the conductor's figures come from bench_kernelbench.
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path

from bench.kernelbench_shrink import ladder, shrink

ROOT = Path(__file__).resolve().parents[1]


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


def shrunk(path: Path) -> tuple[str, dict]:
    """The file at the first ladder setting at which it builds and traces (checked in-process on meta tensors)."""
    from activities.kernels._probe import probe

    original = path.read_text()
    source, made = original, {}
    with tempfile.TemporaryDirectory() as tmp:
        for cap, batch_to_two in ladder():
            source, made = shrink(original, cap, batch_to_two)
            (Path(tmp) / "task.py").write_text(source)
            try:
                if not probe(str(Path(tmp) / "task.py"), 0, symbolic=False).get("trace_error"):
                    break
            except Exception:  # noqa: BLE001 - the task does not build at these sizes: the next setting
                continue
    return source, made


def one(path: Path, timeout_s: float) -> Row:
    from activities.kernels import offline_coder, offline_designer
    from activities.kernels.reference import trace_reference
    from activities.kernels.verifier import verify
    from contracts.errors import FleetforgeError

    source, made = shrunk(path)
    row = Row(name=path.stem, stage="trace", overrides=" ".join(f"{k}={v}" for k, v in made.items()))
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
    ap.add_argument("--dir", help="a folder of KernelBench-format files (e.g. a KernelBench checkout's level3)")
    ap.add_argument("--level", type=int, help="the public Level 1 or 2 files of examples/kernelbench")
    ap.add_argument("--only", help="the files whose name contains this (comma-separated: any of them)")
    ap.add_argument("--timeout-s", type=float, default=600.0, help="trace and verifier limit per file (default 600)")
    ap.add_argument("--jsonl", help="append each row to this file")
    args = ap.parse_args()
    folder = Path(args.dir) if args.dir else ROOT / "examples" / "kernelbench" / f"level{args.level}"
    files = sorted(folder.glob("*.py"), key=lambda p: (int(p.name.split("_")[0]) if p.name[0].isdigit() else 0, p.name))
    if args.only:
        keys = [k.lower() for k in args.only.split(",")]
        files = [p for p in files if any(k in p.stem.lower() for k in keys)]
    rows = []
    for path in files:
        row = one(path, args.timeout_s)
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
