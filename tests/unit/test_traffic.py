"""What the interpreter counts per launch (activities/kernels/traffic.py) against hand-computed bytes and FLOPs of
hand-written kernels, run in one Triton-interpreter child."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.unit.compiler.cases import interpreted

KERNELS = r'''
import json, math
import torch, triton, triton.language as tl
from activities.kernels import traffic
from activities.kernels._child import skip_unasserted_overflow_checks

@triton.jit
def add_relu(x_ptr, y_ptr, out_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    m = offs < n
    x = tl.load(x_ptr + offs, mask=m)
    y = tl.load(y_ptr + offs, mask=m)
    tl.store(out_ptr + offs, tl.maximum(x + y, 0.0), mask=m)

@triton.jit
def matmul(a_ptr, b_ptr, c_ptr, M, N, K, BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr, IEEE: tl.constexpr):
    rm = tl.program_id(0) * BM + tl.arange(0, BM)
    rn = tl.program_id(1) * BN + tl.arange(0, BN)
    acc = tl.zeros((BM, BN), dtype=tl.float32)
    for k0 in range(0, K, BK):
        rk = k0 + tl.arange(0, BK)
        a = tl.load(a_ptr + rm[:, None] * K + rk[None, :], mask=(rm[:, None] < M) & (rk[None, :] < K), other=0.0)
        b = tl.load(b_ptr + rk[:, None] * N + rn[None, :], mask=(rk[:, None] < K) & (rn[None, :] < N), other=0.0)
        if IEEE:
            acc += tl.dot(a, b, input_precision="ieee")
        else:
            acc += tl.dot(a, b)
    tl.store(c_ptr + rm[:, None] * N + rn[None, :], acc, mask=(rm[:, None] < M) & (rn[None, :] < N))

@triton.jit
def softmax_two_reads(x_ptr, out_ptr, C, BLOCK: tl.constexpr):
    row = tl.program_id(0)
    cols = tl.arange(0, BLOCK)
    m = cols < C
    x = tl.load(x_ptr + row * C + cols, mask=m, other=-float("inf"))
    mx = tl.max(x, 0)
    s = tl.sum(tl.exp(x - mx), 0)
    y = tl.load(x_ptr + row * C + cols, mask=m, other=0.0)
    tl.store(out_ptr + row * C + cols, tl.exp(y - mx) / s, mask=m)

@triton.jit
def histogram(idx_ptr, bins_ptr, n, BLOCK: tl.constexpr):
    offs = tl.arange(0, BLOCK)
    m = offs < n
    i = tl.load(idx_ptr + offs, mask=m, other=0)
    tl.atomic_add(bins_ptr + i, 1.0, mask=m)

counter = traffic.Counter()
traffic.install(counter)
skip_unasserted_overflow_checks()  # as the candidate child does: the counts must not depend on it
out = {}
with counter.counting():
    x, y, o = torch.randn(1000), torch.randn(1000), torch.empty(1000)
    add_relu[(triton.cdiv(1000, 256),)](x, y, o, 1000, BLOCK=256)
    out["add_relu_ok"] = bool(torch.equal(o, torch.relu(x + y)))
    a, b = torch.randn(40, 70), torch.randn(70, 36)
    for ieee in (True, False):
        c = torch.empty(40, 36)
        matmul[(2, 2)](a, b, c, 40, 36, 70, BM=32, BN=32, BK=32, IEEE=ieee)
        out["err_ieee" if ieee else "err_tf32"] = float((c.double() - (a.double() @ b.double())).abs().max())
    x = torch.randn(4, 100)
    o = torch.empty(4, 100)
    softmax_two_reads[(4,)](x, o, 100, BLOCK=128)
    out["softmax_ok"] = bool(torch.allclose(o, torch.softmax(x, 1), atol=1e-6))
    idx = torch.tensor([0, 1, 1, 3, 3, 3, 2], dtype=torch.int32)
    bins = torch.zeros(5)
    histogram[(1,)](idx, bins, 7, BLOCK=8)
    out["bins"] = bins.tolist()

    class Declared(tuple):  # a launcher's grid that says what a GPU runs (the compiler's `_on_gpu`)
        pass

    for gpu in (8, 10**9):
        grid = Declared((1,))
        grid.gpu = gpu
        x, o = torch.randn(1000), torch.empty(1000)
        add_relu[grid](x, x, o, 1000, BLOCK=1024)
untouched = torch.empty(10)
add_relu[(1,)](untouched, untouched, untouched, 10, BLOCK=16)  # not counting: not recorded
out["launches"] = counter.launches
print(json.dumps(out))
'''


@pytest.fixture(scope="module")
def counted() -> dict:
    return interpreted(KERNELS)


def launch(counted: dict, i: int) -> dict:
    return counted["launches"][i]


def test_a_masked_pointwise_kernel_moves_its_active_lanes_and_computes_its_whole_block(counted):
    assert counted["add_relu_ok"]
    c = launch(counted, 0)
    assert c["kernel"] == "add_relu" and c["programs"] == 4
    assert (c["loaded"], c["stored"]) == (2 * 1000 * 4, 1000 * 4)  # two fp32 inputs read, one written
    assert (c["unique_loaded"], c["unique_stored"]) == (8000, 4000)
    assert c["flops"] == 2 * 1000  # add and maximum over 4 blocks of 256 lanes, scaled to the 1000 active ones
    assert c["dot_flops"] == c["tf32_flops"] == 0


def test_a_tiled_matmul_rereads_its_tiles_but_its_distinct_bytes_are_the_operands_once(counted):
    ieee, tf32 = launch(counted, 1), launch(counted, 2)
    for c in (ieee, tf32):
        assert c["programs"] == 4
        # 2x2 grid, K in 3 chunks (32, 32, 6): every A row band is read by both column programs, every B column
        # band by both row programs
        assert c["loaded"] == 2 * 40 * 70 * 4 + 2 * 70 * 36 * 4
        assert c["unique_loaded"] == 40 * 70 * 4 + 70 * 36 * 4
        assert c["stored"] == c["unique_stored"] == 40 * 36 * 4
        # the accumulator's add per chunk (4 programs x 3 chunks x 32x32), scaled by the active share of the lanes
        # the loads and stores moved: 12080 of 28672 (24 tile loads and 4 tile stores of 1024 lanes)
        assert c["flops"] == 4 * 3 * 32 * 32 * (42560 // 4 + 5760 // 4) // (24 * 1024 + 4 * 1024)
    # the edge tiles' padding (zeros from the masked loads) is not counted: 2*M*N*K of the product itself
    assert ieee["dot_flops"] == 2 * 40 * 36 * 70 and ieee["tf32_flops"] == 0
    assert tf32["tf32_flops"] == 2 * 40 * 36 * 70 and tf32["dot_flops"] == 0


def test_a_default_precision_dot_rounds_its_operands_to_tf32_like_a_gpu(counted):
    assert counted["err_ieee"] < 1e-4
    assert 1e-4 < counted["err_tf32"] < 0.2  # 10 mantissa bits on 70-long dot products of N(0, 1) values


def test_a_row_read_twice_in_one_launch_counts_twice_requested_once_distinct(counted):
    assert counted["softmax_ok"]
    c = launch(counted, 3)
    assert c["programs"] == 4
    assert c["loaded"] == 2 * 4 * 100 * 4 and c["unique_loaded"] == 4 * 100 * 4
    assert c["stored"] == 4 * 100 * 4
    # per row of a 128-lane block: max, (sub, exp, sum), then (sub, exp, div) = 7 ops of 128 lanes, scaled to the
    # 100 active lanes of each
    assert c["flops"] == 4 * 7 * 100


def test_an_atomic_add_reads_and_writes_each_active_lane(counted):
    assert counted["bins"] == [1.0, 2.0, 1.0, 3.0, 0.0]
    c = launch(counted, 4)
    assert c["loaded"] == 7 * 4 + 7 * 4  # the indices, then the bins' read half of the read-modify-write
    assert c["stored"] == 7 * 4
    assert c["unique_loaded"] == 7 * 4 + 4 * 4  # 7 indices; 4 distinct bins
    assert c["unique_stored"] == 4 * 4


def test_a_grid_declaring_a_gpus_programs_is_modeled_with_them_but_never_more_than_one_per_active_lane(counted):
    """The interpreter ran one program of 1024 lanes; a GPU runs 8 of 128, which is what the cost model reads. A
    claim of a billion programs is cut to the 3000 lanes the launch moved (two loads and a store of 1000)."""
    assert launch(counted, 5)["programs"] == 8
    assert launch(counted, 6)["programs"] == 3000
    assert launch(counted, 5)["unique_loaded"] == 4000  # the same tensor twice: its bytes once


def test_only_launches_inside_counting_are_recorded(counted):
    assert len(counted["launches"]) == 7


def test_the_kernels_extra_admits_the_triton_torchs_cuda_wheel_pins_and_only_hooked_releases():
    """torch 2.13.0's CUDA wheel on PyPI requires triton==3.7.1: an extra pinned to 3.9 could not be installed
    anywhere torch comes from PyPI (pip: ResolutionImpossible). The range and the hooked releases agree."""
    import tomllib

    from packaging.requirements import Requirement

    from activities.kernels import traffic

    root = Path(__file__).resolve().parents[2]
    extras = tomllib.loads((root / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    assert traffic.TRITON_PIN in extras["kernels"]
    pins = {Requirement(r).name: Requirement(r).specifier for r in extras["kernels"]}
    assert pins["torch"].contains("2.13.0") and pins["triton"].contains("3.7.1")
    for release in ("3.6.0", "3.7.1", "3.8.0", "3.9.0", "3.10.0"):
        assert pins["triton"].contains(release) == release.startswith(traffic.HOOKED_TRITONS), release
