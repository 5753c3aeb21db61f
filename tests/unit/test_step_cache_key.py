"""The step cache key covers the toolchain: an upgraded onnxruntime-qnn (or its QNN SDK, or the QAIRT
SDK for a QAIRT step) is a miss, never a stale binary."""

from __future__ import annotations

from pathlib import Path

from activities.toolchains.activities import step_cache_key
from activities.toolchains.versions import toolchain_versions
from contracts.convert import CompiledStep

ORT = {"onnx": "1.23.2", "onnxruntime": "1.32.0", "onnxruntime-qnn": "2.7.0", "qnn-sdk": "2.51.0"}


def step(argv: list[str] | None = None) -> CompiledStep:
    return CompiledStep(step_id="context_binary", tool_name="ortqnn.context_binary", tool_version="1.0", argv=argv,
                        params={"model": "input/m.onnx", "soc": "sm8550", "output": "converted/m_ctx.onnx"},
                        inputs=["input/m.onnx"])


def test_every_toolchain_version_is_in_the_key_of_an_in_process_step(tmp_path: Path):
    (tmp_path / "input").mkdir()
    (tmp_path / "input" / "m.onnx").write_bytes(b"model")
    base = step_cache_key(step(), tmp_path, ORT)
    assert base == step_cache_key(step(), tmp_path, dict(ORT))
    for name in ORT:
        assert step_cache_key(step(), tmp_path, ORT | {name: "other"}) != base, name
    assert step_cache_key(step(), tmp_path, ORT | {"qairt": "2.31.0"}) == base, "QAIRT does not run this step"


def test_a_qairt_step_keys_on_the_qairt_sdk_version(tmp_path: Path):
    (tmp_path / "input").mkdir()
    (tmp_path / "input" / "m.onnx").write_bytes(b"model")
    argv = ["qairt-converter", "--input_network", "input/m.onnx"]
    a = step_cache_key(step(argv), tmp_path, ORT | {"qairt": "2.31.0"})
    assert a != step_cache_key(step(argv), tmp_path, ORT | {"qairt": "2.20.0"})


def test_the_installed_versions_include_the_qnn_sdk_inside_onnxruntime_qnn():
    versions = toolchain_versions()
    assert set(ORT) <= set(versions) and versions["qnn-sdk"].count(".") >= 2, versions
