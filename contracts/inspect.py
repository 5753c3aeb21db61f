"""The inspect job: resolve a model, record it in a run, and keep its workspace."""

from __future__ import annotations

from datetime import datetime

from pydantic import BaseModel, Field

from contracts.common import ArtifactRef, Failure, JobStatus, TaskQueues
from contracts.models import ModelRef
from contracts.runs import WorkspaceRef


class InspectRequest(BaseModel, frozen=True):
    model: str = Field(min_length=1)
    """upload:// reference (a local model the SDK uploaded), s3:// URI, catalog name, or a path on the workers' disk."""
    user_id: str = "local"
    run_id: str = ""
    """Readable id chosen by the client; the workflow derives one when empty."""
    queues: TaskQueues = TaskQueues()


class InspectResult(BaseModel):
    status: JobStatus
    run_id: str
    model: ModelRef | None = None
    workspace: WorkspaceRef | None = None
    artifacts: list[ArtifactRef] = Field(default_factory=list)
    failure: Failure | None = None
    finished_at: datetime | None = None
