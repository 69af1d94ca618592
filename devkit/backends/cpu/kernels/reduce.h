/*
 * reduce.h -- what the reduction-family kernels (reduce*.c) share: per-dtype
 * loads and stores, and splitting a tensor around one axis.
 *
 * Float types compute in double: float32 is exact in it, float16 and
 * bfloat16 are widened through float32. Results are rounded once into the
 * output dtype. Integer types have their own accumulators (see each file).
 */
#ifndef DEVKIT_BACKENDS_CPU_KERNELS_REDUCE_H_
#define DEVKIT_BACKENDS_CPU_KERNELS_REDUCE_H_

#include <stdlib.h>

#include "dks_kernel.h"

/* Rounds a double to float with round-to-odd (truncate, then set the last
 * bit if anything was dropped). float has more than two bits beyond
 * float16's and bfloat16's precision, so rounding this float to nearest
 * gives the correctly rounded float16/bfloat16 of `v`, where two
 * round-to-nearest steps (double -> float -> half) could round twice. */
static inline float reduce_round_odd(double v) {
  float f = (float)v;
  if ((double)f == v || isnan(f) || isinf(f)) return f;
  uint32_t bits;
  memcpy(&bits, &f, sizeof bits);
  if (fabs((double)f) > fabs(v)) bits--; /* rounded away from zero: take the truncation */
  bits |= 1;
  memcpy(&f, &bits, sizeof f);
  return f;
}

/* max/min where NaN propagates, as in NumPy: once `a` is NaN nothing replaces it. */
#define REDUCE_FMAX(a, v) ((v) > (a) || (v) != (v) ? (v) : (a))
#define REDUCE_FMIN(a, v) ((v) < (a) || (v) != (v) ? (v) : (a))
/* Lanes of a max/min fold over a contiguous run: GCC vectorises its
 * compare-and-select only as an elementwise loop over a row of lanes
 * (ReduceMax of 4096-float rows: 0.59 ns an element with 8 lanes, 0.18
 * with 64, AVX-512 clone of a Zen 4). */
#define REDUCE_EXTREMUM_LANES 64

/* Loads (element -> double) and stores (double -> element) per float dtype. */
#define REDUCE_LOAD_F32(x) ((double)(x))
#define REDUCE_LOAD_F64(x) (x)
#define REDUCE_LOAD_F16(x) ((double)dks_f16_to_f32(x))
#define REDUCE_LOAD_BF16(x) ((double)dks_bf16_to_f32(x))
#define REDUCE_STORE_F32(v) ((float)(v))
#define REDUCE_STORE_F64(v) (v)
#define REDUCE_STORE_F16(v) dks_f32_to_f16(reduce_round_odd(v))
#define REDUCE_STORE_BF16(v) dks_f32_to_bf16(reduce_round_odd(v))

/* X-macros over the dtypes: X(suffix, C type, DK dtype, LOAD, STORE) for the
 * float types; X(suffix, C type, unsigned C type, DK dtype, min, max) for
 * the integer types. */
#define REDUCE_FLOAT_TYPES(X)                                           \
  X(f32, float, DK_DTYPE_FLOAT32, REDUCE_LOAD_F32, REDUCE_STORE_F32)    \
  X(f64, double, DK_DTYPE_FLOAT64, REDUCE_LOAD_F64, REDUCE_STORE_F64)   \
  X(f16, uint16_t, DK_DTYPE_FLOAT16, REDUCE_LOAD_F16, REDUCE_STORE_F16) \
  X(bf16, uint16_t, DK_DTYPE_BFLOAT16, REDUCE_LOAD_BF16, REDUCE_STORE_BF16)

#define REDUCE_INT_TYPES(X)                                       \
  X(i8, int8_t, uint8_t, DK_DTYPE_INT8, INT8_MIN, INT8_MAX)       \
  X(u8, uint8_t, uint8_t, DK_DTYPE_UINT8, 0, UINT8_MAX)           \
  X(i32, int32_t, uint32_t, DK_DTYPE_INT32, INT32_MIN, INT32_MAX) \
  X(i64, int64_t, uint64_t, DK_DTYPE_INT64, INT64_MIN, INT64_MAX)

/* Splits compact tensor `t` around `axis` (negative: from the end) into
 * outer x len x inner elements, or fails naming the attribute. */
static inline DK_Status reduce_split(const dks_kernel_args *k, const dks_tensor *t,
                                     const char *attr, int64_t axis, int64_t *outer,
                                     int64_t *len, int64_t *inner) {
  *outer = *len = *inner = 0;
  if (axis < -t->ndim || axis >= t->ndim)
    return dks_kernel_fail(k, DK_INVALID_ARGUMENT, "%s %lld is out of range for rank %d", attr,
                           (long long)axis, t->ndim);
  if (axis < 0) axis += t->ndim;
  *outer = *inner = 1;
  for (int32_t d = 0; d < axis; d++) *outer *= t->shape[d];
  for (int32_t d = (int32_t)axis + 1; d < t->ndim; d++) *inner *= t->shape[d];
  *len = t->shape[axis];
  return DK_OK;
}

/* A validator's check (reduce.c): output 0 has dtype `dtype` and input 0's
 * shape with the `reduced` dims dropped, or kept as 1 with attribute
 * "keepdims" (default 1). */
DK_Status reduce_check_output(const dks_kernel_args *k, const bool *reduced, DK_DTypeKey dtype);

#endif /* DEVKIT_BACKENDS_CPU_KERNELS_REDUCE_H_ */
