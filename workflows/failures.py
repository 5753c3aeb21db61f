"""Failures as values (pure; no I/O): an activity/child failure as a result's Failure(code, message,
where), and a failed job's result contract read back from its workflow failure."""

from __future__ import annotations

from typing import TypeVar

from pydantic import BaseModel, ValidationError
from temporalio.exceptions import ActivityError, ApplicationError, ChildWorkflowError, FailureError

from contracts.common import Failure
from contracts.errors import Err

M = TypeVar("M", bound=BaseModel)


CODES = frozenset(Err)


def failure_from(error: BaseException, where: str) -> Failure:
    """The innermost ApplicationError's type becomes the code when it is one of ours (contracts.errors.Err);
    anything else is INTERNAL. An exception no activity classified reaches us as an ApplicationError typed with its
    class name (`OSError`): INTERNAL too, the class kept in the message, so the failure still says whose it is and
    what to do (REMEDY[INTERNAL])."""
    cause: BaseException | None = error
    while isinstance(cause, (ActivityError, ChildWorkflowError)) and cause.cause is not None:
        cause = cause.cause
    if isinstance(cause, ApplicationError):
        if cause.type in CODES:
            return Failure(code=cause.type, message=cause.message, where=where)
        message = f"{cause.type}: {cause.message}" if cause.type else cause.message
        return Failure(code=Err.INTERNAL, message=message, where=where)
    if isinstance(cause, FailureError):
        return Failure(code=Err.INTERNAL, message=cause.message, where=where)
    return Failure(code=Err.INTERNAL, message=str(cause), where=where)


def result_from_failure(error: BaseException, result_type: type[M]) -> M | None:
    """The result contract a FAILED job carries in its workflow failure (workflows/job_end.py):
    details[0] of the innermost ApplicationError, validated as `result_type`. Works on a client's
    WorkflowFailureError and on a parent's ChildWorkflowError alike; None when there is none (a
    crash, a cancellation, a job from before failures carried their result)."""
    cause: BaseException | None = error
    while cause is not None and not isinstance(cause, ApplicationError):
        cause = getattr(cause, "cause", None)
    if cause is None or not cause.details:
        return None
    detail = cause.details[0]
    try:
        return result_type.model_validate(detail if isinstance(detail, (dict, BaseModel)) else {})
    except ValidationError:
        return None
