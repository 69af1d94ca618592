/*
 * shape_cast.c -- Cast between the nine dtypes of the op set (81 loops).
 *
 * Each source loads exactly into a wide type -- integers and bools into
 * int64, floats into double -- and each target has a store from both; C11
 * _Generic picks the store by the loaded type. Semantics (devkit/ops/shape.py):
 * floats round once to nearest even (shape.h), float -> integer truncates and
 * saturates with NaN -> 0, integer -> integer wraps, x != 0 gives bool.
 */
#include "shape.h"

static inline int64_t load_b8(uint8_t x) { return x != 0; }
static inline int64_t load_i8(int8_t x) { return x; }
static inline int64_t load_u8(uint8_t x) { return x; }
static inline int64_t load_i32(int32_t x) { return x; }
static inline int64_t load_i64(int64_t x) { return x; }
static inline double load_f16(uint16_t x) { return dks_f16_to_f32(x); }
static inline double load_bf16(uint16_t x) { return dks_bf16_to_f32(x); }
static inline double load_f32(float x) { return x; }
static inline double load_f64(double x) { return x; }

/* Integer targets wrap: the conversion to the unsigned type is modular, and
 * back to the signed one is GCC/Clang's documented two's complement. */
static inline uint8_t store_b8_i(int64_t v) { return v != 0; }
static inline uint8_t store_b8_f(double v) { return v != 0; }
static inline int8_t store_i8_i(int64_t v) { return (int8_t)(uint8_t)v; }
static inline int8_t store_i8_f(double v) { return DKS_SATURATE(int8_t, INT8_MIN, INT8_MAX, v); }
static inline uint8_t store_u8_i(int64_t v) { return (uint8_t)v; }
static inline uint8_t store_u8_f(double v) { return DKS_SATURATE(uint8_t, 0, UINT8_MAX, v); }
static inline int32_t store_i32_i(int64_t v) { return (int32_t)(uint32_t)v; }
static inline int32_t store_i32_f(double v) { return DKS_SATURATE(int32_t, INT32_MIN, INT32_MAX, v); }
static inline int64_t store_i64_i(int64_t v) { return v; }
static inline int64_t store_i64_f(double v) { return DKS_SATURATE(int64_t, INT64_MIN, INT64_MAX, v); }
static inline uint16_t store_f16_i(int64_t v) { return dks_i64_to_f16(v); }
static inline uint16_t store_f16_f(double v) { return dks_f64_to_f16(v); }
static inline uint16_t store_bf16_i(int64_t v) { return dks_i64_to_bf16(v); }
static inline uint16_t store_bf16_f(double v) { return dks_f64_to_bf16(v); }
/* int64 -> float and double -> float are correctly rounded conversions in C. */
static inline float store_f32_i(int64_t v) { return (float)v; }
static inline float store_f32_f(double v) { return (float)v; }
static inline double store_f64_i(int64_t v) { return (double)v; }
static inline double store_f64_f(double v) { return v; }

#define STORE(D, v) _Generic((v), int64_t: store_##D##_i, double: store_##D##_f)(v)

/* One loop per (source, target): a contiguous path the compiler vectorises,
 * and a strided one. */
#define CAST_LOOP(S, ST, D, DT)                                                               \
  static void cast_##S##_##D(int64_t n, uint8_t *const *p, const int64_t *s, void *ctx) {    \
    (void)ctx;                                                                               \
    if (s[0] == (int64_t)sizeof(DT) && s[1] == (int64_t)sizeof(ST)) {                        \
      DT *o = (DT *)p[0];                                                                    \
      const ST *a = (const ST *)p[1];                                                        \
      for (int64_t i = 0; i < n; i++) o[i] = STORE(D, load_##S(a[i]));                       \
      return;                                                                                \
    }                                                                                        \
    uint8_t *o = p[0];                                                                       \
    const uint8_t *a = p[1];                                                                 \
    for (int64_t i = 0; i < n; i++, o += s[0], a += s[1])                                    \
      *(DT *)o = STORE(D, load_##S(*(const ST *)a));                                         \
  }

/* Targets in the order of target_index(). */
#define CAST_LOOPS_FROM(S, ST)                                                              \
  CAST_LOOP(S, ST, b8, uint8_t)                                                             \
  CAST_LOOP(S, ST, i8, int8_t)                                                              \
  CAST_LOOP(S, ST, u8, uint8_t)                                                             \
  CAST_LOOP(S, ST, i32, int32_t)                                                            \
  CAST_LOOP(S, ST, i64, int64_t)                                                            \
  CAST_LOOP(S, ST, f16, uint16_t)                                                           \
  CAST_LOOP(S, ST, bf16, uint16_t)                                                          \
  CAST_LOOP(S, ST, f32, float)                                                              \
  CAST_LOOP(S, ST, f64, double)                                                             \
  static const dks_inner_loop cast_from_##S[] = {                                           \
      cast_##S##_b8,  cast_##S##_i8,   cast_##S##_u8,  cast_##S##_i32, cast_##S##_i64,     \
      cast_##S##_f16, cast_##S##_bf16, cast_##S##_f32, cast_##S##_f64};

#define CAST_SOURCES(X) \
  X(b8, uint8_t)        \
  X(i8, int8_t)         \
  X(u8, uint8_t)        \
  X(i32, int32_t)       \
  X(i64, int64_t)       \
  X(f16, uint16_t)      \
  X(bf16, uint16_t)     \
  X(f32, float)         \
  X(f64, double)

CAST_SOURCES(CAST_LOOPS_FROM)

static int target_index(DK_DTypeKey dtype) {
  switch ((int)dtype) {
    case DK_DTYPE_BOOL: return 0;
    case DK_DTYPE_INT8: return 1;
    case DK_DTYPE_UINT8: return 2;
    case DK_DTYPE_INT32: return 3;
    case DK_DTYPE_INT64: return 4;
    case DK_DTYPE_FLOAT16: return 5;
    case DK_DTYPE_BFLOAT16: return 6;
    case DK_DTYPE_FLOAT32: return 7;
    case DK_DTYPE_FLOAT64: return 8;
    default: return -1;
  }
}

static DK_Status cast(const dks_kernel_args *k, const dks_inner_loop *loops) {
  int target = target_index(k->out[0].dtype);
  if (target < 0)
    return dks_kernel_fail(k, DK_INVALID_ARGUMENT, "the output dtype is not one of the op set's");
  dks_elementwise(k, 1, loops[target], NULL);
  return DK_OK;
}

#define CAST_KERNEL(S, ST) \
  static DK_Status cast_##S(const dks_kernel_args *k) { return cast(k, cast_from_##S); }
CAST_SOURCES(CAST_KERNEL)

static const dks_kernel_def k_cast[] = {
    {"Cast", DK_DTYPE_BOOL, cast_b8, DKS_STRIDED},
    {"Cast", DK_DTYPE_INT8, cast_i8, DKS_STRIDED},
    {"Cast", DK_DTYPE_UINT8, cast_u8, DKS_STRIDED},
    {"Cast", DK_DTYPE_INT32, cast_i32, DKS_STRIDED},
    {"Cast", DK_DTYPE_INT64, cast_i64, DKS_STRIDED},
    {"Cast", DK_DTYPE_FLOAT16, cast_f16, DKS_STRIDED},
    {"Cast", DK_DTYPE_BFLOAT16, cast_bf16, DKS_STRIDED},
    {"Cast", DK_DTYPE_FLOAT32, cast_f32, DKS_STRIDED},
    {"Cast", DK_DTYPE_FLOAT64, cast_f64, DKS_STRIDED},
};
DKS_REGISTER_KERNELS(k_cast)

/* Cast: the output has the input's shape and the dtype "to" names. */
static DK_Status validate_cast(const dks_kernel_args *k) {
  DK_Status st = dks_check_output_like(k, 0, 0);
  return st != DK_OK ? st : dks_check_dtype(k, "output", 0, dks_attr_dtype(k, "to", k->in[0].dtype));
}

static const dks_validator v_shape_cast[] = {{"Cast", validate_cast}};
DKS_REGISTER_VALIDATORS(v_shape_cast)
