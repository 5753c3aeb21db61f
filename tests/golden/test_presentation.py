"""Golden tests: what a person reads about each job in the Web UI (static summary and details, and
the current details a running or finished job shows).

A change to `workflows/presentation.py` that changes these texts fails here with a diff. To accept a
deliberate change, run `pytest tests/golden --update-golden`: it rewrites the files that differ and
fails those tests (so the option can never hide a change in CI); review `git diff tests/golden/*.md`
and rerun without it.
"""

from __future__ import annotations

import difflib
from pathlib import Path

import pytest
import yaml
from pydantic import BaseModel

from contracts.common import ArtifactRef, TaskQueues
from contracts.convert import Precision
from contracts.convert_job import (
    AccuracyVerdict, ArtifactReport, ConversionReport, ConversionRequest, EvaluationReport, OutputFigures, PlacementRow,
)
from contracts.fleet_job import FleetTestRequest, ModelTestRequest, RowVerdict, RunnerKind
from contracts.inspect import InspectRequest
from contracts.kernel import ConductorConfig, KernelTask
from contracts.kernel_job import KernelRequest, ModeledSpeed
from workflows import presentation

GOLDEN = Path(__file__).resolve().parent
ROOT = GOLDEN.parent.parent
MANIFEST = ArtifactRef(uri="file:///srv/fleetforge/artifacts/blobs/sha256/ab/" + "ab" * 32, sha256="ab" * 32, size=412,
                       media_type="text/csv", name="models.csv")
QUEUES = TaskQueues()


def kernel_request() -> KernelRequest:
    cfg = ConductorConfig.model_validate(yaml.safe_load((ROOT / "examples/workflows/default.yaml").read_text()))
    task = KernelTask(op_name="relu", task_desc="elementwise max(x, 0) over a float32 tensor", task_id="relu-001",
                      arch="cpu-interpreter")
    return KernelRequest(task=task, config=cfg, queues=QUEUES)


CASES: dict[str, BaseModel] = {
    "inspect": InspectRequest(model="/models/tiny.onnx", run_id="r-0001"),
    "convert": ConversionRequest(model="/models/tiny.onnx", target_soc="sm8550", precision=Precision.INT8,
                                 run_id="r-0002", queues=QUEUES),
    "convert_needs_input": ConversionRequest(model="/models/tiny.onnx", run_id="r-0003", queues=QUEUES),
    "kernel": kernel_request(),
    "fleet_test": FleetTestRequest(manifest=MANIFEST, runner=RunnerKind.PROCESS, concurrency=2, fleet_id="fleet-0004"),
    "model_test": ModelTestRequest(fleet_id="fleet-0004", manifest=MANIFEST, row=3, runner=RunnerKind.PROCESS),
}


SUMMARY_ONLY = {"model_test"}
"""A fleet starts its rows with a static summary only (workflows/fleet.py): the fleet's own details show
the request every row shares, once."""


def rendered(name: str) -> str:
    request = CASES[name]
    if name in SUMMARY_ONLY:
        return f"<!-- summary -->\n{presentation.summary(request)}\n"
    return f"<!-- summary -->\n{presentation.summary(request)}\n\n<!-- details -->\n{presentation.details(request)}\n"


def check_golden(path: Path, actual: str, *, update: bool) -> None:
    """Pass only when the file holds exactly `actual`. With --update-golden a differing (or missing) file
    is rewritten and the test still fails: an update is never a green run."""
    expected = path.read_text() if path.exists() else None
    if actual == expected:
        return
    if update:
        path.write_text(actual)
        pytest.fail(f"wrote golden/{path.name}: review `git diff {path.relative_to(ROOT)}`, then rerun without --update-golden")
    if expected is None:
        pytest.fail(f"no golden file golden/{path.name}; create it with `pytest tests/golden --update-golden`")
    diff = "".join(difflib.unified_diff(expected.splitlines(True), actual.splitlines(True),
                                        f"golden/{path.name}", "presentation now"))
    pytest.fail(f"what users see changed (if deliberate: `pytest tests/golden --update-golden`, review, rerun):\n{diff}")


@pytest.mark.parametrize("name", sorted(CASES))
def test_summary_and_details_match_the_golden_text(name: str, update_golden: bool) -> None:
    check_golden(GOLDEN / f"{name}.md", rendered(name), update=update_golden)


@pytest.mark.parametrize("name", sorted(CASES))
def test_summary_is_one_line_and_details_hide_plumbing(name: str) -> None:
    summary, details = presentation.summary(CASES[name]), presentation.details(CASES[name])
    assert "\n" not in summary and 0 < len(summary) <= 200
    assert "queues" not in details and "fleetforge-workflows" not in details


def artifact(name: str, fill: str, size: int) -> ArtifactRef:
    return ArtifactRef(uri=f"file:///srv/fleetforge/artifacts/blobs/sha256/{fill}/" + fill * 32, sha256=fill * 32,
                       size=size, name=name)


def completed_convert() -> dict[str, object]:
    """A finished int8 conversion's rows, built by the workflow's own row functions (synthetic
    calibration: the verdict says unverified on real data)."""
    from activities.toolchains.report import accuracy_rows, placement_rows
    from workflows.converter import accuracy_row, evaluation_facts, offload_row, precision_row
    from contracts.convert_job import OffloadReport

    logits = OutputFigures(name="logits", cosine=0.99912, max_abs=0.0123, mean_abs=0.00171, sqnr_db=31.4, samples=32,
                           cosine_p05=0.99931, cosine_median=0.99987, cosine_mean=0.99979, cosine_std=0.00018,
                           cosine_pooled=0.999871, top1_agreement=1.0)
    evaluation = EvaluationReport(reference="input/tiny.onnx", candidate="converted/tiny_int8_sm8550_ctx.onnx",
                                  samples=32, max_abs=0.0123, mean_abs=0.00171, cosine=0.99912,
                                  candidate_provider="QNNExecutionProvider", seconds=1.42, outputs=[logits],
                                  families=["natural images", "noise"], calibration="synthetic", calibration_samples=8)
    accuracy = AccuracyVerdict(verdict="unverified", min_cosine=0.95, cosine=0.99912, samples=32, inputs="synthetic",
                               offload_share=1.0, note="accuracy: unverified on real data: ...")
    ctx = ArtifactReport(name="converted/tiny_int8_sm8550_ctx.onnx", sha256="4a" * 32, size=875, role="QNN context model",
                         placement=[PlacementRow(op_type="DequantizeLinear", nodes=9, htp=8, io=1),
                                    PlacementRow(op_type="QuantizeLinear", nodes=5, htp=4, io=1),
                                    PlacementRow(op_type="Conv", nodes=2, htp=2)])
    report = ConversionReport(run_id="r-0002", model="tiny", artifacts=[ctx], toolchain={"onnxruntime": "1.23.2"})
    return {
        "step": "completed", "run": "r-0002", "attempt": 0, "replans": 0, "target": "SM8550",
        "done": "quantize, context_binary", "questions": "", "last error": "",
        "accuracy": accuracy_row(accuracy, evaluation), "precision": precision_row(Precision.INT8, Precision.INT8),
        "offload": offload_row(OffloadReport(nodes_total=16, context_nodes=1, cpu_nodes=0)),
        "evaluation": evaluation_facts(evaluation), "accuracy per output": accuracy_rows(evaluation),
        "op placement": placement_rows(report), "toolchain": report.toolchain,
        "report": artifact("report/conversion_report.md", "5c", 2210),
        "artifacts": [artifact("converted/tiny_int8_sm8550_ctx.onnx", "4a", 875),
                      artifact("converted/tiny_int8_sm8550_ctx_qnn.bin", "7e", 61440),
                      artifact("report/conversion_report.md", "5c", 2210)],
    }


CURRENT: dict[str, tuple[str, dict[str, object]]] = {
    "current_convert_completed": ("convert", completed_convert()),
    "current_convert_needs_input": ("convert", {
        "step": "needs input", "run": "r-0003", "questions": "Which SoC? / Which precision?",
        "waiting for": "an answer: `fleetforge answer convert/r-0003 soc=sm8550 precision=int8`",
        "last error": "shell | pipe\nand a second line",
    }),
    "current_kernel_completed": ("kernel log_softmax", {
        "step": "finished: VERIFIED (VERIFIED)", "steps run": 5, "reference": "lowered: log_softmax",
        "sizes": "batch_size=8, dim=500", "shapes": "also verified at held-out sizes batch_size=5, dim=503",
        "last": "verifier: PASSED", "tokens": 0, "precision": "strict",
        "modeled speed (a roofline model, not a measurement)": presentation.modeled_rows(ModeledSpeed(
            gpu="h100", sol_ms=0.003010, modeled_ms=0.003010, eager_ms=0.003010, speedup=1.0, sol_fraction=1.0,
            score=1.0, traffic_ratio=1.0, launches=1, eager_launches=1, bytes=32000, floor_bytes=32000,
            floor_flops=20000, worst="launch 1/1 log_softmax_rows: 0.0030 ms, 32.0 kB moved, 8 program(s)")),
    }),
    "current_fleet": ("fleet test", {
        "fleet": "fleet-0004", "step": "testing", "progress": "3/4 (2 passed, 1 failed)", "running": 1,
        "rows": [RowVerdict(row=0, model_name="tiny", passed=True, attempts=1, duration_s=0.4),
                 RowVerdict(row=1, model_name="llama-3-8b", passed=False, category="OOM",
                            reason="CUDA out of memory", attempts=3, duration_s=41.0),
                 RowVerdict(row=2, model_name="qwen", passed=True, attempts=2, duration_s=12.5)],
    }),
}


@pytest.mark.parametrize("name", sorted(CURRENT))
def test_current_details_match_the_golden_text(name: str, update_golden: bool) -> None:
    title, rows = CURRENT[name]
    check_golden(GOLDEN / f"{name}.md", presentation.current_details(title, rows), update=update_golden)


def test_table_cells_are_padded_escaped_and_one_line() -> None:
    """The Web UI's table style has no cell padding: every cell ends with the gutter, so two cells
    never run together (`planner_max_tool_iters8`), and a `|` or a newline never breaks the table."""
    lines = presentation.markdown_table(["field", "value"], [["planner_max_tool_iters", 8], ["note", "a | b\nc"]])
    assert lines[1] == "|:---|:---|"
    assert lines[2] == f"| planner_max_tool_iters{presentation.GUTTER} | 8{presentation.GUTTER} |"
    assert lines[3] == f"| note{presentation.GUTTER} | a \\| b c{presentation.GUTTER} |"


def test_long_lists_show_their_first_rows_and_say_how_many_more() -> None:
    rows = [RowVerdict(row=i, model_name=f"m{i}", passed=True) for i in range(presentation.MAX_TABLE_ROWS + 7)]
    text = presentation.current_details("fleet test", {"rows": rows})
    assert f"| m{presentation.MAX_TABLE_ROWS - 1}{presentation.GUTTER} |" in text
    assert f"| m{presentation.MAX_TABLE_ROWS}{presentation.GUTTER} |" not in text
    assert text.rstrip().endswith("… and 7 more")


def test_static_details_name_artifacts_first_and_socs_upper_case() -> None:
    fleet, convert = presentation.details(CASES["fleet_test"]), presentation.details(CASES["convert"])
    assert "| manifest" in fleet and fleet.index("models.csv") < fleet.index("file:///")
    assert f"| target_soc{presentation.GUTTER} | SM8550{presentation.GUTTER} |" in convert
