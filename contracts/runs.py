"""Runs (one record per job, stored in the artifact store) and their workspaces."""

from __future__ import annotations

from datetime import datetime

from pydantic import BaseModel, Field, JsonValue

from contracts.common import ArtifactRef, Failure, JobKind, JobStatus
from contracts.models import ModelRef

WORKSPACE_DIRS = ("input", "converted", "logs")


class WorkspaceRef(BaseModel, frozen=True):
    """A run's workspace. Its files are mirrored to the store under `runs/<run_id>/workspace.json`;
    local disk on a worker is only a cache."""

    run_id: str
    user_id: str = "local"


class RunRecord(BaseModel):
    run_id: str
    user_id: str
    kind: JobKind
    status: JobStatus
    workflow_id: str
    request: JsonValue = None
    created_at: datetime
    updated_at: datetime
    artifacts: list[ArtifactRef] = Field(default_factory=list)
    error: Failure | None = None


class CreateRunRequest(BaseModel, frozen=True):
    run_id: str
    user_id: str = "local"
    kind: JobKind
    workflow_id: str
    request: JsonValue = None
    at: datetime
    """workflow.now() at the call, so a retried activity writes the same record."""


class UpdateRunRequest(BaseModel, frozen=True):
    run_id: str
    status: JobStatus
    at: datetime
    error: Failure | None = None


class AttachArtifactsRequest(BaseModel, frozen=True):
    run_id: str
    artifacts: list[ArtifactRef]
    at: datetime


class PrepareWorkspaceRequest(BaseModel, frozen=True):
    workspace: WorkspaceRef
    model: ModelRef
    metadata: JsonValue = None
    """Extra facts for metadata.json (request, job kind)."""


class WorkspaceFiles(BaseModel, frozen=True):
    """Workspace-relative path → artifact, as mirrored to the store."""

    workspace: WorkspaceRef
    files: dict[str, ArtifactRef]
