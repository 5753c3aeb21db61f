"""Operands read through a reshape torch could only make by copying (activities/kernels/compiler/blocks/matmul.py,
`_merged`): a matmul's A (a permuted [tokens, batch, features] tensor's rows, attention heads put back together) and
attention's Q, K and V (heads split and merged with the batch) are indexed by the kernel itself, and the answer is
torch's."""

from __future__ import annotations


from activities.kernels.compiler.blocks.matmul import KERNEL, LAUNCHER, MERGED
from tests.unit.compiler.cases import Case, candidate, interpreted, run

PROBE = r'''
import json, sys, torch, triton, triton.language as tl
scope = {"torch": torch, "triton": triton, "tl": tl}
exec(sys.argv[1], scope)
torch.manual_seed(0)
cases = {
    "tokens x batch rows of a permuted image": (torch.randn(2, 8, 6).permute(2, 0, 1), [12, 8], torch.randn(8, 5)),
    "heads put back together: rows and columns each merge two dims": (
        torch.randn(8, 6, 2).permute(1, 0, 2), [12, 8], torch.randn(8, 5)),
    "batched: rows merge two dims": (torch.randn(2, 3, 4, 5).permute(0, 2, 1, 3), [2, 12, 5], torch.randn(2, 5, 7)),
    "three dims in one row: torch's copy": (torch.randn(2, 3, 4, 5).permute(3, 2, 1, 0), [60, 2], torch.randn(2, 3)),
    "batched: the batch merges two dims (copied for the matmul)": (
        torch.randn(3, 2, 4, 5).permute(1, 0, 2, 3), [6, 4, 5], torch.randn(6, 5, 2)),
    "a reshape torch can view": (torch.randn(3, 4, 5), [12, 5], torch.randn(5, 2)),
}
report = {}
for case, (x, sizes, b) in cases.items():
    a = scope["_merged"](x, sizes)
    kind = "merged" if isinstance(a, scope["_Merged"]) else "view" if a.data_ptr() == x.data_ptr() else "copy"
    out, grid, args, meta = scope["_matmul"](a, b)
    scope["matmul_kernel"][grid](*args, **meta)
    want = x.reshape(sizes) @ b
    report[case] = {"kind": kind, "right": bool(torch.allclose(out, want, atol=1e-5, rtol=1e-5))}
print(json.dumps(report))
'''


def test_a_reshape_that_would_copy_is_read_in_place_by_the_matmul_and_the_product_is_torchs():
    report = interpreted(PROBE, LAUNCHER + MERGED + "\n" + KERNEL)
    assert report == {
        "tokens x batch rows of a permuted image": {"kind": "merged", "right": True},
        "heads put back together: rows and columns each merge two dims": {"kind": "merged", "right": True},
        "batched: rows merge two dims": {"kind": "merged", "right": True},
        "three dims in one row: torch's copy": {"kind": "copy", "right": True},
        "batched: the batch merges two dims (copied for the matmul)": {"kind": "merged", "right": True},
        "a reshape torch can view": {"kind": "view", "right": True},
    }


HEADS_BACK = Case("self.proj(y.transpose(1, 2).contiguous().view(2, N, 8).view(-1, 8))", "torch.randn(2, 4, N, 2)",
                  args="y", init=("self.proj = nn.Linear(8, 3)",))
"""minGPT's heads put back together ([batch, heads, tokens, head dim] -> [batch, tokens, features]), then a Linear's
2-D view: two reshapes, which `reshape_chains` makes one."""


def test_heads_put_back_together_feed_the_linear_in_place_and_stay_right_at_two_sizes(tmp_path):
    source = candidate(HEADS_BACK, tmp_path / "trace")
    merged = [line.strip() for line in source.splitlines() if "_merged(" in line and "def " not in line]
    permuted = {line.split(" = ")[0].strip() for line in source.splitlines() if ".permute(" in line}
    assert len(merged) == 1 and merged[0].split("_merged(")[1].split(",")[0] in permuted, merged
    assert run({"view:heads back": HEADS_BACK}, tmp_path / "run") == {"view:heads back": []}


ATTENTION_PROBE = r'''
import json, math, sys, torch, triton, triton.language as tl
scope = {"torch": torch, "triton": triton, "tl": tl, "math": math}
exec(sys.argv[1], scope)
torch.manual_seed(0)
tokens, batch, heads, dim = 9, 2, 3, 4
qkv = torch.randn(tokens, batch, 3, heads * dim)  # nn.MultiheadAttention's packed in-projection, [T, B, 3, E]
q, k, v = (scope["_merged"](qkv[:, :, i], [tokens, batch * heads, dim]).permute([1, 0, 2]) for i in range(3))
out, grid, args, meta = scope["_attention"](q, k.permute([0, 2, 1]), v, [], [], [])
scope[sys.argv[2]][grid](*args, **meta)
want = torch.softmax(q.copy() @ k.copy().transpose(1, 2), dim=-1) @ v.copy()
storage = qkv.untyped_storage().data_ptr()
print(json.dumps({"merged": [type(t).__name__ for t in (q, k, v)],
                  "in place": all(t.untyped_storage().data_ptr() == storage for t in args[:3]),  # the kernel's q, k, v
                  "right": bool(torch.allclose(out, want, atol=1e-5, rtol=1e-5))}))
'''


def test_attention_reads_heads_merged_with_the_batch_in_place_and_answers_as_torch():
    from activities.kernels.compiler.blocks.common import GPU_GRID
    from activities.kernels.optimizer.attention import LAUNCHER as ATTENTION, attention_kernel

    name, kernel = attention_kernel(0, 0, [], "acc", "softmax")
    assert interpreted(ATTENTION_PROBE, GPU_GRID + ATTENTION + MERGED + "\n" + kernel, name) == {
        "merged": ["_Merged"] * 3, "in place": True, "right": True}

