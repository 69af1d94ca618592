/*
 * training_loss.c -- SoftmaxCrossEntropyLoss and SoftmaxCrossEntropyLossGrad.
 *
 * scores (and log_prob) are compact (N, C, D1, ...), seen as (N, C, D) with
 * D the product of the trailing dims; labels are (N, D), int32 or int64.
 * Each image's (C, D) slab is widened to double, the log-softmax runs over
 * C for every d at once (contiguous inner loops over d), and the per-label
 * losses and weights are summed pairwise for the reductions.
 */
#include "training.h"

#include <stdlib.h>

/* The labels and how to weigh them. */
typedef struct sce_labels {
  const dks_tensor *labels;
  const dks_tensor *weights; /* NULL: weight 1 */
  bool has_ignore;
  int64_t ignore;
} sce_labels;

static sce_labels labels_of(const dks_kernel_args *k, size_t at) {
  sce_labels l = {.labels = &k->in[at]};
  if (k->num_inputs > at + 1 && k->in[at + 1].ndim >= 0) l.weights = &k->in[at + 1];
  l.has_ignore = dks_attr(k, "ignore_index") != NULL;
  l.ignore = dks_attr_int(k, "ignore_index", 0);
  return l;
}

static int64_t label_at(const sce_labels *l, int64_t i) {
  return dks_load_as_int64(l->labels->data + i * l->labels->itemsize, l->labels->dtype);
}

/* Every label is ignore_index or a class in [0, classes). */
static DK_Status check_labels(const dks_kernel_args *k, const sce_labels *l, int64_t classes) {
  for (int64_t i = 0; i < l->labels->size; i++) {
    int64_t label = label_at(l, i);
    if ((l->has_ignore && label == l->ignore) || (label >= 0 && label < classes)) continue;
    return dks_kernel_fail(k, DK_OUT_OF_RANGE,
                           "label %lld (element %lld of labels) is out of range for %lld classes",
                           (long long)label, (long long)i, (long long)classes);
  }
  return DK_OK;
}

/* The weight of label i: 0 when ignored, else weights[label] or 1. */
static double label_weight(const sce_labels *l, int64_t label) {
  if (l->has_ignore && label == l->ignore) return 0.0;
  return l->weights ? training_load(l->weights, label) : 1.0;
}

typedef enum { REDUCE_NONE, REDUCE_SUM, REDUCE_MEAN } sce_reduction;

static sce_reduction reduction_of(const dks_kernel_args *k) {
  const char *r = dks_attr_string(k, "reduction", "mean");
  return strcmp(r, "none") == 0 ? REDUCE_NONE : strcmp(r, "sum") == 0 ? REDUCE_SUM : REDUCE_MEAN;
}

/* slab[c * d_size + d] becomes log_softmax over c, for each d; `top` and
 * `total` are d_size scratch. NaN propagates through the maximum. */
static void log_softmax_slab(double *slab, int64_t classes, int64_t d_size, double *top, double *total) {
  for (int64_t d = 0; d < d_size; d++) {
    top[d] = -INFINITY;
    total[d] = 0.0;
  }
  for (int64_t c = 0; c < classes; c++) {
    const double *row = slab + c * d_size;
    for (int64_t d = 0; d < d_size; d++)
      if (!isnan(top[d]) && (row[d] > top[d] || isnan(row[d]))) top[d] = row[d];
  }
  for (int64_t c = 0; c < classes; c++) {
    const double *row = slab + c * d_size;
    for (int64_t d = 0; d < d_size; d++) total[d] += exp(row[d] - top[d]);
  }
  for (int64_t d = 0; d < d_size; d++) total[d] = log(total[d]);
  for (int64_t c = 0; c < classes; c++) {
    double *row = slab + c * d_size;
    for (int64_t d = 0; d < d_size; d++) row[d] = (row[d] - top[d]) - total[d];
  }
}

/* ---- SoftmaxCrossEntropyLoss ----------------------------------------------- */

static DK_Status sce_loss(const dks_kernel_args *k) {
  const dks_tensor *scores = &k->in[0], *loss = &k->out[0], *log_prob = &k->out[1];
  sce_labels l = labels_of(k, 1);
  sce_reduction reduction = reduction_of(k);
  int64_t batch = scores->shape[0], classes = scores->shape[1];
  int64_t d_size = training_prod(scores->shape, 2, scores->ndim), labels = batch * d_size;
  DK_Status st = check_labels(k, &l, classes);
  if (st != DK_OK) return st;
  int64_t slab = classes * d_size;
  double *buf = training_scratch(k, slab + 2 * d_size + 2 * labels);
  if (!buf) return DK_RESOURCE_EXHAUSTED;
  double *x = buf, *top = x + slab, *total = top + d_size, *losses = total + d_size, *weights = losses + labels;
  /* With no elements (C or D is 0) there is no slab to touch, and every
   * label is ignored (checked above) or there are none. */
  for (int64_t n = 0; n < batch && slab > 0; n++) {
    training_widen(x, scores->data + n * slab * scores->itemsize, scores->dtype, slab);
    log_softmax_slab(x, classes, d_size, top, total);
    training_narrow(log_prob->data + n * slab * log_prob->itemsize, log_prob->dtype, x, slab);
    for (int64_t d = 0; d < d_size; d++) {
      int64_t i = n * d_size + d, label = label_at(&l, i);
      double w = label_weight(&l, label);
      /* A zero weight zeroes the loss, even of a -inf or NaN log_prob. */
      losses[i] = w == 0.0 ? 0.0 : -w * x[label * d_size + d];
      weights[i] = w;
    }
  }
  if (reduction == REDUCE_NONE) {
    training_narrow(loss->data, loss->dtype, losses, labels);
  } else {
    double sum = training_sum(losses, labels);
    if (reduction == REDUCE_MEAN) sum /= training_sum(weights, labels); /* 0/0: NaN */
    training_narrow(loss->data, loss->dtype, &sum, 1);
  }
  free(buf);
  return DK_OK;
}

/* ---- SoftmaxCrossEntropyLossGrad ------------------------------------------- */

static DK_Status sce_loss_grad(const dks_kernel_args *k) {
  const dks_tensor *dy = &k->in[0], *log_prob = &k->in[1], *grad = &k->out[0];
  sce_labels l = labels_of(k, 2);
  sce_reduction reduction = reduction_of(k);
  int64_t batch = log_prob->shape[0], classes = log_prob->shape[1];
  int64_t d_size = training_prod(log_prob->shape, 2, log_prob->ndim), labels = batch * d_size;
  DK_Status st = check_labels(k, &l, classes);
  if (st != DK_OK) return st;
  int64_t slab = classes * d_size;
  double *buf = training_scratch(k, slab + 2 * labels);
  if (!buf) return DK_RESOURCE_EXHAUSTED;
  double *p = buf, *weights = p + slab, *scale = weights + labels;
  for (int64_t i = 0; i < labels; i++) weights[i] = label_weight(&l, label_at(&l, i));
  /* scale: what d loss / d loss_i is, times the label's weight. */
  double seed = reduction == REDUCE_NONE ? 0.0 : training_load(dy, 0);
  if (reduction == REDUCE_MEAN) seed /= training_sum(weights, labels);
  for (int64_t i = 0; i < labels; i++) scale[i] = weights[i] * (reduction == REDUCE_NONE ? training_load(dy, i) : seed);
  for (int64_t n = 0; n < batch && slab > 0; n++) {
    training_widen(p, log_prob->data + n * slab * log_prob->itemsize, log_prob->dtype, slab);
    for (int64_t c = 0; c < classes; c++) {
      double *row = p + c * d_size;
      for (int64_t d = 0; d < d_size; d++) {
        int64_t i = n * d_size + d;
        double onehot = label_at(&l, i) == c ? 1.0 : 0.0;
        row[d] = weights[i] == 0.0 ? 0.0 : (exp(row[d]) - onehot) * scale[i];
      }
    }
    training_narrow(grad->data + n * slab * grad->itemsize, grad->dtype, p, slab);
  }
  free(buf);
  return DK_OK;
}

/* ---- Registration ----------------------------------------------------------- */

#define LOSS_DEFS(SFX, DT)                                  \
  {"SoftmaxCrossEntropyLoss", DT, sce_loss, 0},             \
  {"SoftmaxCrossEntropyLossGrad", DT, sce_loss_grad, 0},

static const dks_kernel_def k_training_loss[] = {TRAINING_FLOAT_TYPES(LOSS_DEFS)};
DKS_REGISTER_KERNELS(k_training_loss)

/* ---- Validators ------------------------------------------------------------- */

/* labels (input `at`): int32 or int64, (N, D1, ...) of scores' (N, C, D1,
 * ...); weights (the next input), when given, (C) of scores' dtype. *loss
 * gets the loss's rank and shape: the labels', or () when reduced. */
static DK_Status check_sce_inputs(const dks_kernel_args *k, const dks_tensor *scores, size_t at, int32_t *ndim,
                                  int64_t *loss) {
  const dks_tensor *labels = &k->in[at];
  if (scores->ndim < 2) return dks_invalid(k, "the scores have rank %d; they need (N, C, D1, ...)", scores->ndim);
  if (labels->dtype != DK_DTYPE_INT32 && labels->dtype != DK_DTYPE_INT64)
    return dks_invalid(k, "input %zu (labels) has dtype key 0x%x; labels are int32 or int64", at,
                       (unsigned)labels->dtype);
  bool same = labels->ndim == scores->ndim - 1 && labels->shape[0] == scores->shape[0];
  for (int32_t d = 1; same && d < labels->ndim; d++) same = labels->shape[d] == scores->shape[d + 1];
  if (!same) return dks_invalid(k, "input %zu (labels) is not (N, D1, ...) of the scores' (N, C, D1, ...)", at);
  if (at + 1 < k->num_inputs && k->in[at + 1].ndim >= 0) {
    const dks_tensor *w = &k->in[at + 1];
    if (w->dtype != scores->dtype || w->ndim != 1 || w->shape[0] != scores->shape[1])
      return dks_invalid(k, "input %zu (weights) must be (C) = (%lld) of the scores' dtype", at + 1,
                         (long long)scores->shape[1]);
  }
  *ndim = reduction_of(k) == REDUCE_NONE ? labels->ndim : 0;
  memcpy(loss, labels->shape, (size_t)*ndim * sizeof *loss);
  return DK_OK;
}

/* SoftmaxCrossEntropyLoss: the loss, and log_prob of the scores' shape, both
 * in the scores' dtype (the kernel writes both). */
static DK_Status validate_sce(const dks_kernel_args *k) {
  int32_t ndim;
  int64_t loss[DKS_MAX_DIMS];
  DK_Status st = check_sce_inputs(k, &k->in[0], 1, &ndim, loss);
  if (st == DK_OK && k->num_outputs != 2)
    st = dks_invalid(k, "has %zu outputs; the kernel writes the loss and log_prob", k->num_outputs);
  if (st == DK_OK) st = dks_check_output(k, 0, ndim, loss);
  if (st == DK_OK) st = dks_check_output_like(k, 1, 0);
  for (size_t j = 0; st == DK_OK && j < 2; j++) st = dks_check_dtype(k, "output", j, k->in[0].dtype);
  return st;
}

/* SoftmaxCrossEntropyLossGrad: dY of the loss's shape and log_prob's dtype;
 * d_scores like log_prob. */
static DK_Status validate_sce_grad(const dks_kernel_args *k) {
  const dks_tensor *dy = &k->in[0], *log_prob = &k->in[1];
  int32_t ndim;
  int64_t loss[DKS_MAX_DIMS];
  DK_Status st = check_sce_inputs(k, log_prob, 2, &ndim, loss);
  if (st == DK_OK) st = dks_check_dtype(k, "input", 0, log_prob->dtype);
  if (st != DK_OK) return st;
  bool same = dy->ndim == ndim;
  for (int32_t d = 0; same && d < ndim; d++) same = dy->shape[d] == loss[d];
  if (!same) return dks_invalid(k, "input 0 (dY) does not have the loss's shape");
  st = dks_check_output_like(k, 0, 1);
  return st != DK_OK ? st : dks_check_dtype(k, "output", 0, log_prob->dtype);
}

static const dks_validator v_training_loss[] = {
    {"SoftmaxCrossEntropyLoss", validate_sce},
    {"SoftmaxCrossEntropyLossGrad", validate_sce_grad},
};
DKS_REGISTER_VALIDATORS(v_training_loss)
