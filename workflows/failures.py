"""Turning an activity failure into a result's Failure(code, message, where). Pure; no I/O."""

from __future__ import annotations

from temporalio.exceptions import ActivityError, ApplicationError, ChildWorkflowError, FailureError

from contracts.common import Failure
from contracts.errors import Err


def failure_from(error: BaseException, where: str) -> Failure:
    """The innermost ApplicationError's type becomes the code; anything else is INTERNAL."""
    cause: BaseException | None = error
    while isinstance(cause, (ActivityError, ChildWorkflowError)) and cause.cause is not None:
        cause = cause.cause
    if isinstance(cause, ApplicationError):
        return Failure(code=cause.type or Err.INTERNAL, message=cause.message, where=where)
    if isinstance(cause, FailureError):
        return Failure(code=Err.INTERNAL, message=cause.message, where=where)
    return Failure(code=Err.INTERNAL, message=str(cause), where=where)
