"""The artifact store: one interface, a filesystem and an S3 implementation.

Blobs are content-addressed (`blobs/sha256/<aa>/<sha256>`): putting identical content twice
transfers nothing the second time, and every download is checked against its sha256.
Documents (`put_doc`/`get_doc`) are small mutable JSON records keyed by name (run records,
workspace indexes); they are the only things ever overwritten.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import tempfile
from abc import ABC, abstractmethod
from pathlib import Path
from collections.abc import Callable
from typing import TYPE_CHECKING, Any
from urllib.parse import unquote, urlparse

from contracts.common import ArtifactRef
from contracts.errors import Err, FleetforgeError

if TYPE_CHECKING:
    from contracts.settings import Settings

CHUNK = 8 * 1024 * 1024

Progress = Callable[[int], None]
"""Told the number of bytes just moved (an upload's progress bar adds them up)."""


def sha256_file(path: Path) -> str:
    """Hash a file in fixed-size chunks (never reads it whole)."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(CHUNK):
            h.update(chunk)
    return h.hexdigest()


def blob_key(sha256: str) -> str:
    return f"blobs/sha256/{sha256[:2]}/{sha256}"


class ArtifactStore(ABC):
    """Content-addressed blobs plus small keyed documents. Implementations are thread-safe."""

    url: str

    # -- blobs ---------------------------------------------------------------------------
    def put_file(self, path: Path, *, media_type: str = "application/octet-stream", name: str = "",
                 progress: Progress | None = None, sha256: str | None = None) -> ArtifactRef:
        """Upload `path` unless the store has its blob already (then nothing moves). `progress` is
        told the bytes as they go; `sha256`, when the caller hashed the file already."""
        sha = sha256 or sha256_file(path)
        size = path.stat().st_size
        if not self._has(blob_key(sha), size):
            self._upload_file(path, blob_key(sha), sha, progress)
        return ArtifactRef(uri=self._uri(blob_key(sha)), sha256=sha, size=size, media_type=media_type, name=name)

    def put_bytes(self, data: bytes, *, media_type: str = "application/octet-stream", name: str = "") -> ArtifactRef:
        sha = hashlib.sha256(data).hexdigest()
        if not self._has(blob_key(sha), len(data)):
            self._upload_bytes(data, blob_key(sha), sha)
        return ArtifactRef(uri=self._uri(blob_key(sha)), sha256=sha, size=len(data), media_type=media_type, name=name)

    def get_file(self, ref: ArtifactRef, dest: Path) -> Path:
        """Download `ref` to `dest` atomically; raises INTEGRITY_ERROR if the content does not hash to ref.sha256."""
        dest.parent.mkdir(parents=True, exist_ok=True)
        if dest.exists() and dest.stat().st_size == ref.size and sha256_file(dest) == ref.sha256:
            return dest
        fd, tmp_name = tempfile.mkstemp(dir=dest.parent, prefix=f".{dest.name}.")
        os.close(fd)
        tmp = Path(tmp_name)
        try:
            self._download_file(blob_key(ref.sha256), tmp)
            got = sha256_file(tmp)
            if got != ref.sha256:
                raise FleetforgeError(Err.INTEGRITY_ERROR, f"artifact {ref.uri} is corrupt: sha256 {got} != {ref.sha256}")
            os.replace(tmp, dest)
        finally:
            tmp.unlink(missing_ok=True)
        return dest

    def get_bytes(self, ref: ArtifactRef) -> bytes:
        data = self._download_bytes(blob_key(ref.sha256))
        got = hashlib.sha256(data).hexdigest()
        if got != ref.sha256:
            raise FleetforgeError(Err.INTEGRITY_ERROR, f"artifact {ref.uri} is corrupt: sha256 {got} != {ref.sha256}")
        return data

    def exists(self, ref: ArtifactRef) -> bool:
        return self._has(blob_key(ref.sha256), ref.size)

    # -- documents -----------------------------------------------------------------------
    def put_doc(self, key: str, data: bytes) -> None:
        self._upload_bytes(data, _doc_key(key), None)

    def get_doc(self, key: str) -> bytes | None:
        try:
            return self._download_bytes(_doc_key(key))
        except FleetforgeError as e:
            if e.code is Err.ARTIFACT_NOT_FOUND:
                return None
            raise

    @abstractmethod
    def list_docs(self, prefix: str) -> list[str]:
        """Keys of documents under `prefix` (relative to the docs area), sorted."""

    # -- backend primitives --------------------------------------------------------------
    @abstractmethod
    def _uri(self, key: str) -> str: ...
    @abstractmethod
    def _has(self, key: str, size: int) -> bool: ...
    @abstractmethod
    def _upload_file(self, path: Path, key: str, sha256: str | None, progress: Progress | None = None) -> None: ...
    @abstractmethod
    def _upload_bytes(self, data: bytes, key: str, sha256: str | None) -> None: ...
    @abstractmethod
    def _download_file(self, key: str, dest: Path) -> None: ...
    @abstractmethod
    def _download_bytes(self, key: str) -> bytes: ...


def _doc_key(key: str) -> str:
    parts = key.split("/")
    if not key or key.startswith("/") or any(p in ("", ".", "..") for p in parts) or "\x00" in key:
        raise FleetforgeError(Err.PATH_ESCAPE, f"invalid document key {key!r}")
    return f"docs/{key}"


class FileStore(ArtifactStore):
    """The embedded default: the same keys as S3, as files under a root directory."""

    def __init__(self, root: Path):
        self.root = root.resolve()
        self.root.mkdir(parents=True, exist_ok=True)
        self.url = self.root.as_uri()

    def _path(self, key: str) -> Path:
        return self.root / key

    def _uri(self, key: str) -> str:
        return self._path(key).as_uri()

    def _has(self, key: str, size: int) -> bool:
        p = self._path(key)
        return p.is_file() and p.stat().st_size == size

    def _write_atomic(self, key: str, writer: Any) -> None:
        dest = self._path(key)
        dest.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=dest.parent, prefix=f".{dest.name}.")
        try:
            with os.fdopen(fd, "wb") as f:
                writer(f)
            os.replace(tmp, dest)
        finally:
            Path(tmp).unlink(missing_ok=True)

    def _upload_file(self, path: Path, key: str, sha256: str | None, progress: Progress | None = None) -> None:
        def copy(f: Any) -> None:
            with open(path, "rb") as src:
                while chunk := src.read(CHUNK):
                    f.write(chunk)
                    if progress is not None:
                        progress(len(chunk))
        self._write_atomic(key, copy)

    def _upload_bytes(self, data: bytes, key: str, sha256: str | None) -> None:
        self._write_atomic(key, lambda f: f.write(data))

    def _download_file(self, key: str, dest: Path) -> None:
        src = self._path(key)
        if not src.is_file():
            raise FleetforgeError(Err.ARTIFACT_NOT_FOUND, f"{self._uri(key)} does not exist")
        shutil.copyfile(src, dest)

    def _download_bytes(self, key: str) -> bytes:
        src = self._path(key)
        if not src.is_file():
            raise FleetforgeError(Err.ARTIFACT_NOT_FOUND, f"{self._uri(key)} does not exist")
        return src.read_bytes()

    def list_docs(self, prefix: str) -> list[str]:
        base = self._path("docs")
        start = base / prefix if prefix else base
        if not start.exists():
            return []
        return sorted(
            str(p.relative_to(base)) for p in start.rglob("*") if p.is_file() and not p.name.startswith(".")
        )


class S3Store(ArtifactStore):
    """MinIO or any S3 endpoint via boto3. Large files stream through the transfer manager
    (multipart, bounded memory); the sha256 travels as object metadata."""

    def __init__(self, bucket: str, prefix: str = "", *, endpoint_url: str | None = None, client: Any = None):
        import boto3
        from boto3.s3.transfer import TransferConfig
        from botocore.config import Config

        self.bucket = bucket
        self.prefix = prefix.strip("/")
        self.client = client or boto3.client(
            "s3", endpoint_url=endpoint_url,
            config=Config(retries={"max_attempts": 5, "mode": "standard"}, max_pool_connections=16),
        )
        self.transfer = TransferConfig(
            multipart_threshold=CHUNK, multipart_chunksize=CHUNK, max_concurrency=4, use_threads=True
        )
        self.url = f"s3://{bucket}/{self.prefix}".rstrip("/")

    def _key(self, key: str) -> str:
        return f"{self.prefix}/{key}" if self.prefix else key

    def _uri(self, key: str) -> str:
        return f"s3://{self.bucket}/{self._key(key)}"

    def _call(self, what: str, fn: Any, *args: Any, **kwargs: Any) -> Any:
        from botocore.exceptions import BotoCoreError, ClientError

        try:
            return fn(*args, **kwargs)
        except ClientError as e:
            code = str(e.response.get("Error", {}).get("Code", ""))
            if code in ("404", "NoSuchKey", "NotFound"):
                raise FleetforgeError(Err.ARTIFACT_NOT_FOUND, f"{what}: not found") from e
            if code in ("NoSuchBucket",):
                raise FleetforgeError(Err.STORE_UNAVAILABLE, f"{what}: bucket {self.bucket!r} does not exist") from e
            raise FleetforgeError(Err.STORE_UNAVAILABLE, f"{what}: {e}", retryable=True) from e
        except BotoCoreError as e:
            raise FleetforgeError(Err.STORE_UNAVAILABLE, f"{what}: {e}", retryable=True) from e

    def _has(self, key: str, size: int) -> bool:
        try:
            head = self._call(f"head {self._uri(key)}", self.client.head_object, Bucket=self.bucket, Key=self._key(key))
        except FleetforgeError as e:
            if e.code is Err.ARTIFACT_NOT_FOUND:
                return False
            raise
        return int(head.get("ContentLength", -1)) == size

    @staticmethod
    def _extra(sha256: str | None) -> dict[str, Any]:
        return {"Metadata": {"sha256": sha256}} if sha256 else {}

    def _upload_file(self, path: Path, key: str, sha256: str | None, progress: Progress | None = None) -> None:
        self._call(
            f"upload {self._uri(key)}", self.client.upload_file, str(path), self.bucket, self._key(key),
            ExtraArgs=self._extra(sha256), Config=self.transfer, Callback=progress,
        )

    def _upload_bytes(self, data: bytes, key: str, sha256: str | None) -> None:
        self._call(
            f"put {self._uri(key)}", self.client.put_object, Bucket=self.bucket, Key=self._key(key), Body=data,
            **self._extra(sha256),
        )

    def _download_file(self, key: str, dest: Path) -> None:
        self._call(
            f"download {self._uri(key)}", self.client.download_file, self.bucket, self._key(key), str(dest),
            Config=self.transfer,
        )

    def _download_bytes(self, key: str) -> bytes:
        obj = self._call(f"get {self._uri(key)}", self.client.get_object, Bucket=self.bucket, Key=self._key(key))
        return obj["Body"].read()

    def list_docs(self, prefix: str) -> list[str]:
        base = self._key("docs/")
        paginator = self.client.get_paginator("list_objects_v2")
        keys: list[str] = []
        pages = self._call("list", lambda: list(paginator.paginate(Bucket=self.bucket, Prefix=base + prefix)))
        for page in pages:
            keys += [o["Key"][len(base):] for o in page.get("Contents", [])]
        return sorted(keys)


def parse_store_url(url: str) -> tuple[str, str, str]:
    """(`file`|`s3`, root-or-bucket, prefix); raises STORE_URL_INVALID with what to write instead."""
    parsed = urlparse(url)
    if parsed.scheme == "file" and parsed.path and parsed.netloc in ("", "localhost"):
        return "file", unquote(parsed.path), ""
    if parsed.scheme == "s3" and parsed.netloc:
        return "s3", parsed.netloc, parsed.path.strip("/")
    raise FleetforgeError(
        Err.STORE_URL_INVALID, f"bad store URL {url!r}: use file:///ABSOLUTE/PATH or s3://BUCKET[/PREFIX]"
    )


def open_store(settings: "Settings") -> ArtifactStore:
    kind, where, prefix = parse_store_url(settings.resolved_store_url)
    if kind == "file":
        return FileStore(Path(where))
    return S3Store(where, prefix, endpoint_url=settings.s3_endpoint)
