"""Training ops: gradients, a loss and optimizer updates.

Three groups, by where their semantics come from:

- Gradient ops, defined by devkit (domain "devkit", opset = the forward op's
  opset) and named after onnxruntime's training ops where one exists:
  ReluGrad, LeakyReluGrad, SigmoidGrad, TanhGrad, GeluGrad, SoftmaxGrad,
  LogSoftmaxGrad, ConvGrad, MaxPoolGrad, AveragePoolGrad,
  BatchNormalizationGrad, LayerNormalizationGrad, RMSNormalizationGrad and
  SoftmaxCrossEntropyLossGrad. Each takes the gradient of the loss with
  respect to the forward op's output (dY) first, then what the forward op
  saw or produced, and returns the gradients with respect to the forward op's
  inputs. Their attributes are the forward op's.
- SoftmaxCrossEntropyLoss, ONNX's (opset 13).
- Momentum, Adam and Adagrad of ONNX's ai.onnx.preview.training domain
  (opset 1), with the semantics of ONNX's reference implementation. R (the
  learning rate) and T (the update count) are host inputs; the tensors are
  variadic: X1..Xn, G1..Gn, then the optimizer state (V1..Vn, H1..Hn).

MatMul and Gemm need no gradient ops: their gradients are MatMul and Gemm on
transposed operands, reduced over broadcast dims. ``matmul_grad`` and
``gemm_grad`` compose them from forward ops through run_op, on any plugin.

Numerics. The cpu plugin computes in float64 and rounds once on store
(ConvGrad multiplies in float32 for float32, float16 and bfloat16, as Conv
does). The tolerances are wider than that: they admit a plugin that computes
float32 (and float16/bfloat16) in float32 arithmetic. They were measured with
a float32 emulation of the straightforward formulas (NumPy float32,
sequential float32 sums) on the cases, then given a margin. Where a formula
subtracts nearly equal terms (the gradient of Gelu near its minimum, the
centring in the normalization gradients, x - r * step in the optimizers) the
error is bounded relative to the terms, not to the result, hence an atol.
Inputs lie in [-4, 4]. Outputs that are long sums (ConvGrad, the pool and
normalization gradients) state a per-case bound instead, devkit/ops/linalg.py's
dot_tolerance: atol = 2 u sqrt(K) S for sums of K terms whose magnitudes add
up to S, each output checked in a case of its own where their sums differ.
"""

from __future__ import annotations

import math

import numpy as np

from . import dispatch
from . import testing as t
from .linalg import dot_tolerance, magnitude, window_geometry
from .spec import (ALL_FLOAT, F32, F64, FLOAT, I32, I64, REQUIRED, Attr, Case, Input, OpSpec, TensorInfo,
                   Tolerance, dtype_name, get, normalize_axis, register, require_same_dtype)

_U32, _U64 = 2.0 ** -24, 2.0 ** -53  # unit roundoff of the compute types


def _f32(value: float) -> float:
    """``value`` rounded to float32, the precision of ONNX float attributes."""
    return float(np.float32(value))


def _tolerances(f32: Tolerance, f64: Tolerance, low: Tolerance) -> dict:
    """float32, float64 and float16/bfloat16 (computed in float32, rounded once) tolerances."""
    return {"float32": f32, "float64": f64, "float16": low, "bfloat16": low}


def _same_as(info: TensorInfo, other: TensorInfo, name: str, other_name: str) -> None:
    if tuple(info.shape) != tuple(other.shape):
        raise ValueError(f"{name} has shape {tuple(info.shape)} but {other_name} has {tuple(other.shape)}; "
                         "they must be equal")
    if info.dtype != other.dtype:
        raise TypeError(f"{name} has dtype {dtype_name(info.dtype)} but {other_name} has "
                        f"{dtype_name(other.dtype)}")


def _require_float(info: TensorInfo, name: str) -> None:
    if info.dtype not in ALL_FLOAT:
        raise TypeError(f"{name} must be a float tensor, got {dtype_name(info.dtype)}")


def _reduce_to(a: np.ndarray, shape: tuple[int, ...]) -> np.ndarray:
    """Sums ``a`` over the dims that ``shape`` broadcasts along (the adjoint of broadcasting)."""
    lead = a.ndim - len(shape)
    axes = tuple(range(lead)) + tuple(lead + i for i, n in enumerate(shape) if n == 1 and a.shape[lead + i] != 1)
    return np.sum(a, axis=axes, keepdims=True).reshape(shape)


# -- pointwise activation gradients -------------------------------------------------------

def _infer_pointwise(inputs, attrs):
    dy, other = inputs
    _same_as(dy, other, "dY", "the forward tensor")
    return [(dy.shape, dy.dtype)]


def _sigmoid(x):
    e = np.exp(-np.abs(x))
    return np.where(x >= 0, 1.0, e) / (1.0 + e)


_SQRT_HALF, _INV_SQRT_2PI = math.sqrt(0.5), 1.0 / math.sqrt(2.0 * math.pi)
_GELU_K, _GELU_C = math.sqrt(2.0 / math.pi), 0.044715
_erfc = np.vectorize(math.erfc, otypes=[np.float64])


def _gelu_derivative(x, approximate):
    """d Gelu / dx, in the forms the kernels evaluate; its limits (1 and 0)
    at +-inf, where the formulas would multiply an infinity by zero."""
    with np.errstate(over="ignore", invalid="ignore"):
        if approximate == "tanh":
            u = _GELU_K * (x + _GELU_C * x * x * x)
            e = np.exp(-2.0 * np.abs(u))
            sech2 = 4.0 * e / ((1.0 + e) * (1.0 + e))
            slope = 0.5 * x * _GELU_K * (1.0 + 3.0 * _GELU_C * x * x)
            return _sigmoid(2.0 * u) + np.where(sech2 == 0.0, 0.0, slope * sech2)
        phi = np.exp(-0.5 * x * x) * _INV_SQRT_2PI
        return 0.5 * _erfc(-x * _SQRT_HALF) + np.where(phi == 0.0, 0.0, x * phi)


def _pointwise_cases(forward=None, low=-4.0, high=4.0, variants=()):
    """Cases of a pointwise gradient (dY, T): T is X, or the forward output
    ``forward(X)`` when given. Random values in several shapes, each dtype's
    special values as T (with random dY) and as dY, and attribute variants."""

    def cases(dtype, rng):
        def pair(*shape):
            x = t.random(rng, shape, np.float64, low, high)
            second = forward(x) if forward else x
            return [t.random(rng, shape, dtype), np.asarray(second).astype(dtype)]

        special = t.special_values(dtype)
        result = [
            Case("random", pair(3, 1, 7)),
            Case("scalar", pair()),
            Case("empty", pair(2, 0, 3)),
            Case("large", pair(1031, 67)),
            Case("huge", pair(100_003)),
            Case("special_forward", [t.random(rng, special.shape, dtype), special]),
            Case("special_dy", [special, pair(special.size)[1]]),
        ]
        for suffix, attrs in variants:
            result += [Case(f"random_{suffix}", pair(4, 9), dict(attrs)),
                       Case(f"special_{suffix}", [t.random(rng, special.shape, dtype), special], dict(attrs))]
        return result

    return cases


def _pointwise(name, opset, second, reference, doc, *, attrs=(), tolerance, cases):
    return OpSpec(name=name, category="training", domain="devkit", opset=opset,
                  inputs=(Input("dY"), Input(second)), outputs=("dX",), attrs=attrs, dtypes=ALL_FLOAT,
                  infer=_infer_pointwise, reference=lambda x, a: [reference(x[0], x[1], a)],
                  cases=cases, tolerance=tolerance, doc=doc)


# The products dY * ... round at most three times in float32: 3 ulp (float32
# emulation: 1 ulp for SigmoidGrad, 2 for TanhGrad).
_PRODUCT_TOLERANCE = _tolerances(Tolerance(ulp=3), Tolerance(ulp=3), Tolerance(ulp=1))
# erfc/exp round a few times, and Phi(x) + x phi(x) cancels near Gelu's
# minimum (x = -0.75): there the error is bounded in units of roundoff of
# the terms times |dY| <= 4. Float32 emulation: 3 ulp, and where above 4 ulp
# at most 3e-7 (5 u) absolute (a dense sweep of x in [-6, 6]); atol 16 u.
_GELU_TOLERANCE = _tolerances(Tolerance(ulp=4, atol=16 * _U32), Tolerance(ulp=4, atol=16 * _U64),
                              Tolerance(ulp=1, atol=16 * _U32))

register(
    _pointwise("ReluGrad", 14, "X", lambda dy, x, a: np.where(x <= 0, 0.0, dy),
               "dX = dY where X > 0, else 0 (0 at X = 0; a NaN X passes dY through, as PyTorch's "
               "threshold_backward).",
               tolerance=Tolerance(), cases=_pointwise_cases()),
    _pointwise("LeakyReluGrad", 16, "X", lambda dy, x, a: np.where(x > 0, dy, a["alpha"] * dy),
               "dX = dY where X > 0, else alpha * dY (alpha * dY at X = 0 and for a NaN X).",
               attrs=(Attr("alpha", "float", _f32(0.01), doc="LeakyRelu's slope for X < 0"),),
               tolerance=_tolerances(Tolerance(), Tolerance(), Tolerance(ulp=1)),
               cases=_pointwise_cases(variants=[("alpha", {"alpha": _f32(0.1)}),
                                                ("negative_alpha", {"alpha": -1.5})])),
    _pointwise("SigmoidGrad", 13, "Y", lambda dy, y, a: dy * (y * (1.0 - y)),
               "dX = dY * (Y * (1 - Y)), Y the output of Sigmoid.",
               tolerance=_PRODUCT_TOLERANCE,
               cases=_pointwise_cases(_sigmoid, -8.0, 8.0)),
    _pointwise("TanhGrad", 13, "Y", lambda dy, y, a: dy * ((1.0 - y) * (1.0 + y)),
               "dX = dY * ((1 - Y) * (1 + Y)), Y the output of Tanh; the factored form keeps its "
               "accuracy where |Y| is near 1 (1 - Y * Y would cancel).",
               tolerance=_PRODUCT_TOLERANCE,
               cases=_pointwise_cases(np.tanh, -5.0, 5.0)),
    _pointwise("GeluGrad", 20, "X", lambda dy, x, a: dy * _gelu_derivative(x, a["approximate"]),
               "dX = dY * Gelu'(X). approximate='none': Phi(X) + X phi(X) (Phi = erfc(-X / sqrt 2) / 2, "
               "phi the standard normal density); 'tanh' (onnxruntime's FastGeluGrad): with u = sqrt(2/pi) "
               "(X + 0.044715 X^3), sigmoid(2u) + X/2 sqrt(2/pi) (1 + 3 * 0.044715 X^2) sech^2(u). At "
               "+-inf the derivative is its limit, 1 or 0.",
               attrs=(Attr("approximate", "string", "none", choices=("none", "tanh")),),
               tolerance=_GELU_TOLERANCE,
               cases=_pointwise_cases(low=-6.0, high=6.0, variants=[("tanh", {"approximate": "tanh"})])),
)


# -- SoftmaxGrad, LogSoftmaxGrad ------------------------------------------------------------

def _infer_softmax_grad(inputs, attrs):
    dy, y = inputs
    _same_as(dy, y, "dY", "Y")
    normalize_axis(attrs["axis"], dy.ndim)
    return [(dy.shape, dy.dtype)]


def _softmax_grad(inputs, attrs):
    dy, y = inputs
    axis = normalize_axis(attrs["axis"], dy.ndim)
    return [y * (dy - np.sum(dy * y, axis=axis, keepdims=True))]


def _log_softmax_grad(inputs, attrs):
    dy, y = inputs
    axis = normalize_axis(attrs["axis"], dy.ndim)
    return [dy - np.exp(y) * np.sum(dy, axis=axis, keepdims=True)]


def _softmax_grad_cases(log: bool):
    def cases(dtype, rng):
        def pair(*shape, axis=-1):
            x = t.random(rng, shape, np.float64)
            axis = normalize_axis(axis, len(shape))
            shifted = x - np.max(x, axis=axis, keepdims=True, initial=-np.inf)
            with np.errstate(divide="ignore", invalid="ignore"):
                y = np.log(np.exp(shifted) / np.sum(np.exp(shifted), axis=axis, keepdims=True))
            return [t.random(rng, shape, dtype), (y if log else np.exp(y)).astype(dtype)]

        special_dy = pair(3, 5)
        special_dy[0][0, :4] = np.array([np.nan, np.inf, -np.inf, -0.0]).astype(dtype)
        special_dy[0][1, 2] = np.inf
        special_y = pair(3, 4)
        special_y[1][0] = np.array([-np.inf, 0.0, -np.inf, -np.inf] if log else [0.0, 1.0, 0.0, 0.0]).astype(dtype)
        special_y[1][1, 1] = np.nan
        return [
            Case("default_axis", pair(3, 4, 5)),
            Case("axis0", pair(3, 4, 5, axis=0), {"axis": 0}),
            Case("axis1", pair(3, 4, 5, axis=1), {"axis": 1}),
            Case("negative_axis", pair(2, 3, 4, 5, axis=-3), {"axis": -3}),
            Case("size1_axis", pair(4, 1)),
            Case("special_dy", special_dy),
            Case("special_y", special_y),
            Case("empty_outer", pair(0, 5)),
            Case("empty_axis", pair(3, 0)),
            Case("large_rows", pair(97, 1031)),
            Case("large_first_axis", pair(1031, 67, axis=0), {"axis": 0}),
            Case("large_1d", pair(100_003)),
        ]
    return cases


_SOFTMAX_AXIS = Attr("axis", "int", -1, doc="the forward op's axis; negative counts from the back")
# The sum over the axis (up to 1e5 terms) rounds; dY - sum cancels. Float32
# emulation: at most 2.4e-7 absolute for SoftmaxGrad (Y <= 1 scales it down)
# and 1.4e-6 for LogSoftmaxGrad; float64 (the cpu plugin, pairwise sums
# against NumPy's): 7e-18 and 2.7e-15.
_SOFTMAX_GRAD_TOLERANCE = _tolerances(Tolerance(ulp=4, atol=1e-6), Tolerance(ulp=4, atol=1e-15),
                                      Tolerance(ulp=1, atol=1e-6))
_LOG_SOFTMAX_GRAD_TOLERANCE = _tolerances(Tolerance(ulp=4, atol=5e-6), Tolerance(ulp=4, atol=1e-14),
                                          Tolerance(ulp=1, atol=5e-6))

register(
    OpSpec(name="SoftmaxGrad", category="training", domain="devkit", opset=13,
           inputs=(Input("dY"), Input("Y", doc="the output of Softmax")), outputs=("dX",),
           attrs=(_SOFTMAX_AXIS,), dtypes=ALL_FLOAT, infer=_infer_softmax_grad, reference=_softmax_grad,
           cases=_softmax_grad_cases(log=False), tolerance=_SOFTMAX_GRAD_TOLERANCE,
           doc="dX = Y * (dY - sum(dY * Y along axis)), the sum taken in float64 on the cpu plugin."),
    OpSpec(name="LogSoftmaxGrad", category="training", domain="devkit", opset=13,
           inputs=(Input("dY"), Input("Y", doc="the output of LogSoftmax")), outputs=("dX",),
           attrs=(_SOFTMAX_AXIS,), dtypes=ALL_FLOAT, infer=_infer_softmax_grad, reference=_log_softmax_grad,
           cases=_softmax_grad_cases(log=True), tolerance=_LOG_SOFTMAX_GRAD_TOLERANCE,
           doc="dX = dY - exp(Y) * sum(dY along axis), the sum taken in float64 on the cpu plugin."),
)


# -- ConvGrad ---------------------------------------------------------------------------------

_CONV = get("Conv")


def _infer_conv_grad(inputs, attrs):
    dy, x, w = inputs
    require_same_dtype(inputs, ["dY", "X", "W"])
    ((y_shape, _),) = _CONV.infer([x, w, None], attrs)
    if tuple(dy.shape) != tuple(y_shape):
        raise ValueError(f"dY has shape {tuple(dy.shape)} but Conv of X {tuple(x.shape)} and W "
                         f"{tuple(w.shape)} gives {tuple(y_shape)}")
    return [(x.shape, x.dtype), (w.shape, w.dtype), ((w.shape[0],), w.dtype)]


def _conv_grad_reference(inputs, attrs):
    dy, x, w = inputs
    group, kernel = attrs["group"], w.shape[2:]
    out, begin, end, strides, dilations = window_geometry(x.shape[2:], kernel, attrs)
    batch, m, c = x.shape[0], w.shape[0], x.shape[1]
    cg, mg, positions = c // group, m // group, math.prod(out)
    dw = np.zeros(w.shape)
    padded_dx = np.zeros(x.shape[:2] + tuple(n + b + e for n, b, e in zip(x.shape[2:], begin, end)))
    if all(out):
        padded = np.pad(x, [(0, 0), (0, 0)] + list(zip(begin, end)))
        dys = dy.reshape(batch, group, mg, positions)
        for tap in np.ndindex(*kernel):
            window = (slice(None), slice(None)) + tuple(
                slice(k * d, k * d + (o - 1) * s + 1, s) for k, d, o, s in zip(tap, dilations, out, strides))
            xs = padded[window].reshape(batch, group, cg, positions)
            wt = w[(slice(None), slice(None)) + tap].reshape(group, mg, cg)
            dw[(slice(None), slice(None)) + tap] = np.einsum("bgmp,bgcp->gmc", dys, xs).reshape(m, cg)
            padded_dx[window] += np.einsum("gmc,bgmp->bgcp", wt, dys).reshape((batch, c) + tuple(out))
    dx = padded_dx[(slice(None), slice(None)) + tuple(slice(b, b + n) for b, n in zip(begin, x.shape[2:]))]
    return [dx, dw, dy.sum(axis=(0,) + tuple(range(2, dy.ndim)))]


def _conv_grad_cases(dtype, rng):
    r = lambda *shape: t.random(rng, shape, dtype)  # noqa: E731

    def cases(name, x, w, **attrs):
        """Two cases: dX, then dW and dB, each held to the dot-product
        tolerance of its own sums (K products summing to at most S)."""
        full = {"group": 1, "auto_pad": "NOTSET", **attrs}
        ((y_shape, _),) = _CONV.infer([TensorInfo(x.shape, x.dtype), TensorInfo(w.shape, w.dtype), None], full)
        dy = r(*y_shape)
        dx, dw, db = _conv_grad_reference([magnitude(dy), magnitude(x), magnitude(w)], full)
        dx_terms = w.shape[0] // full["group"] * math.prod(w.shape[2:])
        dw_terms = y_shape[0] * math.prod(y_shape[2:])
        largest = lambda a: float(a.max()) if a.size else 0.0  # noqa: E731
        return [Case(f"{name}_dx", [dy, x, w], attrs, compare=[0],
                     tolerance=dot_tolerance(dtype, dx_terms, largest(dx))),
                Case(f"{name}_dw_db", [dy, x, w], attrs, compare=[1, 2],
                     tolerance=dot_tolerance(dtype, dw_terms, max(largest(dw), largest(db))))]

    special = r(1, 2, 5, 5)
    special[0, 0, 1, 1], special[0, 1, 3, 2], special[0, 0, 4, 4] = np.nan, np.inf, -np.inf
    return [
        *cases("basic", r(1, 1, 5, 5), r(1, 1, 3, 3), pads=[1, 1, 1, 1]),
        *cases("strides", r(2, 3, 7, 6), r(4, 3, 3, 3), strides=[2, 2]),
        *cases("asymmetric_pads", r(1, 2, 7, 5), r(3, 2, 3, 2), pads=[1, 0, 2, 1], strides=[2, 1]),
        *cases("same_upper", r(1, 2, 7, 6), r(3, 2, 3, 4), auto_pad="SAME_UPPER", strides=[2, 2]),
        *cases("same_lower", r(1, 2, 7, 6), r(3, 2, 3, 4), auto_pad="SAME_LOWER", strides=[2, 2]),
        *cases("valid", r(1, 2, 7, 6), r(3, 2, 3, 2), auto_pad="VALID", strides=[2, 3]),
        *cases("kernel_shape", r(1, 2, 6, 6), r(2, 2, 2, 3), kernel_shape=[2, 3]),
        *cases("group", r(2, 4, 6, 6), r(6, 2, 3, 3), group=2, pads=[1, 1, 1, 1]),
        *cases("depthwise", r(1, 5, 8, 8), r(5, 1, 3, 3), group=5, pads=[1, 1, 1, 1]),
        *cases("dilations", r(1, 3, 9, 8), r(2, 3, 3, 2), dilations=[2, 3], pads=[2, 1, 0, 2]),
        *cases("stride_skips_input", r(1, 2, 8, 8), r(2, 2, 2, 2), strides=[3, 3]),
        *cases("conv1d", r(2, 3, 20), r(4, 3, 5), strides=[3], pads=[2, 1], dilations=[2]),
        *cases("conv3d", r(1, 2, 5, 6, 4), r(3, 2, 3, 2, 2), pads=[1, 0, 1, 1, 1, 0], strides=[2, 1, 2]),
        *cases("pointwise", r(2, 8, 5, 7), r(6, 8, 1, 1)),
        *cases("pointwise_strided", r(2, 8, 5, 7), r(6, 8, 1, 1), strides=[2, 2]),
        *cases("odd_blocking", r(1, 13, 11, 9), r(17, 13, 3, 3), pads=[1, 1, 1, 1]),
        *cases("empty_batch", r(0, 3, 5, 5), r(2, 3, 3, 3)),
        *cases("empty_channels", r(1, 0, 5, 5), r(4, 0, 3, 3)),
        *cases("no_filters", r(2, 3, 5, 5), r(0, 3, 3, 3)),
        *cases("large", r(2, 16, 40, 40), r(32, 16, 3, 3), pads=[1, 1, 1, 1]),
        *cases("special", special, r(2, 2, 3, 3), pads=[1, 1, 1, 1]),
    ]


register(OpSpec(
    name="ConvGrad", category="training", domain="devkit", opset=_CONV.opset,
    inputs=(Input("dY"), Input("X"), Input("W")), outputs=("dX", "dW", "dB"),
    attrs=_CONV.attrs, dtypes=ALL_FLOAT,
    infer=_infer_conv_grad, reference=_conv_grad_reference, cases=_conv_grad_cases,
    tolerance={dtype_name(d): dot_tolerance(d, 256, 256 * 16.0) for d in ALL_FLOAT},
    doc="The gradients of Conv(X, W, B) with Conv's attributes: dX (X's shape), dW (W's shape) and dB "
        "(M,), the sum of dY over the batch and spatial dims. Per image and group, dW += dY im2col(X)^T "
        "and dX = col2im(W^T dY), both GEMMs (the cpu plugin: dX of float32 3x3 kernels with unit strides "
        "as Conv's Winograd of dY with the flipped kernels); float16/bfloat16 run as float32. Each case states the "
        "dot-product tolerance of its sums (see devkit/ops/linalg.py).",
))


# -- MaxPoolGrad, AveragePoolGrad ------------------------------------------------------------

def _x_shape(info: TensorInfo, dy: TensorInfo) -> tuple[int, ...]:
    """The X_shape host input, checked against dY: (N, C, D1, ...) of dY's rank."""
    shape = info.value.reshape(-1)
    if info.dtype.kind not in "iu" or info.value.ndim != 1:
        raise TypeError(f"X_shape must be a 1-D integer tensor, got {dtype_name(info.dtype)} of shape "
                        f"{tuple(info.value.shape)}")
    shape = tuple(int(v) for v in shape)
    if len(shape) != dy.ndim or any(n < 0 for n in shape):
        raise ValueError(f"X_shape {list(shape)} must list {dy.ndim} sizes >= 0, dY's rank")
    if shape[:2] != tuple(dy.shape[:2]):
        raise ValueError(f"X_shape {list(shape)} disagrees with dY {tuple(dy.shape)} on (N, C)")
    return shape


def _infer_max_pool_grad(inputs, attrs):
    dy, indices, x_shape = inputs
    _require_float(dy, "dY")
    if indices.dtype != I64 or tuple(indices.shape) != tuple(dy.shape):
        raise ValueError(f"Indices must be int64 of dY's shape {tuple(dy.shape)}, got "
                         f"{dtype_name(indices.dtype)} {tuple(indices.shape)}")
    if dy.ndim < 3:
        raise ValueError(f"dY has shape {tuple(dy.shape)}; it needs (N, C, D1, ...)")
    return [(_x_shape(x_shape, dy), dy.dtype)]


def _row_major(index: np.ndarray, spatial: tuple[int, ...]) -> np.ndarray:
    """MaxPool's column-major indices (storage_order 1) as row-major ones."""
    plane = math.prod(spatial)
    base, rest = np.divmod(index, max(plane, 1))
    coords = []
    for n in spatial:
        rest, coord = np.divmod(rest, n)
        coords.append(coord)
    return base * plane + np.ravel_multi_index(coords, spatial) if plane else index


def _max_pool_grad_reference(inputs, attrs):
    dy, indices = inputs[0], inputs[1]
    shape = tuple(int(v) for v in np.asarray(attrs["X_shape"]).reshape(-1))
    index = indices.reshape(-1)
    used = index >= 0
    if attrs["storage_order"] == 1:
        index = np.where(used, _row_major(np.maximum(index, 0), shape[2:]), index)
    dx = np.zeros(math.prod(shape))
    np.add.at(dx, index[used], dy.reshape(-1)[used])
    return [dx.reshape(shape)]


_MAX_POOL = get("MaxPool")
_AVERAGE_POOL = get("AveragePool")


def _max_pool_grad_cases(dtype, rng):
    def case(name, x_shape, dy=None, **pool):
        """dY random (or given) over MaxPool's output of a random X; Indices from MaxPool."""
        x = t.random(rng, x_shape, np.float64)
        attrs = {"auto_pad": "NOTSET", "ceil_mode": 0, "storage_order": 0, **pool}
        y, indices = _MAX_POOL.reference([x], attrs)
        dy = t.random(rng, y.shape, dtype) if dy is None else dy
        # An X element gathers from at most prod(kernel_shape) overlapping windows.
        sums = _max_pool_grad_reference([magnitude(dy), indices], {"X_shape": x_shape, **attrs})[0]
        return Case(name, [dy, indices, np.array(x_shape, np.int64)], {"storage_order": attrs["storage_order"]},
                    tolerance=dot_tolerance(dtype, math.prod(attrs["kernel_shape"]),
                                            float(sums.max()) if sums.size else 0.0))

    special = t.special_values(dtype)
    return [
        case("2d_default", (1, 3, 8, 8), kernel_shape=[2, 2], strides=[2, 2]),
        case("overlapping", (2, 2, 7, 7), kernel_shape=[3, 3], pads=[1, 1, 1, 1]),
        case("strided_overlap", (1, 2, 9, 8), kernel_shape=[3, 2], strides=[2, 1], pads=[1, 0, 1, 1]),
        case("storage_order", (2, 3, 5, 7), kernel_shape=[2, 3], strides=[1, 2], pads=[1, 1, 0, 1],
             storage_order=1),
        case("dilations", (1, 2, 7, 8), kernel_shape=[2, 3], dilations=[2, 2], pads=[1, 0, 1, 2]),
        case("window_misses_input", (1, 2, 1, 3), kernel_shape=[2, 2], dilations=[2, 2], pads=[1, 1, 1, 1]),
        case("1d", (2, 3, 17), kernel_shape=[4], strides=[3], pads=[1, 2]),
        case("3d", (1, 2, 5, 6, 4), kernel_shape=[2, 3, 2], strides=[2, 1, 2], pads=[1, 0, 1, 0, 1, 1]),
        case("empty_batch", (0, 2, 4, 4), kernel_shape=[2, 2]),
        case("large", (2, 16, 64, 64), kernel_shape=[3, 3], strides=[2, 2], pads=[1, 1, 1, 1]),
        case("special_dy", (1, 1, special.size, 2), dy=special.reshape(1, 1, -1, 1), kernel_shape=[1, 2]),
    ]


def _infer_average_pool_grad(inputs, attrs):
    dy, x_shape = inputs
    _require_float(dy, "dY")
    if dy.ndim < 3:
        raise ValueError(f"dY has shape {tuple(dy.shape)}; it needs (N, C, D1, ...)")
    shape = _x_shape(x_shape, dy)
    ((y_shape, _),) = _AVERAGE_POOL.infer([TensorInfo(shape, dy.dtype)], attrs)
    if tuple(y_shape) != tuple(dy.shape):
        raise ValueError(f"dY has shape {tuple(dy.shape)} but AveragePool of X_shape {list(shape)} gives "
                         f"{tuple(y_shape)}")
    return [(shape, dy.dtype)]


def _average_pool_grad_reference(inputs, attrs):
    dy = inputs[0]
    shape = tuple(int(v) for v in np.asarray(attrs["X_shape"]).reshape(-1))
    sizes = shape[2:]
    out, begin, end, strides, dilations = window_geometry(sizes, attrs["kernel_shape"], attrs, pool=True)
    grids = np.meshgrid(*[np.arange(o) for o in out], indexing="ij")
    taps, count = [], np.zeros(out)
    for tap in np.ndindex(*attrs["kernel_shape"]):
        pos = [g * s - b + k * d for g, s, b, k, d in zip(grids, strides, begin, tap, dilations)]
        inside, padded = np.ones(out, bool), np.ones(out, bool)
        for p, n, e in zip(pos, sizes, end):
            inside &= (p >= 0) & (p < n)
            padded &= p < n + e
        taps.append((pos, inside))
        count += padded if attrs["count_include_pad"] else inside
    with np.errstate(divide="ignore", invalid="ignore"):
        share = dy / count  # a window with nothing to count has no tap inside X either
    dx = np.zeros(shape[:2] + (math.prod(sizes),))
    for pos, inside in taps:
        if inside.any():
            flat = np.ravel_multi_index([p[inside] for p in pos], sizes)
            np.add.at(dx, (slice(None), slice(None), flat), share[..., inside])
    return [dx.reshape(shape)]


def _average_pool_grad_cases(dtype, rng):
    def case(name, x_shape, dy=None, **pool):
        attrs = {"auto_pad": "NOTSET", "ceil_mode": 0, "count_include_pad": 0, **pool}
        ((y_shape, _),) = _AVERAGE_POOL.infer([TensorInfo(x_shape, F64)], attrs)
        dy = t.random(rng, y_shape, dtype) if dy is None else dy
        taps = math.prod(attrs["kernel_shape"])
        sums = _average_pool_grad_reference([magnitude(dy)], {"X_shape": x_shape, **attrs})[0]
        return Case(name, [dy, np.array(x_shape, np.int64)], pool,
                    tolerance=dot_tolerance(dtype, taps, float(sums.max()) if sums.size else 0.0))

    special = t.special_values(dtype)
    return [
        case("2d_default", (1, 3, 8, 8), kernel_shape=[2, 2], strides=[2, 2]),
        case("overlapping", (2, 2, 7, 7), kernel_shape=[3, 3], pads=[1, 1, 1, 1]),
        case("asymmetric_pads", (1, 2, 6, 5), kernel_shape=[3, 2], pads=[2, 0, 1, 1]),
        case("ceil_mode", (1, 2, 5, 6), kernel_shape=[2, 3], strides=[2, 2], ceil_mode=1),
        case("count_include_pad", (1, 2, 6, 5), kernel_shape=[3, 3], pads=[1, 2, 2, 1], count_include_pad=1),
        case("count_include_pad_ceil", (1, 1, 6, 6), kernel_shape=[3, 3], strides=[3, 3], pads=[1, 1, 1, 1],
             ceil_mode=1, count_include_pad=1),
        case("same_upper", (1, 2, 7, 6), kernel_shape=[3, 2], strides=[2, 2], auto_pad="SAME_UPPER"),
        case("same_lower_count_pad", (1, 2, 7, 6), kernel_shape=[3, 3], strides=[2, 2], auto_pad="SAME_LOWER",
             count_include_pad=1),
        case("valid", (1, 2, 7, 6), kernel_shape=[3, 2], strides=[2, 3], auto_pad="VALID"),
        case("dilations", (1, 2, 7, 8), kernel_shape=[2, 3], dilations=[2, 2], pads=[1, 0, 1, 2]),
        case("window_misses_input", (1, 2, 1, 3), kernel_shape=[2, 2], dilations=[2, 2], pads=[1, 1, 1, 1]),
        case("1d", (2, 3, 17), kernel_shape=[4], strides=[3], pads=[1, 2]),
        case("3d", (1, 2, 5, 6, 4), kernel_shape=[2, 3, 2], strides=[2, 1, 2], pads=[1, 0, 1, 0, 1, 1]),
        case("empty_batch", (0, 2, 4, 4), kernel_shape=[2, 2]),
        case("large", (2, 16, 64, 64), kernel_shape=[3, 3], strides=[2, 2], pads=[1, 1, 1, 1]),
        case("special_dy", (1, 1, special.size, 2), dy=special.reshape(1, 1, -1, 1), kernel_shape=[1, 2]),
    ]


_X_SHAPE = Input("X_shape", host=True, doc="the shape of the forward op's X")

register(
    OpSpec(name="MaxPoolGrad", category="training", domain="devkit", opset=_MAX_POOL.opset,
           inputs=(Input("dY"), Input("Indices", doc="MaxPool's Indices output"), _X_SHAPE),
           outputs=("dX",), attrs=(Attr("storage_order", "int", 0, choices=(0, 1),
                                        doc="the order MaxPool's indices were written in"),),
           dtypes=ALL_FLOAT, infer=_infer_max_pool_grad, reference=_max_pool_grad_reference,
           cases=_max_pool_grad_cases, tolerance={dtype_name(d): dot_tolerance(d, 9, 36.0) for d in ALL_FLOAT},
           doc="dX (X_shape) is zero but where MaxPool took a maximum: each dY element is added at its "
               "Indices element (flat over X, spatial part column-major with storage_order 1), summing "
               "where windows overlap. Index -1 (a window that missed X) contributes nothing; an index "
               "outside X fails the kernel (OutOfRangeError). The sums are taken in float64 on the cpu plugin."),
    OpSpec(name="AveragePoolGrad", category="training", domain="devkit", opset=_AVERAGE_POOL.opset,
           inputs=(Input("dY"), _X_SHAPE), outputs=("dX",), attrs=_AVERAGE_POOL.attrs,
           dtypes=ALL_FLOAT, infer=_infer_average_pool_grad, reference=_average_pool_grad_reference,
           cases=_average_pool_grad_cases,
           tolerance={dtype_name(d): dot_tolerance(d, 9, 36.0) for d in ALL_FLOAT},
           doc="The gradient of AveragePool (same attributes) on an X of shape X_shape: each dY element, "
               "divided by its window's divisor (AveragePool's count), is added to every X element of the "
               "window. The sums are taken in float64 on the cpu plugin."),
)


# -- normalization gradients -----------------------------------------------------------------

def _batchnorm_grad_infer(inputs, attrs):
    dy, x, scale, mean, inv_std = inputs
    _require_float(x, "X")
    _same_as(dy, x, "dY", "X")
    if x.ndim < 1:
        raise ValueError("X must have rank >= 1 (N, C, D1, ...)")
    channels = x.shape[1] if x.ndim >= 2 else 1
    for info, name in ((scale, "scale"), (mean, "mean"), (inv_std, "inv_std")):
        _require_float(info, name)
        if tuple(info.shape) != (channels,):
            raise ValueError(f"{name} has shape {tuple(info.shape)}; expected ({channels},), one value per channel")
    require_same_dtype([mean, inv_std], ["mean", "inv_std"])
    return [(x.shape, x.dtype), (scale.shape, scale.dtype), (scale.shape, scale.dtype)]


def _channel_view(param, ndim):
    return param.reshape((-1,) + (1,) * (ndim - 2)) if ndim >= 2 else param


def _batchnorm_grad_reference(inputs, attrs):
    dy, x, scale, mean, inv_std = inputs
    axes = (0,) + tuple(range(2, x.ndim))
    count = math.prod(x.shape[a] for a in axes)
    v = lambda p: _channel_view(p, x.ndim)  # noqa: E731
    xhat = (x - v(mean)) * v(inv_std)
    db = np.sum(dy, axis=axes)
    dscale = np.sum(dy * xhat, axis=axes)
    with np.errstate(invalid="ignore", divide="ignore"):
        dx = v(scale * inv_std) * (dy - v(db / count) - xhat * v(dscale / count))
    return [dx, dscale.reshape(scale.shape), db.reshape(scale.shape)]


def _batch_stats(x, dtype):
    """The batch mean and 1 / sqrt(var + 1e-5) per channel, as the forward pass saw them."""
    axes = (0,) + tuple(range(2, x.ndim))
    x = x.astype(np.float64)
    with np.errstate(invalid="ignore", divide="ignore"):
        mean = np.sum(x, axis=axes) / math.prod(x.shape[a] for a in axes)
        var = np.sum(np.square(x - _channel_view(mean, x.ndim)), axis=axes) / math.prod(x.shape[a] for a in axes)
    return [mean.reshape(-1).astype(dtype), (1.0 / np.sqrt(var + 1e-5)).reshape(-1).astype(dtype)]


def _largest(values) -> float:
    values = magnitude(values)
    return float(values.max()) if values.size else 0.0


def _split_by_output(name, inputs, attrs, dtype, dx_bound, params_bound):
    """Two cases: dX, then the parameter gradients, each held to the
    sum bound (dot_tolerance) of its own sums: (terms, largest sum of |terms|)."""
    return [Case(f"{name}_dx", inputs, attrs, compare=[0], tolerance=dot_tolerance(dtype, *dx_bound)),
            Case(f"{name}_params", inputs, attrs, compare=range(1, 3 if len(inputs) > 3 else 2),
                 tolerance=dot_tolerance(dtype, *params_bound))]


def _batchnorm_grad_cases(dtype, rng):
    r = lambda *shape: t.random(rng, shape, dtype)  # noqa: E731

    def cases(name, shape, params=dtype, dy=None):
        x, dy = r(*shape), r(*shape) if dy is None else dy
        c = shape[1] if len(shape) >= 2 else 1
        inputs = [dy, x, t.random(rng, (c,), params), *_batch_stats(x, params)]
        # Bounds from magnitudes: per channel M terms; dX_j's terms are
        # |scale inv| (|dY_j| + sum|dY| / M + |xhat_j| sum|dY xhat| / M).
        g, x, scale, mean, inv = (magnitude(v) for v in inputs)
        axes, v = (0,) + tuple(range(2, x.ndim)), lambda p: _channel_view(p, x.ndim)  # noqa: E731
        count = max(math.prod(x.shape[a] for a in axes), 1)
        xhat = np.abs(x - v(mean)) * v(inv)
        sum_g, sum_gx = np.sum(g, axis=axes), np.sum(g * xhat, axis=axes)
        dx = v(scale * inv) * (g + v(sum_g / count) + xhat * v(sum_gx / count))
        return _split_by_output(name, inputs, {}, dtype, (count, _largest(dx)),
                                (count, max(_largest(sum_g), _largest(sum_gx))))

    special_dy = r(2, 3, 5)
    special_dy[0, 0, :4] = np.array([np.nan, np.inf, -np.inf, -0.0]).astype(dtype)
    return [
        *cases("nchw", (2, 3, 4, 5)),
        *cases("nc_only", (5, 7)),
        *cases("1d_one_channel", (9,)),
        *cases("5d", (2, 3, 2, 3, 5)),
        *cases("params_in_other_dtype", (2, 3, 5), F64 if dtype == F32 else F32),
        *cases("one_per_channel", (1, 4, 1, 1)),
        *cases("empty_batch", (0, 3, 4)),
        *cases("large", (2, 67, 1031)),
        *cases("special_dy", (2, 3, 5), dy=special_dy),
    ]


def _row_norm_grad_infer(inputs, attrs, names, stats):
    dy, x, scale = inputs[:3]
    _require_float(x, "X")
    _same_as(dy, x, "dY", "X")
    if scale.dtype != x.dtype:
        raise TypeError(f"{names[2]} has dtype {dtype_name(scale.dtype)} but X has {dtype_name(x.dtype)}")
    axis = normalize_axis(attrs["axis"], x.ndim)
    shape = tuple(scale.shape)
    if len(shape) > x.ndim or any(s not in (1, n) for s, n in zip(reversed(shape), reversed(x.shape))):
        raise ValueError(f"{names[2]} of shape {shape} does not broadcast to X's shape {tuple(x.shape)}")
    if stats:
        expected = tuple(x.shape[:axis]) + (1,) * (x.ndim - axis)
        for info, name in zip(inputs[3:], ("Mean", "InvStdDev")):
            _require_float(info, name)
            if tuple(info.shape) != expected:
                raise ValueError(f"{name} has shape {tuple(info.shape)}; LayerNormalization with axis "
                                 f"{attrs['axis']} gives {expected}")
        require_same_dtype(inputs[3:], ["Mean", "InvStdDev"])
    return x, axis


def _layernorm_grad_infer(inputs, attrs):
    x, _ = _row_norm_grad_infer(inputs, attrs, ["dY", "X", "Scale"], stats=True)
    scale = inputs[2]
    return [(x.shape, x.dtype), (scale.shape, x.dtype), (scale.shape, x.dtype)]


def _rmsnorm_grad_infer(inputs, attrs):
    x, _ = _row_norm_grad_infer(inputs, attrs, ["dY", "X", "scale"], stats=False)
    return [(x.shape, x.dtype), (inputs[2].shape, x.dtype)]


def _row_norm_backward(dy, xhat, inv, scale, axes, centred):
    """dX of y = xhat * scale per row: inv * (g - mean(g) - xhat * mean(g * xhat)),
    g = dY * scale; without centring (RMS) the mean(g) term drops."""
    count = math.prod(dy.shape[a] for a in axes)
    g = dy * scale
    with np.errstate(invalid="ignore", divide="ignore"):
        correction = xhat * (np.sum(g * xhat, axis=axes, keepdims=True) / count)
        if centred:
            correction = correction + np.sum(g, axis=axes, keepdims=True) / count
    return inv * (g - correction)


def _layernorm_grad_reference(inputs, attrs):
    dy, x, scale, mean, inv = inputs
    axes = tuple(range(normalize_axis(attrs["axis"], x.ndim), x.ndim))
    xhat = (x - mean) * inv
    dx = _row_norm_backward(dy, xhat, inv, scale, axes, centred=True)
    return [dx, _reduce_to(dy * xhat, scale.shape), _reduce_to(dy, scale.shape)]


def _rmsnorm_grad_reference(inputs, attrs):
    dy, x, scale = inputs
    axes = tuple(range(normalize_axis(attrs["axis"], x.ndim), x.ndim))
    count = math.prod(x.shape[a] for a in axes)
    with np.errstate(invalid="ignore", divide="ignore"):
        inv = 1.0 / np.sqrt(np.sum(np.square(x), axis=axes, keepdims=True) / count + attrs["epsilon"])
    xhat = x * inv
    dx = _row_norm_backward(dy, xhat, inv, scale, axes, centred=False)
    return [dx, _reduce_to(dy * xhat, scale.shape)]


_LAYERNORM = get("LayerNormalization")


def _row_norm_grad_cases(dtype, rng, with_stats: bool):
    r = lambda *shape: t.random(rng, shape, dtype)  # noqa: E731

    def cases(name, x, axis, scale_shape, epsilon=None):
        """LayerNormalizationGrad gets the forward pass's statistics (with
        epsilon); RMSNormalizationGrad recomputes its own (epsilon an attribute)."""
        scale, eps = r(*scale_shape), epsilon or _f32(1e-5)
        inputs, attrs = [r(*x.shape), x, scale], {"axis": axis}
        _, mean, inv = _LAYERNORM.reference([t.upcast(x), t.upcast(scale)], {"axis": axis, "epsilon": eps})
        if with_stats:
            inputs += [mean.astype(F32), inv.astype(F32)]
        elif epsilon is not None:
            attrs["epsilon"] = epsilon
        # Bounds from magnitudes: rows of n terms; dX_j's terms are |inv|
        # (|g_j| + sum|g| / n + |xhat_j| sum|g xhat| / n), g = dY * scale.
        # dscale and dB sum their elements over the rows; RMS recomputes inv
        # from a sum of n squares, whose error reaches every term.
        dy, xm, scale_m = magnitude(inputs[0]), magnitude(x), magnitude(scale)
        axes = tuple(range(axis % x.ndim, x.ndim))
        n = max(math.prod(x.shape[a] for a in axes), 1)
        if not with_stats:
            with np.errstate(invalid="ignore", divide="ignore"):
                inv = 1.0 / np.sqrt(np.sum(xm * xm, axis=axes, keepdims=True) / n + eps)
            mean = np.zeros_like(inv)
        inv = magnitude(inv)
        xhat = np.abs(xm - magnitude(mean)) * inv
        g = dy * scale_m
        dx = inv * (g + np.sum(g, axis=axes, keepdims=True) / n + xhat * np.sum(g * xhat, axis=axes,
                                                                              keepdims=True) / n)
        per_param = max(x.size // max(scale.size, 1), 1)
        params = max(_largest(_reduce_to(dy * xhat, scale.shape)), _largest(_reduce_to(dy, scale.shape)))
        return _split_by_output(name, inputs, attrs, dtype, (n, _largest(dx)),
                                (per_param if with_stats else max(per_param, n), params))

    constant_rows = r(3, 9)
    constant_rows[1] = constant_rows[1, 0]
    special = r(3, 7)
    special.reshape(-1)[:4] = np.array([np.nan, np.inf, -np.inf, -0.0]).astype(dtype)
    return [
        *cases("last_axis", r(4, 67), -1, (67,)),
        *cases("axis_minus2", r(3, 5, 7), -2, (5, 7)),
        *cases("axis1_4d", r(2, 3, 4, 5), 1, (3, 4, 5)),
        *cases("scale_broadcasts_in_row", r(2, 3, 4, 5), 1, (3, 1, 5)),
        *cases("axis0_full_shape_scale", r(2, 3, 5), 0, (2, 3, 5)),
        *cases("scale_varies_over_rows", r(4, 6), 1, (4, 6)),
        *cases("scalar_scale", r(5, 3), -1, ()),
        *cases("epsilon", r(3, 9), -1, (9,), epsilon=0.25),
        *cases("constant_rows", constant_rows, -1, (9,), epsilon=1e-3),
        *cases("one_element_rows", r(6, 1), -1, (1,)),
        *cases("empty_rows", r(0, 5), -1, (5,)),
        *cases("empty_normalized", r(3, 0), -1, (0,)),
        *cases("large", r(2, 1031, 67), -1, (67,)),
        *cases("large_rows", r(3, 40000), -1, (40000,)),
        *cases("special", special, -1, (7,)),
    ]


# The spec's table: K = 1024 terms summing to S = 1024 * 16 in magnitude;
# every case states its own bounds, per output (see _split_by_output).
_NORM_GRAD_TOLERANCE = {dtype_name(d): dot_tolerance(d, 1024, 1024 * 16.0) for d in ALL_FLOAT}

_AXIS = Attr("axis", "int", -1, doc="the forward op's axis: the first normalized dim")

register(
    OpSpec(name="BatchNormalizationGrad", category="training", domain="devkit", opset=15,
           inputs=(Input("dY"), Input("X"), Input("scale"), Input("mean", doc="the batch mean, (C)"),
                   Input("inv_std", doc="1 / sqrt(batch variance + epsilon), (C)")),
           outputs=("dX", "dscale", "dB"), dtypes=ALL_FLOAT, key=1,
           infer=_batchnorm_grad_infer, reference=_batchnorm_grad_reference, cases=_batchnorm_grad_cases,
           tolerance=_NORM_GRAD_TOLERANCE,
           doc="The gradients of BatchNormalization in training mode (statistics of the batch): with "
               "xhat = (X - mean) * inv_std per channel and M elements per channel, dB = sum(dY), dscale = "
               "sum(dY * xhat) and dX = scale * inv_std * (dY - dB / M - xhat * dscale / M). mean and "
               "inv_std are the statistics the forward pass normalized with (ReduceMean of X and of its "
               "squared deviations); they share a float dtype, scale may have another (dscale and dB take "
               "it). The sums are taken in float64 on the cpu plugin."),
    OpSpec(name="LayerNormalizationGrad", category="training", domain="devkit", opset=_LAYERNORM.opset,
           inputs=(Input("dY"), Input("X"), Input("Scale"), Input("Mean"), Input("InvStdDev")),
           outputs=("dX", "dScale", "dB"), attrs=(_AXIS,), dtypes=ALL_FLOAT, key=1,
           infer=_layernorm_grad_infer, reference=_layernorm_grad_reference,
           cases=lambda dtype, rng: _row_norm_grad_cases(dtype, rng, with_stats=True),
           tolerance=_NORM_GRAD_TOLERANCE,
           doc="The gradients of LayerNormalization given its Mean and InvStdDev outputs: per row, with "
               "xhat = (X - Mean) * InvStdDev and g = dY * Scale, dX = InvStdDev * (g - mean(g) - xhat * "
               "mean(g * xhat)). dScale = dY * xhat and dB = dY summed over the dims Scale broadcasts "
               "along, both of Scale's shape (a B broadcast otherwise than Scale sums dB further)."),
    OpSpec(name="RMSNormalizationGrad", category="training", domain="devkit", opset=23,
           inputs=(Input("dY"), Input("X"), Input("scale")), outputs=("dX", "dscale"),
           attrs=(_AXIS, Attr("epsilon", "float", _f32(1e-5), doc="the forward op's epsilon")),
           dtypes=ALL_FLOAT, key=1,
           infer=_rmsnorm_grad_infer, reference=_rmsnorm_grad_reference,
           cases=lambda dtype, rng: _row_norm_grad_cases(dtype, rng, with_stats=False),
           tolerance=_NORM_GRAD_TOLERANCE,
           doc="The gradients of RMSNormalization, its statistic recomputed: per row inv = 1 / sqrt(mean(X^2) "
               "+ epsilon), xhat = X * inv, g = dY * scale, dX = inv * (g - xhat * mean(g * xhat)); dscale = "
               "dY * xhat summed over the dims scale broadcasts along."),
)


# -- SoftmaxCrossEntropyLoss and its gradient ----------------------------------------------------

def _sce_shapes(scores: TensorInfo, labels: TensorInfo, weights: TensorInfo | None):
    if scores.ndim < 2:
        raise ValueError(f"scores has shape {tuple(scores.shape)}; it needs (N, C) or (N, C, D1, ...)")
    if labels.dtype not in (I32, I64):
        raise TypeError(f"labels must be int32 or int64, got {dtype_name(labels.dtype)}")
    expected = (scores.shape[0],) + tuple(scores.shape[2:])
    if tuple(labels.shape) != expected:
        raise ValueError(f"labels has shape {tuple(labels.shape)}; scores {tuple(scores.shape)} needs {expected}")
    if weights is not None:
        if weights.dtype != scores.dtype:
            raise TypeError(f"weights has dtype {dtype_name(weights.dtype)} but scores has "
                            f"{dtype_name(scores.dtype)}")
        if tuple(weights.shape) != (scores.shape[1],):
            raise ValueError(f"weights has shape {tuple(weights.shape)}; expected ({scores.shape[1]},), one per class")
    return expected


def _sce_infer(inputs, attrs):
    scores, labels, weights = (list(inputs) + [None])[:3]
    label_shape = _sce_shapes(scores, labels, weights)
    loss_shape = label_shape if attrs["reduction"] == "none" else ()
    return [(loss_shape, scores.dtype), (scores.shape, scores.dtype)]


def _log_softmax_classes(scores):
    with np.errstate(divide="ignore", invalid="ignore"):
        shifted = scores - np.max(scores, axis=1, keepdims=True, initial=-np.inf)
        return shifted - np.log(np.sum(np.exp(shifted), axis=1, keepdims=True))


def _label_weights(labels, weights, attrs, dtype_classes):
    """The weight of each label (0 where ignored) and the labels made safe to index with."""
    ignored = labels == attrs["ignore_index"] if "ignore_index" in attrs else np.zeros(labels.shape, bool)
    safe = np.where(ignored, 0, labels)
    weight = np.ones(labels.shape) if weights is None else weights[np.clip(safe, 0, dtype_classes - 1)]
    return np.where(ignored, 0.0, weight), safe


def _sce_reference(inputs, attrs):
    scores, labels, weights = (list(inputs) + [None])[:3]
    log_prob = _log_softmax_classes(scores)
    weight, safe = _label_weights(labels, weights, attrs, scores.shape[1])
    picked = np.take_along_axis(log_prob, np.expand_dims(safe, 1), axis=1).squeeze(1) if log_prob.size else \
        np.zeros(labels.shape)
    with np.errstate(invalid="ignore"):
        loss = np.where(weight == 0.0, 0.0, -weight * picked)
    if attrs["reduction"] == "sum":
        loss = np.sum(loss)
    elif attrs["reduction"] == "mean":
        with np.errstate(invalid="ignore", divide="ignore"):
            loss = np.sum(loss) / np.sum(weight)
    return [np.asarray(loss), log_prob]


def _sce_grad_infer(inputs, attrs):
    dy, log_prob, labels, weights = (list(inputs) + [None])[:4]
    _require_float(log_prob, "log_prob")
    if dy.dtype != log_prob.dtype:
        raise TypeError(f"dY has dtype {dtype_name(dy.dtype)} but log_prob has {dtype_name(log_prob.dtype)}")
    label_shape = _sce_shapes(log_prob, labels, weights)
    expected = label_shape if attrs["reduction"] == "none" else ()
    if tuple(dy.shape) != expected:
        raise ValueError(f"dY has shape {tuple(dy.shape)}; the loss with reduction '{attrs['reduction']}' "
                         f"has {expected}")
    return [(log_prob.shape, log_prob.dtype)]


def _sce_grad_reference(inputs, attrs):
    dy, log_prob, labels, weights = (list(inputs) + [None])[:4]
    weight, safe = _label_weights(labels, weights, attrs, log_prob.shape[1])
    if attrs["reduction"] == "mean":
        with np.errstate(invalid="ignore", divide="ignore"):
            scale = weight * (dy / np.sum(weight))
    else:
        scale = weight * dy
    onehot = np.arange(log_prob.shape[1]).reshape((1, -1) + (1,) * (labels.ndim - 1)) == np.expand_dims(safe, 1)
    with np.errstate(invalid="ignore"):
        grad = (np.exp(log_prob) - onehot) * np.expand_dims(scale, 1)
    return [np.where(np.expand_dims(weight == 0.0, 1), 0.0, grad)]


def _sce_cases(dtype, rng, grad: bool):
    r = lambda *shape: t.random(rng, shape, dtype)  # noqa: E731

    def labels(shape, classes, index_dtype=np.int64):
        return rng.integers(0, classes, shape).astype(index_dtype)

    def case(name, scores, label, weights=None, **attrs):
        if not grad:
            return Case(name, [scores, label] + ([weights] if weights is not None else []), attrs)
        full = {"reduction": "mean", **attrs}
        log_prob = _log_softmax_classes(t.upcast(scores)).astype(dtype)
        dy_shape = label.shape if full["reduction"] == "none" else ()
        return Case(name, [r(*dy_shape), log_prob, label] + ([weights] if weights is not None else []), attrs)

    def positive(*shape):
        return t.random(rng, shape, dtype, 0.1, 2.0)

    ignored = labels((4, 5), 3)
    ignored[0, :2] = 1
    all_ignored = np.full((3,), 2, np.int64)
    special = r(7, 4)
    special[0, 1], special[1, 0], special[2] = np.nan, np.inf, -np.inf
    special[3, 2] = -np.inf
    special_labels = np.array([0, 1, 2, 2, 3, 0, 1])
    return [
        case("mean", r(5, 4), labels(5, 4)),
        case("sum", r(5, 4), labels(5, 4), reduction="sum"),
        case("none", r(5, 4), labels(5, 4), reduction="none"),
        case("int32_labels", r(5, 4), labels(5, 4, np.int32)),
        case("mean_weights", r(6, 5), labels(6, 5), positive(5)),
        case("none_weights", r(6, 5), labels(6, 5), positive(5), reduction="none"),
        case("sum_weights", r(6, 5), labels(6, 5), positive(5), reduction="sum"),
        case("3d", r(3, 4, 5), labels((3, 5), 4)),
        case("5d_none", r(2, 3, 2, 3, 2), labels((2, 2, 3, 2), 3), reduction="none"),
        case("ignore_index", r(4, 3, 5), ignored, ignore_index=1),
        case("ignore_index_weights", r(4, 3, 5), ignored, positive(3), ignore_index=1),
        case("ignore_index_none", r(4, 3, 5), ignored, ignore_index=1, reduction="none"),
        case("negative_ignore_index", r(4, 3), np.array([0, -5, 2, -5]), ignore_index=-5),
        case("unused_ignore_index", r(4, 3), labels(4, 3), ignore_index=7),
        case("all_ignored_mean", r(3, 4), all_ignored, ignore_index=2),
        case("one_class", r(4, 1), np.zeros(4, np.int64)),
        case("no_classes_all_ignored", r(3, 0), np.full(3, -1), ignore_index=-1, reduction="none"),
        case("empty_batch", r(0, 4), labels(0, 4)),
        case("empty_batch_none", r(0, 4, 3), labels((0, 3), 4), reduction="none"),
        case("large", r(1031, 67), labels(1031, 67)),
        case("large_spatial", r(8, 10, 4099), labels((8, 4099), 10), reduction="sum"),
        case("special", special, special_labels, reduction="none"),
    ]


_REDUCTION = Attr("reduction", "string", "mean", choices=("none", "sum", "mean"),
                  doc="none: the loss per label; sum; mean: the sum divided by the sum of the label weights")
_IGNORE_INDEX = Attr("ignore_index", "int", None, doc="a label value whose loss (and weight) is 0")
# log_prob = (x - max) - log(sum exp) cancels near the maximum, its terms up
# to 8 in magnitude; the reduced losses sum up to 3e4 labels. Float32
# emulation: at most 9.5e-7 absolute on log_prob and the gradients, 7 ulp
# (8e-7 relative) on the reduced losses. float64 is held to the same bounds
# scaled by the ratio of the unit roundoffs (2^-29).
_SCE_TOLERANCE = _tolerances(Tolerance(ulp=4, rtol=4e-6, atol=4e-6), Tolerance(ulp=4, rtol=8e-15, atol=8e-15),
                             Tolerance(ulp=1, rtol=4e-6, atol=4e-6))

register(
    OpSpec(name="SoftmaxCrossEntropyLoss", category="training", opset=13,
           inputs=(Input("scores", doc="(N, C) or (N, C, D1, ...)"), Input("labels", doc="(N) or (N, D1, ...)"),
                   Input("weights", optional=True, doc="(C), a weight per class")),
           outputs=("output", "log_prob"), optional_outputs=1, attrs=(_IGNORE_INDEX, _REDUCTION), dtypes=ALL_FLOAT,
           infer=_sce_infer, reference=_sce_reference,
           cases=lambda dtype, rng: _sce_cases(dtype, rng, grad=False), tolerance=_SCE_TOLERANCE,
           doc="log_prob = LogSoftmax(scores) over the class dim 1; the loss of each label is -weights[label] * "
               "log_prob[label] (weight 1 without weights, 0 for ignore_index), then reduced: none, sum, or "
               "mean = sum / sum of the weights (NaN when every label is ignored or there are none, as 0/0). "
               "A label outside [0, C) that is not ignore_index fails the kernel (OutOfRangeError). Sums "
               "and the log-sum-exp are taken in float64 on the cpu plugin."),
    OpSpec(name="SoftmaxCrossEntropyLossGrad", category="training", domain="devkit", opset=13,
           inputs=(Input("dY", doc="the loss gradient, of the loss's shape"),
                   Input("log_prob", doc="the forward op's log_prob"), Input("labels"),
                   Input("weights", optional=True)),
           outputs=("d_scores",), attrs=(_IGNORE_INDEX, _REDUCTION), dtypes=ALL_FLOAT, key=1,
           infer=_sce_grad_infer, reference=_sce_grad_reference,
           cases=lambda dtype, rng: _sce_cases(dtype, rng, grad=True), tolerance=_SCE_TOLERANCE,
           doc="d_scores = (exp(log_prob) - onehot(label)) * weight(label) * s along the class dim, with s = "
               "dY (none: the label's element of dY; sum) or dY / sum of the weights (mean); 0 for ignored "
               "labels. The forward op's attributes and weights."),
)


# -- optimizers: ai.onnx.preview.training --------------------------------------------------------

def _scalar_input(info: TensorInfo, name: str, kinds: str, what: str):
    if info.value.size != 1 or info.dtype.kind not in kinds:
        raise TypeError(f"{name} must be one {what} value, got {dtype_name(info.dtype)} of shape {tuple(info.shape)}")
    return info.value.reshape(-1)[0]


def _optimizer_infer(kinds: tuple[str, ...]):
    """infer of an optimizer whose tensors come as len(kinds) groups
    (X1..Xn, G1..Gn, state...); outputs: X_new and the new state, by group."""

    def infer(inputs, attrs):
        _scalar_input(inputs[0], "R", "f", "float")
        _scalar_input(inputs[1], "T", "iu", "integer")
        tensors = inputs[2:]
        if len(tensors) % len(kinds):
            raise ValueError(f"takes {len(kinds)} tensors per optimized tensor ({', '.join(kinds)}), got "
                             f"{len(tensors)}")
        n = len(tensors) // len(kinds)
        require_same_dtype(tensors)
        for i in range(n):
            for g, kind in enumerate(kinds[1:], start=1):
                other = tensors[g * n + i]
                if tuple(other.shape) != tuple(tensors[i].shape):
                    raise ValueError(f"{kind}{i + 1} has shape {tuple(other.shape)} but X{i + 1} has "
                                     f"{tuple(tensors[i].shape)}")
        kept = [0] + list(range(2, len(kinds)))  # every group but G
        return [(tensors[g * n + i].shape, tensors[i].dtype) for g in kept for i in range(n)]

    return infer


def _groups(inputs, count):
    tensors = inputs[2:]
    n = len(tensors) // count
    return [tensors[i::n][:count] for i in range(n)] if n else []


def _r_t(attrs):
    return float(np.asarray(attrs["R"]).reshape(-1)[0]), int(np.asarray(attrs["T"]).reshape(-1)[0])


def _momentum_reference(inputs, attrs):
    r, step = _r_t(attrs)
    alpha, beta, decay = attrs["alpha"], attrs["beta"], attrs["norm_coefficient"]
    xs, vs = [], []
    for x, g, v in _groups(inputs, 3):
        g = decay * x + g
        v = alpha * v + (beta if step > 0 else 1.0) * g
        xs.append(x - r * (g + alpha * v) if attrs["mode"] == "nesterov" else x - r * v)
        vs.append(v)
    return xs + vs


def _adagrad_reference(inputs, attrs):
    r, step = _r_t(attrs)
    rate = r / (1.0 + step * attrs["decay_factor"])
    xs, hs = [], []
    for x, g, h in _groups(inputs, 3):
        g = attrs["norm_coefficient"] * x + g
        h = h + g * g
        xs.append(x - rate * g / (np.sqrt(h) + attrs["epsilon"]))
        hs.append(h)
    return xs + hs


def _adam_reference(inputs, attrs):
    r, step = _r_t(attrs)
    alpha, beta = attrs["alpha"], attrs["beta"]
    rate = r * math.sqrt(1.0 - beta ** step) / (1.0 - alpha ** step) if step > 0 else r
    xs, vs, hs = [], [], []
    for x, g, v, h in _groups(inputs, 4):
        g = attrs["norm_coefficient"] * x + g
        v = alpha * v + (1.0 - alpha) * g
        h = beta * h + (1.0 - beta) * (g * g)
        x = x - rate * (v / (np.sqrt(h) + attrs["epsilon"]))
        xs.append((1.0 - attrs["norm_coefficient_post"]) * x)
        vs.append(v)
        hs.append(h)
    return xs + vs + hs


def _optimizer_cases(states: int, variants):
    """Cases of an optimizer with ``states`` state tensors per X (V, H)."""

    def cases(dtype, rng):
        def tensors(*shapes, special=False):
            groups = [[t.random(rng, s, dtype), t.random(rng, s, dtype)]
                      + [t.random(rng, s, dtype, 0.0, 4.0) for _ in range(states)] for s in shapes]
            if special:  # NaN and infinities in the gradient
                values = np.array([np.nan, np.inf, -np.inf, -0.0, 0.0]).astype(dtype)
                groups[0][1].reshape(-1)[:values.size] = values
            return [m for kind in zip(*groups) for m in kind]

        def case(name, *shapes, step=3, rate=None, special=False, **attrs):
            rate = np.array(0.1, dtype) if rate is None else rate
            return Case(name, [rate, np.array(step, np.int64), *tensors(*shapes, special=special)], attrs)

        base = dict(variants[0][1])
        result = [
            case("one_tensor", (3, 4), **base),
            case("first_step", (5,), step=0, **base),
            case("three_tensors", (2, 3), (), (4, 1, 2), **base),
            case("empty_tensor", (0, 3), (2,), **base),
            case("rate_in_other_dtype", (6,), rate=np.array(0.01, F32 if dtype == F64 else F64), **base),
            case("large", (1031, 67), **base),
            case("huge", (100_003,), **base),
            case("special", (7,), special=True, **base),
        ]
        for suffix, attrs in variants[1:]:
            result.append(case(suffix, (4, 5), **attrs))
        return result

    return cases


_OPTIMIZER_INPUTS = (Input("R", host=True, doc="the learning rate, a float scalar"),
                     Input("T", host=True, doc="the update count, an integer scalar"),
                     Input("inputs", variadic=True, doc="X1..Xn, G1..Gn, then the state tensors"))
# x - r * step cancels: bounded relative to |x| <= 4, two ulp of 4 absolute.
# Float32 emulation (the scalar learning rate in float64, as ONNX's
# reference): 1 ulp, and 4.8e-7 absolute where the result is small.
_OPTIMIZER_TOLERANCE = {"float32": Tolerance(ulp=2, atol=1e-6), "float64": Tolerance(ulp=2, atol=2e-15)}


def _finite(value) -> str | None:
    return None if math.isfinite(value) else f"must be finite, got {value}"


register(
    OpSpec(name="Momentum", category="training", domain="ai.onnx.preview.training", opset=1,
           inputs=_OPTIMIZER_INPUTS, outputs=("outputs...",), key=2, dtypes=FLOAT,
           attrs=(Attr("alpha", "float", REQUIRED, check=_finite, doc="decay of the momentum"),
                  Attr("beta", "float", REQUIRED, check=_finite, doc="coefficient of the gradient"),
                  Attr("mode", "string", REQUIRED, choices=("standard", "nesterov")),
                  Attr("norm_coefficient", "float", REQUIRED, check=_finite,
                       doc="L2 regularization: G += norm_coefficient * X")),
           infer=_optimizer_infer(("X", "G", "V")), reference=_momentum_reference,
           cases=_optimizer_cases(1, [("standard", {"alpha": 0.9, "beta": 1.0, "mode": "standard",
                                                    "norm_coefficient": 0.0}),
                                      ("nesterov", {"alpha": 0.9, "beta": 0.5, "mode": "nesterov",
                                                    "norm_coefficient": 0.0}),
                                      ("norm_coefficient", {"alpha": 0.5, "beta": 0.9, "mode": "standard",
                                                            "norm_coefficient": 0.01}),
                                      ("nesterov_norm", {"alpha": 0.95, "beta": 0.1, "mode": "nesterov",
                                                         "norm_coefficient": 0.001})]),
           tolerance=_OPTIMIZER_TOLERANCE,
           doc="SGD with momentum, per tensor: G' = norm_coefficient * X + G; V_new = alpha * V + beta' * G' "
               "(beta' = 1 at T = 0, beta after); standard: X_new = X - R * V_new; nesterov: X_new = X - R * "
               "(G' + alpha * V_new). Outputs X1_new..Xn_new, V1_new..Vn_new. Computed in float64 on the "
               "cpu plugin."),
    OpSpec(name="Adagrad", category="training", domain="ai.onnx.preview.training", opset=1,
           inputs=_OPTIMIZER_INPUTS, outputs=("outputs...",), key=2, dtypes=FLOAT,
           attrs=(Attr("decay_factor", "float", 0.0, check=_finite, doc="R' = R / (1 + T * decay_factor)"),
                  Attr("epsilon", "float", _f32(1e-6), check=_finite),
                  Attr("norm_coefficient", "float", 0.0, check=_finite)),
           infer=_optimizer_infer(("X", "G", "H")), reference=_adagrad_reference,
           cases=_optimizer_cases(1, [("default", {}),
                                      ("decay_factor", {"decay_factor": 0.1}),
                                      ("norm_coefficient", {"norm_coefficient": 0.01, "epsilon": 0.5})]),
           tolerance=_OPTIMIZER_TOLERANCE,
           doc="Adagrad, per tensor: G' = norm_coefficient * X + G; H_new = H + G'^2; X_new = X - R / (1 + T * "
               "decay_factor) * G' / (sqrt(H_new) + epsilon). Outputs X1_new..Xn_new, H1_new..Hn_new. "
               "Computed in float64 on the cpu plugin."),
    OpSpec(name="Adam", category="training", domain="ai.onnx.preview.training", opset=1,
           inputs=_OPTIMIZER_INPUTS, outputs=("outputs...",), key=2, dtypes=FLOAT,
           attrs=(Attr("alpha", "float", _f32(0.9), check=_finite, doc="decay of the first moment"),
                  Attr("beta", "float", _f32(0.999), check=_finite, doc="decay of the second moment"),
                  Attr("epsilon", "float", _f32(1e-6), check=_finite),
                  Attr("norm_coefficient", "float", 0.0, check=_finite),
                  Attr("norm_coefficient_post", "float", 0.0, check=_finite,
                       doc="X_new *= 1 - norm_coefficient_post")),
           infer=_optimizer_infer(("X", "G", "V", "H")), reference=_adam_reference,
           cases=_optimizer_cases(2, [("default", {}),
                                      ("first_moment_only", {"alpha": 0.5, "beta": 0.0}),
                                      ("norm_coefficients", {"norm_coefficient": 0.01, "norm_coefficient_post": 0.1,
                                                             "epsilon": 0.01})]),
           tolerance=_OPTIMIZER_TOLERANCE,
           doc="Adam, per tensor: G' = norm_coefficient * X + G; V_new = alpha * V + (1 - alpha) * G'; H_new = "
               "beta * H + (1 - beta) * G'^2; R' = R * sqrt(1 - beta^T) / (1 - alpha^T) for T > 0, else R; "
               "X_new = (1 - norm_coefficient_post) * (X - R' * V_new / (sqrt(H_new) + epsilon)). Outputs "
               "X1_new..Xn_new, V1_new..Vn_new, H1_new..Hn_new. Computed in float64 on the cpu plugin."),
)


# -- MatMul and Gemm gradients, composed of forward ops -------------------------------------------

def _sum_to(dev_array, shape, stream=None):
    """ReduceSum of a device array over the dims ``shape`` broadcasts along, reshaped to ``shape``."""
    have = tuple(dev_array.shape)
    lead = len(have) - len(shape)
    axes = list(range(lead)) + [lead + i for i, n in enumerate(shape) if n == 1 and have[lead + i] != 1]
    if axes:
        (dev_array,) = dispatch.run_op("ReduceSum", [dev_array, np.array(axes, np.int64)], {"keepdims": 1},
                                       stream=stream)
    return _reshape(dev_array, shape, stream)


def _reshape(dev_array, shape, stream=None):
    if tuple(dev_array.shape) != tuple(shape):
        (dev_array,) = dispatch.run_op("Reshape", [dev_array, np.array(shape, np.int64)], stream=stream)
    return dev_array


def _swap_last(array, stream=None):
    perm = list(range(array.ndim))
    perm[-2:] = perm[-2:][::-1]
    (result,) = dispatch.run_op("Transpose", [array], {"perm": perm}, stream=stream)
    return result


def matmul_grad(a, b, dy, stream=None):
    """(dA, dB) of Y = MatMul(A, B) given dY, as devkit ops on the arrays' device.

    dA = dY @ B^T and dB = A^T @ dY, batch dims (and the dims 1-D operands
    gained) summed back to the operands' shapes with ReduceSum."""
    a2 = a if a.ndim > 1 else a.reshape(1, a.shape[0])
    b2 = b if b.ndim > 1 else b.reshape(b.shape[0], 1)
    dy2 = dy
    if a.ndim == 1:
        dy2 = dy2.reshape(*dy2.shape[:-1], 1, dy2.shape[-1]) if b.ndim > 1 else dy2.reshape(1, 1)
    if b.ndim == 1:
        dy2 = dy2.reshape(*dy2.shape, 1)
    (da,) = dispatch.run_op("MatMul", [dy2, _swap_last(b2, stream)], stream=stream)
    (db,) = dispatch.run_op("MatMul", [_swap_last(a2, stream), dy2], stream=stream)
    da = _reshape(_sum_to(da, tuple(a2.shape), stream), tuple(a.shape), stream)
    db = _reshape(_sum_to(db, tuple(b2.shape), stream), tuple(b.shape), stream)
    return da, db


def gemm_grad(a, b, c, dy, *, alpha=1.0, beta=1.0, transA=0, transB=0, stream=None):  # noqa: N803
    """(dA, dB, dC) of Y = Gemm(A, B, C, alpha, beta, transA, transB) given
    dY, as Gemm calls (transposes folded into transA/transB) and, for C, a
    ReduceSum to C's shape scaled by beta; dC is None without C."""
    def gemm(x, y, ta, tb):
        (out,) = dispatch.run_op("Gemm", [x, y], {"alpha": alpha, "beta": 0.0, "transA": ta, "transB": tb},
                                 stream=stream)
        return out

    # d op(A) = alpha dY op(B)^T and d op(B) = alpha op(A)^T dY, transposed back where op transposes.
    da = gemm(b, dy, transB, 1) if transA else gemm(dy, b, 0, 1 - transB)
    db = gemm(dy, a, 1, transA) if transB else gemm(a, dy, 1 - transA, 0)
    if c is None:
        return da, db, None
    dc = _sum_to(dy, tuple(c.shape), stream)
    if beta != 1.0:
        (dc,) = dispatch.run_op("Mul", [dc, np.array(beta, dc.dtype)], stream=stream)
    return da, db, dc
