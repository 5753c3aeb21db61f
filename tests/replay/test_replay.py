"""Recorded histories must replay against today's workflow code (determinism guard)."""

from __future__ import annotations

from pathlib import Path

import pytest
from temporalio.client import WorkflowHistory
from temporalio.contrib.pydantic import pydantic_data_converter
from temporalio.worker import Replayer

from workflows.conductor import ConductorWorkflow
from workflows.converter import ConverterWorkflow
from workflows.fleet import FleetTestWorkflow, ModelTestWorkflow
from workflows.inspect import InspectModelWorkflow

HISTORIES = Path(__file__).parent / "histories"
RECORDED_IDS = {
    **{f"fleet_current-noid_run{n}": "fleet-test/direct-7752d0" for n in (1, 2)},
}
"""Histories whose workflow derives names from its own id (a fleet started without a fleet id) replay
under the id they were recorded with; the others under `replay-<file>`."""
WORKFLOWS = {"inspect": InspectModelWorkflow, "convert": ConverterWorkflow, "fleet": FleetTestWorkflow,
             "modeltest": ModelTestWorkflow, "kernel": ConductorWorkflow}


@pytest.mark.parametrize("path", sorted(HISTORIES.glob("*.json")), ids=lambda p: p.stem)
async def test_recorded_history_replays(path: Path):
    kind = path.stem.split("_")[0]
    history = WorkflowHistory.from_json(RECORDED_IDS.get(path.stem, f"replay-{path.stem}"), path.read_text())
    replayer = Replayer(workflows=[WORKFLOWS[kind]], data_converter=pydantic_data_converter)
    result = await replayer.replay_workflow(history, raise_on_replay_failure=False)
    assert result.replay_failure is None, result.replay_failure
