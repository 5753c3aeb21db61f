"""The matmul block: (batched) C = A @ B over strided operands (a transpose is strides, not a copy), 2-D output
tiles with a K loop of tl.dot in IEEE fp32 (TF32 where the policy allows) and an fp32 accumulator, masked edges."""

from __future__ import annotations

from typing import TYPE_CHECKING

from activities.kernels.compiler.blocks.common import IEEE_DOT
from activities.kernels.compiler.registry import emits

if TYPE_CHECKING:
    from activities.kernels.compiler.forward import Forward

KERNEL = f'''@triton.jit
def matmul_kernel(a_ptr, b_ptr, c_ptr, M, N, K, sab, sam, sak, sbb, sbk, sbn, scb, scm, scn, AM, sam2, AK, sak2,
                  BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr):
    pid_m = tl.program_id(0)
    pid_n = tl.program_id(1)
    pid_b = tl.program_id(2)
    rm = pid_m * BM + tl.arange(0, BM)
    rn = pid_n * BN + tl.arange(0, BN)
    rk = tl.arange(0, BK)
    a_rows = (rm // AM) * sam + (rm % AM) * sam2
    acc = tl.zeros((BM, BN), dtype=tl.float32)
    for k0 in range(0, K, BK):
        kk = k0 + rk
        a = tl.load(a_ptr + pid_b * sab + a_rows[:, None] + ((kk // AK) * sak + (kk % AK) * sak2)[None, :],
                    mask=(rm[:, None] < M) & (kk[None, :] < K), other=0.0)
        b = tl.load(b_ptr + pid_b * sbb + kk[:, None] * sbk + rn[None, :] * sbn,
                    mask=(kk[:, None] < K) & (rn[None, :] < N), other=0.0)
        acc += tl.dot(a.to(tl.float32), b.to(tl.float32), {IEEE_DOT})
    tl.store(c_ptr + pid_b * scb + rm[:, None] * scm + rn[None, :] * scn, acc, mask=(rm[:, None] < M) & (rn[None, :] < N))
'''
"""A's rows and columns are each `i // AM * sam + i % AM * sam2` (and AK, sak, sak2): a row that merges two strided
dims of a tensor torch could only reshape by copying (`_merged`); AM = 1 (a plain stride) is specialised away."""

LAUNCHER = '''

def _matmul(a, b, BM=None, BN=None, BK=None):
    """(C, grid, args, meta) of A @ B for 2-D or 3-D (batched) strided operands; A may be `_merged`."""
    batched = len(a.shape) == 3
    data, (B, M, K), (sab, sam, sak, am, sam2, ak, sak2) = _operand_a(a, batched)
    b3 = b if batched else b.unsqueeze(0)
    N = b3.shape[2]
    c = torch.empty((B, M, N), dtype=data.dtype, device=data.device)
    BM = BM or (64 if M > 32 else (32 if M > 16 else 16))
    BN = BN or (64 if N > 32 else (32 if N > 16 else 16))
    BK = BK or (64 if data.device.type == "cpu" and K > 32 else 32)
    return c if batched else c[0], (triton.cdiv(M, BM), triton.cdiv(N, BN), B), \\
        (data, b3, c, M, N, K, sab, sam, sak, *b3.stride(), *c.stride(), am, sam2, ak, sak2), \\
        {"BM": BM, "BN": BN, "BK": BK}


def _operand_a(a, batched):
    """(data, (B, M, K), (sab, sam, sak, AM, sam2, AK, sak2)) of a matmul's A: a tensor's strides, or a `_merged`
    one's dims, each `i // AM * sam + i % AM * sam2` (AM = 1: a plain stride; a batch dim of two factors is copied)."""
    if hasattr(a, "factors") and batched and a.factors[0][1] != 1:
        a = a.copy()
    if not hasattr(a, "factors"):
        a3 = a if batched else a.unsqueeze(0)
        return a3, tuple(a3.shape), (*a3.stride(), 1, 0, 1, 0)
    (sb, _, _), (sm, am, sm2), (sk, ak, sk2) = a.factors if batched else [(0, 1, 0), *a.factors]
    return a.data, ((a.shape[0] if batched else 1), a.shape[-2], a.shape[-1]), (sb, sm, sk, am, sm2, ak, sk2)
'''

MERGED = '''

class _Merged:
    """A reshape torch could only make by copying (then permuted, perhaps), kept as the data and, per dim, its
    `(outer stride, inner size, inner stride)`: index i is at `i // inner * outer + i % inner * inner stride` (one
    factor: inner size 1). Kernels that take it index the data themselves; `copy()` is torch's reshape."""

    def __init__(self, x, sizes, factors, perm=None):
        self.data, self.sizes, self.factors = x, sizes, factors
        self.perm = perm or list(range(len(sizes)))
        self.shape = torch.Size([sizes[d] for d in self.perm])

    def permute(self, dims):
        return _Merged(self.data, self.sizes, [self.factors[d] for d in dims], [self.perm[d] for d in dims])

    def copy(self):
        return self.data.reshape(self.sizes).permute(self.perm)


def _merged(x, sizes):
    """x.reshape(sizes) without a copy: a view where torch can make one; else, when each new dim covers at most
    two strided factors of x (a permuted tensor's [tokens, batch] rows, a head split merged with the batch), a
    `_Merged`; else torch's copy."""
    if -1 in sizes:
        sizes = list(torch.empty(x.shape, device="meta").view(sizes).shape)
    try:
        return x.view(sizes)
    except RuntimeError:
        pass
    factors = _factors([[n, s] for n, s in zip(x.shape, x.stride()) if n != 1], sizes)
    if factors is None or any(len(f) > 2 for f in factors):
        return x.reshape(sizes)
    return _Merged(x, sizes, [_dim(f) for f in factors])


def _dim(factors):
    """(outer stride, inner size, inner stride) of a dim from its (size, stride) factors: none (size 1), one (inner
    size 1), or two."""
    if len(factors) < 2:
        return (factors[0][1] if factors else 0), 1, 0
    (_, outer), (inner, stride) = factors
    return outer, inner, stride


def _factors(todo, sizes):
    """Per new dim, the (size, stride) factors of the data it covers in row-major order (a dim of the data split
    where a new dim ends inside it); None where the sizes do not line up."""
    out = []
    for n in sizes:
        mine = []
        while n > 1:
            if not todo or (todo[0][0] % n and n % todo[0][0]):
                return None
            size, stride = todo[0]
            if size <= n:
                mine.append((size, stride))
                todo.pop(0)
                n //= size
            else:  # the new dim ends inside this one: its outer part
                mine.append((n, stride * (size // n)))
                todo[0][0] = size // n
                n = 1
        out.append(mine)
    return out if not todo else None
'''


@emits("matmul")
def matmul(fw: "Forward", v: int) -> str:
    a, b = (fw.tensor(x) for x in fw.nodes[v].args)
    fw.kernel(("matmul_kernel", KERNEL))
    fw.launcher("_matmul", LAUNCHER)
    return fw.launch(v, "matmul_kernel", f"_matmul({a}, {b})")
