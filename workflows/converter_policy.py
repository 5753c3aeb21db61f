"""The converter's decisions as pure functions (STYLE G3): what to do after a compile, after an
execution, and whether a human answer is acceptable. No workflow.* calls, no I/O."""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass

from activities.toolchains.socs import lookup_soc
from contracts.common import Failure
from contracts.convert import CompiledStep, CompileResult, Precision
from contracts.convert_job import AttemptRecord, ConversionRequest, ProvideInput
from contracts.errors import Err, FleetforgeError

NOT_REPLANNABLE = frozenset({Err.TOOLCHAIN_UNAVAILABLE, Err.STORE_UNAVAILABLE, Err.INTEGRITY_ERROR, Err.STORE_URL_INVALID})
"""Execution failures a different plan cannot fix."""


@dataclass(frozen=True)
class Execute:
    steps: list[CompiledStep]
    fingerprint: str


@dataclass(frozen=True)
class Replan:
    feedback: str
    record: AttemptRecord
    where: str = "compile"
    """Where the attempt failed: "compile", or the failing step."""


@dataclass(frozen=True)
class GiveUp:
    failure: Failure
    record: AttemptRecord


@dataclass(frozen=True)
class Evaluate:
    record: AttemptRecord


def fingerprint(steps: list[CompiledStep]) -> str:
    """Identity of what would run: tool, version, argv and params of every step, in order."""
    doc = [{"tool": s.tool_name, "version": s.tool_version, "argv": s.argv, "params": s.params} for s in steps]
    return hashlib.sha256(json.dumps(doc, sort_keys=True, separators=(",", ":"), default=str).encode()).hexdigest()


def next_after_compile(result: CompileResult, *, attempt: int, replans: int, max_replans: int,
                       tried: frozenset[str] = frozenset(), last_feedback: str = "") -> Execute | Replan | GiveUp:
    """Run a clean compile unless exactly these steps already failed; replan a rejected plan while
    the budget lasts."""
    if result.ok:
        fp = fingerprint(result.steps)
        if fp in tried:
            why = "the planner proposed steps that already failed; they are not run twice"
            msg = why + (f". Last error: {last_feedback}" if last_feedback else "")
            return GiveUp(Failure(code=Err.REPLANS_EXHAUSTED, message=msg, where="plan"),
                          AttemptRecord(attempt=attempt, outcome="repeated_plan", feedback=why))
        return Execute(steps=result.steps, fingerprint=fp)
    feedback = result.feedback()
    record = AttemptRecord(attempt=attempt, outcome="compile_rejected", feedback=feedback)
    if replans < max_replans:
        return Replan(feedback=feedback, record=record)
    return GiveUp(Failure(code=Err.REPLANS_EXHAUSTED, where="compile",
                          message=f"the plan was still rejected after {replans} replan(s): {feedback}"), record)


def next_after_execution(failure: Failure | None, *, attempt: int, replans: int, max_replans: int) -> Evaluate | Replan | GiveUp:
    """Evaluate after a clean run; replan after a tool failure while the budget lasts."""
    if failure is None:
        return Evaluate(AttemptRecord(attempt=attempt, outcome="succeeded"))
    feedback = f"[{failure.code}] {failure.where}: {failure.message}"
    record = AttemptRecord(attempt=attempt, outcome="execution_failed", feedback=feedback)
    if failure.code in NOT_REPLANNABLE:
        return GiveUp(failure, record)
    if replans < max_replans:
        return Replan(feedback=feedback, record=record, where=failure.where)
    return GiveUp(Failure(code=Err.REPLANS_EXHAUSTED, where=failure.where,
                          message=f"execution still failed after {replans} replan(s): {feedback}"), record)


def rerun_gives_up(replan: Replan, rerun_of: str, overrides: dict[str, str]) -> GiveUp:
    """A rerun reuses an earlier plan and is never replanned: its failure says what to change."""
    code = Err.COMPILER_ERROR if replan.record.outcome == "compile_rejected" else Err.EXECUTOR_ERROR
    return GiveUp(Failure(code=code, where=replan.where,
                          message=f"the rerun of {rerun_of} with {overrides} failed (a rerun is not replanned; change "
                                  f"the overrides or start a new conversion): {replan.feedback}"), replan.record)


def answer_problems(answer: ProvideInput) -> list[str]:
    """Why an answer cannot be accepted (empty: acceptable)."""
    if answer.is_empty():
        return ["the answer is empty: give soc, precision or calibration"]
    problems = []
    if answer.soc is not None:
        try:
            lookup_soc(answer.soc)
        except FleetforgeError as e:
            problems.append(e.message)
    if answer.precision is not None and answer.precision.strip().lower() not in {p.value for p in Precision}:
        problems.append(f"unknown precision {answer.precision!r}; valid: {', '.join(p.value for p in Precision)}")
    return problems


def answer_hint(workflow_id: str) -> str:
    """The command that answers a waiting job (the details and the timer summary show it)."""
    return f"fleetforge answer {workflow_id} soc=... precision=..."


def wait_summary(timeout_s: int, workflow_id: str) -> str:
    """The NEEDS_INPUT timer's summary, in words a person reads in the Web UI's timeline."""
    return f"waiting up to {_duration(timeout_s)} for an answer: {answer_hint(workflow_id)}"


def _duration(seconds: int) -> str:
    """604800 → "7 days", 5400 → "1 h 30 min", 90 → "1 min 30 s" (the two largest units)."""
    if seconds % 86400 == 0:
        days = seconds // 86400
        return f"{days} day{'s' if days != 1 else ''}"
    parts = [(seconds // 86400, "d"), (seconds % 86400 // 3600, "h"), (seconds % 3600 // 60, "min"), (seconds % 60, "s")]
    shown = [f"{n} {unit}" for n, unit in parts if n][:2]
    return " ".join(shown) or "0 s"


def apply_answer(request: ConversionRequest, answer: ProvideInput) -> ConversionRequest:
    """The request with the answered facts filled in (unanswered ones unchanged)."""
    update: dict[str, object] = {}
    if answer.soc and answer.soc.strip():
        update["target_soc"] = lookup_soc(answer.soc).name
    if answer.precision and answer.precision.strip():
        update["precision"] = Precision(answer.precision.strip().lower())
    if answer.calibration and answer.calibration.strip():
        update["calibration"] = answer.calibration.strip()
    return request.model_copy(update=update)
