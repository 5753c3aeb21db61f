"""No anonymous failures: the failing node from the QNN EP's log, non-finite/absurd QDQ scales named after
quantization, messages cut at a word, and a failure's op read back for the planner's remedy."""

from __future__ import annotations

import warnings
from pathlib import Path

import pytest

from contracts.common import Failure
from contracts.errors import Err, FleetforgeError, clip
from workflows.converter_policy import compile_feedback

# a real line of onnxruntime-qnn 2.51's log for a QDQ graph whose mask constant made a scale of inf
QNN_LOG = ("2026-11-24 16:07:59.415633222 [V:onnxruntime:, qnn_model_wrapper.cc:771 ComposeQnnGraph] Qnn_OpConfig node name: "
           "scores/MatMulAddFusion package_name: qti.aisw QNN_op_type: FullyConnected num_of_inputs: 3\n"
           "\x1b[1;31m2026-11-24 16:07:59.415700312 [E:onnxruntime:, qnn_model_wrapper.cc:776 ComposeQnnGraph] QNN.graphAddNode() "
           "failed for node `scores/MatMulAddFusion` of type `FullyConnected` with error code 6007\n")


def test_clip_cuts_at_a_word_and_says_so():
    text = "op AveragePool cannot run on the QNN HTP backend for SM8550 at int8 because node_avg_pool2d_token_217 is"
    cut = clip(text, 80)
    assert len(cut) <= 80 and cut.endswith("…") and text.startswith(cut[:-1])
    assert cut[:-1].split()[-1] in text.split(), "the last word is whole"
    assert clip("short\n text", 80) == "short text"


def test_the_failing_node_is_read_from_the_qnn_ep_log():
    onnx = pytest.importorskip("onnx")
    from activities.toolchains.ort_qnn import failing_node

    graph = onnx.helper.make_graph([onnx.helper.make_node("Gemm", ["a", "b", "c"], ["y"], name="scores/MatMulAddFusion")],
                                   "g", [], [])
    assert failing_node(QNN_LOG, onnx.helper.make_model(graph)) == ("scores/MatMulAddFusion", "Gemm", "FullyConnected")
    assert failing_node("nothing useful here", onnx.helper.make_model(graph)) is None


# real lines of onnxruntime-qnn 2.51's log on a fresh Debian 12 without libatomic1 (libQnnSystem.so needs it)
QNN_NO_BACKEND_LOG = (
    "\x1b[1;31m2026-11-26 14:28:06.544824286 [E:onnxruntime:, qnn_execution_provider.cc:2290 GetCapabilityImpl] QNN "
    "SetupBackend failed Unable to load backend, error:  libatomic.so.1: cannot open shared object file: No such file or "
    "directory\x1b[m\n"
    "\x1b[1;31m2026-11-26 14:28:06.544893172 [E:onnxruntime:, ep_plugin_provider_interfaces.cc:677 GetCapability] "
    "OrtEp::GetCapability() for QNNExecutionProvider failed with error: [ONNXRuntimeError] : 11 : EP_FAIL\x1b[m\n")


def test_a_backend_that_cannot_load_is_the_workers_fault_not_an_unsupported_model(tmp_path: Path):
    """The EP then claims no node, so the compile writes nothing: without this it read UNSUPPORTED_OP for every op."""
    from activities.toolchains.ort_qnn import backend_unavailable, raise_if_backend_unavailable

    why = backend_unavailable(QNN_NO_BACKEND_LOG)
    assert why is not None and "libatomic.so.1: cannot open shared object file" in why
    assert "apt-get install libatomic1" in why and "\x1b" not in why
    assert backend_unavailable(QNN_LOG) is None
    log = tmp_path / "compile.log"
    log.write_text(QNN_NO_BACKEND_LOG)
    with pytest.raises(FleetforgeError) as ei:
        raise_if_backend_unavailable(log)
    assert ei.value.code is Err.TOOLCHAIN_UNAVAILABLE
    raise_if_backend_unavailable(tmp_path / "no-log")  # nothing logged: nothing to say


def test_a_compile_failure_names_its_op_for_the_planner():
    failure = Failure(code=Err.UNSUPPORTED_OP, where="context_binary",
                      message="op AveragePool cannot run on the QNN HTP backend for SM8550 at int8 at node 'p' (op AveragePool, QNN PoolAvg2d)")
    fb = compile_feedback(failure, ["pass:gelu_fusion"])
    assert fb.kind == "compile" and fb.failing_ops == ["AveragePool"] and fb.code == "UNSUPPORTED_OP"
    assert fb.remedies == ["pass:gelu_fusion"]


def test_an_absurd_quantization_scale_is_named_and_the_mask_pass_removes_it(tmp_path: Path):
    torch = pytest.importorskip("torch")
    pytest.importorskip("onnxruntime_qnn")
    from activities.toolchains.graph_passes import GraphPassesParams, run_passes
    from activities.toolchains.ort_qnn import QuantizeQdqParams, quantize_qdq

    class Causal(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.proj = torch.nn.Linear(8, 8)
            self.register_buffer("mask", torch.triu(torch.full((4, 4), torch.finfo(torch.float32).min), 1))

        def forward(self, x):
            q = self.proj(x)
            return torch.softmax(q @ q.transpose(-1, -2) + self.mask, dim=-1)

    torch.manual_seed(0)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.onnx.export(Causal().eval(), (torch.randn(1, 4, 8),), str(tmp_path / "causal.onnx"), input_names=["x"])
    with pytest.raises(FleetforgeError) as e:
        quantize_qdq(tmp_path, QuantizeQdqParams(model="causal.onnx", output="q.onnx", precision="int8"))
    assert e.value.code is Err.QUANT_SCALE_INVALID
    assert "quantization scale of tensor" in e.value.message and "clamp_mask_constants" in e.value.message
    run_passes(tmp_path, GraphPassesParams(model="causal.onnx", output="clamped.onnx", passes=["clamp_mask_constants"]))
    quantize_qdq(tmp_path, QuantizeQdqParams(model="clamped.onnx", output="q2.onnx", precision="int8"))
    assert (tmp_path / "q2.onnx").is_file()


def test_the_scale_check_reads_the_weights_of_an_external_data_model(tmp_path: Path):
    """torch's default export writes m.onnx + m.onnx.data; the check after quantization reads the float
    source's constants, from beside the model, not from the worker's cwd."""
    onnx = pytest.importorskip("onnx")
    pytest.importorskip("onnxruntime_qnn")
    import numpy as np

    from activities.toolchains.ort_qnn import QuantizeQdqParams, quantize_qdq

    rng = np.random.default_rng(0)
    mask = np.triu(np.full((4, 4), np.finfo(np.float32).min, np.float32), 1)
    graph = onnx.helper.make_graph(
        [onnx.helper.make_node("MatMul", ["x", "w"], ["q"]), onnx.helper.make_node("Add", ["q", "mask"], ["y"])], "g",
        [onnx.helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, [1, 4, 4])],
        [onnx.helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, [1, 4, 4])],
        [onnx.numpy_helper.from_array(rng.normal(size=(4, 4)).astype(np.float32), "w"),
         onnx.numpy_helper.from_array(mask, "mask")])
    (tmp_path / "input").mkdir()
    onnx.save_model(onnx.helper.make_model(graph, opset_imports=[onnx.helper.make_opsetid("", 17)]),
                    str(tmp_path / "input" / "m.onnx"), save_as_external_data=True, location="m.onnx.data", size_threshold=0)
    with pytest.raises(FleetforgeError) as e:
        quantize_qdq(tmp_path, QuantizeQdqParams(model="input/m.onnx", output="q.onnx", precision="int8"))
    assert e.value.code is Err.QUANT_SCALE_INVALID, e.value.message  # the mask's values were read


def test_a_message_that_already_says_what_to_do_does_not_get_the_remedy_twice():
    from contracts.errors import explained

    specific = "input 'k' is Trilu input 1: its valid values cannot be synthesized; give real inputs with " \
               "--calibration FILE.npz ('k' -> array)"
    assert explained(specific, "CALIBRATION_NEEDED") == specific
    assert explained("no calibration given", "CALIBRATION_NEEDED") == \
        "no calibration given (give real inputs with --calibration FILE.npz (input name -> array) for the named inputs)"
    assert explained("something broke", "NOT_A_CODE") == explained("something broke", "") == "something broke"


def test_an_exception_no_activity_classified_is_internal_and_says_what_to_do():
    """An activity's unclassified exception reaches the workflow typed with its class name: a job once ended with
    code 'OSError' and no remedy. It is INTERNAL now, the class kept, and INTERNAL says whose it is."""
    from temporalio.exceptions import ApplicationError

    from contracts.errors import explained
    from workflows.failures import failure_from

    raw = failure_from(ApplicationError("[Errno 30] Read-only file system: '/tmp/x.log'", type="OSError"), "verifier")
    assert (raw.code, raw.message) == (Err.INTERNAL, "OSError: [Errno 30] Read-only file system: '/tmp/x.log'")
    shown = explained(raw.message, raw.code, raw.hint)
    assert "worker" in shown and "traceback" in shown and "bug" in shown
    ours = failure_from(ApplicationError("no HTP implementation", type=Err.UNSUPPORTED_OP), "compile")
    assert (ours.code, ours.message) == (Err.UNSUPPORTED_OP, "no HTP implementation")
