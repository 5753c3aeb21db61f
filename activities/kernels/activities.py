"""Kernel activities: the designer, the coder/optimizer, the verifier and the trace recorder.

Sources and designs go to the artifact store; the workflow history carries ArtifactRefs only.
The offline provider (deterministic templates) is used on CPU CI and whenever no LLM is set.
"""

from __future__ import annotations

import json

from temporalio import activity

from activities.kernels import offline_coder
from activities.storage import ArtifactStore
from contracts.common import ArtifactRef
from contracts.errors import Err, FleetforgeError
from contracts.kernel_job import (
    CodeRequest,
    CodeResult,
    DesignRequest,
    DesignResult,
    RecordTraceRequest,
    VerifyRequest,
    VerifyResult,
)
from contracts.settings import Settings

PY = "text/x-python"
JSON = "application/json"
CPU_SPEED_NOTE = "speed not measurable on CPU (Triton interpreter): correctness only"


def _heartbeat(detail: str) -> None:
    if activity.in_activity():
        activity.heartbeat(detail)


class KernelActivities:
    def __init__(self, store: ArtifactStore, settings: Settings):
        self.store = store
        self.settings = settings

    @activity.defn
    def design(self, req: DesignRequest) -> DesignResult:
        design = offline_coder.design(req.task)
        if design.family == "unknown":
            return DesignResult(parsed_ok=False, design=design, reason=design.notes)
        ref = self.store.put_bytes(design.model_dump_json(indent=2).encode(), media_type=JSON,
                                   name=f"kernels/{req.task.task_id}/design-step{req.step}.json")
        return DesignResult(parsed_ok=True, design=design, artifact=ref)

    @activity.defn
    def code(self, req: CodeRequest) -> CodeResult:
        """Offline provider: the context is the 'prompt', the template answer is the 'output'."""
        base = f"kernels/{req.task.task_id}/{req.role}-step{req.step}"
        prompt = self.store.put_bytes(req.model_dump_json(indent=2).encode(), media_type=JSON, name=f"{base}-context.json")
        source = offline_coder.code(req.task, req.design)
        answer = offline_coder.render_answer(source) if source else f"no template for op '{req.task.op_name}'\n"
        output = self.store.put_bytes(answer.encode(), media_type="text/markdown", name=f"{base}-answer.md")
        parsed = offline_coder.parse_code_answer(answer)
        if parsed is None:
            return CodeResult(parsed_ok=False, prompt=prompt, output=output,
                              reason="answer has no fenced python block with a candidate")
        candidate = self.store.put_bytes(parsed.encode(), media_type=PY, name=f"{base}-candidate.py")
        return CodeResult(parsed_ok=True, candidate=candidate, prompt=prompt, output=output)

    @activity.defn
    def verify(self, req: VerifyRequest) -> VerifyResult:
        from activities.kernels.verifier import verify

        try:
            source = self.store.get_bytes(req.candidate).decode("utf-8")
        except UnicodeDecodeError as e:
            raise FleetforgeError(Err.VERIFIER_ERROR, f"candidate {req.candidate.uri} is not UTF-8 text") from e
        report = verify(req.task.task_desc, source, timeout_s=req.timeout_s, seed=req.seed, trials=req.trials,
                        heartbeat=_heartbeat, gpu=req.task.arch != "cpu")
        return VerifyResult(report=report, speed=CPU_SPEED_NOTE if req.task.arch == "cpu" else "")

    @activity.defn
    def record_trace(self, req: RecordTraceRequest) -> ArtifactRef:
        """Append entries to trace.jsonl (content-addressed: returns the new ArtifactRef)."""
        previous = self.store.get_bytes(req.previous) if req.previous is not None else b""
        lines = b"".join(e.model_dump_json().encode() + b"\n" for e in req.entries)
        return self.store.put_bytes(previous + lines, media_type="application/jsonl", name="trace.jsonl")


def read_trace(store: ArtifactStore, ref: ArtifactRef) -> list[dict]:
    return [json.loads(line) for line in store.get_bytes(ref).decode().splitlines() if line.strip()]
