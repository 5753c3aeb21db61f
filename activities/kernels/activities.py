"""Kernel activities: reading the reference, the agents (designer, coder/optimizer, conductor
analysis), the verifier and the trace recorder.

Each agent activity answers once, for the provider the request names (the offline templates or an
OpenAI-compatible endpoint through LLMActivities.chat), and validates what it got: parsed with the
workflow.yaml's registered parser, then (a candidate) the static checks and the already-rejected
check. It returns the product or a typed refusal (`Rejection` + the reason). The repair rounds and
the offline fallback live in one place, the workflow's agent ladder (workflows/agent_ladder.py): a
refusal's reason comes back in the next request's `repair`. Prompts, raw answers and products go to
the artifact store: the workflow history carries ArtifactRefs, token counts and short reasons only.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
from collections.abc import Callable

from pydantic_core import to_jsonable_python
from temporalio import activity

from activities.heartbeat import heartbeating
from activities.kernels import llm_agents, offline_coder, offline_designer, optimizer, parsers
from activities.kernels.gpus import roofline_gpu, roofline_spec
from activities.kernels.precision import allows_tf32
from activities.kernels.static_checks import static_check
from activities.llm.activity import LLMActivities, record_offline_answer
from activities.llm.structured import Rejected
from activities.storage import ArtifactStore
from contracts.common import ArtifactRef
from activities import sandbox
from activities.sandbox import SandboxMode
from contracts.errors import Err, FleetforgeError
from contracts.kernel import CODE_PARSERS, KernelTask, LLMDecision, TimeLimit
from contracts.kernel_job import (
    AgentCall,
    AnalyzeRequest,
    AnalyzeResult,
    CodeRequest,
    CodeResult,
    DesignRequest,
    DesignResult,
    LaunchCost,
    ModeledSpeed,
    RecordTraceRequest,
    ReferenceAnalysis,
    Rejection,
    TraceReferenceRequest,
    VerifyRequest,
    VerifyResult,
)
from contracts.messages import ChatRequest, Message
from contracts.settings import Settings

PY = "text/x-python"
JSON = "application/json"
MD = "text/markdown"
CPU_SPEED_NOTE = "speed not measurable on CPU (Triton interpreter): correctness only"
"""Said when there is no modeled speed either (no traced reference, nothing counted)."""
NO_TEMPLATE_HINT = "configure an LLM (FLEETFORGE_LLM_BASE_URL) to write this kernel"


class KernelActivities:
    def __init__(self, store: ArtifactStore, settings: Settings, llm: LLMActivities | None = None):
        self.store = store
        self.settings = settings
        self.llm = llm or LLMActivities(settings, store)

    # -- the reference -----------------------------------------------------------------------------

    @activity.defn
    def trace_reference(self, req: TraceReferenceRequest) -> ReferenceAnalysis:
        """What the reference computes (aten ops, input/param shapes) and its size; a task that cannot
        be built is KERNEL_TASK_INVALID (non-retryable: the file is wrong, not the worker)."""
        from activities.kernels.reference import size_problem, trace_reference

        with heartbeating("tracing the reference") as note:
            task = self._task(req.task)  # the SDK's jobs start with the source in the store
            analysis = trace_reference(task.task_desc, timeout_s=req.timeout_s, heartbeat=note)
            ref = self.store.put_bytes(analysis.model_dump_json().encode(), media_type="application/json",
                                       name="reference.json")
            source = req.task.source or self.store.put_bytes(task.task_desc.encode("utf-8"), media_type=PY,
                                                             name="task.py")
            plan = offline_designer.choose_plan(analysis)
            family = f"no offline template: {plan}" if isinstance(plan, str) else plan.label
            return analysis.without_trace(artifact=ref, source=source, family=family,
                                          size_problem=size_problem(analysis))

    def _task(self, task: KernelTask) -> KernelTask:
        """The task with its source: the conductor's requests carry it as a store ref (KernelTask.stored)."""
        if task.source is None:
            return task
        return task.model_copy(update={"task_desc": self.store.get_bytes(task.source).decode("utf-8"), "source": None})

    def _reference(self, ref: ArtifactRef | None) -> ReferenceAnalysis | None:
        """The traced reference an agent request points at (None: the agent works without it)."""
        return ReferenceAnalysis.model_validate_json(self.store.get_bytes(ref)) if ref is not None else None

    # -- agents ------------------------------------------------------------------------------------

    @activity.defn
    async def design(self, req: DesignRequest) -> DesignResult:
        req = req.model_copy(update={"task": await asyncio.to_thread(self._task, req.task)})
        base = f"kernels/{req.task.task_id}/designer-step{req.step}-a{len(req.repair)}"
        fmt = parsers.output_format("designer", req.output)
        if req.llm == "offline":
            reference = await asyncio.to_thread(self._reference, req.reference)  # off the event loop
            chosen = await asyncio.to_thread(offline_designer.design, reference)
            text = (f"no offline template: {chosen}\n" if isinstance(chosen, str)
                    else chosen.model_dump_json(indent=2, exclude_defaults=True))
            call = await self._offline("designer", base, req, text)
            if isinstance(chosen, str):
                return DesignResult(parsed_ok=False, reason=f"no offline template: {chosen}; {NO_TEMPLATE_HINT}",
                                    rejection=Rejection.NO_TEMPLATE, call=call)
            parsed = chosen
        else:
            text, call = await self._ask("designer", base, llm_agents.design_prompt(req))
            answer = llm_agents.design_from(text, fmt)
            if isinstance(answer, Rejected):
                return DesignResult(parsed_ok=False, reason=answer.reason, rejection=Rejection.UNUSABLE, call=call)
            parsed = answer
        ref = await self._put(parsed.model_dump_json(indent=2), JSON, f"{base}-design.json")
        return DesignResult(parsed_ok=True, design=parsed, artifact=ref, call=call)

    @activity.defn
    async def code(self, req: CodeRequest) -> CodeResult:
        """The coder or the optimizer (`req.role`): one candidate that parses, passes the static checks
        and is not one the verifier already rejected; otherwise the refusal and its reason."""
        req = req.model_copy(update={"task": await asyncio.to_thread(self._task, req.task)})
        base = f"kernels/{req.task.task_id}/{req.role}-step{req.step}-c{req.candidate_index}-a{len(req.repair)}"
        fmt = parsers.output_format(req.role, req.output)
        rewrite = ""
        tf32 = allows_tf32(req.task.precision)
        if req.llm == "offline" and req.role == "optimizer":
            reference = await asyncio.to_thread(self._reference, req.reference)
            proposal = await asyncio.to_thread(optimizer.offline_answer, req.task.task_desc, reference, req.tried, tf32=tf32)
            if isinstance(proposal, str):
                call = await self._offline(req.role, base, req, f"no rewrite: {proposal}\n")
                return CodeResult(parsed_ok=False, reason=proposal, rejection=Rejection.NO_TEMPLATE, call=call)
            text, rewrite = _offline_answer(proposal.source, fmt), proposal.rewrite
            call = await self._offline(req.role, base, req, text)
        elif req.llm == "offline":
            reference = await asyncio.to_thread(self._reference, req.reference)
            plan = await asyncio.to_thread(offline_coder.plan_for, req.task, req.design, reference)
            if isinstance(plan, str):
                call = await self._offline(req.role, base, req, f"no offline template: {plan}\n")
                return CodeResult(parsed_ok=False, reason=f"no offline template: {plan}; {NO_TEMPLATE_HINT}",
                                  rejection=Rejection.NO_TEMPLATE, call=call)
            rendered = await asyncio.to_thread(offline_coder.render, plan, req.task.task_desc, reference, tf32=tf32)
            if rendered.startswith("no offline"):
                call = await self._offline(req.role, base, req, rendered + "\n")
                return CodeResult(parsed_ok=False, reason=f"{rendered}; {NO_TEMPLATE_HINT}",
                                  rejection=Rejection.NO_TEMPLATE, call=call)
            text = _offline_answer(rendered, fmt)
            call = await self._offline(req.role, base, req, text)
        else:
            sources = [await self._get_text(a.candidate) for a in req.attempts]
            text, call = await self._ask(req.role, base, llm_agents.code_prompt(req, sources, await self._speed(req)))
        source = llm_agents.source_from(text, fmt)
        if isinstance(source, Rejected):
            return CodeResult(parsed_ok=False, reason=source.reason, rejection=Rejection.UNUSABLE, call=call)
        static = await asyncio.to_thread(static_check, source, req.task.task_desc)
        if not static.ok:
            return CodeResult(parsed_ok=False, reason="static check: " + "; ".join(static.reasons),
                              rejection=Rejection.STATIC, call=call)
        sha = hashlib.sha256(source.encode("utf-8")).hexdigest()
        same = next((r for r in req.rejected if r.sha256 == sha), None)
        if same is not None:
            who = "the offline template's candidate is" if req.llm == "offline" else "the candidate is"
            return CodeResult(parsed_ok=False, rejection=Rejection.DUPLICATE, call=call,
                              reason=f"{who} identical to the one the verifier rejected at step {same.step} "
                                     f"({same.verdict[:240]}); it is not verified again: write a different one")
        candidate = await self._put(source, PY, f"{base}-candidate.py")
        return CodeResult(parsed_ok=True, candidate=candidate, call=call, rewrite=rewrite)

    @activity.defn
    async def analyze(self, req: AnalyzeRequest) -> AnalyzeResult:
        """The conductor's routing question; a decision that is not one of the options (any case) is
        refused with the reason."""
        req = req.model_copy(update={"task": await asyncio.to_thread(self._task, req.task)})
        base = f"kernels/{req.task.task_id}/conductor-step{req.step}-a{len(req.repair)}"
        candidate = await self._get_text(req.candidate) if req.candidate is not None else ""
        text, call = await self._ask("conductor", base, llm_agents.analyze_prompt(req, candidate),
                                     schema=LLMDecision.model_json_schema())
        decision = llm_agents.validate_decision(text, req.options)
        if isinstance(decision, Rejected):
            return AnalyzeResult(reason=decision.reason, call=call)
        return AnalyzeResult(decision=decision, call=call)

    async def _ask(self, agent: str, base: str, prompt: str, *, schema: dict | None = None) -> tuple[str, AgentCall]:
        """One provider call; prompt and raw answer stored next to the call's transcript."""
        prompt_ref = await self._put(prompt, MD, f"{base}-prompt.md")
        result = await self.llm.chat(ChatRequest(messages=[Message.user(prompt)], agent=f"kernel-{agent}",
                                                 response_schema=schema))
        text = result.message.text
        output_ref = await self._put(text, MD, f"{base}-answer.md")
        return text, AgentCall(provider="openai", prompt=prompt_ref, output=output_ref, usage=result.usage,
                               latency_s=result.latency_s, transcript=result.transcript)

    async def _offline(self, agent: str, base: str, context: DesignRequest | CodeRequest, text: str) -> AgentCall:
        """The offline provider's answer, recorded exactly like an LLM answer (transcript, usage zero).
        Its "prompt" is the typed context it decided from; its answer uses the agreed format."""
        shown = to_jsonable_python(context.model_dump(exclude={"reference"}))  # every field (json mode leaves defaults out)
        prompt_ref = await self._put(json.dumps(shown, indent=2), JSON, f"{base}-context.json")
        output_ref = await self._put(text, MD, f"{base}-answer.md")
        result = await asyncio.to_thread(record_offline_answer, self.store, f"kernel-{agent}", shown, text)
        return AgentCall(provider="offline", prompt=prompt_ref, output=output_ref, usage=result.usage,
                         transcript=result.transcript)

    async def _speed(self, req: CodeRequest) -> list[str]:
        """The optimizer's feedback on the best candidate: its modeled figures and every launch's (from the stored
        breakdown); none for the coder, or without a modeled speed."""
        from activities.kernels.cost_model import feedback

        if req.role != "optimizer" or req.modeled is None:
            return []
        breakdown = json.loads(await self._get_text(req.modeled.breakdown)) if req.modeled.breakdown else None
        return feedback(req.modeled, breakdown)

    async def _put(self, text: str, media_type: str, name: str) -> ArtifactRef:
        return await asyncio.to_thread(self.store.put_bytes, text.encode("utf-8"), media_type=media_type, name=name)

    async def _get_text(self, ref: ArtifactRef) -> str:
        data = await asyncio.to_thread(self.store.get_bytes, ref)
        return data.decode("utf-8", errors="replace")

    # -- verification and the trace ------------------------------------------------------------

    @activity.defn
    def verify(self, req: VerifyRequest) -> VerifyResult:
        """Correctness first; then, on a GPU and only for a passing candidate, the profiler's speedup.
        Heartbeats go out from a side thread the whole time (activities/heartbeat.py): the children,
        loading their outputs and the comparison may each be slow on a loaded host."""
        with heartbeating("verifying") as note:
            return self._verify(req, note)

    def _verify(self, req: VerifyRequest, note: Callable[[str], None]) -> VerifyResult:
        req = req.model_copy(update={"task": self._task(req.task)})
        from activities.kernels.verifier import profile, verify

        costs: list[LaunchCost] = []
        try:
            source = self.store.get_bytes(req.candidate).decode("utf-8")
        except UnicodeDecodeError as e:
            raise FleetforgeError(Err.VERIFIER_ERROR, f"candidate {req.candidate.uri} is not UTF-8 text") from e
        limit = req.time_limit or TimeLimit.fixed(req.timeout_s)
        report = verify(req.task.task_desc, source, time_limit=limit, seed=req.seed, trials=req.trials,
                        heartbeat=note, gpu=not req.task.on_cpu, held_out=req.held_out,
                        held_out_note=req.held_out_note, reference_ops=req.reference_ops, allow_mixed=req.allow_mixed,
                        precision=req.task.precision, costs=costs,
                        compile_for=roofline_spec(req.task.arch, req.task.roofline_gpu) if req.task.on_cpu else None)
        if sandbox.mode() is SandboxMode.OFF:  # the operator's choice, said in the result and the Web UI
            report = report.model_copy(update={"confinement": sandbox.confinement_note()})
        if report.reason.startswith("reference failed"):  # the task's failure, never the candidate's verdict
            raise FleetforgeError(Err.KERNEL_TASK_INVALID, f"the reference failed in the verifier: {report.reason}"
                                  + (f" | {report.log[-600:]}" if report.log else ""))
        if req.task.on_cpu:
            modeled, why = self._modeled(req, costs) if report.passed else (None, CPU_SPEED_NOTE)
            return VerifyResult(report=report, speed=modeled.summary if modeled else why, modeled=modeled)
        if not report.passed:
            return VerifyResult(report=report)
        timing, note_text = profile(req.task.task_desc, source, timeout_s=limit.ceiling_s, seed=req.seed,
                                    heartbeat=note, precision=req.task.precision)
        return VerifyResult(report=report, speed=note_text, timing=timing)

    def _modeled(self, req: VerifyRequest, costs: list[LaunchCost]) -> tuple[ModeledSpeed | None, str]:
        """The passing candidate's modeled speed on the task's roofline GPU (its per-launch breakdown stored
        as an artifact), or why there is none."""
        from activities.kernels.cost_model import model

        reference = self._reference(req.reference)
        if reference is None:
            return None, CPU_SPEED_NOTE
        modeled = model(reference, costs, roofline_gpu(req.task.arch, req.task.roofline_gpu), req.task.precision)
        if isinstance(modeled, str):
            return None, f"{CPU_SPEED_NOTE}; {modeled}"
        ref = self.store.put_bytes(json.dumps(modeled.breakdown, indent=1).encode(), media_type=JSON,
                                   name="modeled.json")
        return modeled.speed.model_copy(update={"breakdown": ref}), ""

    @activity.defn
    def record_trace(self, req: RecordTraceRequest) -> ArtifactRef:
        """Append entries to trace.jsonl (content-addressed: returns the new ArtifactRef)."""
        previous = self.store.get_bytes(req.previous) if req.previous is not None else b""
        lines = b"".join(e.model_dump_json().encode() + b"\n" for e in req.entries)
        return self.store.put_bytes(previous + lines, media_type="application/jsonl", name="trace.jsonl")


def _offline_answer(source: str, fmt) -> str:  # noqa: ANN001 - OutputFormat
    """The offline coder's candidate in the answer format the workflow.yaml's parser reads."""
    if fmt.parser_name in CODE_PARSERS:
        return offline_coder.render_answer(source)
    return json.dumps({parsers.code_field(fmt): source}, indent=2)
