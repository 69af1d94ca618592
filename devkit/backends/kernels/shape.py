"""OpenCL kernels of devkit/ops/shape.py.

Ops that only move elements (Identity, Reshape, Flatten, Squeeze, Unsqueeze,
Dropout's output, DepthToSpace, SpaceToDepth, and Shape and Size from a
metadata buffer) are one strided copy: the input read as a view (a permuted
one for the depth/space ops) in the output's row-major order. The copy moves
the bits in plain integers of the element's width, so every dtype shares one
program per width and copies are exact; NonZero lives there too. Cast and the
generators are in shape_cast.py, Resize in shape_resize.py.
"""

from __future__ import annotations

import functools

import numpy as np

from ...abi import C
from ..support.boundary import PluginError, invalid
from .layer import (
    STORAGE_OF_WIDTH,
    STRIDED,
    Call,
    Local,
    Tensor,
    cl_type,
    copy,
    group_size,
    launch_items,
    prelude,
)
from .shape_cast import cast, constant_of_shape, eye_like, fill, range_
from .shape_kit import INDEXING, walk
from .shape_resize import resize

_WIDTH = """
/* Exclusive prefix sum of v over the work-group; *total gets the group's sum. */
inline long dk_group_scan(local long *scratch, long v, long *total) {
  size_t t = get_local_id(0), size = get_local_size(0);
  scratch[t] = v;
  barrier(CLK_LOCAL_MEM_FENCE);
  for (size_t step = 1; step < size; step <<= 1) {
    long add = t >= step ? scratch[t - step] : 0;
    barrier(CLK_LOCAL_MEM_FENCE);
    scratch[t] += add;
    barrier(CLK_LOCAL_MEM_FENCE);
  }
  *total = scratch[size - 1];
  long before = scratch[t] - v;
  barrier(CLK_LOCAL_MEM_FENCE);
  return before;
}

/* NonZero in three passes: count each group's nonzeros, turn the counts into
 * offsets, then write the coordinates. Work-item t of group g tests the
 * `per` elements from (g * size + t) * per; `mask` clears a float's sign bit
 * (-0 is zero, NaN is not). */
#define NONZERO(j) (((ulong)x[x_off + AT0(j)] & mask) != 0)

kernel void k_nonzero_count(global const X_t *x, long x_off, int n0, global const long *meta,
                            long n, ulong mask, long per, global long *counts,
                            local long *scratch) {
  long first = get_global_id(0) * per, end = min(first + per, n), found = 0, total;
  for (long j = first; j < end; ++j) found += NONZERO(j);
  dk_group_scan(scratch, found, &total);
  if (get_local_id(0) == 0) counts[get_group_id(0)] = total;
}

/* One work-group: counts[g] becomes the number of nonzeros before group g,
 * and counts[groups] the total. */
kernel void k_nonzero_offsets(global long *counts, long groups, local long *scratch) {
  long size = get_local_size(0), per = (groups + size - 1) / size;
  long first = get_local_id(0) * per, end = min(first + per, groups), sum = 0, total;
  for (long g = first; g < end; ++g) sum += counts[g];
  long before = dk_group_scan(scratch, sum, &total);
  for (long g = first; g < end; ++g) {
    long count = counts[g];
    counts[g] = before;
    before += count;
  }
  if (get_local_id(0) == 0) counts[groups] = total;
}

/* y is [rank, count] int64, sized from the data the host read: should the
 * data have changed while the op was queued, writes stay inside y. */
kernel void k_nonzero_write(global const X_t *x, long x_off, int n0, global const long *meta,
                            long n, ulong mask, long per, global const long *offsets,
                            local long *scratch, global long *y, long y_off, long count,
                            int rank, global const long *shape) {
  long first = get_global_id(0) * per, end = min(first + per, n), found = 0, total;
  for (long j = first; j < end; ++j) found += NONZERO(j);
  long at = offsets[get_group_id(0)] + dk_group_scan(scratch, found, &total);
  for (long j = first; j < end && at < count; ++j) {
    if (!NONZERO(j)) continue;
    long rest = j;
    for (int d = rank - 1; d >= 0; --d) {
      y[y_off + d * count + at] = rest % shape[d];
      rest /= shape[d];
    }
    ++at;
  }
}
"""

_NONZERO_PER_ITEM = 16  # elements each work-item tests


@functools.cache
def _width_source(itemsize: int) -> str:
    return prelude("X", STORAGE_OF_WIDTH[itemsize], False) + INDEXING + _WIDTH


def _copy(c: Call, x, x_offset: int, view, y: Tensor) -> None:
    """y = the elements of x (a Tensor or a device buffer) read through ``view``
    ((shape, strides) from x_offset) in row-major order."""
    copy(c, x, (x_offset, *view), y, (y.offset, y.shape, y.strides))


def _same_order(c: Call, key: int) -> None:
    """Identity, Reshape, Flatten, Squeeze, Unsqueeze: the input's elements in
    row-major order (the shape inputs arrive as attributes, already applied)."""
    c.expect((1, 1), 1)
    x = c.inputs[0]
    _copy(c, x, x.offset, (x.shape, x.strides), c.outputs[0])


def _dropout(c: Call, key: int) -> None:
    """Inference: the data, and a mask that keeps everything."""
    c.expect((1, 1), 2)
    x = c.inputs[0]
    _copy(c, x, x.offset, (x.shape, x.strides), c.outputs[0])
    mask = c.outputs[1]
    fill(c, mask.dtype, mask, mask.offset, mask.size, 1.0)


def _depth_to_space(c: Call, key: int) -> None:
    """The output as [N, C', H, b (row in block), W, b (column in block)];
    input channel DCR (row * b + column) * C' + c, CRD (c * b + row) * b + column."""
    c.expect((1, 1), 1)
    x, y = c.inputs[0], c.outputs[0]
    b, crd = c.attrs["blocksize"], c.attrs["mode"] == "CRD"
    n, _, h, w = x.shape
    channels = y.shape[1]
    s = x.strides
    shape = [n, channels, h, b, w, b]
    strides = [s[0], s[1] * b * b if crd else s[1], s[2], s[1] * b if crd else s[1] * b * channels,
               s[3], s[1] if crd else s[1] * channels]
    _copy(c, x, x.offset, (shape, strides), y)


def _space_to_depth(c: Call, key: int) -> None:
    """Output channel DCR (row * b + column) * C + c, CRD (c * b + row) * b +
    column: the output walks the input as [N, b, b, C, H', W'] or [N, C, b, b, H', W']."""
    c.expect((1, 1), 1)
    x, y = c.inputs[0], c.outputs[0]
    b, crd = c.attrs["blocksize"], c.attrs["mode"] == "CRD"
    n, channels, _, _ = x.shape
    s = x.strides
    if crd:
        shape, strides = [n, channels, b, b], [s[0], s[1], s[2], s[3]]
    else:
        shape, strides = [n, b, b, channels], [s[0], s[2], s[3], s[1]]
    _copy(c, x, x.offset, (shape + y.shape[2:], strides + [s[2] * b, s[3] * b]), y)


def _shape(c: Call, key: int) -> None:
    """The input's shape, sliced (the host sized the output); its data is never read."""
    c.expect((1, 1), 1)
    x, y = c.inputs[0], c.outputs[0]
    rank = x.ndim
    start = c.attrs["start"]
    start = min(max(start + rank if start < 0 else start, 0), rank)
    values = x.shape[start:start + y.size]
    _copy(c, c.buffer(values), 0, ([len(values)], [1]), y)


def _size(c: Call, key: int) -> None:
    c.expect((1, 1), 1)
    _copy(c, c.buffer([c.inputs[0].size]), 0, ([], []), c.outputs[0])


# Bits that make an element nonzero: all but a float's sign bit.
_NONZERO_MASK = {"float16": 0x7FFF, "bfloat16": 0x7FFF, "float32": 0x7FFFFFFF,
                 "float64": 0x7FFFFFFFFFFFFFFF}


def _nonzero(c: Call, key: int) -> None:
    """y is int64 (rank, count): the count is the data's, checked in stream order
    (the host sized y from the data it read, which may have changed since)."""
    c.expect((1, 1), 1)
    x, y = c.inputs[0], c.outputs[0]
    if y.dtype != C.DK_DTYPE_INT64 or y.ndim != 2 or y.shape[0] != x.ndim:
        raise invalid(f"NonZero: the output must be int64 of shape ({x.ndim}, count), got dtype key "
                      f"{y.dtype:#x} and shape {tuple(y.shape)}")
    count = y.shape[1]
    if x.size == 0:
        if count:
            raise invalid(f"NonZero: X is empty, but the output has room for {count} nonzero elements")
        return
    t = cl_type(key)
    source = _width_source(t.itemsize)
    size = group_size(c)
    groups = -(-x.size // (size * _NONZERO_PER_ITEM))
    counts = c.scratch(8 * (groups + 1))
    scratch = Local(8 * size)
    read = [x, np.int64(x.offset), *walk(c, (x.shape, x.strides)), np.int64(x.size),
            np.uint64(_NONZERO_MASK.get(t.name, 2 ** (8 * t.itemsize) - 1)),
            np.int64(_NONZERO_PER_ITEM)]
    c.launch(source, "k_nonzero_count", read + [counts, scratch], groups * size, size)
    c.launch(source, "k_nonzero_offsets", [counts, np.int64(groups), scratch], size, size)
    if y.size:
        c.launch(source, "k_nonzero_write",
                 read + [counts, scratch, y, np.int64(y.offset), np.int64(count),
                         np.int32(x.ndim), c.buffer(x.shape)], groups * size, size)

    def report(reader) -> PluginError | None:
        found = np.empty(1, np.int64)
        reader.read(found, counts, 8 * groups)
        if int(found[0]) == count:
            return None
        return PluginError(C.DK_FAILED_PRECONDITION,
                           f"NonZero: X has {int(found[0])} nonzero elements, but shape inference counted "
                           f"{count} (did the data change while the op was queued?)")

    c.check_in_stream_order(report)


_ONE_HOT = """
/* y is [outer, depth, inner]: on where the index of (outer, inner) names the
 * position on the depth axis, off elsewhere; values holds [off, on]. */
kernel void k_one_hot(global const I_t *indices, long i_off, int n0, global const long *meta,
                      global const V_t *values, long v_off, long v_step,
                      global V_t *y, long y_off, long depth, long inner, long n) {
  long o = get_global_id(0);
  if (o >= n) return;
  long within = o % inner, k = o / inner % depth, outer = o / inner / depth;
  I_ct index = I_load(indices, i_off + AT0(outer * inner + within));
  bool hot;
#if I_IS_FLOAT
  /* Truncated toward zero; NaN and inf fall outside [-depth, depth). */
  I_ct position = trunc(index);
  hot = position >= -(I_ct)depth && position < (I_ct)depth &&
        ((long)position < 0 ? (long)position + depth : (long)position) == k;
#else
  hot = index >= -depth && index < depth && (index < 0 ? index + depth : (long)index) == k;
#endif
  y[y_off + o] = values[v_off + (hot ? v_step : 0)];
}
"""


@functools.cache
def _one_hot_source(itemsize: int, index_key: int, fp64: bool) -> str:
    values = prelude("V", STORAGE_OF_WIDTH[itemsize], False)
    return values + prelude("I", index_key, fp64) + INDEXING + _ONE_HOT


def _one_hot(c: Call, key: int) -> None:
    c.expect((2, 2), 1)
    indices, values = c.inputs
    y = c.outputs[0]
    if y.size == 0:
        return
    axis = c.attrs["axis"]
    axis = axis + y.ndim if axis < 0 else axis
    depth, inner = y.shape[axis], int(np.prod(y.shape[axis + 1:], dtype=np.int64))
    launch_items(c, _one_hot_source(cl_type(key).itemsize, indices.dtype, c.fp64), "k_one_hot",
                 [indices, np.int64(indices.offset), *walk(c, (indices.shape, indices.strides)),
                  values, np.int64(values.offset), np.int64(values.strides[0]),
                  y, np.int64(y.offset), np.int64(depth), np.int64(inner), np.int64(y.size)], y.size)


UNCLAIMED: dict[tuple[str, str], str] = {}

_READS_STRIDED = C.DK_KERNEL_STRIDED_INPUTS  # strided inputs, a compact output


def register(table) -> None:
    for op in ("Identity", "Reshape", "Flatten", "Squeeze", "Unsqueeze"):
        table.claim(op, _same_order, STRIDED, UNCLAIMED)
    table.claim("DepthToSpace", _depth_to_space, STRIDED, UNCLAIMED)
    table.claim("SpaceToDepth", _space_to_depth, STRIDED, UNCLAIMED)
    table.claim("Shape", _shape, STRIDED, UNCLAIMED)
    table.claim("Size", _size, STRIDED, UNCLAIMED)
    table.claim("Cast", cast, STRIDED, UNCLAIMED)
    table.claim("Dropout", _dropout, _READS_STRIDED, UNCLAIMED)
    table.claim("NonZero", _nonzero, _READS_STRIDED, UNCLAIMED)
    table.claim("OneHot", _one_hot, _READS_STRIDED, UNCLAIMED)
    table.claim("EyeLike", eye_like, _READS_STRIDED, UNCLAIMED)
    table.claim("ConstantOfShape", constant_of_shape, 0, UNCLAIMED)
    table.claim("Range", range_, 0, UNCLAIMED)
    table.claim("Resize", resize, _READS_STRIDED, UNCLAIMED)
