/*
 * movement_gather.c -- Gather, GatherElements, GatherND.
 *
 * Indices are int32 or int64, negative ones count from the end of their
 * axis. Every index is checked before anything is written: one out of range
 * fails the kernel with DK_OUT_OF_RANGE naming it, its position and the
 * bound. Tensors are compact (the host compacts strided inputs).
 */
#include "movement.h"

static int64_t product(const int64_t *shape, int32_t from, int32_t to) {
  int64_t n = 1;
  for (int32_t d = from; d < to; d++) n *= shape[d];
  return n;
}

static int32_t data_axis(const dks_kernel_args *k) {
  int64_t axis = dks_attr_int(k, "axis", 0);
  return (int32_t)(axis < 0 ? axis + k->in[0].ndim : axis);
}

/* out[outer, j, inner] = data[outer, indices[j], inner], with the indices
 * flattened: each index selects a contiguous run of `inner` elements. */
static DK_Status gather(const dks_kernel_args *k) {
  const dks_tensor *data = &k->in[0], *indices = &k->in[1], *out = &k->out[0];
  int32_t axis = data_axis(k);
  int64_t dim = data->shape[axis];
  DK_Status st = movement_check_indices(k, indices, dim, axis);
  if (st != DK_OK || out->size == 0) return st;
  int32_t itemsize = data->itemsize;
  int64_t outer = product(data->shape, 0, axis);
  int64_t inner = product(data->shape, axis + 1, data->ndim);
  int64_t run = inner * itemsize;
  uint8_t *o = out->data;
  for (int64_t i = 0; i < outer; i++) {
    const uint8_t *block = data->data + i * dim * run;
    for (int64_t j = 0; j < indices->size; j++, o += run) {
      int64_t v = movement_index(indices, j);
      movement_copy_run(o, itemsize, block + (v < 0 ? v + dim : v) * run, itemsize, inner,
                        itemsize);
    }
  }
  return DK_OK;
}

/* out[i] = data[i with i[axis] replaced by indices[i]]; indices may be
 * smaller than data in the other dims. */
static DK_Status gather_elements(const dks_kernel_args *k) {
  const dks_tensor *data = &k->in[0], *indices = &k->in[1], *out = &k->out[0];
  int32_t axis = data_axis(k);
  int64_t dim = data->shape[axis];
  DK_Status st = movement_check_indices(k, indices, dim, axis);
  if (st != DK_OK || out->size == 0) return st;
  int32_t itemsize = data->itemsize;
  /* The walk over the indices tracks the data offset of every dim but axis. */
  int64_t walk[DKS_MAX_DIMS], index[DKS_MAX_DIMS] = {0}, offset = 0;
  for (int32_t d = 0; d < data->ndim; d++) walk[d] = d == axis ? 0 : data->strides[d];
  int64_t axis_stride = data->strides[axis];
  for (int64_t p = 0; p < indices->size; p++) {
    int64_t v = movement_index(indices, p);
    movement_copy_element(out->data + p * itemsize,
                          data->data + (offset + (v < 0 ? v + dim : v) * axis_stride) * itemsize,
                          itemsize);
    movement_advance(indices->ndim, indices->shape, walk, index, &offset);
  }
  return DK_OK;
}

/* With b = batch_dims and k = indices.shape[-1]: for each batch and each
 * k-tuple of indices, out gets the slice data[batch, tuple, ...] of
 * prod(data.shape[b + k:]) contiguous elements. */
static DK_Status gather_nd(const dks_kernel_args *k) {
  const dks_tensor *data = &k->in[0], *indices = &k->in[1], *out = &k->out[0];
  int32_t b = (int32_t)dks_attr_int(k, "batch_dims", 0);
  int32_t depth = (int32_t)indices->shape[indices->ndim - 1];
  for (int64_t e = 0; e < indices->size; e++) {
    int32_t axis = b + (int32_t)(e % depth);
    int64_t v = movement_index(indices, e), dim = data->shape[axis];
    if (v < -dim || v >= dim) return movement_index_error(k, v, e, axis, dim);
  }
  if (out->size == 0) return DK_OK;
  int32_t itemsize = data->itemsize;
  int64_t batches = product(data->shape, 0, b);
  int64_t batch_size = product(data->shape, b, data->ndim);
  int64_t tuples = product(indices->shape, b, indices->ndim - 1);
  int64_t slice = product(data->shape, b + depth, data->ndim);
  uint8_t *o = out->data;
  int64_t e = 0;
  for (int64_t i = 0; i < batches; i++) {
    for (int64_t t = 0; t < tuples; t++, o += slice * itemsize) {
      int64_t offset = i * batch_size;
      for (int32_t j = 0; j < depth; j++, e++) {
        int64_t v = movement_index(indices, e), dim = data->shape[b + j];
        offset += (v < 0 ? v + dim : v) * data->strides[b + j];
      }
      movement_copy_run(o, itemsize, data->data + offset * itemsize, itemsize, slice, itemsize);
    }
  }
  return DK_OK;
}

static const dks_kernel_def k_movement_gather[] = {
    DKS_ALL_DTYPES("Gather", gather, 0),
    DKS_ALL_DTYPES("GatherElements", gather_elements, 0),
    DKS_ALL_DTYPES("GatherND", gather_nd, 0),
};
DKS_REGISTER_KERNELS(k_movement_gather)

/* ---- Validators ------------------------------------------------------------ */

/* data of rank >= 1 and int32 or int64 indices. */
static DK_Status check_data_and_indices(const dks_kernel_args *k) {
  DK_Status st = dks_check_rank(k, 0, 1, DKS_MAX_DIMS);
  if (st == DK_OK) st = dks_check_rank(k, 1, 0, DKS_MAX_DIMS);
  if (st == DK_OK && k->in[1].dtype != DK_DTYPE_INT32 && k->in[1].dtype != DK_DTYPE_INT64)
    st = dks_invalid(k, "indices must be int32 or int64, got dtype key 0x%x", (unsigned)k->in[1].dtype);
  return st;
}

DK_Status movement_check_elementwise_indices(const dks_kernel_args *k, int64_t *axis) {
  DK_Status st = check_data_and_indices(k);
  if (st == DK_OK) st = dks_check_axis(k, "axis", k->in[0].ndim, false, axis);
  if (st == DK_OK) st = dks_check_rank(k, 1, k->in[0].ndim, k->in[0].ndim);
  for (int32_t d = 0; st == DK_OK && d < k->in[0].ndim; d++)
    if (d != *axis && k->in[1].shape[d] > k->in[0].shape[d])
      st = dks_invalid(k, "indices dim %d is %lld, larger than data's %lld", d, (long long)k->in[1].shape[d],
                       (long long)k->in[0].shape[d]);
  return st;
}

DK_Status movement_check_nd_indices(const dks_kernel_args *k, int64_t batch_dims, int32_t *depth) {
  DK_Status st = check_data_and_indices(k);
  if (st == DK_OK) st = dks_check_rank(k, 1, 1, DKS_MAX_DIMS);
  if (st != DK_OK) return st;
  const dks_tensor *data = &k->in[0], *indices = &k->in[1];
  int32_t rank = data->ndim < indices->ndim ? data->ndim : indices->ndim;
  if (batch_dims < 0 || batch_dims >= rank)
    return dks_invalid(k, "attribute 'batch_dims' is %lld; it must be in [0, %d)", (long long)batch_dims, rank);
  for (int32_t d = 0; d < batch_dims; d++)
    if (data->shape[d] != indices->shape[d])
      return dks_invalid(k, "batch dim %d is %lld in data and %lld in indices", d, (long long)data->shape[d],
                         (long long)indices->shape[d]);
  int64_t last = indices->shape[indices->ndim - 1];
  if (last < 1 || last > data->ndim - batch_dims)
    return dks_invalid(k, "indices.shape[-1] is %lld; it must be in 1..%lld", (long long)last,
                       (long long)(data->ndim - batch_dims));
  *depth = (int32_t)last;
  return DK_OK;
}

/* Gather: output data.shape[:axis] + indices.shape + data.shape[axis + 1:]. */
static DK_Status validate_gather(const dks_kernel_args *k) {
  int64_t axis;
  DK_Status st = check_data_and_indices(k);
  if (st == DK_OK) st = dks_check_axis(k, "axis", k->in[0].ndim, false, &axis);
  const dks_tensor *data = &k->in[0], *indices = &k->in[1];
  if (st == DK_OK && data->ndim - 1 + indices->ndim > DKS_MAX_DIMS)
    st = dks_invalid(k, "the output's rank exceeds %d", DKS_MAX_DIMS);
  if (st != DK_OK) return st;
  int64_t shape[DKS_MAX_DIMS];
  int32_t n = 0;
  for (int32_t d = 0; d < axis; d++) shape[n++] = data->shape[d];
  for (int32_t d = 0; d < indices->ndim; d++) shape[n++] = indices->shape[d];
  for (int32_t d = (int32_t)axis + 1; d < data->ndim; d++) shape[n++] = data->shape[d];
  st = dks_check_output(k, 0, n, shape);
  return st != DK_OK ? st : dks_check_dtype(k, "output", 0, data->dtype);
}

/* GatherElements: output of indices' shape. */
static DK_Status validate_gather_elements(const dks_kernel_args *k) {
  int64_t axis;
  DK_Status st = movement_check_elementwise_indices(k, &axis);
  if (st == DK_OK) st = dks_check_output_like(k, 0, 1);
  return st != DK_OK ? st : dks_check_dtype(k, "output", 0, k->in[0].dtype);
}

/* GatherND: output indices.shape[:-1] + data.shape[batch_dims + depth:]. */
static DK_Status validate_gather_nd(const dks_kernel_args *k) {
  int64_t b = dks_attr_int(k, "batch_dims", 0);
  int32_t depth;
  DK_Status st = movement_check_nd_indices(k, b, &depth);
  if (st != DK_OK) return st;
  const dks_tensor *data = &k->in[0], *indices = &k->in[1];
  int64_t shape[2 * DKS_MAX_DIMS];
  int32_t n = 0;
  for (int32_t d = 0; d < indices->ndim - 1; d++) shape[n++] = indices->shape[d];
  for (int32_t d = (int32_t)b + depth; d < data->ndim; d++) shape[n++] = data->shape[d];
  if (n > DKS_MAX_DIMS) return dks_invalid(k, "the output's rank exceeds %d", DKS_MAX_DIMS);
  st = dks_check_output(k, 0, n, shape);
  return st != DK_OK ? st : dks_check_dtype(k, "output", 0, data->dtype);
}

static const dks_validator v_movement_gather[] = {
    {"Gather", validate_gather},
    {"GatherElements", validate_gather_elements},
    {"GatherND", validate_gather_nd},
};
DKS_REGISTER_VALIDATORS(v_movement_gather)
