"""Child-process probe: `python -m activities.kernels._probe TASK.py OUT.json SEED [--no-held-out]`.

Reads what a KernelBench-format task computes without computing it: builds `Model(*get_init_inputs())`
and `get_inputs()` on the meta device (shapes and dtypes, no memory), and traces `Model.forward` with
`make_fx` into aten ops. Parameters and buffers are traced as named inputs (`torch.func.functional_call`),
so a template can address them by name; a Python scalar input is traced as a sentinel value and its uses
come back as references to that input (the kernel takes it at run time, not the traced constant).
Then it chooses the held-out sizes (`held_out`: the task at a second size set, traced the same way).
Writes a ReferenceAnalysis (contracts.kernel_job) as JSON. Runs in a child (the task is user code):
the same limits as the verifier's children.
"""

from __future__ import annotations

import math
import operator
import sys
from pathlib import Path
from typing import Any

SENTINEL = 0.1234567891
"""Scalar input i is traced as SENTINEL + i / 1024 (a value no task uses by chance)."""


def _dtype(dt: Any) -> str:
    return str(dt).removeprefix("torch.")


def _spec(t: Any) -> dict:
    return {"shape": [int(s) for s in t.shape], "dtype": _dtype(t.dtype)}


def _json(value: Any, refs: dict, sentinels: dict[float, int]) -> Any:
    import torch
    import torch.fx

    if isinstance(value, torch.fx.Node):
        return refs[value]
    if isinstance(value, (list, tuple)):
        return [_json(v, refs, sentinels) for v in value]
    if isinstance(value, bool) or value is None or isinstance(value, (int, str)):
        return value
    if isinstance(value, float):
        if value in sentinels:
            return {"ref": "scalar", "index": sentinels[value]}
        return value if math.isfinite(value) else {"float": str(value)}
    if isinstance(value, torch.dtype):
        return {"dtype": _dtype(value)}
    return {"repr": repr(value)[:200]}


def _outs(node: Any) -> list[dict]:
    import torch

    val = node.meta.get("val")
    vals = val if isinstance(val, (list, tuple)) else [val]
    return [_spec(v) for v in vals if isinstance(v, torch.Tensor)]


def probe(task_path: str, seed: int) -> dict:
    import torch
    from torch.fx.experimental.proxy_tensor import make_fx

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
        result["trace_error"] = (f"the task could not be built on the meta device "
                                 f"({type(e).__name__}: {' '.join(str(e).split())[:300]})")
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
        return torch.func.functional_call(model, params, tuple(args))

    try:
        with torch.no_grad():
            graph = make_fx(forward)(state, [inputs[i] for i in tensor_at]).graph
    except Exception as e:  # noqa: BLE001 - any failure to trace is reported, the job goes on without a template
        result["trace_error"] = f"{type(e).__name__}: {' '.join(str(e).split())[:300]}"
        return result
    refs: dict = {}
    placeholders = [n for n in graph.nodes if n.op == "placeholder"]
    names = list(state)
    for k, node in enumerate(placeholders):
        refs[node] = {"ref": "param", "index": k, "name": names[k]} if k < len(names) \
            else {"ref": "input", "index": tensor_at[k - len(names)]}
    calls: list[dict] = []
    for node in graph.nodes:
        if node.op == "call_function":
            op = "getitem" if node.target is operator.getitem else str(node.target)
            calls.append({"op": op, "args": _json(list(node.args), refs, sentinels),
                          "kwargs": {k: _json(v, refs, sentinels) for k, v in node.kwargs.items()},
                          "out": _outs(node)})
            refs[node] = {"ref": "node", "index": len(calls) - 1}
        elif node.op == "get_attr":
            calls.append({"op": f"get_attr {node.target}", "out": _outs(node)})
            refs[node] = {"ref": "node", "index": len(calls) - 1}
        elif node.op == "output":
            out = node.args[0]
            result["outputs"] = _json(list(out) if isinstance(out, (list, tuple)) else [out], refs, sentinels)
    result["calls"] = calls
    return result


def held_out_sizes(task_path: str, analysis: Any, seed: int) -> dict:
    """The held-out size set (`held_out.choose`), each candidate set traced here on the meta device from
    the task file rewritten with it (written next to the task: the probe's own scratch folder)."""
    from activities.kernels import held_out
    from activities.kernels.task_source import apply_overrides
    from contracts.kernel_job import ReferenceAnalysis

    path = Path(task_path)
    source = path.read_text(encoding="utf-8")

    def trace(overrides: dict[str, int]) -> ReferenceAnalysis:
        held = path.with_name("held_out_task.py")
        held.write_text(apply_overrides(source, overrides, path.name), encoding="utf-8")
        try:
            return ReferenceAnalysis.model_validate(probe(str(held), seed))
        except Exception as e:  # noqa: BLE001 - a size set the task cannot take is one not to use
            return ReferenceAnalysis(trace_error=f"{type(e).__name__}: {' '.join(str(e).split())[:200]}")

    sizes, note = held_out.choose(source, analysis, trace)
    return {"held_out": sizes, "held_out_note": note}


def main(argv: list[str]) -> int:

    from contracts.kernel_job import ReferenceAnalysis

    task_path, out_path, seed = argv[0], argv[1], int(argv[2])
    analysis = ReferenceAnalysis.model_validate(probe(task_path, seed))
    if "--no-held-out" not in argv:  # each size set is another trace: a whole model's takes seconds
        analysis = analysis.model_copy(update=held_out_sizes(task_path, analysis, seed))
    Path(out_path).write_text(analysis.model_dump_json(), encoding="utf-8")
    return 0


if __name__ == "__main__":
    from activities.kernels._child import apply_limits, die_with_parent

    die_with_parent()
    apply_limits()
    sys.exit(main(sys.argv[1:]))
