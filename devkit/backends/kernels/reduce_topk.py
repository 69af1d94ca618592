"""TopK (opset 11+: K as a host input, axis, largest, sorted).

Every slice along the axis is sorted by a bitonic network over (key, index)
pairs, padded to a power of two P with entries that sort last, and its
first K entries are the outputs. The key is a ulong whose unsigned order is
the order of the values (NaN above every number, -0 equal to +0), inverted
for largest=1, and equal keys go by index: ascending (key, index) order is
ONNX's order, best first, ties by lower index, in both directions.

The network is the variant that sorts every run ascending: each stage of
run length s first compares mirrored positions of a run (i with
s - 1 - i), then positions at halving strides. All stages of runs up to
2*WG entries run in local memory in one launch of k_TopK_local, which also
builds the keys; longer slices take a kernel per step of stride 2*WG or
more (k_TopK_step), each stage finished by k_TopK_local in local memory.
The last launch of k_TopK_local writes the outputs. sorted=0 leaves the
order free: the outputs come sorted all the same.
"""

from __future__ import annotations

import functools

import numpy as np

from .layer import Call, cl_type, group_size, round_up
from .reduce_common import along_axis, build_options, header

# The value's key for each kind of dtype, from v (X_ct).
_FLOAT_KEY = {
    True: """  if (isnan(v)) return ULONG_MAX;
  ulong b = as_ulong((R_t)v == 0 ? (R_t)0 : (R_t)v);
  return b >> 63 ? ~b : b | 0x8000000000000000UL;""",
    False: """  if (isnan(v)) return ULONG_MAX;
  uint b = as_uint((R_t)v == 0 ? (R_t)0 : (R_t)v);
  return (ulong)(b >> 31 ? ~b : b | 0x80000000u);""",
}
_INT_KEY = "  return (ulong)(long)v ^ 0x8000000000000000UL;"

# meta: the nk kept dims' shape, strides in x, in values and in indices; the
# axis' stride in x, in values and in indices.
_TEMPLATE = """
/* Unsigned order of keys = order of values (NaN above +inf, -0 == +0). */
inline ulong topk_key(X_ct v) {{
{key}
}}

/* Entries a < b of (k, i) in ascending (key, index) order. */
#define TOPK_ORDER(k, i, a, b) \\
  if (k[b] < k[a] || (k[b] == k[a] && i[b] < i[a])) {{ \\
    ulong tk = k[a]; k[a] = k[b]; k[b] = tk; \\
    long ti = i[a]; i[a] = i[b]; i[b] = ti; \\
  }}

/* Compare-exchange t of a step of stride j: in each run of 2j entries,
 * (w, w + j), or (w, 2j - 1 - w) for the mirrored first step of a stage. */
#define TOPK_PAIR(t, j, mirror, a, b) \\
  long a = (t) / (j) * 2 * (j) + (t) % (j); \\
  long b = (mirror) ? a - (t) % (j) + 2 * (j) - 1 - (t) % (j) : a + (j);

/* Sorts 2*WG entries per work-group in local memory. sort = 1: entry e is
 * position e % padded of slice e / padded of x (padding past len sorts
 * last), and every run of `span` entries is sorted; sort = 0 (span =
 * 2*WG): the entries come from keys/index, and the steps of strides WG
 * down to 1 of a longer stage remain. last = 1: the sort is complete, and
 * entry j < k of each slice goes to the outputs (its value copied bit for
 * bit); else the entries go back to keys/index. */
kernel void k_TopK_local(int sort, int last, global const X_bits *x, long x_off,
                         global const long *meta, int nk, long len, long n_slices, long padded,
                         int largest, long span, global ulong *keys, global long *index,
                         global X_bits *values, long v_off, global long *indices, long i_off,
                         long k) {{
  local ulong lk[2 * WG];
  local long li[2 * WG];
  int lid = get_local_id(0);
  long e0 = get_group_id(0) * 2 * WG;
  for (int l = lid; l < 2 * WG; l += WG) {{
    long slice = (e0 + l) / padded, r = (e0 + l) % padded;
    if (!sort) {{
      lk[l] = keys[e0 + l];
      li[l] = index[e0 + l];
    }} else if (slice < n_slices && r < len) {{
      long at = x_off + dk_offset(slice, nk, meta, meta + nk) + r * meta[4 * nk];
      ulong key = topk_key(X_load((global const X_t *)x, at));
      lk[l] = largest ? ~key : key;
      li[l] = r;
    }} else {{
      lk[l] = ULONG_MAX;
      li[l] = LONG_MAX;
    }}
  }}
  barrier(CLK_LOCAL_MEM_FENCE);
  for (long s = sort ? 2 : 2 * WG; s <= span; s <<= 1) {{
    for (long j = s / 2; j > 0; j /= 2) {{
      TOPK_PAIR(lid, j, sort && j == s / 2, a, b)
      TOPK_ORDER(lk, li, a, b)
      barrier(CLK_LOCAL_MEM_FENCE);
    }}
  }}
  for (int l = lid; l < 2 * WG; l += WG) {{
    long slice = (e0 + l) / padded, j = (e0 + l) % padded;
    if (!last) {{
      keys[e0 + l] = lk[l];
      index[e0 + l] = li[l];
    }} else if (slice < n_slices && j < k) {{
      long r = li[l];
      values[v_off + dk_offset(slice, nk, meta, meta + 2 * nk) + j * meta[4 * nk + 1]] =
          x[x_off + dk_offset(slice, nk, meta, meta + nk) + r * meta[4 * nk]];
      indices[i_off + dk_offset(slice, nk, meta, meta + 3 * nk) + j * meta[4 * nk + 2]] = r;
    }}
  }}
}}

/* One step of stride j >= 2*WG over all entries. */
kernel void k_TopK_step(global ulong *keys, global long *index, long j, int mirror) {{
  long t = get_global_id(0);
  TOPK_PAIR(t, j, mirror, a, b)
  TOPK_ORDER(keys, index, a, b)
}}
"""


@functools.cache
def _source(key: int, fp64: bool) -> str:
    t = cl_type(key)
    body = _FLOAT_KEY[fp64] if t.is_float else _INT_KEY
    # Values are copied as bits: half can be loaded and stored only through float.
    bits = "ushort" if t.storage == "half" else "X_t"
    return header(key, fp64) + f"typedef {bits} X_bits;\n" + _TEMPLATE.format(key=body)


def _run_topk(c: Call, key: int) -> None:
    c.expect((1, 1), 2)
    x, (values, indices) = c.inputs[0], c.outputs
    if values.size == 0:
        return
    axis = c.attrs["axis"] + x.ndim if c.attrs["axis"] < 0 else c.attrs["axis"]
    (k,) = c.attrs["K"]
    meta, nk, n_slices = along_axis(c, x, axis, [(values, True), (indices, True)])
    length, wg = x.shape[axis], group_size(c)
    source, options, block = _source(key, c.fp64), build_options(c), 2 * wg
    padded = 1 << (length - 1).bit_length()
    total = round_up(n_slices * padded, block)
    sorted_in_local = padded <= block
    keys = index = None
    if not sorted_in_local:
        keys = c.scratch(8 * total)
        index = c.scratch(8 * total)

    def local_sort(sort: bool, last: bool, span: int) -> None:
        c.launch(source, "k_TopK_local",
                 [np.int32(sort), np.int32(last), x, np.int64(x.offset), meta, np.int32(nk),
                  np.int64(length), np.int64(n_slices), np.int64(padded), np.int32(c.attrs["largest"]),
                  np.int64(span), keys, index, values, np.int64(values.offset), indices,
                  np.int64(indices.offset), np.int64(k)], total // 2, wg, options)

    local_sort(True, sorted_in_local, min(padded, block))
    run = 2 * block
    while run <= padded:
        stride, mirror = run // 2, 1
        while stride >= block:
            c.launch(source, "k_TopK_step", [keys, index, np.int64(stride), np.int32(mirror)],
                     total // 2, wg, options)
            stride, mirror = stride // 2, 0
        local_sort(False, run == padded, block)
        run *= 2


OPS = {"TopK": _run_topk}
