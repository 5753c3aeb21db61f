"""`fleetforge dev`: the embedded stack. Use a reachable Temporal frontend, or start the dev
server (SQLite file in the state dir, so jobs survive restarts), then run every worker in-process.
"""

from __future__ import annotations

import asyncio
import socket
import subprocess
import time

from temporalio.api.workflowservice.v1 import DescribeNamespaceRequest
from temporalio.client import Client
from temporalio.service import RPCError

from activities.connection import connect
from activities.storage import open_store
from client import local_llm, out
from client.binaries import temporal_binary
from contracts.errors import Err, FleetforgeError
from contracts.settings import Settings
from workflows._visibility import SEARCH_ATTRIBUTES
from worker import QUEUE_KINDS, install_stop_handlers, serve

STARTUP_DEADLINE_S = 60.0
SHUTDOWN_DEADLINE_S = 30.0


def host_port(address: str) -> tuple[str, int]:
    host, _, port = address.rpartition(":")
    try:
        return host or "127.0.0.1", int(port)
    except ValueError:
        raise FleetforgeError(Err.BAD_INPUT, f"FLEETFORGE_TEMPORAL_ADDRESS {address!r} is not HOST:PORT") from None


def port_open(address: str, timeout: float = 0.5) -> bool:
    try:
        with socket.create_connection(host_port(address), timeout=timeout):
            return True
    except OSError:
        return False


def server_command(settings: Settings) -> list[str]:
    _, port = host_port(settings.temporal_address)
    cmd = [
        temporal_binary(), "server", "start-dev",
        "--db-filename", str(settings.state_dir.resolve() / "temporal.db"),
        "--ip", "127.0.0.1", "--port", str(port), "--ui-port", str(settings.ui_port), "--log-level", "warn",
    ]
    for key in SEARCH_ATTRIBUTES:
        cmd += ["--search-attribute", f"{key.name}=Keyword"]
    return cmd


def start_server(settings: Settings) -> subprocess.Popen[bytes]:
    settings.state_dir.mkdir(parents=True, exist_ok=True)
    log = open(settings.state_dir / "temporal.log", "ab")
    try:
        return subprocess.Popen(server_command(settings), stdout=log, stderr=log, stdin=subprocess.DEVNULL)
    finally:
        log.close()


async def wait_connectable(settings: Settings, proc: subprocess.Popen[bytes] | None, stop: asyncio.Event) -> Client | None:
    """Poll until the frontend answers (None if stopped first); TEMPORAL_UNAVAILABLE after the deadline."""
    store = open_store(settings)
    deadline = time.monotonic() + STARTUP_DEADLINE_S
    while not stop.is_set():
        if proc is not None and proc.poll() is not None:
            raise FleetforgeError(
                Err.TEMPORAL_UNAVAILABLE,
                f"the Temporal dev server exited with code {proc.returncode} (see {settings.state_dir / 'temporal.log'})",
            )
        if port_open(settings.temporal_address):
            try:
                client = await connect(settings, store)
                await client.workflow_service.describe_namespace(DescribeNamespaceRequest(namespace=settings.namespace))
                return client
            except (FleetforgeError, RPCError):  # still starting: namespace or frontend not ready yet
                pass
        if time.monotonic() > deadline:
            raise FleetforgeError(Err.TEMPORAL_UNAVAILABLE, f"the dev server did not answer at {settings.temporal_address} within {STARTUP_DEADLINE_S:.0f}s")
        await asyncio.sleep(0.2)
    return None


def stop_server(proc: subprocess.Popen[bytes]) -> None:
    if proc.poll() is not None:
        return
    proc.terminate()
    try:
        proc.wait(timeout=SHUTDOWN_DEADLINE_S)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


async def _watch(proc: subprocess.Popen[bytes], stop: asyncio.Event) -> None:
    """Stop the worker if the server subprocess dies under us."""
    while proc.poll() is None and not stop.is_set():
        await asyncio.sleep(0.5)
    stop.set()


async def run_dev(settings: Settings, *, worker: bool = True) -> None:
    stop = asyncio.Event()
    install_stop_handlers(stop)
    proc: subprocess.Popen[bytes] | None = None
    if port_open(settings.temporal_address):
        out.hint(f"using the Temporal frontend at {settings.temporal_address}")
    else:
        proc = start_server(settings)
        out.hint(f"started the Temporal dev server at {settings.temporal_address} (db {settings.state_dir / 'temporal.db'})")
    watcher = asyncio.create_task(_watch(proc, stop)) if proc else None
    try:
        client = await wait_connectable(settings, proc, stop)
        if client is None:
            return
        out.hint(f"Web UI: {settings.ui_url}/namespaces/{settings.namespace}/workflows")
        if worker:
            async with local_llm.serving(settings, stop) as worker_settings:  # FLEETFORGE_LLM=local: llama.cpp server
                await serve(worker_settings, list(QUEUE_KINDS), stop, client)
        else:
            await stop.wait()
    finally:
        if watcher:
            watcher.cancel()
        if proc is not None:
            await asyncio.to_thread(stop_server, proc)
            out.hint("stopped the Temporal dev server")
