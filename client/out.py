"""The CLI's one output sink (STYLE G16): results on stdout, hints/progress/errors on stderr.

With `--json`, stdout carries exactly one JSON object (a result contract) and nothing else.
"""

from __future__ import annotations

import json
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager

from pydantic import BaseModel
from rich.console import Console

from contracts.common import JobStatus
from contracts.errors import Err, remedy

_stdout = Console(highlight=False, soft_wrap=True)
_stderr = Console(stderr=True, highlight=False, soft_wrap=True)
_json = False

INPUT_ERRORS = frozenset({
    Err.BAD_INPUT, Err.MODEL_NOT_FOUND, Err.MODEL_INVALID, Err.CATALOG_INVALID, Err.STORE_URL_INVALID,
    Err.JOB_NOT_FOUND, Err.PATH_ESCAPE, Err.WORKFLOW_CONFIG_INVALID, Err.MANIFEST_INVALID, Err.KERNEL_TASK_INVALID,
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


def error(message: str, code: str = "") -> None:
    """One line: `error: WHAT (WHAT TO DO)`."""
    message = " ".join(str(message).split())
    fix = remedy(code) if code else ""
    sys.stderr.write(f"error: {message}" + (f" ({fix})" if fix else "") + "\n")
    sys.stderr.flush()


@contextmanager
def progress(title: str, *, every_s: float = 0.0) -> Iterator[Callable[[str], None]]:
    """Live progress on stderr; yields `update(step)`. Each new step becomes a timeline line
    (seconds since the start, then the step), at most one every `every_s` seconds; on a terminal a
    spinner also shows the current step."""
    started = time.monotonic()
    last = {"step": "", "at": float("-inf")}

    def timeline(step: str) -> None:
        now = time.monotonic()
        if step and step != last["step"] and now - last["at"] >= every_s:
            last.update(step=step, at=now)
            _stderr.print(f"{now - started:7.1f}s  {title}: {step}", markup=False, style="dim")

    if not _stderr.is_terminal:
        yield timeline
        return
    with _stderr.status(f"{title}: starting") as status:
        def update(step: str) -> None:
            timeline(step)
            if step:
                status.update(f"{title}: {step}")
        yield update
