"""Child-process runner: `python -m activities.kernels._child TASK.py OUT.pt SEED TRIALS [CANDIDATE.py]`,
or `... _child --profile TASK.py OUT.json SEED CANDIDATE.py` (GPU only, after verification passed); either with
`--precision strict|kernelbench` (the job's precision policy: whether torch may use TF32, `set_precision`); a
reference with `--float64` runs in float64 (the verifier's arbiter when the fp32 results disagree).

Builds the task's `Model` (or, with a candidate file, the candidate's `ModelNew`) from
`get_init_inputs()` after `torch.manual_seed(SEED)`, runs it on every trial set's inputs and only
writes the outputs (torch.save) to OUT.pt. It never compares anything: the verifier does that in its
own process, so a candidate cannot fake its verdict.

A trial set is the task's own `get_inputs()` (seeded per trial) followed by the same inputs redrawn
from other distributions (FAMILIES: same shapes and dtypes, floating tensors only), so a kernel cannot
pass by relying on the task's input range (KernelBench draws with `torch.rand`: all inputs >= 0).

With `--held-out HELD_TASK.py` (the task file at other sizes) it then runs HELD_OUT_TRIALS trial sets of
HELD_OUT_FAMILIES on that task and writes HELD_OUT_FILE, so a kernel that assumes the sample's sizes fails.

Last, one forward call on SPECIAL inputs (N(0, 1) with NaN, +Inf and -Inf in places) writes SPECIAL_FILE, or
SPECIAL_ERROR_FILE with why it failed; that call never decides the child's exit code (the verifier's report
says whether the candidate treats NaN and Inf as torch does; the verdict is about finite inputs).

For a candidate it also writes LAUNCHES_FILE next to OUT.pt: which outputs do not depend on any
storage a Triton launch received in that forward call, and which compute ops torch ran in forward
outside the launches, with the candidate's line (see `LaunchRecorder`, `torch_work`). Under the
interpreter it writes TRAFFIC_FILE too: what each launch of the first forward call moved and computed
(`traffic.Counter`), the cost model's input.
"""

from __future__ import annotations

import importlib.util
import json
import os
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager, nullcontext
from types import ModuleType
from typing import Any

from activities.lifeline import die_with_parent, exit_now

FAMILIES = ("task", "signed_normal", "large", "near_zero")
"""Input distributions of every trial set: the task's own, N(0, 1), N(0, 1) x LARGE_SCALE, N(0, 1) x NEAR_ZERO_SCALE."""
LARGE_SCALE = 100.0
NEAR_ZERO_SCALE = 1e-3

LAUNCHES_FILE = "launches.json"
"""`{"not_kernel_derived": [[run, output], ...], "held_out_not_kernel_derived": [...], "torch_ops": [...]}`
(run = trial * len(families) + family), written by a candidate child after OUT.pt (again after the
held-out runs)."""
TRAFFIC_FILE = "traffic.json"
"""`[LaunchCost, ...]` of the candidate's first forward call (trial 0, the task's own inputs), in launch order;
written under the Triton interpreter only."""
HELD_OUT_FILE = "held_out.pt"
"""The outputs at the held-out sizes (`--held-out HELD_TASK.py`), next to OUT.pt."""
HELD_OUT_ERROR_FILE = "held_out_error.txt"
"""Written by the reference child when the task itself fails at the held-out sizes (then none are checked)."""
PROGRESS_FILE = "progress.json"
"""`{"phase": "task"|"held_out", "done": N, "total": M, "seconds": S}`, rewritten after every forward call: what a
child that ran out of time had finished, and when (seconds since it started)."""
HELD_OUT_TRIALS = 1
HELD_OUT_FAMILIES = ("task", "signed_normal")
"""The held-out sizes test shape generality; the value distributions were covered at the task's sizes."""
SPECIAL = "nan_inf"
"""The special-values input family: N(0, 1) with one element in SPECIAL_EVERY set to NaN, +Inf or -Inf in turn."""
SPECIAL_EVERY = 61
SPECIAL_FILE = "special.pt"
SPECIAL_ERROR_FILE = "special_error.txt"


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

    It also records every op outside a launch that is not allocation, a view, a cast or a copy
    (`torch_work.ALLOWED`), with the innermost line of the candidate's file on the Python stack: that
    is how a torch-computed result copied out by a kernel is named and rejected.

    Dependence alone does not prove a kernel did the work: `torch.relu(x) + kernel_out * 0`
    depends on a kernel (the recorded relu and add reject it), and a kernel that leaves every byte it received
    unchanged counts as writing nothing (so uninitialized allocations start as all-ones bytes, and a kernel writing
    zeros into one is seen; a kernel writing zeros into a `zeros_like` buffer is not).
    It also runs inside the candidate's own process, so a hostile candidate can tamper with it
    (unpatch `run`, leave the mode, fill the record): it is feedback against lazy decoys, not a
    guarantee. The numeric comparison in the verifier's process stays the real guarantee.

    Wraps the methods `kernel[grid](...)` goes through (triton 3.x): `InterpretedFunction.run`
    under TRITON_INTERPRET=1, `JITFunction.run` on a GPU (autotuned and heuristics kernels end in
    one of these). Must be installed before the candidate is imported.
    """

    def __init__(self, source_file: str = "candidate.py",
                 on_torch_op: Callable[[Any, tuple, dict, Any], None] | None = None) -> None:
        import torch
        from torch.utils._python_dispatch import TorchDispatchMode
        from triton.runtime.interpreter import InterpretedFunction
        from triton.runtime.jit import JITFunction

        aten = torch.ops.aten
        # Ops whose output takes only the shape and dtype of their input, not its values.
        self._value_free = {aten.empty_like, aten.zeros_like, aten.ones_like, aten.full_like, aten.new_empty,
                            aten.new_empty_strided, aten.new_zeros, aten.new_ones, aten.new_full}
        # Uninitialized allocations, filled with all-ones bytes (NaN, -1) before the candidate sees them: a
        # kernel that writes zeros into fresh memory the OS handed out zeroed changes its bytes, so a ReLU
        # whose every output is 0 still counts as written (it was a false "no": L2 9 at its held-out sizes).
        self._uninitialized = {aten.empty, aten.empty_like, aten.empty_strided, aten.new_empty,
                               aten.new_empty_strided}
        self._tensor = torch.Tensor
        self._derived: dict[int, object] = {}
        self._in_launch = False
        self._source = os.path.abspath(source_file)  # the path the candidate's code objects carry
        self.torch_ops: dict[tuple[str, int], dict] = {}
        """Compute ops torch ran in the candidate's forward outside any launch, by (overload, line) (see
        torch_work.ALLOWED), each with the first run that ran it."""
        self.run = 0
        self.held_out = False
        self._on_torch_op = on_torch_op
        """Told every op torch runs outside the launches (the traffic counter: a copy is a kernel on a GPU)."""
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
        if self._in_launch:
            return out
        self._note_torch_op(func)
        if func.overloadpacket in self._uninitialized and isinstance(out, self._tensor) and out.numel():
            _bytes(out).fill_(255)
        if self._on_torch_op is not None:
            self._on_torch_op(func, args, kwargs, out)
        if func.overloadpacket in self._value_free:
            return out
        if any(self._is_derived(t) for t in _tensors([*args, *kwargs.values()])):
            params = func._schema.arguments
            written = [v for p, v in zip(params, args) if p.alias_info is not None and p.alias_info.is_write]
            written += [kwargs[p.name] for p in params
                        if p.name in kwargs and p.alias_info is not None and p.alias_info.is_write]
            self._add(_tensors([out, *written]))
        return out

    def _note_torch_op(self, func: Any) -> None:
        """Record a compute op torch ran outside a launch, at the innermost line of the candidate's own
        file on the Python stack (a helper function's line, not only forward's)."""
        from activities.kernels.torch_work import is_allowed

        name = str(func)
        if is_allowed(name) or len(self.torch_ops) >= 100:
            return
        frame, line = sys._getframe(1), 0
        while frame is not None:
            if frame.f_code.co_filename == self._source:
                line = frame.f_lineno
                break
            frame = frame.f_back
        if (name, line) not in self.torch_ops:
            import linecache

            code = linecache.getline(self._source, line).strip() if line else ""
            self.torch_ops[(name, line)] = {"op": name.split(".")[1] if name.startswith("aten.") else name,
                                            "overload": name, "line": line, "code": code[:200], "run": self.run,
                                            "held_out": self.held_out}

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


def set_precision(policy: str) -> None:
    """The precision policy's TF32 switch for every child (activities/kernels/precision.py). On a GPU torch runs
    float32 convolutions in TF32 by default (cuDNN), 10 mantissa bits: under the strict policy the reference would
    then be less exact than a candidate that computes in IEEE fp32, and the eager baseline faster than the fp32 work
    it stands for, so both are off; the kernelbench policy allows TF32 on every side alike."""
    import torch

    tf32 = policy == "kernelbench"
    torch.backends.cudnn.allow_tf32 = tf32
    torch.backends.cuda.matmul.allow_tf32 = tf32


def skip_unasserted_overflow_checks() -> None:
    """Spare the interpreter its int32 overflow checks: it computes one for every integer add, sub and mul (each
    operand cast to int64, the result compared with both bounds) and then drops it, since it only asserts under
    `debug` (off here, as in a compiled kernel). On index arithmetic that was half the time (a GroupNorm candidate's
    forward: 26 s -> 13-16 s); what the kernel computes does not change."""
    import dataclasses

    from triton.runtime import interpreter

    builder = interpreter.interpreter_builder
    if not builder.options.debug:
        builder.options = dataclasses.replace(builder.options, sanitize_overflow=False)


def pop_option(argv: list[str], flag: str, default: str) -> tuple[str, list[str]]:
    """`--flag VALUE` taken out of argv (the value, and argv without both)."""
    if flag not in argv:
        return default, argv
    i = argv.index(flag)
    return argv[i + 1], argv[:i] + argv[i + 2:]


def _inputs(task: ModuleType) -> list:
    import torch

    return [x.to(_device()) if isinstance(x, torch.Tensor) else x for x in task.get_inputs()]


def family_inputs(task_inputs: list, family: str, seed: int) -> list:
    """The task's inputs redrawn from `family` (floating tensors only; integer tensors and scalars
    stay as the task made them), seeded so the reference and the candidate children agree."""
    import torch

    if family == "task":
        return task_inputs
    torch.manual_seed(seed)
    if family == SPECIAL:
        return [_with_special_values(x) if isinstance(x, torch.Tensor) and x.is_floating_point() else x
                for x in task_inputs]
    scale = {"signed_normal": 1.0, "large": LARGE_SCALE, "near_zero": NEAR_ZERO_SCALE}[family]
    return [torch.randn_like(x) * scale if isinstance(x, torch.Tensor) and x.is_floating_point() else x
            for x in task_inputs]


def _with_special_values(like: Any) -> Any:
    """N(0, 1) in the shape, dtype and layout of `like`, about one element in SPECIAL_EVERY (at seeded places)
    NaN, +Inf and -Inf in turn."""
    import torch

    flat = torch.randn(like.numel(), dtype=like.dtype, device=like.device)
    places = torch.randint(flat.numel(), (max(1, flat.numel() // SPECIAL_EVERY),), device=like.device)
    for k, value in enumerate((float("nan"), float("inf"), float("-inf"))):
        flat[places[k::3]] = value
    return torch.empty_like(like).copy_(flat.view(like.shape))


def main(argv: list[str]) -> int:
    held_out, argv = pop_option(argv, "--held-out", "")  # `--held-out HELD_TASK.py`: the task at other sizes
    float64 = "--float64" in argv  # the reference in float64: the verifier's arbiter when fp32 results disagree
    argv = [a for a in argv if a != "--float64"]
    held_out_path = held_out or None
    task_path, out_path, seed, trials = argv[0], argv[1], int(argv[2]), int(argv[3])
    candidate_path = argv[4] if len(argv) > 4 else None
    import torch

    folder = os.path.dirname(out_path)
    counter = None
    if candidate_path and os.environ.get("TRITON_INTERPRET") == "1":
        from activities.kernels import traffic

        counter = traffic.Counter()
        traffic.install(counter)
        skip_unasserted_overflow_checks()
    recorder = LaunchRecorder(candidate_path, counter.torch_op if counter else None) if candidate_path else None
    task = _load(task_path, "fleetforge_task")
    candidate_cls = getattr(_load(candidate_path, "fleetforge_candidate"), "ModelNew") if candidate_path else None
    progress = _Progress(folder)
    outputs, not_derived = _runs(task, candidate_cls or task.Model, seed, trials, FAMILIES, recorder, counter,
                                 progress.phase("task", trials * len(FAMILIES)), float64=float64)
    torch.save(outputs, out_path)
    if counter is not None:
        with open(os.path.join(folder, TRAFFIC_FILE), "w", encoding="utf-8") as f:
            json.dump(counter.launches, f)
    record: dict[str, Any] = {"not_kernel_derived": not_derived}
    _write_record(folder, record, recorder)
    if held_out_path is not None:
        _held_out(held_out_path, candidate_cls, seed, folder, record, recorder, progress, float64)
    if not float64:  # the float64 arbiter judges the finite runs only
        _special_run(task, candidate_cls or task.Model, seed, folder, progress)
    return 0


def _held_out(path: str, candidate_cls: type | None, seed: int, folder: str, record: dict,
              recorder: LaunchRecorder | None, progress: _Progress, float64: bool) -> None:
    import torch

    try:
        held = _load(path, "fleetforge_task_held_out")
        if recorder:
            recorder.held_out = True
        held_outputs, held_not_derived = _runs(held, candidate_cls or held.Model, seed, HELD_OUT_TRIALS,
                                               HELD_OUT_FAMILIES, recorder,
                                               progress=progress.phase("held_out", HELD_OUT_TRIALS * len(HELD_OUT_FAMILIES)),
                                               float64=float64)
    except Exception as e:  # noqa: BLE001 - the reference's failure here only means no held-out check
        if candidate_cls is not None:
            raise  # the candidate's crash at the held-out sizes is its verdict
        _write_error(os.path.join(folder, HELD_OUT_ERROR_FILE), e)
        return
    torch.save(held_outputs, os.path.join(folder, HELD_OUT_FILE))
    record["held_out_not_kernel_derived"] = held_not_derived
    _write_record(folder, record, recorder)


def _special_run(task: ModuleType, cls: type, seed: int, folder: str, progress: _Progress) -> None:
    """The SPECIAL run at the task's sizes, unrecorded (what torch ops a candidate runs there is not judged)."""
    import torch

    done = progress.phase(SPECIAL, 1)
    done(0)  # the phase begins: a kill from here on is the verifier's cue that every finite run is written
    try:
        outputs, _ = _runs(task, cls, seed, 1, (SPECIAL,), None, progress=done)
    except Exception as e:  # noqa: BLE001 - a crash on NaN/Inf inputs is reported, not a verdict
        _write_error(os.path.join(folder, SPECIAL_ERROR_FILE), e)
        return
    torch.save(outputs, os.path.join(folder, SPECIAL_FILE))


def _write_error(path: str, e: Exception) -> None:
    with open(path, "w", encoding="utf-8") as f:
        f.write(f"{type(e).__name__}: {' '.join(str(e).split())[:300]}")


class _Progress:
    """Writes PROGRESS_FILE after each forward call."""

    def __init__(self, folder: str) -> None:
        self._path, self._start = os.path.join(folder, PROGRESS_FILE), time.monotonic()

    def phase(self, name: str, total: int) -> Callable[[int], None]:
        def done(n: int) -> None:
            with open(self._path, "w", encoding="utf-8") as f:
                json.dump({"phase": name, "done": n, "total": total,
                           "seconds": round(time.monotonic() - self._start, 1)}, f)
        return done


def _runs(task: ModuleType, cls: type, seed: int, trials: int, families: tuple[str, ...],
          recorder: LaunchRecorder | None, counter: Any = None,
          progress: Callable[[int], None] = lambda _n: None, float64: bool = False) -> tuple[list, list]:
    """Every trial set's outputs (run = trial * len(families) + family) and, for a candidate, the
    [run, output] pairs that do not derive from a kernel's writes. `counter` (a traffic.Counter) counts the
    first forward call's launches. `float64`: the same model and inputs (drawn as usual, then cast), computed in
    float64."""
    import torch

    torch.manual_seed(seed)
    model = cls(*task.get_init_inputs()).to(_device())
    if float64:
        model = model.double()
    outputs, not_derived = [], []
    with torch.no_grad():
        for trial in range(trials):
            torch.manual_seed(seed + 1 + trial)
            task_inputs = _inputs(task)
            for family in families:
                k = (*FAMILIES, SPECIAL).index(family)
                inputs = family_inputs(task_inputs, family, seed + 1000 * (k + 1) + trial)
                if float64:
                    inputs = [x.double() if isinstance(x, torch.Tensor) and x.is_floating_point() else x for x in inputs]
                if recorder:
                    recorder.run = len(outputs)
                counting = counter.counting() if counter is not None and not outputs else nullcontext()
                with recorder.call() if recorder else nullcontext(), counting:
                    items = _items(model(*inputs))
                if recorder:
                    not_derived += [[len(outputs), i] for i, x in enumerate(items) if not recorder.derived(x)]
                outputs.append(_as_list(items))
                progress(len(outputs))
    return outputs, not_derived


def _write_record(folder: str, record: dict, recorder: LaunchRecorder | None) -> None:
    if recorder is None:
        return
    record["torch_ops"] = list(recorder.torch_ops.values())
    with open(os.path.join(folder, LAUNCHES_FILE), "w", encoding="utf-8") as f:
        json.dump(record, f)


def do_bench_ms(fn: Callable[[], Any]) -> float:
    """Median milliseconds of `fn` on the GPU (`triton.testing.do_bench`: warm-up, then timed runs)."""
    import triton.testing

    return float(triton.testing.do_bench(fn, warmup=25, rep=100, return_mode="median"))


def profile_times(task: ModuleType, candidate: ModuleType, seed: int,
                  timer: Callable[[Callable[[], Any]], float] = do_bench_ms) -> dict:
    """`{candidate_ms, eager_ms, compile_ms}`: the candidate, the reference in eager mode and the reference
    under `torch.compile`, each built after the same seed and run on the same inputs. A variant that
    cannot run (torch.compile without a working compiler, say) is None with its error beside it
    (`compile_ms_error`), so the others still count. `timer` is do_bench on a GPU; tests pass their own."""
    import torch

    variants = {"candidate_ms": (candidate.ModelNew, False), "eager_ms": (task.Model, False),
                "compile_ms": (task.Model, True)}
    times: dict[str, Any] = {}
    for name, (cls, compiled) in variants.items():
        try:
            torch.manual_seed(seed)
            model = cls(*task.get_init_inputs()).to(_device())
            run = torch.compile(model) if compiled else model
            torch.manual_seed(seed + 1)
            inputs = _inputs(task)

            def forward(run: Callable = run, inputs: list = inputs) -> Any:
                with torch.no_grad():
                    return run(*inputs)
            times[name] = float(timer(forward))
        except Exception as e:  # noqa: BLE001 - a variant that cannot run is a note, not a crash
            first = str(e).strip().splitlines()[0][:200] if str(e).strip() else ""
            times[name], times[f"{name}_error"] = None, f"{type(e).__name__}: {first}"
    return times


def profile(argv: list[str]) -> int:
    """Timing only, on the GPU, after verification passed (correctness was settled by the verifier,
    outside this process): writes `profile_times` as JSON."""
    task_path, out_path, seed, candidate_path = argv[0], argv[1], int(argv[2]), argv[3]
    task = _load(task_path, "fleetforge_task")
    candidate = _load(candidate_path, "fleetforge_candidate")
    with open(out_path, "w", encoding="utf-8") as f:
        json.dump(profile_times(task, candidate, seed), f)
    return 0


if __name__ == "__main__":
    die_with_parent()
    precision, args = pop_option(sys.argv[1:], "--precision", "strict")
    set_precision(precision)
    exit_now(profile(args[1:]) if args[:1] == ["--profile"] else main(args))
