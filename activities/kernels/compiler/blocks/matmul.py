"""The matmul block: (batched) C = A @ B over strided operands (a transpose is strides, not a copy), 2-D output
tiles with a K loop of tl.dot in IEEE fp32 (TF32 where the policy allows) and an fp32 accumulator, masked edges."""

from __future__ import annotations

from typing import TYPE_CHECKING

from activities.kernels.compiler.blocks.common import IEEE_DOT
from activities.kernels.compiler.registry import emits

if TYPE_CHECKING:
    from activities.kernels.compiler.forward import Forward

KERNEL = f'''@triton.jit
def matmul_kernel(a_ptr, b_ptr, c_ptr, M, N, K, sab, sam, sak, sbb, sbk, sbn, scb, scm, scn,
                  BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr):
    pid_m = tl.program_id(0)
    pid_n = tl.program_id(1)
    pid_b = tl.program_id(2)
    rm = pid_m * BM + tl.arange(0, BM)
    rn = pid_n * BN + tl.arange(0, BN)
    rk = tl.arange(0, BK)
    acc = tl.zeros((BM, BN), dtype=tl.float32)
    for k0 in range(0, K, BK):
        kk = k0 + rk
        a = tl.load(a_ptr + pid_b * sab + rm[:, None] * sam + kk[None, :] * sak,
                    mask=(rm[:, None] < M) & (kk[None, :] < K), other=0.0)
        b = tl.load(b_ptr + pid_b * sbb + kk[:, None] * sbk + rn[None, :] * sbn,
                    mask=(kk[:, None] < K) & (rn[None, :] < N), other=0.0)
        acc += tl.dot(a.to(tl.float32), b.to(tl.float32), {IEEE_DOT})
    tl.store(c_ptr + pid_b * scb + rm[:, None] * scm + rn[None, :] * scn, acc, mask=(rm[:, None] < M) & (rn[None, :] < N))
'''

LAUNCHER = '''

def _matmul(a, b, BM=None, BN=None, BK=None):
    """(C, grid, args, meta) of A @ B for 2-D or 3-D (batched) strided operands."""
    batched = a.dim() == 3
    a3, b3 = (a, b) if batched else (a.unsqueeze(0), b.unsqueeze(0))
    B, M, K = a3.shape
    N = b3.shape[2]
    c = torch.empty((B, M, N), dtype=a.dtype, device=a.device)
    BM = BM or (64 if M > 32 else (32 if M > 16 else 16))
    BN = BN or (64 if N > 32 else (32 if N > 16 else 16))
    BK = BK or (64 if a.device.type == "cpu" and K > 32 else 32)
    return c if batched else c[0], (triton.cdiv(M, BM), triton.cdiv(N, BN), B), \\
        (a3, b3, c, M, N, K, *a3.stride(), *b3.stride(), *c.stride()), {"BM": BM, "BN": BN, "BK": BK}
'''


@emits("matmul")
def matmul(fw: "Forward", v: int) -> str:
    a, b = (fw.tensor(x) for x in fw.nodes[v].args)
    fw.kernel(("matmul_kernel", KERNEL))
    fw.launcher("_matmul", LAUNCHER)
    return fw.launch(v, "matmul_kernel", f"_matmul({a}, {b})")
