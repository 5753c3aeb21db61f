"""Per-row run markers: at-least-once execution made safe for the process and script runners.

Temporal runs an activity at least once: when a worker dies mid-test, the retry starts the test
again while the first run's process (its own session, so the worker's death does not take it along)
may still be alive, holding the row's port and GPUs. Before a runner starts a test it takes the
row's lock and reads the row's marker in the state dir; every process group recorded there belongs
to an interrupted earlier run of this row, and is killed (and waited for) first. The marker is
removed when a run ends normally.

Intent before the side effect: the marker records "attempt N is starting" (with a tag the child
carries in its environment, FLEETFORGE_RUN_TAG) durably *before* the process is spawned, and the script
runner its pid right after. A worker killed between the two leaves an intent without a pid; the retry
finds that run's processes by the tag in /proc/PID/environ, kills them and counts the rerun. The process
runner's sandboxed runs record the intent only: bubblewrap's own argv carries the tag (`--setenv`), so
the tag always finds them, even when the command clears its environment.

The docker runner keeps its own durable record (StartIntents): every container name it is about to
`docker run` for (row, attempt) is written (fsync'ed) first and kept after the run, so a retry knows
an earlier start may exist and asks the engine (labels, `docker events`) what really started.

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

from activities.sandbox import proc_stat
from contracts.errors import Err, FleetforgeError

LOCK_WAIT_S = 60.0
KILL_WAIT_S = 10.0
RESCAN_S = 0.2
"""The pause before a scan for tagged processes that found none is trusted by a second one."""


def start_ticks(pid: int) -> int | None:
    """The process's start time (clock ticks since boot): with the pid, what identifies it."""
    fields = proc_stat(pid)
    return int(fields[19]) if fields else None


def group_members(pgid: int) -> list[int]:
    """Live (not zombie) processes of a process group."""
    members = []
    for entry in os.scandir("/proc"):
        if entry.name.isdigit() and (fields := proc_stat(int(entry.name))) and fields[0] != "Z" and int(fields[2]) == pgid:
            members.append(int(entry.name))
    return members


TAG_VAR = "FLEETFORGE_RUN_TAG"
"""The environment variable a marked test's process carries: its run's tag (found in /proc/PID/environ)."""


def tagged_processes(tag: str) -> list[int]:
    """Live processes whose environment holds FLEETFORGE_RUN_TAG=tag, or that set it for their child (the
    sandbox's `bwrap --setenv FLEETFORGE_RUN_TAG tag`); a process of another user is not readable: not
    found, never guessed. A process in the middle of an exec has neither for a moment: scan again."""
    needle = f"{TAG_VAR}={tag}".encode()
    found = []
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            env = Path(f"/proc/{entry.name}/environ").read_bytes().split(b"\0")
            argv = Path(f"/proc/{entry.name}/cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        setenv = any(a == TAG_VAR.encode() and argv[i + 1:i + 2] == [tag.encode()] for i, a in enumerate(argv))
        if (needle in env or setenv) and (fields := proc_stat(int(entry.name))) and fields[0] != "Z":
            found.append(int(entry.name))
    return found


def durable_write(path: Path, text: str) -> None:
    """Replace `path` with `text` so that a crash (even of the machine) leaves the old or the new file."""
    tmp = path.with_suffix(path.suffix + ".tmp")
    with open(tmp, "w") as f:
        f.write(text)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
    dir_fd = os.open(path.parent, os.O_RDONLY)
    try:
        os.fsync(dir_fd)
    finally:
        os.close(dir_fd)


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
        """The marker's runs: intents (`tag`, `attempt`) and started runs (`pid`, `start_ticks` too)."""
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
            if pid <= 0:  # an intent whose pid was never recorded: the worker died around the spawn
                found.append(await self._stop_tagged(str(entry.get("tag", "")), int(entry.get("attempt", 0)), heartbeat))
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

    async def _stop_tagged(self, tag: str, attempt: int, heartbeat: Callable[[str], None]) -> Leftover:
        """Kill the process groups of the processes that carry `tag` (an intent's run that may have started).
        Every scan of /proc kills what it finds, and only two empty scans a pause apart end it: a process in
        the middle of an exec shows neither environment nor argv for a moment (the parent of a just-spawned
        run sees it before the kernel has written them), and a tagged process may start another in a
        session of its own between a scan and its kill."""
        first: list[int] = []
        empty_scans = 0
        deadline = time.monotonic() + KILL_WAIT_S
        while tag and empty_scans < 2 and time.monotonic() < deadline:
            pids = tagged_processes(tag)
            first = first or pids
            empty_scans = 0 if pids else empty_scans + 1
            for pid in pids:
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    group = os.getpgid(pid)
                    if group == os.getpgid(0):  # never our own group: only that process
                        os.kill(pid, signal.SIGKILL)
                    else:
                        os.killpg(group, signal.SIGKILL)
            if pids:
                heartbeat(f"stopping the interrupted earlier run (tag {tag})")
            await asyncio.sleep(0.1 if pids else RESCAN_S)
        return Leftover(first[0] if first else 0, attempt, killed=bool(first))

    def intend(self, attempt: int) -> str:
        """Record, durably and before the spawn, that a run of `attempt` is starting; returns the tag the
        child must carry in its environment (FLEETFORGE_RUN_TAG) so a retry can find it without a pid."""
        tag = f"{self.path.stem}-a{attempt}-{len(self._entries()) + 1}-{os.getpid()}"
        self._write([*self._entries(), {"tag": tag, "attempt": attempt}])
        return tag

    def started(self, pid: int, attempt: int, tag: str = "") -> None:
        """Record a started run (before waiting for it): a crash from here on leaves it findable by pid."""
        runs = [e for e in self._entries() if not (tag and e.get("tag") == tag and not e.get("pid"))]
        self._write([*runs, {"pid": pid, "start_ticks": start_ticks(pid), "attempt": attempt, "tag": tag}])

    def _write(self, runs: list[dict]) -> None:
        durable_write(self.path, json.dumps({"runs": runs}))

    def finished(self) -> None:
        self.path.unlink(missing_ok=True)


@dataclass(frozen=True)
class Intent:
    """A container the docker runner was about to start for (row, attempt), recorded before `docker run`."""

    name: str
    at: float
    """Wall-clock time (Unix seconds) the intent was recorded: `docker events --since` for the engine's answer."""


class StartIntents:
    """`<state>/fleet-rows/<fleet>-<row>.starts.json`: per attempt, every container name the docker runner
    was about to start, recorded durably before `docker run` and kept after the run (a retry of a run whose
    result was lost must still learn that the container started). Use under the row's lock (RowMarker.held)."""

    def __init__(self, root: Path, fleet_id: str, row: int):
        root.mkdir(parents=True, exist_ok=True)
        self.path = root / f"{_safe(fleet_id)}-{row}.starts.json"

    def _data(self) -> dict[str, list[dict]]:
        try:
            data = json.loads(self.path.read_text())
        except (FileNotFoundError, ValueError):
            return {}
        return data if isinstance(data, dict) else {}

    def earlier(self, attempt: int) -> list[Intent]:
        return [Intent(str(e["name"]), float(e["at"])) for e in self._data().get(str(attempt), [])
                if isinstance(e, dict) and "name" in e and "at" in e]

    def intend(self, attempt: int, name: str) -> Intent:
        """Durable before it returns: a worker killed during `docker run` leaves this record behind."""
        intent = Intent(name, time.time())
        data = self._data()
        data.setdefault(str(attempt), []).append({"name": intent.name, "at": intent.at})
        durable_write(self.path, json.dumps(data))
        return intent
