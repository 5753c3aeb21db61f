"""`fleetforge kernel`: the task file is read and checked by the SDK (client/kernel.py)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Optional

import typer

from client import out
from client.cli.app import JsonOpt, WaitOpt, app, client_for, finish, parse_sets, run_sync, settings
from client.kernel import kernel_request
from client.sdk import new_run_id


@app.command()
def kernel(
    task: Annotated[Path, typer.Argument(metavar="TASK.py", help="A KernelBench-format task file: class Model, get_inputs(), get_init_inputs().")],
    arch: Annotated[str, typer.Option("--arch", metavar="ARCH", help="cpu-interpreter (Triton interpreter on CPU) or a GPU arch (a100, h100, ...).")] = "cpu-interpreter",
    workflow: Annotated[str, typer.Option("--workflow", metavar="NAME|FILE", help="A shipped workflow name or a workflow.yaml path.")] = "default",
    num_candidates: Annotated[int, typer.Option("--num-candidates", metavar="N", min=1, max=16, help="Coder candidates per round, run in parallel.")] = 1,
    max_step: Annotated[Optional[int], typer.Option("--max-step", metavar="N", min=1, help="Cap on conductor steps.")] = None,
    op_name: Annotated[Optional[str], typer.Option("--op-name", metavar="NAME", help="The op's name (default: from the file name, 19_ReLU.py -> ReLU).")] = None,
    set_: Annotated[Optional[list[str]], typer.Option("--set", metavar="NAME=VALUE", help="Set a module-level numeric constant of the task (batch_size, dim, M, ...); repeatable.")] = None,
    max_llm_answers: Annotated[int, typer.Option("--max-llm-answers", metavar="N", min=1, max=10, help="LLM answers per agent decision (the first and its repairs) before the offline agent answers.")] = 3,
    llm_rejections: Annotated[int, typer.Option("--llm-rejections-before-fallback", metavar="N", min=1, max=50, help="LLM candidates the verifier may reject before the offline template's candidate is tried.")] = 3,
    wait: WaitOpt = False, json_: JsonOpt = False,
) -> int:
    """Write a Triton kernel for a PyTorch op and verify it against the reference."""
    out.use_json(json_)
    run_id = new_run_id()
    start = kernel_request(  # bad input is exit 2 before anything connects
        task, run_id=run_id, arch=arch, workflow=workflow, op_name=op_name, sets=parse_sets(set_ or []),
        num_candidates=num_candidates, max_step=max_step, max_llm_answers=max_llm_answers,
        llm_rejections_before_fallback=llm_rejections)
    if start.hint:
        out.hint(start.hint)

    async def go() -> int:
        fc = await client_for(settings())
        return await finish(fc, await fc.start_kernel(start.request, run_id=run_id), wait)

    return run_sync(go())
