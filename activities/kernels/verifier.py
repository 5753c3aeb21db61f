"""Prove a candidate kernel against the reference: static checks, then two child processes
(reference `Model`, candidate `ModelNew`) that only write outputs, compared here (and, for a GPU the job
targets, a third beside them: `gpu_compile`'s check, which counts for a right candidate only).

The candidate never shares a process with the reference or with the comparison, runs under
resource limits with a timeout, in a throwaway directory, with the Triton interpreter on CPU.
Every trial set runs the task's own inputs and the same shapes redrawn from other distributions
(`_child.FAMILIES`); a failure names the family. Given held-out sizes, both children then run the task
at those sizes too (a kernel that assumes the sample's sizes fails there); without them the report
says "verified at its own shapes only". Outputs that match are then checked against the candidate
child's provenance record: a compute op torch ran in forward outside the Triton launches means torch
did the work (`torch_work`: named with the candidate's line, rejected unless the workflow allows
mixed kernels), and an output that depends on no buffer a Triton kernel wrote is a torch-computed decoy
(`_child.LaunchRecorder`; advisory, since it runs in the candidate's process: the comparison here is
the guarantee). A crash's report carries a bounded log excerpt with the candidate's own file/line frames.

Time: the candidate may take `TimeLimit.for_reference` of the reference child's own time on the same runs (a
multiple of it, with a floor and a ceiling); both children start together, and until the reference is done
the candidate's limit is the ceiling. A candidate past its limit is rejected with a reason that names the
limit and the reference's time: a verdict about the candidate, never the worker's failure.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import math
import shutil
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NamedTuple

from activities.kernels._child import (
    FAMILIES,
    HELD_OUT_ERROR_FILE,
    HELD_OUT_FAMILIES,
    HELD_OUT_FILE,
    LAUNCHES_FILE,
    PROGRESS_FILE,
    SPECIAL,
    SPECIAL_ERROR_FILE,
    SPECIAL_EVERY,
    SPECIAL_FILE,
    TRAFFIC_FILE,
)
from activities.kernels import gpu_compile
from activities.kernels._proc import MEMORY_LIMIT_BYTES, Child, require_kernel_packages, spawn, wait_all
from activities.kernels.gpus import GpuSpec
from activities.kernels.held_out import OWN_SHAPES_ONLY
from activities.kernels.lru import LRU
from activities.kernels.precision import tf32_problem, tolerance
from activities.kernels.static_checks import static_check
from activities.kernels.task_source import apply_overrides
from activities.kernels.torch_work import torch_work
from activities.kernels.traffic import require_hooked_triton
from activities.scratch import Scratch
from contracts.errors import Err, FleetforgeError
from contracts.kernel import Number, PrecisionPolicy, TimeLimit
from contracts.kernel_job import AS_TORCH, GpuCompileCheck, KernelTiming, LaunchCost, Mismatch, TorchOpUse, VerifierReport

__all__ = ["MEMORY_LIMIT_BYTES", "compare", "profile", "timing_from", "verify"]
MAX_MISMATCHES = 10
NOT_KERNEL_DERIVED = ("the output does not depend on any buffer a Triton kernel wrote in that forward call: "
                      "ModelNew computed it from its inputs with torch ops only (a kernel launched only on "
                      "other buffers is a decoy)")


class ChildFailed(Exception):
    """A child process crashed, timed out, or wrote no outputs; the message says which."""


def verify(
    task_source: str, candidate_source: str, *, timeout_s: float = 120.0, time_limit: TimeLimit | None = None,
    seed: int = 0, trials: int = 2, heartbeat: Callable[[str], None] | None = None, gpu: bool = False,
    held_out: dict[str, Number] | None = None, held_out_note: str = "", reference_ops: list[str] | None = None,
    allow_mixed: bool = False, precision: PrecisionPolicy = PrecisionPolicy.STRICT,
    costs: list[LaunchCost] | None = None, compile_for: GpuSpec | None = None,
) -> VerifierReport:
    """The verdict on `candidate_source`. `time_limit`: the candidate's, from the reference's time (without
    it, a fixed `timeout_s` per child); `held_out`: task constants for a second size set both children also
    run (the candidate must be right there too); `reference_ops`: the reference's traced aten ops (named first
    when torch computed them); `allow_mixed`: torch may do part of the work (named in the report, not rejected);
    `precision`: the job's policy (tolerance, TF32). `costs`, when given, receives what the interpreter counted
    per launch of the candidate's first forward call (the cost model's input; empty on a GPU). `compile_for`: on
    the interpreter, the GPU a candidate right on every run must also compile for (`gpu_compile`; a kernel the GPU
    compiler refuses is rejected, with the compiler's message). A worker without
    torch or triton, `gpu` on a machine without a GPU and, on the interpreter, a Triton other than the hooked
    releases raise VERIFIER_ERROR: the machine's fault, never a verdict."""
    require_kernel_packages()
    if gpu:
        _require_gpu()
    else:
        require_hooked_triton()
    beat = heartbeat or (lambda _msg: None)
    limit = time_limit or TimeLimit.fixed(timeout_s)
    ceiling = limit.ceiling_s
    t0 = time.monotonic()
    static = static_check(candidate_source, task_source)
    durations = {"static": round(time.monotonic() - t0, 4)}
    if not static.ok:
        return VerifierReport(passed=False, reason="static check: " + "; ".join(static.reasons), static=static,
                              durations=durations)
    held_source = apply_overrides(task_source, held_out, "the task") if held_out else ""
    key = _reference_key(task_source + held_source, seed, trials, precision)
    _load_torch_in_background()
    cached = _REFERENCE_CACHE.get(key)
    with Scratch("verify") as root, contextlib.ExitStack() as running:
        compiled = None if gpu or compile_for is None else _CompileCheck.start(root, compile_for, task_source,
                                                                                candidate_source)
        if compiled is not None:
            running.callback(compiled.stop)  # whatever the verdict, nothing of the candidate outlives it
        children: dict[str, Child] = {}
        if cached is None:
            ref_dir = root / "reference"
            ref_dir.mkdir()
            _write_task(ref_dir, task_source, held_source)
            children["reference"] = _start(ref_dir, seed, trials, candidate=False, held=bool(held_source), gpu=gpu,
                                           timeout_s=ceiling, precision=precision)
        cand_dir = root / "candidate"
        cand_dir.mkdir()
        _write_task(cand_dir, task_source, held_source)
        (cand_dir / "candidate.py").write_text(candidate_source, encoding="utf-8")
        children["candidate"] = _start(cand_dir, seed, trials, candidate=True, held=bool(held_source), gpu=gpu,
                                       timeout_s=ceiling, precision=precision)

        def reference_s() -> float | None:
            """The reference's time on these runs: cached, measured alone, or measured beside the candidate."""
            if cached is not None:
                return cached.seconds
            ref = children["reference"]
            return round(ref.elapsed, 3) if ref.exit_code == 0 else None

        def limit_of(name: str) -> float:
            seconds = reference_s() if name == "candidate" else None
            return limit.for_reference(seconds) if seconds is not None else ceiling

        try:
            wait_all(children, ceiling, beat, limit=limit_of)
            _torch_loaded(beat)
        finally:  # an exception or a cancelled activity must not leave children running
            for child in children.values():
                child.kill()
        durations.update({k: round(c.elapsed, 3) for k, c in children.items()})
        reference_failed = "reference" in children and children["reference"].error
        twin = compiled is not None and compiled.child is not None  # the candidate's code ran there too
        if twin and (children["candidate"].error or reference_failed):
            compiled.stop()  # its answer counts for a right candidate only, and it must not starve a rerun
        if reference_failed and (children["candidate"].error or twin):
            # a hostile candidate (a fork bomb, here or in its compile check) can starve its neighbour: the
            # reference is blamed only alone
            shutil.rmtree(ref_dir)
            ref_dir.mkdir()
            _write_task(ref_dir, task_source, held_source)
            children["reference"] = _start(ref_dir, seed, trials, candidate=False, held=bool(held_source), gpu=gpu,
                                           timeout_s=ceiling, precision=precision)
            try:
                wait_all({"reference": children["reference"]}, ceiling, beat)
            finally:
                children["reference"].kill()
            durations["reference_alone"] = round(children["reference"].elapsed, 3)
        ref_err = children["reference"].error if "reference" in children else None
        cand = children["candidate"]
        if ref_err:
            if children["reference"].timed_out:
                ref_err += (f": the reference may take the time limit's ceiling ({limit.text}); raise "
                            "verifier.time_limit.ceiling_s or make the task smaller")
            return VerifierReport(passed=False, reason=f"reference failed: {ref_err}", static=static,
                                  durations=durations, log=children["reference"].log_excerpt)
        t1 = time.monotonic()
        try:
            if cached is None:
                measured = round(children["reference"].elapsed, 3)
                cached = _Reference(*_reference_outputs(root / "reference", bool(held_source)),
                                    special=_special(root / "reference"), seconds=measured)
                _REFERENCE_CACHE.put(key, cached)
        except ChildFailed as e:
            return VerifierReport(passed=False, reason=f"reference failed: {e}", static=static, durations=durations)
        expected, expected_held, held_error = cached.outputs, cached.held_outputs, cached.held_error
        timing = dict(time_limit_s=limit.for_reference(cached.seconds), reference_s=cached.seconds)
        sizes = _sizes(held_out or {})
        if not held_source:
            note = held_out_note if held_out_note.startswith(OWN_SHAPES_ONLY) else \
                f"{OWN_SHAPES_ONLY}: {held_out_note or 'no held-out sizes were given'}"
        elif expected_held is None:
            note = f"{OWN_SHAPES_ONLY}: the reference failed at the held-out sizes {sizes} ({held_error})"
        else:
            note = ""
        checked = {} if note else dict(held_out or {})
        base = dict(static=static, durations=durations, families=list(FAMILIES), held_out=checked, shapes_note=note,
                    **timing)
        in_held_phase = bool(held_source) and (cand_dir / "out.pt").is_file()
        failed, special_failure = cand.error, None  # why the candidate has no special outputs ("": never ran)
        if failed and _phase(cand_dir / PROGRESS_FILE) == SPECIAL:  # every finite run is written: judge those
            failed, special_failure = None, f"the candidate {failed}"
        elif failed:
            special_failure = ""
        if failed and not (in_held_phase and not checked):  # not checked: the reference failed there too
            at = f" at the held-out sizes {sizes}" if in_held_phase else ""
            slow = (f"{_progress(cand_dir / PROGRESS_FILE, in_held_phase)}: its time limit is {limit.text}, and the reference took "
                    f"{cached.seconds:.1f} s on the same runs" if cand.timed_out else "")
            return VerifierReport(passed=False, reason=f"candidate {failed}{at}{slow}", log=cand.log_excerpt,
                                  timed_out=cand.timed_out, **base)
        try:
            got = _load_outputs(cand_dir / "out.pt")
            got_held = _load_outputs(cand_dir / HELD_OUT_FILE) if checked else None
        except ChildFailed as e:
            return VerifierReport(passed=False, reason=str(e), **base)
        reason, mismatches = compare(expected, got, precision=precision)
        if not reason and expected_held is not None and got_held is not None:
            reason, mismatches = compare(expected_held, got_held, families=HELD_OUT_FAMILIES, held_out=sizes,
                                         precision=precision)
        if mismatches and " elements differ beyond " in reason:  # the fp32 reference may be the inaccurate one
            truth = _float64_reference(root, task_source, held_source if checked else "", seed, trials, gpu,
                                       limit.for_reference(cached.seconds), precision, beat)
            if truth is not None:
                reason, mismatches, accuracy_note = _arbitrate(truth, (expected, expected_held), (got, got_held),
                                                               sizes, precision, reason, mismatches)
                base["accuracy_note"] = accuracy_note
        counted = _launch_costs(cand_dir / TRAFFIC_FILE)
        if costs is not None:
            costs[:] = counted
        if policy := tf32_problem(counted, precision):  # the cause first: the interpreter rounds like the GPU
            reason = policy + (f" (so: {reason})" if reason else "")
        family = _family_of(reason, mismatches)
        torch_ops: list[TorchOpUse] = []
        if not reason:
            reason, family, torch_ops = _provenance(cand_dir / LAUNCHES_FILE, reference_ops or [], allow_mixed,
                                                    held_out=sizes if checked else "")
        durations["compare"] = round(time.monotonic() - t1, 4)
        if not reason and compiled is not None:
            t2 = time.monotonic()
            base["gpu_compile"] = check = compiled.result(beat)
            durations["gpu_compile"] = round(time.monotonic() - t2, 3)
            if check.compiles is False:
                reason = (f"{check.summary}. The CPU interpreter ran it, but {compile_for.name} would not: "
                          "the interpreter accepts what the GPU compiler refuses")
        if not reason:
            got_special = _special(cand_dir) if special_failure is None else _Special(None, special_failure)
            base["special_values"] = _special_note(cached.special, got_special, precision)
    return VerifierReport(passed=not reason, reason=reason, mismatches=mismatches, input_family=family if reason else "",
                          torch_ops=torch_ops, **base)


@dataclass
class _CompileCheck:
    """`gpu_compile`'s check of one candidate, once per task, candidate and GPU (the optimizer and the conductor
    verify the same candidate again). Its child needs only the sources, so it starts beside the verification's
    children: a right candidate's check is mostly done by the time its verdict is (on 2026-11-29, relu's first
    verification took 5.6 s with the check after the children, 2.9 s of it the check)."""

    gpu: GpuSpec
    key: str
    known: GpuCompileCheck | None
    """From the cache, or once `result` has it."""
    folder: Path | None = None
    child: Child | None = None
    stopped: bool = False

    @classmethod
    def start(cls, root: Path, gpu: GpuSpec, task_source: str, candidate_source: str) -> _CompileCheck:
        key = hashlib.sha256(f"{gpu.name}:{task_source}:{candidate_source}".encode()).hexdigest()
        if (known := _COMPILE_CACHE.get(key)) is not None:
            return cls(gpu, key, known)
        folder = root / "compile"
        folder.mkdir()
        _write_task(folder, task_source, "")
        (folder / "candidate.py").write_text(candidate_source, encoding="utf-8")
        return cls(gpu, key, None, folder, gpu_compile.start(folder, gpu))

    def result(self, beat: Callable[[str], None]) -> GpuCompileCheck:
        if self.known is None:
            assert self.folder is not None and self.child is not None
            if self.stopped:  # stopped for a reference run alone, which then passed: the check is still owed
                self.child, self.stopped = gpu_compile.start(self.folder, self.gpu), False
            beat(f"compiling the kernels for {gpu_compile.target(self.gpu)}")
            self.known = gpu_compile.result(self.folder, self.gpu, self.child, beat)
            if self.known.compiles is not None:  # an open answer (a child that failed) may be the machine's: asked again
                _COMPILE_CACHE.put(self.key, self.known)
        return self.known

    def stop(self) -> None:
        """Kill the check's child unless it is already over (stopped, or its result read: `wait_all` reaped it)."""
        if self.child is not None and not self.stopped and self.known is None:
            self.child.kill()
            self.stopped = True


def profile(task_source: str, candidate_source: str, *, timeout_s: float, seed: int = 0,
            heartbeat: Callable[[str], None] | None = None,
            precision: PrecisionPolicy = PrecisionPolicy.STRICT) -> tuple[KernelTiming | None, str]:
    """On a GPU, after verification passed: the candidate, eager and `torch.compile` timings and a note,
    taken in a sandboxed child with `triton.testing.do_bench`, the baselines under the same precision policy
    as the candidate. A profiler failure is a note and no timing; callers never call this on CPU (speed is not
    measurable there: the cost model's modeled figures stand instead)."""
    with Scratch("profile") as root:
        (root / "task.py").write_text(task_source, encoding="utf-8")
        (root / "candidate.py").write_text(candidate_source, encoding="utf-8")
        child = spawn("activities.kernels._child", root, ["--profile", "task.py", "times.json", str(seed), "candidate.py",
                                                          "--precision", precision.value], gpu=True, timeout_s=timeout_s)
        try:
            error = wait_all({"profiler": child}, timeout_s, heartbeat or (lambda _m: None))["profiler"].error
        finally:
            child.kill()
        if error:
            return None, f"speed not measured: profiler {error}"
        try:
            times = json.loads((root / "times.json").read_text(encoding="utf-8"))
        except (OSError, ValueError) as e:
            return None, f"speed not measured: profiler output unreadable ({e})"
    return timing_from(times)


def timing_from(times: dict) -> tuple[KernelTiming | None, str]:
    """The profiler's `{candidate_ms, eager_ms, compile_ms, *_error}` as a timing against the faster
    baseline, and its note; no timing when the candidate or the eager reference has no usable time."""
    def ms(name: str) -> float | None:
        value = times.get(name)
        return float(value) if isinstance(value, (int, float)) and math.isfinite(value) and value > 0 else None

    for name, label in (("candidate_ms", "candidate"), ("eager_ms", "reference")):
        if ms(name) is None:
            why = times.get(f"{name}_error") or f"time {times.get(name)!r}"
            return None, f"speed not measured: the {label} could not be timed ({why})"
    cand, eager, compiled = ms("candidate_ms"), ms("eager_ms"), ms("compile_ms")
    assert cand is not None and eager is not None
    baseline, ref = ("torch.compile", compiled) if compiled is not None and compiled < eager else ("eager", eager)
    timing = KernelTiming(candidate_ms=cand, eager_ms=eager, compile_ms=compiled, baseline=baseline, ref_ms=ref,
                          compile_error=str(times.get("compile_ms_error") or ""))
    return timing, timing.summary


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


class _Reference(NamedTuple):
    outputs: list[list[Any]]
    held_outputs: list[list[Any]] | None
    """At the held-out sizes (None when none ran or the reference failed there)."""
    held_error: str
    """Why the reference failed at the held-out sizes."""
    special: _Special
    seconds: float
    """The reference child's time on these runs (the candidate's time limit is a multiple of it)."""


_REFERENCE_CACHE: LRU[_Reference] = LRU()
"""Reference outputs by (task source and held-out source, seed, trials, precision)."""
_COMPILE_CACHE: LRU[GpuCompileCheck] = LRU(128)
"""GPU compile checks by (GPU, task source, candidate source)."""


def _reference_key(task_source: str, seed: int, trials: int, precision: PrecisionPolicy) -> str:
    return hashlib.sha256(f"{seed}:{trials}:{precision.value}:{task_source}".encode()).hexdigest()


# --- child processes ------------------------------------------------------------------------


def _require_gpu() -> None:
    """A GPU target on a worker without one is the worker's problem, never the candidate's."""
    import torch

    if not torch.cuda.is_available():
        raise FleetforgeError(Err.VERIFIER_ERROR, "the job's arch needs a GPU, and this kernels worker has none: run a "
                                                  "kernels worker on a GPU machine, or use --arch cpu-interpreter")


def _start(workdir: Path, seed: int, trials: int, *, candidate: bool, held: bool, gpu: bool, timeout_s: float,
           precision: PrecisionPolicy, float64: bool = False) -> Child:
    args = ["task.py", "out.pt", str(seed), str(trials)] + (["candidate.py"] if candidate else [])
    args += ["--held-out", "held_out_task.py"] if held else []
    args += ["--float64"] if float64 else []
    args += ["--precision", precision.value]
    return spawn("activities.kernels._child", workdir, args, gpu=gpu, timeout_s=timeout_s)


def _write_task(folder: Path, task_source: str, held_source: str) -> None:
    (folder / "task.py").write_text(task_source, encoding="utf-8")
    if held_source:
        (folder / "held_out_task.py").write_text(held_source, encoding="utf-8")


class _Special(NamedTuple):
    """A child's SPECIAL run: its outputs, or why it has none ("" when it never got there)."""
    outputs: list[list[Any]] | None
    error: str


def _special(folder: Path) -> _Special:
    if (error := folder / SPECIAL_ERROR_FILE).is_file():
        return _Special(None, error.read_text(encoding="utf-8", errors="replace")[:300])
    try:
        return _Special(_load_outputs(folder / SPECIAL_FILE), "")
    except ChildFailed as e:
        return _Special(None, str(e))


def _special_note(expected: _Special, got: _Special, precision: PrecisionPolicy) -> str:
    """The report's `special_values`: a passing candidate's SPECIAL run against the reference's."""
    if expected.outputs is None:
        return f"not checked on NaN/Inf inputs: the reference fails on them ({expected.error})"
    if got.outputs is None:
        return (f"fails on NaN/Inf inputs, where the reference does not: {got.error}" if got.error else
                "not checked on NaN/Inf inputs: the candidate stopped before them")
    reason, _ = compare(expected.outputs, got.outputs, families=(SPECIAL,), precision=precision)
    if reason:
        return f"differs from torch on NaN/Inf inputs: {reason}"
    return f"{AS_TORCH} (1 input element in {SPECIAL_EVERY} NaN, +Inf or -Inf)"


def _reference_outputs(folder: Path, held: bool) -> tuple[list[list[Any]], list[list[Any]] | None, str]:
    """The reference child's outputs; at the held-out sizes too, or why the task failed there."""
    expected = _load_outputs(folder / "out.pt")
    if not held:
        return expected, None, ""
    error_file = folder / HELD_OUT_ERROR_FILE
    if error_file.is_file():
        return expected, None, error_file.read_text(encoding="utf-8", errors="replace")[:300]
    return expected, _load_outputs(folder / HELD_OUT_FILE), ""


def _progress(path: Path, held: bool) -> str:
    """How far a child that ran out of time got in its phase (the task's sizes, or `held` the held-out ones):
    `, after 3 of 8 forward calls (the last ended at 412 s)`."""
    first = ", before its first forward call ended"
    try:
        done = json.loads(path.read_text(encoding="utf-8"))
        if (done["phase"] == "held_out") != held:
            return first
        return f", after {int(done['done'])} of {int(done['total'])} forward calls (the last ended at " \
               f"{float(done['seconds']):.0f} s)"
    except FileNotFoundError:
        return first
    except (OSError, ValueError, LookupError, TypeError):
        return ""


def _phase(path: Path) -> str:
    """The phase a child was in when it last wrote PROGRESS_FILE ("" when unknown)."""
    try:
        return str(json.loads(path.read_text(encoding="utf-8"))["phase"])
    except (OSError, ValueError, LookupError, TypeError):
        return ""


def _sizes(held_out: dict[str, Number]) -> str:
    return "(" + ", ".join(f"{k}={v}" for k, v in held_out.items()) + ")"


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


def _provenance(path: Path, reference_ops: list[str], allow_mixed: bool, *,
                held_out: str) -> tuple[str, str, list[TorchOpUse]]:
    """After the numbers matched: the reason torch did the work (unless mixed kernels are allowed), else the
    first output that depends on no Triton kernel's writes ("" when every one does), with its input family,
    and the torch ops the candidate's forward computed."""
    try:
        record = json.loads(path.read_text(encoding="utf-8"))
        used = [TorchOpUse.model_validate(u) for u in record.get("torch_ops", [])]
        reason, flagged = torch_work(used, reference_ops)
        if reason and not allow_mixed:
            return reason, "", flagged
        for key, families, where in (("not_kernel_derived", FAMILIES, ""),
                                     ("held_out_not_kernel_derived", HELD_OUT_FAMILIES, held_out)):
            missing = record.get(key, [])
            if missing:
                run, output = int(missing[0][0]), int(missing[0][1])
                return (f"{_where(run, output, families, where)}: {NOT_KERNEL_DERIVED}",
                        families[run % len(families)], flagged)
        return "", "", flagged
    except (OSError, ValueError, LookupError, TypeError) as e:
        return f"candidate launch record unreadable ({type(e).__name__})", "", []


def _launch_costs(path: Path) -> list[LaunchCost]:
    """The candidate child's per-launch counts (none on a GPU, or when the child wrote none); an unreadable
    record is no counts, never a verdict: the modeled speed is then missing, and says so."""
    try:
        return [LaunchCost.model_validate(c) for c in json.loads(path.read_text(encoding="utf-8"))]
    except (OSError, ValueError, TypeError):
        return []


def _where(run: int, output: int, families: tuple[str, ...] = FAMILIES, held_out: str = "") -> str:
    """`trial 1 (signed_normal inputs) output 0` for a run index (trial * len(families) + family), prefixed
    with `at the held-out sizes (...)` for a held-out run."""
    at = f"at the held-out sizes {held_out}: " if held_out else ""
    return f"{at}trial {run // len(families)} ({families[run % len(families)]} inputs) output {output}"


def _family_of(reason: str, mismatches: list[Mismatch]) -> str:
    if mismatches:
        return mismatches[0].family
    for family in FAMILIES:
        if f"({family} inputs)" in reason:
            return family
    return ""


# --- comparison -----------------------------------------------------------------------------


REFERENCE_ERROR_ALLOWANCE = 2.0
"""How many times the fp32 reference's own error (against float64) a candidate may be off, on an output where the
fp32 results disagree: two correct kernels that sum in another order err by the same order of magnitude."""
UNJUDGEABLE = 1e-2
"""An output whose fp32 reference is off from float64 by more than this times its scale (fewer than two right digits:
KernelBench's own tolerance) judges nothing: it is left out of the float64 check and named in the note, and a
candidate with no output left to judge is not verified (ill-conditioned at these sizes)."""


def _float64_reference(root: Path, task_source: str, held_source: str, seed: int, trials: int, gpu: bool,
                       timeout_s: float, precision: PrecisionPolicy,
                       beat: Callable[[str], None]) -> tuple[list[list[Any]], list[list[Any]] | None] | None:
    """The reference's outputs computed in float64 on the same inputs, or None when the task cannot run in
    float64 (then the fp32 comparison's verdict stands)."""
    folder = root / "reference-float64"
    folder.mkdir()
    _write_task(folder, task_source, held_source)
    child = _start(folder, seed, trials, candidate=False, held=bool(held_source), gpu=gpu, timeout_s=timeout_s,
                   precision=precision, float64=True)
    try:
        wait_all({"reference-float64": child}, timeout_s, beat)
    finally:
        child.kill()
    if child.error:
        return None
    try:
        outputs, held, _ = _reference_outputs(folder, bool(held_source))
    except ChildFailed:
        return None
    return outputs, held


def _arbitrate(truth: tuple[list[list[Any]], list[list[Any]] | None],
               expected: tuple[list[list[Any]], list[list[Any]] | None],
               got: tuple[list[list[Any]], list[list[Any]] | None], sizes: str, precision: PrecisionPolicy,
               reason: str, mismatches: list[Mismatch]) -> tuple[str, list[Mismatch], str]:
    """After an fp32 mismatch: the candidate passes when each output is within the tolerance of the float64
    result, its atol grown by REFERENCE_ERROR_ALLOWANCE times the fp32 reference's own largest error on that output
    (as accurate as PyTorch's fp32 there, give or take a rounding order). A task that is ill-conditioned at its
    sizes (training-mode BatchNorm over 2 samples at 1x1) otherwise rejects every kernel that rounds differently
    from PyTorch; a well-conditioned input family leaves the allowance near 0, so a wrong kernel still fails there."""
    import torch

    worst = max((float((e.double() - t).abs().max()) for runs, truths in zip(expected, truth) if runs and truths
                 for outs, touts in zip(runs, truths) for e, t in zip(outs, touts)
                 if isinstance(e, torch.Tensor) and e.is_floating_point() and e.shape == t.shape), default=0.0)
    unjudged: list[str] = []
    judged = [0]
    new_reason, new_mismatches = compare(truth[0], got[0], precision=precision, widen=expected[0],
                                         unjudged=unjudged, judged=judged)
    if not new_reason and truth[1] is not None and got[1] is not None and expected[1] is not None:
        new_reason, new_mismatches = compare(truth[1], got[1], families=HELD_OUT_FAMILIES, held_out=sizes,
                                             precision=precision, widen=expected[1], unjudged=unjudged, judged=judged)
    left_out = (f"; {len(unjudged)} output(s) judge nothing, the fp32 reference there off by more than "
                f"{UNJUDGEABLE:g} of the output's scale: {', '.join(unjudged[:3])}" + (" ..." if len(unjudged) > 3 else "")
                ) if unjudged else ""
    if new_reason:
        return reason, mismatches, (f"the float64 reference agrees with the fp32 one: the candidate is off by more "
                                    f"than the fp32 reference's own error (at most {worst:.3g}): against float64, "
                                    f"{new_reason}{left_out}")
    if not judged[0]:
        return (f"ill-conditioned at these sizes: {reason}, and on every output the fp32 reference itself is off "
                f"from float64 by more than {UNJUDGEABLE:g} of its scale (up to {worst:.3g}), so no output can judge "
                "the candidate: verify the task at sizes where PyTorch's fp32 result is accurate"), mismatches, left_out[2:]
    return "", [], (f"checked against the reference in float64: the fp32 reference is itself off by up to {worst:.3g} "
                    f"on these inputs ({reason}); the candidate is within the tolerance of the float64 result, "
                    f"each output's atol grown by {REFERENCE_ERROR_ALLOWANCE:g}x the fp32 reference's own error there"
                    f"{left_out}")


def compare(expected: list[list[Any]], got: list[list[Any]], *, families: tuple[str, ...] = FAMILIES,
            held_out: str = "", precision: PrecisionPolicy = PrecisionPolicy.STRICT,
            widen: list[list[Any]] | None = None, unjudged: list[str] | None = None,
            judged: list[int] | None = None) -> tuple[str, list[Mismatch]]:
    """Empty reason when every trial's outputs match within the precision policy's tolerance; otherwise the first
    problem and up to 10 mismatches. `held_out` (the sizes, for people) marks runs at the held-out sizes.
    `widen` (the fp32 reference, when `expected` is its float64 twin): each output's atol grows by
    REFERENCE_ERROR_ALLOWANCE times the fp32 reference's largest error on it; dtypes are compared as the fp32
    reference's; an output where that error is above UNJUDGEABLE of its scale is skipped and named in `unjudged`
    (`judged[0]` counts the others)."""
    import torch

    if len(expected) != len(got):
        return f"ran {len(got)} forward calls, expected {len(expected)}", []
    for run, (exp_outs, got_outs) in enumerate(zip(expected, got)):
        if len(exp_outs) != len(got_outs):
            return f"{_where(run, 0, families, held_out).rsplit(' output', 1)[0]}: forward returned " \
                   f"{len(got_outs)} outputs, expected {len(exp_outs)}", []
        for i, (e, g) in enumerate(zip(exp_outs, got_outs)):
            where = _where(run, i, families, held_out)
            if not isinstance(g, torch.Tensor):
                return f"{where}: not a tensor ({type(g).__name__})", []
            if tuple(e.shape) != tuple(g.shape):
                return f"{where}: wrong shape {tuple(g.shape)}, expected {tuple(e.shape)}", []
            slack = widen[run][i] if widen is not None else None
            if (slack if slack is not None else e).dtype != g.dtype:
                return f"{where}: wrong dtype {g.dtype}, expected {e.dtype}", []
            if slack is not None and unjudged is not None and _unjudgeable(e, slack):
                unjudged.append(where)
                continue
            if judged is not None:
                judged[0] += 1
            reason, mismatches = _compare_values(e, g, run, i, where, families, bool(held_out), precision, slack)
            if reason:
                return reason, mismatches
    return "", []


def _compare_values(e: Any, g: Any, run: int, output: int, where: str, families: tuple[str, ...],
                    held_out: bool, precision: PrecisionPolicy, slack: Any = None) -> tuple[str, list[Mismatch]]:
    import torch

    atol = tol = 0.0
    if not (e.is_floating_point() or e.is_complex()):
        bad = e != g
    else:
        tol = tolerance(precision, e.dtype if slack is None else slack.dtype)
        ef, gf = e.to(torch.float64), g.to(torch.float64)
        e_nan, g_nan = torch.isnan(ef), torch.isnan(gf)
        e_inf, g_inf = torch.isinf(ef), torch.isinf(gf)
        special = e_nan | g_nan | e_inf | g_inf
        bad_special = (e_nan != g_nan) | (e_inf != g_inf) | (e_inf & g_inf & (torch.sign(ef) != torch.sign(gf)))
        atol = tol * _scale(ef, special)
        if slack is None:
            close = torch.isclose(ef, gf, rtol=tol, atol=atol)
        else:  # isclose's rule against float64, atol grown by twice the fp32 reference's own largest error
            own = (slack.to(torch.float64) - ef).abs()[~special]
            atol += REFERENCE_ERROR_ALLOWANCE * (float(own.max()) if own.numel() else 0.0)
            close = (gf - ef).abs() <= atol + tol * ef.abs()
        bad = bad_special | (~special & ~close)
        if bool(bad_special.any()):
            n_nan = int((g_nan & ~e_nan).sum())
            n_inf = int((g_inf & ~e_inf).sum())
            what = f"{n_nan} unexpected NaN, {n_inf} unexpected Inf" if (n_nan or n_inf) else "NaN/Inf positions differ"
            return f"{where}: {what}", _mismatches(e, g, bad_special, run, output, families, held_out)
    n_bad = int(bad.sum())
    if n_bad:
        total = e.numel()
        if not tol:
            return f"{where}: {n_bad}/{total} elements differ", _mismatches(e, g, bad, run, output, families, held_out)
        return (f"{where}: {n_bad}/{total} elements differ beyond rtol={tol:g}, atol={atol:.3g}",
                _mismatches(e, g, bad, run, output, families, held_out))
    return "", []


def _unjudgeable(truth: Any, fp32: Any) -> bool:
    """The fp32 reference is off from its float64 twin by more than UNJUDGEABLE of the output's scale."""
    import torch

    if not truth.is_floating_point():
        return False
    special = torch.isnan(truth) | torch.isinf(truth) | torch.isnan(fp32.double()) | torch.isinf(fp32.double())
    own = (fp32.double() - truth)[~special].abs()
    return bool(own.numel()) and float(own.max()) > UNJUDGEABLE * _scale(truth.double(), special)


def _scale(ef: Any, special: Any) -> float:
    """The output's largest finite magnitude, at least 1: atol scales with it, because a reduction's
    rounding error grows with the magnitude of its terms (a dot product of 100x inputs cancels to
    values near 0 whose absolute error is not near 0), while rtol alone would demand more than fp32 holds."""
    finite = ef[~special]
    return max(1.0, float(finite.abs().max())) if finite.numel() else 1.0


def _mismatches(e: Any, g: Any, bad: Any, run: int, output: int, families: tuple[str, ...],
                held_out: bool) -> list[Mismatch]:
    idx = bad.nonzero()[:MAX_MISMATCHES]
    out = []
    for row in idx.tolist():
        ev, gv = e[tuple(row)].item(), g[tuple(row)].item()
        out.append(Mismatch(trial=run // len(families), family=families[run % len(families)], output=output,
                            index=row, held_out=held_out, expected=_num(ev), got=_num(gv)))
    return out


def _num(v: Any) -> float | str:
    f = float(v.real if isinstance(v, complex) else v)
    return f if math.isfinite(f) else str(f)  # "nan"/"inf": JSON has no NaN
