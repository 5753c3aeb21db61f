"""`fleetforge watch`'s live event lines: each job event on stderr as it happens, an LLM call's
token deltas written on one growing line (the agent's answer appearing as it is written)."""

from __future__ import annotations

import sys
from typing import Any, TextIO

from contracts.events import EventKind, JobEvent, event_line


class EventPrinter:
    def __init__(self, stream: TextIO | None = None):
        self.stream = stream or sys.stderr
        self._open_call = ""
        """The LLM call whose deltas the current line is showing ("" when the line is closed)."""

    def show(self, event: JobEvent) -> None:
        if event.kind is EventKind.TOKENS:
            if event.call != self._open_call:
                self._close()
                self.stream.write(f"  [{event.agent}] ")
                self._open_call = event.call
            self.stream.write(event.text)
        else:
            self._close()
            self.stream.write(f"  {event_line(event)}\n")
        self.stream.flush()

    def _close(self) -> None:
        if self._open_call:
            self.stream.write("\n")
            self._open_call = ""

    def end(self) -> None:
        self._close()
        self.stream.flush()


async def print_events(handle: Any, printer: EventPrinter | None = None) -> None:
    """Print a job's events until it closes (handle: a client.jobs.JobHandle)."""
    printer = printer or EventPrinter()
    try:
        async for event in handle.events():
            printer.show(event)
    finally:
        printer.end()
