"""Child processes for the kernels activities (verifier, reference probe, profiler): a minimal
environment with resource limits the child applies to itself, a session of its own so the whole group
can be killed, a heartbeat while waiting, and a bounded log excerpt when it fails."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[2]
MEMORY_LIMIT_BYTES = 8 * 1024**3
"""The address-space limit of every child on CPU (RLIMIT_AS)."""
_POLL_S = 0.5
LOG_LINES = 40
LOG_CHARS = 4000
"""The bounds of a failure's log excerpt (enough to act on, small enough for a prompt and the history)."""


def child_env(gpu: bool, cpu_s: int) -> dict[str, str]:
    """A minimal environment (no secrets of the worker) plus the limits the child applies to itself
    before importing anything (no preexec_fn: it is unsafe in a threaded worker)."""
    keep = ("PATH", "HOME", "LANG", "LC_ALL", "TMPDIR")
    env = {k: os.environ[k] for k in keep if k in os.environ}
    env.update(PYTHONPATH=str(REPO_ROOT), PYTHONDONTWRITEBYTECODE="1", OMP_NUM_THREADS="1",
               FLEETFORGE_CHILD_MEMORY_BYTES=str(MEMORY_LIMIT_BYTES), FLEETFORGE_CHILD_CPU_S=str(cpu_s),
               FLEETFORGE_CHILD_PARENT_PID=str(os.getpid()))
    if gpu:  # CUDA reserves far more address space than it uses: no RLIMIT_AS there
        env.update(FLEETFORGE_CHILD_DEVICE="cuda", FLEETFORGE_CHILD_MEMORY_BYTES="0")
    else:
        env.update(TRITON_INTERPRET="1", CUDA_VISIBLE_DEVICES="")
    return env


class Child:
    def __init__(self, proc: subprocess.Popen, log: Path):
        self.proc = proc
        self.log = log
        self.started = time.monotonic()
        self.error: str | None = None
        self.log_excerpt = ""
        self.elapsed = 0.0


def spawn(module: str, workdir: Path, args: list[str], *, gpu: bool, timeout_s: float) -> Child:
    log = workdir / "child.log"
    with log.open("wb") as out:
        proc = subprocess.Popen(
            [sys.executable, "-m", module, *args], cwd=workdir,
            env=child_env(gpu, int(timeout_s) + 10), stdin=subprocess.DEVNULL, stdout=out,
            stderr=subprocess.STDOUT, start_new_session=True,
        )
    return Child(proc, log)


def wait_all(children: dict[str, Child], timeout_s: float, beat: Callable[[str], None]) -> dict[str, Child]:
    """Wait for every child (killing the ones past the deadline); each gets `error` (None when it exited 0),
    its log excerpt and its elapsed seconds."""
    deadline = time.monotonic() + timeout_s
    pending = dict(children)
    while pending:
        for name, child in list(pending.items()):
            code = child.proc.poll()
            if code is not None:
                child.elapsed = time.monotonic() - child.started
                if code != 0:
                    child.error = exit_reason(code, child.log)
                    child.log_excerpt = log_excerpt(child.log)
                del pending[name]
        if not pending:
            break
        if time.monotonic() > deadline:
            for child in pending.values():
                kill(child.proc)
                child.elapsed = time.monotonic() - child.started
                child.error = f"timed out after {timeout_s:g}s (killed)"
                child.log_excerpt = log_excerpt(child.log)
            break
        beat(f"waiting for {', '.join(pending)}")
        try:
            next(iter(pending.values())).proc.wait(timeout=_POLL_S)
        except subprocess.TimeoutExpired:
            pass
    return children


def kill(proc: subprocess.Popen) -> None:
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    proc.wait()


def exit_reason(code: int, log: Path) -> str:
    tail = last_line(log)
    if code < 0:
        try:
            name = signal.Signals(-code).name
        except ValueError:
            name = str(-code)
        return f"crashed: killed by signal {name}" + (f": {tail}" if tail else "")
    return f"crashed: exit code {code}" + (f": {tail}" if tail else "")


def _lines(log: Path) -> list[str]:
    try:
        return [ln for ln in log.read_text(encoding="utf-8", errors="replace").splitlines() if ln.strip()]
    except OSError:
        return []


def last_line(log: Path, limit: int = 400) -> str:
    lines = _lines(log)
    return (lines[-1] if lines else "")[-limit:]


_FRAME = re.compile(r'^\s*File "(?P<file>[^"]+)", line (?P<line>\d+)')


def log_excerpt(log: Path, *, own: str = "candidate.py") -> str:
    """What a coder needs from a crash: every traceback frame in its own file (`own`, with the source
    line under it), and the error lines at the end, bounded to LOG_LINES lines / LOG_CHARS characters.
    Frames of torch/triton internals are left out; so are the worker's paths."""
    lines = _lines(log)
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
    return text[-LOG_CHARS:]
