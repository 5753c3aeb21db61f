"""ConductorWorkflow: the workflow.yaml-driven kernel loop (designer → coder → verifier → ...).

The job first reads the reference (a traced `Model.forward`: aten ops, shapes, size; a task the
verifier cannot hold ends here). Routing is `conductor_policy` (pure). Every agent — designer,
coder, optimizer and the routing analysis — climbs the one fallback ladder (workflows/agent_ladder.py):
the LLM's answer, validated by its activity (parser, static checks, not an already-rejected
candidate), bounded repair rounds with the concrete refusal, then the offline agent, recorded as a
fallback. Agent activities answer with ArtifactRefs (prompts, raw answers and sources live in the
artifact store), so the history grows by a few KiB per step.

A candidate identical to one the verifier rejected is never verified again: the coder is told so,
and an offline coder that can only repeat itself ends the run NO_PROGRESS; after
`llm_rejections_before_fallback` LLM candidates rejected by the verifier, the offline template's
candidate is tried once.
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
    from activities.llm.structured import Rejected
    from contracts.agents import AgentProvenance, AnswerSource
    from contracts.common import ArtifactRef, Failure, JobStatus
    from contracts.errors import Err
    from contracts.kernel import (
        AgentName,
        AgentRecord,
        AskLLM,
        ConductorConfig,
        ConductorState,
        Finish,
        FinishReason,
        Go,
        KernelTask,
        LLMDecision,
    )
    from contracts.kernel_job import (
        AS_TORCH,
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
        KernelTiming,
        ModeledSpeed,
        Provider,
        RecordTraceRequest,
        ReferenceAnalysis,
        RejectedCandidate,
        Rejection,
        TraceEntry,
        TraceReferenceRequest,
        VerifierReport,
        VerifyRequest,
        VerifyResult,
    )
    from contracts.messages import TokenUsage
    from workflows import _visibility as ui
    from workflows import presentation as ui_rows
    from workflows._call_options import KERNEL, LLM, verify_start_to_close
    from workflows._events import JobEvents
    from contracts.events import EventKind, JobEvent
    from workflows._llm import token_totals
    from workflows.agent_ladder import Accepted, climb
    from workflows.conductor_policy import (
        ANALYSIS_HISTORY,
        OPTIMIZER_TIME_MULTIPLE,
        ROUTING_LLM_ANSWERS,
        decided,
        fallback_agent,
        better,
        get_next_agent,
        no_answer_finish,
        offline_fallback_due,
        offline_first,
        optimizer_time_limit,
        recent_attempts,
    )
    from workflows.failures import failure_from
    from workflows.job_end import end_failed, is_cancellation, mark_cancelled

R = TypeVar("R", DesignResult, CodeResult)

REFERENCE_IN_STORE = "kernel-reference-and-source-in-store"
"""Deprecated patch: trace_reference returns the analysis without its trace, with the designer's family and the
size check made in the activity (a whole model's trace is hundreds of KiB, and the designer's walk over it outlasts a
workflow task), and the task's source as a store ref that every later request carries instead of the text. The old
path (reading the trace here) is gone: a kernel job started before 2db29ff must end before its worker is upgraded."""

TRACE_IN_STORE = "kernel-trace-in-store"
"""Deprecated patch: the result carries the trace's store ref only (the history held the trace twice:
record_trace's input and the result), so a job that fails after some steps records its trace too. The old path (a
failed job without that activity) is gone: a kernel job started before d8ec1c0 must end before its worker is
upgraded."""

OPTIMIZER_OFFLINE_FIRST = "kernel-optimizer-offline-first"
"""With an LLM configured, an optimizer round asks the offline optimizer first while it has a rewrite left
(`conductor_policy.offline_first`). Histories recorded before asked the LLM first, as they did."""

OFFLINE_ASKED_ONCE = "kernel-offline-answer-asked-once"
"""A round whose offline answer (forced or going first) was refused climbs the LLM ladder with that refusal as
its last rung instead of asking the offline agent again: the same request gets the same deterministic answer.
Histories recorded before ran the offline activity twice in such a round, as they did."""


@workflow.defn
class ConductorWorkflow:
    def __init__(self) -> None:
        self._events = JobEvents()
        """Live events for followers (steps, each agent's outcome); never read back."""
        self._state = ConductorState()
        self._trace: list[TraceEntry] = []
        self._design: KernelDesign | None = None
        self._candidates: list[ArtifactRef] = []
        """The last coder round's candidates (one unless num_candidates > 1)."""
        self._attempts: list[Attempt] = []
        self._best: ArtifactRef | None = None
        self._report: VerifierReport | None = None
        self._best_report: VerifierReport | None = None
        self._speed = ""
        self._timing: KernelTiming | None = None
        self._modeled: ModeledSpeed | None = None
        self._best_record: AgentRecord | None = None
        """The verification of the best candidate (what `better` compares a new one with)."""
        self._tried: list[str] = []
        """The offline optimizer's rewrites tried so far, in order, each with its verdict once verified
        (`rows+epilogue=kept`, `=reverted`, `=wrong`, `=over time`)."""
        self._calls: list[AgentCall] = []
        """Every agent answer and routing analysis, for the result's token/latency totals."""
        self._routing: tuple[str, TokenUsage, AgentProvenance | None] = ("config", TokenUsage(), None)
        """How the next agent was chosen, what the analysis that chose it cost, and who answered it."""
        self._where = "starting"
        self._reference: ReferenceAnalysis | None = None
        self._stored_task: KernelTask | None = None
        """The task with its source in the store, for activity requests (REFERENCE_IN_STORE)."""
        self._family = ""
        self._rejected: list[RejectedCandidate] = []
        self._authors: dict[str, AnswerSource] = {}
        """Who wrote each candidate (by sha256): the LLM, or the offline agent."""
        self._llm_rejected = 0
        self._offline_tried = False
        self._rewrites_left = True
        """False once the offline optimizer had no rewrite left to propose: optimizer rounds then ask the LLM first."""
        self._fallbacks: list[str] = []
        self._duplicates = 0

    @workflow.run
    async def run(self, req: KernelRequest) -> KernelResult:
        self._req = req
        config = self._config(req)
        self._show("reading the reference")
        try:
            refused = await self._read_reference()
            if refused is not None:
                return self._refuse(refused)
            while True:
                decision = get_next_agent(self._state, config)
                self._routing = ("config", TokenUsage(), None)
                if isinstance(decision, AskLLM):
                    decision = await self._route(decision)
                if isinstance(decision, Finish):
                    return await self._finish(decision)
                ended = await self._run_agent(decision, config)
                if ended is not None:
                    return await self._finish(ended)
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

    async def _read_reference(self) -> Failure | None:
        """Trace the reference on the kernels queue; refuse (a Failure) a task the verifier cannot hold."""
        self._where = "reading the reference"
        self._reference = await workflow.execute_activity_method(
            KernelActivities.trace_reference, TraceReferenceRequest(task=self._req.task, timeout_s=self._req.verify_timeout_s),
            task_queue=self._req.queues.kernels, summary="trace the reference",
            start_to_close_timeout=KERNEL.start_to_close, heartbeat_timeout=KERNEL.heartbeat, retry_policy=KERNEL.retry,
        )
        workflow.deprecate_patch(REFERENCE_IN_STORE)
        ref = self._reference
        self._family, problem = ref.family, ref.size_problem
        self._stored_task = self._req.task.stored(ref.source) if ref.source is not None else None
        problem = problem if self._req.task.on_cpu else ""
        if problem:
            return Failure(code=Err.KERNEL_TASK_INVALID, message=problem, where="reading the reference")
        return None

    @property
    def _task(self) -> KernelTask:
        """The task as activity requests carry it: its source as a store ref once the reference was read."""
        return self._stored_task or self._req.task

    def _trace_ref(self) -> ArtifactRef | None:
        """Where the traced reference is stored: agent requests carry this, not the trace itself."""
        return self._reference.artifact if self._reference is not None else None

    async def _route(self, ask: AskLLM) -> Go | Finish:
        """Ask the conductor LLM which option runs next (validated: one of the options, any case); an
        unusable answer is repaired once, then the deterministic rule decides (the trace says so)."""
        results: list[AnalyzeResult] = []
        last = self._trace[-1] if self._trace else None

        async def llm(repair: list[str]) -> Accepted[LLMDecision] | Rejected:
            areq = AnalyzeRequest(
                task=self._task, agent=ask.agent, options=ask.options, step=ask.step,
                last_result=last.summary if last else "",
                recent=[f"step {e.step} {e.agent}: {e.summary}" for e in self._trace[-ANALYSIS_HISTORY:]],
                candidate=self._candidates[0] if self._candidates else None, report=self._report, repair=repair)
            res = await self._llm_call(KernelActivities.analyze, areq, f"conductor: route after {ask.agent}")
            results.append(res)
            return Accepted(res.decision) if res.decision is not None else Rejected(res.reason)

        async def rule(_why: str) -> Accepted[LLMDecision]:
            return Accepted(LLMDecision(next_agent=fallback_agent(ask.options, self._state)))

        climbed = await climb("conductor", llm=llm if self._req.llm != "offline" else None, offline=rule,
                              max_llm_answers=ROUTING_LLM_ANSWERS)
        self._calls += [r.call for r in results]
        usage = sum((r.call.usage for r in results), TokenUsage())
        prov = climbed.provenance
        assert climbed.value is not None
        by_llm = prov.source is AnswerSource.LLM
        why = prov.fallback_reason or "offline conductor (no LLM)"
        self._routing = (f"llm: {climbed.value.next_agent}" if by_llm else f"fallback: {why}"[:300], usage, prov)
        return decided(climbed.value, self._state, fallback=not by_llm)

    async def _run_agent(self, go: Go, config: ConductorConfig) -> Finish | None:
        self._where = f"{go.agent} step {go.step}"
        self._show(self._where)
        started = workflow.now()
        if go.agent == AgentName.DESIGNER:
            record, entry, ended = await self._design_step(go, config)
        elif go.agent in (AgentName.CODER, AgentName.OPTIMIZER):
            record, entry, ended = await self._code_step(go, config)
        else:
            record, entry = await self._verify_step(go)
            ended = None
        routing, analysis_tokens, routing_prov = self._routing
        self._state = self._state.record(record)
        self._trace.append(entry.model_copy(update={
            "sizes": self._req.task.overrides,
            "fallback": go.fallback, "routing": routing, "routing_provenance": routing_prov, "started_at": started,
            "duration_s": round((workflow.now() - started).total_seconds(), 3), "tokens": entry.tokens + analysis_tokens,
        }))
        self._events.publish(JobEvent(kind=EventKind.AGENT, agent=str(go.agent),
                                      text=f"step {go.step} {'ok' if entry.ok else 'failed'}: {entry.summary}"[:300]))
        return ended

    async def _design_step(self, go: Go, config: ConductorConfig) -> tuple[AgentRecord, TraceEntry, Finish | None]:
        dreq = DesignRequest(task=self._task, suggestion=go.suggestion, step=go.step,
                             output=config.output_format(AgentName.DESIGNER))

        def ask(provider: Provider, repair: list[str]) -> Awaitable[DesignResult]:
            offline = provider == "offline"  # only the offline designer reads the trace (keeps LLM requests small)
            update = {"llm": provider, "repair": repair, "reference": self._trace_ref() if offline else None}
            return self._llm_call(KernelActivities.design, dreq.model_copy(update=update),
                                  f"designer step {go.step}" + (" (offline)" if offline else ""))

        value, prov, results = await self._ladder(AgentName.DESIGNER, ask)
        shown = value or results[-1]
        if value is not None:
            self._design = value.design
        summary = f"design: {value.design.family}" if value and value.design else f"no design: {shown.reason}"
        ended = None if value is not None else self._no_answer(go, results, prov)
        entry = _entry(go, shown.call, summary, value is not None, shown.artifact, prov,
                       "; ".join(dict.fromkeys(r.reason for r in results if not r.parsed_ok)))
        usage = sum((r.call.usage for r in results), TokenUsage())
        return (AgentRecord(agent=go.agent, step=go.step, parsed_ok=value is not None, suggestion=go.suggestion),
                entry.model_copy(update={"tokens": usage}), ended)

    async def _code_step(self, go: Go, config: ConductorConfig) -> tuple[AgentRecord, TraceEntry, Finish | None]:
        """One round: `num_candidates` concurrent coder attempts (the optimizer writes one)."""
        n = self._req.task.num_candidates if go.agent == AgentName.CODER else 1
        failed = self._report if self._report is not None and not self._report.passed else None
        base = CodeRequest(task=self._task, role=go.agent, design=self._design,
                           feedback=failed.reason if failed else "", log=failed.log if failed else "",
                           input_family=failed.input_family if failed else "",
                           mismatches=failed.mismatches if failed else [], attempts=recent_attempts(self._attempts),
                           suggestion=go.suggestion, step=go.step, output=config.output_format(go.agent),
                           rejected=list(self._rejected), tried=list(self._tried),
                           modeled=self._modeled if go.agent == AgentName.OPTIMIZER else None)
        llm_configured = self._req.llm != "offline"
        force = offline_fallback_due(role=go.agent, llm_configured=llm_configured, llm_rejected=self._llm_rejected,
                                     threshold=self._req.llm_rejections_before_fallback, tried=self._offline_tried)
        if force:
            self._offline_tried = True
        first = offline_first(role=go.agent, llm_configured=llm_configured, rewrites_left=self._rewrites_left)
        if first and not workflow.patched(OPTIMIZER_OFFLINE_FIRST):
            first = ""

        def attempt(i: int) -> Callable[[Provider, list[str]], Awaitable[CodeResult]]:
            def ask(provider: Provider, repair: list[str]) -> Awaitable[CodeResult]:
                label = f"{go.agent} step {go.step}" + (f", candidate {i + 1}/{n}" if n > 1 else "")
                offline = provider == "offline"
                # the offline coder renders the offline designer's plan; it reads the trace without one, or to
                # lower it again (a `lowered` plan carries only its label: history stays small)
                plan = self._design.plan if self._design is not None else None
                needs_trace = offline and (go.agent == AgentName.OPTIMIZER or plan is None or plan.template == "lowered")
                return self._llm_call(KernelActivities.code, base.model_copy(update={
                    "candidate_index": i, "llm": provider, "repair": repair,
                    "reference": self._trace_ref() if needs_trace else None}), label + (" (offline)" if offline else ""))
            return ask

        async def one(i: int) -> tuple[CodeResult | None, AgentProvenance, list[CodeResult]]:
            if force or first:
                value, prov, results = await self._ladder(go.agent, attempt(i), force_offline=force or first,
                                                          by_policy=bool(first))
                if value is not None:
                    return value, prov, results
                if first:
                    self._rewrites_left = False
                refused = results[-1] if workflow.patched(OFFLINE_ASKED_ONCE) else None
                more = await self._ladder(go.agent, attempt(i), offline_refused=refused)
                return more[0], more[1], results + more[2]
            return await self._ladder(go.agent, attempt(i))

        outcomes = await asyncio.gather(*(one(i) for i in range(n)))
        good: list[ArtifactRef] = []
        for value, prov, _ in outcomes:
            if value is not None and value.candidate is not None and value.candidate.sha256 not in {g.sha256 for g in good}:
                good.append(value.candidate)
                self._authors.setdefault(value.candidate.sha256, prov.source)
        if good:
            self._candidates = good
        results = [r for _, _, rs in outcomes for r in rs]
        value, prov, _ = next((o for o in outcomes if o[0] is not None), outcomes[0])
        shown = value or results[-1]
        usage = sum((r.call.usage for r in results), TokenUsage())
        errors = "; ".join(dict.fromkeys(r.reason for r in results if not r.parsed_ok))
        if good:
            summary = (f"{len(good)} candidate(s) written" if n > 1 else "candidate written") + _by(prov)
        else:
            summary = f"no candidate: {shown.reason}"
        if value is not None and value.rewrite:
            self._tried.append(value.rewrite)
            summary = f"rewrite {value.rewrite}: {summary}"
        ended = None if good else self._no_answer(go, [r for _, _, rs in outcomes for r in rs], outcomes[0][1])
        if ended is not None and go.agent == AgentName.OPTIMIZER and self._best is not None:
            ended = Finish(reason=FinishReason.VERIFIED, step=go.step,  # nothing left to try: the best stands
                           detail=f"optimizer stopped: {shown.reason}"[:300])
        entry = _entry(go, shown.call, summary, bool(good), good[0] if good else None, prov, errors)
        return (AgentRecord(agent=go.agent, step=go.step, parsed_ok=bool(good), suggestion=go.suggestion),
                entry.model_copy(update={"candidates": good if len(good) > 1 else [], "tokens": usage}), ended)

    async def _ladder(self, agent: str, ask: Callable[[Provider, list[str]], Awaitable[R]], *,
                      force_offline: str = "", by_policy: bool = False,
                      offline_refused: R | None = None) -> tuple[R | None, AgentProvenance, list[R]]:
        """Climb the agent ladder with one activity (`ask(provider, repair)`): the LLM and its repairs, then
        the offline agent (the offline optimizer's registered rewrites, for the optimizer). `force_offline` skips
        the LLM and says why: a fallback after refused LLM candidates, or, `by_policy`, the offline answer going
        first (an OFFLINE answer that says why, not a fallback). `offline_refused`: the offline agent's answer
        to this round's request, already refused; it stands as the last rung (listed again, not counted again)."""
        results: list[R] = []

        async def llm(repair: list[str]) -> Accepted[R] | Rejected:
            res = await ask("openai", repair)
            results.append(res)
            return Accepted(res) if res.parsed_ok else Rejected(res.reason)

        async def offline(_why: str) -> Accepted[R] | Rejected:
            res = offline_refused if offline_refused is not None else await ask("offline", [])
            results.append(res)
            return Accepted(res) if res.parsed_ok else Rejected(res.reason)

        use_llm = self._req.llm != "offline" and not force_offline
        climbed = await climb(agent, llm=llm if use_llm else None, offline=offline,
                              max_llm_answers=self._req.max_llm_answers)
        prov = climbed.provenance
        if force_offline and climbed.value is not None:
            source = AnswerSource.OFFLINE if by_policy else AnswerSource.FALLBACK
            prov = prov.model_copy(update={"source": source, "fallback_reason": force_offline})
        asked = [r for r in results if r is not offline_refused]
        self._calls += [r.call for r in asked]
        self._duplicates += sum(r.rejection is Rejection.DUPLICATE for r in asked)
        if prov.source is AnswerSource.FALLBACK:
            self._fallbacks.append(f"step {self._state.step + 1} {agent}: {prov.fallback_reason}"[:400])
        return climbed.value, prov, results

    def _no_answer(self, go: Go, results: list[DesignResult] | list[CodeResult], prov: AgentProvenance) -> Finish:
        kinds = [r.rejection for r in results]
        kind = kinds[-1] if kinds else None
        if kind is Rejection.NO_TEMPLATE and Rejection.DUPLICATE in kinds:
            kind = Rejection.DUPLICATE
        why = results[-1].reason if results else prov.fallback_reason
        if self._req.llm != "offline" and prov.fallback_reason and kind is not Rejection.DUPLICATE:
            why = prov.fallback_reason
        return no_answer_finish(step=go.step, llm_configured=self._req.llm != "offline", rejection=kind, why=why)

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
            if not done[i].report.passed:
                self._rejected.append(RejectedCandidate(sha256=cands[i].sha256, step=go.step,
                                                        verdict=done[i].report.reason[:300]))
                if self._authors.get(cands[i].sha256) is AnswerSource.LLM:
                    self._llm_rejected += 1
        shown = winner if winner is not None else min(done)
        res = done[shown]
        self._report = res.report
        passed = winner is not None
        record = AgentRecord(agent=go.agent, step=go.step, verifier_passed=passed, suggestion=go.suggestion,
                             speedup=res.speedup if passed else None,
                             modeled_ms=res.modeled.modeled_ms if passed and res.modeled else None,
                             sol_fraction=res.modeled.sol_fraction if passed and res.modeled else None)
        kept = passed and better(record, self._best_record)
        if kept:  # a slower (or unmeasured) candidate never replaces the best: the optimizer's rewrite is reverted
            self._best, self._timing, self._best_record = cands[shown], res.timing, record
            self._best_report, self._modeled, self._speed = res.report, res.modeled, res.speed
        elif self._best is None:
            self._speed = res.speed or self._speed
        compiled = res.report.gpu_compile.summary if res.report.gpu_compile else ""
        special = "" if res.report.special_values.startswith(AS_TORCH) else res.report.special_values
        notes = [n for n in (shapes_checked(res.report), compiled, res.report.accuracy_note, special, res.speed) if n]
        summary = ("PASSED" + (f" ({'; '.join(notes)})" if notes else "")) if passed else f"FAILED: {res.report.reason}"
        if len(cands) > 1:
            summary += f" [{sum(r.report.passed for r in done.values())}/{len(cands)} candidates passed]"
        if self._state.last is not None and self._state.last.agent == AgentName.OPTIMIZER:
            over_time = not passed and res.report.timed_out
            if passed:
                summary = (f"kept as the best: {summary}" if kept else
                           f"not faster than the best, reverted (the best stays step {self._best_record.step}): {summary}")
            elif over_time and self._best_record is not None:
                summary = (f"over the optimizer's time budget ({OPTIMIZER_TIME_MULTIPLE:g}x the verified candidate's "
                           f"run), reverted (the best stays step {self._best_record.step}): {summary}")
            if self._tried and "=" not in self._tried[-1]:  # the offline optimizer's rewrite of this round
                self._tried[-1] += "=" + ("kept" if kept else "reverted" if passed else "over time" if over_time
                                          else "wrong")
        return (record,
                TraceEntry(step=go.step, agent=go.agent, summary=summary[:500], ok=passed, artifact=cands[shown],
                           candidates=cands if len(cands) > 1 else [], report=res.report, speed=res.speed,
                           modeled=res.modeled if passed else None))

    async def _verify(self, candidate: ArtifactRef, step: int, index: int, n: int) -> tuple[int, VerifyResult]:
        ref = self._reference or ReferenceAnalysis()
        limit = self._req.verifier_time_limit
        if self._best_report is not None and self._state.last is not None \
                and self._state.last.agent == AgentName.OPTIMIZER:  # a round improving a kernel the job already has
            limit = optimizer_time_limit(limit, self._best_report.durations.get("candidate"))
        res = await workflow.execute_activity_method(
            KernelActivities.verify,
            VerifyRequest(task=self._task, candidate=candidate, timeout_s=self._req.verify_timeout_s,
                          time_limit=limit, held_out=ref.held_out, held_out_note=ref.held_out_note,
                          reference_ops=ref.aten_ops, allow_mixed=self._req.config.allow_mixed_kernels,
                          reference=ref.artifact),
            task_queue=self._req.queues.kernels,
            summary=f"verifier step {step}" + (f", candidate {index + 1}/{n}" if n > 1 else ""),
            start_to_close_timeout=verify_start_to_close(limit.ceiling_s), heartbeat_timeout=KERNEL.heartbeat,
            retry_policy=KERNEL.retry,
        )
        return index, res

    async def _llm_call(self, method: Callable[[Any, Any], Awaitable[Any]], req: Any, summary: str) -> Any:
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

    def _result(self, **fields: Any) -> KernelResult:
        base = dict(best_candidate=self._best, report=self._report, steps=self._state.step,
                    tokens=token_totals(self._calls), overrides=self._req.task.overrides, op_family=self._family,
                    shapes=shapes_checked(self._best_report) if self._best_report else "",
                    aten_ops=self._reference.aten_ops if self._reference else [], fallbacks=list(self._fallbacks),
                    duplicates_refused=self._duplicates, modeled=self._modeled,
                    precision_used=self._req.task.precision.value)
        return KernelResult(**{**base, **fields})

    async def _finish(self, decision: Finish) -> KernelResult:
        outcome = {FinishReason.VERIFIED: KernelOutcome.VERIFIED,
                   FinishReason.MAX_STEPS: KernelOutcome.MAX_STEPS}.get(decision.reason, KernelOutcome.FAILED)
        if decision.reason is not FinishReason.VERIFIED and self._best is not None:
            outcome = KernelOutcome.VERIFIED  # an earlier candidate passed (e.g. the optimizer's did not)
        status = JobStatus.COMPLETED if outcome is KernelOutcome.VERIFIED else JobStatus.FAILED
        trace_ref = await self._record_trace()
        self._show(f"finished: {outcome.value} ({decision.reason.value})")
        report = self._best_report if status is JobStatus.COMPLETED and self._best_report else self._report
        result = self._result(outcome=outcome, status=status, finish_reason=decision.reason, report=report,
                              best_candidate=self._best or (self._candidates[0] if self._candidates else None),
                              trace_artifact=trace_ref, speed=self._speed,
                              speedup=self._timing.speedup if self._timing else None, timing=self._timing)
        if status is JobStatus.COMPLETED:
            ui.set_status(status)
            return result
        failure = unverified(decision, self._report.reason if self._report else "", self._where)
        return end_failed(result.model_copy(update={"failure": failure}), failure)

    def _refuse(self, failure: Failure) -> KernelResult:
        self._show("refused", error=f"{failure.code}: {failure.message}")
        return end_failed(self._result(outcome=KernelOutcome.FAILED, status=JobStatus.FAILED, failure=failure), failure)

    async def _fail(self, error: ActivityError) -> KernelResult:
        failure = failure_from(error, where=self._where)
        self._show("failed", error=f"{failure.code}: {failure.message}")
        trace_ref = await self._record_failed_trace()
        return end_failed(self._result(outcome=KernelOutcome.FAILED, status=JobStatus.FAILED, failure=failure,
                                       trace_artifact=trace_ref), failure)

    async def _record_failed_trace(self) -> ArtifactRef | None:
        """The steps before an activity failed, in the store like a finished job's (TRACE_IN_STORE); None when
        none ran or the store could not take them (the failure that ended the job stays the one reported)."""
        if not self._trace:
            return None
        workflow.deprecate_patch(TRACE_IN_STORE)
        try:
            return await self._record_trace()
        except ActivityError as e:
            if is_cancellation(e):
                raise
            return None

    def _shapes(self) -> str:
        """For the Web UI: which sizes the verified candidate holds at, or (before one) will be checked at."""
        if self._best_report is not None:
            return shapes_checked(self._best_report)
        ref = self._reference
        if ref is None:
            return ""
        return ref.held_out_note or (f"the task's and held-out sizes {_sizes(ref.held_out)}" if ref.held_out else "")

    def _show(self, step: str, error: str = "") -> None:
        self._events.step(step)
        last = self._trace[-1] if self._trace else None
        ui.details(f"kernel {self._req.task.op_name}", {
            "step": step, "steps run": self._state.step,
            "reference": self._family or "-",
            "sizes": ", ".join(f"{k}={v}" for k, v in self._req.task.overrides.items()) or "as in the task file",
            "shapes": self._shapes(),
            **({"gpu compile": self._best_report.gpu_compile.summary}
               if self._best_report and self._best_report.gpu_compile else {}),
            "last": f"{last.agent}: {last.summary}" if last else "",
            "last error": error or (self._report.reason if self._report and not self._report.passed else ""),
            "tokens": token_totals(self._calls).total_tokens,
            "precision": self._req.task.precision.value,
            **({"measured": self._timing.summary} if self._timing else {}),
            **({"modeled speed (a roofline model, not a measurement)": ui_rows.modeled_rows(self._modeled)}
               if self._modeled else {}),
            **({"sandbox": self._report.confinement} if self._report and self._report.confinement else {}),
        })


def unverified(decision: Finish, last_verdict: str, where: str) -> Failure:
    """Why a kernel job ended without a verified candidate: the finish reason is the code (NOT_VERIFIED
    for the routing ends), the message what happened."""
    reason = decision.reason
    message = {
        FinishReason.MAX_STEPS: "no candidate verified within max_step",
        FinishReason.PARSE_FAILED: "no usable answer: the LLM's answers stayed unusable and no offline agent answered",
        FinishReason.NO_OPTIONS: "the workflow.yaml left no agent to run",
        FinishReason.NO_OFFLINE_TEMPLATE: "the offline agents have no template for this reference and no LLM is configured",
        FinishReason.NO_PROGRESS: "the only candidate left to try was already rejected by the verifier",
        FinishReason.REPEAT_LIMIT: "a repeat limit of the workflow.yaml stopped the loop",
    }.get(reason, "the conductor finished without a verified candidate")
    coded = (FinishReason.MAX_STEPS, FinishReason.PARSE_FAILED, FinishReason.NO_OPTIONS, FinishReason.NO_OFFLINE_TEMPLATE,
             FinishReason.NO_PROGRESS, FinishReason.REPEAT_LIMIT)
    code = reason.value if reason in coded else Err.NOT_VERIFIED
    if decision.detail:
        message += f": {decision.detail}"
    if last_verdict and reason is not FinishReason.NO_OFFLINE_TEMPLATE:
        message += f"; last verdict: {last_verdict}"
    return Failure(code=code, message=message, where=where)


def shapes_checked(report: VerifierReport) -> str:
    """Which sizes a passing report proves: "verified at its own shapes only: why", or the held-out sizes too."""
    if report.shapes_note:
        return report.shapes_note
    return f"also verified at held-out sizes {_sizes(report.held_out)}" if report.held_out else ""


def _sizes(sizes: dict) -> str:
    return ", ".join(f"{k}={v}" for k, v in sizes.items())


def _by(prov: AgentProvenance) -> str:
    if prov.source is AnswerSource.LLM:
        return f" (LLM, {prov.llm_answers} answer(s))" if prov.llm_answers > 1 else ""
    if prov.source is AnswerSource.FALLBACK:
        return " (offline fallback)"
    if prov.source is AnswerSource.OFFLINE and prov.fallback_reason:  # an LLM is configured: say who wrote it
        return " (offline, before the LLM)"
    return ""


def _entry(go: Go, call: AgentCall, summary: str, ok: bool, artifact: ArtifactRef | None, prov: AgentProvenance,
           parse_error: str) -> TraceEntry:
    return TraceEntry(step=go.step, agent=go.agent, summary=summary[:500], ok=ok, artifact=artifact,
                      provider=call.provider, prompt=call.prompt, output=call.output, transcript=call.transcript,
                      parse_error=parse_error[:1000], tokens=call.usage, provenance=prov)
