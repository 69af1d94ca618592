"""Decompositions of the normalizations, LRN, Trilu, RotaryEmbedding and
Attention. float32 runs at float64 between Casts (as the kernels accumulate
in double), float16/bfloat16 at float32.
"""

from __future__ import annotations

import math

import numpy as np

from . import nn as family
from .rules_movement import coordinate, reshape
from .spec import ALL_FLOAT, BOOL, F32, I64, Decomposition, dtype_name, normalize_axis, set_decompositions

_WIDE = dict(float64=(F32,))
_CASTS = tuple(f"Cast[{dtype_name(d)}]" for d in ALL_FLOAT)  # parameters of another float dtype


def _like(b, p, x):
    """Parameter p in x's dtype."""
    return p if p is None or p.dtype == x.dtype else b("Cast", p, to=x.dtype)


def _channel(b, p, ndim):
    """A (C,) parameter shaped to broadcast against (N, C, ...)."""
    return reshape(b, p, [-1] + [1] * (ndim - 2)) if ndim >= 2 else p


def _axes(*axes):
    return np.array(axes, np.int64)


def _moments(b, x, axes):
    """Mean and population variance over axes, kept as size-1 dims."""
    mean = b("ReduceMean", x, axes, keepdims=1, noop_with_empty_axes=1)
    centred = b("Sub", x, mean)
    return mean, b("ReduceMean", b("Mul", centred, centred), axes, keepdims=1, noop_with_empty_axes=1)


def _inv_std(b, var, epsilon):
    return b("Div", b.const(1, var.dtype), b("Sqrt", b("Add", var, b.const(epsilon, var.dtype))))


_NORM = ("ReduceMean", "Sub", "Mul", "Add", "Div", "Sqrt", "Reshape") + _CASTS


def _batchnorm(b, xs, a):
    x, scale, bias, mean, var = xs
    stats_dtype = mean.dtype
    scale, bias, mean, var = (_like(b, p, x) for p in (scale, bias, mean, var))
    running_mean, running_var = mean, var
    if a["training_mode"]:
        batch_mean, batch_var = (reshape(b, m, [-1]) for m in
                                 _moments(b, x, _axes(0, *range(2, x.ndim))))
        keep, take = b.const(a["momentum"], x.dtype), b.const(1 - a["momentum"], x.dtype)
        running_mean = b("Add", b("Mul", mean, keep), b("Mul", batch_mean, take))
        running_var = b("Add", b("Mul", var, keep), b("Mul", batch_var, take))
        mean, var = batch_mean, batch_var
    v = lambda p: _channel(b, p, x.ndim)  # noqa: E731
    y = b("Add", b("Div", b("Mul", v(scale), b("Sub", x, v(mean))),
                   b("Sqrt", b("Add", v(var), b.const(a["epsilon"], x.dtype)))), v(bias))
    stats = [b("Cast", s, to=stats_dtype) if s.dtype != stats_dtype else b("Identity", s)
             for s in (running_mean, running_var)]
    return [y] + stats


def _layernorm(b, xs, a):
    x, scale, bias = (list(xs) + [None])[:3]
    axis = normalize_axis(a["axis"], x.ndim)
    mean, var = _moments(b, x, _axes(*range(axis, x.ndim)))
    inv_std = _inv_std(b, var, a["epsilon"])
    y = b("Mul", b("Mul", b("Sub", x, mean), inv_std), _like(b, scale, x))
    if bias is not None:
        y = b("Add", y, _like(b, bias, x))
    return [y, b("Cast", mean, to=F32), b("Cast", inv_std, to=F32)]


def _rmsnorm(b, xs, a):
    x, scale = xs
    axis = normalize_axis(a["axis"], x.ndim)
    mean_square = b("ReduceMean", b("Mul", x, x), _axes(*range(axis, x.ndim)), keepdims=1, noop_with_empty_axes=1)
    root = b("Sqrt", b("Add", mean_square, b.const(a["epsilon"], x.dtype)))
    return [b("Mul", b("Div", x, root), _like(b, scale, x))]


def _groupnorm(b, xs, a):
    x, scale, bias = xs
    n, c, g = x.shape[0], x.shape[1], a["num_groups"]
    groups = reshape(b, x, [n, g, c // g * math.prod(x.shape[2:])])
    mean, var = _moments(b, groups, _axes(2))
    normalized = reshape(b, b("Div", b("Sub", groups, mean), b("Sqrt", b("Add", var, b.const(a["epsilon"], x.dtype)))),
                         x.shape)
    return [b("Add", b("Mul", normalized, _channel(b, _like(b, scale, x), x.ndim)),
              _channel(b, _like(b, bias, x), x.ndim))]


def _instancenorm(b, xs, a):
    x, scale, bias = xs
    mean, var = _moments(b, x, _axes(*range(2, x.ndim)))
    v = lambda p: _channel(b, _like(b, p, x), x.ndim)  # noqa: E731
    y = b("Div", b("Mul", v(scale), b("Sub", x, mean)), b("Sqrt", b("Add", var, b.const(a["epsilon"], x.dtype))))
    return [b("Add", y, v(bias))]


def _lrn(b, xs, a):
    x = xs[0]
    size, channels = a["size"], x.shape[1]
    before, after = (size - 1) // 2, size // 2
    square = b("Mul", x, x)
    pads = [0] * (2 * x.ndim)
    pads[1], pads[x.ndim + 1] = before, after
    padded = b("Pad", square, np.array(pads, np.int64))
    total = None
    for offset in range(size):
        window = b("Slice", padded, [offset], [offset + channels], [1])
        total = window if total is None else b("Add", total, window)
    base = b("Add", b.const(a["bias"], x.dtype), b("Mul", b.const(a["alpha"] / size, x.dtype), total))
    return [b("Div", x, b("Pow", base, b.const(a["beta"], x.dtype)))]


def _trilu(b, xs, a):
    x = xs[0]
    k = family._trilu_k(a["k"]) if a.get("k") is not None else 0
    rows, cols = x.shape[-2], x.shape[-1]
    diagonal = b("Sub", reshape(b, coordinate(b, (cols,), 0), [1, cols]), reshape(b, coordinate(b, (rows,), 0), [rows, 1]))
    limit = b.const(k, I64)
    keep = b("GreaterOrEqual", diagonal, limit) if a["upper"] else b("LessOrEqual", diagonal, limit)
    return [b("Where", keep, x, b.const(0, x.dtype))]


def _rotary(b, xs, a):
    x, cos, sin, position_ids = (list(xs) + [None])[:4]
    batch, seq, heads, head_size, rotary = family._rotary_dims(xs, a)
    rows = b("Transpose", x, perm=[0, 2, 1, 3]) if x.ndim == 4 else reshape(b, x, [batch, seq, heads, head_size])
    if position_ids is not None:
        cos, sin = b("Gather", cos, position_ids, axis=0), b("Gather", sin, position_ids, axis=0)
    cos, sin = (reshape(b, c, [batch, seq, 1, rotary // 2]) for c in (cos, sin))
    if a["interleaved"]:
        x1 = b("Slice", rows, [0], [rotary], [3], [2])
        x2 = b("Slice", rows, [1], [rotary], [3], [2])
    else:
        x1 = b("Slice", rows, [0], [rotary // 2], [3])
        x2 = b("Slice", rows, [rotary // 2], [rotary], [3])
    real = b("Sub", b("Mul", cos, x1), b("Mul", sin, x2))
    imag = b("Add", b("Mul", sin, x1), b("Mul", cos, x2))
    if a["interleaved"]:
        pairs = b("Concat", reshape(b, real, real.shape + (1,)), reshape(b, imag, imag.shape + (1,)), axis=4)
        turned = reshape(b, pairs, [batch, seq, heads, rotary])
    else:
        turned = b("Concat", real, imag, axis=3)
    if rotary < head_size:
        turned = b("Concat", turned, b("Slice", rows, [rotary], [head_size], [3]), axis=3)
    return [b("Transpose", turned, perm=[0, 2, 1, 3]) if x.ndim == 4 else reshape(b, turned, x.shape)]


def _attention(b, xs, a):
    q, k, v, mask, past_key, past_value = (list(xs) + [None] * 6)[:6]
    batch, hq, hkv, lq, lkv, past, d, dv = family._attention_dims(xs, a)
    three_d = q.ndim == 3
    if three_d:  # (batch, len, heads * size) -> (batch, heads, len, size)
        q = b("Transpose", reshape(b, q, [batch, lq, hq, d]), perm=[0, 2, 1, 3])
        k = b("Transpose", reshape(b, k, [batch, lkv, hkv, d]), perm=[0, 2, 1, 3])
        v = b("Transpose", reshape(b, v, [batch, lkv, hkv, dv]), perm=[0, 2, 1, 3])
    present_key = b("Identity", k) if past_key is None else b("Concat", past_key, k, axis=2)
    present_value = b("Identity", v) if past_value is None else b("Concat", past_value, v, axis=2)
    total = past + lkv
    group = hq // hkv if hkv else 1

    def repeat(t, size):
        wide = b("Expand", reshape(b, t, [batch, hkv, 1, total, size]),
                 np.array([batch, hkv, group, total, size], np.int64))
        return reshape(b, wide, [batch, hq, total, size])

    keys, values = repeat(present_key, d), repeat(present_value, dv)
    scale = a.get("scale", 1 / math.sqrt(d) if d else 1.0)
    raw = b("Mul", b("MatMul", q, b("Transpose", keys, perm=[0, 1, 3, 2])), b.const(scale, q.dtype))
    scores = raw
    if a["softcap"] > 0:
        cap = b.const(a["softcap"], q.dtype)
        scores = b("Mul", cap, b("Tanh", b("Div", scores, cap)))
    softcapped = scores
    zero, minus_inf = b.const(0, q.dtype), b.const(-np.inf, q.dtype)
    bias = b("Expand", zero, np.array([lq, total], np.int64))
    if mask is not None:
        bias = b("Add", bias, b("Where", mask, zero, minus_inf) if mask.dtype == BOOL else mask)
    if a["is_causal"]:
        visible = b("LessOrEqual", reshape(b, coordinate(b, (total,), 0), [1, total]),
                    b("Add", reshape(b, coordinate(b, (lq,), 0), [lq, 1]), b.const(past, I64)))
        bias = b("Add", bias, b("Where", visible, zero, minus_inf))
    scores = b("Add", scores, bias)
    if total:
        last = _axes(-1)
        bias = b("Expand", bias, np.array(scores.shape, np.int64))
        masked_rows = b("Equal", b("ReduceMax", bias, last, keepdims=1), minus_inf)
        top = b("ReduceMax", scores, last, keepdims=1)
        e = b("Exp", b("Sub", scores, b("Where", b("Equal", top, minus_inf), zero, top)))
        sums = b("ReduceSum", e, last, keepdims=1)
        sums = b("Where", b("Equal", sums, zero), b.const(1, q.dtype), sums)
        probs = b("Where", masked_rows, zero, b("Div", e, sums))
    else:
        probs = b("Expand", zero, np.array(scores.shape, np.int64))
    y = b("MatMul", probs, values)
    if three_d:
        y = reshape(b, b("Transpose", y, perm=[0, 2, 1, 3]), [batch, lq, hq * dv])
    qk = (raw, softcapped, scores, probs)[a["qk_matmul_output_mode"]]
    return [y, present_key, present_value, b("Identity", qk) if qk is raw and a["softcap"] <= 0 else qk]


_INDEX = ("Expand[int64]", "CumSum[int64]", "Reshape[int64]", "Sub[int64]", "Add[int64]")

set_decompositions({
    "BatchNormalization": Decomposition(_batchnorm, _NORM + ("Identity",), **_WIDE),
    "LayerNormalization": Decomposition(_layernorm, _NORM, **_WIDE),
    "RMSNormalization": Decomposition(_rmsnorm, _NORM, **_WIDE),
    "GroupNormalization": Decomposition(_groupnorm, _NORM, **_WIDE),
    "InstanceNormalization": Decomposition(_instancenorm, _NORM, **_WIDE),
    "LRN": Decomposition(_lrn, ("Mul", "Pad", "Slice", "Add", "Pow", "Div"), **_WIDE),
    "Trilu": Decomposition(_trilu, _INDEX + ("GreaterOrEqual[int64]", "LessOrEqual[int64]", "Where[bool]",
                                             "Where"), float32=()),
    "RotaryEmbedding": Decomposition(_rotary, ("Transpose", "Reshape", "Gather", "Slice", "Mul", "Sub", "Add",
                                               "Concat"), **_WIDE),
    "Attention": Decomposition(_attention, ("Transpose", "Reshape", "Identity", "Concat", "Expand", "MatMul",
                                            "Mul", "Tanh", "Div", "Add", "Where", "Where[bool]", "LessOrEqual[int64]",
                                            "ReduceMax", "Equal", "Exp", "Sub", "ReduceSum") + _INDEX, **_WIDE),
})


# -- gradients ------------------------------------------------------------------------------------------

def _reduce_to(b, t, shape):
    """Sums t over the dims that shape broadcasts along (the adjoint of broadcasting)."""
    lead = t.ndim - len(shape)
    axes = list(range(lead)) + [lead + i for i, n in enumerate(shape) if n == 1 and t.shape[lead + i] != 1]
    summed = b("ReduceSum", t, np.array(axes, np.int64), keepdims=1, noop_with_empty_axes=1)
    return reshape(b, summed, shape)


def _batchnorm_grad(b, xs, a):
    dy, x, scale, mean, inv_std = xs
    scale, mean, inv_std = (_like(b, p, x) for p in (scale, mean, inv_std))
    axes = _axes(0, *range(2, x.ndim))
    count = math.prod(x.shape[d] for d in [0] + list(range(2, x.ndim)))
    v = lambda p: _channel(b, p, x.ndim)  # noqa: E731
    xhat = b("Mul", b("Sub", x, v(mean)), v(inv_std))
    db = b("ReduceSum", dy, axes, keepdims=0)
    dscale = b("ReduceSum", b("Mul", dy, xhat), axes, keepdims=0)
    n = b.const(count, x.dtype)
    inner = b("Sub", b("Sub", dy, v(b("Div", db, n))), b("Mul", xhat, v(b("Div", dscale, n))))
    dx = b("Mul", v(b("Mul", scale, inv_std)), inner)
    return [dx, reshape(b, dscale, scale.shape), reshape(b, db, scale.shape)]


def _row_backward(b, dy, xhat, inv, scale, axes, centred):
    count = math.prod(dy.shape[d] for d in axes)
    n = b.const(count, dy.dtype)
    g = b("Mul", dy, scale)
    correction = b("Mul", xhat, b("Div", b("ReduceSum", b("Mul", g, xhat), _axes(*axes), keepdims=1), n))
    if centred:
        correction = b("Add", correction, b("Div", b("ReduceSum", g, _axes(*axes), keepdims=1), n))
    return b("Mul", inv, b("Sub", g, correction))


def _layernorm_grad(b, xs, a):
    dy, x, scale, mean, inv = xs
    scale, mean, inv = (_like(b, p, x) for p in (scale, mean, inv))
    axes = tuple(range(normalize_axis(a["axis"], x.ndim), x.ndim))
    xhat = b("Mul", b("Sub", x, mean), inv)
    dx = _row_backward(b, dy, xhat, inv, scale, axes, centred=True)
    return [dx, _reduce_to(b, b("Mul", dy, xhat), scale.shape), _reduce_to(b, dy, scale.shape)]


def _rmsnorm_grad(b, xs, a):
    dy, x, scale = xs
    scale = _like(b, scale, x)
    axes = tuple(range(normalize_axis(a["axis"], x.ndim), x.ndim))
    mean_square = b("ReduceMean", b("Mul", x, x), _axes(*axes), keepdims=1, noop_with_empty_axes=1)
    inv = _inv_std(b, mean_square, a["epsilon"])
    xhat = b("Mul", x, inv)
    dx = _row_backward(b, dy, xhat, inv, scale, axes, centred=False)
    return [dx, _reduce_to(b, b("Mul", dy, xhat), scale.shape)]


_NORM_GRAD = ("Sub", "Mul", "Div", "Add", "ReduceSum", "ReduceMean", "Sqrt", "Reshape") + _CASTS

set_decompositions({
    "BatchNormalizationGrad": Decomposition(_batchnorm_grad, _NORM_GRAD, **_WIDE),
    "LayerNormalizationGrad": Decomposition(_layernorm_grad, _NORM_GRAD, **_WIDE),
    "RMSNormalizationGrad": Decomposition(_rmsnorm_grad, _NORM_GRAD, **_WIDE),
})
