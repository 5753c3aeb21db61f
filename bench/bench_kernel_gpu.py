"""Kernels the offline agents verified on the CPU interpreter, verified again and timed on a GPU (issue 24
item 5): the verifier and the profiler exactly as the kernels activity runs them with `--arch cuda`
(sandboxed children, Triton compiled for the GPU), without a Temporal server.

Input: a folder of `NAME/task.py` + `NAME/candidate.py` pairs, e.g. a `bench_kernelbench --suite public`
workdir's `recheck/` folder (every verified kernel with its shrunk task). With `--sizes gpu` (default)
the candidate runs on the task's own KernelBench file (`examples/kernelbench/levelL/NN_*.py`) shrunk by the
bench's one rule with the largest cap (2048, 1024, ... 8; batch halved like the rest) whose inputs and
outputs each fit `--input-mb` (KernelBench's own sizes take gigabytes per tensor, more than the verifier's
disk budget for its eight trial outputs): sizes the offline run never saw, so this is also a check that the kernel does
not assume the shrunk ones. Only the input sizes grow: the constants only the model's construction reads (kernel
size, groups, out_channels: `settings`) keep the values of the task the job ran, which its held-out sizes left alone
too (a candidate verified for 8 groups failing at 256 is not a false pass).

Phase 1 verifies every pair (`--jobs` at a time); phase 2 times the verified ones one at a time (nothing
else on the GPU): candidate, eager reference and `torch.compile` reference, `triton.testing.do_bench`
medians; the baseline is the faster of the two. Prints a table and the speedup distribution, writes
KernelBench v3 `results.csv` columns (speedup, ref_ms, baseline_type filled).

`--model GPU` runs on a machine without one: the roofline cost model (activities/kernels/cost_model.py, the
kernels activity's own path: the reference traced on the meta device, the candidate counted by the Triton
interpreter) of every pair at the same sizes. `--report-from GPU_ROWS MODEL_ROWS` joins the two runs and says
how well the model predicted the measurement: measured / modeled time per kernel, and whether the modeled
and the measured speedup over eager give the same verdict (slower, on par within 5 %, faster).

    python -m bench.bench_kernel_gpu --pairs DIR --csv results.csv --rows gpu.jsonl --deadline-s 500   # GPU
    python -m bench.bench_kernel_gpu --pairs DIR --model h100 --rows model.jsonl                        # CPU
    python -m bench.bench_kernel_gpu --report-from gpu.jsonl model.jsonl
"""

from __future__ import annotations

import argparse
import contextlib
import csv
import itertools
import json
import math
import re
import statistics
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from activities.kernels.task_source import apply_overrides, input_constants, literal_constants, numeric_constants
from bench.bench_kernelbench import CSV_COLUMNS
from contracts.kernel import Number

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


def settings(task: str) -> dict[str, Number]:
    """The task's literal numeric constants that `get_inputs()` does not read: kernel size, groups, channel and
    feature counts only the model's construction reads. The verifier's held-out sizes leave them alone (they
    change the operation, activities/kernels/held_out.py), so the offline job verified its kernel at these values
    only; a GPU re-check that changes them checks another task, and its failure is no false pass of the job's."""
    inputs = input_constants(task)
    return {k: v for k, v in literal_constants(task).items() if k not in inputs}


def gpu_sized(source: str, input_mb: float, keep: dict[str, Number] | None = None) -> tuple[str, int] | None:
    """The task shrunk with the largest cap that builds and whose inputs and outputs each take at most
    `input_mb` (sized on the meta device: nothing is allocated), with the settings in `keep` (`settings` of the
    task the job ran) set back to the job's values: only the input sizes grow."""
    import torch

    from bench.kernelbench_shrink import shrink

    for cap in (2048, 1024, 512, 256, 128, 64, 32, 16, 8):
        text, _ = shrink(source, cap=cap, batch_to_two=False)
        have = numeric_constants(text)
        text = apply_overrides(text, {k: v for k, v in (keep or {}).items() if k in have and have[k] != v})
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


def levels_in_turn(names: list[str]) -> list[str]:
    """Level 1, Level 2, Level 1, ...: a deadline then cuts every level alike."""
    levels: dict[str, list[str]] = {}
    for name in names:
        levels.setdefault(name.split("_")[0], []).append(name)
    return [n for group in itertools.zip_longest(*levels.values()) for n in group if n]


def modeled(task: str, candidate: str, gpu: str, timeout_s: float) -> dict:
    """The cost model's figures for `candidate` at the sizes it is timed at, or why there are none."""
    from activities.kernels.cost_model import model
    from activities.kernels.reference import trace_reference
    from activities.kernels.verifier import verify
    from contracts.errors import FleetforgeError

    costs: list = []
    try:
        report = verify(task, candidate, timeout_s=timeout_s, gpu=False, costs=costs)
    except FleetforgeError as e:  # this machine cannot run the interpreter verifier (its Triton): not the kernel's
        return {"model_note": f"not modeled: {e.message[:160]}"}
    if not report.passed:
        return {"model_note": f"not modeled: the interpreter run failed ({report.reason[:100]})"}
    result = model(trace_reference(task, timeout_s=timeout_s, held_out=False), costs, gpu)
    if isinstance(result, str):
        return {"model_note": result}
    speed = result.speed
    return {"modeled_ms": speed.modeled_ms, "modeled_eager_ms": speed.eager_ms, "modeled_speedup": speed.speedup,
            "sol_ms": speed.sol_ms, "launches": speed.launches}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--pairs", help="folder of NAME/task.py + NAME/candidate.py")
    ap.add_argument("--sizes", choices=("shrunk", "gpu"), default="gpu")
    ap.add_argument("--input-mb", type=float, default=32.0, help="--sizes gpu: the bound on inputs and on outputs")
    ap.add_argument("--only", help="names containing this (comma-separated alternatives)")
    ap.add_argument("--sample", type=int, default=0, help="every k-th pair, this many in all (0: all)")
    ap.add_argument("--jobs", type=int, default=4, help="verifications (or --model runs) at a time")
    ap.add_argument("--timeout-s", type=float, default=240.0, help="per verification / profile / model run")
    ap.add_argument("--deadline-s", type=float, default=0.0, help="start no new work after this many seconds")
    ap.add_argument("--csv", default="results.csv")
    ap.add_argument("--rows", help="append one JSON line per pair here as it finishes")
    ap.add_argument("--model", metavar="GPU", help="no GPU needed: model every pair on this cost-model GPU (h100, "
                    "a100, l40s, b200) at the sizes a GPU run times it at, one --rows line each")
    ap.add_argument("--report-from", nargs="+", metavar="ROWS",
                    help="print the report from recorded --rows files (a GPU run's, then a --model run's)")
    args = ap.parse_args()
    if args.report_from:
        return report(joined(args.report_from), Path(args.csv))
    if not args.pairs:
        ap.error("--pairs is required (or --report-from)")
    names = selected(args)
    tasks = sized_tasks(args, names)
    if args.model:
        return model_run(args, names, tasks)
    return gpu_run(args, names, tasks)


def selected(args: argparse.Namespace) -> list[str]:
    names = sorted(p.name for p in Path(args.pairs).iterdir() if (p / "candidate.py").exists())
    if args.only:
        names = [n for n in names if any(w in n for w in args.only.split(","))]
    if args.sample:
        names = names[::max(1, math.ceil(len(names) / args.sample))]
    return levels_in_turn(names)


def sized_tasks(args: argparse.Namespace, names: list[str]) -> dict[str, str]:
    tasks: dict[str, str] = {}
    for name in names:
        own = original_task(name) if args.sizes == "gpu" else None
        job_task = (Path(args.pairs) / name / "task.py").read_text()
        sized = gpu_sized(own.read_text(), args.input_mb, keep=settings(job_task)) if own else None
        tasks[name] = sized[0] if sized else job_task
        print(f"  {name:<58} {f'cap {sized[1]}' if sized else 'the shrunk sizes'}")
    return tasks


def candidate_of(args: argparse.Namespace, name: str) -> str:
    return (Path(args.pairs) / name / "candidate.py").read_text()


def record(args: argparse.Namespace, row: dict) -> None:
    if args.rows:
        with open(args.rows, "a", encoding="utf-8") as f:
            f.write(json.dumps(row) + "\n")


def model_run(args: argparse.Namespace, names: list[str], tasks: dict[str, str]) -> int:
    """The cost model's figures for every pair at the GPU run's sizes, on the CPU: the model depends on the
    sizes and the kernel only, and the interpreter's counter on the Triton the project pins (the GPU image's
    older Triton interpreter rejects it), so it runs here and the report joins the two runs' rows."""
    t0 = time.monotonic()

    def one(name: str) -> dict:
        late = args.deadline_s and time.monotonic() - t0 > args.deadline_s
        row = {"name": name, **({"model_note": "not modeled (deadline)"} if late else
                                modeled(tasks[name], candidate_of(args, name), args.model, args.timeout_s))}
        note = row.get("model_note") or f"modeled {row['modeled_ms']:.4f} ms"
        print(f"  model  {name:<58} {note}", flush=True)
        record(args, row)
        return row

    with ThreadPoolExecutor(args.jobs) as pool:
        rows = list(pool.map(one, names))
    return 0 if all(r.get("modeled_ms") for r in rows) else 1


def gpu_run(args: argparse.Namespace, names: list[str], tasks: dict[str, str]) -> int:
    import torch

    from activities.kernels.verifier import profile, verify

    if not torch.cuda.is_available():
        print("no GPU here: this benchmark times kernels on a CUDA device (--model runs without one)", file=sys.stderr)
        return 2
    print(f"GPU: {torch.cuda.get_device_name()}  torch {torch.__version__}")
    t0 = time.monotonic()

    def late() -> bool:
        return bool(args.deadline_s) and time.monotonic() - t0 > args.deadline_s

    def check(name: str) -> dict:
        row = {"name": name, "verified": None, "reason": "", "seconds": 0.0}
        if late():
            row["reason"] = "not run (deadline)"
            return row
        s = time.monotonic()
        report = verify(tasks[name], candidate_of(args, name), timeout_s=args.timeout_s, gpu=True)
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
            timing, note = profile(tasks[row["name"]], candidate_of(args, row["name"]), timeout_s=args.timeout_s)
            row["note"] = note
            if timing is not None:
                row.update(timing.model_dump(), speedup=timing.speedup)
            print(f"  time   {row['name']:<58} {note[:110]}", flush=True)
        record(args, row)
    return report(rows, Path(args.csv))


def joined(files: list[str]) -> list[dict]:
    """Rows of several --rows files, merged by kernel name (later files add fields), in the first file's order."""
    rows: dict[str, dict] = {}
    for file in files:
        for line in Path(file).read_text(encoding="utf-8").splitlines():
            if line.strip():
                row = json.loads(line)
                rows.setdefault(row["name"], {"verified": None, "reason": ""}).update(row)
    return list(rows.values())


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
    model_report(timed)
    for r in failed:
        print(f"  failed on the GPU: {r['name']}: {r['reason']}")
    with csv_path.open("w", newline="") as f:
        w = csv.writer(f)
        w.writerow(CSV_COLUMNS)
        for r in rows:
            level, _, problem = r["name"].partition("_")
            w.writerow([level.removeprefix("level"), problem, r["verified"] is not None, bool(r["verified"]),
                        f"{r['speedup']:.3f}" if r.get("speedup") else "", f"{r['ref_ms']:.4f}" if r.get("ref_ms") else "",
                        "", 0, 0.0, r.get("baseline", ""), "strict", *(_fmt(r.get(k)) for k in (
                            "sol_ms", "modeled_ms", "modeled_speedup")), "", r.get("launches", "")])
    print(f"  results.csv: {csv_path}")
    return 0 if not failed else 1


def _fmt(value: float | None) -> str:
    return f"{value:.4g}" if value else ""


def verdict(speedup: float) -> str:
    """Slower, on par (within 5 %: timing noise and the model's rounding) or faster than eager."""
    return "on par" if abs(speedup - 1) <= 0.05 else "faster" if speedup > 1 else "slower"


def model_report(timed: list[dict]) -> None:
    """How well the cost model predicted the GPU: measured / modeled time of the candidate and of eager, and
    whether the modeled and the measured speedup over eager give the same verdict (`verdict`)."""
    both = [r for r in timed if r.get("modeled_ms")]
    if not both:
        return
    print(f"\n  cost model ({len(both)} of {len(timed)} timed kernels modeled at the same sizes; "
          "measured / modeled, 1.00 = exact):")
    print(f"  {'kernel':<58}{'modeled ms':>11}{'measured':>10}{'ratio':>7}{'eager ratio':>12}"
          f"{'modeled x':>10}{'measured x':>11}")
    for r in both:
        measured_x = r["eager_ms"] / r["candidate_ms"]
        print(f"  {r['name']:<58}{r['modeled_ms']:>11.4f}{r['candidate_ms']:>10.4f}"
              f"{r['candidate_ms'] / r['modeled_ms']:>7.2f}{r['eager_ms'] / r['modeled_eager_ms']:>12.2f}"
              f"{r['modeled_speedup']:>10.2f}{measured_x:>11.2f}")
    cand = sorted(r["candidate_ms"] / r["modeled_ms"] for r in both)
    eager = sorted(r["eager_ms"] / r["modeled_eager_ms"] for r in both)
    agree = sum(verdict(r["modeled_speedup"]) == verdict(r["eager_ms"] / r["candidate_ms"]) for r in both)
    within2 = sum(0.5 <= x <= 2 for x in cand)
    print(f"  candidate measured / modeled: median {statistics.median(cand):.2f}, range {cand[0]:.2f}-{cand[-1]:.2f}, "
          f"within 2x: {within2}/{len(cand)}; eager measured / modeled: median {statistics.median(eager):.2f}; "
          f"same verdict over eager (slower / on par within 5 % / faster), modeled and measured: {agree}/{len(both)}")


if __name__ == "__main__":
    sys.exit(main())
