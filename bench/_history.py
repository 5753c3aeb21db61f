"""What the benches read back from a workflow's real history."""

from __future__ import annotations

from typing import Any


async def activity_times(handle: Any) -> list[tuple[str, str, float]]:
    """(activity type, scheduled event id, seconds from scheduled to closed) for every activity
    that completed or failed, in history order."""
    scheduled: dict[int, tuple[str, float]] = {}
    out = []
    async for ev in handle.fetch_history_events():
        t = ev.event_time.ToDatetime().timestamp()
        if ev.HasField("activity_task_scheduled_event_attributes"):
            scheduled[ev.event_id] = (ev.activity_task_scheduled_event_attributes.activity_type.name, t)
        for field in ("activity_task_completed_event_attributes", "activity_task_failed_event_attributes"):
            if ev.HasField(field):
                sid = getattr(ev, field).scheduled_event_id
                name, t0 = scheduled[sid]
                out.append((name, str(sid), t - t0))
    return out
