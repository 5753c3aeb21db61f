"""Process commands: `dev` (the embedded stack), `worker`, `setup-namespace`."""

from __future__ import annotations

import asyncio
from collections.abc import Coroutine
from typing import Annotated, Any, Optional

import typer

from client import out
from client.cli.app import app, client_for, run_sync, settings
from contracts.errors import Err, FleetforgeError
from contracts.settings import Settings


@app.command()
def dev(
    no_worker: Annotated[bool, typer.Option("--no-worker", help="Only the Temporal server, no worker.")] = False,
    llm: Annotated[Optional[str], typer.Option("--llm", metavar="local", help="local: also run a small llama.cpp LLM (same as FLEETFORGE_LLM=local).")] = None,
) -> int:
    """Run the embedded stack: the Temporal dev server (state in FLEETFORGE_STATE_DIR, address
    TEMPORAL_ADDRESS) and a supervised worker process on every queue; Ctrl-C stops both."""
    from activities.logs import configure_logging
    from client.dev import run_dev

    configure_logging()
    return run_sync(run_dev(Settings(llm=llm) if llm else settings(), worker=not no_worker))



@app.command()
def worker(
    queues: Annotated[str, typer.Option("--queues", metavar="KINDS",
                                        help="all, or a comma list of workflows,llm,toolchain,kernels,containers.")] = "all",
) -> int:
    """Run worker(s) against the configured Temporal (TEMPORAL_ADDRESS or the profile)."""
    from activities.logs import configure_logging
    from worker import install_stop_handlers, parse_queue_kinds, serve

    try:
        kinds = parse_queue_kinds(queues)
    except ValueError as e:
        raise FleetforgeError(Err.BAD_INPUT, str(e)) from None
    configure_logging()

    async def go() -> None:
        stop = asyncio.Event()
        install_stop_handlers(stop)
        await serve(settings(), kinds, stop)

    run_sync_none(go())
    return 0



@app.command("setup-namespace")
def setup_namespace() -> int:
    """Register fleetforge's search attributes on an existing cluster (already registered is fine)."""
    from temporalio.api.enums.v1 import IndexedValueType
    from temporalio.api.operatorservice.v1 import AddSearchAttributesRequest
    from temporalio.service import RPCError, RPCStatusCode

    from workflows._visibility import SEARCH_ATTRIBUTES

    async def go() -> int:
        s = settings()
        fc = await client_for(s)
        for key in SEARCH_ATTRIBUTES:
            try:
                await fc.temporal.operator_service.add_search_attributes(AddSearchAttributesRequest(
                    namespace=s.namespace,
                    search_attributes={key.name: IndexedValueType.INDEXED_VALUE_TYPE_KEYWORD},
                ))
                out.line(f"registered {key.name}")
            except RPCError as e:
                if e.status != RPCStatusCode.ALREADY_EXISTS and "already" not in e.message.lower():
                    raise FleetforgeError(Err.INTERNAL, f"cannot register {key.name}: {e.message}") from None
                out.line(f"{key.name} already registered")
        return 0

    return run_sync(go())



def run_sync_none(coro: Coroutine[Any, Any, None]) -> None:
    asyncio.run(coro)

