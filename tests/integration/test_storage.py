"""The artifact store contract, run against both implementations (FileStore and S3Store on moto)."""

from __future__ import annotations

import hashlib
import os
from pathlib import Path
from typing import Any

import pytest

from activities.storage import CHUNK, ArtifactStore, FileStore, S3Store, blob_key, parse_store_url
from contracts.common import ArtifactRef
from contracts.errors import Err, FleetforgeError


def _scheme(store: ArtifactStore) -> str:
    return "file://" if isinstance(store, FileStore) else "s3://"


def _count_uploads(store: S3Store) -> list[str]:
    """Wrap the client's writing calls so a test can see every transfer."""
    calls: list[str] = []
    for name in ("put_object", "upload_file", "upload_fileobj", "create_multipart_upload"):
        original = getattr(store.client, name)

        def wrapped(*a: Any, _name: str = name, _orig: Any = original, **kw: Any) -> Any:
            calls.append(_name)
            return _orig(*a, **kw)

        setattr(store.client, name, wrapped)
    return calls


def _corrupt(store: ArtifactStore, ref: ArtifactRef) -> None:
    """Overwrite the stored blob with same-size garbage, bypassing the store's checks."""
    bad = b"X" * ref.size
    if isinstance(store, FileStore):
        store._path(blob_key(ref.sha256)).write_bytes(bad)
    else:
        assert isinstance(store, S3Store)
        store.client.put_object(Bucket=store.bucket, Key=store._key(blob_key(ref.sha256)), Body=bad)


def test_put_file_and_put_bytes_return_refs(store: ArtifactStore, tmp_path: Path) -> None:
    data = b"hello fleetforge\n" * 100
    f = tmp_path / "a.bin"
    f.write_bytes(data)
    sha = hashlib.sha256(data).hexdigest()

    ref = store.put_file(f, media_type="application/x-test", name="a.bin")
    assert (ref.sha256, ref.size, ref.media_type, ref.name) == (sha, len(data), "application/x-test", "a.bin")
    assert ref.uri.startswith(_scheme(store)) and ref.uri.endswith(sha)

    ref2 = store.put_bytes(data, name="b")
    assert (ref2.sha256, ref2.size, ref2.uri) == (sha, len(data), ref.uri)
    assert store.exists(ref)
    assert store.get_bytes(ref) == data
    out = store.get_file(ref, tmp_path / "out" / "a.bin")
    assert out.read_bytes() == data


def test_identical_content_transfers_nothing_second_time(store: ArtifactStore, tmp_path: Path) -> None:
    f = tmp_path / "same.bin"
    f.write_bytes(os.urandom(4096))
    first = store.put_file(f)
    if isinstance(store, S3Store):
        calls = _count_uploads(store)
        assert store.put_file(f) == first
        assert store.put_bytes(f.read_bytes()) == first
        assert calls == []
    else:
        assert isinstance(store, FileStore)
        blob = store._path(blob_key(first.sha256))
        before = blob.stat()
        assert store.put_file(f) == first
        assert store.put_bytes(f.read_bytes()) == first
        after = blob.stat()
        assert (after.st_ino, after.st_mtime_ns) == (before.st_ino, before.st_mtime_ns)


def test_get_file_detects_corruption(store: ArtifactStore, tmp_path: Path) -> None:
    ref = store.put_bytes(b"precious weights" * 64)
    _corrupt(store, ref)
    dest = tmp_path / "dl" / "w.bin"
    with pytest.raises(FleetforgeError) as e:
        store.get_file(ref, dest)
    assert e.value.code is Err.INTEGRITY_ERROR
    assert not dest.exists()
    assert [p for p in dest.parent.iterdir()] == []  # no temp file left behind
    with pytest.raises(FleetforgeError) as e2:
        store.get_bytes(ref)
    assert e2.value.code is Err.INTEGRITY_ERROR


def test_missing_artifact_is_not_found(store: ArtifactStore, tmp_path: Path) -> None:
    ghost = ArtifactRef(uri="x://ghost", sha256="0" * 64, size=3)
    assert not store.exists(ghost)
    for op in (lambda: store.get_file(ghost, tmp_path / "g"), lambda: store.get_bytes(ghost)):
        with pytest.raises(FleetforgeError) as e:
            op()
        assert e.value.code is Err.ARTIFACT_NOT_FOUND


def test_docs_put_get_list(store: ArtifactStore) -> None:
    assert store.get_doc("runs/r1/run.json") is None
    assert store.list_docs("runs/") == []
    store.put_doc("runs/r1/run.json", b'{"v":1}')
    store.put_doc("runs/r2/run.json", b'{"v":2}')
    store.put_doc("runs/r1/workspace.json", b"{}")
    store.put_doc("other/x", b"x")
    store.put_doc("runs/r1/run.json", b'{"v":3}')  # documents are overwritable
    assert store.get_doc("runs/r1/run.json") == b'{"v":3}'
    assert store.list_docs("runs/") == ["runs/r1/run.json", "runs/r1/workspace.json", "runs/r2/run.json"]
    assert "other/x" in store.list_docs("")
    for bad in ("", "/abs", "a/../b", "a//b", "a/\x00"):
        with pytest.raises(FleetforgeError) as e:
            store.put_doc(bad, b"")
        assert e.value.code is Err.PATH_ESCAPE


def test_large_file_round_trips(store: ArtifactStore, tmp_path: Path) -> None:
    """> 16 MiB: several multipart chunks on S3."""
    src = tmp_path / "big.bin"
    h = hashlib.sha256()
    with open(src, "wb") as f:
        for i in range(17):
            chunk = hashlib.sha256(str(i).encode()).digest() * (1024 * 1024 // 32)
            f.write(chunk)
            h.update(chunk)
    if isinstance(store, S3Store):
        calls = _count_uploads(store)
    ref = store.put_file(src)
    assert ref.size == 17 * 1024 * 1024 and ref.sha256 == h.hexdigest()
    if isinstance(store, S3Store):
        assert calls.count("create_multipart_upload") == 1 and "put_object" not in calls, calls
        head = store.client.head_object(Bucket=store.bucket, Key=store._key(blob_key(ref.sha256)))
        assert head["Metadata"]["sha256"] == ref.sha256
        parts = -(-ref.size // CHUNK)  # 17 MiB in CHUNK-sized parts
        assert head["ETag"].strip('"').endswith(f"-{parts}"), f"expected a {parts}-part upload, ETag {head['ETag']}"
    out = store.get_file(ref, tmp_path / "back.bin")
    assert out.stat().st_size == ref.size
    with open(out, "rb") as a, open(src, "rb") as b:
        while True:
            x, y = a.read(1 << 20), b.read(1 << 20)
            assert x == y
            if not x:
                break


@pytest.mark.parametrize("url, expected", [
    ("file:///srv/ff", ("file", "/srv/ff", "")),
    ("file://localhost/srv/ff", ("file", "/srv/ff", "")),
    ("s3://bucket", ("s3", "bucket", "")),
    ("s3://bucket/a/b/", ("s3", "bucket", "a/b")),
])
def test_parse_store_url_good(url: str, expected: tuple[str, str, str]) -> None:
    assert parse_store_url(url) == expected


@pytest.mark.parametrize("url", ["", "/srv/ff", "relative/path", "file://host/srv", "s3://", "s3:///prefix", "http://x/y", "gs://b"])
def test_parse_store_url_bad(url: str) -> None:
    with pytest.raises(FleetforgeError) as e:
        parse_store_url(url)
    assert e.value.code is Err.STORE_URL_INVALID
    assert "file:///" in str(e.value) and "s3://" in str(e.value)
