"""Child-process runner: `python -m activities.kernels._child TASK.py OUT.pt SEED TRIALS [CANDIDATE.py]`,
or `... _child --profile TASK.py OUT.json SEED CANDIDATE.py` (GPU only, after verification passed).

Builds the task's `Model` (or, with a candidate file, the candidate's `ModelNew`) from
`get_init_inputs()` after `torch.manual_seed(SEED)`, runs it on every trial set's inputs and only
writes the outputs (torch.save) to OUT.pt. It never compares anything: the verifier does that in its
own process, so a candidate cannot fake its verdict.

A trial set is the task's own `get_inputs()` (seeded per trial) followed by the same inputs redrawn
from other distributions (FAMILIES: same shapes and dtypes, floating tensors only), so a kernel cannot
pass by relying on the task's input range (KernelBench draws with `torch.rand`: all inputs >= 0).

For a candidate it also writes LAUNCHES_FILE next to OUT.pt: which outputs do not depend on any
storage a Triton launch received in that forward call (see `LaunchRecorder`).
"""

from __future__ import annotations

import importlib.util
import json
import os
import resource
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager, nullcontext
from types import ModuleType
from typing import Any

FAMILIES = ("task", "signed_normal", "large", "near_zero")
"""Input distributions of every trial set: the task's own, N(0, 1), N(0, 1) x LARGE_SCALE, N(0, 1) x NEAR_ZERO_SCALE."""
LARGE_SCALE = 100.0
NEAR_ZERO_SCALE = 1e-3

LAUNCHES_FILE = "launches.json"
"""`{"not_kernel_derived": [[run, output], ...]}` (run = trial * len(FAMILIES) + family), written by a
candidate child after OUT.pt."""


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
    """Tracks which storages derive from a Triton kernel's writes during a forward call, so the
    child can tell whether each output depends on something a kernel wrote in that call.

    A storage is kernel-derived when a launch wrote it (a storage the launch received has some
    byte changed afterwards; a buffer the kernel only reads, like the input `x`, does not count),
    or when an aten op computed it from a kernel-derived storage (an in-place or `out=` op makes
    the argument it writes derived). A `TorchDispatchMode` sees every aten op of the forward call;
    inside a launch it only passes ops through (the interpreter copies arguments with torch ops of
    its own). So fp32 accumulation then `.to(torch.float16)`, `.contiguous()`, views, or a torch
    reduction of per-block partials pass, while a decoy that launches a kernel on a scratch buffer
    (or only reads `x`) and returns `torch.relu(x)` does not.

    It proves dependence, not that a kernel did the work: `torch.relu(x) + kernel_out * 0`
    passes, and a kernel that leaves every byte it received unchanged counts as writing nothing.
    It also runs inside the candidate's own process, so a hostile candidate can tamper with it
    (unpatch `run`, leave the mode, fill the record): it is feedback against lazy decoys, not a
    guarantee. The numeric comparison in the verifier's process stays the real guarantee.

    Wraps the methods `kernel[grid](...)` goes through (triton 3.x): `InterpretedFunction.run`
    under TRITON_INTERPRET=1, `JITFunction.run` on a GPU (autotuned and heuristics kernels end in
    one of these). Must be installed before the candidate is imported.
    """

    def __init__(self) -> None:
        import torch
        from torch.utils._python_dispatch import TorchDispatchMode
        from triton.runtime.interpreter import InterpretedFunction
        from triton.runtime.jit import JITFunction

        aten = torch.ops.aten
        # Ops whose output takes only the shape and dtype of their input, not its values.
        self._value_free = {aten.empty_like, aten.zeros_like, aten.ones_like, aten.full_like, aten.new_empty,
                            aten.new_empty_strided, aten.new_zeros, aten.new_ones, aten.new_full}
        self._derived: dict[int, object] = {}
        self._in_launch = False
        recorder = self

        class Propagate(TorchDispatchMode):
            @classmethod
            def _should_skip_dynamo(cls) -> bool:  # nothing is compiled: spares importing torch._dynamo (~1.5 s)
                return False

            def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # noqa: ANN001, ANN206
                return recorder._propagate(func, args, kwargs or {})

        self._mode = Propagate
        for cls in (InterpretedFunction, JITFunction):
            cls.run = self._recording(cls.run)

    def _recording(self, run: Callable) -> Callable:
        import torch

        def recorded(fn: object, *args: object, grid: object, warmup: bool, **kwargs: object) -> object:
            if warmup:  # warmup only compiles
                return run(fn, *args, grid=grid, warmup=warmup, **kwargs)
            self._in_launch = True  # the mode passes these ops and the interpreter's own through
            try:
                received = {t.untyped_storage().data_ptr(): _bytes(t) for t in _tensors([*args, *kwargs.values()])}
                before = {ptr: b.clone() for ptr, b in received.items()}
                result = run(fn, *args, grid=grid, warmup=warmup, **kwargs)
                self._add([b for ptr, b in received.items() if not torch.equal(b, before[ptr])])
                return result
            finally:
                self._in_launch = False

        return recorded

    def _propagate(self, func: Any, args: tuple, kwargs: dict) -> object:
        out = func(*args, **kwargs)
        if self._in_launch or func.overloadpacket in self._value_free:
            return out
        if any(self._is_derived(t) for t in _tensors([*args, *kwargs.values()])):
            params = func._schema.arguments
            written = [v for p, v in zip(params, args) if p.alias_info is not None and p.alias_info.is_write]
            written += [kwargs[p.name] for p in params
                        if p.name in kwargs and p.alias_info is not None and p.alias_info.is_write]
            self._add(_tensors([out, *written]))
        return out

    def _add(self, tensors: list) -> None:
        for t in tensors:
            # Holding the storage keeps a freed buffer's address from being reused by another
            # tensor until the call has been checked. Empty storages (address 0) carry nothing.
            storage = t.untyped_storage()
            if storage.data_ptr():
                self._derived[storage.data_ptr()] = storage

    def _is_derived(self, t: Any) -> bool:
        return t.untyped_storage().data_ptr() in self._derived

    @contextmanager
    def call(self) -> Iterator[None]:
        """One forward call: a fresh record, with ops traced while inside."""
        self._derived.clear()
        with self._mode():
            yield

    def derived(self, output: object) -> bool:
        import torch

        if not isinstance(output, torch.Tensor):
            return False
        return output.numel() == 0 or self._is_derived(output)


def _bytes(t: Any) -> Any:
    """The whole storage under `t`, as a flat uint8 tensor sharing it."""
    import torch

    return torch.empty(0, dtype=torch.uint8, device=t.device).set_(t.untyped_storage())


def _tensors(values: list) -> list:
    """The tensors in launch or op arguments (nested in tuples, lists, dicts, or a TensorDescriptor's
    or `triton.reinterpret` wrapper's `base`)."""
    import torch

    found = []
    for v in values:
        if isinstance(v, torch.Tensor):
            found.append(v)
        elif isinstance(v, (tuple, list)):
            found += _tensors(list(v))
        elif isinstance(v, dict):
            found += _tensors(list(v.values()))
        elif hasattr(v, "base"):
            found += _tensors([v.base])
    return found


def _device() -> str:
    """`cuda` on a GPU worker (set by the verifier), else the CPU tensors the interpreter runs on."""
    return os.environ.get("FLEETFORGE_CHILD_DEVICE", "cpu")


def _inputs(task: ModuleType) -> list:
    import torch

    return [x.to(_device()) if isinstance(x, torch.Tensor) else x for x in task.get_inputs()]


def family_inputs(task_inputs: list, family: str, seed: int) -> list:
    """The task's inputs redrawn from `family` (floating tensors only; integer tensors and scalars
    stay as the task made them), seeded so the reference and the candidate children agree."""
    import torch

    if family == "task":
        return task_inputs
    scale = {"signed_normal": 1.0, "large": LARGE_SCALE, "near_zero": NEAR_ZERO_SCALE}[family]
    torch.manual_seed(seed)
    return [torch.randn_like(x) * scale if isinstance(x, torch.Tensor) and x.is_floating_point() else x
            for x in task_inputs]


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
    outputs, not_derived = [], []
    with torch.no_grad():
        for trial in range(trials):
            torch.manual_seed(seed + 1 + trial)
            task_inputs = _inputs(task)
            for k, family in enumerate(FAMILIES):
                inputs = family_inputs(task_inputs, family, seed + 1000 * (k + 1) + trial)
                with recorder.call() if recorder else nullcontext():
                    items = _items(model(*inputs))
                if recorder:
                    not_derived += [[len(outputs), i] for i, x in enumerate(items) if not recorder.derived(x)]
                outputs.append(_as_list(items))
    torch.save(outputs, out_path)
    if recorder:
        with open(os.path.join(os.path.dirname(out_path), LAUNCHES_FILE), "w", encoding="utf-8") as f:
            json.dump({"not_kernel_derived": not_derived}, f)
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
