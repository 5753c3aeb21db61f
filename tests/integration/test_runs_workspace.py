"""Run records and workspaces: idempotent writes, and a workspace that moves between workers."""

from __future__ import annotations

import hashlib
from datetime import UTC, datetime
from pathlib import Path

from activities.experiments import RunActivities, RunStore, add_artifacts
from activities.storage import ArtifactStore
from activities.workspace import Workspace
from contracts.common import ArtifactRef, JobKind, JobStatus
from contracts.runs import AttachArtifactsRequest, CreateRunRequest, WorkspaceRef
from contracts.settings import Settings

T0 = datetime(2026, 1, 1, tzinfo=UTC)
T1 = datetime(2026, 1, 2, tzinfo=UTC)


def _ref(name: str, content: str) -> ArtifactRef:
    sha = hashlib.sha256(content.encode()).hexdigest()
    return ArtifactRef(uri=f"file:///blobs/{sha}", sha256=sha, size=len(content), name=name)


# -- add_artifacts (pure) --------------------------------------------------------------------
def test_add_artifacts_unions_by_name_and_sha_keeping_order() -> None:
    a, b, c = _ref("a", "1"), _ref("b", "2"), _ref("c", "3")
    assert add_artifacts([], []) == []
    assert add_artifacts([a], [b, c]) == [a, b, c]
    assert add_artifacts([a, b], [b, a]) == [a, b]
    assert add_artifacts([], [a, a, b]) == [a, b]


def test_add_artifacts_same_content_other_name_is_kept() -> None:
    a, a_renamed = _ref("a", "1"), _ref("copy-of-a", "1")
    assert add_artifacts([a], [a_renamed]) == [a, a_renamed]
    a_changed = _ref("a", "2")
    assert add_artifacts([a], [a_changed]) == [a, a_changed]


# -- RunActivities -----------------------------------------------------------------------------
def _create(acts: RunActivities, at: datetime = T0) -> CreateRunRequest:
    return CreateRunRequest(run_id="r1", kind=JobKind.INSPECT, workflow_id="wf-r1", request={"x": 1}, at=at)


def test_create_run_twice_gives_one_record(store: ArtifactStore, settings: Settings) -> None:
    acts = RunActivities(store, settings)
    first = acts.create_run(_create(acts))
    again = acts.create_run(_create(acts, at=T1))  # a retry after a crash
    assert again == first
    assert first.status is JobStatus.RUNNING and first.created_at == T0
    assert store.list_docs("runs/") == ["runs/r1/run.json"]
    assert [r.run_id for r in RunStore(store).list()] == ["r1"]


def test_attach_artifacts_twice_no_duplicates(store: ArtifactStore, settings: Settings) -> None:
    acts = RunActivities(store, settings)
    acts.create_run(_create(acts))
    refs = [store.put_bytes(b"model", name="input/m.onnx"), store.put_bytes(b"log", name="logs/x.log")]
    req = AttachArtifactsRequest(run_id="r1", artifacts=refs, at=T1)
    once = acts.attach_artifacts(req)
    twice = acts.attach_artifacts(req)
    assert once == twice
    assert RunStore(store).get("r1").artifacts == refs


def test_workspace_push_then_materialize_on_another_worker(store: ArtifactStore, tmp_path: Path) -> None:
    ref = WorkspaceRef(run_id="r1", user_id="alice")
    ws_a = Workspace(store, tmp_path / "worker-a", ref)
    ws_a.create()
    ws_a.path("input/model.onnx").write_bytes(b"\x08\x07onnx-bytes" * 1000)
    ws_a.write_json("metadata.json", {"run_id": "r1"})
    (ws_a.path("logs/deep/nested.log")).parent.mkdir(parents=True)
    ws_a.path("logs/deep/nested.log").write_text("line\n")
    pushed = ws_a.push()
    assert sorted(pushed) == ["input/model.onnx", "logs/deep/nested.log", "metadata.json"]
    assert pushed["input/model.onnx"].media_type == "application/onnx"

    ws_b = Workspace(store, tmp_path / "worker-b", ref)
    assert ws_b.root != ws_a.root
    got = ws_b.materialize()
    assert got == pushed
    for rel in pushed:
        assert ws_b.path(rel).read_bytes() == ws_a.path(rel).read_bytes()
    for d in ("input", "converted", "logs"):
        assert ws_b.path(d).is_dir()

    # B changes one file and pushes only it; A catches up.
    ws_b.path("logs/deep/nested.log").write_text("line\nmore\n")
    ws_b.push(["logs/deep/nested.log"])
    assert ws_a.materialize()["logs/deep/nested.log"].size == len("line\nmore\n")
    assert ws_a.path("logs/deep/nested.log").read_text() == "line\nmore\n"


def test_workspace_push_unchanged_rewrites_nothing(store: ArtifactStore, tmp_path: Path) -> None:
    ws = Workspace(store, tmp_path / "w", WorkspaceRef(run_id="r2"))
    ws.create()
    ws.write_json("metadata.json", {"a": 1})
    first = ws.push()
    index_before = store.get_doc(ws.index_key)
    store.put_doc(ws.index_key, index_before + b"\n")  # marker: a rewrite would drop it
    assert ws.push() == first
    assert store.get_doc(ws.index_key) == index_before + b"\n"
