"""The kernel job: its request and result, and the kernel activities' request/result models
(STYLE G4). The task, workflow.yaml model and routing decisions live in contracts.kernel."""

from __future__ import annotations

from datetime import datetime
from enum import StrEnum
from typing import Literal

from pydantic import BaseModel, Field

from contracts.common import ArtifactRef, Failure, JobStatus, TaskQueues, TokenTotals
from contracts.kernel import ConductorConfig, FinishReason, KernelTask, LLMDecision, StaticReport
from contracts.messages import TokenUsage

Provider = Literal["offline", "openai"]
"""Who answers the LLM agents (designer, coder, optimizer, conductor analysis)."""


class Mismatch(BaseModel, frozen=True):
    trial: int
    output: int
    """Which output tensor of the forward (0 for a single tensor)."""
    index: list[int]
    expected: float | str
    got: float | str
    """Non-finite values as "nan"/"inf"/"-inf" (JSON has no NaN)."""


class VerifierReport(BaseModel, frozen=True):
    passed: bool
    reason: str
    """Empty when passed; otherwise one line a coder can act on."""
    mismatches: list[Mismatch] = Field(default_factory=list)
    """The first 10 differing elements."""
    static: StaticReport
    durations: dict[str, float] = Field(default_factory=dict)
    """Seconds per phase: static, reference, candidate, compare."""


class KernelDesign(BaseModel, frozen=True):
    """The designer's small structured plan for the coder."""

    family: str
    """elementwise, row_softmax, row_log_softmax, row_sum, rmsnorm, matmul, unknown."""
    block_sizes: dict[str, int] = Field(default_factory=dict)
    grid: str = ""
    tiling: str = ""
    notes: str = ""


class AgentCall(BaseModel, frozen=True):
    """How one agent activity ran, for the trace: the rendered prompt and the raw answer live in the
    artifact store (history carries refs), plus the provider's token usage."""

    provider: Provider = "offline"
    prompt: ArtifactRef | None = None
    output: ArtifactRef | None = None
    usage: TokenUsage = Field(default_factory=TokenUsage)
    latency_s: float = 0.0
    transcript: ArtifactRef | None = None
    """The call's transcript (request and normalised answer), the same shape for every provider."""


class DesignRequest(BaseModel, frozen=True):
    task: KernelTask
    suggestion: str = ""
    step: int = 1
    llm: Provider = "offline"


class DesignResult(BaseModel, frozen=True):
    parsed_ok: bool
    design: KernelDesign | None = None
    artifact: ArtifactRef | None = None
    reason: str = ""
    """Why the answer was unusable (empty when parsed)."""
    call: AgentCall = Field(default_factory=AgentCall)


class Attempt(BaseModel, frozen=True):
    """An earlier candidate and what the verifier said about it (the coder's bounded history)."""

    step: int
    candidate: ArtifactRef
    verdict: str


class CodeRequest(BaseModel, frozen=True):
    """The coder's (or optimizer's) context: the workflow sends this, never a prompt string."""

    task: KernelTask
    role: str = "coder"
    design: KernelDesign | None = None
    feedback: str = ""
    """The last verifier report's reason, when it failed."""
    mismatches: list[Mismatch] = Field(default_factory=list)
    """The last verifier report's first mismatches (index, expected, got)."""
    attempts: list[Attempt] = Field(default_factory=list)
    """The last few candidates (refs; the activity loads their sources), oldest first."""
    suggestion: str = ""
    step: int = 1
    candidate_index: int = 0
    """Which of the round's `num_candidates` parallel attempts this is."""
    llm: Provider = "offline"


class CodeResult(BaseModel, frozen=True):
    parsed_ok: bool
    candidate: ArtifactRef | None = None
    """The candidate source (text/x-python)."""
    reason: str = ""
    call: AgentCall = Field(default_factory=AgentCall)


class AnalyzeRequest(BaseModel, frozen=True):
    """The conductor's routing question (analyze.j2): which of `options` runs after `agent`."""

    task: KernelTask
    agent: str
    options: list[str]
    step: int
    last_result: str = ""
    """One line: what the last agent produced (e.g. the verifier's reason)."""
    recent: list[str] = Field(default_factory=list)
    """The last few trace lines ("step 3 verifier: FAILED: ..."), oldest first."""
    llm: Provider = "openai"


class AnalyzeResult(BaseModel, frozen=True):
    decision: LLMDecision | None = None
    """None when the answer was unusable; the workflow then applies the deterministic fallback."""
    reason: str = ""
    call: AgentCall = Field(default_factory=AgentCall)


class VerifyRequest(BaseModel, frozen=True):
    task: KernelTask
    candidate: ArtifactRef
    timeout_s: float = Field(default=120.0, gt=0)
    seed: int = 0
    trials: int = Field(default=5, ge=1, le=50)


class VerifyResult(BaseModel, frozen=True):
    report: VerifierReport
    speed: str = ""
    """Profiler note (on CPU: speed is not measurable)."""
    speedup: float | None = None
    """Reference time / candidate time (medians), only when measured on a GPU."""


class TraceEntry(BaseModel, frozen=True):
    """One agent execution. Large text (prompt, raw answer, candidate) is referenced, not inlined."""

    step: int
    agent: str
    summary: str
    ok: bool
    artifact: ArtifactRef | None = None
    """The agent's product: design JSON or candidate source (the verified one for the verifier)."""
    fallback: bool = False
    """True when the conductor's LLM decision was unusable and a deterministic rule routed here."""
    routing: str = ""
    """How this agent was chosen: config, llm, or fallback (with the reason)."""
    provider: Provider | None = None
    prompt: ArtifactRef | None = None
    output: ArtifactRef | None = None
    transcript: ArtifactRef | None = None
    """The agent call's transcript (the same shape for the offline provider and an LLM)."""
    parse_error: str = ""
    candidates: list[ArtifactRef] = Field(default_factory=list)
    """Every candidate of a parallel round (coder) or verified in this step (verifier)."""
    report: VerifierReport | None = None
    speed: str = ""
    started_at: datetime | None = None
    duration_s: float = 0.0
    tokens: TokenUsage = Field(default_factory=TokenUsage)
    """This agent's LLM usage plus the routing analysis that chose it."""


class RecordTraceRequest(BaseModel, frozen=True):
    previous: ArtifactRef | None = None
    """The trace.jsonl so far; the new entries are appended to it."""
    entries: list[TraceEntry]


class KernelOutcome(StrEnum):
    VERIFIED = "VERIFIED"
    FAILED = "FAILED"
    MAX_STEPS = "MAX_STEPS"


class KernelRequest(BaseModel, frozen=True):
    task: KernelTask
    config: ConductorConfig
    """Validated at the edge (client or test) from the task's workflow.yaml."""
    queues: TaskQueues = TaskQueues()
    verify_timeout_s: float = Field(default=120.0, gt=0)
    llm: Provider = "offline"
    """Filled from the settings by the client SDK; offline is the default and the fallback."""


class KernelResult(BaseModel):
    outcome: KernelOutcome
    status: JobStatus
    finish_reason: FinishReason | None = None
    best_candidate: ArtifactRef | None = None
    report: VerifierReport | None = None
    steps: int = 0
    trace: list[TraceEntry] = Field(default_factory=list)
    trace_artifact: ArtifactRef | None = None
    failure: Failure | None = None
    tokens: TokenTotals = Field(default_factory=TokenTotals)
    """Every agent answer (LLM and offline) and the routing analyses: calls, tokens, LLM latency."""
    speedup: float | None = None
    """Only when measured (GPU); on CPU see `speed`."""
    speed: str = ""
