"""The convolution block: 1-3D convolution (or transposed convolution) as an implicit GEMM; sizes from the input
and weight at run time."""

from __future__ import annotations

from typing import TYPE_CHECKING

from activities.kernels.compiler.blocks.common import IEEE_DOT, decompose, jit
from activities.kernels.compiler.registry import emits

if TYPE_CHECKING:
    from activities.kernels.compiler.forward import Forward
    from activities.kernels.compiler.graph import Node


def conv_kernel(d: int, transposed: bool, phased: bool = False) -> tuple[str, str]:
    """(name, source): a d-dim convolution (or transposed convolution) as an implicit GEMM: rows are
    (batch, output position), columns the output channels of one group (grid axis 2), K runs over
    (input channel of the group, kernel offset). `phased` (transposed, dilation 1): see phased_lines."""
    sp = range(d)
    args = ["x_ptr", "w_ptr", "b_ptr", "out_ptr", "M", "KTOT", "CI_G", "CO_G"]
    args += [f"I{j}" for j in sp] + [f"O{j}" for j in sp] + [f"K{j}" for j in sp] + [f"S{j}" for j in sp]
    args += [f"P{j}" for j in sp] + [f"D{j}" for j in sp] + ["xs0", "xs1"] + [f"xs{j + 2}" for j in sp]
    args += ["ws0", "ws1"] + [f"ws{j + 2}" for j in sp] + ["os0", "os1"] + [f"os{j + 2}" for j in sp]
    lines = ["    rm = tl.program_id(0) * BM + tl.arange(0, BM)", "    rn = tl.program_id(1) * BN + tl.arange(0, BN)",
             "    mmask = rm < M", "    nmask = rn < CO_G"]
    wmask = "kmask[:, None] & nmask[None, :]"
    if phased:
        lines += phased_lines(d)
        wmask = "qok[:, None] & nmask[None, :]"
    else:
        lines.append("    g = tl.program_id(2)")
        lines += decompose("rm", ["0"] + [f"O{j}" for j in sp], ["nb"] + [f"o{j}" for j in sp], "    ")
        lines += ["    acc = tl.zeros((BM, BN), dtype=tl.float32)", "    for k0 in range(0, KTOT, BK):",
                  "        rk = k0 + tl.arange(0, BK)", "        kmask = rk < KTOT"]
        lines += decompose("rk", ["0"] + [f"K{j}" for j in sp], ["ci"] + [f"q{j}" for j in sp], "        ")
        lines.append("        ok = mmask[:, None] & kmask[None, :]")
        for j in sp:
            if transposed:
                lines += [f"        t{j} = o{j}[:, None] + P{j} - q{j}[None, :] * D{j}",
                          f"        u{j} = tl.where(t{j} >= 0, t{j}, 0)",
                          f"        i{j} = u{j} // S{j}",
                          f"        ok = ok & (t{j} >= 0) & (u{j} % S{j} == 0) & (i{j} < I{j})"]
            else:
                lines += [f"        i{j} = o{j}[:, None] * S{j} - P{j} + q{j}[None, :] * D{j}",
                          f"        ok = ok & (i{j} >= 0) & (i{j} < I{j})"]
    xoff = " + ".join(["nb[:, None] * xs0", "(g * CI_G + ci)[None, :] * xs1"] + [f"i{j} * xs{j + 2}" for j in sp])
    lines.append(f"        a = tl.load(x_ptr + {xoff}, mask=ok, other=0.0)")
    if transposed:
        woff = " + ".join(["(g * CI_G + ci)[:, None] * ws0", "rn[None, :] * ws1"] + [f"q{j}[:, None] * ws{j + 2}" for j in sp])
    else:
        woff = " + ".join(["(g * CO_G + rn)[None, :] * ws0", "ci[:, None] * ws1"] + [f"q{j}[:, None] * ws{j + 2}" for j in sp])
    lines += [f"        b = tl.load(w_ptr + {woff}, mask={wmask}, other=0.0)",
              f"        acc += tl.dot(a.to(tl.float32), b.to(tl.float32), {IEEE_DOT})",
              "    if HAS_BIAS:",
              "        acc += tl.load(b_ptr + g * CO_G + rn, mask=nmask, other=0.0).to(tl.float32)[None, :]"]
    ooff = " + ".join(["nb[:, None] * os0", "(g * CO_G + rn)[None, :] * os1"] + [f"o{j}[:, None] * os{j + 2}" for j in sp])
    lines.append(f"    tl.store(out_ptr + {ooff}, acc, mask=mmask[:, None] & nmask[None, :])")
    src = ("def KERNEL(" + ", ".join(args) + ", HAS_BIAS: tl.constexpr, BM: tl.constexpr, BN: tl.constexpr, "
           "BK: tl.constexpr):\n" + "\n".join(lines) + "\n")
    name = f"conv{d}d_{'transposed_' if transposed else ''}{'phased_' if phased else ''}kernel"
    return jit(name, src)


def phased_lines(d: int) -> list[str]:
    """A strided transposed convolution by output phase: output position o = r + S*m gets contributions only from
    the kernel offsets q = q0 + S*t with q0 = (r + P) % S, reading input i = m + c - t (c = (r + P - q0) / S).
    Grid axis 2 runs over (group, phase r) and K over (input channel, t): in 3-D at stride 2 an eighth of the
    offsets the plain transposed kernel masks off one by one. M and KTOT count per phase (see LAUNCHER)."""
    sp = range(d)
    lines = ["    NPH = " + " * ".join(f"S{j}" for j in sp), "    g = tl.program_id(2) // NPH",
             "    ph = tl.program_id(2) % NPH"]
    lines += decompose("ph", ["0"] + [f"S{j}" for j in range(1, d)], [f"r{j}" for j in sp], "    ")
    for j in sp:
        lines += [f"    MO{j} = (O{j} + S{j} - 1) // S{j}", f"    KT{j} = (K{j} + S{j} - 1) // S{j}",
                  f"    q0{j} = (r{j} + P{j}) % S{j}", f"    c{j} = (r{j} + P{j} - q0{j}) // S{j}"]
    lines += decompose("rm", ["0"] + [f"MO{j}" for j in sp], ["nb"] + [f"m{j}" for j in sp], "    ")
    for j in sp:
        lines += [f"    o{j} = r{j} + m{j} * S{j}", f"    mmask = mmask & (o{j} < O{j})"]
    lines += ["    acc = tl.zeros((BM, BN), dtype=tl.float32)", "    for k0 in range(0, KTOT, BK):",
              "        rk = k0 + tl.arange(0, BK)", "        kmask = rk < KTOT"]
    lines += decompose("rk", ["0"] + [f"KT{j}" for j in sp], ["ci"] + [f"t{j}" for j in sp], "        ")
    lines.append("        qok = kmask")
    for j in sp:
        lines += [f"        q{j} = q0{j} + t{j} * S{j}", f"        qok = qok & (q{j} < K{j})",
                  f"        i{j} = m{j}[:, None] + c{j} - t{j}[None, :]"]
    lines.append("        ok = mmask[:, None] & qok[None, :]")
    lines += [f"        ok = ok & (i{j} >= 0) & (i{j} < I{j})" for j in sp]
    return lines


LAUNCHER = '''

def _conv(x, w, b, stride, padding, dilation, transposed, output_padding, groups, phased, BM=None, BN=None, BK=None):
    """(out, grid, args, meta) of the implicit-GEMM convolution; output sizes from the input and weight.
    `phased`: the kernel computes one output phase per program (its rows and K shrink by the stride)."""
    d = x.dim() - 2
    NB, CI = x.shape[0], x.shape[1]
    I, K = list(x.shape[2:]), list(w.shape[2:])
    if transposed:
        CO_G = w.shape[1]
        O = [(I[j] - 1) * stride[j] - 2 * padding[j] + dilation[j] * (K[j] - 1) + output_padding[j] + 1 for j in range(d)]
    else:
        groups = CI // w.shape[1]
        CO_G = w.shape[0] // groups
        O = [(I[j] + 2 * padding[j] - dilation[j] * (K[j] - 1) - 1) // stride[j] + 1 for j in range(d)]
    out = torch.empty((NB, CO_G * groups, *O), dtype=x.dtype, device=x.device)
    M = NB * math.prod(triton.cdiv(O[j], stride[j]) if phased else O[j] for j in range(d))
    KTOT = (CI // groups) * math.prod(triton.cdiv(K[j], stride[j]) if phased else K[j] for j in range(d))
    BN = BN or max(16, min(64, triton.next_power_of_2(CO_G)))
    columns, planes = triton.cdiv(CO_G, BN), groups * (math.prod(stride) if phased else 1)  # a group's phase each
    gpu = BM or _per_program(M * columns * planes, 16, 64)  # rows per program: the whole grid fills the SMs
    if x.device.type == "cpu":  # the Triton interpreter: fewer, larger tiles run faster
        BM = BM or max(16, min(512, triton.next_power_of_2(M)))
        BK = BK or max(16, min(128, triton.next_power_of_2(KTOT)))
    else:
        BM, BK = gpu, BK or max(16, min(32, triton.next_power_of_2(KTOT)))
    grid = _on_gpu((triton.cdiv(M, BM), columns, planes), (triton.cdiv(M, gpu), columns, planes))
    return out, grid, (
        x, w, b if b is not None else w, out, M, KTOT, CI // groups, CO_G, *I, *O, *K, *stride, *padding, *dilation,
        *x.stride(), *w.stride(), *out.stride()), {"HAS_BIAS": b is not None, "BM": BM, "BN": BN, "BK": BK}
'''


def conv_phased(attrs: dict) -> bool:
    """A transposed convolution without dilation runs by output phase (phased_lines); conv_call tells LAUNCHER."""
    return bool(attrs["transposed"]) and all(x == 1 for x in attrs["dilation"])


def conv_kernel_for(node: Node) -> tuple[str, str]:
    return conv_kernel(len(node.shape) - 2, node.attrs["transposed"], conv_phased(node.attrs))


def conv_call(node: Node, operands: list[str]) -> str:
    """The launcher call for `node` on the candidate's tensors `operands` (input, weight[, bias])."""
    at = node.attrs
    bias = operands[2] if len(operands) > 2 else "None"
    return (f"_conv({operands[0]}, {operands[1]}, {bias}, {at['stride']}, {at['padding']}, {at['dilation']}, "
            f"{at['transposed']}, {at['output_padding']}, {at['groups']}, {conv_phased(at)})")


@emits("conv")
def conv(fw: "Forward", v: int) -> str:
    n = fw.nodes[v]
    t = [fw.tensor(x) for x in n.args]
    name = fw.kernel(conv_kernel_for(n))
    fw.launcher("_conv", LAUNCHER)
    return fw.launch(v, name, conv_call(n, t))
