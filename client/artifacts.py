"""A finished job's outputs by their workspace names, downloading them (`fleetforge artifacts`,
`JobHandle.download`), and a kernel job's trace read back from the store. Pure selection; every read
checks the sha256 (the store does), and a download leaves files with normal permissions (the store's
temp files are 0600)."""

from __future__ import annotations

import os
from pathlib import Path, PurePosixPath

from pydantic import BaseModel

from activities.sandbox import safe_join
from activities.storage import ArtifactStore
from contracts.common import ArtifactRef
from contracts.fleet_job import FleetTestResult, ModelTestResult
from contracts.kernel_job import KernelResult, TraceEntry


def job_outputs(result: BaseModel) -> list[ArtifactRef]:
    """What a job produced, each with a unique relative name: a conversion's or an inspection's
    workspace files, a kernel's best candidate and trace, a fleet's verdict CSV and per-model table,
    a fleet row's attempt logs."""
    match result:
        case KernelResult():
            refs = [r for r in (result.best_candidate, result.trace_artifact) if r is not None]
        case FleetTestResult():
            refs = [r for r in (result.csv, result.table) if r is not None]
        case ModelTestResult():
            refs = [a.log for a in result.attempts if a.log is not None]
        case _:
            refs = list(getattr(result, "artifacts", []) or [])
    return _named(refs)


def kernel_trace(store: ArtifactStore, result: KernelResult) -> list[TraceEntry]:
    """A kernel job's trace, one entry per agent step, read from its trace.jsonl (the result carries only
    its ref: the trace is in the workflow history once). Empty when the job recorded none."""
    if result.trace_artifact is None:
        return []
    lines = store.get_bytes(result.trace_artifact).splitlines()  # sha256-checked
    return [TraceEntry.model_validate_json(line) for line in lines if line.strip()]


def _named(refs: list[ArtifactRef]) -> list[ArtifactRef]:
    """Names made unique and relative: a missing name becomes its sha256, a repeated one gets `-N`."""
    seen: set[str] = set()
    out: list[ArtifactRef] = []
    for ref in refs:
        name = ref.name.lstrip("/") or f"sha256-{ref.sha256}"
        stem, suffix, n = str(PurePosixPath(name).with_suffix("")), PurePosixPath(name).suffix, 1
        while name in seen:
            n += 1
            name = f"{stem}-{n}{suffix}"
        seen.add(name)
        out.append(ref.model_copy(update={"name": name}))
    return out


def download(store: ArtifactStore, refs: list[ArtifactRef], out_dir: Path) -> list[Path]:
    """Write each artifact to `out_dir/<its name>` (sha256-checked; PATH_ESCAPE for a name that
    would leave out_dir), readable like any file the user creates (umask applied)."""
    out_dir.mkdir(parents=True, exist_ok=True)
    mode = 0o666 & ~_umask()
    paths = []
    for ref in refs:
        dest = safe_join(out_dir, ref.name)
        store.get_file(ref, dest)
        os.chmod(dest, mode)
        paths.append(dest)
    return paths


def _umask() -> int:
    current = os.umask(0)
    os.umask(current)
    return current
