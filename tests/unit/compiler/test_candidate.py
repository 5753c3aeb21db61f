"""The candidate as a whole: torch in its forward only allocates and takes views, pointwise chains fuse into
their consumer, an op nothing lowers is refused by name, reshape targets come from run-time sizes."""

from __future__ import annotations

import ast

import pytest

from activities.kernels import compiler
from activities.kernels.compiler.blocks.views import reshape_target
from activities.kernels.static_checks import static_check
from tests.unit.compiler.cases import Case, analyse, candidate, source

CONV = Case("self.c(x)", "torch.randn(2, 4, N, 9)",
            init=("self.c = nn.Conv2d(4, 6, 3, stride=2, padding=2, dilation=2, groups=2)",))
BATCH_NORM = Case("self.bn(x)", "torch.randn(2, 3, N, 5)", init=("self.bn = nn.BatchNorm2d(3)",))
EXCLUSIVE_CUMSUM = Case("torch.cumsum(torch.cat((torch.zeros_like(x.select(1, 0).unsqueeze(1)), x), dim=1)[:, :-1], dim=1)",
                        "torch.randn(3, N)")
CROSS_ENTROPY = Case("F.cross_entropy(x, t)", "torch.randn(N, 5), torch.randint(0, 5, (N,))", args="x, t")
LINEAR = Case("torch.sigmoid(self.fc(x)) * 3.0", "torch.randn(N, 8)", init=("self.fc = nn.Linear(8, 5)",))
LAYER_NORM = Case("self.ln(x) * 2.0", "torch.randn(N, 6)", init=("self.ln = nn.LayerNorm(6)",))


@pytest.mark.parametrize("case", [CONV, BATCH_NORM, EXCLUSIVE_CUMSUM, CROSS_ENTROPY, LINEAR],
                         ids=["conv", "batch_norm", "exclusive_cumsum", "cross_entropy", "linear"])
def test_torch_only_allocates_and_takes_views_in_the_forward(case, tmp_path):
    """Issue 29: every arithmetic step is in a kernel; the forward's torch calls are allocation and views."""
    src = candidate(case, tmp_path)
    assert static_check(src).ok
    tree = ast.parse(src)
    model = next(n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == "ModelNew")
    forward = next(n for n in model.body if isinstance(n, ast.FunctionDef) and n.name == "forward")
    launchers = {n.name for n in tree.body if isinstance(n, ast.FunctionDef) and not n.decorator_list}
    kernels = {n.name for n in tree.body if isinstance(n, ast.FunctionDef) and n.decorator_list}
    allowed_methods = {"reshape", "permute", "unsqueeze", "squeeze", "expand", "select", "narrow", "shape"}
    for node in ast.walk(forward):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
            root = node.func.value
            if isinstance(root, ast.Name) and root.id == "torch":
                assert node.func.attr in {"empty", "zeros_like"}, ast.unparse(node)
            else:
                assert node.func.attr in allowed_methods, ast.unparse(node)
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Name):
            assert node.func.id in launchers, ast.unparse(node)
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Subscript):
            assert ast.unparse(node.func.value) in kernels, ast.unparse(node)


def test_pointwise_ops_are_fused_into_their_consumer(tmp_path):
    forward = candidate(LINEAR, tmp_path).split("class ModelNew", 1)[1]
    assert forward.count("_matmul(") == 1 and forward.count("_pointwise(") == 1, forward
    norm = candidate(LAYER_NORM, tmp_path / "ln").split("class ModelNew", 1)[1]
    assert norm.count("_reduce(") == 2, "mean, then mean of squares with the centring fused"


def test_only_the_launchers_the_forward_calls_are_written(tmp_path):
    src = candidate(LINEAR, tmp_path)
    assert "def _matmul(" in src and "def _pointwise(" in src
    assert "def _conv(" not in src and "def _reduce(" not in src and "def _gather(" not in src


def test_a_graph_with_an_op_it_cannot_lower_is_refused_naming_the_op(tmp_path):
    train = Case("F.dropout(x, 0.5, training=True)", "torch.randn(N, 3)")
    assert compiler.lower(analyse(source(train, 4), tmp_path)).startswith(
        "no lowering for native_dropout (dropout with p > 0 in training mode draws a random mask")
    const = Case("x + torch.tensor([0.5, 1.0, 2.0], device=x.device)", "torch.randn(N, 3)")
    reason = compiler.lower(analyse(source(const, 4), tmp_path / "c"))
    assert isinstance(reason, str) and "get_attr" in reason, "a non-scalar constant built in forward is not read"


def test_repeated_subexpressions_are_computed_once(tmp_path):
    twice = Case("x.sum(dim=1) + x.sum(dim=1) * 2", "torch.randn(3, N)")
    lowered = compiler.lower(analyse(source(twice, 7), tmp_path))
    assert not isinstance(lowered, str)
    assert compiler.launches(lowered) == 2, "one reduction, one pointwise epilogue"


def test_reshape_targets_are_written_from_runtime_sizes():
    assert reshape_target("x", [2, 3, 4], [6, 4]) == ["x.shape[0] * x.shape[1]", "x.shape[2]"]
    assert reshape_target("x", [2, 12], [2, 3, 4]) == ["x.shape[0]", "-1", "4"]
    assert reshape_target("x", [2, 3, 4, 5], [1, 6, 4, 5]) == ["1", "x.shape[0] * x.shape[1]", "x.shape[2]", "x.shape[3]"]


def test_the_tasks_future_imports_open_the_candidate(tmp_path):
    case = Case("torch.relu(x)", "torch.randn(3, N)")
    src = "from __future__ import annotations\n" + source(case, 7)
    lowered = compiler.lower(analyse(src, tmp_path))
    assert not isinstance(lowered, str)
    rendered = compiler.render(lowered, src)
    assert rendered.startswith("from __future__ import annotations\n") and rendered.count("from __future__") == 1
    assert static_check(rendered, src).ok
