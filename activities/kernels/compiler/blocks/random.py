"""Random draws: no kernel. The reference draws inside forward (an LSTM's random initial state); the candidate
calls the same torch function at the same point with the same sizes, so the default generator gives it the same
numbers."""

from __future__ import annotations

from typing import TYPE_CHECKING

from activities.kernels.compiler.graph import symbolic
from activities.kernels.compiler.registry import emits

if TYPE_CHECKING:
    from activities.kernels.compiler.forward import Forward


@emits("random")
def random(fw: "Forward", v: int) -> str:
    n = fw.nodes[v]
    sizes = [fw.size(e) if symbolic(e) else e for e in n.sizes] if n.sizes else [str(s) for s in n.shape]
    device = f"inputs[{fw.graph.device_input}].device" if fw.graph.device_input is not None else '"cpu"'
    return fw.emit(v, f"torch.{n.attrs['fn']}([{', '.join(sizes)}], dtype={fw.dtype(v)}, device={device})")
