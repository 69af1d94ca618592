/*
 * training_norm.c -- BatchNormalizationGrad, LayerNormalizationGrad and
 * RMSNormalizationGrad.
 *
 * Compact tensors. BatchNormalizationGrad gathers each channel's elements
 * (its run of spatial elements in every image) into double scratch and sums
 * them pairwise. The row norms work row by row (the normalized dims are one
 * contiguous run); their scale broadcasts unidirectionally to X, so every
 * element finds its scale -- and its dscale/dB accumulator, which sums over
 * the rows and dims scale broadcasts along -- at an offset from scale's
 * broadcast strides.
 */
#include "training.h"

#include <stdlib.h>

/* ---- BatchNormalizationGrad --------------------------------------------------- */

static DK_Status batchnorm_grad(const cpu_kernel_args *k) {
  const cpu_tensor *dy = &k->in[0], *x = &k->in[1], *scale = &k->in[2], *mean = &k->in[3], *inv = &k->in[4];
  const cpu_tensor *dx = &k->out[0], *dscale = &k->out[1], *db = &k->out[2];
  /* X is (N, C, D...), or (N) with one channel: runs of `inner` elements,
   * run r belonging to channel r % C. */
  int64_t channels = x->ndim >= 2 ? x->shape[1] : 1, inner = training_prod(x->shape, 2, x->ndim);
  int64_t batch = x->shape[0], count = batch * inner;
  if (count == 0) batch = 0; /* sums of nothing; no pointer into an empty (NULL) tensor */
  double *buf = training_scratch(k, 3 * count);
  if (!buf) return DK_RESOURCE_EXHAUSTED;
  double *g = buf, *xhat = g + count, *terms = xhat + count;
  for (int64_t c = 0; c < channels; c++) {
    for (int64_t n = 0; n < batch; n++) {
      int64_t at = (n * channels + c) * inner;
      training_widen(g + n * inner, dy->data + at * dy->itemsize, dy->dtype, inner);
      training_widen(xhat + n * inner, x->data + at * x->itemsize, x->dtype, inner);
    }
    double m = training_load(mean, c), s = training_load(inv, c);
    for (int64_t j = 0; j < count; j++) {
      xhat[j] = (xhat[j] - m) * s;
      terms[j] = g[j] * xhat[j];
    }
    double sum_g = training_sum(g, count), sum_gx = training_sum(terms, count);
    cpu_store_from_double(db->data + c * db->itemsize, db->dtype, sum_g);
    cpu_store_from_double(dscale->data + c * dscale->itemsize, dscale->dtype, sum_gx);
    double a = training_load(scale, c) * s, mean_g = sum_g / (double)count, mean_gx = sum_gx / (double)count;
    for (int64_t j = 0; j < count; j++) g[j] = a * (g[j] - mean_g - xhat[j] * mean_gx);
    for (int64_t n = 0; n < batch; n++)
      training_narrow(dx->data + (n * channels + c) * inner * dx->itemsize, dx->dtype, g + n * inner, inner);
  }
  free(buf);
  return DK_OK;
}

/* ---- LayerNormalizationGrad, RMSNormalizationGrad ----------------------------- */

/* X as (outer, inner) rows over dims [axis, ndim). rms: no centring; the
 * statistic is recomputed from X (mean square + epsilon) instead of read
 * from the Mean and InvStdDev inputs. Outputs dX, dscale[, dB]. */
static DK_Status row_norm_grad(const cpu_kernel_args *k, bool rms) {
  const cpu_tensor *dy = &k->in[0], *x = &k->in[1], *scale = &k->in[2];
  const cpu_tensor *dx = &k->out[0], *dscale = &k->out[1], *db = rms ? NULL : &k->out[2];
  int64_t axis = cpu_attr_int(k, "axis", -1);
  if (axis < 0) axis += x->ndim;
  int32_t ax = (int32_t)axis;
  int64_t outer = training_prod(x->shape, 0, ax), inner = training_prod(x->shape, ax, x->ndim);
  double eps = cpu_attr_float(k, "epsilon", 1e-5);
  /* Scale's element strides as broadcast to X (0 along broadcast dims). */
  int64_t strides[CPU_MAX_DIMS];
  cpu_broadcast_strides(scale, x->ndim, strides);
  for (int32_t d = 0; d < x->ndim; d++) strides[d] /= scale->itemsize;
  int64_t params = scale->size;
  double *buf = training_scratch(k, 4 * inner + 3 * params);
  if (!buf) return DK_RESOURCE_EXHAUSTED;
  int64_t *offsets = malloc((inner > 0 ? (size_t)inner : 1) * sizeof *offsets);
  if (!offsets) {
    free(buf);
    return cpu_kernel_fail(k, DK_RESOURCE_EXHAUSTED, "out of host memory for %lld offsets", (long long)inner);
  }
  double *g = buf, *xhat = g + inner, *gs = xhat + inner, *terms = gs + inner;
  double *w = terms + inner, *acc_scale = w + params, *acc_bias = acc_scale + params;
  training_widen(w, scale->data, scale->dtype, params);
  /* The scale offset of each element of a row, from the row's dims. */
  for (int64_t i = 0; i < inner; i++) {
    int64_t rest = i, off = 0;
    for (int32_t d = x->ndim - 1; d >= ax; d--) {
      off += rest % x->shape[d] * strides[d];
      rest /= x->shape[d];
    }
    offsets[i] = off;
  }
  for (int64_t r = 0; r < outer && inner > 0; r++) {
    int64_t base = 0, rest = r;
    for (int32_t d = ax - 1; d >= 0; d--) {
      base += rest % x->shape[d] * strides[d];
      rest /= x->shape[d];
    }
    training_widen(g, dy->data + r * inner * dy->itemsize, dy->dtype, inner);
    training_widen(xhat, x->data + r * inner * x->itemsize, x->dtype, inner);
    double m = 0.0, s;
    if (rms) {
      for (int64_t i = 0; i < inner; i++) terms[i] = xhat[i] * xhat[i];
      s = 1.0 / sqrt(training_sum(terms, inner) / (double)inner + eps);
    } else {
      m = training_load(&k->in[3], r);
      s = training_load(&k->in[4], r);
    }
    for (int64_t i = 0; i < inner; i++) {
      xhat[i] = (xhat[i] - m) * s;
      gs[i] = g[i] * w[base + offsets[i]];
      terms[i] = gs[i] * xhat[i];
      acc_scale[base + offsets[i]] += g[i] * xhat[i];
      if (db) acc_bias[base + offsets[i]] += g[i];
    }
    double mean_gx = training_sum(terms, inner) / (double)inner;
    double mean_g = rms ? 0.0 : training_sum(gs, inner) / (double)inner;
    for (int64_t i = 0; i < inner; i++) g[i] = s * (gs[i] - (xhat[i] * mean_gx + mean_g));
    training_narrow(dx->data + r * inner * dx->itemsize, dx->dtype, g, inner);
  }
  training_narrow(dscale->data, dscale->dtype, acc_scale, params);
  if (db) training_narrow(db->data, db->dtype, acc_bias, params);
  free(offsets);
  free(buf);
  return DK_OK;
}

static DK_Status layernorm_grad(const cpu_kernel_args *k) { return row_norm_grad(k, false); }
static DK_Status rmsnorm_grad(const cpu_kernel_args *k) { return row_norm_grad(k, true); }

/* ---- Registration ----------------------------------------------------------- */

#define NORM_DEFS(SFX, DT)                                 \
  {"BatchNormalizationGrad", DT, batchnorm_grad, 0},       \
  {"LayerNormalizationGrad", DT, layernorm_grad, 0},       \
  {"RMSNormalizationGrad", DT, rmsnorm_grad, 0},

static const cpu_kernel_def k_training_norm[] = {TRAINING_FLOAT_TYPES(NORM_DEFS)};
CPU_REGISTER_KERNELS(k_training_norm)
