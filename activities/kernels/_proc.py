"""Child processes for the kernels activities (verifier, reference probe, profiler), started through the
one sandbox (activities/sandbox): what they run is a task file a user brought or a candidate an LLM wrote.
This module adds only what is kernel-specific: the child's environment and a log excerpt that keeps the
candidate's own traceback frames."""

from __future__ import annotations

import importlib.util
import os
import re
import sys
from collections.abc import Callable
from pathlib import Path

from activities.sandbox import Child, Limits, SandboxPolicy, log_lines, scrub, spawn_child, wait_children
from contracts.errors import Err, FleetforgeError

REPO_ROOT = Path(__file__).resolve().parents[2]
MEMORY_LIMIT_BYTES = 8 * 1024**3
"""The address-space limit of every child on CPU (RLIMIT_AS)."""
DISK_BUDGET_BYTES = 2 * 1024**3
"""What a child may write (its outputs: the task's tensors, a few hundred MiB at the verifier's size bound)."""
FILE_LIMIT_BYTES = 1024**3
"""The largest file a child may write (RLIMIT_FSIZE)."""
PROCESS_LIMIT = 128
"""Threads count too: torch and the interpreter need a few dozen; a fork bomb stops here."""
LOG_LINES = 40
LOG_CHARS = 4000
"""The bounds of a failure's log excerpt (enough to act on, small enough for a prompt and the history)."""
KERNEL_PACKAGES = ("torch", "triton")
"""What every kernels child imports from the worker's own environment (the kernels extra)."""


def require_kernel_packages() -> None:
    """Refuse to start a child that cannot import torch or triton: it would die of ModuleNotFoundError, and that
    would read as the task's fault (KERNEL_TASK_INVALID) or the candidate's, while the worker lacks the extra."""
    missing = [name for name in KERNEL_PACKAGES if importlib.util.find_spec(name) is None]
    if missing:
        raise FleetforgeError(Err.VERIFIER_ERROR, f"this kernels worker has no {' or '.join(missing)}: install the "
                                                  "kernels extra where the worker runs (pip install "
                                                  "'fleetforge[kernels]'; in a checkout `make setup`), then start "
                                                  "the worker again")


def child_env(gpu: bool) -> dict[str, str]:
    """The device the child runs on; nothing of the worker's. Its limits are prlimit's (`Limits`), set before
    it starts: a child cannot run a line before they hold."""
    if gpu:  # torch.compile's baseline compiles in-process (its worker pool would spend the child's process budget)
        return {"FLEETFORGE_CHILD_DEVICE": "cuda", "TORCHINDUCTOR_COMPILE_THREADS": "1"}
    return {"TRITON_INTERPRET": "1", "CUDA_VISIBLE_DEVICES": ""}


def spawn(module: str, workdir: Path, args: list[str], *, gpu: bool, timeout_s: float,
          memory_bytes: int = MEMORY_LIMIT_BYTES) -> Child:
    """`python -m module args` in the sandbox, `workdir` its scratch dir (no network; a GPU child gets the
    GPU's device nodes). `timeout_s` is the most wall time it may get; its CPU time may be that on every
    core (torch's threads), so a slow child is stopped by the wall-clock limit and reported as a timeout.
    A CPU child sees only the runtime of the host's filesystem (`SandboxPolicy.runtime_only`); a GPU child
    still sees the whole host read-only: the driver's files lie where the host image put them, and a child
    that could not find them would fail as if the task were broken, so it moves once a GPU run shows it works.
    `memory_bytes`: its address-space limit on CPU."""
    require_kernel_packages()
    cpu_s = int(timeout_s * (os.cpu_count() or 1)) + 10
    # CUDA reserves far more address space than it uses: no RLIMIT_AS on a GPU
    limits = Limits(timeout_s=timeout_s, memory_bytes=0 if gpu else memory_bytes, cpu_s=cpu_s,
                    file_bytes=FILE_LIMIT_BYTES, disk_bytes=DISK_BUDGET_BYTES, processes=PROCESS_LIMIT)
    return spawn_child([sys.executable, "-m", module, *args], scratch=workdir, limits=limits,
                       policy=SandboxPolicy(gpu=gpu, runtime_only=not gpu), env=child_env(gpu))


def wait_all(children: dict[str, Child], timeout_s: float, beat: Callable[[str], None],
             limit: Callable[[str], float] | None = None) -> dict[str, Child]:
    """Wait for every child (killing the ones past their limit: `limit(name)` seconds from the child's start,
    else `timeout_s`); each gets `error` (None when it exited 0), its log excerpt (scrubbed) and its elapsed
    seconds. Every child is dead when this returns."""
    wait_children(children, timeout_s=timeout_s, beat=beat, limit=limit)
    for child in children.values():
        if child.error:
            child.log_excerpt = log_excerpt(child.log)
    return children


def last_line(log: Path, limit: int = 400) -> str:
    lines = log_lines(log)
    return scrub((lines[-1] if lines else "")[-limit:])


_FRAME = re.compile(r'^\s*File "(?P<file>[^"]+)", line (?P<line>\d+)')


def log_excerpt(log: Path, *, own: str = "candidate.py") -> str:
    """What a coder needs from a crash: every traceback frame in its own file (`own`, with the source
    line under it), and the error lines at the end, bounded to LOG_LINES lines / LOG_CHARS characters.
    Frames of torch/triton internals are left out; so are the worker's paths."""
    lines = log_lines(log)
    if not lines:
        return ""
    kept: list[str] = []
    i = 0
    while i < len(lines):
        m = _FRAME.match(lines[i])
        if m and Path(m.group("file")).name == own:
            kept.append(f'  {own}:{m.group("line")}' + lines[i][m.end():])
            if i + 1 < len(lines) and not _FRAME.match(lines[i + 1]):
                kept.append("    " + lines[i + 1].strip())
                i += 1
        i += 1
    tail_start = len(lines)
    for j in range(len(lines) - 1, -1, -1):  # the error message: the lines after the last frame
        if _FRAME.match(lines[j]) or lines[j].startswith("Traceback"):
            break
        tail_start = j
    if tail_start < len(lines) and tail_start > 0 and _FRAME.match(lines[tail_start - 1]) \
            and lines[tail_start].startswith("    "):
        tail_start += 1  # the last frame's source line
    tail = [ln for ln in lines[tail_start:] if not set(ln.strip()) <= set("^~ ")][-12:]
    excerpt = (["Traceback (frames in the candidate):"] + kept if kept else []) + tail
    text = "\n".join(excerpt[-LOG_LINES:])
    text = text.replace(str(REPO_ROOT), "<fleetforge>")
    return scrub(text)[-LOG_CHARS:]
