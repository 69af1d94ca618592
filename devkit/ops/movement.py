"""Data movement ops: Transpose, Concat, Split, Slice, Gather, GatherElements,
GatherND, ScatterElements, ScatterND, Pad, Expand and Tile.

They move or select elements without arithmetic (Scatter*'s reductions
aside), so every dtype is held to exact results. Index inputs (Gather*,
Scatter*) are int32 or int64; negative indices count from the end of their
axis, and an index out of range fails the kernel with OutOfRangeError naming
the index and the bound.
"""

from __future__ import annotations

import math

import numpy as np

from . import testing as t
from .spec import (
    ALL,
    BF16,
    BOOL,
    I32,
    I64,
    REQUIRED,
    Attr,
    Case,
    Input,
    OpSpec,
    TensorInfo,
    broadcast_shapes,
    dtype_name,
    normalize_axis,
    register,
    require_same_dtype,
)

INT64_MAX = 2 ** 63 - 1
INT64_MIN = -2 ** 63

# -- shared checks ------------------------------------------------------------------


def _value(x) -> np.ndarray:
    """A host input's values: infer gets a TensorInfo, reference the array."""
    return x.value if isinstance(x, TensorInfo) else np.asarray(x)


def _ints(x, name: str) -> list[int]:
    """A host input of integers, as a list; TypeError for other dtypes."""
    value = _value(x)
    if value.size == 0:  # [] arrives as float64
        return []
    if value.dtype.kind not in "iu":
        raise TypeError(f"input '{name}' must hold integers, got {dtype_name(value.dtype)}")
    if value.ndim > 1:
        raise ValueError(f"input '{name}' must be 1-D, got shape {value.shape}")
    return [int(v) for v in value.reshape(-1)]


def _check_indices_dtype(info: TensorInfo, name: str = "indices") -> None:
    if info.dtype not in (I32, I64):
        raise TypeError(f"input '{name}' must be int32 or int64, got {dtype_name(info.dtype)}")


def _check_updates(data: TensorInfo, updates: TensorInfo, shape: tuple[int, ...]) -> None:
    if updates.dtype != data.dtype:
        raise TypeError(f"updates have dtype {dtype_name(updates.dtype)} but data has "
                        f"{dtype_name(data.dtype)}")
    if tuple(updates.shape) != tuple(shape):
        raise ValueError(f"updates have shape {tuple(updates.shape)}; expected {tuple(shape)}")


def _check_elementwise_indices(data: TensorInfo, indices: TensorInfo, axis: int) -> None:
    """GatherElements/ScatterElements: indices of data's rank, no larger than
    data in the dims other than axis."""
    if indices.ndim != data.ndim:
        raise ValueError(f"indices have rank {indices.ndim} but data has rank {data.ndim}")
    for d, (n, m) in enumerate(zip(indices.shape, data.shape)):
        if d != axis and n > m:
            raise ValueError(f"indices shape {tuple(indices.shape)} exceeds data shape "
                             f"{tuple(data.shape)} in dim {d}")


def _unique_axes(axes, rank: int, what: str = "axes") -> list[int]:
    normalized = [normalize_axis(a, rank, f"{what} entry") for a in axes]
    if len(set(normalized)) != len(normalized):
        raise ValueError(f"{what} {list(axes)} name an axis twice")
    return normalized


def _elementwise_index(data: np.ndarray, indices: np.ndarray, axis: int) -> tuple:
    """The index tuple that picks data[i with i[axis] = indices[i]]."""
    grid = list(np.indices(indices.shape, sparse=True))
    grid[axis] = np.where(indices < 0, indices + data.shape[axis], indices)
    return tuple(grid)


def _exact(rng, shape, dtype) -> np.ndarray:
    """Values whose sums and products of a few stay exact in every dtype
    (at most 2 significant bits each), for Scatter's reductions."""
    dtype = np.dtype(dtype)
    if dtype == BOOL:
        return rng.random(shape) < 0.5
    choices = [-2.0, -1.5, -1.0, -0.5, 0.5, 1.0, 1.5, 2.0, 3.0] if t.is_float(dtype) else \
        [0, 1, 2, 3] if dtype.kind == "u" else [-3, -2, -1, 0, 1, 2, 3]
    return rng.choice(choices, size=shape).astype(dtype)


def _special(dtype, shape) -> np.ndarray:
    """The dtype's edge values, cycled to fill ``shape``."""
    values = t.special_values(dtype)
    return np.resize(values, shape)


# -- Transpose ------------------------------------------------------------------------


def _perm(rank: int, perm) -> tuple[int, ...]:
    if perm is None:
        return tuple(reversed(range(rank)))
    if sorted(perm) != list(range(rank)):
        raise ValueError(f"perm {list(perm)} is not a permutation of the axes 0..{rank - 1}")
    return tuple(perm)


def _transpose_infer(inputs, attrs):
    x = inputs[0]
    perm = _perm(x.ndim, attrs.get("perm"))
    return [(tuple(x.shape[p] for p in perm), x.dtype)]


def _transpose_cases(dtype, rng):
    def r(*shape):
        return t.random(rng, shape, dtype)

    cases = [
        Case("perm_3d", [r(2, 3, 4)], {"perm": [1, 2, 0]}),
        Case("default_reverses", [r(3, 4, 5)]),
        Case("2d", [r(37, 53)], {"perm": [1, 0]}),
        Case("keep_inner", [r(4, 5, 6)], {"perm": [1, 0, 2]}),
        Case("4d", [r(2, 3, 4, 5)], {"perm": [0, 2, 3, 1]}),
        Case("size1_dims", [r(1, 7, 1, 3)], {"perm": [3, 2, 0, 1]}),
        Case("scalar", [r()]),
        Case("empty", [r(0, 3, 2)], {"perm": [2, 0, 1]}),
        Case("large", [r(1031, 117)], {"perm": [1, 0]}),
        Case("large_nchw_to_nhwc", [r(2, 64, 31, 29)], {"perm": [0, 2, 3, 1]}),
    ]
    if t.is_float(dtype):
        cases.append(Case("special", [_special(dtype, (3, 5))], {"perm": [1, 0]}))
    return cases


register(OpSpec(
    name="Transpose", category="movement", opset=23,
    inputs=(Input("data"),), outputs=("transposed",),
    attrs=(Attr("perm", "ints", None, doc="output dim i is input dim perm[i]; default: reversed"),),
    dtypes=ALL,
    infer=_transpose_infer,
    reference=lambda x, a: [np.transpose(x[0], _perm(x[0].ndim, a.get("perm")))],
    cases=_transpose_cases,
    doc="Permutes the dims: output dim i is input dim perm[i] (reversed without perm).",
))

# -- Concat -----------------------------------------------------------------------------


def _concat_infer(inputs, attrs):
    dtype = require_same_dtype(inputs, [f"inputs[{i}]" for i in range(len(inputs))])
    first = inputs[0]
    if first.ndim == 0:
        raise ValueError("inputs must have rank >= 1")
    axis = normalize_axis(attrs["axis"], first.ndim)
    total = 0
    for i, x in enumerate(inputs):
        if x.ndim != first.ndim or any(n != m for d, (n, m) in enumerate(zip(x.shape, first.shape))
                                       if d != axis):
            raise ValueError(f"inputs[{i}] has shape {tuple(x.shape)}, which does not match "
                             f"inputs[0]'s {tuple(first.shape)} outside axis {axis}")
        total += x.shape[axis]
    shape = list(first.shape)
    shape[axis] = total
    return [(tuple(shape), dtype)]


def _concat_cases(dtype, rng):
    def r(*shape):
        return t.random(rng, shape, dtype)

    cases = [
        Case("axis1", [r(2, 3, 4), r(2, 1, 4), r(2, 5, 4)], {"axis": 1}),
        Case("axis0", [r(3, 5), r(4, 5)], {"axis": 0}),
        Case("negative_axis", [r(3, 2), r(3, 4), r(3, 1)], {"axis": -1}),
        Case("last_axis_3d", [r(2, 3, 4), r(2, 3, 2)], {"axis": 2}),
        Case("empty_input", [r(2, 0, 3), r(2, 4, 3)], {"axis": 1}),
        Case("all_empty", [r(0, 3), r(0, 3)], {"axis": 0}),
        Case("single", [r(5)], {"axis": 0}),
        Case("many", [r(1, 7) for _ in range(11)], {"axis": 0}),
        Case("large", [r(1031, 67), r(1031, 50)], {"axis": -1}),
    ]
    if t.is_float(dtype):
        cases.append(Case("special", [_special(dtype, (2, 15)), r(3, 15)], {"axis": 0}))
    return cases


register(OpSpec(
    name="Concat", category="movement", opset=13,
    inputs=(Input("inputs", variadic=True),), outputs=("concat_result",),
    attrs=(Attr("axis", "int", REQUIRED, doc="the axis to join along; negative counts from the back"),),
    dtypes=ALL,
    infer=_concat_infer,
    reference=lambda x, a: [np.concatenate(x, axis=a["axis"])],
    cases=_concat_cases,
    doc="Joins the inputs along axis; they agree in every other dim.",
))

# -- Split ----------------------------------------------------------------------------------


def _split_plan(inputs, attrs) -> tuple[int, list[int]]:
    """(axis, the size of each output along it)."""
    x = inputs[0]
    if x.ndim == 0:
        raise ValueError("input must have rank >= 1")
    axis = normalize_axis(attrs["axis"], x.ndim)
    dim = x.shape[axis]
    split = inputs[1] if len(inputs) > 1 else None
    parts = attrs.get("num_outputs")
    if split is not None and parts is not None:
        raise ValueError("give either the 'split' input or the 'num_outputs' attribute, not both")
    if split is not None:
        sizes = _ints(split, "split")
        if not sizes or any(s < 0 for s in sizes):
            raise ValueError(f"split {sizes} must list one or more sizes >= 0")
        if sum(sizes) != dim:
            raise ValueError(f"split {sizes} sums to {sum(sizes)}, but axis {axis} has size {dim}")
        return axis, sizes
    if parts is None:
        raise ValueError("give the 'split' input or the 'num_outputs' attribute")
    # ONNX: equal parts of ceil(dim / parts); the last one takes what is left.
    chunk = -(-dim // parts)
    last = dim - chunk * (parts - 1)
    if last < 0:
        raise ValueError(f"axis {axis} of size {dim} cannot be split into {parts} parts of {chunk} "
                         f"(with a smaller last part)")
    return axis, [chunk] * (parts - 1) + [last]


def _split_infer(inputs, attrs):
    x = inputs[0]
    axis, sizes = _split_plan(inputs, attrs)
    return [(x.shape[:axis] + (n,) + x.shape[axis + 1:], x.dtype) for n in sizes]


def _split_reference(inputs, attrs):
    axis, sizes = _split_plan(inputs, attrs)
    return np.split(inputs[0], np.cumsum(sizes)[:-1], axis=axis)


def _split_cases(dtype, rng):
    def r(*shape):
        return t.random(rng, shape, dtype)

    cases = [
        Case("num_outputs", [r(6, 4)], {"num_outputs": 3}),
        Case("uneven", [r(7, 3)], {"num_outputs": 4}),
        Case("empty_last_part", [r(3, 6)], {"axis": 1, "num_outputs": 4}),
        Case("split_input", [r(3, 10), [2, 0, 5, 3]], {"axis": -1}),
        Case("split_int32", [r(2, 5, 3), np.array([1, 4], np.int32)], {"axis": 1}),
        Case("one_part", [r(4, 2), [4]]),
        Case("empty_axis", [r(0, 3)], {"num_outputs": 2}),
        Case("empty_other_dim", [r(4, 0)], {"num_outputs": 2}),
        Case("large", [r(1031, 117), [300, 700, 31]]),
    ]
    if t.is_float(dtype):
        cases.append(Case("special", [_special(dtype, (15, 2))], {"num_outputs": 2}))
    return cases


register(OpSpec(
    name="Split", category="movement", opset=18,
    inputs=(Input("input"), Input("split", optional=True, host=True)),
    outputs=("outputs...",),
    attrs=(Attr("axis", "int", 0, doc="the axis to split; negative counts from the back"),
           Attr("num_outputs", "int", None, check=lambda n: None if n >= 1 else "must be >= 1",
                doc="split into this many equal parts (the last may be smaller)")),
    dtypes=ALL,
    infer=_split_infer,
    reference=_split_reference,
    cases=_split_cases,
    doc="Splits input along axis into parts of the sizes in 'split', or into num_outputs equal "
        "parts of ceil(size / num_outputs) with a smaller last one. The number of outputs "
        "varies: len(split) or num_outputs.",
))

# -- Slice ----------------------------------------------------------------------------------


def _slice_plan(inputs) -> list[tuple[int, int, int]]:
    """Per dim of data: (first index, step, count) after ONNX's clamping."""
    shape = inputs[0].shape
    rank = len(shape)
    starts, ends = _ints(inputs[1], "starts"), _ints(inputs[2], "ends")
    axes_input = inputs[3] if len(inputs) > 3 else None
    steps_input = inputs[4] if len(inputs) > 4 else None
    axes = _ints(axes_input, "axes") if axes_input is not None else list(range(len(starts)))
    steps = _ints(steps_input, "steps") if steps_input is not None else [1] * len(starts)
    if not len(starts) == len(ends) == len(axes) == len(steps):
        raise ValueError(f"starts, ends, axes and steps have lengths {len(starts)}, {len(ends)}, "
                         f"{len(axes)}, {len(steps)}; they must agree")
    plan = [(0, 1, dim) for dim in shape]
    for axis, start, end, step in zip(_unique_axes(axes, rank), starts, ends, steps):
        if step == 0:
            raise ValueError(f"steps for axis {axis} is 0")
        dim = shape[axis]
        start += dim if start < 0 else 0
        end += dim if end < 0 else 0
        if step > 0:
            start, end = min(max(start, 0), dim), min(max(end, 0), dim)
            count = max(0, -(-(end - start) // step))
        else:
            start, end = min(max(start, 0), dim - 1), min(max(end, -1), dim - 1)
            count = max(0, -(-(start - end) // -step))
        plan[axis] = (start, step, count)
    return plan


def _slice_infer(inputs, attrs):
    return [(tuple(count for _, _, count in _slice_plan(inputs)), inputs[0].dtype)]


def _slice_reference(inputs, attrs):
    out = inputs[0]
    for axis, (start, step, count) in enumerate(_slice_plan(inputs)):
        out = np.take(out, start + step * np.arange(count, dtype=np.int64), axis=axis)
    return [out]


def _slice_cases(dtype, rng):
    def r(*shape):
        return t.random(rng, shape, dtype)

    cases = [
        Case("axes_steps", [r(5, 6, 7), [1, 0], [4, 6], [0, 2], [1, 2]]),
        Case("default_axes", [r(5, 6), [1, 2], [4, 5]]),
        Case("negative_starts_ends", [r(6, 8), [-4, -7], [-1, -2]]),
        Case("negative_steps", [r(6, 8), [-1, 6], [INT64_MIN, 0], [0, 1], [-1, -2]]),
        Case("negative_step_clamped", [r(5), [100], [-100], [0], [-2]]),
        Case("out_of_range", [r(4, 6), [-100, 2], [100, 1000]]),
        Case("int_max_ends", [r(4, 6), [1, 1], [INT64_MAX, 2 ** 31 - 1]]),
        Case("int32_inputs", [r(4, 6), np.array([1], np.int32), np.array([-1], np.int32),
                              np.array([-1], np.int32), np.array([3], np.int32)]),
        Case("negative_axes", [r(3, 4, 5), [1, 0], [4, 2], [-1, -3]]),
        Case("huge_step", [r(4, 6), [2], [6], [1], [INT64_MAX]]),
        Case("empty_result", [r(4, 6), [3], [1], [1]]),
        Case("empty_input", [r(0, 5), [1], [4], [1]]),
        Case("large", [r(1031, 240), [0, 10], [INT64_MAX, -10], [0, 1], [2, 1]]),
    ]
    if t.is_float(dtype):
        cases.append(Case("special", [_special(dtype, (15, 3)), [14, 0], [INT64_MIN, 3], [0, 1],
                                      [-1, 1]]))
    return cases


register(OpSpec(
    name="Slice", category="movement", opset=13,
    inputs=(Input("data"), Input("starts", host=True), Input("ends", host=True),
            Input("axes", optional=True, host=True), Input("steps", optional=True, host=True)),
    outputs=("output",),
    dtypes=ALL,
    infer=_slice_infer,
    reference=_slice_reference,
    cases=_slice_cases,
    doc="data[starts:ends:steps] along axes (default: the first len(starts) axes); negative "
        "starts/ends count from the back and are clamped as ONNX specifies, so out-of-range "
        "values and INT64_MAX/INT64_MIN ends select to the edge.",
))

# -- Gather -------------------------------------------------------------------------------


def _gather_infer(inputs, attrs):
    data, indices = inputs
    _check_indices_dtype(indices)
    if data.ndim == 0:
        raise ValueError("data must have rank >= 1")
    axis = normalize_axis(attrs["axis"], data.ndim)
    return [(data.shape[:axis] + tuple(indices.shape) + data.shape[axis + 1:], data.dtype)]


def _indices(rng, shape, dim, dtype=I64) -> np.ndarray:
    """Random valid indices for an axis of size dim, negative ones included."""
    return rng.integers(-dim, dim, shape).astype(dtype)


def _gather_cases(dtype, rng):
    def r(*shape):
        return t.random(rng, shape, dtype)

    cases = [
        Case("axis0", [r(5, 4), np.array([[0, -1], [2, 4], [-5, 3]], np.int64)]),
        Case("axis1_int32", [r(3, 5, 2), _indices(rng, (4,), 5, I32)], {"axis": 1}),
        Case("negative_axis", [r(3, 4, 6), _indices(rng, (2, 3), 6)], {"axis": -1}),
        Case("scalar_index", [r(4, 3), np.array(-2, np.int64)], {"axis": 0}),
        Case("scalar_index_last_axis", [r(4, 3), np.array(1, np.int32)], {"axis": 1}),
        Case("repeated", [r(3), np.array([2, 2, -1, 0, 0], np.int64)]),
        Case("empty_indices", [r(5, 4), np.zeros((0,), np.int64)]),
        Case("empty_data_dim", [r(0, 4), np.array([1, -2], np.int64)], {"axis": 1}),
        Case("large", [r(1031, 120), _indices(rng, (1031,), 1031)]),
        Case("large_inner1", [r(50, 7), _indices(rng, (25, 100), 7, I32)], {"axis": 1}),
    ]
    if t.is_float(dtype):
        cases.append(Case("special", [_special(dtype, (15,)), np.arange(-15, 15, dtype=np.int64)]))
    return cases


register(OpSpec(
    name="Gather", category="movement", opset=13,
    inputs=(Input("data"), Input("indices")), outputs=("output",),
    attrs=(Attr("axis", "int", 0, doc="the axis indexed; negative counts from the back"),),
    dtypes=ALL,
    infer=_gather_infer,
    reference=lambda x, a: [np.take(x[0], x[1], axis=a["axis"])],
    cases=_gather_cases,
    doc="Picks entries of data along axis at indices (int32 or int64, in [-size, size)); the "
        "output's shape is data.shape[:axis] + indices.shape + data.shape[axis+1:].",
))

# -- GatherElements -------------------------------------------------------------------------


def _gather_elements_infer(inputs, attrs):
    data, indices = inputs
    _check_indices_dtype(indices)
    if data.ndim == 0:
        raise ValueError("data must have rank >= 1")
    axis = normalize_axis(attrs["axis"], data.ndim)
    _check_elementwise_indices(data, indices, axis)
    return [(tuple(indices.shape), data.dtype)]


def _gather_elements_reference(inputs, attrs):
    data, indices = inputs
    axis = normalize_axis(attrs["axis"], data.ndim)
    return [data[_elementwise_index(data, indices, axis)]]


def _gather_elements_cases(dtype, rng):
    def r(*shape):
        return t.random(rng, shape, dtype)

    cases = [
        Case("axis0", [r(3, 4), _indices(rng, (2, 4), 3)]),
        Case("axis1_int32", [r(3, 5), _indices(rng, (3, 7), 5, I32)], {"axis": 1}),
        Case("negative_axis_3d", [r(2, 3, 4), _indices(rng, (2, 3, 6), 4)], {"axis": -1}),
        Case("middle_axis_3d", [r(2, 5, 4), _indices(rng, (2, 3, 4), 5)], {"axis": 1}),
        Case("smaller_indices", [r(4, 6), _indices(rng, (2, 3), 6)], {"axis": 1}),
        Case("empty", [r(3, 4), np.zeros((0, 4), np.int64)]),
        Case("large", [r(1031, 117), _indices(rng, (1031, 117), 1031)]),
    ]
    if t.is_float(dtype):
        cases.append(Case("special", [_special(dtype, (15, 2)), _indices(rng, (20, 2), 15)]))
    return cases


register(OpSpec(
    name="GatherElements", category="movement", opset=13,
    inputs=(Input("data"), Input("indices")), outputs=("output",),
    attrs=(Attr("axis", "int", 0, doc="the axis indexed; negative counts from the back"),),
    dtypes=ALL,
    infer=_gather_elements_infer,
    reference=_gather_elements_reference,
    cases=_gather_elements_cases,
    doc="output[i] = data[i with i[axis] = indices[i]]; indices have data's rank and are no "
        "larger than data in the other dims; the output has indices' shape.",
))

# -- GatherND ---------------------------------------------------------------------------------


def _gather_nd_infer(inputs, attrs):
    data, indices = inputs
    _check_indices_dtype(indices)
    b = attrs["batch_dims"]
    if data.ndim < 1 or indices.ndim < 1:
        raise ValueError(f"data and indices must have rank >= 1, got {data.ndim} and {indices.ndim}")
    if not 0 <= b < min(data.ndim, indices.ndim):
        raise ValueError(f"batch_dims {b} must be in [0, {min(data.ndim, indices.ndim)}) (below both "
                         f"ranks)")
    if tuple(data.shape[:b]) != tuple(indices.shape[:b]):
        raise ValueError(f"the first {b} (batch) dims of data {tuple(data.shape)} and indices "
                         f"{tuple(indices.shape)} differ")
    depth = indices.shape[-1]
    if not 1 <= depth <= data.ndim - b:
        raise ValueError(f"indices.shape[-1] is {depth}; it must be in 1..{data.ndim - b} (the rank "
                         f"of data after batch_dims)")
    return [(tuple(indices.shape[:-1]) + tuple(data.shape[b + depth:]), data.dtype)]


def _gather_nd_reference(inputs, attrs):
    data, indices = inputs
    b, depth = attrs["batch_dims"], indices.shape[-1]
    batches, count = math.prod(data.shape[:b]), math.prod(indices.shape[b:-1])
    slice_shape = data.shape[b + depth:]
    flat = data.reshape((batches,) + data.shape[b:])
    tuples = indices.reshape(batches, count, depth)
    out = np.empty((batches, count) + slice_shape, data.dtype)
    for i in range(batches):
        out[i] = flat[i][tuple(tuples[i].T)]
    return [out.reshape(indices.shape[:-1] + slice_shape)]


def _gather_nd_cases(dtype, rng):
    def r(*shape):
        return t.random(rng, shape, dtype)


    def tuples(shape, dims, dtype=I64):
        return np.stack([_indices(rng, shape, n, dtype) for n in dims], axis=-1)

    cases = [
        Case("slices", [r(4, 5, 6), tuples((3, 2), (4, 5))]),
        Case("elements", [r(4, 5), tuples((3,), (4, 5))]),
        Case("rows_int32", [r(4, 5, 6), tuples((2,), (4,), I32)]),
        Case("batch_dims1", [r(3, 4, 5), tuples((3, 2), (4,))], {"batch_dims": 1}),
        Case("batch_dims2", [r(2, 3, 4, 5), tuples((2, 3, 2), (4, 5))], {"batch_dims": 2}),
        Case("batch_dims1_slices", [r(2, 4, 5, 3), tuples((2, 6), (4,))], {"batch_dims": 1}),
        Case("empty", [r(4, 5), np.zeros((0, 2), np.int64)]),
        Case("empty_slice", [r(4, 0), tuples((3,), (4,))]),
        Case("large", [r(1031, 117), tuples((1031,), (1031,))]),
    ]
    if t.is_float(dtype):
        cases.append(Case("special", [_special(dtype, (5, 3)), tuples((10,), (5, 3))]))
    return cases


register(OpSpec(
    name="GatherND", category="movement", opset=13,
    inputs=(Input("data"), Input("indices")), outputs=("output",),
    attrs=(Attr("batch_dims", "int", 0, check=lambda b: None if b >= 0 else "must be >= 0",
                doc="leading dims shared by data and indices"),),
    dtypes=ALL,
    infer=_gather_nd_infer,
    reference=_gather_nd_reference,
    cases=_gather_nd_cases,
    doc="Each k-tuple in the last dim of indices (int32 or int64; ONNX has int64 only) picks "
        "the slice data[batch, tuple, ...]; output shape indices.shape[:-1] + "
        "data.shape[batch_dims + k:].",
))

# -- ScatterElements / ScatterND ----------------------------------------------------------------

_REDUCTIONS = ("none", "add", "mul", "max", "min")
_UFUNCS = {"add": np.add, "mul": np.multiply, "max": np.maximum, "min": np.minimum}
_REDUCTION_DOC = ("reduction: none (duplicate indices: unspecified, the cpu plugin keeps the "
                  "last), add, mul, max, min, as NumPy computes them: integers wrap, max/min "
                  "propagate NaN, on bool add/max are 'or' and mul/min 'and'")


def _scatter_elements_infer(inputs, attrs):
    data, indices, updates = inputs
    _check_indices_dtype(indices)
    if data.ndim == 0:
        raise ValueError("data must have rank >= 1")
    axis = normalize_axis(attrs["axis"], data.ndim)
    _check_elementwise_indices(data, indices, axis)
    _check_updates(data, updates, indices.shape)
    return [(tuple(data.shape), data.dtype)]


def _scatter_elements_reference(inputs, attrs):
    data, indices, updates = inputs
    out = data.copy()
    index = _elementwise_index(data, indices, normalize_axis(attrs["axis"], data.ndim))
    if attrs["reduction"] == "none":
        out[index] = updates
    else:
        _UFUNCS[attrs["reduction"]].at(out, index, updates)
    return [out]


def _unique_indices(rng, shape, axis, dim) -> np.ndarray:
    """Indices of ``shape`` with distinct values along ``axis`` (a prefix of
    a permutation of range(dim), half of them negative), so 'none' has no
    duplicates."""
    keys = rng.random(shape[:axis] + (dim,) + shape[axis + 1:]).argsort(axis=axis)
    picked = np.take(keys, np.arange(shape[axis]), axis=axis)
    return np.where(rng.random(shape) < 0.5, picked - dim, picked).astype(np.int64)


def _scatter_elements_cases(dtype, rng):
    def r(*shape):
        return t.random(rng, shape, dtype)

    def e(*shape):
        return _exact(rng, shape, dtype)

    cases = [
        Case("axis0", [r(4, 5), _unique_indices(rng, (3, 5), 0, 4), r(3, 5)]),
        Case("axis1_int32", [r(3, 6), _unique_indices(rng, (3, 4), 1, 6).astype(np.int32),
                             r(3, 4)], {"axis": 1}),
        Case("negative_axis_3d", [r(2, 3, 5), _unique_indices(rng, (2, 2, 5), 2, 5), r(2, 2, 5)],
             {"axis": -1}),
        Case("smaller_indices", [r(4, 6), _unique_indices(rng, (2, 3), 1, 6), r(2, 3)], {"axis": 1}),
        Case("empty", [r(3, 4), np.zeros((0, 4), np.int64), r(0, 4)]),
        Case("large", [r(1031, 117), _unique_indices(rng, (1031, 117), 0, 1031), r(1031, 117)]),
    ]
    for reduction in ("add", "mul", "max", "min"):
        cases.append(Case(f"{reduction}_duplicates",
                          [e(3, 4), _indices(rng, (4, 4), 3), e(4, 4)], {"reduction": reduction}))
        cases.append(Case(f"{reduction}_axis1",
                          [e(2, 5), _indices(rng, (2, 3), 5, I32), e(2, 3)],
                          {"reduction": reduction, "axis": 1}))
    if t.is_float(dtype):
        special = _special(dtype, (15,))
        for reduction in ("max", "min", "add"):
            cases.append(Case(f"{reduction}_special", [special, np.arange(15, dtype=np.int64),
                                                       special[::-1].copy()],
                              {"reduction": reduction}))
    return cases


register(OpSpec(
    name="ScatterElements", category="movement", opset=18,
    inputs=(Input("data"), Input("indices"), Input("updates")), outputs=("output",),
    attrs=(Attr("axis", "int", 0, doc="the axis indexed; negative counts from the back"),
           Attr("reduction", "string", "none", choices=_REDUCTIONS, doc=_REDUCTION_DOC)),
    dtypes=ALL,
    infer=_scatter_elements_infer,
    reference=_scatter_elements_reference,
    cases=_scatter_elements_cases,
    doc="A copy of data with output[i with i[axis] = indices[i]] = updates[i] (or combined by "
        "the reduction); updates have indices' shape.",
))


def _scatter_nd_infer(inputs, attrs):
    data, indices, updates = inputs
    _check_indices_dtype(indices)
    if data.ndim < 1 or indices.ndim < 1:
        raise ValueError(f"data and indices must have rank >= 1, got {data.ndim} and {indices.ndim}")
    depth = indices.shape[-1]
    if not 1 <= depth <= data.ndim:
        raise ValueError(f"indices.shape[-1] is {depth}; it must be in 1..{data.ndim} (the rank of "
                         f"data)")
    _check_updates(data, updates, tuple(indices.shape[:-1]) + tuple(data.shape[depth:]))
    return [(tuple(data.shape), data.dtype)]


def _scatter_nd_reference(inputs, attrs):
    data, indices, updates = inputs
    out = data.copy()
    depth = indices.shape[-1]
    slices = updates.reshape((-1,) + data.shape[depth:])
    for target, update in zip(indices.reshape(-1, depth), slices):
        target = tuple(int(v) for v in target)
        if attrs["reduction"] == "none":
            out[target] = update
        else:
            out[target] = _UFUNCS[attrs["reduction"]](out[target], update)
    return [out]


def _scatter_nd_cases(dtype, rng):
    def r(*shape):
        return t.random(rng, shape, dtype)

    def e(*shape):
        return _exact(rng, shape, dtype)

    def unique(count, dim):
        picked = rng.permutation(dim)[:count]
        return np.where(rng.random(count) < 0.5, picked - dim, picked).astype(np.int64)

    cases = [
        Case("elements_1d", [r(8), np.array([[4], [-5], [1], [7]], np.int64), r(4)]),
        Case("slices", [r(4, 4, 3), unique(2, 4)[:, None], r(2, 4, 3)]),
        Case("elements_2d_int32", [r(4, 5), np.stack([unique(3, 4), unique(3, 5)], -1).astype(I32),
                                   r(3)]),
        Case("rows_of_3d", [r(3, 4, 5), np.array([[[0, -1]], [[2, 1]]], np.int64), r(2, 1, 5)]),
        Case("empty", [r(4, 4), np.zeros((0, 1), np.int64), r(0, 4)]),
        Case("large", [r(1031, 117), unique(1031, 1031)[:, None], r(1031, 117)]),
    ]
    for reduction in ("add", "mul", "max", "min"):
        cases.append(Case(f"{reduction}_duplicates",
                          [e(4, 3), np.array([[0], [-4], [2], [1], [2]], np.int64), e(5, 3)],
                          {"reduction": reduction}))
        cases.append(Case(f"{reduction}_elements",
                          [e(3, 3), _indices(rng, (6, 2), 3), e(6)], {"reduction": reduction}))
    if t.is_float(dtype):
        special = _special(dtype, (15,))
        for reduction in ("max", "min", "mul"):
            cases.append(Case(f"{reduction}_special", [special, np.arange(15, dtype=np.int64)[:, None],
                                                       special[::-1].copy()],
                              {"reduction": reduction}))
    return cases


register(OpSpec(
    name="ScatterND", category="movement", opset=18,
    inputs=(Input("data"), Input("indices"), Input("updates")), outputs=("output",),
    attrs=(Attr("reduction", "string", "none", choices=_REDUCTIONS, doc=_REDUCTION_DOC),),
    dtypes=ALL,
    infer=_scatter_nd_infer,
    reference=_scatter_nd_reference,
    cases=_scatter_nd_cases,
    doc="A copy of data where each k-tuple in the last dim of indices (int32 or int64; ONNX has "
        "int64 only) addresses the slice output[tuple, ...], set to (or combined by the "
        "reduction with) the matching slice of updates, whose shape is indices.shape[:-1] + "
        "data.shape[k:].",
))

# -- Pad ------------------------------------------------------------------------------------------


def _pad_plan(inputs, attrs) -> tuple[list[int], list[int]]:
    """(begin, end) pads of every dim of data."""
    data = inputs[0]
    rank = len(data.shape)
    pads = _ints(inputs[1], "pads")
    axes_input = inputs[3] if len(inputs) > 3 else None
    axes = _unique_axes(_ints(axes_input, "axes"), rank) if axes_input is not None else \
        list(range(rank))
    if len(pads) != 2 * len(axes):
        raise ValueError(f"pads has {len(pads)} entries; expected {2 * len(axes)} (a begin and an "
                         f"end for each of {len(axes)} axes)")
    begin, end = [0] * rank, [0] * rank
    for i, axis in enumerate(axes):
        begin[axis], end[axis] = pads[i], pads[i + len(axes)]
    return begin, end


def _pad_constant(inputs, dtype) -> np.ndarray | None:
    """The constant as a 0-d array of ``dtype``, or None when absent."""
    given = inputs[2] if len(inputs) > 2 else None
    if given is None:
        return None
    value = _value(given)
    if value.size != 1:
        raise ValueError(f"constant_value must be a scalar, got shape {value.shape}")
    value = value.reshape(())
    with np.errstate(all="ignore"):
        converted = value.astype(dtype)
        back = converted.astype(value.dtype)
    same = back == value or (value.dtype.kind == "f" and np.isnan(value) and np.isnan(back))
    if not same:
        raise ValueError(f"constant_value {value} is not representable in {dtype_name(dtype)}")
    return converted


def _pad_infer(inputs, attrs):
    data = inputs[0]
    begin, end = _pad_plan(inputs, attrs)
    _pad_constant(inputs, data.dtype)
    mode = attrs["mode"]
    shape = []
    for d, (n, b, e) in enumerate(zip(data.shape, begin, end)):
        kept = n - max(0, -b) - max(0, -e)
        if kept < 0:
            raise ValueError(f"pads ({b}, {e}) crop axis {d} of size {n} by more than its size")
        if kept == 0 and mode != "constant" and (b > 0 or e > 0):
            raise ValueError(f"mode '{mode}' cannot pad axis {d}: it has no elements to read")
        shape.append(n + b + e)
    return [(tuple(shape), data.dtype)]


def _pad_reference(inputs, attrs):
    data = inputs[0]
    begin, end = _pad_plan(inputs, attrs)
    cropped = data[tuple(slice(max(0, -b), n - max(0, -e)) for n, b, e in zip(data.shape, begin, end))]
    width = [(max(0, b), max(0, e)) for b, e in zip(begin, end)]
    if data.ndim == 0:  # nothing to pad (NumPy refuses an empty pad_width)
        return [data.copy()]
    if attrs["mode"] == "constant":
        constant = _pad_constant(inputs, data.dtype)
        return [np.pad(cropped, width, constant_values=0 if constant is None else constant)]
    if any(n == 0 for n in cropped.shape):  # NumPy refuses; the output is empty too
        return [np.zeros([n + b + e for n, (b, e) in zip(cropped.shape, width)], data.dtype)]
    return [np.pad(cropped, width, mode=attrs["mode"])]


def _pad_cases(dtype, rng):
    def r(*shape):
        return t.random(rng, shape, dtype)

    # bfloat16's constant travels as float32 (the value is exact in both): the
    # dispatcher reads host inputs of NumPy's numeric kinds only.
    constant = np.array(True if dtype == BOOL else 7 if not t.is_float(dtype) else -2.5,
                        np.float32 if dtype == BF16 else dtype)
    cases = [
        Case("constant", [r(3, 4), [0, 2, 1, 1]]),
        Case("constant_value", [r(3, 4), [1, 0, 2, 3], constant]),
        Case("constant_value_list", [r(2, 3), [1, 1, 1, 1], [1]]),
        Case("reflect", [r(4, 5), [2, 3, 1, 4]], {"mode": "reflect"}),
        Case("reflect_beyond_size", [r(3, 2), [5, 0, 3, 4]], {"mode": "reflect"}),
        Case("reflect_size1", [r(1, 4), [2, 1, 1, 2]], {"mode": "reflect"}),
        Case("edge", [r(3, 5), [3, 0, 2, 5]], {"mode": "edge"}),
        Case("wrap", [r(3, 5), [2, 1, 1, 7]], {"mode": "wrap"}),
        Case("axes", [r(2, 3, 4), [1, 2, 3, 0], constant, [-1, 0]]),
        Case("axes_reflect", [r(2, 3, 4), [2, 2], None, [1]], {"mode": "reflect"}),
        Case("negative_pads", [r(4, 6), [-1, 2, 1, -2]]),
        Case("negative_pads_edge", [r(4, 6), [-1, 2, 3, -4]], {"mode": "edge"}),
        Case("empty_constant", [r(0, 3), [1, 0, 1, 2]]),
        Case("empty_other_axis_reflect", [r(0, 3), [0, 2, 0, 2]], {"mode": "reflect"}),
        Case("scalar", [r(), []]),
        Case("3d", [r(2, 3, 4), [1, 0, 2, 0, 1, 1]], {"mode": "wrap"}),
        Case("large", [r(517, 230), [5, 5, 10, 10]], {"mode": "edge"}),
    ]
    if t.is_float(dtype):
        cases.append(Case("special", [_special(dtype, (3, 5)), [1, 2, 1, 3]], {"mode": "reflect"}))
        cases.append(Case("nan_constant", [r(2, 2), [1, 1, 1, 1], np.array(np.nan, constant.dtype)]))
    return cases


register(OpSpec(
    name="Pad", category="movement", opset=23,
    inputs=(Input("data"), Input("pads", host=True), Input("constant_value", optional=True, host=True),
            Input("axes", optional=True, host=True)),
    outputs=("output",),
    attrs=(Attr("mode", "string", "constant", choices=("constant", "reflect", "edge", "wrap")),),
    dtypes=ALL,
    infer=_pad_infer,
    reference=_pad_reference,
    cases=_pad_cases,
    doc="Pads data by pads = [begin..., end...] for axes (default: all). Modes as numpy.pad: "
        "constant (constant_value, default 0), reflect, edge, wrap; reflect and wrap repeat for "
        "pads larger than the axis. Negative pads crop first; the modes read the cropped "
        "range. constant_value may have another dtype if data's dtype holds its value exactly.",
))

# -- Expand / Tile ----------------------------------------------------------------------------------


def _expand_shape(inputs) -> tuple[int, ...]:
    shape = _ints(inputs[1], "shape")
    if any(n < 0 for n in shape):
        raise ValueError(f"shape {shape} has a negative dim")
    return broadcast_shapes(inputs[0].shape, shape)


def _expand_cases(dtype, rng):
    def r(*shape):
        return t.random(rng, shape, dtype)

    cases = [
        Case("new_dims", [r(3, 1), [2, 3, 4]]),
        Case("size1_in_shape", [r(3, 4), [1, 1]]),
        Case("same_shape", [r(2, 3), [2, 3]]),
        Case("middle_dim", [r(2, 1, 3), [2, 5, 3]]),
        Case("shorter_shape", [r(2, 1, 3), [4, 1]]),
        Case("scalar", [r(), [5, 2]]),
        Case("to_empty", [r(1, 3), [0, 3]]),
        Case("empty_input", [r(0, 1), [0, 4]]),
        Case("large_rows", [r(1, 117), [1031, 117]]),
        Case("large_columns", [r(1031, 1), [1031, 117]]),
    ]
    if t.is_float(dtype):
        cases.append(Case("special", [_special(dtype, (15, 1)), [15, 3]]))
    return cases


register(OpSpec(
    name="Expand", category="movement", opset=13,
    inputs=(Input("input"), Input("shape", host=True)), outputs=("output",),
    dtypes=ALL,
    infer=lambda x, a: [(_expand_shape(x), x[0].dtype)],
    reference=lambda x, a: [np.broadcast_to(x[0], _expand_shape(x)).copy()],
    cases=_expand_cases,
    doc="Broadcasts input against shape (both ways, as NumPy broadcasting: a 1 in shape keeps "
        "input's dim).",
))


def _repeats(inputs) -> list[int]:
    repeats = _ints(inputs[1], "repeats")
    rank = len(inputs[0].shape)
    if len(repeats) != rank:
        raise ValueError(f"repeats has {len(repeats)} entries; input has rank {rank}")
    if any(n < 0 for n in repeats):
        raise ValueError(f"repeats {repeats} has a negative entry")
    return repeats


def _tile_cases(dtype, rng):
    def r(*shape):
        return t.random(rng, shape, dtype)

    cases = [
        Case("2d", [r(2, 3), [2, 3]]),
        Case("ones", [r(3, 4), [1, 1]]),
        Case("1d", [r(5), [4]]),
        Case("3d_size1", [r(2, 1, 3), [1, 4, 2]]),
        Case("zero_repeat", [r(2, 3), [0, 2]]),
        Case("empty_input", [r(0, 3), [3, 2]]),
        Case("scalar", [r(), []]),
        Case("int32_repeats", [r(3, 2), np.array([2, 1], np.int32)]),
        Case("large", [r(31, 37), [11, 11]]),
    ]
    if t.is_float(dtype):
        cases.append(Case("special", [_special(dtype, (15,)), [3]]))
    return cases


register(OpSpec(
    name="Tile", category="movement", opset=13,
    inputs=(Input("input"), Input("repeats", host=True)), outputs=("output",),
    dtypes=ALL,
    infer=lambda x, a: [(tuple(n * k for n, k in zip(x[0].shape, _repeats(x))), x[0].dtype)],
    reference=lambda x, a: [np.tile(x[0], _repeats(x))],
    cases=_tile_cases,
    doc="Repeats input repeats[d] times along each dim d.",
))
