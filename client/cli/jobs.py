"""Commands on existing jobs: `watch`, `list`, `show`, `cancel`, `artifacts`."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Annotated, Optional

import typer
from pydantic import BaseModel

from client import out
from client.cli.app import (
    JobIdArg, JsonOpt, WaitOpt, app, client_for, finish, follow, run_sync, settings, show_outcome,
)
from client.cli.render import artifact_line, jobs_table
from client.events_view import print_events
from client.jobs import CANCELLED, JobCancelled, JobSummary
from contracts.common import ArtifactRef, JobKind, JobStatus
from contracts.errors import Err, FleetforgeError


EVENTS_DRAIN_S = 30.0
"""How long `watch` waits, once the job has closed, for its last live events (then it prints the result anyway)."""


class JobList(BaseModel):
    jobs: list[JobSummary]


class ArtifactList(BaseModel):
    """`fleetforge artifacts --json`: a job's outputs and, with --out, the files written."""

    workflow_id: str
    artifacts: list[ArtifactRef]
    written: list[str] = []



@app.command()
def watch(job_id: JobIdArg, json_: JsonOpt = False) -> int:
    """Follow any job live until it closes: progress for fleets, steps for convert/kernel, input requests."""
    out.use_json(json_)

    async def go() -> int:
        fc = await client_for(settings())
        handle = await fc.job(job_id)
        summary = await handle.summary()
        if summary.status == CANCELLED:
            raise JobCancelled(handle.id)
        events = asyncio.ensure_future(print_events(handle))  # live events as they happen, beside the timeline
        try:
            result = await follow(fc, handle, stop_at_input=False)
            # a closed job's last events come from a query its worker answers by replaying the history: allow it time
            await asyncio.wait({events}, timeout=EVENTS_DRAIN_S)
        finally:
            events.cancel()
        return await show_outcome(fc, result, await handle.ui_url())

    return run_sync(go())



STATUS_CHOICES = [*JobStatus.__members__]


@app.command("list")
def list_(
    kind: Annotated[Optional[JobKind], typer.Option("--kind", metavar="KIND", help="Only jobs of this kind: "
                                                    + ", ".join(k.value for k in JobKind) + ".")] = None,
    status: Annotated[Optional[str], typer.Option("--status", metavar="STATUS", autocompletion=lambda: STATUS_CHOICES,
                                                  help="Only jobs in this state: " + ", ".join(STATUS_CHOICES) + ".")] = None,
    rows: Annotated[bool, typer.Option("--rows", help="Also list every fleet's rows (model-test jobs).")] = False,
    limit: Annotated[int, typer.Option("--limit", metavar="N", min=1, max=1000, help="At most N jobs.")] = 50,
    json_: JsonOpt = False,
) -> int:
    """List jobs, newest first: one line per job (a fleet's rows only with --rows)."""
    out.use_json(json_)
    if status is not None:
        status = status.upper()
        if status not in JobStatus.__members__:
            raise FleetforgeError(Err.BAD_INPUT, f"unknown --status {status!r}: use {', '.join(STATUS_CHOICES)}")

    async def go() -> int:
        fc = await client_for(settings())
        jobs = await fc.list_jobs(kind=kind, status=status, limit=limit, rows=rows)
        if json_:
            out.contract(JobList(jobs=jobs))
            return 0
        if not jobs:
            out.hint("no jobs" + (f" with status {status}" if status else ""))
            return 0
        out.table(jobs_table(jobs))
        if len(jobs) == limit:
            out.hint(f"the newest {limit} jobs; --limit N shows more")
        return 0

    return run_sync(go())



@app.command()
def show(job_id: JobIdArg, wait: WaitOpt = False, json_: JsonOpt = False) -> int:
    """Show a job: its result contract once finished, else its status, step and Web UI link."""
    out.use_json(json_)

    async def go() -> int:
        fc = await client_for(settings())
        view = await fc.show(job_id)
        summary = view.summary
        if view.result is not None:
            return await show_outcome(fc, view.result, summary.ui_url)
        if wait:
            return await finish(fc, await fc.job(summary.workflow_id), wait=True)
        if json_:
            out.contract(summary)
        else:
            out.line(f"{summary.workflow_id}  {summary.kind}  {summary.status}  step: {view.step or '-'}")
            out.line(f"Web UI: {summary.ui_url}")
        return 0

    return run_sync(go())



@app.command()
def cancel(job_id: JobIdArg, wait: WaitOpt = False, json_: JsonOpt = False) -> int:
    """Cancel a running job (with --wait: until it has stopped). Exit 2 when it has already finished."""
    out.use_json(json_)

    async def go() -> int:
        fc = await client_for(settings())
        handle = await fc.job(job_id)
        await handle.cancel()
        if wait:
            try:
                result = await handle.outcome()
            except JobCancelled:
                pass
            else:
                out.hint(f"{handle.id} finished before the cancellation took effect")
                return await show_outcome(fc, result, await handle.ui_url())
        if json_:
            out.contract(await handle.summary())  # what Temporal says now (RUNNING until the job has stopped)
        else:
            out.line(handle.id)
            out.hint("cancelled" if wait else "cancellation requested (--wait waits until it has stopped)")
        return 0

    return run_sync(go())



@app.command()
def artifacts(
    job_id: JobIdArg,
    out_dir: Annotated[Optional[Path], typer.Option("--out", metavar="DIR", file_okay=False,
                                                    help="Download the outputs into DIR under their names.")] = None,
    json_: JsonOpt = False,
) -> int:
    """List a finished job's outputs by name; with --out, download them (sha256-checked)."""
    out.use_json(json_)

    async def go() -> int:
        fc = await client_for(settings())
        handle = await fc.job(job_id)
        refs = await handle.artifacts()
        written = [str(p) for p in await handle.download(out_dir)] if out_dir is not None else []
        if json_:
            out.contract(ArtifactList(workflow_id=handle.id, artifacts=refs, written=written))
            return 0
        if not refs:
            out.hint(f"{handle.id} has no artifacts")
        for a in refs:
            out.line(artifact_line(a))
        if out_dir is not None:
            out.hint(f"wrote {len(written)} file(s) under {out_dir}")
        return 0

    return run_sync(go())

