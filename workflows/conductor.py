"""ConductorWorkflow: the workflow.yaml-driven kernel loop (designer → coder → verifier → ...).

Routing is `conductor_policy` (pure); each agent is one activity that gets a typed context and
answers with ArtifactRefs (prompts, raw answers and sources live in the artifact store), so the
history grows by a few KiB per step. The agents run on the llm queue (the offline templates or
the request's LLM); verification runs on the kernels queue. When the conductor must choose
between several agents it asks the LLM (analyze.j2); an unusable answer, or no LLM, is resolved
by `apply_llm_decision`'s deterministic fallback, and the trace says so.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

from temporalio import workflow
from temporalio.exceptions import ActivityError

with workflow.unsafe.imports_passed_through():
    from activities.kernels.activities import KernelActivities
    from activities.kernels.config_loader import config_for_task
    from contracts.common import ArtifactRef, Failure, JobStatus
    from contracts.kernel import (
        AgentName,
        AgentRecord,
        AskLLM,
        ConductorConfig,
        ConductorState,
        Finish,
        FinishReason,
        Go,
    )
    from contracts.kernel_job import (
        AgentCall,
        AnalyzeRequest,
        AnalyzeResult,
        Attempt,
        CodeRequest,
        CodeResult,
        DesignRequest,
        DesignResult,
        KernelDesign,
        KernelOutcome,
        KernelRequest,
        KernelResult,
        Provider,
        RecordTraceRequest,
        TraceEntry,
        VerifierReport,
        VerifyRequest,
        VerifyResult,
    )
    from contracts.messages import TokenUsage
    from workflows import _visibility as ui
    from workflows._call_options import KERNEL, LLM
    from workflows._llm import token_totals
    from workflows.conductor_policy import apply_llm_decision, faster, get_next_agent, provider_for, recent_attempts
    from workflows.failures import failure_from
    from workflows.job_end import end_failed, is_cancellation, mark_cancelled

R = TypeVar("R")
AgentRequest = TypeVar("AgentRequest", DesignRequest, CodeRequest)


@workflow.defn
class ConductorWorkflow:
    def __init__(self) -> None:
        self._state = ConductorState()
        self._trace: list[TraceEntry] = []
        self._design: KernelDesign | None = None
        self._candidates: list[ArtifactRef] = []
        """The last coder round's candidates (one unless num_candidates > 1)."""
        self._attempts: list[Attempt] = []
        self._best: ArtifactRef | None = None
        self._report: VerifierReport | None = None
        self._speed = ""
        self._speedup: float | None = None
        self._calls: list[AgentCall] = []
        """Every agent answer and routing analysis, for the result's token/latency totals."""
        self._routing = ("config", TokenUsage())
        """How the next agent was chosen, and what the analysis that chose it cost."""
        self._where = "starting"

    @workflow.run
    async def run(self, req: KernelRequest) -> KernelResult:
        self._req = req
        config = self._config(req)
        self._show("starting")
        try:
            while True:
                decision = get_next_agent(self._state, config)
                self._routing = ("config", TokenUsage())
                if isinstance(decision, AskLLM):
                    decision = await self._analyse(decision)
                if isinstance(decision, Finish):
                    return await self._finish(decision)
                await self._run_agent(decision, provider_for(decision.agent, self._state, config, req.llm))
        except (ActivityError, asyncio.CancelledError) as e:
            if is_cancellation(e):
                mark_cancelled()
                self._show("cancelled")
                raise
            return await self._fail(e)

    @workflow.query
    def trace(self) -> list[TraceEntry]:
        return list(self._trace)

    # -- steps -------------------------------------------------------------------------------

    @staticmethod
    def _config(req: KernelRequest) -> ConductorConfig:
        """The request's validated config with the task's max_step override (pure: no file read)."""
        return config_for_task(req.task.model_copy(update={"conductor": req.config}))

    async def _analyse(self, ask: AskLLM) -> Go | Finish:
        """Ask the conductor LLM which option runs next; no LLM or an unusable answer → fallback rule."""
        if self._req.llm == "offline":
            result = AnalyzeResult(reason="offline conductor (no LLM)")
        else:
            last = self._trace[-1] if self._trace else None
            areq = AnalyzeRequest(task=self._req.task, agent=ask.agent, options=ask.options, step=ask.step,
                                  last_result=last.summary if last else "",
                                  recent=[f"step {e.step} {e.agent}: {e.summary}" for e in self._trace[-5:]])
            try:
                result = await self._llm_call(KernelActivities.analyze, areq, f"conductor: route after {ask.agent}")
                self._calls.append(result.call)
            except ActivityError as e:
                result = AnalyzeResult(reason=f"LLM failed: {failure_from(e, where='analyze').message}")
        decision = apply_llm_decision(result.decision, ask.options, self._state)
        if isinstance(decision, Go) and decision.fallback:
            why = result.reason or f"decision {result.decision.next_agent if result.decision else ''!r} not in {ask.options}"
            self._routing = (f"fallback: {why}"[:300], result.call.usage)
        else:
            self._routing = (f"llm: {result.decision.next_agent}" if result.decision else "fallback", result.call.usage)
        return decision

    async def _run_agent(self, go: Go, provider: Provider) -> None:
        self._where = f"{go.agent} step {go.step}"
        self._show(self._where)
        started = workflow.now()
        if go.agent == AgentName.DESIGNER:
            record, entry = await self._design_step(go, provider)
        elif go.agent in (AgentName.CODER, AgentName.OPTIMIZER):
            record, entry = await self._code_step(go, provider)
        elif go.agent == AgentName.VERIFIER:
            record, entry = await self._verify_step(go)
        else:
            record = AgentRecord(agent=go.agent, step=go.step, parsed_ok=False, suggestion=go.suggestion)
            entry = TraceEntry(step=go.step, agent=go.agent, summary="no activity for this agent", ok=False)
        routing, analysis_tokens = self._routing
        self._state = self._state.record(record)
        self._trace.append(entry.model_copy(update={
            "fallback": go.fallback, "routing": routing, "started_at": started,
            "duration_s": round((workflow.now() - started).total_seconds(), 3), "tokens": entry.tokens + analysis_tokens,
        }))

    async def _design_step(self, go: Go, provider: Provider) -> tuple[AgentRecord, TraceEntry]:
        dreq = DesignRequest(task=self._req.task, suggestion=go.suggestion, step=go.step, llm=provider)
        res, note = await self._agent(KernelActivities.design, dreq, f"designer step {go.step}")
        if res.parsed_ok:
            self._design = res.design
        self._calls.append(res.call)
        summary = f"design: {res.design.family}" if res.design else f"unusable answer: {res.reason}"
        return (AgentRecord(agent=go.agent, step=go.step, parsed_ok=res.parsed_ok, suggestion=go.suggestion),
                TraceEntry(step=go.step, agent=go.agent, summary=note + summary, ok=res.parsed_ok, artifact=res.artifact,
                           provider=res.call.provider, prompt=res.call.prompt, output=res.call.output,
                           transcript=res.call.transcript, parse_error=res.reason, tokens=res.call.usage))

    async def _code_step(self, go: Go, provider: Provider) -> tuple[AgentRecord, TraceEntry]:
        """One round: `num_candidates` concurrent coder attempts (the optimizer writes one)."""
        n = self._req.task.num_candidates if go.agent == AgentName.CODER else 1
        failed = self._report if self._report is not None and not self._report.passed else None
        base = CodeRequest(task=self._req.task, role=go.agent, design=self._design,
                           feedback=failed.reason if failed else "", mismatches=failed.mismatches if failed else [],
                           attempts=recent_attempts(self._attempts), suggestion=go.suggestion, step=go.step, llm=provider)
        outcomes = await asyncio.gather(*(
            self._agent(KernelActivities.code, base.model_copy(update={"candidate_index": i}),
                        f"{go.agent} step {go.step}" + (f", candidate {i + 1}/{n}" if n > 1 else ""))
            for i in range(n)))
        results: list[CodeResult] = [r for r, _ in outcomes]
        usage = sum((r.call.usage for r in results), TokenUsage())
        self._calls += [r.call for r in results]
        good = _unique([r.candidate for r in results if r.parsed_ok and r.candidate is not None])
        if good:
            self._candidates = good
        errors = "; ".join(r.reason for r in results if not r.parsed_ok)
        summary = (f"{len(good)} candidate(s) written" if n > 1 else "candidate written") if good else f"unusable answer: {errors}"
        first = results[0].call
        return (AgentRecord(agent=go.agent, step=go.step, parsed_ok=bool(good), suggestion=go.suggestion),
                TraceEntry(step=go.step, agent=go.agent, summary=outcomes[0][1] + summary, ok=bool(good),
                           artifact=good[0] if good else None, candidates=good, provider=first.provider,
                           prompt=first.prompt, output=first.output, transcript=first.transcript, parse_error=errors,
                           tokens=usage))

    async def _verify_step(self, go: Go) -> tuple[AgentRecord, TraceEntry]:
        """Verify the round's candidates concurrently; the first that passes wins, the rest are cancelled."""
        if not self._candidates:
            return (AgentRecord(agent=go.agent, step=go.step, verifier_passed=False, suggestion=go.suggestion),
                    TraceEntry(step=go.step, agent=go.agent, summary="no candidate to verify", ok=False))
        cands = list(self._candidates)
        pending = [asyncio.ensure_future(self._verify(c, go.step, i, len(cands))) for i, c in enumerate(cands)]
        done: dict[int, VerifyResult] = {}
        winner: int | None = None
        while pending and winner is None:
            finished, pending = await workflow.wait(pending, return_when=asyncio.FIRST_COMPLETED)
            for task in finished:
                i, res = task.result()
                done[i] = res
                if res.report.passed and (winner is None or i < winner):
                    winner = i
        for task in pending:  # a verified candidate won: the others' verification is not needed
            task.cancel()
        await asyncio.gather(*pending, return_exceptions=True)
        for i in sorted(done):
            self._attempts.append(Attempt(step=go.step, candidate=cands[i], verdict=done[i].report.reason))
        shown = winner if winner is not None else min(done)
        res = done[shown]
        self._report, self._speed = res.report, res.speed or self._speed
        if winner is not None and (self._best is None or faster(res.speedup, self._speedup)):
            self._best, self._speedup = cands[winner], res.speedup  # an optimizer's slower candidate never wins
        passed = winner is not None
        summary = ("PASSED" + (f" ({res.speed})" if res.speed else "")) if passed else f"FAILED: {res.report.reason}"
        if len(cands) > 1:
            summary += f" [{sum(r.report.passed for r in done.values())}/{len(cands)} candidates passed]"
        return (AgentRecord(agent=go.agent, step=go.step, verifier_passed=passed, suggestion=go.suggestion,
                            speedup=res.speedup if passed else None),
                TraceEntry(step=go.step, agent=go.agent, summary=summary[:500], ok=passed, artifact=cands[shown],
                           candidates=cands, report=res.report, speed=res.speed))

    async def _verify(self, candidate: ArtifactRef, step: int, index: int, n: int) -> tuple[int, VerifyResult]:
        res = await workflow.execute_activity_method(
            KernelActivities.verify,
            VerifyRequest(task=self._req.task, candidate=candidate, timeout_s=self._req.verify_timeout_s),
            task_queue=self._req.queues.kernels,
            summary=f"verifier step {step}" + (f", candidate {index + 1}/{n}" if n > 1 else ""),
            start_to_close_timeout=KERNEL.start_to_close, heartbeat_timeout=KERNEL.heartbeat, retry_policy=KERNEL.retry,
        )
        return index, res

    async def _agent(self, method: Callable[[Any, AgentRequest], Awaitable[R]], req: AgentRequest, summary: str) -> tuple[R, str]:
        """An agent call with the request's provider; when the LLM fails (unreachable, auth, retries
        spent) the offline templates answer instead. Returns the result and a note for the trace."""
        try:
            return await self._llm_call(method, req, summary), ""
        except ActivityError as e:
            if req.llm == "offline":
                raise
            why = failure_from(e, where=summary).message
            offline = req.model_copy(update={"llm": "offline"})
            return await self._llm_call(method, offline, f"{summary} (offline fallback)"), f"LLM failed ({why[:200]}); offline: "

    async def _llm_call(self, method: Callable[[Any, Any], Awaitable[R]], req: Any, summary: str) -> R:
        return await workflow.execute_activity_method(
            method, req, task_queue=self._req.queues.llm, summary=summary,
            start_to_close_timeout=LLM.start_to_close, heartbeat_timeout=LLM.heartbeat, retry_policy=LLM.retry,
        )

    async def _record_trace(self) -> ArtifactRef:
        return await workflow.execute_activity_method(
            KernelActivities.record_trace, RecordTraceRequest(entries=self._trace),
            task_queue=self._req.queues.kernels, summary="record trace",
            start_to_close_timeout=KERNEL.start_to_close, heartbeat_timeout=KERNEL.heartbeat, retry_policy=KERNEL.retry,
        )

    async def _finish(self, decision: Finish) -> KernelResult:
        outcome = {FinishReason.VERIFIED: KernelOutcome.VERIFIED,
                   FinishReason.MAX_STEPS: KernelOutcome.MAX_STEPS}.get(decision.reason, KernelOutcome.FAILED)
        if decision.reason is not FinishReason.VERIFIED and self._best is not None:
            outcome = KernelOutcome.VERIFIED  # an earlier candidate passed (e.g. the optimizer's did not)
        status = JobStatus.COMPLETED if outcome is KernelOutcome.VERIFIED else JobStatus.FAILED
        trace_ref = await self._record_trace()
        self._show(f"finished: {outcome.value} ({decision.reason.value})")
        result = KernelResult(
            outcome=outcome, status=status, finish_reason=decision.reason,
            best_candidate=self._best or (self._candidates[0] if self._candidates else None),
            report=self._report, steps=self._state.step, trace=list(self._trace), trace_artifact=trace_ref,
            tokens=token_totals(self._calls), speed=self._speed, speedup=self._speedup,
        )
        if status is JobStatus.COMPLETED:
            ui.set_status(status)
            return result
        failure = unverified(decision.reason, self._report.reason if self._report else "", self._where)
        return end_failed(result.model_copy(update={"failure": failure}), failure)

    async def _fail(self, error: ActivityError) -> KernelResult:
        failure = failure_from(error, where=self._where)
        self._show("failed", error=f"{failure.code}: {failure.message}")
        return end_failed(KernelResult(outcome=KernelOutcome.FAILED, status=JobStatus.FAILED, best_candidate=self._best,
                                       report=self._report, steps=self._state.step, trace=list(self._trace),
                                       failure=failure, tokens=token_totals(self._calls)), failure)

    def _show(self, step: str, error: str = "") -> None:
        last = self._trace[-1] if self._trace else None
        ui.details(f"kernel {self._req.task.op_name}", {
            "step": step, "steps run": self._state.step,
            "last": f"{last.agent}: {last.summary}" if last else "",
            "last error": error or (self._report.reason if self._report and not self._report.passed else ""),
            "tokens": token_totals(self._calls).total_tokens,
        })


def unverified(reason: FinishReason, last_verdict: str, where: str) -> Failure:
    """Why a kernel job ended without a verified candidate: the finish reason is the code."""
    message = {
        FinishReason.MAX_STEPS: "no candidate verified within max_step",
        FinishReason.PARSE_FAILED: "the agent's answers stayed unusable",
        FinishReason.NO_OPTIONS: "the workflow.yaml left no agent to run",
    }.get(reason, "the conductor finished without a verified candidate")
    code = reason.value if reason in (FinishReason.MAX_STEPS, FinishReason.PARSE_FAILED, FinishReason.NO_OPTIONS) \
        else "NOT_VERIFIED"
    return Failure(code=code, message=message + (f"; last verdict: {last_verdict}" if last_verdict else ""), where=where)


def _unique(refs: list[ArtifactRef]) -> list[ArtifactRef]:
    """Candidates by content (the offline provider writes the same source for every attempt)."""
    seen: set[str] = set()
    return [r for r in refs if not (r.sha256 in seen or seen.add(r.sha256))]
