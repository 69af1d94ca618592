/*
 * linalg_pool.c -- MaxPool, AveragePool, GlobalMaxPool, GlobalAveragePool.
 *
 * Windows are clipped to the input per axis (the padding is never read);
 * sums are taken in float64. NaN propagates (see devkit/ops/linalg.py).
 * float16/bfloat16 run as float32, which is exact for the maxima.
 */
#include "linalg.h"

/* The window of one output position, per axis: where tap 0 lands (first)
 * and the taps [lo, hi) that land inside the input. */
typedef struct pool_window {
  int64_t first[CPU_MAX_DIMS], lo[CPU_MAX_DIMS], hi[CPU_MAX_DIMS];
  bool empty;
} pool_window;

static void window_at(const linalg_window *w, const int64_t *q, pool_window *pw) {
  pw->empty = false;
  for (int32_t d = 0; d < w->n; d++) {
    pw->first[d] = q[d] * w->stride[d] - w->pad[d];
    linalg_valid_range(pw->first[d], w->dilation[d], w->kernel[d], w->target[d], &pw->lo[d], &pw->hi[d]);
    pw->empty = pw->empty || pw->lo[d] == pw->hi[d];
  }
}

/* Taps inside the explicitly padded input, for count_include_pad. */
static int64_t padded_taps(const linalg_window *w, const pool_window *pw) {
  int64_t count = 1;
  for (int32_t d = 0; d < w->n; d++) {
    int64_t lo, hi;
    linalg_valid_range(pw->first[d] + w->pad[d], w->dilation[d], w->kernel[d],
                       w->target[d] + w->pad[d] + w->pad_end[d], &lo, &hi);
    count *= hi - lo;
  }
  return count;
}

static void next_position(int64_t *q, const int64_t *shape, int32_t n) {
  for (int32_t d = n - 1; d >= 0; d--) {
    if (++q[d] < shape[d]) return;
    q[d] = 0;
  }
}

/* Visits the input offsets (row-major in the plane) of a non-empty window,
 * tap order row-major: BODY sees `at`. The last axis is the inner loop. */
#define FOR_EACH_TAP(w, pw, BODY)                                                         \
  do {                                                                                    \
    int32_t last_ = (w)->n - 1;                                                           \
    int64_t tap_[CPU_MAX_DIMS];                                                           \
    for (int32_t d_ = 0; d_ < (w)->n; d_++) tap_[d_] = (pw)->lo[d_];                      \
    for (;;) {                                                                            \
      int64_t row_ = 0;                                                                   \
      for (int32_t d_ = 0; d_ < last_; d_++)                                              \
        row_ = row_ * (w)->target[d_] + (pw)->first[d_] + tap_[d_] * (w)->dilation[d_];   \
      row_ = row_ * (w)->target[last_] + (pw)->first[last_];                              \
      for (int64_t t_ = (pw)->lo[last_]; t_ < (pw)->hi[last_]; t_++) {                    \
        int64_t at = row_ + t_ * (w)->dilation[last_];                                    \
        BODY;                                                                             \
      }                                                                                   \
      int32_t d_ = last_ - 1;                                                             \
      for (; d_ >= 0; d_--) {                                                             \
        if (++tap_[d_] < (pw)->hi[d_]) break;                                             \
        tap_[d_] = (pw)->lo[d_];                                                          \
      }                                                                                   \
      if (d_ < 0) break;                                                                  \
    }                                                                                     \
  } while (0)

/* A row-major offset in the input plane as a column-major one. */
static int64_t column_major(const linalg_window *w, int64_t at) {
  int64_t coords[CPU_MAX_DIMS];
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

/* ---- MaxPool ----------------------------------------------------------------------- */

/* The first maximum in tap order wins; a NaN beats every number, the first
 * NaN every later one. An empty window gives LOWEST and index -1. */
#define MAX_POOL(NAME, T, LOWEST, IS_NAN)                                                 \
  static void NAME(const linalg_window *w, const T *x, T *y, int64_t *indices, int64_t planes, \
                   bool col_major) {                                                      \
    int64_t in_plane = linalg_prod(w->target, w->n), out_plane = linalg_prod(w->grid, w->n); \
    for (int64_t p = 0; p < planes; p++) {                                                \
      int64_t base = p * in_plane; /* offsets: x is NULL when empty */                    \
      int64_t q[CPU_MAX_DIMS] = {0};                                                      \
      for (int64_t o = 0; o < out_plane; o++, next_position(q, w->grid, w->n)) {          \
        pool_window pw;                                                                   \
        window_at(w, q, &pw);                                                             \
        T best = LOWEST;                                                                  \
        int64_t best_at = -1;                                                             \
        if (!pw.empty)                                                                    \
          FOR_EACH_TAP(w, &pw, {                                                          \
            T v = x[base + at];                                                           \
            if (best_at < 0 || v > best || (IS_NAN(v) && !IS_NAN(best))) {                \
              best = v;                                                                   \
              best_at = at;                                                               \
            }                                                                             \
          });                                                                             \
        y[p * out_plane + o] = best;                                                      \
        indices[p * out_plane + o] =                                                      \
            best_at < 0 ? -1 : base + (col_major ? column_major(w, best_at) : best_at);   \
      }                                                                                   \
    }                                                                                     \
  }

#define FLOAT_IS_NAN(v) ((v) != (v))
#define INT_IS_NAN(v) false
MAX_POOL(max_pool_f32, float, -INFINITY, FLOAT_IS_NAN)
MAX_POOL(max_pool_f64, double, -INFINITY, FLOAT_IS_NAN)
MAX_POOL(max_pool_i8, int8_t, INT8_MIN, INT_IS_NAN)
MAX_POOL(max_pool_u8, uint8_t, 0, INT_IS_NAN)

/* Window geometry of a pool: X (N, C, D...) to Y (N, C, O...). */
static void pool_window_of(const cpu_kernel_args *k, linalg_window *w) {
  const cpu_tensor *x = &k->in[0], *y = &k->out[0];
  int64_t count;
  const int64_t *kernel = cpu_attr_ints(k, "kernel_shape", &count);
  linalg_window_forward(k, x->ndim - 2, x->shape + 2, y->shape + 2, kernel, w);
}

static DK_Status max_pool(const cpu_kernel_args *k) {
  const cpu_tensor *x = &k->in[0], *y = &k->out[0];
  if (y->size == 0) return DK_OK;
  linalg_window w;
  pool_window_of(k, &w);
  int64_t planes = x->shape[0] * x->shape[1];
  bool col_major = cpu_attr_int(k, "storage_order", 0) == 1;
  int64_t *indices = (int64_t *)k->out[1].data;
  switch ((int)x->dtype) {
    case DK_DTYPE_FLOAT64:
      max_pool_f64(&w, (const double *)x->data, (double *)y->data, indices, planes, col_major);
      break;
    case DK_DTYPE_INT8:
      max_pool_i8(&w, (const int8_t *)x->data, (int8_t *)y->data, indices, planes, col_major);
      break;
    case DK_DTYPE_UINT8:
      max_pool_u8(&w, x->data, y->data, indices, planes, col_major);
      break;
    default:
      max_pool_f32(&w, (const float *)x->data, (float *)y->data, indices, planes, col_major);
      break;
  }
  return DK_OK;
}

static DK_Status max_pool_low(const cpu_kernel_args *k) { return linalg_run_as_f32(k, max_pool); }

/* ---- AveragePool -------------------------------------------------------------------- */

/* The float64 sum over the window's taps inside the input, over the count of
 * those taps (or, with include_pad, of the taps inside the padded input). */
#define AVERAGE_POOL(NAME, T)                                                             \
  static void NAME(const linalg_window *w, const T *x, T *y, int64_t planes, bool include_pad) { \
    int64_t in_plane = linalg_prod(w->target, w->n), out_plane = linalg_prod(w->grid, w->n); \
    for (int64_t p = 0; p < planes; p++) {                                                \
      int64_t base = p * in_plane;                                                        \
      int64_t q[CPU_MAX_DIMS] = {0};                                                      \
      for (int64_t o = 0; o < out_plane; o++, next_position(q, w->grid, w->n)) {          \
        pool_window pw;                                                                   \
        window_at(w, q, &pw);                                                             \
        double sum = 0.0;                                                                 \
        int64_t count = 0;                                                                \
        if (!pw.empty) FOR_EACH_TAP(w, &pw, { sum += x[base + at]; count++; });           \
        if (include_pad) count = padded_taps(w, &pw);                                     \
        y[p * out_plane + o] = (T)(sum / (double)count);                                  \
      }                                                                                   \
    }                                                                                     \
  }
AVERAGE_POOL(average_pool_f32, float)
AVERAGE_POOL(average_pool_f64, double)

static DK_Status average_pool(const cpu_kernel_args *k) {
  const cpu_tensor *x = &k->in[0], *y = &k->out[0];
  if (y->size == 0) return DK_OK;
  linalg_window w;
  pool_window_of(k, &w);
  int64_t planes = x->shape[0] * x->shape[1];
  bool include_pad = cpu_attr_int(k, "count_include_pad", 0) == 1;
  if (x->dtype == DK_DTYPE_FLOAT64)
    average_pool_f64(&w, (const double *)x->data, (double *)y->data, planes, include_pad);
  else
    average_pool_f32(&w, (const float *)x->data, (float *)y->data, planes, include_pad);
  return DK_OK;
}

static DK_Status average_pool_low(const cpu_kernel_args *k) {
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
#define GLOBAL_POOLS(AVERAGE, MAX, T, SUM)                                                \
  static void AVERAGE(const T *x, T *y, int64_t planes, int64_t plane) {                  \
    for (int64_t p = 0; p < planes; p++) y[p] = (T)(SUM(x + p * plane, plane) / (double)plane); \
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

static DK_Status global_pool(const cpu_kernel_args *k, bool average) {
  const cpu_tensor *x = &k->in[0], *y = &k->out[0];
  if (y->size == 0) return DK_OK;
  int64_t planes = x->shape[0] * x->shape[1], plane = linalg_prod(x->shape + 2, x->ndim - 2);
  if (plane == 0) { /* empty planes: the mean of nothing, the identity of max */
    for (int64_t p = 0; p < planes; p++)
      cpu_store_from_double(y->data + p * y->itemsize, y->dtype, average ? NAN : -INFINITY);
  } else if (x->dtype == DK_DTYPE_FLOAT64)
    (average ? global_average_f64 : global_max_f64)((const double *)x->data, (double *)y->data, planes, plane);
  else
    (average ? global_average_f32 : global_max_f32)((const float *)x->data, (float *)y->data, planes, plane);
  return DK_OK;
}

static DK_Status global_average_pool(const cpu_kernel_args *k) { return global_pool(k, true); }
static DK_Status global_max_pool(const cpu_kernel_args *k) { return global_pool(k, false); }
static DK_Status global_average_pool_low(const cpu_kernel_args *k) {
  return linalg_run_as_f32(k, global_average_pool);
}
static DK_Status global_max_pool_low(const cpu_kernel_args *k) {
  return linalg_run_as_f32(k, global_max_pool);
}

/* Compact tensors only: the host copies strided inputs. */
static const cpu_kernel_def k_linalg_pool[] = {
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
CPU_REGISTER_KERNELS(k_linalg_pool)

/* X (N, C, D...) to Y (N, C, O...) (and MaxPool's int64 Indices of Y's shape). */
static DK_Status validate_pool(const cpu_kernel_args *k) {
  DK_Status st = cpu_check_rank(k, 0, 3, CPU_MAX_DIMS);
  if (st != DK_OK) return st;
  const cpu_tensor *x = &k->in[0];
  int64_t out[CPU_MAX_DIMS] = {x->shape[0], x->shape[1]};
  if ((st = linalg_check_window(k, x->ndim, x->shape, NULL, true, false, out + 2)) != DK_OK) return st;
  if ((st = cpu_check_dtype(k, "output", 0, x->dtype)) != DK_OK) return st;
  if ((st = cpu_check_output(k, 0, x->ndim, out)) != DK_OK) return st;
  if (k->num_outputs > 1 && strcmp(k->op, "MaxPool") == 0) {
    if ((st = cpu_check_dtype(k, "output", 1, DK_DTYPE_INT64)) != DK_OK) return st;
    return cpu_check_output(k, 1, x->ndim, out);
  }
  return DK_OK;
}

/* X (N, C, D...) to Y (N, C, 1, ...); a rank-2 X has no spatial dims (each plane is one element). */
static DK_Status validate_global_pool(const cpu_kernel_args *k) {
  DK_Status st = cpu_check_rank(k, 0, 2, CPU_MAX_DIMS);
  if (st != DK_OK) return st;
  const cpu_tensor *x = &k->in[0];
  int64_t out[CPU_MAX_DIMS];
  for (int32_t d = 0; d < x->ndim; d++) out[d] = d < 2 ? x->shape[d] : 1;
  if ((st = cpu_check_dtype(k, "output", 0, x->dtype)) != DK_OK) return st;
  return cpu_check_output(k, 0, x->ndim, out);
}

static const cpu_validator v_linalg_pool[] = {
    {"MaxPool", validate_pool},
    {"AveragePool", validate_pool},
    {"GlobalAveragePool", validate_global_pool},
    {"GlobalMaxPool", validate_global_pool},
};
CPU_REGISTER_VALIDATORS(v_linalg_pool)
