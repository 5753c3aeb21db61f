"""A strided transposed convolution does only its own work: by output phase (compiler/blocks/conv.py
phased_lines), the tl.dot FLOPs the interpreter counts (activities/kernels/traffic.py) are the convolution's
2 x input elements x output channels x kernel offsets, where the plain implicit GEMM computed every offset
and masked 7 of 8 at stride 2 in 3-D (8x the FLOPs)."""

from __future__ import annotations


from tests.unit.compiler.cases import Case, candidate, interpreted

CASE = Case("self.c(x)", "torch.randn(2, 8, 5, N, 6)",
            init=("self.c = nn.ConvTranspose3d(8, 16, 3, stride=2, padding=1, output_padding=1)",))

COUNT = r'''
import importlib.util, json, sys
import torch
from activities.kernels.traffic import Counter, install

spec = importlib.util.spec_from_file_location("cand", sys.argv[1])
cand = importlib.util.module_from_spec(spec)
spec.loader.exec_module(cand)
torch.manual_seed(0)
new = cand.ModelNew()
x = torch.randn(2, 8, 5, 7, 6)
counter = Counter()
install(counter)
with counter.counting():
    y = new(x)
err = (y - cand.Model.forward(new, x)).abs().max().item()
print(json.dumps({"launches": counter.launches, "err": err, "x": x.numel()}))
'''


def test_a_strided_transposed_convolution_computes_only_the_offsets_that_reach_each_output(tmp_path):
    src = candidate(CASE, tmp_path)
    assert "conv3d_transposed_phased_kernel" in src
    (tmp_path / "candidate.py").write_text(src)
    out = interpreted(COUNT, str(tmp_path / "candidate.py"))
    assert out["err"] < 1e-4
    [conv] = [c for c in out["launches"] if c["dot_flops"]]
    assert conv["dot_flops"] == 2 * out["x"] * 16 * 3 ** 3
