"""InspectModelWorkflow: the first real job. Resolve → create run → workspace → attach → complete."""

from __future__ import annotations

from temporalio import workflow
from temporalio.exceptions import ActivityError

with workflow.unsafe.imports_passed_through():
    from contracts.common import JobKind, JobStatus
    from contracts.inspect import InspectRequest, InspectResult
    from contracts.runs import WorkspaceRef
    from workflows import _visibility as ui
    from workflows._events import JobEvents
    from workflows._init_steps import RunContext, run_id_for
    from workflows.failures import failure_from
    from workflows.job_end import end_failed, is_cancellation, mark_cancelled


@workflow.defn
class InspectModelWorkflow:
    def __init__(self) -> None:
        self._result: InspectResult | None = None
        self._step = "starting"
        self._events = JobEvents()

    @workflow.run
    async def run(self, req: InspectRequest) -> InspectResult:
        ctx = RunContext(run_id=run_id_for(req.run_id), kind=JobKind.INSPECT, queues=req.queues)
        step = "resolve"
        try:
            self._show(step, ctx.run_id)
            model = await ctx.resolve(req.model)
            ui.set_model(model.name)
            step = "create run"
            self._show(step, ctx.run_id)
            await ctx.create_run(req.user_id, req.model_dump(mode="json"))
            step = "workspace"
            self._show(step, ctx.run_id)
            workspace = WorkspaceRef(run_id=ctx.run_id, user_id=req.user_id)
            files = await ctx.prepare_workspace(workspace, model, {"job": JobKind.INSPECT.value})
            artifacts = list(files.files.values())
            step = "attach"
            await ctx.attach(artifacts)
            await ctx.finish(JobStatus.COMPLETED)
        except ActivityError as e:
            if is_cancellation(e):
                mark_cancelled()
                raise
            failure = failure_from(e, where=step)
            self._result = InspectResult(status=JobStatus.FAILED, run_id=ctx.run_id, failure=failure, finished_at=workflow.now())
            self._show("failed", ctx.run_id, error=f"{failure.code}: {failure.message}")
            return end_failed(self._result, failure)
        self._result = InspectResult(
            status=JobStatus.COMPLETED, run_id=ctx.run_id, model=model, workspace=workspace,
            artifacts=artifacts, finished_at=workflow.now(),
        )
        ui.set_status(JobStatus.COMPLETED)
        self._show("completed", ctx.run_id)
        return self._result

    @workflow.query
    def status(self) -> InspectResult | None:
        """The result once finished; None while running (use the `step` query for progress)."""
        return self._result

    @workflow.query
    def step(self) -> str:
        return self._step

    def _show(self, step: str, run_id: str, error: str = "") -> None:
        self._step = step
        self._events.step(step)
        ui.details("inspect", {"step": step, "run": run_id, "last error": error})

