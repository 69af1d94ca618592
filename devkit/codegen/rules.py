"""Expression rules: one per elementwise op, written once for every dialect.

A rule gets the printer ``p`` (printers.py), its operands as expressions of
the compute type (always plain variable names, so repeating one is free),
the op's attributes, the operands' dtypes and the output dtype, and returns
the output as an expression. Every dialect difference goes through ``p``.
The primitives of devkit.ops.PRIMITIVES come first; the others are the
non-primitive elementwise ops a plan keeps native kernels for.

REDUCTIONS are the reductions a fused group may hold: (initial value,
combine, finish) over the last axis.
"""

from __future__ import annotations

import math

import numpy as np


def _float(dtype) -> bool:
    return np.dtype(dtype).kind == "f"


def _nan_max(p, a, b):  # NaN propagates, as numpy.maximum and the op set's Max
    return f"(({a}) != ({a}) || ({a}) > ({b}) ? ({a}) : ({b}))"


def _nan_min(p, a, b):
    return f"(({a}) != ({a}) || ({a}) < ({b}) ? ({a}) : ({b}))"


def _fold(combine):
    """An n-ary op (Max, Min, Sum) as its binary rule folded left."""
    def rule(p, args, attrs, dtypes, out):
        result = args[0]
        for arg in args[1:]:
            result = combine(p, result, arg)
        return result
    return rule


def _math(name):
    return lambda p, args, attrs, dtypes, out: p.call(name, out, args[0])


def _sigmoid(p, x, out):
    """Through e^-|x|, which never overflows: 1 / (1 + e^-x) would give 0
    below x = -88.7, where the sigmoid is e^x, a subnormal."""
    one = p.literal(1, out)
    e = p.call("exp", out, f"-{p.call('fabs', out, x)}")
    return f"((({x}) >= 0 ? {one} : {e}) / ({one} + {e}))"


def _softplus(p, x, out):
    """max(x, 0) + log1p(e^-|x|): ln(1 + e^x) as written overflows to inf
    above x = 88.7 and, below, loses the bits of e^x that 1 + e^x rounds off."""
    zero = p.literal(0, out)
    tail = p.call("log1p", out, p.call("exp", out, f"-{p.call('fabs', out, x)}"))
    return f"((({x}) > {zero} ? ({x}) : {zero}) + {tail})"


def _cast(p, args, attrs, dtypes, out):
    if np.dtype(out).kind == "b":
        return f"(({args[0]}) != 0)"
    if np.dtype(dtypes[0]).kind == "f" and np.dtype(out).kind in "iu":  # saturating is not asked: C truncates
        return p.cast(p.call("trunc", dtypes[0], args[0]), out)
    return p.cast(args[0], out)


def _gelu(p, args, attrs, dtypes, out):
    x = args[0]
    half, one = p.literal(0.5, out), p.literal(1, out)
    if attrs.get("approximate", "none") == "tanh":
        inner = f"{p.literal(math.sqrt(2 / math.pi), out)} * (({x}) + {p.literal(0.044715, out)} * ({x}) * ({x}) * ({x}))"
        return f"({half} * ({x}) * ({one} + {p.call('tanh', out, inner)}))"
    return f"({half} * ({x}) * ({one} + {p.call('erf', out, f'({x}) * {p.literal(1 / math.sqrt(2), out)}')}))"


def _abs(p, args, attrs, dtypes, out):
    return p.call("fabs", out, args[0]) if _float(out) else f"(({args[0]}) < 0 ? -({args[0]}) : ({args[0]}))"


def _div(p, args, attrs, dtypes, out):
    return f"(({args[0]}) / ({args[1]}))"


def _pow(p, args, attrs, dtypes, out):
    return p.call("pow", out, args[0], p.cast(args[1], out))


RULES = {
    # primitives
    "Add": lambda p, a, attrs, d, out: f"(({a[0]}) + ({a[1]}))",
    "Mul": lambda p, a, attrs, d, out: f"(({a[0]}) * ({a[1]}))",
    "Div": _div,
    "Pow": _pow,
    "Exp": _math("exp"), "Log": _math("log"), "Sqrt": _math("sqrt"), "Sin": _math("sin"),
    "Cos": _math("cos"), "Atan": _math("atan"), "Erf": _math("erf"), "Floor": _math("floor"),
    "Equal": lambda p, a, attrs, d, out: f"(({a[0]}) == ({a[1]}))",
    "Less": lambda p, a, attrs, d, out: f"(({a[0]}) < ({a[1]}))",
    "Where": lambda p, a, attrs, d, out: f"(({a[0]}) ? ({a[1]}) : ({a[2]}))",
    "Cast": _cast,
    # the other elementwise ops
    "Sub": lambda p, a, attrs, d, out: f"(({a[0]}) - ({a[1]}))",
    "Neg": lambda p, a, attrs, d, out: f"(-({a[0]}))",
    "Abs": _abs,
    "Reciprocal": lambda p, a, attrs, d, out: f"({p.literal(1, out)} / ({a[0]}))",
    "Tanh": _math("tanh"), "Ceil": _math("ceil"),
    "Sigmoid": lambda p, a, attrs, d, out: _sigmoid(p, a[0], out),
    "Relu": lambda p, a, attrs, d, out: f"(({a[0]}) < 0 ? {p.literal(0, out)} : ({a[0]}))",
    "Gelu": _gelu,
    "Max": _fold(_nan_max), "Min": _fold(_nan_min),
    "Sum": _fold(lambda p, x, y: f"(({x}) + ({y}))"),
    "Greater": lambda p, a, attrs, d, out: f"(({a[0]}) > ({a[1]}))",
    "LessOrEqual": lambda p, a, attrs, d, out: f"(({a[0]}) <= ({a[1]}))",
    "GreaterOrEqual": lambda p, a, attrs, d, out: f"(({a[0]}) >= ({a[1]}))",
    "Not": lambda p, a, attrs, d, out: f"(!({a[0]}))",
    "And": lambda p, a, attrs, d, out: f"(({a[0]}) && ({a[1]}))",
    "Or": lambda p, a, attrs, d, out: f"(({a[0]}) || ({a[1]}))",
    "Xor": lambda p, a, attrs, d, out: f"((({a[0]}) != 0) != (({a[1]}) != 0))",
    "Identity": lambda p, a, attrs, d, out: a[0],
    # a scalar constant a decomposition made (fusion.expand): attrs["value"]
    "Constant": lambda p, a, attrs, d, out: p.literal(attrs["value"], out),
    "LeakyRelu": lambda p, a, attrs, d, out:
        f"(({a[0]}) < 0 ? {p.literal(attrs.get('alpha', 0.01), out)} * ({a[0]}) : ({a[0]}))",
    "Softplus": lambda p, a, attrs, d, out: _softplus(p, a[0], out),
}


# (initial accumulator, combine(acc, value), finish(acc, count)) per reduction.
REDUCTIONS = {
    "ReduceSum": (lambda p, dt: p.literal(0, dt), lambda p, acc, v: f"{acc} + ({v})", lambda p, acc, n, dt: acc),
    "ReduceMean": (lambda p, dt: p.literal(0, dt), lambda p, acc, v: f"{acc} + ({v})",
                   lambda p, acc, n, dt: f"({acc} / {p.literal(n, dt)})"),
    "ReduceMax": (lambda p, dt: p.literal(-np.inf, dt), lambda p, acc, v: _nan_max(p, v, acc),
                  lambda p, acc, n, dt: acc),
    "ReduceMin": (lambda p, dt: p.literal(np.inf, dt), lambda p, acc, v: _nan_min(p, v, acc),
                  lambda p, acc, n, dt: acc),
}
