"""Who holds a loopback port: the checks that keep a row from being judged by another row's server.

`port_taken` is asked before a test starts (the row's port must be free); `listening_pids` answers
"which processes listen on this port" from /proc (host networking: the container's sockets are in
the host's tables), so the docker runner can tell whether the server that answered is its own
container's. Reading other processes' file descriptors needs the same user or root; without that
the answer is "unknown" (None), never a guess.
"""

from __future__ import annotations

import os
import socket
from pathlib import Path

_LISTEN = "0A"


def port_taken(port: int, host: str = "127.0.0.1", timeout_s: float = 0.5) -> bool:
    """Something accepts connections on host:port."""
    try:
        with socket.create_connection((host, port), timeout=timeout_s):
            return True
    except OSError:
        return False


def _listening_inodes(port: int) -> set[str]:
    inodes: set[str] = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            lines = Path(table).read_text().splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            cols = line.split()
            if len(cols) > 9 and cols[3] == _LISTEN and int(cols[1].rsplit(":", 1)[1], 16) == port:
                inodes.add(cols[9])
    return inodes


def listening_pids(port: int, candidates: list[int]) -> set[int] | None:
    """Which of `candidates` hold a listening socket on `port`; None when that cannot be known (no
    permission to read their file descriptors, or no listening socket found at all)."""
    inodes = _listening_inodes(port)
    if not inodes:
        return None
    targets = {f"socket:[{i}]" for i in inodes}
    owners: set[int] = set()
    denied = False
    for pid in candidates:
        fd_dir = f"/proc/{pid}/fd"
        try:
            names = os.listdir(fd_dir)
        except PermissionError:
            denied = True
            continue
        except FileNotFoundError:
            continue
        for fd in names:
            try:
                if os.readlink(f"{fd_dir}/{fd}") in targets:
                    owners.add(pid)
                    break
            except OSError:
                continue
    return None if denied and not owners else owners
