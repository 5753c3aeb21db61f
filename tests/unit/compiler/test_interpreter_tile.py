"""The row kernels' tile under the CPU interpreter (`_interpreter_tile`, blocks/common.py): few rows get wider
column tiles, and the grid, which the cost model reads, stays as it was."""

from __future__ import annotations

import itertools

import pytest
import triton

from activities.kernels.compiler.blocks.common import INTERPRETER_TILE


@pytest.fixture(scope="module")
def tile():  # noqa: ANN201 - the launcher helper, as a candidate file defines it
    scope = {"triton": triton}
    exec(INTERPRETER_TILE, scope)  # noqa: S102 - our own launcher source
    return scope["_interpreter_tile"]


def test_a_few_long_rows_get_one_wide_tile_each(tile):
    # GroupNorm(8) over 3 x 16 x 25 x 35 x 35: 24 rows of 61,250; the rows launcher's CPU default is 1 x 128
    assert tile(24, 61250, 1, 128, 4096) == (1, 4096)
    # the reduction's CPU default, 64 x 128, for 24 rows: 32 rows (the grid is one program either way) of 256
    assert tile(24, 61250, 64, 128, 8192) == (32, 256)


def test_enough_rows_or_short_rows_keep_the_tile_they_had(tile):
    assert tile(100_000, 4096, 32, 128, 4096) == (32, 128)
    assert tile(100_000, 16, 256, 16, 8192) == (256, 16)
    assert tile(5, 12, 8, 16, 8192) == (8, 16)


def test_the_grid_never_changes_and_the_tile_stays_within_its_budget(tile):
    for R, C, BR, BC in itertools.product((1, 3, 24, 100, 4099), (1, 7, 128, 1000, 61250), (1, 4, 32, 64), (16, 128)):
        budget = 8192
        br, bc = tile(R, C, BR, BC, budget)
        assert triton.cdiv(R, br) == triton.cdiv(R, BR), (R, C, BR, BC)
        assert bc >= BC and br * bc <= max(budget, BR * BC), (R, C, BR, BC)
        assert bc & (bc - 1) == 0 and br & (br - 1) == 0
