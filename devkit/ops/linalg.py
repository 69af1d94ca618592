"""Linear algebra and windowed ops: MatMul, Gemm, Conv, FusedConv (domain
devkit), ConvTranspose, MaxPool, AveragePool, GlobalAveragePool, GlobalMaxPool, Einsum.

Numerics shared by the family:

- Products are summed in the compute type: float32 for float32, float16 and
  bfloat16 (stored values converted, one rounding back on store), float64 for
  float64. The rounding error of a sum of K products is held to Higham's
  probabilistic bound, ``Tolerance(ulp=1, atol=c * u * sqrt(K) * S)`` (see
  ``dot_tolerance``): ``u`` the unit roundoff of the compute type, ``S`` the
  largest sum of |products| over the case's outputs, ``c`` measured on the
  cpu plugin (OpenBLAS) with a margin. The 1 ulp covers the output rounding.
  Each case states its tolerance from its own K and S; the spec's table shows
  K = 256 products of operands in [-4, 4].
- The pools sum in float64 whatever the dtype, so AveragePool and
  GlobalAveragePool are within 1 ulp of the correctly rounded mean for
  float32, float16 and bfloat16 (``mean_tolerance``); MaxPool and
  GlobalMaxPool are exact.
- NaN propagates as in NumPy: a window (or plane) that holds a NaN pools to
  NaN, and MaxPool's index is that of the first NaN in the window's
  row-major order. (ONNX leaves this open; onnxruntime skips NaNs and the
  ONNX reference implementation drops them, PyTorch propagates them.)
- A pooling window can miss the input altogether (a dilated kernel stepping
  over a short padded input): MaxPool then gives the identity of max, -inf
  (the dtype's minimum for integers), with index -1, as ONNX's ReduceMax does
  for an empty set; AveragePool gives NaN (0/0) unless count_include_pad
  counts padding in the window. Likewise for an empty spatial extent in the
  global pools.
"""

from __future__ import annotations

import math
import re

import numpy as np

from . import testing as t
from .spec import (
    ALL_FLOAT,
    F64,
    I8,
    I32,
    I64,
    REQUIRED,
    U8,
    Attr,
    Case,
    Input,
    OpSpec,
    TensorInfo,
    Tolerance,
    broadcast_shapes,
    dtype_name,
    register,
    require_same_dtype,
)

# -- tolerances ----------------------------------------------------------------------

_UNIT_ROUNDOFF = {"float32": 2.0 ** -24, "float64": 2.0 ** -53}
# Sums of products: the cpu plugin needed c <= 0.91 over the cases (float64,
# where the NumPy reference rounds as much as the kernel; float32 <= 0.83, on
# same-sign operands); c = 2 leaves a margin.
_DOT_C = 2.0
# Float64 means, atol = c * u * log2(n) * max|x| (pairwise sums on both
# sides): measured c <= 0.11; c = 0.5 leaves a margin.
_MEAN_C = 0.5


def _unit_roundoff(dtype) -> float:
    return _UNIT_ROUNDOFF["float64" if np.dtype(dtype) == F64 else "float32"]


def magnitude(value) -> np.ndarray:
    """|value| in float64 with NaN and infinities as 0: operands for computing S."""
    value = np.asarray(value, dtype=np.float64)
    return np.where(np.isfinite(value), np.abs(value), 0.0)


def _largest(values) -> float:
    values = np.asarray(values)
    return float(values.max()) if values.size else 0.0


def dot_tolerance(dtype, terms: int, largest: float) -> Tolerance:
    """The tolerance of outputs that are sums of ``terms`` products whose
    absolute values sum to at most ``largest`` (S), in ``dtype``."""
    return Tolerance(ulp=1, atol=_DOT_C * _unit_roundoff(dtype) * math.sqrt(max(terms, 1)) * largest)


def mean_tolerance(dtype, terms: int, largest: float) -> Tolerance:
    """The tolerance of means of ``terms`` values of magnitude at most
    ``largest``, summed in float64: 1 ulp (float16/bfloat16 round through
    float32), plus the float64 summation error for float64."""
    if np.dtype(dtype) != F64:
        return Tolerance(ulp=1)
    return Tolerance(ulp=1, atol=_MEAN_C * _unit_roundoff(dtype) * math.log2(max(terms, 2)) * largest)


_DOT_TABLE = {dtype_name(d): dot_tolerance(d, 256, 256 * 4.0) for d in ALL_FLOAT}
_MEAN_TABLE = {dtype_name(d): mean_tolerance(d, 256, 4.0) for d in ALL_FLOAT}

# -- attribute validation -------------------------------------------------------------

AUTO_PAD = ("NOTSET", "SAME_UPPER", "SAME_LOWER", "VALID")
# Window attributes beyond this would overflow the kernels' int64 index arithmetic
# long before they made sense.
_EXTENT_LIMIT = 2 ** 31


def _at_least(low: int):
    def check(values):
        bad = [v for v in values if not low <= v < _EXTENT_LIMIT]
        return f"every value must be in [{low}, 2^31), got {list(values)}" if bad else None
    return check


def _flag(name: str) -> Attr:
    return Attr(name, "int", 0, choices=(0, 1))


def _per_axis(attrs: dict, name: str, n: int, default: int, count: int | None = None) -> tuple[int, ...]:
    """An attribute with one value per spatial axis (``count`` values), or its default."""
    count = n if count is None else count
    value = attrs.get(name)
    if value is None:
        return (default,) * count
    if len(value) != count:
        raise ValueError(f"attribute '{name}' has {len(value)} values; {n} spatial axes need {count}")
    return tuple(value)


def _kernel_shape(attrs: dict, weights: tuple[int, ...] | None, n: int) -> tuple[int, ...]:
    """kernel_shape, checked against the weights' spatial dims when both are known."""
    given = attrs.get("kernel_shape")
    if given is not None:
        if len(given) != n:
            raise ValueError(f"attribute 'kernel_shape' has {len(given)} values; the input has {n} spatial axes")
        if weights is not None and tuple(given) != weights:
            raise ValueError(f"attribute 'kernel_shape' {list(given)} does not match W's spatial dims {list(weights)}")
        return tuple(given)
    if weights is None:
        raise ValueError("attribute 'kernel_shape' is required")
    if not all(weights):
        raise ValueError(f"W's spatial dims {list(weights)} include an empty kernel axis")
    return weights


def _spatial_rank(x) -> int:
    if x.ndim < 3:
        raise ValueError(f"X has shape {x.shape}; it needs (N, C, D1, ...) with at least one spatial axis")
    return x.ndim - 2


def window_geometry(in_sizes, kernel, attrs: dict, *, pool: bool = False):
    """Output sizes and (begin, end) pads of Conv and the pools, per spatial axis.

    SAME_UPPER/SAME_LOWER give ceil(in / stride) outputs, the total padding
    split evenly with the odd one at the end (UPPER) or the beginning (LOWER);
    VALID pads nothing. Explicit pads: floor((in + pads - extent) / stride) + 1,
    or ceil with ceil_mode, dropping a last window that would start in the end
    padding."""
    n = len(in_sizes)
    strides = _per_axis(attrs, "strides", n, 1)
    dilations = _per_axis(attrs, "dilations", n, 1)
    pads = _per_axis(attrs, "pads", n, 0, 2 * n)
    auto_pad = attrs["auto_pad"]
    if auto_pad != "NOTSET" and any(pads):
        raise ValueError(f"attribute 'pads' cannot be combined with auto_pad {auto_pad}")
    ceil_mode = pool and attrs.get("ceil_mode", 0) == 1
    out, begin, end = [], [], []
    for i, (size, k, s, d) in enumerate(zip(in_sizes, kernel, strides, dilations)):
        extent = (k - 1) * d + 1
        if auto_pad in ("SAME_UPPER", "SAME_LOWER"):
            o = -(-size // s)
            total = max(0, (o - 1) * s + extent - size)
            b = total // 2 if auto_pad == "SAME_UPPER" else total - total // 2
            e = total - b
        else:
            b, e = (pads[i], pads[n + i]) if auto_pad == "NOTSET" else (0, 0)
            span = size + b + e - extent
            if span < 0:
                raise ValueError(f"spatial axis {i}: the kernel extent {extent} exceeds the padded input size "
                                 f"{size + b + e}")
            o = (-(-span // s) if ceil_mode else span // s) + 1
            if ceil_mode and (o - 1) * s >= size + b:
                o -= 1
        if pool and max(b, e) >= extent:
            raise ValueError(f"spatial axis {i}: pads ({b}, {e}) must be smaller than the kernel extent {extent}")
        out.append(o)
        begin.append(b)
        end.append(e)
    return tuple(out), tuple(begin), tuple(end), strides, dilations


def _floor_half(total: int) -> int:
    return total // 2  # Python floors: a negative total puts the extra output at the end


def conv_transpose_geometry(in_sizes, kernel, attrs: dict):
    """Output sizes and begin pads of ConvTranspose per spatial axis.

    The full result of an axis spans stride * (in - 1) + output_padding +
    extent positions; the output is the window of it that starts at the begin
    pad. Given output_shape (or SAME_*, whose output is in * stride), the total
    padding full - out is split as ONNX states: SAME_UPPER puts the odd one at
    the end, anything else at the beginning. A negative total (an output
    larger than the full result) extends the output with zeros at the end."""
    n = len(in_sizes)
    strides = _per_axis(attrs, "strides", n, 1)
    dilations = _per_axis(attrs, "dilations", n, 1)
    pads = _per_axis(attrs, "pads", n, 0, 2 * n)
    output_padding = _per_axis(attrs, "output_padding", n, 0)
    auto_pad = attrs["auto_pad"]
    if auto_pad != "NOTSET" and any(pads):
        raise ValueError(f"attribute 'pads' cannot be combined with auto_pad {auto_pad}")
    output_shape = attrs.get("output_shape")
    if output_shape is not None and len(output_shape) != n:
        raise ValueError(f"attribute 'output_shape' has {len(output_shape)} values; it lists the {n} spatial "
                         f"output sizes")
    out, begin = [], []
    for i, (size, k, s, d, extra) in enumerate(zip(in_sizes, kernel, strides, dilations, output_padding)):
        if extra >= max(s, d):
            raise ValueError(f"output_padding {extra} on spatial axis {i} must be smaller than the stride or "
                             f"the dilation ({s}, {d})")
        full = s * (size - 1) + extra + (k - 1) * d + 1 if size else 0
        if output_shape is not None or auto_pad in ("SAME_UPPER", "SAME_LOWER"):
            o = output_shape[i] if output_shape is not None else size * s
            total = full - o
            b = _floor_half(total) if auto_pad == "SAME_UPPER" else total - _floor_half(total)
        elif auto_pad == "VALID":
            o, b = full, 0
        else:
            o, b = full - pads[i] - pads[n + i], pads[i]
            if o < 0:
                raise ValueError(f"spatial axis {i}: pads ({pads[i]}, {pads[n + i]}) exceed the full output "
                                 f"size {full}")
        out.append(o)
        begin.append(b)
    return tuple(out), tuple(begin), strides, dilations


def _window_attrs(*, pool: bool) -> tuple[Attr, ...]:
    """auto_pad, dilations, kernel_shape (required by the pools; Conv reads W's),
    pads, strides: per spatial axis, defaults filled in by window_geometry."""
    return (
        Attr("auto_pad", "string", "NOTSET", choices=AUTO_PAD),
        Attr("dilations", "ints", None, check=_at_least(1)),
        Attr("kernel_shape", "ints", REQUIRED if pool else None, check=_at_least(1)),
        Attr("pads", "ints", None, check=_at_least(0)),
        Attr("strides", "ints", None, check=_at_least(1)),
    )


# -- MatMul ------------------------------------------------------------------------------

def _infer_matmul(inputs, attrs):
    a, b = inputs
    dtype = require_same_dtype(inputs, ["A", "B"])
    if a.ndim == 0 or b.ndim == 0:
        raise ValueError(f"A {a.shape} and B {b.shape}: both need rank >= 1")
    k_a = a.shape[-1]
    k_b = b.shape[0] if b.ndim == 1 else b.shape[-2]
    if k_a != k_b:
        raise ValueError(f"A {a.shape} and B {b.shape}: A's last dim {k_a} does not match B's "
                         f"{'only' if b.ndim == 1 else 'second-to-last'} dim {k_b}")
    try:
        batch = broadcast_shapes(a.shape[:-2], b.shape[:-2])
    except ValueError:
        raise ValueError(f"A {a.shape} and B {b.shape}: the batch dims {a.shape[:-2]} and {b.shape[:-2]} "
                         f"do not broadcast") from None
    shape = batch + ((a.shape[-2],) if a.ndim >= 2 else ()) + ((b.shape[-1],) if b.ndim >= 2 else ())
    return [(shape, dtype)]


def _ref_matmul(x, attrs):
    return [np.matmul(x[0], x[1])]


def _matmul_cases(dtype, rng):
    integer = not t.is_float(dtype)
    r = lambda *shape: t.random(rng, shape, dtype)

    def case(name, a, b):
        tol = None if integer else dot_tolerance(dtype, a.shape[-1],
                                                  _largest(np.matmul(magnitude(a), magnitude(b))))
        return Case(name, [a, b], tolerance=tol)

    cases = [
        case("2d", r(3, 4), r(4, 5)),
        case("odd_blocking", r(67, 129), r(129, 33)),
        case("batch_broadcast", r(2, 1, 3, 4), r(5, 4, 6)),
        case("batch_broadcast_a", r(3, 4), r(2, 4, 5)),
        case("batch_both", r(4, 1, 5, 3), r(1, 6, 3, 2)),
        case("vector_vector", r(7), r(7)),
        case("vector_matrix", r(4), r(2, 4, 5)),
        case("matrix_vector", r(2, 3, 4), r(4)),
        case("size1_dims", r(1, 1, 4), r(4, 1)),
        case("k_zero", r(3, 0), r(0, 4)),
        case("empty_m", r(0, 4), r(4, 5)),
        case("empty_batch", r(0, 3, 4), r(4, 5)),
    ]
    if integer:
        # Operands near 2^(bits/2) make the sums wrap around.
        big = np.iinfo(dtype).max
        wide = lambda *shape: rng.integers(-int(big ** 0.5), int(big ** 0.5), shape).astype(dtype)
        cases += [case("large", r(128, 256), r(256, 96)), case("wraparound", wide(9, 70), wide(70, 11))]
    else:
        # Same-sign products: partial sums grow with K, and so does the error.
        positive = lambda *shape: t.random(rng, shape, dtype, 0.0, 4.0)
        cases.append(case("positive", positive(31, 300), positive(300, 45)))
        cases.append(case("large", r(256, 512), r(512, 384)))
        special = np.array([[np.nan, 1, 2], [np.inf, 1, 0], [-np.inf, -1, 1], [0.0, -0.0, 3]], dtype=dtype)
        cases.append(case("special", special, r(3, 5)))
    return cases


register(OpSpec(
    name="MatMul", category="linalg", opset=13,
    inputs=(Input("A"), Input("B")), outputs=("Y",),
    dtypes=ALL_FLOAT + (I32, I64),
    infer=_infer_matmul, reference=_ref_matmul, cases=_matmul_cases,
    tolerance={**_DOT_TABLE, "int32": Tolerance(), "int64": Tolerance()},
    doc="Matrix product with NumPy semantics: batch dims broadcast, a 1-D A gains (and loses) a leading 1, "
        "a 1-D B a trailing 1. Floats go through BLAS (float16/bfloat16 in float32); int32/int64 use a "
        "cache-blocked loop and wrap around on overflow. Tolerance: see the family's doc (sum of K products).",
))


# -- Gemm --------------------------------------------------------------------------------

def _infer_gemm(inputs, attrs):
    a, b, c = (list(inputs) + [None])[:3]
    dtype = require_same_dtype(inputs, ["A", "B", "C"])
    if a.ndim != 2 or b.ndim != 2:
        raise ValueError(f"A {a.shape} and B {b.shape} must both be 2-D")
    m, k = a.shape[::-1] if attrs["transA"] else a.shape
    k_b, n = b.shape[::-1] if attrs["transB"] else b.shape
    if k != k_b:
        raise ValueError(f"op(A) is {m}x{k} but op(B) is {k_b}x{n} (transA={attrs['transA']}, "
                         f"transB={attrs['transB']})")
    if c is not None and (c.ndim > 2 or any(cs not in (1, ys) for cs, ys in zip(c.shape[::-1], (n, m)))):
        raise ValueError(f"C {c.shape} does not broadcast to the output ({m}, {n})")
    return [((m, n), dtype)]


def _ref_gemm(x, attrs):
    a = x[0].T if attrs["transA"] else x[0]
    b = x[1].T if attrs["transB"] else x[1]
    y = attrs["alpha"] * (a @ b)
    if len(x) > 2 and x[2] is not None:
        y = y + attrs["beta"] * x[2]
    return [y]


def _gemm_cases(dtype, rng):
    r = lambda *shape: t.random(rng, shape, dtype)

    def case(name, a, b, c=None, **attrs):
        a_op = magnitude(a).T if attrs.get("transA") else magnitude(a)
        b_op = magnitude(b).T if attrs.get("transB") else magnitude(b)
        sums = abs(attrs.get("alpha", 1.0)) * (a_op @ b_op)
        if c is not None:
            sums = sums + abs(attrs.get("beta", 1.0)) * magnitude(c)
        tol = dot_tolerance(dtype, a_op.shape[1] + (c is not None), _largest(sums))
        return Case(name, [a, b] + ([c] if c is not None else []), attrs, tolerance=tol)

    nonfinite_c = r(4, 2)
    nonfinite_c[0, 0], nonfinite_c[1, 1] = np.nan, np.inf
    return [
        case("no_c", r(3, 4), r(4, 5)),
        case("c_matrix", r(3, 4), r(4, 5), r(3, 5)),
        case("c_row", r(3, 4), r(4, 5), r(5)),
        case("c_row_2d", r(3, 4), r(4, 5), r(1, 5)),
        case("c_column", r(3, 4), r(4, 5), r(3, 1)),
        case("c_scalar", r(3, 4), r(4, 5), r()),
        case("c_single", r(3, 4), r(4, 5), r(1)),
        case("trans_a", r(6, 3), r(6, 5), r(3, 5), transA=1),
        case("trans_b", r(3, 6), r(5, 6), r(5), transB=1),
        case("trans_both", r(6, 3), r(5, 6), r(3, 5), transA=1, transB=1),
        case("alpha_beta", r(4, 7), r(7, 2), r(4, 2), alpha=0.5, beta=-2.0),
        case("beta_zero", r(4, 7), r(7, 2), nonfinite_c, beta=0.0),
        case("odd_blocking", r(129, 67), r(33, 129), r(33), transA=1, transB=1, alpha=1.5, beta=0.25),
        case("k_zero", r(3, 0), r(0, 4), r(3, 4), beta=2.0),
        case("empty_m", r(0, 4), r(4, 5), r(5)),
        case("large", r(128, 256), r(256, 96), r(96)),
        case("special", np.array([[np.nan, 1], [np.inf, 2], [-np.inf, 0], [-0.0, 0.0]], dtype), r(2, 3),
             np.array([[np.inf], [1.0], [-1.0], [-0.0]], dtype)),
    ]


register(OpSpec(
    name="Gemm", category="linalg", opset=13,
    inputs=(Input("A"), Input("B"), Input("C", optional=True)), outputs=("Y",),
    attrs=(Attr("alpha", "float", 1.0), Attr("beta", "float", 1.0), _flag("transA"), _flag("transB")),
    dtypes=ALL_FLOAT,
    infer=_infer_gemm, reference=_ref_gemm, cases=_gemm_cases, tolerance=_DOT_TABLE,
    doc="Y = alpha * op(A) @ op(B) + beta * C, op transposing when transA/transB is 1; C broadcasts "
        "unidirectionally to (M, N). beta * C is formed in IEEE arithmetic (beta = 0 with an infinite or NaN "
        "C gives NaN, as NumPy does); alpha = 0 skips the product (BLAS semantics).",
))


# -- Conv ---------------------------------------------------------------------------------

def _infer_conv(inputs, attrs):
    x, w, b = (list(inputs) + [None])[:3]
    dtype = require_same_dtype(inputs, ["X", "W", "B"])
    n = _spatial_rank(x)
    if w.ndim != x.ndim:
        raise ValueError(f"W has shape {w.shape}; X {x.shape} needs W of rank {x.ndim} (M, C/group, k1, ...)")
    group = attrs["group"]
    kernel = _kernel_shape(attrs, w.shape[2:], n)
    if x.shape[1] != w.shape[1] * group:
        raise ValueError(f"X has {x.shape[1]} channels but W {w.shape} with group {group} expects "
                         f"{w.shape[1] * group}")
    if w.shape[0] % group:
        raise ValueError(f"W's {w.shape[0]} output channels do not divide into {group} groups")
    if b is not None and b.shape != (w.shape[0],):
        raise ValueError(f"B has shape {b.shape}; it needs ({w.shape[0]},)")
    out = window_geometry(x.shape[2:], kernel, attrs)[0]
    return [((x.shape[0], w.shape[0]) + out, dtype)]


def _ref_conv(x, attrs):
    x, w, b = (list(x) + [None])[:3]
    n = x.ndim - 2
    group = attrs["group"]
    kernel = w.shape[2:]
    out, begin, end, strides, dilations = window_geometry(x.shape[2:], kernel, attrs)
    batch, m = x.shape[0], w.shape[0]
    cg, mg = x.shape[1] // group, m // group
    y = np.zeros((batch, group, mg) + out)
    if all(out):
        padded = np.pad(x, [(0, 0), (0, 0)] + list(zip(begin, end)))
        for tap in np.ndindex(*kernel):
            window = tuple(slice(k * d, k * d + (o - 1) * s + 1, s)
                           for k, d, o, s in zip(tap, dilations, out, strides))
            xs = padded[(slice(None), slice(None)) + window].reshape(batch, group, cg, math.prod(out))
            wt = w[(slice(None), slice(None)) + tap].reshape(group, mg, cg)
            y += np.matmul(wt, xs).reshape(y.shape)
    y = y.reshape((batch, m) + out)
    if b is not None:
        y += b.reshape((m,) + (1,) * n)
    return [y]


def _conv_cases(dtype, rng):
    r = lambda *shape: t.random(rng, shape, dtype)

    def case(name, x, w, b=None, **attrs):
        terms = w.shape[1] * math.prod(w.shape[2:])
        sums = _ref_conv([magnitude(x), magnitude(w)], {"group": 1, "auto_pad": "NOTSET", **attrs})[0]
        return Case(name, [x, w] + ([b] if b is not None else []), attrs,
                    tolerance=dot_tolerance(dtype, terms, _largest(sums)))

    special = r(1, 2, 5, 5)
    special[0, 0, 1, 1], special[0, 1, 3, 2], special[0, 0, 4, 4] = np.nan, np.inf, -np.inf
    return [
        case("basic", r(1, 1, 5, 5), r(1, 1, 3, 3), pads=[1, 1, 1, 1]),
        case("bias_strides", r(2, 3, 7, 6), r(4, 3, 3, 3), r(4), strides=[2, 2]),
        case("asymmetric_pads", r(1, 2, 7, 5), r(3, 2, 3, 2), pads=[1, 0, 2, 1], strides=[2, 1]),
        case("same_upper", r(1, 2, 7, 6), r(3, 2, 3, 4), r(3), auto_pad="SAME_UPPER", strides=[2, 2]),
        case("same_lower", r(1, 2, 7, 6), r(3, 2, 3, 4), auto_pad="SAME_LOWER", strides=[2, 2]),
        case("valid", r(1, 2, 7, 6), r(3, 2, 3, 2), auto_pad="VALID", strides=[2, 3]),
        case("kernel_shape", r(1, 2, 6, 6), r(2, 2, 2, 3), kernel_shape=[2, 3]),
        case("group", r(2, 4, 6, 6), r(6, 2, 3, 3), r(6), group=2, pads=[1, 1, 1, 1]),
        case("depthwise", r(1, 5, 8, 8), r(5, 1, 3, 3), r(5), group=5, pads=[1, 1, 1, 1]),
        case("dilations", r(1, 3, 9, 8), r(2, 3, 3, 2), dilations=[2, 3], pads=[2, 1, 0, 2]),
        case("conv1d", r(2, 3, 20), r(4, 3, 5), r(4), strides=[3], pads=[2, 1], dilations=[2]),
        case("conv3d", r(1, 2, 5, 6, 4), r(3, 2, 3, 2, 2), r(3), pads=[1, 0, 1, 1, 1, 0], strides=[2, 1, 2]),
        case("pointwise", r(2, 8, 5, 7), r(6, 8, 1, 1), r(6)),
        case("pointwise_strided", r(2, 8, 5, 7), r(6, 8, 1, 1), strides=[2, 2]),
        case("odd_blocking", r(1, 13, 11, 9), r(17, 13, 3, 3), r(17), pads=[1, 1, 1, 1]),
        case("empty_batch", r(0, 3, 5, 5), r(2, 3, 3, 3), r(2)),
        case("empty_channels", r(1, 0, 5, 5), r(4, 0, 3, 3), r(4)),
        case("large", r(2, 16, 40, 40), r(32, 16, 3, 3), r(32), pads=[1, 1, 1, 1]),
        # cpu: few channels go direct; these (3 and 2 phases, 40 channels) do not
        case("strided_phases", r(2, 5, 11, 13), r(6, 5, 3, 3), r(6), strides=[3, 2], pads=[1, 2, 0, 1]),
        case("wide_channels", r(1, 40, 18, 18), r(16, 40, 3, 3), r(16), pads=[1, 1, 1, 1]),
        case("special", special, r(2, 2, 3, 3), pads=[1, 1, 1, 1]),
    ]


_CONV_ATTRS = _window_attrs(pool=False) + (
    Attr("group", "int", 1, check=lambda v: None if 1 <= v < _EXTENT_LIMIT else "must be in [1, 2^31)"),)
_CONV_INPUTS = (Input("X"), Input("W"), Input("B", optional=True))

register(OpSpec(
    name="Conv", category="linalg", opset=22,
    inputs=_CONV_INPUTS, outputs=("Y",),
    attrs=_CONV_ATTRS,
    dtypes=ALL_FLOAT,
    infer=_infer_conv, reference=_ref_conv, cases=_conv_cases, tolerance=_DOT_TABLE,
    doc="N-D convolution (cross-correlation) of X (N, C, D1, ...) with W (M, C/group, k1, ...), plus B (M). "
        "Padding: explicit pads, or auto_pad SAME_UPPER/SAME_LOWER (ceil(in/stride) outputs) or VALID. "
        "The cpu plugin picks a path per geometry (the limits are in its kernels/linalg_conv.c): im2col + "
        "GEMM over tiles of output positions split over its threads (1x1 kernels: GEMM on X directly); "
        "float32 3x3 kernels with unit strides by Winograd F(2x2, 3x3), its filter transforms prepared at "
        "plan time (a result with a non-finite value is computed again by im2col); float32 kernels with many "
        "filters on strided windows or small planes by an AVX-512 register block over im2col tiles, or, with "
        "W prepared at plan time, by the same block vectorised over the filters, reading the zero-padded image "
        "through per-position pointers (no im2col); and float32 2-D kernels with few channels by direct sums "
        "(on AVX-512 with the output channels in the vector lanes); all within the same tolerance.",
))


# -- FusedConv (domain devkit) --------------------------------------------------------------

# The activations FusedConv applies after the Conv (and Z); "" applies none.
FUSED_CONV_ACTIVATIONS = ("", "Relu")


def _infer_fused_conv(inputs, attrs):
    x, w, b, z = (list(inputs) + [None] * 4)[:4]
    require_same_dtype(inputs, ["X", "W", "B", "Z"])
    conv_attrs = {name: value for name, value in attrs.items() if name != "activation"}
    ((shape, dtype),) = _infer_conv([x, w, b], conv_attrs)
    if z is not None and z.shape != shape:
        raise ValueError(f"Z has shape {z.shape}; it must have the output's shape {shape}")
    return [(shape, dtype)]


def _ref_fused_conv(x, attrs):
    x, w, b, z = (list(x) + [None] * 4)[:4]
    (y,) = _ref_conv([x, w, b], attrs)
    if z is not None:
        y = y + z
    if attrs.get("activation") == "Relu":
        y = np.maximum(y, 0.0)
    return [y]


def _fused_conv_cases(dtype, rng):
    r = lambda *shape: t.random(rng, shape, dtype)

    def case(name, x, w, b=None, z=True, activation="Relu", **attrs):
        """``z``: an array, True (random, of the output's shape) or None. The
        output sums K products plus B and Z: the Conv tolerance for K + 2
        terms, with |B| and |Z| counted in S."""
        geometry = {"group": 1, "auto_pad": "NOTSET", **attrs}
        if z is True:
            z = r(*_ref_conv([np.zeros(x.shape), np.zeros(w.shape)], geometry)[0].shape)
        terms = w.shape[1] * math.prod(w.shape[2:]) + 2
        sums = _ref_fused_conv([magnitude(x), magnitude(w), None if b is None else magnitude(b),
                                None if z is None else magnitude(z)], geometry)[0]
        inputs = [x, w, b, z] if z is not None else [x, w, b] if b is not None else [x, w]
        return Case(name, inputs, {"activation": activation, **attrs},
                    tolerance=dot_tolerance(dtype, terms, _largest(sums)))

    special_z = r(1, 3, 7, 6)
    special_z[0, 0, 1, 1], special_z[0, 1, 3, 2], special_z[0, 2, 4, 4] = np.nan, np.inf, -np.inf
    special_x = r(1, 16, 16, 16)
    special_x[0, 3, 5, 5] = np.inf
    return [
        case("bias_z_relu", r(2, 3, 7, 6), r(4, 3, 3, 3), r(4), pads=[1, 1, 1, 1]),
        case("relu_only", r(1, 2, 5, 5), r(3, 2, 3, 3), z=None, pads=[1, 1, 1, 1]),
        case("bias_relu", r(2, 3, 7, 6), r(4, 3, 3, 3), r(4), z=None, strides=[2, 2]),
        case("z_without_bias", r(1, 2, 7, 6), r(3, 2, 3, 3), pads=[1, 1, 1, 1]),
        case("z_no_activation", r(1, 2, 7, 6), r(3, 2, 3, 3), r(3), activation="", pads=[1, 1, 1, 1]),
        case("pointwise", r(2, 8, 5, 7), r(6, 8, 1, 1), r(6)),
        case("pointwise_strided", r(2, 8, 5, 7), r(6, 8, 1, 1), r(6), strides=[2, 2]),
        case("group", r(2, 4, 6, 6), r(6, 2, 3, 3), r(6), group=2, pads=[1, 1, 1, 1]),
        case("conv1d", r(2, 3, 20), r(4, 3, 5), r(4), strides=[3], pads=[2, 1], dilations=[2]),
        case("conv3d", r(1, 2, 5, 6, 4), r(3, 2, 3, 2, 2), r(3), pads=[1, 0, 1, 1, 1, 0], strides=[2, 1, 2]),
        # cpu: every path (direct sums, Winograd, im2col tiles, small planes whole on 2 threads)
        case("odd_blocking", r(1, 13, 11, 9), r(17, 13, 3, 3), r(17), pads=[1, 1, 1, 1]),
        case("large", r(2, 16, 40, 40), r(32, 16, 3, 3), r(32), pads=[1, 1, 1, 1]),
        case("wide_channels", r(1, 40, 18, 18), r(16, 40, 3, 3), r(16), pads=[1, 1, 1, 1]),
        case("small_plane", r(1, 64, 7, 7), r(32, 64, 3, 3), r(32), pads=[1, 1, 1, 1]),
        case("strided_phases", r(2, 5, 11, 13), r(6, 5, 3, 3), r(6), strides=[3, 2], pads=[1, 2, 0, 1]),
        case("empty_batch", r(0, 3, 5, 5), r(2, 3, 3, 3), r(2)),
        case("empty_channels", r(1, 0, 5, 5), r(4, 0, 3, 3), r(4)),
        case("special", r(1, 2, 7, 6), r(3, 2, 3, 3), r(3), special_z, pads=[1, 1, 1, 1]),
        case("special_winograd", special_x, r(8, 16, 3, 3), r(8), pads=[1, 1, 1, 1]),
    ]


register(OpSpec(
    name="FusedConv", category="linalg", domain="devkit", opset=22,
    inputs=_CONV_INPUTS + (Input("Z", optional=True,
                                 doc="added to the convolution before the activation; Y's shape"),),
    outputs=("Y",),
    attrs=_CONV_ATTRS + (Attr("activation", "string", "", choices=FUSED_CONV_ACTIVATIONS,
                              doc="applied last: \"Relu\", or \"\" for none"),),
    dtypes=ALL_FLOAT,
    infer=_infer_fused_conv, reference=_ref_fused_conv, cases=_fused_conv_cases, tolerance=_DOT_TABLE,
    doc="Conv (same inputs, attributes and numerics) with its epilogue fused (domain devkit), as onnxruntime's "
        "com.microsoft FusedConv: Y = activation(Conv(X, W, B) + Z), Z optional and of Y's shape (no "
        "broadcasting), activation \"Relu\" or \"\" (none; other names are refused). devkit.onnx.prepare "
        "makes it from Conv [-> Add] -> Relu where the plugin has a kernel for it; the decomposition is "
        "Conv, Add, Relu. The tolerance is Conv's over K + 2 terms (B and Z count as two more addends). The "
        "cpu plugin applies B, Z and the activation to each block of outputs while it is in cache, on every "
        "Conv path.",
))


# -- ConvTranspose -------------------------------------------------------------------------

def _infer_conv_transpose(inputs, attrs):
    x, w, b = (list(inputs) + [None])[:3]
    dtype = require_same_dtype(inputs, ["X", "W", "B"])
    n = _spatial_rank(x)
    if w.ndim != x.ndim:
        raise ValueError(f"W has shape {w.shape}; X {x.shape} needs W of rank {x.ndim} (C, M/group, k1, ...)")
    group = attrs["group"]
    kernel = _kernel_shape(attrs, w.shape[2:], n)
    if x.shape[1] != w.shape[0]:
        raise ValueError(f"X has {x.shape[1]} channels but W {w.shape} expects {w.shape[0]}")
    if x.shape[1] % group:
        raise ValueError(f"X's {x.shape[1]} channels do not divide into {group} groups")
    m = w.shape[1] * group
    if b is not None and b.shape != (m,):
        raise ValueError(f"B has shape {b.shape}; it needs ({m},)")
    out = conv_transpose_geometry(x.shape[2:], kernel, attrs)[0]
    return [((x.shape[0], m) + out, dtype)]


def _ref_conv_transpose(x, attrs):
    x, w, b = (list(x) + [None])[:3]
    n = x.ndim - 2
    group = attrs["group"]
    kernel = w.shape[2:]
    out, begin, strides, dilations = conv_transpose_geometry(x.shape[2:], kernel, attrs)
    batch, c, mg = x.shape[0], x.shape[1], w.shape[1]
    cg, m = c // group, mg * group
    # A canvas over full-result coordinates [low, high) that holds the output window.
    full = [(s * (i - 1) + (k - 1) * d + 1) if i else 0
            for s, i, k, d in zip(strides, x.shape[2:], kernel, dilations)]
    low = [min(0, bg) for bg in begin]
    high = [max(f, bg + o) for f, bg, o in zip(full, begin, out)]
    canvas = np.zeros((batch, m) + tuple(h - lo for h, lo in zip(high, low)))
    xs = x.reshape(batch, group, cg, math.prod(x.shape[2:]))
    for tap in np.ndindex(*kernel):
        wt = w[(slice(None), slice(None)) + tap].reshape(group, cg, mg).transpose(0, 2, 1)
        contribution = np.matmul(wt, xs).reshape((batch, m) + x.shape[2:])
        window = tuple(slice(k * d - lo, k * d - lo + (i - 1) * s + 1, s)
                       for k, d, lo, i, s in zip(tap, dilations, low, x.shape[2:], strides))
        if all(x.shape[2:]):
            canvas[(slice(None), slice(None)) + window] += contribution
    y = canvas[(slice(None), slice(None)) + tuple(slice(bg - lo, bg - lo + o)
                                                  for bg, lo, o in zip(begin, low, out))]
    if b is not None:
        y = y + b.reshape((m,) + (1,) * n)
    return [y]


def _conv_transpose_cases(dtype, rng):
    r = lambda *shape: t.random(rng, shape, dtype)

    def case(name, x, w, b=None, **attrs):
        # Each output sums at most C/group * prod(kernel) products.
        terms = w.shape[0] // attrs.get("group", 1) * math.prod(w.shape[2:])
        sums = _ref_conv_transpose([magnitude(x), magnitude(w)], {"group": 1, "auto_pad": "NOTSET", **attrs})[0]
        return Case(name, [x, w] + ([b] if b is not None else []), attrs,
                    tolerance=dot_tolerance(dtype, terms, _largest(sums)))

    special = r(1, 2, 4, 4)
    special[0, 0, 1, 1], special[0, 1, 2, 3], special[0, 0, 3, 0] = np.nan, np.inf, -np.inf
    return [
        case("basic", r(1, 1, 3, 3), r(1, 2, 3, 3)),
        case("bias_strides", r(2, 3, 4, 5), r(3, 2, 3, 3), r(2), strides=[2, 2]),
        case("output_padding", r(1, 1, 3, 3), r(1, 2, 3, 3), strides=[3, 2], output_padding=[1, 1]),
        case("pads", r(1, 2, 3, 4), r(2, 2, 3, 3), r(2), strides=[3, 2], pads=[1, 2, 1, 0]),
        case("output_shape_larger", r(1, 1, 3, 3), r(1, 2, 3, 3), r(2), strides=[3, 2], output_shape=[10, 8]),
        case("output_shape_smaller", r(1, 2, 4, 4), r(2, 3, 3, 3), strides=[2, 2], output_shape=[7, 6]),
        case("same_upper", r(1, 2, 3, 4), r(2, 2, 3, 3), r(2), auto_pad="SAME_UPPER", strides=[2, 2]),
        case("same_lower", r(1, 2, 3, 4), r(2, 2, 3, 3), auto_pad="SAME_LOWER", strides=[2, 3]),
        case("valid", r(1, 2, 3, 4), r(2, 2, 2, 3), auto_pad="VALID", strides=[2, 2]),
        case("dilations", r(1, 2, 4, 4), r(2, 3, 2, 3), dilations=[2, 3], strides=[1, 2], pads=[1, 0, 0, 2]),
        case("group", r(2, 4, 4, 4), r(4, 3, 3, 3), r(6), group=2, strides=[2, 1]),
        case("depthwise", r(1, 3, 5, 5), r(3, 1, 3, 3), r(3), group=3, strides=[2, 2], pads=[1, 1, 1, 1]),
        case("conv1d", r(2, 3, 7), r(3, 4, 5), r(4), strides=[3], dilations=[2], output_padding=[1]),
        case("conv3d", r(1, 2, 3, 4, 3), r(2, 2, 2, 3, 2), r(2), strides=[2, 1, 2], pads=[0, 1, 1, 1, 0, 0]),
        case("pointwise", r(2, 8, 5, 7), r(8, 6, 1, 1), r(6)),
        case("odd_blocking", r(1, 13, 7, 9), r(13, 17, 3, 3), r(17), strides=[2, 2], pads=[1, 1, 1, 1]),
        case("empty_batch", r(0, 3, 4, 4), r(3, 2, 3, 3), r(2)),
        case("empty_channels", r(1, 0, 4, 4), r(0, 2, 3, 3), r(2)),
        case("large", r(1, 32, 16, 16), r(32, 16, 3, 3), r(16), strides=[2, 2]),
        case("special", special, r(2, 2, 3, 3), strides=[2, 2]),
    ]


register(OpSpec(
    name="ConvTranspose", category="linalg", opset=22,
    inputs=(Input("X"), Input("W"), Input("B", optional=True)), outputs=("Y",),
    attrs=_CONV_ATTRS + (Attr("output_padding", "ints", None, check=_at_least(0)),
                         Attr("output_shape", "ints", None, check=_at_least(0))),
    dtypes=ALL_FLOAT,
    infer=_infer_conv_transpose, reference=_ref_conv_transpose, cases=_conv_transpose_cases,
    tolerance=_DOT_TABLE,
    doc="N-D transposed convolution of X (N, C, D1, ...) with W (C, M/group, k1, ...), plus B (M). The output "
        "size follows ONNX's equations: stride * (in - 1) + output_padding + extent - pads, or output_shape "
        "(pads then split as ONNX states; outputs beyond the full result are zero plus bias), or in * stride "
        "for SAME_*. Computed as GEMM + col2im per image, group and run of output channels.",
))


# -- pools ------------------------------------------------------------------------------

def _infer_pool(inputs, attrs):
    (x,) = inputs
    n = _spatial_rank(x)
    kernel = _kernel_shape(attrs, None, n)
    out = window_geometry(x.shape[2:], kernel, attrs, pool=True)[0]
    return x.shape[:2] + out


def _infer_max_pool(inputs, attrs):
    shape = _infer_pool(inputs, attrs)
    return [(shape, inputs[0].dtype), (shape, I64)]


def _infer_average_pool(inputs, attrs):
    return [(_infer_pool(inputs, attrs), inputs[0].dtype)]


def _pool_taps(x, attrs):
    """For each kernel tap: the input values under it at every output position
    (shape (N, C) + out) and whether it lies inside the input, inside the
    padded input, and the row-major and column-major index in the plane."""
    kernel = attrs["kernel_shape"]
    sizes = x.shape[2:]
    out, begin, end, strides, dilations = window_geometry(sizes, kernel, attrs, pool=True)
    grids = np.meshgrid(*[np.arange(o) for o in out], indexing="ij")
    for tap in np.ndindex(*kernel):
        pos = [g * s - b + k * d for g, s, b, k, d in zip(grids, strides, begin, tap, dilations)]
        inside = np.ones(out, bool)
        padded = np.ones(out, bool)
        for p, size, e in zip(pos, sizes, end):
            inside &= (p >= 0) & (p < size)
            padded &= p < size + e
        if x.size:
            clipped = tuple(np.clip(p, 0, size - 1) for p, size in zip(pos, sizes))
            values = x[(slice(None), slice(None)) + clipped]
        else:
            values = np.zeros(x.shape[:2] + out, x.dtype)
        row = np.zeros(out, np.int64)
        col = np.zeros(out, np.int64)
        step = 1
        for p, size in zip(pos, sizes):
            row = row * size + p
            col = col + p * step
            step *= size
        yield values, inside, padded, row, col


def _ref_max_pool(x, attrs):
    (x,) = x
    out_shape = _infer_pool([TensorInfo(x.shape, x.dtype)], attrs)
    lowest = -np.inf if x.dtype.kind == "f" else np.iinfo(x.dtype).min
    best = np.full(out_shape, lowest, np.float64 if x.dtype.kind == "f" else x.dtype)
    index = np.full(out_shape, -1, np.int64)
    found = np.zeros(out_shape, bool)
    column_major = attrs["storage_order"] == 1
    for values, inside, _, row, col in _pool_taps(x, attrs):
        inside = np.broadcast_to(inside, out_shape)
        nan_best = np.isnan(best) if x.dtype.kind == "f" else np.zeros(out_shape, bool)
        nan_value = np.isnan(values) if x.dtype.kind == "f" else np.zeros(out_shape, bool)
        take = inside & (~found | (values > best) | (nan_value & ~nan_best))
        best = np.where(take, values, best)
        index = np.where(take, col if column_major else row, index)
        found |= inside
    plane = math.prod(x.shape[2:])
    base = np.arange(x.shape[0] * x.shape[1], dtype=np.int64).reshape(x.shape[:2] + (1,) * (x.ndim - 2))
    index = np.where(index >= 0, index + base * plane, -1)
    return [best.astype(x.dtype) if x.dtype.kind != "f" else best, index]


def _ref_average_pool(x, attrs):
    (x,) = x
    out_shape = _infer_pool([TensorInfo(x.shape, x.dtype)], attrs)
    total = np.zeros(out_shape)
    count = np.zeros(out_shape[2:])
    for values, inside, padded, _, _ in _pool_taps(x, attrs):
        total += np.where(inside, values, 0.0)
        count += padded if attrs["count_include_pad"] else inside
    return [total / count]


def _pool_cases(dtype, rng, *, average: bool):
    r = lambda *shape: t.random(rng, shape, dtype)
    cases = [
        Case("2d_default", [r(1, 3, 8, 8)], {"kernel_shape": [2, 2]}),
        Case("pads_strides", [r(2, 2, 7, 7)], {"kernel_shape": [3, 3], "pads": [1, 1, 1, 1], "strides": [2, 2]}),
        Case("asymmetric_pads", [r(1, 2, 6, 5)], {"kernel_shape": [3, 2], "pads": [2, 0, 1, 1]}),
        Case("ceil_mode", [r(1, 2, 5, 6)], {"kernel_shape": [2, 3], "strides": [2, 2], "ceil_mode": 1}),
        Case("ceil_mode_pads", [r(1, 1, 6, 6)], {"kernel_shape": [3, 3], "strides": [3, 3],
                                                 "pads": [1, 1, 1, 1], "ceil_mode": 1}),
        Case("ceil_drops_last_window", [r(1, 1, 2, 2)], {"kernel_shape": [1, 1], "strides": [2, 2],
                                                         "ceil_mode": 1}),
        Case("dilations", [r(1, 2, 7, 8)], {"kernel_shape": [2, 3], "dilations": [2, 2], "pads": [1, 0, 1, 2]}),
        Case("same_upper", [r(1, 2, 7, 6)], {"kernel_shape": [3, 2], "strides": [2, 2], "auto_pad": "SAME_UPPER"}),
        Case("same_lower", [r(1, 2, 7, 6)], {"kernel_shape": [3, 2], "strides": [2, 2], "auto_pad": "SAME_LOWER"}),
        Case("valid", [r(1, 2, 7, 6)], {"kernel_shape": [3, 2], "strides": [2, 3], "auto_pad": "VALID"}),
        Case("1d", [r(2, 3, 17)], {"kernel_shape": [4], "strides": [3], "pads": [1, 2]}),
        Case("3d", [r(1, 2, 5, 6, 4)], {"kernel_shape": [2, 3, 2], "strides": [2, 1, 2], "pads": [1, 0, 1, 0, 1, 1]}),
        Case("window_misses_input", [r(1, 2, 1, 3)], {"kernel_shape": [2, 2], "dilations": [2, 2],
                                                      "pads": [1, 1, 1, 1]}),
        Case("empty_batch", [r(0, 2, 4, 4)], {"kernel_shape": [2, 2]}),
        Case("large", [r(2, 16, 64, 64)], {"kernel_shape": [3, 3], "strides": [2, 2], "pads": [1, 1, 1, 1]}),
    ]
    if average:
        cases += [
            Case("count_include_pad", [r(1, 2, 6, 5)], {"kernel_shape": [3, 3], "pads": [1, 2, 2, 1],
                                                        "count_include_pad": 1}),
            Case("count_include_pad_ceil", [r(1, 1, 6, 6)], {"kernel_shape": [3, 3], "strides": [3, 3],
                                                             "pads": [1, 1, 1, 1], "ceil_mode": 1,
                                                             "count_include_pad": 1}),
            Case("count_include_pad_same", [r(1, 2, 7, 6)], {"kernel_shape": [3, 3], "strides": [2, 2],
                                                             "auto_pad": "SAME_LOWER", "count_include_pad": 1}),
            Case("count_include_pad_dilations", [r(1, 1, 1, 3)], {"kernel_shape": [2, 2], "dilations": [2, 2],
                                                                  "pads": [1, 1, 1, 1], "count_include_pad": 1}),
        ]
    else:
        cases.append(Case("storage_order", [r(2, 3, 5, 7)], {"kernel_shape": [2, 3], "strides": [1, 2],
                                                             "pads": [1, 1, 0, 1], "storage_order": 1}))
        cases.append(Case("ties", [np.full((1, 2, 4, 4), 3, dtype)], {"kernel_shape": [2, 2], "pads": [1, 1, 0, 0]}))
    if t.is_float(dtype):
        special = np.resize(t.special_values(dtype), 2 * 6 * 6).reshape(1, 2, 6, 6)
        cases.append(Case("special", [special], {"kernel_shape": [2, 2], "strides": [1, 2]}))
        nan_late = r(1, 1, 4, 4)
        nan_late[0, 0, 1, 1] = np.nan
        nan_late[0, 0, 0, 0] = np.inf
        cases.append(Case("nan_after_inf", [nan_late], {"kernel_shape": [2, 2]}))
        # windows of more than 4 taps: the cpu plugin's separable path without Indices
        special_3x3 = np.resize(t.special_values(dtype), 2 * 7 * 9).reshape(1, 2, 7, 9)
        cases.append(Case("special_3x3", [special_3x3], {"kernel_shape": [3, 3], "strides": [2, 2],
                                                          "pads": [1, 1, 1, 1]}))
    else:
        cases.append(Case("extremes", [np.resize(t.special_values(dtype), 2 * 5 * 5).reshape(1, 2, 5, 5)],
                          {"kernel_shape": [2, 2], "pads": [1, 1, 0, 0]}))
    return cases


def _average_pool_cases(dtype, rng):
    cases = _pool_cases(dtype, rng, average=True)
    for case in cases:
        case.tolerance = mean_tolerance(dtype, math.prod(case.attrs["kernel_shape"]),
                                        _largest(magnitude(case.inputs[0])))
    return cases


_POOL_ATTRS = _window_attrs(pool=True) + (_flag("ceil_mode"),)

register(OpSpec(
    name="MaxPool", category="linalg", opset=22,
    inputs=(Input("X"),), outputs=("Y", "Indices"), optional_outputs=1, skippable_outputs=1,
    attrs=_POOL_ATTRS + (_flag("storage_order"),),
    dtypes=ALL_FLOAT + (I8, U8),
    infer=_infer_max_pool, reference=_ref_max_pool,
    cases=lambda dtype, rng: _pool_cases(dtype, rng, average=False),
    doc="Max over each window of X (N, C, D1, ...), and the flat index of the maximum in X (int64, over "
        "N x C x D1 x ..., the spatial part row-major or, with storage_order 1, column-major). Ties give "
        "the first maximum in the window's row-major order; NaN propagates (first NaN's index). ceil_mode "
        "drops a last window that would start in the end padding; pads must be smaller than the kernel "
        "extent. A window that misses the input gives the dtype's -inf (minimum) and index -1.",
))

register(OpSpec(
    name="AveragePool", category="linalg", opset=22,
    inputs=(Input("X"),), outputs=("Y",),
    attrs=_POOL_ATTRS + (_flag("count_include_pad"),),
    dtypes=ALL_FLOAT,
    infer=_infer_average_pool, reference=_ref_average_pool, cases=_average_pool_cases,
    tolerance=_MEAN_TABLE,
    doc="Mean over each window of X (N, C, D1, ...), summed in float64. The divisor counts the window's "
        "elements inside X, or with count_include_pad those inside the explicitly padded X (not the extra "
        "of ceil_mode). A window with nothing to count gives NaN.",
))


# -- global pools ---------------------------------------------------------------------------

def _infer_global_pool(inputs, attrs):
    (x,) = inputs
    if x.ndim < 2:
        raise ValueError(f"X has shape {x.shape}; it needs (N, C, D1, ...)")
    return [(x.shape[:2] + (1,) * (x.ndim - 2), x.dtype)]


def _global_pool_cases(dtype, rng, *, average: bool):
    r = lambda *shape: t.random(rng, shape, dtype)
    special = np.resize(t.special_values(dtype), 3 * 4 * 5).reshape(3, 4, 5)
    special[1] = 2.0  # batch 1: planes without NaN or infinities
    cases = [
        Case("2d", [r(2, 3, 5, 5)]),
        Case("1d", [r(1, 4, 7)]),
        Case("3d", [r(2, 2, 3, 4, 5)]),
        Case("rank2", [r(3, 4)]),
        Case("size1", [r(2, 3, 1, 1)]),
        Case("empty_batch", [r(0, 3, 4, 4)]),
        Case("empty_spatial", [r(2, 3, 0, 4)]),
        Case("large", [r(2, 3, 20011)]),
        Case("special", [special]),
    ]
    if average:
        for case in cases:
            x = case.inputs[0]
            case.tolerance = mean_tolerance(dtype, math.prod(x.shape[2:]), _largest(magnitude(x)))
    return cases


def _ref_global_max(x, attrs):
    (x,) = x
    return [np.max(x, axis=tuple(range(2, x.ndim)), keepdims=True, initial=-np.inf)]


def _ref_global_average(x, attrs):
    (x,) = x
    axes = tuple(range(2, x.ndim))
    return [np.sum(x, axis=axes, keepdims=True) / math.prod(x.shape[2:])]  # an empty plane: 0/0


register(OpSpec(
    name="GlobalAveragePool", category="linalg", opset=22,
    inputs=(Input("X"),), outputs=("Y",), dtypes=ALL_FLOAT,
    infer=_infer_global_pool, reference=_ref_global_average,
    cases=lambda dtype, rng: _global_pool_cases(dtype, rng, average=True),
    tolerance=_MEAN_TABLE,
    doc="Mean of each (N, C) plane of X over all spatial axes, kept as size-1 dims; summed pairwise in "
        "float64. An empty plane gives NaN.",
))

register(OpSpec(
    name="GlobalMaxPool", category="linalg", opset=22,
    inputs=(Input("X"),), outputs=("Y",), dtypes=ALL_FLOAT,
    infer=_infer_global_pool, reference=_ref_global_max,
    cases=lambda dtype, rng: _global_pool_cases(dtype, rng, average=False),
    doc="Maximum of each (N, C) plane of X over all spatial axes, kept as size-1 dims. NaN propagates; "
        "an empty plane gives -inf.",
))


# -- Einsum ----------------------------------------------------------------------------------

_EINSUM_TOKEN = re.compile(r"\.\.\.|[A-Za-z]")


def _einsum_term(term: str, where: str) -> list[str]:
    tokens = _EINSUM_TOKEN.findall(term)
    if "".join(tokens) != term:
        raise ValueError(f"{where} '{term}' may hold only letters and one '...'")
    if tokens.count("...") > 1:
        raise ValueError(f"{where} '{term}' has more than one '...'")
    return tokens


def parse_einsum(equation: str, shapes) -> tuple[list[list], list, dict]:
    """Einsum's labels: per input its label per dim (letters, and integers
    0..e-1 for the dims of a broadcast ellipsis spanning e dims, right-aligned
    as NumPy aligns them), the output's labels, and every label's size.

    The implicit output is the ellipsis dims, then the letters that occur
    once, in ASCII order (upper case first)."""
    eq = equation.replace(" ", "")
    lhs, arrow, rhs = eq.partition("->")
    if "->" in rhs:
        raise ValueError(f"equation '{equation}' has more than one '->'")
    terms = lhs.split(",")
    if len(terms) != len(shapes):
        raise ValueError(f"equation '{equation}' has {len(terms)} operand terms for {len(shapes)} inputs")
    tokens = [_einsum_term(term, f"operand term {i}") for i, term in enumerate(terms)]
    spans = []
    for i, (toks, shape) in enumerate(zip(tokens, shapes)):
        letters = len(toks) - toks.count("...")
        span = len(shape) - letters
        if span < 0 or (span > 0 and "..." not in toks):
            raise ValueError(f"operand term {i} '{terms[i]}' has {letters} labels for input {i} of rank {len(shape)}")
        spans.append(span if "..." in toks else 0)
    ellipsis = max(spans, default=0)
    labels, sizes = [], {}
    for i, (toks, shape, span) in enumerate(zip(tokens, shapes, spans)):
        expanded = []
        for tok in toks:
            expanded += list(range(ellipsis - span, ellipsis)) if tok == "..." else [tok]
        mine = {}
        for label, size in zip(expanded, shape):
            if label in mine and mine[label] != size:
                raise ValueError(f"input {i} repeats label '{label}' over dims of sizes {mine[label]} and {size}")
            mine[label] = size
            known = sizes.get(label, 1)
            if size != 1 and known != 1 and size != known:
                name = f"'{label}'" if isinstance(label, str) else "of the ellipsis"
                raise ValueError(f"label {name} has size {known} in an earlier input and {size} in input {i}")
            sizes[label] = size if size != 1 else known
        labels.append(expanded)
    if arrow:
        out_tokens = _einsum_term(rhs, "output term")
        letters = [tok for tok in out_tokens if tok != "..."]
        if len(set(letters)) != len(letters):
            raise ValueError(f"output term '{rhs}' repeats a label")
        missing = [tok for tok in letters if tok not in sizes]
        if missing:
            raise ValueError(f"output label '{missing[0]}' does not occur in any input term")
        if ellipsis and "..." not in out_tokens:
            raise ValueError(f"the inputs' '...' spans {ellipsis} dims but the output term '{rhs}' has no '...'")
        output = []
        for tok in out_tokens:
            output += list(range(ellipsis)) if tok == "..." else [tok]
    else:
        counts = {}
        for expanded in labels:
            for label in expanded:
                if isinstance(label, str):
                    counts[label] = counts.get(label, 0) + 1
        output = list(range(ellipsis)) + sorted(label for label, n in counts.items() if n == 1)
    return labels, output, sizes


def _infer_einsum(inputs, attrs):
    dtype = require_same_dtype(inputs, [f"input {i}" for i in range(len(inputs))])
    _, output, sizes = parse_einsum(attrs["equation"], [i.shape for i in inputs])
    return [(tuple(sizes[label] for label in output), dtype)]


def _ref_einsum(x, attrs):
    return [np.einsum(attrs["equation"], *x)]


def _einsum_cases(dtype, rng):
    r = lambda *shape: t.random(rng, shape, dtype)

    def case(name, equation, *operands):
        labels, output, sizes = parse_einsum(equation, [o.shape for o in operands])
        summed = {label for expanded in labels for label in expanded} - set(output)
        terms = math.prod(sizes[label] for label in summed)
        sums = np.einsum(equation, *[magnitude(o) for o in operands])
        return Case(name, list(operands), {"equation": equation},
                    tolerance=dot_tolerance(dtype, terms, _largest(sums)))

    special = r(3, 4)
    special[0, 1], special[2, 2], special[1, 3] = np.nan, np.inf, -np.inf
    return [
        case("matmul", "ij,jk->ik", r(5, 6), r(6, 7)),
        case("batch_matmul", "bij,bjk->bik", r(3, 4, 5), r(3, 5, 6)),
        case("implicit", "ij,jk", r(4, 3), r(3, 5)),
        case("implicit_ascii_order", "bA,Ac", r(3, 4), r(4, 2)),
        case("transpose", "ij->ji", r(4, 7)),
        case("permute_3d", "ijk->kij", r(2, 3, 4)),
        case("trace", "ii", r(5, 5)),
        case("diagonal", "ii->i", r(6, 6)),
        case("batch_diagonal", "...ii->...i", r(3, 2, 4, 4)),
        case("sum_all", "ij->", r(5, 9)),
        case("sum_axis", "ijk->ik", r(3, 4, 5)),
        case("outer", "i,j->ij", r(5), r(7)),
        case("inner", "i,i", r(33), r(33)),
        case("hadamard", "ij,ij->ij", r(3, 4), r(3, 4)),
        case("broadcast_size1", "ij,ij->ij", r(3, 1), r(3, 4)),
        case("ellipsis_broadcast", "...ij,...jk->...ik", r(2, 1, 3, 4), r(5, 4, 2)),
        case("ellipsis_implicit", "...ij,...jk", r(2, 3, 4), r(4, 2)),
        case("three_operands", "ij,jk,kl->il", r(3, 4), r(4, 5), r(5, 2)),
        case("sum_before_contract", "ijk,jl->il", r(3, 4, 5), r(4, 6)),
        case("batch_kept_order", "bij,bkj->kbi", r(2, 3, 4), r(2, 5, 4)),
        case("repeated_and_contracted", "iij,jk->ik", r(3, 3, 4), r(4, 5)),
        case("scalar_operand", ",ij->ij", r(), r(3, 4)),
        case("spaces", " ij , jk -> ik ", r(2, 3), r(3, 4)),
        case("k_zero", "ij,jk->ik", r(3, 0), r(0, 4)),
        case("empty_output", "ij,jk->ik", r(0, 3), r(3, 4)),
        case("odd_blocking", "ij,kj->ik", r(67, 129), r(33, 129)),
        case("large", "ij,jk->ik", r(256, 128), r(128, 400)),
        case("special", "ij,jk->ik", special, r(4, 5)),
    ]


register(OpSpec(
    name="Einsum", category="linalg", opset=13,
    inputs=(Input("Inputs", variadic=True),), outputs=("Output",),
    attrs=(Attr("equation", "string", REQUIRED),),
    dtypes=ALL_FLOAT,
    infer=_infer_einsum, reference=_ref_einsum, cases=_einsum_cases, tolerance=_DOT_TABLE,
    doc="Einstein summation (Einsum-12, unchanged through opset 23) with NumPy's rules: explicit ('->') or "
        "implicit output, repeated labels (diagonals), '...' broadcasting (right-aligned, size-1 dims "
        "broadcast, ellipsis ranks may differ), sums over labels absent from the output, spaces ignored. "
        "Operands contract pairwise, left to right, as batched GEMMs after summing out labels no later "
        "term needs.",
))
