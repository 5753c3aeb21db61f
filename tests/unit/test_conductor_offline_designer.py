"""The offline designer reads the traced reference (aten ops and their arguments), not its text, and the
offline coder renders what it chose. Traced in-process here (the job traces in a child); small sizes."""

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
    "01_ReLU.py": "elementwise(relu)", "02_LeakyReLU.py": "elementwise(leaky_relu)", "03_Sigmoid.py": "elementwise(sigmoid)",
    "04_Tanh.py": "elementwise(tanh)", "05_GELU.py": "elementwise(gelu erf)",
    "06_TanhGELU.py": "elementwise(mul, mul, mul, mul, add, mul, tanh, add, mul)", "07_Swish.py": "elementwise(sigmoid, mul)",
    "08_SiLU.py": "elementwise(silu)", "09_ELU.py": "elementwise(elu)", "10_SELU.py": "elementwise(selu)",
    "11_HardTanh.py": "elementwise(hardtanh)", "12_HardSigmoid.py": "elementwise(hardsigmoid)",
    "13_Softplus.py": "elementwise(softplus)", "14_Softsign.py": "elementwise(abs, add, div)",
    "15_Softmax.py": "lowered: softmax", "16_SoftmaxDim0.py": "lowered: softmax",
    "17_LogSoftmax.py": "lowered: log_softmax", "18_SumDim.py": "lowered: sum",
    "19_MeanDim.py": "lowered: mean", "20_MaxDim.py": "lowered: max", "21_MinDim.py": "lowered: min",
    "22_Argmax.py": "lowered: argmax", "23_Argmin.py": "lowered: argmin",
    "24_RMSNorm.py": "lowered: pow → mean → add → sqrt → div",
    "25_RMSNormWeighted.py": "lowered: pow → mean → add → rsqrt → mul",
    "26_LayerNorm.py": "lowered: native_layer_norm", "27_L1Norm.py": "lowered: abs → sum → div",
    "28_L2Norm.py": "lowered: linalg_vector_norm → div",
    "29_FrobeniusNorm.py": "lowered: linalg_vector_norm → div",
    "30_Matmul.py": "matmul(A, B)", "31_MatmulTransposedA.py": "matmul(A^T, B)", "32_MatmulTransposedB.py": "matmul(A, B^T)",
    "33_BatchedMatmul.py": "bmm(A, B)", "34_MatVec.py": "matvec(A, B)", "35_MatrixScalar.py": "elementwise(mul scalar)",
    "36_Cumsum.py": "lowered: cumsum", "37_Conv2d.py": "lowered: convolution",
    "38_MaxPool2d.py": "lowered: max_pool2d_with_indices", "39_MSELoss.py": "lowered: sub → pow → mean",
    "40_CrossEntropy.py": "lowered: log_softmax → nll_loss_forward",
}


def test_the_task_suite_is_what_the_bench_runs():
    assert sorted(p.name for p in KERNELBENCH.glob("*.py")) == sorted(COVERED)


@pytest.mark.parametrize(("name", "label"), COVERED.items(), ids=list(COVERED))
def test_covered_tasks_get_a_template_that_renders_a_statically_valid_candidate(name, label, tmp_path):
    plan = plan_of(name, tmp_path)
    assert not isinstance(plan, str), plan
    assert plan.label == label
    source = offline_coder.render(plan, small(name), analyse(small(name), tmp_path))
    assert static_check(source).ok, static_check(source).reasons
    assert "libdevice" not in source and "mask=" in source


def test_an_op_nothing_lowers_gets_no_template_and_the_reason_names_it(tmp_path):
    reason = offline_designer.choose_plan(analyse(task("torch.nn.functional.dropout(x, 0.5, training=True)"), tmp_path))
    assert isinstance(reason, str) and reason.startswith("no lowering for bernoulli"), reason
    assert "aten.bernoulli" in reason


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
    assert isinstance(mm, KernelPlan) and mm.template == "matmul"
    cumsum = offline_designer.choose_plan(analyse(task("torch.cumsum(x, dim=1)", doc="sum"), tmp_path))
    assert isinstance(cumsum, KernelPlan) and cumsum.label == "lowered: cumsum"


def test_the_reference_arguments_parameterise_the_template(tmp_path):
    gelu_tanh = offline_designer.choose_plan(analyse(task('F.gelu(x, approximate="tanh")'), tmp_path))
    assert isinstance(gelu_tanh, KernelPlan) and gelu_tanh.ops[0].attrs == {"approximate": "tanh"}
    assert "_tanh(0.7978845608028654" in offline_coder.render(gelu_tanh, task("x"))
    leaky = offline_designer.choose_plan(analyse(task("F.leaky_relu(x, 0.3)"), tmp_path))
    assert isinstance(leaky, KernelPlan) and leaky.ops[0].attrs == {"negative_slope": 0.3}
    rms_task = task("x / torch.sqrt(torch.mean(x * x, dim=0, keepdim=True) + 0.25)")
    rms_ref = analyse(rms_task, tmp_path)
    rms = offline_designer.choose_plan(rms_ref)
    assert isinstance(rms, KernelPlan) and rms.template == "lowered"
    rendered = offline_coder.render(rms, rms_task, rms_ref)
    assert "0.25" in rendered and "[0], True" in rendered, "eps and the reduced dim are read from the trace"
    for body, keep in (("x.sum(dim=1, keepdim=True)", True), ("x.sum(dim=1)", False)):
        ref = analyse(task(body), tmp_path)
        assert f"[1], {keep}" in offline_coder.render(offline_designer.choose_plan(ref), task(body), ref)
    both = offline_designer.choose_plan(analyse(task("A.T @ B.T", args="A, B", inputs="torch.rand(5, 4), torch.rand(3, 5)"),
                                                tmp_path))
    assert isinstance(both, KernelPlan) and (both.transpose_a, both.transpose_b) == (True, True)


def test_a_scalar_forward_input_is_passed_at_run_time_not_baked_in(tmp_path):
    plan = offline_designer.choose_plan(analyse(task("A * s", args="A, s", inputs="torch.rand(4, 6), 3.5"), tmp_path))
    assert isinstance(plan, KernelPlan) and plan.scalars == [1]
    assert [a.kind for a in plan.ops[0].args] == ["x", "scalar"]
    assert "3.5" not in offline_coder.render(plan, task("A * s", args="A, s"))


def test_an_untraceable_reference_has_no_template_and_says_why(tmp_path):
    a = analyse(task("x if x.sum() > 0 else -x"), tmp_path)
    assert a.trace_error
    assert offline_designer.choose_plan(a).startswith("the reference could not be traced (")


def test_a_task_that_cannot_be_built_on_the_meta_device_is_read_as_untraceable_not_refused(tmp_path):
    source = task("torch.relu(x)").replace("return [torch.rand(4, 6)]",
                                           "n = int(torch.randint(3, 5, (1,)).item())\n    return [torch.rand(n, 6)]")
    a = analyse(source, tmp_path)
    assert a.trace_error.startswith("the task could not be built on the meta device (")
    assert a.input_bytes == 0 and a.calls == []
    assert offline_designer.choose_plan(a).startswith("the reference could not be traced (the task could not be built")
