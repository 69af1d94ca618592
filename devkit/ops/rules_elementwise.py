"""Decompositions of the unary and binary families into the primitive set.

Accuracy notes: expm1 and log1p are evaluated with Kahan's corrections
(``(e^x - 1) x / ln(e^x)`` and ``x ln(1 + x) / ((1 + x) - 1)``), which keep
them within a few ulp; the hyperbolic and inverse trigonometric functions
use the forms that avoid cancellation. Where a rule still rounds more often
than a kernel, its decomposition tolerance says by how much.
"""

from __future__ import annotations

import math

import numpy as np

from .spec import F64, Decomposition, Tolerance, set_decompositions


def _tol(ulp32, ulp64, atol32=0.0, atol64=0.0, low=1):
    return {"float32": Tolerance(ulp=ulp32, atol=atol32), "float64": Tolerance(ulp=ulp64, atol=atol64),
            "float16": Tolerance(ulp=low, atol=atol32), "bfloat16": Tolerance(ulp=low, atol=atol32)}


# -- helpers the rules share (plain functions over the builder, not ops) ----------------------

def neg(b, x):
    return b("Mul", x, b.const(-1, x.dtype))


def sub(b, x, y):
    return b("Sub", x, y)


def scale(b, x, factor):
    return b("Mul", x, b.const(factor, x.dtype))


def shift(b, x, amount):
    return b("Add", x, b.const(amount, x.dtype))


def select_negative(b, x, negative, other):
    """``negative`` where x < 0, else ``other``."""
    return b("Where", b("Less", x, b.const(0, x.dtype)), negative, other)


def expm1(b, x):
    """e^x - 1 without cancellation (Kahan): (u - 1) x / ln u for u = e^x."""
    u = b("Exp", x)
    um1 = shift(b, u, -1)
    corrected = b("Mul", um1, b("Div", x, b("Log", u)))
    exact_ends = b("Or", b("Equal", um1, b.const(0, x.dtype)), b("Equal", um1, b.const(-1, x.dtype)))
    exact_ends = b("Or", exact_ends, b("Equal", u, b.const(np.inf, x.dtype)))
    # u = 1: x itself; u = 0 or inf: u - 1 already is the answer.
    return b("Where", exact_ends, b("Where", b("Equal", um1, b.const(0, x.dtype)), x, um1), corrected)


def log1p(b, x):
    """ln(1 + x) without cancellation (Kahan): x ln u / (u - 1) for u = 1 + x."""
    u = shift(b, x, 1)
    um1 = shift(b, u, -1)
    corrected = b("Mul", b("Log", u), b("Div", x, um1))
    plain = b("Or", b("Equal", um1, b.const(0, x.dtype)), b("Equal", u, b.const(np.inf, x.dtype)))
    plain = b("Or", plain, b("Equal", u, b.const(0, x.dtype)))
    return b("Where", plain, b("Where", b("Equal", um1, b.const(0, x.dtype)), x, b("Log", u)), corrected)


_EXPM1 = ("Exp", "Add", "Mul", "Div", "Log", "Equal", "Or[bool]", "Where")
_LOG1P = ("Add", "Mul", "Div", "Log", "Equal", "Or[bool]", "Where")


def _with_sign(b, x, magnitude):
    """``magnitude`` (a function of |x|) given the sign of x."""
    return select_negative(b, x, neg(b, magnitude), magnitude)


def _one(rule, uses, **extra):
    return Decomposition(lambda b, xs, a: [rule(b, xs[0], a)], uses, **extra)


def _ab(rule, uses, **extra):
    return Decomposition(lambda b, xs, a: [rule(b, xs[0], xs[1], a)], uses, **extra)


# -- unary ------------------------------------------------------------------------------------

def _round(b, x, a):
    f = b("Floor", x)
    d = b("Sub", x, f)
    parity = b("Sub", f, scale(b, b("Floor", scale(b, f, 0.5)), 2))  # 1 for odd f
    half = b.const(0.5, x.dtype)
    up, down = shift(b, f, 1), b("Add", f, parity)
    r = b("Where", b("Less", half, d), up, b("Where", b("Less", d, half), f, down))
    return b("Where", b("Equal", f, x), x, r)  # integers and infinities as they are


def _is_inf(b, x, a):
    found = b("Less", x, x)  # all false, NaN included
    for flag, value in (("detect_positive", np.inf), ("detect_negative", -np.inf)):
        if a[flag]:
            found = b("Or", found, b("Equal", x, b.const(value, x.dtype)))
    return found


def _sigmoid(b, x, a):
    e = b("Exp", neg(b, b("Abs", x)))
    return b("Div", select_negative(b, x, e, b.const(1, x.dtype)), shift(b, e, 1))


def _softplus(b, x, a):
    return b("Add", b("Relu", x), log1p(b, b("Exp", neg(b, b("Abs", x)))))


def _tanh(b, x, a):
    t = expm1(b, scale(b, b("Abs", x), -2))
    return _with_sign(b, x, b("Div", neg(b, t), shift(b, t, 2)))


def _sinh(b, x, a):
    e = expm1(b, b("Abs", x))
    s = scale(b, b("Add", e, b("Div", e, shift(b, e, 1))), 0.5)
    s = b("Where", b("Equal", e, b.const(np.inf, x.dtype)), e, s)
    return _with_sign(b, x, s)


def _cosh(b, x, a):
    e = b("Exp", b("Abs", x))
    return scale(b, b("Add", e, b("Reciprocal", e)), 0.5)


def _asin(b, x, a):
    one = b.const(1, x.dtype)
    return b("Atan", b("Div", x, b("Sqrt", b("Mul", b("Sub", one, x), b("Add", one, x)))))


def _acos(b, x, a):
    one = b.const(1, x.dtype)
    return scale(b, b("Atan", b("Sqrt", b("Div", b("Sub", one, x), b("Add", one, x)))), 2)


def _atanh(b, x, a):
    ax = b("Abs", x)  # the odd function's positive half: log1p's argument stays above -1/2
    one = b.const(1, x.dtype)
    return _with_sign(b, x, scale(b, log1p(b, b("Div", scale(b, ax, 2), b("Sub", one, ax))), 0.5))


_BIG = 2.0 ** 28  # above it, sqrt(x^2 + 1) is |x| to the precision of float64


def _asinh(b, x, a):
    ax = b("Abs", x)
    sq = b("Mul", ax, ax)
    small = log1p(b, b("Add", ax, b("Div", sq, shift(b, b("Sqrt", shift(b, sq, 1)), 1))))
    large = shift(b, b("Log", ax), math.log(2))
    return _with_sign(b, x, b("Where", b("Less", ax, b.const(_BIG, x.dtype)), small, large))


def _acosh(b, x, a):
    t = shift(b, x, -1)
    near = log1p(b, b("Add", t, b("Sqrt", b("Mul", t, shift(b, t, 2)))))
    large = shift(b, b("Log", x), math.log(2))
    y = b("Where", b("Less", x, b.const(_BIG, x.dtype)), near, large)
    return b("Where", b("Less", x, b.const(1, x.dtype)), b.const(np.nan, x.dtype), y)


def _gelu(b, x, a):
    if a["approximate"] == "tanh":
        u = b("Mul", x, shift(b, scale(b, b("Mul", x, x), 0.044715), 1))
        u = scale(b, u, -2 * math.sqrt(2 / math.pi))
        return b("Div", x, shift(b, b("Exp", u), 1))
    erfc = b("Sub", b.const(1, x.dtype), b("Erf", scale(b, x, -math.sqrt(0.5))))
    return b("Mul", x, scale(b, erfc, 0.5))


def _clip(b, x, a):
    y = b("Identity", x)
    for name, op in (("min", "Max"), ("max", "Min")):
        if a.get(name) is not None:
            y = b(op, y, b.const(np.asarray(a[name]).reshape(()).astype(x.dtype)))
    return y


def _mish(b, x, a):
    return b("Mul", x, b("Tanh", b("Softplus", x)))


def _hard_swish(b, x, a):
    return b("Mul", x, b("Div", b("Clip", shift(b, x, 3), np.array(0.0), np.array(6.0)), b.const(6, x.dtype)))


def _hard_sigmoid(b, x, a):
    y = shift(b, scale(b, x, a["alpha"]), a["beta"])
    return b("Clip", y, np.array(0.0), np.array(1.0))


def _elu(b, x, a):
    return select_negative(b, x, scale(b, expm1(b, x), a["alpha"]), x)


def _selu(b, x, a):
    positive = b("Less", b.const(0, x.dtype), x)
    return b("Where", positive, scale(b, x, a["gamma"]), scale(b, scale(b, expm1(b, x), a["alpha"]), a["gamma"]))


def _celu(b, x, a):
    negative = scale(b, expm1(b, scale(b, x, 1 / a["alpha"])), a["alpha"])
    return b("Where", b("Less", b.const(0, x.dtype), x), x, negative)


def _sign(b, x, a):
    zero = b.const(0, x.dtype)
    negative = b("Where", b("Less", x, zero), b.const(-1, x.dtype), x)
    return b("Where", b("Less", zero, x), b.const(1, x.dtype), negative)


_ULP_ATOL = _tol(4, 4, 2.0 ** -24, 2.0 ** -53)
_HYPERBOLIC_REASON = "expm1/log1p through Kahan's corrections round a few more times than libm"

_UNARY = {
    "Neg": _one(lambda b, x, a: neg(b, x), ("Mul",), float32=()),
    "Abs": _one(lambda b, x, a: select_negative(b, x, neg(b, x), x), ("Mul", "Less", "Where"), float32=()),
    "Relu": _one(lambda b, x, a: select_negative(b, x, b.const(0, x.dtype), x), ("Less", "Where"), float32=()),
    "Sign": _one(_sign, ("Less", "Where"), float32=()),
    "Reciprocal": _one(lambda b, x, a: b("Div", b.const(1, x.dtype), x), ("Div",)),
    "Ceil": _one(lambda b, x, a: neg(b, b("Floor", neg(b, x))), ("Mul", "Floor"), float32=()),
    "Round": _one(_round, ("Floor", "Sub", "Mul", "Add", "Less", "Where", "Equal")),
    "IsNaN": _one(lambda b, x, a: b("Not", b("Equal", x, x)), ("Equal", "Not[bool]"), float32=()),
    "IsInf": _one(_is_inf, ("Less", "Equal", "Or[bool]"), float32=()),
    "Not": _one(lambda b, x, a: b("Where", x, b.const(False), b.const(True)), ("Where[bool]",)),
    "BitwiseNot": _one(lambda b, x, a: b("Sub", b.const(-1, x.dtype), x), ("Sub",)),
    "LeakyRelu": _one(lambda b, x, a: select_negative(b, x, scale(b, x, a["alpha"]), x), ("Mul", "Less", "Where")),
    "HardSigmoid": _one(_hard_sigmoid, ("Mul", "Add", "Clip")),
    "HardSwish": _one(_hard_swish, ("Add", "Clip", "Div", "Mul"),
                      tolerance=_tol(3, 3), reason="the division by 6 rounds once more than the kernel"),
    "Clip": _one(_clip, ("Identity", "Max", "Min"), float32=()),
    "Sigmoid": _one(_sigmoid, ("Abs", "Mul", "Exp", "Less", "Where", "Add", "Div")),
    "Softplus": _one(_softplus, ("Relu", "Abs", "Mul", "Exp", "Add") + _LOG1P,
                     tolerance=_tol(4, 6), reason=_HYPERBOLIC_REASON),
    "Softsign": _one(lambda b, x, a: b("Div", x, shift(b, b("Abs", x), 1)), ("Abs", "Add", "Div")),
    "Mish": _one(_mish, ("Mul", "Tanh", "Softplus"), tolerance=_tol(8, 8), reason=_HYPERBOLIC_REASON),
    "Tanh": _one(_tanh, ("Abs", "Mul", "Add", "Div", "Less", "Where") + _EXPM1,
                 tolerance=_tol(4, 4), reason=_HYPERBOLIC_REASON),
    "Sinh": _one(_sinh, ("Abs", "Add", "Div", "Mul", "Equal", "Where", "Less") + _EXPM1,
                 tolerance=_tol(4, 4), reason=_HYPERBOLIC_REASON),
    "Cosh": _one(_cosh, ("Exp", "Abs", "Add", "Reciprocal", "Mul"), tolerance=_tol(3, 3),
                 reason="e^|x| and its reciprocal round separately"),
    "Tan": _one(lambda b, x, a: b("Div", b("Sin", x), b("Cos", x)), ("Sin", "Cos", "Div"),
                tolerance=_tol(3, 3), reason="sin and cos round before the division"),
    "Asin": _one(_asin, ("Sub", "Add", "Mul", "Sqrt", "Div", "Atan"),
                 tolerance=_tol(4, 4), reason="atan(x / sqrt((1 - x)(1 + x))) rounds four times"),
    "Acos": _one(_acos, ("Sub", "Add", "Div", "Sqrt", "Atan", "Mul"),
                 tolerance=_tol(4, 4), reason="2 atan(sqrt((1 - x) / (1 + x))) rounds four times"),
    "Atanh": _one(_atanh, ("Abs", "Less", "Where", "Mul", "Sub", "Div") + _LOG1P, tolerance=_tol(4, 4), reason=_HYPERBOLIC_REASON),
    "Asinh": _one(_asinh, ("Abs", "Mul", "Add", "Sqrt", "Div", "Log", "Less", "Where") + _LOG1P,
                  tolerance=_tol(4, 4), reason=_HYPERBOLIC_REASON),
    "Acosh": _one(_acosh, ("Add", "Mul", "Sqrt", "Log", "Less", "Where") + _LOG1P,
                  tolerance=_tol(4, 4), reason=_HYPERBOLIC_REASON),
    "Gelu": _one(_gelu, ("Mul", "Add", "Exp", "Div", "Sub", "Erf"), tolerance=_tol(4, 4, 2.0 ** -21, 2.0 ** -49),
                 reason="erfc(z) as 1 - erf(z) cancels in the negative tail: an absolute error of a few "
                        "ulp of 1 there"),
    "Elu": _one(_elu, ("Mul", "Less", "Where") + _EXPM1, tolerance=_tol(4, 4), reason=_HYPERBOLIC_REASON),
    "Selu": _one(_selu, ("Mul", "Less", "Where") + _EXPM1, tolerance=_tol(5, 6), reason=_HYPERBOLIC_REASON),
    "Celu": _one(_celu, ("Mul", "Less", "Where") + _EXPM1, tolerance=_tol(4, 4), reason=_HYPERBOLIC_REASON),
}


# -- binary and variadic -------------------------------------------------------------------------

def _fold(b, xs, step):
    y = xs[0]
    for x in xs[1:]:
        y = step(b, y, x)
    return b("Identity", y) if len(xs) == 1 else y


def _max_step(b, x, y):
    keep = b("Less", y, x)
    if x.dtype.kind == "f" or x.dtype.name == "bfloat16":
        keep = b("Or", keep, b("IsNaN", x))
    return b("Where", keep, x, y)


def _min_step(b, x, y):
    keep = b("Less", x, y)
    if x.dtype.kind == "f" or x.dtype.name == "bfloat16":
        keep = b("Or", keep, b("IsNaN", x))
    return b("Where", keep, x, y)


def _extremum_uses(dtype):
    floating = np.dtype(dtype).kind == "f" or np.dtype(dtype).name == "bfloat16"
    return ("Identity", "Less", "Where") + (("IsNaN", "Or[bool]") if floating else ())


def _mean(b, xs, a):
    dtype = xs[0].dtype
    total = None
    for x in xs[:-1]:
        total = x if total is None else b("Add", total, x)
    if dtype != F64:  # the last addition and the division in float64, as the kernels do
        last = b("Cast", xs[-1], to=F64)
        total = last if total is None else b("Add", b("Cast", total, to=F64), last)
        return [b("Cast", b("Div", total, b.const(len(xs), F64)), to=dtype)]
    total = xs[-1] if total is None else b("Add", total, xs[-1])
    return [b("Div", total, b.const(len(xs), F64))]


def _bitwise_or(b, x, y, a):
    return b("Sub", b("Add", x, y), b("BitwiseAnd", x, y))


def _bitwise_xor(b, x, y, a):
    return b("Sub", b("Add", x, y), scale(b, b("BitwiseAnd", x, y), 2))


_BINARY = {
    "Sub": _ab(lambda b, x, y, a: b("Add", x, neg(b, y)), ("Add", "Mul"), float32=()),
    "Greater": _ab(lambda b, x, y, a: b("Less", y, x), ("Less",), float32=()),
    "LessOrEqual": _ab(lambda b, x, y, a: b("Or", b("Less", x, y), b("Equal", x, y)),
                       ("Less", "Equal", "Or[bool]"), float32=()),
    "GreaterOrEqual": _ab(lambda b, x, y, a: b("Or", b("Less", y, x), b("Equal", x, y)),
                          ("Less", "Equal", "Or[bool]"), float32=()),
    "And": _ab(lambda b, x, y, a: b("Where", x, y, b.const(False)), ("Where",)),
    "Or": _ab(lambda b, x, y, a: b("Where", x, b.const(True), y), ("Where",)),
    "Xor": _ab(lambda b, x, y, a: b("Where", x, b("Not", y), y), ("Where", "Not")),
    "BitwiseOr": _ab(_bitwise_or, ("Add", "Sub", "BitwiseAnd")),
    "BitwiseXor": _ab(_bitwise_xor, ("Add", "Sub", "BitwiseAnd", "Mul")),
    "PRelu": _ab(lambda b, x, s, a: b("Where", b("Less", b.const(0, x.dtype), x), x, b("Mul", x, s)),
                 ("Less", "Where", "Mul"), float32=()),
    "Max": Decomposition(lambda b, xs, a: [_fold(b, xs, _max_step)], _extremum_uses, float32=()),
    "Min": Decomposition(lambda b, xs, a: [_fold(b, xs, _min_step)], _extremum_uses, float32=()),
    "Sum": Decomposition(lambda b, xs, a: [_fold(b, xs, lambda b, x, y: b("Add", x, y))], ("Identity", "Add")),
    "Mean": Decomposition(_mean, lambda d: ("Add", "Div[float64]") + (
        () if np.dtype(d) == F64 else ("Cast", "Cast[float64]", "Add[float64]"))),
}

set_decompositions({**_UNARY, **_BINARY})
