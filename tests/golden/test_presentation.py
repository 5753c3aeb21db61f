"""Golden tests: what a person reads about each job in the Web UI (static summary and details).

A change to `workflows/presentation.py` that changes these texts fails here with a diff; rerun
with FLEETFORGE_UPDATE_GOLDEN=1 to accept it, and review the diff of tests/golden/*.md.
"""

from __future__ import annotations

import difflib
import os
from pathlib import Path

import pytest
import yaml
from pydantic import BaseModel

from contracts.common import ArtifactRef, TaskQueues
from contracts.convert import Precision
from contracts.convert_job import ConversionRequest
from contracts.fleet_job import FleetTestRequest, ModelTestRequest, RunnerKind
from contracts.inspect import InspectRequest
from contracts.kernel import ConductorConfig, KernelTask
from contracts.kernel_job import KernelRequest
from workflows import presentation

GOLDEN = Path(__file__).resolve().parent
ROOT = GOLDEN.parent.parent
UPDATE = os.environ.get("FLEETFORGE_UPDATE_GOLDEN") == "1"
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


def rendered(request: BaseModel) -> str:
    return f"<!-- summary -->\n{presentation.summary(request)}\n\n<!-- details -->\n{presentation.details(request)}\n"


@pytest.mark.parametrize("name", sorted(CASES))
def test_summary_and_details_match_the_golden_text(name: str) -> None:
    path = GOLDEN / f"{name}.md"
    actual = rendered(CASES[name])
    if UPDATE:
        path.write_text(actual)
    assert path.exists(), f"no golden file {path.name}; run with FLEETFORGE_UPDATE_GOLDEN=1 to create it"
    expected = path.read_text()
    if actual != expected:
        diff = "".join(difflib.unified_diff(expected.splitlines(True), actual.splitlines(True),
                                            f"golden/{path.name}", "presentation now"))
        pytest.fail(f"what users see changed (rerun with FLEETFORGE_UPDATE_GOLDEN=1 if deliberate):\n{diff}")


@pytest.mark.parametrize("name", sorted(CASES))
def test_summary_is_one_line_and_details_hide_plumbing(name: str) -> None:
    summary, details = presentation.summary(CASES[name]), presentation.details(CASES[name])
    assert "\n" not in summary and 0 < len(summary) <= 200
    assert "queues" not in details and "fleetforge-workflows" not in details
