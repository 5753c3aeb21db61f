"""The CLI's one output sink (STYLE G16): results on stdout, hints/progress/errors on stderr.

With `--json`, stdout carries exactly one JSON object (a result contract) and nothing else.
"""

from __future__ import annotations

import json
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from pydantic import BaseModel
from rich.console import Console
from rich.progress import (
    BarColumn, DownloadColumn, MofNCompleteColumn, Progress, SpinnerColumn, TextColumn, TimeElapsedColumn,
    TransferSpeedColumn,
)

from contracts.common import JobStatus
from contracts.errors import Err, explained

_stdout = Console(highlight=False, soft_wrap=True, width=None if sys.stdout.isatty() else 1000)
"""Piped or redirected: lines as long as they are (one job per line for grep), never folded at 80."""
_stderr = Console(stderr=True, highlight=False, soft_wrap=True)
_json = False

INPUT_ERRORS = frozenset({
    Err.BAD_INPUT, Err.JOB_FINISHED, Err.MODEL_NOT_FOUND, Err.MODEL_INVALID, Err.CATALOG_INVALID, Err.STORE_URL_INVALID,
    Err.JOB_NOT_FOUND, Err.PATH_ESCAPE, Err.WORKFLOW_CONFIG_INVALID, Err.MANIFEST_INVALID, Err.KERNEL_TASK_INVALID,
    Err.HOST_LACKS_GPUS,
})


def use_json(enabled: bool) -> None:
    global _json
    _json = enabled


def exit_code(status: str) -> int:
    """0 completed or waiting for input, 1 failed (or cancelled)."""
    return 0 if status in (JobStatus.COMPLETED, JobStatus.RUNNING, JobStatus.NEEDS_INPUT, JobStatus.AWAITING_APPROVAL) else 1


def error_exit_code(code: str) -> int:
    """2 for bad input the user can fix in the command line, 1 for everything else."""
    return 2 if code in INPUT_ERRORS else 1


def contract(model: BaseModel) -> None:
    """Print a contract as one JSON line on stdout (the --json output; human views use `line`)."""
    sys.stdout.write(model.model_dump_json() + "\n")
    sys.stdout.flush()


def json_mode() -> bool:
    return _json


def line(text: str) -> None:
    """A human line on stdout (never in --json mode)."""
    if not _json:
        _stdout.print(text, markup=False)


def workflow_id(wid: str) -> None:
    """Without --wait: the workflow id on stdout ({"workflow_id": ...} with --json)."""
    if _json:
        sys.stdout.write(json.dumps({"workflow_id": wid}) + "\n")
        sys.stdout.flush()
    else:
        _stdout.print(wid, markup=False)


def table(t: object) -> None:
    """A rich table on stdout (never in --json mode)."""
    if not _json:
        _stdout.print(t)


def hint(text: str) -> None:
    _stderr.print(text, markup=False, style="dim")


def error(message: str, code: str = "", hint: str = "") -> None:
    """One line: `error: WHAT (WHAT TO DO)`: the job's own hint, else the code's remedy."""
    message = " ".join(str(message).split())
    sys.stderr.write(f"error: {explained(message, code, hint)}\n")
    sys.stderr.flush()


class Follow:
    """What `progress` yields: `step(text)` for a job's steps, `bar(done, total, label)` for a fleet."""

    def __init__(self, title: str, every_s: float, console: Console, live: Progress | None):
        self.title = title
        self._every_s = every_s
        self._console = console
        self._live = live
        self._task = live.add_task(title, total=None, label="") if live is not None else None
        self._started = time.monotonic()
        self._last = ("", float("-inf"))

    def _timeline(self, text: str) -> None:
        """A line per new step (seconds since the start, then the step), at most one per `every_s`."""
        now = time.monotonic()
        if text and text != self._last[0] and now - self._last[1] >= self._every_s:
            self._last = (text, now)
            self._console.print(f"{now - self._started:7.1f}s  {self.title}: {text}", markup=False, style="dim")

    def step(self, text: str) -> None:
        self._timeline(text)
        if self._live is not None and self._task is not None and text:
            self._live.update(self._task, description=f"{self.title}: {text}")

    def bar(self, done: int, total: int, label: str) -> None:
        """A progress bar of `done` of `total` (a terminal), or a timeline line (a log)."""
        if self._live is None or self._task is None:
            self._timeline(f"{done}/{total} {label}")
            return
        self._live.update(self._task, completed=done, total=total, label=label)


@contextmanager
def progress(title: str, *, every_s: float = 0.0, bar: bool = False, console: Console | None = None) -> Iterator[Follow]:
    """Live progress on stderr. Every new step becomes a timeline line; on a terminal a
    rich.progress display also shows the current step (a spinner) or, with `bar`, a progress bar
    with `done/total` and a label (a fleet's rows)."""
    console = console or _stderr
    if not console.is_terminal:
        yield Follow(title, every_s, console, None)
        return
    if bar:  # fits 80 columns: the title goes on a line of its own
        console.print(title, markup=False, style="dim")
        columns: list[Any] = [SpinnerColumn(), BarColumn(bar_width=20), MofNCompleteColumn(),
                              TextColumn("{task.fields[label]}"), TimeElapsedColumn()]
    else:
        columns = [SpinnerColumn(), TextColumn("{task.description}"), TimeElapsedColumn()]
    with Progress(*columns, console=console, transient=True) as live:
        yield Follow(title, every_s, console, live)


class UploadBar:
    """The CLI's `FleetforgeClient.upload_progress`: a bar per big local input as it goes to the store
    (stderr, transient, on a terminal); in a log, one line per file. Thread-safe (boto3 reports from
    its transfer threads)."""

    def __init__(self, console: Console | None = None):
        self._console = console or _stderr
        self._live: Progress | None = None
        self._tasks: dict[str, Any] = {}
        self._lock = threading.Lock()

    def __call__(self, name: str, done: int, total: int) -> None:
        with self._lock:
            if name not in self._tasks:
                self._tasks[name] = self._start(name, total)
            task = self._tasks[name]
            if self._live is not None and task is not None:
                self._live.update(task, completed=done)
            if done >= total:  # the bar goes when its file is in (a job's own progress display follows)
                self._tasks.pop(name)
                if self._live is not None and task is not None:
                    self._live.remove_task(task)
                if not any(t is not None for t in self._tasks.values()):
                    self.close_locked()

    def _start(self, name: str, total: int) -> Any:
        if not self._console.is_terminal:
            self._console.print(f"uploading {name} ({total} bytes) to the artifact store", markup=False, style="dim")
            return None
        if self._live is None:
            self._live = Progress(TextColumn("uploading {task.description}"), BarColumn(bar_width=20), DownloadColumn(),
                                  TransferSpeedColumn(), console=self._console, transient=True)
            self._live.start()
        return self._live.add_task(name, total=total)

    def close_locked(self) -> None:
        if self._live is not None:
            self._live.stop()
            self._live = None
