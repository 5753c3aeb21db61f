"""The convert job's side effects: plan (offline), compile, execute one step, evaluate.

Every activity materializes the run's workspace from the store first and pushes what it wrote,
so any worker of the toolchain queue can run any step. `execute_step` is cached by content:
the key is the sha256 of canonical JSON of {tool, version, params, argv, input sha256s}, and a
hit restores the recorded outputs from the store without running the tool.
"""

from __future__ import annotations

import contextlib
import contextvars
import hashlib
import json
import threading
from collections.abc import Iterator
from pathlib import Path

from pydantic import BaseModel
from temporalio import activity

from activities.storage import ArtifactStore, sha256_file
from activities.toolchains.compiler import compile_plan as compile_plan_fn
from activities.toolchains.offline_planner import plan_offline as plan_offline_fn
from activities.toolchains.registry import ToolRegistry, default_registry
from activities.workspace import Workspace
from contracts.common import ArtifactRef
from contracts.convert import CompiledStep, CompileResult, ConversionPlan
from contracts.convert_job import (
    CompileRequest, EvaluateRequest, EvaluationReport, ExecuteStepRequest, PlannerToolRequest, PlannerToolResult,
    PlanRequest, RerunRequest, StepResult,
)
from contracts.errors import Err, FleetforgeError
from contracts.messages import ChatResult
from contracts.runs import WorkspaceRef
from contracts.settings import Settings

HEARTBEAT_EVERY_S = 2.0
"""Well inside TOOLCHAIN's 10 s heartbeat timeout (workflows/_call_options.py)."""
ERROR_TAIL = 2000
KEEP_CODES = frozenset({Err.TOOLCHAIN_UNAVAILABLE, Err.PATH_ESCAPE})
"""Tool failure codes passed through as they are; every other tool failure is EXECUTOR_ERROR."""


class StepCacheEntry(BaseModel, frozen=True):
    """`cache/steps/<key>.json`: what a step with this key wrote."""

    key: str
    tool_name: str
    tool_version: str
    outputs: dict[str, ArtifactRef]


def cache_doc_key(key: str) -> str:
    return f"cache/steps/{key}.json"


def eval_cache_doc_key(key: str) -> str:
    return f"cache/evaluations/{key}.json"


def step_cache_key(step: CompiledStep, root: Path) -> str:
    """sha256 of canonical JSON of the step's identity and the content of its inputs."""
    inputs = {}
    for rel in step.inputs:
        p = root / rel
        if not p.is_file():
            raise FleetforgeError(Err.EXECUTOR_ERROR, f"step {step.step_id}: input {rel!r} is missing from the workspace")
        inputs[rel] = sha256_file(p)
    doc = {"tool": step.tool_name, "version": step.tool_version, "params": step.params, "argv": step.argv, "inputs": inputs}
    return hashlib.sha256(json.dumps(doc, sort_keys=True, separators=(",", ":"), default=str).encode()).hexdigest()


@contextlib.contextmanager
def heartbeating(what: str, every_s: float = HEARTBEAT_EVERY_S) -> Iterator[None]:
    """Heartbeat from a side thread while a blocking call runs (no-op outside an activity)."""
    if not activity.in_activity():
        yield
        return
    stop = threading.Event()
    ctx = contextvars.copy_context()

    def beat() -> None:
        while not stop.wait(every_s):
            ctx.run(activity.heartbeat, what)

    activity.heartbeat(what)
    t = threading.Thread(target=beat, name=f"heartbeat-{what}", daemon=True)
    t.start()
    try:
        yield
    finally:
        stop.set()
        t.join()


class ToolchainActivities:
    def __init__(self, store: ArtifactStore, settings: Settings, registry: ToolRegistry | None = None):
        self.store = store
        self.settings = settings
        self.registry = registry or default_registry()
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

        plan = plan_offline_fn(req.request, req.model, self.registry, feedback=req.feedback)
        return record_offline_answer(self.store, AGENT, req.model_dump(mode="json"), plan.model_dump_json())

    @activity.defn
    def plan_offline(self, req: PlanRequest) -> ConversionPlan:
        """The plan without a recorded answer: only for runs started before `offline_planner_answer`
        (their histories schedule this one); remove with the workflow's OFFLINE_ANSWER patch."""
        return plan_offline_fn(req.request, req.model, self.registry, feedback=req.feedback)

    @activity.defn
    def load_plan(self, req: RerunRequest) -> ConversionPlan:
        """An earlier run's logs/plan.json with the overrides applied (for a rerun; no planner)."""
        from activities.experiments import RunStore
        from activities.toolchains.rerun import apply_overrides

        record = RunStore(self.store).get(req.run_id)
        ws = self.workspace(WorkspaceRef(run_id=req.run_id, user_id=record.user_id))
        ws.materialize()
        p = ws.path("logs/plan.json")
        if not p.is_file():
            raise FleetforgeError(Err.BAD_INPUT, f"run {req.run_id} has no plan.json (it ended before planning); "
                                                 "start a new conversion instead of a rerun")
        doc = json.loads(p.read_text())
        doc.pop("attempt", None)
        return apply_overrides(ConversionPlan.model_validate(doc), req.overrides, self.registry)

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
        ws.write_json("logs/plan.json", req.plan.model_dump(mode="json") | {"attempt": req.attempt})
        ws.write_json("logs/compiled_steps.json", result.model_dump(mode="json") | {"attempt": req.attempt})
        ws.push(["logs/plan.json", "logs/compiled_steps.json"])
        return result

    @activity.defn
    def execute_step(self, req: ExecuteStepRequest) -> StepResult:
        """Run one compiled step (or restore its cached outputs) and mirror what it wrote. Heartbeats
        cover the transfers too: a dead worker is noticed whatever it was doing."""
        with heartbeating(f"{req.step.step_id}: {req.step.tool_name}"):
            return self._execute_step(req)

    @activity.defn
    def evaluate(self, req: EvaluateRequest) -> EvaluationReport:
        """Compare the converted model with the original on the same seeded inputs. The figures are a
        function of the two models' content, the samples and the seed, so they are cached like a step
        (under HTP emulation on x86 the evaluation costs more than the compile)."""
        with heartbeating(f"evaluate {req.candidate}"):
            return self._evaluate(req)

    def _execute_step(self, req: ExecuteStepRequest) -> StepResult:
        ws = self.workspace(req.workspace)
        ws.materialize()
        step = req.step
        key = step_cache_key(step, ws.root)
        cached = self._restore(ws, step, key)
        if cached is not None:
            return cached
        seconds, details, files = self._run(ws, step)
        log = f"logs/{step.step_id}.exec_result.json"
        ws.write_json(log, {"step_id": step.step_id, "tool": step.tool_name, "version": step.tool_version,
                            "cached": False, "cache_key": key, "outputs": files, "seconds": seconds, "details": details})
        index = ws.push(files + [log])
        outputs = {rel: index[rel] for rel in files}
        entry = StepCacheEntry(key=key, tool_name=step.tool_name, tool_version=step.tool_version, outputs=outputs)
        self.store.put_doc(cache_doc_key(key), entry.model_dump_json(indent=1).encode())
        return StepResult(step_id=step.step_id, tool_name=step.tool_name, cached=False, cache_key=key,
                          outputs=outputs, seconds=seconds)

    def _evaluate(self, req: EvaluateRequest) -> EvaluationReport:
        from activities.toolchains.evaluate import EvalParams, evaluate, evaluation_cache_key

        ws = self.workspace(req.workspace)
        ws.materialize()
        params = EvalParams(reference=req.reference, candidate=req.candidate, samples=req.samples, seed=req.seed)
        key = evaluation_cache_key(ws.root, params)
        raw = self.store.get_doc(eval_cache_doc_key(key))
        if raw is not None:
            out = EvaluationReport.model_validate_json(raw).model_copy(update={"cached": True})
        else:
            out = EvaluationReport(reference=req.reference, candidate=req.candidate, **evaluate(ws.root, params).model_dump())
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
                            "cached": True, "cache_key": key, "outputs": sorted(entry.outputs)})
        index = ws.push(sorted(entry.outputs) + [log])
        return StepResult(step_id=step.step_id, tool_name=step.tool_name, cached=True, cache_key=key,
                          outputs={rel: index[rel] for rel in sorted(entry.outputs)})

    def _run(self, ws: Workspace, step: CompiledStep) -> tuple[float, dict, list[str]]:
        """Run the tool; on failure record logs/last_error.json and raise a coded error."""
        from activities.toolchains.steps import run_step

        try:
            out = run_step(step, ws.root, self.settings.qairt_sdk_root)
            files = self._written_files(ws, step, list(out.outputs))
        except Exception as e:
            code = e.code if isinstance(e, FleetforgeError) and e.code in KEEP_CODES else Err.EXECUTOR_ERROR
            message = str(e)[-ERROR_TAIL:] or type(e).__name__
            ws.write_json("logs/last_error.json", {"step_id": step.step_id, "tool": step.tool_name,
                                                   "code": code.value, "message": message})
            ws.push(["logs/last_error.json"])
            raise FleetforgeError(code, f"step {step.step_id} ({step.tool_name}) failed: {message}") from e
        return out.seconds, dict(out.details), files

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
