"""What the reduction family's kernel modules share: the work-group size, the
index spaces they view tensors through, and the OpenCL C every template of
the family starts with.

Every kernel of the family walks its input as kept dims (one output, or one
slice, per position) around reduced dims (the reduced axes, or the one axis
an op runs along). The host describes both with a small metadata buffer of
shapes and strides, coalescing dims that are contiguous with each other, so
the kernels honour strided inputs and outputs and a compact tensor reduced
over trailing (or leading) axes becomes a single dim of stride 1.
"""

from __future__ import annotations

import numpy as np

from .layer import Call, Tensor, cl_type, group_size, prelude


def build_options(c: Call) -> str:
    return f"-DWG={group_size(c)}"


def item_per_slice(c: Call, slices: int, length: int) -> bool:
    """Whether a work-item per slice (output, or row along the axis) beats
    a work-group per slice: for short slices, and for slices enough to give
    every compute unit a full work-group of them."""
    wg = group_size(c)
    return length <= wg or slices >= wg * c.device.limits.compute_units


def coalesce(shape: list[int], *strides: list[int]) -> tuple[list[int], list[list[int]]]:
    """``shape`` without its size-1 dims and with each run of dims that are
    contiguous in every one of ``strides`` merged into one dim; returns the
    shape and each stride list over it."""
    merged_shape: list[int] = []
    merged: list[list[int]] = [[] for _ in strides]
    for d, n in enumerate(shape):
        if n == 1:
            continue
        if merged_shape and all(m[-1] == s[d] * n for m, s in zip(merged, strides)):
            merged_shape[-1] *= n
            for m, s in zip(merged, strides):
                m[-1] = s[d]
        else:
            merged_shape.append(n)
            for m, s in zip(merged, strides):
                m.append(s[d])
    return merged_shape, merged


def along_axis(c: Call, x: Tensor, axis: int, outputs: list[tuple[Tensor, bool]]):
    """The metadata buffer of an op along one ``axis`` of ``x``.

    ``outputs`` pairs each output with whether it keeps the axis (as Softmax
    or TopK do; ArgMax with keepdims keeps it as a size-1 dim, which counts
    as not keeping it). The buffer holds the kept dims' shape, then their
    strides in x and in each output, then the axis' stride in x and in each
    output that keeps it. Returns (buffer, number of kept dims, number of
    slices).
    """
    kept = [d for d in range(x.ndim) if d != axis]

    def kept_strides(t: Tensor, keeps_axis: bool) -> list[int]:
        if keeps_axis or t.ndim == x.ndim:
            return [t.strides[d] for d in kept]
        return list(t.strides)

    shape, strides = coalesce([x.shape[d] for d in kept], [x.strides[d] for d in kept],
                              *(kept_strides(t, keeps) for t, keeps in outputs))
    axis_strides = [x.strides[axis]] + [t.strides[axis] for t, keeps in outputs if keeps]
    meta = shape + [s for each in strides for s in each] + axis_strides
    return c.buffer(meta), len(shape), int(np.prod(shape, dtype=np.int64))


_ROUND_ODD = """
/* v rounded to float with round-to-odd (truncate, then set the last bit if
 * anything was dropped): float keeps more than two bits beyond float16's and
 * bfloat16's precision, so the store's rounding to nearest then gives the
 * correctly rounded 16-bit value of v, where double -> float -> 16 bits
 * with two roundings to nearest could round twice. */
inline float dk_round_odd(double v) {
  float f = (float)v;
  if ((double)f == v || isnan(f) || isinf(f)) return f;
  uint bits = as_uint(f);
  if (fabs((double)f) > fabs(v)) bits--;  /* rounded away from zero: take the truncation */
  return as_float(bits | 1u);
}
#define X_put(p, i, v) X_store(p, i, dk_round_odd(v))
"""


def header(key: int, fp64: bool) -> str:
    """The OpenCL C every program of the family starts with: the X prelude
    of dtype ``key``, ``X_put(p, i, v)`` (stores an accumulated value: v
    rounded once into the dtype), ``R_t`` (the widest float type) and the
    dtype's range as ``X_MIN``/``X_MAX`` for integers."""
    t = cl_type(key)
    lines = [prelude("X", key, fp64), f"typedef {'double' if fp64 else 'float'} R_t;"]
    if t.is_float and t.itemsize == 2 and fp64:
        lines.append(_ROUND_ODD)
    else:
        lines.append("#define X_put(p, i, v) X_store(p, i, v)")
    limits = {"int8": ("CHAR_MIN", "CHAR_MAX"), "uint8": ("0", "UCHAR_MAX"),
              "int32": ("INT_MIN", "INT_MAX"), "int64": ("LONG_MIN", "LONG_MAX"), "bool": ("0", "1")}
    if t.name in limits:
        low, high = limits[t.name]
        lines.append(f"#define X_MIN ((long){low})\n#define X_MAX ((long){high})")
    return "\n".join(lines) + "\n"
