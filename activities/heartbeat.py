"""Heartbeats for blocking (sync) activities, sent from a thread that does nothing else.

A sync activity's own thread is busy for long stretches (waiting on its child processes, loading
their outputs, comparing), and slower still on a loaded host: a heartbeat sent from that thread is
late exactly when the host is busiest, and the server then fails a live attempt with "activity
Heartbeat timeout". The beat thread only waits on an event and hands the latest note to the SDK, which
forwards it through the worker's event loop (so that loop must stay free of CPU work too: the async
activities move theirs to threads). A beat the loop cannot take within the SDK's 10 s is dropped and
the next one tries again; the beat thread never dies of it.

Beats say the worker is alive, not that the work moves: a hung activity thread keeps beating, so every
child an activity waits on has its own timeout and start_to_close bounds the rest. Cancellation still
reaches the activity's own thread (the SDK raises it there when a heartbeat's answer carries it).
"""

from __future__ import annotations

import contextlib
import contextvars
import threading
from collections.abc import Iterator
from datetime import timedelta

from temporalio import activity

BEAT_EVERY_S = 2.0
"""The longest pause between beats; shorter when the activity's heartbeat timeout is under 10 s."""


def beat_interval(heartbeat_timeout: timedelta | None) -> float:
    """A fifth of the heartbeat timeout, at most BEAT_EVERY_S (pure)."""
    if heartbeat_timeout is None:
        return BEAT_EVERY_S
    return max(0.05, min(BEAT_EVERY_S, heartbeat_timeout.total_seconds() / 5))


class Note:
    """What the work says it is doing; `note(text)` only records it (never blocks, any thread)."""

    def __init__(self, text: str):
        self.text = text

    def __call__(self, text: str) -> None:
        self.text = text


@contextlib.contextmanager
def heartbeating(what: str, every_s: float | None = None) -> Iterator[Note]:
    """Beat from a side thread for the duration of the block, with the latest note as the detail.
    Outside an activity (tests, benchmarks calling the functions directly) nothing is sent."""
    note = Note(what)
    if not activity.in_activity():
        yield note
        return
    interval = every_s if every_s is not None else beat_interval(activity.info().heartbeat_timeout)
    stop = threading.Event()
    ctx = contextvars.copy_context()

    def beat() -> None:
        while True:
            try:
                ctx.run(activity.heartbeat, note.text)
            except TimeoutError:  # the event loop did not take it within the SDK's 10 s: the next beat retries
                pass
            if stop.wait(interval):
                return

    thread = threading.Thread(target=beat, name=f"heartbeat-{what[:40]}", daemon=True)
    thread.start()
    try:
        yield note
    finally:
        stop.set()
        thread.join()
