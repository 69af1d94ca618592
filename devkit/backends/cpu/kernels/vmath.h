/*
 * vmath.h -- float32 exp, log, tanh, erf, erfc, sigmoid and Gelu for loops
 * the compiler vectorises: no libm calls, no table lookups, no branches
 * (special values are blended in), only float/double arithmetic and bit
 * operations GCC turns into SIMD.
 *
 * vm_expf, vm_tanhf, vm_sigmoidf, vm_erff and vm_gelu_erff compute in
 * float32 (8 lanes per AVX2 vector): range reduction and polynomials, at
 * most 1, 1, 2, 1 and 1 ulp (Gelu: past its atol, 2^-24) from the float64
 * result rounded to float32 over every float32 input
 * (scripts/vmath_exhaustive.c). vm_logf and vm_gelu_tanhf take float32 and
 * compute in float64 -- range reduction and a polynomial whose truncation
 * error is below 2^-31 relative -- then round once to float32: measured over
 * every 7th float32 bit pattern, at most 1 ulp. tests/test_cpu_vmath.py
 * repeats the sweep on a sample against the bounds docs/operators.md states
 * (devkit/backends/cpu/__init__.py), inside every op's tolerance.
 *
 * vm_exp_nonpositive and vm_exp_nonpositive_narrow are the double-precision
 * exps of the Softmax rows (float64 outputs; float32 and narrower), and
 * vm_max_f32 their rows' maximum.
 *
 * Products are never fused (ISO C mode: -ffp-contract=off), so every
 * DKS_VECTOR_CLONES clone -- AVX-512, AVX2, baseline -- and every thread
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
   * 2048) / 2) - 1024 keeps both exponents in range. Unsigned (two's
   * complement, wrapping): a NaN's bits give any k, and signed arithmetic
   * on it could overflow; p is NaN then, whatever the scales. */
  uint64_t ki = vm_bits(t) - vm_bits(shifter);
  uint64_t h = ((ki + 2048) >> 1) - 1024;
  double s1 = vm_from_bits((h + 1023) << 52), s2 = vm_from_bits((ki - h + 1023) << 52);
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

/* e^x, good for one rounding to float32 (or a narrower type), for x <= 0
 * and NaN: x below -110 (where e^x is below 2^-158, under half of float32's
 * smallest subnormal) is taken as -110, so 2^k is one normal factor; e^r by
 * its Taylor polynomial to r^8 / 8! (truncation below 2^-32 relative). The
 * Softmax rows' exponential: about half the operations of
 * vm_exp_nonpositive. */
static inline __attribute__((always_inline)) double vm_exp_nonpositive_narrow(double x) {
  const double shifter = 0x1.8p52;
  double xc = x < -110.0 ? -110.0 : x; /* NaN stays NaN */
  double t = xc * 0x1.71547652b82fep0 + shifter;
  double k = t - shifter;
  double r = (xc - k * 0x1.62e42fee00000p-1) - k * 0x1.a39ef35793c76p-33;
  double p = vm_inv_factorial[8];
  for (int i = 7; i >= 0; i--) p = p * r + vm_inv_factorial[i];
  int64_t ki = (int64_t)(vm_bits(t) - vm_bits(shifter)); /* k in [-159, 0] */
  return p * vm_from_bits((uint64_t)(ki + 1023) << 52);
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

/* erf x in float32 for |x| < 7/8: x + x R(x^2), R(z) = erf(sqrt z) / sqrt z - 1
 * a least-squares fit over z in [0, 49/64] (relative error below 2^-32);
 * the leading x is added last, so its rounding is the one at full weight. */
static inline float vm_erf_smallf(float x) {
  float z = x * x;
  float p = 8.714060095371678e-05f;
  p = p * z - 0.0008220518357120454f;
  p = p * z + 0.005207621492445469f;
  p = p * z - 0.026861969381570816f;
  p = p * z + 0.11283741146326065f;
  p = p * z - 0.37612637877464294f;
  p = p * z + 0.12837916612625122f;
  return x + x * p;
}

/* erfc a in float32 for a >= 7/8 (and NaN): e^Q(a), Q a least-squares fit of
 * ln erfc over a in [7/8, 4] (absolute error below 2^-30, so the relative
 * error of erfc stays near float32's); 0 beyond 4, where erf rounds to 1 and
 * Gelu's tail is below its atol. */
static inline float vm_erfc_largef(float a) {
  float t = a < 0.875f ? 0.875f : a;
  t = t > 4.0f ? 4.0f : t;
  float q = 1.6054320894909324e-06f;
  q = q * t - 4.541504313237965e-05f;
  q = q * t + 0.0005912453634664416f;
  q = q * t - 0.004732866305857897f;
  q = q * t + 0.026343179866671562f;
  q = q * t - 0.10993916541337967f;
  q = q * t - 0.6319798827171326f;
  q = q * t - 1.1301409006118774f;
  q = q * t + 0.00029666503542102873f;
  float e = vm_expf(q);
  return a > 4.0f ? 0.0f : e;
}

static inline float vm_erff(float x) {
  float a = fabsf(x);
  float large = copysignf(1.0f - vm_erfc_largef(a), x);
  return a < 0.875f ? vm_erf_smallf(x) : large;
}

/* Gelu, erf form, in float32: x Phi(x), Phi(x) = (1 + erf(x / sqrt 2)) / 2,
 * as h + h erf(z) (h = x / 2, z = x / sqrt 2) for |z| < 7/8 and
 * x - h erfc(z) or h erfc(-z) beyond, so no form cancels where x > 0 (for
 * x < 0 what cancels is below Gelu's atol); NaN at -inf, the formula's
 * -inf * 0. */
static inline float vm_gelu_erff(float x) {
  float h = 0.5f * x, z = x * 0.70710678118654752440f, e = vm_erfc_largef(fabsf(z));
  float large = x > 0 ? (e == 0 ? x : x - h * e) : h * e; /* +inf stays +inf */
  float small = x == 0 ? x : h + h * vm_erf_smallf(z); /* -0 stays -0 */
  return fabsf(z) < 0.875f ? small : large;
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

/* The largest of len >= 1 float32s, as the largest of their bits mapped to
 * ordered integers (a loop that vectorises, where a float maximum with NaN
 * rules does not). A NaN may or may not win (one with its sign bit set
 * ranks below -inf): a caller whose result must be NaN for a NaN element
 * gets it through the arithmetic on every element (exp(x - max)), or checks
 * where the maximum it got leads elsewhere. */
static inline __attribute__((always_inline)) float vm_max_f32(const float *x, int64_t len) {
  int32_t m = INT32_MIN;
  for (int64_t i = 0; i < len; i++) {
    int32_t b;
    memcpy(&b, &x[i], sizeof b);
    int32_t key = b ^ (int32_t)((uint32_t)(b >> 31) >> 1); /* negatives: magnitude bits flipped */
    m = key > m ? key : m;
  }
  m ^= (int32_t)((uint32_t)(m >> 31) >> 1);
  float f;
  memcpy(&f, &m, sizeof f);
  return f;
}

#endif /* DEVKIT_BACKENDS_CPU_KERNELS_VMATH_H_ */
