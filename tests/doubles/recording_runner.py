"""Test double for a runner: records the commands it is asked to run and reports every test as
passed. Used to prove a rejected command never reaches a runner (nothing would run it anyway)."""

from __future__ import annotations

from contracts.fleet import TestPhase
from contracts.fleet_job import RunTestRequest, TestOutcome


class RecordingRunner:
    def __init__(self) -> None:
        self.calls: list[str] = []

    async def run(self, req: RunTestRequest, heartbeat: object) -> TestOutcome:
        self.calls.append(req.command)
        return TestOutcome(passed=True, phase=TestPhase.PROBE, exit_code=0)
