"""`fleetforge convert --rerun`: the new run's request comes from the earlier run's record, with the
--set overrides that are request fields applied (so its record says what it builds); overrides no
step of the earlier plan takes, or that no plan can satisfy, are bad input before any job starts."""

from __future__ import annotations

from datetime import datetime, timezone
from pathlib import Path

import pytest

from activities.experiments import RunStore
from activities.storage import FileStore
from activities.toolchains.offline_planner import plan_offline
from activities.toolchains.registry import default_registry
from activities.workspace import Workspace
from client.convert import resolve_local, rerun_fields
from contracts.common import JobKind, JobStatus
from contracts.convert import OutputKind, Precision
from contracts.convert_job import ConversionRequest
from contracts.errors import Err, FleetforgeError
from contracts.runs import RunRecord, WorkspaceRef
from tests.unit.test_convert_presets import _model

EARLIER = {"model": "hub/tiny.onnx", "target_soc": "sm8550", "precision": "int8", "output": "qnn_context_binary",
           "toolchain": "auto", "preset": "balanced", "calibration": None, "user_id": "ana"}
NO_MODEL = {"model": None}


def rerun_request(store: FileStore, run_id: str, given: dict, overrides: dict) -> dict:
    """The SDK's rule (client/convert.py, moved out of the CLI), called as the CLI used to."""
    return rerun_fields(store, run_id, given["model"], overrides)


@pytest.fixture
def store(tmp_path: Path) -> FileStore:
    store = FileStore(tmp_path / "artifacts")
    now = datetime.now(timezone.utc)
    for run_id, kind in (("conv-1", JobKind.CONVERT), ("insp-1", JobKind.INSPECT), ("ort-1", JobKind.CONVERT)):
        RunStore(store).put(RunRecord(run_id=run_id, user_id="ana", kind=kind, status=JobStatus.COMPLETED,
                                      workflow_id=f"{kind.value}/{run_id}", request=EARLIER, created_at=now, updated_at=now))
    for run_id, output in (("conv-1", OutputKind.QNN_CONTEXT_BINARY), ("ort-1", OutputKind.ORT)):
        ws = Workspace(store, tmp_path / "cache", WorkspaceRef(run_id=run_id, user_id="ana"))
        plan = plan_offline(ConversionRequest(model="hub/tiny.onnx", target_soc="sm8550", precision=Precision.INT8,
                                              output=output), _model(), default_registry())
        ws.write_json("plan.json", plan.model_dump(mode="json"))
        ws.push(["plan.json"])
    return store


def test_rerun_takes_the_earlier_request_and_applies_request_field_overrides(store: FileStore):
    assert rerun_request(store, "conv-1", NO_MODEL, {}) == {k: v for k, v in EARLIER.items() if k != "user_id"}
    changed = rerun_request(store, "conv-1", NO_MODEL, {"precision": "fp16", "soc": "sm8650"})
    assert (changed["precision"], changed["target_soc"], changed["model"]) == ("fp16", "sm8650", "hub/tiny.onnx")


@pytest.mark.parametrize("run_id, given, fragment", [
    ("nope", NO_MODEL, "--rerun takes the run id"),
    ("insp-1", NO_MODEL, "is not a conversion"),
    ("conv-1", {"model": "other.onnx"}, "drop MODEL"),
])
def test_rerun_of_an_unknown_or_wrong_run_is_bad_input(store: FileStore, run_id: str, given: dict, fragment: str):
    with pytest.raises(FleetforgeError) as e:
        rerun_request(store, run_id, given, {})
    assert e.value.code is Err.BAD_INPUT and fragment in e.value.message


@pytest.mark.parametrize("run_id, overrides, fragment", [
    ("conv-1", {"turbo": "1"}, "args you can --set"),
    ("conv-1", {"soc": "sm9999"}, "sm8650"),
    ("ort-1", {"precision": "w8a16"}, "not w8a16"),
    ("insp-1", {}, "is not a conversion"),
])
def test_overrides_no_plan_can_take_are_bad_input_before_a_job_starts(store: FileStore, run_id: str,
                                                                       overrides: dict, fragment: str):
    with pytest.raises(FleetforgeError) as e:
        rerun_request(store, run_id, NO_MODEL, overrides)
    assert e.value.code is Err.BAD_INPUT and fragment in e.value.message, e.value.message


def test_a_relative_model_path_becomes_absolute_and_names_stay_names(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    (tmp_path / "m.onnx").write_bytes(b"onnx")
    monkeypatch.chdir(tmp_path)
    assert resolve_local("m.onnx") == str(tmp_path / "m.onnx")
    assert resolve_local("./m.onnx") == str(tmp_path / "m.onnx")
    assert resolve_local("resnet-catalog-name") == "resnet-catalog-name"
    assert resolve_local("s3://bucket/m.onnx") == "s3://bucket/m.onnx"


def test_input_shapes_ride_a_rerun_and_a_bad_input_shape_is_bad_input_before_anything_connects(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]):
    """--input-shape (convert-inputs) in the SDK: parsed into the request's input_shapes, kept by a rerun
    (RERUN_KEEPS), and text that is no shape is exit 2 naming it, before any connection."""
    from client.cli import run
    from client.convert import RERUN_KEEPS, input_shapes

    shapes = input_shapes(["pixel_values=1,3,224,224", "ids=1,128:int64"])
    assert {k: (v.dims, v.dtype) for k, v in shapes.items()} == {"pixel_values": ([1, 3, 224, 224], "float32"),
                                                                 "ids": ([1, 128], "int64")}
    assert "input_shapes" in RERUN_KEEPS
    earlier = ConversionRequest(model="m.pt", input_shapes=shapes).model_dump(mode="json")
    assert ConversionRequest(**{k: earlier[k] for k in RERUN_KEEPS if k in earlier}).input_shapes == shapes
    with pytest.raises(FleetforgeError) as e:
        input_shapes(["pixel_values"])
    assert e.value.code is Err.BAD_INPUT and "pixel_values" in e.value.message
    model = tmp_path / "m.pt"
    model.write_bytes(b"not read: the shape is refused first")
    capsys.readouterr()
    assert run(["convert", str(model), "--soc", "sm8550", "--precision", "fp16", "--input-shape", "x=1,a"]) == 2
    assert "x=1,a" in capsys.readouterr().err
