"""Heartbeats of blocking activities come from a side thread: they flow while the activity's thread
is busy and never calls anything, carry the latest note, and survive a beat the SDK could not take."""

from __future__ import annotations

import threading
import time
from datetime import timedelta

import pytest
from temporalio.testing import ActivityEnvironment

from activities.heartbeat import BEAT_EVERY_S, beat_interval, heartbeating


def busy(seconds: float) -> int:
    """Pure-Python CPU work that never yields on purpose (the GIL is only switched by the interpreter)."""
    n, end = 0, time.monotonic() + seconds
    while time.monotonic() < end:
        n += 1
    return n


def test_beats_flow_while_the_activity_thread_computes_and_carry_the_latest_note():
    beats: list[tuple] = []
    env = ActivityEnvironment()
    env.on_heartbeat = lambda *details: beats.append(details)

    def activity_body() -> None:
        with heartbeating("loading", every_s=0.05) as note:
            busy(0.6)
            note("comparing")
            busy(0.6)

    env.run(activity_body)
    assert beats[0] == ("loading",), "the first beat goes out at once"
    assert len(beats) >= 6, f"only {len(beats)} beats in 1.2 s of CPU work"
    assert ("comparing",) in beats and beats[-1] == ("comparing",)


def test_a_beat_the_event_loop_could_not_take_does_not_stop_the_beats():
    calls: list[tuple] = []
    enough = threading.Event()
    env = ActivityEnvironment()

    def on_heartbeat(*details: object) -> None:
        calls.append(details)
        if len(calls) == 1:
            raise TimeoutError()  # what the SDK raises when its event loop took > 10 s
        if len(calls) >= 3:
            enough.set()

    env.on_heartbeat = on_heartbeat

    def activity_body() -> bool:
        with heartbeating("step", every_s=0.01):
            return enough.wait(10)

    assert env.run(activity_body) is True


def test_outside_an_activity_nothing_is_sent_and_notes_still_work():
    with heartbeating("x") as note:
        note("y")
    assert note.text == "y"


@pytest.mark.parametrize("timeout, interval", [
    (None, BEAT_EVERY_S), (timedelta(seconds=10), 2.0), (timedelta(seconds=60), BEAT_EVERY_S),
    (timedelta(seconds=1), 0.2), (timedelta(milliseconds=10), 0.05),
])
def test_beat_interval_is_a_fifth_of_the_timeout_at_most_two_seconds(timeout, interval):
    assert beat_interval(timeout) == pytest.approx(interval)
