"""The offline designer reads the traced reference (aten ops and their arguments), not its text, and the
offline coder renders what it chose (both through activities.kernels.compiler). Traced in-process here (the job traces in a child); small sizes."""

from __future__ import annotations

from pathlib import Path

import pytest

from activities.kernels import offline_coder, offline_designer
from activities.kernels.static_checks import static_check
from activities.kernels.task_source import apply_overrides, numeric_constants
from contracts.kernel_job import KernelPlan, ReferenceAnalysis

KERNELBENCH = Path(__file__).resolve().parents[2] / "examples" / "kernelbench"
SMALL = {"batch_size": 4, "dim": 40, "dim1": 5, "dim2": 6, "features": 3, "rows": 4, "cols": 5, "tokens": 6, "hidden": 16,
         "M": 9, "K": 12, "N": 7, "batch": 2, "length": 10, "cin": 2, "cout": 3, "height": 6, "width": 6, "channels": 2,
         "classes": 5}


def analyse(source: str, tmp: Path) -> ReferenceAnalysis:
    from activities.kernels._probe import probe

    path = tmp / "task.py"
    path.write_text(source)
    return ReferenceAnalysis.model_validate(probe(str(path), 0))


def small(name: str) -> str:
    source = (KERNELBENCH / name).read_text()
    return apply_overrides(source, {k: v for k, v in SMALL.items() if k in numeric_constants(source)})


def plan_of(name: str, tmp: Path) -> KernelPlan | str:
    return offline_designer.choose_plan(analyse(small(name), tmp))


COVERED = {
    "01_ReLU.py": "lowered: relu", "02_LeakyReLU.py": "lowered: leaky_relu", "03_Sigmoid.py": "lowered: sigmoid",
    "04_Tanh.py": "lowered: tanh", "05_GELU.py": "lowered: gelu",
    "06_TanhGELU.py": "lowered: mul → add → tanh", "07_Swish.py": "lowered: sigmoid → mul",
    "08_SiLU.py": "lowered: silu", "09_ELU.py": "lowered: elu", "10_SELU.py": "lowered: elu",
    "11_HardTanh.py": "lowered: hardtanh", "12_HardSigmoid.py": "lowered: hardsigmoid",
    "13_Softplus.py": "lowered: softplus", "14_Softsign.py": "lowered: abs → add → div",
    "15_Softmax.py": "lowered: softmax", "16_SoftmaxDim0.py": "lowered: softmax",
    "17_LogSoftmax.py": "lowered: log_softmax", "18_SumDim.py": "lowered: sum",
    "19_MeanDim.py": "lowered: mean", "20_MaxDim.py": "lowered: max", "21_MinDim.py": "lowered: min",
    "22_Argmax.py": "lowered: argmax", "23_Argmin.py": "lowered: argmin",
    "24_RMSNorm.py": "lowered: pow → mean → add → sqrt → div",
    "25_RMSNormWeighted.py": "lowered: pow → mean → add → rsqrt → mul",
    "26_LayerNorm.py": "lowered: native_layer_norm", "27_L1Norm.py": "lowered: abs → sum → div",
    "28_L2Norm.py": "lowered: linalg_vector_norm → div",
    "29_FrobeniusNorm.py": "lowered: linalg_vector_norm → div",
    "30_Matmul.py": "lowered: mm", "31_MatmulTransposedA.py": "lowered: mm", "32_MatmulTransposedB.py": "lowered: mm",
    "33_BatchedMatmul.py": "lowered: bmm", "34_MatVec.py": "lowered: mm", "35_MatrixScalar.py": "lowered: mul",
    "36_Cumsum.py": "lowered: cumsum", "37_Conv2d.py": "lowered: convolution",
    "38_MaxPool2d.py": "lowered: max_pool2d_with_indices", "39_MSELoss.py": "lowered: sub → pow → mean",
    "40_CrossEntropy.py": "lowered: log_softmax → nll_loss_forward",
}


def test_the_task_suite_is_what_the_bench_runs():
    assert sorted(p.name for p in KERNELBENCH.glob("*.py")) == sorted(COVERED)


@pytest.mark.parametrize(("name", "label"), COVERED.items(), ids=list(COVERED))
def test_covered_tasks_are_lowered_to_a_statically_valid_candidate(name, label, tmp_path):
    plan = plan_of(name, tmp_path)
    assert not isinstance(plan, str), plan
    assert plan.label == label
    source = offline_coder.render(plan, small(name), analyse(small(name), tmp_path))
    assert static_check(source).ok, static_check(source).reasons
    assert "libdevice" not in source and "mask=" in source


def test_an_op_nothing_lowers_gets_no_template_and_the_reason_names_it(tmp_path):
    reason = offline_designer.choose_plan(analyse(task("torch.nn.functional.dropout(x, 0.5, training=True)"), tmp_path))
    assert isinstance(reason, str) and reason.startswith("no lowering for native_dropout (dropout with p > 0"), reason
    assert "aten.native_dropout" in reason


TEMPLATE = '''import math
import torch
import torch.nn as nn
import torch.nn.functional as F


class Model(nn.Module):
    """{doc}"""

    def __init__(self):
        super().__init__()

    def forward(self, {args}):
        return {body}


def get_inputs():
    return [{inputs}]


def get_init_inputs():
    return []
'''


def task(body: str, doc: str = "Performs an op.", args: str = "x", inputs: str = "torch.rand(4, 6)") -> str:
    return TEMPLATE.format(doc=doc, args=args, body=body, inputs=inputs)


def test_docstrings_and_names_do_not_decide_the_template(tmp_path):
    """The issue's regex designer matched `rms` in "Performs" and `sum` in `cumsum`."""
    mm = offline_designer.choose_plan(analyse(task("torch.matmul(A, B)", doc="Performs RMS-free sum of softmax.",
                                                   args="A, B", inputs="torch.rand(4, 5), torch.rand(5, 3)"), tmp_path))
    assert isinstance(mm, KernelPlan) and mm.label == "lowered: mm"
    cumsum = offline_designer.choose_plan(analyse(task("torch.cumsum(x, dim=1)", doc="sum"), tmp_path))
    assert isinstance(cumsum, KernelPlan) and cumsum.label == "lowered: cumsum"


def rendered(body: str, tmp: Path, **kw: str) -> str:
    source = task(body, **kw)
    reference = analyse(source, tmp)
    plan = offline_designer.choose_plan(reference)
    assert isinstance(plan, KernelPlan), plan
    return offline_coder.render(plan, source, reference)


def test_the_reference_arguments_parameterise_the_candidate(tmp_path):
    assert "_tanh(0.7978845608028654" in rendered('F.gelu(x, approximate="tanh")', tmp_path)
    assert "x0 * 0.3" in rendered("F.leaky_relu(x, 0.3)", tmp_path)
    rms = rendered("x / torch.sqrt(torch.mean(x * x, dim=0, keepdim=True) + 0.25)", tmp_path)
    assert "0.25" in rms and "[0], True" in rms, "eps and the reduced dim are read from the trace"
    for body, keep in (("x.sum(dim=1, keepdim=True)", True), ("x.sum(dim=1)", False)):
        assert f"[1], {keep}" in rendered(body, tmp_path)
    both = rendered("A.T @ B.T", tmp_path, args="A, B", inputs="torch.rand(5, 4), torch.rand(3, 5)")
    assert both.count(".permute([1, 0])") == 2, "transposed operands are strides, not copies"


def test_a_scalar_forward_input_is_passed_at_run_time_not_baked_in(tmp_path):
    source = rendered("A * s", tmp_path, args="A, s", inputs="torch.rand(4, 6), 3.5")
    assert "_pointwise([inputs[0]], [inputs[1]]" in source and "3.5" not in source


def test_an_untraceable_reference_has_no_template_and_says_why(tmp_path):
    a = analyse(task("x if x.sum() > 0 else -x"), tmp_path)
    assert a.trace_error
    assert offline_designer.choose_plan(a).startswith("the reference could not be traced (")


def test_a_task_that_cannot_be_built_on_the_meta_device_is_read_as_untraceable_not_refused(tmp_path):
    source = task("torch.relu(x)").replace("return [torch.rand(4, 6)]",
                                           "n = int(torch.randint(3, 5, (1,)).item())\n    return [torch.rand(n, 6).cuda()]")
    a = analyse(source, tmp_path)
    assert a.trace_error.startswith("the task could not be built on the meta device (")
    assert a.input_bytes == 0 and a.calls == []
    assert offline_designer.choose_plan(a).startswith("the reference could not be traced (the task could not be built")


def test_a_model_whose_construction_reads_a_value_is_built_on_the_cpu_and_traced(tmp_path):
    """Swin's blocks read drop-path rates with .item() in __init__: that fails on the meta device only."""
    source = task("x * self.scale").replace("super().__init__()", "super().__init__()\n        "
                                            "self.scale = float(torch.linspace(0, 1, 3)[1].item())")
    a = analyse(source, tmp_path)
    assert not a.trace_error and a.inputs[0].tensor is not None
    plan = offline_designer.choose_plan(a)
    assert isinstance(plan, KernelPlan) and plan.label == "lowered: mul"
