/*
 * unary.c -- unary elementwise kernels: math functions, activations,
 * rounding, IsNaN/IsInf, Clip, Not and BitwiseNot (devkit/ops/unary.py).
 *
 * float32 calls the float libm functions and float64 the double ones --
 * except Exp, Log, Tanh, Sigmoid, Erf and Gelu, whose float32 forms are the
 * vectorisable polynomials of vmath.h (at most 1 ulp from the correctly
 * rounded result); float16 and bfloat16 load as float32, compute exactly as
 * float32 does and round once on store. Each formula is written once, generic over the
 * compute type (see MATH). Every kernel runs through dks_elementwise, so all
 * of them take strided tensors.
 */
#include "dks_kernel.h"
#include "vmath.h"

#include <tgmath.h>

/* The attributes (and Clip's host inputs) a loop reads. */
typedef struct unary_params {
  double alpha, beta, gamma;
  double lo, hi;            /* float Clip bounds; -inf/+inf when absent */
  int64_t ilo, ihi;         /* integer Clip bounds, inside the dtype's range */
  bool tanh_approximation;  /* Gelu approximate="tanh" */
  bool detect_negative, detect_positive; /* IsInf */
} unary_params;

/* ---- Formulas ------------------------------------------------------------
 *
 * MATH(name, body) defines name_float(x, p) and name_double(x, p) from one
 * body in which T is the compute type: <tgmath.h> makes exp(x) call expf for
 * a float x, and P(field) reads a parameter as a T. Constants are written
 * (T)c so float formulas stay in float. GENERIC also sets the result type.
 *
 * NaN propagates through every formula (comparisons are arranged so a NaN
 * falls through to the arithmetic), and at infinities each activation
 * evaluates its ONNX formula as written: the x * 0 forms give NaN there
 * (Gelu(-inf), HardSwish(-inf), Mish(-inf), Softsign(+-inf)), as the ONNX
 * reference does.
 */
#define GENERIC(NAME, RF, RD, ...)                                  \
  static inline RF NAME##_float(float x, const unary_params *p) {   \
    typedef float T __attribute__((unused));                        \
    (void)p;                                                        \
    __VA_ARGS__                                                     \
  }                                                                 \
  static inline RD NAME##_double(double x, const unary_params *p) { \
    typedef double T __attribute__((unused));                       \
    (void)p;                                                        \
    __VA_ARGS__                                                     \
  }
#define MATH(NAME, ...) GENERIC(NAME, float, double, __VA_ARGS__)
/* A float formula of its own (FLOAT_BODY: vmath.h), the body for double. */
#define VMATH(NAME, FLOAT_BODY, ...)                                 \
  static inline float NAME##_float(float x, const unary_params *p) { \
    (void)p;                                                         \
    FLOAT_BODY                                                       \
  }                                                                  \
  static inline double NAME##_double(double x, const unary_params *p) { \
    typedef double T __attribute__((unused));                        \
    (void)p;                                                         \
    __VA_ARGS__                                                      \
  }
#define PREDICATE(NAME, ...) GENERIC(NAME, bool, bool, __VA_ARGS__)
#define P(field) ((T)p->field)

#define SQRT1_2 0.70710678118654752440       /* 1 / sqrt(2) */
#define SQRT_2_OVER_PI 0.79788456080286535588 /* sqrt(2 / pi) */

MATH(abs, return fabs(x);)
MATH(neg, return -x;)
VMATH(exp, return vm_expf(x);, return exp(x);)
VMATH(log, return vm_logf(x);, return log(x);)
MATH(sqrt, return sqrt(x);)
MATH(reciprocal, return 1 / x;)
MATH(sin, return sin(x);)
MATH(cos, return cos(x);)
MATH(tan, return tan(x);)
MATH(asin, return asin(x);)
MATH(acos, return acos(x);)
MATH(atan, return atan(x);)
MATH(sinh, return sinh(x);)
MATH(cosh, return cosh(x);)
VMATH(tanh, return vm_tanhf(x);, return tanh(x);)
MATH(asinh, return asinh(x);)
MATH(acosh, return acosh(x);)
MATH(atanh, return atanh(x);)
VMATH(erf, return vm_erff(x);, return erf(x);)
MATH(floor, return floor(x);)
MATH(ceil, return ceil(x);)
/* rint rounds half to even in the default rounding mode (to nearest), which
 * every kernel assumes. */
MATH(round, return rint(x);)
MATH(sign, return x > 0 ? (T)1 : x < 0 ? (T)-1 : x;)
MATH(relu, return x < 0 ? (T)0 : x;)
MATH(leaky_relu, return x < 0 ? P(alpha) * x : x;)
/* exp(-|x|) never overflows, so the tails keep their (tiny) values. */
VMATH(sigmoid, return vm_sigmoidf(x);, T e = exp(-fabs(x)); return (x >= 0 ? (T)1 : e) / (1 + e);)
MATH(hard_sigmoid, T y = P(alpha) * x + P(beta); y = y < 0 ? (T)0 : y; return y > 1 ? (T)1 : y;)
/* x * clamp(x + 3, 0, 6) / 6: x + 3 is exact where the clamp is open and
 * dividing before multiplying cannot overflow. */
MATH(hard_swish, T y = x + 3; y = y < 0 ? (T)0 : y; y = y > 6 ? (T)6 : y; return x * (y / 6);)
MATH(elu, return x < 0 ? P(alpha) * expm1(x) : x;)
MATH(selu, return x > 0 ? P(gamma) * x : P(gamma) * (P(alpha) * expm1(x));)
MATH(celu, return x > 0 ? x : P(alpha) * expm1(x / P(alpha));)
/* 0.5 x (1 + erf(x / sqrt2)) = 0.5 x erfc(-x / sqrt2), and
 * 0.5 x (1 + tanh(u)) = x / (1 + exp(-2u)): neither cancels for x < 0. */
VMATH(gelu_erf, return vm_gelu_erff(x);, return x * ((T)0.5 * erfc(-x * (T)SQRT1_2));)
VMATH(gelu_tanh, return vm_gelu_tanhf(x);,
      T u = (T)SQRT_2_OVER_PI * (x + (T)0.044715 * x * x * x);
      return x / (1 + exp(-2 * u));)
MATH(softplus, return (x > 0 ? x : (T)0) + log1p(exp(-fabs(x)));)
MATH(softsign, return x / (1 + fabs(x));)
MATH(mish, T softplus = (x > 0 ? x : (T)0) + log1p(exp(-fabs(x))); return x * tanh(softplus);)
/* max(x, min) then min(., max), NaN-propagating (x and bounds) as NumPy's
 * clip: a min above max gives max. */
MATH(clip, T y = (x != x || x >= P(lo)) ? x : P(lo); return (y != y || y <= P(hi)) ? y : P(hi);)
PREDICATE(is_nan, return isnan(x);)
PREDICATE(is_inf, return (x == (T)INFINITY && p->detect_positive) ||
                         (x == -(T)INFINITY && p->detect_negative);)

/* Integer formulas, named after the C type. Abs and Neg wrap in two's
 * complement (Abs and Neg of INT_MIN are INT_MIN), computed in the unsigned
 * type U so that no overflow is undefined. */
#define INT_MATH(T, U)                                                     \
  static inline T abs_##T(T x) { return (T)(x < 0 ? (U)0 - (U)x : (U)x); } \
  static inline T neg_##T(T x) { return (T)((U)0 - (U)x); }                \
  static inline T sign_##T(T x) { return (T)((x > 0) - (x < 0)); }         \
  static inline T relu_##T(T x) { return x < 0 ? 0 : x; }                  \
  static inline T bitwise_not_##T(T x) { return (T)~x; }                   \
  static inline T clip_##T(T x, const unary_params *p) {                   \
    T lo = (T)p->ilo, hi = (T)p->ihi, y = x < lo ? lo : x;                 \
    return y > hi ? hi : y;                                                \
  }
INT_MATH(int8_t, uint8_t)
INT_MATH(int32_t, uint32_t)
INT_MATH(int64_t, uint64_t)
/* uint8 needs no sign tests (and -Wtype-limits rejects them). */
static inline uint8_t abs_uint8_t(uint8_t x) { return x; }
static inline uint8_t neg_uint8_t(uint8_t x) { return (uint8_t)-x; }
static inline uint8_t sign_uint8_t(uint8_t x) { return x > 0; }
static inline uint8_t relu_uint8_t(uint8_t x) { return x; }
static inline uint8_t bitwise_not_uint8_t(uint8_t x) { return (uint8_t)~x; }
static inline uint8_t clip_uint8_t(uint8_t x, const unary_params *p) {
  uint8_t lo = (uint8_t)p->ilo, hi = (uint8_t)p->ihi, y = x < lo ? lo : x;
  return y > hi ? hi : y;
}

/* ---- Loops -----------------------------------------------------------------
 *
 * UNARY_LOOP(name, TI, TX, LOAD, TO, STORE, EXPR): out = STORE(EXPR) with
 * TX x = LOAD(in). A compact run gets an indexed loop the compiler can
 * vectorise; other layouts step by byte strides. The parameters are copied
 * to a local so stores to the output cannot alias them. UNARY_LOOP_WITH's
 * ATTR is DKS_VECTOR_CLONES for the float32 loops worth AVX2/AVX-512 (the
 * FLOAT_OPS column VEC): the vmath functions and the memory-speed ones.
 */
#define UNARY_LOOP_WITH(ATTR, NAME, TI, TX, LOAD, TO, STORE, EXPR)              \
  ATTR static void NAME##_compact(int64_t n, TO *o, const TI *in,                 \
                                  const unary_params params) {                    \
    const unary_params *p = &params;                                              \
    (void)p;                                                                      \
    for (int64_t i = 0; i < n; i++) {                                             \
      TX x = LOAD(in[i]);                                                         \
      o[i] = STORE(EXPR);                                                         \
    }                                                                             \
  }                                                                               \
  static void NAME(int64_t n, uint8_t *const *ptr, const int64_t *s, void *ctx) { \
    const unary_params params = *(const unary_params *)ctx;                       \
    const unary_params *p = &params;                                              \
    (void)p;                                                                      \
    if (s[0] == (int64_t)sizeof(TO) && s[1] == (int64_t)sizeof(TI)) {             \
      NAME##_compact(n, (TO *)ptr[0], (const TI *)ptr[1], params);                \
    } else {                                                                      \
      uint8_t *o = ptr[0];                                                        \
      const uint8_t *in = ptr[1];                                                 \
      for (int64_t i = 0; i < n; i++, o += s[0], in += s[1]) {                    \
        TX x = LOAD(*(const TI *)in);                                             \
        *(TO *)o = STORE(EXPR);                                                   \
      }                                                                           \
    }                                                                             \
  }
#define UNARY_LOOP(...) UNARY_LOOP_WITH(, __VA_ARGS__)

#define AS_IS(v) (v)
#define AS_BOOL(v) ((uint8_t)(v))

#define KERNEL(NAME, LOOP, PARAMS, GRAIN)                   \
  static DK_Status NAME(const dks_kernel_args *k) {        \
    unary_params params = PARAMS(k);                       \
    dks_elementwise_grain(k, 1, LOOP, &params, GRAIN);     \
    return DK_OK;                                          \
  }

/* ---- Parameters ------------------------------------------------------------
 *
 * The host has applied the ONNX defaults; the fallbacks repeat them.
 */

static unary_params no_params(const dks_kernel_args *k) {
  (void)k;
  return (unary_params){0};
}

static unary_params hard_sigmoid_params(const dks_kernel_args *k) {
  return (unary_params){.alpha = dks_attr_float(k, "alpha", 0.2f),
                        .beta = dks_attr_float(k, "beta", 0.5)};
}

static unary_params leaky_relu_params(const dks_kernel_args *k) {
  return (unary_params){.alpha = dks_attr_float(k, "alpha", 0.01f)};
}

static unary_params alpha_one_params(const dks_kernel_args *k) { /* Elu, Celu */
  return (unary_params){.alpha = dks_attr_float(k, "alpha", 1.0)};
}

static unary_params selu_params(const dks_kernel_args *k) {
  return (unary_params){.alpha = dks_attr_float(k, "alpha", 1.67326319217681884765625),
                        .gamma = dks_attr_float(k, "gamma", 1.05070102214813232421875)};
}

static unary_params gelu_params(const dks_kernel_args *k) {
  return (unary_params){
      .tanh_approximation = strcmp(dks_attr_string(k, "approximate", "none"), "tanh") == 0};
}

static unary_params is_inf_params(const dks_kernel_args *k) {
  return (unary_params){.detect_negative = dks_attr_int(k, "detect_negative", 1) != 0,
                        .detect_positive = dks_attr_int(k, "detect_positive", 1) != 0};
}

/* Clip's min and max (host inputs) arrive as one-element "floats" or "ints"
 * attributes: a float input's bounds as either, an integer input's as ints
 * (validate_clip checks that). An omitted bound does not bind. */
static unary_params clip_params(const dks_kernel_args *k) {
  unary_params prm = {.lo = -INFINITY, .hi = INFINITY};
  int64_t type_min, type_max;
  switch ((int)k->in[0].dtype) {
    case DK_DTYPE_INT8: type_min = INT8_MIN, type_max = INT8_MAX; break;
    case DK_DTYPE_UINT8: type_min = 0, type_max = UINT8_MAX; break;
    case DK_DTYPE_INT32: type_min = INT32_MIN, type_max = INT32_MAX; break;
    default: type_min = INT64_MIN, type_max = INT64_MAX; break;
  }
  prm.ilo = type_min;
  prm.ihi = type_max;
  static const char *const names[2] = {"min", "max"};
  for (int i = 0; i < 2; i++) {
    const DK_Attribute *a = dks_attr(k, names[i]);
    if (!a || !a->count) continue;
    double *bound = i ? &prm.hi : &prm.lo;
    int64_t *ibound = i ? &prm.ihi : &prm.ilo;
    if (a->type == DK_ATTR_FLOATS) {
      *bound = a->floats[0];
    } else if (a->type == DK_ATTR_INTS) {
      *bound = (double)a->ints[0];
      /* Clamped into the dtype: a bound outside it never binds. */
      *ibound = a->ints[0] < type_min ? type_min : a->ints[0] > type_max ? type_max : a->ints[0];
    }
  }
  return prm;
}

/* ---- Kernels --------------------------------------------------------------
 *
 * X-macro lists: (ONNX name, formula, parameters[, VEC: the float32 loop's
 * attribute, GRAIN: dks_elementwise_grain's]). Each list item expands into
 * its loops, its kernels and its kernel-table entries.
 */

/* The transcendental formulas split over the pool from 8192 elements, not
 * DKS_ELEMENTWISE_GRAIN's 32768 (a copy's): an element of Sigmoid costs
 * about 20 times an Add's, and llama_decoder's 64 x 344 Sigmoid (22016
 * elements, 8 us) ran on one thread. */
#define UNARY_GRAIN_MATH 4096
#define FLOAT_OPS(X)                                                         \
  X(Abs, abs, no_params, DKS_VECTOR_CLONES, DKS_ELEMENTWISE_GRAIN)           \
  X(Neg, neg, no_params, DKS_VECTOR_CLONES, DKS_ELEMENTWISE_GRAIN)           \
  X(Exp, exp, no_params, DKS_VECTOR_CLONES, UNARY_GRAIN_MATH)                \
  X(Log, log, no_params, DKS_VECTOR_CLONES, UNARY_GRAIN_MATH)                \
  X(Sqrt, sqrt, no_params, , DKS_ELEMENTWISE_GRAIN)                          \
  X(Reciprocal, reciprocal, no_params, , DKS_ELEMENTWISE_GRAIN)              \
  X(Sin, sin, no_params, , UNARY_GRAIN_MATH)                                 \
  X(Cos, cos, no_params, , UNARY_GRAIN_MATH)                                 \
  X(Tan, tan, no_params, , UNARY_GRAIN_MATH)                                 \
  X(Asin, asin, no_params, , UNARY_GRAIN_MATH)                               \
  X(Acos, acos, no_params, , UNARY_GRAIN_MATH)                               \
  X(Atan, atan, no_params, , UNARY_GRAIN_MATH)                               \
  X(Sinh, sinh, no_params, , UNARY_GRAIN_MATH)                               \
  X(Cosh, cosh, no_params, , UNARY_GRAIN_MATH)                               \
  X(Tanh, tanh, no_params, DKS_VECTOR_CLONES, UNARY_GRAIN_MATH)              \
  X(Asinh, asinh, no_params, , UNARY_GRAIN_MATH)                             \
  X(Acosh, acosh, no_params, , UNARY_GRAIN_MATH)                             \
  X(Atanh, atanh, no_params, , UNARY_GRAIN_MATH)                             \
  X(Sigmoid, sigmoid, no_params, DKS_VECTOR_CLONES, UNARY_GRAIN_MATH)        \
  X(HardSigmoid, hard_sigmoid, hard_sigmoid_params, , DKS_ELEMENTWISE_GRAIN) \
  X(HardSwish, hard_swish, no_params, , DKS_ELEMENTWISE_GRAIN)               \
  X(Relu, relu, no_params, DKS_VECTOR_CLONES, DKS_ELEMENTWISE_GRAIN)         \
  X(LeakyRelu, leaky_relu, leaky_relu_params, , DKS_ELEMENTWISE_GRAIN)       \
  X(Elu, elu, alpha_one_params, , UNARY_GRAIN_MATH)                          \
  X(Selu, selu, selu_params, , UNARY_GRAIN_MATH)                             \
  X(Celu, celu, alpha_one_params, , UNARY_GRAIN_MATH)                        \
  X(Erf, erf, no_params, DKS_VECTOR_CLONES, UNARY_GRAIN_MATH)                \
  X(Softplus, softplus, no_params, , UNARY_GRAIN_MATH)                       \
  X(Softsign, softsign, no_params, , DKS_ELEMENTWISE_GRAIN)                  \
  X(Mish, mish, no_params, , UNARY_GRAIN_MATH)                               \
  X(Floor, floor, no_params, , DKS_ELEMENTWISE_GRAIN)                        \
  X(Ceil, ceil, no_params, , DKS_ELEMENTWISE_GRAIN)                          \
  X(Round, round, no_params, , DKS_ELEMENTWISE_GRAIN)                        \
  X(Sign, sign, no_params, , DKS_ELEMENTWISE_GRAIN)                          \
  X(Clip, clip, clip_params, , DKS_ELEMENTWISE_GRAIN)

/* Ops with integer kernels (int8, uint8, int32, int64). */
#define INT_OPS(X)           \
  X(Abs, abs, no_params)     \
  X(Neg, neg, no_params)     \
  X(Sign, sign, no_params)   \
  X(Relu, relu, no_params)   \
  X(Clip, clip, clip_params) \
  X(BitwiseNot, bitwise_not, no_params)

#define F16_LOAD dks_f16_to_f32
#define BF16_LOAD dks_bf16_to_f32

#define FLOAT_KERNELS(OP, FN, PARAMS, VEC, GRAIN)                                         \
  UNARY_LOOP_WITH(VEC, FN##_f32_loop, float, float, AS_IS, float, AS_IS, FN##_float(x, p)) \
  UNARY_LOOP(FN##_f64_loop, double, double, AS_IS, double, AS_IS, FN##_double(x, p)) \
  UNARY_LOOP(FN##_f16_loop, uint16_t, float, F16_LOAD, uint16_t, dks_f32_to_f16,     \
             FN##_float(x, p))                                                       \
  UNARY_LOOP(FN##_bf16_loop, uint16_t, float, BF16_LOAD, uint16_t, dks_f32_to_bf16,  \
             FN##_float(x, p))                                                       \
  KERNEL(FN##_f32, FN##_f32_loop, PARAMS, GRAIN)                                     \
  KERNEL(FN##_f64, FN##_f64_loop, PARAMS, GRAIN)                                     \
  KERNEL(FN##_f16, FN##_f16_loop, PARAMS, GRAIN)                                     \
  KERNEL(FN##_bf16, FN##_bf16_loop, PARAMS, GRAIN)
FLOAT_OPS(FLOAT_KERNELS)

/* Gelu: a loop per form, each vectorising (a test of `approximate` per
 * element keeps the loop scalar), picked by the kernel. */
#define GELU_FORMS(X)                                                          \
  X(GeluErf, gelu_erf, no_params, DKS_VECTOR_CLONES, UNARY_GRAIN_MATH)         \
  X(GeluTanh, gelu_tanh, no_params, DKS_VECTOR_CLONES, UNARY_GRAIN_MATH)
GELU_FORMS(FLOAT_KERNELS)
#define GELU_KERNEL(SFX)                                                                \
  static DK_Status gelu_##SFX(const dks_kernel_args *k) {                               \
    return gelu_params(k).tanh_approximation ? gelu_tanh_##SFX(k) : gelu_erf_##SFX(k); \
  }
GELU_KERNEL(f32)
GELU_KERNEL(f64)
GELU_KERNEL(f16)
GELU_KERNEL(bf16)

/* The integer formulas take p only where they read parameters. */
#define INT_ARGS_no_params(x) (x)
#define INT_ARGS_clip_params(x) (x, p)
#define INT_KERNEL(FN, SUF, T, PARAMS)                                                \
  UNARY_LOOP(FN##_##SUF##_loop, T, T, AS_IS, T, AS_IS, FN##_##T INT_ARGS_##PARAMS(x)) \
  KERNEL(FN##_##SUF, FN##_##SUF##_loop, PARAMS, DKS_ELEMENTWISE_GRAIN)
#define INT_KERNELS(OP, FN, PARAMS)    \
  INT_KERNEL(FN, i8, int8_t, PARAMS)   \
  INT_KERNEL(FN, u8, uint8_t, PARAMS)  \
  INT_KERNEL(FN, i32, int32_t, PARAMS) \
  INT_KERNEL(FN, i64, int64_t, PARAMS)
INT_OPS(INT_KERNELS)

#define PREDICATE_KERNELS(OP, FN, PARAMS, ...)                                                  \
  UNARY_LOOP(FN##_f32_loop, float, float, AS_IS, uint8_t, AS_BOOL, FN##_float(x, p))         \
  UNARY_LOOP(FN##_f64_loop, double, double, AS_IS, uint8_t, AS_BOOL, FN##_double(x, p))      \
  UNARY_LOOP(FN##_f16_loop, uint16_t, float, F16_LOAD, uint8_t, AS_BOOL, FN##_float(x, p))   \
  UNARY_LOOP(FN##_bf16_loop, uint16_t, float, BF16_LOAD, uint8_t, AS_BOOL, FN##_float(x, p)) \
  KERNEL(FN##_f32, FN##_f32_loop, PARAMS, DKS_ELEMENTWISE_GRAIN)                             \
  KERNEL(FN##_f64, FN##_f64_loop, PARAMS, DKS_ELEMENTWISE_GRAIN)                             \
  KERNEL(FN##_f16, FN##_f16_loop, PARAMS, DKS_ELEMENTWISE_GRAIN)                             \
  KERNEL(FN##_bf16, FN##_bf16_loop, PARAMS, DKS_ELEMENTWISE_GRAIN)
#define PREDICATE_OPS(X)         \
  X(IsNaN, is_nan, no_params, )  \
  X(IsInf, is_inf, is_inf_params, )
PREDICATE_OPS(PREDICATE_KERNELS)

/* Not on bool, stored as 0 or 1. */
UNARY_LOOP(not_loop, uint8_t, uint8_t, AS_IS, uint8_t, AS_IS, (uint8_t)!x)
KERNEL(not_bool, not_loop, no_params, DKS_ELEMENTWISE_GRAIN)

/* ---- Table ------------------------------------------------------------------ */

#define FLOAT_ENTRIES(OP, FN, PARAMS, ...)        \
  {#OP, DK_DTYPE_FLOAT32, FN##_f32, DKS_STRIDED}, \
  {#OP, DK_DTYPE_FLOAT64, FN##_f64, DKS_STRIDED}, \
  {#OP, DK_DTYPE_FLOAT16, FN##_f16, DKS_STRIDED}, \
  {#OP, DK_DTYPE_BFLOAT16, FN##_bf16, DKS_STRIDED},
#define INT_ENTRIES(OP, FN, PARAMS)             \
  {#OP, DK_DTYPE_INT8, FN##_i8, DKS_STRIDED},   \
  {#OP, DK_DTYPE_UINT8, FN##_u8, DKS_STRIDED},  \
  {#OP, DK_DTYPE_INT32, FN##_i32, DKS_STRIDED}, \
  {#OP, DK_DTYPE_INT64, FN##_i64, DKS_STRIDED},

static const dks_kernel_def k_unary[] = {
    FLOAT_OPS(FLOAT_ENTRIES)
    FLOAT_ENTRIES(Gelu, gelu, gelu_params)
    INT_OPS(INT_ENTRIES)
    PREDICATE_OPS(FLOAT_ENTRIES)
    {"Not", DK_DTYPE_BOOL, not_bool, DKS_STRIDED},
};
DKS_REGISTER_KERNELS(k_unary)

/* Y has X's shape, and X's dtype (bool for the predicates). */
static DK_Status validate_unary(const dks_kernel_args *k) {
  DK_Status st = dks_check_output_like(k, 0, 0);
  return st != DK_OK ? st : dks_check_dtype(k, "output", 0, k->in[0].dtype);
}

static DK_Status validate_predicate(const dks_kernel_args *k) {
  DK_Status st = dks_check_output_like(k, 0, 0);
  return st != DK_OK ? st : dks_check_dtype(k, "output", 0, DK_DTYPE_BOOL);
}

/* Celu: as the other unary ops; alpha divides x, so it must not be 0. */
static DK_Status validate_celu(const dks_kernel_args *k) {
  if (dks_attr_float(k, "alpha", 1.0) == 0.0) return dks_invalid(k, "attribute 'alpha' must not be 0");
  return validate_unary(k);
}

/* Clip: as the other unary ops; min and max (host inputs), when sent, one
 * value each -- an integer input's an integer its dtype holds (it survives
 * a store and load unchanged). */
static DK_Status validate_clip(const dks_kernel_args *k) {
  static const char *const names[2] = {"min", "max"};
  DK_DTypeKey dtype = k->in[0].dtype;
  bool integer = (dtype & 0xff) == DK_DTYPE_CODE_INT || (dtype & 0xff) == DK_DTYPE_CODE_UINT;
  for (int i = 0; i < 2; i++) {
    const DK_Attribute *a = dks_attr(k, names[i]);
    uint8_t element[8];
    if (!a) continue;
    if (a->count != 1 || (integer && a->type != DK_ATTR_INTS))
      return dks_invalid(k, "attribute '%s' must be one %s value", names[i], integer ? "integer" : "numeric");
    if (integer) dks_store_from_int64(element, dtype, a->ints[0]);
    if (integer && dks_load_as_int64(element, dtype) != a->ints[0])
      return dks_invalid(k, "attribute '%s' is %lld, outside the input's dtype", names[i], (long long)a->ints[0]);
  }
  return validate_unary(k);
}

#define UNARY_VALIDATOR(OP, ...) {#OP, validate_unary},
#define PREDICATE_VALIDATOR(OP, ...) {#OP, validate_predicate},
static const dks_validator v_unary[] = {
    FLOAT_OPS(UNARY_VALIDATOR)
    INT_OPS(UNARY_VALIDATOR)
    PREDICATE_OPS(PREDICATE_VALIDATOR)
    {"Not", validate_unary},
    {"Gelu", validate_unary}, /* the kernels GeluErf and GeluTanh of FLOAT_OPS serve */
    {"Celu", validate_celu},  /* after FLOAT_OPS' entry: the last registration wins */
    {"Clip", validate_clip},  /* likewise */
};
DKS_REGISTER_VALIDATORS(v_unary)
