"""Elementwise ops: each becomes one `pw` node (its Triton expression is in `compiler.expr`); the emitter
fuses chains of them into the kernel of whoever consumes them."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from activities.kernels.compiler.graph import Const, Refused
from activities.kernels.compiler.registry import aten, lowers

if TYPE_CHECKING:
    from activities.kernels.compiler.reader import Call, Reader

UNARY: dict[str, tuple[str, list[tuple[str, Any]]]] = {
    "relu": ("relu", []), "sigmoid": ("sigmoid", []), "tanh": ("tanh", []), "exp": ("exp", []),
    "log": ("log", []), "sqrt": ("sqrt", []), "rsqrt": ("rsqrt", []), "abs": ("abs", []), "neg": ("neg", []),
    "reciprocal": ("reciprocal", []), "sin": ("sin", []), "cos": ("cos", []), "erf": ("erf", []),
    "exp2": ("exp2", []), "log2": ("log2", []), "floor": ("floor", []), "ceil": ("ceil", []),
    "silu": ("silu", []), "hardsigmoid": ("hardsigmoid", []), "hardswish": ("hardswish", []),
    "mish": ("mish", []), "log1p": ("log1p", []), "expm1": ("expm1", []),
    "sign": ("sign", []), "logical_not": ("logical_not", []),
    "gelu": ("gelu", [("approximate", "none")]),
    "leaky_relu": ("leaky_relu", [("negative_slope", 0.01)]),
    "elu": ("elu", [("alpha", 1.0), ("scale", 1.0), ("input_scale", 1.0)]),
    "celu": ("celu", [("alpha", 1.0)]),
    "hardtanh": ("hardtanh", [("min_val", -1.0), ("max_val", 1.0)]),
    "softplus": ("softplus", [("beta", 1.0), ("threshold", 20.0)]),
    "clamp": ("clamp", [("min", None), ("max", None)]),
    "clamp_min": ("clamp", [("min", None)]), "clamp_max": ("clamp", [("max", None)]),
}
"""aten op -> (our function, [(attribute, default), ...] read from the remaining args and kwargs)."""
BINARY = {"add": "add", "sub": "sub", "mul": "mul", "div": "div", "maximum": "maximum", "minimum": "minimum",
          "pow": "pow", "rsub": "rsub", "xlogy": "xlogy", "gt": "gt", "lt": "lt", "ge": "ge", "le": "le",
          "eq": "eq", "ne": "ne", "fmax": "maximum", "fmin": "minimum"}


@lowers(*(getattr(aten, op) for op in UNARY))
def unary(r: Reader, c: Call) -> int:
    name, spec = UNARY[c.op]
    values = {k: d for k, d in spec}
    for (k, _), v in zip(spec, c.args[1:]):
        values[k] = v
    values.update({k: v for k, v in c.kwargs.items() if k in values})
    for k, v in values.items():
        if isinstance(v, dict):
            if "float" not in v:
                raise Refused(f"{c.op}'s {k} comes from a tensor or an input at run time")
            values[k] = float(v["float"])
    if c.op == "gelu" and values.get("approximate") not in ("none", "tanh"):
        raise Refused(f"gelu approximate={values.get('approximate')!r}")
    return r.pw(name, [c.x()], c.shape, c.dtype, **values)


@lowers(*(getattr(aten, op) for op in BINARY))
def binary(r: Reader, c: Call) -> int:
    a, b = c.value(0), c.value(1)
    alpha = c.kwargs.get("alpha", c.args[2] if len(c.args) > 2 else 1)
    if c.op == "div" and c.kwargs.get("rounding_mode") is not None:
        raise Refused(f"div rounding_mode={c.kwargs.get('rounding_mode')!r}")
    if alpha != 1 and c.op in ("add", "sub", "rsub"):
        b = r.pw("mul", [b, Const(float(alpha))], r.shape(b))  # type: ignore[arg-type]
    return r.pw(BINARY[c.op], [a, b], c.shape, c.dtype)


@lowers(aten.where)
def where(r: Reader, c: Call) -> int:
    return r.pw("where", [c.value(0), c.value(1), c.value(2)], c.shape, c.dtype)


@lowers(aten._to_copy)
def to_copy(r: Reader, c: Call) -> int:
    """A dtype cast: a copy whose store converts (`.float()`, `.to(torch.float16)`)."""
    return r.pw("copy", [c.x()], c.shape, c.dtype)


@lowers(aten.masked_fill)
def masked_fill(r: Reader, c: Call) -> int:
    """x where the mask is off, the value where it is on (a causal mask from a registered buffer)."""
    return r.pw("where", [c.value(1), c.value(2), c.x()], c.shape, c.dtype)


@lowers(aten.bitwise_not)
def bitwise_not(r: Reader, c: Call) -> int:
    """~mask on a boolean tensor (integers' bitwise not is not lowered)."""
    if c.dtype != "bool":
        raise Refused(f"bitwise_not on {c.dtype} (only booleans are lowered)")
    return r.pw("logical_not", [c.x()], c.shape, c.dtype)
