"""Scratch folders for the children a worker runs (a verify's reference and candidate, a probe, a fleet row's
test, a sandboxed tool), and the sweep that removes the ones a killed worker left behind.

A worker killed mid-activity (SIGKILL, OOM, a lost host) never runs its `finally`, so its scratch folder stays
in the temp dir: a verify's can hold 100 MB of tensors, and a fleet runs for days. Each folder is made by
`Scratch`, whose process holds an exclusive `flock` on the folder itself until it has removed it; the kernel
drops that lock when the process dies, however it dies. `sweep` (run at worker start) removes every
`fleetforge-*` folder whose lock it can take, so it never touches the live folders of another worker on the same
host. The lock is on the folder, not on a file in it, because the sandboxed child may write (and delete) in
its scratch but cannot replace the folder it was given. A folder is unlocked for an instant after `mkdtemp`; a
sweep that takes it then deletes it while holding the lock, and `Scratch` sees that (the folder it locked
has no links left) and makes another.
"""

from __future__ import annotations

import fcntl
import os
import shutil
import stat
import tempfile
from pathlib import Path
from types import TracebackType

from activities.sandbox.child import UID_RANGE, disk_used

PREFIX = "fleetforge-"
"""Every scratch folder's name starts with it (`fleetforge-verify-…`, `fleetforge-row-…`); `sweep` looks at no
other, so another program's temp folders are never touched."""


class Scratch:
    """A fresh folder `{tempdir}/fleetforge-{kind}-XXXXXXXX`, locked by this process until `remove()` (or the
    `with` block's end) deletes it."""

    def __init__(self, kind: str, *, root: Path | None = None) -> None:
        while True:
            self.path = Path(tempfile.mkdtemp(prefix=f"{PREFIX}{kind}-", dir=root))
            try:
                fd = os.open(self.path, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
            except FileNotFoundError:  # a sweep took it already
                continue
            fcntl.flock(fd, fcntl.LOCK_EX)
            if os.fstat(fd).st_nlink:  # still there: no sweep took it before the lock
                self._fd: int | None = fd
                return
            os.close(fd)

    def remove(self) -> None:
        """Delete the folder, then let go of it (in that order: a sweep never sees it unlocked)."""
        if self._fd is None:
            return
        try:
            shutil.rmtree(self.path, ignore_errors=True)
        finally:
            os.close(self._fd)
            self._fd = None

    def __enter__(self) -> Path:
        return self.path

    def __exit__(self, kind: type[BaseException] | None, error: BaseException | None, tb: TracebackType | None) -> None:
        self.remove()


def sweep(root: Path | None = None) -> tuple[int, int]:
    """Remove the scratch folders in `root` (the temp dir) that no live process holds; (folders, bytes) removed.
    Folders of another user (but for a root worker's, handed to a child's uid), symlinks and anything not named
    `fleetforge-*` are left alone."""
    root = Path(root or tempfile.gettempdir())
    removed = freed = 0
    for entry in root.iterdir():
        if not entry.name.startswith(PREFIX):
            continue
        try:
            fd = os.open(entry, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
        except OSError:  # not a folder, a symlink, gone, or not ours to read
            continue
        try:
            info = os.fstat(fd)
            if not stat.S_ISDIR(info.st_mode) or not _ours(info.st_uid):
                continue
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:  # a live process holds it
                continue
            size = disk_used([entry])
            shutil.rmtree(entry, ignore_errors=True)
            if not entry.exists():
                removed, freed = removed + 1, freed + size
        finally:
            os.close(fd)
    return removed, freed


def _ours(uid: int) -> bool:
    """This user's folder, or (a root worker) one handed to a sandboxed child's uid: a fleet row's or a tool's
    scratch belongs to the child it was given to (activities/sandbox/child.py `_hand_over`)."""
    return uid == os.getuid() or (os.getuid() == 0 and UID_RANGE[0] <= uid <= UID_RANGE[1])
