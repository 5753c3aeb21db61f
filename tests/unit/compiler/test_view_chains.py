"""`view_chains` (activities/kernels/compiler/passes.py): a run of reshapes and permutes is written as a split, one
permute and one merge, so torch copies at most once (at the merge) and only where no view exists."""

from __future__ import annotations


from activities.kernels import compiler
from activities.kernels.compiler.passes import compose_views
from activities.kernels.optimizer import REWRITES, load
from tests.unit.compiler.cases import TRACED_N, Case, interpreted, lowered, run, source


def test_a_head_split_through_a_transpose_is_one_split_and_one_permute_of_the_input():
    # q [T=5, B=2, E=6] -> reshape(T, B * H, hd) -> transpose(0, 1) -> view(B, H, T, hd), H = 3, hd = 2
    steps = [("reshape", [5, 6, 2], ["s0", "(3 * s1)", "2"]), ("permute", [1, 0, 2], []),
             ("reshape", [2, 3, 5, 2], ["s1", "3", "s0", "2"])]
    assert compose_views([5, 2, 6], [], steps) == ([5, 2, 3, 2], ["s0", "s1", "3", "2"], [1, 2, 0, 3])


def test_heads_put_back_together_are_a_permute_then_a_merge():
    # y [B=2, H=3, T=5, hd=2] -> reshape(B * H, T, hd) -> transpose(0, 1) -> reshape(T, B, H * hd)
    steps = [("reshape", [6, 5, 2], []), ("permute", [1, 0, 2], []), ("reshape", [5, 2, 6], [])]
    split, _, perm = compose_views([2, 3, 5, 2], [], steps)
    assert (split, perm) == ([2, 3, 5, 2], [2, 0, 1, 3])


def test_a_run_that_cuts_a_factor_unevenly_or_splits_a_size_it_cannot_name_is_left_alone():
    uneven = [("reshape", [4, 3], []), ("permute", [1, 0], []), ("reshape", [2, 6], [])]
    assert compose_views([6, 2], [], uneven) is None  # 4 cuts the 6 unevenly
    named = [("reshape", [5, 12], ["s0", "s1"]), ("permute", [1, 0], []), ("reshape", [3, 4, 5], ["3", "(s1 // 3)", "s0"])]
    assert compose_views([5, 12], ["s0", "s1"], named) == ([5, 3, 4], ["s0", "3", "(s1 // 3)"], [1, 2, 0])
    unnamed = named[:2] + [("reshape", [3, 20], ["3", "(s1 * s0 // 3)"])]
    assert compose_views([5, 12], ["s0", "s1"], unnamed) is None  # s1's 4 is merged with s0: its size has no name


COPIES_PROBE = r'''
import importlib.util, json, sys, torch
from activities.kernels._child import LaunchRecorder, skip_unasserted_overflow_checks
skip_unasserted_overflow_checks()
ops = []
recorder = LaunchRecorder(sys.argv[1], on_torch_op=lambda func, args, kwargs, out: ops.append(str(func)))
def load(path, name):
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module
task, cand = load(sys.argv[2], "task"), load(sys.argv[1], "cand")
torch.manual_seed(0); model = cand.ModelNew(*task.get_init_inputs())
torch.manual_seed(1); inputs = task.get_inputs()
with torch.no_grad(), recorder.call():
    model(*inputs)
print(json.dumps(ops))
'''
FAST_PATH = Case("self.mha(x, x, x, need_weights=False)[0]", "torch.randn(N, 2, 8)",
                 init=("self.mha = nn.MultiheadAttention(8, 2)",))
"""nn.MultiheadAttention's fast path (no weights asked): the heads split as `reshape(T, B * H, hd).transpose(0, 1)
.view(B, H, T, hd)`, q and k each scaled by sqrt(scale), then scaled_dot_product_attention."""


def test_the_fast_path_of_multihead_attention_reaches_the_attention_kernel_without_a_torch_copy(tmp_path):
    """`view_chains` makes each head split a view (torch copied at its first reshape), and the attention rewrite
    scales q and k in the kernel (`_prescaled` through views): the forward's only torch work is views."""
    load()
    rewritten = REWRITES["attention"].fn(lowered(FAST_PATH, tmp_path / "trace"))
    assert rewritten is not None and compiler.launches(rewritten) == 5  # in-projection, bias, attention, out, bias
    (tmp_path / "candidate.py").write_text(compiler.render(rewritten, source(FAST_PATH, TRACED_N)))
    ops = set(interpreted(COPIES_PROBE, str(tmp_path / "candidate.py"), str(tmp_path / "trace" / "task.py")))
    assert ops and not ops & {"aten.clone.default", "aten.mul.Tensor", "aten.copy_.default"}, sorted(ops)
    assert run({"view:fast path": FAST_PATH}, tmp_path / "run") == {"view:fast path": []}
