"""OpenCL kernels of Attention (opset 23) and RotaryEmbedding, one program
per dtype holding both.

Attention first writes present_key and present_value (past and new keys and
values, (B, Hkv, P + Lkv, .)), then runs a work-group per query row
(b, h, i): its work-items take keys in turn for the scores (scale * q . k,
softcap, attn_mask and causal bias, with qk_matmul_output written at the
selected stage), reduce the row's maximum and sum in local memory for a
max-subtracted softmax, and then take value columns for the output row. The
scores live in a device scratch buffer. Everything computes in X_acc (double
where the device has fp64), which meets every softmax_precision.
RotaryEmbedding is one work-item per element and honours strides.
"""

from __future__ import annotations

import functools
import math

import numpy as np

from ...abi import C
from ..support.boundary import PluginError, invalid
from .layer import STRIDED, broadcast_strides, launch_items, prelude
from .nn_common import GROUP_REDUCE, acc, launch_groups, tensor_args

# attn_mask kinds: k_Attention's mask_kind argument.
_NO_MASK, _BOOL_MASK, _ADDITIVE_MASK = 0, 1, 2
# ONNX TensorProto code of softmax_precision=DOUBLE.
_PRECISION_DOUBLE = 11

_SOURCE = GROUP_REDUCE + f"""
#define BOOL_MASK {_BOOL_MASK}
#define ADDITIVE_MASK {_ADDITIVE_MASK}
""" + """
/* present = concat(past, new) along the sequence: an item per element of
 * (B, Hkv, total, size); the new rows are at fresh_off + b * f_b + h * f_h
 * + t * f_r (3-D inputs interleave the heads in a row). */
kernel void k_AttentionPresent(global const X_t *past, long past_off, global const X_t *fresh, long fresh_off,
                               global X_t *out, long out_off, long hkv, long total, long past_len, long size,
                               long f_b, long f_h, long f_r, long n) {
  long i = get_global_id(0);
  if (i >= n) return;
  long e = i % size, t = i / size % total, bh = i / size / total;
  X_store(out, out_off + i, t < past_len
      ? X_load(past, past_off + (bh * past_len + t) * size + e)
      : X_load(fresh, fresh_off + bh / hkv * f_b + bh % hkv * f_h + (t - past_len) * f_r + e));
}

/* A group per query row. keys and values are present_key and present_value;
 * scores holds `total` values per row. meta: hq, hkv, lq, total, past, d, dv,
 * Q's and Y's strides between batches, heads and rows (3 each), and
 * attn_mask's strides over (B, Hq, Lq, total) (0 where it broadcasts). */
kernel void k_Attention(global const X_t *q, long q_off, global const X_t *keys, long k_off,
                        global const X_t *values, long v_off, global const uchar *mask, long mask_off,
                        int mask_kind, global X_t *y, long y_off, global X_t *qk, long qk_off,
                        global X_acc *scores, global const long *meta, X_acc scale, X_acc softcap,
                        int causal, int mode, local X_acc *scratch) {
  long hq = meta[0], hkv = meta[1], lq = meta[2], total = meta[3], past = meta[4], d = meta[5], dv = meta[6];
  long row = get_group_id(0), lid = get_local_id(0), step = get_local_size(0);
  long qi = row % lq, h = row / lq % hq, b = row / lq / hq;
  long kv = b * hkv + h / (hq / hkv);
  long q_at = q_off + b * meta[7] + h * meta[8] + qi * meta[9];
  long y_at = y_off + b * meta[10] + h * meta[11] + qi * meta[12];
  long mask_at = mask_off + b * meta[13] + h * meta[14] + qi * meta[15];
  long k_at = k_off + kv * total * d, v_at = v_off + kv * total * dv, qk_at = qk_off + row * total;
  global X_acc *s = scores + row * total;

  X_acc top = -INFINITY, attended = 0;  /* attended: 1 once a key's bias is not -inf */
  for (long j = lid; j < total; j += step) {
    X_acc v = 0;
    for (long e = 0; e < d; ++e) v += X_load(q, q_at + e) * X_load(keys, k_at + j * d + e);
    v *= scale;
    if (mode == 0) X_store(qk, qk_at + j, v);
    if (softcap > 0) v = softcap * tanh(v / softcap);
    if (mode == 1) X_store(qk, qk_at + j, v);
    X_acc bias = 0;
    if (mask_kind == BOOL_MASK) bias = mask[mask_at + j * meta[16]] ? 0 : -INFINITY;
    else if (mask_kind == ADDITIVE_MASK) bias = X_load((global const X_t *)mask, mask_at + j * meta[16]);
    if (causal && j > qi + past) bias += -INFINITY;
    if (bias != -INFINITY) attended = 1;
    v += bias;
    if (mode == 2) X_store(qk, qk_at + j, v);
    s[j] = v;
    top = NN_MAX(top, v);
  }
  /* A row that attends no key (every bias -inf, or no keys) gets zero
   * probabilities (ONNX 23 errata), as does a row of -inf scores; a NaN
   * score makes top, and so the whole row, NaN. */
  int zero = nn_group_max(scratch, attended) == 0;
  top = nn_group_max(scratch, top);
  zero |= top == -INFINITY;
  X_acc sum = 0;
  for (long j = lid; j < total; j += step) {
    s[j] = zero ? 0 : exp(s[j] - top);
    sum += s[j];
  }
  sum = nn_group_sum(scratch, sum);
  for (long j = lid; j < total; j += step) {
    s[j] = zero ? 0 : s[j] / sum;
    if (mode == 3) X_store(qk, qk_at + j, s[j]);
  }
  barrier(CLK_GLOBAL_MEM_FENCE);  /* every probability of the row, for every column */
  for (long e = lid; e < dv; e += step) {
    X_acc out = 0;
    for (long j = 0; j < total; ++j) out += s[j] * X_load(values, v_at + j * dv + e);
    X_store(y, y_at + e, out);
  }
}

/* An item per element of Y over (batch, seq, heads, head_size). meta: those
 * sizes; X's and Y's strides over them (4 each); position_ids' strides (2);
 * cos_cache's and sin_cache's strides for (position, batch, seq, pair) (4
 * each, 0 where they do not apply). A position outside [0, positions) sets
 * *bad. */
kernel void k_RotaryEmbedding(global const X_t *x, long x_off, global const X_t *cos_cache, long cos_off,
                              global const X_t *sin_cache, long sin_off, global const long *ids, long ids_off,
                              int has_ids, long positions, global X_t *y, long y_off, global const long *meta,
                              long pairs, int interleaved, global int *bad, long n) {
  /* Products rounded before the sum, as the reference computes them. */
  #pragma OPENCL FP_CONTRACT OFF
  long e = get_global_id(0);
  if (e >= n) return;
  long seq = meta[1], heads = meta[2], head_size = meta[3];
  long i = e % head_size, h = e / head_size % heads, s = e / head_size / heads % seq;
  long b = e / head_size / heads / seq;
  long x_at = x_off + b * meta[4] + s * meta[5] + h * meta[6], x_step = meta[7];
  long y_at = y_off + b * meta[8] + s * meta[9] + h * meta[10] + i * meta[11];
  if (i >= 2 * pairs) {  /* past the rotated part: copied */
    X_store(y, y_at, X_load(x, x_at + i * x_step));
    return;
  }
  long pos = 0;
  if (has_ids) {
    pos = ids[ids_off + b * meta[12] + s * meta[13]];
    if (pos < 0 || pos >= positions) {
      *bad = 1;
      return;
    }
  }
  /* This element's pair (i1, i2) and its index among the pairs. */
  long pair = interleaved ? i / 2 : i % pairs;
  long i1 = interleaved ? 2 * pair : pair, i2 = interleaved ? i1 + 1 : pair + pairs;
  X_acc c = X_load(cos_cache, cos_off + pos * meta[14] + b * meta[15] + s * meta[16] + pair * meta[17]);
  X_acc sn = X_load(sin_cache, sin_off + pos * meta[18] + b * meta[19] + s * meta[20] + pair * meta[21]);
  X_acc x1 = X_load(x, x_at + i1 * x_step), x2 = X_load(x, x_at + i2 * x_step);
  X_store(y, y_at, i == i1 ? c * x1 - sn * x2 : sn * x1 + c * x2);
}
"""


@functools.cache
def _source(key: int, fp64: bool) -> str:
    return prelude("X", key, fp64) + _SOURCE


def _layout(heads: int, length: int, size: int, three_d: bool) -> list[int]:
    """Element strides between batches, heads and rows of compact Q, K, V or Y
    (3-D tensors interleave the heads within a row)."""
    return [heads * length * size, size if three_d else length * size, heads * size if three_d else size]


def _attention(c, key: int) -> None:
    c.expect((3, 6), 4)
    q, k, v, mask, past_key, past_value = (c.inputs + [None] * 3)[:6]
    y, present_key, present_value, qk = c.outputs
    three_d = q.ndim == 3
    if three_d:
        hq, hkv = c.attrs["q_num_heads"], c.attrs["kv_num_heads"]
        batch, lq, lkv = q.shape[0], q.shape[1], k.shape[1]
        d, dv = q.shape[2] // hq, v.shape[2] // hkv
    else:
        batch, hq, lq, d = q.shape
        hkv, lkv, dv = k.shape[1], k.shape[2], v.shape[3]
    past = past_key.shape[2] if past_key is not None else 0
    total = past + lkv
    if c.attrs.get("softmax_precision") == _PRECISION_DOUBLE and not c.fp64:
        raise invalid("softmax_precision DOUBLE needs a device with fp64")
    source = _source(key, c.fp64)
    for present, earlier, fresh, size in ((present_key, past_key, k, d), (present_value, past_value, v, dv)):
        # Without a past the kernel never reads its past argument: the new rows stand in.
        launch_items(c, source, "k_AttentionPresent",
                     tensor_args(earlier or fresh, fresh, present)
                     + [np.int64(n) for n in (hkv, total, past, size, *_layout(hkv, lkv, size, three_d),
                                              present.size)],
                     present.size)
    if y.size == 0 and qk.size == 0:
        return
    rows = batch * hq * lq
    mask_kind = _NO_MASK if mask is None else _BOOL_MASK if mask.dtype == C.DK_DTYPE_BOOL else _ADDITIVE_MASK
    mask_strides = [0] * 4 if mask is None else broadcast_strides(mask, [batch, hq, lq, total])
    meta = c.buffer([hq, hkv, lq, total, past, d, dv, *_layout(hq, lq, d, three_d),
                     *_layout(hq, lq, dv, three_d), *mask_strides])
    scores = c.scratch(max(1, rows * total) * (8 if c.fp64 else 4))
    scale = c.attrs.get("scale", 1 / math.sqrt(d) if d else 1.0)
    launch_groups(c, source, "k_Attention",
                  tensor_args(q, present_key, present_value, mask or q)  # Q stands in for no mask
                  + [np.int32(mask_kind)] + tensor_args(y, qk)
                  + [scores, meta, acc(c, scale), acc(c, c.attrs["softcap"]), np.int32(c.attrs["is_causal"]),
                     np.int32(c.attrs["qk_matmul_output_mode"])],
                  rows)


def _rotary_embedding(c, key: int) -> None:
    c.expect((3, 4), 1)
    x, cos, sin = c.inputs[:3]
    ids, y = c.input(3), c.outputs[0]
    if y.size == 0:
        return
    if x.ndim == 4:
        batch, heads, seq, head_size = x.shape
        def view(t):  # (b, s, h, i) strides of a (B, heads, S, head_size) tensor
            return [t.strides[0], t.strides[2], t.strides[1], t.strides[3]]
    else:
        heads = c.attrs["num_heads"]
        batch, seq, head_size = x.shape[0], x.shape[1], x.shape[2] // heads
        def view(t):  # (b, s, h, i) strides of a (B, S, heads * head_size) tensor
            return [t.strides[0], t.strides[1], head_size * t.strides[2], t.strides[2]]
    pairs = (c.attrs["rotary_embedding_dim"] or head_size) // 2
    if ids is not None:
        def cache(t):  # (position, b, s, pair) strides of a (positions, pairs) cache
            return [t.strides[0], 0, 0, t.strides[1]]
        positions, ids_strides = cos.shape[0], ids.strides
    else:
        def cache(t):  # of a (B, S, pairs) cache
            return [0, *t.strides]
        positions, ids_strides = 0, [0, 0]
    meta = c.buffer([batch, seq, heads, head_size, *view(x), *view(y), *ids_strides, *cache(cos), *cache(sin)])
    bad = c.zeros(1)
    launch_items(c, _source(key, c.fp64), "k_RotaryEmbedding",
                 tensor_args(x, cos, sin, ids or x)  # X stands in for no position_ids
                 + [np.int32(ids is not None), np.int64(positions)] + tensor_args(y)
                 + [meta, np.int64(pairs), np.int32(c.attrs["interleaved"]), bad, np.int64(y.size)],
                 y.size)
    if ids is not None:
        def check(reader) -> PluginError | None:
            flag = np.zeros(1, np.int32)
            reader.read(flag, bad)
            if not flag[0]:
                return None
            return PluginError(C.DK_OUT_OF_RANGE,
                               f"position_ids holds a position outside [0, {positions}), the rows of cos_cache")

        c.check_in_stream_order(check)


def register(table, unclaimed) -> None:
    table.claim("Attention", _attention, unclaimed=unclaimed)
    table.claim("RotaryEmbedding", _rotary_embedding, STRIDED, unclaimed=unclaimed)
