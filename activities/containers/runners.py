"""Runners execute one already-checked command for one model test and report a TestOutcome.

* ProcessRunner: the command is split like a shell would split words (`shlex`: quoted arguments are
  arguments), but no shell ever runs it: an unquoted shell operator (`;`, `&&`, `|`, `>`, ...) is
  refused, and the program must be on the allowlist. It runs in the one sandbox (activities/sandbox:
  an LLM may have written it): its own PID namespace, a read-only filesystem but a scratch folder (its
  cwd), the folders the fleet shares (`--share`, read-only), no secrets, not root; it shares the host's
  network, since its server must answer on 127.0.0.1. The row's slot reaches it as `PORT` and
  `CUDA_VISIBLE_DEVICES`. Pass (ProcessMode): a server on `$PORT` probed like a container while the
  command runs, or, in self-test mode, exit 0 before the deadline and the row's probe URL (if any)
  answering 2xx (SERVES at most). A command that fails on a path the sandbox hides is our Error.
* DockerRunner: a `docker run` re-parsed against the policy and the row's slot, rendered with our
  deterministic name and `fleetforge.run` label. The slot's port must be free before the container
  starts; health and probe go to that port only, and the server that answers must list the row's model
  (probe.py, identity.py): another model listed by the row's own container is MISMATCH, by a stranger's
  server IDENTITY. Then the fixed prompt set, graded into a tier (BOOTS, SERVES, SENSIBLE, MATCHES), or
  the row's probe URL (SERVES). The container is always removed (`docker rm -f`), also on cancellation
  and timeout; every wait beats, so a cancellation reaches the activity within its heartbeat timeout.
* ScriptRunner: the original `test_models.sh <model> <command>` contract (0 pass, 1 fail, 2 timeout). The
  script is the operator's own harness (it drives docker itself), so it runs unconfined; the command
  reaches it as one argument, as data.

At-least-once: a retried activity may find its test's earlier run still alive (the worker died, the
test did not). The process and script runners kill it first through the row's marker (_marker.py);
the docker runner removes the container of the same deterministic name. Either way the outcome's
`test_runs` says how often the test started.

Every runner stores the full log in the artifact store and returns its tail. Runners never raise
for a failing test; they raise FleetforgeError only for a command that must not run at all.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import os
import re
import shlex
import shutil
import signal
import sys
import time
from collections.abc import Awaitable, Callable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Protocol

from activities.containers._marker import TAG_VAR, Intent, RowMarker, StartIntents
from activities.containers._ports import listening_pids, port_taken
from activities.containers.evidence import UNPROVABLE, meets, shortfall, tier_of
from activities.containers.offline_writer import writer_policy
from activities.containers.policy import check_command, container_name, declared_ports, render_argv, run_labels
from activities.containers.probe import HEARTBEAT_S, MISMATCH, PROBE_BUDGET_S, Heartbeat, probe_get, probe_server
from activities.containers.taxonomy import DAEMON_LOST, daemon_unreachable
from activities.sandbox import Child, Limits, SandboxPolicy, hidden_by, scrub, shareable, spawn_child
from activities.scratch import Scratch
from activities.storage import ArtifactStore
from contracts.errors import Err, FleetforgeError
from contracts.fleet import CommandPolicy, DockerRunSpec, Evidence, HardwareProfile, Slot, TestPhase
from contracts.fleet_job import ProcessMode, RunTestRequest, TestOutcome

DEFAULT_PROGRAMS: tuple[str, ...] = ("python", "python3")
TAIL_CHARS = 4000
EXIT_POLL_S = 0.05
"""Longest pause between heartbeats while a runner waits (a quarter of the CONTAINER heartbeat timeout, or less)."""


class Runner(Protocol):
    async def run(self, req: RunTestRequest, heartbeat: Heartbeat) -> TestOutcome: ...


def _reject(reason: str) -> FleetforgeError:
    return FleetforgeError(Err.POLICY_REJECTED, f"command rejected: {reason}")


_OPERATOR_CHARS = frozenset("();<>|&")


def split_words(command: str) -> list[str]:
    """Words of a command as a POSIX shell would split them (quotes group, backslashes escape), with
    every unquoted shell operator refused: nothing runs a shell, so `a; b` would not do what it says."""
    if any(c in command for c in "\n\r\x00"):
        raise _reject("one command on one line (no newline or NUL byte)")
    lexer = shlex.shlex(command, posix=True, punctuation_chars=True)
    lexer.whitespace_split = True
    try:
        words = list(lexer)
    except ValueError as e:
        raise _reject(f"cannot parse the command ({e})") from None
    if op := next((w for w in words if w and set(w) <= _OPERATOR_CHARS), None):
        raise _reject(f"shell operators are not allowed (`{op}` outside quotes): no shell runs this command; "
                      "quote the argument if it is one")
    return words


def process_argv(command: str, programs: Sequence[str] = DEFAULT_PROGRAMS) -> list[str]:
    """The argv a process-runner command runs as; raises FleetforgeError(POLICY_REJECTED).
    `python`/`python3` run as the worker's own interpreter."""
    tokens = split_words(command)
    if not tokens:
        raise _reject("the command is empty")
    if tokens[0] not in programs:
        raise _reject(f"program {tokens[0]!r} is not allowed (allowed: {', '.join(programs)}; "
                      "FLEETFORGE_PROCESS_PROGRAMS on the containers worker sets the list)")
    if tokens[0] in ("python", "python3"):
        return [sys.executable, *tokens[1:]]
    resolved = _which(tokens[0], os.environ.get("PATH", ""))
    if resolved is not None and not os.access(resolved, os.X_OK):  # removed since: look again
        _which.cache_clear()
        resolved = _which(tokens[0], os.environ.get("PATH", ""))
    if resolved is None:
        raise FleetforgeError(Err.RUNNER_UNAVAILABLE, f"program {tokens[0]!r} is not installed on this worker")
    return [resolved, *tokens[1:]]


@functools.lru_cache(maxsize=32)
def _which(program: str, search_path: str) -> str | None:
    """`shutil.which`, once per program and PATH: it stats every PATH folder, for every row."""
    return shutil.which(program, path=search_path)


def slot_env(slot: Slot | None) -> dict[str, str]:
    """What a process/script test learns of its slot: the port to serve on and the GPUs it may use."""
    if slot is None:
        return {}
    return {"PORT": str(slot.port), "CUDA_VISIBLE_DEVICES": ",".join(map(str, slot.devices))}


def tail(text: str, limit: int = TAIL_CHARS) -> str:
    return text if len(text) <= limit else text[-limit:]


async def _run_argv(argv: Sequence[str], timeout_s: float, heartbeat: Heartbeat, what: str,
                    cwd: Path | None = None, env: Mapping[str, str] | None = None,
                    on_start: Callable[[int], None] | None = None) -> tuple[int | None, str]:
    """Run argv (no shell) in its own process group; (exit code or None on timeout, combined output).
    The run ends when the program exits (a background child still holding its output does not keep
    it going); then the whole group is killed, as on timeout and on cancellation: nothing of a test
    outlives it. `on_start(pid)` runs once the process exists, in a thread (it may fsync a marker: never
    on the event loop, which serves every workflow and activity of the worker)."""
    proc = await asyncio.create_subprocess_exec(
        *argv, stdin=asyncio.subprocess.DEVNULL, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT,
        start_new_session=True, cwd=cwd, env={**os.environ, **env} if env else None,
    )
    assert proc.stdout is not None
    reader = asyncio.ensure_future(proc.stdout.read())
    deadline = time.monotonic() + timeout_s
    beat = time.monotonic() + HEARTBEAT_S
    timed_out = False
    try:
        if on_start is not None:
            await asyncio.to_thread(on_start, proc.pid)
        # poll the exit status: on 3.11 `proc.wait()` also waits for the output pipe, which a background
        # child may hold open for ever
        while proc.returncode is None:
            now = time.monotonic()
            if now >= deadline:
                timed_out = True
                break
            if now >= beat:
                heartbeat(f"{what}: running")
                beat = now + HEARTBEAT_S
            pause = min(EXIT_POLL_S, deadline - now)
            await (asyncio.sleep(pause) if reader.done() else asyncio.wait({reader}, timeout=pause))
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)  # the group: a test's children must not outlive it either
    out = await asyncio.shield(reader)
    await asyncio.shield(proc.wait())
    text = (out or b"").decode("utf-8", "replace")
    return (None if timed_out else proc.returncode), text


Serve = Callable[[Child, asyncio.Event], Awaitable[None]]
"""Watches a running command (a server it should start); the event is set once the command has exited."""


async def _run_confined(argv: Sequence[str], timeout_s: float, heartbeat: Heartbeat, what: str,
                        cwd: Path | None = None, env: Mapping[str, str] | None = None,
                        on_start: Callable[[int], None] | None = None, shares: Sequence[Path] = (),
                        serve: Serve | None = None) -> tuple[int | None, str]:
    """`_run_argv`'s contract for a command an LLM may have written: in the sandbox, a fresh scratch folder
    as cwd (`cwd` is not used), `shares` readable, the host's network shared (the server answers on
    127.0.0.1). With `serve`, it runs beside the command and the run ends when it returns (the command is
    killed then; the exit code is None unless the command had exited)."""
    def start() -> tuple[Child, Scratch]:
        """Scratch folder, spawn and `on_start` in one worker thread (fsync'ing a marker never blocks the
        event loop); nothing is left behind when any of them fails."""
        scratch = Scratch("row")
        try:
            child = spawn_child(argv, scratch=scratch.path, policy=SandboxPolicy(network=True, readable=tuple(shares)),
                                limits=Limits(timeout_s=timeout_s, memory_bytes=0), env=dict(env or {}))
        except BaseException:
            scratch.remove()
            raise
        try:
            if on_start is not None:
                on_start(child.pid)
        except BaseException:
            end(child, scratch)
            raise
        return child, scratch

    def end(child: Child, scratch: Scratch) -> str:
        """Kill what is left of the child (nothing of a test outlives it), read its log, drop its scratch folder."""
        try:
            child.kill()
            return scrub(child.log.read_text(encoding="utf-8", errors="replace"))
        finally:
            scratch.remove()

    starting = asyncio.ensure_future(asyncio.to_thread(start))
    try:
        child, scratch = await asyncio.shield(starting)
    except asyncio.CancelledError:  # cancelled while it started: it still starts, and is ended at once
        with contextlib.suppress(Exception):
            await asyncio.to_thread(end, *await starting)
        raise
    deadline = time.monotonic() + timeout_s
    beat = time.monotonic() + HEARTBEAT_S
    timed_out = False
    gone = asyncio.Event()
    watcher = asyncio.ensure_future(serve(child, gone)) if serve is not None else None
    try:
        with _exit_event(child.pid) as exited:
            # the first look once it exited or after one interval: most tests end before, and a look at a
            # running child (Child.poll) scans /proc for its namespace
            await _until(exited, min(EXIT_POLL_S, timeout_s), watcher)
            while (code := child.poll()) is None and not (watcher and watcher.done()):
                now = time.monotonic()
                if now >= deadline:
                    timed_out = True
                    break
                if now >= beat:
                    heartbeat(f"{what}: running")
                    beat = now + HEARTBEAT_S
                await _until(exited, min(EXIT_POLL_S, deadline - now), watcher)
            if watcher is not None and code is not None and not watcher.done():  # exited while it was watched
                gone.set()
                await asyncio.wait({watcher}, timeout=max(0.0, deadline - time.monotonic()))
    finally:
        if watcher is not None and not watcher.done():
            watcher.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await watcher
        text = await asyncio.shield(asyncio.to_thread(end, child, scratch))
    if watcher is not None and watcher.done() and not watcher.cancelled() and watcher.exception() is not None:
        raise watcher.exception()  # type: ignore[misc]
    return (None if timed_out else code), text


@contextlib.contextmanager
def _exit_event(pid: int) -> Iterator[asyncio.Event]:
    """An event set when the (not yet reaped) process `pid` exits, from its pidfd: a test that ends is seen
    at once, not at the next poll. Where the kernel has no pidfd (before Linux 5.3) it is never set and
    the caller's polls find the exit."""
    exited = asyncio.Event()
    try:
        fd = os.pidfd_open(pid)
    except OSError:
        yield exited
        return
    loop = asyncio.get_running_loop()
    loop.add_reader(fd, exited.set)
    try:
        yield exited
    finally:
        loop.remove_reader(fd)
        os.close(fd)


async def _until(event: asyncio.Event, timeout_s: float, task: asyncio.Future | None = None) -> None:
    """Wait until `event` is set, `task` is done or `timeout_s` passed, whichever comes first."""
    if task is None:
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(event.wait(), max(timeout_s, 0))
        return
    waiter = asyncio.ensure_future(event.wait())
    try:
        await asyncio.wait({waiter, task}, timeout=max(timeout_s, 0), return_when=asyncio.FIRST_COMPLETED)
    finally:
        waiter.cancel()


class _Base:
    def __init__(self, store: ArtifactStore):
        self.store = store

    async def _outcome(self, req: RunTestRequest, started: float, log: str, *, passed: bool, phase: TestPhase,
                       exit_code: int | None = None, test_runs: int = 1, evidence: Evidence | None = None) -> TestOutcome:
        """The outcome with its tier: `evidence` from the docker runner's probe, or (None) the row's own test's
        pass/fail, which proves SERVES at most. A test below `req.require_tier` does not pass."""
        if evidence is None:
            evidence = Evidence(healthy=passed, own_test=passed)
        tier = tier_of(evidence)
        if passed and not meets(tier, req.require_tier):
            passed = False
            unprovable, why = shortfall(evidence, tier, req.require_tier, req.reference is not None)
            log += f"\n{UNPROVABLE}: {why}" if unprovable else f"\n[fleetforge] probe: {why}"
        ref = None
        if log:
            ref = await asyncio.to_thread(
                self.store.put_bytes, log.encode(), media_type="text/plain",
                name=f"fleet/{req.fleet_id}/{req.row}/attempt-{req.attempt}.log")
        return TestOutcome(passed=passed, phase=phase, exit_code=exit_code, log_tail=tail(log), log=ref,
                           duration_s=round(time.monotonic() - started, 3), test_runs=test_runs, tier=tier,
                           evidence=evidence)


def _rerun_note(leftovers: int, what: str) -> str:
    return f"[fleetforge] {leftovers} earlier run(s) of this test were interrupted ({what}); started again\n" if leftovers else ""


class _Marked(_Base):
    """A runner whose test is a process group on this host: one run per row at a time, and an
    interrupted earlier run is killed before the test starts again (see _marker.py)."""

    run_argv = staticmethod(_run_argv)
    records_pid = True
    """Record the started run's pid in the marker (a second durable write) as well as its intent's tag."""

    def __init__(self, store: ArtifactStore, marker_dir: Path | None):
        super().__init__(store)
        self.marker_dir = marker_dir

    async def _run_marked(self, req: RunTestRequest, argv: Sequence[str], timeout_s: float, heartbeat: Heartbeat,
                          cwd: Path | None = None, **options: object) -> tuple[int | None, str, int]:
        """(exit code or None on timeout, output, test runs including interrupted earlier ones); `options` go
        to `run_argv` (the sandbox's shares and server watch)."""
        if self.marker_dir is None:
            code, out = await self.run_argv(argv, timeout_s, heartbeat, f"row {req.row}", cwd=cwd, env=slot_env(req.slot),
                                            **options)
            return code, out, 1
        marker = RowMarker(self.marker_dir, req.fleet_id, req.row)
        async with marker.held(heartbeat):
            leftovers = await marker.stop_leftovers(heartbeat)
            killed = sum(1 for lo in leftovers if lo.killed)
            # durable before the spawn (a crash around it stays findable); fsync'ed off the event loop
            tag = await asyncio.to_thread(marker.intend, req.attempt)
            try:
                code, out = await self.run_argv(argv, timeout_s, heartbeat, f"row {req.row}", cwd=cwd,
                                                env={**slot_env(req.slot), TAG_VAR: tag},
                                                on_start=(lambda pid: marker.started(pid, req.attempt, tag))
                                                if self.records_pid else None, **options)
            finally:
                marker.finished()
        what = f"{killed} still running and killed first" if killed else "none still running"
        return code, _rerun_note(len(leftovers), what) + out, 1 + len(leftovers)


_ABS_PATH = re.compile(r"(?<![\w.~:/-])(/[\w.@+=%,-]+(?:/[\w.@+=%,-]+)*)")
_MISSING = re.compile(r"no such file|can't open|cannot open|not found|does not exist|permission denied|"
                      r"FileNotFoundError|ENOENT|EACCES", re.IGNORECASE)
"""A log line that says something was not there or not readable: only the paths it names are suspects."""
HIDDEN = "[fleetforge] hidden by the sandbox:"
"""The log line's start when a failed command named a path its sandbox hides (the taxonomy reads it)."""


def hidden_path(log: str, shares: Sequence[Path]) -> str:
    """The HIDDEN line for the first path that the failed command's output says it could not find or read,
    that exists on this host but that its sandbox hides (the host's /tmp, the worker's home, ...), or "":
    then the command failed on our sandbox, not on its model, and the remedy names the folder to share."""
    for line in log.splitlines():
        if not _MISSING.search(line):
            continue
        for path in dict.fromkeys(m.rstrip(".,") for m in _ABS_PATH.findall(line)):
            root = hidden_by(path, shares)
            if root is None:
                continue
            folder = path if os.path.isdir(path) else os.path.dirname(path)
            try:
                shareable([folder])
            except FleetforgeError as e:  # not a folder that can be shared as it is: say why
                return f"{HIDDEN} {path}: the command does not see {root}, and {e.message}"
            return (f"{HIDDEN} {path}: rerun with --share {folder} (the command sees its scratch dir, read-only "
                    f"system paths and shared folders, not {root})")
    return ""


EXITED_UNSERVED = ("[fleetforge] the command exited (code 0) before a server answered on port {port}: a server "
                   "keeps running while it is probed (--process-mode self-test: a command that tests itself and exits)")


def _probe_line(problem: str) -> str:
    """The log line for what kept a healthy server from passing (the taxonomy reads its start)."""
    if not problem:
        return ""
    return f"\n{problem}" if problem.startswith((UNPROVABLE, DAEMON_LOST, MISMATCH)) else f"\n[fleetforge] probe: {problem}"


class ProcessRunner(_Marked):
    """The row's command in the sandbox, by its mode (ProcessMode): a server on the slot's port that is probed
    like a container and then stopped, or a self-test whose exit code (and the row's probe URL) is the
    verdict, SERVES at most. A failure on a path the sandbox hides is our Error (HIDDEN), never the model's No."""

    run_argv = staticmethod(_run_confined)  # the command may be an LLM's: the sandbox
    records_pid = False
    """The tag alone finds a sandboxed run, always: bubblewrap's own argv carries it (`--setenv`), which the
    command cannot change, and killing bubblewrap's init ends the whole namespace. So no pid record: it
    cost a second durable write per row, a quarter of the runner's CPU (bench_fleet)."""

    def __init__(self, store: ArtifactStore, programs: Sequence[str] = DEFAULT_PROGRAMS, *, marker_dir: Path | None = None,
                 health_path: str = "/health", poll_s: float = 0.5):
        super().__init__(store, marker_dir)
        self.programs = tuple(programs)
        self.health_path = health_path
        self.poll_s = poll_s

    async def run(self, req: RunTestRequest, heartbeat: Heartbeat) -> TestOutcome:
        argv = process_argv(req.command, self.programs)  # checked again: never trust the caller
        shares = shareable(req.shares)
        if req.process_mode is ProcessMode.SELF_TEST:
            return await self._self_test(req, argv, shares, heartbeat)
        return await self._server(req, argv, shares, heartbeat)

    async def _self_test(self, req: RunTestRequest, argv: Sequence[str], shares: Sequence[Path],
                         heartbeat: Heartbeat) -> TestOutcome:
        started = time.monotonic()
        code, log, runs = await self._run_marked(req, argv, req.timeout_s, heartbeat, shares=shares)
        if code is None:
            return await self._outcome(req, started, log + f"\n[fleetforge] did not finish within {req.timeout_s:g}s "
                                       "(--test-timeout); killed", passed=False, phase=TestPhase.TIMEOUT, test_runs=runs)
        if code != 0:
            if hidden := hidden_path(log, shares):
                return await self._outcome(req, started, f"{log}\n{hidden}", passed=False, phase=TestPhase.HIDDEN,
                                           exit_code=code, test_runs=runs)
            return await self._outcome(req, started, log, passed=False, phase=TestPhase.START, exit_code=code,
                                       test_runs=runs)
        check = "exit 0 (self-test)"
        if req.probe_url:
            status, body = await probe_get(req.probe_url, heartbeat)
            if not 200 <= status < 300:
                return await self._outcome(req, started, log + f"\n[fleetforge] probe: {body}", passed=False,
                                           phase=TestPhase.PROBE, test_runs=runs)
            check += f"; GET {req.probe_url} -> {status}"
        return await self._outcome(req, started, log, passed=True, phase=TestPhase.PROBE, exit_code=0, test_runs=runs,
                                   evidence=Evidence(healthy=True, own_test=True, check=check))

    async def _server(self, req: RunTestRequest, argv: Sequence[str], shares: Sequence[Path],
                      heartbeat: Heartbeat) -> TestOutcome:
        """The command must serve the row's model on the slot's port (GET /health 2xx) while it runs; then
        probe.probe_server judges it, its processes owning the port, and the command is stopped."""
        slot = req.slot or Slot(port=8000)  # no slot (a direct call): the port a server is told by default
        started = time.monotonic()
        if await asyncio.to_thread(port_taken, slot.port):
            return await self._outcome(req, started, f"[fleetforge] address already in use: 127.0.0.1:{slot.port}, this "
                                       "row's port, is held by another process before the command started",
                                       passed=False, phase=TestPhase.START)
        found: list[tuple[TestPhase, str, Evidence]] = []
        url = f"http://127.0.0.1:{slot.port}{self.health_path}"

        async def serve(child: Child, gone: asyncio.Event) -> None:
            """Healthy within --test-timeout, then probed (PROBE_BUDGET_S more at most), like a container."""
            healthy_by = time.monotonic() + req.timeout_s
            while not gone.is_set() and time.monotonic() < healthy_by:
                status, _ = await probe_get(url, heartbeat, timeout_s=5.0)
                if 200 <= status < 300:
                    found.append(await probe_server(
                        slot.port, req, argv[1:],
                        lambda: self._owns_port(child, slot.port), "the row's command", heartbeat))
                    return
                heartbeat(f"waiting for {url}")
                await _until(gone, self.poll_s)

        code, log, runs = await self._run_marked(req, argv, req.timeout_s + PROBE_BUDGET_S, heartbeat, shares=shares,
                                                 serve=serve)
        if found:
            phase, problem, evidence = found[0]
            passed = phase is TestPhase.PROBE and meets(tier_of(evidence), req.require_tier)
            return await self._outcome(req, started, log + ("" if passed else _probe_line(problem)), passed=passed,
                                       phase=phase, exit_code=0 if passed else None, test_runs=runs, evidence=evidence)
        if hidden := hidden_path(log, shares):
            return await self._outcome(req, started, f"{log}\n{hidden}", passed=False, phase=TestPhase.HIDDEN,
                                       exit_code=code, test_runs=runs)
        if code is None:
            return await self._outcome(req, started, log + f"\n[fleetforge] not healthy within {req.timeout_s:g}s "
                                       f"(--test-timeout) on port {slot.port}", passed=False, phase=TestPhase.HEALTH,
                                       test_runs=runs)
        if code == 0:
            return await self._outcome(req, started, log + f"\n{EXITED_UNSERVED.format(port=slot.port)}", passed=False,
                                       phase=TestPhase.HEALTH, test_runs=runs)
        return await self._outcome(req, started, log, passed=False, phase=TestPhase.START, exit_code=code, test_runs=runs)

    @staticmethod
    async def _owns_port(child: Child, port: int) -> bool:
        """The socket listening on `port` belongs to a process of the command's sandbox (False when unknown)."""
        return bool(await asyncio.to_thread(lambda: listening_pids(port, child.pids())))


DAEMON_PATIENCE_S = 60.0
"""How long a worker waits for a docker daemon that stopped answering (a restart takes seconds, its
shutdown up to the containers' stop timeout) before its rows are Errors: counted from when this worker
first saw the outage, not per row, so a daemon that stays down costs one wait, not one per row."""


class DockerRunner(_Base):
    def __init__(self, store: ArtifactStore, *, policy_for: Callable[[HardwareProfile], CommandPolicy] = writer_policy,
                 docker: str = "docker", health_path: str = "/health", poll_s: float = 2.0,
                 marker_dir: Path | None = None, daemon_patience_s: float = DAEMON_PATIENCE_S):
        super().__init__(store)
        self.policy_for = policy_for
        self.docker = docker
        self.health_path = health_path
        self.poll_s = poll_s
        self.marker_dir = marker_dir
        """Where the row locks and start intents live (None: no intents; a rerun is seen only by the
        leftover container of the same name)."""
        self.daemon_patience_s = daemon_patience_s
        self._down_since: float | None = None
        """When this worker first found the daemon not answering (None: it answered last time)."""

    async def _docker(self, *args: str, timeout_s: float = 120.0, heartbeat: Heartbeat = lambda _: None) -> tuple[int | None, str]:
        return await _run_argv([self.docker, *args], timeout_s, heartbeat, f"docker {args[0]}")

    async def run(self, req: RunTestRequest, heartbeat: Heartbeat) -> TestOutcome:
        verdict = check_command(req.command, self.policy_for(req.hardware), req.slot, req.hardware.gpu_count)
        if not verdict.accepted or verdict.spec is None:  # checked again: never trust the caller
            raise FleetforgeError(Err.POLICY_REJECTED, verdict.reason)
        if self.marker_dir is None:
            return await self._run(req, verdict.spec, heartbeat, None)
        async with RowMarker(self.marker_dir, req.fleet_id, req.row).held(heartbeat):
            return await self._run(req, verdict.spec, heartbeat, StartIntents(self.marker_dir, req.fleet_id, req.row))

    async def _run(self, req: RunTestRequest, spec: DockerRunSpec, heartbeat: Heartbeat,
                   intents: StartIntents | None) -> TestOutcome:
        """The test under the row's lock. With intents: the container's name is recorded before `docker run`
        and kept; a retry that finds one kills the earlier `docker run` client and container, runs its own under
        a new name (`-r2`, ...), then counts the earlier starts from the engine's events."""
        slot = req.slot or Slot(port=(declared_ports(spec) or [8000])[0])  # no slot (a direct call): the spec's port
        base = container_name(req.fleet_id, f"{req.row}-{req.model_name}", req.attempt)
        labels = run_labels(req.fleet_id, key=str(req.row), attempt=req.attempt)
        earlier = intents.earlier(req.attempt) if intents else []
        name = base if not earlier else f"{base}-r{len(earlier) + 1}"  # never the name a late start may still take
        if down := await self._daemon_answers(heartbeat):
            return await self._outcome(req, time.monotonic(), down, passed=False, phase=TestPhase.START)
        started = time.monotonic()  # the test's time (--test-timeout) starts once the daemon answers
        code, out = await self._docker("image", "inspect", "--format", "{{.Id}}", spec.image, heartbeat=heartbeat)
        if code != 0:
            log = out if "No such image" in out or "daemon" in out else f"No such image: {spec.image}\n{out}"
            return await self._outcome(req, started, log, passed=False, phase=TestPhase.START)
        if earlier:  # an earlier run of this attempt was about to start a container: stop what is left of it
            await asyncio.to_thread(_kill_docker_clients, [i.name for i in earlier])
            await self._remove_labelled(labels, heartbeat)
            runs = 1
        else:
            _, removed = await self._docker("rm", "-f", name, heartbeat=heartbeat)  # a crashed run without intents
            runs = 2 if removed.strip() == name else 1
        if await asyncio.to_thread(port_taken, slot.port):
            note, runs = await self._runs(labels, earlier, runs, heartbeat)
            return await self._outcome(
                req, started, note + f"[fleetforge] address already in use: 127.0.0.1:{slot.port}, this row's port, "
                "is held by another process before the container started", passed=False, phase=TestPhase.START,
                test_runs=runs)
        if intents is not None:
            # durable before `docker run` (a retry will ask the engine); fsync'ed off the event loop
            await asyncio.to_thread(intents.intend, req.attempt, name)
        passed, phase, exit_code, logs, ours, evidence = False, TestPhase.START, None, "", "", Evidence()
        try:
            code, out = await self._docker(*render_argv(spec, name, labels)[1:], heartbeat=heartbeat)
            ours = out.strip().splitlines()[-1] if code == 0 and out.strip() else ""  # the container id
            if code != 0:
                logs, exit_code = f"{out}\n{DOCKER_REFUSED.format(code=code)}", code
            else:
                phase, exit_code, lost = await self._wait_healthy(name, slot.port, started + req.timeout_s, heartbeat)
                problem = ""
                if phase is TestPhase.PROBE:
                    phase, problem, evidence = await self._probe(name, slot.port, spec, req, heartbeat)
                logs = await self._docker_logs(name, heartbeat)
                passed = phase is TestPhase.PROBE and meets(tier_of(evidence), req.require_tier)
                if passed:
                    exit_code, problem = 0, ""
                elif lost or daemon_unreachable(logs):  # the daemon went away mid-test: no verdict on the model
                    problem = f"{DAEMON_LOST} ({(lost or logs).strip().splitlines()[-1][:160]})"
                if phase is TestPhase.HEALTH:
                    logs += f"\n[fleetforge] not healthy within {req.timeout_s:g}s (--test-timeout) on port {slot.port}"
                logs += _probe_line(problem)
        finally:
            await asyncio.shield(self._remove(name, heartbeat))  # also on cancel/timeout
        note, runs = await self._runs(labels, earlier, runs, heartbeat, ours)
        return await self._outcome(req, started, note + logs, passed=passed, phase=phase, exit_code=exit_code,
                                   test_runs=runs, evidence=evidence)

    async def _daemon_answers(self, heartbeat: Heartbeat) -> str:
        """"" once the daemon answers; its last answer when it stays away past the patience. A restart is
        waited out rather than turned into Error rows; the wait counts from this worker's first sight of the
        outage, so once a daemon has been away that long every row is told at once."""
        while True:
            code, out = await self._docker("version", "--format", "{{.Server.Version}}", timeout_s=30.0,
                                           heartbeat=heartbeat)
            if code == 0 or not daemon_unreachable(out):  # another problem: the test itself will say it
                self._down_since = None
                return ""
            now = time.monotonic()
            self._down_since = self._down_since or now
            if now - self._down_since >= self.daemon_patience_s:
                return out
            heartbeat(f"the docker daemon does not answer: waiting up to {self.daemon_patience_s:g}s for it")
            await asyncio.sleep(1.0)

    async def _remove(self, name: str, heartbeat: Heartbeat, patience_s: float = 30.0) -> None:
        """`docker rm -f name`, tried again while the daemon does not answer (a restart mid-test): a container
        left running would hold the row's port for every later row of that slot."""
        deadline = time.monotonic() + patience_s
        while True:
            code, out = await self._docker("rm", "-f", name, timeout_s=60.0, heartbeat=heartbeat)
            if code == 0 or "No such container" in out or time.monotonic() > deadline:
                return
            heartbeat(f"removing container {name}: the docker daemon does not answer")
            await asyncio.sleep(1.0)

    async def _runs(self, labels: Mapping[str, str], earlier: Sequence[Intent], runs: int,
                    heartbeat: Heartbeat, ours: str = "") -> tuple[str, int]:
        """(log note, test runs). After an interrupted run (intents recorded): the starts the engine recorded
        for this (row, attempt) since the first intent, at least 1 (a run killed before docker started its
        container is no rerun); anything of theirs still there (a start that landed late) is removed. Without
        intents: `runs` as the leftover container of the same name told."""
        if not earlier:
            return _rerun_note(runs - 1, "its container was removed"), runs
        starts = await self._engine_starts(labels, since=min(i.at for i in earlier) - 2.0, heartbeat=heartbeat)
        await self._remove_labelled(labels, heartbeat)
        earlier_starts = len([cid for cid in starts if cid != ours])
        if not earlier_starts:
            return (f"[fleetforge] {len(earlier)} earlier run(s) of this test were interrupted before docker started "
                    "their container (the engine recorded no earlier start)\n"), 1
        return _rerun_note(earlier_starts, "the engine recorded its container's start; what was left was removed"), \
            1 + earlier_starts

    async def _engine_starts(self, labels: Mapping[str, str], since: float, heartbeat: Heartbeat) -> list[str]:
        """Container ids the engine started with exactly these labels since `since` (Unix seconds)."""
        args = ["events", "--since", f"{since:.3f}", "--until", f"{time.time():.3f}", "--filter", "type=container",
                "--filter", "event=start", "--format", "{{.ID}}"]
        for key in sorted(labels):
            args += ["--filter", f"label={key}={labels[key]}"]
        code, out = await self._docker(*args, timeout_s=60.0, heartbeat=heartbeat)
        return out.split() if code == 0 else []

    async def _remove_labelled(self, labels: Mapping[str, str], heartbeat: Heartbeat) -> None:
        """Remove every container (running, exited or created) that carries exactly these labels."""
        args = ["ps", "-aq"]
        for key in sorted(labels):
            args += ["--filter", f"label={key}={labels[key]}"]
        code, out = await self._docker(*args, timeout_s=60.0, heartbeat=heartbeat)
        if code == 0 and out.split():
            await self._docker("rm", "-f", *out.split(), timeout_s=60.0, heartbeat=heartbeat)

    async def _probe(self, name: str, port: int, spec: DockerRunSpec, req: RunTestRequest,
                     heartbeat: Heartbeat) -> tuple[TestPhase, str, Evidence]:
        """probe.probe_server on the row's container: its command's arguments (the model it loads, the names it
        serves it under), its processes as the port's owner."""
        return await probe_server(port, req, spec.args,
                                  lambda: self._owns_port(name, port, heartbeat), f"container {name}", heartbeat)

    async def _owns_port(self, name: str, port: int, heartbeat: Heartbeat) -> bool:
        """The socket listening on `port` belongs to a process of container `name` (False when unknown)."""
        code, out = await self._docker("top", name, "-eo", "pid", heartbeat=heartbeat)
        pids = [int(w) for w in out.split() if w.isdigit()] if code == 0 else []
        owners = await asyncio.to_thread(listening_pids, port, pids) if pids else None
        return bool(owners)

    async def _wait_healthy(self, name: str, port: int, deadline: float,
                            heartbeat: Heartbeat) -> tuple[TestPhase, int | None, str]:
        """(phase, exit code, the daemon's answer if it stopped answering meanwhile, else ""): PROBE when
        healthy; START with the exit code when the container stopped; HEALTH at the deadline."""
        url = f"http://127.0.0.1:{port}{self.health_path}"
        lost = ""
        while time.monotonic() < deadline:
            code, state = await self._docker("inspect", "--format", "{{.State.Running}} {{.State.ExitCode}}", name,
                                             heartbeat=heartbeat)
            parts = state.split()
            if code == 0 and parts and parts[0] == "false":
                return TestPhase.START, int(parts[1]) if len(parts) > 1 and parts[1].lstrip("-").isdigit() else None, lost
            if code != 0 and daemon_unreachable(state):
                lost = lost or state
            status, _ = await probe_get(url, heartbeat, timeout_s=5.0)
            if 200 <= status < 300:
                return TestPhase.PROBE, None, lost
            heartbeat(f"waiting for {url}")
            await asyncio.sleep(min(self.poll_s, max(0.0, deadline - time.monotonic())))
        return TestPhase.HEALTH, None, lost

    async def _docker_logs(self, name: str, heartbeat: Heartbeat) -> str:
        _, out = await self._docker("logs", name, timeout_s=60.0, heartbeat=heartbeat)
        return out


DOCKER_REFUSED = "[fleetforge] the docker engine refused to start the container (docker run exit {code})"
"""The line the runner adds when `docker run` itself failed (not the container): the taxonomy reads it as the
engine's failure, never the model's."""


def _kill_docker_clients(names: Sequence[str]) -> list[int]:
    """SIGKILL every `docker run` client still alive for one of these container names (a dead worker's
    client, in its own session, outlives it and could start the container after the retry looked)."""
    wanted = {n.encode() for n in names}
    killed = []
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            argv = Path(f"/proc/{entry.name}/cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if b"run" in argv and any(a == b"--name" and i + 1 < len(argv) and argv[i + 1] in wanted
                                  for i, a in enumerate(argv)):
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(int(entry.name), signal.SIGKILL)
                killed.append(int(entry.name))
    return killed


class ScriptRunner(_Marked):
    """`<script> <model> <command>`; the log is the script's output plus `<log_dir>/<model>.log` if written."""

    EXIT_PASS, EXIT_FAIL, EXIT_TIMEOUT = 0, 1, 2

    def __init__(self, store: ArtifactStore, script: Path, log_dir: Path | None = None, *, marker_dir: Path | None = None):
        super().__init__(store, marker_dir)
        self.script = script
        self.log_dir = log_dir if log_dir is not None else script.parent / "logs"

    async def run(self, req: RunTestRequest, heartbeat: Heartbeat) -> TestOutcome:
        if not self.script.is_file() or not os.access(self.script, os.X_OK):
            raise FleetforgeError(Err.RUNNER_UNAVAILABLE, f"test script {self.script} is missing or not executable")
        started = time.monotonic()
        # the script gets the command as one argument (it is data to it; no shell here)
        code, out, runs = await self._run_marked(req, [str(self.script), req.model_name, req.command],
                                                 req.timeout_s + 30, heartbeat, cwd=self.script.parent)
        log_file = self.log_dir / (req.model_name.replace("/", "_") + ".log")
        log = out + (log_file.read_text("utf-8", "replace") if log_file.is_file() else "")
        if code == self.EXIT_PASS:
            return await self._outcome(req, started, log, passed=True, phase=TestPhase.PROBE, exit_code=0, test_runs=runs,
                                       evidence=Evidence(healthy=True, own_test=True, check="the test script exited 0"))
        if code in (None, self.EXIT_TIMEOUT):
            return await self._outcome(req, started, log + "\n[fleetforge] the test timed out", passed=False,
                                       phase=TestPhase.TIMEOUT, test_runs=runs)
        return await self._outcome(req, started, log, passed=False, phase=TestPhase.START, exit_code=code,
                                   test_runs=runs)
