"""Unary elementwise ops: math functions, activations, rounding, IsNaN and
IsInf, Clip, Not and BitwiseNot.

Conventions of the family:

- float16 and bfloat16 are computed in float32 and rounded once on store, so
  an op that rounds at all may be 1 ulp from the correctly rounded result
  there.
- Outside a function's domain the result is NaN (Log(-1), Acosh(0.5),
  Asin(2), ...), at its poles the matching infinity (Log(0) = -inf,
  Atanh(1) = inf); NaN inputs give NaN.
- At infinities every activation evaluates its ONNX formula as written, so
  the forms that multiply an infinity by zero give NaN, as the ONNX reference
  does: Gelu(-inf), HardSwish(-inf), Mish(-inf), Softsign(+-inf).
- Integer Abs and Neg wrap in two's complement, as NumPy does: Abs and Neg of
  INT_MIN give INT_MIN, and Neg on uint8 gives 256 - x (0 for 0).
- Float attributes are float32 in ONNX; the defaults below are those float32
  values.
"""

from __future__ import annotations

import math

import numpy as np

from . import testing as t
from .spec import (
    ALL_FLOAT,
    BOOL,
    EXACT,
    INT,
    Attr,
    Case,
    Input,
    OpSpec,
    TensorInfo,
    Tolerance,
    dtype_name,
    register,
)


def _f32(value: float) -> float:
    """``value`` rounded to float32, the precision of ONNX float attributes."""
    return float(np.float32(value))


def _infer_same(inputs: list[TensorInfo | None], attrs: dict):
    return [(inputs[0].shape, inputs[0].dtype)]


def _infer_bool(inputs: list[TensorInfo | None], attrs: dict):
    return [(inputs[0].shape, BOOL)]


# -- references ----------------------------------------------------------------------
#
# Floats arrive as float64. Where a kernel evaluates a formula in a rearranged
# but equivalent form (to avoid cancellation or overflow), the reference uses
# the same form, so both agree on the special values.

_erf = np.vectorize(math.erf, otypes=[np.float64])
_erfc = np.vectorize(math.erfc, otypes=[np.float64])


def _sigmoid(x):
    e = np.exp(-np.abs(x))
    return np.where(x >= 0, 1.0, e) / (1.0 + e)


def _softplus(x):
    return np.maximum(x, 0.0) + np.log1p(np.exp(-np.abs(x)))


def _gelu(x, attrs):
    if attrs["approximate"] == "tanh":
        u = math.sqrt(2.0 / math.pi) * (x + 0.044715 * x * x * x)
        return x / (1.0 + np.exp(-2.0 * u))
    return x * (0.5 * _erfc(-x * math.sqrt(0.5)))


def _is_inf(x, attrs):
    return ((x == np.inf) & bool(attrs["detect_positive"])) | ((x == -np.inf) & bool(attrs["detect_negative"]))


def _clip_reference(inputs, attrs):
    x = inputs[0]
    y = x
    for i, bound_op in ((1, np.maximum), (2, np.minimum)):
        if len(inputs) > i and inputs[i] is not None:
            bound = np.asarray(inputs[i]).reshape(())
            y = bound_op(y, bound.astype(x.dtype))
    return [y]


def _elementwise(fn):
    """A reference from a function of x (and the attributes)."""
    return lambda inputs, attrs: [fn(inputs[0], attrs)]


# -- cases -----------------------------------------------------------------------------

def _float_edges(dtype) -> np.ndarray:
    """Values that catch rounding shortcuts: ties and the largest value below 1/2
    (floor(x + 0.5) gets both wrong), and the largest non-integer tie, 2**p - 0.5."""
    nmant = t.finfo(dtype).nmant
    values = [0.5, 1.5, 2.5, -0.5, -1.5, -2.5, 0.5 - 2.0 ** -(nmant + 2), -(0.5 - 2.0 ** -(nmant + 2)),
              2.0 ** nmant - 0.5, -(2.0 ** nmant - 0.5), 2.0 ** nmant + 1, 1.0 - 2.0 ** -(nmant + 1)]
    return np.array(values).astype(dtype)


def _make_cases(domain, variants=(), edges=False):
    """Cases of a single-input op: random values inside ``domain`` (floats) or
    over the whole range (integers) in several shapes and sizes, the dtype's
    special values (out-of-domain ones included), and each attribute variant."""

    def cases(dtype, rng):
        if t.is_float(dtype):
            low, high = domain
        else:
            info = np.iinfo(dtype)
            low, high = info.min, info.max
        r = lambda *shape: t.random(rng, shape, dtype, low, high)
        special = t.special_values(dtype)
        if edges and t.is_float(dtype):
            special = np.concatenate([special, _float_edges(dtype)])
        result = [
            Case("random", [r(3, 1, 7)]),
            Case("scalar", [r()]),
            Case("empty", [r(2, 0, 3)]),
            Case("large", [r(1031, 67)]),
            Case("huge", [r(100_003)]),
            Case("special", [special]),
        ]
        for suffix, attrs in variants:
            result += [Case(f"random_{suffix}", [r(4, 9)], dict(attrs)),
                       Case(f"special_{suffix}", [special], dict(attrs))]
        return result

    return cases


def _predicate_cases(variants=()):
    def cases(dtype, rng):
        special = t.special_values(dtype)
        mixed = t.random(rng, (5, 40), dtype)
        picks = rng.integers(0, special.size, mixed.shape)
        mixed = np.where(rng.random(mixed.shape) < 0.5, special[picks], mixed).astype(dtype)
        large = np.resize(special, (331, 317))
        result = [Case("mixed", [mixed]), Case("scalar", [special[:1].reshape(())]),
                  Case("empty", [mixed[:0]]), Case("special", [special]), Case("large", [large])]
        for suffix, attrs in variants:
            result.append(Case(f"mixed_{suffix}", [mixed], dict(attrs)))
        return result

    return cases


def _bool_cases(dtype, rng):
    r = lambda *shape: t.random(rng, shape, dtype)
    return [Case("random", [r(3, 1, 7)]), Case("scalar", [r()]), Case("empty", [r(0, 4)]),
            Case("special", [t.special_values(dtype)]), Case("large", [r(1031, 67)]),
            Case("huge", [r(100_003)])]


# -- tolerances ------------------------------------------------------------------------
#
# In ulp of the output dtype, counted from the float64 reference rounded to
# it: the largest error measured (glibc's libm, over the conformance cases
# and 2-4 million random values per dtype across each function's domain)
# plus a margin of 1 ulp for composites. float64 also absorbs the error of
# NumPy's own float64 reference. float16/bfloat16 results are float32
# results rounded once more: 1 ulp.

def _tol(f32, f64, low=1, atol32=0.0, atol64=0.0):
    """float32, float64 and float16/bfloat16 tolerances; an atol (float32's
    also serves float16/bfloat16) covers where ulp are meaningless."""
    return {"float32": Tolerance(ulp=f32, atol=atol32), "float64": Tolerance(ulp=f64, atol=atol64),
            "float16": Tolerance(ulp=low, atol=atol32), "bfloat16": Tolerance(ulp=low, atol=atol32)}


# -- the ops ------------------------------------------------------------------------------

def _simple(name, opset, fn, tolerance, domain, doc, *, dtypes=ALL_FLOAT, edges=False):
    """An op Y = fn(X) without attributes; ``domain`` bounds its random inputs."""
    register(OpSpec(
        name=name, category="unary", opset=opset,
        inputs=(Input("X"),), outputs=("Y",), dtypes=dtypes,
        infer=_infer_same, reference=_elementwise(lambda x, a: fn(x)),
        cases=_make_cases(domain, edges=edges), tolerance=tolerance, doc=doc,
    ))


# Integer-capable arithmetic (exact everywhere: no rounding happens).
_simple("Abs", 13, np.abs, EXACT, (-4.0, 4.0),
        "Y = |X|; integer Abs(INT_MIN) wraps to INT_MIN.", dtypes=ALL_FLOAT + INT)
_simple("Neg", 13, np.negative, EXACT, (-4.0, 4.0),
        "Y = -X; integer Neg(INT_MIN) wraps to INT_MIN, uint8 Neg(x) is 256 - x (an extension: ONNX has no "
        "unsigned Neg).", dtypes=ALL_FLOAT + INT)

# libm functions. float16/bfloat16 get 1 ulp (a faithful float32 result
# rounded again); float32/float64 the measured glibc error plus margin.
_simple("Exp", 13, np.exp, _tol(1, 1), (-20.0, 20.0),
        "Y = e^X.")
_simple("Log", 13, np.log, _tol(1, 1), (0.0, 50.0),
        "Y = ln X; NaN for X < 0, -inf at 0.")
_simple("Sqrt", 13, np.sqrt, EXACT, (0.0, 100.0),
        "Y = sqrt(X), correctly rounded; NaN for X < 0.")
_simple("Reciprocal", 13, np.reciprocal, EXACT, (-8.0, 8.0),
        "Y = 1 / X, correctly rounded.")
_simple("Sin", 22, np.sin, _tol(1, 1), (-10.0, 10.0),
        "Y = sin X.")
_simple("Cos", 22, np.cos, _tol(1, 1), (-10.0, 10.0),
        "Y = cos X.")
_simple("Tan", 22, np.tan, _tol(1, 1), (-10.0, 10.0),
        "Y = tan X.")
_simple("Asin", 22, np.arcsin, _tol(1, 1), (-1.0, 1.0),
        "Y = asin X; NaN outside [-1, 1].")
_simple("Acos", 22, np.arccos, _tol(1, 1), (-1.0, 1.0),
        "Y = acos X; NaN outside [-1, 1].")
_simple("Atan", 22, np.arctan, _tol(1, 1), (-20.0, 20.0),
        "Y = atan X.")
_simple("Sinh", 22, np.sinh, _tol(2, 2), (-15.0, 15.0),
        "Y = sinh X.")
_simple("Cosh", 22, np.cosh, _tol(2, 2), (-15.0, 15.0),
        "Y = cosh X.")
_simple("Tanh", 13, np.tanh, _tol(2, 3), (-10.0, 10.0),
        "Y = tanh X.")
_simple("Asinh", 22, np.arcsinh, _tol(2, 2), (-50.0, 50.0),
        "Y = asinh X.")
_simple("Acosh", 22, np.arccosh, _tol(2, 2), (1.0, 50.0),
        "Y = acosh X; NaN below 1.")
_simple("Atanh", 22, np.arctanh, _tol(2, 2), (-1.0, 1.0),
        "Y = atanh X; NaN outside [-1, 1], +-inf at +-1.")
_simple("Erf", 13, _erf, _tol(2, 2), (-4.0, 4.0),
        "Y = erf X.")

# Composites: the error of several roundings (and of exp/log1p/tanh inside).
_simple("Sigmoid", 13, _sigmoid, _tol(3, 3), (-20.0, 20.0),
        "Y = 1 / (1 + e^-X), evaluated through e^-|X| so that neither tail overflows.")
_simple("Softplus", 22, _softplus, _tol(2, 4), (-20.0, 20.0),
        "Y = ln(1 + e^X), evaluated as max(X, 0) + log1p(e^-|X|).")
_simple("Softsign", 22, lambda x: x / (1.0 + np.abs(x)), _tol(2, 2), (-10.0, 10.0),
        "Y = X / (1 + |X|); NaN at +-inf (the formula's inf / inf).")
_simple("Mish", 22, lambda x: x * np.tanh(_softplus(x)), _tol(5, 5), (-10.0, 10.0),
        "Y = X tanh(softplus(X)); NaN at -inf (the formula's -inf * 0).")
_simple("HardSwish", 22, lambda x: x * (np.clip(x + 3.0, 0.0, 6.0) / 6.0), _tol(2, 2), (-5.0, 5.0),
        "Y = X max(0, min(1, X / 6 + 1/2)), evaluated as X (clamp(X + 3, 0, 6) / 6); NaN at -inf (the "
        "formula's -inf * 0).")

# Rounding: results are integers, representable in every float dtype.
_simple("Floor", 13, np.floor, EXACT, (-10.0, 10.0),
        "Y = floor X.", edges=True)
_simple("Ceil", 13, np.ceil, EXACT, (-10.0, 10.0),
        "Y = ceil X.", edges=True)
_simple("Round", 22, np.rint, EXACT, (-10.0, 10.0),
        "Y = X rounded to the nearest integer, halves to even.", edges=True)


register(OpSpec(
    name="Sign", category="unary", opset=13,
    inputs=(Input("X"),), outputs=("Y",), dtypes=ALL_FLOAT + INT,
    infer=_infer_same, reference=_elementwise(lambda x, a: np.sign(x)),
    cases=_make_cases((-4.0, 4.0)), tolerance=EXACT,
    doc="Y = -1, 0 or 1 by the sign of X; Sign(+-0) = +-0, Sign(NaN) = NaN.",
))

register(OpSpec(
    name="Relu", category="unary", opset=14,
    inputs=(Input("X"),), outputs=("Y",), dtypes=ALL_FLOAT + INT,
    infer=_infer_same, reference=_elementwise(lambda x, a: np.maximum(x, x.dtype.type(0))),
    cases=_make_cases((-4.0, 4.0)), tolerance=EXACT,
    doc="Y = max(X, 0); NaN stays NaN. uint8 Relu is the identity (an extension: ONNX has no unsigned Relu).",
))

register(OpSpec(
    name="LeakyRelu", category="unary", opset=16,
    inputs=(Input("X"),), outputs=("Y",), dtypes=ALL_FLOAT,
    attrs=(Attr("alpha", "float", _f32(0.01), doc="slope for X < 0"),),
    infer=_infer_same, reference=_elementwise(lambda x, a: np.where(x < 0, a["alpha"] * x, x)),
    cases=_make_cases((-4.0, 4.0), [("alpha", {"alpha": _f32(0.1)}), ("negative_alpha", {"alpha": -1.5})]),
    tolerance=_tol(0, 0),
    doc="Y = alpha X for X < 0, else X. Exact in float32/float64 for a float32 alpha (the product of two "
        "float32 values is exact in float64).",
))

register(OpSpec(
    name="HardSigmoid", category="unary", opset=22,
    inputs=(Input("X"),), outputs=("Y",), dtypes=ALL_FLOAT,
    attrs=(Attr("alpha", "float", _f32(0.2)), Attr("beta", "float", 0.5)),
    infer=_infer_same,
    reference=_elementwise(lambda x, a: np.clip(a["alpha"] * x + a["beta"], 0.0, 1.0)),
    cases=_make_cases((-5.0, 5.0), [("alpha_beta", {"alpha": 0.5, "beta": 0.25})]),
    # alpha X + beta cancels where it crosses 0: there the error is that of
    # rounding alpha X, at most half an ulp of |beta| (<= 0.5 in the cases).
    tolerance=_tol(2, 2, atol32=2.0 ** -25, atol64=2.0 ** -54),
    doc="Y = max(0, min(1, alpha X + beta)).",
))

register(OpSpec(
    name="Elu", category="unary", opset=22,
    inputs=(Input("X"),), outputs=("Y",), dtypes=ALL_FLOAT,
    attrs=(Attr("alpha", "float", 1.0),),
    infer=_infer_same, reference=_elementwise(lambda x, a: np.where(x < 0, a["alpha"] * np.expm1(x), x)),
    cases=_make_cases((-6.0, 4.0), [("alpha", {"alpha": 0.5})]),
    tolerance=_tol(2, 2),
    doc="Y = alpha (e^X - 1) for X < 0 (through expm1), else X.",
))

register(OpSpec(
    name="Selu", category="unary", opset=22,
    inputs=(Input("X"),), outputs=("Y",), dtypes=ALL_FLOAT,
    attrs=(Attr("alpha", "float", _f32(1.67326319217681884765625)),
           Attr("gamma", "float", _f32(1.05070102214813232421875))),
    infer=_infer_same,
    reference=_elementwise(lambda x, a: np.where(x > 0, a["gamma"] * x, a["gamma"] * (a["alpha"] * np.expm1(x)))),
    cases=_make_cases((-6.0, 4.0), [("alpha_gamma", {"alpha": 2.0, "gamma": 3.0})]),
    tolerance=_tol(3, 4),
    doc="Y = gamma alpha (e^X - 1) for X <= 0 (through expm1), else gamma X.",
))

register(OpSpec(
    name="Celu", category="unary", opset=13,
    inputs=(Input("X"),), outputs=("Y",), dtypes=ALL_FLOAT,
    attrs=(Attr("alpha", "float", 1.0, check=lambda v: "must not be 0" if v == 0 else None),),
    infer=_infer_same,
    reference=_elementwise(lambda x, a: np.where(x > 0, x, a["alpha"] * np.expm1(x / a["alpha"]))),
    cases=_make_cases((-6.0, 4.0), [("alpha", {"alpha": 2.0}), ("small_alpha", {"alpha": 0.25})]),
    tolerance=_tol(2, 2),
    doc="Y = max(0, X) + min(0, alpha (e^(X / alpha) - 1)) (Celu-12, unchanged to opset 23; ONNX defines "
        "float32 only, the other float dtypes are an extension).",
))

register(OpSpec(
    name="Gelu", category="unary", opset=20,
    inputs=(Input("X"),), outputs=("Y",), dtypes=ALL_FLOAT,
    attrs=(Attr("approximate", "string", "none", choices=("none", "tanh")),),
    infer=_infer_same, reference=_elementwise(_gelu),
    cases=_make_cases((-6.0, 6.0), [("tanh", {"approximate": "tanh"})]),
    # The negative tail is ill-conditioned (erfc(z) and e^-2u amplify the
    # rounding of their argument ~2z^2 and ~2|u| times; float32 reaches 184
    # ulp at x = -13), so an atol of half an ulp of 1 bounds the tiny values
    # there: wherever the error exceeds 2 ulp it stays below 2^-24 (measured
    # at most 4.5e-8 in float32).
    tolerance=_tol(2, 2, atol32=2.0 ** -24, atol64=2.0 ** -53),
    doc="approximate='none': Y = X/2 (1 + erf(X / sqrt 2)), evaluated as X erfc(-X / sqrt 2) / 2; "
        "'tanh': Y = X/2 (1 + tanh(sqrt(2/pi) (X + 0.044715 X^3))), evaluated as X / (1 + e^(-2u)). "
        "Both stay accurate in the negative tail; NaN at -inf (the formula's -inf * 0).",
))

register(OpSpec(
    name="IsNaN", category="unary", opset=20,
    inputs=(Input("X"),), outputs=("Y",), dtypes=ALL_FLOAT,
    infer=_infer_bool, reference=_elementwise(lambda x, a: np.isnan(x)),
    cases=_predicate_cases(), tolerance=EXACT,
    doc="Y (bool) = X is NaN.",
))

_detect = {"kind": "int", "default": 1, "choices": (0, 1)}
register(OpSpec(
    name="IsInf", category="unary", opset=20,
    inputs=(Input("X"),), outputs=("Y",), dtypes=ALL_FLOAT,
    attrs=(Attr("detect_negative", **_detect), Attr("detect_positive", **_detect)),
    infer=_infer_bool, reference=_elementwise(_is_inf),
    cases=_predicate_cases([("negative_only", {"detect_positive": 0}), ("positive_only", {"detect_negative": 0}),
                            ("neither", {"detect_negative": 0, "detect_positive": 0})]),
    tolerance=EXACT,
    doc="Y (bool) = X is +inf (if detect_positive) or -inf (if detect_negative).",
))

register(OpSpec(
    name="Not", category="unary", opset=13,
    inputs=(Input("X"),), outputs=("Y",), dtypes=(BOOL,),
    infer=_infer_same, reference=_elementwise(lambda x, a: np.logical_not(x)),
    cases=_bool_cases, tolerance=EXACT,
    doc="Y = not X (Not-1, unchanged to opset 23).",
))

register(OpSpec(
    name="BitwiseNot", category="unary", opset=18,
    inputs=(Input("X"),), outputs=("Y",), dtypes=INT,
    infer=_infer_same, reference=_elementwise(lambda x, a: np.invert(x)),
    cases=_make_cases(None), tolerance=EXACT,
    doc="Y = ~X (two's complement).",
))


# -- Clip --------------------------------------------------------------------------------

def _infer_clip(inputs: list[TensorInfo | None], attrs: dict):
    x = inputs[0]
    integer = np.dtype(x.dtype).kind in "iu"
    for name, bound in zip(("min", "max"), inputs[1:]):
        if bound is None:
            continue
        if bound.value.size != 1:
            raise ValueError(f"input '{name}' must be a scalar, got shape {bound.shape}")
        kind = "f" if t.is_float(bound.value.dtype) else bound.value.dtype.kind
        if kind not in ("iu" if integer else "iuf"):
            raise TypeError(f"input '{name}' has dtype {dtype_name(bound.value.dtype)}, which cannot bound "
                            f"an input of {dtype_name(x.dtype)}")
        if integer:
            info, value = np.iinfo(x.dtype), int(bound.value.reshape(()))
            if not info.min <= value <= info.max:
                raise ValueError(f"input '{name}' is {value}, outside the range of {dtype_name(x.dtype)}")
    return [(x.shape, x.dtype)]


def _clip_cases(dtype, rng):
    if t.is_float(dtype):
        low, high = -4.0, 4.0
        lo, hi = np.array(-1.5, dtype), np.array(2.25, dtype)
    else:
        info = np.iinfo(dtype)
        low, high = info.min, info.max
        span = int(info.max) - int(info.min)
        lo, hi = (np.array(int(info.min) + span // 4, dtype), np.array(int(info.max) - span // 8, dtype))
    r = lambda *shape: t.random(rng, shape, dtype, low, high)
    special = t.special_values(dtype)
    cases = [
        Case("random", [r(3, 1, 7), lo, hi]),
        Case("scalar", [r(), lo, hi]),
        Case("empty", [r(2, 0, 3), lo, hi]),
        Case("large", [r(1031, 67), lo, hi]),
        Case("huge", [r(100_003), lo, hi]),
        Case("special", [special, lo, hi]),
        Case("min_only", [r(4, 9), lo]),
        Case("max_only", [r(4, 9), None, hi]),
        Case("no_bounds", [r(4, 9)]),
        Case("min_above_max", [r(4, 9), hi, lo]),
        Case("bounds_shape_1", [r(4, 9), lo.reshape(1), hi.reshape(1)]),
    ]
    if t.is_float(dtype):
        cases += [Case("infinite_bounds", [special, np.array(-np.inf, dtype), np.array(np.inf, dtype)]),
                  Case("nan_bound", [r(4, 9), np.array(np.nan, dtype)])]
    else:
        info = np.iinfo(dtype)
        cases.append(Case("extreme_bounds", [special, np.array(info.min, dtype), np.array(info.max, dtype)]))
    return cases


register(OpSpec(
    name="Clip", category="unary", opset=13,
    inputs=(Input("input"), Input("min", optional=True, host=True), Input("max", optional=True, host=True)),
    outputs=("output",), dtypes=ALL_FLOAT + INT,
    infer=_infer_clip, reference=_clip_reference,
    cases=_clip_cases, tolerance=EXACT,
    doc="output = min(max(input, min), max); an omitted bound does not bind, a min above max gives max, "
        "NaN (input or bound) propagates. min and max are scalars (shape () or (1,)) read on the host; "
        "integer inputs take integer bounds inside their range, float inputs any numeric bound.",
))
