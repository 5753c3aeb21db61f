"""Runners execute one already-checked command for one model test and report a TestOutcome.

* ProcessRunner: the command is split like a shell would split words (`shlex`: quoted arguments are
  arguments), but no shell ever runs it: an unquoted shell operator (`;`, `&&`, `|`, `>`, ...) is
  refused, and the program must be on the allowlist. It runs in the one sandbox (activities/sandbox:
  an LLM may have written it): its own PID namespace, a read-only filesystem but a scratch folder (its
  cwd), no secrets, not root; it shares the host's network, since its server must answer on
  127.0.0.1. The row's slot reaches it as `PORT` and `CUDA_VISIBLE_DEVICES`. Pass = exit 0 before the deadline, then the row's probe URL (if any)
  answers 2xx.
* DockerRunner: a `docker run` re-parsed against the policy and the row's slot, rendered with our
  deterministic name and `fleetforge.run` label. The slot's port must be free before the container
  starts; health and probe go to that port only, and the server that answers must be the row's own:
  `/v1/models` lists the row's model, or the listening socket belongs to the row's container.
  Then the fixed prompt set (activities/containers/evidence.py) through `POST /v1/completions` (the
  legacy completions endpoint, not chat: it needs no chat template, so base and chat models answer it
  alike), graded into a tier (BOOTS, SERVES, SENSIBLE, MATCHES), or the row's probe URL (SERVES). The container is
  always removed (`docker rm -f`), also on cancellation and timeout; every wait beats, so a
  cancellation reaches the activity within its heartbeat timeout.
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
import json
import os
import shlex
import shutil
import signal
import sys
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Awaitable, Callable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Protocol, TypeVar

from activities.containers._marker import TAG_VAR, Intent, RowMarker, StartIntents
from activities.containers._ports import listening_pids, port_taken
from activities.containers.evidence import MAX_TOKENS, PROMPTS, SENSIBLE_LATENCY_S, UNPROVABLE, degenerate, meets, shortfall, tier_of
from activities.containers.offline_writer import writer_policy
from activities.sandbox import Child, Limits, SandboxPolicy, scrub, spawn_child
from activities.containers.policy import check_command, container_name, declared_ports, render_argv, run_labels
from activities.containers.taxonomy import DAEMON_LOST, daemon_unreachable
from activities.storage import ArtifactStore
from contracts.errors import Err, FleetforgeError
from contracts.fleet import CommandPolicy, DockerRunSpec, Evidence, HardwareProfile, Slot, TestPhase, Tier
from contracts.fleet_job import RunTestRequest, TestOutcome

Heartbeat = Callable[[str], None]
DEFAULT_PROGRAMS: tuple[str, ...] = ("python", "python3")
TAIL_CHARS = 4000
HEARTBEAT_S = 2.0
EXIT_POLL_S = 0.05
"""Longest pause between heartbeats while a runner waits (a quarter of the CONTAINER heartbeat timeout, or less)."""
COMPLETION_TIMEOUT_S = 60.0
"""A first completion may compile kernels or warm caches: generous, and the wait heartbeats."""
T = TypeVar("T")


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


async def _run_confined(argv: Sequence[str], timeout_s: float, heartbeat: Heartbeat, what: str,
                        cwd: Path | None = None, env: Mapping[str, str] | None = None,
                        on_start: Callable[[int], None] | None = None) -> tuple[int | None, str]:
    """`_run_argv`'s contract for a command an LLM may have written: in the sandbox, a fresh scratch folder
    as cwd (`cwd` is not used), the host's network shared (the server answers on 127.0.0.1)."""
    def start() -> Child:
        """Scratch folder, spawn and `on_start` in one worker thread (fsync'ing a marker never blocks the
        event loop); nothing is left behind when any of them fails."""
        scratch = Path(tempfile.mkdtemp(prefix="ff-row-"))
        try:
            child = spawn_child(argv, scratch=scratch, policy=SandboxPolicy(network=True),
                                limits=Limits(timeout_s=timeout_s, memory_bytes=0), env=dict(env or {}))
        except BaseException:
            shutil.rmtree(scratch, ignore_errors=True)
            raise
        try:
            if on_start is not None:
                on_start(child.pid)
        except BaseException:
            end(child)
            raise
        return child

    def end(child: Child) -> str:
        """Kill what is left of the child (nothing of a test outlives it), read its log, drop its scratch folder."""
        try:
            child.kill()
            return scrub(child.log.read_text(encoding="utf-8", errors="replace"))
        finally:
            shutil.rmtree(child.writable[0], ignore_errors=True)

    starting = asyncio.ensure_future(asyncio.to_thread(start))
    try:
        child = await asyncio.shield(starting)
    except asyncio.CancelledError:  # cancelled while it started: it still starts, and is ended at once
        with contextlib.suppress(Exception):
            await asyncio.to_thread(end, await starting)
        raise
    deadline = time.monotonic() + timeout_s
    beat = time.monotonic() + HEARTBEAT_S
    timed_out = False
    try:
        with _exit_event(child.pid) as exited:
            # the first look once it exited or after one interval: most tests end before, and a look at a
            # running child (Child.poll) scans /proc for its namespace
            await _until(exited, min(EXIT_POLL_S, timeout_s))
            while (code := child.poll()) is None:
                now = time.monotonic()
                if now >= deadline:
                    timed_out = True
                    break
                if now >= beat:
                    heartbeat(f"{what}: running")
                    beat = now + HEARTBEAT_S
                await _until(exited, min(EXIT_POLL_S, deadline - now))
    finally:
        text = await asyncio.shield(asyncio.to_thread(end, child))
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


async def _until(event: asyncio.Event, timeout_s: float) -> None:
    """Wait until `event` is set or `timeout_s` passed, whichever comes first."""
    with contextlib.suppress(TimeoutError):
        await asyncio.wait_for(event.wait(), max(timeout_s, 0))


def _http(url: str, timeout_s: float, payload: dict | None = None) -> tuple[int, str]:
    """(HTTP status or 0 when unreachable, body or error text): a GET, or a JSON POST of `payload`."""
    if not url.startswith(("http://", "https://")):
        return 0, f"probe URL {url!r} must be http(s)"
    data = None if payload is None else json.dumps(payload).encode()
    request = urllib.request.Request(url, data=data, headers={"Content-Type": "application/json"} if data else {})
    try:
        with urllib.request.urlopen(request, timeout=timeout_s) as resp:  # noqa: S310 (scheme checked above)
            return resp.status, resp.read(65536).decode("utf-8", "replace")
    except urllib.error.HTTPError as e:
        return e.code, f"HTTP {e.code} from {url}: {e.read(300).decode('utf-8', 'replace').strip()}"
    except (urllib.error.URLError, OSError, TimeoutError) as e:
        return 0, f"{'POST' if data else 'GET'} {url} failed: {getattr(e, 'reason', e)}"


async def _beating(aw: Awaitable[T], heartbeat: Heartbeat, what: str) -> T:
    """Await `aw`, heartbeating every HEARTBEAT_S meanwhile (a slow probe must not look like a dead worker)."""
    task = asyncio.ensure_future(aw)
    try:
        while not (await asyncio.wait({task}, timeout=HEARTBEAT_S))[0]:
            heartbeat(what)
        return task.result()
    finally:
        task.cancel()


async def _probe_get(url: str, heartbeat: Heartbeat, timeout_s: float = 10.0) -> tuple[int, str]:
    return await _beating(asyncio.to_thread(_http, url, timeout_s), heartbeat, f"probing {url}")


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
                          cwd: Path | None = None) -> tuple[int | None, str, int]:
        """(exit code or None on timeout, output, test runs including interrupted earlier ones)."""
        if self.marker_dir is None:
            code, out = await self.run_argv(argv, timeout_s, heartbeat, f"row {req.row}", cwd=cwd, env=slot_env(req.slot))
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
                                                if self.records_pid else None)
            finally:
                marker.finished()
        what = f"{killed} still running and killed first" if killed else "none still running"
        return code, _rerun_note(len(leftovers), what) + out, 1 + len(leftovers)


class ProcessRunner(_Marked):
    run_argv = staticmethod(_run_confined)  # the command may be an LLM's: the sandbox
    records_pid = False
    """The tag alone finds a sandboxed run, always: bubblewrap's own argv carries it (`--setenv`), which the
    command cannot change, and killing bubblewrap's init ends the whole namespace. So no pid record: it
    cost a second durable write per row, a quarter of the runner's CPU (bench_fleet)."""

    def __init__(self, store: ArtifactStore, programs: Sequence[str] = DEFAULT_PROGRAMS, *, marker_dir: Path | None = None):
        super().__init__(store, marker_dir)
        self.programs = tuple(programs)

    async def run(self, req: RunTestRequest, heartbeat: Heartbeat) -> TestOutcome:
        argv = process_argv(req.command, self.programs)  # checked again: never trust the caller
        started = time.monotonic()
        code, log, runs = await self._run_marked(req, argv, req.timeout_s, heartbeat)
        if code is None:
            return await self._outcome(req, started, log + f"\n[fleetforge] did not finish within {req.timeout_s:g}s "
                                       "(--test-timeout); killed", passed=False, phase=TestPhase.TIMEOUT, test_runs=runs)
        if code != 0:
            return await self._outcome(req, started, log, passed=False, phase=TestPhase.START, exit_code=code,
                                       test_runs=runs)
        if req.probe_url:
            status, body = await _probe_get(req.probe_url, heartbeat)
            if not 200 <= status < 300:
                return await self._outcome(req, started, log + f"\n[fleetforge] probe: {body}", passed=False,
                                           phase=TestPhase.PROBE, test_runs=runs)
        return await self._outcome(req, started, log, passed=True, phase=TestPhase.PROBE, exit_code=0, test_runs=runs)


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
                    phase, problem, evidence = await self._probe(name, slot.port, req, heartbeat)
                logs = await self._docker_logs(name, heartbeat)
                passed = phase is TestPhase.PROBE and meets(tier_of(evidence), req.require_tier)
                if passed:
                    exit_code, problem = 0, ""
                elif lost or daemon_unreachable(logs):  # the daemon went away mid-test: no verdict on the model
                    problem = f"{DAEMON_LOST} ({(lost or logs).strip().splitlines()[-1][:160]})"
                if phase is TestPhase.HEALTH:
                    logs += f"\n[fleetforge] not healthy within {req.timeout_s:g}s (--test-timeout) on port {slot.port}"
                if problem:
                    logs += f"\n{problem}" if problem.startswith((UNPROVABLE, DAEMON_LOST)) else f"\n[fleetforge] probe: {problem}"
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

    async def _probe(self, name: str, port: int, req: RunTestRequest,
                     heartbeat: Heartbeat) -> tuple[TestPhase, str, Evidence]:
        """(phase, what keeps it below the required tier or "", evidence) of the healthy server: it must be
        the row's own (IDENTITY otherwise); then the row's probe URL must answer a GET with 2xx (its own test:
        SERVES at most), or the model must answer the fixed prompt set (evidence.PROMPTS, greedy)."""
        server = f"http://127.0.0.1:{port}"
        status, body = await _probe_get(f"{server}/v1/models", heartbeat)
        models = _model_ids(body) if 200 <= status < 300 else []
        owns = req.model_name in models or await self._owns_port(name, port, heartbeat)
        if not owns:
            listed = f"lists {models}" if models else f"lists no model ({body[:120]})"
            return TestPhase.IDENTITY, (f"the server on port {port} {listed}, not {req.model_name!r}, and its "
                                        f"listening socket is not provably container {name}'s"), Evidence(healthy=True)
        if req.probe_url:
            status, body = await _probe_get(req.probe_url, heartbeat)
            evidence = Evidence(healthy=True, lists_model=bool(models), own_test=200 <= status < 300)
            if not evidence.own_test:
                return TestPhase.PROBE, f"GET {req.probe_url}: {body[:300]}", evidence
            if meets(tier_of(evidence), req.require_tier):
                return TestPhase.PROBE, "", evidence
            return TestPhase.PROBE, f"{UNPROVABLE}: {shortfall(evidence, Tier.SERVES, req.require_tier, True)[1]}", evidence
        if not models:
            return TestPhase.PROBE, f"GET /v1/models lists no model: {body[:300]}", Evidence(
                healthy=True, note="GET /v1/models lists no model")
        model = req.model_name if req.model_name in models else models[0]
        evidence = await self._ask_prompts(server, model, req.reference, heartbeat)
        tier = tier_of(evidence)
        if meets(tier, req.require_tier):
            return TestPhase.PROBE, "", evidence
        unprovable, why = shortfall(evidence, tier, req.require_tier, req.reference is not None)
        return TestPhase.PROBE, f"{UNPROVABLE}: {why}" if unprovable else f"POST /v1/completions (model {model}): {why}", evidence

    async def _ask_prompts(self, server: str, model: str, reference: str | None, heartbeat: Heartbeat) -> Evidence:
        """Send the fixed prompt set (greedy, MAX_TOKENS each) and grade the answers; a server that does not
        answer at all (connection refused, timeout) is asked nothing further."""
        url = f"{server}/v1/completions"
        answered = errors = sensible = 0
        slowest, note, first = 0.0, "", None
        for prompt in PROMPTS:
            t0 = time.monotonic()
            status, body = await _beating(asyncio.to_thread(
                _http, url, COMPLETION_TIMEOUT_S, {"model": model, "prompt": prompt, "max_tokens": MAX_TOKENS,
                                                   "temperature": 0}), heartbeat, f"probing {url}")
            took = time.monotonic() - t0
            slowest = max(slowest, took)
            text = _completion_text(body) if 200 <= status < 300 else None
            if first is None:
                first = text
            if text is None:
                errors += 1
                note = note or f"{prompt!r}: {body[:160]}"
                if status == 0:
                    break
                continue
            answered += 1
            why = degenerate(text) or (f"took {took:.1f}s > {SENSIBLE_LATENCY_S:g}s" if took > SENSIBLE_LATENCY_S else "")
            if why:
                note = note or f"{prompt!r}: {why}"
            else:
                sensible += 1
        matched = None if reference is None else (first is not None and first.strip() == reference.strip())
        if matched is False and not note:
            # the whole answer (16 tokens): a person copies it into the row's `reference` cell
            note = f"greedy answer {(first or '').strip()[:300]!r} is not the reference {reference.strip()[:60]!r}"
        return Evidence(healthy=True, lists_model=True, requests=answered + errors, answered=answered, errors=errors,
                        sensible=sensible, slowest_s=round(slowest, 3), matched=matched, note=note)

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
            status, _ = await _probe_get(url, heartbeat, timeout_s=5.0)
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


def _json(body: str) -> object:
    try:
        return json.loads(body)
    except ValueError:
        return None


def _model_ids(body: str) -> list[str]:
    """The model ids of an OpenAI `/v1/models` answer."""
    data = _json(body)
    models = data.get("data") if isinstance(data, dict) else None
    if not isinstance(models, list):
        return []
    return [m["id"] for m in models if isinstance(m, dict) and isinstance(m.get("id"), str)]


def _completion_text(body: str) -> str | None:
    """The first choice's text of an OpenAI completion answer (None: not a completion)."""
    data = _json(body)
    choices = data.get("choices") if isinstance(data, dict) else None
    if not isinstance(choices, list) or not choices or not isinstance(choices[0], dict):
        return None
    text = choices[0].get("text")
    return text if isinstance(text, str) else ""


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
            return await self._outcome(req, started, log, passed=True, phase=TestPhase.PROBE, exit_code=0, test_runs=runs)
        if code in (None, self.EXIT_TIMEOUT):
            return await self._outcome(req, started, log + "\n[fleetforge] the test timed out", passed=False,
                                       phase=TestPhase.TIMEOUT, test_runs=runs)
        return await self._outcome(req, started, log, passed=False, phase=TestPhase.START, exit_code=code,
                                   test_runs=runs)
