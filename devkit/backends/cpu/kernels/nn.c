/*
 * nn.c -- normalization kernels (BatchNormalization in inference and
 * training mode, LayerNormalization, RMSNormalization, GroupNormalization,
 * InstanceNormalization), LRN and Trilu.
 *
 * Statistics are two-pass (mean, then the squared deviations) and summed in
 * double. float32 LayerNormalization, RMSNormalization (Scale and B running
 * along the row) and BatchNormalization inference have float32 element
 * loops split over rows / planes on the thread pool (the float32 row and
 * plane kernels below); every other case loads elements as double, sums
 * pairwise, computes in double and rounds once on store. Inputs are compact
 * (no DKS_STRIDED): a normalized row, group or channel is one contiguous run
 * of elements.
 */
#include <stdlib.h>

#include "nn.h"

/* ---- Per-dtype row helpers ------------------------------------------------ */

/* Below this many elements a sum runs sequentially (four accumulators);
 * above, it splits in halves: pairwise summation, error O(log n) roundings. */
#define NN_PAIRWISE_BLOCK 256

/* The mean and 1/sqrt(variance + eps) (or 1/sqrt(mean square + eps)) of a
 * row, handed to the element loops through dks_nd_loop's ctx. */
typedef struct nn_row_stats {
  double mean, inv;
} nn_row_stats;

/* The per-dtype helpers every kernel here uses, instantiated by NN_DTYPE. */
typedef struct nn_dtype_ops {
  /* sum of x[0..n) */
  double (*sum)(const void *x, int64_t n);
  /* sum of (x[i] - center)^2 */
  double (*sum_sq)(const void *x, int64_t n, double center);
  /* y[i] = (x[i] - center) * a + b */
  void (*affine)(void *y, const void *x, int64_t n, double center, double a, double b);
  /* dks_nd_loop loops over (Y, X, Scale[, B]) with an nn_row_stats ctx:
   * y = (x - mean) * inv * scale [+ b] */
  dks_inner_loop scale_bias, scale_only;
  /* acc[i] += x[i]^2 */
  void (*add_squares)(double *acc, const void *x, int64_t n);
  /* y[i] = x[i] / (bias + alpha_over_size * acc[i]) ^ beta */
  void (*lrn_finish)(void *y, const void *x, const double *acc, int64_t n, double bias,
                     double alpha_over_size, double beta);
} nn_dtype_ops;

#define NN_DTYPE(SUF, T)                                                                   \
  static double nn_sum_##SUF(const void *xv, int64_t n) {                                  \
    const T *x = xv;                                                                       \
    if (n > NN_PAIRWISE_BLOCK)                                                             \
      return nn_sum_##SUF(x, n / 2) + nn_sum_##SUF(x + n / 2, n - n / 2);                  \
    double s0 = 0, s1 = 0, s2 = 0, s3 = 0;                                                 \
    int64_t i = 0;                                                                         \
    for (; i + 4 <= n; i += 4) {                                                           \
      s0 += nn_ld_##SUF(x, i);                                                             \
      s1 += nn_ld_##SUF(x, i + 1);                                                         \
      s2 += nn_ld_##SUF(x, i + 2);                                                         \
      s3 += nn_ld_##SUF(x, i + 3);                                                         \
    }                                                                                      \
    for (; i < n; i++) s0 += nn_ld_##SUF(x, i);                                            \
    return (s0 + s1) + (s2 + s3);                                                          \
  }                                                                                        \
  static double nn_sum_sq_##SUF(const void *xv, int64_t n, double c) {                     \
    const T *x = xv;                                                                       \
    if (n > NN_PAIRWISE_BLOCK)                                                             \
      return nn_sum_sq_##SUF(x, n / 2, c) + nn_sum_sq_##SUF(x + n / 2, n - n / 2, c);      \
    double s0 = 0, s1 = 0, s2 = 0, s3 = 0;                                                 \
    int64_t i = 0;                                                                         \
    for (; i + 4 <= n; i += 4) {                                                           \
      double d0 = nn_ld_##SUF(x, i) - c, d1 = nn_ld_##SUF(x, i + 1) - c;                   \
      double d2 = nn_ld_##SUF(x, i + 2) - c, d3 = nn_ld_##SUF(x, i + 3) - c;               \
      s0 += d0 * d0;                                                                       \
      s1 += d1 * d1;                                                                       \
      s2 += d2 * d2;                                                                       \
      s3 += d3 * d3;                                                                       \
    }                                                                                      \
    for (; i < n; i++) {                                                                   \
      double d = nn_ld_##SUF(x, i) - c;                                                    \
      s0 += d * d;                                                                         \
    }                                                                                      \
    return (s0 + s1) + (s2 + s3);                                                          \
  }                                                                                        \
  static void nn_affine_##SUF(void *yv, const void *xv, int64_t n, double c, double a,     \
                              double b) {                                                  \
    T *y = yv;                                                                             \
    const T *x = xv;                                                                       \
    for (int64_t i = 0; i < n; i++) nn_st_##SUF(y, i, (nn_ld_##SUF(x, i) - c) * a + b);    \
  }                                                                                        \
  static void nn_scale_bias_##SUF(int64_t n, uint8_t *const *p, const int64_t *s,          \
                                  void *ctx) {                                             \
    const nn_row_stats *r = ctx;                                                           \
    uint8_t *y = p[0];                                                                     \
    const uint8_t *x = p[1], *w = p[2], *b = p[3];                                         \
    for (int64_t i = 0; i < n; i++, y += s[0], x += s[1], w += s[2], b += s[3]) {          \
      double v = (nn_ld_##SUF((const T *)x, 0) - r->mean) * r->inv;                        \
      nn_st_##SUF((T *)y, 0,                                                               \
                  v * nn_ld_##SUF((const T *)w, 0) + nn_ld_##SUF((const T *)b, 0));        \
    }                                                                                      \
  }                                                                                        \
  static void nn_scale_only_##SUF(int64_t n, uint8_t *const *p, const int64_t *s,          \
                                  void *ctx) {                                             \
    const nn_row_stats *r = ctx;                                                           \
    uint8_t *y = p[0];                                                                     \
    const uint8_t *x = p[1], *w = p[2];                                                    \
    for (int64_t i = 0; i < n; i++, y += s[0], x += s[1], w += s[2]) {                     \
      double v = (nn_ld_##SUF((const T *)x, 0) - r->mean) * r->inv;                        \
      nn_st_##SUF((T *)y, 0, v * nn_ld_##SUF((const T *)w, 0));                            \
    }                                                                                      \
  }                                                                                        \
  static void nn_add_squares_##SUF(double *acc, const void *xv, int64_t n) {               \
    const T *x = xv;                                                                       \
    for (int64_t i = 0; i < n; i++) {                                                      \
      double v = nn_ld_##SUF(x, i);                                                        \
      acc[i] += v * v;                                                                     \
    }                                                                                      \
  }                                                                                        \
  static void nn_lrn_finish_##SUF(void *yv, const void *xv, const double *acc, int64_t n,  \
                                  double bias, double alpha_over_size, double beta) {      \
    T *y = yv;                                                                             \
    const T *x = xv;                                                                       \
    for (int64_t i = 0; i < n; i++)                                                        \
      nn_st_##SUF(y, i, nn_ld_##SUF(x, i) / pow(bias + alpha_over_size * acc[i], beta));   \
  }                                                                                        \
  static const nn_dtype_ops nn_ops_##SUF = {                                               \
      .sum = nn_sum_##SUF,                                                                 \
      .sum_sq = nn_sum_sq_##SUF,                                                           \
      .affine = nn_affine_##SUF,                                                           \
      .scale_bias = nn_scale_bias_##SUF,                                                   \
      .scale_only = nn_scale_only_##SUF,                                                   \
      .add_squares = nn_add_squares_##SUF,                                                 \
      .lrn_finish = nn_lrn_finish_##SUF,                                                   \
  };

NN_DTYPE(f32, float)
NN_DTYPE(f64, double)
NN_DTYPE(f16, uint16_t)
NN_DTYPE(bf16, uint16_t)

static int64_t nn_prod(const int64_t *shape, int32_t from, int32_t to) {
  int64_t n = 1;
  for (int32_t d = from; d < to; d++) n *= shape[d];
  return n;
}

static DK_Status nn_no_memory(const dks_kernel_args *k, int64_t bytes) {
  return dks_kernel_fail(k, DK_RESOURCE_EXHAUSTED, "out of host memory for %lld bytes of scratch",
                         (long long)bytes);
}

/* ---- float32 row and plane kernels --------------------------------------- */

/* float32 LayerNormalization, RMSNormalization and BatchNormalization
 * inference run as float32 element loops the compiler vectorises, split
 * over rows (planes) with dks_parallel_for. Double only in the statistics:
 * a float32 sum of a 4096-element row in 8 lanes could be off by ~512
 * roundings (3e-5 relative), past the ops' rtol 2e-6, so the sums keep
 * float64 lanes (exact to ~n * 2^-53). The element loop is float32: its
 * 4 roundings stay near 2^-22 relative. */

/* Independent accumulators of a sum: vector lanes. */
#define NN_LANES 8
/* Elements per dks_parallel_for chunk, about: tens of microseconds (a
 * plane or row pass streams them from memory). */
#define NN_CHUNK_ELEMENTS ((int64_t)1 << 16)

static int64_t nn_grain(int64_t per_item) {
  return per_item >= NN_CHUNK_ELEMENTS ? 1 : NN_CHUNK_ELEMENTS / (per_item ? per_item : 1);
}

/* sum of (x[i] - center)^2 over float64 lanes; center 0 and `squares`
 * false: the plain sum. */
static inline __attribute__((always_inline)) double nn_lanes_sum_f32(const float *x, int64_t n,
                                                                     double center, bool squares) {
  double lane[NN_LANES] = {0};
  int64_t body = n - n % NN_LANES;
  for (int64_t i = 0; i < body; i += NN_LANES)
    for (int j = 0; j < NN_LANES; j++) {
      double d = (double)x[i + j] - center;
      lane[j] += squares ? d * d : d;
    }
  for (int64_t i = body; i < n; i++) {
    double d = (double)x[i] - center;
    lane[i - body] += squares ? d * d : d;
  }
  double s = 0.0;
  for (int j = 0; j < NN_LANES; j++) s += lane[j];
  return s;
}

/* A float64 center as float32 hi + lo: (x - hi) - lo is x - center within
 * about an ulp of the difference (x - hi is exact where x is near hi), where
 * x - (float)center would be off by half an ulp of the center itself. */
typedef struct nn_center_f32 {
  float hi, lo;
} nn_center_f32;

static nn_center_f32 nn_split_center(double c) {
  float hi = (float)c;
  return (nn_center_f32){hi, (float)(c - (double)hi)};
}

/* LayerNormalization (rms false) or RMSNormalization over rows of `inner`
 * contiguous elements; scale_at / bias_at: the element offset of each row's
 * Scale / B run (contiguous over the row), from nn_param_offset. */
typedef struct nn_rows_f32_job {
  const dks_tensor *x, *scale, *bias, *y;
  float *mean_out, *inv_out;
  int64_t inner;
  int32_t ax;
  double eps;
  bool rms;
  const int64_t *scale_strides, *bias_strides;
} nn_rows_f32_job;

/* The byte offset, into a parameter broadcast to X with `strides`, of row
 * r's start (row-major digits of r over X's outer dims). */
static int64_t nn_param_offset(const dks_tensor *x, int32_t ax, int64_t r, const int64_t *strides) {
  int64_t rest = r, off = 0;
  for (int32_t d = ax - 1; d >= 0; d--) {
    off += rest % x->shape[d] * strides[d];
    rest /= x->shape[d];
  }
  return off;
}

DKS_VECTOR_CLONES static void nn_rows_f32(void *ctx, int64_t begin, int64_t end) {
  const nn_rows_f32_job *j = ctx;
  int64_t n = j->inner;
  for (int64_t r = begin; r < end; r++) {
    const float *x = (const float *)j->x->data + r * n;
    float *y = (float *)j->y->data + r * n;
    const float *w = (const float *)(j->scale->data + nn_param_offset(j->x, j->ax, r, j->scale_strides));
    const float *b = j->bias ? (const float *)(j->bias->data + nn_param_offset(j->x, j->ax, r, j->bias_strides))
                             : NULL;
    double mean = j->rms ? 0.0 : nn_lanes_sum_f32(x, n, 0.0, false) / (double)n;
    double inv = 1.0 / sqrt(nn_lanes_sum_f32(x, n, mean, true) / (double)n + j->eps);
    if (!j->rms) {
      j->mean_out[r] = (float)mean;
      j->inv_out[r] = (float)inv;
    }
    nn_center_f32 c = nn_split_center(mean);
    float a = (float)inv;
    if (b)
      for (int64_t i = 0; i < n; i++) y[i] = ((x[i] - c.hi) - c.lo) * a * w[i] + b[i];
    else
      for (int64_t i = 0; i < n; i++) y[i] = ((x[i] - c.hi) - c.lo) * a * w[i];
  }
}

/* BatchNormalization inference over (n, c) planes of `inner` elements:
 * y = (x - mean[c]) * a[c] + B[c], a = scale / sqrt(var + eps) -- the
 * per-channel scale with the centering kept apart from the shift, since
 * x * a + (B - mean * a) would cancel to an error of 2^-24 |mean * a|. */
typedef struct nn_planes_f32_job {
  const dks_tensor *x, *scale, *bias, *mean, *var, *y;
  int64_t channels, inner;
  double eps;
} nn_planes_f32_job;

DKS_VECTOR_CLONES static void nn_planes_f32(void *ctx, int64_t begin, int64_t end) {
  const nn_planes_f32_job *j = ctx;
  int64_t n = j->inner;
  for (int64_t p = begin; p < end; p++) {
    int64_t ch = p % j->channels;
    double v = dks_load_as_double(j->var->data + ch * j->var->itemsize, j->var->dtype);
    float a = (float)(dks_load_as_double(j->scale->data + ch * j->scale->itemsize, j->scale->dtype) /
                      sqrt(v + j->eps));
    float b = (float)dks_load_as_double(j->bias->data + ch * j->bias->itemsize, j->bias->dtype);
    nn_center_f32 c =
        nn_split_center(dks_load_as_double(j->mean->data + ch * j->mean->itemsize, j->mean->dtype));
    const float *x = (const float *)j->x->data + p * n;
    float *y = (float *)j->y->data + p * n;
    for (int64_t i = 0; i < n; i++) y[i] = ((x[i] - c.hi) - c.lo) * a + b;
  }
}

/* ---- BatchNormalization ----------------------------------------------------- */

/* Inference: normalizes with input_mean/input_var and passes them on as the
 * running statistics. Training mode: with the batch's mean and population
 * variance per channel (over the channel's run in every image: a sum of
 * pairwise run sums, then the squared deviations from the mean), and the
 * running statistics move towards them by 1 - momentum. */
static DK_Status batchnorm(const dks_kernel_args *k, const nn_dtype_ops *ops) {
  const dks_tensor *x = &k->in[0], *scale = &k->in[1], *bias = &k->in[2];
  const dks_tensor *mean = &k->in[3], *var = &k->in[4], *y = &k->out[0];
  const dks_tensor *running_mean = &k->out[1], *running_var = &k->out[2];
  double eps = dks_attr_float(k, "epsilon", 1e-5), momentum = dks_attr_float(k, "momentum", 0.9);
  bool training = dks_attr_int(k, "training_mode", 0) == 1;
  /* X is (N, C, D...): image n's run of channel c (`inner` elements) starts
   * at element (n * C + c) * inner. X (N) has one channel, one run. */
  bool batched = x->ndim >= 2;
  int64_t channels = batched ? x->shape[1] : 1, batch = batched ? x->shape[0] : 1;
  int64_t inner = batched ? nn_prod(x->shape, 2, x->ndim) : x->size;
  int64_t images = x->size ? batch : 0; /* no pointer into an empty (NULL) tensor */
  if (!training && x->dtype == DK_DTYPE_FLOAT32) {
    for (int64_t c = 0; c < channels; c++) {
      dks_store_from_double(running_mean->data + c * running_mean->itemsize, running_mean->dtype,
                            dks_load_as_double(mean->data + c * mean->itemsize, mean->dtype));
      dks_store_from_double(running_var->data + c * running_var->itemsize, running_var->dtype,
                            dks_load_as_double(var->data + c * var->itemsize, var->dtype));
    }
    nn_planes_f32_job job = {x, scale, bias, mean, var, y, channels, inner, eps};
    dks_parallel_for(images * channels, nn_grain(inner), nn_planes_f32, &job);
    return DK_OK;
  }
  for (int64_t c = 0; c < channels; c++) {
    double m = dks_load_as_double(mean->data + c * mean->itemsize, mean->dtype);
    double v = dks_load_as_double(var->data + c * var->itemsize, var->dtype);
    if (training) {
      double count = (double)(batch * inner), sum = 0.0, squares = 0.0;
      for (int64_t n = 0; n < images; n++)
        sum += ops->sum(x->data + (n * channels + c) * inner * x->itemsize, inner);
      double batch_mean = sum / count; /* NaN for an empty batch */
      for (int64_t n = 0; n < images; n++)
        squares += ops->sum_sq(x->data + (n * channels + c) * inner * x->itemsize, inner, batch_mean);
      m = m * momentum + batch_mean * (1 - momentum);
      v = v * momentum + squares / count * (1 - momentum);
      dks_store_from_double(running_mean->data + c * running_mean->itemsize, running_mean->dtype, m);
      dks_store_from_double(running_var->data + c * running_var->itemsize, running_var->dtype, v);
      m = batch_mean;
      v = squares / count;
    } else {
      dks_store_from_double(running_mean->data + c * running_mean->itemsize, running_mean->dtype, m);
      dks_store_from_double(running_var->data + c * running_var->itemsize, running_var->dtype, v);
    }
    double a = dks_load_as_double(scale->data + c * scale->itemsize, scale->dtype) / sqrt(v + eps);
    double b = dks_load_as_double(bias->data + c * bias->itemsize, bias->dtype);
    for (int64_t n = 0; n < images; n++) {
      int64_t at = (n * channels + c) * inner;
      ops->affine(y->data + at * y->itemsize, x->data + at * x->itemsize, inner, m, a, b);
    }
  }
  return DK_OK;
}

/* ---- LayerNormalization, RMSNormalization ---------------------------------- */

/* Normalizes X over dims [axis, ndim): rows of `inner` contiguous elements.
 * Scale (and B) broadcast unidirectionally to X: each row walks them with
 * dks_nd_loop, starting at the offset its outer index selects. rms: no
 * centering (mean 0), the mean square instead of the variance. */
static DK_Status row_norm(const dks_kernel_args *k, const nn_dtype_ops *ops, bool rms) {
  const dks_tensor *x = &k->in[0], *scale = &k->in[1];
  const dks_tensor *bias = !rms && k->num_inputs > 2 && k->in[2].ndim >= 0 ? &k->in[2] : NULL;
  const dks_tensor *y = &k->out[0];
  float *mean_out = rms ? NULL : (float *)k->out[1].data;
  float *inv_out = rms ? NULL : (float *)k->out[2].data;
  double eps = dks_attr_float(k, "epsilon", 1e-5);
  int64_t axis = dks_attr_int(k, "axis", -1);
  if (axis < 0) axis += x->ndim;
  int32_t ax = (int32_t)axis, inner_ndim = x->ndim - ax;
  int64_t inner = nn_prod(x->shape, ax, x->ndim), outer = nn_prod(x->shape, 0, ax);

  int nops = bias ? 4 : 3;
  int64_t full[4][DKS_MAX_DIMS], strides[4][DKS_MAX_DIMS];
  dks_broadcast_strides(y, x->ndim, full[0]);
  dks_broadcast_strides(x, x->ndim, full[1]);
  dks_broadcast_strides(scale, x->ndim, full[2]);
  if (bias) dks_broadcast_strides(bias, x->ndim, full[3]);
  for (int i = 0; i < nops; i++)
    for (int32_t d = 0; d < inner_ndim; d++) strides[i][d] = full[i][ax + d];
  dks_inner_loop loop = bias ? ops->scale_bias : ops->scale_only;

  /* float32 with Scale (and B) running along each row: the row kernel. */
  bool params_follow_x = true;
  for (int i = 2; i < nops; i++)
    for (int32_t d = 0; d < inner_ndim; d++)
      params_follow_x &= x->shape[ax + d] == 1 || strides[i][d] == strides[1][d];
  if (x->dtype == DK_DTYPE_FLOAT32 && params_follow_x && inner > 0) {
    nn_rows_f32_job job = {x, scale, bias, y, mean_out, inv_out, inner, ax, eps, rms, full[2], full[3]};
    dks_parallel_for(outer, nn_grain(inner), nn_rows_f32, &job);
    return DK_OK;
  }

  for (int64_t r = 0; r < outer; r++) {
    const uint8_t *row = x->data ? x->data + r * inner * x->itemsize : NULL;
    nn_row_stats st;
    if (rms) {
      st.mean = 0.0;
      st.inv = 1.0 / sqrt(ops->sum_sq(row, inner, 0.0) / (double)inner + eps);
    } else {
      st.mean = ops->sum(row, inner) / (double)inner;
      st.inv = 1.0 / sqrt(ops->sum_sq(row, inner, st.mean) / (double)inner + eps);
      mean_out[r] = (float)st.mean;
      inv_out[r] = (float)st.inv;
    }
    if (!inner) continue;
    uint8_t *base[4] = {y->data + r * inner * y->itemsize, (uint8_t *)row,
                        scale->data + nn_param_offset(x, ax, r, full[2]),
                        bias ? bias->data + nn_param_offset(x, ax, r, full[3]) : NULL};
    dks_nd_loop(nops, inner_ndim, x->shape + ax, (const int64_t(*)[DKS_MAX_DIMS])strides, base, loop,
                &st);
  }
  return DK_OK;
}

/* ---- GroupNormalization, InstanceNormalization ----------------------------- */

/* X (N, C, D...): statistics per instance over `groups` runs of C / groups
 * consecutive channels (with their spatial elements), then per channel
 * y = (x - mean) * inv * scale[c] + bias[c]. InstanceNormalization is the
 * case groups == C. */
static DK_Status group_norm(const dks_kernel_args *k, const nn_dtype_ops *ops, int64_t groups) {
  const dks_tensor *x = &k->in[0], *scale = &k->in[1], *bias = &k->in[2], *y = &k->out[0];
  double eps = dks_attr_float(k, "epsilon", 1e-5);
  int64_t batch = x->shape[0], channels = x->shape[1], spatial = nn_prod(x->shape, 2, x->ndim);
  if (x->size == 0) return DK_OK;
  int64_t per_group = channels / groups, run = per_group * spatial;
  for (int64_t n = 0; n < batch; n++) {
    for (int64_t g = 0; g < groups; g++) {
      int64_t start = (n * channels + g * per_group) * spatial;
      const uint8_t *xs = x->data + start * x->itemsize;
      double mean = ops->sum(xs, run) / (double)run;
      double inv = 1.0 / sqrt(ops->sum_sq(xs, run, mean) / (double)run + eps);
      for (int64_t j = 0; j < per_group; j++) {
        int64_t c = g * per_group + j, offset = start + j * spatial;
        ops->affine(y->data + offset * y->itemsize, x->data + offset * x->itemsize, spatial, mean,
                    inv * dks_load_as_double(scale->data + c * scale->itemsize, scale->dtype),
                    dks_load_as_double(bias->data + c * bias->itemsize, bias->dtype));
      }
    }
  }
  return DK_OK;
}

/* ---- LRN ------------------------------------------------------------------- */

static DK_Status lrn(const dks_kernel_args *k, const nn_dtype_ops *ops) {
  const dks_tensor *x = &k->in[0], *y = &k->out[0];
  int64_t size = dks_attr_int(k, "size", 1);
  double alpha = dks_attr_float(k, "alpha", 1e-4), beta = dks_attr_float(k, "beta", 0.75);
  double bias = dks_attr_float(k, "bias", 1.0);
  int64_t batch = x->shape[0], channels = x->shape[1], spatial = nn_prod(x->shape, 2, x->ndim);
  if (x->size == 0) return DK_OK;
  /* The window is [c - floor((size - 1) / 2), c + ceil((size - 1) / 2)]. */
  int64_t before = (size - 1) / 2, after = size / 2;
  double *acc = malloc((size_t)spatial * sizeof *acc);
  if (!acc) return nn_no_memory(k, spatial * (int64_t)sizeof *acc);
  for (int64_t n = 0; n < batch; n++) {
    for (int64_t c = 0; c < channels; c++) {
      int64_t lo = before >= c ? 0 : c - before;
      int64_t hi = after >= channels - 1 - c ? channels - 1 : c + after;
      memset(acc, 0, (size_t)spatial * sizeof *acc);
      for (int64_t j = lo; j <= hi; j++)
        ops->add_squares(acc, x->data + (n * channels + j) * spatial * x->itemsize, spatial);
      int64_t offset = (n * channels + c) * spatial;
      ops->lrn_finish(y->data + offset * y->itemsize, x->data + offset * x->itemsize, acc, spatial,
                      bias, alpha / (double)size, beta);
    }
  }
  free(acc);
  return DK_OK;
}

/* ---- Trilu ------------------------------------------------------------------ */

/* Data movement: every dtype shares this kernel (whole elements are copied,
 * and a zero element is all-zero bytes in every dtype). */
static DK_Status trilu(const dks_kernel_args *k) {
  const dks_tensor *x = &k->in[0], *y = &k->out[0];
  int64_t count;
  const int64_t *kv = dks_attr_ints(k, "k", &count);
  int64_t diag = count ? kv[0] : 0;
  bool upper = dks_attr_int(k, "upper", 1) != 0;
  int64_t rows = x->shape[x->ndim - 2], cols = x->shape[x->ndim - 1];
  if (x->size == 0) return DK_OK;
  int64_t item = x->itemsize, matrices = x->size / (rows * cols);
  for (int64_t m = 0; m < matrices; m++) {
    for (int64_t i = 0; i < rows; i++) {
      /* Columns [keep_from, keep_to) survive; the comparisons avoid
       * overflow for any int64 diagonal offset. */
      int64_t keep_from, keep_to;
      if (upper) {
        keep_from = diag >= cols - i ? cols : (i + diag < 0 ? 0 : i + diag);
        keep_to = cols;
      } else {
        keep_from = 0;
        keep_to = diag >= cols - i - 1 ? cols : (i + diag + 1 < 0 ? 0 : i + diag + 1);
      }
      int64_t offset = (m * rows + i) * cols * item;
      const uint8_t *src = x->data + offset;
      uint8_t *dst = y->data + offset;
      memset(dst, 0, (size_t)(keep_from * item));
      memcpy(dst + keep_from * item, src + keep_from * item, (size_t)((keep_to - keep_from) * item));
      memset(dst + keep_to * item, 0, (size_t)((cols - keep_to) * item));
    }
  }
  return DK_OK;
}

/* ---- Registration -------------------------------------------------------- */

#define NN_FLOAT_KERNELS(SUF)                                                              \
  static DK_Status batchnorm_##SUF(const dks_kernel_args *k) {                             \
    return batchnorm(k, &nn_ops_##SUF);                                                    \
  }                                                                                        \
  static DK_Status layernorm_##SUF(const dks_kernel_args *k) {                             \
    return row_norm(k, &nn_ops_##SUF, false);                                              \
  }                                                                                        \
  static DK_Status rmsnorm_##SUF(const dks_kernel_args *k) {                               \
    return row_norm(k, &nn_ops_##SUF, true);                                               \
  }                                                                                        \
  static DK_Status groupnorm_##SUF(const dks_kernel_args *k) {                             \
    return group_norm(k, &nn_ops_##SUF, dks_attr_int(k, "num_groups", 1));                 \
  }                                                                                        \
  static DK_Status instancenorm_##SUF(const dks_kernel_args *k) {                          \
    return group_norm(k, &nn_ops_##SUF, k->in[0].shape[1]);                                \
  }                                                                                        \
  static DK_Status lrn_##SUF(const dks_kernel_args *k) { return lrn(k, &nn_ops_##SUF); }

NN_FLOAT_KERNELS(f32)
NN_FLOAT_KERNELS(f64)
NN_FLOAT_KERNELS(f16)
NN_FLOAT_KERNELS(bf16)

#define NN_FLOAT_DEFS(SUF, DT)                              \
  {"BatchNormalization", DT, batchnorm_##SUF, 0},           \
  {"LayerNormalization", DT, layernorm_##SUF, 0},           \
  {"RMSNormalization", DT, rmsnorm_##SUF, 0},               \
  {"GroupNormalization", DT, groupnorm_##SUF, 0},           \
  {"InstanceNormalization", DT, instancenorm_##SUF, 0},     \
  {"LRN", DT, lrn_##SUF, 0}

static const dks_kernel_def k_nn[] = {
    NN_FLOAT_DEFS(f32, DK_DTYPE_FLOAT32),
    NN_FLOAT_DEFS(f64, DK_DTYPE_FLOAT64),
    NN_FLOAT_DEFS(f16, DK_DTYPE_FLOAT16),
    NN_FLOAT_DEFS(bf16, DK_DTYPE_BFLOAT16),
    DKS_ALL_DTYPES("Trilu", trilu, 0),
};
DKS_REGISTER_KERNELS(k_nn)

/* Input i is absent or a vector of n elements. */
static DK_Status check_vector(const dks_kernel_args *k, size_t i, int64_t n) {
  if (i >= k->num_inputs || k->in[i].ndim < 0) return DK_OK;
  const dks_tensor *t = &k->in[i];
  if (t->ndim != 1 || t->shape[0] != n)
    return dks_invalid(k, "input %zu has rank %d; it needs shape (%lld)", i, t->ndim, (long long)n);
  return DK_OK;
}

/* The normalisations' attributes: epsilon finite and >= 0; stash_type, when
 * given, 1 (the statistics' precision the kernels implement). */
static DK_Status check_norm_attributes(const dks_kernel_args *k) {
  int64_t stash = dks_attr_int(k, "stash_type", 1);
  if (stash != 1) return dks_invalid(k, "attribute 'stash_type' is %lld; only 1 is supported", (long long)stash);
  return dks_check_float(k, "epsilon", 0.0);
}

/* BatchNormalization, InstanceNormalization: X (N, C, ...) (BatchNormalization:
 * or (N)), per-channel vectors -- InstanceNormalization's of X's dtype,
 * BatchNormalization's scale and B of one float dtype, input_mean and
 * input_var of another, which the running statistics (outputs 1, 2) take;
 * Y like X. */
static DK_Status validate_channel_norm(const dks_kernel_args *k) {
  bool instance = strcmp(k->op, "InstanceNormalization") == 0;
  DK_Status st = dks_check_rank(k, 0, instance ? 3 : 1, DKS_MAX_DIMS);
  if (st == DK_OK) st = check_norm_attributes(k);
  if (st != DK_OK) return st;
  int64_t c = k->in[0].ndim > 1 ? k->in[0].shape[1] : 1;
  for (size_t i = 1; st == DK_OK && i < k->num_inputs; i++) {
    st = check_vector(k, i, c);
    if (st == DK_OK && k->in[i].ndim >= 0)
      st = instance ? dks_check_dtype(k, "input", i, k->in[0].dtype)
           : i % 2 ? dks_check_float_dtype(k, "input", i) /* scale, input_mean */
                   : dks_check_dtype(k, "input", i, k->in[i - 1].dtype); /* B, input_var: their pair's */
  }
  if (st == DK_OK) st = dks_check_output_like(k, 0, 0);
  if (st == DK_OK) st = dks_check_dtype(k, "output", 0, k->in[0].dtype);
  for (size_t j = 1; st == DK_OK && j < k->num_outputs; j++) {
    st = dks_check_output(k, j, 1, &c);
    if (st == DK_OK) st = dks_check_dtype(k, "output", j, k->num_inputs > 3 ? k->in[3].dtype : k->in[0].dtype);
  }
  return st;
}

/* LayerNormalization, RMSNormalization: axis inside X's rank; Scale (and B)
 * broadcast to X; Y like X, Mean and InvStdDev X's shape
 * with 1 from axis on. */
static DK_Status validate_axis_norm(const dks_kernel_args *k) {
  DK_Status st = dks_check_rank(k, 0, 1, DKS_MAX_DIMS);
  int64_t axis;
  if (st == DK_OK) st = check_norm_attributes(k);
  if (st == DK_OK) st = dks_check_axis(k, "axis", k->in[0].ndim, false, &axis);
  if (st == DK_OK) st = dks_validate_like_input(k);
  if (st != DK_OK) return st;
  const dks_tensor *x = &k->in[0];
  for (size_t i = 1; i < k->num_inputs; i++) {
    const dks_tensor *t = &k->in[i];
    if (t->ndim < 0) continue;
    if (t->ndim > x->ndim) return dks_invalid(k, "input %zu has more dims than X", i);
    for (int32_t d = 0; d < t->ndim; d++) {
      int64_t n = t->shape[d], m = x->shape[x->ndim - t->ndim + d];
      if (n != 1 && n != m) return dks_invalid(k, "input %zu does not broadcast to X", i);
    }
  }
  int64_t stats[DKS_MAX_DIMS];
  for (int32_t d = 0; d < x->ndim; d++) stats[d] = d < axis ? x->shape[d] : 1;
  for (size_t j = 1; j < k->num_outputs; j++) { /* Mean and InvStdDev: float32 statistics */
    if ((st = dks_check_output(k, j, x->ndim, stats)) != DK_OK) return st;
    if ((st = dks_check_dtype(k, "output", j, DK_DTYPE_FLOAT32)) != DK_OK) return st;
  }
  return DK_OK;
}

/* GroupNormalization: num_groups >= 1 divides C; scale and bias (C); Y like X. */
static DK_Status validate_group_norm(const dks_kernel_args *k) {
  DK_Status st = dks_check_rank(k, 0, 2, DKS_MAX_DIMS);
  if (st == DK_OK) st = check_norm_attributes(k);
  if (st != DK_OK) return st;
  int64_t groups = dks_attr_int(k, "num_groups", 1), c = k->in[0].shape[1];
  if (groups < 1 || c % groups)
    return dks_invalid(k, "attribute 'num_groups' is %lld; it must be at least 1 and divide the %lld channels",
                       (long long)groups, (long long)c);
  for (size_t i = 1; st == DK_OK && i < k->num_inputs; i++) st = check_vector(k, i, c);
  return st != DK_OK ? st : dks_validate_like_input(k);
}

/* LRN: X (N, C, ...), size >= 1; Y like X. */
static DK_Status validate_lrn(const dks_kernel_args *k) {
  DK_Status st = dks_check_rank(k, 0, 2, DKS_MAX_DIMS);
  if (st != DK_OK) return st;
  int64_t size = dks_attr_int(k, "size", 1);
  if (size < 1) return dks_invalid(k, "attribute 'size' is %lld; it must be at least 1", (long long)size);
  return dks_validate_like_input(k);
}

/* Trilu: a matrix (or a batch of them); Y like it. */
static DK_Status validate_trilu(const dks_kernel_args *k) {
  DK_Status st = dks_check_rank(k, 0, 2, DKS_MAX_DIMS);
  return st != DK_OK ? st : dks_validate_like_input(k);
}

static const dks_validator v_nn[] = {
    {"BatchNormalization", validate_channel_norm}, {"InstanceNormalization", validate_channel_norm},
    {"LayerNormalization", validate_axis_norm},    {"RMSNormalization", validate_axis_norm},
    {"GroupNormalization", validate_group_norm},   {"LRN", validate_lrn},
    {"Trilu", validate_trilu},
};
DKS_REGISTER_VALIDATORS(v_nn)
