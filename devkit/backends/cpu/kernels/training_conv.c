/*
 * training_conv.c -- ConvGrad: the gradients of Conv with respect to X, W
 * and B, through OpenBLAS.
 *
 * Per image and group, over bands of output positions: the im2col columns
 * of X give dW += dY col^T (one GEMM), and dcol = W^T dY (another) is
 * scattered back into dX by col2im, the adjoint of im2col. dB sums dY over
 * the batch and the output positions. The geometry is Conv's
 * (linalg_window_forward, with dY's spatial sizes as the grid); float16 and
 * bfloat16 run as float32 (linalg_run_as_f32).
 */
#include "linalg.h"
#include "training.h"

#include <stdlib.h>

/* Column buffers cover a band of output positions: at most this many
 * elements each, or one position's column when that is larger. */
#define COL_BUDGET ((int64_t)1 << 21)

/* off[j] = the input-plane offset (row-major) that kernel tap `tap` reads at
 * output position p0 + j, or -1 where it falls in the padding. */
static void tap_offsets(const linalg_window *w, const int64_t *tap, int64_t p0, int64_t count, int64_t *off) {
  int64_t q[CPU_MAX_DIMS];
  for (int32_t d = w->n - 1; d >= 0; d--) {
    q[d] = p0 % w->grid[d];
    p0 /= w->grid[d];
  }
  for (int64_t j = 0; j < count; j++) {
    int64_t at = 0;
    bool inside = true;
    for (int32_t d = 0; d < w->n; d++) {
      int64_t pos = q[d] * w->stride[d] - w->pad[d] + tap[d] * w->dilation[d];
      inside = inside && pos >= 0 && pos < w->target[d];
      at = at * w->target[d] + pos;
    }
    off[j] = inside ? at : -1;
    for (int32_t d = w->n - 1; d >= 0 && ++q[d] == w->grid[d]; d--) q[d] = 0;
  }
}

static void next_tap(int64_t *tap, const linalg_window *w) {
  for (int32_t d = w->n - 1; d >= 0; d--) {
    if (++tap[d] < w->kernel[d]) return;
    tap[d] = 0;
  }
}

/* im2col: col[(c, t)][j] = image[c] at tap t of position p0 + j (0 in the
 * padding). col2im: image[c] at that place += col[(c, t)][j]. `off` is
 * scratch for one tap's offsets. */
#define COLUMNS(SFX, T)                                                                         \
  static void im2col_##SFX(const linalg_window *w, const T *image, int64_t channels, int64_t p0, \
                           int64_t count, T *col, int64_t *off) {                                \
    int64_t taps = linalg_prod(w->kernel, w->n), plane = linalg_prod(w->target, w->n);            \
    int64_t tap[CPU_MAX_DIMS] = {0};                                                            \
    for (int64_t t = 0; t < taps; t++, next_tap(tap, w)) {                                      \
      tap_offsets(w, tap, p0, count, off);                                                      \
      for (int64_t c = 0; c < channels; c++) {                                                  \
        const T *src = image + c * plane;                                                       \
        T *dst = col + (c * taps + t) * count;                                                  \
        for (int64_t j = 0; j < count; j++) dst[j] = off[j] >= 0 ? src[off[j]] : (T)0;          \
      }                                                                                         \
    }                                                                                           \
  }                                                                                             \
  static void col2im_##SFX(const linalg_window *w, const T *col, int64_t channels, int64_t p0,   \
                           int64_t count, T *image, int64_t *off) {                              \
    int64_t taps = linalg_prod(w->kernel, w->n), plane = linalg_prod(w->target, w->n);            \
    int64_t tap[CPU_MAX_DIMS] = {0};                                                            \
    for (int64_t t = 0; t < taps; t++, next_tap(tap, w)) {                                      \
      tap_offsets(w, tap, p0, count, off);                                                      \
      for (int64_t c = 0; c < channels; c++) {                                                  \
        T *dst = image + c * plane;                                                             \
        const T *src = col + (c * taps + t) * count;                                            \
        for (int64_t j = 0; j < count; j++)                                                     \
          if (off[j] >= 0) dst[off[j]] += src[j];                                               \
      }                                                                                         \
    }                                                                                           \
  }
COLUMNS(f32, float)
COLUMNS(f64, double)

/* db[m] = sum of dY[n, m, ...] over n and the plane, pairwise per plane. */
static DK_Status bias_grad(const cpu_kernel_args *k, const cpu_tensor *dy, const cpu_tensor *db, int64_t plane) {
  int64_t batch = dy->size ? dy->shape[0] : 0, filters = dy->shape[1];
  double *sums = training_scratch(k, filters + plane);
  if (!sums) return DK_RESOURCE_EXHAUSTED;
  double *row = sums + filters;
  for (int64_t n = 0; n < batch; n++) {
    for (int64_t m = 0; m < filters; m++) {
      training_widen(row, dy->data + (n * filters + m) * plane * dy->itemsize, dy->dtype, plane);
      sums[m] += training_sum(row, plane);
    }
  }
  training_narrow(db->data, db->dtype, sums, filters);
  free(sums);
  return DK_OK;
}

static DK_Status conv_grad_float(const cpu_kernel_args *k) {
  const cpu_tensor *dy = &k->in[0], *x = &k->in[1], *wt = &k->in[2];
  const cpu_tensor *dx = &k->out[0], *dw = &k->out[1], *db = &k->out[2];
  if (dx->size) memset(dx->data, 0, (size_t)(dx->size * dx->itemsize));
  if (dw->size) memset(dw->data, 0, (size_t)(dw->size * dw->itemsize));
  linalg_window w;
  linalg_window_forward(k, x->ndim - 2, x->shape + 2, dy->shape + 2, wt->shape + 2, &w);
  int64_t in_plane = linalg_prod(w.target, w.n), out_plane = linalg_prod(w.grid, w.n);
  DK_Status st = bias_grad(k, dy, db, out_plane);
  /* Without products (no images, channels, filters or positions) dX and dW stay 0. */
  if (st != DK_OK || dy->size == 0 || x->size == 0) return st;
  linalg_real real = linalg_real_of(dx);
  int64_t es = dx->itemsize, group = cpu_attr_int(k, "group", 1);
  int64_t cg = x->shape[1] / group, mg = dy->shape[1] / group, rows = cg * linalg_prod(w.kernel, w.n);
  int64_t band = rows > 0 ? COL_BUDGET / rows : out_plane;
  band = band < 1 ? 1 : band > out_plane ? out_plane : band;
  uint8_t *col = linalg_scratch(k, (size_t)(2 * rows * band), (size_t)es);
  int64_t *off = col ? linalg_scratch(k, (size_t)band, sizeof *off) : NULL;
  if (!off) {
    free(col);
    return DK_RESOURCE_EXHAUSTED;
  }
  uint8_t *dcol = col + rows * band * es;
  for (int64_t n = 0; n < x->shape[0]; n++) {
    for (int64_t g = 0; g < group; g++) {
      const uint8_t *xg = x->data + (n * x->shape[1] + g * cg) * in_plane * es;
      const uint8_t *dyg = dy->data + (n * dy->shape[1] + g * mg) * out_plane * es;
      const uint8_t *wg = wt->data + g * mg * rows * es;
      uint8_t *dxg = dx->data + (n * x->shape[1] + g * cg) * in_plane * es;
      uint8_t *dwg = dw->data + g * mg * rows * es;
      for (int64_t p0 = 0; p0 < out_plane; p0 += band) {
        int64_t count = out_plane - p0 < band ? out_plane - p0 : band;
        if (real == LINALG_F64)
          im2col_f64(&w, (const double *)xg, cg, p0, count, (double *)col, off);
        else
          im2col_f32(&w, (const float *)xg, cg, p0, count, (float *)col, off);
        /* dW_g (mg x rows) += dY_g[:, band] (mg x count) @ col^T (count x rows) */
        linalg_gemm(real, false, true, mg, rows, count, 1.0, dyg + p0 * es, out_plane, col, count, 1.0, dwg,
                    rows);
        /* dcol (rows x count) = W_g^T (rows x mg) @ dY_g[:, band] (mg x count) */
        linalg_gemm(real, true, false, rows, count, mg, 1.0, wg, rows, dyg + p0 * es, out_plane, 0.0, dcol,
                    count);
        if (real == LINALG_F64)
          col2im_f64(&w, (const double *)dcol, cg, p0, count, (double *)dxg, off);
        else
          col2im_f32(&w, (const float *)dcol, cg, p0, count, (float *)dxg, off);
      }
    }
  }
  free(off);
  free(col);
  return DK_OK;
}

static DK_Status conv_grad_low(const cpu_kernel_args *k) { return linalg_run_as_f32(k, conv_grad_float); }

/* Compact tensors only: the host copies strided inputs. */
static const cpu_kernel_def k_training_conv[] = {
    {"ConvGrad", DK_DTYPE_FLOAT32, conv_grad_float, 0},
    {"ConvGrad", DK_DTYPE_FLOAT64, conv_grad_float, 0},
    {"ConvGrad", DK_DTYPE_FLOAT16, conv_grad_low, 0},
    {"ConvGrad", DK_DTYPE_BFLOAT16, conv_grad_low, 0},
};
CPU_REGISTER_KERNELS(k_training_conv)

/* ConvGrad(dY, X, W) -> dX (X's shape), dW (W's), dB (M): dY is Conv(X, W)'s shape. */
static DK_Status validate_conv_grad(const cpu_kernel_args *k) {
  DK_Status st = cpu_check_rank(k, 1, 3, CPU_MAX_DIMS);
  if (st == DK_OK) st = cpu_check_rank(k, 2, k->in[1].ndim, k->in[1].ndim);
  if (st == DK_OK) st = cpu_check_rank(k, 0, k->in[1].ndim, k->in[1].ndim);
  int64_t y[CPU_MAX_DIMS];
  if (st == DK_OK) st = linalg_check_conv(k, &k->in[1], &k->in[2], NULL, false, y);
  for (size_t i = 1; st == DK_OK && i < 3; i++) st = cpu_check_dtype(k, "input", i, k->in[0].dtype);
  for (size_t j = 0; st == DK_OK && j < k->num_outputs; j++) st = cpu_check_dtype(k, "output", j, k->in[0].dtype);
  if (st != DK_OK) return st;
  bool same = true;
  for (int32_t d = 0; d < k->in[1].ndim; d++) same = same && k->in[0].shape[d] == y[d];
  if (!same) return cpu_invalid(k, "dY's shape is not what Conv of X and W gives");
  if ((st = cpu_check_output_like(k, 0, 1)) != DK_OK) return st;
  if (k->num_outputs > 1 && (st = cpu_check_output_like(k, 1, 2)) != DK_OK) return st;
  if (k->num_outputs > 2) st = cpu_check_output(k, 2, 1, &k->in[2].shape[0]);
  return st;
}

static const cpu_validator v_training_conv[] = {{"ConvGrad", validate_conv_grad}};
CPU_REGISTER_VALIDATORS(v_training_conv)
