"""The convert job's side effects: calibration data, plan (offline), compile, execute one step,
evaluate, record a failure.

Every activity materializes the run's workspace from the store first and pushes what it wrote,
so any worker of the toolchain queue can run any step. `execute_step` is cached by content:
the key is the sha256 of canonical JSON of {tool, version, params, argv, input sha256s, the
toolchain's versions (onnxruntime, onnxruntime-qnn, its QNN SDK, QAIRT)}, and a hit restores the
recorded outputs from the store without running the tool. Tools and the evaluation run in child
processes (activities/toolchains/isolate.py): a native crash fails the step, not the worker.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
from collections.abc import Callable
from pathlib import Path
from urllib.parse import unquote, urlparse

from pydantic import BaseModel
from temporalio import activity
from temporalio.exceptions import is_cancelled_exception

from activities.heartbeat import heartbeating
from activities.storage import ArtifactStore, sha256_file
from activities.toolchains.compiler import compile_plan as compile_plan_fn
from activities.toolchains.isolate import DEFAULT_LIMITS, ChildLimits, run_isolated
from activities.toolchains.offline_planner import plan_offline as plan_offline_fn
from activities.toolchains.registry import ToolRegistry, default_registry
from activities.workspace import Workspace
from contracts.common import ArtifactRef
from contracts.convert import CompiledStep, CompileResult, ConversionPlan
from contracts.convert_job import (
    CalibrationRef, CalibrationRequest, CompileRequest, EvaluateRequest, EvaluationReport, ExecuteStepRequest,
    MixedPrecisionReport, OffloadReport, PlannerToolRequest, PlannerToolResult, PlanRequest, RecordFailureRequest, ReportRequest, ReportResult,
    RerunRequest, StepResult,
)
from activities import sandbox
from activities.sandbox import SandboxMode
from contracts.errors import Err, FleetforgeError
from contracts.messages import ChatResult
from contracts.runs import WorkspaceRef
from contracts.settings import Settings

ERROR_TAIL = 2000
PLAN_FILE, COMPILED_FILE = "plan.json", "compiled_steps.json"
"""At the workspace root (README: `input/ converted/ logs/ metadata.json plan.json compiled_steps.json`)."""
LAST_ERROR = "logs/last_error.json"


class StepCacheEntry(BaseModel, frozen=True):
    """`cache/steps/<key>.json`: what a step with this key wrote."""

    key: str
    tool_name: str
    tool_version: str
    outputs: dict[str, ArtifactRef]
    offload: OffloadReport | None = None
    mixed_precision: MixedPrecisionReport | None = None
    toolchain: dict[str, str] = {}


def cache_doc_key(key: str) -> str:
    return f"cache/steps/{key}.json"


def eval_cache_doc_key(key: str) -> str:
    return f"cache/evaluations/{key}.json"


def step_cache_key(step: CompiledStep, root: Path, toolchain: dict[str, str] | None = None) -> str:
    """sha256 of canonical JSON of the step's identity, the content of its inputs and the versions of
    the toolchain that runs it (a changed onnxruntime / QNN SDK / QAIRT SDK is a miss)."""
    inputs = {}
    for rel in step.inputs:
        p = root / rel
        if not p.is_file():
            raise FleetforgeError(Err.EXECUTOR_ERROR, f"step {step.step_id}: input {rel!r} is missing from the workspace")
        inputs[rel] = sha256_file(p)
    doc = {"tool": step.tool_name, "version": step.tool_version, "params": step.params, "argv": step.argv, "inputs": inputs,
           "toolchain": _relevant(step, toolchain or {})}
    return hashlib.sha256(json.dumps(doc, sort_keys=True, separators=(",", ":"), default=str).encode()).hexdigest()


def _relevant(step: CompiledStep, toolchain: dict[str, str]) -> dict[str, str]:
    """The versions that decide a step's output: the QAIRT SDK for an argv (QAIRT CLI) step, the
    onnx/onnxruntime/onnxruntime-qnn/QNN SDK versions for an in-process step."""
    if step.argv is not None:
        return {k: v for k, v in toolchain.items() if k == "qairt"}
    return {k: v for k, v in toolchain.items() if k != "qairt"}


def _cancel_probe() -> Callable[[], bool] | None:
    """`activity.is_cancelled` inside an activity (the child runner polls it), else None."""
    return activity.is_cancelled if activity.in_activity() else None


class ToolchainActivities:
    def __init__(self, store: ArtifactStore, settings: Settings, registry: ToolRegistry | None = None, *,
                 toolchain: dict[str, str] | None = None, limits: ChildLimits = DEFAULT_LIMITS):
        from activities.toolchains.versions import toolchain_versions

        self.store = store
        self.settings = settings
        self.registry = registry or default_registry()
        self.toolchain = toolchain if toolchain is not None else toolchain_versions(settings.qairt_sdk_root)
        """Versions in every cache key (tests pass other ones to show an upgrade misses the cache)."""
        self.limits = limits
        if settings.qairt_sdk_root:  # the installed SDK's version decides which qairt specs (flags) apply
            from activities.toolchains.qairt import detect_sdk
            from contracts.convert import Toolchain

            with contextlib.suppress(FleetforgeError):  # a broken SDK shows up when a qairt step runs
                sdk = detect_sdk(settings.qairt_sdk_root)
                self.registry = self.registry.for_toolchain_version(Toolchain.QAIRT, sdk.spec_version)

    def workspace(self, ref: WorkspaceRef) -> Workspace:
        return Workspace(self.store, self.settings.cache_dir, ref)

    @activity.defn
    def offline_planner_answer(self, req: PlanRequest) -> ChatResult:
        """The deterministic rule-based plan (or a NEEDS_INPUT plan with questions) as the offline
        provider's answer, recorded exactly like an LLM's: the plan JSON as the text, a transcript
        of the request it decided from, usage zero."""
        from activities.llm.activity import record_offline_answer
        from activities.toolchains.llm_planner import AGENT

        plan = plan_offline_fn(req.request, req.model, self.registry, feedback=req.feedback, remedy=req.remedy)
        return record_offline_answer(self.store, AGENT, req.model_dump(mode="json"), plan.model_dump_json())

    @activity.defn
    def load_plan(self, req: RerunRequest) -> ConversionPlan:
        """An earlier run's plan.json with the overrides applied (for a rerun; no planner)."""
        from activities.toolchains.rerun import apply_overrides, earlier_plan

        return apply_overrides(earlier_plan(self.store, req.run_id), req.overrides, self.registry)

    @activity.defn
    def prepare_calibration(self, req: CalibrationRequest) -> CalibrationRef:
        """Copy the user's calibration data into the workspace as one canonical .npz (content-addressed:
        `input/calibration_<sha256>.npz`), checked against the model's inputs. With `eval_samples`, the
        accuracy gate's samples are kept apart (`input/evaluation_<sha256>.npz`): the user's separate
        evaluation set, checked to share no sample with the calibration data, or a held-out part of
        the calibration data that the calibration copy no longer holds."""
        from activities.toolchains.feeds import ingest, ingest_split

        ws = self.workspace(req.workspace)
        ws.materialize()
        source = self._local_data(req.source, "calibration data") if req.source else None
        if not req.eval_samples and not req.eval_source:  # a run from before held-out evaluation
            assert source is not None
            rel, sha, samples, inputs = ingest(source, ws.path(req.model), ws.root)
            ws.push([rel])
            return CalibrationRef(path=rel, sha256=sha, samples=samples, inputs=inputs)
        eval_source = self._local_data(req.eval_source, "evaluation data") if req.eval_source else None
        got = ingest_split(source, ws.path(req.model), ws.root, eval_source=eval_source, eval_samples=req.eval_samples)
        ws.push([p for p in (got.calibration, got.evaluation) if p])
        return CalibrationRef(path=got.calibration or "", sha256=got.calibration_sha256, samples=got.calibration_samples,
                              inputs=got.inputs, evaluation=got.evaluation, evaluation_samples=got.evaluation_samples,
                              held_out=got.held_out)

    def _local_data(self, value: str, what: str) -> Path:
        """A local path for an absolute path, file://, s3:// or upload:// URI of user data (upload: what the
        client shipped, contracts/uploads.py); CALIBRATION_INVALID otherwise."""
        from activities.modelhub import ModelHub

        parsed = urlparse(value)
        if parsed.scheme in ("s3", "upload"):
            try:
                return ModelHub(self.store, self.settings).locate(value)[1]
            except FleetforgeError as e:
                if e.code is Err.STORE_NOT_SHARED:
                    raise
                raise FleetforgeError(Err.CALIBRATION_INVALID, f"{what}: {e.message}") from e
        source = Path(unquote(parsed.path)) if parsed.scheme == "file" else Path(value)
        if not source.is_absolute():
            raise FleetforgeError(Err.CALIBRATION_INVALID, f"{what} path {value!r} is relative; give an "
                                  "absolute path or a file:// or s3:// URI (the fleetforge CLI resolves it for you)")
        return source

    @activity.defn
    def write_report(self, req: ReportRequest) -> ReportResult:
        """The deployment report: the workflow's facts plus, per model artifact, where each op type runs
        (HTP context binary or CPU) and the toolchain versions; stored as `report/conversion_report.md`
        and `.json` in the run's workspace."""
        from activities.toolchains.report import REPORT_JSON, REPORT_MD, complete_report, render_markdown

        ws = self.workspace(req.workspace)
        ws.materialize()
        report = complete_report(req.report, ws.root, req.context_sources, self.toolchain)
        ws.path(REPORT_MD).parent.mkdir(parents=True, exist_ok=True)
        ws.path(REPORT_MD).write_text(render_markdown(report))
        ws.write_json(REPORT_JSON, report.model_dump(mode="json"))
        index = ws.push([REPORT_MD, REPORT_JSON])
        return ReportResult(report=report, files=[index[REPORT_MD], index[REPORT_JSON]])

    @activity.defn
    def record_failure(self, req: RecordFailureRequest) -> None:
        """logs/last_error.json: why the job failed (every failure: compiler, executor, evaluation,
        accuracy gate), with the step's own details when it wrote some."""
        ws = self.workspace(req.workspace)
        ws.materialize()
        step_log = ws.path(f"logs/{req.failure.where}.error.json") if _safe_name(req.failure.where) else None
        details = json.loads(step_log.read_text()) if step_log is not None and step_log.is_file() else {}
        ws.write_json(LAST_ERROR, req.failure.model_dump(mode="json") | {"details": details, "attempts": req.attempts})
        ws.push([LAST_ERROR])

    @activity.defn
    def planner_tool(self, req: PlannerToolRequest) -> PlannerToolResult:
        """One planner-only tool call (list_tools, get_tool_spec, dry_run); anything else is refused."""
        from activities.toolchains.llm_planner import PLANNER_TOOLS, refusal, run_planner_tool

        if req.name not in PLANNER_TOOLS:
            return PlannerToolResult(content=refusal(req.name), is_error=True)
        ws = self.workspace(req.workspace)
        ws.materialize()
        content, is_error = run_planner_tool(req.name, req.arguments, self.registry, ws.root)
        return PlannerToolResult(content=content, is_error=is_error)

    @activity.defn
    def compile_plan(self, req: CompileRequest) -> CompileResult:
        """Validate the plan against the registry and the workspace; record plan and verdict."""
        ws = self.workspace(req.workspace)
        ws.materialize()
        result = compile_plan_fn(req.plan, self.registry, ws.root)
        ws.write_json(PLAN_FILE, req.plan.model_dump(mode="json") | {"attempt": req.attempt})
        ws.write_json(COMPILED_FILE, result.model_dump(mode="json") | {"attempt": req.attempt})
        ws.push([PLAN_FILE, COMPILED_FILE])
        return result

    @activity.defn
    def execute_step(self, req: ExecuteStepRequest) -> StepResult:
        """Run one compiled step (or restore its cached outputs) and mirror what it wrote. Heartbeats
        cover the transfers too: a dead worker is noticed whatever it was doing."""
        with heartbeating(f"{req.step.step_id}: {req.step.tool_name}"):
            return self._execute_step(req)

    @activity.defn
    def evaluate(self, req: EvaluateRequest) -> EvaluationReport:
        """Compare the converted model with the original on the same inputs, in a child process (an
        emulator crash is EVALUATION_CRASHED). The figures are a function of both models' content, the
        inputs, the samples, the seed and the toolchain, so they are cached like a step (under HTP
        emulation on x86 the evaluation costs more than the compile)."""
        with heartbeating(f"evaluate {req.candidate}"):
            return self._evaluate(req)

    def _execute_step(self, req: ExecuteStepRequest) -> StepResult:
        ws = self.workspace(req.workspace)
        ws.materialize()
        step = req.step
        key = step_cache_key(step, ws.root, self.toolchain)
        cached = self._restore(ws, step, key)
        if cached is not None:
            return cached
        seconds, details, files = self._run(ws, step)
        offload = OffloadReport.model_validate(details["offload"]) if isinstance(details.get("offload"), dict) else None
        mixed = details.get("mixed_precision")
        mixed = MixedPrecisionReport.model_validate(mixed) if isinstance(mixed, dict) else None
        log = f"logs/{step.step_id}.exec_result.json"
        ws.write_json(log, {"step_id": step.step_id, "tool": step.tool_name, "version": step.tool_version,
                            "cached": False, "cache_key": key, "outputs": files, "seconds": seconds, "details": details,
                            "toolchain": self.toolchain})
        index = ws.push(files + [log])
        outputs = {rel: index[rel] for rel in files}
        entry = StepCacheEntry(key=key, tool_name=step.tool_name, tool_version=step.tool_version, outputs=outputs,
                               offload=offload, mixed_precision=mixed, toolchain=_relevant(step, self.toolchain))
        self.store.put_doc(cache_doc_key(key), entry.model_dump_json(indent=1).encode())
        unconfined = sandbox.confinement_note() if sandbox.mode() is SandboxMode.OFF else ""
        return StepResult(step_id=step.step_id, tool_name=step.tool_name, cached=False, cache_key=key,
                          outputs=outputs, seconds=seconds, offload=offload, mixed_precision=mixed, confinement=unconfined)

    def _evaluate(self, req: EvaluateRequest) -> EvaluationReport:
        from activities.toolchains.evaluate import EvalParams, evaluation_cache_key

        ws = self.workspace(req.workspace)
        ws.materialize()
        params = EvalParams(reference=req.reference, candidate=req.candidate, samples=req.samples, seed=req.seed,
                            calibration=req.calibration, source=req.source, evaluation=req.evaluation,
                            held_out=req.held_out, calibrated_on=req.calibrated_on)
        key = evaluation_cache_key(ws.root, params, self.toolchain)
        raw = self.store.get_doc(eval_cache_doc_key(key))
        if raw is not None:
            out = EvaluationReport.model_validate_json(raw).model_copy(update={"cached": True})
        else:
            try:
                reply = run_isolated("activities.toolchains.evaluate:evaluate_in_child",
                                     {"root": str(ws.root), "params": params.model_dump(mode="json")},
                                     what=f"evaluating {req.candidate} (QNN HTP emulation on x86)",
                                     crash_code=Err.EVALUATION_CRASHED, fallback_code=Err.EVALUATION_ERROR,
                                     limits=self.limits, cancelled=_cancel_probe(), writable=[ws.root])
            except FleetforgeError as e:
                self._step_error(ws, "evaluate", "evaluate", e)
                raise
            out = EvaluationReport.model_validate(reply)
            self.store.put_doc(eval_cache_doc_key(key), out.model_dump_json(indent=1).encode())
        ws.write_json("logs/evaluation.json", out.model_dump(mode="json"))
        ws.push(["logs/evaluation.json"])
        return out

    def _restore(self, ws: Workspace, step: CompiledStep, key: str) -> StepResult | None:
        raw = self.store.get_doc(cache_doc_key(key))
        if raw is None:
            return None
        entry = StepCacheEntry.model_validate_json(raw)
        if not entry.outputs or not all(self.store.exists(ref) for ref in entry.outputs.values()):
            return None  # a cache entry whose blobs are gone is a miss, not an error
        for rel, ref in entry.outputs.items():
            self.store.get_file(ref, ws.path(rel))
        log = f"logs/{step.step_id}.exec_result.json"
        ws.write_json(log, {"step_id": step.step_id, "tool": step.tool_name, "version": step.tool_version,
                            "cached": True, "cache_key": key, "outputs": sorted(entry.outputs), "toolchain": entry.toolchain})
        index = ws.push(sorted(entry.outputs) + [log])
        return StepResult(step_id=step.step_id, tool_name=step.tool_name, cached=True, cache_key=key,
                          outputs={rel: index[rel] for rel in sorted(entry.outputs)}, offload=entry.offload,
                          mixed_precision=entry.mixed_precision)

    def _run(self, ws: Workspace, step: CompiledStep) -> tuple[float, dict, list[str]]:
        """Run the tool (in a child process); on failure record logs/<step>.error.json and raise a coded
        error. A cancellation passes through untouched (the child is already killed)."""
        from activities.toolchains.steps import run_step

        try:
            out = run_step(step, ws.root, self.settings.qairt_sdk_root, limits=self.limits, cancelled=_cancel_probe())
            files = self._written_files(ws, step, list(out.outputs))
        except FleetforgeError as e:
            self._step_error(ws, step.step_id, step.tool_name, e)
            raise
        except Exception as e:
            if is_cancelled_exception(e):
                raise
            from activities.toolchains.isolate import tidy

            error = FleetforgeError(Err.EXECUTOR_ERROR, f"step {step.step_id} ({step.tool_name}) failed: "
                                    f"{tidy(str(e))[-ERROR_TAIL:] or type(e).__name__}")
            self._step_error(ws, step.step_id, step.tool_name, error)
            raise error from e
        return out.seconds, dict(out.details), files

    def _step_error(self, ws: Workspace, where: str, tool: str, e: FleetforgeError) -> None:
        """logs/<where>.error.json and logs/last_error.json: the failing step's code and message."""
        doc = {"where": where, "tool": tool, "code": e.code.value, "message": e.message, "toolchain": self.toolchain}
        ws.write_json(f"logs/{where}.error.json", doc)
        ws.write_json(LAST_ERROR, doc)
        ws.push([f"logs/{where}.error.json", LAST_ERROR])

    def _written_files(self, ws: Workspace, step: CompiledStep, written: list[str]) -> list[str]:
        """Every file the step wrote; an expected output that is missing or empty is a tool failure."""
        files: set[str] = set()
        for rel in step.outputs + written:
            p = ws.path(rel)
            if p.is_dir():
                found = sorted(q for q in p.rglob("*") if q.is_file())
                files |= {q.relative_to(ws.root).as_posix() for q in found}
                if not found:
                    raise FleetforgeError(Err.EXECUTOR_ERROR, f"step {step.step_id}: output folder {rel!r} is empty")
            elif p.is_file() and p.stat().st_size > 0:
                files.add(rel)
            else:
                raise FleetforgeError(Err.EXECUTOR_ERROR, f"step {step.step_id}: expected output {rel!r} is missing or empty")
        return sorted(files)


def _safe_name(where: str) -> bool:
    return bool(where) and all(c.isalnum() or c in "_.-" for c in where) and not where.startswith(".")
