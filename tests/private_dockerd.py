"""A docker daemon of a test's own: its own socket, data root and exec root (no bridge, no iptables), so a
test or a benchmark can stop and restart a real daemon under a running fleet without touching the shared
engine that other tests use. Needs root and `dockerd` (scripts/engines.sh installs docker.io)."""

from __future__ import annotations

import functools
import os
import shutil
import signal
import subprocess
import tempfile
import time
from pathlib import Path

from activities.lifeline import die_with_parent


class PrivateDockerd:
    def __init__(self, shutdown_timeout_s: int = 2, start_timeout_s: float = 60.0):
        if shutil.which("dockerd") is None or os.geteuid() != 0:
            raise RuntimeError("a private docker daemon needs root and dockerd: run scripts/engines.sh as root")
        # short paths: the daemon's and containerd's unix sockets live under them (108-byte limit)
        self.root = Path(tempfile.mkdtemp(prefix="ffd-", dir="/tmp"))
        self.host = f"unix://{self.root}/docker.sock"
        self.shutdown_timeout_s = shutdown_timeout_s
        self.start_timeout_s = start_timeout_s
        self._proc: subprocess.Popen | None = None

    def start(self) -> None:
        with (self.root / "dockerd.log").open("ab") as log:  # the daemon keeps its own copy of the fd
            self._proc = subprocess.Popen(
                ["dockerd", "--data-root", str(self.root / "data"), "--exec-root", str(self.root / "exec"),
                 "--pidfile", str(self.root / "dockerd.pid"), "-H", self.host, "--bridge=none", "--iptables=false",
                 "--ip-masq=false", "--shutdown-timeout", str(self.shutdown_timeout_s)],
                stdout=log, stderr=subprocess.STDOUT, start_new_session=True, preexec_fn=functools.partial(die_with_parent, signal.SIGTERM))
        deadline = time.monotonic() + self.start_timeout_s
        while self.docker("info", check=False).returncode != 0:
            if self._proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"private dockerd did not come up: {self.log_tail()}")
            time.sleep(0.2)

    def stop(self) -> None:
        """SIGTERM, as a service manager stops it: the daemon stops its containers (SIGTERM, then SIGKILL after
        the shutdown timeout) before it exits."""
        if self._proc is None:
            return
        self._proc.send_signal(signal.SIGTERM)
        try:
            self._proc.wait(timeout=self.shutdown_timeout_s + 60)
        except subprocess.TimeoutExpired:
            os.killpg(self._proc.pid, signal.SIGKILL)
            self._proc.wait(timeout=30)
        self._proc = None

    def restart(self) -> None:
        self.stop()
        self.start()

    def docker(self, *args: str, check: bool = True, **kwargs) -> subprocess.CompletedProcess:
        return subprocess.run(["docker", "-H", self.host, *args], capture_output=True, text=True, check=check,
                              timeout=kwargs.pop("timeout", 120), **kwargs)

    def cli(self, folder: Path) -> Path:
        """A `docker` for a runner: the real CLI, talking to this daemon."""
        path = folder / "docker"
        path.write_text(f'#!/bin/sh\nexec docker -H {self.host} "$@"\n')
        path.chmod(0o755)
        return path

    def log_tail(self, lines: int = 20) -> str:
        log = self.root / "dockerd.log"
        return "\n".join(log.read_text(errors="replace").splitlines()[-lines:]) if log.exists() else ""

    def close(self) -> None:
        try:
            if self._proc is not None:
                ids = self.docker("ps", "-aq", check=False).stdout.split()
                if ids:
                    self.docker("rm", "-f", *ids, check=False)
            self.stop()
        finally:
            for mount in self._mounts():  # the daemon's network namespace file and any overlay left behind
                subprocess.run(["umount", "-l", mount], capture_output=True)
            shutil.rmtree(self.root, ignore_errors=True)

    def _mounts(self) -> list[str]:
        """Mount points under this daemon's folder, deepest first."""
        points = [line.split()[1] for line in Path("/proc/self/mounts").read_text().splitlines()]
        return sorted((p for p in points if p.startswith(f"{self.root}/")), key=len, reverse=True)

    def __enter__(self) -> PrivateDockerd:
        self.start()
        return self

    def __exit__(self, *exc) -> None:
        self.close()
