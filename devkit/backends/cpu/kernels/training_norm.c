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

static DK_Status batchnorm_grad(const dks_kernel_args *k) {
  const dks_tensor *dy = &k->in[0], *x = &k->in[1], *scale = &k->in[2], *mean = &k->in[3], *inv = &k->in[4];
  const dks_tensor *dx = &k->out[0], *dscale = &k->out[1], *db = &k->out[2];
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
    dks_store_from_double(db->data + c * db->itemsize, db->dtype, sum_g);
    dks_store_from_double(dscale->data + c * dscale->itemsize, dscale->dtype, sum_gx);
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
static DK_Status row_norm_grad(const dks_kernel_args *k, bool rms) {
  const dks_tensor *dy = &k->in[0], *x = &k->in[1], *scale = &k->in[2];
  const dks_tensor *dx = &k->out[0], *dscale = &k->out[1], *db = rms ? NULL : &k->out[2];
  int64_t axis = dks_attr_int(k, "axis", -1);
  if (axis < 0) axis += x->ndim;
  int32_t ax = (int32_t)axis;
  int64_t outer = training_prod(x->shape, 0, ax), inner = training_prod(x->shape, ax, x->ndim);
  double eps = dks_attr_float(k, "epsilon", 1e-5);
  /* Scale's element strides as broadcast to X (0 along broadcast dims). */
  int64_t strides[DKS_MAX_DIMS];
  dks_broadcast_strides(scale, x->ndim, strides);
  for (int32_t d = 0; d < x->ndim; d++) strides[d] /= scale->itemsize;
  int64_t params = scale->size;
  double *buf = training_scratch(k, 4 * inner + 3 * params);
  if (!buf) return DK_RESOURCE_EXHAUSTED;
  int64_t *offsets = malloc((inner > 0 ? (size_t)inner : 1) * sizeof *offsets);
  if (!offsets) {
    free(buf);
    return dks_kernel_fail(k, DK_RESOURCE_EXHAUSTED, "out of host memory for %lld offsets", (long long)inner);
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

static DK_Status layernorm_grad(const dks_kernel_args *k) { return row_norm_grad(k, false); }
static DK_Status rmsnorm_grad(const dks_kernel_args *k) { return row_norm_grad(k, true); }

/* ---- Registration ----------------------------------------------------------- */

#define NORM_DEFS(SFX, DT)                                 \
  {"BatchNormalizationGrad", DT, batchnorm_grad, 0},       \
  {"LayerNormalizationGrad", DT, layernorm_grad, 0},       \
  {"RMSNormalizationGrad", DT, rmsnorm_grad, 0},

static const dks_kernel_def k_training_norm[] = {TRAINING_FLOAT_TYPES(NORM_DEFS)};
DKS_REGISTER_KERNELS(k_training_norm)

/* ---- Validators ------------------------------------------------------------- */

/* Input i is a float tensor of rank ndim and the given shape. */
static DK_Status check_float_shape(const dks_kernel_args *k, size_t i, int32_t ndim, const int64_t *shape) {
  const dks_tensor *t = &k->in[i];
  bool same = t->ndim == ndim;
  for (int32_t d = 0; same && d < ndim; d++) same = t->shape[d] == shape[d];
  if (!same) return dks_invalid(k, "input %zu has rank %d and not the shape X gives it", i, t->ndim);
  return dks_check_float_dtype(k, "input", i);
}

/* dY (input 0) has X's (input 1) shape and dtype; the call has the op's
 * `outputs` outputs (the kernels write every one), dX of X's shape and
 * dtype and the rest of the parameter's (input 2) shape in `param_dtype`. */
static DK_Status check_grad_call(const dks_kernel_args *k, size_t outputs, DK_DTypeKey param_dtype) {
  const dks_tensor *x = &k->in[1];
  DK_Status st = check_float_shape(k, 0, x->ndim, x->shape);
  if (st == DK_OK) st = dks_check_dtype(k, "input", 0, x->dtype);
  if (st == DK_OK && k->num_outputs != outputs)
    st = dks_invalid(k, "has %zu outputs; the kernel writes %zu", k->num_outputs, outputs);
  if (st == DK_OK) st = dks_check_output_like(k, 0, 1);
  if (st == DK_OK) st = dks_check_dtype(k, "output", 0, x->dtype);
  for (size_t j = 1; st == DK_OK && j < outputs; j++) {
    st = dks_check_output_like(k, j, 2);
    if (st == DK_OK) st = dks_check_dtype(k, "output", j, param_dtype);
  }
  return st;
}

/* BatchNormalizationGrad: X (N, C, ...) or (N); scale, mean and inv_std
 * float vectors of C values, mean and inv_std of one dtype; dscale and dB
 * of scale's shape and dtype. */
static DK_Status validate_batchnorm_grad(const dks_kernel_args *k) {
  const dks_tensor *x = &k->in[1];
  DK_Status st = dks_check_rank(k, 1, 1, DKS_MAX_DIMS);
  int64_t channels = x->ndim >= 2 ? x->shape[1] : 1;
  for (size_t i = 2; st == DK_OK && i < 5; i++) st = check_float_shape(k, i, 1, &channels);
  if (st == DK_OK) st = dks_check_dtype(k, "input", 4, k->in[3].dtype);
  return st != DK_OK ? st : check_grad_call(k, 3, k->in[2].dtype);
}

/* LayerNormalizationGrad, RMSNormalizationGrad: axis inside X's rank; Scale
 * of X's dtype, broadcasting to X unidirectionally; LayerNormalizationGrad's
 * Mean and InvStdDev float, of one dtype, X's shape with 1 from axis on. */
static DK_Status validate_row_norm_grad(const dks_kernel_args *k) {
  bool rms = strcmp(k->op, "RMSNormalizationGrad") == 0;
  const dks_tensor *x = &k->in[1], *scale = &k->in[2];
  int64_t axis, stats[DKS_MAX_DIMS];
  DK_Status st = dks_check_axis(k, "axis", x->ndim, false, &axis);
  if (st == DK_OK) st = dks_check_dtype(k, "input", 2, x->dtype);
  if (st != DK_OK) return st;
  bool broadcasts = scale->ndim <= x->ndim;
  for (int32_t d = 0; broadcasts && d < scale->ndim; d++)
    broadcasts = scale->shape[d] == 1 || scale->shape[d] == x->shape[x->ndim - scale->ndim + d];
  if (!broadcasts) return dks_invalid(k, "input 2 (the scale) does not broadcast to X");
  for (int32_t d = 0; d < x->ndim; d++) stats[d] = d < axis ? x->shape[d] : 1;
  for (size_t i = 3; !rms && st == DK_OK && i < 5; i++) st = check_float_shape(k, i, x->ndim, stats);
  if (st == DK_OK && !rms) st = dks_check_dtype(k, "input", 4, k->in[3].dtype);
  return st != DK_OK ? st : check_grad_call(k, rms ? 2 : 3, x->dtype);
}

static const dks_validator v_training_norm[] = {
    {"BatchNormalizationGrad", validate_batchnorm_grad},
    {"LayerNormalizationGrad", validate_row_norm_grad},
    {"RMSNormalizationGrad", validate_row_norm_grad},
};
DKS_REGISTER_VALIDATORS(v_training_norm)
