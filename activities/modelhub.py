"""The model hub: resolve a reference (path, file://, s3://, catalog name) into an immutable
ModelRef. Read-only: the hub is never written; the model's bytes are copied into the store."""

from __future__ import annotations

import tarfile
import tempfile
import zipfile
from pathlib import Path
from typing import Any
from urllib.parse import unquote, urlparse

import yaml
from pydantic import BaseModel, ValidationError
from temporalio import activity

from activities.storage import ArtifactStore
from contracts.errors import Err, FleetforgeError, clip
from contracts.models import ModelFormat, ModelRef, OnnxInfo, TensorSpec
from contracts.settings import Settings
from contracts.uploads import UPLOAD_SCHEME


class CatalogEntry(BaseModel, frozen=True):
    path: str
    description: str = ""


class Catalog(BaseModel, frozen=True):
    models: dict[str, CatalogEntry]


def load_catalog(path: Path | None) -> Catalog:
    if path is None:
        return Catalog(models={})
    try:
        raw = yaml.safe_load(path.read_text())
        return Catalog.model_validate(raw)
    except FileNotFoundError as e:
        raise FleetforgeError(Err.CATALOG_INVALID, f"catalog {path} does not exist") from e
    except (yaml.YAMLError, ValidationError) as e:
        first = str(e).splitlines()[0:3]
        raise FleetforgeError(Err.CATALOG_INVALID, f"catalog {path} is invalid: {' '.join(first)}") from e


def sniff_format(path: Path) -> ModelFormat:
    """Decide the format from content first, the extension second."""
    if path.is_dir():
        if (path / "saved_model.pb").is_file() or (path / "saved_model.pbtxt").is_file():
            return ModelFormat.SAVED_MODEL
        raise FleetforgeError(Err.MODEL_INVALID, f"{path} is a directory but not a TensorFlow SavedModel (no saved_model.pb)")
    with open(path, "rb") as f:
        head = f.read(16)
    if len(head) >= 8 and head[4:8] == b"TFL3":
        return ModelFormat.TFLITE
    if zipfile.is_zipfile(path) or path.suffix in (".pt", ".pth", ".pt2"):
        return torch_format(path)
    if path.suffix == ".onnx":
        return ModelFormat.ONNX
    if path.suffix == ".pb":
        return ModelFormat.TF_PB
    if path.suffix == ".tflite":
        raise FleetforgeError(Err.MODEL_INVALID, f"{path} has a .tflite name but no TFL3 identifier: corrupt file?")
    raise FleetforgeError(
        Err.MODEL_INVALID, f"cannot tell the format of {path}: expected .onnx, .tflite, .pb, .pt or a SavedModel directory"
    )


SAVE_TORCH_HOW = ("save TorchScript with torch.jit.save(torch.jit.trace(model, example_inputs), 'model.pt') or an "
                  "ExportedProgram with torch.export.save(torch.export.export(model, example_inputs), 'model.pt2')")


def torch_format(path: Path) -> ModelFormat:
    """TorchScript or ExportedProgram, told apart by the archive's member names (nothing is unpickled
    here); a plain torch.save pickle (a state dict, a pickled module) is refused: it holds weights
    without the code that uses them."""
    try:
        with zipfile.ZipFile(path) as z:
            names = z.namelist()
    except (zipfile.BadZipFile, OSError):
        names = []
    tails = {n.split("/", 1)[1] if "/" in n else n for n in names}
    if "archive_format" in tails or "models/model.json" in tails:
        return ModelFormat.TORCH_EXPORT
    if "constants.pkl" in tails and any(t.startswith("code/") for t in tails):
        return ModelFormat.TORCH
    what = "a torch.save pickle (a state dict or a pickled module)" if "data.pkl" in tails or not names else "not a model archive"
    raise FleetforgeError(Err.MODEL_INVALID, f"{path.name} is {what}: weights without the code that runs them cannot be "
                          f"converted; {SAVE_TORCH_HOW}")


def external_data_files(model: Any) -> list[str]:
    """The external-data locations an ONNX model's tensors name (relative to its folder), sorted."""
    from onnx.external_data_helper import _get_all_tensors, uses_external_data

    found = set()
    for t in _get_all_tensors(model):
        if uses_external_data(t):
            found |= {e.value for e in t.external_data if e.key == "location"}
    return sorted(found)


def _sidecar_paths(path: Path, locations: list[str]) -> list[Path]:
    """Each external-data file beside `path`: a relative path inside the model's folder, a regular file."""
    from activities.sandbox import safe_join

    out = []
    for loc in locations:
        try:
            p = safe_join(path.parent, loc)
        except FleetforgeError as e:
            raise FleetforgeError(Err.MODEL_INVALID, f"{path.name} names external data {loc!r} outside its folder") from e
        if not p.is_file():
            raise FleetforgeError(Err.MODEL_INVALID, f"{path.name} keeps its weights in {loc!r}, which is not beside it "
                                  f"({p.parent}): copy {loc} next to {path.name}")
        out.append(p)
    return out


def _dims(type_proto: Any) -> tuple[str, list[int | str]]:
    import onnx

    t = type_proto.tensor_type
    dtype = onnx.helper.tensor_dtype_to_np_dtype(t.elem_type).name if t.elem_type else "undefined"
    shape: list[int | str] = [d.dim_value if d.HasField("dim_value") else (d.dim_param or "?") for d in t.shape.dim]
    return dtype, shape


def onnx_info(path: Path) -> OnnxInfo:
    """Read the graph's interface with onnx (protobuf parse + checker), without loading weights twice."""
    try:
        import onnx
    except ImportError as e:
        raise FleetforgeError(Err.TOOLCHAIN_UNAVAILABLE, "reading ONNX models needs the `onnx` package: pip install 'fleetforge[toolchains]'") from e
    try:
        model = onnx.load(str(path), load_external_data=False)
        external = external_data_files(model)
        _sidecar_paths(path, external)
        # by path: the checker then resolves external data against the model's folder, not the cwd
        onnx.checker.check_model(str(path) if external else model)
    except FleetforgeError:
        raise
    except Exception as e:  # onnx raises DecodeError, ValidationError, ... depending on the damage
        raise FleetforgeError(Err.MODEL_INVALID, f"{path.name} is not a valid ONNX model: {clip(str(e).splitlines()[0], 200)}") from e
    inits = {i.name for i in model.graph.initializer}
    inputs = [TensorSpec(name=i.name, dtype=d, shape=s) for i in model.graph.input if i.name not in inits for d, s in [_dims(i.type)]]
    outputs = [TensorSpec(name=o.name, dtype=d, shape=s) for o in model.graph.output for d, s in [_dims(o.type)]]
    opset = next((o.version for o in model.opset_import if o.domain in ("", "ai.onnx")), 0)
    return OnnxInfo(
        inputs=inputs, outputs=outputs, opset=opset, ir_version=model.ir_version,
        producer=model.producer_name, node_count=len(model.graph.node),
    )


def _tar_dir(path: Path, dest: Path) -> None:
    """A deterministic tar of a SavedModel directory (sorted, zero mtimes), so its sha256 is stable."""
    with tarfile.open(dest, "w") as tar:
        for p in sorted(path.rglob("*")):
            info = tar.gettarinfo(str(p), arcname=str(p.relative_to(path)))
            info.mtime, info.uid, info.gid, info.uname, info.gname = 0, 0, 0, "", ""
            if p.is_file():
                with open(p, "rb") as f:
                    tar.addfile(info, f)
            else:
                tar.addfile(info)


class ModelHub:
    def __init__(self, store: ArtifactStore, settings: Settings):
        self.store = store
        self.settings = settings

    def locate(self, reference: str) -> tuple[str, Path]:
        """(display name, local path) of a reference; s3:// models are downloaded into the cache."""
        parsed = urlparse(reference)
        if parsed.scheme == UPLOAD_SCHEME:  # what the client shipped (contracts/uploads.py)
            from activities.uploads import fetch_upload

            return Path(parsed.path).name or parsed.netloc, fetch_upload(self.store, self.settings.cache_dir, reference)
        if parsed.scheme == "s3":
            return Path(parsed.path).name, self._fetch_s3(parsed.netloc, parsed.path.lstrip("/"))
        if parsed.scheme == "file":
            path = Path(unquote(parsed.path))
        elif parsed.scheme in ("", ) or len(parsed.scheme) == 1:
            path = Path(reference).expanduser()
            catalog = load_catalog(self.settings.catalog)
            if not path.exists() and reference in catalog.models:
                entry = catalog.models[reference]
                return reference, self.locate(entry.path)[1]
            if not path.exists() and "/" not in reference and not path.suffix:
                known = ", ".join(sorted(catalog.models)) or "none (set FLEETFORGE_CATALOG)"
                raise FleetforgeError(Err.MODEL_NOT_FOUND, f"no model file or catalog entry named {reference!r}; catalog names: {known}")
        else:
            raise FleetforgeError(Err.MODEL_NOT_FOUND, f"unsupported model reference scheme {parsed.scheme!r} in {reference!r}")
        if not path.exists():
            raise FleetforgeError(Err.MODEL_NOT_FOUND, f"model file {path} does not exist")
        return path.name, path.resolve()

    def _fetch_s3(self, bucket: str, key: str) -> Path:
        import boto3
        from botocore.exceptions import BotoCoreError, ClientError

        dest = self.settings.cache_dir / "hub" / bucket / key
        dest.parent.mkdir(parents=True, exist_ok=True)
        try:
            boto3.client("s3", endpoint_url=self.settings.s3_endpoint).download_file(bucket, key, str(dest))
        except (ClientError, BotoCoreError) as e:
            raise FleetforgeError(Err.MODEL_NOT_FOUND, f"cannot read s3://{bucket}/{key}: {e}") from e
        return dest

    def resolve(self, reference: str) -> ModelRef:
        name, path = self.locate(reference)
        fmt = sniff_format(path)
        info = onnx_info(path) if fmt is ModelFormat.ONNX else None
        if fmt is ModelFormat.SAVED_MODEL:
            with tempfile.TemporaryDirectory() as tmp:
                packed = Path(tmp) / f"{path.name}.tar"
                _tar_dir(path, packed)
                artifact = self.store.put_file(packed, media_type="application/x-tar", name=packed.name)
            filename = f"{path.name}.tar"
        else:
            artifact = self.store.put_file(path, media_type=f"application/{fmt.value}", name=path.name)
            filename = path.name
        sidecars = []
        if fmt is ModelFormat.ONNX:
            import onnx

            locations = external_data_files(onnx.load(str(path), load_external_data=False))
            sidecars = [self.store.put_file(p, name=loc) for loc, p in zip(locations, _sidecar_paths(path, locations))]
        return ModelRef(
            name=name, source=_source(self.store, reference), format=fmt, sha256=artifact.sha256, size=artifact.size,
            artifact=artifact, filename=filename, onnx=info, sidecars=sidecars,
        )


def _source(store: ArtifactStore, reference: str) -> str:
    """The reference as the user gave it: a shipped input's path on the client."""
    if not reference.startswith(f"{UPLOAD_SCHEME}://"):
        return reference
    from activities.uploads import shipped_source

    return shipped_source(store, reference)


class ModelHubActivities:
    def __init__(self, hub: ModelHub):
        self.hub = hub

    @activity.defn
    def resolve_model(self, reference: str) -> ModelRef:
        activity.heartbeat(f"resolving {reference}")
        return self.hub.resolve(reference)
