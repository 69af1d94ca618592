/*
 * vmath.h -- float32 exp, log, tanh, erf, erfc, sigmoid and Gelu for loops
 * the compiler vectorises: no libm calls, no table lookups, no branches
 * (special values are blended in), only float/double arithmetic and bit
 * operations GCC turns into SIMD.
 *
 * vm_expf, vm_tanhf and vm_sigmoidf compute in float32 (8 lanes per AVX2
 * vector): range reduction and a polynomial, at most 1, 1 and 2 ulp from
 * the float64 result rounded to float32 over every float32 input
 * (scripts/vmath_exhaustive.c). The others take float32 and compute in
 * float64 -- range reduction and a polynomial whose truncation error is
 * below 2^-31 relative -- then round once to float32: measured over every
 * 7th float32 bit pattern, at most 1 ulp. tests/test_cpu_vmath.py repeats
 * the sweep on a sample against the bounds docs/operators.md states
 * (devkit/backends/cpu/__init__.py), inside every op's tolerance.
 *
 * vm_exp_nonpositive is the double-precision exp of the Softmax rows.
 *
 * Products are never fused (ISO C mode: -ffp-contract=off), so every
 * CPU_VECTOR_CLONES clone -- AVX-512, AVX2, baseline -- and every thread
 * count gives the same bits.
 */
#ifndef DEVKIT_BACKENDS_CPU_KERNELS_VMATH_H_
#define DEVKIT_BACKENDS_CPU_KERNELS_VMATH_H_

#include <math.h>
#include <stdint.h>
#include <string.h>

static inline uint64_t vm_bits(double d) {
  uint64_t u;
  memcpy(&u, &d, sizeof u);
  return u;
}

static inline double vm_from_bits(uint64_t u) {
  double d;
  memcpy(&d, &u, sizeof d);
  return d;
}

static inline double vm_clamp(double x, double lo, double hi) { /* NaN stays NaN */
  x = x < lo ? lo : x;
  return x > hi ? hi : x;
}

/* 1 / i!, the Taylor coefficients of e^r. */
static const double vm_inv_factorial[14] = {
    1.0,           1.0,           1.0 / 2,        1.0 / 6,         1.0 / 24,
    1.0 / 120,     1.0 / 720,     1.0 / 5040,     1.0 / 40320,     1.0 / 362880,
    1.0 / 3628800, 1.0 / 39916800, 1.0 / 479001600, 1.0 / 6227020800.0};

/* e^x for x in [-746, 709] (NaN gives NaN): x = k ln2 + r, |r| <= ln2 / 2,
 * with k ln2 in two parts (k * LN2_HI is exact, so r is exact to ~1e-19);
 * e^r by its Taylor polynomial to r^degree / degree! -- degree 9 (truncation
 * below 2^-35) where the result rounds to float32, 13 (below 1e-17: a few
 * double ulps) where it stays float64; 2^k as two factors 2^h 2^(k - h),
 * both normal, so results down to the subnormals are formed without
 * overflowing the exponent (and where both are normal the product is the
 * one scaling by 2^k). `degree` is a constant at every call: inlined, the
 * loop unrolls into the Horner chain. */
static inline __attribute__((always_inline)) double vm_exp_taylor(double x, int degree) {
  const double shifter = 0x1.8p52; /* adding it rounds to an integer in the low bits */
  double t = x * 0x1.71547652b82fep0 + shifter;
  double k = t - shifter;
  double r = (x - k * 0x1.62e42fee00000p-1) - k * 0x1.a39ef35793c76p-33;
  double p = vm_inv_factorial[degree];
  for (int i = degree - 1; i >= 0; i--) p = p * r + vm_inv_factorial[i];
  /* k in [-1077, 1023] as an integer, from t's low bits; h = floor((k +
   * 2048) / 2) - 1024 keeps both exponents in range. */
  int64_t ki = (int64_t)(vm_bits(t) - vm_bits(shifter));
  int64_t h = (int64_t)((uint64_t)(ki + 2048) >> 1) - 1024;
  double s1 = vm_from_bits((uint64_t)(h + 1023) << 52), s2 = vm_from_bits((uint64_t)(ki - h + 1023) << 52);
  return p * s1 * s2;
}

/* e^x for |x| <= 200, good for one rounding to float32. */
static inline double vm_exp_core(double x) { return vm_exp_taylor(x, 9); }

/* e^x in double precision (a few ulps) for x <= 0 and NaN. x below `floor`
 * (>= -746) is taken as `floor`: a caller whose results round to zero below
 * some point passes it, keeping subnormal arithmetic out of its loops. */
static inline __attribute__((always_inline)) double vm_exp_nonpositive(double x, double floor) {
  return vm_exp_taylor(x < floor ? floor : x, 13); /* NaN stays NaN */
}

static inline uint32_t vm_bits32(float f) {
  uint32_t u;
  memcpy(&u, &f, sizeof u);
  return u;
}

static inline float vm_from_bits32(uint32_t u) {
  float f;
  memcpy(&f, &u, sizeof f);
  return f;
}

/* e^x in float32 arithmetic (8 lanes per AVX2 vector, 16 per AVX-512):
 * x clamped to [-104, 89] (NaN stays NaN; e^-104 rounds to 0 and e^89 to
 * inf), x = k ln2 + r with |r| <= ln2 / 2 and ln2 in two parts (the first
 * has 13 bits, so k times it is exact for |k| <= 150, and x minus that is
 * exact by Sterbenz); e^r = 1 + (r + r^2 P(r)), P the Taylor terms to
 * r^7 / 7! (truncation below 2^-30), the 1 added last so its rounding is the
 * only one at full weight; 2^k as two normal factors 2^h 2^(k - h), so
 * results down to the subnormals round once and inf comes from the product. */
static inline float vm_expf(float x) {
  const float shifter = 0x1.8p23f; /* adding it rounds to an integer in the low bits */
  float xc = x < -104.0f ? -104.0f : x;
  xc = xc > 89.0f ? 89.0f : xc;
  float t = xc * 0x1.715476p0f + shifter;
  float k = t - shifter;
  float r = (xc - k * 0x1.62ep-1f) - k * 0x1.0bfbe8p-15f;
  float p = 1.0f / 5040;
  p = p * r + 1.0f / 720;
  p = p * r + 1.0f / 120;
  p = p * r + 1.0f / 24;
  p = p * r + 1.0f / 6;
  p = p * r + 0.5f;
  float er = 1.0f + (r + (r * r) * p);
  int32_t ki = (int32_t)(vm_bits32(t) - vm_bits32(shifter)); /* k in [-150, 128] */
  int32_t h = ki >> 1;
  float s1 = vm_from_bits32((uint32_t)(h + 127) << 23), s2 = vm_from_bits32((uint32_t)(ki - h + 127) << 23);
  return er * s1 * s2;
}

/* ln x: x = 2^k m with m in [sqrt(1/2), sqrt(2)) (subnormals scaled up
 * first), ln m = 2 atanh(f / (2 + f)), f = m - 1 (exact), by its series to
 * s^13 / 13 (|s| <= 0.172: truncation below 2^-39). */
static inline float vm_logf(float x) {
  uint32_t ix;
  float xs = x < 0x1p-126f ? x * 0x1p23f : x; /* subnormal or 0: exact */
  memcpy(&ix, &xs, sizeof ix);
  int32_t k = x < 0x1p-126f ? -23 : 0;
  ix += 0x3f800000u - 0x3f3504f3u;
  k += (int32_t)(ix >> 23) - 0x7f;
  ix = (ix & 0x007fffffu) + 0x3f3504f3u;
  float m;
  memcpy(&m, &ix, sizeof m);
  double f = (double)m - 1.0, s = f / (2.0 + f), z = s * s;
  double p = 1.0 / 13;
  p = p * z + 1.0 / 11;
  p = p * z + 1.0 / 9;
  p = p * z + 1.0 / 7;
  p = p * z + 1.0 / 5;
  p = p * z + 1.0 / 3;
  p = p * z + 1.0;
  float y = (float)((double)k * 0x1.62e42fefa39efp-1 + 2.0 * s * p);
  y = x == 0 ? -INFINITY : y;
  y = x < 0 ? NAN : y;
  return x == INFINITY || x != x ? x : y;
}

/* tanh x in float32: x + x^3 P(x^2) below |x| = 1 (P a least-squares fit
 * over x^2 in [0, 1], relative error below 2^-27), where 1 - 2 / (e^2|x| + 1)
 * would cancel; that form above (2 / (e^2|x| + 1) < 0.24 there, so its
 * error weighs at most a third of an ulp of the result; |x| clamped to 10,
 * where tanh rounds to 1). */
static inline float vm_tanhf(float x) {
  float a = fabsf(x), z = x * x;
  float p = -0.00035522019875458555f;
  p = p * z + 0.002289963020574326f;
  p = p * z - 0.007930298395173153f;
  p = p * z + 0.021475796312188766f;
  p = p * z - 0.05387598690461318f;
  p = p * z + 0.13332281753433664f;
  p = p * z - 0.3333329185869473f;
  float small = copysignf(a + a * (z * p), x); /* -0 stays -0 */
  float e = vm_expf(2.0f * (a > 10.0f ? 10.0f : a));
  float large = copysignf(1.0f - 2.0f / (e + 1.0f), x);
  return a < 1.0f ? small : large;
}

/* 1 / (1 + e^-x) through e^-|x|, so neither tail overflows (e^-|x| is 0
 * below x = -104, where the sigmoid rounds to 0). */
static inline float vm_sigmoidf(float x) {
  float e = vm_expf(-fabsf(x));
  return (x >= 0 ? 1.0f : e) / (1.0f + e);
}

/* erf x for |x| < 3/4 by its Taylor series (to x^21: truncation below
 * 2^-38). */
static inline double vm_erf_small(double x) {
  static const double c[11] = {
      1.1283791670955126, -0.37612638903183754, 0.11283791670955126, -0.026866170645131252,
      0.005223977625442188, -0.0008548327023450852, 0.00012055332981789664, -1.492565035840625e-05,
      1.6462114365889246e-06, -1.6365844691234924e-07, 1.4807192815879218e-08};
  double z = x * x, p = c[10];
  for (int i = 9; i >= 0; i--) p = p * z + c[i];
  return x * p;
}

/* erfc u for u >= 3/4: e^-u^2 erfcx(u), erfcx(u) a degree-15 polynomial in
 * y = 2 (t - t0) / (t1 - t0) - 1, t = 1 / (1 + u) (a Chebyshev fit over
 * u in [3/4, 10.5]: relative error 3e-12); 0 beyond 10.5, where erfc is
 * below float32's smallest subnormal (and +inf gives exactly 0). */
static inline double vm_erfc_large(double u) {
  static const double c[16] = {
      0.25142432813480803, 0.23181655263646295, 0.029773068336771128, -0.005547089316790042,
      -0.0009697037032600128, 0.000491003495045532, -2.520459418813346e-05, -3.768866528749428e-05,
      1.380151395280972e-05, -4.955297832868492e-07, -1.4801993579230884e-06, 6.64441213669236e-07,
      -6.23005252031238e-08, -7.057942149302783e-08, 2.783177562146138e-08, -1.2081814925145704e-09};
  double t = 1.0 / (1.0 + vm_clamp(u, 0.75, 10.5));
  double y = t * 4.128205128205129 - 1.358974358974359, p = c[15];
  for (int i = 14; i >= 0; i--) p = p * y + c[i];
  double r = vm_exp_core(-vm_clamp(u * u, 0.0, 200.0)) * p;
  return u > 10.5 ? 0.0 : r;
}

static inline float vm_erff(float xf) {
  double x = xf, a = fabs(x);
  double large = copysign(1.0 - vm_erfc_large(a), x);
  return (float)(a < 0.75 ? vm_erf_small(x) : large);
}

/* erfc z over the whole line, accurate in relative terms for z > 0 too. */
static inline double vm_erfc(double z) {
  double a = fabs(z), small = 1.0 - vm_erf_small(z), large = vm_erfc_large(a);
  return a < 0.75 ? small : z > 0 ? large : 2.0 - large;
}

/* Gelu, erf form: x erfc(-x / sqrt 2) / 2 (no cancellation for x < 0; NaN
 * at -inf, the formula's -inf * 0). */
static inline float vm_gelu_erff(float xf) {
  double x = xf;
  return (float)(x * (0.5 * vm_erfc(-x * 0.70710678118654752440)));
}

/* Gelu, tanh form: x / (1 + e^-2u), u = sqrt(2/pi) (x + 0.044715 x^3);
 * e^-2u is +inf past the clamp, so -inf gives -inf / inf = NaN as the
 * formula does. */
static inline float vm_gelu_tanhf(float xf) {
  double x = xf, u = 0.79788456080286535588 * (x + 0.044715 * x * x * x);
  double e = vm_exp_core(vm_clamp(-2.0 * u, -200.0, 200.0));
  e = -2.0 * u > 200.0 ? INFINITY : e;
  return (float)(x / (1.0 + e));
}

#endif /* DEVKIT_BACKENDS_CPU_KERNELS_VMATH_H_ */
