"""Model jobs: `inspect`, `convert` (and `--rerun`), `answer`. Checks, uploads and reruns are the
SDK's (client/convert.py); these commands map options onto SDK calls."""

from __future__ import annotations

from typing import Annotated, Optional

import typer

from client import out
from client.convert import check_model, convert_request, input_shapes
from client.cli.app import JobIdArg, JsonOpt, WaitOpt, app, client_for, finish, parse_sets, run_sync, settings
from client.cli.options import Opts, with_options
from client.job_options import CONVERT
from contracts.errors import Err, FleetforgeError


@app.command()
def inspect(
    model: Annotated[str, typer.Argument(metavar="MODEL", help="Model path, file:// or s3:// URI, or catalog name.")],
    wait: WaitOpt = False, json_: JsonOpt = False,
) -> int:
    """Resolve a model, record it in a run and keep its workspace."""
    out.use_json(json_)

    s = settings()
    check_model(model, s)  # exit 2 before anything connects

    async def go() -> int:
        fc = await client_for(s)
        return await finish(fc, await fc.start_inspect(model), wait)

    return run_sync(go())


@app.command()
@with_options(CONVERT)
def convert(
    model: Annotated[Optional[str], typer.Argument(metavar="MODEL", help="Model path, file:// or s3:// URI, or catalog name "
                                                        "(with --rerun: the earlier run's model).")] = None,
    opts: Opts = {},
    rerun: Annotated[Optional[str], typer.Option("--rerun", metavar="RUN_ID", help="Run id of an earlier conversion whose plan is reused.")] = None,
    set_: Annotated[Optional[list[str]], typer.Option("--set", metavar="KEY=VALUE", help="With --rerun: key=value step arg override (repeatable).")] = None,
    input_shape: Annotated[Optional[list[str]], typer.Option(
        "--input-shape", metavar="NAME=1,3,224,224[:int64]", help="Static shape of an input (repeatable): a PyTorch model's "
        "export shapes; an ONNX model's symbolic dims (others become 1).")] = None,
    wait: WaitOpt = False, json_: JsonOpt = False,
) -> int:
    """Convert a model (ONNX, TorchScript .pt, ExportedProgram .pt2) to a QNN/SNPE/ORT artifact for a SoC and precision."""
    out.use_json(json_)
    overrides = parse_sets(set_ or [])
    if overrides and not rerun:
        raise FleetforgeError(Err.BAD_INPUT, "--set only applies with --rerun RUN_ID")
    if model is None and not rerun:
        raise FleetforgeError(Err.BAD_INPUT, "missing MODEL (or --rerun RUN_ID to rerun an earlier conversion)")

    s = settings()
    request = None
    if not rerun:  # bad input is exit 2 before anything connects
        assert model is not None
        request = convert_request(model, settings=s, **opts, input_shapes=input_shapes(input_shape or []))

    async def go() -> int:
        fc = await client_for(s)
        if request is None:
            handle = await fc.rerun_convert(str(rerun), overrides=overrides, model=model, min_cosine=opts["min_cosine"])
        else:
            handle = await fc.start_convert(request)
        return await finish(fc, handle, wait)

    return run_sync(go())


@app.command()
def answer(
    job_id: JobIdArg,
    answers: Annotated[list[str], typer.Argument(metavar="KEY=VALUE...",
                                                 help="Answers: soc=sm8550 precision=int8 calibration=PATH eval_data=PATH "
                                                      "synthetic_calibration=yes")],
    wait: WaitOpt = False, json_: JsonOpt = False,
) -> int:
    """Answer a convert job that is waiting for input (exit 2 when it has already finished)."""
    out.use_json(json_)
    parsed = parse_sets(answers)

    async def go() -> int:
        fc = await client_for(settings())
        handle = await fc.job(job_id)
        progress = await fc.answer(handle.id, **parsed)
        if wait:
            return await finish(fc, handle, wait=True)
        if json_:
            out.contract(progress)
        else:
            out.line(f"{handle.id}: answer accepted")
            out.hint(f"follow it with: fleetforge watch {handle.id} (Web UI: {await handle.ui_url()})")
        return 0

    return run_sync(go())
