"""`fleetforge kernel`: the task file is read and checked by the SDK (client/kernel.py)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Optional

import typer

from client import out
from client.cli.app import JsonOpt, WaitOpt, app, client_for, finish, parse_sets, run_sync, settings
from client.cli.options import Opts, with_options
from client.job_options import KERNEL
from client.kernel import kernel_request
from client.sdk import new_run_id


@app.command()
@with_options(KERNEL)
def kernel(
    task: Annotated[Path, typer.Argument(metavar="TASK.py", help="A KernelBench-format task file: class Model, get_inputs(), get_init_inputs().")],
    opts: Opts = {},
    set_: Annotated[Optional[list[str]], typer.Option("--set", metavar="NAME=VALUE", help="Set a module-level numeric constant of the task (batch_size, dim, M, ...); repeatable.")] = None,
    wait: WaitOpt = False, json_: JsonOpt = False,
) -> int:
    """Write a Triton kernel for a PyTorch op and verify it against the reference."""
    out.use_json(json_)
    run_id = new_run_id()
    start = kernel_request(task, run_id=run_id, sets=parse_sets(set_ or []), **opts)  # bad input: exit 2 before connecting
    if start.hint:
        out.hint(start.hint)

    async def go() -> int:
        fc = await client_for(settings())
        return await finish(fc, await fc.start_kernel(start.request, run_id=run_id), wait)

    return run_sync(go())
