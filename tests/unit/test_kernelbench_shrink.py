"""bench_kernelbench's one shrink rule for the public KernelBench files (pure text, nothing executed)."""

from __future__ import annotations

import ast

from bench.kernelbench_shrink import ladder, shrink

SOURCE = '''import torch
batch_size = 128
in_channels = 64
height = width = 128
depth, h2, w2 = (16, 32, 33)
D = 16; K = 4095
input_shape = (32768,)
kernel_size = (3, 5, 7)
stride = 2
M = 1024 * 2
bias_shape = (in_channels, 1, 1)
scale = 2.0


def get_inputs():
    return [torch.rand(batch_size, in_channels, height, width)]
'''


def constants(source: str) -> dict[str, object]:
    found = {}
    for node in ast.parse(source).body:
        if isinstance(node, ast.Assign) and isinstance(node.targets[0], ast.Name):
            try:
                found[node.targets[0].id] = ast.literal_eval(node.value)
            except ValueError:
                found[node.targets[0].id] = ast.unparse(node.value)
    return found


def test_sizes_are_split_into_single_names_and_halved_to_the_bound():
    source, made = shrink(SOURCE)
    got = constants(source)
    assert got["batch_size"] == 2 and got["in_channels"] == 8
    assert got["height"] == got["width"] == 8, "a chained assignment becomes one line per name"
    assert (got["depth"], got["h2"], got["w2"]) == (8, 8, 8), "a tuple assignment too"
    assert got["D"] == 8 and got["K"] == 7, "two statements on one line; an odd size stays odd"
    assert got["input_shape"] == (8,) and got["kernel_size"] == (3, 5, 7) and got["stride"] == 2
    assert got["M"] == 8, "arithmetic constants are evaluated first"
    assert got["bias_shape"] == "(in_channels, 1, 1)", "a constant built from names follows them"
    assert got["scale"] == 2.0
    assert made["batch_size"] == 2 and "stride" not in made and "scale" not in made
    assert "def get_inputs" in source


def test_the_ladder_loosens_the_bound_and_the_batch_rule():
    assert ladder()[0] == (8, True)
    loose, _ = shrink(SOURCE, 16, False)
    got = constants(loose)
    assert got["batch_size"] == 16 and got["in_channels"] == 16 and got["K"] == 15
