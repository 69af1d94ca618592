"""OpenCL kernels of devkit/ops/nn.py: the normalizations, LRN and Trilu here;
Attention and RotaryEmbedding in nn_attention.py.

A normalized row (LayerNormalization, RMSNormalization), group
(GroupNormalization, InstanceNormalization) or channel (BatchNormalization in
training mode) is one work-group: its work-items accumulate strided partial
sums in X_acc (double where the device has fp64) and combine them in a tree in
local memory. Statistics are two-pass (the mean, then the squared deviations
from it), as the cpu plugin's. The other kernels take a work-item per element.
Every kernel here but Trilu takes compact tensors; Trilu honours strides.
"""

from __future__ import annotations

import functools

import numpy as np

from ...abi import C
from ..support.boundary import invalid
from . import nn_attention
from .layer import STRIDED, broadcast_strides, cl_type, launch_items, prelude
from .nn_common import (
    GROUP_REDUCE,
    acc,
    count,
    launch_groups,
    tensor_args,
)

UNCLAIMED: dict[tuple[str, str], str] = {}

# Kernels shared by the normalizations and LRN, one program per X dtype.
_NORM = GROUP_REDUCE + """
/* The mean (0 unless `center`) of x[start, start + n) and 1 / sqrt(the mean
 * squared deviation from it + epsilon); NaN when n is 0. */
inline void nn_stats(global const X_t *x, long start, long n, int center, X_acc epsilon,
                     local X_acc *scratch, X_acc *mean, X_acc *inv) {
  long lid = get_local_id(0), step = get_local_size(0);
  X_acc m = 0, squares = 0;
  if (center) {
    X_acc sum = 0;
    for (long i = lid; i < n; i += step) sum += X_load(x, start + i);
    m = nn_group_sum(scratch, sum) / n;
  }
  for (long i = lid; i < n; i += step) {
    X_acc d = X_load(x, start + i) - m;
    squares += d * d;
  }
  *mean = m;
  *inv = 1 / sqrt(nn_group_sum(scratch, squares) / n + epsilon);
}

/* A group per row of `inner` elements. meta: X's shape, then Scale's and B's
 * strides over it (0 where they broadcast). */
kernel void k_LayerNormalization(global const X_t *x, long x_off, global const X_t *scale, long scale_off,
                                 global const X_t *bias, long bias_off, int has_bias,
                                 global X_t *y, long y_off, global float *mean_out, long mean_off,
                                 global float *inv_out, long inv_off, long inner, int ndim,
                                 global const long *meta, X_acc epsilon, local X_acc *scratch) {
  long row = get_group_id(0), start = row * inner;
  X_acc mean, inv;
  nn_stats(x, x_off + start, inner, 1, epsilon, scratch, &mean, &inv);
  if (get_local_id(0) == 0) {
    mean_out[mean_off + row] = (float)mean;
    inv_out[inv_off + row] = (float)inv;
  }
  for (long i = get_local_id(0); i < inner; i += get_local_size(0)) {
    X_acc v = (X_load(x, x_off + start + i) - mean) * inv
              * X_load(scale, scale_off + dk_offset(start + i, ndim, meta, meta + ndim));
    if (has_bias) v += X_load(bias, bias_off + dk_offset(start + i, ndim, meta, meta + 2 * ndim));
    X_store(y, y_off + start + i, v);
  }
}

/* As k_LayerNormalization, without centering, bias or statistics outputs. */
kernel void k_RMSNormalization(global const X_t *x, long x_off, global const X_t *scale, long scale_off,
                               global X_t *y, long y_off, long inner, int ndim, global const long *meta,
                               X_acc epsilon, local X_acc *scratch) {
  long start = get_group_id(0) * inner;
  X_acc mean, inv;
  nn_stats(x, x_off + start, inner, 0, epsilon, scratch, &mean, &inv);
  for (long i = get_local_id(0); i < inner; i += get_local_size(0)) {
    X_acc v = X_load(x, x_off + start + i) * inv
              * X_load(scale, scale_off + dk_offset(start + i, ndim, meta, meta + ndim));
    X_store(y, y_off + start + i, v);
  }
}

/* A group per (instance, channel group): a run of per_group * spatial
 * elements. InstanceNormalization is per_group == 1. */
kernel void k_GroupNormalization(global const X_t *x, long x_off, global const X_t *scale, long scale_off,
                                 global const X_t *bias, long bias_off, global X_t *y, long y_off,
                                 long spatial, long per_group, long groups, X_acc epsilon,
                                 local X_acc *scratch) {
  long row = get_group_id(0), run = per_group * spatial, start = row * run;
  long first_channel = row % groups * per_group;
  X_acc mean, inv;
  nn_stats(x, x_off + start, run, 1, epsilon, scratch, &mean, &inv);
  for (long i = get_local_id(0); i < run; i += get_local_size(0)) {
    long c = first_channel + i / spatial;
    X_acc v = (X_load(x, x_off + start + i) - mean) * inv * X_load(scale, scale_off + c)
              + X_load(bias, bias_off + c);
    X_store(y, y_off + start + i, v);
  }
}

/* An item per element of X (N, C, spatial): the window of channels
 * [c - before, c + after] clipped to [0, C). */
kernel void k_LRN(global const X_t *x, long x_off, global X_t *y, long y_off, long channels,
                  long spatial, long before, long after, X_acc alpha_over_size, X_acc beta,
                  X_acc bias, long n) {
  long i = get_global_id(0);
  if (i >= n) return;
  long c = i / spatial % channels, at = i - c * spatial;  /* at: channel 0 of this position */
  long lo = max(c - before, 0L), hi = min(c + after, channels - 1);
  X_acc squares = 0;
  for (long j = lo; j <= hi; ++j) {
    X_acc v = X_load(x, x_off + at + j * spatial);
    squares += v * v;
  }
  X_store(y, y_off + i, X_load(x, x_off + i) / pow(bias + alpha_over_size * squares, beta));
}
"""

# BatchNormalization, one program per (X, P, S) dtypes: P of scale and B, S of
# input_mean, input_var and the running statistics. X is (N, C, inner).
_BATCHNORM = GROUP_REDUCE + """
/* An item per element of X (and per channel, for the running statistics,
 * which are input_mean and input_var unchanged). */
kernel void k_BatchNormalization(global const X_t *x, long x_off, global const P_t *scale, long scale_off,
                                 global const P_t *bias, long bias_off, global const S_t *mean, long mean_off,
                                 global const S_t *var, long var_off, global X_t *y, long y_off,
                                 global S_t *running_mean, long rm_off, global S_t *running_var, long rv_off,
                                 long channels, long inner, long n, X_acc epsilon) {
  long i = get_global_id(0);
  if (i < channels) {
    S_store(running_mean, rm_off + i, S_load(mean, mean_off + i));
    S_store(running_var, rv_off + i, S_load(var, var_off + i));
  }
  if (i >= n) return;
  long c = i / inner % channels;
  X_acc v = (X_acc)P_load(scale, scale_off + c) * (X_load(x, x_off + i) - (X_acc)S_load(mean, mean_off + c))
            / sqrt((X_acc)S_load(var, var_off + c) + epsilon) + (X_acc)P_load(bias, bias_off + c);
  X_store(y, y_off + i, v);
}

/* Element t of channel c's elements: its run of `inner` in each image. */
#define BN_AT(t) ((t) / inner * channels + c) * inner + (t) % inner

/* Training mode: a group per channel; statistics NaN for an empty batch. */
kernel void k_BatchNormalizationTraining(
    global const X_t *x, long x_off, global const P_t *scale, long scale_off, global const P_t *bias,
    long bias_off, global const S_t *mean, long mean_off, global const S_t *var, long var_off,
    global X_t *y, long y_off, global S_t *running_mean, long rm_off, global S_t *running_var, long rv_off,
    long batch, long channels, long inner, X_acc epsilon, X_acc momentum, local X_acc *scratch) {
  long c = get_group_id(0), lid = get_local_id(0), step = get_local_size(0), count = batch * inner;
  X_acc sum = 0, squares = 0;
  for (long t = lid; t < count; t += step) sum += X_load(x, x_off + BN_AT(t));
  X_acc batch_mean = nn_group_sum(scratch, sum) / count;
  for (long t = lid; t < count; t += step) {
    X_acc d = X_load(x, x_off + BN_AT(t)) - batch_mean;
    squares += d * d;
  }
  X_acc batch_var = nn_group_sum(scratch, squares) / count;
  if (lid == 0) {
    S_store(running_mean, rm_off + c,
            (X_acc)S_load(mean, mean_off + c) * momentum + batch_mean * (1 - momentum));
    S_store(running_var, rv_off + c,
            (X_acc)S_load(var, var_off + c) * momentum + batch_var * (1 - momentum));
  }
  X_acc s = P_load(scale, scale_off + c), b = P_load(bias, bias_off + c), root = sqrt(batch_var + epsilon);
  for (long t = lid; t < count; t += step)
    X_store(y, y_off + BN_AT(t), s * (X_load(x, x_off + BN_AT(t)) - batch_mean) / root + b);
}
"""

# Trilu moves whole elements: one program per element width, copying X_t
# words (a zero element is all-zero bytes in every dtype).
_TRILU = """
/* An item per element of the output; meta: the shape, then the input's and
 * the output's strides. Keeps j - i >= k (upper) or j - i <= k. */
kernel void k_Trilu(global const X_t *x, long x_off, global X_t *y, long y_off, int ndim,
                    global const long *meta, long k, int upper, long n) {
  long e = get_global_id(0);
  if (e >= n) return;
  long cols = meta[ndim - 1], rows = meta[ndim - 2];
  long diff = e % cols - e / cols % rows;  /* j - i, never near overflow */
  int keep = upper ? diff >= k : diff <= k;
  y[y_off + dk_offset(e, ndim, meta, meta + 2 * ndim)] =
      keep ? x[x_off + dk_offset(e, ndim, meta, meta + ndim)] : (X_t)0;
}
"""

# A dtype of each element width, whose storage type Trilu copies.
_WORD_OF_WIDTH = {1: C.DK_DTYPE_UINT8, 2: C.DK_DTYPE_BFLOAT16, 4: C.DK_DTYPE_INT32, 8: C.DK_DTYPE_INT64}


@functools.cache
def _norm_source(key: int, fp64: bool) -> str:
    return prelude("X", key, fp64) + _NORM


@functools.cache
def _batchnorm_source(x_key: int, p_key: int, s_key: int, fp64: bool) -> str:
    return prelude("X", x_key, fp64) + prelude("P", p_key, fp64) + prelude("S", s_key, fp64) + _BATCHNORM


@functools.cache
def _trilu_source(itemsize: int) -> str:
    return prelude("X", _WORD_OF_WIDTH[itemsize], False) + _TRILU


def _row_norm(c, key: int) -> None:
    rms = c.op == "RMSNormalization"
    c.expect((2, 2) if rms else (2, 3), 1 if rms else 3)
    x, scale, y = c.inputs[0], c.inputs[1], c.outputs[0]
    axis = c.attrs["axis"] % x.ndim
    rows, inner = count(x.shape, 0, axis), count(x.shape, axis)
    if rows == 0:
        return
    bias = None if rms else c.input(2)
    params = [scale] if bias is None else [scale, bias]
    meta = c.buffer(x.shape + [s for p in params for s in broadcast_strides(p, x.shape)])
    if rms:
        args = tensor_args(x, scale, y)
    else:
        # Without B the kernel never reads its bias argument: Scale stands in.
        args = tensor_args(x, scale, bias or scale) + [np.int32(bias is not None)]
        args += tensor_args(y, c.outputs[1], c.outputs[2])
    args += [np.int64(inner), np.int32(x.ndim), meta, acc(c, c.attrs["epsilon"])]
    launch_groups(c, _norm_source(key, c.fp64), f"k_{c.op}", args, rows)


def _group_norm(c, key: int) -> None:
    c.expect((3, 3), 1)
    x, scale, bias = c.inputs
    if x.size == 0:
        return
    channels = x.shape[1]
    groups = c.attrs["num_groups"] if c.op == "GroupNormalization" else channels
    launch_groups(c, _norm_source(key, c.fp64), "k_GroupNormalization",
                  tensor_args(x, scale, bias, c.outputs[0])
                  + [np.int64(count(x.shape, 2)), np.int64(channels // groups), np.int64(groups),
                     acc(c, c.attrs["epsilon"])],
                  x.shape[0] * groups)


def _lrn(c, key: int) -> None:
    c.expect((1, 1), 1)
    x = c.inputs[0]
    size = c.attrs["size"]
    # The window is [c - floor((size - 1) / 2), c + ceil((size - 1) / 2)].
    launch_items(c, _norm_source(key, c.fp64), "k_LRN",
                 tensor_args(x, c.outputs[0])
                 + [np.int64(x.shape[1]), np.int64(count(x.shape, 2)), np.int64((size - 1) // 2),
                    np.int64(size // 2), acc(c, c.attrs["alpha"] / size), acc(c, c.attrs["beta"]),
                    acc(c, c.attrs["bias"]), np.int64(x.size)],
                 x.size)


def _batchnorm(c, key: int) -> None:
    c.expect((5, 5), 3)
    x, scale, bias, mean, var = c.inputs
    if C.DK_DTYPE_FLOAT64 in (scale.dtype, mean.dtype) and not c.fp64:
        raise invalid("float64 parameters need a device with fp64")
    # X (N, C, D...); a 1-D X (N) is one channel of N elements.
    batch, channels = (x.shape[0], x.shape[1]) if x.ndim >= 2 else (1, 1)
    inner = count(x.shape, 2) if x.ndim >= 2 else x.size
    source = _batchnorm_source(key, scale.dtype, mean.dtype, c.fp64)
    args = tensor_args(x, scale, bias, mean, var, *c.outputs)
    epsilon = acc(c, c.attrs["epsilon"])
    if c.attrs["training_mode"]:
        launch_groups(c, source, "k_BatchNormalizationTraining",
                      args + [np.int64(batch), np.int64(channels), np.int64(inner), epsilon,
                              acc(c, c.attrs["momentum"])],
                      channels)
    else:
        launch_items(c, source, "k_BatchNormalization",
                     args + [np.int64(channels), np.int64(inner), np.int64(x.size), epsilon],
                     max(x.size, channels))


def _trilu(c, key: int) -> None:
    c.expect((1, 1), 1)
    x, y = c.inputs[0], c.outputs[0]
    if y.size == 0:
        return
    k = c.attrs.get("k", [0])[0]
    launch_items(c, _trilu_source(cl_type(key).itemsize), "k_Trilu",
                 tensor_args(x, y) + [np.int32(y.ndim), c.buffer(y.shape + x.strides + y.strides),
                                      np.int64(k), np.int32(c.attrs["upper"]), np.int64(y.size)],
                 y.size)


def register(table) -> None:
    for op in ("LayerNormalization", "RMSNormalization"):
        table.claim(op, _row_norm, unclaimed=UNCLAIMED)
    for op in ("GroupNormalization", "InstanceNormalization"):
        table.claim(op, _group_norm, unclaimed=UNCLAIMED)
    table.claim("BatchNormalization", _batchnorm, unclaimed=UNCLAIMED)
    table.claim("LRN", _lrn, unclaimed=UNCLAIMED)
    table.claim("Trilu", _trilu, STRIDED, unclaimed=UNCLAIMED)
    nn_attention.register(table, UNCLAIMED)
