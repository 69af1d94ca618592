"""MaxPool, AveragePool, GlobalMaxPool and GlobalAveragePool.

The window pools run one work-item per output element and visit the window's
taps in row-major order, so MaxPool keeps the first maximum (and the first
NaN, which beats every number) as the spec requires; they read and write
through strides. A window that misses the input gives -inf (the dtype's
minimum) and index -1, or for AveragePool 0/0 = NaN unless
count_include_pad counts padding in it.

The global pools run one work-group per (N, C) plane: each work-item folds a
strided share of the plane, then a tree in local memory folds the shares.
Sums are in float64 (the accumulator type) wherever the device has fp64.
"""

from __future__ import annotations

import functools
import math

import numpy as np

from ...abi import C
from ...ops.linalg import window_geometry
from .layer import STRIDED, Call, Local, cl_type, group_size, launch_items, prelude

_WINDOW = """
/* meta: per spatial axis the input sizes, output sizes, kernel sizes,
 * strides, dilations, begin pads and end pads (nsp each), then the strides
 * of X, of Y and of the indices (nsp + 2 each). */
#define G_IN(d) meta[d]
#define G_OUT(d) meta[nsp + (d)]
#define G_K(d) meta[2 * nsp + (d)]
#define G_S(d) meta[3 * nsp + (d)]
#define G_D(d) meta[4 * nsp + (d)]
#define G_P(d) meta[5 * nsp + (d)]
#define G_PE(d) meta[6 * nsp + (d)]
#define X_STRIDE(d) meta[7 * nsp + (d)]
#define Y_STRIDE(d) meta[8 * nsp + 2 + (d)]
#define I_STRIDE(d) meta[9 * nsp + 4 + (d)]

/* Output element i: its offsets in X (plane start) and Y (and the indices),
 * its position in the output plane and its plane's number. */
inline void pool_output(long i, long channels, int nsp, global const long *meta, long *x_at, long *y_at,
                        long *i_at, long *position, long *plane) {
  long rest = i, span = 1;
  *position = 0;
  for (int d = nsp - 1; d >= 0; --d) {
    const long q = rest % G_OUT(d);
    rest /= G_OUT(d);
    *y_at += q * Y_STRIDE(2 + d);
    *i_at += q * I_STRIDE(2 + d);
    *position += q * span;
    span *= G_OUT(d);
  }
  *plane = rest;
  const long c = rest % channels, n = rest / channels;
  *x_at += n * X_STRIDE(0) + c * X_STRIDE(1);
  *y_at += n * Y_STRIDE(0) + c * Y_STRIDE(1);
  *i_at += n * I_STRIDE(0) + c * I_STRIDE(1);
}

/* Tap t of the window of output `position`: whether it lies inside X (and
 * inside the explicitly padded X), its offset from the plane start and its
 * row-major index in the plane. */
inline bool pool_tap(long t, long position, int nsp, global const long *meta, bool *padded, long *at,
                     long *index) {
  bool inside = true;
  long span = 1;
  *padded = true;
  *at = 0;
  *index = 0;
  for (int d = nsp - 1; d >= 0; --d) {
    const long pos = position % G_OUT(d) * G_S(d) - G_P(d) + t % G_K(d) * G_D(d);
    position /= G_OUT(d);
    t /= G_K(d);
    inside = inside && pos >= 0 && pos < G_IN(d);
    *padded = *padded && pos < G_IN(d) + G_PE(d);
    *at += pos * X_STRIDE(2 + d);
    *index += pos * span;
    span *= G_IN(d);
  }
  return inside;
}
"""

_MAX_POOL = """
kernel void k_MaxPool(global const X_t *x, long x_off, global X_t *y, long y_off, global long *indices,
                      long i_off, int indexed, long channels, long taps, int col_major, int nsp,
                      global const long *meta, long total) {
  const long i = get_global_id(0);
  if (i >= total) return;
  long x_at = x_off, y_at = y_off, i_at = i_off, position, plane, at, index, best_index = -1;
  bool padded;
  pool_output(i, channels, nsp, meta, &x_at, &y_at, &i_at, &position, &plane);
  X_ct best = LOWEST;
  for (long t = 0; t < taps; ++t) {
    if (!pool_tap(t, position, nsp, meta, &padded, &at, &index)) continue;
    const X_ct v = X_load(x, x_at + at);
    if (best_index < 0 || BEATS(v, best)) {
      best = v;
      best_index = index;
    }
  }
  long in_plane = 1;
  for (int d = 0; d < nsp; ++d) in_plane *= G_IN(d);
  if (col_major && best_index >= 0) {  /* the same position, counted column-major */
    long rest = best_index, span = in_plane;
    best_index = 0;
    for (int d = nsp - 1; d >= 0; --d) {
      span /= G_IN(d);
      best_index += rest % G_IN(d) * span;
      rest /= G_IN(d);
    }
  }
  X_store(y, y_at, best);
  if (indexed) indices[i_at] = best_index < 0 ? -1 : plane * in_plane + best_index;
}
"""

_FLOAT_POOLS = """
kernel void k_AveragePool(global const X_t *x, long x_off, global X_t *y, long y_off, long channels,
                          long taps, int include_pad, int nsp, global const long *meta, long total) {
  const long i = get_global_id(0);
  if (i >= total) return;
  long x_at = x_off, y_at = y_off, i_at = 0, position, plane, at, index, count = 0;
  bool padded;
  pool_output(i, channels, nsp, meta, &x_at, &y_at, &i_at, &position, &plane);
  X_acc sum = 0;
  for (long t = 0; t < taps; ++t) {
    const bool inside = pool_tap(t, position, nsp, meta, &padded, &at, &index);
    if (inside) sum += X_load(x, x_at + at);
    count += include_pad ? padded : inside;
  }
  X_store(y, y_at, sum / count);  /* nothing counted: 0 / 0, NaN */
}

inline X_acc max_nan(X_acc a, X_acc b) { return a > b || isnan(a) ? a : b; }

/* One work-group per plane of a compact X; `part` holds a value per work-item. */
kernel void k_GlobalMaxPool(global const X_t *x, long x_off, global X_t *y, long y_off, long plane,
                            local X_acc *part) {
  const int l = get_local_id(0), size = get_local_size(0);
  const long start = x_off + get_group_id(0) * plane;
  X_acc best = -INFINITY;
  for (long j = l; j < plane; j += size) best = max_nan(best, X_load(x, start + j));
  part[l] = best;
  barrier(CLK_LOCAL_MEM_FENCE);
  for (int s = size / 2; s > 0; s /= 2) {
    if (l < s) part[l] = max_nan(part[l], part[l + s]);
    barrier(CLK_LOCAL_MEM_FENCE);
  }
  if (l == 0) X_store(y, y_off + get_group_id(0), part[0]);
}

kernel void k_GlobalAveragePool(global const X_t *x, long x_off, global X_t *y, long y_off, long plane,
                                local X_acc *part) {
  const int l = get_local_id(0), size = get_local_size(0);
  const long start = x_off + get_group_id(0) * plane;
  X_acc sum = 0;
  for (long j = l; j < plane; j += size) sum += X_load(x, start + j);
  part[l] = sum;
  barrier(CLK_LOCAL_MEM_FENCE);
  for (int s = size / 2; s > 0; s /= 2) {
    if (l < s) part[l] += part[l + s];
    barrier(CLK_LOCAL_MEM_FENCE);
  }
  if (l == 0) X_store(y, y_off + get_group_id(0), part[0] / plane);  /* an empty plane: NaN */
}
"""

# The identity of max per integer dtype (floats: -INFINITY). A value beats the
# best so far when larger, or (floats) when it is the first NaN.
_LOWEST = {C.DK_DTYPE_INT8: "CHAR_MIN", C.DK_DTYPE_UINT8: "0"}


@functools.cache
def _source(key: int, fp64: bool) -> str:
    is_float = cl_type(key).is_float
    beats = "(v > best || (isnan(v) && !isnan(best)))" if is_float else "(v > best)"
    macros = f"#define LOWEST {_LOWEST.get(key, '-INFINITY')}\n#define BEATS(v, best) {beats}\n"
    return prelude("X", key, fp64) + macros + _WINDOW + _MAX_POOL + (_FLOAT_POOLS if is_float else "")


def _window(c: Call, outputs: list) -> tuple[object, int, int]:
    """The window pools' metadata buffer, spatial rank and taps per window."""
    x = c.inputs[0]
    kernel = c.attrs["kernel_shape"]
    out, begin, end, strides, dilations = window_geometry(x.shape[2:], kernel, c.attrs, pool=True)
    meta = (list(x.shape[2:]) + list(out) + list(kernel) + list(strides) + list(dilations) + list(begin)
            + list(end) + x.strides + [s for t in outputs for s in t.strides])
    return c.buffer(meta), len(kernel), math.prod(kernel)


def _launch_window(c: Call, key: int, name: str, args: list, total: int) -> None:
    launch_items(c, _source(key, c.fp64), name, args + [np.int64(total)], total, preferred=64)


def _max_pool(c: Call, key: int) -> None:
    c.expect((1, 1), (1, 2))  # Indices is an optional output
    x, y = c.inputs[0], c.outputs[0]
    if y.size == 0:
        return
    # Without Indices, Y stands in for its (never written) buffer and strides.
    indices = c.outputs[1] if len(c.outputs) > 1 else y
    meta, nsp, taps = _window(c, [y, indices])
    _launch_window(c, key, "k_MaxPool",
                   [x, np.int64(x.offset), y, np.int64(y.offset), indices, np.int64(indices.offset),
                    np.int32(len(c.outputs) > 1), np.int64(x.shape[1]), np.int64(taps), np.int32(c.attrs["storage_order"]),
                    np.int32(nsp), meta], y.size)


def _average_pool(c: Call, key: int) -> None:
    c.expect((1, 1), 1)
    x, y = c.inputs[0], c.outputs[0]
    if y.size == 0:
        return
    # The indices' strides are never read: Y's stand in for them.
    meta, nsp, taps = _window(c, [y, y])
    _launch_window(c, key, "k_AveragePool",
                   [x, np.int64(x.offset), y, np.int64(y.offset), np.int64(x.shape[1]), np.int64(taps),
                    np.int32(c.attrs["count_include_pad"]), np.int32(nsp), meta], y.size)


def _global_pool(c: Call, key: int) -> None:
    c.expect((1, 1), 1)
    x, y = c.inputs[0], c.outputs[0]
    if y.size == 0:
        return
    size = group_size(c)  # a power of two, which the tree halves
    c.launch(_source(key, c.fp64), f"k_{c.op}",
             [x, np.int64(x.offset), y, np.int64(y.offset), np.int64(math.prod(x.shape[2:])),
              Local(size * 8)], y.size * size, size)


def register(table, unclaimed) -> None:
    table.claim("MaxPool", _max_pool, STRIDED, unclaimed)
    table.claim("AveragePool", _average_pool, STRIDED, unclaimed)
    table.claim("GlobalMaxPool", _global_pool, 0, unclaimed)
    table.claim("GlobalAveragePool", _global_pool, 0, unclaimed)
