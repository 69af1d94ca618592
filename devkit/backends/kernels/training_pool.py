"""MaxPoolGrad and AveragePoolGrad: every dX element gathers its sum, so no
float is ever added concurrently.

AveragePoolGrad gathers from the windows that cover the element (AveragePool's
geometry, devkit.ops.linalg.window_geometry), each dY element divided by its
window's count. MaxPoolGrad's windows are not known (only MaxPool's
Indices are), so a first pass links every dY element into a list per X element
it points at (an integer atomic exchange), and a second walks each list.
Sums are in the prelude's acc type, rounded once, as on the cpu plugin
(training_pool.c); compact tensors.
"""

from __future__ import annotations

import math

import numpy as np

from ...ops.linalg import window_geometry
from ..support.boundary import invalid
from .layer import Call, launch_items, prelude
from .training_common import NO_CONTRACT, VALID_RANGE, RangeCheck, scratch

# A list of at most this many dY elements is summed in dY order (that of
# the cpu plugin, deterministic); a longer one, which MaxPool's own indices
# never make, in list order, to keep the walk linear.
_ORDERED_LIST = 32

_TEMPLATE = """
kernel void k_max_pool_heads(global int *head, long n) {
  long i = get_global_id(0);
  if (i < n) head[i] = -1;
}

/* dY element j points at X element index[j] (-1: a window that missed X;
 * spatial part column-major with storage_order 1): pushed on that element's
 * list, next[j] the element pushed before it. spatial: X's spatial sizes. */
kernel void k_max_pool_link(global const long *index, long index_off, long n, global int *head,
                            global int *next, long size, int column_major, int rank,
                            global const long *spatial, volatile global int *flag) {
  long j = get_global_id(0);
  if (j >= n) return;
  long at = index[index_off + j];
  if (at == -1) return;
  if (at < 0 || at >= size) {
    atomic_xchg(flag, 1);
    return;
  }
  if (column_major) {
    long plane = 1;
    for (int d = 0; d < rank; ++d) plane *= spatial[d];
    long rest = at % plane, offset = 0, step = plane;
    for (int d = 0; d < rank; ++d) {
      step /= spatial[d];
      offset += rest % spatial[d] * step;
      rest /= spatial[d];
    }
    at = at - at % plane + offset;
  }
  next[j] = atomic_xchg(head + at, (int)j);
}

kernel void k_MaxPoolGrad(global const X_t *dy, long dy_off, global const int *head,
                          global const int *next, global X_t *dx, long dx_off, long n) {
  long i = get_global_id(0);
  if (i >= n) return;
  int length = 0;
  for (int j = head[i]; j >= 0; j = next[j]) ++length;
  X_acc sum = 0;
  if (length <= ORDERED_LIST) {
    int last = -1;
    for (int k = 0; k < length; ++k) {  /* the next larger j on the list */
      int smallest = INT_MAX;
      for (int j = head[i]; j >= 0; j = next[j])
        if (j > last && j < smallest) smallest = j;
      sum += X_load(dy, dy_off + smallest);
      last = smallest;
    }
  } else {
    for (int j = head[i]; j >= 0; j = next[j]) sum += X_load(dy, dy_off + j);
  }
  X_store(dx, dx_off + i, sum);
}

/* The taps of a window along one axis that AveragePool counts: those in X,
 * or with include_pad in the explicitly padded X. */
inline long dk_window_count(long q, long size, long kernel_size, long stride, long dilation, long begin,
                            long end, int include_pad) {
  long first = q * stride - begin, lo, hi;
  if (include_pad)
    dk_valid_range(first + begin, dilation, kernel_size, size + begin + end, &lo, &hi);
  else
    dk_valid_range(first, dilation, kernel_size, size, &lo, &hi);
  return hi - lo;
}

/* dX element i of X's plane i / in_plane, spatial position s: the sum over
 * the windows q with a tap k on s (q * stride - begin + k * dilation = s) of
 * dY[q] / count(q). meta, per spatial axis of `rank`: X's size, dY's size,
 * kernel, stride, dilation, begin and end pads (7 rows of rank). As in
 * ConvGrad's dX, each row of taps (all axes but the last) is decoded once. */
kernel void k_AveragePoolGrad(global const X_t *dy, long dy_off, global X_t *dx, long dx_off, long n,
                              int rank, global const long *meta, long taps, int include_pad) {
  long i = get_global_id(0);
  if (i >= n) return;
  global const long *size = meta, *out = meta + rank, *kernel_ = meta + 2 * rank,
                    *stride = meta + 3 * rank, *dilation = meta + 4 * rank,
                    *begin = meta + 5 * rank, *end = meta + 6 * rank;
  int last = rank - 1;
  long in_plane = 1, out_plane = 1;
  for (int d = 0; d < rank; ++d) {
    in_plane *= size[d];
    out_plane *= out[d];
  }
  long s = i % in_plane, dy_plane = dy_off + i / in_plane * out_plane, pos_last = s % size[last];
  X_acc sum = 0;
  for (long tap_row = 0; tap_row < taps / kernel_[last]; ++tap_row) {
    long rest_s = s / size[last], rest_t = tap_row, q_row = 0, step = 1, count = 1;
    bool hit = true;
    for (int d = last - 1; d >= 0 && hit; --d) {
      long num = rest_s % size[d] + begin[d] - rest_t % kernel_[d] * dilation[d], q = num / stride[d];
      rest_s /= size[d];
      rest_t /= kernel_[d];
      hit = num >= 0 && q * stride[d] == num && q < out[d];
      count *= dk_window_count(q, size[d], kernel_[d], stride[d], dilation[d], begin[d], end[d], include_pad);
      q_row += q * step;
      step *= out[d];
    }
    for (long k = 0; hit && k < kernel_[last]; ++k) {
      long num = pos_last + begin[last] - k * dilation[last], q = num / stride[last];
      if (num < 0 || q * stride[last] != num || q >= out[last]) continue;
      long divisor = count * dk_window_count(q, size[last], kernel_[last], stride[last], dilation[last],
                                             begin[last], end[last], include_pad);
      sum += (X_acc)X_load(dy, dy_plane + q_row * out[last] + q) / divisor;
    }
  }
  X_store(dx, dx_off + i, sum);
}
"""


def _source(c: Call, key: int) -> str:
    return (NO_CONTRACT + prelude("X", key, c.fp64) + f"#define ORDERED_LIST {_ORDERED_LIST}\n" + VALID_RANGE
            + _TEMPLATE)


def _max_pool_grad(c: Call, key: int) -> None:
    c.expect((2, 2), 1)
    dy, indices = c.inputs
    (dx,) = c.outputs
    if dx.size == 0:
        return
    if dy.size > np.iinfo(np.int32).max:
        raise invalid(f"dY has {dy.size} elements; MaxPoolGrad links at most 2^31 - 1")
    source = _source(c, key)
    head = scratch(c, dx.size, 4)
    launch_items(c, source, "k_max_pool_heads", [head, np.int64(dx.size)], dx.size)
    next_ = scratch(c, dy.size, 4)
    if dy.size:
        check = RangeCheck(c)
        args = [indices, np.int64(indices.offset), np.int64(dy.size), head, next_, np.int64(dx.size),
                np.int32(c.attrs["storage_order"] == 1), np.int32(dx.ndim - 2), c.buffer(dx.shape[2:]), check.flag]
        launch_items(c, source, "k_max_pool_link", args, dy.size)
        check.report(indices, lambda values: (values == -1) | ((values >= 0) & (values < dx.size)),
                     lambda value, i: f"index {value} (element {i} of Indices) is out of range for X of "
                                      f"{dx.size} elements")
    args = [dy, np.int64(dy.offset), head, next_, dx, np.int64(dx.offset), np.int64(dx.size)]
    launch_items(c, source, "k_MaxPoolGrad", args, dx.size)


def _average_pool_grad(c: Call, key: int) -> None:
    c.expect((1, 1), 1)
    (dy,) = c.inputs
    (dx,) = c.outputs
    if dx.size == 0:
        return
    kernel = list(c.attrs["kernel_shape"])
    out, begin, end, strides, dilations = window_geometry(dx.shape[2:], kernel, c.attrs, pool=True)
    if list(out) != dy.shape[2:]:
        raise invalid(f"dY has spatial sizes {dy.shape[2:]} but AveragePool of X {dx.shape} gives {list(out)}")
    meta = [*dx.shape[2:], *out, *kernel, *strides, *dilations, *begin, *end]
    args = [dy, np.int64(dy.offset), dx, np.int64(dx.offset), np.int64(dx.size), np.int32(len(kernel)),
            c.buffer(meta), np.int64(math.prod(kernel)), np.int32(c.attrs["count_include_pad"] == 1)]
    launch_items(c, _source(c, key), "k_AveragePoolGrad", args, dx.size)


def register(table, unclaimed) -> None:
    table.claim("MaxPoolGrad", _max_pool_grad, 0, unclaimed)
    table.claim("AveragePoolGrad", _average_pool_grad, 0, unclaimed)
