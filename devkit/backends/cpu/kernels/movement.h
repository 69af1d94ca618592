/*
 * movement.h -- helpers shared by the data-movement kernels (movement*.c).
 *
 * The kernels move elements without looking at their values (Scatter*'s
 * reductions and Pad's constant aside), so most are generic over the element
 * size and registered once per dtype with DKS_ALL_DTYPES.
 */
#ifndef DEVKIT_BACKENDS_CPU_KERNELS_MOVEMENT_H_
#define DEVKIT_BACKENDS_CPU_KERNELS_MOVEMENT_H_

#include "dks_kernel.h"

/* Tile views a rank-r tensor as 2r dims (repeat, extent) for movement_copy. */
#define MOVEMENT_MAX_DIMS (2 * DKS_MAX_DIMS)

/* Copies one element. The constant sizes become single loads and stores
 * (memcpy keeps them free of alignment and aliasing assumptions). */
static inline void movement_copy_element(uint8_t *dst, const uint8_t *src, int32_t itemsize) {
  switch (itemsize) {
    case 1: *dst = *src; break;
    case 2: memcpy(dst, src, 2); break;
    case 4: memcpy(dst, src, 4); break;
    case 8: memcpy(dst, src, 8); break;
    default: memcpy(dst, src, (size_t)itemsize); break;
  }
}

/* Copies n elements; dst and src advance by dst_step and src_step bytes
 * (src_step 0 repeats one element). One memcpy when both are contiguous. */
void movement_copy_run(uint8_t *dst, int64_t dst_step, const uint8_t *src, int64_t src_step,
                       int64_t n, int32_t itemsize);

/* dst[i] = src[i] for every index i of `shape` (ndim <= MOVEMENT_MAX_DIMS
 * dims); strides in bytes, any sign, 0 where src is broadcast. Dims that are
 * contiguous on both sides are merged so contiguous runs become single
 * memcpy calls, and a transposing copy goes through cache-sized tiles. */
void movement_copy(int32_t ndim, const int64_t *shape, uint8_t *dst, const int64_t *dst_strides,
                   const uint8_t *src, const int64_t *src_strides, int32_t itemsize);

/* The byte strides of `t`. */
static inline void movement_byte_strides(const dks_tensor *t, int64_t *strides) {
  for (int32_t d = 0; d < t->ndim; d++) strides[d] = t->strides[d] * t->itemsize;
}

/* Element i of a compact int32 or int64 index tensor. */
static inline int64_t movement_index(const dks_tensor *indices, int64_t i) {
  if (indices->dtype == DK_DTYPE_INT64) return ((const int64_t *)indices->data)[i];
  return ((const int32_t *)indices->data)[i];
}

/* Fails the kernel with DK_OUT_OF_RANGE: index `value`, element `position`
 * of the indices, is outside [-dim, dim) for data axis `axis`. */
DK_Status movement_index_error(const dks_kernel_args *k, int64_t value, int64_t position,
                               int32_t axis, int64_t dim);

/* Reports the first element of `indices` outside [-dim, dim), the range
 * of an axis of size `dim` (`axis` names it in the message). */
DK_Status movement_check_indices(const dks_kernel_args *k, const dks_tensor *indices,
                                 int64_t dim, int32_t axis);

/* Validators' checks of data (input 0) and indices (input 1, int32 or
 * int64), as the Gather and Scatter ops read them. _elementwise: GatherElements and
 * ScatterElements -- "axis" inside data's rank (*axis normalised), indices of
 * data's rank and no larger in any other dim. _nd: GatherND and ScatterND --
 * the first `batch_dims` dims shared, and *depth = indices.shape[-1] in
 * 1..rank(data) - batch_dims. */
DK_Status movement_check_elementwise_indices(const dks_kernel_args *k, int64_t *axis);
DK_Status movement_check_nd_indices(const dks_kernel_args *k, int64_t batch_dims, int32_t *depth);

/* Steps a row-major walk over `shape` to the next index, keeping
 * *offset == sum(index[d] * strides[d]). */
static inline void movement_advance(int32_t ndim, const int64_t *shape, const int64_t *strides,
                                    int64_t *index, int64_t *offset) {
  for (int32_t d = ndim - 1; d >= 0; d--) {
    *offset += strides[d];
    if (++index[d] < shape[d]) return;
    *offset -= strides[d] * shape[d];
    index[d] = 0;
  }
}

#endif /* DEVKIT_BACKENDS_CPU_KERNELS_MOVEMENT_H_ */
