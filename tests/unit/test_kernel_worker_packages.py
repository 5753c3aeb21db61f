"""A kernels worker without the kernels extra (torch, triton) fails a job as its own problem. Before, `fleetforge
kernel` on a worker installed with only the toolchains extra ended KERNEL_TASK_INVALID, "fix the task file":
the probe child died of `ModuleNotFoundError: No module named 'torch'` and that read as the task's fault."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

from activities.kernels import reference, verifier
from contracts.errors import Err, FleetforgeError

RELU = (Path(__file__).resolve().parents[2] / "examples" / "kernels" / "relu.py").read_text()


@pytest.fixture(params=["torch", "triton"])
def missing(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == request.param else real(name, *a))
    monkeypatch.setattr(reference, "_ANALYSES", reference.LRU(8))
    return request.param


def test_reading_a_task_on_a_worker_without_the_extra_blames_the_worker_not_the_task(missing: str):
    with pytest.raises(FleetforgeError) as raised:
        reference.trace_reference(RELU, timeout_s=60, held_out=False)
    assert raised.value.code is Err.VERIFIER_ERROR, raised.value.message
    assert f"this kernels worker has no {missing}" in raised.value.message
    assert "fleetforge[kernels]" in raised.value.message


@pytest.mark.parametrize("gpu", [False, True])
def test_verifying_on_a_worker_without_the_extra_is_no_verdict(missing: str, gpu: bool):
    with pytest.raises(FleetforgeError) as raised:
        verifier.verify(RELU, RELU.replace("class Model", "class ModelNew"), timeout_s=60, gpu=gpu)
    assert raised.value.code is Err.VERIFIER_ERROR, raised.value.message
    assert f"this kernels worker has no {missing}" in raised.value.message
