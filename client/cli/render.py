"""How the CLI shows results: every contract as lines and tables (JSON goes through `out.contract`).
Formatting only (STYLE G16); what a job is and does is the SDK's."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from pydantic import BaseModel

from client import out
from client.jobs import JobSummary
from contracts.agents import AgentProvenance
from contracts.common import ArtifactRef, JobStatus, TokenTotals
from contracts.convert_job import ConversionResult
from contracts.fleet_job import FleetTestResult, ModelTestResult
from contracts.inspect import InspectResult
from contracts.kernel_job import KernelOutcome, KernelResult, TraceEntry


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
        from activities.toolchains.report import verdict_words

        t.add_row("accuracy", verdict_words(acc), "", "", f">= {acc.min_cosine:g}")
    if result.offload is not None:
        t.add_row("offload", f"{result.offload.share:.0%} on HTP", "", "", "")
    return t


def accuracy_line(result: ConversionResult) -> str | None:
    """One line on the accuracy gate: verdict, figures, remedies; None for a run from before the gate."""
    from activities.toolchains.report import verdict_words

    acc = result.accuracy
    if acc is None:
        return None
    text = f"accuracy: {verdict_words(acc)}"
    if acc.cosine is not None:
        figure = "lowest per-sample cosine" if acc.samples else "worst output cosine"
        text += f" ({figure} {acc.cosine:.4f}, threshold {acc.min_cosine:g}"
        text += f", {acc.samples} {acc.inputs.replace('_', '-')} samples" if acc.samples else ""
        text += f", SQNR {acc.sqnr_db:.1f} dB)" if acc.sqnr_db is not None else ")"
    if acc.remedies:
        text += " after remedies: " + ", ".join(acc.remedies)
    if acc.verdict == "unverified":
        text += "; " + (acc.hint or "verify it on real inputs: --calibration FILE.npz (a held-out part grades it) or "
                        "--eval-data FILE.npz")
    return text + (f"; {acc.note}" if acc.note and acc.verdict not in ("passed", "unverified") else "")


def precision_line(result: ConversionResult) -> str | None:
    req, got = result.requested_precision, result.delivered_precision
    if req is None or got is None:
        return None
    return f"precision: {got.value}" + (f" (requested {req.value})" if got != req else " (as requested)")


def mixed_line(result: ConversionResult) -> str | None:
    """The layers an int8 build keeps at 16-bit activations, and why (None: none)."""
    from activities.toolchains.report import mixed_words

    mixed = getattr(result, "mixed_precision", None)
    if mixed is None:
        return None
    layers = ", ".join(f"{layer.node} ({layer.op_type}, {layer.cosine_gain:+.4f})" for layer in mixed.sixteen_bit)
    return f"mixed precision: {mixed_words(mixed)}; most sensitive first (cosine gained alone): {layers}"


def offload_line(result: ConversionResult) -> str | None:
    o = result.offload
    if o is None:
        return None
    text = f"offload: {o.share:.0%} of {o.model_nodes} nodes inside the HTP context binary"
    return text + (f"; on the CPU: {', '.join(o.cpu_ops)} ({o.cpu_nodes} nodes)" if o.cpu_nodes else "") + o.io_note()


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
    for text in (accuracy_line(result), precision_line(result), mixed_line(result), offload_line(result)):
        if text:
            out.line(text)
    if result.report is not None:
        from activities.toolchains.report import render_markdown

        out.line("")
        for line in render_markdown(result.report).splitlines():
            out.line(line)
    for a in result.attempts:
        outcome = f"remedy {a.remedies[-1]} could not run" if a.outcome == "remedy_failed" and a.remedies else a.outcome
        out.line(f"attempt {a.attempt}: {outcome}" + (f" - {a.feedback.splitlines()[0]}" if a.feedback else ""))
    for p in result.planner:
        out.line(planner_line(p))
    show_tokens(result.tokens)
    for w in result.warnings:
        out.hint(f"warning: {w}")
    out.line(f"Web UI: {ui_url}")


def planner_line(p: AgentProvenance) -> str:
    """Who planned: with 0 tokens spent, the reader should not have to guess whether an LLM was asked."""
    if p.source == "offline":
        return "planner: offline (the worker has no LLM: FLEETFORGE_LLM, docs/configuration.md)"
    return (f"planner: {p.source} ({p.llm_answers} LLM answer(s), {len(p.rejections)} refused)"
            + (f": {p.fallback_reason}" if p.fallback_reason else ""))


def show_tokens(t: TokenTotals) -> None:
    out.line(f"tokens: {t.total_tokens} ({t.prompt_tokens} prompt, {t.completion_tokens} completion) in {t.calls} "
             f"agent answer(s), {t.latency_s:.1f} s of LLM time"
             + (f"; {t.unreported_calls} call(s) without usage from the server, not counted" if t.unreported_calls else ""))


def _mark(entry: TraceEntry, verified: bool) -> str:
    """`ok`, `err`, or `end` for the optimizer step that wrote no candidate in a verified job: its rounds ended
    (every rewrite tried, or the LLM had nothing better), which is no failure of the job."""
    if entry.ok:
        return "ok "
    return "end" if verified and entry.agent == "optimizer" and entry.artifact is None else "err"


def show_kernel(result: KernelResult, trace: Sequence[TraceEntry], ui_url: str) -> None:
    """`trace`: the job's steps, read from the store (`client.artifacts.kernel_trace`)."""
    out.line(f"kernel: {result.outcome.value if hasattr(result.outcome, 'value') else result.outcome} "
             f"({result.status.value}, {result.steps} steps"
             + (f", {result.finish_reason.value if hasattr(result.finish_reason, 'value') else result.finish_reason}" if result.finish_reason else "")
             + ")")
    if result.op_family or result.aten_ops:
        out.line(f"reference: {result.op_family or 'no offline template'} (aten: {', '.join(result.aten_ops) or '-'})")
    if result.overrides:
        out.line("sizes: " + ", ".join(f"{k}={v}" for k, v in result.overrides.items()))
    verified = result.outcome == KernelOutcome.VERIFIED
    for e in trace:
        out.line(f"  {e.step:>3} {e.agent:<10} {_mark(e, verified)} {e.summary}")
    for why in result.fallbacks:
        out.hint(f"fallback: {why}")
    if result.duplicates_refused:
        out.line(f"{result.duplicates_refused} candidate(s) identical to a rejected one were not verified again")
    if result.best_candidate is not None:
        out.line("best candidate:" + artifact_line(result.best_candidate))
    if result.report is not None:
        out.line(f"verifier: {'passed' if result.report.passed else 'failed'}"
                 + (f": {result.report.reason}" if result.report.reason else ""))
        if result.report.passed and result.report.gpu_compile is not None:
            out.line(f"gpu: {result.report.gpu_compile.summary}")
        if result.report.passed and result.report.special_values:
            out.line(f"nan/inf: {result.report.special_values}")
    out.line(f"speed: {result.timing.summary if result.timing is not None else result.speed or '-'}")
    if result.modeled is not None and result.timing is not None:  # the measurement first, the model beside it
        out.line(f"       {result.modeled.summary}")
    out.line(f"precision: {result.precision_used}")
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
    text = f"fleetforge answer {workflow_id} " + " ".join(example[k] for k in keys)
    if any("synthetic_calibration" in q for q in questions):
        text += f" (or: fleetforge answer {workflow_id} synthetic_calibration=yes)"
    return text


def show_needs_input(workflow_id: str, questions: list[str], ui_url: str) -> None:
    out.hint(f"{workflow_id} is waiting for input:")
    for q in questions:
        out.hint(f"  - {q}")
    out.hint(f"answer with: {answer_command(workflow_id, questions)}")
    out.hint(f"Web UI: {ui_url}")


def show_result(result: BaseModel, ui_url: str, trace: Sequence[TraceEntry] = ()) -> int:
    """Print a finished job's contract (JSON or human) and return its exit code; `trace`: a kernel job's
    steps for the human view (the JSON is the contract, with the trace's ref)."""
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
        show_kernel(result, trace, ui_url)
    elif isinstance(result, FleetTestResult):
        show_fleet(result, ui_url)
    elif isinstance(result, ModelTestResult):
        show_model_test(result, ui_url)
    else:
        out.line(result.model_dump_json(indent=2))
    failure = getattr(result, "failure", None)
    if failure is not None:
        out.error(f"{failure.code} in {failure.where}: {failure.message}", failure.code, getattr(failure, "hint", ""))
    return out.exit_code(status)


def jobs_table(jobs: list[JobSummary]) -> Any:
    from rich.table import Table

    t = Table(box=None, pad_edge=False, header_style="bold")
    for col in ("JOB", "KIND", "STATUS", "MODEL", "TARGET", "STARTED"):
        t.add_column(col, no_wrap=col != "MODEL", overflow="fold")
    for j in jobs:
        started = f"{j.start_time.astimezone():%Y-%m-%d %H:%M:%S}" if j.start_time else ""
        t.add_row(j.workflow_id, j.kind, j.status, j.model or "-", j.target or "-", started)
    return t

