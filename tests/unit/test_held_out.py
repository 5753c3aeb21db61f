"""Held-out sizes: VERIFIED holds beyond the sample's shapes. The rule that picks the second size set, and
the verifier running both children at it: a candidate with the task's size baked in is rejected there,
its general twin verified; a task whose shapes cannot change says so."""

from __future__ import annotations

from pathlib import Path

import pytest

from activities.kernels import held_out
from activities.kernels._probe import held_out_sizes
from activities.kernels.verifier import verify
from contracts.kernel_job import InputSpec, ReferenceAnalysis, TensorSpec
from tests.unit.test_conductor_offline_designer import analyse
from tests.unit.test_verifier import RELU, TIMEOUT_S, candidate


@pytest.mark.parametrize(("v", "expected"), [(2, 3), (3, 5), (4, 5), (7, 9), (16, 19), (1000, 1125), (4096, 4609)])
def test_a_held_out_size_is_larger_odd_and_never_the_same(v: int, expected: int):
    assert held_out.held_out_value(v) == expected


def sizes_of(source: str, tmp_path: Path) -> dict:
    path = tmp_path / "task.py"
    path.write_text(source)
    return held_out_sizes(str(path), analyse(source, tmp_path), 0)


def test_the_dimension_constants_change_and_derived_ones_follow(tmp_path: Path):
    source = RELU.replace("dim = 1000", "dim = 1000\nhidden = dim * 2\nunused = 5")
    assert sizes_of(source, tmp_path) == {"held_out": {"batch_size": 9, "dim": 1125}, "held_out_note": ""}


def test_a_constraint_the_task_puts_on_its_sizes_is_respected(tmp_path: Path):
    # GroupNorm needs channels divisible by groups: every set that grows channels (or groups) fails to build;
    # the first single change, batch_size, builds.
    source = '''import torch
import torch.nn as nn


class Model(nn.Module):
    def __init__(self, groups, channels):
        super().__init__()
        self.gn = nn.GroupNorm(groups, channels)

    def forward(self, x):
        return self.gn(x)


batch_size = 4
groups = 4
channels = 16
length = 10


def get_inputs():
    return [torch.randn(batch_size, channels, length)]


def get_init_inputs():
    return [groups, channels]
'''
    found = sizes_of(source, tmp_path)
    assert found["held_out"] == {"batch_size": 5}, found


def test_a_task_whose_shapes_cannot_change_is_verified_at_its_own_shapes_only(tmp_path: Path):
    # The input is data written out (nothing to grow), and the constants are not read by get_inputs().
    fixed = RELU.replace("torch.randn(batch_size, dim)", "torch.tensor([[-2.0, -1.0, 0.5], [1.5, -0.5, 2.0]])")
    found = sizes_of(fixed, tmp_path)
    assert found["held_out"] == {}, "constants get_inputs() does not read size nothing"
    assert found["held_out_note"].startswith("verified at its own shapes only: the task has no size to vary")
    report = verify(fixed, candidate("return launch(x)"), timeout_s=TIMEOUT_S, held_out_note=found["held_out_note"])
    assert report.passed and report.held_out == {}
    assert report.shapes_note == found["held_out_note"]


LITERAL_RELU = RELU.replace("torch.randn(batch_size, dim)", "torch.randn(3, 1001)").replace("batch_size = 7\ndim = 1000\n", "")
"""Sizes as literals in get_inputs(), as most model code and many task files write them."""
LITERAL_BAKED_IN = "out = torch.empty_like(x)\nrelu_kernel[(3,)](x, out, 3003, BLOCK=1024)\nreturn out"


def test_literal_sizes_in_get_inputs_are_varied_like_constants(tmp_path: Path):
    line = LITERAL_RELU.splitlines().index("    return [torch.randn(3, 1001)]") + 1
    sizes = sizes_of(LITERAL_RELU, tmp_path)
    assert sizes == {"held_out": {f"3@{line}:25": 5, f"1001@{line}:28": 1127}, "held_out_note": ""}, sizes


def test_a_kernel_with_a_literal_size_baked_in_is_rejected_and_its_general_twin_verified(tmp_path: Path):
    sizes = sizes_of(LITERAL_RELU, tmp_path)["held_out"]
    baked = verify(LITERAL_RELU, candidate(LITERAL_BAKED_IN), timeout_s=TIMEOUT_S)
    assert baked.passed, "at the task's own 3x1001 alone it is right: the false yes the literal sizes close"

    rejected = verify(LITERAL_RELU, candidate(LITERAL_BAKED_IN), timeout_s=TIMEOUT_S, held_out=sizes)
    assert not rejected.passed
    shown = ", ".join(f"{k}={v}" for k, v in sizes.items())
    assert rejected.reason.startswith(f"at the held-out sizes ({shown}): trial 0 (task inputs) output 0: "), \
        rejected.reason
    assert rejected.mismatches and all(m.held_out for m in rejected.mismatches)

    general = verify(LITERAL_RELU, candidate("return launch(x)"), timeout_s=TIMEOUT_S, held_out=sizes)
    assert general.passed, general.reason
    assert general.held_out == sizes and general.shapes_note == ""


def test_size_sets_try_fewer_changes_after_all_of_them():
    assert held_out.size_sets({"batch_size": 16, "k": 3}) == [{"batch_size": 19, "k": 5}, {"batch_size": 19}, {"k": 5}]
    analysis = ReferenceAnalysis(inputs=[InputSpec(kind="tensor", tensor=TensorSpec(shape=[7, 1000], dtype="float32"))])
    assert held_out.choose("x = 1\n", analysis, lambda _o: analysis)[1].startswith("verified at its own shapes only")


HARD_CODED = "out = torch.empty_like(x)\nrelu_kernel[(7,)](x, out, 7000, BLOCK=1024)\nreturn out"


def test_a_candidate_with_the_sample_size_baked_in_is_rejected_and_its_general_twin_verified(tmp_path: Path):
    sizes = sizes_of(RELU, tmp_path)["held_out"]
    assert sizes == {"batch_size": 9, "dim": 1125}
    baked = verify(RELU, candidate(HARD_CODED), timeout_s=TIMEOUT_S)
    assert baked.passed, "at the task's own sizes alone it is right: that is the false yes held-out sizes close"
    assert baked.shapes_note == "verified at its own shapes only: no held-out sizes were given"

    rejected = verify(RELU, candidate(HARD_CODED), timeout_s=TIMEOUT_S, held_out=sizes)
    assert not rejected.passed
    assert rejected.reason.startswith("at the held-out sizes (batch_size=9, dim=1125): trial 0 (task inputs) "
                                      "output 0: "), rejected.reason
    assert rejected.mismatches and all(m.held_out for m in rejected.mismatches)

    general = verify(RELU, candidate("return launch(x)"), timeout_s=TIMEOUT_S, held_out=sizes)
    assert general.passed, general.reason
    assert general.held_out == sizes and general.shapes_note == ""


def test_when_the_reference_fails_at_the_held_out_sizes_the_report_says_own_shapes_only():
    # The task only works at its own batch size: the held-out run of the reference fails, the job does not.
    task = RELU.replace("return torch.relu(x)", "assert x.shape[0] == 7\n        return torch.relu(x)")
    report = verify(task, candidate("return launch(x)"), timeout_s=TIMEOUT_S, held_out={"batch_size": 9})
    assert report.passed, report.reason
    assert report.held_out == {}
    assert report.shapes_note.startswith("verified at its own shapes only: the reference failed at the held-out "
                                         "sizes (batch_size=9) (AssertionError"), report.shapes_note


def test_constants_only_the_model_reads_configure_the_op_and_stay(tmp_path: Path):
    # KernelBench's conv and pooling tasks pass kernel_size, stride and groups to the model only: changing
    # them changes the operation (a kernel specialised to a 3x3 stride-2 conv is a fine kernel), not its sizes.
    source = """import torch
import torch.nn as nn

class Model(nn.Module):
    def __init__(self, cin, cout, kernel_size, stride, groups):
        super().__init__()
        self.conv = nn.Conv2d(cin, cout, kernel_size, stride=stride, groups=groups)

    def forward(self, x):
        return self.conv(x)

batch_size = 2
in_channels = 4
out_channels = 4
kernel_size = 3
stride = 2
groups = 2
side = 8
shape = (batch_size, in_channels, side, side)

def get_inputs():
    return [torch.randn(*shape)]

def get_init_inputs():
    return [in_channels, out_channels, kernel_size, stride, groups]
"""
    assert held_out.input_constants(source) >= {"batch_size", "in_channels", "side", "shape"}
    # in_channels 5 is not divisible by the 2 groups, so the set with every size fails; the large size alone is taken
    assert sizes_of(source, tmp_path)["held_out"] == {"side": 9}


def test_a_size_that_changes_the_models_parameters_is_an_architecture_setting_and_stays(tmp_path: Path):
    # num_layers is h0's first dimension, but growing it adds a layer: a kernel for a two-layer LSTM is a
    # fine kernel, as one for a 3x3 convolution is. The input sizes still vary.
    lstm = (Path(__file__).resolve().parents[1] / "kernel_tasks" / "lstm.py").read_text()
    found = sizes_of(lstm, tmp_path)
    assert found == {"held_out": {"batch_size": 3, "sequence_length": 7, "input_size": 5, "hidden_size": 9},
                     "held_out_note": ""}, found


def test_architecture_settings_are_the_sizes_that_change_the_parameter_names():
    def names(overrides: dict[str, int]) -> list[str]:
        layers = overrides.get("num_layers", 2)
        return [f"lstm.weight_l{i}" for i in range(layers)]  # hidden_size changes shapes only

    assert held_out.architecture_settings({"hidden_size": 8, "num_layers": 2}, names) == ["num_layers"]
    assert held_out.architecture_settings({"hidden_size": 8}, lambda _o: None) == [], "cannot build: tried later"


STATE_FROM_THE_MODULE = '''import torch
import torch.nn as nn


class Model(nn.Module):
    def __init__(self, dim):
        super().__init__()
        self.state = torch.randn((batch_size, dim))  # batch_size read from this file, not passed in
        self.fc = nn.Linear(dim, dim)

    def forward(self, x):
        return self.fc(x + self.state)


batch_size = 4
dim = 16


def get_inputs():
    return [torch.rand(batch_size, dim)]


def get_init_inputs():
    return [dim]
'''


def test_a_size_the_construction_reads_from_the_task_file_stays_and_the_note_says_so(tmp_path: Path):
    """A candidate is a file of its own: built from the held-out init inputs it would still draw a (4, dim) state
    and with it other Linear weights than the reference, a false "no" of a right kernel."""
    assert sizes_of(STATE_FROM_THE_MODULE, tmp_path) == {"held_out": {"dim": 19}, "held_out_note": ""}
    analysis = analyse(STATE_FROM_THE_MODULE, tmp_path)
    sizes, note = held_out.choose(STATE_FROM_THE_MODULE, analysis, lambda _o: analysis, reads_module=lambda _o: True)
    assert sizes == {} and note.startswith("verified at its own shapes only") \
        and "construction reads batch_size, dim from the task file itself" in note, note
    assert held_out.module_settings({"batch_size": 4, "dim": 16}, lambda o: "batch_size" in o) == ["batch_size"]
