"""Worker interceptor: binds log context for every activity and turns FleetforgeError into an
ApplicationError with a stable type, so library code never needs to import temporalio."""

from __future__ import annotations

from typing import Any

import structlog
from temporalio import activity
from temporalio.exceptions import ApplicationError, ApplicationErrorCategory
from temporalio.worker import ActivityInboundInterceptor, ExecuteActivityInput, Interceptor

from contracts.errors import Err, FleetforgeError

log = structlog.get_logger("fleetforge.activity")


class _ActivityInbound(ActivityInboundInterceptor):
    async def execute_activity(self, input: ExecuteActivityInput) -> Any:
        info = activity.info()
        ctx = dict(
            workflow_id=info.workflow_id, run_id=info.workflow_run_id,
            activity=info.activity_type, attempt=info.attempt,
        )
        # Sync activities run in a thread pool: contextvars are copied into the thread by the SDK.
        with structlog.contextvars.bound_contextvars(**ctx):
            try:
                return await self.next.execute_activity(input)
            except FleetforgeError as e:
                expected = not e.retryable and e.code is not Err.INTERNAL
                if expected:  # a classified verdict (unsupported op, bad model, ...): one line, no traceback
                    log.info("activity failed", code=e.code.value, message=e.message)
                raise ApplicationError(e.message, type=str(e.code), non_retryable=not e.retryable,
                                       category=ApplicationErrorCategory.BENIGN if expected
                                       else ApplicationErrorCategory.UNSPECIFIED) from e


class FleetforgeInterceptor(Interceptor):
    def intercept_activity(self, next: ActivityInboundInterceptor) -> ActivityInboundInterceptor:
        return _ActivityInbound(next)
