"""ConverterWorkflow: resolve → run → workspace (+ calibration data) → plan (ask if facts are missing)
→ compile → execute step by step → evaluate → accuracy gate → attach → complete.

The planner climbs the shared ladder (workflows/agent_ladder.py): the LLM's plan must parse and
compile, a refusal is repaired with the compiler's reasons, and the offline planner answers when the
LLM cannot. A plan that runs but misses the accuracy threshold (or leaves nodes on the CPU when a
context binary was asked for) goes back to the planner with the figures, while the planner has a
remedy and the budget lasts. A deterministic planner is never asked to repeat itself: a failure it
cannot change ends the job with the failing step's own code."""

from __future__ import annotations

import asyncio
import itertools
from datetime import timedelta

from temporalio import workflow
from temporalio.exceptions import ActivityError, ApplicationError

with workflow.unsafe.imports_passed_through():
    from activities.llm.structured import Parsed, Rejected, parse_structured
    from activities.toolchains import llm_planner
    from activities.toolchains.activities import ToolchainActivities
    from activities.toolchains.offline_planner import (
        evaluation_pair, next_remedy, plan_remedies, plan_warnings, questions_for, remedy_words,
    )
    from activities.toolchains.report import accuracy_rows, placement_rows, verdict_words
    from contracts.agents import AgentProvenance, AnswerSource
    from contracts.common import ArtifactRef, Failure, JobKind, JobStatus, TokenTotals
    from contracts.convert import CompiledStep, CompileResult, ConversionPlan, PlanStatus, Precision
    from contracts.events import EventKind, JobEvent
    from contracts.convert_job import (
        AccuracyVerdict, AttemptRecord, CalibrationRequest, CompileRequest, ConversionProgress, ConversionRequest,
        ConversionResult, EvaluateRequest, EvaluationReport, ExecuteStepRequest, MixedPrecisionReport, OffloadReport,
        PlanFeedback, PlannerToolRequest, PlanRequest, ProvideInput, RecordFailureRequest, RerunRequest, StepResult,
        ArtifactReport, ConversionReport, ReportRequest, ReportResult,
    )
    from contracts.messages import ChatRequest, ChatResult, Message, ToolResultBlock
    from contracts.errors import Err, clip
    from contracts.models import ModelRef
    from contracts.runs import WorkspaceRef
    from workflows import _visibility as ui
    from workflows._call_options import TOOLCHAIN
    from workflows._events import JobEvents
    from workflows._init_steps import RunContext, run_id_for
    from workflows._llm import ask, token_totals
    from workflows.agent_ladder import Accepted, climb
    from workflows.converter_policy import (
        EVAL_SEED, Complete, Evaluate, Execute, GiveUp, Replan, answer_hint, answer_problems, apply_answer,
        calibration_question, calibration_sources, check_precision, delivered_precision, failure_hint, gate, min_cosine_for,
        next_after_compile, next_after_execution, next_after_failed_remedy, rerun_gives_up, wait_summary,
    )
    from workflows.failures import failure_from
    from workflows.job_end import end_failed, is_cancellation, mark_cancelled


@workflow.defn
class ConverterWorkflow:
    def __init__(self) -> None:
        self._progress = ConversionProgress()
        self._req: ConversionRequest | None = None
        self._answer: ProvideInput | None = None
        self._waiting = False
        self._run_created = False
        self._model: ModelRef | None = None
        self._workspace: WorkspaceRef | None = None
        self._attempts: list[AttemptRecord] = []
        self._warnings: list[str] = []
        self._steps: list[StepResult] = []
        self._messages: list[Message] = []
        """The LLM planner's conversation (kept across replans: feedback is appended once)."""
        self._pending_note = ""
        """Human answers, feedback or a repair request not yet told to the LLM planner."""
        self._llm_calls: list[ChatResult] = []
        self._planner_warnings: list[str] = []
        self._provenance: list[AgentProvenance] = []
        self._evaluation: EvaluationReport | None = None
        self._accuracy: AccuracyVerdict | None = None
        self._calibrated_from: str | None = None
        self._events = JobEvents()
        """Live events for followers (steps, planner tools and answers, status); not state: never read back."""
        self._calibration_source: str | None = None
        """The user's calibration data as given (the request then names the workspace copy)."""
        self._ingested: tuple[str | None, str | None] = (None, None)
        self._eval_set: str | None = None
        """Workspace .npz the gate grades (held out or --eval-data); None: synthetic evaluation inputs."""
        self._held_out = False
        self._ran: list[CompiledStep] = []
        """The steps of the attempt that ran last (what built the artifacts)."""
        self._report: ReportResult | None = None

    @workflow.run
    async def run(self, req: ConversionRequest) -> ConversionResult:
        self._req = req
        ctx = RunContext(run_id=run_id_for(req.run_id), kind=JobKind.CONVERT, queues=req.queues)
        try:
            ws = await self._init(ctx)
            if req.rerun_of:
                plan = await self._load_rerun_plan()
                compiled = await self._compile(plan, ws, 0)
            else:
                plan, compiled = await self._plan_or_ask()
            while plan.status is PlanStatus.NEEDS_INPUT:
                if not await self._wait_for_answer(ctx, plan.questions):
                    return await self._unanswered(ctx, plan.questions)
                await self._ingest_calibration()
                plan, compiled = await self._plan_or_ask()
            return await self._convert(ctx, ws, plan, compiled)
        except (ActivityError, asyncio.CancelledError) as e:
            if is_cancellation(e):
                self._cancelled()
                raise
            return await self._fail(ctx, failure_from(e, where=self._progress.step))

    async def _convert(self, ctx: RunContext, ws: WorkspaceRef, plan: ConversionPlan,
                       compiled: CompileResult | None) -> ConversionResult:
        """compile → execute → evaluate → gate, until a verdict; replans only with a planner that can
        change its plan."""
        req = self._request
        tried: set[str] = set()
        last_failure: Failure | None = None
        remedying: Replan | None = None
        """The gate's verdict this attempt's plan is a remedy for."""
        for attempt in itertools.count():
            compiled = compiled or await self._compile(plan, ws, attempt)
            compiled = check_precision(compiled, req)  # a plan that delivers another precision than allowed does not run
            verdict = next_after_compile(compiled, attempt=attempt, replans=self._progress.replans,
                                         max_replans=req.max_replans, tried=frozenset(tried),
                                         last_feedback=self._progress.last_error,
                                         last_failure=last_failure, can_replan=not self._deterministic)
            compiled = None
            if isinstance(verdict, Execute):
                tried.add(verdict.fingerprint)
                self._ran = list(verdict.steps)
                failure = await self._execute(verdict.steps, ws)
                if failure is not None and remedying is not None and self._deterministic:
                    remedies, float_outputs, _ = plan_remedies(plan)
                    verdict = next_after_failed_remedy(failure, remedying, remedies=remedies, float_outputs=float_outputs,
                                                       attempt=attempt, replans=self._progress.replans,
                                                       max_replans=req.max_replans, can_remedy=self._can_remedy)
                else:
                    verdict = next_after_execution(failure, attempt=attempt, replans=self._progress.replans,
                                                   max_replans=req.max_replans,
                                                   can_replan=not self._deterministic,
                                                   can_remedy=self._can_remedy if failure and self._graph_passes else None,
                                                   remedies=plan_remedies(plan)[0])
            if isinstance(verdict, Evaluate):
                verdict = await self._judge(plan, ws, verdict, attempt)
            if isinstance(verdict, Replan) and req.rerun_of:
                verdict = rerun_gives_up(verdict, req.rerun_of, req.overrides)
            match verdict:
                case Complete(record, accuracy):
                    self._attempts.append(record)
                    self._accuracy = accuracy
                    return await self._complete(ctx, ws)
                case GiveUp(failure, record):
                    self._attempts.append(record)
                    return await self._fail(ctx, failure, attach=failure.code == Err.EVALUATION_CRASHED)
                case Replan(feedback, record, _, failure, remedy, _):
                    last_failure = failure
                    remedying = verdict if remedy is not None else None
                    plan, compiled = await self._replan(feedback, record, attempt + 1, remedy)
        raise AssertionError("unreachable")

    async def _judge(self, plan: ConversionPlan, ws: WorkspaceRef, ran: Evaluate,
                     attempt: int) -> Complete | Replan | GiveUp:
        """Evaluate the converted model and put the figures through the accuracy gate."""
        try:
            self._evaluation = await self._evaluate(plan, ws)
        except ActivityError as e:
            if is_cancellation(e):
                raise
            failure = failure_from(e, where="evaluate")
            if failure.code == Err.EVALUATION_CRASHED:
                failure = failure.model_copy(update={"message": "the conversion succeeded but is UNEVALUATED: "
                                                                + failure.message})
                self._accuracy = AccuracyVerdict(verdict="unevaluated", min_cosine=min_cosine_for(self._request),
                                                 note=clip(failure.message, 300))
            return GiveUp(failure, ran.record.model_copy(update={"outcome": "evaluation_failed",
                                                                 "feedback": failure.message}))
        remedies, float_outputs, failed = plan_remedies(plan)
        verdict = gate(self._evaluation, self._offload(), request=self._request, attempt=attempt,
                       replans=self._progress.replans, max_replans=self._request.max_replans, remedies=remedies,
                       float_outputs=float_outputs, can_remedy=self._can_remedy, failed=failed,
                       delivered=self._delivered())
        if not isinstance(verdict, Complete):
            self._accuracy = verdict.accuracy
        return verdict

    def _can_remedy(self, feedback: PlanFeedback) -> bool:
        """An LLM planner may always try; the offline planner only when it has a remedy left; a rerun never."""
        if self._request.rerun_of:
            return False
        return not self._deterministic or next_remedy(self._request, feedback) is not None

    @property
    def _graph_passes(self) -> bool:
        """A compile failure naming an op a graph pass rewrites goes back to the offline planner."""
        return self._deterministic

    @property
    def _deterministic(self) -> bool:
        """The offline planner (or a rerun's fixed plan): the same feedback gives the same plan."""
        return self._request.llm != "openai" or bool(self._request.rerun_of)

    def _delivered(self) -> Precision | None:
        """What the built artifacts compute in (None: nothing ran yet)."""
        return delivered_precision(self._ran, self._request.precision) if self._ran else None

    def _offload(self) -> OffloadReport | None:
        return next((s.offload for s in reversed(self._steps) if s.offload is not None), None)

    def _mixed_precision(self) -> MixedPrecisionReport | None:
        return next((s.mixed_precision for s in reversed(self._steps) if s.mixed_precision is not None), None)

    # ---- queries and updates ----------------------------------------------------------------

    @workflow.query
    def status(self) -> ConversionProgress:
        return self._progress

    @workflow.update
    def provide_input(self, answer: ProvideInput) -> ConversionProgress:
        """Answer a NEEDS_INPUT job's questions (soc, precision, calibration)."""
        self._answer = answer
        self._waiting = False
        return self._progress

    @provide_input.validator
    def _check_answer(self, answer: ProvideInput) -> None:
        if not self._waiting:
            raise ApplicationError("the job is not waiting for input", type=Err.BAD_INPUT, non_retryable=True)
        problems = answer_problems(answer)
        if problems:
            raise ApplicationError("; ".join(problems), type=Err.BAD_INPUT, non_retryable=True)

    # ---- steps ------------------------------------------------------------------------------

    async def _init(self, ctx: RunContext) -> WorkspaceRef:
        req = self._request
        self._show("resolve", ctx.run_id)
        self._model = await ctx.resolve(req.model)
        ui.set_model(self._model.name)
        self._show("create run", ctx.run_id)
        await ctx.create_run(req.user_id, req.model_dump(mode="json"))
        self._run_created = True
        self._show("workspace", ctx.run_id)
        self._workspace = WorkspaceRef(run_id=ctx.run_id, user_id=req.user_id)
        await ctx.prepare_workspace(self._workspace, self._model, {"job": JobKind.CONVERT.value})
        await self._ingest_calibration()
        return self._workspace

    async def _plan_or_ask(self) -> tuple[ConversionPlan, CompileResult | None]:
        """The first plan, unless quantizing without calibration data and without the synthetic opt-in:
        then the job asks for the data (with any other missing fact) before a planner runs."""
        question = calibration_question(self._request)
        if question is None:
            return await self._plan(attempt=0)
        return ConversionPlan(status=PlanStatus.NEEDS_INPUT, questions=[*questions_for(self._request), question],
                              rationale="calibration data needed"), None

    async def _ingest_calibration(self) -> None:
        """Copy the user's calibration data into the workspace (content-addressed); from then on the
        request names the workspace copy, so planner, quantizer and evaluation read the same data. The
        evaluation data is ingested with it, never overlapping: `--eval-data` checked against the
        calibration data, or a held-out part of it (prepare_calibration)."""
        req = self._request
        calibration = self._calibration_source if req.calibration == self._calibrated_from else req.calibration
        sources = (calibration, req.eval_data)
        if not any(sources) or sources == self._ingested:
            return
        assert self._workspace is not None and self._model is not None
        self._show("calibration data")
        what = " and ".join(x for x in (calibration and f"the calibration data {calibration}",
                                         req.eval_data and f"the evaluation data {req.eval_data}") if x)
        ref = await workflow.execute_activity_method(
            ToolchainActivities.prepare_calibration,
            CalibrationRequest(workspace=self._workspace, source=calibration or "", model=f"input/{self._model.filename}",
                               eval_source=req.eval_data, eval_samples=req.eval_samples),
            task_queue=req.queues.toolchain, summary=f"copy {what} into the workspace, evaluation samples kept apart",
            start_to_close_timeout=TOOLCHAIN.start_to_close, heartbeat_timeout=TOOLCHAIN.heartbeat,
            retry_policy=TOOLCHAIN.retry)
        self._ingested, self._calibration_source = sources, calibration
        self._req = req.model_copy(update={"calibration": ref.path or None})
        self._calibrated_from = ref.path or None
        self._eval_set, self._held_out = ref.evaluation, ref.held_out

    async def _plan(self, attempt: int, feedback: str = "", remedy: PlanFeedback | None = None,
                    ) -> tuple[ConversionPlan, CompileResult | None]:
        """One planner decision on the ladder: (plan, its compile result; None for NEEDS_INPUT)."""
        self._show("plan", attempt=attempt)
        assert self._model is not None and self._workspace is not None
        req, ws = self._request, self._workspace
        repair: list[str] = [feedback]

        async def llm(rejections: list[str]) -> Accepted[tuple[ConversionPlan, CompileResult | None]] | Rejected:
            answer = await self._llm_answer(attempt, repair[-1])
            if isinstance(answer, Rejected):
                repair.append(llm_planner.repair_prompt(answer.reason))
                return answer
            if answer.status is PlanStatus.NEEDS_INPUT:
                return Accepted((answer, None))
            compiled = await self._compile(answer, ws, attempt)
            if compiled.ok:
                return Accepted((answer, compiled))
            self._attempts.append(AttemptRecord(attempt=attempt, outcome="compile_rejected", feedback=compiled.feedback()))
            self._progress.replans += 1
            repair.append(llm_planner.feedback_prompt(compiled.feedback()))
            return Rejected(compiled.feedback())

        async def offline(reason: str) -> Accepted[tuple[ConversionPlan, CompileResult | None]]:
            plan = await self._plan_offline(PlanRequest(request=req, model=self._model, attempt=attempt,  # type: ignore[arg-type]
                                                        feedback=feedback if req.llm != "openai" else "", remedy=remedy),
                                            f"offline planner, attempt {attempt}")
            if plan.status is PlanStatus.NEEDS_INPUT:
                return Accepted((plan, None))
            return Accepted((plan, await self._compile(plan, ws, attempt)))

        climbed = await climb(llm_planner.AGENT, llm=llm if req.llm == "openai" else None, offline=offline,
                              max_llm_answers=req.max_replans + 1)
        self._provenance.append(climbed.provenance)
        self._events.publish(JobEvent(kind=EventKind.AGENT, agent=llm_planner.AGENT,
                                      text=f"answered ({climbed.provenance.source.value})"))
        if climbed.provenance.source is AnswerSource.FALLBACK:
            self._planner_warnings.append(f"{climbed.provenance.fallback_reason}; planned with the offline planner instead")
        if climbed.value is None:  # the offline planner always answers; kept for the type
            raise ApplicationError(f"no planner gave a plan: {climbed.provenance.fallback_reason}",
                                   type=Err.LLM_OUTPUT_INVALID, non_retryable=True)
        plan, compiled = climbed.value
        self._warnings = plan_warnings(plan)
        return plan, compiled

    async def _plan_offline(self, req: PlanRequest, summary: str) -> ConversionPlan:
        """The offline planner's answer, counted and kept like an LLM answer (a call, zero tokens)."""
        queue = self._request.queues.toolchain
        result = await workflow.execute_activity_method(
            ToolchainActivities.offline_planner_answer, req, task_queue=queue, summary=summary,
            start_to_close_timeout=TOOLCHAIN.start_to_close, retry_policy=TOOLCHAIN.retry)
        self._llm_calls.append(result)
        return ConversionPlan.model_validate_json(result.message.text)

    async def _load_rerun_plan(self) -> ConversionPlan:
        req = self._request
        assert req.rerun_of is not None
        self._show(f"load plan of {req.rerun_of}")
        plan = await workflow.execute_activity_method(
            ToolchainActivities.load_plan, RerunRequest(run_id=req.rerun_of, overrides=req.overrides),
            task_queue=req.queues.toolchain, summary=f"load the plan of run {req.rerun_of} with overrides {req.overrides}",
            start_to_close_timeout=TOOLCHAIN.start_to_close, retry_policy=TOOLCHAIN.retry,
        )
        self._warnings = plan_warnings(plan)
        return plan

    async def _llm_answer(self, attempt: int, note: str) -> ConversionPlan | Rejected:
        """One LLM answer: the ReAct loop, one LLM call per tick; planner tools run as activities; ends
        with the answer's plan, or a Rejected (unparseable, or no plan within planner_max_tool_iters).
        An LLM call that fails raises (the ladder falls back to the offline planner)."""
        req, model = self._request, self._model
        assert model is not None
        if not self._messages:
            self._messages = [Message.system(llm_planner.system_prompt(model)),
                              Message.user(llm_planner.request_prompt(req, model))]
        if self._pending_note:
            self._messages.append(Message.user(self._pending_note))
            self._pending_note = ""
        if note:
            self._messages.append(Message.user(note))
        for tick in range(req.planner_max_tool_iters):
            result = await ask(ChatRequest(messages=list(self._messages), tools=llm_planner.TOOL_DEFINITIONS,
                                           agent=llm_planner.AGENT, temperature=0.0, stream=True, live=True),
                               queue=req.queues.llm, summary=f"planner: ask the LLM (attempt {attempt}, tick {tick + 1})")
            self._llm_calls.append(result)
            msg = result.message
            self._messages.append(Message(role="assistant", content=msg.content, tool_calls=msg.tool_calls))
            if msg.tool_calls:
                self._messages.append(Message(role="tool", content=[await self._planner_tool(c.name, c.id, c.arguments, attempt)
                                                                    for c in msg.tool_calls]))
                continue
            outcome = parse_structured(msg.text, ConversionPlan)
            return outcome.value if isinstance(outcome, Parsed) else outcome
        return Rejected(f"no plan within planner_max_tool_iters={req.planner_max_tool_iters} tool calls: "
                        "answer with the plan JSON")

    async def _planner_tool(self, name: str, call_id: str, arguments: str, attempt: int) -> ToolResultBlock:
        """Run an allowlisted planner tool as an activity; refuse anything else without running it."""
        if name not in llm_planner.PLANNER_TOOLS:
            return ToolResultBlock(tool_call_id=call_id, content=llm_planner.refusal(name), is_error=True)
        assert self._workspace is not None
        self._show(f"plan: {name}", attempt=attempt)
        self._events.publish(JobEvent(kind=EventKind.TOOL, agent=llm_planner.AGENT, text=f"{name} {arguments}"[:300]))
        out = await workflow.execute_activity_method(
            ToolchainActivities.planner_tool, PlannerToolRequest(name=name, arguments=arguments, workspace=self._workspace),
            task_queue=self._request.queues.toolchain, summary=f"planner tool {name}, attempt {attempt}",
            start_to_close_timeout=TOOLCHAIN.start_to_close, retry_policy=TOOLCHAIN.retry,
        )
        return ToolResultBlock(tool_call_id=call_id, content=out.content, is_error=out.is_error)

    async def _replan(self, feedback: str, record: AttemptRecord, attempt: int,
                      remedy: PlanFeedback | None) -> tuple[ConversionPlan, CompileResult | None]:
        self._attempts.append(record)
        self._progress.replans += 1
        self._progress.last_error = feedback
        if remedy is not None and self._request.llm == "openai":
            feedback = llm_planner.gate_feedback(remedy, feedback,
                                                 allow_wider=self._request.precision_fallback)
        elif self._request.llm == "openai":
            feedback = llm_planner.feedback_prompt(feedback)
        return await self._plan(attempt, feedback, remedy)

    async def _wait_for_answer(self, ctx: RunContext, questions: list[str]) -> bool:
        """Ask, then wait (durably, for up to the request's timeout) for `provide_input`."""
        await ctx.finish(JobStatus.NEEDS_INPUT)
        self._progress.questions = list(questions)
        self._progress.status = JobStatus.NEEDS_INPUT
        self._waiting = True
        ui.set_status(JobStatus.NEEDS_INPUT)
        self._events.status(JobStatus.NEEDS_INPUT, " / ".join(questions))
        self._show("needs input")
        try:
            timeout_s = self._request.needs_input_timeout_s
            await workflow.wait_condition(lambda: self._answer is not None, timeout=timedelta(seconds=timeout_s),
                                          timeout_summary=wait_summary(timeout_s, workflow.info().workflow_id))
        except asyncio.TimeoutError:
            self._waiting = False
            return False
        assert self._answer is not None
        self._req = apply_answer(self._request, self._answer)
        assert self._model is not None
        self._pending_note = "The user answered the questions. The request is now:\n" + llm_planner.request_prompt(self._req, self._model)
        self._answer = None
        self._progress.questions = []
        self._progress.status = JobStatus.RUNNING
        ui.set_status(JobStatus.RUNNING)
        if self._req.target_soc:
            ui.set_target(self._req.target_soc)
        await ctx.finish(JobStatus.RUNNING)
        return True

    async def _compile(self, plan: ConversionPlan, ws: WorkspaceRef, attempt: int) -> CompileResult:
        self._show("compile", attempt=attempt)
        return await workflow.execute_activity_method(
            ToolchainActivities.compile_plan, CompileRequest(plan=plan, workspace=ws, attempt=attempt),
            task_queue=self._request.queues.toolchain, summary=f"compile plan, attempt {attempt} ({len(plan.steps)} steps)",
            start_to_close_timeout=TOOLCHAIN.start_to_close, retry_policy=TOOLCHAIN.retry,
        )

    async def _execute(self, steps: list[CompiledStep], ws: WorkspaceRef) -> Failure | None:
        """Run the steps in order, one activity each; the first failure stops the attempt."""
        self._steps = []
        for step in steps:
            self._show(f"run {step.step_id}")
            try:
                result = await workflow.execute_activity_method(
                    ToolchainActivities.execute_step, ExecuteStepRequest(step=step, workspace=ws),
                    task_queue=self._request.queues.toolchain, summary=f"run step {step.step_id} with {step.tool_name}",
                    start_to_close_timeout=TOOLCHAIN.start_to_close, heartbeat_timeout=TOOLCHAIN.heartbeat,
                    retry_policy=TOOLCHAIN.retry,
                )
            except ActivityError as e:
                if is_cancellation(e):
                    raise
                failure = failure_from(e, where=step.step_id)
                self._progress.last_error = f"[{failure.code}] {failure.where}: {failure.message}"
                return failure
            self._steps.append(result)
            self._progress.steps_done.append(step.step_id + (" (cached)" if result.cached else ""))
        return None

    async def _evaluate(self, plan: ConversionPlan, ws: WorkspaceRef) -> EvaluationReport | None:
        pair = evaluation_pair(plan)
        if pair is None:
            return None
        ref, cand = pair
        self._show("evaluate")
        source = plan.intent.get("source_model")  # a PyTorch model: the torch module is the reference
        torch_ref = {"source": source} if isinstance(source, str) else {}
        req = EvaluateRequest(workspace=ws, reference=ref, candidate=cand, samples=self._request.eval_samples,
                              seed=EVAL_SEED, evaluation=self._eval_set, held_out=self._held_out,
                              calibrated_on=calibration_sources(self._ran), **torch_ref)  # type: ignore[arg-type]
        return await workflow.execute_activity_method(
            ToolchainActivities.evaluate, req,
            task_queue=self._request.queues.toolchain, summary=f"evaluate {cand} against {ref}",
            start_to_close_timeout=TOOLCHAIN.start_to_close, heartbeat_timeout=TOOLCHAIN.heartbeat,
            retry_policy=TOOLCHAIN.retry,
        )

    def _artifacts(self) -> list[ArtifactRef]:
        return [a for s in self._steps for a in s.outputs.values()]

    async def _complete(self, ctx: RunContext, ws: WorkspaceRef) -> ConversionResult:
        artifacts = self._artifacts()
        if self._accuracy is not None and self._accuracy.verdict == "unverified":
            self._warnings.append(self._accuracy.note)
        self._report = await self._write_report(ctx, ws, artifacts)
        artifacts = artifacts + self._report.files
        self._show("attach")
        await ctx.attach(artifacts)
        await ctx.finish(JobStatus.COMPLETED)
        ui.set_status(JobStatus.COMPLETED)
        self._progress.status = JobStatus.COMPLETED
        self._progress.last_error = ""  # an earlier attempt's error is history (result.attempts), not where it is now
        self._events.status(JobStatus.COMPLETED)
        self._show("completed")
        if self._accuracy is not None and self._accuracy.verdict == "accepted_lossy":
            self._warnings.append(self._accuracy.note)
        return self._result(ctx, JobStatus.COMPLETED, artifacts=artifacts)

    async def _write_report(self, ctx: RunContext, ws: WorkspaceRef, artifacts: list[ArtifactRef]) -> ReportResult:
        """The deployment report (placement per op type, toolchain, accuracy per output), stored beside
        the artifacts."""
        self._show("report")
        req = self._request
        facts = ConversionReport(
            run_id=ctx.run_id, model=self._model.name if self._model else req.model, target_soc=req.target_soc,
            requested_precision=req.precision, delivered_precision=self._delivered(),
            artifacts=[ArtifactReport(name=a.name or a.uri, sha256=a.sha256, size=a.size, role="") for a in artifacts],
            evaluation=self._evaluation, accuracy=self._accuracy, mixed_precision=self._mixed_precision(),
            warnings=self._planner_warnings + self._warnings + self._remedy_warnings() + self._sandbox_warnings())
        sources = {str(s.params["output"]): str(s.params["model"]) for s in self._ran
                   if s.tool_name == "ortqnn.context_binary" and "output" in s.params and "model" in s.params}
        return await workflow.execute_activity_method(
            ToolchainActivities.write_report, ReportRequest(workspace=ws, report=facts, context_sources=sources),
            task_queue=req.queues.toolchain, summary="write the deployment report (placement, toolchain, accuracy)",
            start_to_close_timeout=TOOLCHAIN.start_to_close, retry_policy=TOOLCHAIN.retry)

    async def _fail(self, ctx: RunContext, failure: Failure, *, attach: bool = False, **result: object) -> ConversionResult:
        """End FAILED: logs/last_error.json, the run record, and (an unevaluated conversion) its artifacts.
        The failure carries the hint for its code and this job's precision."""
        if not failure.hint:
            failure = failure.model_copy(update={"hint": failure_hint(failure.code, self._request, self._delivered())})
        self._progress.status = JobStatus.FAILED
        self._progress.last_error = f"[{failure.code}] {failure.where}: {failure.message}"
        self._events.status(JobStatus.FAILED, self._progress.last_error)
        self._show("failed", error=self._progress.last_error)
        if attach and self._artifacts():
            result["artifacts"] = self._artifacts()
        if self._run_created:
            try:
                if self._workspace is not None:
                    await workflow.execute_activity_method(
                        ToolchainActivities.record_failure,
                        RecordFailureRequest(workspace=self._workspace, failure=failure, attempts=self._attempts),
                        task_queue=self._request.queues.toolchain, summary=f"write logs/last_error.json ({failure.code})",
                        start_to_close_timeout=TOOLCHAIN.start_to_close, retry_policy=TOOLCHAIN.retry)
                if attach and self._artifacts():
                    await ctx.attach(self._artifacts())
                await ctx.finish(JobStatus.FAILED, failure)
            except ActivityError as e:
                if is_cancellation(e):
                    raise
                workflow.logger.warning("could not record the failure of run %s", ctx.run_id)
        return end_failed(self._result(ctx, JobStatus.FAILED, failure=failure, **result), failure)

    def _cancelled(self) -> None:
        self._progress.status = JobStatus.CANCELLED
        self._progress.questions = []
        self._waiting = False
        mark_cancelled()
        self._events.status(JobStatus.CANCELLED)
        self._show("cancelled")

    async def _unanswered(self, ctx: RunContext, questions: list[str]) -> ConversionResult:
        """Nobody answered in time: the job ends FAILED (it is no longer waiting), the questions kept."""
        timeout = self._request.needs_input_timeout_s
        failure = Failure(code=Err.NEEDS_INPUT_TIMEOUT, where="needs input",
                          message=f"no answer within {timeout}s; start a new job with the missing facts")
        self._progress.questions = []
        return await self._fail(ctx, failure, questions=questions)

    def _result(self, ctx: RunContext, status: JobStatus, **kw: object) -> ConversionResult:
        return ConversionResult(
            status=status, run_id=ctx.run_id, model=self._model, workspace=self._workspace, attempts=self._attempts,
            cached_steps=[s.step_id for s in self._steps if s.cached],
            executed_steps=[s.step_id for s in self._steps if not s.cached],
            warnings=self._planner_warnings + self._warnings + self._remedy_warnings() + self._sandbox_warnings(), tokens=self._tokens(),
            transcripts=[c.transcript for c in self._llm_calls], evaluation=self._evaluation,
            accuracy=self._accuracy, offload=self._offload(), mixed_precision=self._mixed_precision(),
            planner=self._provenance,
            finished_at=workflow.now(), requested_precision=self._request.precision,
            delivered_precision=self._delivered(), report=self._report.report if self._report else None,
            **kw,  # type: ignore[arg-type]
        )

    def _sandbox_warnings(self) -> list[str]:
        """The worker's opt-out of the sandbox (FLEETFORGE_SANDBOX=off), said once when a tool ran unconfined."""
        return sorted({s.confinement for s in self._steps if s.confinement})

    def _remedy_warnings(self) -> list[str]:
        acc = self._accuracy
        if acc is None or not acc.remedies or acc.verdict not in ("passed", "unverified", "accepted_lossy"):
            return []
        return [f"the accuracy gate (cosine >= {acc.min_cosine:g}) was met only with: "
                + ", ".join(remedy_words(r) for r in acc.remedies)]

    def _tokens(self) -> TokenTotals:
        return token_totals(self._llm_calls)

    @property
    def _request(self) -> ConversionRequest:
        assert self._req is not None
        return self._req

    def _show(self, step: str, run_id: str = "", *, attempt: int | None = None, error: str = "") -> None:
        self._progress.step = step
        self._events.step(step)
        if attempt is not None:
            self._progress.attempt = attempt
        if error:
            self._progress.last_error = error
        ui.details("convert", {
            "step": step, "run": run_id, "attempt": attempt, "replans": self._progress.replans,
            "target": ui.normalise_target(self._req.target_soc or "") if self._req else "", "done": ", ".join(self._progress.steps_done),
            "accuracy": accuracy_row(self._accuracy, self._evaluation),
            "precision": precision_row(self._request.precision if self._req else None, self._delivered()),
            "offload": offload_row(self._offload()),
            "16-bit layers": mixed_row(self._mixed_precision()),
            "evaluation": evaluation_facts(self._evaluation),
            "accuracy per output": accuracy_rows(self._evaluation) if self._evaluation else [],
            "op placement": placement_rows(self._report.report) if self._report else [],
            "toolchain": self._report.report.toolchain if self._report else {},
            "report": self._report.files[0] if self._report else None,
            "artifacts": self._artifacts() if step in ("completed", "failed") else [],
            "questions": " / ".join(self._progress.questions),
            "waiting for": (f"an answer: `{answer_hint(workflow.info().workflow_id)}`"
                            if self._progress.questions else ""),
            "last error": self._progress.last_error,
        })


def accuracy_row(accuracy: AccuracyVerdict | None, evaluation: EvaluationReport | None) -> str:
    """The Web UI's accuracy cell: verdict, worst cosine against the threshold, remedies."""
    if accuracy is None:
        return f"cosine {evaluation.cosine:.4f} (not judged yet)" if evaluation is not None else ""
    words = verdict_words(accuracy)
    if accuracy.cosine is not None and accuracy.samples:
        words += (f": lowest per-sample cosine {accuracy.cosine:.4f} (threshold {accuracy.min_cosine:g}) on "
                  f"{accuracy.samples} {accuracy.inputs.replace('_', '-')} samples")
    elif accuracy.cosine is not None:
        words += f": cosine {accuracy.cosine:.4f} (threshold {accuracy.min_cosine:g})"
    if accuracy.remedies:
        words += " after " + ", ".join(accuracy.remedies)
    return words


def evaluation_facts(evaluation: EvaluationReport | None) -> dict[str, object] | None:
    """The evaluation's scalar facts for the details (its outputs have their own table)."""
    return evaluation.model_dump(mode="json", exclude={"outputs"}) if evaluation is not None else None


def precision_row(requested: Precision | None, delivered: Precision | None) -> str:
    """`int8` when delivered as requested, else `requested int8, delivered w8a16`."""
    if delivered is None or requested is None:
        return ""
    return delivered.value if delivered == requested else f"requested {requested.value}, delivered {delivered.value}"


def mixed_row(mixed: MixedPrecisionReport | None) -> str:
    """The Web UI's mixed-precision cell: how many layers at 16 bits, which (most sensitive first)."""
    if mixed is None:
        return ""
    return (f"{len(mixed.sixteen_bit)} of {mixed.layers_total} ({mixed.share:.0%}): "
            + ", ".join(f"{layer.node} ({layer.op_type})" for layer in mixed.sixteen_bit))


def offload_row(offload: OffloadReport | None) -> str:
    if offload is None:
        return ""
    text = f"{offload.share:.0%} of {offload.model_nodes} nodes in the context binary"
    return text + (f"; on the CPU: {', '.join(offload.cpu_ops)}" if offload.cpu_ops else "") + offload.io_note()
