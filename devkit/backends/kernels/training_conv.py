"""ConvGrad: the gradients of Conv with respect to X, W and B, without
scatters.

dX gathers: each element sums W * dY over the (filter, tap) pairs whose
output position reads it (q * stride - begin + k * dilation = its position).
dW and dB are reductions over the batch and the output positions: one row
kernel (training_common.launch_rows), a row per weight element, then one
per filter. Products accumulate
in the prelude's acc type (double where the device has fp64), rounded
once; the geometry is Conv's (devkit.ops.linalg.window_geometry, with dY's
spatial sizes as its output). Compact tensors.
"""

from __future__ import annotations

import math

import numpy as np

from ...ops.linalg import window_geometry
from ..support.boundary import invalid
from .layer import Call, launch_items, prelude
from .training_common import NO_CONTRACT, VALID_RANGE, launch_rows, row_helpers

# meta, per spatial axis of `rank`: X's size, dY's size, the kernel size,
# stride, dilation and begin pad (6 rows of rank). Shapes: X (N, C, ...),
# W (M, C / group, ...), dY (N, M, ...); cg = C / group, mg = M / group.
# Both kernels walk the last axis incrementally and decode the others once
# per row of it: integer division is what their loops would cost otherwise.
_TEMPLATE = """
#define DK_GEOMETRY                                                                          \\
  global const long *size = meta, *out = meta + rank, *kernel_ = meta + 2 * rank,            \\
                    *stride = meta + 3 * rank, *dilation = meta + 4 * rank,                  \\
                    *begin = meta + 5 * rank;                                                \\
  int last = rank - 1;                                                                       \\
  long in_plane = 1, out_plane = 1, taps = 1;                                                \\
  for (int d = 0; d < rank; ++d) {                                                           \\
    in_plane *= size[d];                                                                     \\
    out_plane *= out[d];                                                                     \\
    taps *= kernel_[d];                                                                      \\
  }

/* dX element i = (n, c, s): the sum over taps t and filters m of c's group,
 * where tap t of output position q lands on s, of W[m, c % cg, t] dY[n, m, q].
 * Per row of taps (all axes but the last), the output row it reads s from. */
kernel void k_ConvGrad_dx(global const X_t *dy, long dy_off, global const X_t *w, long w_off,
                          global X_t *dx, long dx_off, long n, long channels, long filters, long cg,
                          long mg, int rank, global const long *meta) {
  long i = get_global_id(0);
  if (i >= n) return;
  DK_GEOMETRY
  long s = i % in_plane, c = i / in_plane % channels, image = i / in_plane / channels;
  long m0 = c / cg * mg, w_c = w_off + c % cg * taps;  /* W[m, c % cg, t] at w_c + m * cg * taps + t */
  long dy_image = dy_off + image * filters * out_plane, pos_last = s % size[last];
  X_acc sum = 0;
  for (long tap_row = 0; tap_row < taps / kernel_[last]; ++tap_row) {
    long rest_s = s / size[last], rest_t = tap_row, q_row = 0, step = 1;
    bool hit = true;
    for (int d = last - 1; d >= 0 && hit; --d) {
      long num = rest_s % size[d] + begin[d] - rest_t % kernel_[d] * dilation[d], q = num / stride[d];
      rest_s /= size[d];
      rest_t /= kernel_[d];
      hit = num >= 0 && q * stride[d] == num && q < out[d];
      q_row += q * step;
      step *= out[d];
    }
    for (long k = 0; hit && k < kernel_[last]; ++k) {
      long num = pos_last + begin[last] - k * dilation[last], q = num / stride[last];
      if (num < 0 || q * stride[last] != num || q >= out[last]) continue;
      long t = tap_row * kernel_[last] + k, at = dy_image + q_row * out[last] + q;
      for (long m = m0; m < m0 + mg; ++m)
        sum += (X_acc)X_load(w, w_c + m * cg * taps + t) * X_load(dy, at + m * out_plane);
    }
  }
  X_store(dx, dx_off + i, sum);
}

/* Row g < w_size: dW element g = (m, c % cg, t), the sum over images and
 * output positions q of dY[n, m, q] X[n, c, q * stride - begin + t *
 * dilation], where X's padding adds 0 * dY (NaN for an infinite or NaN dY,
 * as in the zero-padded formula); row g >= w_size: dB[g - w_size], the sum
 * of dY[n, m, q]. Lanes take rows of output positions (all axes but the last). */
kernel void k_ConvGrad_params(global const X_t *dy, long dy_off, global const X_t *x, long x_off,
                              global X_t *dw, long dw_off, global X_t *db, long db_off, long w_size,
                              long images, long channels, long filters, long cg, long mg, int rank,
                              global const long *meta, long rows, local X_acc *s) {
  DK_ROW
  DK_GEOMETRY
  long out_last = out[last], out_rows = out_last ? out_plane / out_last : 0;
  bool bias = row >= w_size;
  long m = bias ? row - w_size : row / (cg * taps), t = row % taps;
  long c = bias ? 0 : m / mg * cg + row / taps % cg;  /* cg is 0 where there are only biases */
  long first = t % kernel_[last] * dilation[last] - begin[last], lo, hi;
  dk_valid_range(first, stride[last], out_last, size[last], &lo, &hi);
  X_acc part = 0;
  bool finite = true;
  for (long f = lane; active && f < images * out_rows; f += lanes) {
    long image = f / out_rows, q_row = f % out_rows;
    long dy_row = dy_off + (image * filters + m) * out_plane + q_row * out_last;
    if (bias) {
      for (long q = 0; q < out_last; ++q) part += X_load(dy, dy_row + q);
      continue;
    }
    long rest_q = q_row, rest_t = t / kernel_[last], x_row = 0, step = size[last];
    bool inside = true;
    for (int d = last - 1; d >= 0; --d) {
      long pos = rest_q % out[d] * stride[d] - begin[d] + rest_t % kernel_[d] * dilation[d];
      rest_q /= out[d];
      rest_t /= kernel_[d];
      inside = inside && pos >= 0 && pos < size[d];
      x_row += pos * step;
      step *= size[d];
    }
    x_row += x_off + (image * channels + c) * in_plane + first;
    long a = inside ? lo : out_last, b = inside ? hi : out_last;  /* q in [a, b) read X */
    for (long q = 0; q < out_last; ++q) {
      X_acc g = X_load(dy, dy_row + q);
      if (q >= a && q < b)
        part += g * X_load(x, x_row + q * stride[last]);
      else
        finite = finite && isfinite(g);
    }
  }
  X_acc sum = dk_row_sum_X(s, finite ? part : NAN);
  if (active && lane == 0) {
    if (bias)
      X_store(db, db_off + m, sum);
    else
      X_store(dw, dw_off + row, sum);
  }
}
"""


def _conv_grad(c: Call, key: int) -> None:
    c.expect((3, 3), 3)
    dy, x, w = c.inputs
    dx, dw, db = c.outputs
    group = c.attrs["group"]
    kernel = w.shape[2:]
    out, begin, _, strides, dilations = window_geometry(x.shape[2:], kernel, c.attrs)
    if list(out) != dy.shape[2:]:
        raise invalid(f"dY has spatial sizes {dy.shape[2:]} but Conv of X {x.shape} and W {w.shape} "
                      f"gives {list(out)}")
    channels, filters = x.shape[1], w.shape[0]
    cg, mg = channels // group, filters // group
    meta = c.buffer([*x.shape[2:], *out, *kernel, *strides, *dilations, *begin])
    rank = np.int32(len(kernel))
    source = NO_CONTRACT + prelude("X", key, c.fp64) + VALID_RANGE + row_helpers("X") + _TEMPLATE
    if dx.size:
        args = [dy, np.int64(dy.offset), w, np.int64(w.offset), dx, np.int64(dx.offset), np.int64(dx.size),
                np.int64(channels), np.int64(filters), np.int64(cg), np.int64(mg), rank, meta]
        launch_items(c, source, "k_ConvGrad_dx", args, dx.size)
    if dw.size + db.size:
        args = [dy, np.int64(dy.offset), x, np.int64(x.offset), dw, np.int64(dw.offset), db, np.int64(db.offset),
                np.int64(dw.size), np.int64(x.shape[0]), np.int64(channels), np.int64(filters), np.int64(cg),
                np.int64(mg), rank, meta]
        launch_rows(c, source, "k_ConvGrad_params", args, dw.size + db.size, x.shape[0] * math.prod(out))


def register(table, unclaimed) -> None:
    table.claim("ConvGrad", _conv_grad, 0, unclaimed)

