"""Inputs for calibration and evaluation: synthetic data valid for each input's role, or the user's
data checked against the model and stored byte-reproducibly."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from activities.toolchains.feeds import calibration_feeds, ingest, read_npz, synthetic_feeds, write_npz
from contracts.errors import Err, FleetforgeError
from examples.tiny_model import build_tiny_cnn


def save(path: Path, nodes: list, inputs: list, outputs: list, inits: list | None = None) -> Path:
    g = helper.make_graph(nodes, "g", inputs, outputs, initializer=inits or [])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    m.ir_version = 8
    onnx.save(m, str(path))
    return path


def vi(name: str, dtype: int, shape: list) -> onnx.ValueInfoProto:
    return helper.make_tensor_value_info(name, dtype, shape)


def test_gather_indices_stay_inside_the_indexed_axis(tmp_path: Path):
    model = save(tmp_path / "g.onnx", [helper.make_node("Gather", ["data", "idx"], ["y"], axis=1)],
                 [vi("data", TensorProto.FLOAT, [2, 5, 3]), vi("idx", TensorProto.INT64, [4])], [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)])
    feeds = synthetic_feeds(model, samples=20, seed=0)
    idx = np.stack([f["idx"] for f in feeds])
    assert idx.dtype == np.int64 and idx.min() >= 0 and idx.max() <= 4 and len(np.unique(idx)) > 1
    assert feeds[0]["data"].dtype == np.float32


def test_an_input_that_is_a_shape_asks_for_real_data_naming_it(tmp_path: Path):
    model = save(tmp_path / "r.onnx", [helper.make_node("Reshape", ["x", "shape"], ["y"])],
                 [vi("x", TensorProto.FLOAT, [2, 6]), vi("shape", TensorProto.INT64, [2])], [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)])
    with pytest.raises(FleetforgeError) as e:
        synthetic_feeds(model, samples=1, seed=0)
    assert e.value.code is Err.CALIBRATION_NEEDED
    assert "'shape'" in e.value.message and "Reshape" in e.value.message and "--calibration" in e.value.message


def test_domains_and_dtypes_are_respected(tmp_path: Path):
    nodes = [helper.make_node("Log", ["pos"], ["a"]), helper.make_node("Acos", ["unit"], ["b"]),
             helper.make_node("Not", ["flag"], ["c"]), helper.make_node("Div", ["num", "den"], ["d"])]
    model = save(tmp_path / "d.onnx", nodes,
                 [vi("pos", TensorProto.FLOAT, [50]), vi("unit", TensorProto.FLOAT, [50]), vi("flag", TensorProto.BOOL, [50]),
                  vi("num", TensorProto.INT32, [50]), vi("den", TensorProto.INT32, [50])],
                 [vi(n, t, [50]) for n, t in (("a", TensorProto.FLOAT), ("b", TensorProto.FLOAT), ("c", TensorProto.BOOL),
                                              ("d", TensorProto.INT32))])
    (f,) = synthetic_feeds(model, samples=1, seed=3)
    assert f["pos"].min() > 0 and abs(f["unit"]).max() < 1
    assert f["flag"].dtype == np.bool_ and f["flag"].any() and not f["flag"].all()
    assert f["den"].dtype == np.int32 and f["den"].min() >= 1, "never an integer division by zero"
    assert synthetic_feeds(model, samples=2, seed=3)[0]["pos"].tolist() == f["pos"].tolist(), "seeded"


def test_calibration_arrays_are_split_into_samples_in_either_layout(tmp_path: Path):
    model = build_tiny_cnn(tmp_path / "tiny.onnx")
    x = np.random.default_rng(0).standard_normal((5, 3, 32, 32)).astype(np.float32)
    np.savez(tmp_path / "flat.npz", input=x)               # [N, C, H, W] for a [1, C, H, W] input
    np.savez(tmp_path / "stacked.npz", input=x[:, None])   # [N, 1, C, H, W]
    for name in ("flat.npz", "stacked.npz"):
        feeds = calibration_feeds(tmp_path / name, model)
        assert len(feeds) == 5 and feeds[2]["input"].shape == (1, 3, 32, 32)
        assert np.array_equal(feeds[2]["input"][0], x[2])
    assert len(calibration_feeds(tmp_path / "flat.npz", model, limit=2)) == 2


@pytest.mark.parametrize("arrays, fragment", [
    ({"image": np.zeros((2, 3, 32, 32), np.float32)}, "no array for input(s) input"),
    ({"input": np.zeros((2, 3, 16, 16), np.float32)}, "has shape [2, 3, 16, 16]"),
    ({"input": np.array(["a"] * 3072).reshape(1, 3, 32, 32)}, "is <U1"),
])
def test_calibration_that_does_not_fit_the_model_is_refused_with_the_reason(tmp_path: Path, arrays: dict, fragment: str):
    model = build_tiny_cnn(tmp_path / "tiny.onnx")
    np.savez(tmp_path / "bad.npz", **arrays)
    with pytest.raises(FleetforgeError) as e:
        calibration_feeds(tmp_path / "bad.npz", model)
    assert e.value.code is Err.CALIBRATION_INVALID and fragment in e.value.message, e.value.message


def test_a_folder_is_concatenated_and_the_stored_copy_is_content_addressed_and_reproducible(tmp_path: Path):
    model = build_tiny_cnn(tmp_path / "tiny.onnx")
    folder = tmp_path / "calib"
    folder.mkdir()
    rng = np.random.default_rng(1)
    for i in range(3):
        np.savez(folder / f"part{i}.npz", input=rng.standard_normal((2, 3, 32, 32)).astype(np.float32))
    assert read_npz(folder)["input"].shape == (6, 3, 32, 32)
    shas = []
    for run in ("a", "b"):
        root = tmp_path / run
        (root / "input").mkdir(parents=True)
        rel, sha, samples, inputs = ingest(folder, model, root)
        assert rel == f"input/calibration_{sha[:16]}.npz" and samples == 6 and inputs == ["input"]
        shas.append(sha)
    assert shas[0] == shas[1], "the same data has the same bytes (and cache keys) in every run"
    assert write_npz({"input": np.zeros(3, np.float32)}, tmp_path / "z.npz") != shas[0]


def test_a_missing_source_is_calibration_invalid(tmp_path: Path):
    model = build_tiny_cnn(tmp_path / "tiny.onnx")
    with pytest.raises(FleetforgeError) as e:
        ingest(tmp_path / "nope.npz", model, tmp_path)
    assert e.value.code is Err.CALIBRATION_INVALID and "does not exist" in e.value.message


def test_initializers_are_not_inputs(tmp_path: Path):
    w = numpy_helper.from_array(np.ones((4,), np.float32), "w")
    model = save(tmp_path / "i.onnx", [helper.make_node("Add", ["x", "w"], ["y"])],
                 [vi("x", TensorProto.FLOAT, [4])], [vi("y", TensorProto.FLOAT, [4])], [w])
    assert list(synthetic_feeds(model, samples=1, seed=0)[0]) == ["x"]


def embedding_model(path: Path) -> Path:
    """Token ids into a 50-row embedding, a 0/1 mask, and a float input of Log: the roles check_values reads."""
    table = numpy_helper.from_array(np.random.default_rng(0).standard_normal((50, 4)).astype(np.float32), "table")
    nodes = [helper.make_node("Gather", ["table", "ids"], ["emb"]), helper.make_node("Cast", ["attention_mask"], ["m"], to=1),
             helper.make_node("Log", ["scale"], ["l"])]
    return save(path, nodes, [vi("ids", TensorProto.INT64, [1, 6]), vi("attention_mask", TensorProto.INT64, [1, 6]),
                              vi("scale", TensorProto.FLOAT, [1, 6])],
                [vi(n, TensorProto.FLOAT, None) for n in ("emb", "m", "l")], [table])


GOOD = {"ids": np.full((4, 1, 6), 7, np.int64), "attention_mask": np.ones((4, 1, 6), np.int64),
        "scale": np.full((4, 1, 6), 0.5, np.float32)}


@pytest.mark.parametrize("change, fragment", [
    ({"scale": np.full((4, 1, 6), 2, np.int32)}, "integer data for a float input is refused"),
    ({"scale": np.where(np.eye(6)[:1], np.nan, 0.5).repeat(4, 0)[:, None].astype(np.float32)}, "NaN/Inf"),
    ({"ids": np.full((4, 1, 6), 2.5)}, "its values have fractions"),
    ({"ids": np.full((4, 1, 6), 60, np.int64)}, "the axis they index has 50 entries"),
    ({"attention_mask": np.full((4, 1, 6), 2, np.int64)}, "a mask holds 0 and 1"),
    ({"scale": np.full((4, 1, 6), -1.0, np.float32)}, "takes positive values only"),
    ({"ids": np.full((4, 1, 6), 2**40, np.int64), "_model_dtype": TensorProto.INT32}, "outside int32's"),
])
def test_data_whose_dtype_or_values_do_not_fit_the_input_is_refused(tmp_path: Path, change: dict, fragment: str):
    model = embedding_model(tmp_path / "emb.onnx")
    if change.pop("_model_dtype", None) is not None:
        m = onnx.load(str(model))
        m.graph.input[0].type.tensor_type.elem_type = TensorProto.INT32
        onnx.save(m, str(model))
    np.savez(tmp_path / "good.npz", **GOOD)
    assert len(calibration_feeds(tmp_path / "good.npz", model)) == 4
    np.savez(tmp_path / "bad.npz", **(GOOD | change))
    with pytest.raises(FleetforgeError) as e:
        calibration_feeds(tmp_path / "bad.npz", model)
    assert e.value.code is Err.CALIBRATION_INVALID and fragment in e.value.message, e.value.message


def test_the_client_refuses_int32_calibration_for_a_float_input_before_a_job_starts(tmp_path: Path):
    from client.convert import convert_request
    from contracts.settings import Settings

    model = build_tiny_cnn(tmp_path / "tiny.onnx")
    np.savez(tmp_path / "ints.npz", input=np.zeros((3, 3, 32, 32), np.int32))
    with pytest.raises(FleetforgeError) as e:
        convert_request(str(model), settings=Settings(state_dir=tmp_path), soc="sm8550", precision="int8",
                        calibration=str(tmp_path / "ints.npz"))
    assert e.value.code is Err.BAD_INPUT and "--calibration" in e.value.message and "int32" in e.value.message
