"""The kernel job: its request and result, and the kernel activities' request/result models
(STYLE G4). The task, workflow.yaml model and routing decisions live in contracts.kernel."""

from __future__ import annotations

from enum import StrEnum

from pydantic import BaseModel, Field

from contracts.common import ArtifactRef, Failure, JobStatus, TaskQueues
from contracts.kernel import ConductorConfig, FinishReason, KernelTask, StaticReport


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


class DesignRequest(BaseModel, frozen=True):
    task: KernelTask
    suggestion: str = ""
    step: int = 1


class DesignResult(BaseModel, frozen=True):
    parsed_ok: bool
    design: KernelDesign | None = None
    artifact: ArtifactRef | None = None
    reason: str = ""


class CodeRequest(BaseModel, frozen=True):
    """The coder's (or optimizer's) context: the workflow sends this, never a prompt string."""

    task: KernelTask
    role: str = "coder"
    design: KernelDesign | None = None
    feedback: str = ""
    """The last verifier report's reason, when it failed."""
    suggestion: str = ""
    step: int = 1


class CodeResult(BaseModel, frozen=True):
    parsed_ok: bool
    candidate: ArtifactRef | None = None
    """The candidate source (text/x-python)."""
    prompt: ArtifactRef | None = None
    output: ArtifactRef | None = None
    provider: str = "offline"
    reason: str = ""


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


class TraceEntry(BaseModel, frozen=True):
    step: int
    agent: str
    summary: str
    ok: bool
    artifact: ArtifactRef | None = None
    fallback: bool = False


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
