"""Vocabulary every job shares: job kinds and states, artifact references, failures, queues."""

from __future__ import annotations

from enum import StrEnum

from pydantic import BaseModel, Field


class JobKind(StrEnum):
    INSPECT = "inspect"
    CONVERT = "convert"
    KERNEL = "kernel"
    FLEET_TEST = "fleet-test"
    MODEL_TEST = "model-test"


class JobStatus(StrEnum):
    RUNNING = "RUNNING"
    NEEDS_INPUT = "NEEDS_INPUT"
    AWAITING_APPROVAL = "AWAITING_APPROVAL"
    COMPLETED = "COMPLETED"
    FAILED = "FAILED"
    CANCELLED = "CANCELLED"
    """Cancelled (or terminated) before it reached a verdict; the workflow execution is Canceled."""


TERMINAL = frozenset({JobStatus.COMPLETED, JobStatus.FAILED, JobStatus.CANCELLED})
"""States a job never leaves. NEEDS_INPUT is not terminal: the workflow waits for an answer.

How each one looks in Temporal (workflows/job_end.py): COMPLETED = a Completed execution whose
result is the job's result contract; FAILED = a Failed execution whose failure is a non-retryable
ApplicationError (type = the failure code, details[0] = the result contract); CANCELLED = a
Canceled execution. FleetforgeStatus says the same (a fleet's rows carry it only while they wait for
approval: workflows/_visibility.set_status)."""


class ArtifactRef(BaseModel, frozen=True):
    """A content-addressed object in the artifact store. Workflow history carries only these."""

    uri: str
    sha256: str = Field(pattern=r"^[0-9a-f]{64}$")
    size: int = Field(ge=0)
    media_type: str = "application/octet-stream"
    name: str = ""
    """Human name (usually the workspace-relative path); not part of the identity."""


class Failure(BaseModel, frozen=True):
    """Why a job failed: a stable `code` (see contracts.errors.Err), a message, and the step."""

    code: str
    message: str
    where: str
    hint: str = ""
    """What to do about it, for this job (a conversion's hint fits its code and precision); empty: the
    code's general remedy (contracts.errors.REMEDY)."""


class TaskQueues(BaseModel, frozen=True):
    """Where each kind of work runs. Requests carry them so workflows never read settings."""

    workflows: str = "fleetforge-workflows"
    llm: str = "fleetforge-llm"
    toolchain: str = "fleetforge-toolchain"
    kernels: str = "fleetforge-kernels"
    containers: str = "fleetforge-containers"

    @classmethod
    def single(cls, name: str) -> "TaskQueues":
        """Every kind of work on one queue (tests, one-process deployments)."""
        return cls(workflows=name, llm=name, toolchain=name, kernels=name, containers=name)

    def all(self) -> list[str]:
        return sorted({self.workflows, self.llm, self.toolchain, self.kernels, self.containers})


class TokenTotals(BaseModel):
    """LLM cost of a job: summed token usage and latency of its calls."""

    calls: int = 0
    prompt_tokens: int = 0
    completion_tokens: int = 0
    total_tokens: int = 0
    latency_s: float = 0.0
    unreported_calls: int = 0
    """LLM calls whose server sent no usage: the token counts above leave them out (unknown, not zero)."""

    def __add__(self, other: "TokenTotals") -> "TokenTotals":
        return TokenTotals(calls=self.calls + other.calls, prompt_tokens=self.prompt_tokens + other.prompt_tokens,
                           completion_tokens=self.completion_tokens + other.completion_tokens,
                           total_tokens=self.total_tokens + other.total_tokens,
                           latency_s=round(self.latency_s + other.latency_s, 3),
                           unreported_calls=self.unreported_calls + other.unreported_calls)
