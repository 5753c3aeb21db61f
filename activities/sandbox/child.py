"""The one way fleetforge starts a child that runs LLM-written code or parses an untrusted file.

Every such child (kernel verifier / reference probe / profiler, the converter's tool and evaluation
children, the process runner's commands) is started by `spawn_child` inside bubblewrap:

* no network (its own network namespace; `SandboxPolicy.network` shares the host's for the process
  runner, whose servers must answer on 127.0.0.1);
* no view of other processes (its own PID namespace: the worker's /proc/PID/environ does not exist there);
* the filesystem read-only except its scratch dir (and the paths the caller names writable); the
  worker's home, the state dir, the file artifact store and /run (the docker socket) are hidden behind
  empty tmpfs mounts; the interpreter and the repository stay readable; a `runtime_only` child (an
  LLM-written kernel on CPU) sees nothing of the host but the system's directories and that runtime;
* not root: a worker running as root starts the command as a fresh unprivileged uid of its own with no
  capabilities (setpriv, no user namespace needed); any other worker maps it to uid 65534 in a user
  namespace; an empty environment apart from what the caller passes;
* resource limits (prlimit): address space, CPU seconds, file size, process count, no core files,
  a wall-clock timeout, and a disk budget for what it writes;
* for a GPU child, the /dev/nvidia* nodes are bound in; nothing else changes.

Where bubblewrap cannot start a sandbox, `spawn_child` raises SANDBOX_UNAVAILABLE (no silent
downgrade). An operator may set FLEETFORGE_SANDBOX=off: children then run unconfined (limits and the
empty environment still apply) and `Child.confined` is False, so every job can say so.

Text read from a child's log goes through `scrub` before it goes anywhere.
"""

from __future__ import annotations

import contextlib
import functools
import glob
import json
import os
import secrets
import select
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from enum import StrEnum
from pathlib import Path

from activities.lifeline import PARENT_PID_VAR
from activities.sandbox.scrub import scrub
from contracts.errors import Err, FleetforgeError

REPO_ROOT = Path(__file__).resolve().parents[2]
TMP_BYTES = 256 * 1024**2
"""Size of the child's private /tmp (a tmpfs; TMPDIR points at the scratch dir anyway)."""
KILL_WAIT_S = 5.0
"""How long a kill waits for the namespace's processes to be gone (the kernel reaps them asynchronously)."""
INFO_WAIT_S = 10.0
"""How long bubblewrap may take to report its sandbox's init (it does so before the command starts)."""
UID_RANGE = (200_000, 2**31 - 2)
"""A root worker starts each child as a random uid from this range: no file on the host belongs to it,
and RLIMIT_NPROC (counted per uid) is the child's own, not shared with its neighbours."""


class SandboxMode(StrEnum):
    BWRAP = "bwrap"
    OFF = "off"
    """An operator's explicit choice (FLEETFORGE_SANDBOX=off): children run unconfined, jobs say so."""


@dataclass(frozen=True)
class Limits:
    timeout_s: float
    memory_bytes: int = 8 * 1024**3
    """RLIMIT_AS (0: none; CUDA reserves far more address space than it uses)."""
    cpu_s: int | None = None
    """RLIMIT_CPU soft limit (SIGXCPU; the hard limit, SIGKILL, is 5 s later); None: the timeout plus 10 s."""
    file_bytes: int = 4 * 1024**3
    """RLIMIT_FSIZE: the largest file the child may write."""
    processes: int = 512
    """RLIMIT_NPROC: processes and threads of the child's uid (a fork bomb stops here)."""
    disk_bytes: int = 8 * 1024**3
    """What the child may add to its writable paths; past it, it is killed."""


@dataclass(frozen=True)
class SandboxPolicy:
    network: bool = False
    """Share the host's network namespace (the process runner: its server must answer on 127.0.0.1)."""
    gpu: bool = False
    writable: tuple[Path, ...] = ()
    """Paths besides the scratch dir the child may write (the converter's run workspace)."""
    readable: tuple[Path, ...] = ()
    """Folders the child may read even where it would not see them (the process runner's `--share DIR`):
    bound read-only at the same path. Checked with `shareable` first: never a place kept from every child."""
    runtime_only: bool = False
    """See only the system's own directories (SYSTEM_DIRS), the interpreter, its libraries and the repository,
    not the rest of the host (/home, /srv, /opt, /var, other checkouts, a company's model folders): for
    LLM-written kernels, which need nothing else and whose log excerpt goes back into the next prompt. False:
    the whole host read-only less the hidden paths, for children that run or read a user's own files."""


@dataclass
class _Config:
    mode: SandboxMode = SandboxMode.BWRAP
    hidden: tuple[Path, ...] = ()
    probe: str | None = field(default=None)
    probed: bool = False


_CONFIG = _Config()
_LOCK = threading.Lock()


def configure(mode: SandboxMode | str = SandboxMode.BWRAP, hidden: Sequence[Path] = ()) -> None:
    """Set once by the worker from its settings: the mode, and the paths children must not see
    (the state dir, the filesystem artifact store). Without a call: bubblewrap, home and /run hidden."""
    with _LOCK:
        _CONFIG.mode = SandboxMode(mode)
        _CONFIG.hidden = tuple(Path(p).resolve() for p in hidden)
        _CONFIG.probed = False


def mode() -> SandboxMode:
    return _CONFIG.mode


def confinement_note() -> str:
    """One line for results and Web UI details: how this worker's children run."""
    if _CONFIG.mode is SandboxMode.OFF:
        return "UNCONFINED: FLEETFORGE_SANDBOX=off on the worker; untrusted code ran with the worker's filesystem and network"
    return "bubblewrap sandbox: no network, own PID namespace, read-only filesystem except its scratch dir, not root"


def hidden_paths() -> list[Path]:
    """What children never see: the worker's home, /run (sockets: docker, dbus), and the configured paths."""
    paths = [*_CONFIG.hidden, Path("/run")]
    home = os.environ.get("HOME")
    if home and Path(home).resolve() != Path("/"):
        paths.append(Path(home).resolve())
    if Path("/var/run").is_dir() and not Path("/var/run").is_symlink():
        paths.append(Path("/var/run"))
    return [p for p in dict.fromkeys(paths) if p.is_dir()]


def never_shown() -> list[Path]:
    """What no child may see even when asked (`--share`): the configured paths (state dir, artifact store),
    /run and /var/run (the docker socket)."""
    return [*_CONFIG.hidden, Path("/run"), Path("/var/run").resolve()]


def shareable(paths: Sequence[str | Path]) -> tuple[Path, ...]:
    """The folders a caller asks a child to read (SandboxPolicy.readable), resolved; BAD_INPUT naming the
    first that is not an existing folder others may read, is the root, the temp dir or a folder above it
    (every child's scratch dir), or holds or lies in a place no child sees (never_shown)."""
    out: list[Path] = []
    temp = Path(tempfile.gettempdir()).resolve()
    for raw in paths:
        path = Path(raw)
        if not path.is_absolute():
            raise FleetforgeError(Err.BAD_INPUT, f"--share {raw}: give an absolute folder path")
        path = path.resolve()
        if not path.is_dir():
            raise FleetforgeError(Err.BAD_INPUT, f"--share {raw}: no such folder on the worker")
        if path == Path("/") or path == temp or path in temp.parents:
            raise FleetforgeError(Err.BAD_INPUT, f"--share {raw}: would show every other test's scratch dir; "
                                  f"share the folder the command needs (e.g. {temp}/NAME)")
        if hidden := next((h for h in never_shown() if _under(path, [h]) or _under(h, [path])), None):
            raise FleetforgeError(Err.BAD_INPUT, f"--share {raw}: {hidden} is never shown to a command (the "
                                  "worker's state, artifacts or sockets); copy what it needs to another folder")
        if path.stat().st_mode & 0o005 != 0o005:
            raise FleetforgeError(Err.BAD_INPUT, f"--share {raw}: others may not read it (mode "
                                  f"{path.stat().st_mode & 0o777:o}); the command runs as an unprivileged user of "
                                  f"its own: chmod o+rx {path}")
        out.append(path)
    return tuple(dict.fromkeys(out))


def hidden_by(path: str | Path, readable: Sequence[Path] = ()) -> Path | None:
    """The folder that hides `path`, which exists on this host, from a child that may read `readable`: the
    host's /tmp (a child has a private one), a hidden path (hidden_paths); None when the child sees it
    or it does not exist here. By the path's text, as the child would look it up."""
    norm = Path(os.path.normpath(path))
    if not norm.is_absolute() or not norm.exists() or _under(norm, [*readable, *runtime_paths()]):
        return None
    if root := next((h for h in hidden_paths() if _under(norm, [h])), None):
        return root
    return Path("/tmp") if _under(norm, [Path("/tmp")]) and norm != Path("/tmp") else None


def runtime_paths() -> list[Path]:
    """What a child needs to read: the interpreter, its libraries and the repository. Never the temp dir
    itself or a folder above it (a worker started as `python /tmp/script.py` has /tmp on sys.path): that
    would show every other child's scratch dir."""
    return list(_runtime_paths(tuple(sys.path), tempfile.gettempdir()))


@functools.lru_cache(maxsize=4)
def _runtime_paths(search_path: tuple[str, ...], tempdir: str) -> tuple[Path, ...]:
    """runtime_paths for one sys.path and temp dir, resolved once: resolving them cost about 130 readlink
    and 200 stat calls, at every start of a child."""
    temp = Path(tempdir).resolve()
    paths = [Path(sys.prefix), Path(sys.base_prefix), Path(sys.exec_prefix), Path(sys.executable).resolve().parent,
             REPO_ROOT, *(Path(p) for p in search_path if p)]
    resolved = [p.resolve() for p in dict.fromkeys(paths) if p.exists()]
    return tuple(p for p in dict.fromkeys(resolved) if not (p == temp or p in temp.parents))


def _under(path: Path, roots: Sequence[Path]) -> bool:
    """`path` is one of `roots` or inside one (absolute, resolved paths; by their text: `Path.parents` builds
    a Path per level, and an argv compares every runtime path with every hidden one)."""
    text = str(path)
    return any(text == (root := str(r)) or text.startswith(root.rstrip("/") + "/") for r in roots)


SYSTEM_DIRS = ("usr", "etc", "sys", "bin", "sbin", "lib", "lib32", "lib64", "libx32")
"""What a runtime-only child sees of the host besides the runtime: programs, libraries, configuration, the kernel's
device information (torch reads the CPU's caches there, CUDA its devices). Merged-/usr links stay links."""


def _root_view(runtime_only: bool, runtime: Sequence[Path], system: Mapping[str, str | None]) -> list[str]:
    """The child's root: the host's, read-only; or, `runtime_only`, an empty one with the `system` entries (name:
    link target, None for a directory) and the runtime paths outside /tmp (those under it are bound after the
    private /tmp) bound read-only."""
    if not runtime_only:
        return ["--ro-bind", "/", "/"]
    argv: list[str] = []
    for name, target in system.items():
        argv += ["--symlink", target, f"/{name}"] if target is not None else ["--ro-bind", f"/{name}", f"/{name}"]
    shown = [Path("/tmp"), *(Path("/", name) for name in system)]
    for path in sorted(runtime):  # a folder before the folders in it, which it then shows already
        if not _under(path, shown):
            argv += _traversable_parents(path, [Path("/")])
            argv += ["--ro-bind", str(path), str(path)]
            shown.append(path)
    return argv


@functools.lru_cache(maxsize=1)
def system_entries() -> dict[str, str | None]:
    """SYSTEM_DIRS as this host has them: a link's target, None for a directory; absent ones left out."""
    found: dict[str, str | None] = {}
    for name in SYSTEM_DIRS:
        path = Path("/", name)
        if path.is_symlink():
            found[name] = os.readlink(path)
        elif path.is_dir():
            found[name] = None
    return found


def bwrap_argv(command: Sequence[str], *, scratch: Path, policy: SandboxPolicy, limits: Limits,
               env: Mapping[str, str], hidden: Sequence[Path], runtime: Sequence[Path], uid: int | None,
               system: Mapping[str, str | None] | None = None, info_fd: int | None = None) -> list[str]:
    """The full argv (pure: tests assert it). `uid` set: the worker is root and the command drops to it
    with setpriv; None: an unprivileged bubblewrap with a user namespace. `system`: the host's SYSTEM_DIRS
    (`system_entries()`), read only for a runtime-only child. `info_fd`: where bubblewrap writes its
    sandbox's init pid (`_sandbox_init`)."""
    root = _root_view(policy.runtime_only, runtime, system if system is not None else system_entries())
    argv = ["bwrap", *root, "--dev", "/dev", "--proc", "/proc",
            "--perms", "1777", "--size", str(TMP_BYTES), "--tmpfs", "/tmp",
            "--unshare-pid", "--unshare-ipc", "--unshare-uts", "--unshare-cgroup-try",
            "--die-with-parent", "--new-session", "--clearenv"]
    if info_fd is not None:
        argv += ["--info-fd", str(info_fd)]
    if not policy.network:
        argv.append("--unshare-net")
    if uid is None:
        argv += ["--unshare-user", "--uid", "65534", "--gid", "65534", "--disable-userns"]
    tmp = [Path("/tmp")]
    for path in runtime:  # an interpreter or checkout under /tmp (a CI clone) stays readable over the private /tmp
        if _under(path, tmp) and not _under(path, hidden):
            argv += _traversable_parents(path, tmp)
            argv += ["--ro-bind", str(path), str(path)]
    for path in hidden:  # after those binds: a state dir inside such a checkout is still hidden
        argv += ["--tmpfs", str(path)]
    for path in runtime:
        if _under(path, hidden):
            argv += _traversable_parents(path, [*hidden, *tmp])
            argv += ["--ro-bind", str(path), str(path)]
    empty = [Path("/")] if policy.runtime_only else []  # the folders bubblewrap makes in its empty root
    for path in policy.readable:
        argv += _traversable_parents(path, [*hidden, *tmp, *empty])
        argv += ["--ro-bind", str(path), str(path)]
    if policy.gpu:
        for dev in sorted(glob.glob("/dev/nvidia*")):
            argv += ["--dev-bind", dev, dev]
    for path in (scratch, *policy.writable):
        argv += _traversable_parents(path, [*hidden, Path("/tmp"), *empty])
        argv += ["--bind", str(path), str(path)]
    argv += ["--chdir", str(scratch)]
    for key, value in env.items():
        argv += ["--setenv", key, value]
    argv += ["--", *_prlimit(limits)]
    if uid is not None:
        argv += ["setpriv", f"--reuid={uid}", f"--regid={uid}", "--clear-groups", "--inh-caps=-all",
                 "--bounding-set=-all", "--"]
    return argv + list(command)


def _traversable_parents(path: Path, tmpfs_roots: Sequence[Path]) -> list[str]:
    """bubblewrap recreates the parents of a bind inside a tmpfs with the host's modes (a 0700 temp dir);
    the unprivileged child must pass through them to reach its scratch dir by its absolute path."""
    roots = [r for r in tmpfs_roots if r in path.parents]
    if not roots:
        return []
    root = max(roots, key=lambda r: len(r.parts))
    argv: list[str] = []
    for parent in reversed(path.parents):
        if root in parent.parents:
            argv += ["--perms", "0755", "--dir", str(parent)]
    return argv


def _prlimit(limits: Limits) -> list[str]:
    memory = str(limits.memory_bytes) if limits.memory_bytes else "unlimited"
    cpu = limits.cpu_s if limits.cpu_s is not None else int(limits.timeout_s) + 10
    return ["prlimit", f"--as={memory}", f"--cpu={cpu}:{cpu + 5}", f"--fsize={limits.file_bytes}",
            f"--nproc={limits.processes}", "--core=0", "--"]


def base_env(scratch: Path) -> dict[str, str]:
    """What every child gets: a PATH, a locale, its scratch dir as HOME and TMPDIR, the repository on
    PYTHONPATH, a user name (its uid has no passwd entry, and `getpass.getuser()` in torch.compile's cache
    lookup fails without one). Nothing of the worker's own environment (no keys, no endpoints)."""
    return {"PATH": "/usr/local/bin:/usr/bin:/bin", "LANG": "C.UTF-8", "HOME": str(scratch), "TMPDIR": str(scratch),
            "PYTHONPATH": str(REPO_ROOT), "PYTHONDONTWRITEBYTECODE": "1", "OMP_NUM_THREADS": "1",
            "USER": "sandbox", "LOGNAME": "sandbox"}


def unavailable() -> str | None:
    """Why bubblewrap cannot confine a child on this worker, or None."""
    return _probe()


def _probe() -> str | None:
    """None when bubblewrap can start a sandbox here, else why not. A success is remembered for the
    configuration; a failure is not (a loaded machine can fail one start), so the next child asks again."""
    with _LOCK:
        if _CONFIG.probed and _CONFIG.probe is None:
            return None
        reason = None
        missing = [tool for tool in ("bwrap", "prlimit", "setpriv") if shutil.which(tool) is None]
        if missing:
            reason = f"{', '.join(missing)} not found on the worker"
        else:
            probe_dir = Path(os.environ.get("TMPDIR", "/tmp"))
            argv = bwrap_argv(["true"], scratch=probe_dir, policy=SandboxPolicy(), limits=Limits(timeout_s=10),
                              env={}, hidden=hidden_paths(), runtime=runtime_paths(),
                              uid=_child_uid() if os.geteuid() == 0 else None)
            try:
                done = subprocess.run(argv, capture_output=True, timeout=30, check=False)
                if done.returncode != 0:
                    said = done.stderr.decode(errors="replace").strip()[:300]
                    reason = f"bubblewrap failed ({exit_description(done.returncode)}){': ' + said if said else ''}"
            except (OSError, subprocess.TimeoutExpired) as e:
                reason = f"bubblewrap failed: {e}"
        _CONFIG.probe, _CONFIG.probed = reason, True
        return reason


def _child_uid() -> int:
    return UID_RANGE[0] + secrets.randbelow(UID_RANGE[1] - UID_RANGE[0])


def _hand_over(paths: Sequence[Path], uid: int) -> None:
    """Give the child's uid its writable paths (a root worker's files stay readable to the worker)."""
    for top in paths:
        os.chown(top, uid, uid)
        for dirpath, dirnames, filenames in os.walk(top):
            for name in (*dirnames, *filenames):
                os.chown(os.path.join(dirpath, name), uid, uid, follow_symlinks=False)


def disk_used(paths: Sequence[Path]) -> int:
    total = 0
    for top in paths:
        for dirpath, _dirs, files in os.walk(top):
            for name in files:
                try:
                    total += os.lstat(os.path.join(dirpath, name)).st_size
                except OSError:
                    pass
    return total


class Child:
    """A started child: its process (bubblewrap's, or the command's when unconfined), its log, and
    what ended it (`error`, None when it exited 0)."""

    def __init__(self, proc: subprocess.Popen, log: Path, writable: tuple[Path, ...], limits: Limits, confined: bool,
                 init_pid: int | None = None):
        self.proc = proc
        self.log = log
        self.writable = writable
        self.limits = limits
        self.confined = confined
        self.started = time.monotonic()
        self._disk_base = disk_used(writable)
        self._namespace: str | None = None
        """The child's PID namespace (`pid:[inode]`), held from the start (bubblewrap names its init): what `kill`
        waits to be empty."""
        self._namespace_fd: int | None = None
        self.error: str | None = None
        self.log_excerpt = ""
        """What the caller made of the log for a report (its own format; scrubbed)."""
        self.exit_code: int | None = None
        self.elapsed = 0.0
        self.timed_out = False
        """Killed at its time limit (`error` says after how long)."""
        if init_pid is not None:
            self._hold_namespace(init_pid)

    @property
    def pid(self) -> int:
        return self.proc.pid

    def pids(self) -> list[int]:
        """Host pids of the child's processes: bubblewrap's and everything below it (who holds a socket)."""
        return [self.proc.pid, *_descendants(self.proc.pid)]

    def poll(self) -> int | None:
        """The exit code, negative for a signal (bubblewrap reports a signalled child as 128 + N)."""
        code = self.proc.poll()
        if code is not None and self.confined and 128 < code < 128 + signal.NSIG:
            return -(code - 128)
        return code

    def over_disk_budget(self) -> bool:
        return disk_used(self.writable) - self._disk_base > self.limits.disk_bytes

    def kill(self) -> None:
        """Kill the whole child and wait until nothing of it is left: bubblewrap, the namespace's init
        (with it the kernel kills everything in the PID namespace), and the command (another session).
        bubblewrap exits as soon as the command does, while its init still waits for the command's own children
        (a test's background server, a fork bomb's processes), so this waits until the namespace is empty.
        Its pid and process group are signalled only while they are still its own: until it is reaped (a zombie
        keeps its pid). Once reaped, that number may belong to a stranger; what is left is then found by the
        namespace held from the start and, unconfined, by the members of its group, each checked through a pidfd."""
        if self.proc.returncode is None:
            tree = _descendants(self.proc.pid)
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.proc.pid, signal.SIGKILL)
            for pid in [self.proc.pid, *tree]:
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.kill(pid, signal.SIGKILL)
        else:
            tree = _members(group := _in_group(self.proc.pid))
            for pid in tree:
                _kill_checked(pid, group)
        self.proc.wait()
        in_namespace = _in_namespace(self._namespace) if self._namespace is not None else None
        deadline = time.monotonic() + KILL_WAIT_S
        try:
            while time.monotonic() < deadline:
                tree = [pid for pid in tree if _alive(pid)]
                left = _members(in_namespace) if in_namespace is not None else []
                if not tree and not left:
                    return
                for pid in left:
                    _kill_checked(pid, in_namespace)
                time.sleep(0.01)
        finally:
            self._release_namespace()

    def _hold_namespace(self, init_pid: int) -> None:
        """Remember the PID namespace of the sandbox's init (`init_pid`, from bubblewrap as it starts) and hold
        it open: while we hold it, its inode number cannot be reused by another child's new namespace, so `kill`
        never reaches a stranger's processes."""
        try:
            pidfd = os.pidfd_open(init_pid)
        except OSError:  # it has already exited, and with it its namespace
            return
        try:
            fd = os.open(f"/proc/{init_pid}/ns/pid", os.O_RDONLY)
        except OSError:
            os.close(pidfd)
            return
        try:
            signal.pidfd_send_signal(pidfd, 0)  # still the process the pidfd names: the namespace opened is its
            name = os.readlink(f"/proc/self/fd/{fd}")
        except OSError:
            os.close(fd)
            return
        finally:
            os.close(pidfd)
        if name == _pid_namespace(os.getpid()):
            os.close(fd)
            return
        self._namespace, self._namespace_fd = name, fd

    def _release_namespace(self) -> None:
        if self._namespace_fd is not None:
            os.close(self._namespace_fd)
        self._namespace, self._namespace_fd = None, None

    def __del__(self) -> None:
        if getattr(self, "_namespace_fd", None) is not None:
            with contextlib.suppress(OSError):
                os.close(self._namespace_fd)  # type: ignore[arg-type]

    def tail(self, lines: int = 3, chars: int = 400) -> list[str]:
        """The child's last non-empty log lines, each bounded, scrubbed of the worker's secrets."""
        return [scrub(ln[-chars:]) for ln in log_lines(self.log)[-lines:]]

    def finish(self, code: int | None, error: str | None, *, timed_out: bool = False) -> None:
        self.exit_code, self.error, self.timed_out = code, error, timed_out
        self.elapsed = time.monotonic() - self.started


def proc_stat(pid: int) -> list[str] | None:
    """Fields of /proc/PID/stat after the command name (state first, then ppid, pgrp, ...), or None when
    there is no such process. Raw reads: a scan of /proc reads one of these per process, several times
    per sandboxed child, and pathlib's text I/O cost seven system calls a file where this costs three."""
    try:
        fd = os.open(f"/proc/{pid}/stat", os.O_RDONLY)
    except OSError:
        return None
    try:
        raw = os.read(fd, 4096)
    except OSError:
        return None
    finally:
        os.close(fd)
    return raw[raw.rindex(b")") + 2:].decode().split() if raw else None


def _alive(pid: int) -> bool:
    fields = proc_stat(pid)
    return fields is not None and fields[0] != "Z"


def _pid_namespace(pid: int) -> str | None:
    try:
        return os.readlink(f"/proc/{pid}/ns/pid")
    except OSError:
        return None


def _in_namespace(namespace: str) -> Callable[[int], bool]:
    return lambda pid: _pid_namespace(pid) == namespace


def _in_group(pgid: int) -> Callable[[int], bool]:
    """Membership of process group `pgid` (while one member lives, no new process can be given that number)."""
    return lambda pid: (fields := proc_stat(pid)) is not None and fields[2] == str(pgid)


def _members(ours: Callable[[int], bool]) -> list[int]:
    """Live processes for which `ours(pid)` holds (host pids, from a scan of /proc)."""
    return [int(e.name) for e in os.scandir("/proc") if e.name.isdigit() and ours(int(e.name)) and _alive(int(e.name))]


def _kill_checked(pid: int, ours: Callable[[int], bool]) -> None:
    """SIGKILL `pid` if `ours(pid)` still holds: a pidfd pins the process first, so the check and the signal are
    about the same one even if `pid` found in a scan of /proc has exited since and its number was given to another."""
    try:
        pidfd = os.pidfd_open(pid)
    except OSError:
        return
    try:
        if ours(pid):
            signal.pidfd_send_signal(pidfd, signal.SIGKILL)
    except OSError:
        pass
    finally:
        os.close(pidfd)


def _descendants(root: int) -> list[int]:
    """Every process below `root` (host pids), parents first."""
    children: dict[int, list[int]] = {}
    for entry in os.scandir("/proc"):
        if entry.name.isdigit() and (fields := proc_stat(int(entry.name))):
            children.setdefault(int(fields[1]), []).append(int(entry.name))
    found, frontier = [], [root]
    while frontier:
        kids = [k for pid in frontier for k in children.get(pid, [])]
        found += kids
        frontier = kids
    return found


def log_lines(log: Path) -> list[str]:
    try:
        return [ln for ln in log.read_text(encoding="utf-8", errors="replace").splitlines() if ln.strip()]
    except OSError:
        return []


def spawn_child(command: Sequence[str], *, scratch: Path, limits: Limits, policy: SandboxPolicy = SandboxPolicy(),
                env: Mapping[str, str] | None = None, log: Path | None = None) -> Child:
    """Start `command` in the sandbox with `scratch` as its cwd, HOME and TMPDIR; stdout and stderr go to
    `log` (default scratch/child.log). Raises SANDBOX_UNAVAILABLE when it cannot be confined."""
    scratch = scratch.resolve()
    writable = (scratch, *(p.resolve() for p in policy.writable))
    child_env = {**base_env(scratch), **(env or {})}
    log = log or scratch / "child.log"
    confined = _CONFIG.mode is SandboxMode.BWRAP
    if confined:
        problem = _probe()
        if problem:
            raise FleetforgeError(Err.SANDBOX_UNAVAILABLE,
                                  f"cannot start a sandboxed child ({problem}): untrusted code does not run unconfined")
        uid = _child_uid() if os.geteuid() == 0 else None
        if uid is not None:
            _hand_over(writable, uid)
        info, info_w = os.pipe()
        argv = bwrap_argv(command, scratch=scratch, policy=policy, limits=limits, env=child_env,
                          hidden=hidden_paths(), runtime=runtime_paths(), uid=uid, info_fd=info_w)
        popen_env: dict[str, str] | None = {"PATH": os.environ.get("PATH", "/usr/bin:/bin")}
    else:  # prlimit execs the command: its parent is this worker, whose death it can check for
        info, info_w = None, None
        argv = [*_prlimit(limits), *command]
        popen_env = {**child_env, PARENT_PID_VAR: str(os.getpid())}
    try:
        with log.open("ab") as out:
            proc = subprocess.Popen(argv, cwd=scratch, env=popen_env, stdin=subprocess.DEVNULL, stdout=out,
                                    stderr=subprocess.STDOUT, start_new_session=True,
                                    pass_fds=() if info_w is None else (info_w,))
    except BaseException:
        if info is not None:
            os.close(info)
        raise
    finally:
        if info_w is not None:
            os.close(info_w)
    return Child(proc, log, writable, limits, confined, init_pid=None if info is None else _sandbox_init(info))


def _sandbox_init(info: int) -> int | None:
    """The host pid of the sandbox's init, read from bubblewrap's `--info-fd` (it writes it, then lets the init
    start the command; EOF once bubblewrap closes or exits). None if bubblewrap failed before it."""
    data = b""
    deadline = time.monotonic() + INFO_WAIT_S
    with os.fdopen(info, "rb", buffering=0) as stream:
        while (left := deadline - time.monotonic()) > 0 and select.select([stream], [], [], left)[0]:
            chunk = stream.read(4096)
            if not chunk:
                break
            data += chunk
    try:
        return int(json.loads(data)["child-pid"])
    except (ValueError, KeyError, TypeError):
        return None


POLL_S = 0.25


def wait_children(children: Mapping[str, Child], *, timeout_s: float, beat: Callable[[str], None] = lambda _m: None,
                  cancelled: Callable[[], bool] | None = None, limit: Callable[[str], float] | None = None) -> None:
    """Wait for every child, killing the ones past their time limit or over their disk budget; each gets
    `exit_code` and `error` (None when it exited 0). Every child is dead when this returns or raises.
    A child's limit is `limit(name)` seconds from its own start, asked again at every poll (it may depend on
    how long another child took), else `timeout_s` from now for all.
    `cancelled()` true: kill them all and raise the activity's CancelledError."""
    start = time.monotonic()
    pending = dict(children)
    try:
        while pending:
            for name, child in list(pending.items()):
                code = child.poll()
                if code is not None:
                    if code != 0 and child.confined and (said := _sandbox_setup_error(child)):
                        # never the candidate's or the model's failure; bubblewrap's own can be a loaded machine's
                        raise FleetforgeError(Err.SANDBOX_UNAVAILABLE, f"the sandbox did not start ({said})",
                                              retryable=said.startswith("bwrap: "))
                    child.finish(code, None if code == 0 else exit_reason(code, child))
                    del pending[name]
                elif child.over_disk_budget():
                    child.kill()
                    child.finish(None, f"wrote more than {_gib(child.limits.disk_bytes)} (disk budget); killed")
                    del pending[name]
            now = time.monotonic()
            for name, child in list(pending.items()):
                seconds, since = (limit(name), child.started) if limit is not None else (timeout_s, start)
                if now - since > seconds:
                    child.kill()
                    child.finish(None, f"timed out after {seconds:g}s (killed)", timed_out=True)
                    del pending[name]
            if not pending:
                return
            if cancelled is not None and cancelled():
                from temporalio.exceptions import CancelledError

                raise CancelledError("the activity was cancelled; its child processes were killed")
            beat(f"waiting for {', '.join(pending)}")
            try:
                next(iter(pending.values())).proc.wait(timeout=POLL_S)
            except subprocess.TimeoutExpired:
                pass
    finally:
        for child in children.values():
            child.kill()  # also an exited one: what it left running in its namespace goes now


def _sandbox_setup_error(child: Child) -> str:
    """What bubblewrap, prlimit or setpriv said when they failed before the command started ("" otherwise)."""
    first = log_lines(child.log)[:1]
    if first and first[0].startswith(("bwrap: ", "prlimit: ", "setpriv: ")):
        return first[0][:300]
    return ""


def exit_description(code: int) -> str:
    """"signal SIGSEGV" for a negative exit code, "exit code 3" otherwise."""
    if code < 0:
        try:
            return f"signal {signal.Signals(-code).name}"
        except ValueError:
            return f"signal {-code}"
    return f"exit code {code}"


def exit_reason(code: int, child: Child) -> str:
    """"crashed: exit code 1: <last log line>" (scrubbed)."""
    last = child.tail(1)
    killed = "killed by " if code < 0 else ""
    return f"crashed: {killed}{exit_description(code)}" + (f": {last[0]}" if last else "")


def _gib(n: int) -> str:
    return f"{n / 1024**3:g} GiB"
