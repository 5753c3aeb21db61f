"""Child-process runner: `python -m activities.kernels._child TASK.py OUT.pt SEED TRIALS [CANDIDATE.py]`,
or `... _child --profile TASK.py OUT.json SEED CANDIDATE.py` (GPU only, after verification passed).

Builds the task's `Model` (or, with a candidate file, the candidate's `ModelNew`) from
`get_init_inputs()` after `torch.manual_seed(SEED)`, runs it on `get_inputs()` seeded per trial,
and only writes the outputs (torch.save) to OUT.pt. It never compares anything: the verifier
does that in its own process, so a candidate cannot fake its verdict.

For a candidate it also writes LAUNCHES_FILE next to OUT.pt: which outputs were not written by a
Triton kernel (see `LaunchRecorder`).
"""

from __future__ import annotations

import importlib.util
import json
import os
import resource
import sys
from collections.abc import Callable
from types import ModuleType

LAUNCHES_FILE = "launches.json"
"""`{"not_kernel_written": [[trial, output], ...]}`, written by a candidate child after OUT.pt."""


def _load(path: str, name: str) -> ModuleType:
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


def _items(out: object) -> list:
    return list(out) if isinstance(out, (tuple, list)) else [out]


def _as_list(items: list) -> list:
    import torch

    return [x.detach().cpu().clone().contiguous() if isinstance(x, torch.Tensor) else torch.as_tensor(x) for x in items]


class LaunchRecorder:
    """Records the storages of the tensors every Triton launch receives, so the child can tell
    whether each output of a forward call went through a kernel in that call.

    This catches a decoy that launches a kernel on a scratch buffer and returns `torch.relu(x)`:
    the returned storage was never handed to a kernel. A view or reshape of a kernel-written
    buffer shares its storage and passes. It proves only that a launch received the output's
    storage, not that the kernel wrote every element. It also runs inside the candidate's own
    process, so a hostile candidate can tamper with it (unpatch `run`, fill the record): it is
    feedback against lazy decoys, not a guarantee. The numeric comparison in the verifier's
    process stays the real guarantee.

    Wraps the methods `kernel[grid](...)` goes through (triton 3.x): `InterpretedFunction.run`
    under TRITON_INTERPRET=1, `JITFunction.run` on a GPU (autotuned and heuristics kernels end in
    one of these). Must be installed before the candidate is imported.
    """

    def __init__(self) -> None:
        from triton.runtime.interpreter import InterpretedFunction
        from triton.runtime.jit import JITFunction

        self._storages: dict[int, object] = {}
        for cls in (InterpretedFunction, JITFunction):
            cls.run = self._recording(cls.run)

    def _recording(self, run: Callable) -> Callable:
        def recorded(fn: object, *args: object, grid: object, warmup: bool, **kwargs: object) -> object:
            if not warmup:  # warmup only compiles
                self._add([*args, *kwargs.values()])
            return run(fn, *args, grid=grid, warmup=warmup, **kwargs)

        return recorded

    def _add(self, values: list) -> None:
        import torch

        for v in values:
            if isinstance(v, torch.Tensor):
                # Holding the storage keeps a freed scratch buffer's address from being reused
                # by the output until the call has been checked.
                storage = v.untyped_storage()
                self._storages[storage.data_ptr()] = storage
            elif isinstance(v, (tuple, list)):
                self._add(list(v))
            elif hasattr(v, "base"):  # TensorDescriptor, triton.reinterpret's TensorWrapper
                self._add([v.base])

    def start_call(self) -> None:
        self._storages.clear()

    def written(self, output: object) -> bool:
        import torch

        if not isinstance(output, torch.Tensor):
            return False
        return output.numel() == 0 or output.untyped_storage().data_ptr() in self._storages


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

    recorder = LaunchRecorder() if candidate_path else None
    task = _load(task_path, "fleetforge_task")
    cls = getattr(_load(candidate_path, "fleetforge_candidate"), "ModelNew") if candidate_path else task.Model
    torch.manual_seed(seed)
    model = cls(*task.get_init_inputs()).to(_device())
    outputs, not_written = [], []
    with torch.no_grad():
        for trial in range(trials):
            torch.manual_seed(seed + 1 + trial)
            if recorder:
                recorder.start_call()
            items = _items(model(*_inputs(task)))
            if recorder:
                not_written += [[trial, i] for i, x in enumerate(items) if not recorder.written(x)]
            outputs.append(_as_list(items))
    torch.save(outputs, out_path)
    if recorder:
        with open(os.path.join(os.path.dirname(out_path), LAUNCHES_FILE), "w", encoding="utf-8") as f:
            json.dump({"not_kernel_written": not_written}, f)
    return 0


def profile(argv: list[str]) -> int:
    """Median milliseconds of the reference and the candidate forward on the GPU
    (`triton.testing.do_bench`: warm-up, then at least PROFILE_RUNS timed runs). Timing only:
    correctness was settled by the verifier, outside this process."""
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
