"""Worker side of shipped inputs (contracts/uploads.py): fetch an `upload://` reference from the
store into the cache, each file sha256-checked, and return the local path the job opens.

The cache folder is named by the manifest's sha256, so a second job on the same input downloads
nothing. A manifest this worker's store lacks means the client uploaded into another store (a
`file://` store on the client's machine): STORE_NOT_SHARED, at once and with the fix, never a
MODEL_NOT_FOUND on a path the user can see."""

from __future__ import annotations

from pathlib import Path

from activities.sandbox import safe_join
from activities.storage import ArtifactStore
from contracts.common import ArtifactRef
from contracts.errors import Err, FleetforgeError
from contracts.uploads import UploadManifest, parse_upload_uri


def not_shared(uri: str, store: ArtifactStore, manifest: UploadManifest | None = None) -> FleetforgeError:
    where = f" (the client's store: {manifest.store})" if manifest is not None and manifest.store else ""
    return FleetforgeError(
        Err.STORE_NOT_SHARED,
        f"{uri} was uploaded by the client to a store this worker cannot read{where}; this worker's store is "
        f"{store.url}. Client and workers must share one store: set FLEETFORGE_STORE_URL=s3://BUCKET/PREFIX "
        "(and FLEETFORGE_S3_ENDPOINT) for both; a file:// store works only when they share its folder")


def fetch_upload(store: ArtifactStore, cache_dir: Path, uri: str) -> Path:
    """The local path of the shipped input `uri` (downloaded into `cache_dir/uploads/<sha256>/`)."""
    parsed = parse_upload_uri(uri)
    if parsed is None:
        raise FleetforgeError(Err.MODEL_NOT_FOUND, f"{uri!r} is not an upload reference (upload://SHA256/NAME)")
    sha, _ = parsed
    try:
        raw = store.get_bytes(ArtifactRef(uri=uri, sha256=sha, size=0))
    except FleetforgeError as e:
        if e.code is Err.ARTIFACT_NOT_FOUND:
            raise not_shared(uri, store) from None
        raise
    manifest = UploadManifest.model_validate_json(raw)
    folder = cache_dir / "uploads" / sha
    for ref in manifest.files:
        dest = safe_join(folder, ref.name)  # PATH_ESCAPE for a name that would leave the folder
        try:
            store.get_file(ref, dest)
        except FleetforgeError as e:
            if e.code is Err.ARTIFACT_NOT_FOUND:
                raise not_shared(uri, store, manifest) from None
            raise
    return folder if manifest.entry == "." else safe_join(folder, manifest.entry)


def shipped_source(store: ArtifactStore, uri: str) -> str:
    """Where the client read a shipped input (its path there, for people), else `uri` itself."""
    parsed = parse_upload_uri(uri)
    if parsed is None:
        return uri
    try:
        manifest = UploadManifest.model_validate_json(store.get_bytes(ArtifactRef(uri=uri, sha256=parsed[0], size=0)))
    except FleetforgeError:
        return uri
    return manifest.source or uri
