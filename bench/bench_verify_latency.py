"""How long a verified candidate waits for its verdict, with the GPU compile check beside the verification's
children (the verifier's way) against after them (its way until 2026-11-29), interleaved in one run.

    .venv/bin/python -m bench.bench_verify_latency [--rounds 4] [--fresh-reference]

Each round verifies the example tasks' offline candidates once per mode, each with a comment no earlier round
had, so the compile check is never a cache hit (as for a new candidate). "beside" is `verify(compile_for=H100)`;
"after" is `verify` without it, then `gpu_compile.check` on the same sources in a fresh folder: the old order,
the same work. The reference's outputs are cached after the warm-up round, as in an optimizer round
(`--fresh-reference`: a new seed each round, as in a job's first verification). Prints each mode's median
seconds per candidate and the ratio beside / after; PASS when beside is faster. Exit 1 on FAIL.
"""

from __future__ import annotations

import argparse
import itertools
import statistics
import tempfile
import time
from pathlib import Path

from activities.kernels import gpu_compile
from activities.kernels.gpus import GPUS
from activities.kernels.verifier import verify
from bench.bench_sandbox import TASKS, candidates

GPU = GPUS["h100"]
_fresh = itertools.count()


def round_seconds(cases: list[tuple[str, str, str]], mode: str, seed: int) -> float:
    t0 = time.monotonic()
    for name, task, code in cases:
        code += f"\n# {mode} {next(_fresh)}: a new candidate for the compile check\n"
        report = verify(task, code, timeout_s=300, seed=seed, compile_for=GPU if mode == "beside" else None)
        assert report.passed, f"{name} ({mode}): {report.reason}"
        if mode == "after":
            with tempfile.TemporaryDirectory(prefix="ff-bench-compile-") as tmp:
                (Path(tmp) / "task.py").write_text(task)
                (Path(tmp) / "candidate.py").write_text(code)
                check = gpu_compile.check(Path(tmp), GPU, lambda _msg: None)
        else:
            check = report.gpu_compile
        assert check is not None and check.compiles is True, f"{name} ({mode}): {check}"
    return time.monotonic() - t0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("--fresh-reference", action="store_true", help="a new seed (no cached reference) each round")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        cases = candidates(Path(tmp))
    round_seconds(cases, "beside", 0)  # warm-up: the page cache, and the reference outputs for seed 0
    times: dict[str, list[float]] = {"beside": [], "after": []}
    for i in range(args.rounds):
        for mode in ("beside", "after") if i % 2 == 0 else ("after", "beside"):
            times[mode].append(round_seconds(cases, mode, 1 + 2 * i + (mode == "after") if args.fresh_reference else 0))
    per_candidate = {m: statistics.median(t) / len(cases) for m, t in times.items()}
    ratio = per_candidate["beside"] / per_candidate["after"]
    print(f"{len(cases)} candidates x {args.rounds} rounds per mode ({', '.join(TASKS)}), reference "
          f"{'new each round' if args.fresh_reference else 'cached'}")
    for mode, label in (("beside", "compile check beside the children"), ("after", "compile check after them")):
        print(f"  {label:36s} median {per_candidate[mode]:.3f} s per verified candidate "
              f"(rounds: {', '.join(f'{t:.2f}' for t in times[mode])})")
    verdict = "PASS" if ratio < 1 else "FAIL"
    print(f"beside / after: {ratio:.3f} (target < 1) {verdict}")
    return 0 if verdict == "PASS" else 1


if __name__ == "__main__":
    raise SystemExit(main())
