"""Shared test helpers: polling with a deadline (never sleep-and-hope), throwaway queues, workers."""

from __future__ import annotations

import asyncio
import contextlib
import os
import random
import socket
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any, TypeVar

from pydantic import BaseModel
from temporalio.client import Client, WorkflowFailureError
from temporalio.service import RPCError, RPCStatusCode
from temporalio.worker import Worker

from contracts.common import TaskQueues
from contracts.fleet_job import ProcessMode, RunnerKind

T = TypeVar("T")
M = TypeVar("M", bound=BaseModel)

SELF_TESTS: dict[str, Any] = {"runner": RunnerKind.PROCESS, "process_mode": ProcessMode.SELF_TEST}
"""Fleet request fields for rows whose commands test their model and exit (`python -c ...`): the process
runner's self-test mode, whose exit code is the verdict (no server is probed). SELF_TESTS_CLI: the same options."""
SELF_TESTS_CLI = ("--runner", "process", "--process-mode", "self-test")

TRANSIENT_RPC = frozenset({RPCStatusCode.CANCELLED, RPCStatusCode.UNAVAILABLE, RPCStatusCode.DEADLINE_EXCEEDED,
                           RPCStatusCode.RESOURCE_EXHAUSTED})


async def outcome_of(handle: Any, result_type: type[M]) -> M:
    """A started job's result contract, COMPLETED (the return value) or FAILED (carried by the failure)."""
    from workflows.failures import result_from_failure

    try:
        return await handle.result()
    except WorkflowFailureError as e:
        failed = result_from_failure(e, result_type)
        if failed is None:
            raise
        return failed


async def job_outcome(client: Client, run: Any, request: Any, *, result_type: type[M], **kwargs: Any) -> M:
    """Execute a job workflow and return its result contract whether it COMPLETED (the return value)
    or FAILED (the contract carried by the workflow failure, workflows/job_end.py)."""
    from workflows.failures import result_from_failure

    try:
        return await client.execute_workflow(run, request, result_type=result_type, **kwargs)
    except WorkflowFailureError as e:
        failed = result_from_failure(e, result_type)
        if failed is None:
            raise
        return failed


async def assert_eventually(
    check: Callable[[], Awaitable[T]] | Callable[[], T], *, timeout: float = 60.0, interval: float = 0.1,
    message: str = "condition not met",
) -> T:
    """Poll `check` until it returns a truthy value before the deadline. An AssertionError or a
    transient Temporal RPC error (e.g. "operation was canceled" under load) counts as "not yet"."""
    deadline = time.monotonic() + timeout
    last: BaseException | None = None
    while True:
        try:
            value = check()
            if asyncio.iscoroutine(value):
                value = await value
            if value:
                return value  # type: ignore[return-value]
        except AssertionError as e:
            last = e
        except RPCError as e:
            if e.status not in TRANSIENT_RPC:
                raise
            last = e
        if time.monotonic() > deadline:
            raise AssertionError(f"{message} within {timeout}s" + (f": {last}" if last else ""))
        await asyncio.sleep(interval)


def wait_until(check: Callable[[], Any], *, timeout: float = 60.0, interval: float = 0.1, message: str = "condition not met") -> Any:
    """Synchronous twin of assert_eventually, for thread/process fixtures."""
    deadline = time.monotonic() + timeout
    while True:
        value = check()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"{message} within {timeout}s")
        time.sleep(interval)


def proc_bytes(pid: int | str, name: str) -> bytes:
    """/proc/PID/<name> (cmdline, environ, ...), or b"" when the process is gone or not readable."""
    try:
        with open(f"/proc/{pid}/{name}", "rb") as f:
            return f.read()
    except OSError:
        return b""


def alive(pid: int) -> bool:
    """The process exists and is not a zombie (an exited child its parent has not reaped yet)."""
    stat = proc_bytes(pid, "stat")
    return bool(stat) and stat.rsplit(b")", 1)[1].split()[0] != b"Z"


def free_ports(n: int = 1) -> list[int]:
    """`n` distinct free TCP ports for servers a test starts later (see `free_port_range`)."""
    ports: list[int] = []
    while len(ports) < n:
        first, _ = free_port_range(1)
        ports += [first] if first not in ports else []
    return ports


def free_port_range(n: int) -> tuple[int, int]:
    """(first, last) of `n` consecutive ports free on the host: a fleet hardware profile's port_range.

    Drawn outside the kernel's ephemeral range: a port there is handed to any process's bind(0) or
    connect() (a concurrent test's server, a gRPC client), so one probed free there can be taken
    before the test's server binds it (the row fails PORT_IN_USE). Each xdist worker draws from its
    own band, so two tests running at once never get the same port."""
    low, high = _port_band()
    for _ in range(100):
        first = random.randint(low, high - n + 1)
        socks = [socket.socket() for _ in range(n)]
        try:
            for i, sock in enumerate(socks):
                sock.bind(("0.0.0.0", first + i))
            return first, first + n - 1
        except OSError:
            continue
        finally:
            for sock in socks:
                sock.close()
    raise AssertionError(f"no {n} consecutive free ports in {low}-{high}")


def _port_band() -> tuple[int, int]:
    """This xdist worker's share of the ports outside the ephemeral range (the wider side of it)."""
    with open("/proc/sys/net/ipv4/ip_local_port_range") as f:
        ephemeral_low, ephemeral_high = map(int, f.read().split())
    low, high = max([(10000, ephemeral_low - 1), (ephemeral_high + 1, 65535)], key=lambda band: band[1] - band[0])
    worker = int(os.environ.get("PYTEST_XDIST_WORKER", "gw0").removeprefix("gw"))
    width = (high - low + 1) // int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))
    return low + worker * width, low + (worker + 1) * width - 1


def fresh_queues() -> TaskQueues:
    """All work of one test on one throwaway queue."""
    return TaskQueues.single(f"test-{uuid.uuid4().hex[:10]}")


@contextlib.asynccontextmanager
async def new_worker(
    client: Client, *, workflows: Sequence[type] = (), activities: Sequence[Callable] = (),
    task_queue: str | None = None, **kwargs: Any,
) -> AsyncIterator[Worker]:
    """A worker on a fresh (or given) queue, with fleetforge's interceptor and a thread pool."""
    from activities.interceptors import FleetforgeInterceptor
    from worker import cache_bytecode

    cache_bytecode()  # as the product's worker does at start
    with ThreadPoolExecutor(max_workers=16) as executor:
        worker = Worker(
            client, task_queue=task_queue or f"test-{uuid.uuid4().hex[:10]}", workflows=list(workflows),
            activities=list(activities), activity_executor=executor, interceptors=[FleetforgeInterceptor()], **kwargs,
        )
        async with worker:
            yield worker
