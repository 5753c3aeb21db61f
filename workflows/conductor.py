"""ConductorWorkflow: the workflow.yaml-driven kernel loop (designer → coder → verifier → ...).

Routing is `conductor_policy` (pure); each agent is one activity; sources live in the artifact
store and the history carries ArtifactRefs. With no LLM (CPU CI, offline) an AskLLM decision is
resolved by `apply_llm_decision`'s deterministic fallback.
"""

from __future__ import annotations

from temporalio import workflow
from temporalio.exceptions import ActivityError

with workflow.unsafe.imports_passed_through():
    from activities.kernels.activities import KernelActivities
    from activities.kernels.config_loader import config_for_task
    from contracts.common import ArtifactRef, JobStatus
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
        CodeRequest,
        DesignRequest,
        KernelDesign,
        KernelOutcome,
        KernelRequest,
        KernelResult,
        RecordTraceRequest,
        TraceEntry,
        VerifierReport,
        VerifyRequest,
    )
    from workflows import _visibility as ui
    from workflows._call_options import KERNEL
    from workflows.conductor_policy import apply_llm_decision, get_next_agent
    from workflows.failures import failure_from


@workflow.defn
class ConductorWorkflow:
    def __init__(self) -> None:
        self._state = ConductorState()
        self._trace: list[TraceEntry] = []
        self._design: KernelDesign | None = None
        self._candidate: ArtifactRef | None = None
        self._best: ArtifactRef | None = None
        self._report: VerifierReport | None = None
        self._where = "starting"

    @workflow.run
    async def run(self, req: KernelRequest) -> KernelResult:
        self._req = req
        config = self._config(req)
        self._show("starting")
        try:
            while True:
                decision = get_next_agent(self._state, config)
                if isinstance(decision, AskLLM):
                    decision = self._analyse(decision)
                if isinstance(decision, Finish):
                    return await self._finish(decision)
                await self._run_agent(decision)
        except ActivityError as e:
            return await self._fail(e)

    @workflow.query
    def trace(self) -> list[TraceEntry]:
        return list(self._trace)

    # -- steps -------------------------------------------------------------------------------

    @staticmethod
    def _config(req: KernelRequest) -> ConductorConfig:
        """The request's validated config with the task's max_step override (pure: no file read)."""
        return config_for_task(req.task.model_copy(update={"conductor": req.config}))

    def _analyse(self, ask: AskLLM) -> Go | Finish:
        """Offline conductor: no LLM answer, so the policy's deterministic fallback decides."""
        return apply_llm_decision(None, ask.options, self._state)

    async def _run_agent(self, go: Go) -> None:
        self._where = f"{go.agent} step {go.step}"
        self._show(self._where)
        if go.agent == AgentName.DESIGNER:
            record, entry = await self._design_step(go)
        elif go.agent in (AgentName.CODER, AgentName.OPTIMIZER):
            record, entry = await self._code_step(go)
        elif go.agent == AgentName.VERIFIER:
            record, entry = await self._verify_step(go)
        else:
            record = AgentRecord(agent=go.agent, step=go.step, parsed_ok=False, suggestion=go.suggestion)
            entry = TraceEntry(step=go.step, agent=go.agent, summary="no activity for this agent", ok=False)
        self._state = self._state.record(record)
        self._trace.append(entry.model_copy(update={"fallback": go.fallback}))

    async def _design_step(self, go: Go) -> tuple[AgentRecord, TraceEntry]:
        res = await workflow.execute_activity_method(
            KernelActivities.design, DesignRequest(task=self._req.task, suggestion=go.suggestion, step=go.step),
            task_queue=self._req.queues.kernels, summary=f"designer step {go.step}",
            start_to_close_timeout=KERNEL.start_to_close, heartbeat_timeout=KERNEL.heartbeat, retry_policy=KERNEL.retry,
        )
        if res.parsed_ok:
            self._design = res.design
        summary = f"design: {res.design.family}" if res.design else res.reason
        return (AgentRecord(agent=go.agent, step=go.step, parsed_ok=res.parsed_ok, suggestion=go.suggestion),
                TraceEntry(step=go.step, agent=go.agent, summary=summary, ok=res.parsed_ok, artifact=res.artifact))

    async def _code_step(self, go: Go) -> tuple[AgentRecord, TraceEntry]:
        feedback = self._report.reason if self._report is not None and not self._report.passed else ""
        res = await workflow.execute_activity_method(
            KernelActivities.code,
            CodeRequest(task=self._req.task, role=go.agent, design=self._design, feedback=feedback,
                        suggestion=go.suggestion, step=go.step),
            task_queue=self._req.queues.kernels, summary=f"{go.agent} step {go.step}",
            start_to_close_timeout=KERNEL.start_to_close, heartbeat_timeout=KERNEL.heartbeat, retry_policy=KERNEL.retry,
        )
        if res.parsed_ok:
            self._candidate = res.candidate
        summary = "candidate written" if res.parsed_ok else f"unusable answer: {res.reason}"
        return (AgentRecord(agent=go.agent, step=go.step, parsed_ok=res.parsed_ok, suggestion=go.suggestion),
                TraceEntry(step=go.step, agent=go.agent, summary=summary, ok=res.parsed_ok, artifact=res.candidate))

    async def _verify_step(self, go: Go) -> tuple[AgentRecord, TraceEntry]:
        if self._candidate is None:
            return (AgentRecord(agent=go.agent, step=go.step, verifier_passed=False, suggestion=go.suggestion),
                    TraceEntry(step=go.step, agent=go.agent, summary="no candidate to verify", ok=False))
        res = await workflow.execute_activity_method(
            KernelActivities.verify,
            VerifyRequest(task=self._req.task, candidate=self._candidate, timeout_s=self._req.verify_timeout_s),
            task_queue=self._req.queues.kernels, summary=f"verifier step {go.step}",
            start_to_close_timeout=KERNEL.start_to_close, heartbeat_timeout=KERNEL.heartbeat, retry_policy=KERNEL.retry,
        )
        self._report = res.report
        if res.report.passed:
            self._best = self._candidate
        summary = "PASSED" + (f" ({res.speed})" if res.speed else "") if res.report.passed else f"FAILED: {res.report.reason}"
        return (AgentRecord(agent=go.agent, step=go.step, verifier_passed=res.report.passed, suggestion=go.suggestion),
                TraceEntry(step=go.step, agent=go.agent, summary=summary[:500], ok=res.report.passed,
                           artifact=self._candidate))

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
        ui.set_status(status)
        self._show(f"finished: {outcome.value} ({decision.reason.value})")
        return KernelResult(
            outcome=outcome, status=status, finish_reason=decision.reason, best_candidate=self._best or self._candidate,
            report=self._report, steps=self._state.step, trace=list(self._trace), trace_artifact=trace_ref,
        )

    async def _fail(self, error: ActivityError) -> KernelResult:
        failure = failure_from(error, where=self._where)
        ui.set_status(JobStatus.FAILED)
        self._show("failed", error=f"{failure.code}: {failure.message}")
        return KernelResult(outcome=KernelOutcome.FAILED, status=JobStatus.FAILED, best_candidate=self._best,
                            report=self._report, steps=self._state.step, trace=list(self._trace), failure=failure)

    def _show(self, step: str, error: str = "") -> None:
        last = self._trace[-1] if self._trace else None
        ui.details(f"kernel {self._req.task.op_name}", {
            "step": step, "steps run": self._state.step,
            "last": f"{last.agent}: {last.summary}" if last else "",
            "last error": error or (self._report.reason if self._report and not self._report.passed else ""),
        })
