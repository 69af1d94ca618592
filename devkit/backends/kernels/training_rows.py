"""SoftmaxGrad, LogSoftmaxGrad and the normalization gradients
(BatchNormalizationGrad, LayerNormalizationGrad, RMSNormalizationGrad):
row kernels (training_common.launch_rows), the lanes of a long row summing
in local memory.

Compact tensors. Sums accumulate in the prelude's acc type (double where the
device has fp64), each result rounded once on store, as on the cpu plugin
(devkit/backends/cpu/kernels/training.c and training_norm.c).
"""

from __future__ import annotations

import math

import numpy as np

from ...abi import C
from ..support.boundary import invalid
from .layer import Call, prelude
from .training_common import (
    NO_CONTRACT,
    acc_itemsize,
    acc_scalar,
    launch_rows,
    row_helpers,
    scratch,
)

# ---- SoftmaxGrad, LogSoftmaxGrad ----------------------------------------------------------

# The tensors as (outer, n, inner), n along the axis: row `row` is the n
# elements of (row / inner, :, row % inner).
_SOFTMAX_TEMPLATE = """
#define DK_SOFTMAX_GRAD(NAME, TERM, RESULT)                                                    \\
  kernel void NAME(global const X_t *dy, long dy_off, global const X_t *y, long y_off,         \\
                   global X_t *dx, long dx_off, long n, long inner, long rows,                 \\
                   local X_acc *s) {                                                           \\
    DK_ROW                                                                                     \\
    long first = row / inner * n * inner + row % inner;                                        \\
    X_acc part = 0;                                                                            \\
    for (long a = lane; active && a < n; a += lanes) {                                         \\
      long j = first + a * inner;                                                              \\
      X_acc g = X_load(dy, dy_off + j), v = X_load(y, y_off + j);                              \\
      part += TERM;                                                                            \\
    }                                                                                          \\
    X_acc sum = dk_row_sum_X(s, part);                                                         \\
    for (long a = lane; active && a < n; a += lanes) {                                         \\
      long j = first + a * inner;                                                              \\
      X_acc g = X_load(dy, dy_off + j), v = X_load(y, y_off + j);                              \\
      X_store(dx, dx_off + j, RESULT);                                                         \\
    }                                                                                          \\
  }

DK_SOFTMAX_GRAD(k_SoftmaxGrad, g * v, v * (g - sum))
DK_SOFTMAX_GRAD(k_LogSoftmaxGrad, g, g - exp(v) * sum)
"""


def _softmax_grad(c: Call, key: int) -> None:
    c.expect((2, 2), 1)
    dy, y = c.inputs
    (dx,) = c.outputs
    if dx.size == 0:
        return
    axis = c.attrs["axis"] % dy.ndim
    n, inner = dy.shape[axis], math.prod(dy.shape[axis + 1:])
    source = NO_CONTRACT + prelude("X", key, c.fp64) + row_helpers("X") + _SOFTMAX_TEMPLATE
    args = [dy, np.int64(dy.offset), y, np.int64(y.offset), dx, np.int64(dx.offset), np.int64(n),
            np.int64(inner)]
    launch_rows(c, source, f"k_{c.op}", args, dx.size // n, n)


# ---- the normalization gradients ------------------------------------------------------------

# Prefixes: X for dY, X and dX; S for the scale and its gradients; M for the
# statistics inputs (mean, inv_std). Sums and statistics are X_acc.
_NORM_TEMPLATE = """
/* X is (N, C, D...) as runs of `inner` elements, run r of channel r % C:
 * row c sums its channel's count = N * inner elements. */
kernel void k_BatchNormalizationGrad(global const X_t *dy, long dy_off, global const X_t *x, long x_off,
                                     global const S_t *scale, long scale_off,
                                     global const M_t *mean, long mean_off,
                                     global const M_t *inv_std, long inv_off,
                                     global X_t *dx, long dx_off, global S_t *dscale, long dscale_off,
                                     global S_t *db, long db_off, long inner, long count, long rows,
                                     local X_acc *s) {
  DK_ROW
  long c = row;
  X_acc m = active ? M_load(mean, mean_off + c) : 0, inv = active ? M_load(inv_std, inv_off + c) : 0;
  X_acc part_g = 0, part_gx = 0;
  for (long k = lane; active && k < count; k += lanes) {
    long j = (k / inner * rows + c) * inner + k % inner;
    X_acc g = X_load(dy, dy_off + j);
    part_g += g;
    part_gx += g * ((X_load(x, x_off + j) - m) * inv);
  }
  X_acc sum_g = dk_row_sum_X(s, part_g), sum_gx = dk_row_sum_X(s, part_gx);
  if (!active) return;
  if (lane == 0) {
    S_store(db, db_off + c, sum_g);
    S_store(dscale, dscale_off + c, sum_gx);
  }
  X_acc a = S_load(scale, scale_off + c) * inv, mean_g = sum_g / count, mean_gx = sum_gx / count;
  for (long k = lane; k < count; k += lanes) {
    long j = (k / inner * rows + c) * inner + k % inner;
    X_acc xhat = (X_load(x, x_off + j) - m) * inv;
    X_store(dx, dx_off + j, a * (X_load(dy, dy_off + j) - mean_g - xhat * mean_gx));
  }
}

/* Row r of LayerNormalization or RMSNormalization: the `inner` elements from
 * r * inner. The scale element of X element j is at dk_offset(j) over X's
 * shape with scale's broadcast strides (meta: shape, then strides). With
 * `rms`, the statistic is recomputed (mean 0, inv from the mean square)
 * and there is no centring; else it comes from the mean and inv_std inputs.
 * The row's (mean, inv) go to stats[2r], stats[2r + 1] for the parameter sums. */
kernel void k_norm_rows(global const X_t *dy, long dy_off, global const X_t *x, long x_off,
                        global const S_t *scale, long scale_off, global const M_t *mean, long mean_off,
                        global const M_t *inv_std, long inv_off, global X_t *dx, long dx_off,
                        global X_acc *stats, long inner, int ndim, global const long *meta, int rms,
                        X_acc epsilon, long rows, local X_acc *s) {
  DK_ROW
  long first = row * inner;
  X_acc m = 0, inv = 0;
  if (rms) {
    X_acc part = 0;
    for (long i = lane; active && i < inner; i += lanes) {
      X_acc v = X_load(x, x_off + first + i);
      part += v * v;
    }
    inv = 1 / sqrt(dk_row_sum_X(s, part) / inner + epsilon);
  } else if (active) {
    m = M_load(mean, mean_off + row);
    inv = M_load(inv_std, inv_off + row);
  }
  X_acc part_gs = 0, part_gx = 0;
  for (long i = lane; active && i < inner; i += lanes) {
    long j = first + i;
    X_acc gs = X_load(dy, dy_off + j) * S_load(scale, scale_off + dk_offset(j, ndim, meta, meta + ndim));
    part_gs += gs;
    part_gx += gs * ((X_load(x, x_off + j) - m) * inv);
  }
  X_acc mean_gx = dk_row_sum_X(s, part_gx) / inner;
  X_acc mean_g = rms ? 0 : dk_row_sum_X(s, part_gs) / inner;
  if (!active) return;
  for (long i = lane; i < inner; i += lanes) {
    long j = first + i;
    X_acc gs = X_load(dy, dy_off + j) * S_load(scale, scale_off + dk_offset(j, ndim, meta, meta + ndim));
    X_acc xhat = (X_load(x, x_off + j) - m) * inv;
    X_store(dx, dx_off + j, inv * (gs - (xhat * mean_gx + mean_g)));
  }
  if (lane == 0) {
    stats[2 * row] = m;
    stats[2 * row + 1] = inv;
  }
}

/* Row p sums, over the `count` X elements that scale element p broadcasts
 * to, dY * xhat into dscale[p] and (with_bias) dY into db[p]. meta: the
 * sizes, then X's strides, of the n_kept dims (scale's own, p row-major
 * over them), then likewise of the n_free dims (those scale broadcasts along). */
kernel void k_norm_param_sums(global const X_t *dy, long dy_off, global const X_t *x, long x_off,
                              global const X_acc *stats, global S_t *dscale, long dscale_off,
                              global S_t *db, long db_off, int with_bias, long count, long inner,
                              int n_kept, int n_free, global const long *meta, long rows,
                              local X_acc *s) {
  DK_ROW
  long base = 0, rest = row;
  for (int d = n_kept - 1; d >= 0; --d) {
    base += rest % meta[d] * meta[n_kept + d];
    rest /= meta[d];
  }
  global const long *free_meta = meta + 2 * n_kept;
  X_acc part_gx = 0, part_g = 0;
  for (long f = lane; active && f < count; f += lanes) {
    long j = base;
    rest = f;
    for (int d = n_free - 1; d >= 0; --d) {
      j += rest % free_meta[d] * free_meta[n_free + d];
      rest /= free_meta[d];
    }
    long r = j / inner;
    X_acc g = X_load(dy, dy_off + j);
    part_gx += g * ((X_load(x, x_off + j) - stats[2 * r]) * stats[2 * r + 1]);
    part_g += g;
  }
  X_acc sum_gx = dk_row_sum_X(s, part_gx), sum_g = dk_row_sum_X(s, part_g);
  if (active && lane == 0) {
    S_store(dscale, dscale_off + row, sum_gx);
    if (with_bias) S_store(db, db_off + row, sum_g);
  }
}
"""


def _norm_source(c: Call, x: int, s: int, m: int) -> str:
    if not c.fp64 and C.DK_DTYPE_FLOAT64 in (s, m):
        raise invalid("float64 parameters or statistics need a device with fp64")
    return (NO_CONTRACT + prelude("X", x, c.fp64) + prelude("S", s, c.fp64) + prelude("M", m, c.fp64)
            + row_helpers("X") + _NORM_TEMPLATE)


def _batchnorm_grad(c: Call, key: int) -> None:
    c.expect((5, 5), 3)
    dy, x, scale, mean, inv_std = c.inputs
    dx, dscale, db = c.outputs
    channels = x.shape[1] if x.ndim >= 2 else 1
    if channels == 0:
        return
    inner = math.prod(x.shape[2:])
    count = x.shape[0] * inner
    source = _norm_source(c, key, scale.dtype, mean.dtype)
    args = [dy, np.int64(dy.offset), x, np.int64(x.offset), scale, np.int64(scale.offset),
            mean, np.int64(mean.offset), inv_std, np.int64(inv_std.offset), dx, np.int64(dx.offset),
            dscale, np.int64(dscale.offset), db, np.int64(db.offset), np.int64(inner), np.int64(count)]
    launch_rows(c, source, "k_BatchNormalizationGrad", args, channels, count)


def _row_norm_grad(c: Call, key: int) -> None:
    """LayerNormalizationGrad (inputs dY, X, Scale, Mean, InvStdDev; outputs
    dX, dScale, dB) and RMSNormalizationGrad (dY, X, scale; dX, dscale)."""
    rms = c.op == "RMSNormalizationGrad"
    c.expect((3, 3) if rms else (5, 5), 2 if rms else 3)
    dy, x, scale = c.inputs[:3]
    mean, inv_std = (x, x) if rms else c.inputs[3:]  # RMS: stand-ins, never read
    dx, dscale = c.outputs[:2]
    axis = c.attrs["axis"] % x.ndim
    inner = math.prod(x.shape[axis:])
    rows = math.prod(x.shape[:axis])
    # The dims of X that scale has (kept) and those it broadcasts along (free).
    lead = x.ndim - scale.ndim
    kept = [d for d in range(lead, x.ndim) if scale.shape[d - lead] == x.shape[d]]
    free = [d for d in range(x.ndim) if d not in kept]
    strides = [scale.strides[d - lead] if d in kept else 0 for d in range(x.ndim)]
    source = _norm_source(c, key, key, mean.dtype)
    stats = scratch(c, 2 * rows, acc_itemsize(c))
    if dx.size:
        args = [dy, np.int64(dy.offset), x, np.int64(x.offset), scale, np.int64(scale.offset), mean,
                np.int64(mean.offset), inv_std, np.int64(inv_std.offset), dx, np.int64(dx.offset), stats,
                np.int64(inner), np.int32(x.ndim), c.buffer(x.shape + strides), np.int32(rms),
                acc_scalar(c, c.attrs.get("epsilon", 0.0))]
        launch_rows(c, source, "k_norm_rows", args, rows, inner)
    if dscale.size == 0:
        return
    x_strides = [math.prod(x.shape[d + 1:]) for d in range(x.ndim)]
    meta = ([x.shape[d] for d in kept] + [x_strides[d] for d in kept]
            + [x.shape[d] for d in free] + [x_strides[d] for d in free])
    db = c.outputs[2] if not rms else dscale  # RMS: a stand-in, never written
    args = [dy, np.int64(dy.offset), x, np.int64(x.offset), stats, dscale, np.int64(dscale.offset),
            db, np.int64(db.offset), np.int32(not rms), np.int64(x.size // dscale.size), np.int64(inner),
            np.int32(len(kept)), np.int32(len(free)), c.buffer(meta)]
    launch_rows(c, source, "k_norm_param_sums", args, dscale.size, x.size // dscale.size)


def register(table, unclaimed) -> None:
    for op in ("SoftmaxGrad", "LogSoftmaxGrad"):
        table.claim(op, _softmax_grad, 0, unclaimed)
    table.claim("BatchNormalizationGrad", _batchnorm_grad, 0, unclaimed)
    for op in ("LayerNormalizationGrad", "RMSNormalizationGrad"):
        table.claim(op, _row_norm_grad, 0, unclaimed)

