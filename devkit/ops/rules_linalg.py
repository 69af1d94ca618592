"""Decompositions of Gemm, Einsum, the convolutions and the pools.

Conv is im2col: a strided Slice of the zero-padded input per kernel tap,
stacked, then one MatMul with the reshaped weights. ConvTranspose is the
Conv of the input spread by the stride (zeros between) with the weights
flipped and their channel axes swapped. FusedConv is its Conv, then the Add
of Z and the activation. The pools take the same per-tap
Slices and reduce them; the positions each tap reads (for MaxPool's indices
and AveragePool's divisor) come from ramps on the device. Einsum takes
diagonals with a Gather, sums lone labels, and contracts operand pairs with
MatMul. float32 runs at float64 between Casts, as the kernels accumulate.
"""

from __future__ import annotations

import math

import numpy as np

from . import linalg as family
from .rules_movement import concat, coordinate, iota, reshape
from .spec import F32, I64, Decomposition, set_decompositions

_WIDE = dict(float64=(F32,))


def _gemm(b, xs, a):
    x, y, c = (list(xs) + [None])[:3]
    if a["transA"]:
        x = b("Transpose", x, perm=[1, 0])
    if a["transB"]:
        y = b("Transpose", y, perm=[1, 0])
    out = b("Mul", b("MatMul", x, y), b.const(a["alpha"], x.dtype))
    if c is not None:
        out = b("Add", out, b("Mul", c, b.const(a["beta"], x.dtype)))
    return [out]


# -- windows -------------------------------------------------------------------------------------------

def _taps(b, padded, kernel, out, strides, dilations):
    """Per kernel tap (row-major): the strided Slice of padded under it, (N, C) + out."""
    n = len(kernel)
    for tap in np.ndindex(*kernel):
        starts = [k * d for k, d in zip(tap, dilations)]
        ends = [st + (o - 1) * s + 1 for st, o, s in zip(starts, out, strides)]
        yield tap, b("Slice", padded, starts, ends, list(range(2, 2 + n)), list(strides))


def _pad_spatial(b, x, begin, end, value):
    pads = [0, 0] + list(begin) + [0, 0] + list(end)
    return b("Pad", x, np.array(pads, np.int64), np.array(value, np.float64 if np.isinf(value) else x.dtype))


def _window_ends(sizes, out, begin, end, strides, dilations, kernel):
    """End pads that cover every window (ceil_mode's last window may reach past the end pad)."""
    return [max(e, (o - 1) * s + (k - 1) * d + 1 - size - bg)
            for size, o, bg, e, s, d, k in zip(sizes, out, begin, end, strides, dilations, kernel)]


def _conv(b, xs, a):
    x, w, bias = (list(xs) + [None])[:3]
    kernel = w.shape[2:]
    out, begin, end, strides, dilations = family.window_geometry(x.shape[2:], kernel, a)
    batch, m, group = x.shape[0], w.shape[0], a["group"]
    cg, mg = x.shape[1] // group, m // group
    taps, planes = math.prod(kernel), math.prod(out)
    if planes == 0 or batch == 0:
        y = b("Expand", b.const(0, x.dtype), np.array((batch, m) + out, np.int64))
    else:
        padded = _pad_spatial(b, x, begin, end, 0)
        columns = [reshape(b, t, [batch, group, cg, 1, planes]) for _, t in _taps(b, padded, kernel, out,
                                                                                   strides, dilations)]
        stacked = reshape(b, concat(b, columns, 3) if len(columns) > 1 else columns[0],
                          [batch, group, cg * taps, planes])
        weights = reshape(b, w, [group, mg, cg * taps])
        y = reshape(b, b("MatMul", weights, stacked), (batch, m) + out)
    if bias is not None:
        y = b("Add", y, reshape(b, bias, [m] + [1] * len(kernel)))
    return [y]


def _fused_conv(b, xs, a):
    x, w, bias, z = (list(xs) + [None] * 4)[:4]
    y = b("Conv", x, w, bias, **{name: value for name, value in a.items() if name != "activation"})
    if z is not None:
        y = b("Add", y, z)
    if a["activation"] == "Relu":
        y = b("Relu", y)
    return [y]


def _conv_transpose(b, xs, a):
    x, w, bias = (list(xs) + [None])[:3]
    n = x.ndim - 2
    kernel = w.shape[2:]
    out, begin, strides, dilations = family.conv_transpose_geometry(x.shape[2:], kernel, a)
    group, c, mg = a["group"], x.shape[1], w.shape[1]
    cg, m = c // group, mg * group
    if x.size == 0 or math.prod(out) == 0:
        y = b("Expand", b.const(0, x.dtype), np.array((x.shape[0], m) + out, np.int64))
        return [y if bias is None else b("Add", y, reshape(b, bias, [m] + [1] * n))]
    spread = x
    for axis, s in enumerate(strides, start=2):
        size = spread.shape[axis]
        if s > 1 and size > 1:
            shape = list(spread.shape)
            one = reshape(b, spread, shape[:axis + 1] + [1] + shape[axis + 1:])
            zeros = b("Expand", b.const(0, x.dtype), np.array(shape[:axis + 1] + [s - 1] + shape[axis + 1:], np.int64))
            wide = reshape(b, b("Concat", one, zeros, axis=axis + 1), shape[:axis] + [size * s] + shape[axis + 1:])
            spread = b("Slice", wide, [0], [(size - 1) * s + 1], [axis])
    before = [(k - 1) * d - bg for k, d, bg in zip(kernel, dilations, begin)]
    after = [o + (k - 1) * d - L - p for o, k, d, L, p in zip(out, kernel, dilations, spread.shape[2:], before)]
    padded = b("Pad", spread, np.array([0, 0] + before + [0, 0] + after, np.int64))
    turned = b("Transpose", reshape(b, w, [group, cg, mg] + list(kernel)), perm=[0, 2, 1] + list(range(3, 3 + n)))
    turned = reshape(b, turned, [m, cg] + list(kernel))
    flipped = b("Slice", turned, [-1] * n, [-(2 ** 62)] * n, list(range(2, 2 + n)), [-1] * n)
    inputs = [padded, flipped] + ([bias] if bias is not None else [])
    return [b("Conv", *inputs, group=group, dilations=list(dilations), kernel_shape=list(kernel))]


def _positions(b, out, strides, begin, tap, dilations):
    """Per spatial axis: the input position the tap reads at each output position (int64, out-shaped)."""
    return [b("Add", b("Mul", coordinate(b, out, i), b.const(s, I64)), b.const(k * d - bg, I64))
            for i, (s, bg, k, d) in enumerate(zip(strides, begin, tap, dilations))]


def _within(b, positions, limits):
    """Whether every position p of an axis lies in [0, limit)."""
    inside = None
    for p, limit in zip(positions, limits):
        ok = b("And", b("Less", p, b.const(limit, I64)), b("Not", b("Less", p, b.const(0, I64))))
        inside = ok if inside is None else b("And", inside, ok)
    return inside


def _pool_geometry(x, a):
    kernel = a["kernel_shape"]
    out, begin, end, strides, dilations = family.window_geometry(x.shape[2:], kernel, a, pool=True)
    ends = _window_ends(x.shape[2:], out, begin, end, strides, dilations, kernel)
    return kernel, out, begin, end, ends, strides, dilations


def _max_pool(b, xs, a):
    x = xs[0]
    kernel, out, begin, end, ends, strides, dilations = _pool_geometry(x, a)
    shape = x.shape[:2] + out
    floating = x.dtype.kind == "f" or x.dtype.name == "bfloat16"
    lowest = -np.inf if floating else np.iinfo(x.dtype).min
    if math.prod(shape) == 0:
        empty = b("Expand", b.const(lowest, x.dtype), np.array(shape, np.int64))
        return [empty, b("Expand", b.const(-1, I64), np.array(shape, np.int64))]
    padded = _pad_spatial(b, x, begin, ends, lowest)
    taps = list(_taps(b, padded, kernel, out, strides, dilations))
    stacked = concat(b, [reshape(b, t, (1,) + shape) for _, t in taps], 0) if len(taps) > 1 else \
        reshape(b, taps[0][1], (1,) + shape)
    best = b("ReduceMax", stacked, np.array([0], np.int64), keepdims=0)
    sizes = x.shape[2:]
    column_major = a["storage_order"] == 1
    index = b("Expand", b.const(-1, I64), np.array(shape, np.int64))
    for tap, values in reversed(taps):  # the first tap that meets the maximum wins
        positions = _positions(b, out, strides, begin, tap, dilations)
        hit = b("Equal", values, best)
        if floating:
            hit = b("Or", hit, b("And", b("IsNaN", values), b("IsNaN", best)))
        hit = b("And", hit, _within(b, positions, sizes))
        flat, step = None, 1
        for p, size in (zip(positions, sizes) if column_major else zip(reversed(positions), reversed(sizes))):
            term = b("Mul", p, b.const(step, I64))
            flat = term if flat is None else b("Add", flat, term)
            step *= size
        index = b("Where", hit, flat, index)
    plane = math.prod(sizes)
    base = b("Mul", coordinate(b, shape, 0), b.const(x.shape[1] * plane, I64))
    base = b("Add", base, b("Mul", coordinate(b, shape, 1), b.const(plane, I64)))
    missed = b("Less", index, b.const(0, I64))  # a window over padding only
    return [best, b("Where", missed, index, b("Add", index, base))]


def _average_pool(b, xs, a):
    x = xs[0]
    kernel, out, begin, end, ends, strides, dilations = _pool_geometry(x, a)
    shape = x.shape[:2] + out
    if math.prod(shape) == 0:
        return [b("Expand", b.const(0, x.dtype), np.array(shape, np.int64))]
    padded = _pad_spatial(b, x, begin, ends, 0)
    total, count = None, None
    limits = [n + e for n, e in zip(x.shape[2:], end)] if a["count_include_pad"] else list(x.shape[2:])
    for tap, values in _taps(b, padded, kernel, out, strides, dilations):
        total = values if total is None else b("Add", total, values)
        positions = _positions(b, out, strides, begin, tap, dilations)
        if a["count_include_pad"]:  # inside the padded input: p < size + end pad
            positions = [b("Add", p, b.const(bg, I64)) for p, bg in zip(positions, begin)]
            limits_here = [n + bg for n, bg in zip(limits, begin)]
        else:
            limits_here = limits
        counted = b("Cast", _within(b, positions, limits_here), to=x.dtype)
        count = counted if count is None else b("Add", count, counted)
    return [b("Div", total, count)]


# -- Einsum ----------------------------------------------------------------------------------------------

def _diagonals(b, x, labels):
    """x with each repeated label's dims replaced by their diagonal."""
    labels = list(labels)
    while len(set(labels)) < len(labels):
        label = next(lb for lb in labels if labels.count(lb) > 1)
        p = labels.index(label)
        q = labels.index(label, p + 1)
        n = x.shape[p]
        rest = [d for d in range(x.ndim) if d not in (p, q)]
        moved = b("Transpose", x, perm=rest + [p, q])
        flat = reshape(b, moved, [x.shape[d] for d in rest] + [n * n])
        diagonal = b("Mul", iota(b, n), b.const(n + 1, I64))
        x = b("Gather", flat, diagonal, axis=len(rest))
        labels = [labels[d] for d in rest] + [label]
    return x, labels


def _sum_out(b, x, labels, keep):
    drop = [i for i, lb in enumerate(labels) if lb not in keep]
    if not drop:
        return x, labels
    x = b("ReduceSum", x, np.array(drop, np.int64), keepdims=0)
    return x, [lb for lb in labels if lb in keep]


def _contract(b, left, right, needed):
    (x, lx), (y, ly) = left, right
    batch = [lb for lb in lx if lb in ly and lb in needed]
    summed = [lb for lb in lx if lb in ly and lb not in needed]
    only_x = [lb for lb in lx if lb not in ly]
    only_y = [lb for lb in ly if lb not in lx]
    size = lambda labels, t, lt: [t.shape[lt.index(lb)] for lb in labels]  # noqa: E731
    xt = b("Transpose", x, perm=[lx.index(lb) for lb in batch + only_x + summed])
    yt = b("Transpose", y, perm=[ly.index(lb) for lb in batch + summed + only_y])
    batch_sizes = size(batch, x, lx)
    k = math.prod(size(summed, x, lx))
    m, n = math.prod(size(only_x, x, lx)), math.prod(size(only_y, y, ly))
    product = b("MatMul", reshape(b, xt, batch_sizes + [m, k]), reshape(b, yt, batch_sizes + [k, n]))
    labels = batch + only_x + only_y
    return reshape(b, product, batch_sizes + size(only_x, x, lx) + size(only_y, y, ly)), labels


def _einsum(b, xs, a):
    labels, output, sizes = family.parse_einsum(a["equation"], [x.shape for x in xs])
    operands = []
    for x, lx in zip(xs, labels):
        x, lx = _diagonals(b, x, lx)
        full = [sizes[lb] for lb in lx]
        if list(x.shape) != full:  # broadcast size-1 dims up front
            x = b("Expand", x, np.array(full, np.int64))
        operands.append((x, lx))
    for i, (x, lx) in enumerate(operands):
        others = {lb for _, lo in operands[:i] + operands[i + 1:] for lb in lo}
        operands[i] = _sum_out(b, x, lx, others | set(output))
    x, lx = operands[0]
    for i, right in enumerate(operands[1:], start=1):
        needed = set(output) | {lb for _, lo in operands[i + 1:] for lb in lo}
        x, lx = _sum_out(b, x, lx, needed | set(right[1]))
        right = _sum_out(b, *right, needed | set(lx))
        x, lx = _contract(b, (x, lx), right, needed)
    x, lx = _sum_out(b, x, lx, set(output))
    perm = [lx.index(lb) for lb in output]
    return [b("Transpose", x, perm=perm) if perm != list(range(len(perm))) else b("Identity", x)]


# -- Global pools ------------------------------------------------------------------------------------------

def _global(op):
    def rule(b, xs, a):
        x = xs[0]
        if x.ndim == 2:
            return [b("Identity", x)]
        return [b(op, x, np.arange(2, x.ndim, dtype=np.int64), keepdims=1)]
    return rule


_POSITIONS = ("Expand[int64]", "CumSum[int64]", "Reshape[int64]", "Mul[int64]", "Add[int64]", "Less[int64]",
              "Not[bool]", "And[bool]")

set_decompositions({
    "Gemm": Decomposition(_gemm, ("Transpose", "MatMul", "Mul", "Add"), **_WIDE),
    "Conv": Decomposition(_conv, ("Expand", "Pad", "Slice", "Reshape", "Concat", "MatMul", "Add"), **_WIDE),
    "FusedConv": Decomposition(_fused_conv, ("Conv", "Add", "Relu")),
    "ConvTranspose": Decomposition(_conv_transpose, ("Expand", "Add", "Reshape", "Concat", "Slice", "Pad",
                                                     "Transpose", "Conv"), float32=()),
    "MaxPool": Decomposition(_max_pool, lambda d: ("Expand", "Pad", "Slice", "Reshape", "Concat", "ReduceMax",
                                                   "Equal", "Where[int64]", "Expand[int64]") + _POSITIONS + (
        ("Or[bool]", "IsNaN") if np.dtype(d).kind == "f" or np.dtype(d).name == "bfloat16" else ()), float32=()),
    "AveragePool": Decomposition(_average_pool, ("Expand", "Pad", "Slice", "Add", "Cast[bool]", "Div")
                                 + _POSITIONS, **_WIDE),
    "Einsum": Decomposition(_einsum, ("Transpose", "Reshape", "Gather", "Expand", "ReduceSum", "MatMul",
                                      "Identity", "Expand[int64]", "CumSum[int64]", "Mul[int64]"), **_WIDE),
    "GlobalAveragePool": Decomposition(_global("ReduceMean"), ("Identity", "ReduceMean"), float32=()),
    "GlobalMaxPool": Decomposition(_global("ReduceMax"), ("Identity", "ReduceMax"), float32=()),
})


# -- gradients of the windows (col2im) ----------------------------------------------------------------------

def place_tap(b, values, tap, strides, dilations, begin, sizes):
    """col2im for one tap: values (N, C) + out, at input positions o * s - begin + k * d,
    spread by the stride with zeros and padded (or cropped) to the input sizes."""
    for axis, s in enumerate(strides, start=2):
        size = values.shape[axis]
        if s > 1 and size > 1:
            shape = list(values.shape)
            one = reshape(b, values, shape[:axis + 1] + [1] + shape[axis + 1:])
            zeros = b("Expand", b.const(0, values.dtype),
                      np.array(shape[:axis + 1] + [s - 1] + shape[axis + 1:], np.int64))
            wide = reshape(b, b("Concat", one, zeros, axis=axis + 1), shape[:axis] + [size * s] + shape[axis + 1:])
            values = b("Slice", wide, [0], [(size - 1) * s + 1], [axis])
    first = [k * d - bg for k, d, bg in zip(tap, dilations, begin)]
    last = [n - f - length for n, f, length in zip(sizes, first, values.shape[2:])]
    return b("Pad", values, np.array([0, 0] + first + [0, 0] + last, np.int64))


def _conv_grad(b, xs, a):
    dy, x, w = xs
    kernel = w.shape[2:]
    out, begin, end, strides, dilations = family.window_geometry(x.shape[2:], kernel, a)
    batch, m, group = x.shape[0], w.shape[0], a["group"]
    c = x.shape[1]
    cg, mg = c // group, m // group
    taps, planes = math.prod(kernel), math.prod(out)
    db = b("ReduceSum", dy, np.array([0] + list(range(2, dy.ndim)), np.int64), keepdims=0)
    if planes == 0 or batch == 0:
        zeros = lambda shape: b("Expand", b.const(0, x.dtype), np.array(shape, np.int64))  # noqa: E731
        return [zeros(x.shape), zeros(w.shape), db]
    padded = _pad_spatial(b, x, begin, end, 0)
    columns = [reshape(b, t, [batch, group, cg, 1, planes]) for _, t in _taps(b, padded, kernel, out,
                                                                               strides, dilations)]
    stacked = reshape(b, concat(b, columns, 3) if taps > 1 else columns[0], [batch, group, cg * taps, planes])
    dys = reshape(b, dy, [batch, group, mg, planes])
    dw = b("ReduceSum", b("MatMul", dys, b("Transpose", stacked, perm=[0, 1, 3, 2])), np.array([0], np.int64),
           keepdims=0)
    weights = reshape(b, w, [group, mg, cg * taps])
    dcols = reshape(b, b("MatMul", b("Transpose", weights, perm=[0, 2, 1]), dys), [batch, c, taps] + list(out))
    dx = None
    for i, tap in enumerate(np.ndindex(*kernel)):
        piece = reshape(b, b("Slice", dcols, [i], [i + 1], [2]), [batch, c] + list(out))
        placed = place_tap(b, piece, tap, strides, dilations, begin, x.shape[2:])
        dx = placed if dx is None else b("Add", dx, placed)
    return [dx, reshape(b, dw, w.shape), db]


def _max_pool_grad(b, xs, a):
    dy, indices = xs[0], xs[1]
    shape = tuple(int(v) for v in np.asarray(a["X_shape"]).reshape(-1))
    size, spatial = math.prod(shape), shape[2:]
    index = reshape(b, indices, [-1])
    used = b("Not", b("Less", index, b.const(0, I64)))
    if a["storage_order"] == 1 and math.prod(spatial):  # column-major positions to row-major ones
        plane = math.prod(spatial)
        rest = b("Mod", index, b.const(plane, I64))
        flat = b("Sub", index, rest)
        strides = [math.prod(spatial[i + 1:]) for i in range(len(spatial))]
        for n, stride in zip(spatial, strides):
            coord = b("Mod", rest, b.const(n, I64))
            rest = b("Div", rest, b.const(n, I64))
            flat = b("Add", flat, b("Mul", coord, b.const(stride, I64)))
        index = flat
    index = b("Where", used, index, b.const(size, I64))  # unused ones go to a spare slot
    total = b("Expand", b.const(0, dy.dtype), np.array([size + 1], np.int64))
    dx = b("ScatterElements", total, index, reshape(b, dy, [-1]), axis=0, reduction="add")
    return [reshape(b, b("Slice", dx, [0], [size], [0]), shape)]


def _average_pool_grad(b, xs, a):
    dy = xs[0]
    shape = tuple(int(v) for v in np.asarray(a["X_shape"]).reshape(-1))
    sizes = shape[2:]
    kernel = a["kernel_shape"]
    out, begin, end, strides, dilations = family.window_geometry(sizes, kernel, a, pool=True)
    if math.prod(shape) == 0 or math.prod(dy.shape) == 0:
        return [b("Expand", b.const(0, dy.dtype), np.array(shape, np.int64))]
    count = None
    for tap in np.ndindex(*kernel):
        positions = _positions(b, out, strides, begin, tap, dilations)
        if a["count_include_pad"]:
            positions = [b("Add", p, b.const(bg, I64)) for p, bg in zip(positions, begin)]
            limits = [n + bg + e for n, bg, e in zip(sizes, begin, end)]
        else:
            limits = list(sizes)
        counted = b("Cast", _within(b, positions, limits), to=dy.dtype)
        count = counted if count is None else b("Add", count, counted)
    share = b("Div", dy, count)
    dx = None
    for tap in np.ndindex(*kernel):
        placed = place_tap(b, share, tap, strides, dilations, begin, sizes)
        dx = placed if dx is None else b("Add", dx, placed)
    return [dx]


_COL2IM = ("Reshape", "Expand", "Concat", "Slice", "Pad", "Add")

set_decompositions({
    "ConvGrad": Decomposition(_conv_grad, _COL2IM + ("ReduceSum", "MatMul", "Transpose"), **_WIDE),
    "MaxPoolGrad": Decomposition(_max_pool_grad, ("Reshape[int64]", "Less[int64]", "Not[bool]", "Mod[int64]",
                                                  "Sub[int64]", "Div[int64]", "Add[int64]", "Mul[int64]",
                                                  "Where[int64]", "Expand", "ScatterElements", "Reshape", "Slice"),
                                 **_WIDE),
    "AveragePoolGrad": Decomposition(_average_pool_grad, _COL2IM + ("Cast[bool]", "Div") + _POSITIONS, **_WIDE),
})
