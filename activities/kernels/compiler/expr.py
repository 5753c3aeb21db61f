"""Each pointwise function as a Triton expression over its operands' expressions, computed in fp32: the one
op table the pointwise emitter uses (and `HELPERS`, the @triton.jit helpers some expressions call)."""

from __future__ import annotations

import math
from typing import Any

from activities.kernels.compiler.graph import Const

SIMPLE = {"exp": "tl.exp", "log": "tl.log", "sqrt": "tl.sqrt", "rsqrt": "tl.rsqrt", "abs": "tl.abs",
          "sin": "tl.sin", "cos": "tl.cos", "erf": "tl.math.erf", "exp2": "tl.exp2", "log2": "tl.log2",
          "floor": "tl.floor", "ceil": "tl.ceil", "sigmoid": "tl.sigmoid", "tanh": "_tanh"}
COMPARE = {"gt": ">", "lt": "<", "ge": ">=", "le": "<=", "eq": "==", "ne": "!="}

HELPERS = '''

@triton.jit
def _tanh(x):
    e = tl.exp(-2.0 * tl.abs(x))
    t = (1.0 - e) / (1.0 + e)
    return tl.where(x >= 0, t, -t)


@triton.jit
def _softplus(x, beta, threshold):
    return tl.where(x * beta > threshold, x, tl.log(1.0 + tl.exp(x * beta)) / beta)
'''


def maximum(a: str, b: str) -> str:
    """torch's max of two values: a NaN wins (Triton's default, like C's fmax, returns the other one), so relu,
    clamp, amax and max pooling give NaN where the reference does."""
    return f"tl.maximum({a}, {b}, propagate_nan=tl.PropagateNan.ALL)"


def minimum(a: str, b: str) -> str:
    """torch's min of two values: a NaN wins (see `maximum`)."""
    return f"tl.minimum({a}, {b}, propagate_nan=tl.PropagateNan.ALL)"


def extreme(fn: str, tile: str, axis: int) -> str:
    """torch's max or min (`fn`) of a tile along `axis`: NaN if a lane holds one. `tl.max` skips NaN, and a
    `tl.reduce` with a NaN-keeping combine runs element by element under the interpreter (13x slower)."""
    nan = f"tl.max(({tile} != {tile}).to(tl.int32), axis={axis}) > 0"
    return f"tl.where({nan}, float(\"nan\"), tl.{fn}({tile}, axis={axis}))"


def num(v: float) -> str:
    """A float as Python/Triton source (nan and infinities included)."""
    if v != v:
        return 'float("nan")'
    if v in (float("inf"), float("-inf")):
        return 'float("inf")' if v > 0 else '-float("inf")'
    return repr(float(v))


def expression(fn: str, attrs: dict[str, Any], a: list[str], args: list[Any]) -> str:
    """`fn` applied to operand expressions `a` (`args`: the graph values behind them, a Const for a number)."""
    x = a[0] if a else ""

    def attr(name: str, default: float) -> str:
        value = attrs.get(name, default)
        return num(float(value))

    if fn in SIMPLE:
        return f"{SIMPLE[fn]}({x})"
    if fn in COMPARE:
        return f"tl.where({a[0]} {COMPARE[fn]} {a[1]}, 1.0, 0.0)"
    match fn:
        case "copy":
            return x
        case "where":
            return f"tl.where({a[0]} != 0, {a[1]}, {a[2]})"
        case "xlogy":
            return f"tl.where({a[0]} == 0, 0.0, {a[0]} * tl.log({a[1]}))"
        case "log1p":
            return f"tl.log(1.0 + {x})"
        case "expm1":
            return f"(tl.exp({x}) - 1.0)"
        case "sign":
            return f"tl.where({x} > 0, 1.0, tl.where({x} < 0, -1.0, 0.0))"
        case "logical_not":
            return f"tl.where({x} == 0, 1.0, 0.0)"
        case "relu":
            return maximum(x, "0.0")
        case "neg":
            return f"-({x})"
        case "reciprocal":
            return f"1.0 / ({x})"
        case "silu":
            return f"{x} * tl.sigmoid({x})"
        case "hardsigmoid":
            return minimum(maximum(f"{x} / 6.0 + 0.5", "0.0"), "1.0")
        case "hardswish":
            return f"{x} * {minimum(maximum(f'{x} / 6.0 + 0.5', '0.0'), '1.0')}"
        case "mish":
            return f"{x} * _tanh(_softplus({x}, 1.0, 20.0))"
        case "gelu":
            if attrs.get("approximate") == "tanh":
                return f"0.5 * {x} * (1.0 + _tanh(0.7978845608028654 * ({x} + 0.044715 * {x} * {x} * {x})))"
            return f"0.5 * {x} * (1.0 + tl.math.erf({x} * 0.7071067811865476))"
        case "leaky_relu":
            return f"tl.where({x} > 0, {x}, {x} * {attr('negative_slope', 0.01)})"
        case "elu":
            return (f"{attr('scale', 1.0)} * tl.where({x} > 0, {x}, {attr('alpha', 1.0)} * "
                    f"(tl.exp({x} * {attr('input_scale', 1.0)}) - 1.0))")
        case "celu":
            alpha = attr("alpha", 1.0)
            return f"tl.where({x} > 0, {x}, {alpha} * (tl.exp({x} / {alpha}) - 1.0))"
        case "hardtanh":
            return minimum(maximum(x, attr("min_val", -1.0)), attr("max_val", 1.0))
        case "softplus":
            return f"_softplus({x}, {attr('beta', 1.0)}, {attr('threshold', 20.0)})"
        case "clamp":
            out = x
            if attrs.get("min") is not None:
                out = maximum(out, attr("min", 0.0))
            if attrs.get("max") is not None:
                out = minimum(out, attr("max", 0.0))
            return out
        case "add":
            return f"({a[0]} + {a[1]})"
        case "sub":
            return f"({a[0]} - {a[1]})"
        case "rsub":
            return f"({a[1]} - {a[0]})"
        case "mul":
            return f"({a[0]} * {a[1]})"
        case "div":
            return f"({a[0]} / {a[1]})"
        case "maximum":
            return maximum(a[0], a[1])
        case "minimum":
            return minimum(a[0], a[1])
        case "pow":
            return power(a, args)
    raise ValueError(f"no Triton expression for pointwise function {fn}")


def power(a: list[str], args: list[Any]) -> str:
    """base ** exp: small integer and half powers unrolled, else exp(e * log(base))."""
    base, exp = args
    if isinstance(exp, Const):
        e = exp.value
        if e == int(e) and abs(e) <= 4:
            if e == 0:
                return f"({a[0]} * 0.0 + 1.0)"
            prod = " * ".join([f"({a[0]})"] * int(abs(e)))
            return prod if e > 0 else f"1.0 / ({prod})"
        if e == 0.5:
            return f"tl.sqrt({a[0]})"
        if e == -0.5:
            return f"tl.rsqrt({a[0]})"
        return f"tl.exp({num(e)} * tl.log({a[0]}))"
    if isinstance(base, Const) and base.value > 0:
        return f"tl.exp({a[1]} * {num(math.log(base.value))})"
    return f"tl.exp({a[1]} * tl.log({a[0]}))"
