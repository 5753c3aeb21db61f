"""Live events of a running job: what a follower (`fleetforge watch`, an MCP client's progress
notifications, `JobHandle.events()`) sees as it happens, carried on the job's Workflow Stream
(`temporalio.contrib.workflow_streams`). Events are for people watching: the job's result contract,
queries and history stay the record of what happened."""

from __future__ import annotations

from enum import StrEnum

from pydantic import BaseModel

EVENTS_TOPIC = "fleetforge.events"
"""The one stream topic every fleetforge event is published on (workflow and activities alike)."""


class EventKind(StrEnum):
    STEP = "step"
    """The job moved on to a new step (the same text as its current details' step)."""
    TOOL = "tool"
    """An agent called one of its tools (the converter planner's list_tools, dry_run, ...)."""
    AGENT = "agent"
    """An agent answered (who answered: the LLM, its repair, the offline fallback)."""
    TOKENS = "tokens"
    """Text an LLM has streamed so far in one call (a delta: append it to the call's earlier ones)."""
    STATUS = "status"
    """The job's status changed: NEEDS_INPUT (with the questions), COMPLETED, FAILED, CANCELLED."""
    PROGRESS = "progress"
    """Counts of a job made of many parts (a fleet's rows)."""
    SKIPPED = "skipped"
    """Not published by a job: `JobHandle.events()` says that `done` events before the next one are no longer kept
    (a job that continued as new starts with only its latest events, workflows/_events.py), so the follower
    never takes a gap for a quiet job. The record (a fleet's CSV, the job's result) still has what they said."""


class JobEvent(BaseModel, frozen=True):
    kind: EventKind
    text: str = ""
    """A step's name, a tool's name and summary, a token delta, a status value and why."""
    agent: str = ""
    """The agent it concerns (planner, designer, coder, ...); empty for the job itself."""
    call: str = ""
    """TOKENS: which LLM call the delta belongs to (the activity's id and attempt), so deltas of a
    retried call are not glued to the first attempt's."""
    done: int | None = None
    total: int | None = None


def event_line(event: JobEvent) -> str:
    """One line of text for an event (what `fleetforge watch` prints and an MCP progress message says)."""
    who = f"[{event.agent}] " if event.agent else ""
    match event.kind:
        case EventKind.STEP:
            return f"step: {event.text}"
        case EventKind.TOOL:
            return f"{who}tool {event.text}"
        case EventKind.AGENT:
            return f"{who}{event.text}"
        case EventKind.TOKENS:
            return f"{who}{event.text}"
        case EventKind.STATUS:
            return f"status: {event.text}"
        case EventKind.PROGRESS:
            return f"{event.done}/{event.total} {event.text}".strip()
        case EventKind.SKIPPED:
            return f"({event.done} earlier events are no longer kept: {event.text})"
    return event.text
