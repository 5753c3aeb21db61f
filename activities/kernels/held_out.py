"""Held-out sizes: a second size set for the same task, so VERIFIED means the kernel is right beyond the
sample's shapes (a kernel with `3 * 1001` baked in is right on `get_inputs()` and wrong everywhere else).

The sizes are the task's own settable constants (`--set` names) that `get_inputs()` reads and whose values
are dimensions of its inputs or parameters, and that are written as literals (a derived constant follows the ones it is
derived from), and the integer literals `get_inputs()` passes to a tensor factory as a size when they are such
dimensions too (`torch.randn(3, 1001)`: keyed `3@LINE:COL`, task_source.literal_sizes). Each grows a little to an odd number (`held_out_value`): odd, because kernels that
assume powers of two or multiples of a block size fail there; larger, because a kernel that assumes
the sample's element count then leaves elements unwritten (a smaller size would let it write out of
bounds, which the Triton interpreter does not catch). Some tasks constrain their sizes (GroupNorm's
channels divisible by the groups), so several size sets are tried, fewest changes last, and the first
that builds and traces on the meta device, changes a dimension, and fits the memory bound is taken.
A size that changes the model's parameters (an LSTM's `num_layers`, a block count) is an architecture
setting, not a size: varying it changes the operation (a kernel for a two-layer LSTM is a fine kernel), so it
stays like a kernel size. So does a size the model's construction reads from the task file itself, not through
get_init_inputs() (`module_settings`): a candidate file keeps the task's value. Each size is checked alone by
building the model (on the meta device, no trace).
The probe child (`_probe`) does the trying; this module holds the rules.
"""

from __future__ import annotations

from collections.abc import Callable

from activities.kernels.reference import size_problem
from activities.kernels.task_source import input_constants, literal_constants, literal_sizes
from contracts.kernel import Number
from contracts.kernel_job import ReferenceAnalysis

MAX_GROWTH = 2.0
"""A held-out size set may take at most this many times the task's data (the interpreter's time grows with it)."""
OWN_SHAPES_ONLY = "verified at its own shapes only"


def held_out_value(v: int) -> int:
    """About 1/8 larger, odd, and never v itself: 2 -> 3, 3 -> 5, 16 -> 19, 1000 -> 1125, 4096 -> 4609."""
    n = v + max(1, v // 8)
    return n if n % 2 else n + 1


def knobs(source: str, analysis: ReferenceAnalysis) -> dict[str, int]:
    """The task's literal integer constants (> 1) that `get_inputs()` reads, and the literal sizes it passes to
    tensor factories, whose values are dimensions of its inputs or parameters: the input sizes. A constant
    only the model's construction reads (kernel size, stride, groups, the dim a reduction runs over) changes
    the operation, not its shapes, so it stays."""
    dims = {d for i in analysis.inputs if i.tensor is not None for d in i.tensor.shape}
    dims |= {d for p in analysis.params for d in p.tensor.shape}
    sizes = input_constants(source)
    named = {k: v for k, v in literal_constants(source).items()
             if isinstance(v, int) and not isinstance(v, bool) and v > 1 and v in dims and k in sizes}
    return named | {k: v for k, v in literal_sizes(source).items() if v in dims}


def size_sets(sizes: dict[str, int]) -> list[dict[str, int]]:
    """The size sets to try, in order: every knob; the large ones only (>= 8: small numbers are often
    kernel sizes or channel counts a task constrains); then each knob alone, in the file's order."""
    grown = {k: held_out_value(v) for k, v in sizes.items()}
    sets = [grown, {k: v for k, v in grown.items() if sizes[k] >= 8}, *({k: v} for k, v in grown.items())]
    unique: list[dict[str, int]] = []
    for s in sets:
        if s and s not in unique:
            unique.append(s)
    return unique


def architecture_settings(sizes: dict[str, int], parameters: Callable[[dict[str, int]], list[str] | None]) -> list[str]:
    """The sizes that, grown alone, change the model's parameter names (more layers, more blocks)."""
    base = parameters({})
    if base is None:
        return []
    changed = []
    for k, v in sizes.items():
        names = parameters({k: held_out_value(v)})
        if names is not None and names != base:
            changed.append(k)
    return changed


def module_settings(sizes: dict[str, int], reads_module: Callable[[dict[str, int]], bool]) -> list[str]:
    """The sizes the model's construction reads from the task file's module itself, not through
    get_init_inputs() (`self.hidden = torch.randn((batch_size, hidden_size))` in `__init__`, batch_size a module
    constant). The candidate is a file of its own: built from the held-out init inputs it still sees the task's
    value there, so its state, and every parameter drawn after it, would differ from the reference's (a false
    "no" of a right kernel). The reference itself only runs where that constant matches its inputs, so such a
    size stays, like an architecture setting. `reads_module(overrides)`: whether the model built from the task file
    at `overrides` differs from the one the task's own model code builds from those overrides' init inputs."""
    return [k for k, v in sizes.items() if reads_module({k: held_out_value(v)})]


def check(original: ReferenceAnalysis, held: ReferenceAnalysis) -> str:
    """Why a traced held-out size set cannot be used ("" when it can)."""
    if held.trace_error:
        return held.trace_error
    shapes = [[i.tensor.shape for i in a.inputs if i.tensor] + [p.tensor.shape for p in a.params]
              for a in (original, held)]
    if shapes[0] == shapes[1]:
        return "no input or parameter dimension changed"
    if [p.name for p in original.params] != [p.name for p in held.params]:
        return "it changes the model's parameters (an architecture setting)"
    problem = size_problem(held)
    if problem:
        return problem
    data = original.input_bytes + original.param_bytes
    if held.input_bytes + held.param_bytes > MAX_GROWTH * data + 1024**2:
        return f"it takes more than {MAX_GROWTH:g}x the task's data"
    return ""


def choose(source: str, analysis: ReferenceAnalysis, trace: Callable[[dict[str, int]], ReferenceAnalysis],
           parameters: Callable[[dict[str, int]], list[str] | None] | None = None,
           reads_module: Callable[[dict[str, int]], bool] | None = None) -> tuple[dict[str, Number], str]:
    """The first usable size set (traced with `trace(overrides)`), or ({}, "verified at its own shapes only: why").
    `parameters(overrides)`: the model's parameter and buffer names with them (None: it cannot be built);
    a size that changes them is an architecture setting and stays; so does one the model's construction reads
    from the task file itself (`reads_module`, see module_settings)."""
    if analysis.trace_error:
        return {}, f"{OWN_SHAPES_ONLY}: the task could not be traced, so its dimensions are unknown"
    sizes = knobs(source, analysis)
    architecture = architecture_settings(sizes, parameters) if parameters is not None else []
    sizes = {k: v for k, v in sizes.items() if k not in architecture}
    built_in = module_settings(sizes, reads_module) if reads_module is not None else []
    sizes = {k: v for k, v in sizes.items() if k not in built_in}
    if not sizes:
        also = (f"; {', '.join(architecture)} change the model's parameters (architecture settings, kept)"
                if architecture else "")
        also += (f"; the model's construction reads {', '.join(built_in)} from the task file itself, not through "
                 "get_init_inputs(), so a candidate (a file of its own) cannot follow a change of it (kept)"
                 if built_in else "")
        return {}, (f"{OWN_SHAPES_ONLY}: the task has no size to vary (a module-level integer constant that "
                    "get_inputs() reads, or an integer literal it passes to a tensor factory, that is a dimension "
                    f"of its inputs or parameters){also}")
    tried: list[str] = []
    for overrides in size_sets(sizes):
        why = check(analysis, trace(overrides))
        if not why:
            return dict(overrides), ""
        tried.append(f"{', '.join(f'{k}={v}' for k, v in overrides.items())}: {why[:160]}")
    return {}, f"{OWN_SHAPES_ONLY}: no held-out size set could be used ({'; '.join(tried[:3])})"[:600]
