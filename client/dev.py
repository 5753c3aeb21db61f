"""`fleetforge dev`: the embedded stack. Use a reachable Temporal frontend, or start the dev
server (SQLite file in the state dir, so jobs survive restarts), then run a worker on every queue
as a supervised child process.

Nothing outlives it: the server and the worker are started so that the kernel sends them SIGTERM
when `fleetforge dev` dies, however it dies (PR_SET_PDEATHSIG; an orphaned worker that cannot
finish its shutdown within ORPHAN_GRACE_S exits anyway); a worker that crashes is restarted
with a backoff, and after too many crashes in a row everything stops cleanly (exit 1).

One server serves one artifact store: a server that `fleetforge dev` started records its store in
the namespace's data, and a second `fleetforge dev` with another store refuses to join it.
"""

from __future__ import annotations

import asyncio
import functools
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from dataclasses import dataclass

from temporalio.api.namespace.v1 import UpdateNamespaceInfo
from temporalio.api.workflowservice.v1 import DescribeNamespaceRequest, UpdateNamespaceRequest
from temporalio.client import Client
from temporalio.service import RPCError

from activities.connection import connect
from activities.lifeline import PARENT_PID_VAR, die_with_parent
from activities.storage import open_store
from client import local_llm, out
from client.binaries import temporal_binary
from contracts.errors import Err, FleetforgeError
from contracts.settings import Settings
from workflows._visibility import SEARCH_ATTRIBUTES, web_ui_link
from worker import install_stop_handlers

STARTUP_DEADLINE_S = 60.0
SHUTDOWN_DEADLINE_S = 30.0
STORE_KEY = "fleetforge.store"
"""Namespace data key: the artifact store of the `fleetforge dev` that started this server."""
LOCAL_HOSTS = frozenset({"127.0.0.1", "localhost"})


def host_port(address: str) -> tuple[str, int]:
    host, _, port = address.rpartition(":")
    try:
        return host or "127.0.0.1", int(port)
    except ValueError:
        raise FleetforgeError(Err.BAD_INPUT, f"Temporal address {address!r} is not HOST:PORT (TEMPORAL_ADDRESS)") from None


def port_open(address: str, timeout: float = 0.5) -> bool:
    try:
        with socket.create_connection(host_port(address), timeout=timeout):
            return True
    except OSError:
        return False


# -- the Temporal server ---------------------------------------------------------------------

def server_command(settings: Settings) -> list[str]:
    _, port = host_port(settings.temporal_address)
    cmd = [
        temporal_binary(), "server", "start-dev",
        "--db-filename", str(settings.state_dir.resolve() / "temporal.db"),
        "--ip", "127.0.0.1", "--port", str(port),
        "--ui-port", str(settings.ui_port), "--log-level", "warn",
    ]
    for key in SEARCH_ATTRIBUTES:
        cmd += ["--search-attribute", f"{key.name}=Keyword"]
    return cmd


def start_server(settings: Settings) -> subprocess.Popen[bytes]:
    """Start the dev server (before any thread exists: preexec_fn is safe then) in its own session,
    so a Ctrl-C reaches `fleetforge dev` only, which stops the worker first and the server last."""
    settings.state_dir.mkdir(parents=True, exist_ok=True)
    log = open(settings.state_dir / "temporal.log", "ab")
    try:
        return subprocess.Popen(server_command(settings), stdout=log, stderr=log, stdin=subprocess.DEVNULL,
                                start_new_session=True, preexec_fn=functools.partial(die_with_parent, signal.SIGTERM))
    finally:
        log.close()


async def wait_connectable(settings: Settings, proc: subprocess.Popen[bytes] | None, stop: asyncio.Event) -> Client | None:
    """Poll until the frontend answers (None if stopped first); TEMPORAL_UNAVAILABLE after the deadline."""
    store = open_store(settings)
    own = settings.model_copy(update={"metrics_port": None})  # the worker process serves the metrics port
    deadline = time.monotonic() + STARTUP_DEADLINE_S
    while not stop.is_set():
        if proc is not None and proc.poll() is not None:
            raise FleetforgeError(
                Err.TEMPORAL_UNAVAILABLE,
                f"the Temporal dev server exited with code {proc.returncode} (see {settings.state_dir / 'temporal.log'})",
            )
        if port_open(settings.temporal_address):
            try:
                client = await connect(own, store)
                await client.workflow_service.describe_namespace(DescribeNamespaceRequest(namespace=settings.namespace))
                return client
            except (FleetforgeError, RPCError):  # still starting: namespace or frontend not ready yet
                pass
        if time.monotonic() > deadline:
            raise FleetforgeError(Err.TEMPORAL_UNAVAILABLE, f"the dev server did not answer at {settings.temporal_address} within {STARTUP_DEADLINE_S:.0f}s")
        await asyncio.sleep(0.2)
    return None


def stop_process(proc: subprocess.Popen[bytes], deadline_s: float = SHUTDOWN_DEADLINE_S) -> None:
    if proc.poll() is not None:
        return
    proc.terminate()
    try:
        proc.wait(timeout=deadline_s)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


async def _namespace_data(client: Client, namespace: str) -> dict[str, str]:
    desc = await client.workflow_service.describe_namespace(DescribeNamespaceRequest(namespace=namespace))
    return dict(desc.namespace_info.data)


async def record_store(client: Client, settings: Settings) -> None:
    """Mark the server this dev started with its artifact store (namespace data)."""
    await client.workflow_service.update_namespace(UpdateNamespaceRequest(
        namespace=settings.namespace, update_info=UpdateNamespaceInfo(data={STORE_KEY: settings.resolved_store_url})))


def join_verdict(recorded: str | None, ours: str, address: str) -> str:
    """What joining a running server means (pure): a line saying what was joined, or STORE_CONFLICT
    (exit 2) when another `fleetforge dev` serves it with a different artifact store: its workers
    would look for our jobs' files in their store."""
    if recorded is None:
        return (f"joined the Temporal server at {address} (not started by fleetforge dev; it records no "
                f"artifact store): jobs use {ours}")
    if recorded != ours:
        raise FleetforgeError(
            Err.BAD_INPUT,
            f"the Temporal server at {address} belongs to another `fleetforge dev` whose artifact store is {recorded}, "
            f"not {ours}: use its FLEETFORGE_STATE_DIR/FLEETFORGE_STORE_URL, or give this one its own server "
            f"(TEMPORAL_ADDRESS=127.0.0.1:PORT FLEETFORGE_UI_PORT=PORT2 fleetforge dev)")
    return f"joined the Temporal server at {address} that fleetforge dev started for this store ({ours})"


# -- the worker ------------------------------------------------------------------------------

ORPHAN_GRACE_S = 10.0
"""How long an orphaned worker may take over its graceful shutdown (with its server gone too, a
Temporal worker's shutdown can wait on pollers that never return) before it exits anyway."""


def exit_when_orphaned(parent: int, grace: float = ORPHAN_GRACE_S) -> None:
    """A daemon thread: once `parent` is gone, give the SIGTERM-triggered shutdown `grace` seconds,
    then leave without waiting (os._exit)."""
    def watch() -> None:
        while os.getppid() == parent:
            time.sleep(0.5)
        time.sleep(grace)
        os._exit(1)

    threading.Thread(target=watch, name="orphan-watch", daemon=True).start()


def worker_child() -> None:
    """Entry point of the worker process `fleetforge dev` supervises: it dies with its parent."""
    die_with_parent(signal.SIGTERM)  # first: a parent killed while the worker imports must still take it along
    exit_when_orphaned(os.getppid())
    import worker

    sys.exit(worker.main(["--queues", "all"]))


def start_worker(env: dict[str, str] | None = None) -> subprocess.Popen[bytes]:
    """The worker process; `env` adds to ours (the local LLM's endpoint)."""
    return subprocess.Popen([sys.executable, "-c", "from client.dev import worker_child; worker_child()"],
                            stdin=subprocess.DEVNULL, start_new_session=True,
                            env={**os.environ, **(env or {}), PARENT_PID_VAR: str(os.getpid())})


@dataclass(frozen=True)
class RestartPolicy:
    """Restart a crashed worker after a backoff; give up after `max_crashes` within `window_s`."""

    max_crashes: int = 5
    window_s: float = 300.0
    first_delay_s: float = 0.5
    max_delay_s: float = 10.0

    def after_crash(self, crashes: list[float], now: float) -> float | None:
        """Seconds to wait before the next start, or None to give up (pure)."""
        recent = [t for t in crashes if now - t <= self.window_s]
        if len(recent) >= self.max_crashes:
            return None
        return min(self.max_delay_s, self.first_delay_s * 2 ** max(0, len(recent) - 1))


async def _exited(proc: subprocess.Popen[bytes], stop: asyncio.Event) -> int | None:
    """The process's exit code, or None once `stop` is set first."""
    while not stop.is_set():
        code = proc.poll()
        if code is not None:
            return code
        try:
            await asyncio.wait_for(stop.wait(), timeout=0.5)
        except asyncio.TimeoutError:
            pass
    return None


async def supervise_worker(stop: asyncio.Event, policy: RestartPolicy = RestartPolicy(),
                           env: dict[str, str] | None = None) -> int:
    """Run the worker until `stop` (exit 0), restarting it when it dies; 1 when it keeps dying."""
    crashes: list[float] = []
    while True:
        proc = start_worker(env)
        out.hint(f"worker started (pid {proc.pid})")
        code = await _exited(proc, stop)
        if code is None:  # stopping: let the worker finish its tasks' current step
            await asyncio.to_thread(stop_process, proc)
            return 0
        crashes.append(time.monotonic())
        delay = policy.after_crash(crashes, time.monotonic())
        if delay is None:
            out.error(f"the worker died {policy.max_crashes} times within {policy.window_s:.0f}s (last exit code {code}); "
                      "stopping fleetforge dev")
            return 1
        out.hint(f"the worker exited with code {code}; restarting it in {delay:.1f}s")
        try:
            await asyncio.wait_for(stop.wait(), timeout=delay)
            return 0
        except asyncio.TimeoutError:
            pass


async def _watch_server(proc: subprocess.Popen[bytes], stop: asyncio.Event, died: list[int]) -> None:
    """Stop everything if the server dies under us."""
    code = await _exited(proc, stop)
    if code is not None:
        died.append(code)
        stop.set()


async def run_dev(settings: Settings, *, worker: bool = True) -> int:
    """The stack until SIGINT/SIGTERM (exit 0); 1 when the server died or the worker kept dying."""
    stop = asyncio.Event()
    install_stop_handlers(stop)
    proc: subprocess.Popen[bytes] | None = None
    if not port_open(settings.temporal_address):
        if host_port(settings.temporal_address)[0] not in LOCAL_HOSTS:
            raise FleetforgeError(Err.TEMPORAL_UNAVAILABLE, f"cannot reach Temporal at {settings.temporal_address}; "
                                                            "fleetforge dev starts a server only on 127.0.0.1/localhost")
        proc = start_server(settings)
        out.hint(f"started the Temporal dev server at {settings.temporal_address} (db {settings.state_dir / 'temporal.db'})")
    died: list[int] = []
    watcher = asyncio.create_task(_watch_server(proc, stop, died)) if proc else None
    rc = 0
    try:
        client = await wait_connectable(settings, proc, stop)
        if client is None:
            return 0
        if proc is not None:
            await record_store(client, settings)
        else:
            recorded = (await _namespace_data(client, settings.namespace)).get(STORE_KEY)
            out.hint(join_verdict(recorded, settings.resolved_store_url, settings.temporal_address))
        out.hint(f"Web UI: {web_ui_link(settings.ui_url, settings.namespace)}")
        del client
        if worker:
            async with local_llm.serving(settings, stop) as worker_settings:  # FLEETFORGE_LLM=local: llama.cpp server
                rc = await supervise_worker(stop, env=local_llm.worker_env(worker_settings))
        else:
            await stop.wait()
        if died:
            out.error(f"the Temporal dev server exited with code {died[0]} (see {settings.state_dir / 'temporal.log'})")
            rc = 1
        return rc
    finally:
        if watcher:
            watcher.cancel()
        if proc is not None:
            await asyncio.to_thread(stop_process, proc)
            out.hint("stopped the Temporal dev server")
