"""GPU timing of a verified kernel (issue 24 item 5), with a fake timer: the profiler times the candidate,
the reference in eager mode and under torch.compile on the same inputs, and the baseline is the faster
of the two. The real do_bench numbers are taken on a GPU (bench/bench_kernel_gpu.py)."""

from __future__ import annotations

import math
import types

import pytest
import torch

from activities.kernels._child import profile_times
from activities.kernels.verifier import timing_from

TASK = '''
import torch
import torch.nn as nn

class Model(nn.Module):
    def __init__(self, scale):
        super().__init__()
        self.w = nn.Parameter(torch.randn(8) * scale)

    def forward(self, x):
        return torch.relu(x * self.w)

def get_inputs():
    return [torch.randn(4, 8)]

def get_init_inputs():
    return [2.0]
'''
CANDIDATE = '''
import torch
import torch.nn as nn

class ModelNew(nn.Module):
    def __init__(self, scale):
        super().__init__()
        self.w = nn.Parameter(torch.randn(8) * scale)

    def forward(self, x):
        return (x * self.w).clamp_min(0)
'''


def module(name: str, source: str) -> types.ModuleType:
    m = types.ModuleType(name)
    exec(compile(source, f"{name}.py", "exec"), m.__dict__)  # noqa: S102 - the test's own fixture source
    return m


class FakeTimer:
    """Runs each forward once (so building and running every variant is exercised) and answers the
    next of `ms`; keeps the outputs to show the variants saw the same weights and inputs."""

    def __init__(self, *ms: float) -> None:
        self.ms, self.outputs = list(ms), []

    def __call__(self, fn) -> float:
        self.outputs.append(fn())
        return self.ms.pop(0)


def test_the_baseline_is_the_faster_of_eager_and_torch_compile(monkeypatch):
    compiled = []
    monkeypatch.setattr(torch, "compile", lambda model: compiled.append(model) or model)
    timer = FakeTimer(2.0, 4.0, 3.0)  # candidate, eager, compiled
    task, candidate = module("task", TASK), module("candidate", CANDIDATE)
    times = profile_times(task, candidate, seed=7, timer=timer)
    assert times == {"candidate_ms": 2.0, "eager_ms": 4.0, "compile_ms": 3.0}
    assert len(compiled) == 1 and type(compiled[0]).__name__ == "Model"
    assert torch.equal(timer.outputs[0], timer.outputs[1]) and torch.equal(timer.outputs[1], timer.outputs[2])
    timing, note = timing_from(times)
    assert timing is not None
    assert (timing.baseline, timing.ref_ms, timing.speedup) == ("torch.compile", 3.0, pytest.approx(1.5))
    assert note.startswith("speedup 1.50x over torch.compile") and "eager 4.0000 ms" in note


def test_eager_is_the_baseline_when_it_is_faster():
    timing, _ = timing_from({"candidate_ms": 1.0, "eager_ms": 2.0, "compile_ms": 2.5})
    assert timing is not None and (timing.baseline, timing.ref_ms, timing.speedup) == ("eager", 2.0, 2.0)


def test_a_torch_compile_failure_leaves_eager_as_the_baseline_and_says_why(monkeypatch):
    def no_compiler(model):
        raise RuntimeError("InductorError: no working C++ compiler\nlong traceback")
    monkeypatch.setattr(torch, "compile", no_compiler)
    times = profile_times(module("task", TASK), module("candidate", CANDIDATE), seed=0, timer=FakeTimer(1.0, 3.0))
    assert times["compile_ms"] is None and times["compile_ms_error"] == "RuntimeError: InductorError: no working C++ compiler"
    timing, note = timing_from(times)
    assert timing is not None and timing.baseline == "eager" and timing.speedup == 3.0
    assert timing.compile_error.startswith("RuntimeError") and "torch.compile failed: RuntimeError" in note


@pytest.mark.parametrize("times, says", [
    ({"candidate_ms": None, "candidate_ms_error": "OutOfResources: shared memory", "eager_ms": 1.0},
     "the candidate could not be timed (OutOfResources: shared memory)"),
    ({"candidate_ms": 1.0, "eager_ms": math.nan}, "the reference could not be timed (time nan)"),
    ({"candidate_ms": 0.0, "eager_ms": 1.0}, "the candidate could not be timed (time 0.0)"),
])
def test_no_speed_without_a_usable_candidate_and_eager_time(times, says):
    timing, note = timing_from(times)
    assert timing is None and note == f"speed not measured: {says}"
