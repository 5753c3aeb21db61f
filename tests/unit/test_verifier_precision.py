"""The precision policy in the verifier (real Triton-interpreter children): a TF32 `tl.dot` is refused under the
strict policy and verified under kernelbench's; the counts of the candidate's first forward call come back for
the cost model, torch copies outside the launches included."""

from __future__ import annotations

from pathlib import Path

from activities.kernels import offline_coder
from activities.kernels.precision import tolerance
from activities.kernels.verifier import verify
from contracts.kernel import KernelTask, PrecisionPolicy
from contracts.kernel_job import LaunchCost
from tests.unit.test_conductor_offline_designer import analyse
from tests.unit.test_verifier import HEADER, RELU, TIMEOUT_S, candidate

MATMUL = (Path(__file__).resolve().parents[2] / "examples" / "kernels" / "matmul.py").read_text()


def matmul_candidate(dot: str) -> str:
    return HEADER + f'''
@triton.jit
def mm_kernel(a_ptr, b_ptr, c_ptr, M, N, K, sam, sak, sbk, sbn, scm, scn,
              BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr):
    rm = tl.program_id(0) * BM + tl.arange(0, BM)
    rn = tl.program_id(1) * BN + tl.arange(0, BN)
    acc = tl.zeros((BM, BN), dtype=tl.float32)
    for k0 in range(0, K, BK):
        rk = k0 + tl.arange(0, BK)
        a = tl.load(a_ptr + rm[:, None] * sam + rk[None, :] * sak, mask=(rm[:, None] < M) & (rk[None, :] < K), other=0.0)
        b = tl.load(b_ptr + rk[:, None] * sbk + rn[None, :] * sbn, mask=(rk[:, None] < K) & (rn[None, :] < N), other=0.0)
        acc += {dot}
    tl.store(c_ptr + rm[:, None] * scm + rn[None, :] * scn, acc, mask=(rm[:, None] < M) & (rn[None, :] < N))


class ModelNew(nn.Module):
    def forward(self, A, B):
        M, K = A.shape
        N = B.shape[1]
        C = torch.empty((M, N), dtype=A.dtype, device=A.device)
        mm_kernel[(triton.cdiv(M, 32), triton.cdiv(N, 32))](A, B, C, M, N, K, *A.stride(), *B.stride(), *C.stride(),
                                                           BM=32, BN=32, BK=32)
        return C
'''


def test_a_tf32_dot_is_refused_under_the_strict_policy_naming_the_kernel():
    report = verify(MATMUL, matmul_candidate("tl.dot(a, b)"), timeout_s=TIMEOUT_S)
    assert not report.passed
    assert "precision policy strict" in report.reason and "mm_kernel" in report.reason
    assert 'input_precision="ieee"' in report.reason and "--precision kernelbench" in report.reason


def test_the_same_tf32_dot_verifies_under_the_kernelbench_policy_and_its_counts_come_back():
    costs: list[LaunchCost] = []
    report = verify(MATMUL, matmul_candidate("tl.dot(a, b)"), timeout_s=TIMEOUT_S,
                    precision=PrecisionPolicy.KERNELBENCH, costs=costs)
    assert report.passed, report.reason
    assert [c.kernel for c in costs] == ["mm_kernel"]
    c = costs[0]
    assert c.programs == 3 * 2 and c.tf32_flops == 2 * 67 * 53 * 45 and c.dot_flops == 0
    assert c.unique_loaded == (67 * 45 + 45 * 53) * 4 and c.unique_stored == 67 * 53 * 4


def test_an_ieee_dot_verifies_under_the_strict_policy():
    costs: list[LaunchCost] = []
    report = verify(MATMUL, matmul_candidate('tl.dot(a, b, input_precision="ieee")'), timeout_s=TIMEOUT_S,
                    costs=costs)
    assert report.passed, report.reason
    assert costs[0].dot_flops > 0 and costs[0].tf32_flops == 0


def test_a_copy_outside_the_launches_is_counted_as_a_kernel_of_its_own():
    costs: list[LaunchCost] = []
    report = verify(RELU, candidate("y = x.t().contiguous().t()\nreturn launch(y)"), timeout_s=TIMEOUT_S,
                    costs=costs)
    assert report.passed, report.reason
    kinds = [c.kernel for c in costs]
    assert kinds[0].startswith("torch:") and kinds[-1] == "relu_kernel", kinds
    copy = costs[0]
    assert copy.unique_loaded == copy.unique_stored == costs[-1].unique_stored  # x read once, its copy written


def test_the_policies_tolerances():
    assert tolerance(PrecisionPolicy.STRICT, "torch.float32") == 1e-4
    assert tolerance(PrecisionPolicy.STRICT, "torch.float16") == 1e-2
    assert tolerance(PrecisionPolicy.KERNELBENCH, "torch.float32") == 1e-2


CONV_LINEAR = '''import torch
import torch.nn as nn


class Model(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(3, 8, 3)
        self.fc = nn.Linear(8, 5)

    def forward(self, x):
        return self.fc(torch.relu(self.conv(x)).mean(dim=(2, 3)))


def get_inputs():
    return [torch.randn(2, 3, 12, 12)]


def get_init_inputs():
    return []
'''


def test_the_compilers_dots_run_in_tf32_only_where_the_policy_allows_it(tmp_path):
    """Under kernelbench's policy the baselines' cuBLAS and cuDNN compute in TF32: the compiler's conv and matmul
    dots then do too (an IEEE dot runs on a GPU's FP32 units, a seventh of its TF32 tensor peak)."""
    def compiled(policy: PrecisionPolicy) -> str:
        task = KernelTask(op_name="op", task_desc=CONV_LINEAR, task_id="t", arch="cpu", precision=policy)
        source = offline_coder.code(task, None, analyse(CONV_LINEAR, tmp_path))
        assert source is not None
        return source

    strict, fast = compiled(PrecisionPolicy.STRICT), compiled(PrecisionPolicy.KERNELBENCH)
    assert strict.count('input_precision="ieee"') == 2 and "tf32" not in strict
    assert fast.count('input_precision="tf32"') == 2 and '"ieee"' not in fast
    costs: list[LaunchCost] = []
    report = verify(CONV_LINEAR, fast, timeout_s=TIMEOUT_S, precision=PrecisionPolicy.KERNELBENCH, costs=costs)
    assert report.passed, report.reason
    dots = [c for c in costs if c.tf32_flops]
    assert [c.kernel for c in dots] == ["conv2d_kernel", "matmul_kernel"] and all(c.dot_flops == 0 for c in dots)
    refused = verify(CONV_LINEAR, fast, timeout_s=TIMEOUT_S)  # the same candidate under the strict policy
    assert not refused.passed and "precision policy strict" in refused.reason
