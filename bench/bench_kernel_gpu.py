"""Kernels the offline agents verified on the CPU interpreter, verified again and timed on a GPU (issue 24
item 5): the verifier and the profiler exactly as the kernels activity runs them with `--arch cuda`
(sandboxed children, Triton compiled for the GPU), without a Temporal server.

Input: a folder of `NAME/task.py` + `NAME/candidate.py` pairs, e.g. a `bench_kernelbench --suite public`
workdir's `recheck/` folder (every verified kernel with its shrunk task). With `--sizes gpu` (default)
the candidate runs on the task's own KernelBench file (`examples/kernelbench/levelL/NN_*.py`) shrunk by the
bench's one rule with the largest cap (2048, 1024, ... 8; batch halved like the rest) whose inputs and
outputs each fit `--input-mb` (KernelBench's own sizes take gigabytes per tensor, more than the verifier's
disk budget for its eight trial outputs): sizes the offline run never saw, so this is also a check that the kernel does
not assume the shrunk ones.

Phase 1 verifies every pair (`--jobs` at a time); phase 2 times the verified ones one at a time (nothing
else on the GPU): candidate, eager reference and `torch.compile` reference, `triton.testing.do_bench`
medians; the baseline is the faster of the two. Prints a table and the speedup distribution, writes
KernelBench v3 `results.csv` columns (speedup, ref_ms, baseline_type filled).

    python -m bench.bench_kernel_gpu --pairs DIR --csv results.csv --deadline-s 500
"""

from __future__ import annotations

import argparse
import contextlib
import csv
import json
import math
import re
import statistics
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from bench.bench_kernelbench import CSV_COLUMNS

ROOT = Path(__file__).resolve().parents[1]
KERNELBENCH = ROOT / "examples" / "kernelbench"


def original_task(name: str) -> Path | None:
    """`level1_19_ReLU` (a recheck folder name) -> examples/kernelbench/level1/19_ReLU.py."""
    m = re.match(r"level(\d)_(.+)$", name)
    path = KERNELBENCH / f"level{m.group(1)}" / f"{m.group(2)}.py" if m else None
    return path if path is not None and path.exists() else None


def nbytes(values: object) -> int:
    import torch

    items = values if isinstance(values, (list, tuple)) else [values]
    return sum(x.numel() * x.element_size() for x in items if isinstance(x, torch.Tensor))


def gpu_sized(source: str, input_mb: float) -> tuple[str, int] | None:
    """The task shrunk with the largest cap that builds and whose inputs and outputs each take at most
    `input_mb` (sized on the meta device: nothing is allocated)."""
    import torch

    from bench.kernelbench_shrink import shrink

    for cap in (2048, 1024, 512, 256, 128, 64, 32, 16, 8):
        text, _ = shrink(source, cap=cap, batch_to_two=False)
        scope: dict = {}
        try:
            exec(compile(text, "task.py", "exec"), scope)  # noqa: S102 - KernelBench's public task files, shipped here
            with torch.device("meta"):  # sizes only: nothing allocated
                inputs = scope["get_inputs"]()
                model = scope["Model"](*scope["get_init_inputs"]())
                size = nbytes(inputs)
                with contextlib.suppress(Exception):  # an op without a meta kernel: the inputs' size alone
                    size = max(size, nbytes(model(*inputs)))
        except Exception:  # noqa: BLE001 - does not build at this cap (groups, kernel wider than input): next
            continue
        if size <= input_mb * 2**20:
            return text, cap
    return None


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--pairs", required=True, help="folder of NAME/task.py + NAME/candidate.py")
    ap.add_argument("--sizes", choices=("shrunk", "gpu"), default="gpu")
    ap.add_argument("--input-mb", type=float, default=32.0, help="--sizes gpu: the bound on inputs and on outputs")
    ap.add_argument("--only", help="names containing this (comma-separated alternatives)")
    ap.add_argument("--sample", type=int, default=0, help="every k-th pair, this many in all (0: all)")
    ap.add_argument("--jobs", type=int, default=4, help="verifications at a time (phase 1)")
    ap.add_argument("--timeout-s", type=float, default=240.0, help="per verification / profile")
    ap.add_argument("--deadline-s", type=float, default=0.0, help="start no new work after this many seconds")
    ap.add_argument("--csv", default="results.csv")
    ap.add_argument("--rows", help="append one JSON line per pair here as it finishes")
    args = ap.parse_args()

    import torch

    from activities.kernels.verifier import profile, verify

    if not torch.cuda.is_available():
        print("no GPU here: this benchmark times kernels on a CUDA device", file=sys.stderr)
        return 2
    print(f"GPU: {torch.cuda.get_device_name()}  torch {torch.__version__}")
    names = sorted(p.name for p in Path(args.pairs).iterdir() if (p / "candidate.py").exists())
    if args.only:
        names = [n for n in names if any(w in n for w in args.only.split(","))]
    if args.sample:
        names = names[::max(1, math.ceil(len(names) / args.sample))]
    t0 = time.monotonic()

    def late() -> bool:
        return bool(args.deadline_s) and time.monotonic() - t0 > args.deadline_s

    tasks: dict[str, str] = {}
    for name in names:
        own = original_task(name) if args.sizes == "gpu" else None
        sized = gpu_sized(own.read_text(), args.input_mb) if own else None
        tasks[name] = sized[0] if sized else (Path(args.pairs) / name / "task.py").read_text()
        print(f"  {name:<58} {f'cap {sized[1]}' if sized else 'the shrunk sizes'}")

    def candidate_of(name: str) -> str:
        return (Path(args.pairs) / name / "candidate.py").read_text()

    def check(name: str) -> dict:
        row = {"name": name, "verified": None, "reason": "", "seconds": 0.0}
        if late():
            row["reason"] = "not run (deadline)"
            return row
        s = time.monotonic()
        report = verify(tasks[name], candidate_of(name), timeout_s=args.timeout_s, gpu=True)
        row.update(verified=report.passed, reason=report.reason[:200], seconds=round(time.monotonic() - s, 1))
        print(f"  verify {name:<58} {'ok' if report.passed else 'FAILED ' + report.reason[:90]}  {row['seconds']} s",
              flush=True)
        return row

    print(f"phase 1: verify {len(names)} kernels on the GPU ({args.sizes} sizes), {args.jobs} at a time")
    with ThreadPoolExecutor(args.jobs) as pool:
        rows = list(pool.map(check, names))
    print("phase 2: time the verified ones, one at a time")
    for row in rows:
        if row["verified"] and not late():
            timing, note = profile(tasks[row["name"]], candidate_of(row["name"]), timeout_s=args.timeout_s)
            row["note"] = note
            if timing is not None:
                row.update(timing.model_dump(), speedup=timing.speedup)
            print(f"  time   {row['name']:<58} {note[:110]}", flush=True)
        if args.rows:
            with open(args.rows, "a", encoding="utf-8") as f:
                f.write(json.dumps(row) + "\n")
    return report(rows, Path(args.csv))


def report(rows: list[dict], csv_path: Path) -> int:
    timed = [r for r in rows if r.get("speedup")]
    verified = [r for r in rows if r["verified"]]
    failed = [r for r in rows if r["verified"] is False]
    print(f"\n{len(rows)} kernels: {len(verified)} verified on the GPU, {len(failed)} failed, "
          f"{len(rows) - len(verified) - len(failed)} not run; {len(timed)} timed\n")
    print(f"  {'kernel':<58}{'cand ms':>10}{'eager ms':>10}{'compile ms':>11}  {'baseline':<14}{'speedup':>8}")
    for r in timed:
        compiled = f"{r['compile_ms']:.4f}" if r.get("compile_ms") is not None else "failed"
        print(f"  {r['name']:<58}{r['candidate_ms']:>10.4f}{r['eager_ms']:>10.4f}{compiled:>11}  {r['baseline']:<14}"
              f"{r['speedup']:>8.2f}")
    if timed:
        s = sorted(r["speedup"] for r in timed)
        print(f"\n  speedup over the faster baseline: median {statistics.median(s):.2f}x, geomean "
              f"{statistics.geometric_mean(s):.2f}x, >= 1.0x: {sum(x >= 1 for x in s)}/{len(s)}, "
              f"baseline torch.compile: {sum(r['baseline'] == 'torch.compile' for r in timed)}/{len(timed)}")
    for r in failed:
        print(f"  failed on the GPU: {r['name']}: {r['reason']}")
    with csv_path.open("w", newline="") as f:
        w = csv.writer(f)
        w.writerow(CSV_COLUMNS)
        for r in rows:
            level, _, problem = r["name"].partition("_")
            w.writerow([level.removeprefix("level"), problem, r["verified"] is not None, bool(r["verified"]),
                        f"{r['speedup']:.3f}" if r.get("speedup") else "", f"{r['ref_ms']:.4f}" if r.get("ref_ms") else "",
                        "", 0, 0.0, r.get("baseline", ""), "strict", "", "", "", "", ""])
    print(f"  results.csv: {csv_path}")
    return 0 if not failed else 1


if __name__ == "__main__":
    sys.exit(main())
