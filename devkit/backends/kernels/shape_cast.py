"""Cast, and the generators that turn real numbers into any dtype:
ConstantOfShape, EyeLike, Range (and Dropout's mask).

One program per source dtype holds a Cast kernel per target (k_cast_<target>).
The generators live in the program whose source is the device's widest float
(float64, or float32 without fp64): they convert a real scalar exactly as
Cast converts that dtype.
"""

from __future__ import annotations

import functools

import numpy as np

from ...abi import C
from .layer import CL_TYPES, Call, cl_type, launch_items, prelude
from .shape_kit import (
    INDEXING,
    ROUND_TO_ODD,
    ROUND_TO_ODD_DOUBLE,
    convert,
    real_type,
    value_kind,
    walk,
)

_CAST = """
kernel void k_cast_{to}(global const X_t *x, long x_off, global Y{to}_t *y, long y_off,
                       int n0, int n1, global const long *meta, long n) {{
  long i = get_global_id(0);
  if (i >= n) return;
  X_ct v = {load};
  Y{to}_store(y, y_off + AT1(i), {value});
}}
"""

# Generators write compact outputs; `real` is double, or float without fp64.
_GENERATORS = """
kernel void k_fill_{to}(global Y{to}_t *y, long y_off, real value, long n) {{
  long i = get_global_id(0);
  if (i >= n) return;
  Y{to}_store(y, y_off + i, {fill});
}}

/* Ones where column - row == k. */
kernel void k_eye_{to}(global Y{to}_t *y, long y_off, long cols, long k, long n) {{
  long i = get_global_id(0);
  if (i >= n) return;
  uchar one = i % cols - i / cols == k;
  Y{to}_store(y, y_off + i, one);
}}
"""

_RANGE_REAL = """
/* start + i * delta in the real type, rounded once to the output. */
kernel void k_range_{to}(global Y{to}_t *y, long y_off, real start, real delta, long n) {{
  long i = get_global_id(0);
  if (i >= n) return;
  real v = start + (real)i * delta;
  Y{to}_store(y, y_off + i, {value});
}}
"""

_RANGE_INT = """
/* start + i * delta wraps in ulong exactly as the true value does, which fits. */
kernel void k_range_{to}(global Y{to}_t *y, long y_off, long start, long delta, long n) {{
  long i = get_global_id(0);
  if (i >= n) return;
  Y{to}_store(y, y_off + i, (long)((ulong)start + (ulong)i * (ulong)delta));
}}
"""

_RANGE_DTYPES = (C.DK_DTYPE_FLOAT32, C.DK_DTYPE_FLOAT64, C.DK_DTYPE_INT32, C.DK_DTYPE_INT64)


def _real_key(fp64: bool) -> int:
    return C.DK_DTYPE_FLOAT64 if fp64 else C.DK_DTYPE_FLOAT32


@functools.cache
def _source(key: int, fp64: bool) -> str:
    """The program of source dtype ``key``: a Cast kernel per target the
    device holds, and the generators where ``key`` is the real type's dtype."""
    source_type = cl_type(key)
    targets = [t for t in CL_TYPES.values() if fp64 or t.storage != "double"]
    parts = [prelude("X", key, fp64)] + [prelude(f"Y{t.name}", t.key, fp64) for t in targets]
    parts += [INDEXING, ROUND_TO_ODD, ROUND_TO_ODD_DOUBLE if fp64 else ""]
    kind = value_kind(source_type, fp64)
    load = "X_load(x, x_off + AT0(i))"
    if source_type.kind == "bool":
        load = f"({load} != 0)"  # any nonzero byte is true
    for t in targets:
        parts.append(_CAST.format(to=t.name, load=load, value=convert("v", kind, t)))
    if key == _real_key(fp64):
        real = real_type(fp64)
        # Range rounds start + i * delta twice, as the spec does: no fma.
        parts.append(f"#pragma OPENCL FP_CONTRACT OFF\ntypedef {real} real;\n")
        for t in targets:
            parts.append(_GENERATORS.format(to=t.name, fill=convert("value", real, t)))
            if t.key in _RANGE_DTYPES:
                template = _RANGE_REAL if t.is_float else _RANGE_INT
                parts.append(template.format(to=t.name, value=convert("v", real, t)))
    return "".join(parts)


def _real(c: Call, value: float):
    return np.float64(value) if c.fp64 else np.float32(value)


def generate(c: Call, name: str, key: int, y, y_offset: int, n: int, *args) -> None:
    """Runs generator k_<name>_<dtype key's name> over the n elements of y (a
    compact Tensor or device buffer) from y_offset: args between y_off and n."""
    launch_items(c, _source(_real_key(c.fp64), c.fp64), f"k_{name}_{cl_type(key).name}",
                 [y, np.int64(y_offset), *args, np.int64(n)], n)


def fill(c: Call, key: int, y, y_offset: int, n: int, value: float) -> None:
    """n elements of dtype ``key`` = value, converted as Cast converts a real."""
    generate(c, "fill", key, y, y_offset, n, _real(c, value))


def cast(c: Call, key: int) -> None:
    c.expect((1, 1), 1)
    x, y = c.inputs[0], c.outputs[0]
    if y.size == 0:
        return
    launch_items(c, _source(key, c.fp64), f"k_cast_{cl_type(y.dtype).name}",
                 [x, np.int64(x.offset), y, np.int64(y.offset),
                  *walk(c, (x.shape, x.strides), (y.shape, y.strides)), np.int64(y.size)], y.size)


def constant_of_shape(c: Call, key: int) -> None:
    c.expect((0, 0), 1)
    y = c.outputs[0]
    fill(c, y.dtype, y, y.offset, y.size, c.attrs["value"])


def eye_like(c: Call, key: int) -> None:
    """The input's values are never read (its shape is the output's)."""
    c.expect((1, 1), 1)
    y = c.outputs[0]
    if y.size:
        generate(c, "eye", y.dtype, y, y.offset, y.size, np.int64(y.shape[1]),
                 np.int64(c.attrs["k"]))


def range_(c: Call, key: int) -> None:
    c.expect((0, 0), 1)
    y = c.outputs[0]
    start, delta = c.attrs["start"][0], c.attrs["delta"][0]
    if cl_type(key).is_float:
        start, delta = _real(c, start), _real(c, delta)
    else:
        start, delta = np.int64(start), np.int64(delta)
    generate(c, "range", key, y, y.offset, y.size, start, delta)
