/*
 * movement_pad.c -- Pad: constant, reflect, edge and wrap modes.
 *
 * Negative pads crop: each axis is first cut to [max(0, -begin), size -
 * max(0, -end)), and the positive pads then extend that range, reflect,
 * edge and wrap reading from the cut range (as NumPy's pad on the cropped
 * array does, for pads of any size). Output and input strides are honoured.
 */
#include "movement.h"

#include <stdlib.h>

typedef enum pad_mode { PAD_CONSTANT, PAD_REFLECT, PAD_EDGE, PAD_WRAP } pad_mode;

/* The position in [0, n) that offset j (relative to the start of an axis's
 * kept range of n elements, and outside it) reads; -1 for the constant. An
 * empty range has nothing to read (the host allows only constant padding of
 * one). */
static int64_t padded_source(int64_t j, int64_t n, pad_mode mode) {
  if (n == 0) return -1;
  switch (mode) {
    case PAD_EDGE: return j < 0 ? 0 : n - 1;
    case PAD_WRAP: return (j % n + n) % n;
    case PAD_REFLECT: {
      if (n == 1) return 0;
      int64_t period = 2 * (n - 1), m = (j % period + period) % period;
      return m < n ? m : period - m;
    }
    case PAD_CONSTANT: break;
  }
  return -1;
}

static pad_mode mode_of(const char *mode) {
  if (strcmp(mode, "reflect") == 0) return PAD_REFLECT;
  if (strcmp(mode, "edge") == 0) return PAD_EDGE;
  if (strcmp(mode, "wrap") == 0) return PAD_WRAP;
  return PAD_CONSTANT;
}

/* The constant, converted to the data's dtype (0 when absent). */
static void constant_value(const dks_kernel_args *k, DK_DTypeKey dtype, uint8_t *value) {
  memset(value, 0, 8);
  int64_t count;
  const int64_t *ints = dks_attr_ints(k, "constant_value", &count);
  if (ints) {
    dks_store_from_int64(value, dtype, ints[0]);
    return;
  }
  const double *floats = dks_attr_floats(k, "constant_value", &count);
  if (floats) dks_store_from_double(value, dtype, floats[0]);
}

/* The output is written row by row (a row: the innermost dim). Per dim, a
 * table maps each output position to the input position it reads, -1 for
 * the constant. A row whose outer positions include -1 is all constant;
 * otherwise its kept middle is one run copy and its pads element copies. */
static DK_Status pad(const dks_kernel_args *k) {
  const dks_tensor *in = &k->in[0], *out = &k->out[0];
  if (out->size == 0) return DK_OK;
  int32_t rank = out->ndim, itemsize = out->itemsize;
  uint8_t fill[8];
  constant_value(k, out->dtype, fill);
  if (rank == 0) {
    movement_copy_element(out->data, in->data, itemsize);
    return DK_OK;
  }
  pad_mode mode = mode_of(dks_attr_string(k, "mode", "constant"));
  int64_t n_pads, n_axes;
  const int64_t *pads = dks_attr_ints(k, "pads", &n_pads);
  const int64_t *axes = dks_attr_ints(k, "axes", &n_axes);
  int64_t begin[DKS_MAX_DIMS] = {0};
  for (int64_t i = 0; i < n_pads / 2; i++) {
    int64_t axis = axes ? axes[i] : i;
    begin[axis < 0 ? axis + rank : axis] = pads[i];
  }

  int64_t total = 0;
  for (int32_t d = 0; d < rank; d++) total += out->shape[d];
  int64_t *table = malloc((size_t)total * sizeof *table);
  if (!table)
    return dks_kernel_fail(k, DK_RESOURCE_EXHAUSTED, "host out of memory for the pad tables");
  int64_t *source[DKS_MAX_DIMS];
  /* Per dim: output positions [head, head + kept) read input [low, low + kept). */
  int64_t low[DKS_MAX_DIMS], kept[DKS_MAX_DIMS], head[DKS_MAX_DIMS];
  int64_t *next = table;
  for (int32_t d = 0; d < rank; d++) {
    int64_t end = out->shape[d] - in->shape[d] - begin[d];
    low[d] = begin[d] < 0 ? -begin[d] : 0;
    kept[d] = in->shape[d] - low[d] - (end < 0 ? -end : 0);
    head[d] = begin[d] > 0 ? begin[d] : 0;
    source[d] = next;
    for (int64_t o = 0; o < out->shape[d]; o++) {
      int64_t j = o - head[d];
      int64_t s = j >= 0 && j < kept[d] ? j : padded_source(j, kept[d], mode);
      source[d][o] = s < 0 ? -1 : low[d] + s;
    }
    next += out->shape[d];
  }

  int32_t last = rank - 1;
  int64_t out_step = out->strides[last] * itemsize, in_step = in->strides[last] * itemsize;
  const int64_t *map = source[last];
  int64_t middle_end = head[last] + kept[last], rows = out->size / out->shape[last];
  int64_t index[DKS_MAX_DIMS] = {0};
  for (int64_t r = 0; r < rows; r++) {
    uint8_t *dst = out->data;
    int64_t offset = 0; /* of the row's source, in input elements */
    bool constant = false;
    for (int32_t d = 0; d < last; d++) {
      dst += index[d] * out->strides[d] * itemsize;
      if (source[d][index[d]] < 0)
        constant = true;
      else
        offset += source[d][index[d]] * in->strides[d];
    }
    if (constant || kept[last] == 0) { /* nothing of the input in this row */
      movement_copy_run(dst, out_step, fill, 0, out->shape[last], itemsize);
    } else {
      const uint8_t *src = in->data + offset * itemsize;
      for (int64_t o = 0; o < head[last]; o++)
        movement_copy_element(dst + o * out_step, map[o] < 0 ? fill : src + map[o] * in_step,
                              itemsize);
      movement_copy_run(dst + head[last] * out_step, out_step, src + low[last] * in_step, in_step,
                        kept[last], itemsize);
      for (int64_t o = middle_end; o < out->shape[last]; o++)
        movement_copy_element(dst + o * out_step, map[o] < 0 ? fill : src + map[o] * in_step,
                              itemsize);
    }
    for (int32_t d = last - 1; d >= 0; d--) { /* odometer over the outer dims */
      if (++index[d] < out->shape[d]) break;
      index[d] = 0;
    }
  }
  free(table);
  return DK_OK;
}

static const dks_kernel_def k_movement_pad[] = {
    DKS_ALL_DTYPES("Pad", pad, DKS_STRIDED),
};
DKS_REGISTER_KERNELS(k_movement_pad)

/* Pads this large would overflow the output sizes. */
#define CPU_PAD_LIMIT ((int64_t)1 << 62)

/* pads: a begin and an end per padded axis; the output is the input grown by them. */
static DK_Status validate_pad(const dks_kernel_args *k) {
  const dks_tensor *in = &k->in[0];
  int32_t rank = in->ndim, axes[DKS_MAX_DIMS];
  int64_t n_axes, n_pads;
  DK_Status st = dks_check_dtype(k, "output", 0, in->dtype);
  if (st == DK_OK) st = dks_check_axes(k, "axes", rank, axes, &n_axes);
  if (st != DK_OK) return st;
  const int64_t *pads = dks_attr_ints(k, "pads", &n_pads);
  if ((st = dks_check_int_list(k, "pads")) != DK_OK) return st;
  int64_t padded = n_axes >= 0 ? n_axes : rank;
  if (n_pads != 2 * padded)
    return dks_invalid(k, "attribute 'pads' has %lld values; %lld axes need %lld", (long long)n_pads,
                       (long long)padded, (long long)(2 * padded));
  bool constant = mode_of(dks_attr_string(k, "mode", "constant")) == PAD_CONSTANT;
  int64_t shape[DKS_MAX_DIMS];
  for (int32_t d = 0; d < rank; d++) shape[d] = in->shape[d];
  for (int64_t i = 0; i < padded; i++) {
    int32_t axis = n_axes >= 0 ? axes[i] : (int32_t)i;
    int64_t b = pads[i], e = pads[padded + i], n = in->shape[axis], kept;
    if (b <= -CPU_PAD_LIMIT || b >= CPU_PAD_LIMIT || e <= -CPU_PAD_LIMIT || e >= CPU_PAD_LIMIT)
      return dks_invalid(k, "pads (%lld, %lld) of axis %d are beyond 2^62", (long long)b, (long long)e, axis);
    kept = n - (b < 0 ? -b : 0) - (e < 0 ? -e : 0);
    if (kept < 0)
      return dks_invalid(k, "pads (%lld, %lld) crop axis %d of size %lld by more than its size", (long long)b,
                         (long long)e, axis, (long long)n);
    if (kept == 0 && !constant && (b > 0 || e > 0))
      return dks_invalid(k, "mode '%s' cannot pad axis %d: it has no elements to read",
                         dks_attr_string(k, "mode", "constant"), axis);
    shape[axis] = n + b + e;
  }
  return dks_check_output(k, 0, rank, shape);
}

static const dks_validator v_movement_pad[] = {{"Pad", validate_pad}};
DKS_REGISTER_VALIDATORS(v_movement_pad)
