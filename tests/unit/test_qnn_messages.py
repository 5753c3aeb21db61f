"""What the QNN toolchain's failures say: the op an HTP compile error names, and light (IR 3) models
whose folded constants must stay valid for the quantizer."""

from __future__ import annotations

from pathlib import Path

import onnx
import pytest

from activities.toolchains.ort_qnn import _prepare, failing_op

LIGHT = Path(onnx.__file__).parent / "backend" / "test" / "data" / "light"


@pytest.mark.parametrize("message, op", [
    ("Node 'n2_token_7' OpType:LRN with domain:com.ms.internal.nhwc was inserted using the NHWC format", "LRN"),
    ("QNN node validation failed: op_type=GridSample unsupported", "GridSample"),
    ("graph finalize failed", None),
])
def test_an_htp_compile_error_names_its_op_when_it_can(message: str, op: str | None):
    assert failing_op(message) == op


def test_a_light_models_prepared_copy_keeps_every_input_it_declares(tmp_path: Path):
    prepared = _prepare(LIGHT / "light_squeezenet.onnx", tmp_path / "q.onnx")
    m = onnx.load(str(prepared))
    inits = {i.name for i in m.graph.initializer}
    assert [i.name for i in m.graph.input if i.name not in inits] == ["data_0"]
    assert m.ir_version >= 4 and "Dropout" not in {n.op_type for n in m.graph.node}
    assert all(n.name for n in m.graph.node), "nodes are named (the quantizer excludes nodes by name)"
    onnx.checker.check_model(m)
