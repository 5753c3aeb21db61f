"""A job's live event channel, hosted by the workflow on a Workflow Stream (temporalio contrib).

Publishing from workflow code only appends to the stream's in-memory log (no command, no history
event), so a replay rebuilds the same log and old histories replay unchanged. Followers read it with
the stream's poll Update (a running job) or Query (a closed one); the LLM activity adds token deltas
by Signal (activities/llm/live.py). Construct it in the workflow's `__init__`: the stream registers
its handlers there."""

from __future__ import annotations

import dataclasses

from temporalio import workflow
from temporalio.contrib.workflow_streams import WorkflowStream, WorkflowStreamState

with workflow.unsafe.imports_passed_through():
    from contracts.events import EVENTS_TOPIC, EventKind, JobEvent


HANDOVER_EVENTS = 500
"""The latest events a continue-as-new run starts with: a follower that had not read them before the handover
(between two polls, or after a slow print) reads them from the next run. 500 is a fleet run's default rows, at
about 300 bytes each in the next run's input; a follower further behind goes on at the oldest event kept."""


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

    def handover(self) -> WorkflowStreamState:
        """What a continue-as-new run's events start from: the latest HANDOVER_EVENTS at their offsets, so a
        follower misses none of the run that ends, and the next run's input stays bounded."""
        state = self._stream.get_state()
        dropped = max(0, len(state.log) - HANDOVER_EVENTS)
        return dataclasses.replace(state, log=state.log[dropped:], base_offset=state.base_offset + dropped)

    def detach(self) -> None:
        """Before continue-as-new: release the followers' polls so they move to the next run."""
        self._stream.detach_pollers()
