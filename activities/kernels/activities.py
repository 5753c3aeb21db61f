"""Kernel activities: the agents (designer, coder/optimizer, conductor analysis), the verifier and
the trace recorder.

The agents take the typed context the workflow sent, render their jinja2 template
(llm_agents), ask the provider the request names (`offline` templates or an OpenAI-compatible
endpoint through LLMActivities.chat, the same call `complete_chat` makes), and store the prompt,
the raw answer and the parsed product in the artifact store: the workflow history carries
ArtifactRefs, token counts and short reasons only.
"""

from __future__ import annotations

import asyncio
import json

from temporalio import activity

from activities.kernels import llm_agents, offline_coder
from activities.llm.activity import LLMActivities, record_offline_answer
from activities.llm.structured import Rejected
from activities.storage import ArtifactStore
from contracts.common import ArtifactRef
from contracts.errors import Err, FleetforgeError
from contracts.kernel import LLMDecision
from contracts.kernel_job import (
    AgentCall,
    AnalyzeRequest,
    AnalyzeResult,
    CodeRequest,
    CodeResult,
    DesignRequest,
    DesignResult,
    KernelDesign,
    RecordTraceRequest,
    VerifyRequest,
    VerifyResult,
)
from contracts.messages import ChatRequest, Message
from contracts.settings import Settings

PY = "text/x-python"
JSON = "application/json"
MD = "text/markdown"
CPU_SPEED_NOTE = "speed not measurable on CPU (Triton interpreter): correctness only"


def _heartbeat(detail: str) -> None:
    if activity.in_activity():
        activity.heartbeat(detail)


class KernelActivities:
    def __init__(self, store: ArtifactStore, settings: Settings, llm: LLMActivities | None = None):
        self.store = store
        self.settings = settings
        self.llm = llm or LLMActivities(settings, store)

    # -- agents ------------------------------------------------------------------------------

    @activity.defn
    async def design(self, req: DesignRequest) -> DesignResult:
        base = f"kernels/{req.task.task_id}/designer-step{req.step}"
        if req.llm == "offline":
            parsed = offline_coder.design(req.task)
            call = await self._offline("designer", base, req, parsed.model_dump_json(indent=2))
            if parsed.family == "unknown":
                parsed = Rejected(parsed.notes)
        else:
            text, call = await self._ask("designer", base, llm_agents.design_prompt(req),
                                         schema=KernelDesign.model_json_schema())
            parsed = llm_agents.parse_design(text)
        if isinstance(parsed, Rejected):
            return DesignResult(parsed_ok=False, reason=parsed.reason, call=call)
        ref = await self._put(parsed.model_dump_json(indent=2), JSON, f"{base}-design.json")
        return DesignResult(parsed_ok=True, design=parsed, artifact=ref, call=call)

    @activity.defn
    async def code(self, req: CodeRequest) -> CodeResult:
        """The coder or the optimizer (`req.role`): one complete candidate, or an unusable answer."""
        base = f"kernels/{req.task.task_id}/{req.role}-step{req.step}-c{req.candidate_index}"
        if req.llm == "offline":
            source = offline_coder.code(req.task, req.design)
            text = offline_coder.render_answer(source) if source else f"no template for op '{req.task.op_name}'\n"
            call = await self._offline(req.role, base, req, text)
        else:
            sources = [await self._get_text(a.candidate) for a in req.attempts]
            text, call = await self._ask(req.role, base, llm_agents.code_prompt(req, sources))
        parsed = llm_agents.parse_code(text)
        if isinstance(parsed, Rejected):
            return CodeResult(parsed_ok=False, reason=parsed.reason, call=call)
        candidate = await self._put(parsed, PY, f"{base}-candidate.py")
        return CodeResult(parsed_ok=True, candidate=candidate, call=call)

    @activity.defn
    async def analyze(self, req: AnalyzeRequest) -> AnalyzeResult:
        """The conductor's routing question; an unusable answer is `decision=None` plus the reason."""
        base = f"kernels/{req.task.task_id}/conductor-step{req.step}"
        text, call = await self._ask("conductor", base, llm_agents.analyze_prompt(req),
                                     schema=LLMDecision.model_json_schema())
        parsed = llm_agents.parse_decision(text)
        if isinstance(parsed, Rejected):
            return AnalyzeResult(reason=parsed.reason, call=call)
        return AnalyzeResult(decision=parsed, call=call)

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
        prompt_ref = await self._put(context.model_dump_json(indent=2), JSON, f"{base}-context.json")
        output_ref = await self._put(text, MD, f"{base}-answer.md")
        result = await asyncio.to_thread(record_offline_answer, self.store, f"kernel-{agent}",
                                         context.model_dump(mode="json"), text)
        return AgentCall(provider="offline", prompt=prompt_ref, output=output_ref, usage=result.usage,
                         transcript=result.transcript)

    async def _put(self, text: str, media_type: str, name: str) -> ArtifactRef:
        return await asyncio.to_thread(self.store.put_bytes, text.encode("utf-8"), media_type=media_type, name=name)

    async def _get_text(self, ref: ArtifactRef) -> str:
        data = await asyncio.to_thread(self.store.get_bytes, ref)
        return data.decode("utf-8", errors="replace")

    # -- verification and the trace ------------------------------------------------------------

    @activity.defn
    def verify(self, req: VerifyRequest) -> VerifyResult:
        """Correctness first; then, on a GPU and only for a passing candidate, the profiler's speedup."""
        from activities.kernels.verifier import profile, verify

        try:
            source = self.store.get_bytes(req.candidate).decode("utf-8")
        except UnicodeDecodeError as e:
            raise FleetforgeError(Err.VERIFIER_ERROR, f"candidate {req.candidate.uri} is not UTF-8 text") from e
        report = verify(req.task.task_desc, source, timeout_s=req.timeout_s, seed=req.seed, trials=req.trials,
                        heartbeat=_heartbeat, gpu=not req.task.on_cpu)
        if req.task.on_cpu:
            return VerifyResult(report=report, speed=CPU_SPEED_NOTE)
        if not report.passed:
            return VerifyResult(report=report)
        speedup, note = profile(req.task.task_desc, source, timeout_s=req.timeout_s, seed=req.seed, heartbeat=_heartbeat)
        return VerifyResult(report=report, speed=note, speedup=speedup)

    @activity.defn
    def record_trace(self, req: RecordTraceRequest) -> ArtifactRef:
        """Append entries to trace.jsonl (content-addressed: returns the new ArtifactRef)."""
        previous = self.store.get_bytes(req.previous) if req.previous is not None else b""
        lines = b"".join(e.model_dump_json().encode() + b"\n" for e in req.entries)
        return self.store.put_bytes(previous + lines, media_type="application/jsonl", name="trace.jsonl")


def read_trace(store: ArtifactStore, ref: ArtifactRef) -> list[dict]:
    return [json.loads(line) for line in store.get_bytes(ref).decode().splitlines() if line.strip()]
