"""A job's live event channel, hosted by the workflow on a Workflow Stream (temporalio contrib).

Publishing from workflow code only appends to the stream's in-memory log (no command, no history
event), so a replay rebuilds the same log and old histories replay unchanged. Followers read it with
the stream's poll Update (a running job) or Query (a closed one); the LLM activity adds token deltas
by Signal (activities/llm/live.py). Construct it in the workflow's `__init__`: the stream registers
its handlers there."""

from __future__ import annotations

from temporalio import workflow
from temporalio.contrib.workflow_streams import WorkflowStream, WorkflowStreamState

with workflow.unsafe.imports_passed_through():
    from contracts.events import EVENTS_TOPIC, EventKind, JobEvent


class JobEvents:
    def __init__(self, prior: WorkflowStreamState | None = None) -> None:
        # the stream checks that its caller is named __init__: build JobEvents in the workflow's __init__
        self._stream = WorkflowStream(prior)
        self._topic = self._stream.topic(EVENTS_TOPIC, type=JobEvent)
        self._last_step = ""

    def step(self, text: str) -> None:
        """A step change (repeats of the current step are not published again)."""
        if text and text != self._last_step:
            self._last_step = text
            self.publish(JobEvent(kind=EventKind.STEP, text=text))

    def publish(self, event: JobEvent) -> None:
        self._topic.publish(event)

    def status(self, status: str, text: str = "") -> None:
        self.publish(JobEvent(kind=EventKind.STATUS, text=f"{status}: {text}" if text else status))

    def next_offset(self) -> int:
        """Where a continue-as-new run's events go on (its log starts empty: history stays small, and a
        follower that lags behind the handover reads the new run from its start)."""
        state = self._stream.get_state()
        return state.base_offset + len(state.log)

    def detach(self) -> None:
        """Before continue-as-new: release the followers' polls so they move to the next run."""
        self._stream.detach_pollers()


def resumed_stream(offset: int) -> WorkflowStreamState | None:
    """The stream state a continue-as-new run starts from: an empty log at `offset`."""
    return WorkflowStreamState(base_offset=offset) if offset else None
