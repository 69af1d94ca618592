"""OpenCL kernels of devkit/ops/movement.py.

Most of the ops are one strided copy: Transpose, Slice, Expand, Concat and
Split (a copy per piece) and Tile (over 2r dims: repeat, extent) read the
input through a view whose strides the host composes from the input's own,
so every tensor may be strided. Copies, Pad and the gathers move raw storage
of the element's width: all dtypes share four programs and results are
bit-exact. Only Scatter*'s reductions look at values; they get one program
per dtype.

Indices (int32 or int64; one program reads both) are checked by their own
kernel, which records the first out-of-range position in a small scratch
buffer. Host work queued on the stream after it reads that buffer and fails
the stream with OutOfRangeError naming the index and the bound (on the NULL
stream the call is synchronous and raises). The gather and scatter kernels
skip an out-of-range index, so nothing is read or written out of bounds.
"""

from __future__ import annotations

import functools
import math

import numpy as np

from ... import dtypes
from ...abi import C
from ..support.boundary import PluginError
from .layer import (
    STORAGE_OF_WIDTH,
    STRIDED,
    Call,
    Tensor,
    broadcast_strides,
    cl_type,
    copy,
    launch_items,
    prelude,
    whole,
)

# Per element width: the NumPy scalar passed as the X_t of STORAGE_OF_WIDTH's
# dtype, the OpenCL type of the raw bits.
_SCALAR_OF_WIDTH = {1: np.uint8, 2: np.uint16, 4: np.int32, 8: np.int64}
_BITS_OF_WIDTH = {1: "uchar", 2: "ushort", 4: "uint", 8: "ulong"}

# k_check_indices records positions as uint offsets from its launch's base.
_CHUNK = 1 << 31
_NO_ERROR = 0xFFFFFFFF

_PAD_MODES = {"constant": 0, "reflect": 1, "edge": 2, "wrap": 3}
_REDUCTIONS = {"none": 0, "add": 1, "mul": 2, "max": 3, "min": 4}

_INDEX = """
/* Element i of an int32 (wide == 0) or int64 index tensor: one program reads both. */
inline long dk_index(global const int *p, int wide, long i) {
  return wide ? ((global const long *)p)[i] : (long)p[i];
}
"""

_MOVE = _INDEX + """
/* meta: the output's shape and strides, x's strides, the begin pads and the
 * kept (cropped) size of each dim; x_off is the first kept element. */
kernel void k_pad(global const X_t *x, long x_off, global X_t *y, long y_off, int ndim,
                  global const long *meta, X_t fill, int mode, long n) {
  long i = get_global_id(0);
  if (i >= n) return;
  long rest = i, yo = y_off, xo = x_off;
  bool outside = false;
  for (int d = ndim - 1; d >= 0; --d) {
    long k = rest % meta[d];
    rest /= meta[d];
    yo += k * meta[ndim + d];
    long kept = meta[4 * ndim + d], j = k - meta[3 * ndim + d];
    if (j < 0 || j >= kept) {
      if (mode == 0) {          /* constant */
        outside = true;
      } else if (mode == 1) {   /* reflect: period 2 (kept - 1), the edges not repeated */
        long period = 2 * (kept - 1);
        j = period == 0 ? 0 : j % period;
        if (j < 0) j += period;
        if (j >= kept) j = period - j;
      } else if (mode == 2) {   /* edge */
        j = j < 0 ? 0 : kept - 1;
      } else {                  /* wrap */
        j %= kept;
        if (j < 0) j += kept;
      }
    }
    xo += j * meta[2 * ndim + d];
  }
  y[yo] = outside ? fill : x[xo];
}

/* Gather, GatherElements, GatherND. meta: the output's shape, then the
 * output's, x's and the indices' strides over it (x's 0 along the dims the
 * indices pick, the indices' 0 along x's own). The `depth` indices at
 * io + k * i_step pick a coordinate of x's k-th indexed dim: axes holds the
 * dims' sizes, then their strides. */
kernel void k_gather(global const X_t *x, long x_off, global const int *ix, long i_off, int wide,
                     global X_t *y, long y_off, int ndim, global const long *meta, int depth,
                     global const long *axes, long i_step, long n) {
  long i = get_global_id(0);
  if (i >= n) return;
  long rest = i, yo = y_off, xo = x_off, io = i_off;
  for (int d = ndim - 1; d >= 0; --d) {
    long k = rest % meta[d];
    rest /= meta[d];
    yo += k * meta[ndim + d];
    xo += k * meta[2 * ndim + d];
    io += k * meta[3 * ndim + d];
  }
  for (int k = 0; k < depth; ++k) {
    long bound = axes[k], v = dk_index(ix, wide, io + k * i_step);
    if (v < 0) v += bound;
    if (v < 0 || v >= bound) return;  /* k_check_indices reports it */
    xo += v * axes[depth + k];
  }
  y[yo] = x[xo];
}

/* Lowers first[slot] to the position (from base) of every index outside
 * [-bound, bound), bound = bounds[position % depth]. meta: the indices'
 * shape, then strides. */
kernel void k_check_indices(global const int *ix, long i_off, int wide, int ndim,
                            global const long *meta, int depth, global const long *bounds,
                            long base, long n, global uint *first, int slot) {
  long g = get_global_id(0);
  if (g >= n) return;
  long e = base + g;
  long v = dk_index(ix, wide, i_off + dk_offset(e, ndim, meta, meta + ndim));
  long bound = bounds[e % depth];
  if (v < -bound || v >= bound) atomic_min(first + slot, (uint)g);
}
"""

_SCATTER = _INDEX + """
/* NumPy's semantics: integers wrap (through X_U), max/min let a NaN win. On
 * bool (0/1) the integer forms are or/and once X_store maps nonzero to 1. */
#if X_IS_FLOAT
#define DK_ADD(a, b) ((a) + (b))
#define DK_MUL(a, b) ((a) * (b))
#define DK_MAX(a, b) (((a) >= (b) || isnan(a)) ? (a) : (b))
#define DK_MIN(a, b) (((a) <= (b) || isnan(a)) ? (a) : (b))
#else
#define DK_ADD(a, b) ((X_U)((X_U)(a) + (X_U)(b)))
#define DK_MUL(a, b) ((X_U)((X_U)(a) * (X_U)(b)))
#define DK_MAX(a, b) ((a) >= (b) ? (a) : (b))
#define DK_MIN(a, b) ((a) <= (b) ? (a) : (b))
#endif

/* ScatterElements and ScatterND, on a y that already holds data. Work-item w
 * owns every target its updates can reach (no other work-item's indices
 * address them) and applies its n_seq updates in row-major order, so
 * duplicate indices combine in the order the cpu plugin uses and "none"
 * keeps the last. meta: the work-items' shape (np dims) and their y, index
 * and update strides; the sequence's shape (ns dims) and its index and
 * update strides. axes and i_step as for k_gather, axes' strides in y. */
kernel void k_scatter(global X_t *y, long y_off, global const int *ix, long i_off, int wide,
                      global const X_t *u, long u_off, int np, int ns, global const long *meta,
                      int depth, global const long *axes, long i_step, int reduction,
                      long n_par, long n_seq) {
  long w = get_global_id(0);
  if (w >= n_par) return;
  long rest = w, yb = y_off, ib = i_off, ub = u_off;
  for (int d = np - 1; d >= 0; --d) {
    long k = rest % meta[d];
    rest /= meta[d];
    yb += k * meta[np + d];
    ib += k * meta[2 * np + d];
    ub += k * meta[3 * np + d];
  }
  global const long *seq = meta + 4 * np;
  for (long s = 0; s < n_seq; ++s) {
    long r = s, io = ib, uo = ub, yo = yb;
    for (int d = ns - 1; d >= 0; --d) {
      long k = r % seq[d];
      r /= seq[d];
      io += k * seq[ns + d];
      uo += k * seq[2 * ns + d];
    }
    bool in_range = true;
    for (int k = 0; k < depth; ++k) {
      long bound = axes[k], v = dk_index(ix, wide, io + k * i_step);
      if (v < 0) v += bound;
      in_range = in_range && v >= 0 && v < bound;  /* k_check_indices reports it */
      yo += v * axes[depth + k];
    }
    if (!in_range) continue;
    if (reduction == 0) {  /* none: the update's bits (half has no loads of its own) */
      ((global X_bits *)y)[yo] = ((global const X_bits *)u)[uo];
      continue;
    }
    X_ct a = X_load(y, yo), b = X_load(u, uo);
    switch (reduction) {
      case 1: X_store(y, yo, DK_ADD(a, b)); break;
      case 2: X_store(y, yo, DK_MUL(a, b)); break;
      case 3: X_store(y, yo, DK_MAX(a, b)); break;
      default: X_store(y, yo, DK_MIN(a, b)); break;
    }
  }
}
"""


@functools.cache
def _move_source(itemsize: int) -> str:
    return prelude("X", STORAGE_OF_WIDTH[itemsize], False) + _MOVE


@functools.cache
def _scatter_source(key: int, fp64: bool) -> str:
    bits = _BITS_OF_WIDTH[cl_type(key).itemsize]
    return prelude("X", key, fp64) + f"typedef {bits} X_bits;\n" + _SCATTER


def _itemsize(t: Tensor) -> int:
    return cl_type(t.dtype).itemsize


def _axis(c: Call, rank: int) -> int:
    axis = c.attrs.get("axis", 0)
    return axis + rank if axis < 0 else axis


# ---- strided copies (layer.copy) ----------------------------------------------------------


def _transpose(c: Call, key: int) -> None:
    c.expect((1, 1), 1)
    x, y = c.inputs[0], c.outputs[0]
    perm = c.attrs.get("perm", list(reversed(range(x.ndim))))
    copy(c, x, (x.offset, y.shape, [x.strides[p] for p in perm]), y, whole(y))


def _slice(c: Call, key: int) -> None:
    """Only where each dim starts and its step matter: the output's shape
    already holds the counts the host derived from the ends."""
    c.expect((1, 1), 1)
    x, y = c.inputs[0], c.outputs[0]
    if y.size == 0:
        return
    starts = c.attrs["starts"]
    axes = c.attrs.get("axes", list(range(len(starts))))
    steps = c.attrs.get("steps", [1] * len(starts))
    first, step = [0] * x.ndim, [1] * x.ndim
    for axis, start, by in zip(axes, starts, steps):
        axis += x.ndim if axis < 0 else 0
        dim = x.shape[axis]
        start += dim if start < 0 else 0
        # ONNX clamps to [0, dim] going forward and to [0, dim - 1] going back.
        first[axis] = min(max(start, 0), dim if by > 0 else dim - 1)
        step[axis] = by
    offset = x.offset + sum(f * s for f, s in zip(first, x.strides))
    # A dim of one element never steps (its step may be INT64_MAX).
    strides = [s * k if n > 1 else 0 for s, k, n in zip(x.strides, step, y.shape)]
    copy(c, x, (offset, y.shape, strides), y, whole(y))


def _expand(c: Call, key: int) -> None:
    c.expect((1, 1), 1)
    x, y = c.inputs[0], c.outputs[0]
    copy(c, x, (x.offset, y.shape, broadcast_strides(x, y.shape)), y, whole(y))


def _concat(c: Call, key: int) -> None:
    c.expect((1, max(1, len(c.inputs))), 1)  # variadic: any count but 0
    y = c.outputs[0]
    axis = _axis(c, y.ndim)
    at = 0
    for x in c.inputs:
        copy(c, x, whole(x), y, (y.offset + at * y.strides[axis], x.shape, y.strides))
        at += x.shape[axis]


def _split(c: Call, key: int) -> None:
    c.expect((1, 1), max(1, len(c.outputs)))  # variadic outputs: any count but 0
    x = c.inputs[0]
    axis = _axis(c, x.ndim)
    at = 0
    for y in c.outputs:
        copy(c, x, (x.offset + at * x.strides[axis], y.shape, x.strides), y, whole(y))
        at += y.shape[axis]


def _tile(c: Call, key: int) -> None:
    """Output dim d of n * r elements, seen as dims (r, n): x is read with
    strides (0, its own), y written with (n * its own, its own)."""
    c.expect((1, 1), 1)
    x, y = c.inputs[0], c.outputs[0]
    if y.size == 0:
        return
    shape, src, dst = [], [], []
    for n, m, xs, ys in zip(x.shape, y.shape, x.strides, y.strides):
        shape += [m // n, n]
        src += [0, xs]
        dst += [n * ys, ys]
    copy(c, x, (x.offset, shape, src), y, (y.offset, shape, dst))


# ---- Pad ------------------------------------------------------------------------------------


def _storage_bits(value: float, key: int):
    """``value`` in dtype ``key``'s storage, as the kernel's X_t scalar."""
    t = cl_type(key)
    dtype = dtypes.bfloat16 if key == C.DK_DTYPE_BFLOAT16 else np.dtype(t.name)
    if t.kind == "bool":
        value = value != 0
    elif not t.is_float:
        value = int(value)
    return np.array(value, dtype).view(_SCALAR_OF_WIDTH[t.itemsize])[()]


def _pad(c: Call, key: int) -> None:
    c.expect((1, 1), 1)
    x, y = c.inputs[0], c.outputs[0]
    if y.size == 0:
        return
    pads = c.attrs["pads"]
    axes = [a + x.ndim if a < 0 else a for a in c.attrs.get("axes", range(x.ndim))]
    begin = [0] * x.ndim
    for i, axis in enumerate(axes):
        begin[axis] = pads[i]
    # Negative pads crop: x is read from the first kept element on.
    crop = [max(0, -b) for b in begin]
    end = [m - n - b for n, m, b in zip(x.shape, y.shape, begin)]
    kept = [n - c0 - max(0, -e) for n, c0, e in zip(x.shape, crop, end)]
    offset = x.offset + sum(c0 * s for c0, s in zip(crop, x.strides))
    meta = c.buffer(y.shape + y.strides + x.strides + [max(0, b) for b in begin] + kept)
    constant = c.attrs.get("constant_value", [0])[0]
    launch_items(c, _move_source(_itemsize(y)), "k_pad",
                 [x, np.int64(offset), y, np.int64(y.offset), np.int32(y.ndim), meta,
                  _storage_bits(constant, key), np.int32(_PAD_MODES[c.attrs["mode"]]),
                  np.int64(y.size)], y.size)


# ---- indices: Gather*, Scatter* -------------------------------------------------------------


def _wide(indices: Tensor) -> np.int32:
    return np.int32(indices.dtype == C.DK_DTYPE_INT64)


def _check_indices(c: Call, indices: Tensor, bounds: list[int], first_axis: int,
                   itemsize: int) -> None:
    """Queues the range check of every index: element e must lie in
    [-bound, bound) for bound = bounds[e % len(bounds)], the size of data
    axis first_axis + e % len(bounds). The first failure (in row-major order)
    is reported in stream order. ``itemsize`` picks the program that the
    op's own kernels come from."""
    n = indices.size
    if n == 0:
        return
    depth = len(bounds)
    chunks = -(-n // _CHUNK)
    first = c.buffer(np.full(chunks, _NO_ERROR, np.uint32), np.uint32, writable=True)
    meta = c.buffer(indices.shape + indices.strides)
    bounds_buffer = c.buffer(bounds)
    for slot, base in enumerate(range(0, n, _CHUNK)):
        count = min(_CHUNK, n - base)
        launch_items(c, _move_source(itemsize), "k_check_indices",
                     [indices, np.int64(indices.offset), _wide(indices), np.int32(indices.ndim), meta,
                      np.int32(depth), bounds_buffer, np.int64(base), np.int64(count), first,
                      np.int32(slot)], count)

    def report(reader) -> PluginError | None:
        found = np.empty(chunks, np.uint32)
        reader.read(found, first)
        hits = np.flatnonzero(found != _NO_ERROR)
        if hits.size == 0:
            return None
        # Re-armed for the next run of a captured graph, which replays the
        # check on this same buffer: a failure must not outlive its launch.
        reader.write(first, np.full(chunks, _NO_ERROR, np.uint32))
        position = int(hits[0]) * _CHUNK + int(found[hits[0]])
        at = sum(int(k) * s for k, s in zip(np.unravel_index(position, indices.shape),
                                            indices.strides))
        value = np.empty(1, np.int64 if _wide(indices) else np.int32)
        reader.read(value, indices.buffer, (indices.offset + at) * value.itemsize)
        dim = bounds[position % depth]
        return PluginError(C.DK_OUT_OF_RANGE,
                           f"{c.op}: index {int(value[0])} (element {position} of indices) is out "
                           f"of range for axis {first_axis + position % depth} of size {dim}: "
                           f"valid indices are in [{-dim}, {dim})")

    c.check_in_stream_order(report)


def _gather(c: Call, x: Tensor, indices: Tensor, x_strides: list[int], i_strides: list[int],
            first_axis: int, depth: int, i_step: int) -> None:
    """y[i] = x at the view ``x_strides`` of i, moved along x's dims
    first_axis .. first_axis + depth by the indices that ``i_strides`` and
    ``i_step`` locate (see k_gather)."""
    y = c.outputs[0]
    dims = x.shape[first_axis:first_axis + depth]
    _check_indices(c, indices, dims, first_axis, _itemsize(x))
    if y.size == 0:
        return
    meta = c.buffer(y.shape + y.strides + x_strides + i_strides)
    axes = c.buffer(dims + x.strides[first_axis:first_axis + depth])
    launch_items(c, _move_source(_itemsize(x)), "k_gather",
                 [x, np.int64(x.offset), indices, np.int64(indices.offset), _wide(indices), y,
                  np.int64(y.offset), np.int32(y.ndim), meta, np.int32(depth), axes,
                  np.int64(i_step), np.int64(y.size)], y.size)


def _gather_axis(c: Call, key: int) -> None:
    """Gather: output dims are x's before axis, the indices', x's after axis."""
    c.expect((2, 2), 1)
    x, indices = c.inputs
    axis = _axis(c, x.ndim)
    before, after = axis, x.ndim - 1 - axis
    _gather(c, x, indices, x.strides[:axis] + [0] * indices.ndim + x.strides[axis + 1:],
            [0] * before + indices.strides + [0] * after, axis, 1, 0)


def _gather_elements(c: Call, key: int) -> None:
    c.expect((2, 2), 1)
    x, indices = c.inputs
    axis = _axis(c, x.ndim)
    x_strides = list(x.strides)
    x_strides[axis] = 0
    _gather(c, x, indices, x_strides, indices.strides, axis, 1, 0)


def _gather_nd(c: Call, key: int) -> None:
    """Output dims are the indices' but the last (the first batch_dims of
    them x's too), then x's after the depth indexed ones."""
    c.expect((2, 2), 1)
    x, indices = c.inputs
    b, depth = c.attrs.get("batch_dims", 0), indices.shape[-1]
    tuples, tail = indices.ndim - 1, x.ndim - b - depth
    _gather(c, x, indices, x.strides[:b] + [0] * (tuples - b) + x.strides[b + depth:],
            indices.strides[:-1] + [0] * tail, b, depth, indices.strides[-1])


def _scatter(c: Call, key: int, parallel: list[int], strides: tuple[list[int], ...],
             sequence: list[int], seq_strides: tuple[list[int], list[int]], first_axis: int,
             depth: int, i_step: int) -> None:
    """y = x, then the updates applied (see k_scatter): one work-item per
    index of ``parallel`` (with y, index and update ``strides``), each
    walking ``sequence`` (with index and update ``seq_strides``)."""
    x, indices, updates = c.inputs
    y = c.outputs[0]
    dims = x.shape[first_axis:first_axis + depth]
    _check_indices(c, indices, dims, first_axis, _itemsize(x))
    copy(c, x, whole(x), y, whole(y))
    n_par, n_seq = math.prod(parallel), math.prod(sequence)
    if n_par == 0 or n_seq == 0:
        return
    meta = c.buffer([v for part in (parallel, *strides, sequence, *seq_strides) for v in part])
    axes = c.buffer(dims + y.strides[first_axis:first_axis + depth])
    launch_items(c, _scatter_source(key, c.fp64), "k_scatter",
                 [y, np.int64(y.offset), indices, np.int64(indices.offset), _wide(indices), updates,
                  np.int64(updates.offset), np.int32(len(parallel)), np.int32(len(sequence)), meta,
                  np.int32(depth), axes, np.int64(i_step),
                  np.int32(_REDUCTIONS[c.attrs.get("reduction", "none")]), np.int64(n_par),
                  np.int64(n_seq)], n_par)


def _scatter_elements(c: Call, key: int) -> None:
    """A work-item per line of the indices along axis: only its own indices
    address the outputs of its line."""
    c.expect((3, 3), 1)
    x, indices, updates = c.inputs
    y = c.outputs[0]
    axis = _axis(c, x.ndim)
    lines = list(indices.shape)
    lines[axis] = 1
    _scatter(c, key, lines, (y.strides, indices.strides, updates.strides),
             [indices.shape[axis]], ([indices.strides[axis]], [updates.strides[axis]]), axis, 1, 0)


def _scatter_nd(c: Call, key: int) -> None:
    """A work-item per element of the slices (x.shape[depth:]) walks every
    index tuple: any two tuples may address the same slice."""
    c.expect((3, 3), 1)
    x, indices, updates = c.inputs
    y = c.outputs[0]
    depth, tuples = indices.shape[-1], indices.ndim - 1
    tail = x.ndim - depth
    _scatter(c, key, x.shape[depth:], (y.strides[depth:], [0] * tail, updates.strides[tuples:]),
             indices.shape[:-1], (indices.strides[:-1], updates.strides[:tuples]), 0, depth,
             indices.strides[-1])


UNCLAIMED: dict[tuple[str, str], str] = {}

_KERNELS = {
    "Concat": _concat, "Expand": _expand, "Gather": _gather_axis,
    "GatherElements": _gather_elements, "GatherND": _gather_nd, "Pad": _pad,
    "ScatterElements": _scatter_elements, "ScatterND": _scatter_nd, "Slice": _slice,
    "Split": _split, "Tile": _tile, "Transpose": _transpose,
}


def register(table) -> None:
    for op, run in _KERNELS.items():
        table.claim(op, run, STRIDED, UNCLAIMED)
