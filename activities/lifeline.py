"""How a child process of ours ends: with its parent, and without the interpreter's teardown.

The sandboxed children's entry points (activities/kernels/_child.py and _probe.py, activities/toolchains/isolate.py)
call these first and last; they import this module before torch or onnxruntime, so it imports nothing of ours.
`fleetforge dev` uses `die_with_parent` for its Temporal server and worker.
"""

from __future__ import annotations

import os
import signal
import sys
from typing import NoReturn

PARENT_PID_VAR = "FLEETFORGE_PARENT_PID"
"""The parent's pid, set by a parent whose child cannot otherwise tell that it died before the child asked to be
told. Only where the child sees the parent's own pid: not inside the sandbox's PID namespace (bubblewrap's
--die-with-parent covers that child, and its parent there is the namespace's init)."""
PR_SET_PDEATHSIG = 1


def die_with_parent(signum: int = signal.SIGKILL) -> None:
    """Ask Linux to send `signum` when the parent dies (a no-op elsewhere). A parent that died before this
    request sends nothing, so a child given PARENT_PID_VAR whose parent is no longer that pid leaves at once."""
    if not sys.platform.startswith("linux"):
        return
    import ctypes

    ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, int(signum))
    expected = os.environ.get(PARENT_PID_VAR)
    if expected and os.getppid() != int(expected):
        os._exit(1)


def exit_now(code: int) -> NoReturn:
    """Leave without the interpreter's teardown, which with torch loaded costs about a second per child (import
    torch and triton then exit: 2.8 s with this, 4.0 s without) and in which some native libraries' static
    destructors crash. The caller has closed every file it wrote."""
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)
