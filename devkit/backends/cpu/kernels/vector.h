/*
 * vector.h -- what the row, pool and convolution kernels share to run their
 * hot loops vectorised: CPU-feature clones and a fast double exp.
 */
#ifndef DEVKIT_BACKENDS_CPU_KERNELS_VECTOR_H_
#define DEVKIT_BACKENDS_CPU_KERNELS_VECTOR_H_

#include <stdint.h>
#include <string.h>

/* Loops with selects (clamps, NaN-aware maxima) vectorise only where GCC
 * may assume floating-point exceptions are not trapped, and no kernel reads
 * the exception flags: the functions after this header are compiled so. */
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC optimize("no-trapping-math")
#endif

/* A hot loop compiled twice, for AVX2 + FMA and for the baseline, the copy
 * picked by the CPU at load time (GCC function multiversioning): the wheel
 * keeps running on any x86-64, and elsewhere the loop is compiled once. */
#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__) && defined(__ELF__)
#define VECTOR_CLONES __attribute__((target_clones("arch=x86-64-v3", "default")))
#else
#define VECTOR_CLONES
#endif

/* exp(x) for x <= 0 (and NaN), branch-free so that loops over it vectorise:
 * x = n ln2 + r with |r| <= ln2 / 2 (ln2 in two parts, so r is exact to
 * ~1e-19), exp(r) by its degree-13 Taylor polynomial (truncation below
 * 1e-17) and 2^n as two power-of-two factors, so results down to the
 * subnormals (x >= -745) are formed without overflowing the exponent.
 * Relative error within a few double ulps. x below `floor` is taken as
 * `floor` (>= -746): a caller whose results round to zero below some point
 * passes it, keeping subnormal arithmetic out of its loops. */
static inline __attribute__((always_inline)) double vector_exp_nonpositive(double x, double floor) {
  const double magic = 6755399441055744.0; /* 1.5 * 2^52: adding it rounds to an integer */
  const double log2e = 1.4426950408889634, ln2_hi = 6.93147180369123816490e-01,
               ln2_lo = 1.90821492927058770002e-10;
  x = x < floor ? floor : x; /* NaN stays NaN */
  double t = x * log2e + magic, n = t - magic;
  double r = (x - n * ln2_hi) - n * ln2_lo;
  double p = 1.0 / 6227020800.0;
  p = p * r + 1.0 / 479001600.0;
  p = p * r + 1.0 / 39916800.0;
  p = p * r + 1.0 / 3628800.0;
  p = p * r + 1.0 / 362880.0;
  p = p * r + 1.0 / 40320.0;
  p = p * r + 1.0 / 5040.0;
  p = p * r + 1.0 / 720.0;
  p = p * r + 1.0 / 120.0;
  p = p * r + 1.0 / 24.0;
  p = p * r + 1.0 / 6.0;
  p = p * r + 0.5;
  p = p * r + 1.0;
  p = p * r + 1.0;
  /* n in [-1077, 0] as an integer, from t's low bits; 2^n = 2^h * 2^(n - h)
   * with h = floor((n + 2048) / 2) - 1024, both factors normal. */
  int64_t bits, magic_bits;
  memcpy(&bits, &t, sizeof bits);
  memcpy(&magic_bits, &magic, sizeof magic_bits);
  int64_t ni = bits - magic_bits;
  int64_t h = (int64_t)((uint64_t)(ni + 2048) >> 1) - 1024;
  uint64_t e1 = (uint64_t)(h + 1023) << 52, e2 = (uint64_t)(ni - h + 1023) << 52;
  double s1, s2;
  memcpy(&s1, &e1, sizeof s1);
  memcpy(&s2, &e2, sizeof s2);
  return p * s1 * s2;
}

#endif /* DEVKIT_BACKENDS_CPU_KERNELS_VECTOR_H_ */
