"""bench_kernelbench's one shrink rule for the public KernelBench files (pure text, nothing executed)."""

from __future__ import annotations

import ast

from bench.kernelbench_shrink import ladder, ladder3, scale, shrink

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


LEVEL3 = '''import torch
import torch.nn as nn


class Model(nn.Module):
    def __init__(self, in_channels, layer_sizes, num_classes):
        super().__init__()
        self.branches = nn.ModuleList([nn.Conv2d(in_channels, 64, 1), nn.Conv2d(in_channels, 192, 3, padding=1)])
        self.fc = nn.Linear(256 * 7 * 7, layer_sizes[0])
        self.out = nn.Linear(layer_sizes[-1], num_classes)


batch_size = 10
in_channels = 480
layer_sizes = [4096] * 2
num_classes = 1000


def get_inputs():
    return [torch.rand(batch_size, in_channels, 224, 224)]


def get_init_inputs():
    return [in_channels, layer_sizes, num_classes]
'''


def test_level3_divides_every_size_by_one_factor_so_sums_and_products_still_agree():
    source, made = scale(LEVEL3, 16)
    assert made == {"factor": 16, "inputs": True, "batch_size": 2}
    assert "nn.Conv2d(in_channels, 4, 1), nn.Conv2d(in_channels, 12, 3, padding=1)" in source
    assert "nn.Linear(16 * 7 * 7, layer_sizes[0])" in source, "64 + 192 = 256 still: 4 + 12 = 16"
    assert constants(source) == {"batch_size": 2, "in_channels": 30, "layer_sizes": "[256] * 2", "num_classes": 62}
    assert "torch.rand(batch_size, in_channels, 14, 14)" in source
    kept, made = scale(LEVEL3, 8, inputs_too=False)
    assert "torch.rand(batch_size, in_channels, 224, 224)" in kept and made["inputs"] is False, \
        "a classifier sized for 224x224 images needs them"
    assert "nn.Linear(32 * 7 * 7" in kept
    assert ladder3()[0] == (16, True) and ladder3()[-1] == (2, False)


def test_level3_keeps_the_constants_only_get_inputs_reads_when_it_keeps_the_input_sizes():
    source = LEVEL3.replace("224, 224)", "height, width)").replace("num_classes = 1000", "num_classes = 1000\nheight = 224\nwidth = 224")
    kept, _ = scale(source, 16, inputs_too=False)
    got = constants(kept)
    assert got["height"] == got["width"] == 224 and got["in_channels"] == 30, "init inputs read in_channels: scaled"
