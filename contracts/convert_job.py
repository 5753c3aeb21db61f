"""The convert job: its request and result, the human-input update, and the toolchain activities'
request/result models (STYLE G4: one request and one result model per call)."""

from __future__ import annotations

from datetime import datetime
from typing import Literal

from pydantic import BaseModel, Field

from contracts.common import ArtifactRef, Failure, JobStatus, TaskQueues, TokenTotals
from contracts.convert import CompiledStep, ConversionPlan, OutputKind, Precision, Toolchain
from contracts.models import ModelRef
from contracts.runs import WorkspaceRef

NEEDS_INPUT_TIMEOUT_S = 7 * 24 * 3600


class ConversionRequest(BaseModel, frozen=True):
    model: str = Field(min_length=1)
    """Local path, file://, s3:// URI, or a catalog name."""
    target_soc: str | None = None
    """e.g. "SM8550" (case-insensitive); None: the job asks (NEEDS_INPUT)."""
    precision: Precision | None = None
    """None: the job asks (NEEDS_INPUT)."""
    output: OutputKind = OutputKind.QNN_CONTEXT_BINARY
    toolchain: Toolchain = Toolchain.AUTO
    calibration: str | None = None
    """Workspace-relative calibration data (.npz); None: seeded synthetic calibration."""
    preset: Literal["fast", "balanced", "max_perf"] = "balanced"
    """How hard to try (activities/toolchains/presets.py maps it to concrete tool args)."""
    max_replans: int = Field(default=2, ge=0, le=10)
    planner_max_tool_iters: int = Field(default=8, ge=1, le=64)
    user_id: str = "local"
    run_id: str = ""
    """Readable id chosen by the client; the workflow derives one when empty."""
    queues: TaskQueues = TaskQueues()
    needs_input_timeout_s: int = Field(default=NEEDS_INPUT_TIMEOUT_S, ge=1)
    rerun_of: str | None = None
    """Run id of an earlier conversion whose plan.json is reused (the planner is skipped)."""
    overrides: dict[str, str] = Field(default_factory=dict)
    """For a rerun: step args to change, e.g. {"soc": "sm8650"}; every step having that arg gets the value."""
    llm: Literal["offline", "openai"] = "offline"
    """Who plans: the deterministic offline planner, or the LLM (ReAct loop over planner tools)."""


class ProvideInput(BaseModel, frozen=True):
    """Answers to a NEEDS_INPUT job's questions (the `provide_input` update). Omitted = unchanged."""

    soc: str | None = None
    precision: str | None = None
    calibration: str | None = None

    def is_empty(self) -> bool:
        return not any((v or "").strip() for v in (self.soc, self.precision, self.calibration))


class AttemptRecord(BaseModel, frozen=True):
    """One plan → compile → execute attempt and why it ended."""

    attempt: int
    outcome: str
    """"compile_rejected", "execution_failed", "repeated_plan" or "succeeded"."""
    feedback: str = ""


class EvaluationReport(BaseModel, frozen=True):
    """The converted model against the fp32 original on the same seeded inputs."""

    reference: str
    candidate: str
    samples: int
    max_abs: float
    mean_abs: float
    cosine: float
    candidate_provider: str
    seconds: float
    cached: bool = False
    """True when these figures were restored from the evaluation cache (same reference and candidate
    content, samples and seed) instead of running both models again."""


class ConversionProgress(BaseModel):
    """What the `status` query answers while the job runs."""

    status: JobStatus = JobStatus.RUNNING
    step: str = "starting"
    attempt: int = 0
    replans: int = 0
    questions: list[str] = Field(default_factory=list)
    last_error: str = ""
    steps_done: list[str] = Field(default_factory=list)


class ConversionResult(BaseModel):
    status: JobStatus
    run_id: str
    model: ModelRef | None = None
    workspace: WorkspaceRef | None = None
    artifacts: list[ArtifactRef] = Field(default_factory=list)
    evaluation: EvaluationReport | None = None
    questions: list[str] = Field(default_factory=list)
    failure: Failure | None = None
    attempts: list[AttemptRecord] = Field(default_factory=list)
    cached_steps: list[str] = Field(default_factory=list)
    """Step ids whose outputs came from the step cache (no tool ran)."""
    executed_steps: list[str] = Field(default_factory=list)
    """Step ids whose tool actually ran."""
    warnings: list[str] = Field(default_factory=list)
    tokens: TokenTotals = Field(default_factory=TokenTotals)
    """Every planner answer, LLM or offline (an offline answer is a call with zero tokens)."""
    transcripts: list[ArtifactRef] = Field(default_factory=list)
    """The planner answers' transcripts in the store, in order (provider "offline" or the LLM's)."""
    finished_at: datetime | None = None


# ---- toolchain activities -------------------------------------------------------------------


class PlanRequest(BaseModel, frozen=True):
    request: ConversionRequest
    """The job's request with any human answers merged in."""
    model: ModelRef
    attempt: int = 0
    feedback: str = ""
    """Why the previous attempt failed (compiler rejections, executor error)."""


class CompileRequest(BaseModel, frozen=True):
    plan: ConversionPlan
    workspace: WorkspaceRef
    attempt: int = 0


class ExecuteStepRequest(BaseModel, frozen=True):
    step: CompiledStep
    workspace: WorkspaceRef


class StepResult(BaseModel, frozen=True):
    step_id: str
    tool_name: str
    cached: bool
    cache_key: str
    outputs: dict[str, ArtifactRef]
    """Workspace-relative path → artifact of every file the step wrote."""
    seconds: float = 0.0


class RerunRequest(BaseModel, frozen=True):
    run_id: str
    overrides: dict[str, str] = Field(default_factory=dict)


class PlannerToolRequest(BaseModel, frozen=True):
    """One planner tool call (list_tools, get_tool_spec, dry_run) as the LLM made it."""

    name: str
    arguments: str = ""
    """The JSON text exactly as the model produced it."""
    workspace: WorkspaceRef


class PlannerToolResult(BaseModel, frozen=True):
    content: str
    is_error: bool = False


class EvaluateRequest(BaseModel, frozen=True):
    workspace: WorkspaceRef
    reference: str
    candidate: str
    samples: int = 4
    seed: int = 1234
