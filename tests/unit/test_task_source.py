"""`--set` reads every form KernelBench writes a size constant in, and constants derived from a set one
follow: the rewritten source is run here (constants only) to show what Python itself makes of it."""

from __future__ import annotations

import pytest

from activities.kernels.task_source import apply_overrides, literal_sizes, numeric_constants
from contracts.errors import Err, FleetforgeError


def run(source: str) -> dict:
    scope: dict = {}
    exec(compile(source, "task.py", "exec"), scope)  # noqa: S102 - our own constants-only test source
    return {k: v for k, v in scope.items() if not k.startswith("__")}


@pytest.mark.parametrize(
    ("source", "overrides", "expected"),
    [
        ("batch_size = 16\ndim = batch_size * 4\n", {"batch_size": 3}, {"batch_size": 3, "dim": 12}),
        ("height = width = 128\narea = height * width\n", {"height": 9}, {"height": 9, "width": 128, "area": 1152}),
        ("height = width = 128\narea = height * width\n", {"height": 9, "width": 5},
         {"height": 9, "width": 5, "area": 45}),
        ("height, width = 128, 64\narea = height * width\n", {"width": 7}, {"height": 128, "width": 7, "area": 896}),
        ("(height, width) = (128, 64)\n", {"height": 3}, {"height": 3, "width": 64}),
        ("[height, width] = [128, 2 * 32]\n", {"height": 3}, {"height": 3, "width": 64}),
        ("dim: int = 16\nhidden: int = dim * 2\n", {"dim": 5}, {"dim": 5, "hidden": 10}),
    ],
    ids=["single-derived", "chained-one", "chained-both", "tuple", "parenthesised-tuple", "list", "annotated"],
)
def test_set_rewrites_each_constant_form_and_derived_constants_follow(source: str, overrides: dict, expected: dict):
    assert all(numeric_constants(source)[k] != v for k, v in overrides.items()), "the test must change something"
    out = apply_overrides(source, overrides, "task.py")
    assert run(out) == expected
    assert numeric_constants(out) == expected, "what --set reads back is what Python computes"
    assert len(out.splitlines()) == len(source.splitlines()), "line numbers of the task stay"
    assert "# --set " in out


def test_every_form_is_a_known_constant():
    source = "a = 1\nb = c = 2\nd, e = 3, 4\nf: int = 5\ng = d + e\n"
    assert numeric_constants(source) == {"a": 1, "b": 2, "c": 2, "d": 3, "e": 4, "f": 5, "g": 7}


def test_a_tuple_reads_its_right_side_before_binding_like_python():
    source = "x = 1\nx, y = 5, x\n"
    assert numeric_constants(source) == run(source) == {"x": 5, "y": 1}


def test_unpacking_something_that_is_not_a_literal_tuple_is_not_a_constant():
    source = "sizes = (1, 2)\na, b = sizes\nc = d = 'text'\n"
    assert numeric_constants(source) == {}
    with pytest.raises(FleetforgeError) as e:
        apply_overrides(source, {"a": 3}, "task.py")
    assert e.value.code == Err.KERNEL_TASK_INVALID and "no module-level numeric constant 'a'" in e.value.message


def test_a_kernelbench_level2_header_is_settable():
    source = ("batch_size = 128\nin_channels = 3\nout_channels = 16\nheight, width = 32, 32\nkernel_size = 3\n"
              "depth = height = width = 16\n")
    out = apply_overrides(source, {"height": 7, "width": 9, "batch_size": 2})
    assert run(out) == {"batch_size": 2, "in_channels": 3, "out_channels": 16, "height": 7, "width": 9,
                        "kernel_size": 3, "depth": 16}


LITERALS = '''import torch
def get_inputs():
    return [torch.randn(3, 1001), torch.rand((8, 64), dtype=torch.float32), torch.randint(0, 10, (5,)),
            torch.full((4, 9), 2.0), torch.zeros(size=[6, 1]), torch.tensor([7, 7]), torch.arange(12)]
'''


def test_literal_sizes_are_the_size_arguments_of_tensor_factories_in_get_inputs():
    assert literal_sizes(LITERALS) == {"3@3:25": 3, "1001@3:28": 1001, "8@3:47": 8, "64@3:50": 64, "5@3:99": 5,
                                       "4@4:25": 4, "9@4:28": 9, "6@4:56": 6}, \
        "randint's bounds, full's fill value, 1 and data tensors are not sizes"


def test_a_literal_size_is_set_where_it_stands_and_an_unknown_one_is_named():
    changed = apply_overrides(LITERALS, {"1001@3:28": 1125, "3@3:25": 5, "5@3:99": 7})
    assert "torch.randn(5, 1125), torch.rand((8, 64)" in changed and "torch.randint(0, 10, (7,))" in changed
    assert changed.splitlines()[3:] == LITERALS.splitlines()[3:]
    for key in literal_sizes(LITERALS):
        value, (line, col) = key.split("@")[0], map(int, key.split("@")[1].split(":"))
        assert LITERALS.splitlines()[line - 1][col - 1:].startswith(value), "COL counts from 1"
    with pytest.raises(FleetforgeError) as info:
        apply_overrides(LITERALS, {"1001@3:29": 5})
    assert info.value.code is Err.KERNEL_TASK_INVALID
    assert info.value.message.startswith("--set 1001@3:29: <task> has no literal size 1001@3:29 in get_inputs() "
                                         "(it has: 3@3:25, 1001@3:28, ")
