"""The deployment report of a conversion: per artifact, where each op type runs (inside the HTP context
binary or on the CPU); the toolchain versions; the accuracy per output with its sample count and spread,
and top-1 agreement for classifier outputs. The workflow gathers the facts it knows, `complete_report`
adds what only the files say, `render_markdown` is what the CLI prints, the store keeps and the Web UI
shows. Pure except `complete_report` (it reads models from the workspace); onnx is imported lazily.
"""

from __future__ import annotations

from collections import Counter
from pathlib import Path
from typing import Any

from activities.sandbox import safe_join
from contracts.convert_job import AccuracyVerdict, ConversionReport, EvaluationReport, MixedPrecisionReport, PlacementRow

REPORT_MD, REPORT_JSON = "report/conversion_report.md", "report/conversion_report.json"
VERDICT_WORDS = {
    "passed": "passed",
    "unverified": "unverified on real data",
    "accepted_lossy": "accepted as lossy",
    "below_threshold": "below threshold",
    "not_offloaded": "not fully offloaded",
    "unevaluated": "unevaluated",
    "not_evaluable": "not evaluable",
}
INPUT_WORDS = {
    "synthetic": "synthetic inputs",
    "held_out": "held-out samples of the calibration data",
    "eval_data": "the separate evaluation data",
    "calibration": "the calibration data itself (in-sample, before held-out evaluation)",
}


def verdict_words(accuracy: AccuracyVerdict) -> str:
    """The verdict as a person reads it: `unverified on real data` (or `unverified: N graded samples, fewer
    than the minimum M`) is never the word for a pass."""
    few = accuracy.min_samples is not None and accuracy.samples is not None and accuracy.samples < accuracy.min_samples
    if accuracy.verdict == "unverified" and few:
        words = "unverified on real data, and" if accuracy.note.startswith("accuracy: unverified on real data") else "unverified:"
        return f"{words} {accuracy.samples} graded sample(s), fewer than the minimum {accuracy.min_samples}"
    return VERDICT_WORDS.get(accuracy.verdict, accuracy.verdict.replace("_", " "))


def mixed_words(mixed: MixedPrecisionReport) -> str:
    """`2 of 40 layers (5%) at 16-bit activations, the rest 8-bit: cosine 0.62 -> 0.98 on 16 calibration samples`."""
    return (f"{len(mixed.sixteen_bit)} of {mixed.layers_total} layers ({mixed.share:.0%}) at 16-bit activations, the rest "
            f"8-bit, chosen by their sensitivity: cosine {mixed.cosine_int8:.4f} all 8-bit -> {mixed.cosine_mixed:.4f} "
            f"(target {mixed.target:.4f}) on {mixed.samples} calibration samples, CPU")


def inputs_words(evaluation: EvaluationReport) -> str:
    text = INPUT_WORDS.get(evaluation.inputs, evaluation.inputs)
    if evaluation.families:
        text += f" ({', '.join(evaluation.families)})"
    return text


def artifact_role(name: str, model: Any | None) -> str:
    if name.endswith("_qnn.bin"):
        return "HTP context binary"
    if name.endswith(".dlc"):
        return "QNN DLC"
    if name.endswith(".ort"):
        return "ORT format model"
    if model is None:
        return "file"
    ops = {n.op_type for n in model.graph.node}
    if "EPContext" in ops:
        return "QNN context model (EPContext)"
    if "QuantizeLinear" in ops:
        return "QDQ ONNX model"
    return "ONNX model"


def placement(source: Any, context: Any) -> list[PlacementRow]:
    """Per op type of `source` (the model the HTP compiler was given): nodes, how many run inside the
    context binary, how many on the CPU (every node of the context model outside an EPContext node), and
    of those how many only convert the float graph inputs/outputs (as ort_qnn.offload_report counts)."""
    inputs = {i.name for i in context.graph.input}
    outputs = {o.name for o in context.graph.output}

    def boundary(node: Any) -> bool:
        if node.op_type == "QuantizeLinear":
            return node.input[0] in inputs
        return node.op_type == "DequantizeLinear" and all(o in outputs for o in node.output)

    outside = [n for n in context.graph.node if n.op_type != "EPContext"]
    cpu = Counter(n.op_type for n in outside if not boundary(n))
    io = Counter(n.op_type for n in outside if boundary(n))
    total = Counter(n.op_type for n in source.graph.node)
    rows = []
    for op, count in sorted(total.items(), key=lambda kv: (-kv[1], kv[0])):
        on_cpu, on_io = min(count, cpu.get(op, 0)), min(count, io.get(op, 0))
        rows.append(PlacementRow(op_type=op, nodes=count, htp=max(0, count - on_cpu - on_io), cpu=on_cpu, io=on_io))
    return rows


def complete_report(report: ConversionReport, root: Path, context_sources: dict[str, str],
                    toolchain: dict[str, str]) -> ConversionReport:
    """`report` with each artifact's role and (context models) op placement, and the toolchain versions."""
    import onnx

    artifacts = []
    for art in report.artifacts:
        path = safe_join(root, art.name)
        model = None
        if art.name.endswith(".onnx") and path.is_file():
            model = onnx.load(str(path), load_external_data=False)
        rows: list[PlacementRow] = []
        source = context_sources.get(art.name)
        if model is not None and source and safe_join(root, source).is_file():
            rows = placement(onnx.load(str(safe_join(root, source)), load_external_data=False), model)
        artifacts.append(art.model_copy(update={"role": artifact_role(art.name, model), "placement": rows}))
    return report.model_copy(update={"artifacts": artifacts, "toolchain": dict(sorted(toolchain.items()))})


def accuracy_rows(evaluation: EvaluationReport) -> list[dict[str, object]]:
    """One row per output: samples, the gate's figure (lowest per-sample cosine) and the spread."""
    rows = []
    for o in evaluation.outputs:
        row: dict[str, object] = {
            "output": o.name, "samples": o.samples or evaluation.samples, "min cosine": _f(o.cosine),
            "p5": _f(o.cosine_p05), "median": _f(o.cosine_median),
            "mean ± std": f"{o.cosine_mean:.4f} ± {o.cosine_std:.4f}" if o.cosine_mean is not None and o.cosine_std is not None else "",
            "pooled": _f(o.cosine_pooled), "SQNR dB": f"{o.sqnr_db:.1f}", "max abs": f"{o.max_abs:.3g}",
            "top-1 agreement": f"{o.top1_agreement:.1%}" if o.top1_agreement is not None else "",
        }
        if o.nonfinite_mismatches:
            row["NaN/Inf mismatches"] = o.nonfinite_mismatches
        rows.append(row)
    return rows


def placement_rows(report: ConversionReport) -> list[dict[str, object]]:
    """Every context model's placement as rows (artifact, op type, nodes, HTP, CPU)."""
    return [{"artifact": a.name.rsplit("/", 1)[-1], **_placement_cells(r)} for a in report.artifacts for r in a.placement]


def _placement_cells(r: PlacementRow) -> dict[str, object]:
    return {"op type": r.op_type, "nodes": r.nodes, "HTP": r.htp, "CPU": r.cpu, "CPU (float I/O conversion)": r.io}


def _f(value: float | None) -> str:
    return "" if value is None else f"{value:.4f}"


def _table(rows: list[dict[str, object]]) -> list[str]:
    if not rows:
        return []
    header = list(dict.fromkeys(k for r in rows for k in r))
    out = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    out += ["| " + " | ".join(str(r.get(k, "")).replace("|", "\\|") for k in header) + " |" for r in rows]
    return out


def verdict_line(report: ConversionReport) -> str:
    acc, ev = report.accuracy, report.evaluation
    if acc is None:
        return "accuracy: not judged"
    text = f"accuracy: {verdict_words(acc)}"
    if acc.cosine is not None:
        text += f" (lowest per-sample cosine {acc.cosine:.4f}, threshold {acc.min_cosine:g}"
        text += f", {ev.samples} samples of {inputs_words(ev)})" if ev is not None else ")"
    return text + (f"; {acc.note}" if acc.note and acc.verdict not in ("passed", "unverified") else "")


def render_markdown(report: ConversionReport) -> str:
    """The report as markdown: what the CLI prints, the store keeps and the Web UI links."""
    req = report.requested_precision.value if report.requested_precision else "-"
    got = report.delivered_precision.value if report.delivered_precision else "-"
    lines = [f"# Conversion report: run {report.run_id}", "",
             f"model {report.model} for {report.target_soc or 'no SoC'}: precision requested {req}, delivered {got}", "",
             verdict_line(report)]
    ev = report.evaluation
    if ev is not None:
        lines += ["", f"## Accuracy per output ({ev.samples} samples: {inputs_words(ev)}; calibrated on: "
                      f"{ev.calibration}{f', {ev.calibration_samples} samples, none of them graded' if ev.calibration_samples else ''})",
                  "", *_table(accuracy_rows(ev))]
    mixed = report.mixed_precision
    if mixed is not None:
        lines += ["", f"## Mixed precision ({mixed_words(mixed)})", "",
                  *_table([{"layer": layer.node, "op": layer.op_type, "cosine gained alone": f"{layer.cosine_gain:+.4f}"}
                           for layer in mixed.sixteen_bit])]
    lines += ["", "## Artifacts", "", *_table([{"artifact": a.name, "role": a.role, "size": a.size, "sha256": a.sha256[:16]}
                                              for a in report.artifacts])]
    for a in report.artifacts:
        if a.placement:
            htp, cpu, io = (sum(getattr(r, k) for r in a.placement) for k in ("htp", "cpu", "io"))
            total = sum(r.nodes for r in a.placement)
            where = f"{htp} of {total} nodes inside the HTP context binary, {cpu} on the CPU"
            where += f", {io} converting float inputs/outputs on the CPU" if io else ""
            lines += ["", f"### Op placement: {a.name} ({where})", "", *_table([_placement_cells(r) for r in a.placement])]
    if report.toolchain:
        lines += ["", "## Toolchain", "", *_table([{"component": k, "version": v} for k, v in report.toolchain.items()])]
    if report.warnings:
        lines += ["", "## Warnings", "", *[f"- {w}" for w in report.warnings]]
    return "\n".join(lines) + "\n"
