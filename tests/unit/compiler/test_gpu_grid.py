"""The launchers' two grids (`GPU_GRID`, blocks/common.py): under the interpreter each runs few, large programs and
declares the grid a GPU launch of the same call takes, which the cost model reads. The declared grid must be the
one the launcher really picks for a GPU tensor (here a meta tensor: any device but the CPU takes the GPU's sizes),
and on a GPU the two are one."""

from __future__ import annotations

import math

import pytest
import torch
import triton

from activities.kernels.compiler.blocks import conv, pointwise, pool, reduction, scan
from activities.kernels.compiler.blocks.common import GPU_GRID, INTERPRETER_TILE
from activities.kernels.optimizer import attention, rows


@pytest.fixture(scope="module")
def launchers() -> dict:
    scope = {"torch": torch, "triton": triton, "math": math}
    sources = [GPU_GRID, INTERPRETER_TILE, pointwise.FLAT_GRID, pointwise.LAUNCHER, pool.LAUNCHER, reduction.LAUNCHER,
               scan.LAUNCHER, conv.LAUNCHER, rows.LAUNCHER, attention.LAUNCHER]
    exec("".join(sources), scope)  # noqa: S102 - our own launcher sources, as a candidate file defines them
    return scope


def t(*shape: int) -> torch.Tensor:
    return torch.empty(*shape)


CALLS = {
    "a pointwise chain over 64 x 63 x 9": ("_pointwise", lambda: ([t(64, 63, 9)], [], torch.float32), {}),
    "a max pool of 2 x 8 x 30 x 30": ("_pool", lambda: (t(2, 8, 30, 30), [2, 2], [2, 2], [0, 0], [1, 1], False), {}),
    "a sum of 3 rows of 100,000": ("_reduce", lambda: ([t(3, 100000)], [], [1], False, torch.float32), {"split": True}),
    "a mean over 4096 rows of 50": ("_reduce", lambda: ([t(4096, 50)], [], [1], False, torch.float32), {}),
    "a cumulative sum of 40 rows of 300": ("_scan", lambda: ([t(40, 300)], [], 1, torch.float32), {}),
    "a 3-D convolution of 2 x 2 x 8^3 by 3 x 2 x 3^3": (
        "_conv", lambda: (t(2, 2, 8, 8, 8), t(3, 2, 3, 3, 3), None, [1, 1, 1], [0, 0, 0], [1, 1, 1], False,
                          [0, 0, 0], 1, False), {}),
    "a softmax's rows: 512 of 1000": ("_rows", lambda: ([t(512, 1000)], [], [1], False, False, torch.float32), {}),
    "attention over 2 x 300 queries of 64": ("_attention", lambda: (t(2, 300, 64), t(2, 64, 300), t(2, 300, 64),
                                                                    [], [], []), {}),
}


def on_meta(value: object) -> object:
    if isinstance(value, list):
        return [on_meta(v) for v in value]
    return value.to("meta") if isinstance(value, torch.Tensor) else value


def grids(launchers: dict, key: str) -> tuple[tuple, tuple]:
    """(the CPU call's grid, the same call's grid on meta tensors)."""
    name, args, kwargs = CALLS[key]
    cpu = launchers[name](*args(), **kwargs)[1]
    meta = launchers[name](*[on_meta(a) for a in args()], **kwargs)[1]
    return cpu, meta


@pytest.mark.parametrize("key", list(CALLS))
def test_the_interpreter_runs_fewer_programs_and_declares_the_gpus(launchers, key):
    cpu, gpu = grids(launchers, key)
    assert cpu.gpu == math.prod(gpu) and gpu.gpu == math.prod(gpu), (cpu, gpu)  # on a GPU: the grid it runs
    assert math.prod(cpu) <= math.prod(gpu), (cpu, gpu)


def test_a_gpus_blocks_are_sized_from_the_shapes_to_fill_its_sms(launchers):
    """Two programs per SM of a 132-SM GPU before a program takes more work, within each block's range."""
    declared = {key: grids(launchers, key)[1].gpu for key in CALLS}
    assert declared["a pointwise chain over 64 x 63 x 9"] == 284  # 36,288 elements in blocks of 128 (the least)
    assert declared["a max pool of 2 x 8 x 30 x 30"] == 57  # 3,600 outputs in blocks of 64 (the least)
    assert declared["a sum of 3 rows of 100,000"] == 3 * 49  # a row per program, its columns in 49 ranges
    assert declared["a mean over 4096 rows of 50"] == 256  # 16 rows per program
    assert declared["a cumulative sum of 40 rows of 300"] == 40
    assert declared["a 3-D convolution of 2 x 2 x 8^3 by 3 x 2 x 3^3"] == 27  # 432 output rows in tiles of 16
    assert declared["a softmax's rows: 512 of 1000"] == 512  # a row of 1024 columns per program
    assert declared["attention over 2 x 300 queries of 64"] == 2 * 5  # 64 queries per program at head dim 64
    interpreted = {key: math.prod(grids(launchers, key)[0]) for key in CALLS}
    assert interpreted["a 3-D convolution of 2 x 2 x 8^3 by 3 x 2 x 3^3"] == 1  # one tile of 512 rows
    assert interpreted["a softmax's rows: 512 of 1000"] == 16  # 32 rows of 128 columns per program


def test_sizes_the_caller_gives_run_on_both_devices(launchers):
    cpu, gpu = (launchers["_pointwise"]([x], [], torch.float32, BLOCK=256)[1] for x in (t(5000), t(5000).to("meta")))
    assert tuple(cpu) == tuple(gpu) == (20,) and cpu.gpu == 20
