"""The offline kernel compiler: the traced reference in, a Triton candidate out, in three stages a reader can
follow (after Inductor's lowering registry and Olive's registered passes):

1. `reader`: the one aten-graph reader. Each aten call goes to the function registered for its op
   (`registry.lowers`, modules in `lowerings/`), which writes primitive nodes into a `graph.Graph`.
2. `passes`: registered rewrites over that graph, in order (`registry`-style: `passes.graph_pass`).
3. `forward` + `blocks/`: the building block registered for each node's op (`registry.emits`) writes its
   kernel and launch; `candidate` puts the file together.

`lower(analysis)` is stages 1 and 2 (pure: the workflow runs it to name the task's family); `render` is stage 3.
"""

from __future__ import annotations

from activities.kernels.compiler import passes
from activities.kernels.compiler.candidate import launches, render
from activities.kernels.compiler.graph import Graph, Refused
from activities.kernels.compiler.reader import read
from contracts.kernel_job import ReferenceAnalysis


def lower(a: ReferenceAnalysis) -> Graph | str:
    """The lowered graph, or one line saying which op (or use of it) cannot be lowered."""
    try:
        return passes.run(read(a))
    except Refused as e:
        return str(e)


__all__ = ["Graph", "Refused", "launches", "lower", "render"]
