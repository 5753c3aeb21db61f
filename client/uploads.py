"""Shipping what the user points at to the artifact store (issue 28): a job reads only the store.

`Uploader.ship_model("m.onnx")` uploads the model (with the external-data files it names, or a
SavedModel folder's every file) and returns `upload://<manifest sha256>/m.onnx`, the reference the
request carries (contracts/uploads.py). Blobs are content-addressed: a file the store already has
is not sent again (a HEAD, no PUT). `progress(name, done, total)` is told of every big file's bytes.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path, PurePosixPath

from activities.storage import ArtifactStore, sha256_file
from client.paths import local_path
from contracts.common import ArtifactRef
from contracts.errors import Err, FleetforgeError
from contracts.uploads import UploadManifest, upload_uri

UploadProgress = Callable[[str, int, int], None]
"""(file name, bytes sent so far, file size); called only for files of BIG_FILE bytes or more."""

BIG_FILE = 16 * 1024 * 1024


def onnx_sidecars(model: Path) -> list[str]:
    """The external-data files an ONNX model names (relative to its folder). Without the `onnx`
    package, or for a file it cannot parse, the conventional `<model>.data` / `<stem>.data` next to it."""
    try:
        import onnx
        from onnx.external_data_helper import _get_all_tensors, uses_external_data

        proto = onnx.load(str(model), load_external_data=False)
        names = sorted({entry.value for t in _get_all_tensors(proto) if uses_external_data(t)
                        for entry in t.external_data if entry.key == "location"})
    except Exception:  # ImportError, or a file onnx cannot read: the worker says what is wrong with it
        names = [n for n in (model.name + ".data", model.stem + ".data") if (model.parent / n).is_file()]
    for name in names:
        rel = PurePosixPath(name)
        if rel.is_absolute() or ".." in rel.parts or not (model.parent / name).is_file():
            raise FleetforgeError(Err.MODEL_INVALID, f"{model.name} names external data {name!r}, which is not a file "
                                  f"next to it in {model.parent}: keep the model and its .data files in one folder")
    return names


def input_files(path: Path, *, model: bool) -> tuple[Path, list[str], str]:
    """(folder, files relative to it, entry) of a local input: a folder ships every file under it
    (entry `.`); a model file ships with its sidecars; any other file alone."""
    if path.is_dir():
        files = sorted(str(p.relative_to(path).as_posix()) for p in path.rglob("*") if p.is_file())
        if not files:
            raise FleetforgeError(Err.BAD_INPUT, f"{path} is an empty folder")
        return path, files, "."
    sidecars = onnx_sidecars(path) if model and path.suffix == ".onnx" else []
    return path.parent, [path.name, *sidecars], path.name


class Uploader:
    """Uploads local inputs into `store` (the client's; it must be the workers' store too)."""

    def __init__(self, store: ArtifactStore, progress: UploadProgress | None = None):
        self.store = store
        self.progress = progress

    def ship_model(self, reference: str, cwd: Path | None = None) -> str:
        """The model reference as a worker reads it: a local file/folder uploaded, else unchanged."""
        return self._ship(reference, cwd, model=True)

    def ship_calibration(self, reference: str, cwd: Path | None = None) -> str:
        """Calibration data (an .npz or a folder of them) as a worker reads it, like `ship_model`."""
        return self._ship(reference, cwd, model=False)

    def _ship(self, reference: str, cwd: Path | None, *, model: bool) -> str:
        path = local_path(reference, cwd)
        if path is None:
            return reference
        folder, names, entry = input_files(path, model=model)
        refs = [self.put(folder / name, name) for name in names]
        manifest = UploadManifest(files=refs, entry=entry, source=str(path), store=self.store.url)
        blob = self.store.put_bytes(manifest.model_dump_json().encode(), media_type="application/json",
                                    name="upload.json")
        return upload_uri(blob.sha256, path.name if entry == "." else entry)

    def put(self, path: Path, name: str) -> ArtifactRef:
        """One file into the store (nothing sent when its blob is there already)."""
        size = path.stat().st_size
        sha = sha256_file(path)
        progress = None
        if self.progress is not None and size >= BIG_FILE:
            report, sent = self.progress, [0]

            def progress(n: int) -> None:
                sent[0] += n
                report(name, sent[0], size)
        return self.store.put_file(path, name=name, progress=progress, sha256=sha)
