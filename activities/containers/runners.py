"""Runners execute one already-checked command for one model test and report a TestOutcome.

* ProcessRunner: the command is a plain argv (shell operators rejected by the same check as the
  docker policy, program on an allowlist), run with no shell. Pass = exit 0 before the deadline,
  then the row's probe URL (if any) answers 2xx.
* DockerRunner: a `docker run` re-parsed against the policy, rendered with our deterministic name
  and `fleetforge.run` label, health-polled, then probed: the row's probe URL if it has one, else the
  OpenAI-compatible pair `GET /v1/models` + a one-token `POST /v1/completions` (the legacy completions
  endpoint, not chat: it needs no chat template, so base and chat models answer it alike). The
  container is always removed (`docker rm -f`), also on cancellation and timeout; every wait beats,
  so a cancellation reaches the activity within its heartbeat timeout.
* ScriptRunner: the original `test_models.sh <model> <command>` contract (0 pass, 1 fail, 2 timeout).

Every runner stores the full log in the artifact store and returns its tail. Runners never raise
for a failing test; they raise FleetforgeError only for a command that must not run at all.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import shutil
import signal
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Awaitable, Callable, Sequence
from pathlib import Path
from typing import Protocol, TypeVar

from activities.containers.offline_writer import writer_policy
from activities.containers.policy import _split as split_command  # the shared shell-operator check
from activities.containers.policy import container_name, parse_docker_run, render_argv, run_labels
from activities.storage import ArtifactStore
from contracts.errors import Err, FleetforgeError
from contracts.fleet import CommandPolicy, DockerRunSpec, HardwareProfile, TestPhase
from contracts.fleet_job import RunTestRequest, TestOutcome

Heartbeat = Callable[[str], None]
DEFAULT_PROGRAMS: tuple[str, ...] = ("python", "python3")
TAIL_CHARS = 4000
HEARTBEAT_S = 2.0
"""Longest pause between heartbeats while a runner waits (a quarter of the CONTAINER heartbeat timeout, or less)."""
PROBE_PROMPT = {"prompt": "Hello", "max_tokens": 1, "temperature": 0}
"""The tiny completion every OpenAI-compatible server must answer (one token)."""
COMPLETION_TIMEOUT_S = 60.0
"""A first completion may compile kernels or warm caches: generous, and the wait heartbeats."""
T = TypeVar("T")


class Runner(Protocol):
    async def run(self, req: RunTestRequest, heartbeat: Heartbeat) -> TestOutcome: ...


def process_argv(command: str, programs: Sequence[str] = DEFAULT_PROGRAMS) -> list[str]:
    """The argv a process-runner command runs as; raises FleetforgeError(POLICY_REJECTED).
    `python`/`python3` run as the worker's own interpreter."""
    tokens = split_command(command)
    if not tokens:
        raise FleetforgeError(Err.POLICY_REJECTED, "command rejected: the command is empty")
    if tokens[0] not in programs:
        raise FleetforgeError(Err.POLICY_REJECTED,
                              f"command rejected: program {tokens[0]!r} is not allowed (allowed: {', '.join(programs)})")
    if tokens[0] in ("python", "python3"):
        return [sys.executable, *tokens[1:]]
    resolved = shutil.which(tokens[0])
    if resolved is None:
        raise FleetforgeError(Err.RUNNER_UNAVAILABLE, f"program {tokens[0]!r} is not installed on this worker")
    return [resolved, *tokens[1:]]


def tail(text: str, limit: int = TAIL_CHARS) -> str:
    return text if len(text) <= limit else text[-limit:]


async def _run_argv(argv: Sequence[str], timeout_s: float, heartbeat: Heartbeat, what: str,
                    cwd: Path | None = None) -> tuple[int | None, str]:
    """Run argv (no shell) in its own process group; (exit code or None on timeout, combined output).
    The whole group is killed on timeout and on cancellation."""
    proc = await asyncio.create_subprocess_exec(
        *argv, stdin=asyncio.subprocess.DEVNULL, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT,
        start_new_session=True, cwd=cwd,
    )
    reader = asyncio.ensure_future(proc.communicate())
    deadline = time.monotonic() + timeout_s
    timed_out = False
    try:
        while True:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                timed_out = True
                break
            done, _ = await asyncio.wait({reader}, timeout=min(HEARTBEAT_S, remaining))
            if done:
                break
            heartbeat(f"{what}: running")
    finally:
        if proc.returncode is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
    out, _ = await asyncio.shield(reader)
    text = (out or b"").decode("utf-8", "replace")
    return (None if timed_out else proc.returncode), text


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
                       exit_code: int | None = None) -> TestOutcome:
        ref = None
        if log:
            ref = await asyncio.to_thread(
                self.store.put_bytes, log.encode(), media_type="text/plain",
                name=f"fleet/{req.fleet_id}/{req.row}/attempt-{req.attempt}.log")
        return TestOutcome(passed=passed, phase=phase, exit_code=exit_code, log_tail=tail(log), log=ref,
                           duration_s=round(time.monotonic() - started, 3))


class ProcessRunner(_Base):
    def __init__(self, store: ArtifactStore, programs: Sequence[str] = DEFAULT_PROGRAMS):
        super().__init__(store)
        self.programs = tuple(programs)

    async def run(self, req: RunTestRequest, heartbeat: Heartbeat) -> TestOutcome:
        argv = process_argv(req.command, self.programs)  # checked again: never trust the caller
        started = time.monotonic()
        code, log = await _run_argv(argv, req.timeout_s, heartbeat, f"row {req.row}")
        if code is None:
            return await self._outcome(req, started, log + f"\n[fleetforge] timed out after {req.timeout_s:g}s",
                                       passed=False, phase=TestPhase.HEALTH)
        if code != 0:
            return await self._outcome(req, started, log, passed=False, phase=TestPhase.START, exit_code=code)
        if req.probe_url:
            status, body = await _probe_get(req.probe_url, heartbeat)
            if not 200 <= status < 300:
                return await self._outcome(req, started, log + f"\n[fleetforge] probe: {body}", passed=False,
                                           phase=TestPhase.PROBE)
        return await self._outcome(req, started, log, passed=True, phase=TestPhase.PROBE, exit_code=0)


def server_port(spec: DockerRunSpec) -> int:
    """Where the server inside a host-network container listens: a published port, `--port N`, PORT."""
    if spec.ports:
        return spec.ports[0].host
    for flag in ("--port",):
        if flag in spec.args:
            i = spec.args.index(flag)
            if i + 1 < len(spec.args) and spec.args[i + 1].isdigit():
                return int(spec.args[i + 1])
    port = spec.env.get("PORT", "")
    return int(port) if port.isdigit() else 8000


class DockerRunner(_Base):
    def __init__(self, store: ArtifactStore, *, policy_for: Callable[[HardwareProfile], CommandPolicy] = writer_policy,
                 docker: str = "docker", health_path: str = "/health", poll_s: float = 2.0):
        super().__init__(store)
        self.policy_for = policy_for
        self.docker = docker
        self.health_path = health_path
        self.poll_s = poll_s

    async def _docker(self, *args: str, timeout_s: float = 120.0, heartbeat: Heartbeat = lambda _: None) -> tuple[int | None, str]:
        return await _run_argv([self.docker, *args], timeout_s, heartbeat, f"docker {args[0]}")

    async def run(self, req: RunTestRequest, heartbeat: Heartbeat) -> TestOutcome:
        spec = parse_docker_run(req.command, self.policy_for(req.hardware))
        name = container_name(req.fleet_id, f"{req.row}-{req.model_name}", req.attempt)
        labels = run_labels(req.fleet_id, key=str(req.row), attempt=req.attempt)
        started = time.monotonic()
        code, out = await self._docker("image", "inspect", "--format", "{{.Id}}", spec.image, heartbeat=heartbeat)
        if code != 0:
            log = out if "No such image" in out or "daemon" in out else f"No such image: {spec.image}\n{out}"
            return await self._outcome(req, started, log, passed=False, phase=TestPhase.START)
        await self._docker("rm", "-f", name, heartbeat=heartbeat)  # a stale container of a crashed earlier attempt
        try:
            code, out = await self._docker(*render_argv(spec, name, labels)[1:], heartbeat=heartbeat)
            if code != 0:
                return await self._outcome(req, started, out, passed=False, phase=TestPhase.START, exit_code=code)
            phase, exit_code = await self._wait_healthy(name, spec, started + req.timeout_s, heartbeat)
            problem = ""
            if phase is TestPhase.PROBE:
                problem = await self._probe(f"http://127.0.0.1:{server_port(spec)}", req.probe_url, heartbeat)
            logs = await self._docker_logs(name, heartbeat)
            if phase is TestPhase.PROBE and not problem:
                return await self._outcome(req, started, logs, passed=True, phase=TestPhase.PROBE, exit_code=0)
            return await self._outcome(req, started, logs + (f"\n[fleetforge] probe: {problem}" if problem else ""),
                                       passed=False, phase=phase, exit_code=exit_code)
        finally:
            await asyncio.shield(self._docker("rm", "-f", name, timeout_s=60.0))  # also on cancel/timeout

    async def _probe(self, server: str, probe_url: str | None, heartbeat: Heartbeat) -> str:
        """What is wrong with the healthy server's answers ("" = it serves): the row's probe URL must
        answer a GET with 2xx; without one, `/v1/models` must list a model and that model must answer a
        one-token completion (PROBE_PROMPT) with at least one choice."""
        if probe_url:
            status, body = await _probe_get(probe_url, heartbeat)
            return "" if 200 <= status < 300 else f"GET {probe_url}: {body[:300]}"
        status, body = await _probe_get(f"{server}/v1/models", heartbeat)
        model = _first_model(body) if 200 <= status < 300 else None
        if model is None:
            return f"GET /v1/models lists no model: {body[:300]}"
        url = f"{server}/v1/completions"
        status, body = await _beating(asyncio.to_thread(_http, url, COMPLETION_TIMEOUT_S,
                                                        {"model": model, **PROBE_PROMPT}), heartbeat, f"probing {url}")
        if 200 <= status < 300 and _has_choices(body):
            return ""
        return f"POST /v1/completions (model {model}, 1 token): {body[:300]}"

    async def _wait_healthy(self, name: str, spec: DockerRunSpec, deadline: float,
                            heartbeat: Heartbeat) -> tuple[TestPhase, int | None]:
        """PROBE when healthy; START with the exit code when the container stopped; HEALTH at the deadline."""
        url = f"http://127.0.0.1:{server_port(spec)}{self.health_path}"
        while time.monotonic() < deadline:
            code, state = await self._docker("inspect", "--format", "{{.State.Running}} {{.State.ExitCode}}", name,
                                             heartbeat=heartbeat)
            parts = state.split()
            if code == 0 and parts and parts[0] == "false":
                return TestPhase.START, int(parts[1]) if len(parts) > 1 and parts[1].lstrip("-").isdigit() else None
            status, _ = await _probe_get(url, heartbeat, timeout_s=5.0)
            if 200 <= status < 300:
                return TestPhase.PROBE, None
            heartbeat(f"waiting for {url}")
            await asyncio.sleep(min(self.poll_s, max(0.0, deadline - time.monotonic())))
        return TestPhase.HEALTH, None

    async def _docker_logs(self, name: str, heartbeat: Heartbeat) -> str:
        _, out = await self._docker("logs", name, timeout_s=60.0, heartbeat=heartbeat)
        return out


def _json(body: str) -> object:
    try:
        return json.loads(body)
    except ValueError:
        return None


def _first_model(body: str) -> str | None:
    """The first model id of an OpenAI `/v1/models` answer."""
    data = _json(body)
    models = data.get("data") if isinstance(data, dict) else None
    if isinstance(models, list) and models and isinstance(models[0], dict) and isinstance(models[0].get("id"), str):
        return models[0]["id"]
    return None


def _has_choices(body: str) -> bool:
    data = _json(body)
    return isinstance(data, dict) and isinstance(data.get("choices"), list) and bool(data["choices"])


class ScriptRunner(_Base):
    """`<script> <model> <command>`; the log is the script's output plus `<log_dir>/<model>.log` if written."""

    EXIT_PASS, EXIT_FAIL, EXIT_TIMEOUT = 0, 1, 2

    def __init__(self, store: ArtifactStore, script: Path, log_dir: Path | None = None):
        super().__init__(store)
        self.script = script
        self.log_dir = log_dir if log_dir is not None else script.parent / "logs"

    async def run(self, req: RunTestRequest, heartbeat: Heartbeat) -> TestOutcome:
        if not self.script.is_file() or not os.access(self.script, os.X_OK):
            raise FleetforgeError(Err.RUNNER_UNAVAILABLE, f"test script {self.script} is missing or not executable")
        started = time.monotonic()
        # the script gets the command as one argument (it is data to it; no shell here)
        code, out = await _run_argv([str(self.script), req.model_name, req.command], req.timeout_s + 30,
                                    heartbeat, f"row {req.row}", cwd=self.script.parent)
        log_file = self.log_dir / (req.model_name.replace("/", "_") + ".log")
        log = out + (log_file.read_text("utf-8", "replace") if log_file.is_file() else "")
        if code == self.EXIT_PASS:
            return await self._outcome(req, started, log, passed=True, phase=TestPhase.PROBE, exit_code=0)
        if code in (None, self.EXIT_TIMEOUT):
            return await self._outcome(req, started, log, passed=False, phase=TestPhase.HEALTH)
        return await self._outcome(req, started, log, passed=False, phase=TestPhase.START, exit_code=code)
