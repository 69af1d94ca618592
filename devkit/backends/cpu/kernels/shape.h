/*
 * shape.h -- conversions shared by the shape family's kernels (shape.c,
 * shape_cast.c, shape_resize.c): every float result is rounded once, to
 * nearest even, from the exact value.
 *
 * Rounding a double to float32 and then to float16/bfloat16 rounds twice and
 * can land one ulp off (a value just above a float16 halfway point becomes
 * the halfway point in float32, then rounds to even). Rounding the first step
 * to odd -- truncate, and set the last bit when anything was cut off --
 * keeps the information the second rounding needs, as long as the final
 * format has at least two fewer significand bits (float16: 11, bfloat16: 8,
 * float32: 24).
 */
#ifndef DEVKIT_BACKENDS_CPU_KERNELS_SHAPE_H_
#define DEVKIT_BACKENDS_CPU_KERNELS_SHAPE_H_

#include "kernel.h"

/* Float -> integer: truncation toward zero, saturated, NaN -> 0 (C leaves
 * out-of-range conversions undefined; so does ONNX). */
#define SHAPE_SATURATE(T, lo, hi, v)                                                    \
  ((v) != (v) ? (T)0 : (v) <= (double)(lo) ? (T)(lo) : (v) >= (double)(hi) ? (T)(hi) \
                                                                          : (T)(v))

static inline float shape_f32_from_bits(uint32_t bits) {
  float f;
  memcpy(&f, &bits, sizeof f);
  return f;
}

static inline uint32_t shape_f32_bits(float f) {
  uint32_t bits;
  memcpy(&bits, &f, sizeof bits);
  return bits;
}

/* double -> float32, rounded to odd. */
static inline float shape_f64_to_f32_odd(double d) {
  float f = (float)d;
  if (isfinite(d) && (double)f != d) {
    if (fabs((double)f) > fabs(d)) f = nextafterf(f, 0.0f); /* truncate; inf -> FLT_MAX */
    f = shape_f32_from_bits(shape_f32_bits(f) | 1u);
  }
  return f;
}

/* int64 -> float32, rounded to odd: keep the top 24 significant bits, the
 * lowest of them or-ed with every bit cut off. */
static inline float shape_i64_to_f32_odd(int64_t v) {
  uint64_t magnitude = v < 0 ? 0 - (uint64_t)v : (uint64_t)v;
  if (magnitude >> 24) {
    int shift = 40 - __builtin_clzll(magnitude); /* bit length - 24 */
    uint64_t kept = magnitude >> shift;
    if (magnitude & ((UINT64_C(1) << shift) - 1)) kept |= 1;
    magnitude = kept << shift; /* 24 significant bits: exact in float32 */
  }
  float f = (float)magnitude;
  return v < 0 ? -f : f;
}

static inline uint16_t shape_f64_to_f16(double d) { return cpu_f32_to_f16(shape_f64_to_f32_odd(d)); }
static inline uint16_t shape_f64_to_bf16(double d) { return cpu_f32_to_bf16(shape_f64_to_f32_odd(d)); }
static inline uint16_t shape_i64_to_f16(int64_t v) { return cpu_f32_to_f16(shape_i64_to_f32_odd(v)); }
static inline uint16_t shape_i64_to_bf16(int64_t v) { return cpu_f32_to_bf16(shape_i64_to_f32_odd(v)); }

/* Stores `v` as one element of `dtype` (any of the nine in the op set):
 * floats rounded once to nearest even, integers as SHAPE_SATURATE, bool v != 0. */
static inline void shape_store_double(uint8_t *p, DK_DTypeKey dtype, double v) {
  switch ((int)dtype) {
    case DK_DTYPE_FLOAT16: *(uint16_t *)p = shape_f64_to_f16(v); break;
    case DK_DTYPE_BFLOAT16: *(uint16_t *)p = shape_f64_to_bf16(v); break;
    case DK_DTYPE_FLOAT32: *(float *)p = (float)v; break;
    case DK_DTYPE_FLOAT64: *(double *)p = v; break;
    case DK_DTYPE_INT8: *(int8_t *)p = SHAPE_SATURATE(int8_t, INT8_MIN, INT8_MAX, v); break;
    case DK_DTYPE_UINT8: *p = SHAPE_SATURATE(uint8_t, 0, UINT8_MAX, v); break;
    case DK_DTYPE_INT32: *(int32_t *)p = SHAPE_SATURATE(int32_t, INT32_MIN, INT32_MAX, v); break;
    case DK_DTYPE_INT64: *(int64_t *)p = SHAPE_SATURATE(int64_t, INT64_MIN, INT64_MAX, v); break;
    default: *p = v != 0; break; /* bool */
  }
}

static inline bool shape_is_float(DK_DTypeKey dtype) {
  int code = (int)(dtype & 0xff);
  return code == DK_DTYPE_CODE_FLOAT || code == DK_DTYPE_CODE_BFLOAT;
}

#endif /* DEVKIT_BACKENDS_CPU_KERNELS_SHAPE_H_ */
