"""`fleetforge dev`'s decisions without processes: when to restart a dead worker, and what joining
a running Temporal server means."""

from __future__ import annotations

import pytest

from client.dev import RestartPolicy, join_verdict
from contracts.errors import Err, FleetforgeError


def test_a_dead_worker_is_restarted_with_a_growing_backoff_then_given_up_on():
    policy = RestartPolicy(max_crashes=4, window_s=60, first_delay_s=0.5, max_delay_s=3)
    crashes: list[float] = []
    delays = []
    for now in (100.0, 101.0, 102.0):
        crashes.append(now)
        delays.append(policy.after_crash(crashes, now))
    assert delays == [0.5, 1.0, 2.0]
    crashes.append(103.0)
    assert policy.after_crash(crashes, 103.0) is None


def test_old_crashes_are_forgiven():
    policy = RestartPolicy(max_crashes=2, window_s=60)
    assert policy.after_crash([0.0, 100.0], 100.0) == policy.first_delay_s


def test_joining_a_server_of_the_same_store_or_a_foreign_one_says_what_was_joined():
    same = join_verdict("file:///a/artifacts", "file:///a/artifacts", "127.0.0.1:7233")
    assert "started for this store" in same
    foreign = join_verdict(None, "file:///a/artifacts", "127.0.0.1:7233")
    assert "not started by fleetforge dev" in foreign and "file:///a/artifacts" in foreign


def test_joining_the_server_of_another_store_is_refused_with_what_to_do():
    with pytest.raises(FleetforgeError) as e:
        join_verdict("file:///a/artifacts", "file:///b/artifacts", "127.0.0.1:7233")
    assert e.value.code is Err.BAD_INPUT
    assert "file:///a/artifacts" in e.value.message and "TEMPORAL_ADDRESS" in e.value.message
