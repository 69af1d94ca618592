/*
 * linalg_conv.c -- Conv (im2col + GEMM) and ConvTranspose (GEMM + col2im),
 * N-D, per image and group; 1x1 kernels with unit strides and no padding
 * multiply the image directly. float16/bfloat16 run as float32.
 */
#include "linalg.h"

#include <stdlib.h>

/* Column buffers cover a band of grid positions at a time: at most this
 * many elements, or one position's column when that is larger. */
#define COL_BUDGET ((int64_t)1 << 22)

/* ---- Walking a band of grid positions ------------------------------------------- */

/* The grid positions [p0, p0 + count) of one kernel tap, in runs along the
 * last axis. Each run covers columns [p, p + len) of a column-buffer row;
 * column p + j meets target element base + j * step (row-major in the
 * target plane) for j in [lo, hi), and lies in the padding otherwise. */
typedef struct band_walk {
  const linalg_window *w;
  const int64_t *tap;
  int64_t q[CPU_MAX_DIMS]; /* grid coordinates of the next run */
  int64_t p, end;
} band_walk;

typedef struct band_run {
  int64_t p, len, base, step, lo, hi;
} band_run;

static void band_start(band_walk *it, const linalg_window *w, const int64_t *tap, int64_t p0,
                       int64_t count) {
  it->w = w;
  it->tap = tap;
  it->p = p0;
  it->end = p0 + count;
  for (int32_t d = w->n - 1; d >= 0; d--) {
    it->q[d] = p0 % w->grid[d];
    p0 /= w->grid[d];
  }
}

static bool band_next(band_walk *it, band_run *r) {
  const linalg_window *w = it->w;
  int32_t last = w->n - 1;
  if (it->p >= it->end) return false;
  r->p = it->p;
  r->len = w->grid[last] - it->q[last];
  if (r->len > it->end - it->p) r->len = it->end - it->p;
  r->step = w->stride[last];
  int64_t base = 0;
  bool inside = true;
  for (int32_t d = 0; d < last; d++) {
    int64_t pos = it->q[d] * w->stride[d] - w->pad[d] + it->tap[d] * w->dilation[d];
    inside = inside && pos >= 0 && pos < w->target[d];
    base = base * w->target[d] + pos;
  }
  int64_t first = it->q[last] * w->stride[last] - w->pad[last] + it->tap[last] * w->dilation[last];
  r->base = base * w->target[last] + first;
  if (inside) {
    linalg_valid_range(first, r->step, r->len, w->target[last], &r->lo, &r->hi);
  } else {
    r->lo = r->hi = 0;
  }
  it->p += r->len;
  it->q[last] += r->len;
  for (int32_t d = last; d > 0 && it->q[d] == w->grid[d]; d--) {
    it->q[d] = 0;
    it->q[d - 1]++;
  }
  return true;
}

static void next_tap(int64_t *tap, const linalg_window *w) {
  for (int32_t d = w->n - 1; d >= 0; d--) {
    if (++tap[d] < w->kernel[d]) return;
    tap[d] = 0;
  }
}

/* col[(c, tap)][p] = image[c] at the target of grid position p0 + p (0 in
 * the padding), for `channels` planes of the image. */
#define IM2COL(NAME, T)                                                                   \
  static void NAME(const linalg_window *w, const T *image, int64_t channels, int64_t p0,  \
                   int64_t count, T *col) {                                               \
    int64_t taps = linalg_prod(w->kernel, w->n), plane = linalg_prod(w->target, w->n);    \
    for (int64_t c = 0; c < channels; c++) {                                              \
      const T *src = image + c * plane;                                                   \
      int64_t tap[CPU_MAX_DIMS] = {0};                                                    \
      for (int64_t t = 0; t < taps; t++, next_tap(tap, w)) {                              \
        T *dst = col + (c * taps + t) * count;                                            \
        band_walk it;                                                                     \
        band_run r;                                                                       \
        band_start(&it, w, tap, p0, count);                                               \
        while (band_next(&it, &r)) {                                                      \
          T *out = dst + (r.p - p0);                                                      \
          for (int64_t j = 0; j < r.lo; j++) out[j] = 0;                                  \
          for (int64_t j = r.lo; j < r.hi; j++) out[j] = src[r.base + j * r.step];        \
          for (int64_t j = r.hi; j < r.len; j++) out[j] = 0;                              \
        }                                                                                 \
      }                                                                                   \
    }                                                                                     \
  }
IM2COL(im2col_f32, float)
IM2COL(im2col_f64, double)

/* image[m] at the target of grid position p0 + p += col[(m, tap)][p]: the
 * adjoint of im2col, for `channels` planes of the image. */
#define COL2IM(NAME, T)                                                                   \
  static void NAME(const linalg_window *w, const T *col, int64_t channels, int64_t p0,    \
                   int64_t count, T *image) {                                             \
    int64_t taps = linalg_prod(w->kernel, w->n), plane = linalg_prod(w->target, w->n);    \
    for (int64_t c = 0; c < channels; c++) {                                              \
      T *dst = image + c * plane;                                                         \
      int64_t tap[CPU_MAX_DIMS] = {0};                                                    \
      for (int64_t t = 0; t < taps; t++, next_tap(tap, w)) {                              \
        const T *src = col + (c * taps + t) * count;                                      \
        band_walk it;                                                                     \
        band_run r;                                                                       \
        band_start(&it, w, tap, p0, count);                                               \
        while (band_next(&it, &r)) {                                                      \
          const T *in = src + (r.p - p0);                                                 \
          for (int64_t j = r.lo; j < r.hi; j++) dst[r.base + j * r.step] += in[j];        \
        }                                                                                 \
      }                                                                                   \
    }                                                                                     \
  }
COL2IM(col2im_f32, float)
COL2IM(col2im_f64, double)

/* y[n, m, ...] += b[m] */
#define ADD_BIAS(NAME, T)                                                                 \
  static void NAME(T *y, const T *b, int64_t batch, int64_t channels, int64_t plane) {    \
    for (int64_t i = 0; i < batch * channels; i++) {                                      \
      T bias = b[i % channels], *row = y + i * plane;                                     \
      for (int64_t j = 0; j < plane; j++) row[j] += bias;                                 \
    }                                                                                     \
  }
ADD_BIAS(add_bias_f32, float)
ADD_BIAS(add_bias_f64, double)

static void add_bias(linalg_real real, const cpu_tensor *y, const cpu_tensor *b, int64_t plane) {
  if (real == LINALG_F64)
    add_bias_f64((double *)y->data, (const double *)b->data, y->shape[0], y->shape[1], plane);
  else
    add_bias_f32((float *)y->data, (const float *)b->data, y->shape[0], y->shape[1], plane);
}

/* A 1x1 kernel with unit strides and no padding maps grid to target 1:1. */
static bool pointwise(const linalg_window *w) {
  for (int32_t d = 0; d < w->n; d++)
    if (w->kernel[d] != 1 || w->stride[d] != 1 || w->pad[d] != 0 || w->grid[d] != w->target[d])
      return false;
  return true;
}

/* Grid positions per band for columns of `rows` elements. */
static int64_t band_width(int64_t rows, int64_t positions) {
  int64_t band = rows > 0 ? COL_BUDGET / rows : positions;
  if (band > positions) band = positions;
  return band > 0 ? band : 1;
}

static const cpu_tensor *bias_of(const cpu_kernel_args *k) {
  return k->num_inputs > 2 && k->in[2].ndim >= 0 ? &k->in[2] : NULL;
}

/* With no input channels or no input positions nothing is summed: y is the
 * bias (or 0). Handled first, so no pointer is formed from an empty (NULL)
 * tensor's data. */
static bool nothing_summed(linalg_real real, const cpu_tensor *x, const cpu_tensor *y,
                           const cpu_tensor *b, int64_t plane) {
  if (x->size) return false;
  memset(y->data, 0, (size_t)(y->size * y->itemsize));
  if (b) add_bias(real, y, b, plane);
  return true;
}

/* ---- Conv --------------------------------------------------------------------------- */

static DK_Status conv_float(const cpu_kernel_args *k) {
  const cpu_tensor *x = &k->in[0], *wt = &k->in[1], *y = &k->out[0], *b = bias_of(k);
  if (y->size == 0) return DK_OK;
  linalg_real real = linalg_real_of(y);
  int64_t es = y->itemsize;
  linalg_window w;
  linalg_window_forward(k, x->ndim - 2, x->shape + 2, y->shape + 2, wt->shape + 2, &w);
  int64_t group = cpu_attr_int(k, "group", 1);
  int64_t cg = x->shape[1] / group, mg = y->shape[1] / group;
  int64_t rows = cg * linalg_prod(w.kernel, w.n);
  int64_t in_plane = linalg_prod(w.target, w.n), out_plane = linalg_prod(w.grid, w.n);
  if (nothing_summed(real, x, y, b, out_plane)) return DK_OK;
  bool direct = pointwise(&w);
  int64_t band = band_width(rows, out_plane);
  uint8_t *col = direct ? NULL : linalg_scratch(k, (size_t)(rows * band), (size_t)es);
  if (!direct && !col) return DK_RESOURCE_EXHAUSTED;
  for (int64_t n = 0; n < x->shape[0]; n++) {
    for (int64_t g = 0; g < group; g++) {
      const uint8_t *xg = x->data + (n * x->shape[1] + g * cg) * in_plane * es;
      const uint8_t *wg = wt->data + g * mg * rows * es;
      uint8_t *yg = y->data + (n * y->shape[1] + g * mg) * out_plane * es;
      if (direct) {
        linalg_gemm(real, false, false, mg, out_plane, cg, 1.0, wg, rows, xg, in_plane, 0.0, yg, out_plane);
        continue;
      }
      for (int64_t p0 = 0; p0 < out_plane; p0 += band) {
        int64_t count = out_plane - p0 < band ? out_plane - p0 : band;
        if (real == LINALG_F64)
          im2col_f64(&w, (const double *)xg, cg, p0, count, (double *)col);
        else
          im2col_f32(&w, (const float *)xg, cg, p0, count, (float *)col);
        linalg_gemm(real, false, false, mg, count, rows, 1.0, wg, rows, col, count, 0.0, yg + p0 * es,
                    out_plane);
      }
    }
  }
  free(col);
  if (b) add_bias(real, y, b, out_plane);
  return DK_OK;
}

static DK_Status conv_low(const cpu_kernel_args *k) { return linalg_run_as_f32(k, conv_float); }

/* ---- ConvTranspose --------------------------------------------------------------------- */

static int64_t floor_half(int64_t v) { return v >= 0 ? v / 2 : -((-v + 1) / 2); }

/* ConvTranspose's geometry: the grid is the input, the target the output,
 * and the begin pads follow the spec (devkit/ops/linalg.py,
 * conv_transpose_geometry). */
static void window_transpose(const cpu_kernel_args *k, int32_t n, const int64_t *in, const int64_t *out,
                             const int64_t *kernel, linalg_window *w) {
  int64_t ns, nd, np, nop, nshape;
  const int64_t *strides = cpu_attr_ints(k, "strides", &ns);
  const int64_t *dilations = cpu_attr_ints(k, "dilations", &nd);
  const int64_t *pads = cpu_attr_ints(k, "pads", &np);
  const int64_t *output_padding = cpu_attr_ints(k, "output_padding", &nop);
  cpu_attr_ints(k, "output_shape", &nshape);
  const char *auto_pad = cpu_attr_string(k, "auto_pad", "NOTSET");
  bool upper = strcmp(auto_pad, "SAME_UPPER") == 0;
  bool derived = nshape > 0 || upper || strcmp(auto_pad, "SAME_LOWER") == 0;
  bool explicit_pads = strcmp(auto_pad, "NOTSET") == 0 && np == 2 * n;
  memset(w, 0, sizeof *w);
  w->n = n;
  for (int32_t d = 0; d < n; d++) {
    w->grid[d] = in[d];
    w->target[d] = out[d];
    w->kernel[d] = kernel[d];
    w->stride[d] = ns == n ? strides[d] : 1;
    w->dilation[d] = nd == n ? dilations[d] : 1;
    int64_t extra = nop == n ? output_padding[d] : 0;
    int64_t full = in[d] ? w->stride[d] * (in[d] - 1) + extra + (kernel[d] - 1) * w->dilation[d] + 1 : 0;
    if (derived) {
      int64_t total = full - out[d];
      w->pad[d] = upper ? floor_half(total) : total - floor_half(total);
    } else if (explicit_pads) {
      w->pad[d] = pads[d];
    }
  }
}

static DK_Status conv_transpose_float(const cpu_kernel_args *k) {
  const cpu_tensor *x = &k->in[0], *wt = &k->in[1], *y = &k->out[0], *b = bias_of(k);
  if (y->size == 0) return DK_OK;
  linalg_real real = linalg_real_of(y);
  int64_t es = y->itemsize;
  linalg_window w;
  window_transpose(k, x->ndim - 2, x->shape + 2, y->shape + 2, wt->shape + 2, &w);
  int64_t group = cpu_attr_int(k, "group", 1);
  int64_t cg = x->shape[1] / group, mg = wt->shape[1];
  int64_t rows = mg * linalg_prod(w.kernel, w.n);
  int64_t in_plane = linalg_prod(w.grid, w.n), out_plane = linalg_prod(w.target, w.n);
  if (nothing_summed(real, x, y, b, out_plane)) return DK_OK;
  bool direct = pointwise(&w);
  int64_t band = band_width(rows, in_plane);
  uint8_t *col = direct ? NULL : linalg_scratch(k, (size_t)(rows * band), (size_t)es);
  if (!direct && !col) return DK_RESOURCE_EXHAUSTED;
  memset(y->data, 0, (size_t)(y->size * es));
  for (int64_t n = 0; n < x->shape[0]; n++) {
    for (int64_t g = 0; g < group; g++) {
      const uint8_t *xg = x->data + (n * x->shape[1] + g * cg) * in_plane * es;
      const uint8_t *wg = wt->data + g * cg * rows * es;
      uint8_t *yg = y->data + (n * y->shape[1] + g * mg) * out_plane * es;
      if (direct) { /* yg (mg x plane) = wg^T (mg x cg) @ xg (cg x plane) */
        linalg_gemm(real, true, false, mg, in_plane, cg, 1.0, wg, rows, xg, in_plane, 0.0, yg, out_plane);
        continue;
      }
      for (int64_t p0 = 0; p0 < in_plane; p0 += band) {
        int64_t count = in_plane - p0 < band ? in_plane - p0 : band;
        linalg_gemm(real, true, false, rows, count, cg, 1.0, wg, rows, xg + p0 * es, in_plane, 0.0, col,
                    count);
        if (real == LINALG_F64)
          col2im_f64(&w, (const double *)col, mg, p0, count, (double *)yg);
        else
          col2im_f32(&w, (const float *)col, mg, p0, count, (float *)yg);
      }
    }
  }
  free(col);
  if (b) add_bias(real, y, b, out_plane);
  return DK_OK;
}

static DK_Status conv_transpose_low(const cpu_kernel_args *k) {
  return linalg_run_as_f32(k, conv_transpose_float);
}

/* Compact tensors only: the host copies strided inputs. */
static const cpu_kernel_def k_linalg_conv[] = {
    {"Conv", DK_DTYPE_FLOAT32, conv_float, 0},
    {"Conv", DK_DTYPE_FLOAT64, conv_float, 0},
    {"Conv", DK_DTYPE_FLOAT16, conv_low, 0},
    {"Conv", DK_DTYPE_BFLOAT16, conv_low, 0},
    {"ConvTranspose", DK_DTYPE_FLOAT32, conv_transpose_float, 0},
    {"ConvTranspose", DK_DTYPE_FLOAT64, conv_transpose_float, 0},
    {"ConvTranspose", DK_DTYPE_FLOAT16, conv_transpose_low, 0},
    {"ConvTranspose", DK_DTYPE_BFLOAT16, conv_transpose_low, 0},
};
CPU_REGISTER_KERNELS(k_linalg_conv)

/* X, W, optional B and Y: one dtype; Y's shape as X, W and the attributes give it. */
static DK_Status validate_conv_common(const cpu_kernel_args *k, bool transpose) {
  DK_Status st = cpu_check_rank(k, 0, 3, CPU_MAX_DIMS);
  if (st == DK_OK) st = cpu_check_rank(k, 1, k->in[0].ndim, k->in[0].ndim);
  const cpu_tensor *b = k->num_inputs > 2 && k->in[2].ndim >= 0 ? &k->in[2] : NULL;
  int64_t out[CPU_MAX_DIMS];
  if (st == DK_OK) st = linalg_check_conv(k, &k->in[0], &k->in[1], b, transpose, out);
  for (size_t i = 1; st == DK_OK && i < k->num_inputs; i++)
    if (k->in[i].ndim >= 0) st = cpu_check_dtype(k, "input", i, k->in[0].dtype);
  if (st == DK_OK) st = cpu_check_dtype(k, "output", 0, k->in[0].dtype);
  return st != DK_OK ? st : cpu_check_output(k, 0, k->in[0].ndim, out);
}

static DK_Status validate_conv(const cpu_kernel_args *k) { return validate_conv_common(k, false); }
static DK_Status validate_conv_transpose(const cpu_kernel_args *k) { return validate_conv_common(k, true); }

static const cpu_validator v_linalg_conv[] = {
    {"Conv", validate_conv},
    {"ConvTranspose", validate_conv_transpose},
};
CPU_REGISTER_VALIDATORS(v_linalg_conv)
