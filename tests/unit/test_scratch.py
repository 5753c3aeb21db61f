"""Scratch folders and the worker-start sweep: a folder whose process was SIGKILLed is removed, a live
process's folder (another worker's, on the same host) and anything that is not ours are left."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from activities.scratch import Scratch, sweep

HOLDER = """
import sys
from pathlib import Path
from activities.scratch import Scratch
folder = Scratch("verify", root=Path(sys.argv[1]))
(folder.path / "outputs.pt").write_bytes(b"x" * 4096)
print(folder.path, flush=True)
sys.stdin.readline()
"""


def hold(root: Path) -> tuple[subprocess.Popen, Path]:
    """A process that makes a scratch folder in `root` and keeps it until killed."""
    proc = subprocess.Popen([sys.executable, "-c", HOLDER, str(root)], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            text=True, cwd=Path(__file__).resolve().parents[2])
    return proc, Path(proc.stdout.readline().strip())


@pytest.mark.timeout(60)
def test_the_sweep_removes_a_killed_processs_folder_and_keeps_a_live_ones(tmp_path):
    live, kept = hold(tmp_path)
    dead, left = hold(tmp_path)
    try:
        assert kept.is_dir() and left.is_dir() and kept.name.startswith("fleetforge-verify-")
        assert sweep(tmp_path) == (0, 0), "both owners are alive"
        dead.send_signal(signal.SIGKILL)
        dead.wait(timeout=30)
        assert left.is_dir(), "a SIGKILLed process runs no cleanup"

        assert sweep(tmp_path) == (1, 4096)
        assert not left.exists()
        assert (kept / "outputs.pt").is_file(), "the live process's folder is untouched"
    finally:
        for proc in (live, dead):
            proc.kill()
            proc.wait(timeout=30)


@pytest.mark.skipif(os.geteuid() != 0, reason="only a root worker hands scratch folders to a child's uid")
def test_the_sweep_removes_a_dead_root_workers_folder_it_had_handed_to_a_child(tmp_path):
    """A fleet row's scratch belongs to its sandboxed child's uid; once its worker is gone it is swept all the same."""
    from activities.sandbox.child import UID_RANGE

    dead, left = hold(tmp_path)
    os.chown(left, UID_RANGE[0] + 7, UID_RANGE[0] + 7)
    dead.send_signal(signal.SIGKILL)
    dead.wait(timeout=30)
    other = tmp_path / "fleetforge-verify-someone"  # another user's (not a sandbox uid): left
    other.mkdir()
    os.chown(other, 1000, 1000)
    assert sweep(tmp_path) == (1, 4096)
    assert not left.exists() and other.is_dir()


def test_the_sweep_leaves_what_is_not_a_scratch_folder(tmp_path):
    other = tmp_path / "ff-verify-1234"  # another program's (or an older fleetforge's) folder
    other.mkdir()
    target = tmp_path / "precious"
    target.mkdir()
    (target / "data").write_text("keep")
    (tmp_path / "fleetforge-verify-link").symlink_to(target)
    (tmp_path / "fleetforge-notes.txt").write_text("a file, not a folder")

    assert sweep(tmp_path) == (0, 0)
    assert other.is_dir() and (target / "data").read_text() == "keep"
    assert (tmp_path / "fleetforge-notes.txt").is_file()


def test_a_scratch_folder_is_removed_at_the_end_of_its_block_even_on_error(tmp_path):
    with pytest.raises(RuntimeError), Scratch("probe", root=tmp_path) as folder:
        (folder / "task.py").write_text("x = 1")
        raise RuntimeError("the child failed")
    assert not folder.exists()
    assert os.listdir(tmp_path) == []


def sweep_elsewhere(root: Path) -> str:
    """A sweep by another process (another worker starting on this host)."""
    code = f"from activities.scratch import sweep; from pathlib import Path; print(sweep(Path({str(root)!r})))"
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                          cwd=Path(__file__).resolve().parents[2]).stdout.strip()


@pytest.mark.parametrize("gap", ["before the folder is opened", "between open and lock"])
def test_a_folder_a_sweep_takes_before_it_is_locked_is_replaced(tmp_path, monkeypatch, gap):
    """The instant between mkdtemp and flock: a sweep that removes the folder there makes Scratch take another."""
    import activities.scratch as scratch

    swept: list[str] = []
    real_mkdtemp, real_flock = scratch.tempfile.mkdtemp, scratch.fcntl.flock

    def mkdtemp(**kwargs):
        path = real_mkdtemp(**kwargs)
        if gap == "before the folder is opened" and not swept:
            swept.append(sweep_elsewhere(tmp_path))
        return path

    def flock(fd, operation):
        if gap == "between open and lock" and not swept:
            swept.append(sweep_elsewhere(tmp_path))
        return real_flock(fd, operation)

    monkeypatch.setattr(scratch.tempfile, "mkdtemp", mkdtemp)
    monkeypatch.setattr(scratch.fcntl, "flock", flock)
    with Scratch("row", root=tmp_path) as folder:
        assert swept == ["(1, 0)"], "the other process removed the first folder"
        assert folder.is_dir() and os.listdir(tmp_path) == [folder.name]
        assert sweep_elsewhere(tmp_path) == "(0, 0)", "the one it kept is locked"
