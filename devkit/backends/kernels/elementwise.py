"""Kernels of devkit/ops/unary.py and binary.py: elementwise math, activations,
comparisons, logic, Pow, Mod, Where, Clip and the variadic Max/Min/Sum/Mean.

Two programs per dtype hold every kernel: the unary one (an input and an
output) and the binary one (two or three inputs), so a cold process compiles
at most two programs for a dtype whatever ops and shapes it runs. Attributes
reach the kernels as arguments, never as source.

Every input is read through its own strides over the output's shape (stride 0
where it broadcasts), so all kernels take strided and broadcast tensors; the
host merges the dimensions that every tensor steps through as one before the
launch. float32 computes in double where the device has fp64 (the prelude's
X_ct) and rounds once on store, which keeps the builtins' error inside the
spec's ulp tolerances; float16/bfloat16 compute in float. Pow and Mean's last
step compute in double wherever the device has it, as their specs say.

Integer semantics follow the specs (and the cpu plugin's kernels): arithmetic
wraps around in the unsigned type of the same width, x / 0 and x % 0 are 0,
INT_MIN / -1 wraps to INT_MIN, Abs and Neg of INT_MIN are INT_MIN.
"""

from __future__ import annotations

import dataclasses
import functools

import numpy as np

from ... import ops
from ...abi import C
from ...ops.spec import dtype_name
from ..support.boundary import invalid
from .elementwise_tan import TAN_F64
from .layer import (
    DeviceLimits,
    STRIDED,
    Call,
    ClType,
    Tensor,
    broadcast_strides,
    cl_type,
    launch_items,
    prelude,
)

# -- formulas ---------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class _Formula:
    """One op's result as an OpenCL C expression per dtype kind, of the loaded
    operands (x for unary ops; a, b for binary ones) in the compute type X_ct,
    and of the kernel arguments ``params`` ((OpenCL type, name) pairs)."""

    float: str | None = None
    int: str | None = None   # signed and unsigned integers
    bool: str | None = None
    out: str = "X"           # the output's prelude: X (the input dtype) or B (bool)
    params: tuple[tuple[str, str], ...] = ()

    def expression(self, t: ClType) -> str | None:
        return {"float": self.float, "bool": self.bool}.get(t.kind, self.int)


_WRAP_NEG = "(X_t)((X_U)0 - (X_U)x)"  # two's complement: -INT_MIN is INT_MIN

_UNARY = {
    "Abs": _Formula(float="fabs(x)", int=f"x < 0 ? {_WRAP_NEG} : x"),
    "Neg": _Formula(float="-x", int=_WRAP_NEG),
    "Exp": _Formula(float="exp(x)"),
    "Log": _Formula(float="log(x)"),
    "Sqrt": _Formula(float="sqrt(x)"),
    "Reciprocal": _Formula(float="1 / x"),
    "Sin": _Formula(float="sin(x)"),
    "Cos": _Formula(float="cos(x)"),
    "Tan": _Formula(float="dk_tan(x)"),
    "Asin": _Formula(float="asin(x)"),
    "Acos": _Formula(float="acos(x)"),
    "Atan": _Formula(float="atan(x)"),
    "Sinh": _Formula(float="sinh(x)"),
    "Cosh": _Formula(float="cosh(x)"),
    "Tanh": _Formula(float="tanh(x)"),
    "Asinh": _Formula(float="asinh(x)"),
    "Acosh": _Formula(float="acosh(x)"),
    "Atanh": _Formula(float="atanh(x)"),
    "Erf": _Formula(float="erf(x)"),
    "Floor": _Formula(float="floor(x)"),
    "Ceil": _Formula(float="ceil(x)"),
    "Round": _Formula(float="rint(x)"),  # halves to even in the default rounding mode
    # Keeps NaN and the sign of zero.
    "Sign": _Formula(float="x > 0 ? (X_ct)1 : x < 0 ? (X_ct)-1 : x", int="(X_t)((x > 0) - (x < 0))"),
    "Relu": _Formula(float="x < 0 ? (X_ct)0 : x", int="x < 0 ? (X_t)0 : x"),
    "LeakyRelu": _Formula(float="x < 0 ? alpha * x : x", params=(("X_ct", "alpha"),)),
    "Sigmoid": _Formula(float="dk_sigmoid(x)"),
    "HardSigmoid": _Formula(float="dk_hard_sigmoid(x, alpha, beta)",
                            params=(("X_ct", "alpha"), ("X_ct", "beta"))),
    "HardSwish": _Formula(float="dk_hard_swish(x)"),
    "Elu": _Formula(float="x < 0 ? alpha * expm1(x) : x", params=(("X_ct", "alpha"),)),
    "Selu": _Formula(float="x > 0 ? gamma * x : gamma * (alpha * expm1(x))",
                     params=(("X_ct", "alpha"), ("X_ct", "gamma"))),
    "Celu": _Formula(float="x > 0 ? x : alpha * expm1(x / alpha)", params=(("X_ct", "alpha"),)),
    "Gelu": _Formula(float="dk_gelu(x)"),
    "GeluTanh": _Formula(float="dk_gelu_tanh(x)"),  # Gelu with approximate="tanh"
    "Softplus": _Formula(float="dk_softplus(x)"),
    "Softsign": _Formula(float="x / (1 + fabs(x))"),
    "Mish": _Formula(float="x * tanh(dk_softplus(x))"),
    "Clip": _Formula(float="dk_clip(x, lo, hi)", int="dk_clip(x, lo, hi)",
                     params=(("X_ct", "lo"), ("X_ct", "hi"))),
    "IsNaN": _Formula(float="isnan(x)", out="B"),
    "IsInf": _Formula(float="(x == INFINITY && detect_positive) || (x == -INFINITY && detect_negative)",
                      out="B", params=(("int", "detect_negative"), ("int", "detect_positive"))),
    "Not": _Formula(bool="!x"),
    "BitwiseNot": _Formula(int="(X_t)~x"),
}


def _wrap(op: str) -> str:
    return f"(X_t)((X_U)a {op} (X_U)b)"


def _compare(op: str) -> _Formula:
    return _Formula(float=f"a {op} b", int=f"a {op} b", out="B")


_BINARY = {
    "Add": _Formula(float="a + b", int=_wrap("+")),
    "Sub": _Formula(float="a - b", int=_wrap("-")),
    "Mul": _Formula(float="a * b", int=_wrap("*")),
    "Div": _Formula(float="a / b", int="dk_div(a, b)"),
    # Float Mod is fmod=1 only (the host refuses fmod=0 for floats); integer
    # fmod=0 takes the divisor's sign and fmod=1 (ModTrunc) the dividend's.
    "Mod": _Formula(float="fmod(a, b)", int="dk_mod(a, b)"),
    "ModTrunc": _Formula(int="dk_rem(a, b)"),
    "PRelu": _Formula(float="a > 0 ? a : a * b", int=f"a > 0 ? a : {_wrap('*')}"),
    "Max": _Formula(float="dk_max(a, b)", int="a > b ? a : b"),
    "Min": _Formula(float="dk_min(a, b)", int="a < b ? a : b"),
    # Mean's last step: the last addition and the division in double.
    "MeanLast": _Formula(float="((dk_wide)a + (dk_wide)b) / count", params=(("dk_wide", "count"),)),
    "Equal": _Formula(float="a == b", int="a == b", bool="(a != 0) == (b != 0)", out="B"),
    "Less": _compare("<"),
    "LessOrEqual": _compare("<="),
    "Greater": _compare(">"),
    "GreaterOrEqual": _compare(">="),
    "And": _Formula(bool="a && b"),
    "Or": _Formula(bool="a || b"),
    "Xor": _Formula(bool="(a != 0) != (b != 0)"),
    "BitwiseAnd": _Formula(int="a & b"),
    "BitwiseOr": _Formula(int="a | b"),
    "BitwiseXor": _Formula(int="a ^ b"),
}

# Kernels that are variants or steps of an op, by the op whose spec lists their dtypes.
_SPEC_OF = {"GeluTanh": "Gelu", "ModTrunc": "Mod", "MeanLast": "Mean"}

_VARIADIC = ("Max", "Min", "Sum", "Mean")

# Pow's exponent may have any numeric dtype: its kind (the index here) picks the
# load. Floats come first, then signed and unsigned integers (see dk_pow_int).
_EXPONENTS = {
    C.DK_DTYPE_FLOAT32: "((global const float *)p)[i]",
    C.DK_DTYPE_FLOAT64: "((global const double *)p)[i]",
    C.DK_DTYPE_FLOAT16: "vload_half(i, (global const half *)p)",
    C.DK_DTYPE_BFLOAT16: "dk_bf16_load(((global const ushort *)p)[i])",
    C.DK_DTYPE_INT8: "((global const char *)p)[i]",
    C.DK_DTYPE_INT16: "((global const short *)p)[i]",
    C.DK_DTYPE_INT32: "((global const int *)p)[i]",
    C.DK_DTYPE_INT64: "((global const long *)p)[i]",
    C.DK_DTYPE_UINT8: "((global const uchar *)p)[i]",
    C.DK_DTYPE_UINT16: "((global const ushort *)p)[i]",
    C.DK_DTYPE_UINT32: "((global const uint *)p)[i]",
    C.DK_DTYPE_UINT64: "((global const ulong *)p)[i]",
}
_EXPONENT_KIND = {key: kind for kind, key in enumerate(_EXPONENTS)}
_FIRST_SIGNED, _FIRST_UNSIGNED = 4, 8
# A device without doubles reads a float64 exponent from its bits, rounded to float.
_DOUBLE_BITS_LOAD = "dk_float_of_double(((global const ulong *)p)[i])"
_FLOAT_OF_DOUBLE = """
inline float dk_float_of_double(ulong bits) {
  int e = (int)(bits >> 52) & 0x7ff;
  ulong m = bits & 0xfffffffffffffUL;
  float magnitude = e == 0x7ff ? (m ? NAN : INFINITY)
                               : ldexp((float)(e ? m | 0x10000000000000UL : m), max(e, 1) - 1075);
  return bits >> 63 ? -magnitude : magnitude;
}
"""


# -- OpenCL C --------------------------------------------------------------------------

_COMMON = """
/* Offsets of row-major index i of the output's shape (meta[0, ndim)) in each of
 * `count` tensors, whose strides over that shape follow in meta, ndim each.
 * What is left of i after the inner dims is the outermost dim's index, so a
 * one-dim layout (the host merges compact ones into one) divides nothing. */
inline void dk_offsets(long i, int ndim, global const long *meta, int count, long *offsets) {
  for (int t = 0; t < count; ++t) offsets[t] = 0;
  for (int d = ndim - 1; d > 0; --d) {
    long k = i % meta[d];
    i /= meta[d];
    for (int t = 0; t < count; ++t) offsets[t] += k * meta[(t + 1) * ndim + d];
  }
  if (ndim > 0)
    for (int t = 0; t < count; ++t) offsets[t] += i * meta[(t + 1) * ndim];
}
"""

# NaN propagates through every formula, and the activations evaluate their
# ONNX formulas as written at infinities (the x * 0 forms give NaN there).
_FLOAT_HELPERS = """
/* max(x, lo), then min(., hi), NaN (input or bound) propagating as NumPy's
 * clip does; a lo above hi gives hi. */
inline X_ct dk_clip(X_ct x, X_ct lo, X_ct hi) {
  X_ct y = (isnan(x) || x >= lo) ? x : lo;
  return (isnan(y) || y <= hi) ? y : hi;
}
/* exp(-|x|) never overflows, so the tails keep their tiny values. */
inline X_ct dk_sigmoid(X_ct x) {
  X_ct e = exp(-fabs(x));
  return (x >= 0 ? (X_ct)1 : e) / (1 + e);
}
inline X_ct dk_hard_sigmoid(X_ct x, X_ct alpha, X_ct beta) {
  X_ct y = alpha * x + beta;
  y = y < 0 ? (X_ct)0 : y;
  return y > 1 ? (X_ct)1 : y;
}
/* x + 3 is exact where the clamp is open; dividing first cannot overflow. */
inline X_ct dk_hard_swish(X_ct x) {
  X_ct y = x + 3;
  y = y < 0 ? (X_ct)0 : y;
  y = y > 6 ? (X_ct)6 : y;
  return x * (y / 6);
}
inline X_ct dk_softplus(X_ct x) { return (x > 0 ? x : (X_ct)0) + log1p(exp(-fabs(x))); }
/* x/2 (1 + erf(x / sqrt 2)) = x erfc(-x / sqrt 2) / 2 and x/2 (1 + tanh u) =
 * x / (1 + e^-2u): neither cancels for x < 0. */
inline X_ct dk_gelu(X_ct x) { return x * ((X_ct)0.5 * erfc(-x * (X_ct)0.70710678118654752440)); }
inline X_ct dk_gelu_tanh(X_ct x) {
  X_ct u = (X_ct)0.79788456080286535588 * (x + (X_ct)0.044715 * x * x * x);
  return x / (1 + exp(-2 * u));
}
/* IEEE 754-2019 maximum/minimum: NaN propagates and -0 < +0, so the result
 * does not depend on the operand order. */
inline X_ct dk_max(X_ct a, X_ct b) {
  if (isnan(a) || isnan(b)) return a + b;
  if (a == b) return signbit(a) ? b : a;
  return a > b ? a : b;
}
inline X_ct dk_min(X_ct a, X_ct b) {
  if (isnan(a) || isnan(b)) return a + b;
  if (a == b) return signbit(a) ? a : b;
  return a < b ? a : b;
}
"""

# Where C leaves integer division undefined the specs define it: x / 0 = x % 0
# = 0, INT_MIN / -1 wraps and INT_MIN % -1 is 0. dk_rem takes the dividend's
# sign (C's %), dk_mod the divisor's (Python's %).
_SIGNED_HELPERS = """
inline X_t dk_div(X_t a, X_t b) {
  return b == 0 ? (X_t)0 : b == -1 ? (X_t)((X_U)0 - (X_U)a) : (X_t)(a / b);
}
inline X_t dk_rem(X_t a, X_t b) { return b == 0 || b == -1 ? (X_t)0 : (X_t)(a % b); }
inline X_t dk_mod(X_t a, X_t b) {
  X_t r = dk_rem(a, b);
  return r != 0 && (r < 0) != (b < 0) ? (X_t)(r + b) : r;
}
"""
_UNSIGNED_HELPERS = """
/* Without signs both remainders agree. */
inline X_t dk_div(X_t a, X_t b) { return b == 0 ? (X_t)0 : (X_t)(a / b); }
inline X_t dk_rem(X_t a, X_t b) { return b == 0 ? (X_t)0 : (X_t)(a % b); }
#define dk_mod dk_rem
"""
_INT_CLIP = """
inline X_t dk_clip(X_t x, X_t lo, X_t hi) {
  X_t y = x < lo ? lo : x;
  return y > hi ? hi : y;
}
"""


def _exponent_loads(fp64: bool) -> str:
    """dk_exponent(p, i, kind) for Pow, as dk_wide; dk_exponent_bits for the
    integer kinds, sign-extended (signed) or zero-extended (unsigned)."""
    floats, ints = [], []
    for key, load in _EXPONENTS.items():
        kind = _EXPONENT_KIND[key]
        if key == C.DK_DTYPE_FLOAT64 and not fp64:
            load = _DOUBLE_BITS_LOAD
        floats.append(f"    case {kind}: return {load};")
        if kind >= _FIRST_SIGNED:
            ints.append(f"    case {kind}: return (long){load};")
    floats, ints = "\n".join(floats), "\n".join(ints)
    return ("" if fp64 else _FLOAT_OF_DOUBLE) + f"""
inline dk_wide dk_exponent(global const uchar *p, long i, int kind) {{
  switch (kind) {{
{floats}
  }}
  return NAN;
}}
inline long dk_exponent_bits(global const uchar *p, long i, int kind) {{
  switch (kind) {{
{ints}
  }}
  return 0;
}}
"""


# An integer base: x ** e exact and wrapping for an integer e, and 1 / x ** -e
# truncated toward zero for a negative one (1 for x = 1, +-1 for x = -1, else 0,
# as an integer x / 0 is 0); a floating e computes in dk_wide, truncates toward
# zero and saturates (NaN gives 0).
_POW_INT = """
inline X_t dk_pow_int(X_t x, global const uchar *p, long i, int kind) {
  if (kind < %(signed)d)
    return convert_%(storage)s_sat_rtz(pow((dk_wide)x, dk_exponent(p, i, kind)));
  ulong e = (ulong)dk_exponent_bits(p, i, kind);
  if (kind < %(unsigned)d && (long)e < 0)
    return x == 1 ? (X_t)1 : x == -1 ? (X_t)((e & 1) ? -1 : 1) : (X_t)0;
  ulong base = (ulong)(long)x, power = 1;
  for (; e; e >>= 1, base *= base)
    if (e & 1) power *= base;
  return (X_t)power;
}
"""

_KERNEL = """
kernel void k_{name}({args}global {out}_t *y, long y_off, int ndim, global const long *meta,
                     long n{params}) {{
  long i = get_global_id(0);
  if (i >= n) return;
  long o[{count}];
  dk_offsets(i, ndim, meta, {count}, o);
{body}
}}
"""

# The same over a range that _merge_dims made one dimension (contiguous
# tensors, a scalar broadcast): each offset is off + i * step, with no
# table, no index division and no offsets array, which lets a compiler
# vectorise across work-items (PoCL, Add of 16 Mi float32: 6.4 ms against
# 27 ms through dk_offsets).
_KERNEL_1D = """
kernel void k_{name}_1d({args}global {out}_t *y, long y_off, long y_step, long n{params}) {{
  long i = get_global_id(0);
  if (i >= n) return;
{body}
}}
"""


def _kernel(name: str, operands: list[tuple[str, str]], body: str, out: str = "X",
            params: tuple[tuple[str, str], ...] = ()) -> str:
    """A kernel over the output's elements, and its one-dimensional twin
    (k_NAME_1d); operand v (pointer type T) arrives as ``v_p`` and its
    element offset as ``v_i``, the output's as ``y_i``."""
    params = "".join(f", {t} {v}" for t, v in params)
    args = "".join(f"global const {t} *{v}_p, long {v}_off, " for v, t in operands)
    lines = [f"  const long {v}_i = {v}_off + o[{k}];" for k, (v, _) in enumerate(operands)]
    lines += [f"  const long y_i = y_off + o[{len(operands)}];", body]
    general = _KERNEL.format(name=name, args=args, out=out, count=len(operands) + 1, body="\n".join(lines),
                             params=params)
    args = "".join(f"global const {t} *{v}_p, long {v}_off, long {v}_step, " for v, t in operands)
    lines = [f"  const long {v}_i = {v}_off + i * {v}_step;" for v, _ in operands]
    lines += ["  const long y_i = y_off + i * y_step;", body]
    return general + _KERNEL_1D.format(name=name, args=args, out=out, body="\n".join(lines), params=params)


def _formula_kernel(name: str, formula: _Formula, expression: str, variables: str) -> str:
    loads = "".join(f"  const X_ct {v} = X_load({v}_p, {v}_i);\n" for v in variables)
    return _kernel(name, [(v, "X_t") for v in variables],
                   f"{loads}  {formula.out}_store(y, y_i, {expression});", formula.out, formula.params)


def _has(op: str, t: ClType) -> bool:
    """Whether op's spec lists dtype t (steps go with the op they belong to)."""
    spec = ops.get(_SPEC_OF.get(op, op))
    return t.name in {dtype_name(d) for d in spec.dtypes}


def _header(t: ClType, fp64: bool) -> str:
    bits = {1: "uchar", 2: "ushort", 4: "uint", 8: "ulong"}[t.itemsize]
    helpers = {"float": _FLOAT_HELPERS, "int": _INT_CLIP + _SIGNED_HELPERS,
               "uint": _INT_CLIP + _UNSIGNED_HELPERS}.get(t.kind, "")
    # dk_wide: where Pow and Mean compute (double wherever the device has it);
    # R_t: an element as raw bits, for the kernels that only move elements.
    return (prelude("X", t.key, fp64) + prelude("B", C.DK_DTYPE_BOOL, fp64)
            + f"typedef {'double' if fp64 else 'float'} dk_wide;\ntypedef {bits} R_t;\n"
            + _COMMON + helpers)


@functools.cache
def _unary_source(key: int, fp64: bool) -> str:
    """The program of every unary kernel of dtype ``key``."""
    t = cl_type(key)
    parts = [_header(t, fp64)]
    if t.is_float:
        # Rounding to a narrower type than tan computes in (float16/bfloat16,
        # float32 computed in double) absorbs the builtin's error; float64
        # needs its own tan.
        parts.append(TAN_F64 if t.storage == "double" else "#define dk_tan tan\n")
    for name, formula in _UNARY.items():
        expression = formula.expression(t)
        if expression is not None and _has(name, t):
            parts.append(_formula_kernel(name, formula, expression, "x"))
    return "".join(parts)


@functools.cache
def _binary_source(key: int, fp64: bool) -> str:
    """The program of every binary, variadic and Where kernel of dtype ``key``."""
    t = cl_type(key)
    parts = [_header(t, fp64)]
    for name, formula in _BINARY.items():
        expression = formula.expression(t)
        if expression is not None and _has(name, t):
            parts.append(_formula_kernel(name, formula, expression, "ab"))
    if _has("Max", t):  # a variadic op of one input copies it
        parts.append(_kernel("Copy", [("a", "R_t")], "  y[y_i] = a_p[a_i];", out="R"))
    parts.append(_kernel("Where", [("c", "uchar"), ("a", "R_t"), ("b", "R_t")],
                         "  y[y_i] = c_p[c_i] ? a_p[a_i] : b_p[b_i];", out="R"))
    if _has("Pow", t):
        parts.append(_exponent_loads(fp64))
        if t.is_float:
            power = "pow((dk_wide)X_load(a_p, a_i), dk_exponent(b_p, b_i, kind))"
        else:
            parts.append(_POW_INT % {"signed": _FIRST_SIGNED, "unsigned": _FIRST_UNSIGNED,
                                     "storage": t.storage})
            power = "dk_pow_int(X_load(a_p, a_i), b_p, b_i, kind)"
        parts.append(_kernel("Pow", [("a", "X_t"), ("b", "uchar")], f"  X_store(y, y_i, {power});",
                             params=(("int", "kind"),)))
    return "".join(parts)


# -- launches --------------------------------------------------------------------------

def _merge_dims(shape: list[int], strides: list[list[int]]) -> tuple[list[int], list[list[int]]]:
    """The output's shape and every tensor's strides over it with size-1 dims
    dropped and each dim merged into the next where every tensor steps through
    the pair as through one dim (fewer index divisions per element)."""
    dims: list[tuple[int, list[int]]] = []
    for d, n in enumerate(shape):
        if n == 1:
            continue
        step = [s[d] for s in strides]
        if dims and all(outer == inner * n for outer, inner in zip(dims[-1][1], step)):
            dims[-1] = (dims[-1][0] * n, step)
        else:
            dims.append((n, step))
    return [n for n, _ in dims], [[step[k] for _, step in dims] for k in range(len(strides))]


@functools.cache
def _build_options(limits: DeviceLimits) -> str:
    """The build options of every elementwise program: float16/bfloat16 compute
    in float, and their Div, Sqrt and Reciprocal are exact only with a correctly
    rounded float division and square root."""
    return "-cl-fp32-correctly-rounded-divide-sqrt" if limits.exact_divide_sqrt else ""


def _launch(c: Call, source: str, kernel: str, operands: list[Tensor], scalars: list = ()) -> None:
    """Runs k_``kernel`` of ``source`` over the elements of the call's output."""
    out = c.outputs[0]
    n = out.size
    if n == 0:
        return
    shape, strides = _merge_dims(out.shape, [broadcast_strides(t, out.shape) for t in operands]
                                 + [out.strides])
    if len(shape) <= 1:  # one dimension (or one element): k_NAME_1d, each tensor at a fixed step
        steps = [np.int64(s[0] if shape else 0) for s in strides]
        name = f"k_{kernel}_1d"
        args = [a for t, step in zip(operands, steps) for a in (t, np.int64(t.offset), step)]
        args += [out, np.int64(out.offset), steps[-1]]
    else:
        meta = c.buffer(shape + [s for tensor_strides in strides for s in tensor_strides])
        name = f"k_{kernel}"
        args = [a for t in operands for a in (t, np.int64(t.offset))]
        args += [out, np.int64(out.offset), np.int32(len(shape)), meta]
    launch_items(c, source, name, args + [np.int64(n), *scalars], n, _build_options(c.device.limits))


def _scalar(t: ClType, fp64: bool):
    """The NumPy type of a kernel argument declared X_ct (see prelude)."""
    if not t.is_float:
        return np.dtype(t.name).type
    return np.float64 if t.storage == "double" or (t.storage == "float" and fp64) else np.float32


def _clip_bounds(c: Call, t: ClType) -> list[float | int]:
    """Clip's min and max (host inputs, one-element lists); an omitted one does not bind."""
    if t.is_float:
        low, high = -np.inf, np.inf
    else:
        info = np.iinfo(t.name)
        low, high = int(info.min), int(info.max)
    return [c.attrs[name][0] if c.attrs.get(name) else default
            for name, default in (("min", low), ("max", high))]


def _run_unary(c: Call, key: int) -> None:
    c.expect((1, 1), 1)  # Clip's min and max are host inputs: attributes here
    t = cl_type(key)
    name = "GeluTanh" if c.op == "Gelu" and c.attrs.get("approximate") == "tanh" else c.op
    if c.op == "Clip":
        values = _clip_bounds(c, t)
    else:
        values = [c.attrs[param] for _, param in _UNARY[name].params]
    scalars = [np.int32(v) if ctype == "int" else _scalar(t, c.fp64)(v)
               for (ctype, _), v in zip(_UNARY[name].params, values)]
    _launch(c, _unary_source(key, c.fp64), name, [c.inputs[0]], scalars)


def _run_binary(c: Call, key: int) -> None:
    c.expect((2, 2), 1)
    name = "ModTrunc" if c.op == "Mod" and c.attrs.get("fmod") and not cl_type(key).is_float else c.op
    _launch(c, _binary_source(key, c.fp64), name, c.inputs)


def _run_where(c: Call, key: int) -> None:
    c.expect((3, 3), 1)
    _launch(c, _binary_source(key, c.fp64), "Where", c.inputs)


def _run_variadic(c: Call, key: int) -> None:
    """Folds the inputs into the output: y = f(x0, x1), then y = f(y, xi) for
    each later input (so partial results are held in the dtype, as the specs'
    tolerances assume); Mean's last step adds and divides in double."""
    if not c.inputs or len(c.outputs) != 1:
        raise invalid(f"{c.op} takes 1 or more inputs and has 1 output, got {len(c.inputs)} and "
                      f"{len(c.outputs)}")
    source, y, inputs = _binary_source(key, c.fp64), c.outputs[0], c.inputs
    if len(inputs) == 1:
        _launch(c, source, "Copy", inputs)
        return
    step = "Add" if c.op in ("Sum", "Mean") else c.op
    for i in range(1, len(inputs)):
        operands = [inputs[0] if i == 1 else y, inputs[i]]
        if c.op == "Mean" and i == len(inputs) - 1:
            _launch(c, source, "MeanLast", operands, [(np.float64 if c.fp64 else np.float32)(len(inputs))])
        else:
            _launch(c, source, step, operands)


def _run_pow(c: Call, key: int) -> None:
    c.expect((2, 2), 1)
    exponent = c.inputs[1].dtype
    if exponent not in _EXPONENT_KIND:
        raise invalid(f"Pow: exponent dtype {exponent:#x} is not a numeric dtype")
    _launch(c, _binary_source(key, c.fp64), "Pow", c.inputs, [np.int32(_EXPONENT_KIND[exponent])])


# -- registration ------------------------------------------------------------------------

UNCLAIMED: dict[tuple[str, str], str] = {}

_UNARY_OPS = [op for op in _UNARY if op not in _SPEC_OF]
_BINARY_OPS = [op for op in _BINARY if op not in _SPEC_OF and op not in _VARIADIC]


def register(table) -> None:
    """Claims every elementwise (op, dtype) the devices support."""
    for op in _UNARY_OPS:
        table.claim(op, _run_unary, STRIDED, UNCLAIMED)
    for op in _BINARY_OPS:
        table.claim(op, _run_binary, STRIDED, UNCLAIMED)
    for op in _VARIADIC:
        table.claim(op, _run_variadic, STRIDED, UNCLAIMED)
    table.claim("Where", _run_where, STRIDED, UNCLAIMED)
    table.claim("Pow", _run_pow, STRIDED, UNCLAIMED)
