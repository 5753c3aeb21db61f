"""ConverterWorkflow: resolve → run → workspace → plan (ask if facts are missing) → compile →
execute step by step (replanning within a budget) → evaluate → attach → complete."""

from __future__ import annotations

import asyncio
import itertools
from datetime import timedelta

from temporalio import workflow
from temporalio.exceptions import ActivityError, ApplicationError

with workflow.unsafe.imports_passed_through():
    from activities.llm.structured import Parsed, parse_structured
    from activities.toolchains import llm_planner
    from activities.toolchains.activities import ToolchainActivities
    from activities.toolchains.offline_planner import evaluation_pair, plan_warnings
    from contracts.common import ArtifactRef, Failure, JobKind, JobStatus, TokenTotals
    from contracts.convert import CompiledStep, CompileResult, ConversionPlan, PlanStatus
    from contracts.convert_job import (
        AttemptRecord, CompileRequest, ConversionProgress, ConversionRequest, ConversionResult, EvaluateRequest,
        EvaluationReport, ExecuteStepRequest, PlannerToolRequest, PlanRequest, ProvideInput, RerunRequest, StepResult,
    )
    from contracts.messages import ChatRequest, ChatResult, Message, ToolResultBlock
    from contracts.errors import Err
    from contracts.models import ModelRef
    from contracts.runs import WorkspaceRef
    from workflows import _visibility as ui
    from workflows._call_options import TOOLCHAIN
    from workflows._init_steps import RunContext, run_id_for
    from workflows._llm import ask, token_totals
    from workflows.converter_policy import (
        Evaluate, Execute, GiveUp, Replan, answer_hint, answer_problems, apply_answer, next_after_compile,
        next_after_execution, rerun_gives_up, wait_summary,
    )
    from workflows.failures import failure_from
    from workflows.job_end import end_failed, is_cancellation, mark_cancelled


OFFLINE_ANSWER = "offline-planner-answer"
"""Patch: the offline plan comes as a recorded answer (offline_planner_answer), not a bare plan."""


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
        """Human answers not yet told to the LLM planner."""
        self._llm_calls: list[ChatResult] = []
        self._planner_warnings: list[str] = []

    @workflow.run
    async def run(self, req: ConversionRequest) -> ConversionResult:
        self._req = req
        ctx = RunContext(run_id=run_id_for(req.run_id), kind=JobKind.CONVERT, queues=req.queues)
        try:
            ws = await self._init(ctx)
            plan = await (self._load_rerun_plan() if req.rerun_of else self._plan(attempt=0))
            while plan.status is PlanStatus.NEEDS_INPUT:
                if not await self._wait_for_answer(ctx, plan.questions):
                    return await self._unanswered(ctx, plan.questions)
                plan = await self._plan(attempt=0)
            tried: set[str] = set()
            for attempt in itertools.count():
                verdict = next_after_compile(await self._compile(plan, ws, attempt), attempt=attempt,
                                             replans=self._progress.replans, max_replans=req.max_replans,
                                             tried=frozenset(tried), last_feedback=self._progress.last_error)
                if isinstance(verdict, Execute):
                    tried.add(verdict.fingerprint)
                    failure = await self._execute(verdict.steps, ws)
                    verdict = next_after_execution(failure, attempt=attempt, replans=self._progress.replans,
                                                   max_replans=req.max_replans)
                if isinstance(verdict, Replan) and req.rerun_of:
                    verdict = rerun_gives_up(verdict, req.rerun_of, req.overrides)
                match verdict:
                    case Evaluate(record):
                        self._attempts.append(record)
                        break
                    case GiveUp(failure, record):
                        self._attempts.append(record)
                        return await self._fail(ctx, failure)
                    case Replan(feedback, record, _):
                        plan = await self._replan(feedback, record, attempt + 1)
            report = await self._evaluate(plan, ws)
            return await self._complete(ctx, ws, report)
        except (ActivityError, asyncio.CancelledError) as e:
            if is_cancellation(e):
                self._cancelled()
                raise
            return await self._fail(ctx, failure_from(e, where=self._progress.step))

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
        return self._workspace

    async def _plan(self, attempt: int, feedback: str = "") -> ConversionPlan:
        self._show("plan", attempt=attempt)
        assert self._model is not None
        if self._request.llm == "openai":
            llm_plan = await self._plan_llm(attempt, feedback)
            if llm_plan is not None:
                self._warnings = plan_warnings(llm_plan)
                return llm_plan
            feedback = ""  # the offline planner starts fresh
        plan = await self._plan_offline(PlanRequest(request=self._request, model=self._model, attempt=attempt,
                                                    feedback=feedback), f"offline planner, attempt {attempt}")
        self._warnings = plan_warnings(plan)
        return plan

    async def _plan_offline(self, req: PlanRequest, summary: str) -> ConversionPlan:
        """The offline planner's answer, counted and kept like an LLM answer (a call, zero tokens)."""
        queue = self._request.queues.toolchain
        if not workflow.patched(OFFLINE_ANSWER):  # a run started before offline answers were recorded
            return await workflow.execute_activity_method(
                ToolchainActivities.plan_offline, req, task_queue=queue, summary=summary,
                start_to_close_timeout=TOOLCHAIN.start_to_close, retry_policy=TOOLCHAIN.retry)
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

    async def _plan_llm(self, attempt: int, feedback: str) -> ConversionPlan | None:
        """The ReAct loop: one LLM call per tick; planner tools run as activities; ends with a plan.
        None: no usable plan within planner_max_tool_iters (or the LLM failed): use the offline planner."""
        req, model = self._request, self._model
        assert model is not None
        if not self._messages:
            self._messages = [Message.system(llm_planner.system_prompt(model)),
                              Message.user(llm_planner.request_prompt(req, model))]
        if self._pending_note:
            self._messages.append(Message.user(self._pending_note))
            self._pending_note = ""
        if feedback:
            self._messages.append(Message.user(llm_planner.feedback_prompt(feedback)))
        iters = 0
        while iters < req.planner_max_tool_iters:
            try:
                result = await ask(ChatRequest(messages=list(self._messages), tools=llm_planner.TOOL_DEFINITIONS,
                                               agent=llm_planner.AGENT, temperature=0.0, stream=False),
                                   queue=req.queues.llm, summary=f"planner: ask the LLM (attempt {attempt}, tick {iters + 1})")
            except ActivityError as e:
                f = failure_from(e, where="planner")
                return self._fallback(f"the LLM planner failed ([{f.code}] {f.message})")
            self._llm_calls.append(result)
            msg = result.message
            self._messages.append(Message(role="assistant", content=msg.content, tool_calls=msg.tool_calls))
            iters += 1
            if msg.tool_calls:
                self._messages.append(Message(role="tool", content=[await self._planner_tool(c.name, c.id, c.arguments, attempt)
                                                                    for c in msg.tool_calls]))
                continue
            outcome = parse_structured(msg.text, ConversionPlan)
            if isinstance(outcome, Parsed):
                return outcome.value
            self._messages.append(Message.user(llm_planner.repair_prompt(outcome.reason)))
        return self._fallback(f"the LLM planner gave no plan within planner_max_tool_iters={req.planner_max_tool_iters}")

    async def _planner_tool(self, name: str, call_id: str, arguments: str, attempt: int) -> ToolResultBlock:
        """Run an allowlisted planner tool as an activity; refuse anything else without running it."""
        if name not in llm_planner.PLANNER_TOOLS:
            return ToolResultBlock(tool_call_id=call_id, content=llm_planner.refusal(name), is_error=True)
        assert self._workspace is not None
        self._show(f"plan: {name}", attempt=attempt)
        out = await workflow.execute_activity_method(
            ToolchainActivities.planner_tool, PlannerToolRequest(name=name, arguments=arguments, workspace=self._workspace),
            task_queue=self._request.queues.toolchain, summary=f"planner tool {name}, attempt {attempt}",
            start_to_close_timeout=TOOLCHAIN.start_to_close, retry_policy=TOOLCHAIN.retry,
        )
        return ToolResultBlock(tool_call_id=call_id, content=out.content, is_error=out.is_error)

    def _fallback(self, why: str) -> None:
        self._planner_warnings.append(f"{why}; planned with the offline planner instead")
        return None

    async def _replan(self, feedback: str, record: AttemptRecord, attempt: int) -> ConversionPlan:
        self._attempts.append(record)
        self._progress.replans += 1
        self._progress.last_error = feedback
        return await self._plan(attempt, feedback)

    async def _wait_for_answer(self, ctx: RunContext, questions: list[str]) -> bool:
        """Ask, then wait (durably, for up to the request's timeout) for `provide_input`."""
        await ctx.finish(JobStatus.NEEDS_INPUT)
        self._progress.questions = list(questions)
        self._progress.status = JobStatus.NEEDS_INPUT
        self._waiting = True
        ui.set_status(JobStatus.NEEDS_INPUT)
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
        return await workflow.execute_activity_method(
            ToolchainActivities.evaluate, EvaluateRequest(workspace=ws, reference=ref, candidate=cand),
            task_queue=self._request.queues.toolchain, summary=f"evaluate {cand} against {ref}",
            start_to_close_timeout=TOOLCHAIN.start_to_close, heartbeat_timeout=TOOLCHAIN.heartbeat,
            retry_policy=TOOLCHAIN.retry,
        )

    async def _complete(self, ctx: RunContext, ws: WorkspaceRef, report: EvaluationReport | None) -> ConversionResult:
        artifacts: list[ArtifactRef] = [a for s in self._steps for a in s.outputs.values()]
        self._show("attach")
        await ctx.attach(artifacts)
        await ctx.finish(JobStatus.COMPLETED)
        ui.set_status(JobStatus.COMPLETED)
        self._progress.status = JobStatus.COMPLETED
        self._show("completed")
        return self._result(ctx, JobStatus.COMPLETED, artifacts=artifacts, evaluation=report)

    async def _fail(self, ctx: RunContext, failure: Failure, **result: object) -> ConversionResult:
        self._progress.status = JobStatus.FAILED
        self._progress.last_error = f"[{failure.code}] {failure.where}: {failure.message}"
        self._show("failed", error=self._progress.last_error)
        if self._run_created:
            try:
                await ctx.finish(JobStatus.FAILED, failure)
            except ActivityError:
                workflow.logger.warning("could not mark run %s failed", ctx.run_id)
        return end_failed(self._result(ctx, JobStatus.FAILED, failure=failure, **result), failure)

    def _cancelled(self) -> None:
        self._progress.status = JobStatus.CANCELLED
        self._progress.questions = []
        self._waiting = False
        mark_cancelled()
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
            warnings=self._planner_warnings + self._warnings, tokens=self._tokens(),
            transcripts=[c.transcript for c in self._llm_calls],
            finished_at=workflow.now(), **kw,  # type: ignore[arg-type]
        )

    def _tokens(self) -> TokenTotals:
        return token_totals(self._llm_calls)

    @property
    def _request(self) -> ConversionRequest:
        assert self._req is not None
        return self._req

    def _show(self, step: str, run_id: str = "", *, attempt: int | None = None, error: str = "") -> None:
        self._progress.step = step
        if attempt is not None:
            self._progress.attempt = attempt
        if error:
            self._progress.last_error = error
        ui.details("convert", {
            "step": step, "run": run_id, "attempt": attempt, "replans": self._progress.replans,
            "target": self._req.target_soc if self._req else "", "done": ", ".join(self._progress.steps_done),
            "questions": " / ".join(self._progress.questions),
            "waiting for": (f"an answer: `{answer_hint(workflow.info().workflow_id)}`"
                            if self._progress.questions else ""),
            "last error": self._progress.last_error,
        })
