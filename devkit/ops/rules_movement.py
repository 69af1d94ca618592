"""Decompositions of the data movement and shape families.

Views and copies become Reshape/Transpose/Slice/Concat/Expand; element
selections (GatherElements, GatherND, ScatterND, OneHot, NonZero) become a
Gather or ScatterElements on flattened data, with the flat indices computed
on the device from ramps (``iota``: a CumSum of ones). Only scalars and
shape-sized index tables travel from the host.
"""

from __future__ import annotations

import math

import numpy as np

from . import movement as _movement
from . import shape as _shape
from .spec import I64, NUMERIC, Decomposition, TensorInfo, dtype_name, set_decompositions

_SAME = ()  # movement rules run at every dtype as they are: no float32 detour


def iota(b, n: int, dtype=I64):
    """[0, 1, ..., n-1] on the device."""
    ones = b("Expand", b.const(1, dtype), np.array([n], np.int64))
    return b("CumSum", ones, np.array(0, np.int64), exclusive=1)


def reshape(b, x, shape):
    return b("Reshape", x, np.array(list(shape), np.int64), allowzero=1)


def grid_offsets(b, shape, strides, skip=None):
    """An int64 tensor of ``shape``: sum over dims d != skip of index_d * strides[d]."""
    total = None
    for d, (n, stride) in enumerate(zip(shape, strides)):
        if d == skip or n == 1:
            continue
        ramp = b("Mul", iota(b, n), b.const(stride, I64))
        ramp = reshape(b, ramp, [n if e == d else 1 for e in range(len(shape))])
        total = ramp if total is None else b("Add", total, ramp)
    zero = reshape(b, b.const(0, I64), [1] * len(shape))
    total = zero if total is None else total
    return b("Expand", total, np.array(list(shape), np.int64))


_CONCAT_LIMIT = 32  # kernels may take a bounded number of inputs (the cpu plugin: 64)


def concat(b, parts, axis):
    """Concat of any number of parts, in rounds of at most _CONCAT_LIMIT inputs."""
    while len(parts) > _CONCAT_LIMIT:
        parts = [b("Concat", *parts[i:i + _CONCAT_LIMIT], axis=axis) if len(parts[i:i + _CONCAT_LIMIT]) > 1
                 else parts[i] for i in range(0, len(parts), _CONCAT_LIMIT)]
    return b("Concat", *parts, axis=axis) if len(parts) > 1 else b("Identity", parts[0])


def coordinate(b, shape, d):
    """An int64 tensor of ``shape`` holding each element's index along dim d."""
    ramp = reshape(b, iota(b, shape[d]), [n if e == d else 1 for e, n in enumerate(shape)])
    return b("Expand", ramp, np.array(list(shape), np.int64))


def wrap_negative(b, index, size):
    """index + size where index < 0, as int64 (the size may be a per-position tensor)."""
    index = b("Cast", index, to=I64)
    size = size if not isinstance(size, (int, np.integer)) else b.const(size, I64)
    return b("Where", b("Less", index, b.const(0, I64)), b("Add", index, size), index)


def row_major_strides(shape):
    strides, acc = [], 1
    for n in reversed(shape):
        strides.append(acc)
        acc *= n
    return list(reversed(strides))


_IOTA = ("Expand[int64]", "CumSum[int64]")
_GRID = _IOTA + ("Mul[int64]", "Reshape[int64]", "Add[int64]")
_WRAP = ("Cast[int32]", "Cast[int64]", "Less[int64]", "Where[int64]", "Add[int64]")


def _reshape_to_inferred(name):
    def rule(b, xs, a):
        own = {k: v for k, v in a.items() if b.spec_attr(name, k)}
        return [reshape(b, xs[0], b.infer(name, *xs, **own)[0][0])]
    return Decomposition(rule, ("Reshape",), float32=_SAME)


def _split(b, xs, a):
    x = xs[0]
    axis, sizes = _movement._split_plan(xs, a)
    outputs, start = [], 0
    for n in sizes:
        outputs.append(b("Slice", x, [start], [start + n], [axis]))
        start += n
    return outputs


def _tile(b, xs, a):
    x, repeats = xs[0], [int(r) for r in np.asarray(xs[1]).reshape(-1)]
    spread = [v for n in x.shape for v in (1, n)]
    wide = [v for n, r in zip(x.shape, repeats) for v in (r, n)]
    y = b("Expand", reshape(b, x, spread), np.array(wide, np.int64))
    return [reshape(b, y, [n * r for n, r in zip(x.shape, repeats)])]


def _pad(b, xs, a):
    x = xs[0]
    begin, end = _movement._pad_plan(xs, a)
    if x.ndim == 0:
        return [b("Identity", x)]
    crop = [(max(0, -s), n - max(0, -e)) for n, s, e in zip(x.shape, begin, end)]
    y = b("Slice", x, [c[0] for c in crop], [c[1] for c in crop], list(range(x.ndim)))
    mode = a["mode"]
    constant = _movement._pad_constant(xs, x.dtype) if mode == "constant" else None
    for axis, (s, e) in enumerate(zip(begin, end)):
        s, e = max(0, s), max(0, e)
        if not (s or e):
            continue
        n = y.shape[axis]
        if mode == "constant" or n == 0:
            fill = b.const(0 if constant is None else constant, x.dtype)
            parts = [b("Expand", fill, np.array(y.shape[:axis] + (k,) + y.shape[axis + 1:], np.int64))
                     for k in (s, e)]
            y = b("Concat", parts[0], y, parts[1], axis=axis)
        else:
            table = np.pad(np.arange(n), (s, e), mode=mode)
            y = b("Gather", y, b.const(table, I64), axis=axis)
    return [y]


def _gather_elements(b, xs, a):
    data, indices = xs
    axis = a["axis"] + data.ndim if a["axis"] < 0 else a["axis"]
    strides = row_major_strides(data.shape)
    index = wrap_negative(b, indices, data.shape[axis])
    flat = b("Add", grid_offsets(b, indices.shape, strides, skip=axis),
             b("Mul", index, b.const(strides[axis], I64)))
    return [b("Gather", reshape(b, data, [-1] if data.size else [0]), flat, axis=0)]


def _flat_rows(b, indices, dims):
    """Row-major flat positions of the index tuples in indices[..., :] over dims."""
    index = wrap_negative(b, indices, b.const(np.array(dims, np.int64), I64))
    strides = b.const(np.array(row_major_strides(dims), np.int64), I64)
    return b("ReduceSum", b("Mul", index, strides), np.array([-1], np.int64), keepdims=0)


def _gather_nd(b, xs, a):
    data, indices = xs
    batch = a["batch_dims"]
    depth = indices.shape[-1]
    outer = math.prod(data.shape[:batch])
    dims = data.shape[batch:batch + depth]
    inner = data.shape[batch + depth:]
    rows = reshape(b, _flat_rows(b, indices, dims), [outer, -1] if indices.size else [outer, 0])
    block = math.prod(dims)
    rows = b("Add", rows, reshape(b, b("Mul", iota(b, outer), b.const(block, I64)), [outer, 1]))
    table = reshape(b, data, [outer * block] + list(inner))
    picked = b("Gather", table, rows, axis=0)
    return [reshape(b, picked, b.infer("GatherND", data, indices, batch_dims=batch)[0][0])]


def _scatter_nd(b, xs, a):
    data, indices, updates = xs
    depth = indices.shape[-1]
    dims, inner = data.shape[:depth], math.prod(data.shape[depth:])
    rows = reshape(b, _flat_rows(b, indices, dims), [-1, 1])
    count = math.prod(indices.shape[:-1])
    table = reshape(b, data, [math.prod(dims), inner])
    where = b("Expand", rows, np.array([count, inner], np.int64))
    scattered = b("ScatterElements", table, where, reshape(b, updates, [count, inner]),
                  axis=0, reduction=a["reduction"])
    return [reshape(b, scattered, data.shape)]


def _onehot(b, xs, a):
    indices, _, values = xs
    depth = _shape._onehot_depth(TensorInfo((), np.asarray(a["depth"]).dtype, np.asarray(a["depth"])))
    axis = a["axis"] + indices.ndim + 1 if a["axis"] < 0 else a["axis"]
    position = indices
    if indices.dtype.kind == "f" or indices.dtype.name == "bfloat16":
        inside = b("And", b("Less", b.const(-depth - 1, indices.dtype), indices),
                   b("Less", indices, b.const(depth, indices.dtype)))  # trunc() in [-depth, depth)
        position = b("Where", inside, indices, b.const(depth, indices.dtype))
    position = b("Cast", position, to=I64)
    position = b("Where", b("Less", position, b.const(-depth, I64)), b.const(depth, I64), position)
    position = wrap_negative(b, position, depth)  # out of range: >= depth, which matches no class
    position = reshape(b, position, indices.shape[:axis] + (1,) + indices.shape[axis:])
    classes = reshape(b, iota(b, depth), [depth] + [1] * (indices.ndim - axis))
    hot = b("Equal", position, classes)
    off, on = (b("Gather", values, np.array(i, np.int64), axis=0) for i in (0, 1))
    return [b("Where", hot, on, off)]


# The indices may have any numeric dtype, whatever the key (the values') dtype is.
_ONEHOT_USES = ("Gather", "Where", "And[bool]", "Equal[int64]", "Reshape[int64]") + _IOTA + _WRAP + tuple(
    f"{op}[{dtype_name(d)}]" for op in ("Cast", "Less", "Where") for d in NUMERIC)


def _nonzero(b, xs, a):
    x = xs[0]
    count = b.infer("NonZero", x)[0][0][1]
    if x.ndim == 0:
        return [reshape(b, b.const(np.zeros(0, np.int64), I64), [0, count])]
    mask = reshape(b, b("Not", b("Equal", x, b.const(0, x.dtype))), [-1])
    slot = b("Sub", b("CumSum", b("Cast", mask, to=I64), np.array(0, np.int64)), b.const(1, I64))
    slot = b("Where", mask, slot, b.const(count, I64))  # the zeros go to a spare last slot
    coords = [reshape(b, coordinate(b, x.shape, d), [1, -1]) for d in range(x.ndim)]
    coords = concat(b, coords, 0) if x.ndim > 1 else coords[0]
    target = b("Expand", reshape(b, slot, [1, -1]), np.array([x.ndim, x.size], np.int64))
    base = b("Expand", b.const(0, I64), np.array([x.ndim, count + 1], np.int64))
    placed = b("ScatterElements", base, target, coords, axis=1)
    return [b("Slice", placed, [0], [count], [1])]


def _space_depth(to_space):
    def rule(b, xs, a):
        x, k = xs[0], a["blocksize"]
        n, c, h, w = x.shape
        if to_space:
            if a["mode"] == "DCR":
                y = b("Transpose", reshape(b, x, [n, k, k, c // (k * k), h, w]), perm=[0, 3, 4, 1, 5, 2])
            else:
                y = b("Transpose", reshape(b, x, [n, c // (k * k), k, k, h, w]), perm=[0, 1, 4, 2, 5, 3])
            return [reshape(b, y, [n, c // (k * k), h * k, w * k])]
        t = reshape(b, x, [n, c, h // k, k, w // k, k])
        perm = [0, 3, 5, 1, 2, 4] if a["mode"] == "DCR" else [0, 1, 3, 5, 2, 4]
        return [reshape(b, b("Transpose", t, perm=perm), [n, c * k * k, h // k, w // k])]
    return Decomposition(rule, ("Reshape", "Transpose"), float32=_SAME)


def _range(b, xs, a):
    start, limit, delta = (np.asarray(v).reshape(()) for v in xs)
    n = b.infer("Range", start, limit, delta)[0][0][0]
    dtype = start.dtype
    if dtype.kind == "f":  # start + i * delta in float64, rounded once
        i = b("Cast", iota(b, n), to=np.float64)
        value = b("Add", b("Mul", i, b.const(float(delta), np.float64)), b.const(float(start), np.float64))
        return [b("Cast", value, to=dtype)]
    i = b("Cast", iota(b, n), to=dtype)
    return [b("Add", b("Mul", i, b.const(delta, dtype)), b.const(start, dtype))]


def _eyelike(b, xs, a):
    x = xs[0]
    rows, cols = x.shape
    dtype = a.get("dtype", x.dtype)
    diagonal = b("Sub", reshape(b, iota(b, cols), [1, cols]), reshape(b, iota(b, rows), [rows, 1]))
    return [b("Cast", b("Equal", diagonal, b.const(a["k"], I64)), to=dtype)]


def _constant_of_shape(b, xs, a):
    shape = np.asarray(a["input"]).reshape(-1).astype(np.int64)
    value = b.const(_shape._constant_value(a["value"], a["dtype"]), a["dtype"])
    return [b("Expand", value, shape)]


def _dropout(b, xs, a):
    x = xs[0]
    mask = b("Expand", b.const(True), np.array(x.shape, np.int64))
    return [b("Identity", x), mask]


def _resize(b, xs, a):
    """One axis at a time, as the reference: nearest is a Gather of host-computed
    source indices; linear and cubic sum Gathers weighted by host-computed
    per-axis weights (tables of the output length by the taps), in float64."""
    x = xs[0]
    axes, scale, out_shape, starts, ends = _shape._resize_geometry(
        x.shape, _shape._given(a, "roi"), _shape._given(a, "scales"), _shape._given(a, "sizes"), a)
    mode, coordinates = a["mode"], a["coordinate_transformation_mode"]
    integer = x.dtype.kind in "iu"
    result = x if mode == "nearest" or not integer else b("Cast", x, to=np.float64)
    fill_dtype = result.dtype
    for axis in axes:
        n_in, n_out = result.shape[axis], out_shape[axis]
        if n_out == 0 or result.size == 0:
            result = b("Expand", b.const(0, result.dtype),
                       np.array(result.shape[:axis] + (n_out,) + result.shape[axis + 1:], np.int64))
            continue
        y = np.arange(n_out, dtype=np.float64)
        coordinate, outside = _shape._source_coordinates(y, coordinates, scale[axis], n_in, n_out,
                                                         starts[axis], ends[axis])
        mask_shape = (1,) * axis + (n_out,) + (1,) * (x.ndim - axis - 1)
        if mode == "nearest":
            index = np.clip(_shape._nearest_index(coordinate, a["nearest_mode"]), 0, n_in - 1)
            result = b("Gather", result, b.const(index, I64), axis=axis)
            fill = a["extrapolation_value"]
            fill = _shape._convert(np.round(fill) if integer else np.float64(fill), x.dtype)
        else:
            indices, weights = _shape._interpolation_taps(coordinate, mode, scale[axis], n_in, a)
            clamped = np.clip(indices, 0, n_in - 1)
            total = None
            for k in range(indices.shape[1]):
                w = weights[:, k].reshape(mask_shape)
                term = b("Mul", b("Gather", result, b.const(clamped[:, k], I64), axis=axis), b.const(w, fill_dtype))
                term = b("Where", b.const(w != 0, np.bool_), term, b.const(0, fill_dtype))  # an inf beside a 0 weight
                total = term if total is None else b("Add", total, term)
            result, fill = total, a["extrapolation_value"]
        if outside.any():
            result = b("Where", b.const(outside.reshape(mask_shape), np.bool_), b.const(fill, result.dtype), result)
    if mode != "nearest" and integer:
        info = np.iinfo(x.dtype)
        rounded = b("Clip", b("Round", result), np.array(float(info.min)), np.array(float(info.max)))
        return [b("Cast", rounded, to=x.dtype)]
    return [result if result is not x else b("Identity", x)]


def _resize_uses(dtype):
    if np.dtype(dtype).kind in "iu":
        return ("Gather", "Where", "Expand", "Identity", "Cast", "Expand[float64]", "Gather[float64]",
                "Mul[float64]", "Where[float64]", "Add[float64]", "Round[float64]", "Clip[float64]", "Cast[float64]")
    return ("Gather", "Where", "Expand", "Identity", "Mul", "Add")


_MOVEMENT = {
    "Resize": Decomposition(_resize, _resize_uses, float64=(np.dtype("float32"),)),
    "Identity": Decomposition(lambda b, xs, a: [reshape(b, xs[0], xs[0].shape)], ("Reshape",), float32=_SAME),
    "Flatten": _reshape_to_inferred("Flatten"),
    "Squeeze": _reshape_to_inferred("Squeeze"),
    "Unsqueeze": _reshape_to_inferred("Unsqueeze"),
    "Split": Decomposition(_split, ("Slice",), float32=_SAME),
    "Tile": Decomposition(_tile, ("Reshape", "Expand"), float32=_SAME),
    "Pad": Decomposition(_pad, ("Identity", "Slice", "Expand", "Concat", "Gather"), float32=_SAME),
    "GatherElements": Decomposition(_gather_elements, ("Reshape", "Gather") + _GRID + _WRAP, float32=_SAME),
    "GatherND": Decomposition(_gather_nd, ("Reshape", "Gather", "Mul[int64]", "ReduceSum[int64]") + _GRID + _WRAP,
                              float32=_SAME),
    "ScatterND": Decomposition(_scatter_nd, ("Reshape", "ScatterElements", "Expand[int64]", "Mul[int64]",
                                             "ReduceSum[int64]", "Reshape[int64]") + _WRAP, float32=_SAME),
    "OneHot": Decomposition(_onehot, _ONEHOT_USES, float32=_SAME),
    "NonZero": Decomposition(_nonzero, ("Equal", "Not[bool]", "Reshape[bool]", "Cast[bool]", "Sub[int64]",
                                        "Where[int64]", "Concat[int64]", "ScatterElements[int64]",
                                        "Slice[int64]", "CumSum[int64]", "Expand[int64]", "Reshape[int64]"),
                             float32=_SAME),
    "DepthToSpace": _space_depth(True),
    "SpaceToDepth": _space_depth(False),
    "Range": Decomposition(_range, _IOTA + ("Cast[int64]", "Mul", "Add", "Cast[float64]", "Mul[float64]",
                                            "Add[float64]"), float32=_SAME),
    "EyeLike": Decomposition(_eyelike, _GRID + ("Sub[int64]", "Equal[int64]", "Cast[bool]"), float32=_SAME),
    "ConstantOfShape": Decomposition(_constant_of_shape, ("Expand",), float32=_SAME),
    "Shape": Decomposition(lambda b, xs, a: [b.const(np.array(_shape._shape_slice(xs[0].shape, a), np.int64),
                                                     I64)], (), float32=_SAME),
    "Size": Decomposition(lambda b, xs, a: [b.const(np.int64(xs[0].size), I64)], (), float32=_SAME),
    "Dropout": Decomposition(_dropout, ("Identity", "Expand[bool]"), float32=_SAME),
}

set_decompositions(_MOVEMENT)
