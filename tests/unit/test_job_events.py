"""`JobHandle.events()` reads a job's live events through the workflow stream client. A closed
job's last events come from a query its worker answers by replaying the history; a busy worker can
let that query expire. The events must go on from the last one read, neither lost nor repeated."""

from __future__ import annotations

from dataclasses import dataclass
from types import SimpleNamespace
from typing import Any

import pytest
from temporalio.contrib import workflow_streams
from temporalio.service import RPCError, RPCStatusCode

from client.jobs import JobHandle
from contracts.events import EventKind, JobEvent, event_line

EVENTS = [JobEvent(kind=EventKind.STEP, text=f"step {i}") for i in range(5)] + [
    JobEvent(kind=EventKind.STATUS, text="COMPLETED")]


@dataclass
class Item:
    data: JobEvent
    offset: int


class ExpiringStream:
    """A stream whose reads fail with `error` after the events at the offsets in `fail_after`."""

    def __init__(self, error: RPCError, fail_after: list[int]):
        self.error, self.fail_after, self.starts = error, list(fail_after), []

    async def subscribe(self, topics: list[str], from_offset: int, *, result_type: type) -> Any:
        self.starts.append(from_offset)
        for offset in range(from_offset, len(EVENTS)):
            yield Item(EVENTS[offset], offset)
            if self.fail_after and offset == self.fail_after[0]:
                self.fail_after.pop(0)
                raise self.error


def handle_on(stream: ExpiringStream, monkeypatch: pytest.MonkeyPatch) -> JobHandle[Any]:
    monkeypatch.setattr(workflow_streams.WorkflowStreamClient, "create", staticmethod(lambda client, wid: stream))
    context = SimpleNamespace(temporal=object())
    return JobHandle(SimpleNamespace(id="convert/20261125-000000-abcd"), dict, context)  # type: ignore[arg-type]


async def test_an_expired_read_resumes_after_the_last_event_seen(monkeypatch: pytest.MonkeyPatch) -> None:
    expired = RPCError("context deadline exceeded", RPCStatusCode.DEADLINE_EXCEEDED, b"")
    stream = ExpiringStream(expired, fail_after=[1, 4])
    seen = [e async for e in handle_on(stream, monkeypatch).events()]
    assert seen == EVENTS  # the final status included, nothing twice
    assert stream.starts == [0, 2, 5]


async def test_a_read_that_keeps_expiring_raises_in_the_end(monkeypatch: pytest.MonkeyPatch) -> None:
    expired = RPCError("context deadline exceeded", RPCStatusCode.DEADLINE_EXCEEDED, b"")
    stream = ExpiringStream(expired, fail_after=list(range(len(EVENTS))))  # every read fails after one event
    with pytest.raises(RPCError):
        _ = [e async for e in handle_on(stream, monkeypatch).events()]
    assert stream.starts == list(range(len(EVENTS)))  # each retry went on from the last event, then it gave up


async def test_a_refused_read_is_not_retried(monkeypatch: pytest.MonkeyPatch) -> None:
    denied = RPCError("permission denied", RPCStatusCode.PERMISSION_DENIED, b"")
    stream = ExpiringStream(denied, fail_after=[2])
    seen: list[JobEvent] = []
    with pytest.raises(RPCError):
        async for e in handle_on(stream, monkeypatch).events():
            seen.append(e)
    assert seen == EVENTS[:3] and stream.starts == [0]


class HandedOverStream:
    """A stream whose run keeps only the events from `base` on (a continue-as-new run's handover): a read below
    it starts at `base`, as `workflow_streams` does after its truncated-offset error."""

    def __init__(self, base: int):
        self.base = base

    async def subscribe(self, topics: list[str], from_offset: int, *, result_type: type) -> Any:
        for offset in range(max(from_offset, self.base), len(EVENTS)):
            yield Item(EVENTS[offset], offset)


async def test_a_follower_behind_the_kept_events_is_told_how_many_it_missed(monkeypatch: pytest.MonkeyPatch) -> None:
    seen = [e async for e in handle_on(HandedOverStream(base=3), monkeypatch).events()]
    assert seen[0].kind is EventKind.SKIPPED and seen[0].done == 3, seen[0]
    assert "latest 500 events" in event_line(seen[0]) and event_line(seen[0]).startswith("(3 earlier events")
    assert seen[1:] == EVENTS[3:]

    caught_up = [e async for e in handle_on(HandedOverStream(base=3), monkeypatch).events(from_offset=4)]
    assert caught_up == EVENTS[4:], "nothing was skipped for a follower that is not behind"
