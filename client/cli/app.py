"""The typer app every command group registers on, the options they share, and the tail every job
command shares (print the id, or follow the job and print its contract). No job rule lives here:
commands parse arguments, call the SDK (client/sdk.py) and hand results to `client.out`.

Exit codes: 0 completed or waiting for input, 1 failed, 2 bad usage or bad input (a job that has
already finished cannot be cancelled or answered: 2).
"""

from __future__ import annotations

import asyncio
from collections.abc import Coroutine
from importlib.metadata import version as package_version
from typing import Annotated, Any

import typer
from pydantic import BaseModel

from activities.storage import ArtifactStore, open_store
from client import fleetforge_version, out
from client.artifacts import kernel_trace
from client.cli.render import answer_command, show_needs_input, show_result
from client.ids import candidates
from client.jobs import JobHandle, fleet_label
from client.sdk import FleetforgeClient
from contracts.common import JobKind, JobStatus
from contracts.convert_job import ConversionProgress
from contracts.errors import Err, FleetforgeError
from contracts.kernel_job import KernelResult, TraceEntry
from contracts.settings import Settings

app = typer.Typer(
    name="fleetforge", add_completion=True, no_args_is_help=True, pretty_exceptions_enable=False,
    rich_markup_mode=None,  # click's plain help: real metavars (`--limit N`), no `<bool>` on flags
)

WaitOpt = Annotated[bool, typer.Option("--wait", help="Block until the job ends (progress on a terminal).")]
JsonOpt = Annotated[bool, typer.Option("--json", help="Print the result contract as one JSON object on stdout.")]


def _valid_job_id(value: str) -> str:
    """Reject text that names no job before connecting anywhere (BAD_INPUT, exit 2)."""
    candidates(value)
    return value


JobIdArg = Annotated[str, typer.Argument(
    metavar="JOB_ID", show_default=False, callback=_valid_job_id,
    help="A job as fleetforge prints it: KIND/RUN_ID (convert/20261122-140512-3f9a), a bare RUN_ID, "
         "fleet/FLEET_ID/ROW for a fleet's row, or its Web UI link.")]


def version_text() -> str:
    return f"fleetforge {fleetforge_version()} (temporalio {package_version('temporalio')})"


def _print_version(value: bool) -> None:
    if value:
        out.line(version_text())
        raise typer.Exit(0)


@app.callback()
def _options(
    version: Annotated[bool, typer.Option("--version", is_eager=True, callback=_print_version,
                                          help="Print fleetforge's version and exit.")] = False,
) -> None:
    """Durable agentic deep-learning jobs on Temporal: convert models, write kernels, test fleets.

    Configuration: the Temporal connection as the `temporal` CLI reads it (TEMPORAL_ADDRESS,
    TEMPORAL_NAMESPACE, TEMPORAL_API_KEY, TEMPORAL_TLS_*, TEMPORAL_PROFILE), FLEETFORGE_* for the rest.
    """


def run_sync(coro: Coroutine[Any, Any, Any]) -> Any:
    return asyncio.run(coro)


def settings() -> Settings:
    return Settings()


async def client_for(s: Settings, store: ArtifactStore | None = None) -> FleetforgeClient:
    """The SDK client, with big uploads drawn as a progress bar on stderr."""
    fc = await FleetforgeClient.connect(s, store or open_store(s))
    fc.upload_progress = out.UploadBar()
    return fc


def parse_sets(pairs: list[str]) -> dict[str, str]:
    parsed: dict[str, str] = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key.strip():
            raise FleetforgeError(Err.BAD_INPUT, f"expected key=value, got {pair!r}")
        parsed[key.strip()] = value.strip()
    return parsed


class NeedsInput(BaseModel):
    """--json output of a job that stopped to wait for input."""

    workflow_id: str
    status: str = JobStatus.NEEDS_INPUT.value
    progress: ConversionProgress
    answer: str


async def finish(fc: FleetforgeClient, handle: JobHandle[Any], wait: bool) -> int:
    """Shared tail of every job command: print the id, or wait and print the contract."""
    for note in handle.notes:
        out.hint(note)
    if not wait:
        out.workflow_id(handle.id)
        out.hint(f"follow it with: fleetforge watch {handle.id}   (Web UI: {await handle.ui_url()})")
        return 0
    result = await follow(fc, handle, stop_at_input=True)
    if result is None:
        return 0
    rc = await show_outcome(fc, result, await handle.ui_url())
    if rc == 0 and not out.json_mode() and handle.kind is not JobKind.MODEL_TEST:  # a failure's error stays last
        out.hint(f"get its outputs with fleetforge artifacts {handle.id} --out DIR")
    return rc


async def show_outcome(fc: FleetforgeClient, result: BaseModel, ui_url: str) -> int:
    """`show_result` with a kernel job's trace read from the store for the human view (the JSON is the
    contract); a trace the store cannot give is named, and the result still shown."""
    trace: list[TraceEntry] = []
    if isinstance(result, KernelResult) and not out.json_mode():
        try:
            trace = await asyncio.to_thread(kernel_trace, fc.store, result)
        except FleetforgeError as e:
            out.hint(f"the trace is not shown: {e.code}: {e.message}")
    return show_result(result, ui_url, trace)


async def follow(fc: FleetforgeClient, handle: JobHandle[Any], *, stop_at_input: bool) -> Any | None:
    """The job's result, showing its progress live on stderr: a timeline of its steps (a fleet: a
    progress bar of its rows) and, when it waits for input, the exact `fleetforge answer` command.
    With `stop_at_input` it returns None there (the job commands exit 0); `watch` keeps following."""
    waiting = asyncio.ensure_future(handle.outcome())
    fleet = handle.kind is JobKind.FLEET_TEST
    asked = False
    seen = 0
    try:
        with out.progress(handle.id, every_s=10.0 if fleet else 0.0, bar=fleet) as live:
            while True:
                done = waiting.done()  # one more snapshot after the end shows the last steps too
                snap = await handle.snapshot()
                p = snap.convert
                needs_input = p is not None and p.status is JobStatus.NEEDS_INPUT
                if needs_input and not asked:
                    if stop_at_input and out.json_mode():
                        out.contract(NeedsInput(workflow_id=handle.id, progress=p,
                                                answer=answer_command(handle.id, p.questions)))
                    show_needs_input(handle.id, p.questions, await handle.ui_url())
                    if stop_at_input:
                        return None
                asked = needs_input
                for step in snap.finished[seen:]:  # steps finished between two polls still show
                    live.step(step)
                seen = len(snap.finished)
                fp = snap.fleet
                if fp is not None and fp.total:
                    live.bar(fp.done, fp.total - fp.skipped, fleet_label(fp))
                else:
                    live.step(snap.step)
                if done:
                    return waiting.result()
                await asyncio.wait({waiting}, timeout=0.5)
    finally:
        waiting.cancel()
