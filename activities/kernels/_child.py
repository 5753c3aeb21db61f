"""Child-process runner: `python -m activities.kernels._child TASK.py OUT.pt SEED TRIALS [CANDIDATE.py]`,
or `... _child --profile TASK.py OUT.json SEED CANDIDATE.py` (GPU only, after verification passed).

Builds the task's `Model` (or, with a candidate file, the candidate's `ModelNew`) from
`get_init_inputs()` after `torch.manual_seed(SEED)`, runs it on `get_inputs()` seeded per trial,
and only writes the outputs (torch.save) to OUT.pt. It never compares anything: the verifier
does that in its own process, so a candidate cannot fake its verdict.
"""

from __future__ import annotations

import importlib.util
import os
import resource
import sys
from types import ModuleType


def _load(path: str, name: str) -> ModuleType:
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


def _as_list(out: object) -> list:
    import torch

    items = list(out) if isinstance(out, (tuple, list)) else [out]
    return [x.detach().cpu().clone().contiguous() if isinstance(x, torch.Tensor) else torch.as_tensor(x) for x in items]


def _device() -> str:
    """`cuda` on a GPU worker (set by the verifier), else the CPU tensors the interpreter runs on."""
    return os.environ.get("FLEETFORGE_CHILD_DEVICE", "cpu")


def _inputs(task: ModuleType) -> list:
    import torch

    return [x.to(_device()) if isinstance(x, torch.Tensor) else x for x in task.get_inputs()]


def apply_limits() -> None:
    """Address space, CPU seconds, no core files, bounded output files: set by the verifier."""
    mem = int(os.environ.get("FLEETFORGE_CHILD_MEMORY_BYTES", 8 * 1024**3))
    cpu = int(os.environ.get("FLEETFORGE_CHILD_CPU_S", 600))
    if mem > 0:
        resource.setrlimit(resource.RLIMIT_AS, (mem, mem))
    resource.setrlimit(resource.RLIMIT_CPU, (cpu, cpu + 5))
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
    resource.setrlimit(resource.RLIMIT_FSIZE, (1024**3, 1024**3))


def die_with_parent() -> None:
    """The child runs in a session of its own (so the verifier can kill its whole group); this
    makes it die with the worker too, when the worker itself is killed (Linux)."""
    if not sys.platform.startswith("linux"):
        return
    import ctypes
    import signal

    ctypes.CDLL(None, use_errno=True).prctl(1, int(signal.SIGKILL))  # PR_SET_PDEATHSIG
    if os.getppid() != int(os.environ.get("FLEETFORGE_CHILD_PARENT_PID", os.getppid())):
        os._exit(1)  # the worker died before prctl took effect


def main(argv: list[str]) -> int:
    task_path, out_path, seed, trials = argv[0], argv[1], int(argv[2]), int(argv[3])
    candidate_path = argv[4] if len(argv) > 4 else None
    import torch

    task = _load(task_path, "fleetforge_task")
    cls = getattr(_load(candidate_path, "fleetforge_candidate"), "ModelNew") if candidate_path else task.Model
    torch.manual_seed(seed)
    model = cls(*task.get_init_inputs()).to(_device())
    outputs = []
    with torch.no_grad():
        for trial in range(trials):
            torch.manual_seed(seed + 1 + trial)
            outputs.append(_as_list(model(*_inputs(task))))
    torch.save(outputs, out_path)
    return 0


def profile(argv: list[str]) -> int:
    """Median milliseconds of the reference and the candidate forward on the GPU
    (`triton.testing.do_bench`: warm-up, then at least PROFILE_RUNS timed runs). Timing only:
    correctness was settled by the verifier, outside this process."""
    import json

    import torch
    import triton.testing

    task_path, out_path, seed, candidate_path = argv[0], argv[1], int(argv[2]), argv[3]
    task = _load(task_path, "fleetforge_task")
    candidate = _load(candidate_path, "fleetforge_candidate")
    timings = {}
    for name, cls in (("reference_ms", task.Model), ("candidate_ms", candidate.ModelNew)):
        torch.manual_seed(seed)
        model = cls(*task.get_init_inputs()).to(_device())
        torch.manual_seed(seed + 1)
        inputs = _inputs(task)
        with torch.no_grad():
            timings[name] = float(triton.testing.do_bench(lambda: model(*inputs), warmup=25, rep=100,
                                                          return_mode="median"))
    with open(out_path, "w", encoding="utf-8") as f:
        json.dump(timings, f)
    return 0


if __name__ == "__main__":
    die_with_parent()
    apply_limits()
    sys.exit(profile(sys.argv[2:]) if sys.argv[1:2] == ["--profile"] else main(sys.argv[1:]))
