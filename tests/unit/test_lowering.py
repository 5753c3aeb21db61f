"""The offline lowering's building blocks, each run for real under the Triton interpreter against the
reference (one child process for the whole table: importing torch and triton once), at the task's sizes
and at a second, different set of sizes (the candidate must not bake in the sample's shapes)."""

from __future__ import annotations

import ast
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from activities.kernels import lowering, offline_coder, offline_designer
from activities.kernels.static_checks import static_check
from contracts.kernel_job import KernelPlan, ReferenceAnalysis

ROOT = Path(__file__).resolve().parents[2]

TASK = '''import torch
import torch.nn as nn
import torch.nn.functional as F

N = {n}


class Model(nn.Module):
    def __init__(self):
        super().__init__()
{init}

    def forward(self, {args}):
        return {body}


def get_inputs():
    return [{inputs}]


def get_init_inputs():
    return []
'''

# name -> (init lines, forward args, forward body, inputs using N)
CASES: dict[str, tuple[str, str, str, str]] = {
    "pointwise_broadcast_three_inputs": ("        pass", "x, b, y", "torch.relu(x + b) * y - 0.5",
                                         "torch.randn(2, N, 6), torch.randn(N, 1), torch.randn(6)"),
    "logsumexp_then_gelu": ("        pass", "x", "F.gelu(torch.logsumexp(x, dim=1, keepdim=True))", "torch.randn(N, 7)"),
    "var_unbiased_over_two_dims": ("        pass", "x", "torch.var(x, dim=(0, 2))", "torch.randn(3, N, 5)"),
    "argmin_middle_dim": ("        pass", "x", "torch.argmin(x, dim=1)", "torch.randn(3, N, 4)"),
    "batch_norm_training": ("        self.bn = nn.BatchNorm2d(3)", "x", "self.bn(x)", "torch.randn(2, 3, N, 5)"),
    "group_norm": ("        self.gn = nn.GroupNorm(2, 4)", "x", "self.gn(x)", "torch.randn(2, 4, N)"),
    "instance_norm": ("        self.inorm = nn.InstanceNorm2d(3)", "x", "self.inorm(x)", "torch.randn(2, 3, N, 4)"),
    "layer_norm_affine": ("        self.ln = nn.LayerNorm(6)", "x", "self.ln(x) * 2.0", "torch.randn(N, 6)"),
    "linear_with_epilogue": ("        self.fc = nn.Linear(8, 5)", "x", "torch.sigmoid(self.fc(x)) * 3.0",
                             "torch.randn(N, 8)"),
    "bmm_transposed": ("        pass", "a, b", "torch.bmm(a, b.transpose(1, 2))", "torch.randn(2, N, 6), torch.randn(2, 5, 6)"),
    "conv2d_strided_dilated_grouped": ("        self.c = nn.Conv2d(4, 6, 3, stride=2, padding=2, dilation=2, groups=2)",
                                       "x", "self.c(x)", "torch.randn(2, 4, N, 9)"),
    "conv_transpose1d_strided": ("        self.c = nn.ConvTranspose1d(3, 4, 3, stride=2, padding=1, output_padding=1)",
                                 "x", "self.c(x)", "torch.randn(2, 3, N)"),
    "conv3d_bias": ("        self.c = nn.Conv3d(2, 3, (2, 3, 2))", "x", "self.c(x)", "torch.randn(1, 2, 4, N, 5)"),
    "conv_transpose2d_grouped": ("        self.c = nn.ConvTranspose2d(4, 6, 3, stride=2, groups=2, dilation=2)", "x",
                                 "self.c(x)", "torch.randn(1, 4, N, 5)"),
    "max_pool2d_dilated_ceil": ("        self.p = nn.MaxPool2d(3, stride=2, padding=1, dilation=2, ceil_mode=True)",
                                "x", "self.p(x)", "torch.randn(2, 3, N, 11)"),
    "avg_pool1d_no_pad_count": ("        self.p = nn.AvgPool1d(4, stride=2, padding=2, count_include_pad=False)",
                                "x", "self.p(x)", "torch.randn(2, 3, N)"),
    "avg_pool3d": ("        self.p = nn.AvgPool3d(2)", "x", "self.p(x)", "torch.randn(1, 2, 4, N, 4)"),
    "cumsum_reverse": ("        pass", "x", "torch.cumsum(x.flip(1), dim=1).flip(1)", "torch.randn(3, N)"),
    "cumsum_exclusive": ("        pass", "x",
                         "torch.cumsum(torch.cat((torch.zeros_like(x.select(1, 0).unsqueeze(1)), x), dim=1)[:, :-1], dim=1)",
                         "torch.randn(3, N)"),
    "cumsum_masked": ("        pass", "x, m", "torch.cumsum(x * m, dim=1)",
                      "torch.randn(3, N), torch.randint(0, 2, (3, N)).bool()"),
    "cumprod": ("        pass", "x", "torch.cumprod(x, dim=0)", "torch.rand(N, 3) + 0.5"),
    "smooth_l1_loss": ("        pass", "x, y", "F.smooth_l1_loss(x, y)", "torch.randn(N, 5), torch.randn(N, 5)"),
    "cross_entropy": ("        pass", "x, t", "F.cross_entropy(x, t)", "torch.randn(N, 5), torch.randint(0, 5, (N,))"),
    "softmax_dim0_times_input": ("        pass", "x", "torch.softmax(x, dim=0) * x", "torch.randn(N, 4)"),
    "triu_matmul": ("        pass", "a, b", "torch.triu(a @ b)", "torch.randn(N, N), torch.randn(N, N)"),
}


def source(name: str, n: int) -> str:
    init, args, body, inputs = CASES[name]
    return TASK.format(n=n, init=init, args=args, body=body, inputs=inputs)


def analyse(src: str, folder: Path) -> ReferenceAnalysis:
    from activities.kernels._probe import probe

    folder.mkdir(parents=True, exist_ok=True)
    (folder / "task.py").write_text(src)
    return ReferenceAnalysis.model_validate(probe(str(folder / "task.py"), 0))


def candidate(name: str, folder: Path) -> str:
    a = analyse(source(name, 7), folder)
    plan = offline_designer.choose_plan(a)
    assert isinstance(plan, KernelPlan), plan
    return offline_coder.render(plan, source(name, 7), a)


RUNNER = '''
import importlib.util, json, sys, torch
results = {}
for folder in sys.argv[1:]:
    def load(p, n):
        s = importlib.util.spec_from_file_location(n, p); m = importlib.util.module_from_spec(s); s.loader.exec_module(m)
        return m
    cand = load(folder + "/candidate.py", "cand_" + folder.replace("/", "_"))
    notes = []
    for task_file in ("task.py", "other_size.py"):
        t = load(folder + "/" + task_file, "task_" + folder.replace("/", "_") + task_file[:-3])
        torch.manual_seed(0); ref = t.Model()
        torch.manual_seed(0); new = cand.ModelNew()
        torch.manual_seed(1); inputs = t.get_inputs()
        with torch.no_grad():
            e, g = ref(*inputs), new(*inputs)
        if e.shape != g.shape or e.dtype != g.dtype:
            notes.append(f"{task_file}: {tuple(g.shape)} {g.dtype} vs {tuple(e.shape)} {e.dtype}")
        elif not (torch.allclose(g, e, rtol=1e-4, atol=1e-4) if e.is_floating_point() else torch.equal(g, e)):
            notes.append(f"{task_file}: max err {float((g.double() - e.double()).abs().max())}")
    results[folder.rsplit("/", 1)[1]] = notes
print(json.dumps(results))
'''


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> dict[str, list[str]]:
    """Every case rendered at N=7 and run at N=7 and at N=10 in one interpreter child."""
    root = tmp_path_factory.mktemp("lowering")
    folders = []
    for name in CASES:
        folder = root / name
        (folder / "candidate.py").parent.mkdir(parents=True, exist_ok=True)
        (folder / "candidate.py").write_text(candidate(name, folder))
        (folder / "other_size.py").write_text(source(name, 10))
        folders.append(str(folder))
    env = {**os.environ, "TRITON_INTERPRET": "1", "PYTHONPATH": str(ROOT), "CUDA_VISIBLE_DEVICES": ""}
    done = subprocess.run([sys.executable, "-c", RUNNER, *folders], env=env, capture_output=True, text=True,
                          timeout=900, cwd=root)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize("name", list(CASES))
def test_each_block_matches_the_reference_at_two_sizes(name, runs):
    assert runs[name] == [], runs[name]


@pytest.mark.parametrize("name", ["conv2d_strided_dilated_grouped", "batch_norm_training", "cumsum_exclusive",
                                  "cross_entropy", "linear_with_epilogue"])
def test_torch_only_allocates_and_takes_views_in_the_forward(name, tmp_path):
    """Issue 29: every arithmetic step is in a kernel; the forward's torch calls are allocation and views."""
    src = candidate(name, tmp_path)
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
    src = candidate("linear_with_epilogue", tmp_path)
    forward = src.split("def forward", 1)[1]
    assert forward.count("_matmul(") == 1 and forward.count("_pointwise(") == 1, forward
    norm = candidate("layer_norm_affine", tmp_path / "ln")
    assert norm.split("def forward", 1)[1].count("_reduce(") == 2, "mean, then mean of squares with the centring fused"


def test_a_graph_with_an_op_it_cannot_lower_is_refused_naming_the_op(tmp_path):
    src = TASK.format(n=4, init="        pass", args="x", body="F.dropout(x, 0.5, training=True)", inputs="torch.randn(N, 3)")
    plan = offline_designer.choose_plan(analyse(src, tmp_path))
    assert isinstance(plan, str) and "no lowering for bernoulli" in plan, plan
    const = TASK.format(n=4, init="        pass", args="x", body="torch.min(x, torch.tensor(0.5))", inputs="torch.randn(N, 3)")
    reason = offline_designer.choose_plan(analyse(const, tmp_path / "c"))
    assert isinstance(reason, str) and "get_attr" in reason


def test_reshape_targets_are_written_from_runtime_sizes():
    assert lowering._reshape_expr("x", [2, 3, 4], [6, 4]) == "[x.shape[0] * x.shape[1], x.shape[2]]"
    assert lowering._reshape_expr("x", [2, 12], [2, 3, 4]) == "[x.shape[0], -1, 4]"
    assert lowering._reshape_expr("x", [2, 3, 4, 5], [1, 6, 4, 5]) == "[1, x.shape[0] * x.shape[1], x.shape[2], x.shape[3]]"
