"""The real Temporal dev server for one bench run, stopped however the run ends."""

from __future__ import annotations

import asyncio
import contextlib
import signal
from collections.abc import AsyncIterator
from typing import Any


@contextlib.asynccontextmanager
async def dev_server() -> AsyncIterator[Any]:
    """A local dev server (fleetforge's search attributes, the pydantic converter), shut down when the run ends,
    fails or is sent SIGTERM. The server is a child process that outlives a killed parent, so without the handler a
    CI runner's or `timeout`'s SIGTERM left it running; the handler cancels the run instead, which unwinds to here."""
    from temporalio.contrib.pydantic import pydantic_data_converter
    from temporalio.testing import WorkflowEnvironment

    from client.binaries import temporal_binary
    from workflows._visibility import SEARCH_ATTRIBUTES

    loop, run = asyncio.get_running_loop(), asyncio.current_task()
    assert run is not None, "dev_server() runs inside a task"
    loop.add_signal_handler(signal.SIGTERM, run.cancel)
    try:
        env = await WorkflowEnvironment.start_local(
            dev_server_existing_path=temporal_binary(), data_converter=pydantic_data_converter,
            search_attributes=SEARCH_ATTRIBUTES, dev_server_log_level="error")
        try:
            yield env
        finally:
            await env.shutdown()
    finally:
        loop.remove_signal_handler(signal.SIGTERM)
