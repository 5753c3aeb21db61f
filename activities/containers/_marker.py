"""Per-row run markers: at-least-once execution made safe for the process and script runners.

Temporal runs an activity at least once: when a worker dies mid-test, the retry starts the test
again while the first run's process (its own session, so the worker's death does not take it along)
may still be alive, holding the row's port and GPUs. Before a runner starts a test it takes the
row's lock and reads the row's marker in the state dir; every process group recorded there belongs
to an interrupted earlier run of this row, and is killed (and waited for) first. The marker is
removed when a run ends normally. The docker runner gets the same guarantee from its deterministic
container name (`docker rm -f` before `docker run`).

The guarantee is per host (the state dir): a retry on another machine cannot reach the first
machine's processes, and the first machine's worker is gone with them in the usual crash.
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import json
import os
import re
import signal
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from pathlib import Path

from contracts.errors import Err, FleetforgeError

LOCK_WAIT_S = 60.0
KILL_WAIT_S = 10.0


def _stat(pid: int) -> list[str] | None:
    """Fields of /proc/PID/stat after the command name (field 3 first), or None when there is no such process."""
    try:
        raw = Path(f"/proc/{pid}/stat").read_text()
    except (FileNotFoundError, ProcessLookupError, PermissionError):
        return None
    return raw[raw.rindex(")") + 2:].split()


def start_ticks(pid: int) -> int | None:
    """The process's start time (clock ticks since boot): with the pid, what identifies it."""
    fields = _stat(pid)
    return int(fields[19]) if fields else None


def group_members(pgid: int) -> list[int]:
    """Live (not zombie) processes of a process group."""
    members = []
    for entry in os.scandir("/proc"):
        if entry.name.isdigit() and (fields := _stat(int(entry.name))) and fields[0] != "Z" and int(fields[2]) == pgid:
            members.append(int(entry.name))
    return members


def _safe(name: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.-]+", "_", name)[:120]


@dataclass(frozen=True)
class Leftover:
    """An earlier run of the row's test found in its marker."""

    pid: int
    attempt: int
    killed: bool
    """It was still running (now killed); False when it had already ended."""


class RowMarker:
    """The lock and marker of one fleet row (`<state>/fleet-rows/<fleet>-<row>.json`)."""

    def __init__(self, root: Path, fleet_id: str, row: int):
        root.mkdir(parents=True, exist_ok=True)
        self.path = root / f"{_safe(fleet_id)}-{row}.json"
        self._lock = self.path.with_suffix(".lock")

    @contextlib.asynccontextmanager
    async def held(self, heartbeat: Callable[[str], None]) -> AsyncIterator["RowMarker"]:
        """Hold the row's lock (another live run of the same row on this host waits; a dead worker's
        lock is released by the kernel with its file descriptors)."""
        fd = os.open(self._lock, os.O_CREAT | os.O_RDWR, 0o600)
        try:
            deadline = time.monotonic() + LOCK_WAIT_S
            while True:
                try:
                    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                    break
                except BlockingIOError:
                    if time.monotonic() > deadline:
                        raise FleetforgeError(Err.INTERNAL, f"row lock {self._lock} is held by a live run for "
                                              f"{LOCK_WAIT_S:.0f}s", retryable=True) from None
                    heartbeat("waiting for the row's lock (another run of this row is still alive)")
                    await asyncio.sleep(0.2)
            yield self
        finally:
            os.close(fd)  # releases the lock

    def _entries(self) -> list[dict]:
        try:
            data = json.loads(self.path.read_text())
        except (FileNotFoundError, ValueError):
            return []
        return [e for e in data.get("runs", []) if isinstance(e, dict)] if isinstance(data, dict) else []

    async def stop_leftovers(self, heartbeat: Callable[[str], None]) -> list[Leftover]:
        """Kill the process group of every earlier run recorded in the marker (a pid whose start time
        no longer matches is another process now: never touched), wait until they are gone."""
        found: list[Leftover] = []
        for entry in self._entries():
            pid, ticks = int(entry.get("pid", 0)), entry.get("start_ticks")
            if pid <= 0:
                continue
            now = start_ticks(pid)
            if now is not None and now != ticks:  # the pid was reused: our group is gone (a live pgid is never reused)
                found.append(Leftover(pid, int(entry.get("attempt", 0)), killed=False))
                continue
            alive = bool(group_members(pid))
            if alive:
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.killpg(pid, signal.SIGKILL)
                deadline = time.monotonic() + KILL_WAIT_S
                while group_members(pid) and time.monotonic() < deadline:
                    heartbeat(f"stopping the interrupted earlier run (process group {pid})")
                    await asyncio.sleep(0.1)
            found.append(Leftover(pid, int(entry.get("attempt", 0)), killed=alive))
        return found

    def started(self, pid: int, attempt: int) -> None:
        """Record a started run (before waiting for it): a crash from here on leaves it findable."""
        runs = [*self._entries(), {"pid": pid, "start_ticks": start_ticks(pid), "attempt": attempt}]
        tmp = self.path.with_suffix(".tmp")
        tmp.write_text(json.dumps({"runs": runs}))
        os.replace(tmp, self.path)

    def finished(self) -> None:
        self.path.unlink(missing_ok=True)
