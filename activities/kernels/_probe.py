"""Child-process probe: `python -m activities.kernels._probe TASK.py OUT.json SEED [--no-held-out]`.

Reads what a KernelBench-format task computes without computing it: builds `Model(*get_init_inputs())`
and `get_inputs()` on the meta device (shapes and dtypes, no memory), and traces `Model.forward` with
`make_fx` into aten ops. Parameters and buffers are traced as named inputs (`torch.func.functional_call`),
so a lowering can address them by name; a Python scalar input is traced as a sentinel value and its uses
come back as references to that input (the kernel takes it at run time, not the traced constant).
The trace is symbolic in the forward inputs' sizes (parameters keep theirs: they fix the sizes they meet), so a
size forward computes from `x.size()` comes back as an expression over the inputs' size symbols, not the traced
number; a forward the symbolic trace cannot take is traced with concrete sizes instead.
Then it chooses the held-out sizes (`held_out`: the task at a second size set, traced the same way).
Writes a ReferenceAnalysis (contracts.kernel_job) as JSON. Runs in a child (the task is user code):
the same limits as the verifier's children.
"""

from __future__ import annotations

import dataclasses
import functools
import logging
import math
import operator
import re
import sys
from pathlib import Path
from typing import Any

SENTINEL = 0.1234567891
"""Scalar input i is traced as SENTINEL + i / 1024 (a value no task uses by chance)."""


def _dtype(dt: Any) -> str:
    return str(dt).removeprefix("torch.")


def _spec(t: Any) -> dict:
    return {"shape": [int(s) for s in t.shape], "dtype": _dtype(t.dtype)}


class _NotPrintable(Exception):
    pass


def _py(expr: Any) -> str:
    """A sympy size expression as Python over the symbol names (`s0*s1` -> `(s0 * s1)`); raises _NotPrintable."""
    name = type(expr).__name__
    if getattr(expr, "is_Integer", False):
        return str(int(expr))
    if getattr(expr, "is_Symbol", False):
        return str(expr.name)
    args = [_py(a) for a in expr.args] if name in ("Add", "Mul", "FloorDiv", "CleanDiv", "CeilDiv", "PythonMod", "Mod",
                                                   "Max", "Min") else []
    if name == "Add":
        return "(" + " + ".join(args) + ")"
    if name == "Mul":
        return "(" + " * ".join(args) + ")"
    if name == "Pow" and getattr(expr.exp, "is_Integer", False) and int(expr.exp) > 0:
        return f"({_py(expr.base)} ** {int(expr.exp)})"
    if name in ("FloorDiv", "CleanDiv"):  # CleanDiv: a division known to be exact
        return f"({args[0]} // {args[1]})"
    if name == "CeilDiv":
        return f"(-(-{args[0]} // {args[1]}))"
    if name in ("PythonMod", "Mod"):
        return f"({args[0]} % {args[1]})"
    if name in ("Max", "Min"):
        return f"{name.lower()}({', '.join(args)})"
    raise _NotPrintable(f"{name}: {expr}")


class _Sizes:
    """A symbolic trace's shape environment: size expressions as Python, with their traced values."""

    def __init__(self, env: Any, symbols: dict[str, dict]):
        self.env = env
        self.symbols = symbols

    def expr(self, s: Any) -> str:
        e = self.env.replace(s.node.expr) if hasattr(s, "node") else s
        text = _py(self.env.simplify(e) if hasattr(e, "free_symbols") else e)
        unknown = set(re.findall(r"[A-Za-z_]\w*", text)) - set(self.symbols) - {"max", "min"}
        if unknown:
            raise _NotPrintable(f"{text} uses {sorted(unknown)}")
        return text

    def hint(self, s: Any) -> int:
        return int(s) if isinstance(s, int) else int(s.node.hint)


def _json(value: Any, refs: dict, sentinels: dict[float, int], sizes: _Sizes | None = None) -> Any:
    import torch
    import torch.fx

    if isinstance(value, torch.fx.Node):
        val = value.meta.get("val")
        if sizes is not None and isinstance(val, torch.SymInt):
            text = sizes.expr(val)
            return int(text) if text.lstrip("-").isdigit() else {"sym": text, "hint": sizes.hint(val)}
        if sizes is not None and isinstance(val, (torch.SymFloat, torch.SymBool)):
            return float(val.node.hint) if isinstance(val, torch.SymFloat) else bool(val.node.hint)
        return refs[value]
    if isinstance(value, (list, tuple)):
        return [_json(v, refs, sentinels, sizes) for v in value]
    if isinstance(value, bool) or value is None or isinstance(value, (int, str)):
        return value
    if isinstance(value, float):
        if value in sentinels:
            return {"ref": "scalar", "index": sentinels[value]}
        return value if math.isfinite(value) else {"float": str(value)}
    if isinstance(value, torch.dtype):
        return {"dtype": _dtype(value)}
    return {"repr": repr(value)[:200]}


def _outs(node: Any, sizes: _Sizes | None = None) -> list[dict]:
    import torch

    val = node.meta.get("val")
    vals = val if isinstance(val, (list, tuple)) else [val]
    if sizes is None:
        return [_spec(v) for v in vals if isinstance(v, torch.Tensor)]
    specs = []
    for v in vals:
        if isinstance(v, torch.Tensor):
            exprs = [sizes.expr(d) if isinstance(d, torch.SymInt) else str(int(d)) for d in v.shape]
            spec = {"shape": [sizes.hint(d) for d in v.shape], "dtype": _dtype(v.dtype)}
            specs.append({**spec, "sizes": exprs} if any(not e.isdigit() for e in exprs) else spec)
    return specs


def _sizes_only(node: Any) -> bool:
    """The call computes a size or a guard, no tensor."""
    import torch

    val = node.meta.get("val")
    return val is None or isinstance(val, (torch.SymInt, torch.SymFloat, torch.SymBool, int, float, bool))


SKIPPED = ("aten._assert_scalar", "aten.sym_constrain_range", "aten._assert_tensor_metadata", "aten.sym_size",
           "aten.sym_numel", "aten.sym_stride", "aten.sym_storage_offset")
"""Calls of a symbolic trace that compute no tensor: size arithmetic (inlined into its uses) and guards."""


def _trace(forward: Any, state: dict, tensors: list, symbolic: bool) -> tuple[Any, _Sizes | None]:
    """(fx graph, its sizes): symbolic in the tensors' sizes, parameters static; concrete when `symbolic` is off."""
    from torch.fx.experimental.proxy_tensor import make_fx

    if not symbolic:
        return make_fx(forward)(state, tensors).graph, None
    import sympy
    from torch._guards import GuardSource, Source
    from torch._subclasses.fake_tensor import FakeTensorMode
    from torch.fx.experimental.symbolic_shapes import DimDynamic, ShapeEnv, SLoc, StatelessSymbolicContext

    @dataclasses.dataclass(frozen=True)
    class Input(Source):
        """torch._dynamo.source.ConstantSource, whose import loads torch._dynamo (about 1.3 s of CPU)."""

        source_name: str

        @property
        def guard_source(self) -> GuardSource:
            return GuardSource.CONSTANT

        @property
        def _name_template(self) -> str:
            return self.source_name

    class KeepSymbols(ShapeEnv):
        """A size the forward compares with a constant (a Linear's features, `num_features` in a norm's check)
        stays a symbol: it is read from the input at run time, where the model built at other sizes has its own
        constant. Symbols equated with symbols still merge."""

        def _set_replacement(self, a: Any, tgt: Any, msg: str) -> None:
            if not getattr(tgt, "is_number", False):
                super()._set_replacement(a, tgt, msg)
            elif not self.converting:  # a comparison fixed it (to a parameter's size): not a conversion
                self.pinned.add(str(a))

        def _get_stack_summary(self, is_debug: bool = False, framework_loc: str | None = None) -> tuple[Any, str]:
            """No source location for a symbol: torch finds the user's frame by importing torch._dynamo, _inductor
            and export to list their files (about 2 s of a probe's CPU), and nothing here reads it."""
            return SLoc(framework_loc, None), ""

        def evaluate_expr(self, orig_expr: Any, *args: Any, **kwargs: Any) -> Any:
            """Records a size that the model's own Python code turned into a plain number (`range(x.size(0))`,
            `int(n)`: SymInt.__index__/__int__/__float__ called from outside torch; torch's own conversions, a
            split's chunk count, are its decompositions' business): the graph traced past it holds for that
            value only."""
            converting = not isinstance(orig_expr, (sympy.Rel, sympy.logic.boolalg.BooleanFunction))
            self.converting += converting
            try:
                value = super().evaluate_expr(orig_expr, *args, **kwargs)
            finally:
                self.converting -= converting
            if converting and getattr(orig_expr, "free_symbols", None) and getattr(value, "is_number", False) \
                    and _converted_by_model_code():
                self.specialized[str(orig_expr)] = int(value) if value.is_Integer else float(value)
            return value

    logging.getLogger("torch._subclasses.fake_tensor").setLevel(logging.CRITICAL)  # a failed try is not news
    env = KeepSymbols(duck_shape=False)  # equal sizes stay separate symbols unless the forward equates them
    env.specialized, env.pinned, env.converting = {}, set(), 0  # type: ignore[attr-defined] - see KeepSymbols
    mode = FakeTensorMode(shape_env=env, allow_non_fake_inputs=True)  # a plain tensor attribute: a constant
    params = {k: mode.from_tensor(v, static_shapes=True) for k, v in state.items()}
    fakes = [mode.from_tensor(t, source=Input(f"input{i}"), symbolic_context=StatelessSymbolicContext(
        dynamic_sizes=[DimDynamic.DYNAMIC] * t.dim())) for i, t in enumerate(tensors)]
    graph = make_fx(forward, tracing_mode="symbolic")(params, fakes).graph
    return graph, fakes


def _converted_by_model_code() -> bool:
    """Whether the size being evaluated is converted to a Python number (SymInt.__index__ / __int__ / __float__)
    by code outside torch: the model's own."""
    import torch

    torch_dir = str(Path(torch.__file__).parent)
    frame = sys._getframe(1)
    while frame is not None:
        if frame.f_code.co_name in ("__index__", "__int__", "__float__") and frame.f_code.co_filename.startswith(
                torch_dir):
            caller = frame.f_back
            return caller is not None and not caller.f_code.co_filename.startswith(torch_dir)
        frame = frame.f_back
    return False


RECURRENT = ("lstm", "gru", "rnn_tanh", "rnn_relu")
"""torch's recurrent layers (`torch._VF.<mode>`): traced whole, as `fleetforge.rnn`, not unrolled over time steps."""


def _rnn_op() -> Any:
    """`fleetforge::rnn(mode, input, hx, params, has_biases, num_layers, dropout, train, bidirectional, batch_first)`:
    a recurrent layer as one op of the trace (its fake kernel gives the output sizes), so the sequence length
    stays a size the candidate reads at run time."""
    import torch

    if hasattr(torch.ops.fleetforge, "rnn"):
        return torch.ops.fleetforge.rnn

    @torch.library.custom_op("fleetforge::rnn", mutates_args=(), schema=(
        "(str mode, Tensor input, Tensor[] hx, Tensor[] params, bool has_biases, int num_layers, float dropout, "
        "bool train, bool bidirectional, bool batch_first) -> Tensor[]"))
    def rnn(mode, input, hx, params, has_biases, num_layers, dropout, train, bidirectional, batch_first):  # noqa: ANN001
        hx_arg = hx if mode == "lstm" else hx[0]
        out = getattr(torch._VF, mode)(input, hx_arg, params, has_biases, num_layers, dropout, train, bidirectional,
                                       batch_first)
        return [t.clone() for t in out]

    @rnn.register_fake
    def _(mode, input, hx, params, has_biases, num_layers, dropout, train, bidirectional, batch_first):
        seq, batch = (input.shape[1], input.shape[0]) if batch_first else (input.shape[0], input.shape[1])
        hidden = hx[0].shape[2]
        width = hidden * (2 if bidirectional else 1)
        out = input.new_empty((batch, seq, width) if batch_first else (seq, batch, width))
        return [out] + [h.new_empty(h.shape) for h in hx]

    return torch.ops.fleetforge.rnn


def _trace_rewrites() -> Any:
    """One torch function mode for the calls the trace must see otherwise than eager runs them, each handled by
    the function below that says why; every other call runs as it is."""
    import torch
    import torch.nn.functional as F
    from torch.overrides import TorchFunctionMode

    handlers: dict[Any, Any] = {getattr(torch._VF, m): functools.partial(_recurrent_whole, m) for m in RECURRENT}
    handlers[F.scaled_dot_product_attention] = _attention_written_out
    handlers[torch.tensor] = _number_tensor_keeps_its_value

    class Rewrites(TorchFunctionMode):
        def __torch_function__(self, func, types, args=(), kwargs=None):  # noqa: ANN001 - torch's protocol
            handler = handlers.get(func)
            return func(*args, **(kwargs or {})) if handler is None else handler(func, *args, **(kwargs or {}))

    return Rewrites()


def _recurrent_whole(mode: str, func: Any, *args: Any, **kwargs: Any) -> Any:
    """torch._VF's recurrent layer `mode` as one `fleetforge.rnn` op, not unrolled over time steps."""
    import torch

    if kwargs or len(args) != 9 or not isinstance(args[1], (list, tuple, torch.Tensor)) \
            or not isinstance(args[2], (list, tuple)):
        return func(*args, **kwargs)
    hx = list(args[1]) if isinstance(args[1], (list, tuple)) else [args[1]]
    out = _rnn_op()(mode, args[0], hx, list(args[2]), *args[3:])
    return out[0], *out[1:]


def _attention_written_out(func: Any, q: Any, k: Any, v: Any, attn_mask: Any = None, dropout_p: float = 0.0,
                           is_causal: bool = False, scale: float | None = None, enable_gqa: bool = False) -> Any:
    """`F.scaled_dot_product_attention` written out in ops, its default scale 1/sqrt(E) as tensor ops on the size
    E: torch's own decomposition turns that scale into a number of the traced E, which the candidate would then
    bake in (wrong at any other head size)."""
    import torch

    if dropout_p or enable_gqa or (is_causal and attn_mask is not None):
        return func(q, k, v, attn_mask, dropout_p, is_causal, scale=scale, enable_gqa=enable_gqa)
    factor = torch.rsqrt(torch.ones((), dtype=q.dtype, device=q.device) * q.shape[-1]) if scale is None else scale
    scores = (q @ k.transpose(-2, -1)) * factor
    if is_causal:
        keep = torch.ones(q.shape[-2], k.shape[-2], dtype=torch.bool, device=q.device).tril()
        scores = scores.masked_fill(~keep, float("-inf"))
    elif attn_mask is not None and attn_mask.dtype == torch.bool:
        scores = scores.masked_fill(~attn_mask, float("-inf"))
    elif attn_mask is not None:
        scores = scores + attn_mask
    return torch.ops.aten._safe_softmax(scores, -1) @ v  # a fully masked row is 0, as in torch's own


def _number_tensor_keeps_its_value(func: Any, *args: Any, **kwargs: Any) -> Any:
    """`torch.tensor(number, device=x.device)` made on the CPU while tracing on the meta device, where it would
    have no value: a 0-d CPU tensor combines with tensors on any device as the number it holds, and the trace
    keeps it (`_scalar_constant`)."""
    import torch

    if args and isinstance(args[0], (bool, int, float)) and torch.device(kwargs.get("device") or "cpu").type == "meta":
        kwargs = {**kwargs, "device": "cpu"}
    return func(*args, **kwargs)


def probe(task_path: str, seed: int, symbolic: bool = True) -> dict:
    """The ReferenceAnalysis as JSON; `symbolic`: try the symbolic trace first (the held-out size sets, which only
    need the sizes, are traced concretely)."""
    import torch

    from activities.kernels._child import _load
    from activities.kernels.task_source import numeric_constants

    source = Path(task_path).read_text(encoding="utf-8")
    result: dict[str, Any] = {"constants": numeric_constants(source, Path(task_path).name)}
    task = _load(task_path, "fleetforge_task")
    try:
        with torch.device("meta"):
            torch.manual_seed(seed)
            model = task.Model(*task.get_init_inputs())
            inputs = list(task.get_inputs())
    except Exception as e:  # noqa: BLE001 - e.g. .item() or .cuda() in the task: it may still run for real
        meta_error = f"{type(e).__name__}: {' '.join(str(e).split())[:300]}"
        try:  # an .item() in the construction (a Swin block's drop-path rates): built for real, then made meta
            torch.manual_seed(seed)
            model = task.Model(*task.get_init_inputs()).to("meta")
            inputs = [x.to("meta") if isinstance(x, torch.Tensor) else x for x in task.get_inputs()]
        except Exception as e:  # noqa: BLE001 - a .cuda() on a CPU worker, say: the job still runs it for real
            result["trace_error"] = (f"the task could not be built on the meta device ({meta_error}) nor on the "
                                     f"CPU ({type(e).__name__}: {' '.join(str(e).split())[:200]})")
            return result
    state = {**dict(model.named_parameters()), **dict(model.named_buffers())}
    result["inputs"] = [
        {"kind": "tensor", "tensor": _spec(x)} if isinstance(x, torch.Tensor)
        else {"kind": "scalar", "value": x} if isinstance(x, (int, float, bool))
        else {"kind": "other"} for x in inputs]
    result["params"] = [{"name": k, "tensor": _spec(v)} for k, v in state.items()]
    result["input_bytes"] = sum(x.numel() * x.element_size() for x in inputs if isinstance(x, torch.Tensor))
    result["param_bytes"] = sum(v.numel() * v.element_size() for v in state.values())

    tensor_at = [i for i, x in enumerate(inputs) if isinstance(x, torch.Tensor)]
    sentinels = {SENTINEL + i / 1024: i for i, x in enumerate(inputs) if isinstance(x, float)}
    traced_args = list(inputs)
    for value, i in sentinels.items():
        traced_args[i] = value

    def forward(params: dict, tensors: list) -> Any:
        args = list(traced_args)
        for i, t in zip(tensor_at, tensors):
            args[i] = t
        with _trace_rewrites():
            return torch.func.functional_call(model, params, tuple(args))

    tensors = [inputs[i] for i in tensor_at]
    if symbolic and tensors:
        try:
            with torch.no_grad():
                graph, fakes = _trace(forward, state, tensors, symbolic=True)
            return _record(result, graph, names=list(state), tensor_at=tensor_at, sentinels=sentinels,
                           sizes=_sizes_of(graph, fakes, tensor_at))
        except Exception:  # noqa: BLE001 - what the symbolic trace cannot take, the concrete one may
            pass
    try:
        with torch.no_grad():
            graph, _ = _trace(forward, state, tensors, symbolic=False)
    except Exception as e:  # noqa: BLE001 - any failure to trace is reported, the job goes on without a template
        result["trace_error"] = f"{type(e).__name__}: {' '.join(str(e).split())[:300]}"
        return result
    return _record(result, graph, names=list(state), tensor_at=tensor_at, sentinels=sentinels, sizes=None)


def _sizes_of(graph: Any, fakes: list, tensor_at: list[int]) -> _Sizes:
    """The symbols the trace left free, each with the input size it stands for."""
    env = fakes[0].fake_mode.shape_env
    symbols: dict[str, dict] = {}
    for k, t in enumerate(fakes):
        for d, s in enumerate(t.shape):
            e = env.replace(s.node.expr) if hasattr(s, "node") else None
            if e is not None and getattr(e, "is_Symbol", False) and str(e.name) not in symbols:
                symbols[str(e.name)] = {"input": tensor_at[k], "dim": d}
    return _Sizes(env, symbols)


def _scalar_constant(graph: Any, target: str) -> bool | int | float | None:
    """The value of a 0-d tensor forward built from a number (`torch.tensor(0.5)`): the trace keeps it as an
    attribute of the traced module, not as a call, so its value is recorded here. Larger constants stay
    unread (the reader refuses them)."""
    import torch
    from torch._subclasses.fake_tensor import is_fake

    t = getattr(graph.owning_module, target, None)
    if isinstance(t, torch.Tensor) and t.dim() == 0 and not t.is_complex() and not t.is_meta and not is_fake(t):
        return t.item()
    return None


def _record(result: dict, graph: Any, *, names: list[str], tensor_at: list[int], sentinels: dict[float, int],
            sizes: _Sizes | None) -> dict:
    """The traced graph written into `result`: calls with JSON arguments, outputs, the size symbols."""
    refs: dict = {}
    placeholders = [n for n in graph.nodes if n.op == "placeholder"]
    for k, node in enumerate(placeholders):
        refs[node] = {"ref": "param", "index": k, "name": names[k]} if k < len(names) \
            else {"ref": "input", "index": tensor_at[k - len(names)]}
    calls: list[dict] = []
    for node in graph.nodes:
        if node.op == "call_function":
            op = "getitem" if node.target is operator.getitem else str(node.target)
            if sizes is not None and (op.startswith(SKIPPED) or _sizes_only(node)):
                continue  # size arithmetic, inlined where it is used, and guards
            calls.append({"op": op, "args": _json(list(node.args), refs, sentinels, sizes),
                          "kwargs": {k: _json(v, refs, sentinels, sizes) for k, v in node.kwargs.items()},
                          "out": _outs(node, sizes)})
            refs[node] = {"ref": "node", "index": len(calls) - 1}
        elif node.op == "get_attr":
            scalar = _scalar_constant(graph, node.target)
            calls.append({"op": f"get_attr {node.target}", "out": _outs(node, sizes),
                          "args": [] if scalar is None else [_json(scalar, refs, sentinels, sizes)]})
            refs[node] = {"ref": "node", "index": len(calls) - 1}
        elif node.op == "output":
            out = node.args[0]
            result["outputs"] = _json(list(out) if isinstance(out, (list, tuple)) else [out], refs, sentinels, sizes)
    result["calls"] = calls
    if sizes is not None:
        result["symbols"] = sizes.symbols
        result["specialized"] = {expr: value for expr, value in sizes.env.specialized.items()
                                 if not set(re.findall(r"[A-Za-z_]\w*", expr)) <= sizes.env.pinned}
    return result


def held_out_sizes(task_path: str, analysis: Any, seed: int) -> dict:
    """The held-out size set (`held_out.choose`), each candidate set traced here on the meta device from
    the task file rewritten with it (written next to the task: the probe's own scratch folder), and each
    size's model built there to see whether it changes the model's parameters."""
    import torch

    from activities.kernels import held_out
    from activities.kernels._child import _load
    from activities.kernels.task_source import apply_overrides
    from contracts.kernel_job import ReferenceAnalysis

    path = Path(task_path)
    source = path.read_text(encoding="utf-8")
    held = path.with_name("held_out_task.py")

    def trace(overrides: dict[str, int]) -> ReferenceAnalysis:
        held.write_text(apply_overrides(source, overrides, path.name), encoding="utf-8")
        try:
            return ReferenceAnalysis.model_validate(probe(str(held), seed, symbolic=False))
        except Exception as e:  # noqa: BLE001 - a size set the task cannot take is one not to use
            return ReferenceAnalysis(trace_error=f"{type(e).__name__}: {' '.join(str(e).split())[:200]}")

    def build(overrides: dict[str, int]) -> tuple[list, Any] | None:
        """(init inputs, model) of the task file rewritten with `overrides`, built on the meta device (no
        trace), or None when it cannot be built."""
        held.write_text(apply_overrides(source, overrides, path.name), encoding="utf-8")
        try:
            task = _load(str(held), "fleetforge_task_built")
            with torch.device("meta"):
                init = list(task.get_init_inputs())
                torch.manual_seed(seed)
                return init, task.Model(*init)
        except Exception:  # noqa: BLE001 - a size the model cannot be built with is tried (and refused) later
            return None

    def parameters(overrides: dict[str, int]) -> list[str] | None:
        """The names of the parameters and buffers the model has with `overrides`, or None when it cannot be
        built."""
        built = build(overrides)
        return None if built is None else [name for name, _ in (*built[1].named_parameters(), *built[1].named_buffers())]

    own = _load(task_path, "fleetforge_task_own_sizes")

    def reads_module(overrides: dict[str, int]) -> bool:
        """Whether the model the task file builds at `overrides` differs from the one the task's own model code
        (a candidate carries it at the task's sizes) builds from the same init inputs (held_out.module_settings)."""
        built = build(overrides)
        if built is None:
            return False
        init, model = built
        try:
            with torch.device("meta"):
                torch.manual_seed(seed)
                return _construction(own.Model(*init)) != _construction(model)
        except Exception:  # noqa: BLE001 - the task's own code cannot take these init inputs: neither could a candidate
            return True

    sizes, note = held_out.choose(source, analysis, trace, parameters, reads_module)
    return {"held_out": sizes, "held_out_note": note}


def _construction(model: Any) -> list[tuple]:
    """What a model's construction made, comparable across two builds: each parameter's and buffer's name, shape
    and dtype, and each submodule's plain tensor attributes (shape, dtype) and number or string attributes."""
    import torch

    made: list[tuple] = [(k, tuple(v.shape), str(v.dtype)) for k, v in (*model.named_parameters(),
                                                                         *model.named_buffers())]
    for prefix, module in model.named_modules():
        for k, v in vars(module).items():
            if isinstance(v, torch.Tensor):
                made.append((prefix, k, tuple(v.shape), str(v.dtype)))
            elif isinstance(v, (bool, int, float, str)):
                made.append((prefix, k, repr(v)))
    return made


def main(argv: list[str]) -> int:

    from contracts.kernel_job import ReferenceAnalysis

    task_path, out_path, seed = argv[0], argv[1], int(argv[2])
    analysis = ReferenceAnalysis.model_validate(probe(task_path, seed))
    if "--no-held-out" not in argv:  # each size set is another trace: a whole model's takes seconds
        analysis = analysis.model_copy(update=held_out_sizes(task_path, analysis, seed))
    Path(out_path).write_text(analysis.model_dump_json(), encoding="utf-8")
    return 0


if __name__ == "__main__":
    from activities.lifeline import die_with_parent, exit_now

    die_with_parent()
    exit_now(main(sys.argv[1:]))
