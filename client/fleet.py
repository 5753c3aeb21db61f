"""The fleet-test job's rules: read and check a manifest CSV before a job starts, load a hardware
profile, find the request a fleet started with, and merge its verdicts back into the user's CSV
(only into the manifest it started from, atomically, keeping every untouched byte).

`write_back` returns a `WriteBack` report; the front door decides how to tell the user."""

from __future__ import annotations

import hashlib
import os
import shutil
import tempfile
from collections.abc import Callable, Sequence
from pathlib import Path

from pydantic import BaseModel, Field, ValidationError
from temporalio.client import Client
from temporalio.service import RPCError, RPCStatusCode

from activities.storage import ArtifactStore
from contracts.common import JobKind
from contracts.errors import Err, FleetforgeError
from contracts.fleet import HardwareProfile, Tier
from contracts.fleet_job import FleetTestRequest, ProcessMode, RunnerKind


def read_manifest(csv_file: Path) -> str:
    """The CSV's text with its bytes unchanged (no newline translation): its sha256 is the file's."""
    if not csv_file.is_file():
        raise FleetforgeError(Err.BAD_INPUT, f"{csv_file}: no such CSV file")
    try:
        return csv_file.read_bytes().decode("utf-8")
    except (OSError, UnicodeDecodeError) as e:
        raise FleetforgeError(Err.BAD_INPUT, f"{csv_file}: cannot read: {e}") from None


def check_manifest(csv_text: str, runner: RunnerKind) -> None:
    """MANIFEST_INVALID before anything connects or starts (the process runner needs a command per row)."""
    from activities.containers.manifest import parse_manifest, require_commands

    rows = parse_manifest(csv_text)
    if runner is RunnerKind.PROCESS:
        require_commands(rows)


def check_process_options(runner: RunnerKind, share: Sequence[str | Path] = (), process_mode: ProcessMode | str | None = None,
                          cwd: Path | None = None) -> tuple[str, ...]:
    """The `--share` folders as absolute paths (relative ones from `cwd`), BAD_INPUT before anything starts
    when a folder cannot be shared (activities.sandbox.shareable: missing, not readable by others, the root or
    the temp dir) or the options are given to another runner than the process runner, which alone uses them.
    The containers worker checks them again (its state dir is never shared)."""
    from activities.sandbox import shareable

    if runner is not RunnerKind.PROCESS:
        if share:
            raise FleetforgeError(Err.BAD_INPUT, f"--share is for --runner process; a {runner.value} row reaches host "
                                  "folders its own way (docker: -v under the hardware profile's model_cache_dir)")
        if process_mode is not None and ProcessMode(process_mode) is not ProcessMode.SERVER:
            raise FleetforgeError(Err.BAD_INPUT, f"--process-mode {ProcessMode(process_mode).value} is for --runner process")
        return ()
    return tuple(str(p) for p in shareable([Path(s) if Path(s).is_absolute() else (cwd or Path.cwd()) / s for s in share]))


def host_checked_profile(csv_text: str, profile: HardwareProfile | None, where: str,
                         require_tier: Tier | None = None,
                         show: Callable[[HardwareProfile], None] | None = None) -> HardwareProfile:
    """The host as it is: without a profile, this host's GPUs (discovered); with one, nothing in it or in the
    CSV may ask for GPUs the host lacks (HOST_LACKS_GPUS, what to change) — checked before any row starts.
    A required tier of NONE is refused too: it would pass a model that never became healthy."""
    from activities.containers.host import discover_gpus, gpu_problems, host_profile
    from activities.containers.manifest import parse_manifest

    if require_tier is Tier.NONE:
        raise FleetforgeError(Err.BAD_INPUT, "--require-tier NONE would pass a model that never became healthy: "
                              "use BOOTS, SERVES, SENSIBLE or MATCHES")
    host = discover_gpus()
    resolved = profile if profile is not None else host_profile(host, HardwareProfile())
    if show is not None:
        show(resolved)  # before a refusal too: the user sees what the host has
    if problems := gpu_problems(resolved, host, parse_manifest(csv_text), where):
        raise FleetforgeError(Err.HOST_LACKS_GPUS, "; ".join(problems))
    return resolved


def load_hardware(path: Path | None) -> HardwareProfile:
    """A hardware profile YAML (None: the default profile); BAD_INPUT saying which field is wrong."""
    import yaml

    if path is None:
        return HardwareProfile()
    try:
        data = yaml.safe_load(path.read_text(encoding="utf-8"))
    except OSError as e:
        raise FleetforgeError(Err.BAD_INPUT, f"{path}: cannot read: {e.strerror or e}") from None
    except yaml.YAMLError as e:
        raise FleetforgeError(Err.BAD_INPUT, f"{path}: not valid YAML: {' '.join(str(e).split())}") from None
    if not isinstance(data, dict):
        raise FleetforgeError(Err.BAD_INPUT, f"{path}: expected a mapping of hardware fields")
    try:
        return HardwareProfile(**{"source": str(path), **data})
    except ValidationError as e:
        first = e.errors()[0]
        where = ".".join(str(p) for p in first.get("loc", ())) or "profile"
        raise FleetforgeError(Err.BAD_INPUT, f"{path}: {where}: {first.get('msg')}") from None


async def fleet_request(client: Client, workflow_id: str) -> FleetTestRequest:
    """The request a fleet-test job was started with (its manifest ref and fleet id), read from the
    start event of its current run's history (no worker needed)."""
    from contracts.fleet_job import default_fleet_id

    if not workflow_id.startswith(JobKind.FLEET_TEST.value + "/"):
        raise FleetforgeError(Err.BAD_INPUT, f"{workflow_id} is not a fleet-test job")
    try:
        async for event in client.get_workflow_handle(workflow_id).fetch_history_events():
            payloads = event.workflow_execution_started_event_attributes.input.payloads
            [req] = await client.data_converter.decode(payloads, [FleetTestRequest])
            # the workflow's own default when a fleet was started without a fleet id
            return req if req.fleet_id else req.model_copy(update={"fleet_id": default_fleet_id(workflow_id)})
    except RPCError as e:
        if e.status == RPCStatusCode.NOT_FOUND:
            raise FleetforgeError(Err.JOB_NOT_FOUND, f"no job with workflow id {workflow_id!r}") from None
        raise
    raise FleetforgeError(Err.JOB_NOT_FOUND, f"{workflow_id} has no history")


def manifest_mismatch(store: ArtifactStore, request: FleetTestRequest, csv_path: Path) -> str:
    """Why `csv_path` is not the manifest the fleet started from ("" when it is: the same bytes, or the
    same rows with status/note filled in and rows added at the end)."""
    from activities.containers.manifest import manifest_mismatch as mismatch

    current = read_manifest(csv_path)
    if hashlib.sha256(current.encode("utf-8")).hexdigest() == request.manifest.sha256:
        return ""
    original = store.get_bytes(request.manifest).decode("utf-8")
    why = mismatch(original, current)
    return f"{csv_path} is not the manifest fleet {request.fleet_id} started from: {why}" if why else ""


class WriteBack(BaseModel):
    """What `write_back` did to the CSV."""

    path: str
    written: list[str] = Field(default_factory=list)
    """Rows whose verdicts were written."""
    changed: list[str] = Field(default_factory=list)
    """Rows not written: they changed since their test."""
    missing: list[str] = Field(default_factory=list)
    """Rows not written: no such row any more."""
    pending: bool = False
    """True when the fleet had no finished rows yet (nothing written)."""


def write_back(store: ArtifactStore, request: FleetTestRequest, csv_path: Path, *, force: bool = False) -> WriteBack:
    """Merge the fleet's recorded verdicts into the local CSV: only into the manifest the fleet started
    from (else MANIFEST_CHANGED unless `force`), by row identity (model name + the tested cells'
    fingerprint), keeping rows added meanwhile and every untouched byte; atomically (temp file +
    rename) with the previous version kept as `<csv>.bak`."""
    from activities.containers.activities import collect_verdicts
    from activities.containers.manifest import merge_verdicts

    verdicts = collect_verdicts(store, request.fleet_id)
    if not verdicts:
        return WriteBack(path=str(csv_path), pending=True)
    if not force and (why := manifest_mismatch(store, request, csv_path)):
        raise FleetforgeError(Err.MANIFEST_CHANGED, f"{why}; nothing written ({len(verdicts)} verdicts stay in the store)")
    for _ in range(3):  # the file may change while we merge: then merge again
        before = csv_path.read_bytes()
        merged = merge_verdicts(before.decode("utf-8"), sorted(verdicts.values(), key=lambda v: v.row),
                                request.evidence_columns)
        data = merged.text.encode("utf-8")
        if data == before:
            break
        if not _replace_if_unchanged(csv_path, before, data):
            continue
        break
    else:
        raise FleetforgeError(Err.MANIFEST_CHANGED, f"{csv_path} kept changing while the verdicts were merged; try again")
    return WriteBack(path=str(csv_path), written=list(merged.written), changed=list(merged.changed),
                     missing=list(merged.missing))


def _replace_if_unchanged(csv_path: Path, before: bytes, data: bytes) -> bool:
    fd, tmp = tempfile.mkstemp(dir=csv_path.parent, prefix=f".{csv_path.name}.")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        shutil.copymode(csv_path, tmp)
        if csv_path.read_bytes() != before:
            return False
        shutil.copy2(csv_path, csv_path.with_name(csv_path.name + ".bak"))
        os.replace(tmp, csv_path)
        return True
    finally:
        Path(tmp).unlink(missing_ok=True)


