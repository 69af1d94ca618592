/*
 * training.h -- what the training kernel files (training*.c) share.
 *
 * The training kernels compute in double whatever the float storage dtype:
 * a kernel widens the elements it works on into double scratch, computes
 * there (loops the compiler vectorises), and narrows the results with one
 * rounding (float16 and bfloat16 through float32, as every cpu kernel
 * rounds them). The helpers are defined in training.c.
 */
#ifndef DEVKIT_BACKENDS_CPU_KERNELS_TRAINING_H_
#define DEVKIT_BACKENDS_CPU_KERNELS_TRAINING_H_

#include "dks_kernel.h"

/* X(SFX, DTYPE) for every float storage dtype. */
#define TRAINING_FLOAT_TYPES(X) \
  X(f32, DK_DTYPE_FLOAT32) X(f64, DK_DTYPE_FLOAT64) X(f16, DK_DTYPE_FLOAT16) X(bf16, DK_DTYPE_BFLOAT16)

/* dst[i] = element i of the compact float tensor data `src`, i < n (n may
 * be 0, src then NULL). */
void training_widen(double *dst, const uint8_t *src, DK_DTypeKey dtype, int64_t n);

/* Element i of the compact float tensor data `dst` = src[i], rounded once. */
void training_narrow(uint8_t *dst, DK_DTypeKey dtype, const double *src, int64_t n);

/* Element i of a compact float tensor, as double. */
static inline double training_load(const dks_tensor *t, int64_t i) {
  return dks_load_as_double(t->data + i * t->itemsize, t->dtype);
}

/* Pairwise sum of x[0..n): error O(log n) roundings, not O(n). */
double training_sum(const double *x, int64_t n);

/* Scratch for `count` doubles (zeroed; count 0 allocates one), or NULL after
 * reporting DK_RESOURCE_EXHAUSTED through dks_kernel_fail. */
double *training_scratch(const dks_kernel_args *k, int64_t count);

/* The product of sizes [from, to) of a shape. */
static inline int64_t training_prod(const int64_t *shape, int32_t from, int32_t to) {
  int64_t n = 1;
  for (int32_t d = from; d < to; d++) n *= shape[d];
  return n;
}

#endif /* DEVKIT_BACKENDS_CPU_KERNELS_TRAINING_H_ */
