"""Do candidates' kernels compile for a GPU? Answered without one.

    python -m bench.gpu_compile DIR... [--gpu h100]               # DIR: task.py + candidate.py (recheck/NAME)
    python -m bench.gpu_compile --offline TASKS_DIR... [--gpu h100]  # the offline compiler's own, per task file

Each candidate is checked as the verifier checks a passing one on the CPU interpreter
(activities/kernels/gpu_compile.py: the forward on the meta device with its launches recorded, each kernel compiled
for the GPU by Triton's own ptxas, its shared memory compared with the GPU's), in the kernels activity's sandboxed
child. `--offline` writes, for every task file in the folders (examples/kernelbench/level1 ...), the offline coder's
candidate and the offline optimizer's first one (every applicable rewrite at once), and checks both: the share of
the offline compiler's kernels that would build on the GPU, without verifying them (the bench_kernelbench run does
that). Prints one line per candidate and a count; exit code 1 when any candidate's kernels do not compile.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from activities.kernels.gpu_compile import check
from activities.kernels.gpus import DEFAULT_GPU, GPUS, GpuSpec


def offline_candidates(task_file: Path, root: Path) -> list[Path] | str:
    """Folders (task.py + candidate.py) for the offline coder's candidate and the optimizer's first rewrite of it,
    or why there are none. The task is traced in this process: run it on trusted task files only."""
    from activities.kernels import compiler, optimizer
    from activities.kernels._probe import probe
    from contracts.kernel_job import ReferenceAnalysis

    task = task_file.read_text(encoding="utf-8")
    trace = root / task_file.stem / "trace"
    trace.mkdir(parents=True)
    (trace / "task.py").write_text(task, encoding="utf-8")
    try:
        reference = ReferenceAnalysis.model_validate(probe(str(trace / "task.py"), 0, symbolic=True))
    except Exception as e:  # noqa: BLE001 - a task the probe cannot trace has no offline candidate
        return f"not traced: {type(e).__name__}: {str(e)[:200]}"
    lowered = compiler.lower(reference)
    if isinstance(lowered, str):
        return f"no offline lowering: {lowered[:200]}"
    sources = {"coder": compiler.render(lowered, task)}
    proposal = optimizer.offline_answer(task, reference, [])
    if isinstance(proposal, optimizer.Proposal):
        sources[f"optimizer {proposal.rewrite}"] = proposal.source
    folders = []
    for label, source in sources.items():
        folder = root / task_file.stem / label.split()[0]
        folder.mkdir()
        (folder / "task.py").write_text(task, encoding="utf-8")
        (folder / "candidate.py").write_text(source, encoding="utf-8")
        (folder / "label").write_text(f"{task_file.parent.name}/{task_file.stem} {label}", encoding="utf-8")
        folders.append(folder)
    return folders


def _line(folder: Path, gpu: GpuSpec) -> tuple[bool | None, str]:
    result = check(folder, gpu, lambda _msg: None)
    label = (folder / "label").read_text(encoding="utf-8") if (folder / "label").is_file() else folder.name
    said = {True: "ok", False: "FAILED", None: "OPEN"}[result.compiles]
    summary = " ".join(result.summary.split())[:400]
    return result.compiles, f"{label:60} {said:6} {summary} [{', '.join(result.kernels)}]"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("folders", nargs="+", type=Path, help="folders holding task.py and candidate.py (with "
                                                              "--offline: folders of task files)")
    parser.add_argument("--gpu", choices=sorted(GPUS), default=DEFAULT_GPU, help=f"the target (default {DEFAULT_GPU})")
    parser.add_argument("--offline", action="store_true", help="check the offline compiler's candidates for the "
                                                               "task files in the folders")
    parser.add_argument("--jobs", type=int, default=2, help="checks at a time (default 2)")
    args = parser.parse_args(argv)
    gpu = GPUS[args.gpu]
    with tempfile.TemporaryDirectory(prefix="ff-gpu-compile-") as tmp:
        folders = [folder.resolve() for folder in args.folders]
        if args.offline:
            folders = []
            for task_file in sorted(f for d in args.folders for f in d.glob("*.py") if f.name != "__init__.py"):
                made = offline_candidates(task_file, Path(tmp))
                if isinstance(made, str):
                    print(f"{task_file.parent.name}/{task_file.stem:55} SKIP   {made}")
                else:
                    folders += made
        verdicts = []
        with ThreadPoolExecutor(max(1, args.jobs)) as pool:  # each check is a sandboxed child: threads only wait
            for compiles, line in pool.map(lambda f: _line(f, gpu), folders):
                verdicts.append(compiles)
                print(line, flush=True)
    print(f"{verdicts.count(True)} compile, {verdicts.count(False)} do not, {verdicts.count(None)} not checked "
          f"(of {len(verdicts)}) for {gpu.name}")
    return 1 if False in verdicts else 0


if __name__ == "__main__":
    sys.exit(main())
