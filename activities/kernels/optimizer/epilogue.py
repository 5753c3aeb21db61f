"""The `epilogue` rewrite: the pointwise chain that consumes a matmul's or a convolution's output is computed in that
kernel, on its fp32 accumulator tile, before the one store (bias, activation, scaling: Level 2's GEMM/conv +
epilogue fusions). The compiler launches the chain as a second kernel that reads the product back from DRAM and
writes it again; here it costs neither a launch nor those bytes.

The kernel is the matmul or conv block's own (compiler/blocks), with the epilogue spliced in before its final
`tl.store(..., acc, ...)`: the chain's other operands (a bias vector, a per-channel scale, a residual tensor) are
loaded at the output tile's indices with their own broadcast strides, and the store writes the chain's value.

A chain qualifies when the product is used by the chain only, every node of the chain has the product's shape and
dtype, its other operands broadcast to that shape, and exactly one of its values leaves it.
"""

from __future__ import annotations

import copy
import re
from typing import TYPE_CHECKING, Any

from activities.kernels.compiler.blocks import conv as conv_block
from activities.kernels.compiler.blocks import matmul as matmul_block
from activities.kernels.compiler.blocks.common import kernel_name
from activities.kernels.compiler.blocks.pointwise import Fused
from activities.kernels.compiler.expr import expression
from activities.kernels.compiler.forward import with_blocks
from activities.kernels.compiler.graph import Node, broadcast
from activities.kernels.compiler.registry import emits
from activities.kernels.optimizer import reaches, rewrite

if TYPE_CHECKING:
    from activities.kernels.compiler.forward import Forward
    from activities.kernels.compiler.graph import Graph

PRODUCTS = ("matmul", "conv")
OUT_STRIDES = {"matmul": ["scb", "scm", "scn"], "conv": None}
"""The output's stride arguments in each block's kernel (conv: os0, os1, os2, ... by its rank)."""


@rewrite("epilogue", order=20, summary="a matmul's or convolution's pointwise epilogue inside its kernel")
def epilogue(graph: Graph) -> Graph | None:
    """Every qualifying product + chain becomes one `epilogue` node (None: the graph has none)."""
    users = graph.users()
    outputs = set(graph.outputs)
    done = False
    for main, node in enumerate(graph.nodes):
        if node.op not in PRODUCTS or main in outputs or not users[main]:
            continue
        chain = _chain(graph, main)
        exits = [n for n in chain if n in outputs or any(u not in chain for u in users[n])]
        if (len(exits) != 1 or any(u not in chain for u in users[main])
                or any(graph.nodes[n].dtype != node.dtype for n in chain)):
            continue
        out = exits[0]
        original = graph.nodes[out]
        operands = [a for a in node.args if isinstance(a, int)]  # the product's own operands, not the product
        graph.nodes[out] = Node(op="epilogue", args=[*operands, *_leaves(graph, chain, main)], shape=list(original.shape),
                                dtype=original.dtype, sizes=list(original.sizes),
                                attrs={"main": main, "chain": sorted(chain), "out_node": copy.deepcopy(original)})
        done = True
    return graph if done else None


def _chain(graph: Graph, main: int) -> set[int]:
    """The later pointwise nodes of the product's shape that use the product or the chain, with operands that
    broadcast to it."""
    shape = list(graph.nodes[main].shape)
    chain: set[int] = set()
    inside = {main}
    for i in range(main + 1, len(graph.nodes)):
        node = graph.nodes[i]
        if node.op != "pw" or list(node.shape) != shape:
            continue
        if not any(isinstance(a, int) and a in inside for a in node.args):
            continue
        if any(isinstance(a, int) and a not in inside and reaches(graph, a, inside) for a in node.args):
            continue  # it needs a value computed from the chain elsewhere (a reduction of it): not the epilogue's
        if all(not isinstance(a, int) or a in inside or broadcast(shape, graph.nodes[a].shape) == shape
               for a in node.args):
            chain.add(i)
            inside.add(i)
    return chain


def _leaves(graph: Graph, chain: set[int], main: int) -> list[int]:
    """The chain's operands from outside it (ids only: the emitter reads them through `Fused`)."""
    found: list[int] = []
    for n in sorted(chain):
        for a in graph.nodes[n].args:
            if isinstance(a, int) and a != main and a not in chain and a not in found:
                found.append(a)
    return found


class _Epilogue(Fused):
    """The chain's expression over the accumulator tile `acc` (the product) and the chain's operands."""

    def __init__(self, fw: Forward, v: int):
        super().__init__(fw)
        self.v = v
        self.at = fw.nodes[v].attrs

    def expr(self, v: Any) -> str:
        if v == self.at["main"]:
            return "acc"
        if v == self.v:  # the chain's last node, whose place the epilogue node took
            node: Node = self.at["out_node"]
            parts = [self.expr(a) for a in node.args]
            return self.line(expression(node.attrs["fn"], node.attrs.get("attrs", {}), parts, node.args))
        return super().expr(v)


def splice(kernel: tuple[str, str], kind: str, rank: int, leaves: int, scalars: int, body: list[str],
           result: str) -> tuple[str, str]:
    """The block's kernel with the epilogue before its final store: leaf pointers and strides (and scalars) as new
    arguments ahead of the constexprs, each leaf loaded at the output tile's offsets."""
    _, source = kernel
    lines = source.splitlines()
    at = max(i for i, ln in enumerate(lines) if ln.strip().startswith("tl.store("))
    store = re.fullmatch(r"(\s*)tl\.store\((\w+) \+ (.*), acc, mask=(.*)\)", lines[at])
    if store is None:
        raise ValueError(f"the {kind} kernel's store is not `tl.store(ptr + offset, acc, mask=...)`")
    indent, _ptr, off, mask = store.groups()
    names = OUT_STRIDES[kind] or [f"os{j}" for j in range(rank)]
    new_args, loads = [], [f"{indent}em = {mask}"]
    for k in range(leaves):
        mine = {name: f"l{k}_s{j}" for j, name in enumerate(names)}
        leaf_off = re.sub(r"\b(" + "|".join(names) + r")\b", lambda m: mine[m.group(1)], off)
        new_args += [f"l{k}_ptr"] + list(mine.values())
        loads.append(f"{indent}x{k} = tl.load(l{k}_ptr + {leaf_off}, mask=em, other=0.0).to(tl.float32)")
    new_args += [f"s{k}" for k in range(scalars)]
    tail = [indent + b for b in body] + [lines[at].replace(", acc, mask=", f", {result}, mask=", 1)]
    lines[at:at + 1] = loads + tail
    text = "\n".join(lines) + "\n"
    first_constexpr = re.search(r",\s*\w+: tl\.constexpr", text)
    assert first_constexpr is not None
    text = text[:first_constexpr.start()] + "".join(f", {a}" for a in new_args) + text[first_constexpr.start():]
    old_name = re.search(r"def (\w+)\(", text).group(1)
    name = kernel_name(f"{old_name.removesuffix('_kernel')}_epilogue", text)
    return name, text.replace(f"def {old_name}(", f"def {name}(", 1)


@emits("epilogue")
def emit_epilogue(fw: Forward, v: int) -> str:
    at = fw.nodes[v].attrs
    main: Node = fw.nodes[at["main"]]
    k = _Epilogue(fw, v)
    result = k.expr(v)
    operands = [fw.tensor(a) for a in main.args]
    if main.op == "matmul":
        made = ("matmul_kernel", matmul_block.KERNEL)
        fw.launcher("_matmul", matmul_block.LAUNCHER)
        call, rank, pad = f"_matmul({operands[0]}, {operands[1]})", 3, True
    else:
        made = conv_block.conv_kernel_for(main)
        fw.launcher("_conv", conv_block.LAUNCHER)
        call = conv_block.conv_call(main, operands)
        rank, pad = len(main.shape), False
    call = with_blocks(call, at.get("inner_blocks"))  # the product's block sizes (the `blocks` rewrite)
    name = fw.kernel(splice(made, main.op, rank, len(k.leaves), len(k.scalars), k.lines, result))
    fw.launcher("_epilogue", LAUNCHER)
    return fw.launch(v, name, f"_epilogue({call}, [{k.leaf_vars()}], [{k.scalar_args()}], {pad})")


LAUNCHER = '''

def _epilogue(made, leaves, scalars, pad):
    """A matmul's or convolution's (out, grid, args, meta) with its epilogue's operands appended: each leaf and
    its strides broadcast to the output (a 2-D matmul's padded with a batch stride of 0), then the scalars."""
    out, grid, args, meta = made
    extra = []
    for t in leaves:
        strides = list(t.expand(out.shape).stride())
        extra += [t, *([0] * (3 - len(strides)) if pad else []), *strides]
    return out, grid, (*args, *extra, *scalars), meta
'''
