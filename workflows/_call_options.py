"""Timeouts, heartbeats and retry policy for each kind of activity, named once (STYLE G7)."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import timedelta

from temporalio.common import RetryPolicy

from contracts.errors import Err


@dataclass(frozen=True)
class CallOptions:
    start_to_close: timedelta
    heartbeat: timedelta | None
    retry: RetryPolicy


_NON_RETRYABLE_INPUT = [
    Err.BAD_INPUT, Err.MODEL_NOT_FOUND, Err.MODEL_INVALID, Err.CATALOG_INVALID, Err.PATH_ESCAPE,
    Err.STORE_URL_INVALID, Err.INTEGRITY_ERROR,
]

STORAGE = CallOptions(
    start_to_close=timedelta(minutes=30), heartbeat=timedelta(seconds=60),
    retry=RetryPolicy(maximum_attempts=5, non_retryable_error_types=[str(e) for e in _NON_RETRYABLE_INPUT]),
)
"""Runs, workspaces, model resolution: cheap, idempotent, retried a few times."""

LLM = CallOptions(
    start_to_close=timedelta(minutes=10), heartbeat=timedelta(seconds=30),
    retry=RetryPolicy(
        initial_interval=timedelta(seconds=1), maximum_attempts=6,
        non_retryable_error_types=[Err.LLM_BAD_REQUEST, Err.LLM_AUTH, Err.LLM_OUTPUT_INVALID, Err.LLM_UNAVAILABLE,
                                   Err.LLM_CONTEXT_LENGTH, Err.LLM_QUOTA, Err.LLM_RATE_LIMITED],
    ),
)

TOOLCHAIN = CallOptions(
    start_to_close=timedelta(hours=2), heartbeat=timedelta(seconds=10),  # a side thread beats every 2 s: a dead worker is noticed in 10 s
    retry=RetryPolicy(maximum_attempts=3, non_retryable_error_types=[Err.EXECUTOR_ERROR, Err.COMPILER_ERROR, Err.PATH_ESCAPE, Err.TOOLCHAIN_UNAVAILABLE]),
)

KERNEL = CallOptions(
    start_to_close=timedelta(minutes=15), heartbeat=timedelta(seconds=10),  # a side thread beats every 2 s (activities/heartbeat.py): a dead worker is noticed in 10 s
    retry=RetryPolicy(maximum_attempts=3, non_retryable_error_types=[Err.VERIFIER_ERROR, Err.KERNEL_TASK_INVALID]),
)



def verify_start_to_close(ceiling_s: float) -> timedelta:
    """A verification's bound: the reference and the candidate side by side, the reference again alone
    when both failed, then the GPU profiler, each up to the time limit's ceiling. A slow candidate is
    stopped by the verifier's own limit (a verdict) long before this."""
    return max(KERNEL.start_to_close, timedelta(seconds=3 * ceiling_s + 300))


CONTAINER = CallOptions(
    # runners beat every 2 s: a dead worker is noticed, and a cancellation delivered, within 10 s
    start_to_close=timedelta(hours=1), heartbeat=timedelta(seconds=10),
    retry=RetryPolicy(maximum_attempts=3, non_retryable_error_types=[Err.POLICY_REJECTED, Err.RUNNER_UNAVAILABLE]),
)

LOCAL = CallOptions(
    start_to_close=timedelta(seconds=30), heartbeat=None,
    retry=RetryPolicy(maximum_attempts=5, non_retryable_error_types=[str(e) for e in _NON_RETRYABLE_INPUT]),
)
"""Local activities: quick bookkeeping on the workflow's own worker (a fleet row's write/check/classify)."""
