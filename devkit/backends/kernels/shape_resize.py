"""Resize (ONNX opset 19), as devkit/ops/shape.py specifies it.

The host derives the geometry (per-dim scale, roi, output shape) from the
host inputs with the spec's own _resize_geometry: O(rank) metadata. On the
device each output position maps to an input coordinate by the
coordinate_transformation_mode, computed in double (float without fp64)
operation for operation as the reference does, with contraction into fma
off so the rounding matches.

- nearest: one work-item per output element gathers one input element
  (bits copied, exact for every dtype); tf_crop_and_resize positions outside
  the input take extrapolation_value, converted once by the fill generator.
- linear / cubic: separable, one pass per resized dim in the order of axes,
  each a work-item per element of the pass's output: the weighted sum of
  the taps along the dim (indices clamped to the edge, weight-0 taps
  skipped), in the real type between passes; the last pass rounds once to
  the output dtype (integers half to even, saturated).
"""

from __future__ import annotations

import functools
import math

import numpy as np

from ...ops.shape import _COORDINATE_MODES, _resize_geometry
from ..support.boundary import invalid
from .layer import STORAGE_OF_WIDTH, Call, cl_type, launch_items, prelude
from .shape_cast import fill
from .shape_kit import (
    ROUND_TO_ODD,
    ROUND_TO_ODD_DOUBLE,
    convert,
    real_type,
)

_NEAREST_MODES = ("round_prefer_floor", "round_prefer_ceil", "floor", "ceil")
_TF_CROP_AND_RESIZE = _COORDINATE_MODES.index("tf_crop_and_resize")

_COMMON = """
#pragma OPENCL FP_CONTRACT OFF
typedef {real} real;

/* Output position y of a resized dim -> input coordinate; *outside marks
 * tf_crop_and_resize positions beyond the input. width is ONNX's
 * length_resized, scale * n_in (fractional). Modes in the order of the
 * spec's _COORDINATE_MODES. */
inline real dk_coordinate(int mode, real y, real scale, long n_in, long n_out, real roi_start,
                          real roi_end, bool *outside) {{
  real width = scale * (real)n_in, center_of_pixel = (real)0.5;
  *outside = false;
  switch (mode) {{
    case 0: return (y + center_of_pixel) / scale - center_of_pixel;
    case 1: {{
      real adjustment = (real)n_out / width, center = (real)n_in / 2;
      real offset = center * (1 - adjustment);
      return offset + (y + center_of_pixel) / scale - center_of_pixel;
    }}
    case 2: return width > 1 ? (y + center_of_pixel) / scale - center_of_pixel : 0;
    case 3: return width != 1 ? y * (real)(n_in - 1) / (width - 1) : 0;
    case 4: return y / scale;
    default: {{
      real x = width != 1 ? y * (roi_end - roi_start) * (real)(n_in - 1) / (width - 1)
                          : (roi_end - roi_start) * (real)(n_in - 1) / 2;
      x = x + roi_start * (real)(n_in - 1);
      *outside = !(x >= 0 && x <= (real)(n_in - 1));
      return x;
    }}
  }}
}}

/* An index-like real clamped into [lo, hi] before it becomes a long (NaN -> lo). */
inline long dk_clamped_index(real v, long lo, long hi) {{
  return v >= (real)hi ? hi : v >= (real)lo ? (long)v : lo;
}}

/* dims: per dim n_in, n_out, the input's stride, resized (0/1); geometry:
 * per dim scale, roi start, roi end. */
kernel void k_nearest(global const W_t *x, long x_off, global W_t *y, long y_off,
                      global const W_t *fill, int rank, global const long *dims,
                      global const real *geometry, int mode, int rounding, long n) {{
  long o = get_global_id(0);
  if (o >= n) return;
  long rest = o, offset = x_off;
  bool outside = false;
  for (int d = rank - 1; d >= 0; --d) {{
    global const long *dim = dims + 4 * d;
    long j = rest % dim[1];
    rest /= dim[1];
    if (dim[3]) {{
      bool beyond;
      global const real *g = geometry + 3 * d;
      real v = dk_coordinate(mode, (real)j, g[0], dim[0], dim[1], g[1], g[2], &beyond);
      real below = floor(v), fraction = v - below;
      bool up = rounding == 0 ? fraction > (real)0.5 : rounding == 1 ? fraction >= (real)0.5
                : rounding == 3 && fraction > 0;
      outside |= beyond;
      j = dk_clamped_index(below + up, 0, dim[0] - 1);
    }}
    offset += j * dim[2];
  }}
  y[y_off + o] = outside ? fill[0] : x[offset];
}}

inline real dk_filter(int cubic, real x, real a) {{
  x = fabs(x);
  if (!cubic) return clamp(1 - x, (real)0, (real)1);
  real x2 = x * x, x3 = x * x2;
  if (x <= 1) return (a + 2) * x3 - (a + 3) * x2 + 1;
  if (x < 2) return a * x3 - 5 * a * x2 + 8 * a * x - 4 * a;
  return 0;
}}

/* Weight of tap t (from `first` past the left neighbour, which the
 * coordinate lies `ratio` in (0, 1] past), before exclude_outside; antialias
 * weights are the filter's divided by `filter_total`, the sum over the taps. */
inline real dk_weight(int cubic, int antialias, real stretch, real a, long first, long t,
                      real ratio, real filter_total) {{
  if (antialias) return dk_filter(cubic, ((real)(first + t) - ratio) * stretch, a) / filter_total;
  if (!cubic) return t == 0 ? 1 - ratio : ratio;
  real r1 = ratio + 1, q = 1 - ratio, q1 = (1 - ratio) + 1;
  switch (t) {{
    case 0: return ((a * r1 - 5 * a) * r1 + 8 * a) * r1 - 4 * a;
    case 1: return ((a + 2) * ratio - (a + 3)) * ratio * ratio + 1;
    case 2: return ((a + 2) * q - (a + 3)) * q * q + 1;
    default: return ((a * q1 - 5 * a) * q1 + 8 * a) * q1 - 4 * a;
  }}
}}
"""

# One pass along `axis`: shape is the pass's output shape, strides the
# source's (element strides, rank each). A source X is read through X_load,
# a real one directly; the last pass stores X.
_PASS = """
kernel void k_{name}(global const {src_t} *src, long src_off, global {dst_t} *dst, long dst_off,
                     int rank, global const long *shape, global const long *strides, int axis,
                     long n_in, real scale, real roi_start, real roi_end, int mode, int cubic,
                     int antialias, int exclude_outside, real a, long first, long count,
                     real extrapolation, long n) {{
  long o = get_global_id(0);
  if (o >= n) return;
  long rest = o, base = src_off, j = 0;
  for (int d = rank - 1; d >= 0; --d) {{
    long k = rest % shape[d];
    rest /= shape[d];
    if (d == axis) j = k;
    else base += k * strides[d];
  }}
  long step = strides[axis];
  bool outside;
  real v = dk_coordinate(mode, (real)j, scale, n_in, shape[axis], roi_start, roi_end, &outside);
  if (outside) {{
    v = extrapolation;
  }} else {{
    real below = floor(v), left = v == below ? v - 1 : below, ratio = v - left;
    real stretch = scale < 1 ? scale : 1;
    /* Far beyond the edges every tap clamps to the same element: clamping
     * left there changes nothing but keeps the conversion defined. */
    long start = dk_clamped_index(left, -count - 1, n_in + count + 1) + first;
    real filter_total = 0, total = 0;
    if (antialias)
      for (long t = 0; t < count; ++t)
        filter_total = filter_total + dk_filter(cubic, ((real)(first + t) - ratio) * stretch, a);
    if (exclude_outside)
      for (long t = 0; t < count; ++t)
        if (start + t >= 0 && start + t < n_in)
          total = total + dk_weight(cubic, antialias, stretch, a, first, t, ratio, filter_total);
    v = 0;
    for (long t = 0; t < count; ++t) {{
      real w = dk_weight(cubic, antialias, stretch, a, first, t, ratio, filter_total);
      if (exclude_outside) {{
        if (start + t < 0 || start + t >= n_in) continue;
        if (total != 0) w = w / total;
      }}
      if (w == 0) continue;
      long index = clamp(start + t, 0L, n_in - 1);
      v += w * {load};
    }}
  }}
  {store};
}}
"""


@functools.cache
def _source(key: int, fp64: bool) -> str:
    t = cl_type(key)
    real = real_type(fp64)
    # W: the element's bits, which nearest copies exactly.
    parts = [prelude("X", key, fp64), prelude("W", STORAGE_OF_WIDTH[t.itemsize], False),
             ROUND_TO_ODD, ROUND_TO_ODD_DOUBLE if fp64 else "", _COMMON.format(real=real)]
    rounded = "v" if t.is_float else "rint(v)"  # integers: half to even, then saturated
    store_x = f"X_store(dst, dst_off + o, {convert(rounded, real, t)})"
    for name, src_t, load in (("from_x", "X_t", "(real)X_load(src, base + index * step)"),
                              ("from_real", "real", "src[base + index * step]")):
        for suffix, dst_t, store in (("", "real", "dst[dst_off + o] = v"),
                                     ("_last", "X_t", store_x)):
            parts.append(_PASS.format(name=name + suffix, src_t=src_t, dst_t=dst_t, load=load,
                                      store=store))
    return "".join(parts)


def _given(c: Call, name: str):
    """A host input's values, None when omitted or empty (ONNX's way to omit one)."""
    values = c.attrs.get(name)
    return values if values else None


def resize(c: Call, key: int) -> None:
    c.expect((1, 4), 1)
    x, y = c.inputs[0], c.outputs[0]
    if y.size == 0:
        return
    if x.size == 0:
        raise invalid("cannot resize an empty input to a non-empty output")
    attrs = c.attrs
    axes, scale, out_shape, starts, ends = _resize_geometry(
        x.shape, _given(c, "roi"), _given(c, "scales"), _given(c, "sizes"), attrs)
    if list(out_shape) != y.shape:
        raise invalid(f"output shape {y.shape} is not the resized shape {list(out_shape)}")
    mode = _COORDINATE_MODES.index(attrs["coordinate_transformation_mode"])
    source = _source(key, c.fp64)
    real = np.float64 if c.fp64 else np.float32
    if attrs["mode"] == "nearest":
        _nearest(c, key, source, real, axes, scale, starts, ends, mode)
    else:
        _interpolate(c, source, real, axes, scale, starts, ends, mode)


def _nearest(c: Call, key: int, source: str, real, axes, scale, starts, ends, mode: int) -> None:
    x, y = c.inputs[0], c.outputs[0]
    dims = [v for d in range(x.ndim) for v in (x.shape[d], y.shape[d], x.strides[d], d in axes)]
    geometry = [v for d in range(x.ndim) for v in (scale[d], starts[d], ends[d])]
    if mode == _TF_CROP_AND_RESIZE:
        value = c.attrs["extrapolation_value"]
        if not cl_type(key).is_float:
            value = float(np.rint(value))  # integers take it rounded half to even
        fill_element = c.scratch(cl_type(key).itemsize)
        fill(c, key, fill_element, 0, 1, value)
    else:
        fill_element = x.buffer  # never read: no position falls outside
    launch_items(c, source, "k_nearest",
                 [x, np.int64(x.offset), y, np.int64(y.offset), fill_element, np.int32(x.ndim),
                  c.buffer(dims), c.buffer(geometry, real), np.int32(mode),
                  np.int32(_NEAREST_MODES.index(c.attrs["nearest_mode"])), np.int64(y.size)], y.size)


def _interpolate(c: Call, source: str, real, axes, scale, starts, ends, mode: int) -> None:
    """A pass per resized dim. A linear pass of scale 1 (tf_crop_and_resize
    aside) maps every position onto itself, ratio 1: its weights are exactly
    (0, 1), each element comes through unchanged, and the pass is skipped.
    (Cubic weights at ratio 1 are 0 and 1 only up to rounding for some
    cubic_coeff_a: those passes run.) Should every pass be skipped, the last
    still runs: it converts and stores."""
    x, y = c.inputs[0], c.outputs[0]
    attrs = c.attrs
    cubic, antialias = attrs["mode"] == "cubic", attrs["antialias"]
    passes = [a for a in axes if cubic or scale[a] != 1 or mode == _TF_CROP_AND_RESIZE] or axes[-1:]
    support = 2 if cubic else 1
    shape = list(x.shape)
    src, src_offset, strides = x, x.offset, x.strides
    for i, axis in enumerate(passes):
        last = i == len(passes) - 1
        first = 1 - support
        if antialias:
            first = math.floor(-support / min(scale[axis], 1.0)) + 1
        n_in, shape[axis] = shape[axis], y.shape[axis]
        n = int(np.prod(shape, dtype=np.int64))
        if last:
            dst, dst_offset = y, y.offset
        else:
            dst, dst_offset = c.scratch(n * np.dtype(real).itemsize), 0
        name = ("k_from_x" if src is x else "k_from_real") + ("_last" if last else "")
        launch_items(c, source, name,
                     [src, np.int64(src_offset), dst, np.int64(dst_offset), np.int32(len(shape)),
                      c.buffer(shape), c.buffer(strides), np.int32(axis), np.int64(n_in),
                      real(scale[axis]), real(starts[axis]), real(ends[axis]), np.int32(mode),
                      np.int32(cubic), np.int32(antialias), np.int32(attrs["exclude_outside"]),
                      real(attrs["cubic_coeff_a"]), np.int64(first), np.int64(2 - 2 * first),
                      real(attrs["extrapolation_value"]), np.int64(n)], n)
        src, src_offset = dst, 0
        strides = [int(np.prod(shape[d + 1:], dtype=np.int64)) for d in range(len(shape))]
