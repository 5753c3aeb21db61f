"""The accuracy gate's independence from what it grades, without a server: calibration and evaluation
samples never overlap (synthetic families and seeds, the user's data split, a separate set checked),
per-sample figures, the `unverified` verdict, and a delivered precision that is the requested one
unless the user allowed a fallback. Real onnx models and onnxruntime; no doubles."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from activities.toolchains.evaluate import EvalParams, evaluate, output_figures
from activities.toolchains.feeds import (
    feeds_from, ingest_split, overlap, sample_key, split_held_out, synthetic_feeds, write_npz,
)
from activities.toolchains.offline_planner import (
    FLOAT_OUTPUTS, MIXED, MORE_CALIBRATION, W8A16, failing_outputs, next_remedy, plan_offline,
)
from activities.toolchains.registry import default_registry
from contracts.common import ArtifactRef
from contracts.convert import CompiledStep, CompileResult, OutputKind, Precision
from contracts.convert_job import (
    CalibrationSource, ConversionRequest, EvaluationReport, OffloadReport, OutputFigures, PlanFeedback,
)
from contracts.errors import Err, FleetforgeError
from contracts.models import ModelFormat, ModelRef
from examples.tiny_model import build_tiny_cnn
from workflows.converter_policy import (
    MIN_GRADED_SAMPLES, Complete, GiveUp, Replan, calibration_question, calibration_sources, check_precision,
    delivered_precision, failure_hint, gate,
)

onnx = pytest.importorskip("onnx")


def token_model(path: Path) -> Path:
    """Embedding lookup masked by an attention mask: ids [1, 8] into a 50-row table, mask [1, 8]."""
    from onnx import TensorProto, helper, numpy_helper

    table = numpy_helper.from_array(np.random.default_rng(0).standard_normal((50, 4)).astype(np.float32), "table")
    nodes = [helper.make_node("Gather", ["table", "input_ids"], ["emb"], axis=0),
             helper.make_node("Cast", ["attention_mask"], ["m"], to=TensorProto.FLOAT),
             helper.make_node("Unsqueeze", ["m", "axes"], ["m3"]),
             helper.make_node("Mul", ["emb", "m3"], ["out"])]
    axes = numpy_helper.from_array(np.array([2], dtype=np.int64), "axes")
    g = helper.make_graph(nodes, "tokens", [helper.make_tensor_value_info("input_ids", TensorProto.INT64, [1, 8]),
                                            helper.make_tensor_value_info("attention_mask", TensorProto.INT64, [1, 8])],
                          [helper.make_tensor_value_info("out", TensorProto.FLOAT, [1, 8, 4])], initializer=[table, axes])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    m.ir_version = 8
    path.parent.mkdir(parents=True, exist_ok=True)
    onnx.save(m, str(path))
    return path


# ---- calibration and evaluation samples never overlap ------------------------------------------


def test_synthetic_evaluation_shares_no_sample_and_draws_a_family_the_calibration_never_uses(tmp_path: Path):
    model = build_tiny_cnn(tmp_path / "tiny.onnx")
    calibration = synthetic_feeds(model, samples=64, seed=0)
    evaluation = synthetic_feeds(model, samples=32, seed=1234, purpose="evaluation")
    assert overlap(evaluation, calibration) == 0
    # the same seed still gives other samples for half of them: the families differ, not only the seed
    same_seed = synthetic_feeds(model, samples=32, seed=0, purpose="evaluation")
    assert overlap(same_seed[0::2], calibration) == 0
    natural = evaluation[0]["input"]
    assert abs(float(natural.std()) - 1.0) < 0.05
    # natural-statistics images are smooth: neighbouring pixels correlate, unlike noise
    def neighbour_corr(x: np.ndarray) -> float:
        return float(np.corrcoef(x[..., :-1].ravel(), x[..., 1:].ravel())[0, 1])
    assert neighbour_corr(natural) > 0.5 and abs(neighbour_corr(calibration[0]["input"])) < 0.2


def test_evaluation_token_ids_are_valid_and_padded_where_the_mask_has_zeros(tmp_path: Path):
    model = token_model(tmp_path / "tokens.onnx")
    evaluation = synthetic_feeds(model, samples=32, seed=1234, purpose="evaluation")
    calibration = synthetic_feeds(model, samples=32, seed=0)
    assert overlap(evaluation, calibration) == 0
    for feed in evaluation:
        ids, mask = feed["input_ids"], feed["attention_mask"]
        assert ids.dtype == np.int64 and ids.min() >= 0 and ids.max() < 50
        assert set(np.unique(mask)) <= {0, 1} and (mask == 0).any(), "every evaluation mask pads"
        assert (ids[mask == 0] == 0).all(), "padding positions carry the padding id"


def test_held_out_split_is_disjoint_even_with_duplicated_samples_and_reproducible():
    rng = np.random.default_rng(3)
    base = rng.standard_normal((30, 1, 4)).astype(np.float32)
    data = {"x": np.concatenate([base, base[:10]])}  # 10 samples twice
    cal, held = split_held_out(data, 32, "ab" * 32)
    cal_feeds, eval_feeds = feeds_from(cal), feeds_from(held)
    assert len(eval_feeds) == 15 and len(cal_feeds) + len({sample_key(f) for f in eval_feeds}) + \
        sum(sample_key(f) in {sample_key(e) for e in eval_feeds} for f in feeds_from(data)) - 15 == 40
    assert overlap(eval_feeds, cal_feeds) == 0
    assert len({sample_key(f) for f in cal_feeds} | {sample_key(f) for f in eval_feeds}) == 30, "nothing lost"
    again, _ = split_held_out(data, 32, "ab" * 32)
    assert np.array_equal(again["x"], cal["x"])
    _, few = split_held_out(data, 4, "ab" * 32)
    assert len(feeds_from(few)) == 4


def test_one_distinct_sample_cannot_be_split_and_says_what_to_do():
    with pytest.raises(FleetforgeError) as e:
        split_held_out({"x": np.zeros((5, 1, 4), dtype=np.float32)}, 32, "cd" * 32)
    assert e.value.code is Err.CALIBRATION_INVALID and "--eval-data" in e.value.message


def test_a_separate_evaluation_set_that_shares_a_calibration_sample_is_refused(tmp_path: Path):
    model = build_tiny_cnn(tmp_path / "ws" / "input" / "tiny.onnx")
    x = np.random.default_rng(1).standard_normal((6, 1, 3, 32, 32)).astype(np.float32)
    write_npz({"input": x}, tmp_path / "cal.npz")
    write_npz({"input": x[4:]}, tmp_path / "eval_overlap.npz")
    write_npz({"input": x[:2] + 1.0}, tmp_path / "eval_ok.npz")
    with pytest.raises(FleetforgeError) as e:
        ingest_split(tmp_path / "cal.npz", model, tmp_path / "ws", eval_source=tmp_path / "eval_overlap.npz", eval_samples=32)
    assert e.value.code is Err.EVALUATION_NOT_HELD_OUT and "2 of 2" in e.value.message
    got = ingest_split(tmp_path / "cal.npz", model, tmp_path / "ws", eval_source=tmp_path / "eval_ok.npz", eval_samples=32)
    assert (got.calibration_samples, got.evaluation_samples, got.held_out) == (6, 2, False)
    split = ingest_split(tmp_path / "cal.npz", model, tmp_path / "ws", eval_source=None, eval_samples=32)
    assert (split.calibration_samples, split.evaluation_samples, split.held_out) == (3, 3, True)
    from activities.toolchains.feeds import calibration_feeds
    assert overlap(calibration_feeds(tmp_path / "ws" / split.evaluation, model),
                   calibration_feeds(tmp_path / "ws" / split.calibration, model)) == 0


def test_the_evaluation_refuses_to_grade_samples_the_candidate_was_calibrated_on(tmp_path: Path):
    """A gate on in-sample data is impossible: whatever the plan calibrated on is regenerated and compared."""
    root = tmp_path / "ws"
    build_tiny_cnn(root / "input" / "tiny.onnx")
    x = np.random.default_rng(2).standard_normal((8, 1, 3, 32, 32)).astype(np.float32)
    write_npz({"input": x}, root / "input" / "data.npz")
    in_sample = EvalParams(reference="input/tiny.onnx", candidate="input/tiny.onnx", samples=8, evaluation="input/data.npz",
                           calibrated_on=[CalibrationSource(step_id="quantize", model="input/tiny.onnx", data="input/data.npz")])
    with pytest.raises(FleetforgeError) as e:
        evaluate(root, in_sample)
    assert e.value.code is Err.EVALUATION_NOT_HELD_OUT and "8 of 8" in e.value.message
    # a plan calibrating on synthetic samples with the evaluation's own seed and families is caught too
    same = EvalParams(reference="input/tiny.onnx", candidate="input/tiny.onnx", samples=8, seed=5,
                      calibrated_on=[CalibrationSource(step_id="q", model="input/tiny.onnx", samples=64, seed=5)])
    with pytest.raises(FleetforgeError) as e:
        evaluate(root, same)
    assert e.value.code is Err.EVALUATION_NOT_HELD_OUT
    fine = evaluate(root, same.model_copy(update={"calibrated_on": [CalibrationSource(step_id="q", model="input/tiny.onnx",
                                                                                      samples=64, seed=0)]}))
    assert fine.samples == 8 and fine.inputs == "synthetic" and fine.calibration == "synthetic"
    assert fine.calibration_samples == 64 and fine.families == ["natural images", "noise"]


# ---- per-sample figures ------------------------------------------------------------------------


def test_one_bad_sample_sets_the_gate_figure_though_the_pooled_cosine_hides_it():
    rng = np.random.default_rng(0)
    ref = [rng.standard_normal((1, 10)) * (10 if i else 1) for i in range(16)]
    cand = [r.copy() for r in ref]
    cand[0] = -ref[0]  # the small-magnitude sample is completely wrong
    fig = output_figures("logits", ref, cand)
    assert fig.cosine_pooled > 0.99 and fig.cosine == pytest.approx(-1.0)
    assert fig.samples == 16 and fig.cosine_median == pytest.approx(1.0) and fig.cosine_std > 0.4
    assert fig.top1_agreement == pytest.approx(15 / 16)
    assert output_figures("seq", [np.ones((1, 4, 3))], [np.ones((1, 4, 3))]).top1_agreement is None


# ---- verdicts ----------------------------------------------------------------------------------


def figures(cosine: float, inputs: str, samples: int = 32) -> EvaluationReport:
    out = OutputFigures(name="logits", cosine=cosine, max_abs=0.1, mean_abs=0.01, sqnr_db=20.0, samples=samples,
                        cosine_p05=cosine, cosine_median=cosine)
    return EvaluationReport(reference="input/m.onnx", candidate="converted/m_ctx.onnx", samples=samples, max_abs=0.1,
                            mean_abs=0.01, cosine=cosine, candidate_provider="QNNExecutionProvider", seconds=1.0,
                            outputs=[out], inputs=inputs)  # type: ignore[arg-type]


INT8 = ConversionRequest(model="m.onnx", target_soc="sm8550", precision=Precision.INT8, synthetic_calibration=True)
FULL = OffloadReport(nodes_total=3, context_nodes=1, cpu_nodes=0)


def judge(ev: EvaluationReport, request: ConversionRequest = INT8, delivered: Precision | None = None, can: bool = False):
    return gate(ev, FULL, request=request, attempt=0, replans=0, max_replans=2, remedies=[], float_outputs=[],
                can_remedy=lambda fb: can, delivered=delivered)


def test_a_synthetic_calibrated_int8_result_is_unverified_never_passed():
    verdict = judge(figures(0.99, "synthetic"))
    assert isinstance(verdict, Complete) and verdict.accuracy.verdict == "unverified"
    assert verdict.accuracy.note.startswith("accuracy: unverified on real data") and "32 synthetic samples" in verdict.accuracy.note
    real = judge(figures(0.99, "held_out"))
    assert isinstance(real, Complete) and real.accuracy.verdict == "passed"
    fp16 = judge(figures(0.995, "synthetic"), INT8.model_copy(update={"precision": Precision.FP16}))
    assert isinstance(fp16, Complete) and fp16.accuracy.verdict == "passed", "float needs no calibration"


def test_int8_below_the_gate_proposes_w8a16_but_never_applies_it_without_consent():
    verdict = judge(figures(0.9, "held_out"))
    assert isinstance(verdict, GiveUp) and verdict.failure.code == Err.ACCURACY_BELOW_THRESHOLD
    assert "--precision w8a16" in verdict.failure.message and "--precision-fallback" in verdict.failure.message
    assert "p5 0.9000, median 0.9000 over 32 samples" in verdict.failure.message
    allowed = judge(figures(0.9, "held_out"), INT8.model_copy(update={"precision_fallback": True}), can=True)
    assert isinstance(allowed, Replan) and "--precision-fallback" not in allowed.failure.message
    # the offline planner's remedy ladder skips w8a16 unless the request allows it
    fb = PlanFeedback(kind="accuracy", remedies=[FLOAT_OUTPUTS], evaluation=figures(0.9, "held_out"), min_cosine=0.95)
    assert next_remedy(INT8, fb) == MIXED, "a few layers at 16 bits keep the delivered precision int8"
    fb = fb.model_copy(update={"remedies": [FLOAT_OUTPUTS, MIXED]})
    assert next_remedy(INT8, fb) == MORE_CALIBRATION
    spent = fb.model_copy(update={"remedies": [FLOAT_OUTPUTS, MIXED, MORE_CALIBRATION]})
    assert next_remedy(INT8, spent) is None, "no consent: w8a16 is never the next remedy"
    assert next_remedy(INT8.model_copy(update={"precision_fallback": True}), fb) == W8A16


def test_outputs_of_the_right_direction_and_the_wrong_size_fail_on_the_pooled_cosine():
    """A sample whose fp32 logits are 13x the usual size, clipped to a fifth by the 8-bit ranges: its own
    cosine stays high, the pooled one does not (MobileNetV2 int8 in a foreign sweep: pooled 0.73)."""
    rng = np.random.default_rng(1)
    ref = [rng.standard_normal((1, 10)) for _ in range(32)]
    ref[5] = ref[5] * 13
    cand = [r.copy() for r in ref]
    cand[5] = ref[5] / 5
    fig = output_figures("logits", ref, cand)
    assert fig.cosine == pytest.approx(1.0) and fig.cosine_pooled < 0.9 and fig.misses(0.95)
    ev = EvaluationReport(reference="input/m.onnx", candidate="converted/m_ctx.onnx", samples=32, max_abs=1.0, mean_abs=0.1,
                          cosine=fig.cosine, candidate_provider="QNNExecutionProvider", seconds=1.0, outputs=[fig],
                          inputs="held_out")
    verdict = judge(ev)
    assert isinstance(verdict, GiveUp) and verdict.failure.code == Err.ACCURACY_BELOW_THRESHOLD
    assert verdict.failure.message.startswith(f"pooled cosine {fig.cosine_pooled:.4f} < 0.95 on 32 held_out samples")
    assert "sizes are off" in verdict.failure.message
    fb = PlanFeedback(kind="accuracy", remedies=[], evaluation=ev, min_cosine=0.95)
    assert failing_outputs(fb) == ["logits"], "the planner's remedies see the output as failing too"
    same = output_figures("logits", ref, [r.copy() for r in ref])
    assert not same.misses(0.95) and isinstance(judge(ev.model_copy(update={"outputs": [same]})), Complete)


def model_ref() -> ModelRef:
    sha = "0" * 64
    art = ArtifactRef(uri=f"file:///blobs/{sha}", sha256=sha, size=4, name="m.onnx")
    return ModelRef(name="m", source="/hub/m.onnx", format=ModelFormat.ONNX, sha256=sha, size=4, artifact=art, filename="m.onnx")


def test_a_plan_delivering_w8a16_for_an_int8_request_does_not_run_without_consent():
    registry = default_registry()
    w8a16_req = INT8.model_copy(update={"precision": Precision.W8A16})
    plan = plan_offline(w8a16_req, model_ref(), registry)
    steps = [CompiledStep(step_id=s.step_id, tool_name=s.tool_name, tool_version="1.0", params=s.required_args | s.optional_args)
             for s in plan.steps]
    assert delivered_precision(steps, Precision.INT8) is Precision.W8A16
    refused = check_precision(CompileResult(ok=True, steps=steps), INT8)
    assert not refused.ok and refused.errors[0].code == Err.PLAN_INVALID and "--precision-fallback" in refused.errors[0].message
    assert check_precision(CompileResult(ok=True, steps=steps), INT8.model_copy(update={"precision_fallback": True})).ok
    assert check_precision(CompileResult(ok=True, steps=steps), w8a16_req).ok
    sources = calibration_sources(steps)
    assert [(s.step_id, s.data, s.samples, s.seed) for s in sources] == [("quantize", None, 8, 0)]


def test_int8_without_calibration_data_asks_for_it_unless_synthetic_calibration_is_opted_in():
    bare = INT8.model_copy(update={"synthetic_calibration": False})
    question = calibration_question(bare)
    assert question and "calibration=FILE.npz" in question and "synthetic_calibration=yes" in question
    assert "unverified on real data" in question
    assert calibration_question(INT8) is None
    assert calibration_question(bare.model_copy(update={"calibration": "/data/c.npz"})) is None
    assert calibration_question(bare.model_copy(update={"precision": Precision.FP16})) is None
    assert calibration_question(bare.model_copy(update={"output": OutputKind.ONNX_QDQ})) is not None


def test_the_report_and_the_cli_never_word_an_unverified_result_as_a_pass():
    from activities.toolchains.report import render_markdown
    from client.cli.render import accuracy_line, precision_line
    from contracts.convert_job import AccuracyVerdict, ArtifactReport, ConversionReport, ConversionResult, PlacementRow
    from contracts.common import JobStatus

    ev = figures(0.99, "synthetic")
    acc = judge(ev).accuracy
    report = ConversionReport(run_id="r1", model="m", requested_precision=Precision.INT8, delivered_precision=Precision.INT8,
                              evaluation=ev, accuracy=acc, toolchain={"onnxruntime": "1.0"},
                              artifacts=[ArtifactReport(name="converted/m_ctx.onnx", sha256="a" * 64, size=1, role="QNN context model",
                                                        placement=[PlacementRow(op_type="Conv", nodes=2, htp=1, cpu=1)])])
    md = render_markdown(report)
    assert "accuracy: unverified on real data" in md and "passed" not in md
    assert "| logits | 32 | 0.9900 |" in md and "1 of 2 nodes inside the HTP context binary, 1 on the CPU" in md
    result = ConversionResult(status=JobStatus.COMPLETED, run_id="r1", accuracy=acc, requested_precision=Precision.INT8,
                              delivered_precision=Precision.W8A16)
    line = accuracy_line(result)
    assert line.startswith("accuracy: unverified on real data") and "passed" not in line and "--eval-data" in line
    assert precision_line(result) == "precision: w8a16 (requested int8)"
    passed = result.model_copy(update={"accuracy": AccuracyVerdict(verdict="passed", min_cosine=0.95, cosine=0.99, samples=20,
                                                                   inputs="held_out")})
    assert accuracy_line(passed).startswith("accuracy: passed (lowest per-sample cosine 0.9900, threshold 0.95, 20 held-out")


def test_the_delivered_precision_is_read_from_the_steps_of_every_toolchain():
    def step(tool: str, **params: object) -> CompiledStep:
        return CompiledStep(step_id=tool, tool_name=tool, tool_version="1", params=params)

    assert delivered_precision([step("onnx.quantize_static", model="a"), step("onnx.to_ort")], Precision.INT8) is Precision.INT8
    assert delivered_precision([step("onnx.fp16", model="a")], Precision.FP16) is Precision.FP16
    assert delivered_precision([step("qairt-converter"), step("qairt-quantizer", act_bitwidth=16)], Precision.INT8) \
        is Precision.W8A16
    assert delivered_precision([step("ortqnn.context_binary", precision="fp16")], Precision.FP32) is Precision.FP16
    assert check_precision(CompileResult(ok=True, steps=[step("ortqnn.context_binary", precision="fp16")]),
                           INT8.model_copy(update={"precision": Precision.FP32})).ok, "fp32 on the HTP is fp16 math"
    assert not check_precision(CompileResult(ok=True, steps=[step("ortqnn.context_binary", precision="fp16")]), INT8).ok


def test_a_gate_on_fewer_samples_than_its_minimum_is_unverified_with_the_count_never_passed(tmp_path: Path):
    """The issue's case: 3 samples given, 2 calibrate, 1 is held out and graded."""
    model = build_tiny_cnn(tmp_path / "tiny.onnx")
    np.savez(tmp_path / "three.npz", input=np.random.default_rng(0).standard_normal((3, 3, 32, 32)).astype(np.float32))
    split = ingest_split(tmp_path / "three.npz", model, tmp_path / "ws", eval_source=None, eval_samples=32)
    assert (split.calibration_samples, split.evaluation_samples) == (2, 1)
    real = INT8.model_copy(update={"calibration": split.calibration, "synthetic_calibration": False})
    verdict = judge(figures(0.999, "held_out", samples=split.evaluation_samples), real)
    acc = verdict.accuracy
    assert isinstance(verdict, Complete) and acc.verdict == "unverified" and acc.samples == 1
    assert f"only 1 held-out sample(s), fewer than the gate's minimum of {MIN_GRADED_SAMPLES}" in acc.note
    assert "calibration samples" in acc.hint and "--eval-data" in acc.hint
    fp16 = judge(figures(0.999, "synthetic", samples=4), INT8.model_copy(update={"precision": Precision.FP16, "eval_samples": 4}))
    assert fp16.accuracy.verdict == "unverified" and fp16.accuracy.hint == f"grade at least {MIN_GRADED_SAMPLES} samples: " \
        f"--eval-samples {MIN_GRADED_SAMPLES} or more"
    enough = judge(figures(0.999, "held_out", samples=MIN_GRADED_SAMPLES), real)
    assert enough.accuracy.verdict == "passed" and enough.accuracy.min_samples == MIN_GRADED_SAMPLES
    from activities.toolchains.report import verdict_words

    assert verdict_words(acc) == f"unverified: 1 graded sample(s), fewer than the minimum {MIN_GRADED_SAMPLES}"


def test_an_fp16_failures_hint_never_mentions_calibration_and_a_quantized_ones_fits_its_data():
    from contracts.errors import explained

    fp16 = INT8.model_copy(update={"precision": Precision.FP16, "synthetic_calibration": False})
    for code in Err:
        shown = explained("it failed", code, failure_hint(code, fp16))
        assert "calibrat" not in shown.lower(), (code, shown)
    below = failure_hint(Err.ACCURACY_BELOW_THRESHOLD, fp16)
    assert "--output ort --precision fp32" in below and "--min-cosine" in below
    synthetic = failure_hint(Err.ACCURACY_BELOW_THRESHOLD, INT8)
    assert synthetic.startswith("give real inputs with --calibration") and "--precision w8a16" in synthetic
    real = failure_hint(Err.ACCURACY_BELOW_THRESHOLD, INT8.model_copy(update={"calibration": "input/c.npz"}))
    assert "--calibration" not in real and "--precision w8a16" in real
    assert "--precision fp16" in failure_hint(Err.ACCURACY_BELOW_THRESHOLD, INT8, delivered=Precision.W8A16)
    assert failure_hint(Err.UNSUPPORTED_OP, INT8) == "", "the code's general remedy fits every precision"
