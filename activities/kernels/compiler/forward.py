"""Writes the candidate's forward from a Graph: walks back from the outputs and asks the building block
registered for each node's op (`registry.emits`) to write it. Pointwise nodes are not launched one by one: the
pointwise block fuses them into the kernel of whoever consumes them (a pointwise chain, a reduction's input),
so `relu(x + b) * s` is one kernel; every other node is one launch of its block's kernel.

A launch is written in plain sight: `t, grid, args, meta = _launcher(...)` (sizes from the run-time tensors)
then `kernel[grid](*args, **meta)`. Kernels and launchers are collected by name, each written once.
"""

from __future__ import annotations

import re

from activities.kernels.compiler import blocks  # noqa: F401 - registers every emitter
from activities.kernels.compiler.blocks.common import GPU_GRID, IEEE_DOT, TF32_DOT
from activities.kernels.compiler.graph import TORCH_DTYPES, Graph, Node, Refused
from activities.kernels.compiler.registry import EMITTERS


class Forward:
    def __init__(self, graph: Graph, *, tf32: bool = False):
        self.graph = graph
        self.tf32 = tf32
        """The job's precision policy allows TF32: every block's `tl.dot` on fp32 operands computes in it."""
        self.nodes = graph.nodes
        self.kernels: dict[str, str] = {}
        """name -> @triton.jit source, in first-use order."""
        self.launchers: dict[str, str] = {}
        """name -> the Python launcher's source, in first-use order."""
        self.lines: list[str] = []
        self.names: dict[int, str] = {}
        self.launches = 0
        self.symbols: set[str] = set()
        """The size symbols the forward's lines use (bound from the inputs' sizes by `prologue`)."""
        self._readers: dict[int, list[int]] | None = None
        self.cat_buffers: dict[int, int] = {}
        """A growing cat's node -> how many of its parts its buffer holds so far (`blocks.pointwise.cat`)."""

    def write(self) -> list[str]:
        """The forward's variables for the graph's outputs (writing everything they need into `lines`). The nodes
        that are not fused into a consumer are written in graph order (operands first, so a deep model never
        recurses deeply, and random draws happen in the reference's order)."""
        for v in self.needed():
            if self.nodes[v].op not in ("pw", "input"):
                self.tensor(v)
        return [self.tensor(o) for o in self.graph.outputs]

    def needed(self) -> list[int]:
        """The nodes the outputs depend on, in graph order."""
        return sorted(self.graph.needed())

    def readers(self, v: int) -> list[int]:
        """The needed nodes that read `v` (an earlier rewrite may leave dead ones that still name it)."""
        if self._readers is None:
            self._readers = {}
            for u in self.needed():
                for a in dict.fromkeys(a for a in self.nodes[u].args if isinstance(a, int)):
                    self._readers.setdefault(a, []).append(u)
        return self._readers.get(v, [])

    def size(self, expr: str) -> str:
        """A size expression from the trace, as forward code (its symbols are variables bound at the start)."""
        self.symbols |= set(re.findall(r"[A-Za-z_]\w*", expr)) & set(self.graph.symbols)
        return expr

    def prologue(self) -> list[str]:
        """`s0 = inputs[0].shape[0]` for each symbol the forward uses."""
        return [f"{s} = inputs[{i}].shape[{d}]" for s, (i, d) in sorted(self.graph.symbols.items()) if s in self.symbols]

    def kernel(self, made: tuple[str, str]) -> str:
        name, source = made
        self.kernels.setdefault(name, source.replace(IEEE_DOT, TF32_DOT) if self.tf32 else source)
        return name

    def launcher(self, name: str, source: str) -> str:
        if "_on_gpu(" in source:  # the helpers of the GPU's grid, written once, before their first user
            self.launchers.setdefault("_on_gpu", GPU_GRID)
        self.launchers.setdefault(name, source)
        return name

    def emit(self, v: int, code: str) -> str:
        """`t<v> = code` (a view, an allocation)."""
        name = f"t{v}"
        self.lines.append(f"{name} = {code}")
        self.names[v] = name
        return name

    def launch(self, v: int, kernel: str, helper: str) -> str:
        """`t<v>, grid, args, meta = helper` then the launch of `kernel` (the launcher sizes its blocks from the
        run-time shapes: on a GPU to fill the SMs, under the interpreter to run few programs, `GPU_GRID`)."""
        name = f"t{v}"
        self.lines += [f"{name}, grid, args, meta = {helper}", f"{kernel}[grid](*args, **meta)"]
        self.names[v] = name
        self.launches += 1
        return name

    def dtype(self, v: int) -> str:
        return TORCH_DTYPES.get(self.nodes[v].dtype, "torch.float32")

    def node(self, v: int) -> Node:
        return self.nodes[v]

    def tensor(self, v: int) -> str:
        """The forward variable holding node v, writing what computes it (once)."""
        if v in self.names:
            return self.names[v]
        n = self.nodes[v]
        if n.op == "input":
            self.names[v] = f"inputs[{n.attrs['index']}]"
            return self.names[v]
        if n.op == "param":
            return self.emit(v, f"_state(self, {n.attrs['name']!r})")
        emitter = EMITTERS.get(n.op)
        if emitter is None:
            raise Refused(f"cannot emit {n.op}")
        return emitter.fn(self, v)


STATE = '''

def _state(module, name):
    """A parameter or buffer of the model by its dotted name."""
    tensors = dict(module.named_parameters())
    tensors.update(dict(module.named_buffers()))
    return tensors[name].detach()
'''
