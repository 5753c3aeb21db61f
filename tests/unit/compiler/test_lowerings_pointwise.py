"""The elementwise lowerings (activities/kernels/compiler/lowerings/pointwise.py), one case per aten op."""

from __future__ import annotations

import pytest

from tests.unit.compiler.cases import Case, run

X = "torch.randn(3, N)"
I = "torch.randint(2**40, (3, N))"
CASES: dict[str, Case] = {
    "relu": Case("torch.relu(x)", X),
    "add:int64_exact": Case("i * 3 + (i - 2**40) + 1", I, args="i"),
    "eq:int64_exact": Case("(i + 1) == i", I, args="i"),
    "where:int64_exact": Case("torch.where(x > 0, torch.maximum(i, j), -i)", f"torch.randn(3, N), {I}, {I}",
                              args="x, i, j"),
    "_to_copy:int64_exact": Case("i.int().long() * 2", "torch.randint(2**30, (3, N))", args="i"),
    "sigmoid": Case("torch.sigmoid(x)", X),
    "tanh": Case("torch.tanh(x)", X),
    "exp": Case("torch.exp(x)", X),
    "log": Case("torch.log(x.abs() + 0.1)", X),
    "sqrt": Case("torch.sqrt(x.abs())", X),
    "rsqrt": Case("torch.rsqrt(x.abs() + 0.5)", X),
    "abs": Case("torch.abs(x)", X),
    "neg": Case("-x", X),
    "reciprocal": Case("torch.reciprocal(x.abs() + 1)", X),
    "sin": Case("torch.sin(x)", X),
    "cos": Case("torch.cos(x)", X),
    "erf": Case("torch.erf(x)", X),
    "exp2": Case("torch.exp2(x)", X),
    "log2": Case("torch.log2(x.abs() + 0.1)", X),
    "floor": Case("torch.floor(x * 3)", X),
    "ceil": Case("torch.ceil(x * 3)", X),
    "silu": Case("F.silu(x)", X),
    "hardsigmoid": Case("F.hardsigmoid(x * 4)", X),
    "hardswish": Case("F.hardswish(x * 4)", X),
    "mish": Case("F.mish(x)", X),
    "log1p": Case("torch.log1p(x.abs())", X),
    "expm1": Case("torch.expm1(x)", X),
    "sign": Case("torch.sign(x)", X),
    "logical_not": Case("torch.logical_not(x > 0).float()", X),
    "gelu": Case("F.gelu(x)", X),
    "gelu:tanh": Case('F.gelu(x, approximate="tanh")', X),
    "leaky_relu": Case("F.leaky_relu(x, 0.3)", X),
    "elu": Case("F.elu(x, 0.7)", X),
    "elu:selu": Case("F.selu(x)", X),
    "celu": Case("F.celu(x, 0.7)", X),
    "hardtanh": Case("F.relu6(x * 4)", X),
    "softplus": Case("F.softplus(x * 10, 2.0, 5.0)", X),
    "clamp": Case("torch.clamp(x, -0.5, 0.5)", X),
    "clamp_min": Case("torch.clamp_min(x, 0.2)", X),
    "clamp_max": Case("torch.clamp_max(x, 0.2)", X),
    "add": Case("torch.add(x, y, alpha=2.0)", "torch.randn(2, N, 6), torch.randn(N, 1)", args="x, y"),
    "sub": Case("x - y", "torch.randn(2, N, 6), torch.randn(6)", args="x, y"),
    "mul": Case("x * y", "torch.randn(2, N, 6), torch.randn(2, 1, 6)", args="x, y"),
    "div": Case("x / (y.abs() + 1)", "torch.randn(N, 6), torch.randn(N, 6)", args="x, y"),
    "mul:scalar_input": Case("x * s", "torch.randn(4, N), 3.5", args="x, s"),
    "maximum": Case("torch.maximum(x, x * 0.5)", X),
    "minimum": Case("torch.minimum(x, x * 0.5)", X),
    "minimum:tensor_constant_built_in_forward": Case("torch.min(x, torch.tensor(0.5)) * 2", X),
    "minimum:tensor_constant_on_the_input_device": Case("torch.min(x, torch.tensor(0.0, device=x.device)) * 2", X),
    "pow": Case("torch.pow(x, 3) + torch.pow(x.abs(), 0.5) + torch.pow(x.abs() + 1, 1.7)", X),
    "pow:tensor_exponent": Case("torch.pow(x.abs() + 1, y)", "torch.randn(3, N), torch.randn(3, N)", args="x, y"),
    "rsub": Case("1.5 - x", X),
    "xlogy": Case("torch.xlogy(x, x.abs() + 1)", X),
    "gt": Case("(x > 0).float()", X),
    "lt": Case("(x < 0).float()", X),
    "ge": Case("(x >= 0).float()", X),
    "le": Case("(x <= 0).float()", X),
    "eq": Case("(x.floor() == 0).float()", X),
    "ne": Case("(x.floor() != 0).float()", X),
    "fmax": Case("torch.fmax(x, x * 0.5)", X),
    "fmin": Case("torch.fmin(x, x * 0.5)", X),
    "where": Case("torch.where(x > 0, x, y)", "torch.randn(3, N), torch.randn(3, N)", args="x, y"),
    "masked_fill": Case("x.masked_fill(x > 0, float('-inf')).exp()", X),
    "masked_fill:causal_buffer": Case("F.softmax(x.masked_fill(self.mask[:, :, :x.size(2), :x.size(2)] == 0, float('-inf')), dim=-1)",
                                      "torch.randn(2, 3, N, N)",
                                      init=("self.register_buffer('mask', torch.tril(torch.ones(16, 16)).view(1, 1, 16, 16))",)),
    "bitwise_not": Case("x.masked_fill(~torch.tril(torch.ones(x.size(0), x.size(1), device=x.device, dtype=torch.bool)), "
                        "-1.0)", "torch.randn(N, N)"),
    "_to_copy": Case("(x * 3).to(torch.float16)", X),
    "relu:chain_fused_with_broadcast": Case("torch.relu(x + b) * y - 0.5", "torch.randn(2, N, 6), torch.randn(N, 1), torch.randn(6)", args="x, b, y"),
}


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> dict[str, list[str]]:
    return run(CASES, tmp_path_factory.mktemp("pointwise"))


@pytest.mark.parametrize("key", list(CASES))
def test_the_lowering_matches_the_reference_at_the_traced_size_and_another(key, runs):
    assert runs[key] == [], runs[key]
