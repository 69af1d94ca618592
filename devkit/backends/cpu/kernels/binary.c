/*
 * binary.c -- binary and variadic elementwise kernels (Add, ...).
 */
#include "kernel.h"

#define BINARY_LOOP(NAME, T, EXPR)                                              \
  static void NAME(int64_t n, uint8_t *const *p, const int64_t *s, void *ctx) { \
    (void)ctx;                                                                  \
    uint8_t *o = p[0];                                                          \
    const uint8_t *a = p[1], *b = p[2];                                         \
    for (int64_t i = 0; i < n; i++, o += s[0], a += s[1], b += s[2]) {          \
      T x = *(const T *)a, y = *(const T *)b;                                   \
      *(T *)o = (T)(EXPR);                                                      \
    }                                                                           \
  }

/* float16/bfloat16: load as float32, compute, round once on store. */
#define BINARY_LOOP_LOW(NAME, LOAD, STORE, EXPR)                                \
  static void NAME(int64_t n, uint8_t *const *p, const int64_t *s, void *ctx) { \
    (void)ctx;                                                                  \
    uint8_t *o = p[0];                                                          \
    const uint8_t *a = p[1], *b = p[2];                                         \
    for (int64_t i = 0; i < n; i++, o += s[0], a += s[1], b += s[2]) {          \
      float x = LOAD(*(const uint16_t *)a), y = LOAD(*(const uint16_t *)b);     \
      *(uint16_t *)o = STORE(EXPR);                                             \
    }                                                                           \
  }

#define KERNEL(NAME, LOOP)                           \
  static DK_Status NAME(const cpu_kernel_args *k) {  \
    cpu_elementwise(k, 2, LOOP, NULL);               \
    return DK_OK;                                    \
  }

/* Signed integer arithmetic wraps (two's complement), as ONNX runtimes do. */
#define WRAP_ADD(T, U) (T)((U)x + (U)y)

BINARY_LOOP(add_f32_loop, float, x + y)
BINARY_LOOP(add_f64_loop, double, x + y)
BINARY_LOOP_LOW(add_f16_loop, cpu_f16_to_f32, cpu_f32_to_f16, x + y)
BINARY_LOOP_LOW(add_bf16_loop, cpu_bf16_to_f32, cpu_f32_to_bf16, x + y)
BINARY_LOOP(add_i8_loop, int8_t, WRAP_ADD(int8_t, uint8_t))
BINARY_LOOP(add_u8_loop, uint8_t, x + y)
BINARY_LOOP(add_i32_loop, int32_t, WRAP_ADD(int32_t, uint32_t))
BINARY_LOOP(add_i64_loop, int64_t, WRAP_ADD(int64_t, uint64_t))

KERNEL(add_f32, add_f32_loop)
KERNEL(add_f64, add_f64_loop)
KERNEL(add_f16, add_f16_loop)
KERNEL(add_bf16, add_bf16_loop)
KERNEL(add_i8, add_i8_loop)
KERNEL(add_u8, add_u8_loop)
KERNEL(add_i32, add_i32_loop)
KERNEL(add_i64, add_i64_loop)

static const cpu_kernel_def k_binary[] = {
    {"Add", DK_DTYPE_FLOAT32, add_f32, CPU_STRIDED},
    {"Add", DK_DTYPE_FLOAT64, add_f64, CPU_STRIDED},
    {"Add", DK_DTYPE_FLOAT16, add_f16, CPU_STRIDED},
    {"Add", DK_DTYPE_BFLOAT16, add_bf16, CPU_STRIDED},
    {"Add", DK_DTYPE_INT8, add_i8, CPU_STRIDED},
    {"Add", DK_DTYPE_UINT8, add_u8, CPU_STRIDED},
    {"Add", DK_DTYPE_INT32, add_i32, CPU_STRIDED},
    {"Add", DK_DTYPE_INT64, add_i64, CPU_STRIDED},
};
CPU_REGISTER_KERNELS(k_binary)
