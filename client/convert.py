"""The convert (and inspect) job rules, for every front door: check what the user asked before a
job starts (BAD_INPUT / MODEL_NOT_FOUND / MODEL_INVALID, so the CLI exits 2 and an MCP tool call
fails at once), ship local inputs to the store (client/uploads.py), and build a rerun's request
from the earlier run's record. Pure checks first, I/O (store, model parse) only where named."""

from __future__ import annotations

from pathlib import Path
from typing import Any
from urllib.parse import urlparse

from activities.storage import ArtifactStore
from client.paths import is_uri, local_path
from client.uploads import Uploader
from contracts.common import JobKind
from contracts.convert_job import ConversionRequest, ProvideInput
from contracts.errors import Err, FleetforgeError
from contracts.settings import Settings

RERUN_KEEPS = ("model", "target_soc", "precision", "output", "toolchain", "preset", "calibration", "min_cosine", "eval_data",
               "eval_samples", "synthetic_calibration", "precision_fallback", "input_shapes")
"""What a rerun takes over from the earlier conversion's request."""


def check_soc(soc: str | None) -> None:
    """BAD_INPUT for a SoC no toolchain knows (the same validator as the job's answer update)."""
    if soc is None:
        return
    from workflows.converter_policy import answer_problems

    problems = answer_problems(ProvideInput(soc=soc))
    if problems:
        raise FleetforgeError(Err.BAD_INPUT, "; ".join(problems))


def check_request(request: ConversionRequest) -> None:
    """BAD_INPUT for a combination no plan can satisfy (w8a16 as ORT, ...)."""
    from activities.toolchains.offline_planner import request_problems

    problems = request_problems(request)
    if problems:
        raise FleetforgeError(Err.BAD_INPUT, problems[0])


def check_model(reference: str, settings: Settings, cwd: Path | None = None) -> Path | None:
    """The local model file a reference names (None: a URI or catalog name, the worker resolves it).
    MODEL_NOT_FOUND for a path that does not exist or a name not in the catalog (FLEETFORGE_CATALOG,
    which the client and workers share), MODEL_INVALID for a file that is no model (when the client
    has `onnx`; without it the worker checks)."""
    from activities.modelhub import load_catalog, onnx_info, sniff_format
    from contracts.models import ModelFormat

    if is_uri(reference) and urlparse(reference).scheme != "file":
        return None
    path = local_path(reference, cwd)
    if path is None:
        looks_like_path = "/" in reference or Path(reference).suffix or reference.startswith(("file:", "~", "."))
        if looks_like_path:
            shown = Path(reference).expanduser() if Path(reference).is_absolute() else (cwd or Path.cwd()) / reference
            raise FleetforgeError(Err.MODEL_NOT_FOUND, f"model file {shown} does not exist (nor a catalog name)")
        catalog = load_catalog(settings.catalog)
        if reference not in catalog.models:
            known = ", ".join(sorted(catalog.models)) or "none (set FLEETFORGE_CATALOG)"
            raise FleetforgeError(Err.MODEL_NOT_FOUND, f"no model file or catalog entry named {reference!r}; "
                                                       f"catalog names: {known}")
        return None  # a catalog name: the worker resolves it
    if sniff_format(path) is ModelFormat.ONNX:
        try:
            onnx_info(path)
        except FleetforgeError as e:
            if e.code is not Err.TOOLCHAIN_UNAVAILABLE:  # the client lacks onnx: the worker checks
                raise
    return path


def check_calibration(value: str, model: Path | None, cwd: Path | None = None, option: str = "--calibration") -> None:
    """BAD_INPUT for calibration (or evaluation, `option` --eval-data) data that is missing or does not fit
    the model's inputs (checked here when the model is local and onnx/numpy are installed; else the worker)."""
    if is_uri(value) and urlparse(value).scheme != "file":
        return
    path = local_path(value, cwd)
    if path is None:
        raise FleetforgeError(Err.BAD_INPUT, f"{option} {value}: no such file or folder (an .npz, or a folder of them)")
    if model is None or not _is_onnx(model):  # a PyTorch model's inputs are known once it is exported (worker)
        return
    try:
        from activities.toolchains.feeds import check_values, graph_inputs, read_npz, samples_of

        check_values(samples_of(read_npz(path), graph_inputs(model)), model)
    except ImportError:
        pass
    except FleetforgeError as e:
        if e.code in (Err.CALIBRATION_INVALID, Err.CALIBRATION_NEEDED):
            raise FleetforgeError(Err.BAD_INPUT, f"{option} {value}: {e.message}") from None
        raise


def _is_onnx(model: Path) -> bool:
    from activities.modelhub import sniff_format
    from contracts.models import ModelFormat

    try:
        return sniff_format(model) is ModelFormat.ONNX
    except FleetforgeError:
        return False


def input_shapes(items: list[str]) -> dict[str, Any]:
    """`--input-shape NAME=1,3,224,224[:int64]` items as the request's input_shapes; BAD_INPUT says what is wrong."""
    from contracts.convert_job import parse_input_shape

    try:
        return dict(parse_input_shape(item) for item in items)
    except ValueError as e:
        raise FleetforgeError(Err.BAD_INPUT, str(e)) from e


def convert_request(
    model: str, *, settings: Settings, soc: str | None = None, precision: str | None = None,
    calibration: str | None = None, cwd: Path | None = None, **fields: Any,
) -> ConversionRequest:
    """A checked ConversionRequest (local paths not yet shipped), without any connection, so a front
    door can refuse bad input before it connects: BAD_INPUT for an unknown SoC, a combination no plan
    can satisfy or calibration data that does not fit the model; MODEL_NOT_FOUND, MODEL_INVALID."""
    check_soc(soc)
    request = ConversionRequest(model=model, target_soc=soc, precision=precision, calibration=calibration, **fields)
    check_request(request)
    local = check_model(model, settings, cwd)
    if calibration is not None:
        check_calibration(calibration, local, cwd)
    if request.eval_data is not None:
        check_calibration(request.eval_data, local, cwd, "--eval-data")
    return request


def shipped_request(request: ConversionRequest, uploader: Uploader, cwd: Path | None = None) -> ConversionRequest:
    """The request with its local model and calibration uploaded (store references in their place)."""
    update: dict[str, Any] = {"model": uploader.ship_model(request.model, cwd)}
    for field in ("calibration", "eval_data"):  # user data for the worker: shipped like the calibration
        if getattr(request, field):
            update[field] = uploader.ship_calibration(getattr(request, field), cwd)
    return request.model_copy(update=update)


def rerun_fields(store: ArtifactStore, run_id: str, model: str | None, overrides: dict[str, str],
                 min_cosine: float | None = None, uploader: Uploader | None = None) -> dict[str, Any]:
    """For a rerun: the earlier conversion's request fields, with the overrides that are request
    fields (soc, precision) applied, so the new run's record says what it builds. A `model` given
    must be the earlier run's. The overrides are applied to the earlier plan here too, so an unknown
    key or an impossible precision is BAD_INPUT before any job starts."""
    from activities.experiments import RunStore
    from activities.toolchains.registry import default_registry
    from activities.toolchains.rerun import apply_overrides, earlier_plan

    try:
        record = RunStore(store).get(run_id)
    except FleetforgeError as e:
        if e.code is Err.RUN_NOT_FOUND:
            raise FleetforgeError(Err.BAD_INPUT, f"{e.message}; --rerun takes the run id a conversion printed") from e
        raise
    earlier = record.request if isinstance(record.request, dict) else {}
    if record.kind is not JobKind.CONVERT or not earlier.get("model"):
        raise FleetforgeError(Err.BAD_INPUT, f"run {run_id} is not a conversion; --rerun takes a convert run id")
    if model is not None and earlier["model"] not in _names_of(model, uploader):
        raise FleetforgeError(Err.BAD_INPUT, f"run {run_id} converted {earlier['model']}, not {model}; "
                                             "drop MODEL or start a new conversion")
    request = {k: earlier[k] for k in RERUN_KEEPS if k in earlier}
    for arg, field in (("soc", "target_soc"), ("precision", "precision")):
        if arg in overrides:
            request[field] = overrides[arg]
    if min_cosine is not None:
        request["min_cosine"] = min_cosine
    if overrides:
        apply_overrides(earlier_plan(store, run_id), overrides, default_registry())  # BAD_INPUT before a job starts
    return request


def _names_of(model: str, uploader: Uploader | None) -> set[str]:
    """Every way a request may have named this model: as given, as an absolute path, as shipped."""
    names = {model}
    path = local_path(model)
    if path is not None:
        names.add(str(path))
        if uploader is not None:
            names.add(uploader.ship_model(model))
    return names


def resolve_local(reference: str) -> str:
    """A local path made absolute; URIs and names unchanged (what requests carried before uploads)."""
    path = local_path(reference)
    return str(path) if path is not None else reference
