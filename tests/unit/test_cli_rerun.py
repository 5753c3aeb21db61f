"""`fleetforge convert --rerun`: the new run's request comes from the earlier run's record, with the
--set overrides that are request fields applied (so its record says what it builds)."""

from __future__ import annotations

from datetime import datetime, timezone
from pathlib import Path

import pytest

from activities.experiments import RunStore
from activities.storage import FileStore
from client.cli import rerun_request
from contracts.common import JobKind, JobStatus
from contracts.errors import Err, FleetforgeError
from contracts.runs import RunRecord

EARLIER = {"model": "hub/tiny.onnx", "target_soc": "sm8550", "precision": "int8", "output": "qnn_context_binary",
           "toolchain": "auto", "preset": "balanced", "calibration": None, "user_id": "ana"}
NO_MODEL = {"model": None}


@pytest.fixture
def store(tmp_path: Path) -> FileStore:
    store = FileStore(tmp_path / "artifacts")
    now = datetime.now(timezone.utc)
    for run_id, kind in (("conv-1", JobKind.CONVERT), ("insp-1", JobKind.INSPECT)):
        RunStore(store).put(RunRecord(run_id=run_id, user_id="ana", kind=kind, status=JobStatus.COMPLETED,
                                      workflow_id=f"{kind.value}/{run_id}", request=EARLIER, created_at=now, updated_at=now))
    return store


def test_rerun_takes_the_earlier_request_and_applies_request_field_overrides(store: FileStore):
    assert rerun_request(store, "conv-1", NO_MODEL, {}) == {k: v for k, v in EARLIER.items() if k != "user_id"}
    changed = rerun_request(store, "conv-1", NO_MODEL, {"precision": "fp16", "soc": "sm8650", "seed": "3"})
    assert (changed["precision"], changed["target_soc"], changed["model"]) == ("fp16", "sm8650", "hub/tiny.onnx")


@pytest.mark.parametrize("run_id, given, fragment", [
    ("nope", NO_MODEL, "--rerun takes the run id"),
    ("insp-1", NO_MODEL, "is not a conversion"),
    ("conv-1", {"model": "other.onnx"}, "drop MODEL"),
])
def test_rerun_of_an_unknown_or_wrong_run_is_bad_input(store: FileStore, run_id: str, given: dict, fragment: str):
    with pytest.raises(FleetforgeError) as e:
        rerun_request(store, run_id, given, {})
    assert e.value.code is Err.BAD_INPUT and fragment in e.value.message
