/*
 * training_pool.c -- MaxPoolGrad and AveragePoolGrad.
 *
 * Both scatter dY into a float64 accumulator of X's shape (windows overlap,
 * so elements gather several contributions), rounded once into dX.
 * MaxPoolGrad follows MaxPool's Indices; AveragePoolGrad walks AveragePool's
 * windows (linalg_window_forward, dY's spatial sizes as the grid) and
 * divides by the same count AveragePool does.
 */
#include "linalg.h"
#include "training.h"

#include <stdlib.h>

/* ---- MaxPoolGrad ---------------------------------------------------------------- */

/* MaxPool's column-major spatial offset (storage_order 1) as a row-major one. */
static int64_t row_major(int64_t at, const int64_t *spatial, int32_t n) {
  int64_t coords[DKS_MAX_DIMS];
  for (int32_t d = 0; d < n; d++) {
    coords[d] = at % spatial[d];
    at /= spatial[d];
  }
  int64_t index = 0;
  for (int32_t d = 0; d < n; d++) index = index * spatial[d] + coords[d];
  return index;
}

static DK_Status max_pool_grad(const dks_kernel_args *k) {
  const dks_tensor *dy = &k->in[0], *indices = &k->in[1], *dx = &k->out[0];
  bool column_major = dks_attr_int(k, "storage_order", 0) == 1;
  int32_t n = dx->ndim - 2;
  int64_t plane = training_prod(dx->shape, 2, dx->ndim);
  double *buf = training_scratch(k, dx->size + dy->size);
  if (!buf) return DK_RESOURCE_EXHAUSTED;
  double *acc = buf, *grad = buf + dx->size;
  training_widen(grad, dy->data, dy->dtype, dy->size);
  const int64_t *index = (const int64_t *)indices->data;
  for (int64_t i = 0; i < dy->size; i++) {
    int64_t at = index[i];
    if (at == -1) continue; /* a window that missed X */
    if (at < 0 || at >= dx->size) {
      free(buf);
      return dks_kernel_fail(k, DK_OUT_OF_RANGE,
                             "index %lld (element %lld of Indices) is out of range for X of %lld elements",
                             (long long)at, (long long)i, (long long)dx->size);
    }
    if (column_major) at = at - at % plane + row_major(at % plane, dx->shape + 2, n);
    acc[at] += grad[i];
  }
  training_narrow(dx->data, dx->dtype, acc, dx->size);
  free(buf);
  return DK_OK;
}

/* ---- AveragePoolGrad ------------------------------------------------------------ */

static DK_Status average_pool_grad(const dks_kernel_args *k) {
  const dks_tensor *dy = &k->in[0], *dx = &k->out[0];
  int64_t count;
  const int64_t *kernel = dks_attr_ints(k, "kernel_shape", &count);
  bool include_pad = dks_attr_int(k, "count_include_pad", 0) == 1;
  linalg_window w;
  linalg_window_forward(k, dx->ndim - 2, dx->shape + 2, dy->shape + 2, kernel, &w);
  int64_t in_plane = linalg_prod(w.target, w.n), out_plane = linalg_prod(w.grid, w.n);
  int64_t planes = dx->shape[0] * dx->shape[1];
  double *buf = training_scratch(k, dx->size + dy->size);
  if (!buf) return DK_RESOURCE_EXHAUSTED;
  double *acc = buf, *grad = buf + dx->size;
  training_widen(grad, dy->data, dy->dtype, dy->size);
  for (int64_t p = 0; p < planes; p++) {
    double *plane_acc = acc + p * in_plane;
    const double *plane_grad = grad + p * out_plane;
    int64_t q[DKS_MAX_DIMS] = {0};
    for (int64_t o = 0; o < out_plane; o++) {
      /* The window of output position q: per axis, tap 0 lands at first[d],
       * taps [lo, hi) land inside X (with count_include_pad, those inside
       * the explicitly padded X count too). */
      int64_t first[DKS_MAX_DIMS], lo[DKS_MAX_DIMS], hi[DKS_MAX_DIMS], divisor = 1;
      bool empty = false;
      for (int32_t d = 0; d < w.n; d++) {
        first[d] = q[d] * w.stride[d] - w.pad[d];
        linalg_valid_range(first[d], w.dilation[d], w.kernel[d], w.target[d], &lo[d], &hi[d]);
        empty = empty || lo[d] == hi[d];
        int64_t plo = lo[d], phi = hi[d];
        if (include_pad)
          linalg_valid_range(first[d] + w.pad[d], w.dilation[d], w.kernel[d],
                             w.target[d] + w.pad[d] + w.pad_end[d], &plo, &phi);
        divisor *= phi - plo;
      }
      for (int32_t d = w.n - 1; d >= 0 && ++q[d] == w.grid[d]; d--) q[d] = 0;
      if (empty) continue; /* no element of X to pass a gradient to */
      double share = plane_grad[o] / (double)divisor;
      /* Every tap inside X, row-major. */
      int64_t tap[DKS_MAX_DIMS];
      for (int32_t d = 0; d < w.n; d++) tap[d] = lo[d];
      for (;;) {
        int64_t at = 0;
        for (int32_t d = 0; d < w.n; d++) at = at * w.target[d] + first[d] + tap[d] * w.dilation[d];
        plane_acc[at] += share;
        int32_t d = w.n - 1;
        for (; d >= 0; d--) {
          if (++tap[d] < hi[d]) break;
          tap[d] = lo[d];
        }
        if (d < 0) break;
      }
    }
  }
  training_narrow(dx->data, dx->dtype, acc, dx->size);
  free(buf);
  return DK_OK;
}

/* ---- Registration ----------------------------------------------------------- */

#define POOL_DEFS(SFX, DT)                          \
  {"MaxPoolGrad", DT, max_pool_grad, 0},            \
  {"AveragePoolGrad", DT, average_pool_grad, 0},

static const dks_kernel_def k_training_pool[] = {TRAINING_FLOAT_TYPES(POOL_DEFS)};
DKS_REGISTER_KERNELS(k_training_pool)

/* dX has the shape X_shape names (rank >= 3), and dY the pool's output shape over it. */
static DK_Status validate_pool_grad(const dks_kernel_args *k) {
  int64_t n;
  const int64_t *x_shape = dks_attr_ints(k, "X_shape", &n);
  if (dks_attr(k, "X_shape")->type != DK_ATTR_INTS || n < 3 || n > DKS_MAX_DIMS)
    return dks_invalid(k, "attribute 'X_shape' has %lld values; it needs (N, C, D1, ...)", (long long)n);
  for (int64_t d = 0; d < n; d++)
    if (x_shape[d] < 0) return dks_invalid(k, "attribute 'X_shape' has a negative size %lld", (long long)x_shape[d]);
  DK_Status st = dks_check_output(k, 0, (int32_t)n, x_shape);
  if (st == DK_OK) st = dks_check_rank(k, 0, (int32_t)n, (int32_t)n);
  if (st == DK_OK) st = dks_check_dtype(k, "output", 0, k->in[0].dtype);
  if (st != DK_OK) return st;
  const dks_tensor *dy = &k->in[0];
  if (strcmp(k->op, "MaxPoolGrad") == 0) { /* Indices: int64, dY's shape; the kernel checks their values */
    if ((st = dks_check_rank(k, 1, dy->ndim, dy->ndim)) != DK_OK ||
        (st = dks_check_dtype(k, "input", 1, DK_DTYPE_INT64)) != DK_OK)
      return st;
    for (int32_t d = 0; d < dy->ndim; d++)
      if (k->in[1].shape[d] != dy->shape[d]) return dks_invalid(k, "Indices' shape is not dY's");
    return dy->shape[0] == x_shape[0] && dy->shape[1] == x_shape[1]
               ? DK_OK : dks_invalid(k, "dY's N and C are not X_shape's");
  }
  int64_t y[DKS_MAX_DIMS] = {x_shape[0], x_shape[1]};
  if ((st = linalg_check_window(k, (int32_t)n, x_shape, NULL, true, false, y + 2)) != DK_OK) return st;
  for (int32_t d = 0; d < dy->ndim; d++)
    if (dy->shape[d] != y[d]) return dks_invalid(k, "dY's shape is not what AveragePool of X_shape gives");
  return DK_OK;
}

static const dks_validator v_training_pool[] = {
    {"MaxPoolGrad", validate_pool_grad},
    {"AveragePoolGrad", validate_pool_grad},
};
DKS_REGISTER_VALIDATORS(v_training_pool)
