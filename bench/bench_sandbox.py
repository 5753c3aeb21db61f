"""Sandbox cost per verified candidate: the same honest candidates verified with every child in bubblewrap
and with the sandbox off (FLEETFORGE_SANDBOX=off), interleaved in one run, so machine noise hits both alike.

    .venv/bin/python -m bench.bench_sandbox [--rounds 6]

Each round verifies the example tasks' offline candidates once per mode (the reference outputs are cached
after the first round, as in a worker, so a round times the candidate children: static check, the child's
start, torch/triton import, the trials, the comparison). Prints per-mode medians of the round times and
the ratio sandboxed / unsandboxed, then PASS/FAIL against the target ratio <= 1.1. Exit 1 on FAIL.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path

from activities import sandbox
from activities.kernels import offline_coder
from activities.kernels.verifier import verify
from contracts.kernel import KernelTask
from tests.unit.test_conductor_offline_designer import analyse

TARGET_RATIO = 1.1
TASKS = ["relu", "softmax", "matmul"]
EXAMPLES = Path(__file__).resolve().parents[1] / "examples" / "kernels"


def candidates(workdir: Path) -> list[tuple[str, str, str]]:
    out = []
    for name in TASKS:
        source = (EXAMPLES / f"{name}.py").read_text()
        task = KernelTask(op_name=name, task_desc=source, task_id=name, arch="cpu")
        code = offline_coder.code(task, None, analyse(source, workdir))
        assert code is not None, name
        out.append((name, source, code))
    return out


def round_seconds(cases: list[tuple[str, str, str]], mode: str) -> float:
    sandbox.configure(mode)
    t0 = time.monotonic()
    for name, task, code in cases:
        report = verify(task, code, timeout_s=300)
        assert report.passed, f"{name} ({mode}): {report.reason}"
    return time.monotonic() - t0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=6)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        cases = candidates(Path(tmp))
    round_seconds(cases, "bwrap")  # warm-up: reference outputs cached, page cache warm
    times: dict[str, list[float]] = {"bwrap": [], "off": []}
    for i in range(args.rounds):
        order = ("bwrap", "off") if i % 2 == 0 else ("off", "bwrap")
        for mode in order:
            times[mode].append(round_seconds(cases, mode))
    sandbox.configure("bwrap")
    per_candidate = {m: statistics.median(t) / len(cases) for m, t in times.items()}
    ratio = per_candidate["bwrap"] / per_candidate["off"]
    print(f"{len(cases)} candidates x {args.rounds} rounds per mode ({', '.join(TASKS)})")
    for mode, label in (("bwrap", "sandboxed (bubblewrap)"), ("off", "unsandboxed (FLEETFORGE_SANDBOX=off)")):
        print(f"  {label:40s} median {per_candidate[mode]:.3f} s per verified candidate "
              f"(rounds: {', '.join(f'{t:.2f}' for t in times[mode])})")
    verdict = "PASS" if ratio <= TARGET_RATIO else "FAIL"
    print(f"sandbox cost ratio: {ratio:.3f} (target <= {TARGET_RATIO}) {verdict}")
    return 0 if verdict == "PASS" else 1


if __name__ == "__main__":
    raise SystemExit(main())
