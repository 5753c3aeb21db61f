"""Count, per launch, what a candidate's Triton kernels move and compute while the interpreter runs them
(TRITON_INTERPRET=1, in the candidate's sandboxed child), and make the interpreter's `tl.dot` round fp32
operands to TF32 when the kernel asks for TF32, as a GPU's tensor cores do.

How Triton's interpreter (3.7-3.9) runs a kernel (triton/runtime/interpreter.py): `InterpretedFunction.run` hands the
arguments to a `GridExecutor`, which sets `interpreter_builder.set_grid_dim(nx, ny, nz)` and calls the kernel's
Python function once per program. Every `tl.*` call lands on that module-level `InterpreterBuilder` instance:

* `tl.load` -> `create_masked_load(ptrs, mask, other, ...)` (an unmasked load passes an all-true mask; atomic
  loads and TMA descriptor loads come through it too), `tl.store` -> `create_masked_store(ptrs, value, mask, ...)`.
  `ptrs.data` holds the elements' host addresses (uint64), `mask.data` the lanes that move;
* `tl.atomic_*` -> `create_atomic_rmw` / `create_atomic_cas` (a read and a write per active lane);
* `tl.dot` -> `create_dot(a, b, acc, input_precision, ...)`, `input_precision` an `ir.INPUT_PRECISION`
  (TF32 is Triton's default for fp32 operands; the interpreter itself multiplies in full fp32);
* arithmetic -> `binary_op` / `unary_op` / `ternary_op` / `create_fma` / `create_erf` / `create_rsqrt` /
  `create_fabs`; reductions and scans -> `ReduceOps.sum` / `ReduceOps.min_max` / `ScanOps.cumsum` /
  `ScanOps.cumprod` (custom combine functions run through the builder's arithmetic instead).

`install(counter)` wraps those methods once per process (on the `interpreter_builder` instance, the two op classes
and `InterpretedFunction.run`); the wrappers count only while `counter.counting()` is active. Per launch they
record (contracts.kernel_job.LaunchCost): the bytes requested by loads and stores over active lanes (every
re-read counts), the distinct bytes read and written (a byte map over the storages the launch received: the
DRAM traffic when re-reads within one launch hit the cache), the floating-point FLOPs outside `tl.dot` (one per
element of the block, scaled by the launch's share of active lanes over its loads and stores: a block sized for the
interpreter, 4096 lanes over 12 elements, computes the 12 that matter; integer and address arithmetic is not
counted), and 2*M*N*K per `tl.dot` over the tile's used rows, columns and depth (masked loads leave the padding
of an edge tile all zeros: a row, column or depth index that is zero throughout is padding), by operand precision. Torch ops the forward runs outside its launches (a `.contiguous()`
copy, a zero fill) are recorded through `torch_op` by the child's dispatch mode: they are kernels on a GPU too.
A launch's program count is its grid's, or the GPU's where the grid declares it (an attribute `gpu` on the grid
tuple: the compiler's launchers run fewer, larger programs under the interpreter, which pays per program, than a
GPU does), capped at one program per active lane.

This runs inside the candidate's process, like `_child.LaunchRecorder`: a hostile candidate could tamper with the
counts (the static checks forbid patching triton, not every trick), so the figures are a model and labelled so;
the numeric comparison in the verifier's process stays the guarantee of correctness, and a GPU's measurement the
one of speed.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

from activities.kernels.torch_work import ALLOCATION, VIEWS, op_name

UNFILLED = frozenset({"empty", "empty_like", "empty_strided", "new_empty", "new_empty_strided", "lift_fresh",
                      "lift_fresh_copy", "scalar_tensor"})
"""Allocations that write nothing (the other ALLOCATION ops fill their output)."""
_COUNTER: Counter | None = None
_INSTALLED = False


class Counter:
    """The launches counted while `counting()` is active, as LaunchCost dicts in launch order."""

    def __init__(self) -> None:
        self.launches: list[dict] = []
        self.active = False
        self._launch: _Launch | None = None
        self._grid = (1, 1, 1)

    @contextmanager
    def counting(self) -> Iterator[None]:
        self.active = True
        try:
            yield
        finally:
            self.active = False

    def torch_op(self, func: Any, args: tuple, kwargs: dict, out: Any) -> None:
        """A torch op the forward ran outside any launch: a kernel of its own on a GPU (views and bare
        allocations are free); its bytes are its distinct input and output tensors."""
        if not self.active:
            return
        name = op_name(str(func))
        if name in VIEWS or name in UNFILLED:
            return
        import torch

        outs = _walk([out])
        if name in ALLOCATION:  # a fill: writes its output, reads nothing
            ins: list = []
        else:
            ins = [t for t in _walk([*args, *kwargs.values()]) if isinstance(t, torch.Tensor)]
        seen: set[tuple[int, int]] = set()

        def nbytes(tensors: list) -> int:
            total = 0
            for t in tensors:
                if not isinstance(t, torch.Tensor):
                    continue
                key = (t.data_ptr(), t.numel())
                if key not in seen:
                    seen.add(key)
                    total += t.numel() * t.element_size()
            return total

        stored = nbytes(outs)
        loaded = nbytes(ins)
        self.launches.append({"kernel": f"torch:{name}", "loaded": loaded, "stored": stored,
                              "unique_loaded": loaded, "unique_stored": stored,
                              "flops": 0 if name in ALLOCATION else max((t.numel() for t in outs
                                                                         if isinstance(t, torch.Tensor)), default=0)})


HOOKED_TRITONS = ("3.7.", "3.8.", "3.9.")
"""The Triton releases whose interpreter `install` hooks: the ones torch 2.12-2.15's CUDA wheels require (torch
2.13.0 pins triton 3.7.1), each run through the verifier tests. Their builders differ only in the load/store
cache arguments, which the hooks pass through. 3.6 and older crash in the interpreter itself under numpy 2.4
(triton-lang/triton#9171); a release not seen here may move the builder's other entry points."""
TRITON_PIN = "triton>=3.7.1,<3.10"
"""The kernels extra's requirement (pyproject.toml; a test holds the two and HOOKED_TRITONS together)."""


def require_hooked_triton() -> None:
    """Refuse to judge on another Triton release: every interpreted candidate would crash inside a hook and be
    blamed for it (a false "no"), while the fault is the machine's."""
    from importlib.metadata import PackageNotFoundError, version

    from contracts.errors import Err, FleetforgeError

    try:
        found = version("triton")
    except PackageNotFoundError:
        found = "none"
    if not found.startswith(HOOKED_TRITONS):
        known = ", ".join(f"{v}x" for v in HOOKED_TRITONS)
        raise FleetforgeError(Err.VERIFIER_ERROR, f"this kernels worker has Triton {found}; the cpu-interpreter "
                                                  f"verifier hooks the interpreter of Triton {known}: pip install "
                                                  f"'{TRITON_PIN}' on the worker (the kernels extra asks for it), or "
                                                  "run the job on a GPU worker with --arch")


def round_to_tf32(data: Any) -> Any:
    """fp32 values at TF32's 10 mantissa bits, rounded to nearest even, Inf and NaN kept (what Triton 3.9's
    interpreter does for TF32 tensor-map loads; 3.7 and 3.8 have no such function)."""
    import numpy as np

    bits = np.asarray(data, dtype=np.float32).view(np.uint32)
    special = (bits & np.uint32(0x7F800000)) == np.uint32(0x7F800000)
    round_bias = ((bits >> np.uint32(13)) & np.uint32(1)) + np.uint32(0x00000FFF)
    rounded = (bits + round_bias) & np.uint32(0xFFFFE000)
    return np.where(special, bits, rounded).view(np.float32)


def install(counter: Counter) -> None:
    """Wrap the interpreter's entry points (once per process) and count into `counter` from now on."""
    global _COUNTER, _INSTALLED
    _COUNTER = counter
    if _INSTALLED:
        return
    import numpy as np
    from triton.runtime import interpreter as it

    builder = it.interpreter_builder

    def wrap(owner: Any, name: str, make: Callable[[Callable], Callable]) -> None:
        setattr(owner, name, make(getattr(owner, name)))

    def masked_load(orig: Callable) -> Callable:
        def load(ptrs, mask, *rest):  # noqa: ANN001, ANN002, ANN202  (rest: the release's cache arguments)
            launch = _current()
            if launch is not None:
                launch.access(ptrs, mask.data, store=False)
            return orig(ptrs, mask, *rest)
        return load

    def masked_store(orig: Callable) -> Callable:
        def store(ptrs, value, mask, *rest):  # noqa: ANN001, ANN002, ANN202
            launch = _current()
            if launch is not None:
                launch.access(ptrs, mask.data, store=True)
            return orig(ptrs, value, mask, *rest)
        return store

    def atomic_rmw(orig: Callable) -> Callable:
        def rmw(rmw_op, ptr, val, mask, sem, scope):  # noqa: ANN001, ANN202
            launch = _current()
            if launch is not None:
                launch.access(ptr, mask.data, store=False)
                launch.access(ptr, mask.data, store=True)
            return orig(rmw_op, ptr, val, mask, sem, scope)
        return rmw

    def atomic_cas(orig: Callable) -> Callable:
        def cas(ptr, cmp, val, sem, scope):  # noqa: ANN001, ANN202
            launch = _current()
            if launch is not None:
                every = np.ones(ptr.data.shape, dtype=bool)
                launch.access(ptr, every, store=False)
                launch.access(ptr, every, store=True)
            return orig(ptr, cmp, val, sem, scope)
        return cas

    def grid_dim(orig: Callable) -> Callable:
        def set_grid_dim(nx, ny, nz):  # noqa: ANN001, ANN202
            launch = _current()
            if launch is not None:
                launch.programs = int(nx) * int(ny) * int(nz)
            return orig(nx, ny, nz)
        return set_grid_dim

    def flops_of(orig: Callable, per_element: int = 1, only: Any = None) -> Callable:
        def counted(*args):  # noqa: ANN002, ANN202
            out = orig(*args)
            launch = _current()
            if launch is not None and (only is None or args[-1] is only) and _floating(out):
                launch.flops += per_element * int(out.data.size)
            return out
        return counted

    def dot(orig: Callable) -> Callable:
        def create_dot(a, b, d, input_precision, max_num_imprecise_acc):  # noqa: ANN001, ANN202
            mode = getattr(input_precision, "name", str(input_precision)).upper()
            fp32 = a.get_element_ty() == it.tl.float32 and b.get_element_ty() == it.tl.float32
            if fp32 and mode == "TF32":  # what the tensor cores compute: operands at a 10-bit mantissa
                a = it.TensorHandle(round_to_tf32(a.data), a.dtype)
                b = it.TensorHandle(round_to_tf32(b.data), b.dtype)
            launch = _current()
            if launch is not None:
                work = _dot_work(np, a.data, b.data)
                if not fp32:
                    launch.half_flops += work
                elif mode == "IEEE":
                    launch.dot_flops += work
                else:  # TF32, or TF32x3 (three TF32 products)
                    launch.tf32_flops += work * (3 if mode == "TF32X3" else 1)
            return orig(a, b, d, input_precision, max_num_imprecise_acc)
        return create_dot

    def reduction(orig: Callable) -> Callable:
        def reduced(op_self, input, *rest, **kw):  # noqa: ANN001, ANN003, ANN202, A002
            launch = _current()
            value = input[0] if isinstance(input, tuple) else input
            if launch is not None and value.dtype.scalar.is_floating():
                launch.flops += int(value.handle.data.size)
            return orig(op_self, input, *rest, **kw)
        return reduced

    def run(orig: Callable) -> Callable:
        def launched(fn, *args, grid, warmup, **kwargs):  # noqa: ANN001, ANN202
            counter = _COUNTER
            if warmup or counter is None or not counter.active:
                return orig(fn, *args, grid=grid, warmup=warmup, **kwargs)
            launch = _Launch(getattr(fn, "__name__", "kernel"), _storages([*args, *kwargs.values()]))
            launch.gpu_programs = getattr(grid, "gpu", None)
            counter._launch = launch
            try:
                return orig(fn, *args, grid=grid, warmup=warmup, **kwargs)
            finally:
                counter._launch = None
                counter.launches.append(launch.cost())
        return launched

    wrap(builder, "create_masked_load", masked_load)
    wrap(builder, "create_masked_store", masked_store)
    wrap(builder, "create_atomic_rmw", atomic_rmw)
    wrap(builder, "create_atomic_cas", atomic_cas)
    wrap(builder, "set_grid_dim", grid_dim)
    wrap(builder, "create_dot", dot)
    for name in ("binary_op", "unary_op", "create_erf", "create_rsqrt", "create_fabs"):
        wrap(builder, name, flops_of)
    wrap(builder, "create_fma", lambda orig: flops_of(orig, per_element=2))
    wrap(builder, "ternary_op", lambda orig: flops_of(orig, only=np.clip))
    for cls, names in ((it.ReduceOps, ("sum", "min_max")), (it.ScanOps, ("cumsum", "cumprod"))):
        for name in names:
            wrap(cls, name, reduction)
    wrap(it.InterpretedFunction, "run", run)
    _INSTALLED = True


def _dot_work(np: Any, a: Any, b: Any) -> int:
    """2 * used rows * used columns * used depth of a (batched) tile product: the padding an edge tile carries
    (zeros from masked loads) is not the kernel's work, and a tiny problem's 16-wide minimum tile would count it."""
    nz_a, nz_b = a != 0, b != 0
    rows = nz_a.any(axis=-1).sum(axis=-1)
    cols = nz_b.any(axis=-2).sum(axis=-1)
    depth = (nz_a.any(axis=-2) | nz_b.any(axis=-1)).sum(axis=-1)
    return int(2 * np.sum(rows * cols * depth))


def _current() -> _Launch | None:
    counter = _COUNTER
    return counter._launch if counter is not None and counter.active else None


def _floating(handle: Any) -> bool:
    return handle is not None and hasattr(handle, "dtype") and handle.dtype.scalar.is_floating()


def _walk(values: list) -> list:
    """Tensors (and objects with a `base` tensor: TensorDescriptor, TensorWrapper) nested in launch or op args."""
    found = []
    for v in values:
        if isinstance(v, (tuple, list)):
            found += _walk(list(v))
        elif isinstance(v, dict):
            found += _walk(list(v.values()))
        elif hasattr(v, "data_ptr"):
            found.append(v)
        elif hasattr(v, "base"):
            found += _walk([v.base])
    return found


def _storages(values: list) -> list[tuple[int, int]]:
    """(address, bytes) of every distinct storage a launch received."""
    ranges = {}
    for t in _walk(values):
        base = getattr(t, "base", None) if not hasattr(t, "untyped_storage") else t
        storage = (base if base is not None else t).untyped_storage()
        if storage.data_ptr():
            ranges[storage.data_ptr()] = storage.nbytes()
    return sorted(ranges.items())


class _Launch:
    """One launch's counts; the byte maps span the storages it received, end to end."""

    def __init__(self, kernel: str, ranges: list[tuple[int, int]]) -> None:
        import numpy as np

        self.kernel = kernel
        self.programs = 1
        self.gpu_programs: Any = None
        self.loaded = self.stored = 0
        self.flops = self.dot_flops = self.tf32_flops = self.half_flops = 0
        self.lanes = self.active = 0
        self.bases = np.array([b for b, _ in ranges], dtype=np.uint64)
        self.sizes = np.array([n for _, n in ranges], dtype=np.uint64)
        self.offsets = np.concatenate([[0], np.cumsum(self.sizes)[:-1]]).astype(np.uint64) if ranges else self.sizes
        total = int(self.sizes.sum()) if ranges else 0
        self.read_map = np.zeros(total, dtype=bool)
        self.write_map = np.zeros(total, dtype=bool)

    def gpu_grid(self) -> int:
        """The programs a GPU launch takes: the count the launcher's grid declares (`_on_gpu`: the interpreter ran
        fewer, larger ones), at most one per active lane (a program that moves nothing does no work), else the
        programs that ran."""
        try:
            declared = int(self.gpu_programs)
        except (TypeError, ValueError):
            return self.programs
        return max(1, min(declared, max(self.programs, self.active)))

    def access(self, ptrs: Any, mask: Any, *, store: bool) -> None:
        import numpy as np

        width = max(1, ptrs.get_element_ty().primitive_bitwidth // 8)
        addrs = ptrs.data[np.broadcast_to(mask, ptrs.data.shape)] if np.ndim(ptrs.data) else (
            ptrs.data.reshape(1) if bool(np.all(mask)) else ptrs.data.reshape(0))
        moved = int(addrs.size) * width
        self.lanes += int(np.size(ptrs.data))
        self.active += int(addrs.size)
        if store:
            self.stored += moved
        else:
            self.loaded += moved
        if not addrs.size or not self.bases.size:
            return
        addrs = addrs.astype(np.uint64)
        idx = np.searchsorted(self.bases, addrs, side="right").astype(np.int64) - 1
        inside = idx >= 0
        idx = np.maximum(idx, 0)
        offset = addrs - np.minimum(self.bases[idx], addrs)
        inside &= (addrs >= self.bases[idx]) & (offset + np.uint64(width) <= self.sizes[idx])
        spot = (self.offsets[idx] + offset)[inside].astype(np.int64)
        target = self.write_map if store else self.read_map
        for k in range(width):
            target[spot + k] = True

    def cost(self) -> dict:
        return {"kernel": self.kernel, "programs": self.gpu_grid(), "loaded": self.loaded, "stored": self.stored,
                "unique_loaded": int(self.read_map.sum()), "unique_stored": int(self.write_map.sum()),
                "flops": self.flops * self.active // self.lanes if self.lanes else self.flops, "dot_flops": self.dot_flops, "tf32_flops": self.tf32_flops,
                "half_flops": self.half_flops}
