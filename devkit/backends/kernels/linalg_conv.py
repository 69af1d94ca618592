"""Conv and ConvTranspose, N-D, with groups, on the family's tiled product.

Conv is an implicit GEMM per group: Y[n, g, m, p] = sum over r = (c, tap) of
W[g, m, r] * col[r, (n, p)], where col (im2col's matrix: the input under tap
`tap` of output position p's window, 0 in the padding) is never stored: the
B loader reads it from X. Per tile it tabulates in local memory where each
column's window starts and each row's channel and tap offsets lie, so a load
is a few additions and compares. Images fold into the GEMM's N, groups are
its batch.

ConvTranspose is GEMM + col2im, as the spec states: col[(m, tap), q] = sum
over c of W[c, m, tap] * X[c, q] by the batched product (per image and
group), then each output sums the col entries of the (tap, q) pairs that
land on it. Only real contributions are summed, so a non-finite weight
reaches exactly the outputs its taps reach. col is held in the product's
compute type (float16/bfloat16 operands are widened to float32 first) and
is produced a band of images at a time to bound its size.
"""

from __future__ import annotations

import functools
import math

import numpy as np

from ...ops.linalg import conv_transpose_geometry, window_geometry
from .layer import Call, Local, cl_type, prelude, round_up
from .linalg_gemm import (
    SKELETON,
    Matrix,
    compact_copy,
    compute_itemsize,
    gemm,
    header,
    scratch,
    tiles,
    use_tiles,
    work_dtype,
)

_GEOMETRY = """
/* geo: per spatial axis the input sizes, output sizes, kernel sizes,
 * strides, dilations and begin pads, nsp of each. */
#define G_IN(d) geo[d]
#define G_OUT(d) geo[nsp + (d)]
#define G_K(d) geo[2 * nsp + (d)]
#define G_S(d) geo[3 * nsp + (d)]
#define G_D(d) geo[4 * nsp + (d)]
#define G_P(d) geo[5 * nsp + (d)]
"""

# ---- Conv --------------------------------------------------------------------------------

_CONV_PARAMS = """global const X_t *x, long x_off, global const X_t *w, long w_off,
    global const X_t *bias, long bias_off, int has_bias, global X_t *y, long y_off,
    long M, long N, long K, long x_channels, long y_channels, long cg, long taps,
    long in_plane, long out_plane, int nsp, global const long *geo"""

_CONV_COMMON = _GEOMETRY + """
/* Column n is output position n % out_plane of image n / out_plane. */
#define CONV_STORE(sum, m, n) { \\
  R_t v = (sum); \\
  if (has_bias) v += (R_t)X_load(bias, bias_off + g * M + (m)); \\
  X_store(y, y_off + ((n) / out_plane * y_channels + g * M + (m)) * out_plane + (n) % out_plane, v); \\
}

/* col[row][column] from the tables: col = {offset of the column's image and
 * group in X, or -1; per axis where its window starts}, row = {offset of
 * the row's channel in the group, or -1; per axis its tap's offset}. */
inline R_t conv_tap(global const X_t *x, local const long *col, local const long *row, int nsp,
                    global const long *geo) {
  if (col[0] < 0 || row[0] < 0) return 0;
  long at = col[0] + row[0], span = 1;
  for (int d = nsp - 1; d >= 0; --d) {
    const long pos = col[1 + d] + row[1 + d];
    if (pos < 0 || pos >= G_IN(d)) return 0;
    at += pos * span;
    span *= G_IN(d);
  }
  return (R_t)X_load(x, at);
}
"""

_CONV_TILED = SKELETON.format(
    name="k_conv", params=_CONV_PARAMS + ", local long *cols, local long *rows",
    setup="""  const long g = get_group_id(2);
  /* One work-item per column tabulates it; the first tile's barrier publishes the table. */
  if (lid < TN)
    for (int j = 0; j < NCOL; ++j) {
      const int cb = lid + j * WG;
      const long n = n0 + cb;
      local long *col = cols + cb * (nsp + 1);
      long p = n % out_plane;
      col[0] = n < N ? x_off + (n / out_plane * x_channels + g * cg) * in_plane : -1;
      for (int d = nsp - 1; d >= 0; --d) {
        col[1 + d] = p % G_OUT(d) * G_S(d) - G_P(d);
        p /= G_OUT(d);
      }
    }""",
    stage="""    /* The rows of this tile: their channel's offset and their tap's, per axis. */
    for (int kk = lid; kk < TK; kk += WG) {
      local long *row = rows + kk * (nsp + 1);
      const long r = k0 + kk;
      long t = r % taps;
      row[0] = r < K ? r / taps * in_plane : -1;
      for (int d = nsp - 1; d >= 0; --d) {
        row[1 + d] = t % G_K(d) * G_D(d);
        t /= G_K(d);
      }
    }
    barrier(CLK_LOCAL_MEM_FENCE);""",
    load_a="(R_t)X_load(w, w_off + (g * M + m) * K + k)",
    load_b="""    for (int t = 0; t < KPW; ++t) {
      local const long *row = rows + (kb + t) * (nsp + 1);
      for (int j = 0; j < NCOL; ++j) {
        const int cb = lid % TN + j * WG;
        Bs[kb + t][cb] = conv_tap(x, cols + cb * (nsp + 1), row, nsp, geo);
      }
    }""",
    store="        CONV_STORE(acc[i][j], m, n);")

_CONV_DIRECT = """
/* One work-item per output element (index over group x M x N). */
kernel void k_conv_direct(""" + _CONV_PARAMS + """, long total) {
  const long i = get_global_id(0);
  if (i >= total) return;
  const long n = i % N, m = i / N % M, g = i / N / M, p = n % out_plane;
  const long image = x_off + (n / out_plane * x_channels + g * cg) * in_plane;
  R_t sum = 0;
  for (long r = 0; r < K; ++r) {
    long t = r % taps, q = p, at = image + r / taps * in_plane, span = 1;
    bool inside = true;
    for (int d = nsp - 1; d >= 0; --d) {
      const long pos = q % G_OUT(d) * G_S(d) - G_P(d) + t % G_K(d) * G_D(d);
      inside = inside && pos >= 0 && pos < G_IN(d);
      at += pos * span;
      span *= G_IN(d);
      q /= G_OUT(d);
      t /= G_K(d);
    }
    /* The padding reads as 0 and is multiplied like any input, as im2col's is. */
    sum += (R_t)X_load(w, w_off + (g * M + m) * K + r) * (inside ? (R_t)X_load(x, at) : 0);
  }
  CONV_STORE(sum, m, n);
}
"""


@functools.cache
def _conv_source(key: int, fp64: bool) -> str:
    return header(key, fp64) + _CONV_COMMON + _CONV_TILED + _CONV_DIRECT


def _conv(c: Call, key: int) -> None:
    c.expect((2, 3), 1)
    x, w = c.inputs[:2]
    bias = c.input(2)
    y = c.outputs[0]
    if y.size == 0:
        return
    nsp = x.ndim - 2
    out, begin, _, strides, dilations = window_geometry(x.shape[2:], w.shape[2:], c.attrs)
    group = c.attrs["group"]
    mg, cg, taps = w.shape[0] // group, w.shape[1], math.prod(w.shape[2:])
    in_plane, out_plane = math.prod(x.shape[2:]), math.prod(out)
    m, n, k = mg, x.shape[0] * out_plane, cg * taps
    geo = c.buffer(list(x.shape[2:]) + list(out) + list(w.shape[2:]) + list(strides) + list(dilations)
                   + list(begin))
    has_bias = bias is not None
    args = [x, np.int64(x.offset), w, np.int64(w.offset), bias if has_bias else x,
            np.int64(bias.offset if has_bias else 0), np.int32(has_bias), y, np.int64(y.offset),
            np.int64(m), np.int64(n), np.int64(k), np.int64(x.shape[1]), np.int64(y.shape[1]), np.int64(cg),
            np.int64(taps), np.int64(in_plane), np.int64(out_plane), np.int32(nsp), geo]
    t = tiles(c.device, key)
    source = _conv_source(key, c.fp64)
    tables = [t.tn * (nsp + 1) * 8, t.tk * (nsp + 1) * 8]  # bytes of cols and rows
    fits = t.local_bytes(compute_itemsize(key)) + sum(tables) <= c.device.limits.local_mem_size
    if fits and use_tiles(t, m, n):
        c.launch(source, "k_conv", args + [Local(size) for size in tables],
                 (round_up(n, t.tn) // t.rn, round_up(m, t.tm) // t.rm, group), (t.wn, t.wm, 1),
                 options=t.options())
    else:
        total = group * m * n
        size = min(64, c.device.limits.max_group_size)
        c.launch(source, "k_conv_direct", args + [np.int64(total)], round_up(total, size), size,
                 options=t.options())


# ---- ConvTranspose -------------------------------------------------------------------------

_COL2IM = _GEOMETRY + """
/* y[image, g * mg + m, o] = bias + the sum over taps t and input positions q
 * with q * stride - pad + t * dilation = o (per axis) of col[image, g,
 * m * taps + t, q]; one work-item per output element. */
kernel void k_col2im(global const S_t *col, global const X_t *bias, long bias_off, int has_bias,
                     global X_t *y, long y_off, long channels, long mg, long taps, long in_plane,
                     long out_plane, int nsp, global const long *geo, long total) {
  const long i = get_global_id(0);
  if (i >= total) return;
  const long o = i % out_plane, channel = i / out_plane % channels, image = i / out_plane / channels;
  global const S_t *rows = col + (image * channels + channel) * taps * in_plane;
  S_acc sum = 0;
  for (long t = 0; t < taps; ++t) {
    long rest = o, tap = t, at = 0, span = 1;
    bool hit = true;
    for (int d = nsp - 1; d >= 0; --d) {
      const long pos = rest % G_OUT(d) + G_P(d) - tap % G_K(d) * G_D(d);
      hit = hit && pos >= 0 && pos % G_S(d) == 0 && pos / G_S(d) < G_IN(d);
      at += pos / G_S(d) * span;
      span *= G_IN(d);
      rest /= G_OUT(d);
      tap /= G_K(d);
    }
    if (hit) sum += S_load(rows, t * in_plane + at);
  }
  if (has_bias) sum += X_load(bias, bias_off + channel);
  X_store(y, y_off + i, sum);
}
"""

# col is produced for as many images at a time as fit in this many bytes
# (always at least one image).
_COL_BYTES = 1 << 26


@functools.cache
def _col2im_source(work_key: int, key: int, fp64: bool) -> str:
    return prelude("S", work_key, fp64) + prelude("X", key, fp64) + _COL2IM


def _conv_transpose(c: Call, key: int) -> None:
    c.expect((2, 3), 1)
    x, w = c.inputs[:2]
    bias = c.input(2)
    y = c.outputs[0]
    if y.size == 0:
        return
    nsp = x.ndim - 2
    out, begin, strides, dilations = conv_transpose_geometry(x.shape[2:], w.shape[2:], c.attrs)
    group = c.attrs["group"]
    images, channels = x.shape[:2]
    cg, mg, taps = channels // group, w.shape[1], math.prod(w.shape[2:])
    in_plane, out_plane = math.prod(x.shape[2:]), math.prod(out)
    rows = mg * taps
    work = work_dtype(key)
    if work == key:
        x_buf, x_off, w_buf, w_off = x.buffer, x.offset, w.buffer, w.offset
    else:
        x_buf, x_off, w_buf, w_off = compact_copy(c, x, work), 0, compact_copy(c, w, work), 0
    per_image = group * rows * in_plane
    band = min(images, max(1, _COL_BYTES // max(per_image * cl_type(work).itemsize, 1)))
    col = scratch(c, work, band * per_image)
    geo = c.buffer(list(x.shape[2:]) + list(out) + list(w.shape[2:]) + list(strides) + list(dilations)
                   + list(begin))
    size = min(64, c.device.limits.max_group_size)
    for first in range(0, images, band):
        count = min(band, images - first)
        if in_plane:
            # col[image, g, (m, tap), q] = W[g, :, (m, tap)]^T @ X[image, g, :, q]
            gemm(c, work, Matrix(w_buf, w_off, 1, rows),
                 Matrix(x_buf, x_off + first * channels * in_plane, in_plane, 1),
                 Matrix(col, 0, in_plane, 1), rows, in_plane, cg,
                 [(count, 0, channels * in_plane, per_image),
                  (group, cg * rows, cg * in_plane, rows * in_plane)])
        total = count * y.shape[1] * out_plane
        c.launch(_col2im_source(work, key, c.fp64), "k_col2im",
                 [col, bias if bias is not None else y, np.int64(bias.offset if bias is not None else 0),
                  np.int32(bias is not None), y,
                  np.int64(y.offset + first * y.shape[1] * out_plane), np.int64(y.shape[1]), np.int64(mg),
                  np.int64(taps), np.int64(in_plane), np.int64(out_plane), np.int32(nsp), geo,
                  np.int64(total)], round_up(total, size), size)


def register(table, unclaimed) -> None:
    table.claim("Conv", _conv, 0, unclaimed)
    table.claim("ConvTranspose", _conv_transpose, 0, unclaimed)
