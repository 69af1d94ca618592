"""What the shape family's kernels share: strided views in
row-major order, and the family's conversions in OpenCL C.

Conversions (devkit/ops/shape.py): a float result is the exact value rounded
once to nearest even (overflow to inf); float -> integer truncates toward
zero and saturates, NaN giving 0; integer -> integer wraps; anything -> bool
is x != 0 (NaN is true).
"""

from __future__ import annotations

import numpy as np

from .layer import Call, ClType, collapse


def walk(c: Call, *views) -> list:
    """Kernel arguments for the INDEXING macros: the rank of each collapsed
    view (shape, strides), then one buffer of each one's shape and strides.
    The views hold the same number of elements, walked in row-major order."""
    collapsed = [collapse(shape, strides) for shape, strides in views]
    meta = [v for shape, strides in collapsed for v in shape + strides]
    return [np.int32(len(shape)) for shape, _ in collapsed] + [c.buffer(meta)]


# Kernels taking walk(c, view0[, view1]) as (int n0[, int n1], global const long *meta).
INDEXING = """
#define AT0(i) dk_offset((i), n0, meta, meta + n0)
#define AT1(i) dk_offset((i), n1, meta + 2 * n0, meta + 2 * n0 + n1)
"""

# Two roundings in a row (to float, then to float16/bfloat16) may differ from
# one; rounding to odd first does not: a float rounded to odd (truncated, the
# last bit set when inexact) holds enough to round once more correctly to any
# type at least two bits narrower.
ROUND_TO_ODD = """
inline float dk_odd_long(long v) {
  float f = convert_float_rtz(v);
  return (long)f == v ? f : as_float(as_uint(f) | 1u);
}
"""
ROUND_TO_ODD_DOUBLE = """
inline float dk_odd_double(double v) {
  float f = convert_float_rtz(v);
  return ((double)f == v || isnan(v)) ? f : as_float(as_uint(f) | 1u);
}
"""


def real_type(fp64: bool) -> str:
    """The type of coordinates, weights and real scalars: double where the device has it."""
    return "double" if fp64 else "float"


def value_kind(t: ClType, fp64: bool) -> str:
    """How a value of dtype ``t`` is held once loaded (its P_ct): "double" or
    "float", "int" (int32/int64: float may not hold it exactly), or "small"
    (int8, uint8, bool: float holds it exactly)."""
    if t.is_float:
        return "double" if t.storage == "double" or (t.storage == "float" and fp64) else "float"
    return "int" if t.itemsize >= 4 else "small"


def convert(value: str, kind: str, to: ClType) -> str:
    """OpenCL C converting ``value``, held as ``kind`` (see value_kind), into
    what ``to``'s P_store takes, with the family's rounding."""
    real = kind in ("double", "float")
    if to.kind == "bool":
        return value  # the store tests != 0
    if not to.is_float:
        # float -> integer: _sat conversions truncate, saturate and map NaN to 0.
        return f"convert_{to.storage}_sat({value})" if real else value
    if to.storage == "double":
        return f"convert_double_rte({value})"
    if to.storage == "float":
        return f"convert_float_rte({value})"
    # float16, bfloat16: their stores round a float once.
    return {"double": f"dk_odd_double({value})", "int": f"dk_odd_long({value})"}.get(kind, value)
