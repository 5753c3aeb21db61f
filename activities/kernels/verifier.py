"""Prove a candidate kernel against the reference: static checks, then two child processes
(reference `Model`, candidate `ModelNew`) that only write outputs, compared here.

The candidate never shares a process with the reference or with the comparison, runs under
resource limits with a timeout, in a throwaway directory, with the Triton interpreter on CPU.
Every trial set runs the task's own inputs and the same shapes redrawn from other distributions
(`_child.FAMILIES`); a failure names the family. Outputs that match are then checked against the
candidate child's provenance record: an output that depends on no buffer a Triton kernel wrote is a
torch-computed decoy (`_child.LaunchRecorder`; advisory, since it runs in the candidate's process:
the comparison here is the guarantee). A crash's report carries a bounded log excerpt with the
candidate's own file/line frames.
"""

from __future__ import annotations

import hashlib
import json
import math
import shutil
import tempfile
import threading
import time
from collections import OrderedDict
from collections.abc import Callable
from pathlib import Path
from typing import Any

from activities.kernels._child import FAMILIES, LAUNCHES_FILE
from activities.kernels._proc import MEMORY_LIMIT_BYTES, Child, spawn, wait_all
from activities.kernels.static_checks import static_check
from contracts.kernel_job import Mismatch, VerifierReport

__all__ = ["MEMORY_LIMIT_BYTES", "compare", "profile", "verify"]
MAX_MISMATCHES = 10
NOT_KERNEL_DERIVED = ("the output does not depend on any buffer a Triton kernel wrote in that forward call: "
                      "ModelNew computed it from its inputs with torch ops only (a kernel launched only on "
                      "other buffers is a decoy)")


class ChildFailed(Exception):
    """A child process crashed, timed out, or wrote no outputs; the message says which."""


def verify(
    task_source: str, candidate_source: str, *, timeout_s: float, seed: int = 0, trials: int = 2,
    heartbeat: Callable[[str], None] | None = None, gpu: bool = False,
) -> VerifierReport:
    beat = heartbeat or (lambda _msg: None)
    t0 = time.monotonic()
    static = static_check(candidate_source)
    durations = {"static": round(time.monotonic() - t0, 4)}
    if not static.ok:
        return VerifierReport(passed=False, reason="static check: " + "; ".join(static.reasons), static=static,
                              durations=durations)
    key = _reference_key(task_source, seed, trials)
    _load_torch_in_background()
    expected = _REFERENCE_CACHE.get(key)
    with tempfile.TemporaryDirectory(prefix="ff-verify-") as tmp:
        root = Path(tmp)
        children: dict[str, Child] = {}
        if expected is None:
            ref_dir = root / "reference"
            ref_dir.mkdir()
            (ref_dir / "task.py").write_text(task_source, encoding="utf-8")
            children["reference"] = _start(ref_dir, seed, trials, candidate=False, gpu=gpu, timeout_s=timeout_s)
        cand_dir = root / "candidate"
        cand_dir.mkdir()
        (cand_dir / "task.py").write_text(task_source, encoding="utf-8")
        (cand_dir / "candidate.py").write_text(candidate_source, encoding="utf-8")
        children["candidate"] = _start(cand_dir, seed, trials, candidate=True, gpu=gpu, timeout_s=timeout_s)
        try:
            wait_all(children, timeout_s, beat)
            _torch_loaded(beat)
        finally:  # an exception or a cancelled activity must not leave children running
            for child in children.values():
                child.kill()
        durations.update({k: round(c.elapsed, 3) for k, c in children.items()})
        if "reference" in children and children["reference"].error and children["candidate"].error:
            # a hostile candidate (a fork bomb) can starve its neighbour: the reference is blamed only alone
            shutil.rmtree(ref_dir)
            ref_dir.mkdir()
            (ref_dir / "task.py").write_text(task_source, encoding="utf-8")
            children["reference"] = _start(ref_dir, seed, trials, candidate=False, gpu=gpu, timeout_s=timeout_s)
            try:
                wait_all({"reference": children["reference"]}, timeout_s, beat)
            finally:
                children["reference"].kill()
            durations["reference_alone"] = round(children["reference"].elapsed, 3)
        ref_err = children["reference"].error if "reference" in children else None
        cand = children["candidate"]
        cand_err = cand.error
        if ref_err:
            return VerifierReport(passed=False, reason=f"reference failed: {ref_err}", static=static,
                                  durations=durations, log=children["reference"].log_excerpt)
        t1 = time.monotonic()
        try:
            if expected is None:
                expected = _load_outputs(root / "reference" / "out.pt")
                _REFERENCE_CACHE.put(key, expected)
        except ChildFailed as e:
            return VerifierReport(passed=False, reason=f"reference failed: {e}", static=static, durations=durations)
        families = list(FAMILIES)
        if cand_err:
            return VerifierReport(passed=False, reason=f"candidate {cand_err}", static=static, durations=durations,
                                  families=families, log=cand.log_excerpt)
        try:
            got = _load_outputs(cand_dir / "out.pt")
        except ChildFailed as e:
            return VerifierReport(passed=False, reason=str(e), static=static, durations=durations, families=families)
        reason, mismatches = compare(expected, got)
        family = _family_of(reason, mismatches)
        if not reason:
            reason, family = _not_kernel_derived(cand_dir / LAUNCHES_FILE)
        durations["compare"] = round(time.monotonic() - t1, 4)
    return VerifierReport(passed=not reason, reason=reason, mismatches=mismatches, static=static, durations=durations,
                          families=families, input_family=family if reason else "")


def profile(task_source: str, candidate_source: str, *, timeout_s: float, seed: int = 0,
            heartbeat: Callable[[str], None] | None = None) -> tuple[float | None, str]:
    """On a GPU, after verification passed: (reference median / candidate median, a note), timed in
    a child with `triton.testing.do_bench` (warm-up, then medians). A profiler failure is a note
    and no number; callers never call this on CPU (speed is not measurable there)."""
    with tempfile.TemporaryDirectory(prefix="ff-profile-") as tmp:
        root = Path(tmp)
        (root / "task.py").write_text(task_source, encoding="utf-8")
        (root / "candidate.py").write_text(candidate_source, encoding="utf-8")
        child = spawn("activities.kernels._child", root, ["--profile", "task.py", "times.json", str(seed), "candidate.py"],
                      gpu=True, timeout_s=timeout_s)
        try:
            error = wait_all({"profiler": child}, timeout_s, heartbeat or (lambda _m: None))["profiler"].error
        finally:
            child.kill()
        if error:
            return None, f"speed not measured: profiler {error}"
        try:
            times = json.loads((root / "times.json").read_text(encoding="utf-8"))
            ref, cand = float(times["reference_ms"]), float(times["candidate_ms"])
        except (OSError, ValueError, KeyError, TypeError) as e:
            return None, f"speed not measured: profiler output unreadable ({e})"
    if cand <= 0:
        return None, f"speed not measured: candidate time {cand} ms"
    return ref / cand, f"speedup {ref / cand:.2f}x (reference {ref:.4f} ms, candidate {cand:.4f} ms; do_bench medians)"


# --- torch in the worker ------------------------------------------------------------------------

_TORCH = threading.Thread(target=lambda: __import__("torch"), name="import-torch", daemon=True)
_TORCH_LOCK = threading.Lock()


def _load_torch_in_background() -> None:
    """The comparison needs torch in the worker; a fresh worker imports it while the children run, so the
    activity keeps heartbeating (a blocking import on a loaded machine can outlast the heartbeat timeout)."""
    with _TORCH_LOCK:
        if not _TORCH.is_alive() and _TORCH.ident is None:
            _TORCH.start()


def _torch_loaded(beat: Callable[[str], None]) -> None:
    while _TORCH.is_alive():
        beat("loading torch for the comparison")
        _TORCH.join(0.5)


# --- reference outputs cache ------------------------------------------------------------------


class _LRU:
    """Reference outputs by (task source, seed, trials): the reference is deterministic and trusted,
    so one run per worker process is enough. Thread-safe (activities run in a thread pool)."""

    def __init__(self, size: int = 32):
        self._size = size
        self._data: OrderedDict[str, list[list[Any]]] = OrderedDict()
        self._lock = threading.Lock()

    def get(self, key: str) -> list[list[Any]] | None:
        with self._lock:
            if key in self._data:
                self._data.move_to_end(key)
                return self._data[key]
            return None

    def put(self, key: str, value: list[list[Any]]) -> None:
        with self._lock:
            self._data[key] = value
            while len(self._data) > self._size:
                self._data.popitem(last=False)


_REFERENCE_CACHE = _LRU()


def _reference_key(task_source: str, seed: int, trials: int) -> str:
    return hashlib.sha256(f"{seed}:{trials}:{task_source}".encode()).hexdigest()


# --- child processes ------------------------------------------------------------------------


def _start(workdir: Path, seed: int, trials: int, *, candidate: bool, gpu: bool, timeout_s: float) -> Child:
    args = ["task.py", "out.pt", str(seed), str(trials)] + (["candidate.py"] if candidate else [])
    return spawn("activities.kernels._child", workdir, args, gpu=gpu, timeout_s=timeout_s)


def _load_outputs(path: Path) -> list[list[Any]]:
    import torch

    if not path.is_file():
        raise ChildFailed(f"{path.parent.name} wrote no outputs")
    try:
        data = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as e:  # noqa: BLE001 - anything unreadable is the child's fault
        raise ChildFailed(f"{path.parent.name} outputs unreadable: {type(e).__name__}: {e}") from e
    if not isinstance(data, list) or not all(isinstance(t, list) for t in data):
        raise ChildFailed(f"{path.parent.name} outputs have an unexpected structure")
    return data


def _not_kernel_derived(path: Path) -> tuple[str, str]:
    """("", "") when every output of every run depends on a Triton kernel's writes in its forward call;
    else the reason and the input family of the first run that does not."""
    try:
        missing = json.loads(path.read_text(encoding="utf-8"))["not_kernel_derived"]
        if not missing:
            return "", ""
        run, output = int(missing[0][0]), int(missing[0][1])
        return f"{_where(run, output)}: {NOT_KERNEL_DERIVED}", FAMILIES[run % len(FAMILIES)]
    except (OSError, ValueError, LookupError, TypeError) as e:
        return f"candidate launch record unreadable ({type(e).__name__})", ""


def _where(run: int, output: int) -> str:
    """`trial 1 (signed_normal inputs) output 0` for a run index (trial * len(FAMILIES) + family)."""
    return f"trial {run // len(FAMILIES)} ({FAMILIES[run % len(FAMILIES)]} inputs) output {output}"


def _family_of(reason: str, mismatches: list[Mismatch]) -> str:
    if mismatches:
        return mismatches[0].family
    for family in FAMILIES:
        if f"({family} inputs)" in reason:
            return family
    return ""


# --- comparison -----------------------------------------------------------------------------


def tolerance(dtype: Any) -> float:
    import torch

    return 1e-2 if dtype in (torch.float16, torch.bfloat16) else 1e-4


def compare(expected: list[list[Any]], got: list[list[Any]]) -> tuple[str, list[Mismatch]]:
    """Empty reason when every trial's outputs match; otherwise the first problem and up to 10 mismatches."""
    import torch

    if len(expected) != len(got):
        return f"ran {len(got)} forward calls, expected {len(expected)}", []
    for run, (exp_outs, got_outs) in enumerate(zip(expected, got)):
        if len(exp_outs) != len(got_outs):
            return f"{_where(run, 0).rsplit(' output', 1)[0]}: forward returned {len(got_outs)} outputs, " \
                   f"expected {len(exp_outs)}", []
        for i, (e, g) in enumerate(zip(exp_outs, got_outs)):
            where = _where(run, i)
            if not isinstance(g, torch.Tensor):
                return f"{where}: not a tensor ({type(g).__name__})", []
            if tuple(e.shape) != tuple(g.shape):
                return f"{where}: wrong shape {tuple(g.shape)}, expected {tuple(e.shape)}", []
            if e.dtype != g.dtype:
                return f"{where}: wrong dtype {g.dtype}, expected {e.dtype}", []
            reason, mismatches = _compare_values(e, g, run, i, where)
            if reason:
                return reason, mismatches
    return "", []


def _compare_values(e: Any, g: Any, run: int, output: int, where: str) -> tuple[str, list[Mismatch]]:
    import torch

    atol = tol = 0.0
    if not (e.is_floating_point() or e.is_complex()):
        bad = e != g
    else:
        tol = tolerance(e.dtype)
        ef, gf = e.to(torch.float64), g.to(torch.float64)
        e_nan, g_nan = torch.isnan(ef), torch.isnan(gf)
        e_inf, g_inf = torch.isinf(ef), torch.isinf(gf)
        special = e_nan | g_nan | e_inf | g_inf
        bad_special = (e_nan != g_nan) | (e_inf != g_inf) | (e_inf & g_inf & (torch.sign(ef) != torch.sign(gf)))
        atol = tol * _scale(ef, special)
        close = torch.isclose(ef, gf, rtol=tol, atol=atol)
        bad = bad_special | (~special & ~close)
        if bool(bad_special.any()):
            n_nan = int((g_nan & ~e_nan).sum())
            n_inf = int((g_inf & ~e_inf).sum())
            what = f"{n_nan} unexpected NaN, {n_inf} unexpected Inf" if (n_nan or n_inf) else "NaN/Inf positions differ"
            return f"{where}: {what}", _mismatches(e, g, bad_special, run, output)
    n_bad = int(bad.sum())
    if n_bad:
        total = e.numel()
        if not tol:
            return f"{where}: {n_bad}/{total} elements differ", _mismatches(e, g, bad, run, output)
        return (f"{where}: {n_bad}/{total} elements differ beyond rtol={tol:g}, atol={atol:.3g}",
                _mismatches(e, g, bad, run, output))
    return "", []


def _scale(ef: Any, special: Any) -> float:
    """The output's largest finite magnitude, at least 1: atol scales with it, because a reduction's
    rounding error grows with the magnitude of its terms (a dot product of 100x inputs cancels to
    values near 0 whose absolute error is not near 0), while rtol alone would demand more than fp32 holds."""
    finite = ef[~special]
    return max(1.0, float(finite.abs().max())) if finite.numel() else 1.0


def _mismatches(e: Any, g: Any, bad: Any, run: int, output: int) -> list[Mismatch]:
    idx = bad.nonzero()[:MAX_MISMATCHES]
    out = []
    for row in idx.tolist():
        ev, gv = e[tuple(row)].item(), g[tuple(row)].item()
        out.append(Mismatch(trial=run // len(FAMILIES), family=FAMILIES[run % len(FAMILIES)], output=output,
                            index=row, expected=_num(ev), got=_num(gv)))
    return out


def _num(v: Any) -> float | str:
    f = float(v.real if isinstance(v, complex) else v)
    return f if math.isfinite(f) else str(f)  # "nan"/"inf": JSON has no NaN
