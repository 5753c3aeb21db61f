"""How every job ends, the same rule for every kind (inspect, convert, kernel, fleet-test and its
model-test rows), so Temporal's own tools tell the truth:

| verdict   | workflow execution | FleetforgeStatus | what it carries |
|---|---|---|---|
| COMPLETED | Completed          | COMPLETED        | the result contract (the return value) |
| FAILED    | Failed             | FAILED           | a non-retryable ApplicationError: type = the failure code, details[0] = the result contract |
| CANCELLED | Canceled           | CANCELLED        | nothing |

A fleet's verdict is FAILED when any tested row is No or Error (its rows' children fail the same
way), so `ExecutionStatus='Failed'`, `FleetforgeStatus='FAILED'` and the CLI's exit code 1 agree.
A row's FleetforgeStatus is left out (`_visibility.set_status`): its execution status says how it ended.
Readers get the contract back with `workflows.failures.result_from_failure` (the SDK raises
`JobFailed` carrying it; a fleet parent reads its rows' results from their failures).
"""

from __future__ import annotations

import asyncio
from typing import TypeVar

from pydantic import BaseModel
from temporalio import workflow
from temporalio.exceptions import ApplicationError, is_cancelled_exception

with workflow.unsafe.imports_passed_through():
    from contracts.common import Failure, JobStatus
    from workflows import _visibility as ui

M = TypeVar("M", bound=BaseModel)


def end_failed(result: M, failure: Failure) -> M:
    """End a job FAILED: raise the failure that fails the workflow execution (it carries `result`).
    Never returns; typed to return `M` so callers can `return end_failed(...)`."""
    ui.set_status(JobStatus.FAILED)
    raise ApplicationError(f"[{failure.code}] {failure.where}: {failure.message}", result,
                           type=failure.code, non_retryable=True)


def is_cancellation(error: BaseException) -> bool:
    """A cancellation of this job (as it reaches workflow code: directly, or as the cause of an
    activity's or child's failure); it must propagate, never be treated as a step's failure."""
    return isinstance(error, asyncio.CancelledError) or is_cancelled_exception(error)


def mark_cancelled() -> None:
    """Keep FleetforgeStatus in step before the cancellation propagates (a cancelled NEEDS_INPUT job
    must not stay listed as waiting for input)."""
    ui.set_status(JobStatus.CANCELLED)
