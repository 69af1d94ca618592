"""What the training kernel modules share: launch geometry, scalar arguments,
scratch buffers, OpenCL C helpers (strided offsets, work-group reductions)
and the device-side range check of labels and indices.

Work-group sizes are fixed per kind of kernel, never derived from the shape:
PoCL compiles a kernel once per local size it is launched with, so a size
that followed the rows would cost a compile per new shape.
"""

from __future__ import annotations

import numpy as np

from ...abi import C
from ..support.boundary import PluginError
from .layer import Call, Local, Tensor, group_size, round_up

ROW_GROUP = 64           # work-items of a row kernel's work-group (a power of two)
SHORT_ROW = 64           # rows up to this long take one work-item each


def launch_rows(c: Call, source: str, name: str, args: list, rows: int, length: int) -> None:
    """A row kernel over ``rows`` rows of ``length`` terms: on a 2-D range whose
    dim 0 holds the lanes that share a row (ROW_GROUP of them for a long row,
    one for a short one) and dim 1 the rows, ROW_GROUP / lanes per group. The
    kernel's last arguments, appended here, are ``long rows`` and its local
    scratch (``local acc *``, one element per work-item); see row_helpers."""
    group = group_size(c, ROW_GROUP)
    lanes = 1 if length <= SHORT_ROW else group
    per_group = group // lanes
    c.launch(source, name, args + [np.int64(rows), Local(group * acc_itemsize(c))],
             (lanes, round_up(rows, per_group)), (lanes, per_group))


def acc_itemsize(c: Call) -> int:
    return 8 if c.fp64 else 4


def acc_scalar(c: Call, value: float):
    """A float kernel argument declared ``acc`` (double where the device has fp64)."""
    return np.float64(value) if c.fp64 else np.float32(value)


def scratch(c: Call, count: int, itemsize: int):
    """A device buffer of ``count`` elements for a kernel's intermediate results."""
    return c.scratch(max(count, 1) * itemsize)


def is_compact(t: Tensor) -> bool:
    step = 1
    for n, s in zip(reversed(t.shape), reversed(t.strides)):
        if n != 1 and s != step:
            return False
        step *= n
    return True


def offsets_meta(c: Call, tensors: list[Tensor]) -> tuple[np.int32, object]:
    """(strided, meta) for kernels over tensors of one shape: strided is 0
    where every tensor is compact (the kernels then index them linearly);
    meta holds the shape, then each tensor's strides (see OFFSETS)."""
    strided = not all(is_compact(t) for t in tensors)
    meta = list(tensors[0].shape) + [s for t in tensors for s in t.strides] if strided else []
    return np.int32(strided), c.buffer(meta)


# Every training program starts with it: no multiply-adds fused behind the
# formulas' back, so that results round as the cpu plugin's and the float64
# references do (OpenCL C contracts by default).
NO_CONTRACT = "#pragma OPENCL FP_CONTRACT OFF\n"

# Element offsets, in `count` tensors of one shape, of row-major index i.
OFFSETS = """
inline void dk_offsets(long i, int strided, int ndim, global const long *meta, int count,
                       const long *base, long *offset) {
  for (int t = 0; t < count; ++t) offset[t] = base[t] + (strided ? 0 : i);
  if (!strided) return;
  for (int d = ndim - 1; d >= 0; --d) {
    long k = i % meta[d];
    i /= meta[d];
    for (int t = 0; t < count; ++t) offset[t] += k * meta[ndim + t * ndim + d];
  }
}
"""

# Along one axis of a window, the steps j in [0, count) with first + j *
# step inside [0, limit): [lo, hi) (the cpu plugin's linalg_valid_range).
VALID_RANGE = """
inline void dk_valid_range(long first, long step, long count, long limit, long *lo, long *hi) {
  long a = first >= 0 ? 0 : (-first - 1) / step + 1;
  long b = first >= limit ? 0 : (limit - first - 1) / step + 1;
  *lo = min(a, count);
  *hi = max(*lo, min(b, count));
}
"""

# Row kernels (launch_rows): DK_ROW names the row, the lane and the lane
# count; `active` is false for the padding rows of the last group, which
# take part in the barriers but touch no data. The reductions combine the
# lanes of one row in `acc` values (of the prefix of a prelude), returning
# the result to each; their trailing barrier lets the scratch be reused.
_ROWS = """
#define DK_ROW                                                                   \\
  long row = get_global_id(1), lane = get_local_id(0), lanes = get_local_size(0); \\
  bool active = row < rows;

inline {P}_acc dk_row_sum_{P}(local {P}_acc *s, {P}_acc v) {{
  size_t lane = get_local_id(0), lanes = get_local_size(0);
  local {P}_acc *r = s + get_local_id(1) * lanes;
  r[lane] = v;
  barrier(CLK_LOCAL_MEM_FENCE);
  for (size_t h = lanes / 2; h > 0; h /= 2) {{
    if (lane < h) r[lane] += r[lane + h];
    barrier(CLK_LOCAL_MEM_FENCE);
  }}
  {P}_acc total = r[0];
  barrier(CLK_LOCAL_MEM_FENCE);
  return total;
}}

/* The maximum, NaN if any value is NaN. */
inline {P}_acc dk_nan_max_{P}({P}_acc a, {P}_acc b) {{ return isnan(a) || a > b ? a : b; }}

inline {P}_acc dk_row_max_{P}(local {P}_acc *s, {P}_acc v) {{
  size_t lane = get_local_id(0), lanes = get_local_size(0);
  local {P}_acc *r = s + get_local_id(1) * lanes;
  r[lane] = v;
  barrier(CLK_LOCAL_MEM_FENCE);
  for (size_t h = lanes / 2; h > 0; h /= 2) {{
    if (lane < h) r[lane] = dk_nan_max_{P}(r[lane], r[lane + h]);
    barrier(CLK_LOCAL_MEM_FENCE);
  }}
  {P}_acc top = r[0];
  barrier(CLK_LOCAL_MEM_FENCE);
  return top;
}}
"""


def row_helpers(prefix: str) -> str:
    """DK_ROW, and dk_row_sum_P, dk_row_max_P and dk_nan_max_P over prefix P's acc type."""
    return _ROWS.format(P=prefix)


class RangeCheck:
    """A label or index outside its range, reported without blocking the call.

    Kernels that meet one set the flag (``atomic_xchg(flag, 1)``) and skip
    the element. ``report`` queues a host step behind them that reads the flag
    and, when set, fails the call's stream with OutOfRangeError; the message
    names the first offending element, found on the host from the tensor (an
    error path only).
    """

    def __init__(self, c: Call):
        self.c = c
        self.flag = c.zeros(1)

    def report(self, tensor: Tensor, valid, describe) -> None:
        """``valid(values)``: a mask of the acceptable values of ``tensor``
        (compact); ``describe(value, element)``: what is wrong with one."""
        flag, op = self.flag, self.c.op
        dtype = np.int64 if tensor.dtype == C.DK_DTYPE_INT64 else np.int32
        seen = np.zeros(1, np.int32)

        def check(reader) -> PluginError | None:
            reader.read(seen, flag)
            if not seen[0]:
                return None
            values = np.empty(tensor.size, dtype)
            reader.read(values, tensor.buffer, tensor.offset * values.itemsize)
            i = int(np.argmin(valid(values)))
            return PluginError(C.DK_OUT_OF_RANGE, f"{op}: {describe(values[i], i)}")

        self.c.check_in_stream_order(check)
