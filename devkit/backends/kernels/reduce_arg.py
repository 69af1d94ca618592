"""ArgMax, ArgMin and Hardmax (one program per dtype), Softmax and LogSoftmax
(another): ops along one axis, a slice per position of the other dims.

Each slice takes one work-item (see reduce_common.item_per_slice) or a
work-group, whose work-items stride over it and combine in local memory.

ArgMax/ArgMin follow NumPy: NaN beats every number both ways and ties go
to the lower index, or the higher with select_last_index; the tree
combines (value, index) pairs under that same total order, so the
winner does not depend on how the slice is split. Hardmax marks ArgMax's
first winner. Softmax and LogSoftmax compute exp(x - max) / sum and
(x - max) - log(sum) in X_acc (double where the device has fp64) and round
once: NaN, +inf or only -inf in a slice make it all NaN, as in ONNX's
reference; -inf beside finite values gives 0 (LogSoftmax: -inf).
"""

from __future__ import annotations

import functools

import numpy as np

from .layer import Call, cl_type, group_size, round_up
from .reduce_common import (
    along_axis,
    build_options,
    header,
    item_per_slice,
)

# Per kind of dtype: "vb is a greater (less) value than va", "they tie".
_FLOAT_ORDER = ("vb > va || (isnan(vb) && !isnan(va))", "vb < va || (isnan(vb) && !isnan(va))",
                "vb == va || (isnan(vb) && isnan(va))")
_INT_ORDER = ("vb > va", "vb < va", "vb == va")
_OP_NUMBERS = {"ArgMax": 0, "ArgMin": 1, "Hardmax": 2}

# Both kernels take rows = 1 for a work-item per slice, 0 for a work-group
# per slice; meta holds the nk kept dims' shape, strides in x, strides in
# y, then the axis' stride in x (and in y, for outputs along it). Every
# work-item runs the trees, so that no barrier is conditional; with rows
# their results go unused.
_ARG = """
#define ARGMIN {argmin}
#define HARDMAX {hardmax}

/* (vb, ib) beats (va, ia): a better value (the greater, or the less with
 * minimum), or an equal one at the lower index (the higher with last). */
inline bool arg_beats(int minimum, int last, X_ct vb, long ib, X_ct va, long ia) {{
  if (minimum ? ({less}) : ({greater})) return true;
  return ({equal}) && (last ? ib > ia : ib < ia);
}}

/* ArgMax and ArgMin write the int64 index of each slice's winner to index;
 * Hardmax writes its slice to y, 1 at ArgMax's winner and 0 elsewhere. */
kernel void k_arg(int op, int rows, global const X_t *x, long x_off, global long *index,
                  global X_t *y, long y_off, global const long *meta, int nk, long len,
                  long n_out, int last) {{
  local X_ct sv[WG];
  local long si[WG];
  int lid = get_local_id(0), minimum = op == ARGMIN;
  long o = rows ? get_global_id(0) : get_group_id(0);
  long first = rows ? 0 : lid, step = rows ? 1 : WG, end = o < n_out ? len : 0;
  long base = x_off + dk_offset(o, nk, meta, meta + nk), stride = meta[3 * nk];
  X_ct best = 0;
  long at = -1;  /* none yet */
  for (long r = first; r < end; r += step) {{
    X_ct v = X_load(x, base + r * stride);
    if (at < 0 || arg_beats(minimum, last, v, r, best, at)) {{
      best = v;
      at = r;
    }}
  }}
  sv[lid] = best;
  si[lid] = at;
  barrier(CLK_LOCAL_MEM_FENCE);
  for (int h = WG / 2; h > 0; h >>= 1) {{
    if (lid < h && si[lid + h] >= 0 &&
        (si[lid] < 0 || arg_beats(minimum, last, sv[lid + h], si[lid + h], sv[lid], si[lid]))) {{
      sv[lid] = sv[lid + h];
      si[lid] = si[lid + h];
    }}
    barrier(CLK_LOCAL_MEM_FENCE);
  }}
  if (o >= n_out) return;
  if (!rows) at = si[0];
  long yb = y_off + dk_offset(o, nk, meta, meta + 2 * nk);
  if (op != HARDMAX) {{
    if (rows || lid == 0) index[yb] = at;
    return;
  }}
  for (long r = first; r < len; r += step) X_store(y, yb + r * meta[3 * nk + 1], r == at);
}}
"""

# log_form: LogSoftmax.
_SOFTMAX = """
inline X_acc softmax_max(X_acc a, X_acc b) { return b > a || isnan(b) ? b : a; }

/* The work-group's values of a combined (maximum: with softmax_max, else
 * summed), for every work-item. */
inline X_acc softmax_tree(local X_acc *s, X_acc a, int maximum) {
  int lid = get_local_id(0);
  s[lid] = a;
  barrier(CLK_LOCAL_MEM_FENCE);
  for (int h = WG / 2; h > 0; h >>= 1) {
    if (lid < h) s[lid] = maximum ? softmax_max(s[lid], s[lid + h]) : s[lid] + s[lid + h];
    barrier(CLK_LOCAL_MEM_FENCE);
  }
  a = s[0];
  barrier(CLK_LOCAL_MEM_FENCE);  /* all have read s[0] before s is reused */
  return a;
}

kernel void k_softmax(int log_form, int rows, global const X_t *x, long x_off, global X_t *y,
                      long y_off, global const long *meta, int nk, long len, long n_out) {
  local X_acc t[WG];
  long o = rows ? get_global_id(0) : get_group_id(0);
  long first = rows ? 0 : get_local_id(0), step = rows ? 1 : WG, end = o < n_out ? len : 0;
  long xb = x_off + dk_offset(o, nk, meta, meta + nk), xs = meta[3 * nk];
  X_acc m = -INFINITY, s = 0;
  for (long r = first; r < end; r += step) m = softmax_max(m, (X_acc)X_load(x, xb + r * xs));
  X_acc tree = softmax_tree(t, m, 1);
  if (!rows) m = tree;
  for (long r = first; r < end; r += step) s += exp((X_acc)X_load(x, xb + r * xs) - m);
  tree = softmax_tree(t, s, 0);
  if (!rows) s = tree;
  X_acc log_s = log(s);
  long yb = y_off + dk_offset(o, nk, meta, meta + 2 * nk), ys = meta[3 * nk + 1];
  for (long r = first; r < end; r += step) {
    X_acc d = (X_acc)X_load(x, xb + r * xs) - m;
    X_put(y, yb + r * ys, log_form ? d - log_s : exp(d) / s);
  }
}
"""


@functools.cache
def _arg_source(key: int, fp64: bool) -> str:
    greater, less, equal = _FLOAT_ORDER if cl_type(key).is_float else _INT_ORDER
    return header(key, fp64) + _ARG.format(greater=greater, less=less, equal=equal,
                                           argmin=_OP_NUMBERS["ArgMin"], hardmax=_OP_NUMBERS["Hardmax"])


@functools.cache
def _softmax_source(key: int, fp64: bool) -> str:
    return header(key, fp64) + _SOFTMAX


def _run(c: Call, key: int) -> None:
    c.expect((1, 1), 1)
    x, y = c.inputs[0], c.outputs[0]
    if y.size == 0:
        return
    axis = c.attrs["axis"] + x.ndim if c.attrs["axis"] < 0 else c.attrs["axis"]
    meta, nk, n_out = along_axis(c, x, axis, [(y, c.op not in ("ArgMax", "ArgMin"))])
    length, wg = x.shape[axis], group_size(c)
    rows = item_per_slice(c, n_out, length)
    x_args = [np.int32(rows), x, np.int64(x.offset)]
    y_args = [np.int64(y.offset), meta, np.int32(nk), np.int64(length), np.int64(n_out)]
    if c.op in _OP_NUMBERS:
        index, values = (None, y) if c.op == "Hardmax" else (y, None)
        args = [np.int32(_OP_NUMBERS[c.op]), *x_args, index, values, *y_args,
                np.int32(c.attrs.get("select_last_index", 0))]
        source, kernel = _arg_source(key, c.fp64), "k_arg"
    else:
        args = [np.int32(c.op == "LogSoftmax"), *x_args, y, *y_args]
        source, kernel = _softmax_source(key, c.fp64), "k_softmax"
    c.launch(source, kernel, args, round_up(n_out, wg) if rows else n_out * wg, wg, build_options(c))


OPS = {op: _run for op in ("ArgMax", "ArgMin", "Hardmax", "Softmax", "LogSoftmax")}
