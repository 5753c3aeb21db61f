"""A child of ours dies with its parent, also when the parent died before the child asked to be told, and the
sandbox gives an unconfined child its parent's pid for that check (a confined one sees another PID namespace)."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from activities import sandbox
from activities.lifeline import PARENT_PID_VAR
from activities.sandbox import Limits, proc_stat, spawn_child, wait_children

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="PR_SET_PDEATHSIG is Linux's")

ASK = "from activities.lifeline import die_with_parent; die_with_parent(); print('asked', flush=True)"
DEADLINE_S = 20.0


def gone(pid: int) -> bool:
    """No such process, or only its zombie left (a container's init may be slow to reap it)."""
    fields = proc_stat(pid)
    return fields is None or fields[0] == "Z"


def test_a_child_whose_parent_is_not_the_named_one_leaves_at_once_with_code_1():
    done = subprocess.run([sys.executable, "-c", ASK], env={**os.environ, PARENT_PID_VAR: "1"},
                          capture_output=True, text=True, timeout=DEADLINE_S)
    assert (done.returncode, done.stdout) == (1, "")


def test_a_child_whose_parent_is_the_named_one_carries_on():
    done = subprocess.run([sys.executable, "-c", ASK], env={**os.environ, PARENT_PID_VAR: str(os.getpid())},
                          capture_output=True, text=True, timeout=DEADLINE_S)
    assert (done.returncode, done.stdout) == (0, "asked\n")


def test_the_child_is_killed_when_its_parent_is():
    # a parent that starts the asking child, says its pid and waits; killing that parent must take the child along
    parent_code = ("import os, subprocess, sys; "
                   f"c = subprocess.Popen([sys.executable, '-c', {ASK + '; import time; time.sleep(600)'!r}], "
                   f"env={{**os.environ, {PARENT_PID_VAR!r}: str(os.getpid())}}, stdout=subprocess.PIPE, text=True); "
                   "assert c.stdout.readline() == 'asked\\n'; print(c.pid, flush=True); c.wait()")
    parent = subprocess.Popen([sys.executable, "-c", parent_code], stdout=subprocess.PIPE, text=True)
    child = int(parent.stdout.readline())  # type: ignore[union-attr]
    assert not gone(child)
    parent.kill()
    parent.wait()
    deadline = time.monotonic() + DEADLINE_S
    while not gone(child) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert gone(child)


@pytest.mark.parametrize("mode", ["off", "bwrap"])
def test_only_an_unconfined_child_is_told_its_parents_pid(mode: str, tmp_path: Path):
    sandbox.configure(mode)
    try:
        if mode == "bwrap" and sandbox.unavailable():
            pytest.skip(f"no sandbox here: {sandbox.unavailable()}")
        code = f"import os; {ASK}; print(os.environ.get({PARENT_PID_VAR!r}))"
        child = spawn_child([sys.executable, "-c", code], scratch=tmp_path, limits=Limits(timeout_s=DEADLINE_S))
        wait_children({"c": child}, timeout_s=DEADLINE_S)
    finally:
        sandbox.configure("bwrap")
    said = child.log.read_text().split()
    assert child.exit_code == 0, said
    assert said == ["asked", str(os.getpid()) if mode == "off" else "None"]
