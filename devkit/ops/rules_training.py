"""Decompositions of the training ops: pointwise gradients, the softmax
gradients, SoftmaxCrossEntropyLoss and its gradient, and the optimizers.
float32 runs at float64 between Casts where the kernels accumulate or take
the scalar rate in double.
"""

from __future__ import annotations

import math

import numpy as np

from . import training as family
from .rules_elementwise import _tol
from .rules_movement import coordinate, reshape
from .spec import F32, I64, Decomposition, Tolerance, normalize_axis, set_decompositions

_WIDE = dict(float64=(F32,))


def _pointwise(rule, uses, **extra):
    return Decomposition(lambda b, xs, a: [rule(b, xs[0], xs[1], a)], uses, **extra)


def _relu_grad(b, dy, x, a):
    return b("Where", b("LessOrEqual", x, b.const(0, x.dtype)), b.const(0, x.dtype), dy)


def _leaky_relu_grad(b, dy, x, a):
    return b("Where", b("Greater", x, b.const(0, x.dtype)), dy, b("Mul", dy, b.const(a["alpha"], x.dtype)))


def _sigmoid_grad(b, dy, y, a):
    return b("Mul", dy, b("Mul", y, b("Sub", b.const(1, y.dtype), y)))


def _tanh_grad(b, dy, y, a):
    one = b.const(1, y.dtype)
    return b("Mul", dy, b("Mul", b("Sub", one, y), b("Add", one, y)))


def _gelu_grad(b, dy, x, a):
    c = lambda v: b.const(v, x.dtype)  # noqa: E731
    if a["approximate"] == "tanh":
        u = b("Mul", b("Mul", x, b("Add", c(1), b("Mul", c(0.044715), b("Mul", x, x)))), c(math.sqrt(2 / math.pi)))
        two_u = b("Mul", u, c(2))
        s, s_minus = b("Sigmoid", two_u), b("Sigmoid", b("Neg", two_u))
        sech2 = b("Mul", c(4), b("Mul", s, s_minus))
        slope = b("Mul", b("Mul", x, c(0.5 * math.sqrt(2 / math.pi))),
                  b("Add", c(1), b("Mul", c(3 * 0.044715), b("Mul", x, x))))
        derivative = b("Add", s, b("Mul", slope, sech2))
    else:
        phi_cdf = b("Mul", c(0.5), b("Sub", c(1), b("Erf", b("Mul", x, c(-math.sqrt(0.5))))))
        density = b("Mul", b("Exp", b("Mul", b("Mul", x, x), c(-0.5))), c(1 / math.sqrt(2 * math.pi)))
        derivative = b("Add", phi_cdf, b("Mul", x, density))
    # Beyond |x| = 20 the derivative is its limit, 1 or 0, to double precision
    # (and the formulas' x^3 would overflow to inf * 0).
    limit = b("Where", b("Less", c(0), x), c(1), c(0))
    derivative = b("Where", b("Less", c(20), b("Abs", x)), limit, derivative)
    return b("Mul", dy, derivative)


def _softmax_grad(b, xs, a):
    dy, y = xs
    axis = np.array([normalize_axis(a["axis"], dy.ndim)], np.int64)
    return [b("Mul", y, b("Sub", dy, b("ReduceSum", b("Mul", dy, y), axis, keepdims=1)))]


def _log_softmax_grad(b, xs, a):
    dy, y = xs
    axis = np.array([normalize_axis(a["axis"], dy.ndim)], np.int64)
    return [b("Sub", dy, b("Mul", b("Exp", y), b("ReduceSum", dy, axis, keepdims=1)))]


def _label_weights(b, labels, weights, a, dtype):
    """Each label's weight (0 where ignored) and the labels made safe to index with (int64)."""
    labels = b("Cast", labels, to=I64)
    zero = b.const(0, dtype)
    if "ignore_index" in a:
        ignored = b("Equal", labels, b.const(a["ignore_index"], I64))
        safe = b("Where", ignored, b.const(0, I64), labels)
    else:
        ignored, safe = None, labels
    if weights is None:
        weight = b("Expand", b.const(1, dtype), np.array(labels.shape, np.int64))
    else:
        classes = weights.shape[0]
        clipped = b("Clip", safe, np.array(0, np.int64), np.array(max(classes - 1, 0), np.int64))
        weight = b("Gather", weights, clipped, axis=0)
    if ignored is not None:
        weight = b("Where", ignored, zero, weight)
    return weight, safe


def _onehot_classes(b, safe, classes):
    position = reshape(b, safe, safe.shape[:1] + (1,) + safe.shape[1:])
    classes_shape = (1, classes) + (1,) * (safe.ndim - 1)
    return b("Equal", reshape(b, coordinate(b, (classes,), 0), classes_shape), position)


def _sce(b, xs, a):
    scores, labels, weights = (list(xs) + [None])[:3]
    log_prob = b("LogSoftmax", scores, axis=1)
    weight, safe = _label_weights(b, labels, weights, a, scores.dtype)
    if scores.size:
        hot = _onehot_classes(b, safe, scores.shape[1])
        picked = b("ReduceSum", b("Where", hot, log_prob, b.const(0, scores.dtype)), np.array([1], np.int64),
                   keepdims=0)
    else:
        picked = b("Expand", b.const(0, scores.dtype), np.array(labels.shape, np.int64))
    zero = b.const(0, scores.dtype)
    loss = b("Where", b("Equal", weight, zero), zero, b("Neg", b("Mul", weight, picked)))
    if a["reduction"] == "sum":
        loss = b("ReduceSum", loss, np.array([], np.int64), keepdims=0)
    elif a["reduction"] == "mean":
        loss = b("Div", b("ReduceSum", loss, np.array([], np.int64), keepdims=0),
                 b("ReduceSum", weight, np.array([], np.int64), keepdims=0))
    return [loss, log_prob]


def _sce_grad(b, xs, a):
    dy, log_prob, labels, weights = (list(xs) + [None])[:4]
    weight, safe = _label_weights(b, labels, weights, a, log_prob.dtype)
    if a["reduction"] == "mean":
        scale = b("Mul", weight, b("Div", dy, b("ReduceSum", weight, np.array([], np.int64), keepdims=0)))
    else:
        scale = b("Mul", weight, dy)
    expand = lambda t: reshape(b, t, t.shape[:1] + (1,) + t.shape[1:])  # noqa: E731
    hot = b("Cast", _onehot_classes(b, safe, log_prob.shape[1]), to=log_prob.dtype)
    grad = b("Mul", b("Sub", b("Exp", log_prob), hot), expand(scale))
    zero = b.const(0, log_prob.dtype)
    return [b("Where", expand(b("Equal", weight, zero)), zero, grad)]


_SCE_USES = ("LogSoftmax", "Cast[int32]", "Cast[int64]", "Equal[int64]", "Where[int64]", "Expand", "Clip[int64]",
             "Gather", "Where", "Reshape[int64]", "Expand[int64]", "CumSum[int64]", "ReduceSum", "Equal", "Neg",
             "Mul", "Div", "Sub", "Exp", "Cast[bool]", "Reshape", "Reshape[bool]")


# -- optimizers ----------------------------------------------------------------------------------

def _scalar(b, value, dtype):
    return b.const(value, dtype)


def _momentum(b, xs, a):
    r, step = family._r_t(a)
    alpha, beta, decay = a["alpha"], a["beta"], a["norm_coefficient"]
    new_x, new_v = [], []
    for x, g, v in family._groups(xs, 3):
        c = lambda value: _scalar(b, value, x.dtype)  # noqa: E731,B023
        g = b("Add", b("Mul", c(decay), x), g)
        v = b("Add", b("Mul", c(alpha), v), b("Mul", c(beta if step > 0 else 1.0), g))
        direction = b("Add", g, b("Mul", c(alpha), v)) if a["mode"] == "nesterov" else v
        new_x.append(b("Sub", x, b("Mul", c(r), direction)))
        new_v.append(v)
    return new_x + new_v


def _adagrad(b, xs, a):
    r, step = family._r_t(a)
    rate = r / (1.0 + step * a["decay_factor"])
    new_x, new_h = [], []
    for x, g, h in family._groups(xs, 3):
        c = lambda value: _scalar(b, value, x.dtype)  # noqa: E731,B023
        g = b("Add", b("Mul", c(a["norm_coefficient"]), x), g)
        h = b("Add", h, b("Mul", g, g))
        step_size = b("Div", b("Mul", c(rate), g), b("Add", b("Sqrt", h), c(a["epsilon"])))
        new_x.append(b("Sub", x, step_size))
        new_h.append(h)
    return new_x + new_h


def _adam(b, xs, a):
    r, step = family._r_t(a)
    alpha, beta = a["alpha"], a["beta"]
    rate = r * math.sqrt(1.0 - beta ** step) / (1.0 - alpha ** step) if step > 0 else r
    new_x, new_v, new_h = [], [], []
    for x, g, v, h in family._groups(xs, 4):
        c = lambda value: _scalar(b, value, x.dtype)  # noqa: E731,B023
        g = b("Add", b("Mul", c(a["norm_coefficient"]), x), g)
        v = b("Add", b("Mul", c(alpha), v), b("Mul", c(1.0 - alpha), g))
        h = b("Add", b("Mul", c(beta), h), b("Mul", c(1.0 - beta), b("Mul", g, g)))
        x = b("Sub", x, b("Mul", c(rate), b("Div", v, b("Add", b("Sqrt", h), c(a["epsilon"])))))
        new_x.append(b("Mul", c(1.0 - a["norm_coefficient_post"]), x))
        new_v.append(v)
        new_h.append(h)
    return new_x + new_v + new_h


_OPTIMIZER = ("Add", "Mul", "Sub", "Div", "Sqrt")

set_decompositions({
    "ReluGrad": _pointwise(_relu_grad, ("LessOrEqual", "Where"), float32=()),
    "LeakyReluGrad": _pointwise(_leaky_relu_grad, ("Greater", "Where", "Mul")),
    "SigmoidGrad": _pointwise(_sigmoid_grad, ("Mul", "Sub"), **_WIDE),
    "TanhGrad": _pointwise(_tanh_grad, ("Mul", "Sub", "Add"), **_WIDE),
    "GeluGrad": _pointwise(_gelu_grad, ("Mul", "Add", "Sigmoid", "Neg", "Sub", "Erf", "Exp", "Less", "Where",
                                        "Abs"), **_WIDE,
                           tolerance={**_tol(4, 4, 2.0 ** -20, 2.0 ** -48),
                                      "float64": Tolerance(ulp=4, rtol=2.0 ** -40, atol=2.0 ** -48)},
                           reason="Phi(x) as (1 - erf(-x / sqrt 2)) / 2 cancels in the negative tail (the "
                                  "error is relative to the derivative there, so float64 needs an rtol)"),
    "SoftmaxGrad": Decomposition(_softmax_grad, ("Mul", "Sub", "ReduceSum"), **_WIDE),
    "LogSoftmaxGrad": Decomposition(_log_softmax_grad, ("Mul", "Sub", "ReduceSum", "Exp"), **_WIDE),
    "SoftmaxCrossEntropyLoss": Decomposition(_sce, _SCE_USES, **_WIDE),
    "SoftmaxCrossEntropyLossGrad": Decomposition(_sce_grad, _SCE_USES, **_WIDE),
    "Momentum": Decomposition(_momentum, _OPTIMIZER, **_WIDE),
    "Adagrad": Decomposition(_adagrad, _OPTIMIZER, **_WIDE),
    "Adam": Decomposition(_adam, _OPTIMIZER, **_WIDE),
})
