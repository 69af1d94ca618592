/*
 * binary.c -- binary and variadic elementwise kernels, with ONNX
 * multidirectional broadcasting: Add Sub Mul Div Pow Mod PRelu, Max Min Sum
 * Mean, Equal Less LessOrEqual Greater GreaterOrEqual, And Or Xor,
 * BitwiseAnd BitwiseOr BitwiseXor and Where.
 *
 * Every kernel runs on dks_elementwise and so honours strides (DKS_STRIDED).
 * float16/bfloat16 are loaded as float32, computed and rounded once on store.
 * The integer results ONNX leaves open are those devkit/ops/binary.py fixes:
 * arithmetic wraps around, x / 0 and x % 0 are 0, INT_MIN / -1 is INT_MIN.
 */
#include "dks_kernel.h"

/* ---- dtype lists (X-macros) ----------------------------------------------- */

#define AS_IS(v) (v)
/* Stores from float32 -- or from float64 (Pow, Mean) through float32. */
#define STORE_F16(v) dks_f32_to_f16((float)(v))
#define STORE_BF16(v) dks_f32_to_bf16((float)(v))

/* X(SFX, T, CT, LOAD, STORE, M): stored as T, computed as CT; M is the libm
 * suffix of CT (f for float, empty for double). */
#define FLOAT_TYPES(X)                                   \
  X(f32, float, float, AS_IS, AS_IS, f)                  \
  X(f64, double, double, AS_IS, AS_IS, )                 \
  X(f16, uint16_t, float, dks_f16_to_f32, STORE_F16, f)  \
  X(bf16, uint16_t, float, dks_bf16_to_f32, STORE_BF16, f)

/* X(SFX, T, U): U is T's unsigned twin, where overflow wraps. */
#define SIGNED_TYPES(X) X(i8, int8_t, uint8_t) X(i32, int32_t, uint32_t) X(i64, int64_t, uint64_t)
#define UNSIGNED_TYPES(X) X(u8, uint8_t, uint8_t)
#define INT_TYPES(X) SIGNED_TYPES(X) UNSIGNED_TYPES(X)

/* ---- Loop and kernel generators ------------------------------------------ */

/* An inner loop storing out = EXPR, where x is operand 1 (TA, read through
 * LOADA) and y operand 2 (TB, through LOADB), both held as CT; the result is
 * stored as TO through STORE. EXPR may use ctx. Compact operands, and a
 * compact one with a broadcast scalar, get indexed loops the compiler
 * vectorises; other layouts step by byte strides. VLOOP2's compact loops are
 * also compiled for AVX2 and AVX-512 (DKS_VECTOR_CLONES): the arithmetic
 * that runs at memory speed, where wider vectors pay (every loop cloned
 * would triple the build time for loops that call libm anyway). */
#define LOOP2_WITH(ATTR, NAME, TA, LOADA, TB, LOADB, CT, TO, STORE, EXPR)         \
  ATTR static void NAME##_compact(int64_t n, TO *out,                 \
                                               const TA *a, const TB *b,           \
                                               int64_t sa, int64_t sb, void *ctx) { \
    (void)ctx;                                                                    \
    if (sa && sb) {                                                               \
      for (int64_t i = 0; i < n; i++) {                                           \
        CT x = (CT)LOADA(a[i]), y = (CT)LOADB(b[i]);                              \
        out[i] = (TO)STORE(EXPR);                                                 \
      }                                                                           \
    } else if (sa) {                                                              \
      CT y = (CT)LOADB(b[0]);                                                     \
      for (int64_t i = 0; i < n; i++) {                                           \
        CT x = (CT)LOADA(a[i]);                                                   \
        out[i] = (TO)STORE(EXPR);                                                 \
      }                                                                           \
    } else {                                                                      \
      CT x = (CT)LOADA(a[0]);                                                     \
      for (int64_t i = 0; i < n; i++) {                                           \
        CT y = (CT)LOADB(b[i]);                                                   \
        out[i] = (TO)STORE(EXPR);                                                 \
      }                                                                           \
    }                                                                             \
  }                                                                               \
  static void NAME(int64_t n, uint8_t *const *p, const int64_t *s, void *ctx) {   \
    uint8_t *o = p[0];                                                            \
    const uint8_t *a = p[1], *b = p[2];                                           \
    bool a_ok = s[1] == (int64_t)sizeof(TA) || s[1] == 0;                         \
    bool b_ok = s[2] == (int64_t)sizeof(TB) || s[2] == 0;                         \
    if (s[0] == (int64_t)sizeof(TO) && a_ok && b_ok && (s[1] || s[2])) {          \
      NAME##_compact(n, (TO *)o, (const TA *)a, (const TB *)b, s[1], s[2], ctx);  \
      return;                                                                     \
    }                                                                             \
    for (int64_t i = 0; i < n; i++, o += s[0], a += s[1], b += s[2]) {            \
      CT x = (CT)LOADA(*(const TA *)a), y = (CT)LOADB(*(const TB *)b);            \
      *(TO *)o = (TO)STORE(EXPR);                                                 \
    }                                                                             \
  }

#define LOOP2(...) LOOP2_WITH(, __VA_ARGS__)
#define VLOOP2(...) LOOP2_WITH(DKS_VECTOR_CLONES, __VA_ARGS__)

/* A kernel NAME over two operands of storage T, with its loop NAME_loop. */
#define BINARY_WITH(LOOP, NAME, T, CT, LOAD, TO, STORE, EXPR) \
  LOOP(NAME##_loop, T, LOAD, T, LOAD, CT, TO, STORE, EXPR)    \
  static DK_Status NAME(const dks_kernel_args *k) {           \
    dks_elementwise(k, 2, NAME##_loop, NULL);                 \
    return DK_OK;                                             \
  }
#define BINARY(...) BINARY_WITH(LOOP2, __VA_ARGS__)
#define VBINARY(...) BINARY_WITH(VLOOP2, __VA_ARGS__)

/* Integer arithmetic in the unsigned twin, where overflow wraps (C leaves
 * signed overflow undefined). */
#define WRAP(T, U, OP) (T)((U)x OP (U)y)

/* ---- Bit copies by element size: Where, and variadic ops of one input ---- */

#define SIZED_LOOPS(BITS, T)                                                          \
  static void copy##BITS(int64_t n, uint8_t *const *p, const int64_t *s, void *ctx) {  \
    (void)ctx;                                                                        \
    uint8_t *o = p[0];                                                                \
    const uint8_t *a = p[1];                                                          \
    for (int64_t i = 0; i < n; i++, o += s[0], a += s[1]) *(T *)o = *(const T *)a;    \
  }                                                                                   \
  static void where##BITS(int64_t n, uint8_t *const *p, const int64_t *s, void *ctx) { \
    (void)ctx;                                                                        \
    uint8_t *o = p[0];                                                                \
    const uint8_t *c = p[1], *a = p[2], *b = p[3];                                    \
    for (int64_t i = 0; i < n; i++, o += s[0], c += s[1], a += s[2], b += s[3])       \
      *(T *)o = *c ? *(const T *)a : *(const T *)b;                                   \
  }
SIZED_LOOPS(8, uint8_t)
SIZED_LOOPS(16, uint16_t)
SIZED_LOOPS(32, uint32_t)
SIZED_LOOPS(64, uint64_t)

/* By itemsize (the launcher admits 1 to 8 bytes); NULL for sizes no dtype has. */
static const dks_inner_loop copy_loops[9] = {
    [1] = copy8, [2] = copy16, [4] = copy32, [8] = copy64};
static const dks_inner_loop where_loops[9] = {
    [1] = where8, [2] = where16, [4] = where32, [8] = where64};

/* ---- Scalar helpers ------------------------------------------------------ */

/* IEEE 754-2019 maximum/minimum: NaN propagates (as NumPy's maximum), and
 * -0 < +0, so that the result does not depend on the operand order. */
#define EXTREMA(CT, M)                                                 \
  static inline CT ieee_max##M(CT x, CT y) {                           \
    if (isnan(x) || isnan(y)) return x + y;                            \
    if (x == y) return signbit(x) ? y : x;                             \
    return x > y ? x : y;                                              \
  }                                                                    \
  static inline CT ieee_min##M(CT x, CT y) {                           \
    if (isnan(x) || isnan(y)) return x + y;                            \
    if (x == y) return signbit(x) ? x : y;                             \
    return x < y ? x : y;                                              \
  }
EXTREMA(float, f)
EXTREMA(double, )

/* Integer Div truncates toward zero (C, ONNX). Where C is undefined they are
 * defined here: x / 0 = x % 0 = 0; INT_MIN / -1 wraps to INT_MIN and
 * INT_MIN % -1 is 0. imod is the floored remainder (sign of y, Python's %,
 * Mod fmod=0); irem the truncated one (sign of x, C's %, Mod fmod=1). */
#define SIGNED_HELPERS(SFX, T, U)                              \
  static inline T idiv_##SFX(T x, T y) {                       \
    if (y == 0) return 0;                                      \
    if (y == -1) return (T)((U)0 - (U)x);                      \
    return (T)(x / y);                                         \
  }                                                            \
  static inline T irem_##SFX(T x, T y) {                       \
    return y == 0 || y == -1 ? 0 : (T)(x % y);                 \
  }                                                            \
  static inline T imod_##SFX(T x, T y) {                       \
    T r = irem_##SFX(x, y);                                    \
    return r != 0 && (r < 0) != (y < 0) ? (T)(r + y) : r;      \
  }
#define UNSIGNED_HELPERS(SFX, T, U)                                         \
  static inline T idiv_##SFX(T x, T y) { return y == 0 ? 0 : (T)(x / y); }  \
  static inline T irem_##SFX(T x, T y) { return y == 0 ? 0 : (T)(x % y); }  \
  static inline T imod_##SFX(T x, T y) { return irem_##SFX(x, y); }
SIGNED_TYPES(SIGNED_HELPERS)
UNSIGNED_TYPES(UNSIGNED_HELPERS)

/* ---- Arithmetic, Max/Min steps, bitwise ---------------------------------- */

/* Mod of floats is fmod=1 only: the host refuses fmod=0 for them. */
#define FLOAT_ARITH(SFX, T, CT, LOAD, STORE, M)                                   \
  VBINARY(add_##SFX, T, CT, LOAD, T, STORE, x + y)                                 \
  VBINARY(sub_##SFX, T, CT, LOAD, T, STORE, x - y)                                 \
  VBINARY(mul_##SFX, T, CT, LOAD, T, STORE, x * y)                                 \
  VBINARY(div_##SFX, T, CT, LOAD, T, STORE, x / y)                                 \
  BINARY(mod_##SFX, T, CT, LOAD, T, STORE, fmod##M(x, y))                         \
  BINARY(prelu_##SFX, T, CT, LOAD, T, STORE, x > 0 ? x : x * y)                   \
  VLOOP2(max_##SFX##_loop, T, LOAD, T, LOAD, CT, T, STORE, ieee_max##M(x, y))      \
  VLOOP2(min_##SFX##_loop, T, LOAD, T, LOAD, CT, T, STORE, ieee_min##M(x, y))
FLOAT_TYPES(FLOAT_ARITH)

#define INT_ARITH(SFX, T, U)                                                    \
  VBINARY(add_##SFX, T, T, AS_IS, T, AS_IS, WRAP(T, U, +))                       \
  VBINARY(sub_##SFX, T, T, AS_IS, T, AS_IS, WRAP(T, U, -))                       \
  VBINARY(mul_##SFX, T, T, AS_IS, T, AS_IS, WRAP(T, U, *))                       \
  BINARY(div_##SFX, T, T, AS_IS, T, AS_IS, idiv_##SFX(x, y))                    \
  LOOP2(mod_floor_##SFX, T, AS_IS, T, AS_IS, T, T, AS_IS, imod_##SFX(x, y))     \
  LOOP2(mod_trunc_##SFX, T, AS_IS, T, AS_IS, T, T, AS_IS, irem_##SFX(x, y))     \
  static DK_Status mod_##SFX(const dks_kernel_args *k) {                        \
    bool truncated = dks_attr_int(k, "fmod", 0) != 0;                           \
    dks_elementwise(k, 2, truncated ? mod_trunc_##SFX : mod_floor_##SFX, NULL); \
    return DK_OK;                                                               \
  }                                                                             \
  LOOP2(max_##SFX##_loop, T, AS_IS, T, AS_IS, T, T, AS_IS, x > y ? x : y)       \
  LOOP2(min_##SFX##_loop, T, AS_IS, T, AS_IS, T, T, AS_IS, x < y ? x : y)       \
  BINARY(bitwise_and_##SFX, T, T, AS_IS, T, AS_IS, x & y)                       \
  BINARY(bitwise_or_##SFX, T, T, AS_IS, T, AS_IS, x | y)                        \
  BINARY(bitwise_xor_##SFX, T, T, AS_IS, T, AS_IS, x ^ y)
INT_TYPES(INT_ARITH)

/* ONNX PRelu takes int32 and int64 among the integers. */
BINARY(prelu_i32, int32_t, int32_t, AS_IS, int32_t, AS_IS, x > 0 ? x : WRAP(int32_t, uint32_t, *))
BINARY(prelu_i64, int64_t, int64_t, AS_IS, int64_t, AS_IS, x > 0 ? x : WRAP(int64_t, uint64_t, *))

/* ---- Comparisons and logic (bool output, one byte 0/1) ------------------- */

#define COMPARISONS(SFX, T, CT, LOAD)                                    \
  BINARY(equal_##SFX, T, CT, LOAD, uint8_t, AS_IS, x == y)               \
  BINARY(less_##SFX, T, CT, LOAD, uint8_t, AS_IS, x < y)                 \
  BINARY(less_equal_##SFX, T, CT, LOAD, uint8_t, AS_IS, x <= y)          \
  BINARY(greater_##SFX, T, CT, LOAD, uint8_t, AS_IS, x > y)              \
  BINARY(greater_equal_##SFX, T, CT, LOAD, uint8_t, AS_IS, x >= y)
#define FLOAT_COMPARISONS(SFX, T, CT, LOAD, STORE, M) COMPARISONS(SFX, T, CT, LOAD)
#define INT_COMPARISONS(SFX, T, U) COMPARISONS(SFX, T, T, AS_IS)
FLOAT_TYPES(FLOAT_COMPARISONS)
INT_TYPES(INT_COMPARISONS)

/* Bools are read as C bool, so any nonzero byte is true. */
BINARY(equal_b8, uint8_t, bool, AS_IS, uint8_t, AS_IS, x == y)
BINARY(and_b8, uint8_t, bool, AS_IS, uint8_t, AS_IS, x && y)
BINARY(or_b8, uint8_t, bool, AS_IS, uint8_t, AS_IS, x || y)
BINARY(xor_b8, uint8_t, bool, AS_IS, uint8_t, AS_IS, x != y)

/* ---- Variadic ops: Max Min Sum Mean -------------------------------------- */

/* Folds the inputs into the output: out = f(in0, in1), then out = f(out, in_i)
 * for each later input, every step broadcasting into the output's shape.
 * `last` is the final step's loop (Mean divides there); one input is copied. */
static DK_Status fold(const dks_kernel_args *k, dks_inner_loop step, dks_inner_loop last,
                      void *ctx) {
  size_t n = k->num_inputs;
  if (n == 1) {
    dks_inner_loop copy = copy_loops[k->out[0].itemsize];
    if (!copy) return dks_kernel_fail(k, DK_INVALID_ARGUMENT, "unsupported element size %d",
                                      k->out[0].itemsize);
    dks_elementwise(k, 1, copy, NULL);
    return DK_OK;
  }
  dks_elementwise(k, 2, n == 2 ? last : step, ctx);
  /* Later steps read the running result back from the output. */
  dks_tensor operands[2];
  operands[0] = k->out[0];
  dks_kernel_args pair = *k;
  pair.in = operands;
  pair.num_inputs = 2;
  for (size_t i = 2; i < n; i++) {
    operands[1] = k->in[i];
    dks_elementwise(&pair, 2, i + 1 == n ? last : step, ctx);
  }
  return DK_OK;
}

#define EXTREMA_VARIADIC(SFX)                                                              \
  static DK_Status max_##SFX(const dks_kernel_args *k) {                                   \
    return fold(k, max_##SFX##_loop, max_##SFX##_loop, NULL);                              \
  }                                                                                        \
  static DK_Status min_##SFX(const dks_kernel_args *k) {                                   \
    return fold(k, min_##SFX##_loop, min_##SFX##_loop, NULL);                              \
  }
/* Mean's last step adds and divides (ctx: the input count) in float64, so a
 * mean of two inputs is correctly rounded and does not overflow. */
#define FLOAT_VARIADIC(SFX, T, CT, LOAD, STORE, M)                                         \
  EXTREMA_VARIADIC(SFX)                                                                    \
  static DK_Status sum_##SFX(const dks_kernel_args *k) {                                   \
    return fold(k, add_##SFX##_loop, add_##SFX##_loop, NULL);                              \
  }                                                                                        \
  LOOP2(mean_last_##SFX, T, LOAD, T, LOAD, double, T, STORE,                               \
        (x + y) / *(const double *)ctx)                                                    \
  static DK_Status mean_##SFX(const dks_kernel_args *k) {                                  \
    double count = (double)k->num_inputs;                                                  \
    return fold(k, add_##SFX##_loop, mean_last_##SFX, &count);                             \
  }
#define INT_VARIADIC(SFX, T, U) EXTREMA_VARIADIC(SFX)
FLOAT_TYPES(FLOAT_VARIADIC)
INT_TYPES(INT_VARIADIC)

/* ---- Pow ----------------------------------------------------------------- */

/* The exponent may have any numeric dtype (ONNX Pow's T1):
 * X(ESFX, DTYPE, TE, LOADE, base arguments...). */
#define FLOAT_EXPONENTS(X, ...)                                   \
  X(f32, DK_DTYPE_FLOAT32, float, AS_IS, __VA_ARGS__)             \
  X(f64, DK_DTYPE_FLOAT64, double, AS_IS, __VA_ARGS__)            \
  X(f16, DK_DTYPE_FLOAT16, uint16_t, dks_f16_to_f32, __VA_ARGS__) \
  X(bf16, DK_DTYPE_BFLOAT16, uint16_t, dks_bf16_to_f32, __VA_ARGS__)
#define SIGNED_EXPONENTS(X, ...)                          \
  X(i8, DK_DTYPE_INT8, int8_t, AS_IS, __VA_ARGS__)        \
  X(i16, DK_DTYPE_INT16, int16_t, AS_IS, __VA_ARGS__)     \
  X(i32, DK_DTYPE_INT32, int32_t, AS_IS, __VA_ARGS__)     \
  X(i64, DK_DTYPE_INT64, int64_t, AS_IS, __VA_ARGS__)
#define UNSIGNED_EXPONENTS(X, ...)                        \
  X(u8, DK_DTYPE_UINT8, uint8_t, AS_IS, __VA_ARGS__)      \
  X(u16, DK_DTYPE_UINT16, uint16_t, AS_IS, __VA_ARGS__)   \
  X(u32, DK_DTYPE_UINT32, uint32_t, AS_IS, __VA_ARGS__)   \
  X(u64, DK_DTYPE_UINT64, uint64_t, AS_IS, __VA_ARGS__)
#define ALL_EXPONENTS(X, ...)    \
  FLOAT_EXPONENTS(X, __VA_ARGS__)  \
  SIGNED_EXPONENTS(X, __VA_ARGS__) \
  UNSIGNED_EXPONENTS(X, __VA_ARGS__)

/* x**e, e >= 0, by squaring, modulo 2^64: a narrower dtype's wrapped result
 * is this one truncated. */
static inline uint64_t ipow_unsigned(uint64_t x, uint64_t e) {
  uint64_t r = 1;
  for (; e; e >>= 1, x *= x)
    if (e & 1) r *= x;
  return r;
}

/* A negative exponent gives 1 / x**-e truncated toward zero: +-1 for x = +-1,
 * otherwise 0 -- also for x = 0, as an integer x / 0 is 0. */
static inline uint64_t ipow_signed(int64_t x, int64_t e) {
  if (e >= 0) return ipow_unsigned((uint64_t)x, (uint64_t)e);
  if (x == 1) return 1;
  if (x == -1) return e % 2 ? UINT64_MAX : 1;
  return 0;
}

/* An integer base with a floating exponent: the float64 power truncated
 * toward zero and saturated to the range, NaN giving 0 (a plain conversion
 * would be undefined out of range). */
static inline int32_t saturate_i32(double v) {
  return v != v ? 0 : v <= INT32_MIN ? INT32_MIN : v >= INT32_MAX ? INT32_MAX : (int32_t)v;
}
static inline int64_t saturate_i64(double v) {
  /* (double)INT64_MAX is 2^63, so any smaller v converts. */
  return v != v                  ? 0
         : v <= (double)INT64_MIN ? INT64_MIN
         : v >= (double)INT64_MAX ? INT64_MAX
                                  : (int64_t)v;
}

/* A floating base: pow in float64 whatever the exponent, rounded once. */
#define POW_FLOAT_LOOP(ESFX, DT, TE, LOADE, SFX, T, LOAD, STORE) \
  LOOP2(pow_##SFX##_##ESFX, T, LOAD, TE, LOADE, double, T, STORE, pow(x, y))
#define POW_FLOAT_LOOPS(SFX, T, CT, LOAD, STORE, M) \
  ALL_EXPONENTS(POW_FLOAT_LOOP, SFX, T, LOAD, STORE)
FLOAT_TYPES(POW_FLOAT_LOOPS)

#define POW_INT_FLOAT_EXPONENT(ESFX, DT, TE, LOADE, SFX, T) \
  LOOP2(pow_##SFX##_##ESFX, T, AS_IS, TE, LOADE, double, T, saturate_##SFX, pow(x, y))
#define POW_INT_SIGNED_EXPONENT(ESFX, DT, TE, LOADE, SFX, T) \
  LOOP2(pow_##SFX##_##ESFX, T, AS_IS, TE, LOADE, int64_t, T, AS_IS, ipow_signed(x, y))
#define POW_INT_UNSIGNED_EXPONENT(ESFX, DT, TE, LOADE, SFX, T) \
  LOOP2(pow_##SFX##_##ESFX, T, AS_IS, TE, LOADE, uint64_t, T, AS_IS, ipow_unsigned(x, y))
#define POW_INT_LOOPS(SFX, T)                             \
  FLOAT_EXPONENTS(POW_INT_FLOAT_EXPONENT, SFX, T)         \
  SIGNED_EXPONENTS(POW_INT_SIGNED_EXPONENT, SFX, T)       \
  UNSIGNED_EXPONENTS(POW_INT_UNSIGNED_EXPONENT, SFX, T)
POW_INT_LOOPS(i32, int32_t)
POW_INT_LOOPS(i64, int64_t)

/* The kernel of each base dtype picks its loop by the exponent's dtype. */
#define POW_CASE(ESFX, DT, TE, LOADE, SFX) \
  case DT:                                 \
    loop = pow_##SFX##_##ESFX;             \
    break;
#define POW_KERNEL(SFX)                                                                    \
  static DK_Status pow_##SFX(const dks_kernel_args *k) {                                   \
    dks_inner_loop loop;                                                                   \
    switch ((int)k->in[1].dtype) {                                                         \
      ALL_EXPONENTS(POW_CASE, SFX)                                                         \
      default:                                                                             \
        return dks_kernel_fail(k, DK_INVALID_ARGUMENT,                                     \
                               "exponent dtype %#x is not supported",                      \
                               (unsigned)k->in[1].dtype);                                  \
    }                                                                                      \
    dks_elementwise(k, 2, loop, NULL);                                                     \
    return DK_OK;                                                                          \
  }
POW_KERNEL(f32)
POW_KERNEL(f64)
POW_KERNEL(f16)
POW_KERNEL(bf16)
POW_KERNEL(i32)
POW_KERNEL(i64)

/* ---- Where --------------------------------------------------------------- */

/* A bit copy: one kernel for every dtype, by element size. */
static DK_Status where_kernel(const dks_kernel_args *k) {
  dks_inner_loop loop = where_loops[k->out[0].itemsize];
  if (!loop) return dks_kernel_fail(k, DK_INVALID_ARGUMENT, "unsupported element size %d",
                                    k->out[0].itemsize);
  dks_elementwise(k, 3, loop, NULL);
  return DK_OK;
}

/* ---- The table ----------------------------------------------------------- */

#define ENTRY(OP, DT, FN) {OP, DT, FN, DKS_STRIDED},
#define FLOAT_ENTRIES(OP, NAME)                 \
  ENTRY(OP, DK_DTYPE_FLOAT32, NAME##_f32)       \
  ENTRY(OP, DK_DTYPE_FLOAT64, NAME##_f64)       \
  ENTRY(OP, DK_DTYPE_FLOAT16, NAME##_f16)       \
  ENTRY(OP, DK_DTYPE_BFLOAT16, NAME##_bf16)
#define INT_ENTRIES(OP, NAME)                   \
  ENTRY(OP, DK_DTYPE_INT8, NAME##_i8)           \
  ENTRY(OP, DK_DTYPE_UINT8, NAME##_u8)          \
  ENTRY(OP, DK_DTYPE_INT32, NAME##_i32)         \
  ENTRY(OP, DK_DTYPE_INT64, NAME##_i64)
#define NUMERIC_ENTRIES(OP, NAME) FLOAT_ENTRIES(OP, NAME) INT_ENTRIES(OP, NAME)

static const dks_kernel_def k_binary[] = {
    NUMERIC_ENTRIES("Add", add)
    NUMERIC_ENTRIES("Sub", sub)
    NUMERIC_ENTRIES("Mul", mul)
    NUMERIC_ENTRIES("Div", div)
    NUMERIC_ENTRIES("Mod", mod)
    FLOAT_ENTRIES("Pow", pow)
    ENTRY("Pow", DK_DTYPE_INT32, pow_i32)
    ENTRY("Pow", DK_DTYPE_INT64, pow_i64)
    FLOAT_ENTRIES("PRelu", prelu)
    ENTRY("PRelu", DK_DTYPE_INT32, prelu_i32)
    ENTRY("PRelu", DK_DTYPE_INT64, prelu_i64)
    NUMERIC_ENTRIES("Max", max)
    NUMERIC_ENTRIES("Min", min)
    FLOAT_ENTRIES("Sum", sum)
    FLOAT_ENTRIES("Mean", mean)
    NUMERIC_ENTRIES("Equal", equal)
    ENTRY("Equal", DK_DTYPE_BOOL, equal_b8)
    NUMERIC_ENTRIES("Less", less)
    NUMERIC_ENTRIES("LessOrEqual", less_equal)
    NUMERIC_ENTRIES("Greater", greater)
    NUMERIC_ENTRIES("GreaterOrEqual", greater_equal)
    ENTRY("And", DK_DTYPE_BOOL, and_b8)
    ENTRY("Or", DK_DTYPE_BOOL, or_b8)
    ENTRY("Xor", DK_DTYPE_BOOL, xor_b8)
    INT_ENTRIES("BitwiseAnd", bitwise_and)
    INT_ENTRIES("BitwiseOr", bitwise_or)
    INT_ENTRIES("BitwiseXor", bitwise_xor)
    DKS_ALL_DTYPES("Where", where_kernel, DKS_STRIDED),
};
DKS_REGISTER_KERNELS(k_binary)

/* The inputs broadcast to the output's shape; every input has the first one's
 * dtype (Pow's exponent may differ) and the output it too, or bool. */
static DK_Status validate_binary(const dks_kernel_args *k) {
  DK_Status st = dks_check_broadcast(k, k->num_inputs);
  for (size_t i = 1; st == DK_OK && i < k->num_inputs && strcmp(k->op, "Pow") != 0; i++)
    st = dks_check_dtype(k, "input", i, k->in[0].dtype);
  if (st != DK_OK) return st;
  const char *op = k->op;
  bool compares = strcmp(op, "Equal") == 0 || strncmp(op, "Less", 4) == 0 || strncmp(op, "Greater", 7) == 0;
  return dks_check_dtype(k, "output", 0, compares ? DK_DTYPE_BOOL : k->in[0].dtype);
}

/* Mod: as the other binary ops; float inputs take only fmod=1. */
static DK_Status validate_mod(const dks_kernel_args *k) {
  DK_DTypeKey dt = k->in[0].dtype;
  bool real = dt == DK_DTYPE_FLOAT32 || dt == DK_DTYPE_FLOAT64 || dt == DK_DTYPE_FLOAT16 || dt == DK_DTYPE_BFLOAT16;
  if (real && dks_attr_int(k, "fmod", 0) == 0)
    return dks_invalid(k, "fmod=0 (integer modulo) is defined for integers only; float inputs need fmod=1");
  return validate_binary(k);
}

/* Where(condition, X, Y): a bool condition; X, Y and the output of one dtype. */
static DK_Status validate_where(const dks_kernel_args *k) {
  DK_Status st = dks_check_broadcast(k, 3);
  if (st == DK_OK) st = dks_check_dtype(k, "input", 0, DK_DTYPE_BOOL);
  if (st == DK_OK) st = dks_check_dtype(k, "input", 2, k->in[1].dtype);
  if (st == DK_OK) st = dks_check_dtype(k, "output", 0, k->in[1].dtype);
  return st;
}

static const dks_validator v_binary[] = {
    {"Add", validate_binary},      {"Sub", validate_binary},         {"Mul", validate_binary},
    {"Div", validate_binary},      {"Mod", validate_mod}   ,         {"Pow", validate_binary},
    {"PRelu", validate_binary},    {"Max", validate_binary},         {"Min", validate_binary},
    {"Sum", validate_binary},      {"Mean", validate_binary},        {"Equal", validate_binary},
    {"Less", validate_binary},     {"LessOrEqual", validate_binary}, {"Greater", validate_binary},
    {"GreaterOrEqual", validate_binary}, {"And", validate_binary},  {"Or", validate_binary},
    {"Xor", validate_binary},      {"BitwiseAnd", validate_binary},  {"BitwiseOr", validate_binary},
    {"BitwiseXor", validate_binary}, {"Where", validate_where},
};
DKS_REGISTER_VALIDATORS(v_binary)
