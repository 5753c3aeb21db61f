"""A worker probes a task once: the same source again returns the remembered analysis without a child; a task
whose probe failed is probed again (its error is not remembered), and a changed source is a new probe."""

from __future__ import annotations

from pathlib import Path

import pytest

from activities.kernels import reference
from contracts.errors import FleetforgeError

RELU = (Path(__file__).resolve().parents[2] / "examples" / "kernels" / "relu.py").read_text()


@pytest.fixture
def probes(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    started: list[str] = []
    real = reference.spawn

    def counting(module, workdir, args, **kw):
        started.append((workdir / "task.py").read_text())
        return real(module, workdir, args, **kw)

    monkeypatch.setattr(reference, "spawn", counting)
    monkeypatch.setattr(reference, "_ANALYSES", reference.LRU(8))
    return started


def test_the_same_task_is_probed_once_and_its_analysis_is_a_copy(probes: list[str]):
    first = reference.trace_reference(RELU, timeout_s=120, held_out=False)
    first.calls.clear()  # a caller changing its copy does not change what the next caller gets
    again = reference.trace_reference(RELU, timeout_s=120, held_out=False)

    assert len(probes) == 1
    assert again.calls and not first.calls
    reference.trace_reference(RELU.replace("dim = 1000", "dim = 999"), timeout_s=120, held_out=False)
    assert len(probes) == 2


def test_a_failed_probe_is_not_remembered(probes: list[str]):
    broken = RELU + "\nraise RuntimeError('the task file is broken')\n"
    for _ in range(2):
        with pytest.raises(FleetforgeError, match="the task file is broken"):
            reference.trace_reference(broken, timeout_s=120, held_out=False)
    assert len(probes) == 2
