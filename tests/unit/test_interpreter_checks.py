"""The candidate child spares Triton's interpreter the int32 overflow checks it computes and then drops
(`_child.skip_unasserted_overflow_checks`): the same values come out, without the checks' comparisons."""

from __future__ import annotations

from tests.unit.compiler.cases import interpreted

PROBE = '''
import json, sys
import torch, triton, triton.language as tl
from triton.runtime import interpreter
from activities.kernels._child import skip_unasserted_overflow_checks

@triton.jit
def strided_copy(x_ptr, o_ptr, n, d1, s0, s1, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    i1 = offs % d1
    i0 = offs // d1
    tl.store(o_ptr + offs, tl.load(x_ptr + i0 * s0 + i1 * s1, mask=offs < n, other=0.0), mask=offs < n)

if sys.argv[1] == "skip":
    skip_unasserted_overflow_checks()
builder = interpreter.interpreter_builder
checks = {"n": 0}
original = builder.create_icmpSLE
def counted(*args):
    checks["n"] += 1  # the overflow check's `result <= int32 max`; the kernel itself has no <=
    return original(*args)
builder.create_icmpSLE = counted
torch.manual_seed(0)
x = torch.randn(37, 23).t()
o = torch.empty(23 * 37)
strided_copy[(triton.cdiv(o.numel(), 128),)](x, o, o.numel(), 37, x.stride(0), x.stride(1), BLOCK=128)
print(json.dumps({"checks": checks["n"], "right": bool(torch.equal(o, x.reshape(-1))), "out": o.tolist()}))
'''


def run(mode: str) -> dict:
    return interpreted(PROBE, mode)


def test_the_interpreter_computes_the_same_values_without_its_dropped_overflow_checks():
    checked, skipped = run("keep"), run("skip")
    assert checked["right"] and skipped["right"]
    assert skipped["out"] == checked["out"]
    assert checked["checks"] > 0 and skipped["checks"] == 0
