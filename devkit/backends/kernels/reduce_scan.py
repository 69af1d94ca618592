"""CumSum (opset 14: the axis as a host input, exclusive, reverse).

Each slice is scanned by one work-item (see reduce_common.item_per_slice)
or by a work-group, WG elements at a time: an inclusive scan of the chunk
in local memory (Hillis-Steele), plus the carry of the chunks before it.
Floats sum in X_acc (double where the device has fp64) and round each output
once; integers sum in ulong, whose low bits wrap like the dtype's
arithmetic (devkit/backends/cpu/kernels/reduce_cumsum.c).

float64 slices are always scanned by one work-item, in order: with no wider
type to sum in, the running sums' rounding errors depend on the order of
the additions, and the spec (rtol = atol = 1e-13) holds the results to the
sequential order's, which the tree order misses wherever a long running sum
comes back near zero.
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

# meta: the nk kept dims' shape, strides in x, strides in y; the axis' stride
# in x and in y. Position p of the scan is element len - 1 - p with reverse.
# rows = 1: a work-item per slice; 0: a work-group per slice. All the
# work-items of a work-group take the same path, so no barrier is
# conditional within one.
_TEMPLATE = """
kernel void k_CumSum(int rows, global const X_t *x, long x_off, global X_t *y, long y_off,
                     global const long *meta, int nk, long len, long n_out, int exclusive,
                     int reverse) {{
  local A s[WG];
  int lid = get_local_id(0);
  long o = rows ? get_global_id(0) : get_group_id(0);
  if (o >= n_out) return;
  long xb = x_off + dk_offset(o, nk, meta, meta + nk), xs = meta[3 * nk];
  long yb = y_off + dk_offset(o, nk, meta, meta + 2 * nk), ys = meta[3 * nk + 1];
  if (rows) {{
    A sum = 0;
    for (long p = 0; p < len; ++p) {{
      long r = reverse ? len - 1 - p : p;
      A v = (A)X_load(x, xb + r * xs);
      if (!exclusive) sum += v;
      X_put(y, yb + r * ys, {result});
      if (exclusive) sum += v;
    }}
    return;
  }}
  A carry = 0;
  for (long p0 = 0; p0 < len; p0 += WG) {{
    long p = p0 + lid, r = reverse ? len - 1 - p : p;
    s[lid] = p < len ? (A)X_load(x, xb + r * xs) : 0;
    barrier(CLK_LOCAL_MEM_FENCE);
    for (int d = 1; d < WG; d <<= 1) {{
      A before = lid >= d ? s[lid - d] : 0;
      barrier(CLK_LOCAL_MEM_FENCE);
      s[lid] += before;
      barrier(CLK_LOCAL_MEM_FENCE);
    }}
    A sum = carry + (exclusive ? (lid > 0 ? s[lid - 1] : 0) : s[lid]);
    if (p < len) X_put(y, yb + r * ys, {result});
    carry += s[WG - 1];
    barrier(CLK_LOCAL_MEM_FENCE);  /* all have read s before the next chunk */
  }}
}}
"""


@functools.cache
def _source(key: int, fp64: bool) -> str:
    if cl_type(key).is_float:
        acc, result = "X_acc", "sum"
    else:
        acc, result = "ulong", "(X_U)sum"
    return header(key, fp64) + f"typedef {acc} A;\n" + _TEMPLATE.format(result=result)


def _run_cumsum(c: Call, key: int) -> None:
    c.expect((1, 1), 1)
    x, y = c.inputs[0], c.outputs[0]
    if y.size == 0:
        return
    (axis,) = c.attrs["axis"]
    axis = axis + x.ndim if axis < 0 else axis
    meta, nk, n_out = along_axis(c, x, axis, [(y, True)])
    length, wg = x.shape[axis], group_size(c)
    source, options = _source(key, c.fp64), build_options(c)
    args = [x, np.int64(x.offset), y, np.int64(y.offset), meta, np.int32(nk), np.int64(length)]
    flags = [np.int32(c.attrs["exclusive"]), np.int32(c.attrs["reverse"])]
    rows = item_per_slice(c, n_out, length) or cl_type(key).name == "float64"
    c.launch(source, "k_CumSum", [np.int32(rows), *args, np.int64(n_out), *flags],
             round_up(n_out, wg) if rows else n_out * wg, wg, options)


OPS = {"CumSum": _run_cumsum}
