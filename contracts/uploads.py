"""What the client ships to the artifact store for a job, and how a request names it.

A job never reads the client's disk: the SDK uploads every local input (a model file with its
external-data sidecars, a SavedModel directory, calibration files or folders) as content-addressed
blobs plus one small manifest blob, and the request carries `upload://<manifest sha256>/<name>` (the name only for people to read).
A worker fetches the manifest and its files from *its* store into a cache folder and opens
`<folder>/<manifest.entry>`. So the client and the workers must share one store (S3/MinIO across machines).
"""

from __future__ import annotations

from pydantic import BaseModel, Field

from contracts.common import ArtifactRef

UPLOAD_SCHEME = "upload"


class UploadManifest(BaseModel, frozen=True):
    """The files of one shipped input, each under its path relative to the input's folder."""

    files: list[ArtifactRef] = Field(default_factory=list)
    """`name` is the file's relative POSIX path (no `..`, not absolute); sorted by name."""
    entry: str
    """What the job opens, relative to the folder: the model file, or `.` for a directory input."""
    source: str = ""
    """Where the client read it (for messages only; never opened by a worker)."""
    store: str = ""
    """The client's store URL when it uploaded (for the not-shared-store message)."""


def upload_uri(manifest_sha256: str, name: str) -> str:
    return f"{UPLOAD_SCHEME}://{manifest_sha256}/{name}"


def parse_upload_uri(uri: str) -> tuple[str, str] | None:
    """(manifest sha256, display name) of an `upload://` reference; None for anything else."""
    prefix = f"{UPLOAD_SCHEME}://"
    if not uri.startswith(prefix):
        return None
    sha, _, entry = uri[len(prefix):].partition("/")
    if len(sha) != 64 or any(c not in "0123456789abcdef" for c in sha):
        return None
    return sha, entry or "."
