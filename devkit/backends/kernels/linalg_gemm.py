"""The tiled matrix product of the linalg family (MatMul, Gemm, Einsum; Conv
and ConvTranspose build on the same tile loop in linalg_conv.py).

A work-group computes a TM x TN tile of Y = op(A) @ op(B): K is walked TK at
a time, each step staging a TM x TK tile of A and a TK x TN tile of B in local
memory, and each of its WM x WN work-items keeps an RM x RN block of the
tile's sums in registers (rows ty + i * WM, columns tx + j * WN, so that
neighbouring work-items read neighbouring local memory). Out-of-range tile
elements load as 0, so the products past K add 0 * 0 and never turn an
infinity into NaN. The tile sizes are fixed per device (build options, see
``tiles``); shapes only ever reach kernels as arguments.

Sums are accumulated in the compute type the spec states: float for
float32, float16 and bfloat16, double for float64, and the unsigned type of
int32/int64 (wrapping around, as the spec's integer MatMul does).

Where tiles would be mostly padding (a few rows or columns per product, many
small batched products) a per-output kernel computes each sum directly.

The lowerings onto the product (Einsum, ConvTranspose) also need strided
gathers, dtype conversions and sums over dims: ``sum_view`` does all three.
"""

from __future__ import annotations

import dataclasses
import functools

import numpy as np

from ...abi import C
from .layer import Call, DeviceLimits, cl_type, launch_items, prelude, round_up


@dataclasses.dataclass(frozen=True)
class Tiles:
    """A work-group of wm x wn work-items, each computing rm x rn sums; K is
    staged tk at a time."""

    wm: int
    wn: int
    rm: int
    rn: int
    tk: int

    @property
    def tm(self) -> int:
        return self.wm * self.rm

    @property
    def tn(self) -> int:
        return self.wn * self.rn

    @property
    def group(self) -> int:
        return self.wm * self.wn

    def local_bytes(self, itemsize: int) -> int:
        return self.tk * (self.tm + self.tn) * itemsize

    def options(self) -> str:
        return f"-DWM={self.wm} -DWN={self.wn} -DRM={self.rm} -DRN={self.rn} -DTK={self.tk}"


# In order of preference; powers of two, so that the work-group divides the
# B tile's columns or the other way round (see SKELETON). On CPU devices
# (PoCL, AVX-512) a 16 x 16 block per work-item in 128 x 256 tiles ran
# 1024^3 float32 in half the time of 8 x 8 blocks in 128 x 128 tiles and of
# CLBlast; GPUs want more work-groups and fewer registers per work-item.
_CPU_TILES = (Tiles(8, 16, 16, 16, 16), Tiles(8, 8, 8, 8, 16), Tiles(4, 4, 4, 4, 8), Tiles(1, 1, 1, 1, 1))
_GPU_TILES = (Tiles(16, 16, 4, 4, 16), Tiles(8, 8, 4, 4, 16), Tiles(4, 4, 2, 2, 8), Tiles(1, 1, 1, 1, 1))

# The compute type tiles and sums are held in, per storage type, and its NumPy scalar.
_COMPUTE = {"float": "float", "double": "double", "half": "float", "ushort": "float",
            "int": "uint", "long": "ulong"}
_SCALAR = {"float": np.float32, "double": np.float64, "uint": np.uint32, "ulong": np.uint64}


@functools.cache
def _tiles_for(limits: DeviceLimits, itemsize: int) -> Tiles:
    sizes = limits.max_item_sizes
    prefer = _CPU_TILES if limits.is_cpu else _GPU_TILES
    for t in prefer:
        if (t.group <= limits.max_group_size and t.wn <= sizes[0] and t.wm <= sizes[1]
                and t.local_bytes(itemsize) <= limits.local_mem_size and t.group <= t.tk * t.tn):
            return t
    raise AssertionError("a 1 x 1 work-group always fits")


def compute_type(key: int) -> str:
    return _COMPUTE[cl_type(key).storage]


def compute_itemsize(key: int) -> int:
    return 8 if compute_type(key) in ("double", "ulong") else 4


def tiles(device, key: int) -> Tiles:
    """The tile sizes of dtype ``key``'s kernels on ``device`` (fixed per device)."""
    return _tiles_for(device.limits, compute_itemsize(key))


def scalar(key: int, value: float):
    """``value`` as a kernel argument of dtype ``key``'s compute type."""
    return _SCALAR[compute_type(key)](value)


def header(key: int, fp64: bool) -> str:
    """The prelude of every linalg product: dtype ``key`` as X (storage, loads
    and stores) and R_t, the type tiles and sums are held in, with the tile
    geometry the build options give."""
    return prelude("X", key, fp64) + f"typedef {compute_type(key)} R_t;\n" + _GEOMETRY


_GEOMETRY = """
#define TM (WM * RM)
#define TN (WN * RN)
#define WG (WM * WN)
/* B tiles: each work-item loads NCOL columns (lid % TN + j * WG) and KPW
 * consecutive rows (from kb = lid / TN * KPW) of each. */
#define NCOL (TN >= WG ? TN / WG : 1)
#define KPW (TN >= WG ? TK : TK * TN / WG)
"""

# The tile loop shared by every tiled product. Hooks: {setup} (per work-item
# set-up, before the first tile), {stage} (per tile, before its loads; it
# ends in a barrier if it writes local memory the loads read), {load_a} (an
# expression of A(m, k) for m < M and k < K, kk = k - k0), {load_b} (a
# statement filling Bs for the tile at k0) and {store} (a statement storing
# acc[i][j] at row m, column n).
SKELETON = """
kernel __attribute__((reqd_work_group_size(WN, WM, 1)))
void {name}({params}) {{
  local R_t As[TK][TM], Bs[TK][TN];
  const int tx = get_local_id(0), ty = get_local_id(1), lid = ty * WN + tx, kb = lid / TN * KPW;
  const long m0 = get_group_id(1) * (long)TM, n0 = get_group_id(0) * (long)TN;
{setup}
  R_t acc[RM][RN];
  for (int i = 0; i < RM; ++i)
    for (int j = 0; j < RN; ++j) acc[i][j] = 0;
  for (long k0 = 0; k0 < K; k0 += TK) {{
{stage}
    for (int l = lid; l < TM * TK; l += WG) {{
      const int kk = l % TK;
      const long m = m0 + l / TK, k = k0 + kk;
      As[kk][l / TK] = m < M && k < K ? {load_a} : 0;
    }}
{load_b}
    barrier(CLK_LOCAL_MEM_FENCE);
    for (int kk = 0; kk < TK; ++kk) {{
      R_t a[RM], b[RN];
      for (int i = 0; i < RM; ++i) a[i] = As[kk][ty + i * WM];
      for (int j = 0; j < RN; ++j) b[j] = Bs[kk][tx + j * WN];
      for (int i = 0; i < RM; ++i)
        for (int j = 0; j < RN; ++j) acc[i][j] += a[i] * b[j];
    }}
    barrier(CLK_LOCAL_MEM_FENCE);
  }}
  for (int i = 0; i < RM; ++i) {{
    const long m = m0 + ty + i * WM;
    for (int j = 0; j < RN; ++j) {{
      const long n = n0 + tx + j * WN;
      if (m < M && n < N) {{
{store}
      }}
    }}
  }}
}}
"""

# ---- the batched strided product ----------------------------------------------------

_GEMM_PARAMS = """global const X_t *a, long a_off, long a_rs, long a_cs,
    global const X_t *b, long b_off, long b_rs, long b_cs,
    global const X_t *c, long c_off, long c_rs, long c_cs, int has_c, R_t alpha, R_t beta,
    global X_t *y, long y_off, long y_rs, long y_cs,
    long M, long N, long K, int nb, global const long *batch"""

_GEMM_COMMON = """
/* The element offsets of batch `i` into A, B and Y: `batch` holds the nb
 * batch sizes, then the batch strides of A, of B and of Y. */
inline void batch_offsets(long i, int nb, global const long *batch, long *ao, long *bo, long *yo) {
  for (int d = nb - 1; d >= 0; --d) {
    const long at = i % batch[d];
    i /= batch[d];
    *ao += at * batch[nb + d];
    *bo += at * batch[2 * nb + d];
    *yo += at * batch[3 * nb + d];
  }
}

/* Gemm's alpha = 0 skips the product (BLAS); beta * C in IEEE arithmetic. */
#define EPILOGUE(sum, m, n) \\
  R_t v = alpha == 0 ? (R_t)0 : alpha * (sum); \\
  if (has_c) v += beta * (R_t)X_load(c, c_off + (m) * c_rs + (n) * c_cs); \\
  X_store(y, yo + (m) * y_rs + (n) * y_cs, v)
"""

_GEMM_TILED = SKELETON.format(
    name="k_gemm", params=_GEMM_PARAMS,
    setup="""  long ao = a_off, bo = b_off, yo = y_off;
  batch_offsets(get_group_id(2), nb, batch, &ao, &bo, &yo);""",
    stage="",
    load_a="(R_t)X_load(a, ao + m * a_rs + k * a_cs)",
    load_b="""    for (int j = 0; j < NCOL; ++j) {
      const int cb = lid % TN + j * WG;
      const long n = n0 + cb;
      for (int t = 0; t < KPW; ++t) {
        const long k = k0 + kb + t;
        Bs[kb + t][cb] = n < N && k < K ? (R_t)X_load(b, bo + k * b_rs + n * b_cs) : 0;
      }
    }""",
    store="        EPILOGUE(acc[i][j], m, n);")

_GEMM_DIRECT = """
/* One work-item per output element (index over batch x M x N). */
kernel void k_gemm_direct(""" + _GEMM_PARAMS + """, long total) {
  long i = get_global_id(0);
  if (i >= total) return;
  const long n = i % N, m = i / N % M;
  long ao = a_off, bo = b_off, yo = y_off;
  batch_offsets(i / N / M, nb, batch, &ao, &bo, &yo);
  R_t sum = 0;
  for (long k = 0; k < K; ++k)
    sum += (R_t)X_load(a, ao + m * a_rs + k * a_cs) * (R_t)X_load(b, bo + k * b_rs + n * b_cs);
  EPILOGUE(sum, m, n);
}
"""


@functools.cache
def _gemm_source(key: int, fp64: bool) -> str:
    return header(key, fp64) + _GEMM_COMMON + _GEMM_TILED + _GEMM_DIRECT


# Tiles are used while their padding at most multiplies the work by 16: on
# PoCL the per-output kernel computes about 16 times fewer products per second
# (measured break-even: 8 x 512 @ 512 x 512 and 67 x 129 @ 129 x 33, each
# padded about 16-fold by 128 x 256 tiles).
_MAX_PADDING = 16.0


def use_tiles(t: Tiles, m: int, n: int) -> bool:
    """Whether an m x n product is better computed in t's tiles than per output."""
    return round_up(m, t.tm) * round_up(n, t.tn) <= _MAX_PADDING * m * n


@dataclasses.dataclass
class Matrix:
    """An operand or result: a buffer, an element offset and the element
    strides of its rows and columns."""

    buffer: object  # a device buffer: a Tensor's, or one the Call made
    offset: int
    rs: int
    cs: int


def gemm(c: Call, key: int, a: Matrix, b: Matrix, y: Matrix, m: int, n: int, k: int,
         batch: list[tuple[int, int, int, int]] = (), alpha: float = 1.0,
         beta: float = 0.0, addend: Matrix | None = None) -> None:
    """Enqueues y = alpha * a @ b (+ beta * addend) for every batch index.

    a is m x k, b is k x n, y and addend (read with its own strides) are m x n;
    ``batch`` lists (size, a stride, b stride, y stride) per batch dim,
    outermost first. Needs m * n > 0 and a non-empty batch."""
    batch = [dim for dim in batch if dim[0] != 1]
    # Trailing batch dims over which B stays the same and A and Y step by whole
    # matrices fold into M: one larger product instead of many thin ones.
    while batch and batch[-1][2] == 0:
        size, sa, _, sy = batch[-1]
        if m == 1:  # a single row has no row stride yet: take the batch step's
            a, y = dataclasses.replace(a, rs=sa), dataclasses.replace(y, rs=sy)
        if sa != m * a.rs or sy != m * y.rs:
            break
        m *= size
        batch.pop()
    if c.library_gemm(key, a, b, y, m, n, k, batch, alpha, beta, addend):
        return
    count = int(np.prod([dim[0] for dim in batch], dtype=np.int64))
    meta = c.buffer([dim[0] for dim in batch] + [dim[j] for j in (1, 2, 3) for dim in batch])
    has_c = addend is not None
    if addend is None:
        addend = Matrix(a.buffer, 0, 0, 0)  # a stand-in, never read
    args = [a.buffer, np.int64(a.offset), np.int64(a.rs), np.int64(a.cs),
            b.buffer, np.int64(b.offset), np.int64(b.rs), np.int64(b.cs),
            addend.buffer, np.int64(addend.offset), np.int64(addend.rs), np.int64(addend.cs),
            np.int32(has_c), scalar(key, alpha), scalar(key, beta),
            y.buffer, np.int64(y.offset), np.int64(y.rs), np.int64(y.cs),
            np.int64(m), np.int64(n), np.int64(k), np.int32(len(batch)), meta]
    t = tiles(c.device, key)
    source = _gemm_source(key, c.fp64)
    if use_tiles(t, m, n):
        c.launch(source, "k_gemm", args,
                 (round_up(n, t.tn) // t.rn, round_up(m, t.tm) // t.rm, count), (t.wn, t.wm, 1),
                 options=t.options())
    else:
        total = count * m * n
        launch_items(c, source, "k_gemm_direct", args + [np.int64(total)], total, t.options(), preferred=64)


# ---- strided views: gathers, conversions and sums ------------------------------------

_SUM_VIEW = """
/* y (compact over the kept dims, or with the strides `meta` gives) = x summed
 * over the summed dims, in X's accumulator type; one work-item per output.
 * meta: the nk kept sizes, their x strides and y strides, then the ns summed
 * sizes and their x strides; `inner` is the product of the summed sizes. */
kernel void k_sum_view(global const X_t *x, long x_off, global Y_t *y, long y_off, int nk, int ns,
                       global const long *meta, long inner, long total) {
  long i = get_global_id(0);
  if (i >= total) return;
  long xo = x_off, yo = y_off;
  for (int d = nk - 1; d >= 0; --d) {
    const long at = i % meta[d];
    i /= meta[d];
    xo += at * meta[nk + d];
    yo += at * meta[2 * nk + d];
  }
  global const long *sizes = meta + 3 * nk, *strides = sizes + ns;
  /* The sum starts from its first term rather than 0: a gather keeps -0.0. */
  X_acc sum = 0;
  for (long s = 0; s < inner; ++s) {
    long rest = s, at = xo;
    for (int d = ns - 1; d >= 0; --d) {
      at += rest % sizes[d] * strides[d];
      rest /= sizes[d];
    }
    sum = s ? sum + X_load(x, at) : X_load(x, at);
  }
  Y_store(y, yo, sum);
}
"""


@functools.cache
def _sum_source(src_key: int, dst_key: int, fp64: bool) -> str:
    return prelude("X", src_key, fp64) + prelude("Y", dst_key, fp64) + _SUM_VIEW


def sum_view(c: Call, src_key: int, src, src_offset: int, kept: list[tuple[int, int, int]],
             summed: list[tuple[int, int]], dst_key: int, dst, dst_offset: int) -> None:
    """Enqueues dst = src summed over ``summed`` ((size, src stride) per dim),
    one element per index of ``kept`` ((size, src stride, dst stride) per dim);
    dtypes convert (rounding once). An empty sum gives 0."""
    total = int(np.prod([dim[0] for dim in kept], dtype=np.int64))
    if total == 0:
        return
    inner = int(np.prod([dim[0] for dim in summed], dtype=np.int64))
    meta = c.buffer([d[j] for j in range(3) for d in kept] + [d[j] for j in range(2) for d in summed])
    launch_items(c, _sum_source(src_key, dst_key, c.fp64), "k_sum_view",
                 [src, np.int64(src_offset), dst, np.int64(dst_offset), np.int32(len(kept)),
                  np.int32(len(summed)), meta, np.int64(inner), np.int64(total)], total, preferred=64)


def work_dtype(key: int) -> int:
    """The dtype a product's intermediate results are kept in: float64 for
    float64, float32 for the other floats (the compute type, so that
    intermediates add no rounding of their own)."""
    return C.DK_DTYPE_FLOAT64 if key == C.DK_DTYPE_FLOAT64 else C.DK_DTYPE_FLOAT32


def scratch(c: Call, key: int, count: int):
    """A device buffer for ``count`` elements of dtype ``key`` (at least one)."""
    return c.scratch(max(count, 1) * cl_type(key).itemsize)


def compact_copy(c: Call, tensor, key: int):
    """A compact copy of ``tensor`` converted to dtype ``key``."""
    buffer = scratch(c, key, tensor.size)
    step, kept = 1, []
    for size, stride in reversed(list(zip(tensor.shape, tensor.strides))):
        kept.insert(0, (size, stride, step))
        step *= size
    sum_view(c, tensor.dtype, tensor.buffer, tensor.offset, kept, [], key, buffer, 0)
    return buffer
