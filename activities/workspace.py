"""A run's workspace: a local directory (a cache) mirrored to the artifact store (the truth).

The index `runs/<run_id>/workspace.json` maps workspace-relative paths to artifacts, so a run
can continue on any worker: `materialize()` fetches what the local cache lacks, `push()` uploads
what changed. Both are idempotent.
"""

from __future__ import annotations

import json
from pathlib import Path

from activities.sandbox import safe_join
from activities.storage import ArtifactStore, sha256_file
from contracts.common import ArtifactRef
from contracts.runs import WORKSPACE_DIRS, WorkspaceFiles, WorkspaceRef

MEDIA_TYPES = {
    ".json": "application/json", ".jsonl": "application/jsonl", ".onnx": "application/onnx",
    ".bin": "application/octet-stream", ".dlc": "application/x-dlc", ".log": "text/plain",
    ".txt": "text/plain", ".csv": "text/csv", ".py": "text/x-python", ".ort": "application/x-ort",
}


def media_type(path: str) -> str:
    return MEDIA_TYPES.get(Path(path).suffix.lower(), "application/octet-stream")


class Workspace:
    def __init__(self, store: ArtifactStore, cache_root: Path, ref: WorkspaceRef):
        self.store = store
        self.ref = ref
        self.root = (cache_root / "workspaces" / ref.user_id / ref.run_id).resolve()
        self.index_key = f"runs/{ref.run_id}/workspace.json"

    def path(self, rel: str) -> Path:
        """Sandboxed absolute path of a workspace-relative path."""
        return safe_join(self.root, rel)

    def create(self) -> None:
        for d in WORKSPACE_DIRS:
            (self.root / d).mkdir(parents=True, exist_ok=True)

    def index(self) -> dict[str, ArtifactRef]:
        raw = self.store.get_doc(self.index_key)
        if raw is None:
            return {}
        return WorkspaceFiles.model_validate_json(raw).files

    def materialize(self) -> dict[str, ArtifactRef]:
        """Bring the local cache up to date with the store; returns the index."""
        self.create()
        files = self.index()
        for rel, ref in files.items():
            self.store.get_file(ref, self.path(rel))
        return files

    def push(self, rels: list[str] | None = None) -> dict[str, ArtifactRef]:
        """Upload the given files (default: every file) and record them in the index."""
        files = self.index()
        if rels is None:
            rels = sorted(str(p.relative_to(self.root)) for p in self.root.rglob("*") if p.is_file() and not p.name.startswith("."))
        changed = False
        for rel in rels:
            p = self.path(rel)
            old = files.get(rel)
            if old is not None and old.size == p.stat().st_size and old.sha256 == sha256_file(p):
                continue
            files[rel] = self.store.put_file(p, media_type=media_type(rel), name=rel)
            changed = True
        if changed:
            doc = WorkspaceFiles(workspace=self.ref, files=dict(sorted(files.items())))
            self.store.put_doc(self.index_key, doc.model_dump_json(indent=1).encode())
        return files

    def write_json(self, rel: str, obj: object) -> Path:
        p = self.path(rel)
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text(json.dumps(obj, indent=2, sort_keys=True, default=str) + "\n")
        return p
