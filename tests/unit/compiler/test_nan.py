"""NaN as torch has it: a max or min of anything with a NaN is NaN, and argmax / argmin point at the first NaN.
Triton's default maximum (like C's fmax) returns the other operand, so relu, clamp, hardtanh, amax and max pooling
would give a number where the reference gives NaN, a difference no finite test input shows. Likewise infinities:
torch's logsumexp of a row holding +inf is +inf (it shifts by 0, not by the infinite max)."""

from __future__ import annotations

import pytest

from tests.unit.compiler.cases import Case, run

NAN = "float('nan')"
ROWS = f"torch.tensor([[1.0, {NAN}, 3.0, -2.0], [-1.0, 0.5, {NAN}, {NAN}], [2.0, -3.0, 0.25, 4.0]]).repeat(1, N)"
"""Three rows: a NaN in the middle, NaNs at the end, none (a row without NaN must keep its own answer)."""
INF = "float('inf')"
INF_ROWS = f"torch.tensor([[1.0, {INF}, 3.0], [-{INF}, 0.5, 2.0], [{INF}, -{INF}, 0.0], [-{INF}, -{INF}, -{INF}]]).repeat(1, N)"
"""+inf in a row, -inf in a row, both, and only -inf."""
IMAGE = f"torch.where(torch.rand(2, 3, N, 8) < 0.1, {NAN}, torch.randn(2, 3, N, 8))"
CASES: dict[str, Case] = {
    "relu": Case("torch.relu(x)", ROWS),
    "hardtanh": Case("F.hardtanh(x)", ROWS),
    "hardsigmoid": Case("F.hardsigmoid(x)", ROWS),
    "clamp": Case("torch.clamp(x, -0.5, 0.5)", ROWS),
    "maximum": Case("torch.maximum(x, y) + torch.minimum(y, x)", f"{ROWS}, torch.zeros(3, 4 * N)", args="x, y"),
    "amax": Case("torch.amax(x, dim=1) + torch.amin(x, dim=1)", ROWS),
    "max": Case("torch.max(x, dim=1)[0]", ROWS),
    "argmax": Case("torch.argmax(x, dim=1)", ROWS),
    "argmin": Case("torch.argmin(x, dim=1)", ROWS),
    "max_pool2d_with_indices": Case("F.max_pool2d(x, 2)", IMAGE),
    "adaptive_max_pool2d": Case("F.adaptive_max_pool2d(x, (2, 3))", IMAGE),
    "logsumexp": Case("torch.logsumexp(x, dim=1)", INF_ROWS),
}


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> dict[str, list[str]]:
    return run(CASES, tmp_path_factory.mktemp("nan"))


@pytest.mark.parametrize("key", list(CASES))
def test_nan_comes_out_where_torch_gives_it(key, runs):
    assert runs[key] == [], runs[key]
