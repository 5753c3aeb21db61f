"""The `epilogue` rewrite: the pointwise chain that consumes a matmul's or a convolution's output is computed in that
kernel, on its fp32 accumulator tile, before the one store (bias, activation, scaling: Level 2's GEMM/conv +
epilogue fusions). The compiler launches the chain as a second kernel that reads the product back from DRAM and
writes it again; here it costs neither a launch nor those bytes.

The kernel is the matmul or conv block's own (compiler/blocks), with the epilogue spliced in before its final
`tl.store(..., acc, ...)`: the chain's other operands (a bias vector, a per-channel scale, a residual tensor) are
loaded at the output tile's indices with their own broadcast strides, and the store writes the chain's value.

A chain qualifies when the product is used by the chain only, every node of the chain has the product's dtype and
the shape of its values from the chain, its other operands broadcast to that shape, and exactly one of its values
leaves it. The chain may pass through reshapes (a Linear on [batch, tokens, features] traces as a 2-D matmul viewed
back to 3-D before its activation and residual add): a reshape keeps every value's row-major place, so the tile's
lane for the product's element f holds the chain's element f at every shape, and an operand attached at a reshaped
shape is read through the same reshape of its broadcast (`_epilogue`'s `shapes`), taken only where that reshape is
a view (no copy); the result is reshaped back after the launch.
"""

from __future__ import annotations

import copy
import math
import re
from typing import TYPE_CHECKING, Any

from activities.kernels.compiler.blocks import conv as conv_block
from activities.kernels.compiler.blocks import matmul as matmul_block
from activities.kernels.compiler.blocks.common import kernel_name
from activities.kernels.compiler.blocks.pointwise import Fused
from activities.kernels.compiler.blocks.views import reshape_sizes
from activities.kernels.compiler.expr import expression
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
    alive = graph.needed()  # an earlier rewrite may have left nodes no output needs
    done = False
    for main, node in enumerate(graph.nodes):
        if node.op not in PRODUCTS or main in outputs or main not in alive or not users[main]:
            continue
        region = _region(graph, main, users, outputs)
        if region is None:
            continue
        chain, out = region
        original = graph.nodes[out]
        operands = [a for a in node.args if isinstance(a, int)]  # the product's own operands, not the product
        graph.nodes[out] = Node(op="epilogue", args=[*operands, *chain_operands(graph, chain, main)],
                                shape=list(original.shape), dtype=original.dtype, sizes=list(original.sizes),
                                attrs={"main": main, "chain": sorted(chain), "out_node": copy.deepcopy(original)})
        done = True
    return graph if done else None


def _region(graph: Graph, main: int, users: dict[int, list[int]], outputs: set[int]) -> tuple[set[int], int] | None:
    """The product's chain and its exit: through reshapes where that chain qualifies, else without them."""
    for through_views in (True, False):
        chain = product_chain(graph, main, through_views)
        out = _exit(graph, main, chain, users, outputs)
        if out is not None:
            return chain, out
    return None


def _exit(graph: Graph, main: int, chain: set[int], users: dict[int, list[int]], outputs: set[int]) -> int | None:
    """The chain's one value that leaves it, or None when the chain does not qualify."""
    exits = [n for n in chain if n in outputs or any(u not in chain for u in users[n])]
    if (len(exits) != 1 or graph.nodes[exits[0]].op != "pw" or any(u not in chain for u in users[main])
            or any(graph.nodes[n].dtype != graph.nodes[main].dtype for n in chain)):
        return None
    return exits[0]


def product_chain(graph: Graph, main: int, through_views: bool) -> set[int]:
    """The later pointwise nodes that use the product or the chain elementwise (their shape is that of their values
    from the chain), with operands that broadcast to it; `through_views`: reshapes of chain values join it too (kept
    only where a chain node reads them)."""
    product = list(graph.nodes[main].shape)
    chain: set[int] = set()
    inside = {main}
    for i in range(main + 1, len(graph.nodes)):
        node = graph.nodes[i]
        ins = [a for a in node.args if isinstance(a, int) and a in inside]
        if not ins:
            continue
        if through_views and node.op == "view" and node.attrs.get("kind") == "reshape":
            chain.add(i)
            inside.add(i)
            continue
        shape = list(node.shape)
        if node.op != "pw" or any(list(graph.nodes[a].shape) != shape for a in ins):
            continue
        if any(isinstance(a, int) and a not in inside and reaches(graph, a, inside) for a in node.args):
            continue  # it needs a value computed from the chain elsewhere (a reduction of it): not the epilogue's
        if all(not isinstance(a, int) or a in inside or _attaches(graph.nodes[a].shape, shape, product)
               for a in node.args):
            chain.add(i)
            inside.add(i)
    users = graph.users()
    for i in sorted(chain, reverse=True):  # a reshape no chain node reads is the consumer's, not the epilogue's
        if graph.nodes[i].op == "view" and not any(u in chain for u in users[i]):
            chain.discard(i)
    return chain


def _attaches(operand: list[int], shape: list[int], product: list[int]) -> bool:
    """Can an operand of shape `operand` (contiguous), broadcast to `shape`, be read at the product's tile through
    a view of it reshaped to the product's shape?"""
    if broadcast(shape, operand) != shape:
        return False
    if shape == product:
        return True
    lead = len(shape) - len(operand)
    contiguous = [math.prod(operand[j + 1:]) for j in range(len(operand))]
    strides = [0 if j < lead or operand[j - lead] == 1 else contiguous[j - lead] for j in range(len(shape))]
    return view_strides(shape, strides, product) is not None


def view_strides(shape: list[int], strides: list[int], new: list[int]) -> list[int] | None:
    """The strides of `tensor.view(new)` for a tensor of `shape` and `strides`, or None where the view would need a
    copy (torch's computeStride: the new dims must split or merge chunks of dims that are contiguous together)."""
    if math.prod(shape) != math.prod(new):
        return None
    if not shape or math.prod(shape) == 0:
        return [math.prod(new[j + 1:]) for j in range(len(new))]
    out = [0] * len(new)
    view_d = len(new) - 1
    base = strides[-1]
    tensor_numel = view_numel = 1
    for d in range(len(shape) - 1, -1, -1):
        tensor_numel *= shape[d]
        if d == 0 or (shape[d - 1] != 1 and strides[d - 1] != tensor_numel * base):
            while view_d >= 0 and (view_numel < tensor_numel or new[view_d] == 1):
                out[view_d] = view_numel * base
                view_numel *= new[view_d]
                view_d -= 1
            if view_numel != tensor_numel:
                return None
            if d > 0:
                base, tensor_numel, view_numel = strides[d - 1], 1, 1
    return out if view_d == -1 else None


def chain_operands(graph: Graph, chain: set[int], main: int) -> list[int]:
    """The chain's operands from outside it (ids only: the emitter reads them through `Fused`)."""
    found: list[int] = []
    for n in sorted(chain):
        for a in graph.nodes[n].args:
            if isinstance(a, int) and a != main and a not in chain and a not in found:
                found.append(a)
    return found


class ChainExpr(Fused):
    """A product's pointwise chain as an expression over its accumulator tile `acc` and the chain's operands, each
    operand with the reshape of the product it is attached at (`shapes`). `last` is the chain's exit, `last_node`
    its node (the epilogue rewrite put its own node in the exit's place)."""

    def __init__(self, fw: Forward, main: int, chain: list[int], last: int, last_node: Node):
        super().__init__(fw)
        self.main, self.v, self.last_node = main, last, last_node
        self.chain = set(chain)
        self.product = list(fw.nodes[main].shape)
        self.reshaped: dict[int, Node | None] = {main: None}
        """The reshape that gave each chain value its shape (None: the product's)."""
        for c in sorted(self.chain):
            node = self._node(c)
            self.reshaped[c] = ((None if list(node.shape) == self.product else node) if node.op == "view" else
                                next(self.reshaped[a] for a in node.args if isinstance(a, int) and a in self.reshaped))
        self.shapes: list[Node | None] = []
        """Each leaf's attachment: the reshape whose shape it broadcasts to (None: the product's)."""
        self._attach: Node | None = None
        self._keys: list[tuple] = []

    def expr(self, v: Any) -> str:
        if v == self.main:
            return "acc"
        if not isinstance(v, int) or v not in self.chain:
            return super().expr(v)  # an operand from outside: a leaf (or its pointwise inlined) at the attached shape
        node = self._node(v)
        if node.op == "view":
            return self.expr(node.args[0])  # a reshape moves no element from its lane
        if v not in self.memo:
            outer, self._attach = self._attach, self.reshaped[v]
            parts = [self.expr(a) for a in node.args]
            self._attach = outer
            self.memo[v] = self.line(expression(node.attrs["fn"], node.attrs.get("attrs", {}), parts, node.args))
        return self.memo[v]

    def target(self, view: Node, x: str) -> str:
        """The reshape `view` of the product's shape as forward code over the product's tensor `x`."""
        return f"[{', '.join(reshape_sizes(self.fw, x, self.product, list(view.shape), view.sizes))}]"

    def _node(self, v: int) -> Node:
        return self.last_node if v == self.v else self.fw.nodes[v]

    def leaf(self, var: str, flips: tuple[int, ...] = ()) -> str:
        key = (var, flips, id(self._attach))
        if key not in self._keys:
            self._keys.append(key)
            self.leaves.append((var, flips))
            self.shapes.append(self._attach)
        return f"x{self._keys.index(key)}"


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
    k = ChainExpr(fw, at["main"], at["chain"], v, at["out_node"])
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
    name = fw.kernel(splice(made, main.op, rank, len(k.leaves), len(k.scalars), k.lines, result))
    fw.launcher("_epilogue", LAUNCHER)
    shapes = ", ".join("None" if s is None else f"lambda out: {k.target(s, 'out')}" for s in k.shapes)
    shapes = f", shapes=[{shapes}]" if any(k.shapes) else ""
    out = fw.launch(v, name, f"_epilogue({call}, [{k.leaf_vars()}], [{k.scalar_args()}], {pad}{shapes})")
    last = k.reshaped[v]
    if last is not None:  # the chain ended at a reshape of the product's shape
        out = fw.emit(v, f"{out}.reshape({k.target(last, out)})")
    return out


LAUNCHER = '''

def _epilogue(made, leaves, scalars, pad, shapes=None):
    """A matmul's or convolution's (out, grid, args, meta) with its epilogue's operands appended: each leaf and
    its strides broadcast to the output (a 2-D matmul's padded with a batch stride of 0), then the scalars. A leaf
    attached after a reshape of the product (`shapes`: the reshape's target as a function of the output) is
    broadcast to that shape and reshaped back to the output's."""
    out, grid, args, meta = made
    extra = []
    for t, shape in zip(leaves, shapes or [None] * len(leaves)):
        if shape is not None:
            t = t.expand(out.view(shape(out)).shape).reshape(out.shape)
        strides = list(t.expand(out.shape).stride())
        extra += [t, *([0] * (3 - len(strides)) if pad else []), *strides]
    return out, grid, (*args, *extra, *scalars), meta
'''
