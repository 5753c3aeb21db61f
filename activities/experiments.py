"""Runs and workspaces as activities. Every write is idempotent: a retry after a crash writes the
same record (timestamps come from the workflow) and never duplicates an artifact."""

from __future__ import annotations

from temporalio import activity

from activities.sandbox import safe_join
from activities.storage import ArtifactStore
from activities.workspace import Workspace
from contracts.common import ArtifactRef, JobStatus
from contracts.errors import Err, FleetforgeError
from contracts.runs import (
    AttachArtifactsRequest, CreateRunRequest, PrepareWorkspaceRequest, RunRecord, UpdateRunRequest,
    WorkspaceFiles, WorkspaceRef,
)
from contracts.settings import Settings


def run_key(run_id: str) -> str:
    return f"runs/{run_id}/run.json"


class RunStore:
    """Run records in the artifact store (plain library; the activities below wrap it)."""

    def __init__(self, store: ArtifactStore):
        self.store = store

    def get(self, run_id: str) -> RunRecord:
        raw = self.store.get_doc(run_key(run_id))
        if raw is None:
            raise FleetforgeError(Err.RUN_NOT_FOUND, f"no run {run_id!r} in {self.store.url}")
        return RunRecord.model_validate_json(raw)

    def put(self, record: RunRecord) -> RunRecord:
        self.store.put_doc(run_key(record.run_id), record.model_dump_json(indent=1).encode())
        return record

    def list(self) -> list[RunRecord]:
        keys = [k for k in self.store.list_docs("runs/") if k.endswith("/run.json")]
        return [self.get(k.split("/")[1]) for k in keys]


def add_artifacts(existing: list[ArtifactRef], new: list[ArtifactRef]) -> list[ArtifactRef]:
    """Union by (name, sha256), keeping order: attaching the same artifact twice is a no-op."""
    seen = {(a.name, a.sha256) for a in existing}
    out = list(existing)
    for a in new:
        if (a.name, a.sha256) not in seen:
            seen.add((a.name, a.sha256))
            out.append(a)
    return out


class RunActivities:
    def __init__(self, store: ArtifactStore, settings: Settings):
        self.runs = RunStore(store)
        self.store = store
        self.settings = settings

    def workspace(self, ref: WorkspaceRef) -> Workspace:
        return Workspace(self.store, self.settings.cache_dir, ref)

    @activity.defn
    def create_run(self, req: CreateRunRequest) -> RunRecord:
        try:
            return self.runs.get(req.run_id)
        except FleetforgeError as e:
            if e.code is not Err.RUN_NOT_FOUND:
                raise
        return self.runs.put(RunRecord(
            run_id=req.run_id, user_id=req.user_id, kind=req.kind, status=JobStatus.RUNNING,
            workflow_id=req.workflow_id, request=req.request, created_at=req.at, updated_at=req.at,
        ))

    @activity.defn
    def update_run_status(self, req: UpdateRunRequest) -> RunRecord:
        record = self.runs.get(req.run_id)
        record.status, record.error, record.updated_at = req.status, req.error, req.at
        return self.runs.put(record)

    @activity.defn
    def attach_artifacts(self, req: AttachArtifactsRequest) -> RunRecord:
        record = self.runs.get(req.run_id)
        record.artifacts = add_artifacts(record.artifacts, req.artifacts)
        record.updated_at = req.at
        return self.runs.put(record)

    @activity.defn
    def prepare_workspace(self, req: PrepareWorkspaceRequest) -> WorkspaceFiles:
        """Create the layout, copy the model into input/, write metadata.json, mirror to the store."""
        ws = self.workspace(req.workspace)
        ws.materialize()
        self.store.get_file(req.model.artifact, ws.path(f"input/{req.model.filename}"))
        for sidecar in req.model.sidecars:  # an ONNX model's external data, beside it as the model names it
            self.store.get_file(sidecar, safe_join(ws.path("input"), sidecar.name))
        ws.write_json("metadata.json", {
            "run_id": req.workspace.run_id, "user_id": req.workspace.user_id,
            "model": req.model.model_dump(mode="json"), "input": f"input/{req.model.filename}",
            "job": req.metadata,
        })
        return WorkspaceFiles(workspace=req.workspace, files=ws.push())
