"""SoftmaxCrossEntropyLoss and SoftmaxCrossEntropyLossGrad.

scores (and log_prob) are compact (N, C, D1, ...), seen as (N, C, D) with D
the product of the trailing dims; labels are (N, D), int32 or int64 (prefix
I). The log-softmax over C and the per-label losses are computed in the
prelude's acc type, as on the cpu plugin (training_loss.c); the reduced
loss and the mean's sum of weights are device-side reductions over every
label, in a second pass. A label outside [0, C) that is not ignore_index
fails the stream (OutOfRangeError, training_common.RangeCheck).
"""

from __future__ import annotations

import math

import numpy as np

from .layer import Call, launch_items, prelude
from .training_common import (
    NO_CONTRACT,
    RangeCheck,
    acc_itemsize,
    launch_rows,
    row_helpers,
    scratch,
)

_REDUCTIONS = {"none": 0, "sum": 1, "mean": 2}

_TEMPLATE = """
/* The weight of a label: 0 where ignored, and where out of range (flagged). */
inline X_acc dk_label_weight(I_ct label, long classes, global const X_t *weights, long w_off,
                             int has_weights, int has_ignore, long ignore, volatile global int *flag) {
  if (has_ignore && label == ignore) return 0;
  if (label < 0 || label >= classes) {
    atomic_xchg(flag, 1);
    return 0;
  }
  return has_weights ? (X_acc)X_load(weights, w_off + label) : (X_acc)1;
}

/* Row i: the log-softmax over the classes of label position i = (n, d),
 * then its loss: stored (reduction none), or with its weight into
 * partial[2i], partial[2i + 1] for k_sce_reduce. */
kernel void k_SoftmaxCrossEntropyLoss(global const X_t *scores, long scores_off,
                                      global const I_t *labels, long labels_off,
                                      global const X_t *weights, long w_off, int has_weights,
                                      int has_ignore, long ignore, global X_t *log_prob, long lp_off,
                                      global X_t *loss, long loss_off, global X_acc *partial, int reduce,
                                      long classes, long d_size, volatile global int *flag,
                                      long rows, local X_acc *s) {
  DK_ROW
  long i = row, first = i / d_size * classes * d_size + i % d_size;
  X_acc top = -INFINITY;
  for (long c = lane; active && c < classes; c += lanes)
    top = dk_nan_max_X(top, X_load(scores, scores_off + first + c * d_size));
  top = dk_row_max_X(s, top);
  X_acc part = 0;
  for (long c = lane; active && c < classes; c += lanes)
    part += exp(X_load(scores, scores_off + first + c * d_size) - top);
  X_acc lse = log(dk_row_sum_X(s, part));
  if (!active) return;
  for (long c = lane; c < classes; c += lanes) {
    long j = first + c * d_size;
    X_store(log_prob, lp_off + j, (X_load(scores, scores_off + j) - top) - lse);
  }
  if (lane != 0) return;
  I_ct label = I_load(labels, labels_off + i);
  X_acc w = dk_label_weight(label, classes, weights, w_off, has_weights, has_ignore, ignore, flag);
  /* A zero weight zeroes the loss, even of a -inf or NaN log_prob. */
  X_acc l = w == 0 ? 0 : -w * ((X_load(scores, scores_off + first + label * d_size) - top) - lse);
  if (reduce) {
    partial[2 * i] = l;
    partial[2 * i + 1] = w;
  } else {
    X_store(loss, loss_off + i, l);
  }
}

/* One row: the sum of the `count` losses in partial, or (mean) that sum
 * over the sum of their weights (0/0: NaN). */
kernel void k_sce_reduce(global const X_acc *partial, long count, int mean, global X_t *loss,
                         long loss_off, long rows, local X_acc *s) {
  DK_ROW
  X_acc part_l = 0, part_w = 0;
  for (long i = lane; active && i < count; i += lanes) {
    part_l += partial[2 * i];
    part_w += partial[2 * i + 1];
  }
  X_acc sum = dk_row_sum_X(s, part_l), weight = dk_row_sum_X(s, part_w);
  if (active && lane == 0) X_store(loss, loss_off, mean ? sum / weight : sum);
}

/* One row: every label checked, the sum of their weights to total[0]. */
kernel void k_sce_weight_total(global const I_t *labels, long labels_off, long count,
                               global const X_t *weights, long w_off, int has_weights, int has_ignore,
                               long ignore, long classes, volatile global int *flag,
                               global X_acc *total, long rows, local X_acc *s) {
  DK_ROW
  X_acc part = 0;
  for (long i = lane; active && i < count; i += lanes)
    part += dk_label_weight(I_load(labels, labels_off + i), classes, weights, w_off, has_weights,
                            has_ignore, ignore, flag);
  X_acc sum = dk_row_sum_X(s, part);
  if (active && lane == 0) total[0] = sum;
}

/* One work-item per element (n, c, d) of d_scores: (exp(log_prob) - onehot)
 * times the label's weight times dY (none: the label's element; sum: dY[0];
 * mean: dY[0] / total[0]); 0 where the weight is 0. */
kernel void k_SoftmaxCrossEntropyLossGrad(global const X_t *dy, long dy_off,
                                          global const X_t *log_prob, long lp_off,
                                          global const I_t *labels, long labels_off,
                                          global const X_t *weights, long w_off, int has_weights,
                                          int has_ignore, long ignore, global X_t *grad, long grad_off,
                                          int reduction, global const X_acc *total, long classes,
                                          long d_size, long n, volatile global int *flag) {
  long e = get_global_id(0);
  if (e >= n) return;
  long slab = classes * d_size, c = e % slab / d_size, i = e / slab * d_size + e % d_size;
  I_ct label = I_load(labels, labels_off + i);
  X_acc w = dk_label_weight(label, classes, weights, w_off, has_weights, has_ignore, ignore, flag);
  X_acc result = 0;
  if (w != 0) {
    X_acc seed = X_load(dy, dy_off + (reduction == 0 ? i : 0));
    if (reduction == 2) seed /= total[0];
    result = (exp((X_acc)X_load(log_prob, lp_off + e)) - (label == c ? 1 : 0)) * (w * seed);
  }
  X_store(grad, grad_off + e, result);
}
"""


def _source(c: Call, key: int, labels_key: int) -> str:
    return (NO_CONTRACT + prelude("X", key, c.fp64) + prelude("I", labels_key, c.fp64) + row_helpers("X")
            + _TEMPLATE)


class _Labels:
    """The labels' kernel arguments (weights, ignore_index) and their range check."""

    def __init__(self, c: Call, labels, weights, classes: int):
        ignore = c.attrs.get("ignore_index")
        self.labels, self.ignore, self.classes = labels, ignore, classes
        self.check = RangeCheck(c)
        self.args = [weights if weights is not None else labels,  # a stand-in, never read
                     np.int64(weights.offset if weights is not None else 0), np.int32(weights is not None),
                     np.int32(ignore is not None), np.int64(ignore if ignore is not None else 0)]

    def report(self) -> None:
        def valid(values):
            return ((values >= 0) & (values < self.classes)) | (values == self.ignore)

        def describe(label, i):
            return f"label {label} (element {i} of labels) is out of range for {self.classes} classes"

        self.check.report(self.labels, valid, describe)


def _loss(c: Call, key: int) -> None:
    c.expect((2, 3), 2)
    scores, labels = c.inputs[:2]
    weights = c.input(2)
    loss, log_prob = c.outputs
    classes, d_size = scores.shape[1], math.prod(scores.shape[2:])
    count = scores.shape[0] * d_size
    reduction = _REDUCTIONS[c.attrs["reduction"]]
    source = _source(c, key, labels.dtype)
    label = _Labels(c, labels, weights, classes)
    partial = scratch(c, 2 * count if reduction else 0, acc_itemsize(c))  # (loss, weight) per label
    if count:
        args = ([scores, np.int64(scores.offset), labels, np.int64(labels.offset)] + label.args
                + [log_prob, np.int64(log_prob.offset), loss, np.int64(loss.offset), partial,
                   np.int32(reduction != 0), np.int64(classes), np.int64(d_size), label.check.flag])
        launch_rows(c, source, "k_SoftmaxCrossEntropyLoss", args, count, classes)
        label.report()
    if reduction:
        args = [partial, np.int64(count), np.int32(reduction == 2), loss, np.int64(loss.offset)]
        launch_rows(c, source, "k_sce_reduce", args, 1, count)


def _loss_grad(c: Call, key: int) -> None:
    c.expect((3, 4), 1)
    dy, log_prob, labels = c.inputs[:3]
    weights = c.input(3)
    (grad,) = c.outputs
    classes, d_size = log_prob.shape[1], math.prod(log_prob.shape[2:])
    count = log_prob.shape[0] * d_size
    if count == 0:
        return
    reduction = _REDUCTIONS[c.attrs["reduction"]]
    source = _source(c, key, labels.dtype)
    label = _Labels(c, labels, weights, classes)
    total = scratch(c, 1, acc_itemsize(c))
    launch_rows(c, source, "k_sce_weight_total",
                [labels, np.int64(labels.offset), np.int64(count)] + label.args
                + [np.int64(classes), label.check.flag, total], 1, count)
    if grad.size:
        args = ([dy, np.int64(dy.offset), log_prob, np.int64(log_prob.offset), labels, np.int64(labels.offset)]
                + label.args + [grad, np.int64(grad.offset), np.int32(reduction), total, np.int64(classes),
                                np.int64(d_size), np.int64(grad.size), label.check.flag])
        launch_items(c, source, "k_SoftmaxCrossEntropyLossGrad", args, grad.size)
    label.report()


def register(table, unclaimed) -> None:
    table.claim("SoftmaxCrossEntropyLoss", _loss, 0, unclaimed)
    table.claim("SoftmaxCrossEntropyLossGrad", _loss_grad, 0, unclaimed)
