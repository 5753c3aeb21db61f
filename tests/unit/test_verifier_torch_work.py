"""VERIFIED means the Triton kernel did the work: a candidate whose forward computes with torch (then lets a
kernel copy the result out, or does part of the work in torch) is rejected with the op and the line of
candidate.py, however the torch call is reached. Real verifier children (Triton interpreter), small sizes."""

from __future__ import annotations

from pathlib import Path

import pytest

from activities.kernels.torch_work import ALLOWED, torch_work
from activities.kernels.verifier import verify
from contracts.kernel_job import TorchOpUse
from tests.unit.test_conductor_offline_designer import analyse
from tests.unit.test_verifier import EXAMPLES, HEADER, RELU, TIMEOUT_S, candidate

RELU_OPS = ["aten.relu.default"]
COPY = '''
@triton.jit
def copy_kernel(src_ptr, out_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    tl.store(out_ptr + offs, tl.load(src_ptr + offs, mask=mask), mask=mask)


def copy_out(y):
    y = y.contiguous()
    out = torch.empty_like(y)
    copy_kernel[(triton.cdiv(y.numel(), 1024),)](y, out, y.numel(), BLOCK=1024)
    return out


def helper(x):
    return torch.nn.functional.relu(x)
'''


def line_of(source: str, text: str) -> int:
    return 1 + next(i for i, ln in enumerate(source.splitlines()) if ln.strip() == text)


@pytest.mark.parametrize(
    ("body", "torch_line"),
    [
        ("y = torch.relu(x)\nreturn copy_out(y)", "y = torch.relu(x)"),
        ("return copy_out(helper(x))", "return torch.nn.functional.relu(x)"),
        ("y = torch.ops.aten.relu.default(x)\nreturn copy_out(y)", "y = torch.ops.aten.relu.default(x)"),
        ("try:\n    relu_kernel[(1,)](x, x)\n    y = x\nexcept Exception:\n    y = torch.relu(x)\nreturn copy_out(y)",
         "y = torch.relu(x)"),
    ],
    ids=["copy-wrapper", "functional-in-a-helper", "aten-direct", "try-except-fallback"],
)
def test_torch_computing_the_task_is_rejected_with_the_op_and_its_line(body: str, torch_line: str):
    source = candidate(body, prelude=COPY)
    report = verify(RELU, source, timeout_s=TIMEOUT_S, reference_ops=RELU_OPS)
    assert report.static.ok and report.mismatches == [], "the numbers match: torch computed them"
    assert not report.passed
    line = line_of(source, torch_line)
    assert report.reason.startswith("torch did the work, not the Triton kernel: the reference's relu ran as torch "
                                    f"op aten.relu.default at candidate.py:{line} `{torch_line}`"), report.reason
    assert "Compute relu inside the kernel" in report.reason
    assert [(u.op, u.line, u.in_reference) for u in report.torch_ops] == [("relu", line, True)]


SOFTMAX_TASK = '''import torch
import torch.nn as nn


class Model(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, a, b):
        return torch.softmax(a @ b, dim=-1)


M, K, N = 9, 12, 7


def get_inputs():
    return [torch.randn(M, K), torch.randn(K, N)]


def get_init_inputs():
    return []
'''

MIXED = HEADER + '''
@triton.jit
def matmul_kernel(a_ptr, b_ptr, c_ptr, M, N, K, BLOCK: tl.constexpr):
    rm = tl.arange(0, BLOCK)
    rn = tl.arange(0, BLOCK)
    acc = tl.zeros((BLOCK, BLOCK), dtype=tl.float32)
    for k in range(0, K):
        a = tl.load(a_ptr + rm * K + k, mask=rm < M, other=0.0)
        b = tl.load(b_ptr + k * N + rn, mask=rn < N, other=0.0)
        acc += a[:, None] * b[None, :]
    tl.store(c_ptr + rm[:, None] * N + rn[None, :], acc, mask=(rm[:, None] < M) & (rn[None, :] < N))


class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, a, b):
        a, b = a.contiguous(), b.contiguous()
        c = torch.empty((a.shape[0], b.shape[1]), dtype=a.dtype)
        matmul_kernel[(1,)](a, b, c, a.shape[0], b.shape[1], a.shape[1], BLOCK=16)
        return torch.softmax(c, dim=-1)
'''


def test_a_mixed_kernel_is_rejected_for_the_op_torch_did_unless_the_workflow_allows_it(tmp_path: Path):
    ops = analyse(SOFTMAX_TASK, tmp_path).aten_ops  # the reference's traced graph, as the job has it
    assert "aten._softmax.default" in ops and "aten.mm.default" in ops
    line = line_of(MIXED, "return torch.softmax(c, dim=-1)")
    report = verify(SOFTMAX_TASK, MIXED, timeout_s=TIMEOUT_S, reference_ops=ops)
    assert not report.passed and report.mismatches == []
    assert report.reason.startswith("torch did the work, not the Triton kernel: the reference's _softmax ran as "
                                    f"torch op aten._softmax.default at candidate.py:{line}"), report.reason
    assert "mm" not in {u.op for u in report.torch_ops}, "the matmul ran in the kernel"

    allowed = verify(SOFTMAX_TASK, MIXED, timeout_s=TIMEOUT_S, reference_ops=ops, allow_mixed=True)
    assert allowed.passed, allowed.reason
    assert [(u.op, u.line) for u in allowed.torch_ops] == [("_softmax", line)], "named, not hidden"


PARTIAL_SUMS_REDUCED_BY_TORCH = "return part.sum(dim=0).unsqueeze(1)"


def test_per_block_partial_sums_reduced_with_torch_are_partial_offload():
    from tests.unit.test_verifier import PARTIAL_SUMS

    task = (EXAMPLES / "sum_dim.py").read_text()
    report = verify(task, PARTIAL_SUMS, timeout_s=TIMEOUT_S, reference_ops=["aten.sum.dim_IntList"])
    assert not report.passed
    assert f"the reference's sum ran as torch op aten.sum.dim_IntList at candidate.py:" \
           f"{line_of(PARTIAL_SUMS, PARTIAL_SUMS_REDUCED_BY_TORCH)}" in report.reason, report.reason
    assert verify(task, PARTIAL_SUMS, timeout_s=TIMEOUT_S, allow_mixed=True).passed


def test_glue_passes_and_ops_outside_the_reference_are_still_named():
    glue = [TorchOpUse(op=o, overload=f"aten.{o}.default") for o in ("empty_like", "view", "_to_copy", "clone", "copy_")]
    assert torch_work(glue, RELU_OPS) == ("", [])
    reason, flagged = torch_work([*glue, TorchOpUse(op="clamp_min", overload="aten.clamp_min.default", line=9),
                                  TorchOpUse(op="relu", overload="aten.relu.default", line=12)], RELU_OPS)
    assert [(u.op, u.in_reference) for u in flagged] == [("relu", True), ("clamp_min", False)], "the task's op first"
    assert "the reference's relu ran as torch op aten.relu.default at candidate.py:12" in reason
    assert "clamp_min ran as torch op aten.clamp_min.default at candidate.py:9" in reason
    assert not {"relu", "mm", "addmm", "sum", "mul", "add", "cat", "_softmax", "where"} & ALLOWED
