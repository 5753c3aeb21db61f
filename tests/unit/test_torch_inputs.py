"""PyTorch files in: what is refused (a torch.save pickle), what each archive is, the export step (input
shapes, exporter and opset recorded), and the evaluation's reference being the torch module itself."""

from __future__ import annotations

import warnings
from pathlib import Path

import numpy as np
import pytest

torch = pytest.importorskip("torch")
onnx = pytest.importorskip("onnx")

from activities.modelhub import sniff_format  # noqa: E402
from activities.toolchains.evaluate import EvalParams, evaluate  # noqa: E402
from activities.toolchains.torch_export import TorchExportParams, export_onnx  # noqa: E402
from contracts.errors import Err, FleetforgeError  # noqa: E402
from contracts.models import ModelFormat  # noqa: E402

X = torch.from_numpy(np.random.default_rng(0).standard_normal((1, 3, 8, 8)).astype(np.float32))


def net(seed: int) -> "torch.nn.Module":
    torch.manual_seed(seed)
    return torch.nn.Sequential(torch.nn.Conv2d(3, 4, 3, padding=1), torch.nn.ReLU(), torch.nn.Flatten(),
                               torch.nn.Linear(256, 5)).eval()


def save_ts(module, path: Path) -> Path:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.jit.save(torch.jit.trace(module, X), str(path))
    return path


def save_ep(module, path: Path, dynamic: bool = False) -> Path:
    shapes = ({0: torch.export.Dim("batch", min=1, max=8)},) if dynamic else None
    example = torch.cat([X, X]) if dynamic else X  # a batch of 1 would specialise the dim
    torch.export.save(torch.export.export(module, (example,), dynamic_shapes=shapes), str(path))
    return path


@pytest.mark.parametrize("what", ["state_dict", "whole_module"])
def test_a_torch_save_pickle_is_refused_saying_how_to_save_torchscript_or_an_exported_program(tmp_path: Path, what: str):
    path = tmp_path / "model.pth"
    torch.save(net(0).state_dict() if what == "state_dict" else net(0), str(path))
    with pytest.raises(FleetforgeError) as e:
        sniff_format(path)
    assert e.value.code is Err.MODEL_INVALID
    assert "torch.save pickle" in e.value.message
    assert "torch.jit.save(torch.jit.trace(model" in e.value.message and "torch.export.save(torch.export.export(model" in e.value.message


def test_torchscript_and_an_exported_program_are_told_apart_by_their_archives(tmp_path: Path):
    assert sniff_format(save_ts(net(0), tmp_path / "m.pt")) is ModelFormat.TORCH
    assert sniff_format(save_ep(net(0), tmp_path / "m.pt2")) is ModelFormat.TORCH_EXPORT


def test_torchscript_needs_input_shapes_and_the_error_names_its_inputs(tmp_path: Path):
    save_ts(net(0), tmp_path / "m.pt")
    with pytest.raises(FleetforgeError) as e:
        export_onnx(tmp_path, TorchExportParams(model="m.pt", output="out/m.onnx"))
    assert e.value.code is Err.INPUT_SHAPE_NEEDED and "--input-shape" in e.value.message and "input" in e.value.message


@pytest.mark.parametrize("missing", ["torch", "onnxscript"])
def test_a_worker_without_the_torch_export_extra_says_so_and_is_not_replanned(tmp_path: Path, monkeypatch, missing: str):
    """Before, the step failed EXECUTOR_ERROR "No module named 'torch'" with the advice to try another --preset."""
    import importlib.util

    from workflows.converter_policy import NOT_REPLANNABLE

    save_ts(net(0), tmp_path / "m.pt")
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == missing else real(name, *a))
    with pytest.raises(FleetforgeError) as e:
        export_onnx(tmp_path, TorchExportParams(model="m.pt", output="out/m.onnx", input_shapes=["input=1,3,8,8"]))
    assert e.value.code is Err.TOOLCHAIN_UNAVAILABLE and e.value.code in NOT_REPLANNABLE
    assert f"needs {missing} on the worker" in e.value.message and "fleetforge[torch-export]" in e.value.message


def test_a_dynamic_exported_program_needs_input_shapes_and_exports_static_with_them(tmp_path: Path):
    save_ep(net(0), tmp_path / "m.pt2", dynamic=True)
    with pytest.raises(FleetforgeError) as e:
        export_onnx(tmp_path, TorchExportParams(model="m.pt2", output="out/m.onnx"))
    assert e.value.code is Err.INPUT_SHAPE_NEEDED and "dynamic" in e.value.message
    with pytest.raises(FleetforgeError, match="names no input"):
        export_onnx(tmp_path, TorchExportParams(model="m.pt2", output="out/m.onnx", input_shapes=["x=2,3,8,8"]))
    out = export_onnx(tmp_path, TorchExportParams(model="m.pt2", output="out/m.onnx", input_shapes=["input=2,3,8,8"]))
    dims = [d.dim_value for d in onnx.load(str(tmp_path / "out/m.onnx")).graph.input[0].type.tensor_type.shape.dim]
    assert dims == [2, 3, 8, 8] and out.details["format"] == "exported_program"


def test_a_dynamic_exported_program_exports_the_model_as_it_was_captured_in_eval_and_does_not_warn(tmp_path: Path):
    """ExportedProgram.module() is a new GraphModule whose flag says training; its graph is what
    torch.export captured, so batch norm keeps its running statistics and dropout is off."""
    import onnxruntime as ort

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Conv2d(3, 4, 3), torch.nn.BatchNorm2d(4), torch.nn.Dropout(0.5)).eval()
    with torch.no_grad():
        model[1].running_mean.fill_(0.3), model[1].running_var.fill_(2.0)
    save_ep(model, tmp_path / "m.pt2", dynamic=True)
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        export_onnx(tmp_path, TorchExportParams(model="m.pt2", output="m.onnx", input_shapes=["input=1,3,8,8"]))
    assert not [w for w in seen if "training mode" in str(w.message)], [str(w.message) for w in seen]
    (y,) = ort.InferenceSession(str(tmp_path / "m.onnx")).run(None, {"input": X.numpy()})
    with torch.no_grad():
        assert np.abs(y - model(X).numpy()).max() < 1e-5, "eval-mode outputs (training mode differs by about 4.6 here)"


@pytest.mark.parametrize("suffix", [".pt", ".pt2"])
def test_the_export_writes_one_onnx_file_recording_exporter_and_opset(tmp_path: Path, suffix: str):
    (save_ts if suffix == ".pt" else save_ep)(net(0), tmp_path / f"m{suffix}")
    shapes = ["input=1,3,8,8"] if suffix == ".pt" else []
    out = export_onnx(tmp_path, TorchExportParams(model=f"m{suffix}", output="out/m.onnx", input_shapes=shapes))
    assert out.outputs == ["out/m.onnx"] and not (tmp_path / "out/m.onnx.data").exists(), "weights inline"
    model = onnx.load(str(tmp_path / "out/m.onnx"))
    meta = {p.key: p.value for p in model.metadata_props}
    assert meta["fleetforge.torch"] == torch.__version__ and "torch.onnx.export" in meta["fleetforge.exporter"]
    assert out.details["opset"] == next(o.version for o in model.opset_import if o.domain == "") > 0


def test_the_evaluation_takes_its_reference_outputs_from_the_torch_module(tmp_path: Path):
    save_ts(net(0), tmp_path / "a.pt")
    save_ts(net(1), tmp_path / "b.pt")
    export_onnx(tmp_path, TorchExportParams(model="a.pt", output="a.onnx", input_shapes=["input=1,3,8,8"]))
    same = evaluate(tmp_path, EvalParams(reference="a.onnx", candidate="a.onnx", source="a.pt"))
    other = evaluate(tmp_path, EvalParams(reference="a.onnx", candidate="a.onnx", source="b.pt"))
    assert same.cosine > 0.9999, "the export of a.pt computes what a.pt computes"
    assert other.cosine < 0.9, "with b.pt as the source the figures are b's: the torch module answered, not a.onnx"


def test_calibration_data_for_a_torch_model_is_ingested_and_checked_against_the_exported_onnx(tmp_path: Path):
    """The .pt has no ONNX graph to check the data against when the data is copied in (the export is a
    plan step): ingestion keeps the arrays as [N, *shape], the quantizer's read checks them against the export."""
    from activities.toolchains.feeds import calibration_feeds, ingest_split

    save_ts(net(0), tmp_path / "m.pt")
    rng = np.random.default_rng(1)
    np.savez(tmp_path / "good.npz", input=rng.standard_normal((8, 1, 3, 8, 8)).astype(np.float32))
    np.savez(tmp_path / "bad.npz", input=rng.standard_normal((8, 1, 3, 4, 4)).astype(np.float32))
    got = ingest_split(tmp_path / "good.npz", tmp_path / "m.pt", tmp_path, eval_source=None, eval_samples=4)
    assert (got.calibration_samples, got.evaluation_samples, got.inputs) == (4, 4, ["input"])
    export_onnx(tmp_path, TorchExportParams(model="m.pt", output="m.onnx", input_shapes=["input=1,3,8,8"]))
    assert len(calibration_feeds(tmp_path / got.calibration, tmp_path / "m.onnx")) == 4
    bad = ingest_split(tmp_path / "bad.npz", tmp_path / "m.pt", tmp_path, eval_source=None, eval_samples=4)
    with pytest.raises(FleetforgeError) as e:
        calibration_feeds(tmp_path / bad.calibration, tmp_path / "m.onnx")
    assert e.value.code is Err.CALIBRATION_INVALID and "[1, 3, 8, 8]" in e.value.message
