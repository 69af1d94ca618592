/*
 * linalg_pool.c -- MaxPool, AveragePool, GlobalMaxPool, GlobalAveragePool.
 *
 * Windows are clipped to the input per axis (the padding is never read);
 * sums are taken in float64 (a float32 sum of mixed signs can cancel to
 * more than AveragePool's 1 ulp). NaN propagates (see devkit/ops/linalg.py).
 * float16/bfloat16 run as float32, which is exact for the maxima.
 */
#include "linalg.h"

#include <stdlib.h>

/* ---- Windowed pools: one output row at a time -------------------------------- */

/* The pools walk the output one row (last axis) at a time. A row's window
 * rows -- the valid taps of the other axes -- are visited in row-major tap
 * order; for each, every tap t of the last axis updates the row's outputs o
 * in the range where o * stride - pad + t * dilation lies inside the input,
 * a contiguous (or strided) loop with no bounds test, which the compiler
 * vectorises. Per output position the taps still arrive in row-major order,
 * so "the first maximum wins" holds. Work splits over (plane, output row).
 *
 * Common last-axis windows (2 or 3 taps, stride 1 or 2, no dilation) take
 * the row's interior columns -- those whose every tap lies inside X -- in
 * one pass per window row that folds all its taps, in tap order, with the
 * tap count and stride constant: one load and store of the outputs per
 * window row instead of per tap. The border columns keep the per-tap loops,
 * so each position still sees its taps in the same order (the same bits). */
typedef struct pool_job {
  const linalg_window *w;
  const uint8_t *x;
  uint8_t *y;
  int64_t *indices;                  /* MaxPool */
  const int64_t *last_count;         /* AveragePool: per output column, taps inside X ... */
  const int64_t *last_padded;        /* ... and inside the explicitly padded X */
  int64_t in_plane, out_plane, rows; /* rows: output rows per plane */
  int64_t inner_lo, inner_hi;        /* the interior output columns of a fused row pass; none: equal */
  bool square;                       /* 2-D, a square window of 2 or 3 taps, stride 1 or 2 both ways, no dilation */
  bool col_major, include_pad;
  int64_t band, bands;               /* separable AveragePool: output rows per item, items per plane */
  int failed;                        /* a chunk ran out of memory */
} pool_job;

/* The window rows of output row `row` (its coordinates on the axes before
 * the last): per axis the first target position and the taps [lo, hi)
 * inside X; *count multiplies the taps inside X, *padded those inside the
 * padded X. False when no window row lies inside X. */
typedef struct pool_rows {
  int64_t first[DKS_MAX_DIMS], lo[DKS_MAX_DIMS], hi[DKS_MAX_DIMS], tap[DKS_MAX_DIMS];
  int64_t count, padded;
} pool_rows;

static bool rows_start(const linalg_window *w, int64_t row, pool_rows *r) {
  int32_t last = w->n - 1;
  r->count = r->padded = 1;
  bool any = true;
  for (int32_t d = last - 1; d >= 0; d--) {
    int64_t q = row % w->grid[d];
    row /= w->grid[d];
    r->first[d] = q * w->stride[d] - w->pad[d];
    linalg_valid_range(r->first[d], w->dilation[d], w->kernel[d], w->target[d], &r->lo[d], &r->hi[d]);
    int64_t plo, phi;
    linalg_valid_range(r->first[d] + w->pad[d], w->dilation[d], w->kernel[d],
                       w->target[d] + w->pad[d] + w->pad_end[d], &plo, &phi);
    r->count *= r->hi[d] - r->lo[d];
    r->padded *= phi - plo;
    r->tap[d] = r->lo[d];
    any = any && r->lo[d] < r->hi[d];
  }
  return any;
}

/* The plane offset of the current window row's first element; advances to
 * the next window row, false after the last. */
static int64_t rows_offset(const linalg_window *w, const pool_rows *r) {
  int64_t at = 0;
  for (int32_t d = 0; d < w->n - 1; d++) at = at * w->target[d] + r->first[d] + r->tap[d] * w->dilation[d];
  return at * w->target[w->n - 1];
}

static bool rows_next(const linalg_window *w, pool_rows *r) {
  for (int32_t d = w->n - 2; d >= 0; d--) {
    if (++r->tap[d] < r->hi[d]) return true;
    r->tap[d] = r->lo[d];
  }
  return false;
}

/* Output columns [*lo, *hi) whose last-axis tap t lies inside X; *base: the
 * input column of output column 0 under that tap. */
static void tap_columns(const linalg_window *w, int64_t t, int64_t *base, int64_t *lo, int64_t *hi) {
  int32_t last = w->n - 1;
  *base = t * w->dilation[last] - w->pad[last];
  linalg_valid_range(*base, w->stride[last], w->grid[last], w->target[last], lo, hi);
}

/* A row-major offset in the input plane as a column-major one. */
static int64_t column_major(const linalg_window *w, int64_t at) {
  int64_t coords[DKS_MAX_DIMS];
  for (int32_t d = w->n - 1; d >= 0; d--) {
    coords[d] = at % w->target[d];
    at /= w->target[d];
  }
  int64_t index = 0, step = 1;
  for (int32_t d = 0; d < w->n; d++) {
    index += coords[d] * step;
    step *= w->target[d];
  }
  return index;
}

/* Calls TAP(at, lo, count, s, ...) for every window row of output row `row`
 * and every last-axis tap that meets X: `at` is the plane offset of the tap
 * at output column lo, [lo, lo + count) the output columns it meets, s the
 * last axis's stride -- a constant for strides 1 and 2, so TAP, inlined,
 * loops with a constant step. The job's interior columns [inner_lo,
 * inner_hi), when there are any, go instead to ROW(at, lo, count, s, taps,
 * ...) once per window row, `at` the plane offset of column lo's first tap
 * and taps the last axis's kernel size, both constants. Leaves r's taps as
 * rows_start set them; `any` is declared, true when a window row meets X. */
#define POOL_FUSED_ROW(ROW, at, lo, count, s, taps, ...) \
  (s == 1 ? (taps == 2 ? ROW(at, lo, count, 1, 2, __VA_ARGS__) : ROW(at, lo, count, 1, 3, __VA_ARGS__)) \
          : (taps == 2 ? ROW(at, lo, count, 2, 2, __VA_ARGS__) : ROW(at, lo, count, 2, 3, __VA_ARGS__)))

#define POOL_TAP_SPAN(TAP, at, lo, count, s, ...) \
  do {                                            \
    if (s == 1)                                   \
      TAP(at, lo, count, 1, __VA_ARGS__);         \
    else if (s == 2)                              \
      TAP(at, lo, count, 2, __VA_ARGS__);         \
    else                                          \
      TAP(at, lo, count, s, __VA_ARGS__);         \
  } while (0)

#define POOL_ROW_TAPS(job, w, row, r, any, TAP, ROW, ...)                                  \
  bool any = rows_start(w, row, &(r));                                                    \
  if (any) {                                                                              \
    int32_t last_ = (w)->n - 1;                                                           \
    int64_t s_ = (w)->stride[last_], taps_ = (w)->kernel[last_];                          \
    int64_t inner_lo_ = (job)->inner_lo, inner_hi_ = (job)->inner_hi;                     \
    do {                                                                                  \
      int64_t row_at_ = rows_offset(w, &(r));                                             \
      if (inner_lo_ < inner_hi_)                                                          \
        POOL_FUSED_ROW(ROW, row_at_ + inner_lo_ * s_ - (w)->pad[last_], inner_lo_,         \
                       inner_hi_ - inner_lo_, s_, taps_, __VA_ARGS__);                    \
      for (int64_t t_ = 0; t_ < taps_; t_++) {                                            \
        int64_t base_, lo_, hi_;                                                          \
        tap_columns(w, t_, &base_, &lo_, &hi_);                                           \
        /* the columns before the interior, then those after it */                        \
        int64_t split_lo_ = inner_lo_ < inner_hi_ ? inner_lo_ : hi_;                      \
        int64_t split_hi_ = inner_lo_ < inner_hi_ ? inner_hi_ : hi_;                      \
        int64_t end_ = hi_ < split_lo_ ? hi_ : split_lo_;                                 \
        if (lo_ < end_) POOL_TAP_SPAN(TAP, row_at_ + base_ + lo_ * s_, lo_, end_ - lo_, s_, __VA_ARGS__); \
        int64_t from_ = lo_ > split_hi_ ? lo_ : split_hi_;                                \
        if (from_ < hi_) POOL_TAP_SPAN(TAP, row_at_ + base_ + from_ * s_, from_, hi_ - from_, s_, __VA_ARGS__); \
      }                                                                                   \
    } while (rows_next(w, &(r)));                                                         \
  }

/* The output columns of a fused row pass: those whose every last-axis tap
 * lies inside X, for the windows POOL_FUSED_ROW has passes for; else none. */
static void interior_columns(const linalg_window *w, int64_t *lo, int64_t *hi) {
  int32_t last = w->n - 1;
  int64_t taps = w->kernel[last], s = w->stride[last];
  *lo = *hi = 0;
  if ((taps == 2 || taps == 3) && (s == 1 || s == 2) && w->dilation[last] == 1)
    linalg_valid_range(-w->pad[last], s, w->grid[last], w->target[last] - (taps - 1), lo, hi);
}

/* For a square job (2-D): true when every window row of output row `row`
 * lies inside X; *top gets the plane offset of the first. */
static bool interior_row(const linalg_window *w, int64_t row, int64_t *top) {
  int64_t first = row * w->stride[0] - w->pad[0];
  *top = first * w->target[1];
  return first >= 0 && first + w->kernel[0] <= w->target[0];
}

/* Calls BLOCK(at, lo, count, s, k, ...) with the square window's size k and
 * stride s as constants. */
#define POOL_SQUARE(BLOCK, at, lo, count, s, k, ...)                                  \
  do {                                                                                \
    if (s == 1 && k == 2)                                                             \
      BLOCK(at, lo, count, 1, 2, __VA_ARGS__);                     \
    else if (s == 1)                                                                  \
      BLOCK(at, lo, count, 1, 3, __VA_ARGS__);                     \
    else if (k == 2)                                                                  \
      BLOCK(at, lo, count, 2, 2, __VA_ARGS__);                     \
    else                                                                              \
      BLOCK(at, lo, count, 2, 3, __VA_ARGS__);                     \
  } while (0)

/* A chunk's row buffer; NULL after flagging the job's failure. */
static void *chunk_scratch(pool_job *job, int64_t count, size_t size) {
  void *p = malloc((size_t)count * size);
  if (!p) __atomic_store_n(&job->failed, 1, __ATOMIC_RELAXED);
  return p;
}

/* ---- MaxPool ----------------------------------------------------------------------- */

/* The plane offset of output column o's first tap inside X in the window
 * row at first_row, or -1 when the column's window misses X. */
static int64_t first_tap(const linalg_window *w, int64_t first_row, int64_t o) {
  int32_t last = w->n - 1;
  int64_t first = o * w->stride[last] - w->pad[last], lo, hi;
  linalg_valid_range(first, w->dilation[last], w->kernel[last], w->target[last], &lo, &hi);
  return lo < hi ? first_row + first + lo * w->dilation[last] : -1;
}

/* A row's plane offsets (-1: none) as Indices: flat, from the plane at
 * `offset`, row-major or (col_major) column-major. */
#define WIDEN_INDICES(NAME, IDX)                                                              \
  static inline __attribute__((always_inline)) void NAME(const linalg_window *w, bool col_major, \
                                                         int64_t offset, int64_t *out,        \
                                                         const IDX *index, int64_t width) {   \
    if (col_major)                                                                            \
      for (int64_t o = 0; o < width; o++)                                                     \
        out[o] = index[o] < 0 ? -1 : offset + column_major(w, index[o]);                      \
    else                                                                                      \
      for (int64_t o = 0; o < width; o++) out[o] = index[o] < 0 ? -1 : offset + index[o];     \
  }
WIDEN_INDICES(widen_indices_i32, int32_t)
WIDEN_INDICES(widen_indices_i64, int64_t)
#define widen_indices(w, col_major, offset, out, index, width) \
  _Generic((index), int32_t *: widen_indices_i32, int64_t *: widen_indices_i64)(w, col_major, offset, out, index, width)

/* The first maximum in tap order wins; a NaN beats every number, the first
 * NaN every later one. An empty window gives LOWEST and index -1. The row's
 * indices (plane offsets) are kept as IDX -- int32_t when the plane allows,
 * so that they share the values' vector lanes -- and widened at the end.
 * Outputs start at LOWEST with no index: the one tap that can fail to beat
 * LOWEST is a leading LOWEST, which the widening gives the window's first
 * tap. NAME writes Indices; NAME##_values, for a call without that output,
 * keeps no index at all. */
#define MAX_TAKES(v, best, IS_NAN) ((v) > (best) || (IS_NAN(v) && !IS_NAN(best)))
#define MAX_POOL(NAME, T, LOWEST, IS_NAN, IDX)                                                  \
  static inline __attribute__((always_inline)) void NAME##_tap(                                 \
      int64_t at, int64_t lo, int64_t count, int64_t s, const T *plane, T *y, IDX *index,       \
      bool indexed) {                                                                           \
    const T *src = plane + at;                                                                  \
    y += lo;                                                                                    \
    for (int64_t o = 0; o < count; o++) {                                                       \
      T v = src[o * s], best = y[o];                                                            \
      bool take = MAX_TAKES(v, best, IS_NAN);                                                   \
      y[o] = take ? v : best;                                                                   \
      if (indexed) index[lo + o] = take ? (IDX)(at + o * s) : index[lo + o];                    \
    }                                                                                           \
  }                                                                                             \
  static inline __attribute__((always_inline)) void NAME##_row(                                 \
      int64_t at, int64_t lo, int64_t count, int64_t s, int64_t taps, const T *plane, T *y,     \
      IDX *index, bool indexed) {                                                               \
    const T *src = plane + at;                                                                  \
    y += lo;                                                                                    \
    for (int64_t o = 0; o < count; o++) {                                                       \
      T best = y[o];                                                                            \
      IDX where = indexed ? index[lo + o] : 0;                                                  \
      for (int64_t t = 0; t < taps; t++) {                                                      \
        T v = src[o * s + t];                                                                   \
        bool take = MAX_TAKES(v, best, IS_NAN);                                                 \
        best = take ? v : best;                                                                 \
        where = take ? (IDX)(at + o * s + t) : where;                                           \
      }                                                                                         \
      y[o] = best;                                                                              \
      if (indexed) index[lo + o] = where;                                                       \
    }                                                                                           \
  }                                                                                             \
  /* Square windows, an interior output row: the interior columns [lo, lo +                   \
   * count) fold their k x k taps in registers (at: the plane offset of column                 \
   * lo's first tap, `width` X's row length) ... */                                            \
  static inline __attribute__((always_inline)) void NAME##_block(                               \
      int64_t at, int64_t lo, int64_t count, int64_t s, int64_t k, const T *plane,              \
      int64_t width, T *y, int64_t *out, int64_t offset, bool indexed) {                        \
    for (int64_t o = 0; o < count; o++) {                                                       \
      const T *src = plane + at + o * s;                                                        \
      IDX first = (IDX)(at + o * s), where = first;                                             \
      T best = src[0];                                                                          \
      _Pragma("GCC unroll 9") for (int64_t j = 1; j < k * k; j++) {                              \
        int64_t tap = j / k * width + j % k;                                                    \
        T v = src[tap];                                                                         \
        bool take = MAX_TAKES(v, best, IS_NAN);                                                 \
        best = take ? v : best;                                                                 \
        where = take ? first + (IDX)tap : where;                                                \
      }                                                                                         \
      y[lo + o] = best;                                                                         \
      if (indexed) out[lo + o] = offset + where;                                                \
    }                                                                                           \
  }                                                                                             \
  /* ... and the border columns one at a time, over the taps inside X. */                       \
  static void NAME##_border(const linalg_window *w, int64_t top, int64_t o, const T *plane,     \
                            T *y, int64_t *out, int64_t offset, bool indexed) {                 \
    int64_t width = w->target[1], first = o * w->stride[1] - w->pad[1];                         \
    T best = LOWEST;                                                                            \
    int64_t where = -1;                                                                         \
    for (int64_t i = 0; i < w->kernel[0]; i++)                                                  \
      for (int64_t t = 0; t < w->kernel[1]; t++) {                                              \
        if (first + t < 0 || first + t >= width) continue;                                      \
        int64_t at = top + i * width + first + t;                                               \
        if (where < 0 || MAX_TAKES(plane[at], best, IS_NAN)) {                                  \
          best = plane[at];                                                                     \
          where = at;                                                                           \
        }                                                                                       \
      }                                                                                         \
    y[o] = best;                                                                                \
    if (indexed) out[o] = where < 0 ? -1 : offset + where;                                      \
  }                                                                                             \
  static inline __attribute__((always_inline)) void NAME##_rows(pool_job *job, int64_t begin,   \
                                                                int64_t end, IDX *index,        \
                                                                bool indexed) {                 \
    const linalg_window *w = job->w;                                                            \
    int64_t width = w->grid[w->n - 1];                                                          \
    for (int64_t item = begin; item < end; item++) {                                            \
      int64_t p = item / job->rows, row = item % job->rows;                                     \
      const T *plane = (const T *)job->x + p * job->in_plane;                                   \
      T *y = (T *)job->y + p * job->out_plane + row * width;                                    \
      int64_t *out = indexed ? job->indices + p * job->out_plane + row * width : NULL;          \
      int64_t top;                                                                              \
      if (job->square && !job->col_major && interior_row(w, row, &top)) {                       \
        int64_t lo = job->inner_lo, hi = job->inner_hi, s = w->stride[1];                       \
        POOL_SQUARE(NAME##_block, top + lo * s - w->pad[1], lo, hi - lo, s, w->kernel[1], plane, \
                    w->target[1], y, out, p * job->in_plane, indexed);                          \
        for (int64_t o = 0; o < lo; o++) NAME##_border(w, top, o, plane, y, out, p * job->in_plane, indexed); \
        for (int64_t o = hi; o < width; o++) NAME##_border(w, top, o, plane, y, out, p * job->in_plane, indexed); \
        continue;                                                                               \
      }                                                                                         \
      for (int64_t o = 0; o < width; o++) y[o] = LOWEST;                                        \
      if (indexed)                                                                              \
        for (int64_t o = 0; o < width; o++) index[o] = -1;                                      \
      pool_rows r;                                                                              \
      POOL_ROW_TAPS(job, w, row, r, any, NAME##_tap, NAME##_row, plane, y, index, indexed);     \
      if (!indexed) continue;                                                                   \
      if (any) {                                                                                \
        int64_t first_row = rows_offset(w, &r);                                                 \
        for (int64_t o = 0; o < width; o++)                                                     \
          if (index[o] < 0) index[o] = (IDX)first_tap(w, first_row, o);                         \
      }                                                                                         \
      widen_indices(w, job->col_major, p * job->in_plane, out, index, width);                   \
    }                                                                                           \
  }                                                                                             \
  DKS_VECTOR_CLONES static void NAME(void *ctx, int64_t begin, int64_t end) {                   \
    pool_job *job = ctx;                                                                        \
    IDX *index = chunk_scratch(job, job->w->grid[job->w->n - 1], sizeof *index);                \
    if (!index) return;                                                                         \
    NAME##_rows(job, begin, end, index, true);                                                  \
    free(index);                                                                                \
  }                                                                                             \
  DKS_VECTOR_CLONES static void NAME##_values(void *ctx, int64_t begin, int64_t end) {          \
    NAME##_rows(ctx, begin, end, NULL, false);                                                  \
  }

#define FLOAT_IS_NAN(v) ((v) != (v))
#define INT_IS_NAN(v) false
MAX_POOL(max_pool_f32, float, -INFINITY, FLOAT_IS_NAN, int32_t)
MAX_POOL(max_pool_f64, double, -INFINITY, FLOAT_IS_NAN, int32_t)
MAX_POOL(max_pool_i8, int8_t, INT8_MIN, INT_IS_NAN, int32_t)
MAX_POOL(max_pool_u8, uint8_t, 0, INT_IS_NAN, int32_t)
/* Planes of 2^31 elements or more. */
MAX_POOL(max_pool_wide_f32, float, -INFINITY, FLOAT_IS_NAN, int64_t)
MAX_POOL(max_pool_wide_f64, double, -INFINITY, FLOAT_IS_NAN, int64_t)
MAX_POOL(max_pool_wide_i8, int8_t, INT8_MIN, INT_IS_NAN, int64_t)
MAX_POOL(max_pool_wide_u8, uint8_t, 0, INT_IS_NAN, int64_t)

/* float32 rows in vectors of 8 (GCC vector extensions: AVX2 registers in
 * the avx2 clone, two SSE or NEON registers elsewhere). take_first_max is
 * MAX_TAKES lane by lane -- v beats best when it is greater, or a NaN where
 * best is not: !(v <= best) && best == best -- so a fold in tap order keeps
 * the first maximum's bits (of -0 and +0, of two NaNs: the first). */
#define POOL_LANES 8
typedef float pool_vec __attribute__((vector_size(POOL_LANES * sizeof(float))));
typedef int32_t pool_mask __attribute__((vector_size(POOL_LANES * sizeof(int32_t))));

/* The helpers take vectors by pointer: a vector argument or result would
 * use an ABI that differs between the clones (GCC's -Wpsabi). */
static inline __attribute__((always_inline)) void pool_load(pool_vec *v, const float *p) {
  memcpy(v, p, sizeof *v);
}

static inline __attribute__((always_inline)) void take_first_max(pool_vec *best, const pool_vec *v) {
  pool_mask take = ~(*v <= *best) & (*best == *best);
  *best = (pool_vec)(((pool_mask)*v & take) | ((pool_mask)*best & ~take));
}

#if defined(__has_builtin)
#if __has_builtin(__builtin_shufflevector)
#define POOL_HAS_EVEN_LANES 1
/* p[0], p[2], ..., p[14]: a stride-2 tap of 8 outputs from two loads,
 * p[0..7] and p[7..14] (nothing past the last element used). */
static inline __attribute__((always_inline)) void pool_load_even(pool_vec *v, const float *p) {
  pool_vec lo, hi;
  pool_load(&lo, p);
  pool_load(&hi, p + POOL_LANES - 1);
  *v = __builtin_shufflevector(lo, hi, 0, 2, 4, 6, 9, 11, 13, 15);
}
#endif
#endif

/* out[o] for o in [lo, hi), hi - lo >= POOL_LANES: the maximum of `taps`
 * taps from src + o * s - pad. The last vector overlaps the one before it
 * instead of leaving a scalar tail (its outputs are computed again, the
 * same). */
static inline __attribute__((always_inline)) void max_row_vectors(const float *src, int64_t s, int64_t pad,
                                                                  int64_t taps, float *out, int64_t lo,
                                                                  int64_t hi) {
  for (int64_t o = lo;; o += POOL_LANES) {
    if (o + POOL_LANES > hi) o = hi - POOL_LANES;
    const float *at = src + (o * s - pad);
    pool_vec best, v;
#ifdef POOL_HAS_EVEN_LANES
    if (s == 2) {
      pool_load_even(&best, at);
      for (int64_t t = 1; t < taps; t++) {
        pool_load_even(&v, at + t);
        take_first_max(&best, &v);
      }
    } else
#endif
    {
      pool_load(&best, at);
      for (int64_t t = 1; t < taps; t++) {
        pool_load(&v, at + t);
        take_first_max(&best, &v);
      }
    }
    memcpy(out + o, &best, sizeof best);
    if (o + POOL_LANES == hi) return;
  }
}

/* The maximum over the taps inside the row (width long) of a window from
 * column `first`. */
static inline __attribute__((always_inline)) float max_border_column(const float *src, int64_t first,
                                                                     int64_t taps, int64_t width) {
  float best = -INFINITY;
  for (int64_t c = first < 0 ? 0 : first; c < first + taps && c < width; c++)
    best = MAX_TAKES(src[c], best, FLOAT_IS_NAN) ? src[c] : best;
  return best;
}

/* A plane's input row `src` to its column maxima `out` (grid[1] of them)
 * with stride 1 or 2 (2 where the compiler has the lane shuffle) and no
 * dilation: the interior columns, whose every tap lies inside the row, in
 * vectors -- the tap count a constant for 2 and 3 -- the border ones over
 * their taps inside, in order. False (nothing written) for other windows
 * or fewer than POOL_LANES interior columns. */
static inline __attribute__((always_inline)) bool max_row_float(const linalg_window *w, const float *src,
                                                                 float *out) {
  int64_t s = w->stride[1], taps = w->kernel[1], pad = w->pad[1], width = w->target[1], lo, hi;
#ifdef POOL_HAS_EVEN_LANES
  bool vector_stride = s == 1 || s == 2;
#else
  bool vector_stride = s == 1;
#endif
  if (!vector_stride) return false;
  linalg_valid_range(-pad, s, w->grid[1], width - (taps - 1), &lo, &hi);
  if (hi - lo < POOL_LANES) return false;
  if (taps == 2)
    max_row_vectors(src, s, pad, 2, out, lo, hi);
  else if (taps == 3)
    max_row_vectors(src, s, pad, 3, out, lo, hi);
  else
    max_row_vectors(src, s, pad, taps, out, lo, hi);
  for (int64_t o = 0; o < lo; o++) out[o] = max_border_column(src, o * s - pad, taps, width);
  for (int64_t o = hi; o < w->grid[1]; o++) out[o] = max_border_column(src, o * s - pad, taps, width);
  return true;
}

/* y[o] = the maximum over `count` >= 1 rows, `step` apart, from `rows`, of
 * row[o], folded in row order; false (nothing written) below POOL_LANES
 * columns. (The first row stands for the fold's start, -inf: beating -inf,
 * or equal to it, it gives the same bits.) */
static inline __attribute__((always_inline)) void max_columns_vectors(const float *rows, int64_t step,
                                                                      int64_t count, float *y, int64_t n) {
  for (int64_t o = 0;; o += POOL_LANES) {
    if (o + POOL_LANES > n) o = n - POOL_LANES;
    pool_vec best, v;
    pool_load(&best, rows + o);
    for (int64_t i = 1; i < count; i++) {
      pool_load(&v, rows + i * step + o);
      take_first_max(&best, &v);
    }
    memcpy(y + o, &best, sizeof best);
    if (o + POOL_LANES == n) return;
  }
}

static inline __attribute__((always_inline)) bool max_columns_float(const float *rows, int64_t step,
                                                                     int64_t count, float *y, int64_t n) {
  if (count < 1 || n < POOL_LANES) return false;
  if (count == 2)
    max_columns_vectors(rows, step, 2, y, n);
  else if (count == 3)
    max_columns_vectors(rows, step, 3, y, n);
  else
    max_columns_vectors(rows, step, count, y, n);
  return true;
}

/* The other dtypes' rows: the tap loops. */
#define NO_FAST_ROW(T)                                                                           \
  static inline bool max_row_##T(const linalg_window *w, const T *src, T *out) {                \
    (void)w, (void)src, (void)out;                                                               \
    return false;                                                                                \
  }                                                                                              \
  static inline bool max_columns_##T(const T *rows, int64_t step, int64_t count, T *y, int64_t n) { \
    (void)rows, (void)step, (void)count, (void)y, (void)n;                                       \
    return false;                                                                                \
  }
NO_FAST_ROW(double)
NO_FAST_ROW(int8_t)
NO_FAST_ROW(uint8_t)

/* MaxPool without Indices over 2-D windows with no dilation, a plane at a
 * time: a window's maximum is the maximum, over its rows, of each row's
 * maximum over its columns, so each input row gets its column maxima once
 * (kw taps per output column) and each output row takes the maximum of kh
 * of those rows: kh + kw instead of kh * kw compares per output, each a
 * contiguous (or constant-stride) loop -- for float32 in vectors
 * (max_row_float, max_columns_float). Among equal maxima the first row's first
 * wins, and a row's first NaN, and the first row with a NaN: the first in
 * row-major order, as the tap walk gives (the same bits). */
#define MAX_POOL_SEPARABLE(NAME, T, LOWEST, IS_NAN)                                                \
  static inline __attribute__((always_inline)) void NAME##_tap(const T *src, int64_t s, int64_t count, \
                                                               T *best) {                         \
    for (int64_t o = 0; o < count; o++) {                                                         \
      T v = src[o * s];                                                                           \
      best[o] = MAX_TAKES(v, best[o], IS_NAN) ? v : best[o];                                      \
    }                                                                                             \
  }                                                                                               \
  DKS_VECTOR_CLONES static void NAME(void *ctx, int64_t begin, int64_t end) {                     \
    pool_job *job = ctx;                                                                          \
    const linalg_window *w = job->w;                                                              \
    int64_t height = w->target[0], width = w->target[1], oh = w->grid[0], ow = w->grid[1];       \
    int64_t s = w->stride[1];                                                                     \
    T *rows = chunk_scratch(job, height * ow, sizeof *rows); /* column maxima of each input row */ \
    if (!rows) return;                                                                            \
    for (int64_t p = begin; p < end; p++) {                                                       \
      const T *plane = (const T *)job->x + p * job->in_plane;                                     \
      T *y = (T *)job->y + p * job->out_plane;                                                    \
      for (int64_t r = 0; r < height; r++) {                                                      \
        T *out = rows + r * ow;                                                                   \
        if (max_row_##T(w, plane + r * width, out)) continue;                                     \
        for (int64_t o = 0; o < ow; o++) out[o] = LOWEST;                                         \
        for (int64_t t = 0; t < w->kernel[1]; t++) {                                              \
          int64_t base, lo, hi;                                                                   \
          tap_columns(w, t, &base, &lo, &hi);                                                     \
          const T *src = plane + r * width + base + lo * s;                                       \
          if (s == 1)                                                                             \
            NAME##_tap(src, 1, hi - lo, out + lo);                                                \
          else if (s == 2)                                                                        \
            NAME##_tap(src, 2, hi - lo, out + lo);                                                \
          else                                                                                    \
            NAME##_tap(src, s, hi - lo, out + lo);                                                \
        }                                                                                         \
      }                                                                                           \
      for (int64_t q = 0; q < oh; q++, y += ow) {                                                 \
        int64_t first = q * w->stride[0] - w->pad[0], lo, hi;                                     \
        linalg_valid_range(first, 1, w->kernel[0], height, &lo, &hi);                             \
        if (max_columns_##T(rows + (first + lo) * ow, ow, hi - lo, y, ow)) continue;              \
        for (int64_t o = 0; o < ow; o++) y[o] = LOWEST;                                           \
        for (int64_t i = lo; i < hi; i++) NAME##_tap(rows + (first + i) * ow, 1, ow, y);          \
      }                                                                                           \
    }                                                                                             \
    free(rows);                                                                                   \
  }
MAX_POOL_SEPARABLE(max_pool_rows_f32, float, -INFINITY, FLOAT_IS_NAN)
MAX_POOL_SEPARABLE(max_pool_rows_f64, double, -INFINITY, FLOAT_IS_NAN)
MAX_POOL_SEPARABLE(max_pool_rows_i8, int8_t, INT8_MIN, INT_IS_NAN)
MAX_POOL_SEPARABLE(max_pool_rows_u8, uint8_t, 0, INT_IS_NAN)

/* ---- float32 MaxPool with column stride 2, by AVX-512 -------------------------------- */

/* ResNet's 3x3/2 and the U-Net's 2x2/2 MaxPool (float32, no Indices, up to
 * 4 taps a row, column stride 2, no dilation): 16 outputs of a row at a
 * time, each window row's taps from two pairs of masked loads (the columns
 * outside X read as -inf), their even and odd lanes gathered by permutes,
 * folded in row-major tap order by take-first-max (the same bits as the
 * tap walk: -inf for a tap outside X changes nothing). On small planes
 * (16 outputs a row) the separable pass spent more on each row's set-up and
 * border columns than on its maxima: 2x16x32x32 3x3/2 13.7 -> 7.2 us, the
 * U-Net's 2x2/2 3.4 -> 2.8 and 2.0 -> 1.8 us (2 threads). Wider rows keep
 * the separable pass, which reads each input row once: ResNet-18's
 * 112x112 -> 56x56 105 us that way, 147 this one. */
#define POOL_STRIDE2_MAX_OUTPUTS 32
#if defined(__x86_64__) && defined(__GNUC__)
#include <immintrin.h>
#define POOL_STRIDE2_AVX512 1

static bool pool_stride2_fits(const linalg_window *w, DK_DTypeKey dtype, bool indexed) {
  return !indexed && dtype == DK_DTYPE_FLOAT32 && w->n == 2 && w->stride[1] == 2 && w->kernel[1] <= 4 &&
         w->grid[1] <= POOL_STRIDE2_MAX_OUTPUTS &&
         w->dilation[0] == 1 && w->dilation[1] == 1 && __builtin_cpu_supports("avx512f");
}

/* Lanes l of 16 with 0 <= at + l < width. */
static __mmask16 inside_lanes(int64_t at, int64_t width) {
  int64_t lo = at < 0 ? -at : 0, hi = width - at < 16 ? width - at : 16;
  if (lo >= hi) return 0;
  return (__mmask16)(((1u << hi) - 1) & ~((1u << lo) - 1));
}

/* b where it beats a (greater, or a NaN where a is not): MAX_TAKES by lanes. */
static inline __attribute__((always_inline, target("avx512f"))) __m512 first_max(__m512 a, __m512 b) {
  __mmask16 take = _mm512_cmp_ps_mask(b, a, _CMP_NLE_UQ) & _mm512_cmp_ps_mask(a, a, _CMP_ORD_Q);
  return _mm512_mask_mov_ps(a, take, b);
}

/* The first maximum of each of 16 outputs' window taps on one input row
 * (kw <= 4 of them, column c0 + 2 * i + t for output i): two pairs of
 * masked loads (m: the lanes inside X; -inf outside), even and odd lanes
 * by permutes, pairs folded apart (taking the first maximum is
 * associative: a shorter chain). */
static inline __attribute__((always_inline, target("avx512f"))) __m512 row_first_max(const float *row,
                                                                                  const __mmask16 m[4],
                                                                                  int64_t kw) {
  const __m512i even = _mm512_setr_epi32(0, 2, 4, 6, 8, 10, 12, 14, 16, 18, 20, 22, 24, 26, 28, 30);
  const __m512i odd = _mm512_setr_epi32(1, 3, 5, 7, 9, 11, 13, 15, 17, 19, 21, 23, 25, 27, 29, 31);
  const __m512 lowest = _mm512_set1_ps(-INFINITY);
  __m512 lo = _mm512_mask_loadu_ps(lowest, m[0], row), hi = _mm512_mask_loadu_ps(lowest, m[1], row + 16);
  __m512 tap0 = _mm512_permutex2var_ps(lo, even, hi);
  if (kw == 1) return tap0;
  __m512 pair0 = first_max(tap0, _mm512_permutex2var_ps(lo, odd, hi));
  if (kw == 2) return pair0;
  __m512 lo2 = _mm512_mask_loadu_ps(lowest, m[2], row + 2), hi2 = _mm512_mask_loadu_ps(lowest, m[3], row + 18);
  __m512 tap2 = _mm512_permutex2var_ps(lo2, even, hi2);
  return first_max(pair0, kw > 3 ? first_max(tap2, _mm512_permutex2var_ps(lo2, odd, hi2)) : tap2);
}

/* Planes [begin, end). Each input row's taps are folded once (row_first_max
 * into `folded`), then each output row folds its window rows' in order: a
 * 3x3/2 window's rows are each read by one or two output rows, which
 * folded them again each time before (the zoo resnet's 2x16x32x32 in its
 * plan run: 5.5 -> 3.7 us). */
__attribute__((target("avx512f"))) static void max_pool_stride2(void *ctx, int64_t begin, int64_t end) {
  pool_job *job = ctx;
  const linalg_window *w = job->w;
  int64_t height = w->target[0], width = w->target[1], oh = w->grid[0], ow = w->grid[1];
  int64_t kh = w->kernel[0], kw = w->kernel[1], pad_w = w->pad[1];
  __m512 *folded = aligned_alloc(64, (size_t)(height > 0 ? height : 1) * sizeof *folded);
  if (!folded) {
    job->failed = 1;
    return;
  }
  for (int64_t p = begin; p < end; p++) {
    const float *plane = (const float *)job->x + p * job->in_plane;
    float *y = (float *)job->y + p * job->out_plane;
    for (int64_t o0 = 0; o0 < ow; o0 += 16) {
      int64_t c0 = 2 * o0 - pad_w; /* tap t of output o0 + i reads column c0 + 2 * i + t */
      __mmask16 m[4], store = inside_lanes(0, ow - o0);
      for (int u = 0; u < 4; u++) m[u] = inside_lanes(c0 + 16 * (u & 1) + 2 * (u >> 1), width);
      /* the input rows the windows reach (rows above and below X are padding) */
      int64_t r0 = -w->pad[0] > 0 ? -w->pad[0] : 0, r1 = (oh - 1) * w->stride[0] - w->pad[0] + kh;
      if (r1 > height) r1 = height;
      for (int64_t r = r0; r < r1; r++) folded[r] = row_first_max(plane + r * width + c0, m, kw);
      for (int64_t q = 0; q < oh; q++) {
        int64_t first = q * w->stride[0] - w->pad[0], lo, hi;
        linalg_valid_range(first, 1, kh, height, &lo, &hi);
        __m512 best = _mm512_set1_ps(-INFINITY);
        for (int64_t i = lo; i < hi; i++) best = first_max(best, folded[first + i]);
        _mm512_mask_storeu_ps(y + q * ow + o0, store, best);
      }
    }
  }
  free(folded);
}
#endif

/* Window geometry of a pool: X (N, C, D...) to Y (N, C, O...). */
static void pool_window_of(const dks_kernel_args *k, linalg_window *w) {
  const dks_tensor *x = &k->in[0], *y = &k->out[0];
  int64_t count;
  const int64_t *kernel = dks_attr_ints(k, "kernel_shape", &count);
  linalg_window_forward(k, x->ndim - 2, x->shape + 2, y->shape + 2, kernel, w);
}

/* The job of a pool call over (plane, output row) items: *items of them,
 * split in chunks of about POOL_CHUNK_TAPS window taps. */
#define POOL_CHUNK_TAPS ((int64_t)1 << 16)

static pool_job pool_job_of(const dks_kernel_args *k, const linalg_window *w, int64_t *items,
                            int64_t *grain) {
  const dks_tensor *x = &k->in[0], *y = &k->out[0];
  pool_job job = {.w = w, .x = x->data, .y = y->data};
  job.in_plane = linalg_prod(w->target, w->n);
  job.out_plane = linalg_prod(w->grid, w->n);
  job.rows = job.out_plane / w->grid[w->n - 1];
  *items = x->shape[0] * x->shape[1] * job.rows;
  int64_t row_taps = w->grid[w->n - 1] * linalg_prod(w->kernel, w->n);
  *grain = row_taps >= POOL_CHUNK_TAPS ? 1 : POOL_CHUNK_TAPS / (row_taps > 0 ? row_taps : 1);
  interior_columns(w, &job.inner_lo, &job.inner_hi);
  job.square = w->n == 2 && job.inner_lo < job.inner_hi && w->kernel[0] == w->kernel[1] &&
               w->stride[0] == w->stride[1] && w->dilation[0] == 1;
  return job;
}

static DK_Status max_pool(const dks_kernel_args *k) {
  const dks_tensor *x = &k->in[0], *y = &k->out[0];
  if (y->size == 0) return DK_OK;
  linalg_window w;
  pool_window_of(k, &w);
  int64_t items, grain;
  pool_job job = pool_job_of(k, &w, &items, &grain);
  job.col_major = dks_attr_int(k, "storage_order", 0) == 1;
  bool indexed = k->num_outputs > 1; /* Indices is an optional output */
  job.indices = indexed ? (int64_t *)k->out[1].data : NULL;
  bool wide = job.in_plane > INT32_MAX;
#define MAX_POOL_FN(S) (wide ? (indexed ? max_pool_wide_##S : max_pool_wide_##S##_values) \
                             : (indexed ? max_pool_##S : max_pool_##S##_values))
  dks_range_fn fn = x->dtype == DK_DTYPE_FLOAT64 ? MAX_POOL_FN(f64)
                    : x->dtype == DK_DTYPE_INT8  ? MAX_POOL_FN(i8)
                    : x->dtype == DK_DTYPE_UINT8 ? MAX_POOL_FN(u8)
                                                 : MAX_POOL_FN(f32);
#undef MAX_POOL_FN
#ifdef POOL_STRIDE2_AVX512
  if (pool_stride2_fits(&w, x->dtype, indexed)) {
    int64_t plane_taps = job.out_plane * w.kernel[0] * w.kernel[1];
    items = x->shape[0] * x->shape[1];
    grain = plane_taps >= POOL_CHUNK_TAPS ? 1 : POOL_CHUNK_TAPS / (plane_taps > 0 ? plane_taps : 1);
    dks_parallel_for(items, grain, max_pool_stride2, &job);
    if (job.failed) return dks_kernel_fail(k, DK_RESOURCE_EXHAUSTED, "out of host memory for a plane's folded rows");
    return DK_OK;
  }
#endif
  if (!indexed && w.n == 2 && w.dilation[0] == 1 && w.dilation[1] == 1 && w.kernel[0] * w.kernel[1] > 4) {
    /* A plane per item: about kh + kw compares per output, and kw per input
     * row. (Smaller windows fold their taps in registers as fast.) */
    fn = x->dtype == DK_DTYPE_FLOAT64 ? max_pool_rows_f64
         : x->dtype == DK_DTYPE_INT8  ? max_pool_rows_i8
         : x->dtype == DK_DTYPE_UINT8 ? max_pool_rows_u8
                                      : max_pool_rows_f32;
    int64_t plane_taps = w.target[0] * w.grid[1] * w.kernel[1] + job.out_plane * w.kernel[0];
    items = x->shape[0] * x->shape[1];
    grain = plane_taps >= POOL_CHUNK_TAPS ? 1 : POOL_CHUNK_TAPS / (plane_taps > 0 ? plane_taps : 1);
  }
  dks_parallel_for(items, grain, fn, &job);
  if (job.failed) return dks_kernel_fail(k, DK_RESOURCE_EXHAUSTED, "out of host memory for a row of indices");
  return DK_OK;
}

static DK_Status max_pool_low(const dks_kernel_args *k) { return linalg_run_as_f32(k, max_pool); }

/* ---- AveragePool -------------------------------------------------------------------- */

/* The float64 sum over the window's taps inside the input, times 1 / the
 * count of those taps (or, with include_pad, of the taps inside the padded
 * input): per column, recomputed only when a row's count on the other axes
 * changes (a double product where a division cost ~4x, within a double ulp
 * of the quotient before the one rounding to the output type). A window with
 * nothing to count gives 0 * inf, NaN. */
#define AVERAGE_POOL(NAME, T)                                                                   \
  static inline __attribute__((always_inline)) void NAME##_tap(                                 \
      int64_t at, int64_t lo, int64_t count, int64_t s, const T *plane, double *acc) {          \
    const T *src = plane + at;                                                                  \
    acc += lo;                                                                                  \
    for (int64_t o = 0; o < count; o++) acc[o] += (double)src[o * s];                           \
  }                                                                                             \
  static inline __attribute__((always_inline)) void NAME##_row(                                 \
      int64_t at, int64_t lo, int64_t count, int64_t s, int64_t taps, const T *plane,           \
      double *acc) {                                                                            \
    const T *src = plane + at;                                                                  \
    acc += lo;                                                                                  \
    for (int64_t o = 0; o < count; o++) {                                                       \
      double sum = acc[o];                                                                      \
      for (int64_t t = 0; t < taps; t++) sum += (double)src[o * s + t];                         \
      acc[o] = sum;                                                                             \
    }                                                                                           \
  }                                                                                             \
  DKS_VECTOR_CLONES static void NAME(void *ctx, int64_t begin, int64_t end) {                   \
    pool_job *job = ctx;                                                                        \
    const linalg_window *w = job->w;                                                            \
    int64_t width = w->grid[w->n - 1];                                                          \
    double *acc = chunk_scratch(job, 2 * width, sizeof *acc), *scale = acc + width;             \
    if (!acc) return;                                                                           \
    double scale_outer = -1.0; /* the taps of the other axes that `scale` holds: none yet */    \
    for (int64_t item = begin; item < end; item++) {                                            \
      int64_t p = item / job->rows, row = item % job->rows;                                     \
      const T *plane = (const T *)job->x + p * job->in_plane;                                   \
      T *y = (T *)job->y + p * job->out_plane + row * width;                                    \
      memset(acc, 0, (size_t)width * sizeof *acc);                                              \
      pool_rows r;                                                                              \
      POOL_ROW_TAPS(job, w, row, r, any, NAME##_tap, NAME##_row, plane, acc);                   \
      (void)any;                                                                                \
      const int64_t *columns = job->include_pad ? job->last_padded : job->last_count;           \
      double outer = (double)(job->include_pad ? r.padded : r.count);                           \
      if (outer != scale_outer) {                                                               \
        for (int64_t o = 0; o < width; o++) scale[o] = 1.0 / (outer * (double)columns[o]);      \
        scale_outer = outer;                                                                    \
      }                                                                                         \
      for (int64_t o = 0; o < width; o++) y[o] = (T)(acc[o] * scale[o]);                        \
    }                                                                                           \
    free(acc);                                                                                  \
  }
AVERAGE_POOL(average_pool_f32, float)
AVERAGE_POOL(average_pool_f64, double)

/* 2-D windows without dilation, separably: each input row gets the window
 * sums along the last axis (its taps inside, in order, from 0), then each
 * output row the sum of its window rows' sums (in order; a row outside the
 * input is zeros), times 1 / the count as above: kh + kw float64 adds per
 * output instead of kh x kw, the interior columns (every tap inside) and
 * the output rows in loops with no border case (the tap walk above spent
 * most of its time per row: a 3x3 pool on 64 x 56 x 56 took 435 us on one
 * thread of a Zen 4). Adding a zero changes no sum, and sums of at most
 * kh x kw float32 values in float64 are exact unless their exponents span
 * more than 29 binades, so the order changes no float32 mean then. float64
 * pools keep the tap walk, whose sums run in the windows' row-major order.
 * Items are (plane, band of output rows); a band sums the input rows its
 * windows read. */
/* sums[o] for o in [lo, hi) from K (2 or 3) taps at at + o * S, both constants, in order from 0. */
#define POOL_ROW_SUMS(sums, at, lo, hi, S, K)                                                    \
  for (int64_t o = lo; o < hi; o++) {                                                            \
    double sum_ = (0.0 + (double)(at)[o * (S)]) + (double)(at)[o * (S) + 1];                      \
    sums[o] = K == 3 ? sum_ + (double)(at)[o * (S) + 2] : sum_;                                  \
  }

/* sums[o] = the sum of input row src's taps under output column o; [lo, hi): the interior */
static inline __attribute__((always_inline)) void average_pool_row_sums(
    const linalg_window *w, const float *src, int64_t lo, int64_t hi, double *sums) {
  int64_t ow = w->grid[1], s = w->stride[1], kw = w->kernel[1];
  const float *at = src - w->pad[1];
  if (s == 1 && kw == 2) {
    POOL_ROW_SUMS(sums, at, lo, hi, 1, 2)
  } else if (s == 1 && kw == 3) {
    POOL_ROW_SUMS(sums, at, lo, hi, 1, 3)
  } else if (s == 2 && kw == 2) {
    POOL_ROW_SUMS(sums, at, lo, hi, 2, 2)
  } else if (s == 2 && kw == 3) {
    POOL_ROW_SUMS(sums, at, lo, hi, 2, 3)
  } else {
    for (int64_t o = lo; o < hi; o++) sums[o] = 0.0;
    for (int64_t t = 0; t < kw; t++)
      for (int64_t o = lo; o < hi; o++) sums[o] += (double)at[o * s + t];
  }
  for (int64_t o = 0; o < ow; o++) { /* the border columns, over their taps inside */
    if (o == lo && lo < hi) o = hi;
    if (o >= ow) break;
    int64_t first = o * s - w->pad[1], tlo, thi;
    linalg_valid_range(first, 1, kw, w->target[1], &tlo, &thi);
    double sum = 0.0;
    for (int64_t t = tlo; t < thi; t++) sum += (double)src[first + t];
    sums[o] = sum;
  }
}

DKS_VECTOR_CLONES static void average_pool_rows_f32(void *ctx, int64_t begin, int64_t end) {
  pool_job *job = ctx;
  const linalg_window *w = job->w;
  int64_t h = w->target[0], wd = w->target[1], oh = w->grid[0], ow = w->grid[1];
  int64_t kh = w->kernel[0], sh = w->stride[0], ph = w->pad[0];
  int64_t rows_max = (job->band - 1) * sh + kh; /* input rows a band reads, at most */
  if (rows_max > h) rows_max = h;
  /* scratch: the band's row sums, a row of zeros, one of sums, and per count of window rows
   * (0 to kh) its scales, 1 / (that count x the column's), and 1 once they are computed */
  double *sums = chunk_scratch(job, (rows_max + 2) * ow + (kh + 1) * (ow + 1), sizeof *sums);
  if (!sums) return;
  double *zeros = sums + rows_max * ow, *acc = zeros + ow, *scales = acc + ow;
  double *scaled = scales + (kh + 1) * ow;
  memset(zeros, 0, (size_t)ow * sizeof *zeros);
  memset(scaled, 0, (size_t)(kh + 1) * sizeof *scaled);
  const int64_t *columns = job->include_pad ? job->last_padded : job->last_count;
  int64_t lo, hi; /* the interior columns, whose every tap lies inside the row */
  linalg_valid_range(-w->pad[1], w->stride[1], ow, wd - (w->kernel[1] - 1), &lo, &hi);
  for (int64_t item = begin; item < end; item++) {
    int64_t p = item / job->bands, oy0 = item % job->bands * job->band;
    int64_t oy1 = oh - oy0 < job->band ? oh : oy0 + job->band;
    const float *plane = (const float *)job->x + p * job->in_plane;
    /* input rows [first, last) under the band's windows; with kh <= sh some are between */
    int64_t first = oy0 * sh - ph, last = (oy1 - 1) * sh - ph + kh;
    first = first < 0 ? 0 : first;
    last = last > h ? h : last;
    for (int64_t iy = first; iy < last; iy++)
      if (kh > sh || (iy + ph) % sh < kh)
        average_pool_row_sums(w, plane + iy * wd, lo, hi, sums + (iy - first) * ow);
    for (int64_t oy = oy0; oy < oy1; oy++) {
      int64_t top = oy * sh - ph, tlo, thi, plo, phi; /* the window rows inside, padded */
      linalg_valid_range(top, 1, kh, h, &tlo, &thi);
      linalg_valid_range(top + ph, 1, kh, h + ph + w->pad_end[0], &plo, &phi);
      int64_t outer = job->include_pad ? phi - plo : thi - tlo;
      double *scale = scales + outer * ow;
      if (!scaled[outer]) {
        for (int64_t o = 0; o < ow; o++) scale[o] = 1.0 / ((double)outer * (double)columns[o]);
        scaled[outer] = 1.0;
      }
      float *y = (float *)job->y + p * job->out_plane + oy * ow;
      const double *r[3]; /* window row t's sums: zeros outside the input */
      for (int64_t t = 0; t < 3 && t < kh; t++)
        r[t] = t >= tlo && t < thi ? sums + (top + t - first) * ow : zeros;
      if (kh == 3) {
        for (int64_t o = 0; o < ow; o++) y[o] = (float)(((r[0][o] + r[1][o]) + r[2][o]) * scale[o]);
      } else if (kh == 2) {
        for (int64_t o = 0; o < ow; o++) y[o] = (float)((r[0][o] + r[1][o]) * scale[o]);
      } else {
        memset(acc, 0, (size_t)ow * sizeof *acc);
        for (int64_t t = tlo; t < thi; t++)
          for (int64_t o = 0; o < ow; o++) acc[o] += sums[(top + t - first) * ow + o];
        for (int64_t o = 0; o < ow; o++) y[o] = (float)(acc[o] * scale[o]);
      }
    }
  }
  free(sums);
}

/* A separable band's row sums stay about this small (doubles). */
#define POOL_BAND_DOUBLES ((int64_t)1 << 13)

static DK_Status average_pool(const dks_kernel_args *k) {
  const dks_tensor *x = &k->in[0], *y = &k->out[0];
  if (y->size == 0) return DK_OK;
  linalg_window w;
  pool_window_of(k, &w);
  int64_t items, grain;
  pool_job job = pool_job_of(k, &w, &items, &grain);
  job.include_pad = dks_attr_int(k, "count_include_pad", 0) == 1;
  /* Per output column: the last axis's taps inside X and inside the padded X. */
  int32_t last = w.n - 1;
  int64_t width = w.grid[last];
  int64_t *columns = linalg_scratch(k, (size_t)(2 * width), sizeof *columns);
  if (!columns) return DK_RESOURCE_EXHAUSTED;
  for (int64_t o = 0; o < width; o++) {
    int64_t first = o * w.stride[last] - w.pad[last], lo, hi;
    linalg_valid_range(first, w.dilation[last], w.kernel[last], w.target[last], &lo, &hi);
    columns[o] = hi - lo;
    linalg_valid_range(first + w.pad[last], w.dilation[last], w.kernel[last],
                       w.target[last] + w.pad[last] + w.pad_end[last], &lo, &hi);
    columns[width + o] = hi - lo;
  }
  job.last_count = columns;
  job.last_padded = columns + width;
  dks_range_fn fn = x->dtype == DK_DTYPE_FLOAT64 ? average_pool_f64 : average_pool_f32;
  if (w.n == 2 && w.dilation[0] == 1 && w.dilation[1] == 1 && x->dtype != DK_DTYPE_FLOAT64) {
    /* Bands whose row sums stay in L1, at least a few items per thread. */
    int64_t planes = x->shape[0] * x->shape[1], oh = w.grid[0];
    int64_t band = (POOL_BAND_DOUBLES / width - w.kernel[0]) / w.stride[0] + 1;
    int64_t per_plane = (4 * dks_thread_count() + planes - 1) / planes;
    if (band > (oh + per_plane - 1) / per_plane) band = (oh + per_plane - 1) / per_plane;
    job.band = band < 1 ? 1 : band;
    job.bands = (oh + job.band - 1) / job.band;
    items = planes * job.bands;
    int64_t item_adds = job.band * width * (w.kernel[0] + w.kernel[1]);
    grain = item_adds >= POOL_CHUNK_TAPS ? 1 : POOL_CHUNK_TAPS / (item_adds > 0 ? item_adds : 1);
    fn = average_pool_rows_f32;
  }
  dks_parallel_for(items, grain, fn, &job);
  free(columns);
  if (job.failed) return dks_kernel_fail(k, DK_RESOURCE_EXHAUSTED, "out of host memory for a row of sums");
  return DK_OK;
}

static DK_Status average_pool_low(const dks_kernel_args *k) {
  return linalg_run_as_f32(k, average_pool);
}

/* ---- Global pools ------------------------------------------------------------------- */

/* Pairwise summation in float64: the error grows with log2(n), not n. */
#define PAIRWISE_SUM(NAME, T)                                                             \
  static double NAME(const T *x, int64_t n) {                                             \
    if (n > 256) {                                                                        \
      int64_t half = n / 2;                                                               \
      return NAME(x, half) + NAME(x + half, n - half);                                    \
    }                                                                                     \
    double sum = 0.0;                                                                     \
    for (int64_t i = 0; i < n; i++) sum += x[i];                                          \
    return sum;                                                                           \
  }
PAIRWISE_SUM(pairwise_sum_f32, float)
PAIRWISE_SUM(pairwise_sum_f64, double)

/* Per (N, C) plane of a non-empty x: the mean or the maximum (NaN
 * propagating). */
#define GLOBAL_POOL_LANES 8
#define GLOBAL_POOLS(AVERAGE, MAX, T, SUM)                                                \
  static void AVERAGE(const T *x, T *y, int64_t planes, int64_t plane) {                  \
    int64_t p = 0;                                                                        \
    /* Planes of SUM's one run (256 or fewer) GLOBAL_POOL_LANES at a time, each           \
     * summed in the same order as alone: one chain of dependent adds per plane           \
     * took about 4x as long (the zoo resnet's 64 planes of 8x8: 1.4 us). */              \
    for (; plane <= 256 && p + GLOBAL_POOL_LANES <= planes; p += GLOBAL_POOL_LANES) {     \
      double sum[GLOBAL_POOL_LANES] = {0};                                                \
      const T *src = x + p * plane;                                                       \
      for (int64_t i = 0; i < plane; i++)                                                 \
        for (int l = 0; l < GLOBAL_POOL_LANES; l++) sum[l] += src[l * plane + i];         \
      for (int l = 0; l < GLOBAL_POOL_LANES; l++) y[p + l] = (T)(sum[l] / (double)plane); \
    }                                                                                     \
    for (; p < planes; p++) y[p] = (T)(SUM(x + p * plane, plane) / (double)plane);        \
  }                                                                                       \
  static void MAX(const T *x, T *y, int64_t planes, int64_t plane) {                      \
    for (int64_t p = 0; p < planes; p++) {                                                \
      const T *src = x + p * plane;                                                       \
      T best = src[0];                                                                    \
      for (int64_t i = 1; i < plane; i++)                                                 \
        if (src[i] > best || (src[i] != src[i] && best == best)) best = src[i];           \
      y[p] = best;                                                                        \
    }                                                                                     \
  }
GLOBAL_POOLS(global_average_f32, global_max_f32, float, pairwise_sum_f32)
GLOBAL_POOLS(global_average_f64, global_max_f64, double, pairwise_sum_f64)

static DK_Status global_pool(const dks_kernel_args *k, bool average) {
  const dks_tensor *x = &k->in[0], *y = &k->out[0];
  if (y->size == 0) return DK_OK;
  int64_t planes = x->shape[0] * x->shape[1], plane = linalg_prod(x->shape + 2, x->ndim - 2);
  if (plane == 0) { /* empty planes: the mean of nothing, the identity of max */
    for (int64_t p = 0; p < planes; p++)
      dks_store_from_double(y->data + p * y->itemsize, y->dtype, average ? NAN : -INFINITY);
  } else if (x->dtype == DK_DTYPE_FLOAT64)
    (average ? global_average_f64 : global_max_f64)((const double *)x->data, (double *)y->data, planes, plane);
  else
    (average ? global_average_f32 : global_max_f32)((const float *)x->data, (float *)y->data, planes, plane);
  return DK_OK;
}

static DK_Status global_average_pool(const dks_kernel_args *k) { return global_pool(k, true); }
static DK_Status global_max_pool(const dks_kernel_args *k) { return global_pool(k, false); }
static DK_Status global_average_pool_low(const dks_kernel_args *k) {
  return linalg_run_as_f32(k, global_average_pool);
}
static DK_Status global_max_pool_low(const dks_kernel_args *k) {
  return linalg_run_as_f32(k, global_max_pool);
}

/* Compact tensors only: the host copies strided inputs. */
static const dks_kernel_def k_linalg_pool[] = {
    {"MaxPool", DK_DTYPE_FLOAT32, max_pool, 0},
    {"MaxPool", DK_DTYPE_FLOAT64, max_pool, 0},
    {"MaxPool", DK_DTYPE_FLOAT16, max_pool_low, 0},
    {"MaxPool", DK_DTYPE_BFLOAT16, max_pool_low, 0},
    {"MaxPool", DK_DTYPE_INT8, max_pool, 0},
    {"MaxPool", DK_DTYPE_UINT8, max_pool, 0},
    {"AveragePool", DK_DTYPE_FLOAT32, average_pool, 0},
    {"AveragePool", DK_DTYPE_FLOAT64, average_pool, 0},
    {"AveragePool", DK_DTYPE_FLOAT16, average_pool_low, 0},
    {"AveragePool", DK_DTYPE_BFLOAT16, average_pool_low, 0},
    {"GlobalAveragePool", DK_DTYPE_FLOAT32, global_average_pool, 0},
    {"GlobalAveragePool", DK_DTYPE_FLOAT64, global_average_pool, 0},
    {"GlobalAveragePool", DK_DTYPE_FLOAT16, global_average_pool_low, 0},
    {"GlobalAveragePool", DK_DTYPE_BFLOAT16, global_average_pool_low, 0},
    {"GlobalMaxPool", DK_DTYPE_FLOAT32, global_max_pool, 0},
    {"GlobalMaxPool", DK_DTYPE_FLOAT64, global_max_pool, 0},
    {"GlobalMaxPool", DK_DTYPE_FLOAT16, global_max_pool_low, 0},
    {"GlobalMaxPool", DK_DTYPE_BFLOAT16, global_max_pool_low, 0},
};
DKS_REGISTER_KERNELS(k_linalg_pool)

/* X (N, C, D...) to Y (N, C, O...) (and MaxPool's int64 Indices of Y's shape). */
static DK_Status validate_pool(const dks_kernel_args *k) {
  DK_Status st = dks_check_rank(k, 0, 3, DKS_MAX_DIMS);
  if (st != DK_OK) return st;
  const dks_tensor *x = &k->in[0];
  int64_t out[DKS_MAX_DIMS] = {x->shape[0], x->shape[1]};
  if ((st = linalg_check_window(k, x->ndim, x->shape, NULL, true, false, out + 2)) != DK_OK) return st;
  if ((st = dks_check_dtype(k, "output", 0, x->dtype)) != DK_OK) return st;
  if ((st = dks_check_output(k, 0, x->ndim, out)) != DK_OK) return st;
  if (k->num_outputs > 1 && strcmp(k->op, "MaxPool") == 0) {
    if ((st = dks_check_dtype(k, "output", 1, DK_DTYPE_INT64)) != DK_OK) return st;
    return dks_check_output(k, 1, x->ndim, out);
  }
  return DK_OK;
}

/* X (N, C, D...) to Y (N, C, 1, ...); a rank-2 X has no spatial dims (each plane is one element). */
static DK_Status validate_global_pool(const dks_kernel_args *k) {
  DK_Status st = dks_check_rank(k, 0, 2, DKS_MAX_DIMS);
  if (st != DK_OK) return st;
  const dks_tensor *x = &k->in[0];
  int64_t out[DKS_MAX_DIMS];
  for (int32_t d = 0; d < x->ndim; d++) out[d] = d < 2 ? x->shape[d] : 1;
  if ((st = dks_check_dtype(k, "output", 0, x->dtype)) != DK_OK) return st;
  return dks_check_output(k, 0, x->ndim, out);
}

static const dks_validator v_linalg_pool[] = {
    {"MaxPool", validate_pool},
    {"AveragePool", validate_pool},
    {"GlobalAveragePool", validate_global_pool},
    {"GlobalMaxPool", validate_global_pool},
};
DKS_REGISTER_VALIDATORS(v_linalg_pool)
