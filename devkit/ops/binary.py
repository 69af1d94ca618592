"""Binary and variadic elementwise ops, with ONNX multidirectional (NumPy)
broadcasting; PRelu broadcasts its slope to X only.

Integer results that ONNX leaves open are fixed here, for every plugin:
arithmetic wraps around (two's complement); Div truncates toward zero, x / 0
is 0 and INT_MIN / -1 wraps to INT_MIN; Mod's x % 0 is 0 (both fmod modes).
Pow's rules for integer bases are in its doc.
"""

from __future__ import annotations

import functools

import numpy as np

from . import testing as t
from .spec import (ALL, ALL_FLOAT, BOOL, F64, I32, I64, INT, NUMERIC, Attr, Case, Input, OpSpec,
                   Tolerance, broadcast_shapes, dtype_name, register, require_same_dtype)

# Every numeric dtype devkit arrays carry: ONNX Pow takes any of them as the exponent.
EXPONENT_DTYPES = NUMERIC + tuple(np.dtype(n) for n in ("int16", "uint16", "uint32", "uint64"))


# -- shape and dtype inference ------------------------------------------------------------

def _infer_broadcast(inputs, attrs):
    dtype = require_same_dtype(inputs, ["A", "B"])
    return [(broadcast_shapes(*(i.shape for i in inputs)), dtype)]


def _infer_compare(inputs, attrs):
    require_same_dtype(inputs, ["A", "B"])
    return [(broadcast_shapes(*(i.shape for i in inputs)), BOOL)]


def _infer_variadic(inputs, attrs):
    dtype = require_same_dtype(inputs)
    return [(broadcast_shapes(*(i.shape for i in inputs)), dtype)]


def _infer_mod(inputs, attrs):
    dtype = require_same_dtype(inputs, ["A", "B"])
    if t.is_float(dtype) and attrs["fmod"] == 0:
        raise ValueError(f"fmod=0 (integer modulo) is defined for integers only; {dtype_name(dtype)} "
                         "inputs need fmod=1")
    return [(broadcast_shapes(inputs[0].shape, inputs[1].shape), dtype)]


def _infer_pow(inputs, attrs):
    x, y = inputs
    if y.dtype not in EXPONENT_DTYPES:
        raise TypeError(f"Y has dtype {dtype_name(y.dtype)}; the exponent takes "
                        + ", ".join(dtype_name(d) for d in EXPONENT_DTYPES))
    return [(broadcast_shapes(x.shape, y.shape), x.dtype)]


def _infer_prelu(inputs, attrs):
    dtype = require_same_dtype(inputs, ["X", "slope"])
    x, slope = inputs
    try:
        fits = broadcast_shapes(x.shape, slope.shape) == tuple(x.shape)
    except ValueError:
        fits = False
    if not fits:
        raise ValueError(f"slope of shape {tuple(slope.shape)} does not broadcast to X's shape "
                         f"{tuple(x.shape)} (PRelu broadcasts slope to X only)")
    return [(tuple(x.shape), dtype)]


def _infer_where(inputs, attrs):
    condition, x, y = inputs
    if condition.dtype != BOOL:
        raise TypeError(f"condition has dtype {dtype_name(condition.dtype)}; it must be bool")
    dtype = require_same_dtype([x, y], ["X", "Y"])
    return [(broadcast_shapes(condition.shape, x.shape, y.shape), dtype)]


# -- references -----------------------------------------------------------------------------

def _int_div(a, b):
    """Division truncated toward zero; x / 0 = 0 and INT_MIN / -1 = INT_MIN."""
    a, b = np.broadcast_arrays(a, b)
    special = (b == 0) | (b == -1)
    safe = np.where(special, 1, b).astype(b.dtype)
    q = np.floor_divide(a, safe)
    q = q + ((a - q * safe != 0) & ((a < 0) != (safe < 0))).astype(q.dtype)
    q = np.where(b == -1, np.negative(a), q)  # np.negative wraps INT_MIN to itself
    return np.where(b == 0, 0, q).astype(a.dtype)


def _int_mod(a, b, fmod):
    """Remainder with the sign of the dividend (fmod=1) or of the divisor
    (fmod=0); x % 0 = 0 (and x % -1 = 0, where C's INT_MIN % -1 overflows)."""
    a, b = np.broadcast_arrays(a, b)
    special = (b == 0) | (b == -1)
    safe = np.where(special, 1, b).astype(b.dtype)
    r = np.fmod(a, safe) if fmod else np.mod(a, safe)
    return np.where(special, 0, r).astype(a.dtype)


def _mod_reference(inputs, attrs):
    a, b = inputs
    if a.dtype.kind == "f":
        return [np.fmod(a, b)]
    return [_int_mod(a, b, attrs["fmod"])]


def _int_power(x, y):
    """x ** y for integer y, wrapping around in x's dtype; a negative y gives
    1 / x ** -y truncated toward zero: 1 for x = 1, +-1 for x = -1, else 0."""
    x, y = np.broadcast_arrays(x, y)
    magnitude = y.astype(np.uint64)
    negative = y < 0
    magnitude = np.where(negative, np.uint64(0) - magnitude, magnitude)
    base, result = x.astype(np.uint64), np.ones(x.shape, np.uint64)
    while np.any(magnitude):
        result = np.where(magnitude & np.uint64(1), result * base, result)
        base = base * base
        magnitude = magnitude >> np.uint64(1)
    result = result.view(np.int64).astype(x.dtype)
    odd = (y % 2) != 0
    reciprocal = np.where(x == 1, 1, np.where(x == -1, np.where(odd, -1, 1), 0)).astype(x.dtype)
    return np.where(negative, reciprocal, result)


def _truncate_saturate(v, dtype):
    """float64 -> integer: truncated toward zero, saturated to the range, NaN -> 0."""
    info = np.iinfo(dtype)
    lo, hi = float(info.min), float(info.max)
    inside = np.where((v > lo) & (v < hi), v, 0.0).astype(dtype)
    return np.where(v >= hi, info.max, np.where(v <= lo, info.min, inside)).astype(dtype)


def _pow_reference(inputs, attrs):
    x, y = inputs
    if x.dtype.kind in "iu" and y.dtype.kind in "iu":
        return [_int_power(x, y)]
    # In extended precision (x87 long double where the platform has it), rounded
    # to float64: a reference more accurate than the float64 pow it checks.
    power = np.power(x.astype(np.longdouble), y.astype(np.longdouble)).astype(np.float64)
    return [power if x.dtype.kind == "f" else _truncate_saturate(power, x.dtype)]


# -- cases ------------------------------------------------------------------------------------

def _uniform(rng, dtype, low=-4.0, high=4.0):
    """A maker of random operands: make(*shape)."""
    return lambda *shape: t.random(rng, shape, dtype, low, high)


def _full_range(rng, dtype):
    info = np.iinfo(dtype)
    return _uniform(rng, dtype, info.min, info.max)


def _cross(values):
    """Every pair of values: (n, 1) against (1, n)."""
    return [values[:, None], values[None, :]]


def _broadcast_cases(dtype, rng, make_a, make_b=None, full_range=True):
    """The cases of a broadcasting binary op: operands from make_a(*shape) and
    make_b(*shape), size-1 broadcasting in every position, scalars, empty
    dims, sizes that cross vector and thread boundaries, the dtype's special
    values against each other and, for integers, random full-range values."""
    make_b = make_b or make_a
    cases = [
        Case("same_shape", [make_a(3, 4), make_b(3, 4)]),
        Case("broadcast_both", [make_a(3, 1, 5), make_b(1, 4, 1)]),
        Case("broadcast_rank", [make_a(2, 1, 4), make_b(3, 1)]),
        Case("scalar_tensor", [make_a(), make_b(2, 3)]),
        Case("tensor_scalar", [make_a(2, 3), make_b()]),
        Case("scalars", [make_a(), make_b()]),
        Case("empty", [make_a(2, 0, 1), make_b(4)]),
        Case("odd_sizes", [make_a(1031, 67), make_b(67)]),
        Case("large", [make_a(127, 1031), make_b(127, 1)]),
        Case("special_values", _cross(t.special_values(dtype))),
    ]
    if dtype in INT and full_range:
        full = _full_range(rng, dtype)
        cases.append(Case("full_range", [full(256), full(256)]))
    return cases


def _arith_cases(dtype, rng):
    return _broadcast_cases(dtype, rng, _uniform(rng, dtype))


def _compare_cases(dtype, rng):
    if t.is_float(dtype):  # halves in [-3, 3], so that ties are common
        make = lambda *shape: (rng.integers(-6, 7, shape) / 2).astype(dtype)  # noqa: E731
    else:
        make = _uniform(rng, dtype, -3, 3)
    return _broadcast_cases(dtype, rng, make)


def _bitwise_cases(dtype, rng):
    return _broadcast_cases(dtype, rng, _full_range(rng, dtype), full_range=False)


def _mod_cases(dtype, rng):
    cases = _broadcast_cases(dtype, rng, _uniform(rng, dtype))
    if t.is_float(dtype):
        for case in cases:
            case.attrs = {"fmod": 1}
        return cases
    # fmod=1 shares the loops' broadcasting with fmod=0; its semantics need only these.
    truncated = [case for case in _broadcast_cases(dtype, rng, _uniform(rng, dtype))
                 if case.name in ("same_shape", "broadcast_both", "special_values", "full_range")]
    for case in truncated:
        case.name += "_fmod1"
        case.attrs = {"fmod": 1}
    return cases + truncated


def _pow_cases(dtype, rng):
    if t.is_float(dtype):
        base = _uniform(rng, dtype, 0.0, 3.0)
        exponent = _uniform(rng, dtype, -3.0, 3.0)
        cases = _broadcast_cases(dtype, rng, base, exponent)
        # Integral exponents are where a negative base has a real power.
        cases.append(Case("negative_base", [_uniform(rng, dtype)(3, 4), _uniform(rng, dtype)(4).round()]))
    else:
        base = _uniform(rng, dtype, -6, 6)
        cases = _broadcast_cases(dtype, rng, base, _uniform(rng, dtype, 0, 6))
        cases += [
            Case("negative_exponent", [_uniform(rng, dtype, -3, 3)(7, 1), _uniform(rng, dtype, -4, -1)(1, 4)]),
            Case("wrap_around", [_uniform(rng, dtype, -1000, 1000)(64), _uniform(rng, dtype, 10, 40)(64)]),
            # Truncation toward zero, saturation both ways and NaN -> 0.
            Case("float_exponent_edges", [np.array([[-500], [-2], [0], [3], [700]], dtype),
                                          np.array([7.0, 8.0, 0.5, -0.5, np.inf, -np.inf, np.nan])]),
        ]
    for other in EXPONENT_DTYPES:
        if other != dtype:
            low = -2.0 if t.is_float(other) else -3
            cases.append(Case(f"exponent_{dtype_name(other)}", [base(3, 4), _uniform(rng, other, low, 3.0)(4)]))
    return cases


def _sum_tolerance(dtype, inputs, mean):
    """The error bound of the kernels' running sum, held in the dtype for
    three or more inputs: u * sum |partial sum| over the partial sums that get
    rounded (recursive summation; Mean adds its last input in float64), plus
    one ulp for the rounding of the result. float64 is exact: the reference
    sums in the same order."""
    if len(inputs) < 3 or dtype == F64:
        return None
    u = float(t.finfo(dtype).eps) / 2
    total = np.asarray(inputs[0], np.float64)
    bound = np.zeros(())
    for i, x in enumerate(inputs[1:], start=2):
        total = total + np.asarray(x, np.float64)
        if not (mean and i == len(inputs)):
            bound = bound + np.abs(total)
    scale = len(inputs) if mean else 1
    return Tolerance(atol=float(np.max(u * (bound + 2 * np.abs(total)), initial=0.0)) / scale)


def _variadic_cases(kind):
    """Cases of Max/Min ("extremum") and Sum/Mean ("sum"/"mean")."""

    def cases(dtype, rng):
        make = _uniform(rng, dtype)
        result = [
            Case("one_input", [make(3, 4)]),
            Case("two_inputs", [make(3, 4), make(3, 4)]),
            Case("broadcast_two", [make(3, 1, 5), make(1, 4, 1)]),
            Case("three_inputs", [make(3, 1, 5), make(4, 1), make(5)]),
            Case("scalars_and_tensor", [make(), make(2, 3), make()]),
            Case("nine_inputs", [make(2, 3) for _ in range(9)]),
            Case("empty", [make(0, 3), make(3), make(1, 3)]),
            Case("one_empty_input", [make(2, 0)]),
            Case("odd_sizes", [make(1031, 67), make(67)]),
            Case("large", [make(127, 1031), make(127, 1)]),
            Case("special_values", _cross(t.special_values(dtype))),
        ]
        if dtype in INT:
            full = _full_range(rng, dtype)
            result.append(Case("full_range", [full(256), full(256), full(256)]))
        if kind != "extremum":
            for case in result:
                case.tolerance = _sum_tolerance(dtype, case.inputs, kind == "mean")
        return result

    return cases


def _prelu_cases(dtype, rng):
    make = _uniform(rng, dtype)
    special = t.special_values(dtype)
    return [
        Case("same_shape", [make(3, 4, 5), make(3, 4, 5)]),
        Case("channel_slope", [make(2, 3, 4, 4), make(3, 1, 1)]),
        Case("last_dim_slope", [make(3, 4, 5), make(5)]),
        Case("size1_slope", [make(3, 4, 5), make(1, 4, 1)]),
        Case("scalar_slope", [make(3, 4), make()]),
        Case("scalars", [make(), make()]),
        Case("empty", [make(0, 3), make(3)]),
        Case("odd_sizes", [make(1031, 67), make(67)]),
        Case("large", [make(127, 1031), make(127, 1)]),
        Case("special_values", [np.repeat(special[:, None], special.size, axis=1), special]),
    ]


def _where_cases(dtype, rng):
    make = _uniform(rng, dtype)
    condition = lambda *shape: rng.random(shape) < 0.5  # noqa: E731
    special = t.special_values(dtype)
    return [
        Case("same_shape", [condition(3, 4), make(3, 4), make(3, 4)]),
        Case("broadcast_all", [condition(3, 1, 1), make(1, 4, 1), make(5)]),
        Case("broadcast_condition", [condition(4), make(3, 4), make(3, 1)]),
        Case("scalar_condition", [condition(), make(2, 3), make(2, 3)]),
        Case("scalar_values", [condition(2, 3), make(), make()]),
        Case("scalars", [condition(), make(), make()]),
        Case("empty", [condition(0, 3), make(3), make(1, 3)]),
        Case("odd_sizes", [condition(1031, 67), make(1031, 67), make(67)]),
        Case("large", [condition(127, 1031), make(127, 1031), make(127, 1)]),
        Case("special_values", [condition(special.size, special.size), *_cross(special)]),
    ]


# -- the specs -----------------------------------------------------------------------------------

ARITHMETIC = ALL_FLOAT + INT


def _binary(name, reference, doc, *, dtypes=ARITHMETIC, opset=14, cases=_arith_cases,
            infer=_infer_broadcast):
    return OpSpec(name=name, category="binary", opset=opset, inputs=(Input("A"), Input("B")),
                  outputs=("C",), dtypes=dtypes, infer=infer, cases=cases,
                  reference=lambda x, a: [reference(x[0], x[1])], doc=doc)


def _div(a, b):
    return np.divide(a, b) if a.dtype.kind == "f" else _int_div(a, b)


def _variadic(name, reference, kind, doc, dtypes=ARITHMETIC):
    return OpSpec(name=name, category="binary", opset=13, inputs=(Input("data_0", variadic=True),),
                  outputs=(name.lower(),), dtypes=dtypes, infer=_infer_variadic,
                  reference=lambda x, a: [reference(x)], cases=_variadic_cases(kind), doc=doc)


def _compare(name, function, opset, dtypes=NUMERIC):
    return _binary(name, function, f"C = {name}(A, B) elementwise, as bool; NaN compares false "
                   "(unequal to everything).", dtypes=dtypes, opset=opset, infer=_infer_compare,
                   cases=_compare_cases)


_POW_TOLERANCE = {"float32": Tolerance(ulp=1), "float64": Tolerance(ulp=1),
                  "float16": Tolerance(ulp=1), "bfloat16": Tolerance(ulp=1)}

register(
    _binary("Add", np.add, "C = A + B; integers wrap around."),
    _binary("Sub", np.subtract, "C = A - B; integers wrap around."),
    _binary("Mul", np.multiply, "C = A * B; integers wrap around."),
    _binary("Div", _div, "C = A / B. Integers truncate toward zero; x / 0 is 0 and "
            "INT_MIN / -1 wraps to INT_MIN."),
    OpSpec(name="Pow", category="binary", opset=15, inputs=(Input("X"), Input("Y")), outputs=("Z",),
           dtypes=ALL_FLOAT + (I32, I64), infer=_infer_pow, reference=_pow_reference, cases=_pow_cases,
           tolerance=_POW_TOLERANCE,
           doc="Z = X ** Y, in X's dtype; Y may have any numeric dtype. A floating X computes in "
               "float64 (pow) and rounds once. An integer X with an integer Y is exact, wrapping "
               "around; a negative Y gives 1 / X ** -Y truncated toward zero (1 for X = 1, +-1 for "
               "X = -1, otherwise 0, also for X = 0 as integer x / 0 is 0). An integer X with a "
               "floating Y computes in float64, truncates toward zero and saturates to X's range "
               "(NaN gives 0)."),
    OpSpec(name="Mod", category="binary", opset=13, inputs=(Input("A"), Input("B")), outputs=("C",),
           dtypes=ARITHMETIC, infer=_infer_mod, reference=_mod_reference, cases=_mod_cases,
           attrs=(Attr("fmod", "int", 0, choices=(0, 1)),),
           doc="C = A mod B. fmod=0 (integers only): the sign of the divisor, as Python's %; "
               "fmod=1: C's fmod, the sign of the dividend (required for floats). An integer "
               "x % 0 is 0."),
    _variadic("Max", lambda x: functools.reduce(np.maximum, x), "extremum",
              "Elementwise maximum of the inputs (one or more, broadcast together); NaN propagates."),
    _variadic("Min", lambda x: functools.reduce(np.minimum, x), "extremum",
              "Elementwise minimum of the inputs (one or more, broadcast together); NaN propagates."),
    _variadic("Sum", lambda x: functools.reduce(np.add, x), "sum",
              "Elementwise sum of the inputs (one or more, broadcast together), added in order.",
              dtypes=ALL_FLOAT),
    _variadic("Mean", lambda x: functools.reduce(np.add, x) / len(x), "mean",
              "Elementwise mean of the inputs (one or more, broadcast together): their sum in "
              "order, the last addition and the division in float64.", dtypes=ALL_FLOAT),
    _compare("Equal", np.equal, 19, dtypes=ALL),
    _compare("Less", np.less, 13),
    _compare("LessOrEqual", np.less_equal, 16),
    _compare("Greater", np.greater, 13),
    _compare("GreaterOrEqual", np.greater_equal, 16),
    _binary("And", np.logical_and, "C = A and B.", dtypes=(BOOL,), opset=13,
            infer=_infer_compare),
    _binary("Or", np.logical_or, "C = A or B.", dtypes=(BOOL,), opset=13,
            infer=_infer_compare),
    _binary("Xor", np.logical_xor, "C = A xor B.", dtypes=(BOOL,), opset=13,
            infer=_infer_compare),
    _binary("BitwiseAnd", np.bitwise_and, "C = A & B.", dtypes=INT, opset=18, cases=_bitwise_cases),
    _binary("BitwiseOr", np.bitwise_or, "C = A | B.", dtypes=INT, opset=18, cases=_bitwise_cases),
    _binary("BitwiseXor", np.bitwise_xor, "C = A ^ B.", dtypes=INT, opset=18, cases=_bitwise_cases),
    OpSpec(name="Where", category="binary", opset=16,
           inputs=(Input("condition"), Input("X"), Input("Y")), outputs=("output",), dtypes=ALL, key=1,
           infer=_infer_where, reference=lambda x, a: [np.where(x[0], x[1], x[2])], cases=_where_cases,
           doc="output = condition ? X : Y elementwise, the three broadcast together."),
    OpSpec(name="PRelu", category="binary", opset=16, inputs=(Input("X"), Input("slope")),
           outputs=("Y",), dtypes=ALL_FLOAT + (I32, I64), infer=_infer_prelu,
           reference=lambda x, a: [np.where(x[0] > 0, x[0], x[0] * x[1])], cases=_prelu_cases,
           doc="Y = X if X > 0 else X * slope, with slope broadcast to X's shape; integers wrap "
               "around."),
)
