"""Token deltas of a streamed LLM call, published to the calling workflow's live events as they arrive
(a Workflow Streams publish Signal, batched), so a follower sees an agent's answer being written.

Best effort by design: the events are for people watching, the answer itself travels as the
activity's result. A publish that fails is logged and dropped, never failing the LLM call."""

from __future__ import annotations

import contextlib
import time
from datetime import timedelta
from types import TracebackType
from typing import Any

import structlog
from temporalio import activity

from contracts.events import EVENTS_TOPIC, EventKind, JobEvent

log = structlog.get_logger(__name__)

FLUSH_EVERY_S = 0.25
"""How often buffered deltas go to the workflow (one Signal each): a follower sees text within about
this long, and a 1,000-token answer costs a few dozen small history events, not one per token."""


class LiveTokens:
    def __init__(self, agent: str, *, every_s: float = FLUSH_EVERY_S):
        self.agent = agent
        self.every_s = every_s
        self._client: Any = None
        self._topic: Any = None
        self._pending = ""
        self._last = 0.0
        self._call = ""

    async def __aenter__(self) -> "LiveTokens":
        from temporalio.contrib.workflow_streams import WorkflowStreamClient

        info = activity.info()
        self._call = f"{info.activity_id}#{info.attempt}"
        try:
            client = WorkflowStreamClient.from_within_activity(batch_interval=timedelta(seconds=self.every_s))
            self._topic = client.topic(EVENTS_TOPIC, type=JobEvent)
            self._client = await client.__aenter__()
        except Exception as e:  # no parent workflow, no client: nobody to tell
            log.warning("live tokens unavailable", error=str(e)[:200])
            self._client = None
        self._last = time.monotonic()
        return self

    def add(self, text: str) -> None:
        """Buffer a delta; hand the buffer to the stream client every `every_s` seconds."""
        if self._client is None or not text:
            return
        self._pending += text
        if time.monotonic() - self._last >= self.every_s:
            self._emit()

    def _emit(self) -> None:
        if self._pending:
            self._topic.publish(JobEvent(kind=EventKind.TOKENS, agent=self.agent, text=self._pending, call=self._call))
            self._pending = ""
        self._last = time.monotonic()

    async def __aexit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                        tb: TracebackType | None) -> None:
        if self._client is None:
            return
        self._emit()
        with contextlib.suppress(Exception):
            await self._client.__aexit__(exc_type, exc, tb)
            return
        log.warning("live tokens: the last deltas could not be published")
