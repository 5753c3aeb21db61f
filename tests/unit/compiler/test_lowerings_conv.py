"""Convolution (activities/kernels/compiler/lowerings/conv.py)."""

from __future__ import annotations

import pytest

from tests.unit.compiler.cases import Case, run

X = "torch.randn(3, N)"
CASES: dict[str, Case] = {
    "convolution": Case("self.c(x)", "torch.randn(2, 4, N, 9)", init=("self.c = nn.Conv2d(4, 6, 3, stride=2, padding=2, dilation=2, groups=2)",)),
    "convolution:transposed1d": Case("self.c(x)", "torch.randn(2, 3, N)", init=("self.c = nn.ConvTranspose1d(3, 4, 3, stride=2, padding=1, output_padding=1)",)),
    "convolution:conv3d": Case("self.c(x)", "torch.randn(1, 2, 4, N, 5)", init=("self.c = nn.Conv3d(2, 3, (2, 3, 2))",)),
    "convolution:transposed3d_phased": Case("self.c(x)", "torch.randn(1, 2, 3, N, 4)", init=("self.c = nn.ConvTranspose3d(2, 3, 3, stride=2, padding=1, output_padding=1)",)),
    "convolution:transposed2d_phased_kernel_below_stride": Case("self.c(x)", "torch.randn(2, 4, N, 3)", init=("self.c = nn.ConvTranspose2d(4, 6, (2, 3), stride=(3, 2), padding=(0, 2), groups=2, bias=False)",)),
    "convolution:transposed2d_grouped": Case("self.c(x)", "torch.randn(1, 4, N, 5)", init=("self.c = nn.ConvTranspose2d(4, 6, 3, stride=2, groups=2, dilation=2)",)),
}


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> dict[str, list[str]]:
    return run(CASES, tmp_path_factory.mktemp("conv"))


@pytest.mark.parametrize("key", list(CASES))
def test_the_lowering_matches_the_reference_at_the_traced_size_and_another(key, runs):
    assert runs[key] == [], runs[key]
