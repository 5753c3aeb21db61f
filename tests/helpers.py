"""Shared test helpers: polling with a deadline (never sleep-and-hope), throwaway queues, workers."""

from __future__ import annotations

import asyncio
import contextlib
import socket
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any, TypeVar

from temporalio.client import Client
from temporalio.worker import Worker

from contracts.common import TaskQueues

T = TypeVar("T")


async def assert_eventually(
    check: Callable[[], Awaitable[T]] | Callable[[], T], *, timeout: float = 20.0, interval: float = 0.1,
    message: str = "condition not met",
) -> T:
    """Poll `check` until it returns a truthy value (or stops raising AssertionError) before the deadline."""
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
        if time.monotonic() > deadline:
            raise AssertionError(f"{message} within {timeout}s" + (f": {last}" if last else ""))
        await asyncio.sleep(interval)


def wait_until(check: Callable[[], Any], *, timeout: float = 20.0, interval: float = 0.1, message: str = "condition not met") -> Any:
    """Synchronous twin of assert_eventually, for thread/process fixtures."""
    deadline = time.monotonic() + timeout
    while True:
        value = check()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"{message} within {timeout}s")
        time.sleep(interval)


def free_ports(n: int = 1) -> list[int]:
    """`n` distinct free TCP ports on 127.0.0.1 (held together while chosen, then released)."""
    socks = [socket.socket() for _ in range(n)]
    try:
        for s in socks:
            s.bind(("127.0.0.1", 0))
        return [s.getsockname()[1] for s in socks]
    finally:
        for s in socks:
            s.close()


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

    with ThreadPoolExecutor(max_workers=16) as executor:
        worker = Worker(
            client, task_queue=task_queue or f"test-{uuid.uuid4().hex[:10]}", workflows=list(workflows),
            activities=list(activities), activity_executor=executor, interceptors=[FleetforgeInterceptor()], **kwargs,
        )
        async with worker:
            yield worker
