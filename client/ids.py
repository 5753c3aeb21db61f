"""One id grammar for every command (pure): whatever the tool prints names a job.

| the tool prints | it names |
|---|---|
| `convert/20261122-140512-3f9a` (any `KIND/RUN_ID`) | that job |
| `20261122-140512-3f9a` (a bare run id) | the one job of any kind with that run id |
| `fleet/FLEET_ID/ROW` | a fleet's row (a model-test workflow) |
| `fleet/FLEET_ID` | the fleet `fleet-test/FLEET_ID` |
| a Web UI link (`http://…/namespaces/NS/workflows/convert%2F…/RUN/user-metadata`, any tab) | the job on that page |
"""

from __future__ import annotations

import re
from urllib.parse import unquote, urlparse

from contracts.common import JobKind
from contracts.errors import Err, FleetforgeError

ROW_PREFIX = "fleet/"
"""Row children of a fleet are `fleet/<fleet_id>/<row>` (kind model-test)."""
_ROW = re.compile(r"^fleet/[^/\s]+/\d+$")
_FLEET = re.compile(r"^fleet/[^/\s]+$")
_BARE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._:-]*$")
STARTABLE = (JobKind.INSPECT, JobKind.CONVERT, JobKind.KERNEL, JobKind.FLEET_TEST)
"""Kinds a bare run id may belong to (rows are always named with their fleet)."""

USAGE = "a job id is KIND/RUN_ID (e.g. convert/20261122-140512-3f9a), a bare run id, fleet/FLEET_ID/ROW or a Web UI link"


def kind_of(workflow_id: str) -> JobKind:
    """Job kind of a full workflow id; BAD_INPUT for anything that is not one."""
    if _ROW.match(workflow_id):
        return JobKind.MODEL_TEST
    head, sep, rest = workflow_id.partition("/")
    try:
        kind = JobKind(head)
    except ValueError:
        kind = None
    if kind is None or kind is JobKind.MODEL_TEST or not sep or not rest:
        raise FleetforgeError(Err.BAD_INPUT, f"{workflow_id!r} is not a job id: {USAGE}")
    return kind


def candidates(text: str) -> list[str]:
    """The workflow ids `text` can name: one for a full id, a row id or a link; one per kind for a
    bare run id (the caller keeps the one that exists). BAD_INPUT for text that names nothing."""
    text = text.strip()
    if text.startswith(("http://", "https://")):
        return [_from_link(text)]
    if _ROW.match(text):
        return [text]
    if _FLEET.match(text):
        return [f"{JobKind.FLEET_TEST.value}/{text.removeprefix(ROW_PREFIX)}"]
    if "/" in text:
        kind_of(text)
        return [text]
    if _BARE.match(text):
        return [f"{k.value}/{text}" for k in STARTABLE]
    raise FleetforgeError(Err.BAD_INPUT, f"{text!r} is not a job id: {USAGE}")


def run_id_of(workflow_id: str) -> str:
    """The run id part of a job's workflow id (`convert/X` -> `X`; a row keeps `FLEET/ROW`)."""
    return workflow_id.removeprefix(ROW_PREFIX) if _ROW.match(workflow_id) else workflow_id.partition("/")[2]


def run_id_for(kind: JobKind, text: str) -> str:
    """The run id of a `kind` job named any way the tool prints it (`convert/X`, a Web UI link, or
    the bare `X`); BAD_INPUT for an id of another kind."""
    text = text.strip()
    if _BARE.match(text):
        return text
    [workflow_id] = candidates(text)
    if kind_of(workflow_id) is not kind:
        raise FleetforgeError(Err.BAD_INPUT, f"{text!r} is not a {kind.value} job")
    return run_id_of(workflow_id)


def _from_link(link: str) -> str:
    parts = urlparse(link).path.split("/")
    try:
        encoded = parts[parts.index("workflows") + 1]
    except (ValueError, IndexError):
        raise FleetforgeError(Err.BAD_INPUT, f"{link!r} is not a Web UI link to a job: {USAGE}") from None
    workflow_id = unquote(encoded)
    kind_of(workflow_id)
    return workflow_id
