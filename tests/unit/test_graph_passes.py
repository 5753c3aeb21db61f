"""Each graph pass on a real graph exported by torch's exporter (the pattern it is for, rewritten, same
outputs under onnxruntime), and on a real graph without its pattern (byte-identical, and the
`onnx.graph_passes` step then copies its input byte for byte)."""

from __future__ import annotations

import warnings
from pathlib import Path

import numpy as np
import pytest

torch = pytest.importorskip("torch")
onnx = pytest.importorskip("onnx")
ort = pytest.importorskip("onnxruntime")

from activities.toolchains.graph_passes import (  # noqa: E402
    PASSES, GraphPassesParams, PassContext, apply_pass, passes_for, run_passes,
)


def export(module, args: tuple, path: Path, **kw) -> "onnx.ModelProto":
    torch.manual_seed(0)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.onnx.export(module.eval(), args, str(path), **kw)
    return onnx.load(str(path))


def ops(model) -> set[str]:
    return {n.op_type for n in model.graph.node}


def run(model, feed: dict) -> list[np.ndarray]:
    return ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, feed)


def cosine(a: np.ndarray, b: np.ndarray) -> float:
    a, b = a.ravel().astype(np.float64), b.ravel().astype(np.float64)
    return float(a @ b / np.linalg.norm(a) / np.linalg.norm(b))


def apply(name: str, model, **ctx) -> tuple[int, "onnx.ModelProto"]:
    work = onnx.ModelProto()
    work.CopyFrom(model)
    return PASSES[name].apply(work, PassContext(**ctx)), work


def assert_untouched(name: str, model) -> None:
    before = model.SerializeToString()
    count, after = apply(name, model)
    assert count == 0 and after.SerializeToString() == before, f"{name} changed a graph without its pattern"


class Mlp(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc1, self.act, self.fc2 = torch.nn.Linear(8, 16), torch.nn.GELU(), torch.nn.Linear(16, 4)

    def forward(self, x):
        return self.fc2(self.act(self.fc1(x)))


X8 = np.random.default_rng(0).standard_normal((2, 8)).astype(np.float32)


def test_gelu_fusion_turns_the_erf_chain_of_an_opset_17_export_into_gelu(tmp_path: Path):
    model = export(Mlp(), (torch.from_numpy(X8),), tmp_path / "mlp17.onnx", input_names=["x"], opset_version=17)
    assert "Erf" in ops(model), "torch exports the exact GELU as an Erf chain below opset 20"
    count, fused = apply("gelu_fusion", model)
    assert count == 1 and "Erf" not in ops(fused) and "Gelu" in ops(fused)
    assert any(o.domain == "com.microsoft" for o in fused.opset_import), "opset 17 has no Gelu: the contrib op is declared"
    np.testing.assert_allclose(run(fused, {"x": X8})[0], run(model, {"x": X8})[0], atol=1e-5)


def test_gelu_fusion_leaves_an_opset_20_export_byte_identical(tmp_path: Path):
    model = export(Mlp(), (torch.from_numpy(X8),), tmp_path / "mlp20.onnx", input_names=["x"])
    assert "Gelu" in ops(model) and "Erf" not in ops(model)
    assert_untouched("gelu_fusion", model)


class GeluPositions(torch.nn.Module):
    """Exact GELU in the positions where the fused node once broke the QDQ quantizer: feeding a
    LayerNormalization, feeding a Softmax, and as the graph output."""

    def __init__(self) -> None:
        super().__init__()
        self.fc1, self.norm, self.fc2, self.fc3 = (torch.nn.Linear(8, 16), torch.nn.LayerNorm(16), torch.nn.Linear(16, 16),
                                                   torch.nn.Linear(16, 4))

    def forward(self, x):
        h = self.norm(torch.nn.functional.gelu(self.fc1(x)))
        a = torch.softmax(torch.nn.functional.gelu(self.fc2(h)), dim=-1)
        return torch.nn.functional.gelu(self.fc3(a * h))


def untyped(model) -> list[str]:
    """Node outputs onnx's own shape inference leaves without a type (what the quantizer's pre-processing
    falls back to when onnxruntime's symbolic inference fails on a graph)."""
    inferred = onnx.shape_inference.infer_shapes(model)
    typed = {v.name for v in [*inferred.graph.value_info, *inferred.graph.output]}
    return [o for n in inferred.graph.node for o in n.output if o not in typed]


def test_a_fused_gelu_in_every_position_keeps_the_graph_typed_and_quantizes_fully(tmp_path: Path):
    model = export(GeluPositions(), (torch.from_numpy(X8),), tmp_path / "gelu17.onnx", input_names=["x"], opset_version=17)
    del model.graph.value_info[:]  # as an exporter that records no intermediate types leaves it
    count, fused = apply("gelu_fusion", model)
    assert count == 3 and "Erf" not in ops(fused)
    np.testing.assert_allclose(run(fused, {"x": X8})[0], run(model, {"x": X8})[0], atol=1e-5)
    assert untyped(fused) == [], "onnx does not infer com.microsoft Gelu: the pass types its outputs itself"
    pytest.importorskip("onnxruntime_qnn")
    from activities.toolchains.ort_qnn import ContextBinaryParams, QuantizeQdqParams, context_binary, quantize_qdq

    onnx.save(fused, str(tmp_path / "fused.onnx"))
    np.savez(tmp_path / "calib.npz", x=np.random.default_rng(5).standard_normal((16, 2, 8)).astype(np.float32))
    quantize_qdq(tmp_path, QuantizeQdqParams(model="fused.onnx", output="q.onnx", precision="int8", calibration_data="calib.npz"))
    q = onnx.load(str(tmp_path / "q.onnx"))
    quantized = {n.input[0] for n in q.graph.node if n.op_type == "QuantizeLinear"}
    gelus = [n for n in q.graph.node if n.op_type == "Gelu"]
    assert len(gelus) == 3 and all(any(o.startswith(g.output[0]) for o in quantized) for g in gelus), \
        "every Gelu output gets a quantization scale"
    out = context_binary(tmp_path, ContextBinaryParams(model="q.onnx", soc="sm8550", output="ctx/q_ctx.onnx", precision="int8"))
    assert out.details["offload"]["cpu_nodes"] == 0


class AudioFeatureStack(torch.nn.Module):
    """Data2Vec-audio's feature extractor and projection: Conv1d -> Transpose -> LayerNorm -> Transpose ->
    exact GELU per conv layer, then Transpose -> LayerNorm. onnxruntime's quantization pre-processing (its
    transpose optimizer) cancels each Transpose pair around a fused Gelu and names the Gelu's moved output
    anew, which its onnx shape inference cannot type (com.microsoft Gelu): the QDQ quantizer then skipped
    it and failed on the next LayerNorm's bias ("Unable to get valid quantization scale for input
    'Gelu_1'"), and the Erf chains stayed on the CPU."""

    def __init__(self) -> None:
        super().__init__()
        self.convs = torch.nn.ModuleList([torch.nn.Conv1d(1, 8, 5, stride=2), torch.nn.Conv1d(8, 8, 3, stride=2)])
        self.norms = torch.nn.ModuleList([torch.nn.LayerNorm(8), torch.nn.LayerNorm(8)])
        self.projection_norm, self.projection = torch.nn.LayerNorm(8), torch.nn.Linear(8, 16)

    def forward(self, x):
        h = x[:, None]
        for conv, norm in zip(self.convs, self.norms):
            h = torch.nn.functional.gelu(norm(conv(h).transpose(-2, -1)).transpose(-2, -1))
        return self.projection(self.projection_norm(h.transpose(1, 2)))


WAVE = np.random.default_rng(2).standard_normal((1, 64)).astype(np.float32)


def test_gelu_fusion_on_data2vec_audios_conv_stack_is_exact_and_quantizes_fully_on_the_htp(tmp_path: Path):
    model = export(AudioFeatureStack(), (torch.from_numpy(WAVE),), tmp_path / "stack17.onnx", input_names=["x"],
                   opset_version=17)
    assert "Erf" in ops(model)
    count, fused = apply("gelu_fusion", model)
    assert count == 2 and "Erf" not in ops(fused)
    np.testing.assert_allclose(run(fused, {"x": WAVE})[0], run(model, {"x": WAVE})[0], atol=1e-5)
    pytest.importorskip("onnxruntime_qnn")
    from activities.toolchains.ort_qnn import ContextBinaryParams, QuantizeQdqParams, context_binary, quantize_qdq

    onnx.save(fused, str(tmp_path / "fused.onnx"))
    np.savez(tmp_path / "calib.npz", x=np.random.default_rng(6).standard_normal((16, 1, 64)).astype(np.float32))
    quantize_qdq(tmp_path, QuantizeQdqParams(model="fused.onnx", output="q.onnx", precision="int8", calibration_data="calib.npz"))
    q = onnx.load(str(tmp_path / "q.onnx"))
    quantized = {n.input[0] for n in q.graph.node if n.op_type == "QuantizeLinear"}
    gelus = [n for n in q.graph.node if n.op_type == "Gelu"]
    assert len(gelus) == 2 and all(g.output[0] in quantized for g in gelus), "every Gelu output gets a quantization scale"
    out = context_binary(tmp_path, ContextBinaryParams(model="q.onnx", soc="sm8550", output="ctx/q_ctx.onnx", precision="int8"))
    assert out.details["offload"]["cpu_nodes"] == 0


class Pooler(torch.nn.Module):
    def __init__(self, kernel: int, ceil: bool) -> None:
        super().__init__()
        self.conv = torch.nn.Conv2d(3, 4, 3, stride=4, padding=1)
        self.pool = torch.nn.AvgPool2d(kernel, ceil_mode=ceil)

    def forward(self, x):
        return self.pool(torch.relu(self.conv(x)))


IMG = np.random.default_rng(1).standard_normal((1, 3, 8, 8)).astype(np.float32)


def test_avgpool_to_global_rewrites_efficientnets_oversized_ceil_mode_pooler(tmp_path: Path):
    model = export(Pooler(kernel=16, ceil=True), (torch.from_numpy(IMG),), tmp_path / "pool.onnx", input_names=["x"])
    assert "AveragePool" in ops(model)
    count, fixed = apply("avgpool_to_global", model)
    assert count == 1 and "AveragePool" not in ops(fixed) and "GlobalAveragePool" in ops(fixed)
    np.testing.assert_allclose(run(fixed, {"x": IMG})[0], run(model, {"x": IMG})[0], atol=1e-6)


def test_avgpool_to_global_leaves_a_windowed_pool_byte_identical(tmp_path: Path):
    model = export(Pooler(kernel=1, ceil=False), (torch.from_numpy(IMG),), tmp_path / "pool1.onnx", input_names=["x"])
    assert "AveragePool" in ops(model), "a 1x1 window over a 2x2 map is not a global pool"
    assert_untouched("avgpool_to_global", model)


class EfficientNetTop(torch.nn.Module):
    """EfficientNet's stem padding and pooler as TorchScript exports them: ZeroPad2d's amounts come out
    of a Constant -> Reshape -> Slice -> Transpose -> Cast chain, so onnx's shape inference knows no
    shape after the Pad, and the oversized ceil-mode pooler's input is unknown."""

    def __init__(self) -> None:
        super().__init__()
        self.pad, self.conv = torch.nn.ZeroPad2d((0, 1, 0, 1)), torch.nn.Conv2d(3, 4, 3, stride=2)
        self.pool = torch.nn.AvgPool2d(64, ceil_mode=True)

    def forward(self, x):
        return self.pool(torch.relu(self.conv(self.pad(x))))


def test_avgpool_to_global_fires_after_folding_torchscripts_computed_pad_amounts(tmp_path: Path):
    model = export(EfficientNetTop(), (torch.from_numpy(IMG),), tmp_path / "eff_ts.onnx", input_names=["x"],
                   opset_version=17, dynamo=False)
    assert "Pad" in ops(model) and "AveragePool" in ops(model)
    assert apply("avgpool_to_global", model)[0] == 0, "without folding the pooler's input shape is unknown"
    work, ctx = onnx.ModelProto(), PassContext()
    work.CopyFrom(model)
    assert apply_pass("avgpool_to_global", work, ctx) == 1 and ctx.folded >= 1
    assert "AveragePool" not in ops(work) and "GlobalAveragePool" in ops(work)
    np.testing.assert_allclose(run(work, {"x": IMG})[0], run(model, {"x": IMG})[0], atol=1e-6)


def test_fold_constants_keeps_nothing_it_need_not_change(tmp_path: Path):
    model = export(Pooler(kernel=1, ceil=False), (torch.from_numpy(IMG),), tmp_path / "pool1.onnx", input_names=["x"])
    assert_untouched("fold_constants", model)
    work, ctx = onnx.ModelProto(), PassContext()
    work.CopyFrom(model)
    assert apply_pass("avgpool_to_global", work, ctx) == 0 and work.SerializeToString() == model.SerializeToString()


def pool_node(shape: list[int], count_include_pad: int, kernel: int = 3, pad: int = 1) -> "onnx.ModelProto":
    from onnx import TensorProto, helper

    node = helper.make_node("AveragePool", ["x"], ["y"], kernel_shape=[kernel] * 2, pads=[pad] * 4, strides=[1, 1],
                            count_include_pad=count_include_pad, name="pool")
    graph = helper.make_graph([node], "pool", [helper.make_tensor_value_info("x", TensorProto.FLOAT, shape)],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


POOL_X = np.random.default_rng(4).standard_normal((1, 16, 16, 16)).astype(np.float32)


def test_avgpool_exclude_pad_is_exact_and_the_htp_fp16_gets_it_right(tmp_path: Path):
    model = pool_node([1, 16, 16, 16], count_include_pad=0)
    count, fixed = apply("avgpool_exclude_pad", model)
    assert count == 1 and ops(fixed) == {"AveragePool", "Mul"}
    np.testing.assert_allclose(run(fixed, {"x": POOL_X})[0], run(model, {"x": POOL_X})[0], rtol=1e-6, atol=1e-6)
    pytest.importorskip("onnxruntime_qnn")
    from activities.toolchains.ort_qnn import context_provider_options
    from activities.toolchains.qnn_ep import qnn_session

    want = run(model, {"x": POOL_X})[0]
    htp = {name: qnn_session(m.SerializeToString(), context_provider_options("SM8550", "fp16")).run(None, {"x": POOL_X})[0]
           for name, m in (("as given", model), ("rewritten", fixed))}
    assert cosine(htp["as given"], want) < 0.9, "the backend defect this pass is for (if fixed, retire the pass)"
    assert cosine(htp["rewritten"], want) > 0.999


class TokenMixer(torch.nn.Module):
    """PoolFormer's token mixer: pool(x) - x with the padding not counted."""

    def __init__(self) -> None:
        super().__init__()
        self.pool = torch.nn.AvgPool2d(3, stride=1, padding=1, count_include_pad=False)

    def forward(self, x):
        return self.pool(x) - x


def test_avgpool_exclude_pad_rewrites_poolformers_exported_token_mixer(tmp_path: Path):
    model = export(TokenMixer(), (torch.from_numpy(POOL_X),), tmp_path / "mixer.onnx", input_names=["x"])
    count, fixed = apply("avgpool_exclude_pad", model)
    assert count == 1
    np.testing.assert_allclose(run(fixed, {"x": POOL_X})[0], run(model, {"x": POOL_X})[0], rtol=1e-5, atol=1e-6)


def test_avgpool_exclude_pad_leaves_pools_that_count_the_padding_or_have_none_byte_identical():
    assert_untouched("avgpool_exclude_pad", pool_node([1, 16, 16, 16], count_include_pad=1))
    assert_untouched("avgpool_exclude_pad", pool_node([1, 16, 16, 16], count_include_pad=0, pad=0))


def test_fix_input_dims_fixes_a_dynamic_batch_from_input_shape_or_to_1_saying_so(tmp_path: Path):
    batch = torch.export.Dim("batch", min=1, max=64)
    model = export(Mlp(), (torch.from_numpy(X8),), tmp_path / "dyn.onnx", input_names=["x"], dynamic_shapes=({0: batch},))
    assert model.graph.input[0].type.tensor_type.shape.dim[0].dim_param, "the export has a symbolic batch"
    count, fixed = apply("fix_input_dims", model, input_shapes={"x": [4, 8]})
    assert count == 1 and [d.dim_value for d in fixed.graph.input[0].type.tensor_type.shape.dim] == [4, 8]
    x4 = np.tile(X8, (2, 1))
    np.testing.assert_allclose(run(fixed, {"x": x4})[0], run(model, {"x": x4})[0], atol=1e-6)
    ctx = PassContext()
    work = onnx.ModelProto()
    work.CopyFrom(model)
    assert PASSES["fix_input_dims"].apply(work, ctx) == 1
    assert [d.dim_value for d in work.graph.input[0].type.tensor_type.shape.dim] == [1, 8]
    assert ctx.notes and "fixed to 1" in ctx.notes[0] and "--input-shape x=" in ctx.notes[0], "said out loud"


def test_fix_input_dims_leaves_a_static_export_byte_identical(tmp_path: Path):
    assert_untouched("fix_input_dims", export(Mlp(), (torch.from_numpy(X8),), tmp_path / "static.onnx", input_names=["x"]))


class CausalScores(torch.nn.Module):
    """GPT-2's old attention: scores masked with float32 min where a position may not look ahead."""

    def __init__(self) -> None:
        super().__init__()
        self.proj = torch.nn.Linear(8, 8)
        self.register_buffer("mask", torch.triu(torch.full((4, 4), torch.finfo(torch.float32).min), 1))

    def forward(self, x):
        q = self.proj(x)
        return torch.softmax(q @ q.transpose(-1, -2) + self.mask, dim=-1)


SEQ = np.random.default_rng(2).standard_normal((1, 4, 8)).astype(np.float32)


def test_clamp_mask_constants_clamps_a_float32_min_causal_mask_with_the_same_softmax(tmp_path: Path):
    model = export(CausalScores(), (torch.from_numpy(SEQ),), tmp_path / "causal.onnx", input_names=["x"])
    count, fixed = apply("clamp_mask_constants", model)
    assert count >= 1
    from onnx import numpy_helper
    assert all(np.abs(numpy_helper.to_array(i)).max() < 1e30 for i in fixed.graph.initializer if i.data_type == 1)
    np.testing.assert_allclose(run(fixed, {"x": SEQ})[0], run(model, {"x": SEQ})[0], atol=1e-6)


def test_the_clamped_mask_leaves_the_scores_their_8_bit_resolution(tmp_path: Path):
    """The mask value lands in the masked scores' quantization range: a floor of -1e4 made the 8-bit
    step ~40, every score 0 and the softmax uniform (cosine 0.90 for DistilBERT int8)."""
    pytest.importorskip("onnxruntime_qnn")
    from activities.toolchains.ort_qnn import QuantizeQdqParams, quantize_qdq

    model = export(CausalScores(), (torch.from_numpy(SEQ),), tmp_path / "causal.onnx", input_names=["x"])
    apply_count, fixed = apply("clamp_mask_constants", model)
    onnx.save(fixed, str(tmp_path / "clamped.onnx"))
    rng = np.random.default_rng(3)
    calib, held_out = (rng.standard_normal((n, 1, 4, 8)).astype(np.float32) for n in (32, 16))
    np.savez(tmp_path / "calib.npz", x=calib)
    quantize_qdq(tmp_path, QuantizeQdqParams(model="clamped.onnx", output="q.onnx", precision="int8",
                                             calibration_data="calib.npz"))
    q = onnx.load(str(tmp_path / "q.onnx"))
    worst = min(cosine(run(q, {"x": x})[0], run(model, {"x": x})[0]) for x in held_out)
    assert apply_count >= 1 and worst > 0.98, worst


def test_clamp_mask_constants_leaves_a_graph_without_huge_constants_byte_identical(tmp_path: Path):
    assert_untouched("clamp_mask_constants", export(Mlp(), (torch.from_numpy(X8),), tmp_path / "mlp.onnx", input_names=["x"]))


@pytest.fixture(scope="module")
def bert(tmp_path_factory) -> "onnx.ModelProto":
    transformers = pytest.importorskip("transformers")
    torch.manual_seed(0)
    cfg = transformers.BertConfig(hidden_size=32, num_hidden_layers=1, num_attention_heads=2, intermediate_size=64,
                                  vocab_size=100, max_position_embeddings=32)
    model = transformers.BertModel(cfg).eval()
    ids, mask = torch.randint(0, 100, (1, 8)), torch.ones(1, 8, dtype=torch.long)
    return export(model, (ids, mask), tmp_path_factory.mktemp("bert") / "bert.onnx", input_names=["input_ids", "attention_mask"])


def test_gathernd_to_gather_removes_the_gathernd_of_transformers_mask_building(bert):
    assert "GatherND" in ops(bert), "transformers builds the padding mask with a constant-index GatherND"
    count, fixed = apply("gathernd_to_gather", bert)
    assert count == 1 and "GatherND" not in ops(fixed)
    rng = np.random.default_rng(3)
    feed = {"input_ids": rng.integers(0, 100, (1, 8)).astype(np.int64),
            "attention_mask": np.array([[1, 1, 1, 1, 1, 0, 0, 0]], np.int64)}
    for a, b in zip(run(fixed, feed), run(bert, feed)):
        np.testing.assert_allclose(a, b, atol=1e-5)


def test_gathernd_to_gather_leaves_a_graph_without_gathernd_byte_identical(tmp_path: Path):
    assert_untouched("gathernd_to_gather", export(Mlp(), (torch.from_numpy(X8),), tmp_path / "mlp.onnx", input_names=["x"]))


class HeadsOut(torch.nn.Module):
    """An attention block's output projection: heads merged back by a reshape of the last two axes
    (MobileViT's, at its sizes), then a Linear; `merge=False` reshapes the leading axes only."""

    def __init__(self, merge: bool = True) -> None:
        super().__init__()
        self.merge = merge
        self.proj = torch.nn.Linear(32 if merge else 8, 32)

    def forward(self, x):
        if self.merge:
            return self.proj(x.transpose(1, 2).reshape(4, 4, 32))
        return self.proj(x.reshape(16, 4, 8))


HEADS = np.random.default_rng(2).standard_normal((4, 4, 4, 8)).astype(np.float32)


def test_flatten_matmul_input_puts_the_merged_heads_projection_in_2d_and_the_htp_fp16_gets_it_right(tmp_path: Path):
    model = export(HeadsOut(), (torch.from_numpy(HEADS),), tmp_path / "heads.onnx", input_names=["x"])
    count, fixed = apply("flatten_matmul_input", model)
    assert count == 1
    np.testing.assert_array_equal(run(fixed, {"x": HEADS})[0], run(model, {"x": HEADS})[0])  # exact: same sums, same order
    pytest.importorskip("onnxruntime_qnn")
    from activities.toolchains.ort_qnn import context_provider_options
    from activities.toolchains.qnn_ep import qnn_session

    htp = {name: qnn_session(m.SerializeToString(), context_provider_options("SM8550", "fp16")).run(None, {"x": HEADS})[0]
           for name, m in (("as exported", model), ("flattened", fixed))}
    want = run(model, {"x": HEADS})[0]
    assert cosine(htp["as exported"], want) < 0.5, "the backend defect this pass is for (if fixed, retire the pass)"
    assert cosine(htp["flattened"], want) > 0.999


def test_flatten_matmul_input_leaves_a_projection_after_a_leading_axes_reshape_byte_identical(tmp_path: Path):
    model = export(HeadsOut(merge=False), (torch.from_numpy(HEADS),), tmp_path / "lead.onnx", input_names=["x"])
    assert "Reshape" in ops(model) and "MatMul" in ops(model)
    assert_untouched("flatten_matmul_input", model)
    assert_untouched("flatten_matmul_input", export(Mlp(), (torch.from_numpy(X8),), tmp_path / "mlp.onnx", input_names=["x"]))


def test_constant_second_lets_the_htp_compile_llamas_rmsnorm_at_fp16_with_the_same_numbers(tmp_path: Path):
    transformers = pytest.importorskip("transformers")
    from transformers.models.llama.modeling_llama import LlamaRMSNorm

    norm = LlamaRMSNorm(16)
    with torch.no_grad():
        norm.weight.copy_(torch.linspace(0.5, 1.5, 16))
    x = np.random.default_rng(6).standard_normal((1, 8, 16)).astype(np.float32)
    model = export(norm, (torch.from_numpy(x),), tmp_path / "rms.onnx", input_names=["x"])
    count, fixed = apply("constant_second", model)
    assert count >= 1 and transformers is not None
    np.testing.assert_array_equal(run(fixed, {"x": x})[0], run(model, {"x": x})[0])  # a * b == b * a exactly
    pytest.importorskip("onnxruntime_qnn")
    from activities.toolchains.ort_qnn import context_provider_options
    from activities.toolchains.qnn_ep import qnn_session

    with pytest.raises(Exception, match="MEM_ALLOC"):
        qnn_session(model.SerializeToString(), context_provider_options("SM8550", "fp16"))
    htp = qnn_session(fixed.SerializeToString(), context_provider_options("SM8550", "fp16")).run(None, {"x": x})[0]
    assert cosine(htp, run(model, {"x": x})[0]) > 0.9999


def test_constant_second_leaves_a_graph_whose_constants_come_second_byte_identical(tmp_path: Path):
    assert_untouched("constant_second", export(Mlp(), (torch.from_numpy(X8),), tmp_path / "mlp.onnx", input_names=["x"]))


class TinyLlama(torch.nn.Module):
    """One LLaMA decoder layer (RMSNorm, rotary, grouped-query attention) and its LM head, taking token ids."""

    def __init__(self) -> None:
        super().__init__()
        transformers = pytest.importorskip("transformers")
        torch.manual_seed(0)
        cfg = transformers.LlamaConfig(hidden_size=64, intermediate_size=128, num_hidden_layers=1, num_attention_heads=4,
                                       num_key_value_heads=2, vocab_size=128, max_position_embeddings=32, use_cache=False,
                                       attn_implementation="eager")
        self.inner = transformers.LlamaForCausalLM(cfg).eval()

    def forward(self, ids):
        return self.inner(input_ids=ids, return_dict=False)[0]


def test_rsqrt_to_div_is_exact_and_the_htp_gets_a_quantized_llama_right(tmp_path: Path):
    ids = np.random.default_rng(7).integers(0, 128, (48, 1, 16)).astype(np.int64)
    model = export(TinyLlama(), (torch.from_numpy(ids[0]),), tmp_path / "llama.onnx", input_names=["ids"])
    for name in ("clamp_mask_constants", "gathernd_to_gather", "constant_second"):
        model = apply(name, model)[1]
    count, fixed = apply("rsqrt_to_div", model)
    assert count == 3 and "Reciprocal" not in ops(fixed), "one rsqrt per RMSNorm: two in the layer, one after it"
    np.testing.assert_allclose(run(fixed, {"ids": ids[0]})[0], run(model, {"ids": ids[0]})[0], rtol=1e-5, atol=1e-6)
    pytest.importorskip("onnxruntime_qnn")
    from onnxruntime.quantization import QuantType, quantize
    from onnxruntime.quantization.execution_providers.qnn import get_qnn_qdq_config

    from activities.toolchains.ort_qnn import (
        ContextBinaryParams, QuantizeQdqParams, calibration_reader, context_binary, quantize_qdq,
    )
    from activities.toolchains.qnn_ep import qnn_session

    onnx.save(model, str(tmp_path / "as_exported.onnx"))
    np.savez(tmp_path / "calib.npz", ids=ids[:32])
    feeds = [{"ids": x} for x in ids[:32]]
    # the model as exported, quantized by onnxruntime alone (no preparation): the defect this pass is for
    raw = get_qnn_qdq_config(str(tmp_path / "as_exported.onnx"), calibration_reader(feeds), activation_type=QuantType.QUInt8)
    quantize(str(tmp_path / "as_exported.onnx"), str(tmp_path / "raw.onnx"), raw)
    quantize_qdq(tmp_path, QuantizeQdqParams(model="as_exported.onnx", output="q.onnx", precision="int8", calibration_data="calib.npz"))
    worst = {}
    for name in ("raw", "q"):
        context_binary(tmp_path, ContextBinaryParams(model=f"{name}.onnx", soc="sm8550", output=f"ctx/{name}_ctx.onnx", precision="int8"))
        htp = qnn_session(tmp_path / f"ctx/{name}_ctx.onnx", {"backend_type": "htp"})
        worst[name] = min(cosine(htp.run(None, {"ids": x})[0], run(model, {"ids": x})[0]) for x in ids[32:])
    assert worst["raw"] < 0.9, f"the backend defect this pass is for (if fixed, retire the pass): {worst}"
    assert worst["q"] > 0.95, worst


def test_the_step_copies_its_input_byte_for_byte_when_no_pass_matches(tmp_path: Path):
    export(Mlp(), (torch.from_numpy(X8),), tmp_path / "m.onnx", input_names=["x"])
    out = run_passes(tmp_path, GraphPassesParams(model="m.onnx", output="out/m.onnx", passes=list(PASSES)))
    assert (tmp_path / "out/m.onnx").read_bytes() == (tmp_path / "m.onnx").read_bytes()
    assert set(out.details["applied"].values()) == {0}


def test_every_pass_says_what_it_fixes_and_the_planners_lookup_finds_it():
    assert passes_for(["Erf"]) == ["gelu_fusion"] and passes_for(["AveragePool"]) == ["avgpool_to_global"]
    assert passes_for([], ["QUANT_SCALE_INVALID"]) == ["clamp_mask_constants"]
    assert passes_for([], ["ACCURACY_BELOW_THRESHOLD"]) == ["avgpool_exclude_pad", "flatten_matmul_input"]
    assert passes_for([], ["HTP_GRAPH_REJECTED"]) == ["constant_second"] and passes_for([], ["EXECUTOR_ERROR"]) == []
    assert passes_for(["Conv", "Det"]) == []
    assert all(p.pattern and p.name for p in PASSES.values())


def test_the_planners_spec_describes_the_registered_passes():
    import json

    from activities.toolchains.graph_passes import catalog

    spec = json.loads((Path(__file__).parents[2] / "activities/toolchains/specs/onnx.graph_passes@1.0.json").read_text())
    assert spec["description"].endswith("Passes: " + catalog()), "regenerate the spec's text from graph_passes.catalog()"
    (names,) = [a["description"] for a in spec["args"] if a["name"] == "passes"]
    assert names.endswith(", ".join(PASSES))
