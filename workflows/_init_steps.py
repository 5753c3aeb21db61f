"""The initialisation every model job shares (inspect, convert): resolve the model read-only,
create the run, copy the model into a fresh workspace."""

from __future__ import annotations

from dataclasses import dataclass

from temporalio import workflow

with workflow.unsafe.imports_passed_through():
    from activities.experiments import RunActivities
    from activities.modelhub import ModelHubActivities
    from contracts.common import ArtifactRef, Failure, JobKind, JobStatus, TaskQueues
    from contracts.models import ModelRef
    from contracts.runs import (
        AttachArtifactsRequest, CreateRunRequest, PrepareWorkspaceRequest, UpdateRunRequest, WorkspaceFiles,
        WorkspaceRef,
    )
    from workflows._call_options import STORAGE


def run_id_for(requested: str) -> str:
    """The client's readable id, else a deterministic one from the workflow's random source."""
    return requested or workflow.uuid4().hex[:12]


@dataclass
class RunContext:
    run_id: str
    kind: JobKind
    queues: TaskQueues

    async def resolve(self, reference: str) -> ModelRef:
        return await workflow.execute_activity_method(
            ModelHubActivities.resolve_model, reference, task_queue=self.queues.toolchain,
            summary=f"resolve model {reference}", start_to_close_timeout=STORAGE.start_to_close,
            heartbeat_timeout=STORAGE.heartbeat, retry_policy=STORAGE.retry,
        )

    async def create_run(self, user_id: str, request: object) -> None:
        await workflow.execute_activity_method(
            RunActivities.create_run,
            CreateRunRequest(run_id=self.run_id, user_id=user_id, kind=self.kind, workflow_id=workflow.info().workflow_id,
                             request=request, at=workflow.now()),
            task_queue=self.queues.toolchain, summary=f"create run {self.run_id}",
            start_to_close_timeout=STORAGE.start_to_close, retry_policy=STORAGE.retry,
        )

    async def prepare_workspace(self, workspace: WorkspaceRef, model: ModelRef, metadata: object) -> WorkspaceFiles:
        return await workflow.execute_activity_method(
            RunActivities.prepare_workspace, PrepareWorkspaceRequest(workspace=workspace, model=model, metadata=metadata),
            task_queue=self.queues.toolchain, summary=f"copy {model.filename} into input/ of run {self.run_id}",
            start_to_close_timeout=STORAGE.start_to_close, heartbeat_timeout=STORAGE.heartbeat, retry_policy=STORAGE.retry,
        )

    async def attach(self, artifacts: list[ArtifactRef]) -> None:
        await workflow.execute_activity_method(
            RunActivities.attach_artifacts, AttachArtifactsRequest(run_id=self.run_id, artifacts=artifacts, at=workflow.now()),
            task_queue=self.queues.toolchain, summary=f"attach {len(artifacts)} artifacts to run {self.run_id}",
            start_to_close_timeout=STORAGE.start_to_close, retry_policy=STORAGE.retry,
        )

    async def finish(self, status: JobStatus, failure: Failure | None = None) -> None:
        await workflow.execute_activity_method(
            RunActivities.update_run_status, UpdateRunRequest(run_id=self.run_id, status=status, error=failure, at=workflow.now()),
            task_queue=self.queues.toolchain, summary=f"mark run {self.run_id} {status.value}",
            start_to_close_timeout=STORAGE.start_to_close, retry_policy=STORAGE.retry,
        )
