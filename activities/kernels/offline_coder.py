"""The offline kernel agents: a deterministic template designer and coder (no LLM).

They recognise the op families of KernelBench-style tasks (elementwise activations, row
softmax / log-softmax, sum over a dim, RMSNorm, matmul) from the task's op name and reference
source, and emit a complete `ModelNew` with masked `@triton.jit` kernels. `ModelNew.__init__`
is the reference `Model.__init__` verbatim, so parameters are created in the same seeded order.
"""

from __future__ import annotations

import ast
import re
import textwrap

from contracts.kernel import KernelTask
from contracts.kernel_job import KernelDesign


ELEMENTWISE = {
    "relu": "tl.where(x > 0, x, 0.0)",
    "leaky_relu": "tl.where(x >= 0, x, x * slope)",
    "gelu": "0.5 * x * (1.0 + tl.math.erf(x * 0.7071067811865476))",
}
_SOURCE_HINTS: list[tuple[str, str]] = [
    (r"leaky_relu|LeakyReLU", "leaky_relu"),
    (r"\bgelu\b|GELU", "gelu"),
    (r"log_softmax|LogSoftmax", "log_softmax"),
    (r"softmax|Softmax", "softmax"),
    (r"\brelu\b|ReLU", "relu"),
    (r"rsqrt|sqrt\(.*mean\(.*\*|rms", "rmsnorm"),
    (r"matmul|\bmm\(|@", "matmul"),
    (r"\.sum\(|torch\.sum\(", "sum"),
]
FAMILIES = {
    "relu": "elementwise", "leaky_relu": "elementwise", "gelu": "elementwise",
    "softmax": "row_softmax", "log_softmax": "row_log_softmax", "sum": "row_sum",
    "rmsnorm": "rmsnorm", "matmul": "matmul",
}


def recognise_op(task: KernelTask) -> str | None:
    """The op the templates know for this task: from op_name first, then the reference source."""
    name = task.op_name.lower()
    for op in sorted(FAMILIES, key=len, reverse=True):
        if op in name or op.replace("_", "") in name:
            return op
    if "rms" in name:
        return "rmsnorm"
    if "gemm" in name or "mm" == name:
        return "matmul"
    forward = _forward_source(task.task_desc) or task.task_desc
    for pattern, op in _SOURCE_HINTS:
        if re.search(pattern, forward):
            return op
    return None


def design(task: KernelTask) -> KernelDesign:
    op = recognise_op(task)
    if op is None:
        return KernelDesign(family="unknown", notes=f"no template for op '{task.op_name}'")
    family = FAMILIES[op]
    if family == "elementwise":
        return KernelDesign(family=family, block_sizes={"BLOCK": 1024}, grid="cdiv(numel, BLOCK)",
                            tiling="flat 1-D tiles over the contiguous input, masked tail",
                            notes=f"op={op}")
    if family == "matmul":
        return KernelDesign(family=family, block_sizes={"BLOCK_M": 32, "BLOCK_N": 32, "BLOCK_K": 32},
                            grid="(cdiv(M, BLOCK_M), cdiv(N, BLOCK_N))",
                            tiling="2-D output tiles, K loop with tl.dot, fp32 accumulator, masked edges",
                            notes=f"op={op}")
    return KernelDesign(family=family, block_sizes={"BLOCK": 0}, grid="(rows,)",
                        tiling="one program per row; the reduced dim moved last and padded to a power of two",
                        notes=f"op={op}; BLOCK = next_power_of_2(row length) at launch")


def code(task: KernelTask, kernel_design: KernelDesign | None = None) -> str | None:
    """A full candidate source, or None when no template fits the task."""
    op = recognise_op(task)
    if op is None:
        return None
    d = kernel_design if kernel_design is not None and kernel_design.family == FAMILIES[op] else design(task)
    init = _init_source(task.task_desc)
    forward = _forward_source(task.task_desc) or ""
    dim_default = _int_kwarg(forward, "dim", -1)
    keepdim = bool(re.search(r"keepdim\s*=\s*True", forward))
    body = _TEMPLATES[FAMILIES[op].replace("row_log_softmax", "row_softmax")].format(
        op=op, expr=ELEMENTWISE.get(op, ""), block=d.block_sizes.get("BLOCK", 1024),
        bm=d.block_sizes.get("BLOCK_M", 32), bn=d.block_sizes.get("BLOCK_N", 32), bk=d.block_sizes.get("BLOCK_K", 32),
        dim=dim_default, keepdim=keepdim, log="True" if op == "log_softmax" else "False",
    )
    return _HEADER + body.replace("__INIT__", textwrap.indent(init, "    "))


def render_answer(source: str) -> str:
    """The offline coder's answer in the agreed format: one fenced python block (parsed by
    llm_agents.parse_code, like an LLM's)."""
    return f"```python\n{source.rstrip()}\n```\n"


# --- reading the reference --------------------------------------------------------------------


def _model_class(source: str) -> tuple[ast.ClassDef | None, ast.Module | None]:
    try:
        tree = ast.parse(source)
    except SyntaxError:
        return None, None
    cls = next((n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == "Model"), None)
    return cls, tree


def _method_source(source: str, name: str) -> str | None:
    cls, _ = _model_class(source)
    if cls is None:
        return None
    fn = next((n for n in cls.body if isinstance(n, ast.FunctionDef) and n.name == name), None)
    if fn is None:
        return None
    start = fn.decorator_list[0].lineno if fn.decorator_list else fn.lineno
    lines = source.splitlines()[start - 1 : fn.end_lineno]
    return textwrap.dedent("\n".join(lines))


def _init_source(source: str) -> str:
    init = _method_source(source, "__init__")
    if init is None:
        return "def __init__(self):\n    super().__init__()\n"
    return re.sub(r"super\(\s*Model\s*,", "super(ModelNew,", init) + "\n"


def _forward_source(source: str) -> str | None:
    return _method_source(source, "forward")


def _int_kwarg(text: str, name: str, default: int) -> int:
    m = re.search(rf"\b{name}\s*=\s*(-?\d+)", text)
    return int(m.group(1)) if m else default


# --- templates ----------------------------------------------------------------------------------

_HEADER = '''import torch
import torch.nn as nn
import triton
import triton.language as tl

'''

_ROWWISE_HELPERS = '''

def _rows_last(x, dim):
    """Move `dim` last and flatten the rest: a contiguous (rows, n) view and how to undo it."""
    dim = dim % x.dim()
    moved = x.movedim(dim, -1).contiguous()
    return moved.reshape(-1, moved.shape[-1]), moved.shape, dim
'''

_TEMPLATES: dict[str, str] = {
    "elementwise": '''
@triton.jit
def {op}_kernel(x_ptr, out_ptr, n_elements, slope, BLOCK: tl.constexpr):
    pid = tl.program_id(0)
    offs = pid * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n_elements
    x = tl.load(x_ptr + offs, mask=mask, other=0.0)
    y = {expr}
    tl.store(out_ptr + offs, y, mask=mask)


class ModelNew(nn.Module):
__INIT__
    def forward(self, x):
        x = x.contiguous()
        out = torch.empty_like(x)
        n = x.numel()
        slope = float(getattr(self, "negative_slope", 0.01))
        grid = (triton.cdiv(n, {block}),)
        {op}_kernel[grid](x, out, n, slope, BLOCK={block})
        return out
''',
    "row_softmax": _ROWWISE_HELPERS + '''

@triton.jit
def softmax_rows_kernel(x_ptr, out_ptr, n_cols, stride, LOG: tl.constexpr, BLOCK: tl.constexpr):
    row = tl.program_id(0)
    cols = tl.arange(0, BLOCK)
    mask = cols < n_cols
    x = tl.load(x_ptr + row * stride + cols, mask=mask, other=-float("inf"))
    shifted = x - tl.max(x, axis=0)
    e = tl.where(mask, tl.exp(shifted), 0.0)
    denom = tl.sum(e, axis=0)
    if LOG:
        y = shifted - tl.log(denom)
    else:
        y = e / denom
    tl.store(out_ptr + row * stride + cols, y, mask=mask)


class ModelNew(nn.Module):
__INIT__
    def forward(self, x):
        rows, shape, dim = _rows_last(x, int(getattr(self, "dim", {dim})))
        out = torch.empty_like(rows)
        n = rows.shape[1]
        softmax_rows_kernel[(rows.shape[0],)](rows, out, n, rows.stride(0), LOG={log},
                                              BLOCK=triton.next_power_of_2(n))
        return out.reshape(shape).movedim(-1, dim)
''',
    "row_sum": _ROWWISE_HELPERS + '''

@triton.jit
def sum_rows_kernel(x_ptr, out_ptr, n_cols, stride, BLOCK: tl.constexpr):
    row = tl.program_id(0)
    cols = tl.arange(0, BLOCK)
    mask = cols < n_cols
    x = tl.load(x_ptr + row * stride + cols, mask=mask, other=0.0)
    tl.store(out_ptr + row, tl.sum(x, axis=0))


class ModelNew(nn.Module):
__INIT__
    def forward(self, x):
        rows, shape, dim = _rows_last(x, int(getattr(self, "dim", {dim})))
        out = torch.empty(rows.shape[0], dtype=x.dtype, device=x.device)
        n = rows.shape[1]
        sum_rows_kernel[(rows.shape[0],)](rows, out, n, rows.stride(0), BLOCK=triton.next_power_of_2(n))
        out = out.reshape(shape[:-1]).unsqueeze(-1).movedim(-1, dim)
        return out if {keepdim} else out.squeeze(dim)
''',
    "rmsnorm": _ROWWISE_HELPERS + '''

@triton.jit
def rmsnorm_rows_kernel(x_ptr, w_ptr, out_ptr, n_cols, stride, eps, HAS_W: tl.constexpr, BLOCK: tl.constexpr):
    row = tl.program_id(0)
    cols = tl.arange(0, BLOCK)
    mask = cols < n_cols
    x = tl.load(x_ptr + row * stride + cols, mask=mask, other=0.0)
    ms = tl.sum(x * x, axis=0) / n_cols
    y = x / tl.sqrt(ms + eps)
    if HAS_W:
        y = y * tl.load(w_ptr + cols, mask=mask, other=0.0)
    tl.store(out_ptr + row * stride + cols, y, mask=mask)


class ModelNew(nn.Module):
__INIT__
    def forward(self, x):
        rows, shape, dim = _rows_last(x, -1)
        out = torch.empty_like(rows)
        n = rows.shape[1]
        weight = getattr(self, "weight", None)
        w = weight.detach().contiguous() if weight is not None else rows
        eps = float(getattr(self, "eps", 1e-5))
        rmsnorm_rows_kernel[(rows.shape[0],)](rows, w, out, n, rows.stride(0), eps, HAS_W=weight is not None,
                                              BLOCK=triton.next_power_of_2(n))
        return out.reshape(shape).movedim(-1, dim)
''',
    "matmul": '''
@triton.jit
def matmul_kernel(a_ptr, b_ptr, c_ptr, M, N, K, sam, sak, sbk, sbn, scm, scn,
                  BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):
    pid_m = tl.program_id(0)
    pid_n = tl.program_id(1)
    rm = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    rn = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    rk = tl.arange(0, BLOCK_K)
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k0 in range(0, K, BLOCK_K):
        kk = k0 + rk
        a = tl.load(a_ptr + rm[:, None] * sam + kk[None, :] * sak,
                    mask=(rm[:, None] < M) & (kk[None, :] < K), other=0.0)
        b = tl.load(b_ptr + kk[:, None] * sbk + rn[None, :] * sbn,
                    mask=(kk[:, None] < K) & (rn[None, :] < N), other=0.0)
        acc += tl.dot(a, b)
    tl.store(c_ptr + rm[:, None] * scm + rn[None, :] * scn, acc, mask=(rm[:, None] < M) & (rn[None, :] < N))


class ModelNew(nn.Module):
__INIT__
    def forward(self, A, B):
        M, K = A.shape
        N = B.shape[1]
        C = torch.empty((M, N), dtype=A.dtype, device=A.device)
        grid = (triton.cdiv(M, {bm}), triton.cdiv(N, {bn}))
        matmul_kernel[grid](A, B, C, M, N, K, A.stride(0), A.stride(1), B.stride(0), B.stride(1),
                            C.stride(0), C.stride(1), BLOCK_M={bm}, BLOCK_N={bn}, BLOCK_K={bk})
        return C
''',
}
