"""Fleet commands: `fleet-test` (start, or `--resume` and write the verdicts back into the CSV) and
`approve`. Manifest checks and the write-back are the SDK's (client/fleet.py)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Optional

import typer
from pydantic import BaseModel

from activities.containers.manifest import columns_help
from client import out
from client.cli.app import JsonOpt, WaitOpt, app, client_for, follow, run_sync, settings
from client.cli.options import Opts, with_options
from client.cli.render import show_result
from client.job_options import FLEET_TEST
from client.fleet import (
    WriteBack, check_manifest, check_process_options, host_checked_profile, load_hardware, read_manifest,
)
from client.jobs import JobCancelled
from client.sdk import FleetforgeClient
from contracts.errors import Err, FleetforgeError


def show_write_back(done: WriteBack) -> None:
    csv_path = Path(done.path)
    if done.pending:
        out.hint(f"no finished rows to write back into {csv_path} yet")
        return
    out.hint(f"verdicts of {len(done.written)} row(s) written to {csv_path} (previous version: {csv_path.name}.bak)")
    for rows, why in ((done.changed, "the row changed since its test"), (done.missing, "no such row any more")):
        if rows:
            out.hint(f"not written, {why}: {', '.join(rows[:5])}" + (f" and {len(rows) - 5} more" if len(rows) > 5 else ""))


async def write_back(fc: FleetforgeClient, job_id: str, csv_file: Path, force: bool) -> None:
    show_write_back(await fc.write_back(job_id, csv_file, force=force))


@app.command("fleet-test")
@with_options(FLEET_TEST)
def fleet_test(
    csv_file: Annotated[Path, typer.Argument(metavar="MODELS.csv", help=f"Manifest CSV. {columns_help()}")],
    opts: Opts = {},
    hardware: Annotated[Optional[Path], typer.Option("--hardware", metavar="FILE.yaml", help="Hardware profile YAML.")] = None,
    resume: Annotated[Optional[str], typer.Option("--resume", metavar="JOB_ID", help="Follow an existing fleet-test job instead of starting one; writes its finished rows back.")] = None,
    force: Annotated[bool, typer.Option("--force", help="Write the verdicts back even into a CSV that is not the fleet's manifest (merged by model name).")] = False,
    wait: WaitOpt = False, json_: JsonOpt = False,
) -> int:
    """Test-deploy every model of a CSV that has no verdict yet; with --wait (or --resume), write the
    verdicts back into the CSV. Exit 1 when any tested row is No or Error."""
    out.use_json(json_)
    csv_text = ""
    if resume is None:  # a bad CSV is exit 2 before anything connects or starts, and the file is not touched
        csv_text = read_manifest(csv_file)
        check_manifest(csv_text, opts["runner"])
        opts["share"] = check_process_options(opts["runner"], opts["share"], opts["process_mode"])
    profile = load_hardware(hardware) if hardware is not None else None
    if resume is None:  # the host as it is: its GPUs, and nothing that asks for more (exit 2 before any row starts)
        profile = host_checked_profile(csv_text, profile, str(hardware or "the profile"), opts["require_tier"], show=lambda p: out.hint(
            f"hardware: {p.gpu_count} GPU(s), {p.gpu_memory_gb} GB each, ports {p.port_range[0]}-{p.port_range[1]} "
            f"({p.source or hardware})"))

    async def go() -> int:
        fc = await client_for(settings())
        if resume is not None:
            handle = await fc.job(resume)  # any id the tool printed: fleet-test/ID, fleet/ID, the bare ID, a link
            if not force and (why := await fc.manifest_mismatch(handle.id, csv_file)):
                out.error(f"{why}; nothing written", Err.MANIFEST_CHANGED)
                return 2
        else:
            handle = await fc.start_fleet_test(csv_text, name=csv_file.name, hardware=profile, **opts)
        if not wait:
            if resume is not None:
                await write_back(fc, handle.id, csv_file, force)
            out.workflow_id(handle.id)
            out.hint(f"follow it with: fleetforge watch {handle.id}   (Web UI: {await handle.ui_url()})")
            if opts["require_approval"]:
                out.hint("approve each row's command with: fleetforge approve fleet/FLEET_ID/ROW --attempt N "
                         "(rows waiting: fleetforge list --status AWAITING_APPROVAL)")
            return 0
        try:
            result = await follow(fc, handle, stop_at_input=False)
        except JobCancelled:
            await write_back(fc, handle.id, csv_file, force)
            raise
        try:
            await write_back(fc, handle.id, csv_file, force)
        except FleetforgeError as e:
            rc = show_result(result, await handle.ui_url())
            out.error(e.message, e.code)
            return max(rc, 1)
        return show_result(result, await handle.ui_url())

    return run_sync(go())


@app.command()
def approve(
    row_id: Annotated[str, typer.Argument(metavar="ROW_ID", help="The row's workflow id: fleet/FLEET_ID/ROW.")],
    attempt: Annotated[int, typer.Option("--attempt", metavar="N", min=1, help="The attempt whose command is waiting.")],
    refuse: Annotated[bool, typer.Option("--refuse", help="Refuse the command (the writer gets the reason and tries again).")] = False,
    reason: Annotated[str, typer.Option("--reason", metavar="TEXT", help="Why (shown to the writer and in the row's note).")] = "",
    json_: JsonOpt = False,
) -> int:
    """Approve (or refuse) the command a fleet row waits with (fleet-test --require-approval)."""
    out.use_json(json_)

    async def go() -> int:
        fc = await client_for(settings())
        verdict, command = await fc.approve(row_id, attempt, approved=not refuse, reason=reason)
        if out.json_mode():
            out.contract(ApprovalAnswer(row_id=row_id, attempt=attempt, verdict=verdict, command=command))
        else:
            out.line(f"{row_id} attempt {attempt}: {verdict}: {command}")
        return 0

    return run_sync(go())



class ApprovalAnswer(BaseModel):
    """--json output of `fleetforge approve`."""

    row_id: str
    attempt: int
    verdict: str
    command: str

