"""The SDK ships what the user points at (issue 28): content-addressed uploads into the store (the
second upload of the same model sends no byte: PUTs counted on a real S3 endpoint), external-data
sidecars and SavedModel folders travel with their model, a worker rebuilds the folder from its own
store, and a worker whose store lacks the upload fails at once with STORE_NOT_SHARED."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from activities.modelhub import ModelHub
from activities.storage import FileStore, S3Store
from activities.uploads import fetch_upload
from client.paths import local_path
from client.uploads import BIG_FILE, Uploader
from contracts.errors import Err, FleetforgeError
from contracts.settings import Settings
from contracts.uploads import UploadManifest, parse_upload_uri
from examples.tiny_model import build_tiny_cnn


def count_puts(store: S3Store) -> list[str]:
    """Every PUT request the store's boto3 client sends (a whole object or a multipart part)."""
    sent: list[str] = []
    store.client.meta.events.register("before-send.s3", lambda request, **_: sent.append(request.url)
                                      if request.method == "PUT" else None)
    return sent


def with_sidecar(path: Path) -> Path:
    """A real ONNX model whose weights live in `<name>.data` next to it (as torch.onnx.export writes them)."""
    import onnx

    model = onnx.load(str(build_tiny_cnn(path)))
    onnx.save_model(model, str(path), save_as_external_data=True, all_tensors_to_one_file=True,
                    location=path.name + ".data", size_threshold=0)
    assert (path.parent / (path.name + ".data")).stat().st_size > 0
    return path


def test_uploading_the_same_model_twice_moves_its_bytes_once(s3_store: S3Store, tmp_path: Path):
    model = tmp_path / "big.onnx.data"
    model.write_bytes(os.urandom(BIG_FILE + 1024))  # multipart: several PUTs the first time
    puts = count_puts(s3_store)
    seen: list[tuple[str, int, int]] = []
    uploader = Uploader(s3_store, progress=lambda name, done, total: seen.append((name, done, total)))

    first = uploader.ship_calibration(str(model))
    sent_first = len(puts)
    second = uploader.ship_calibration(str(model))

    assert first == second and first.startswith("upload://")
    assert sent_first >= 2, puts  # the blob (in parts) and the manifest
    assert len(puts) == sent_first, puts[sent_first:]  # nothing sent again
    assert seen and seen[-1] == ("big.onnx.data", model.stat().st_size, model.stat().st_size)  # the bar reached the end


def test_a_model_ships_with_its_external_data_and_the_worker_rebuilds_the_folder(s3_store: S3Store, tmp_path: Path):
    import onnx

    model = with_sidecar(tmp_path / "client" / "m.onnx")
    uri = Uploader(s3_store).ship_model(str(model))
    sha, name = parse_upload_uri(uri) or ("", "")
    manifest = UploadManifest.model_validate_json(s3_store.get_bytes(_ref(sha)))
    assert name == "m.onnx" and sorted(f.name for f in manifest.files) == ["m.onnx", "m.onnx.data"]

    worker_cache = tmp_path / "worker-cache"
    local = fetch_upload(s3_store, worker_cache, uri)
    assert local == worker_cache / "uploads" / sha / "m.onnx"
    loaded = onnx.load(str(local))  # reads the sidecar from the rebuilt folder
    assert [i.name for i in loaded.graph.initializer] == [i.name for i in onnx.load(str(model)).graph.initializer]


def test_a_saved_model_folder_ships_every_file(s3_store: S3Store, tmp_path: Path):
    saved = tmp_path / "sm"
    (saved / "variables").mkdir(parents=True)
    (saved / "saved_model.pb").write_bytes(b"graph")
    (saved / "variables" / "variables.index").write_bytes(b"index")
    uri = Uploader(s3_store).ship_model(str(saved))
    local = fetch_upload(s3_store, tmp_path / "cache", uri)
    assert local.is_dir() and (local / "variables" / "variables.index").read_bytes() == b"index"
    ref = ModelHub(s3_store, Settings(state_dir=tmp_path / "state")).resolve(uri)
    assert ref.format.value == "saved_model" and ref.source == str(saved) and ref.name == "sm"


def test_a_worker_with_another_file_store_fails_at_once_saying_to_share_one(tmp_path: Path):
    model = build_tiny_cnn(tmp_path / "m.onnx")
    uri = Uploader(FileStore(tmp_path / "client-store")).ship_model(str(model))
    with pytest.raises(FleetforgeError) as e:
        ModelHub(FileStore(tmp_path / "worker-store"), Settings(state_dir=tmp_path / "w")).resolve(uri)
    assert e.value.code is Err.STORE_NOT_SHARED and not e.value.retryable
    assert "FLEETFORGE_STORE_URL=s3://" in e.value.message


def test_one_path_rule_relative_to_the_callers_directory(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    (tmp_path / "sub").mkdir()
    (tmp_path / "sub" / "m.onnx").write_bytes(b"x")
    monkeypatch.chdir(tmp_path / "sub")
    assert local_path("m.onnx") == tmp_path / "sub" / "m.onnx"
    assert local_path("sub/m.onnx", cwd=tmp_path) == tmp_path / "sub" / "m.onnx"
    assert local_path((tmp_path / "sub" / "m.onnx").as_uri()) == tmp_path / "sub" / "m.onnx"
    assert local_path("s3://bucket/m.onnx") is None and local_path("resnet-catalog-name") is None


def _ref(sha: str):
    from contracts.common import ArtifactRef

    return ArtifactRef(uri="", sha256=sha, size=0)
