/*
 * vmath_exhaustive.c -- every float32 input (all 2^32 bit patterns) through
 * the cpu plugin's float32 functions (devkit/backends/cpu/kernels/vmath.h)
 * against libm in float64 rounded to float32; prints the largest ulp error
 * per function (Gelu's past its atol), and any special-value mismatch (NaN,
 * inf, signed zero).
 *
 *   cc -O2 -ffp-contract=off -fopenmp -Idevkit/backends/cpu/kernels \
 *      scripts/vmath_exhaustive.c -lm -o /tmp/vmath_exhaustive && /tmp/vmath_exhaustive [STRIDE]
 *
 * STRIDE (default 1: every input) tests every STRIDE-th bit pattern only;
 * names after it (exp, sigmoid, tanh, erf, gelu) pick the functions.
 */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "vmath.h"

static double sigmoid(double x) { return 1.0 / (1.0 + exp(-x)); }
static double gelu(double x) { return x * (0.5 * erfc(-x * 0.70710678118654752440)); }

static int64_t ordered(float f) {
  int32_t b;
  memcpy(&b, &f, sizeof b);
  return b < 0 ? (int64_t)INT32_MIN - b : b;
}

typedef float (*f32_fn)(float);
typedef double (*f64_fn)(double);

static int64_t stride = 1;
static int n_picked;
static char **picked;

/* Errors within atol (Gelu's tolerance has one) are not counted. */
static void sweep(const char *name, f32_fn got_fn, f64_fn want_fn, double atol) {
  int wanted = n_picked == 0;
  for (int i = 0; i < n_picked; i++) wanted |= strcmp(picked[i], name) == 0;
  if (!wanted) return;
  int64_t worst = 0, mismatches = 0;
  uint32_t worst_bits = 0;
#pragma omp parallel for reduction(+ : mismatches)
  for (int64_t i = 0; i < (int64_t)1 << 32; i += 1 << 16) {
    int64_t local_worst = 0;
    uint32_t local_bits = 0;
    for (int64_t j = i; j < i + (1 << 16); j += stride) {
      float x = vm_from_bits32((uint32_t)j), got = got_fn(x), want = (float)want_fn(x);
      if (want != want || got != got) {
        mismatches += (want != want) != (got != got);
        continue;
      }
      if (!isfinite(want) || x == 0 || !isfinite(x)) {
        if (vm_bits32(got) != vm_bits32(want)) {
          mismatches++;
#pragma omp critical
          printf("  %s(%a): got %a, want %a\n", name, (double)x, (double)got, (double)want);
        }
        continue;
      }
      if (fabs((double)got - (double)want) <= atol) continue;
      int64_t d = ordered(got) - ordered(want);
      d = d < 0 ? -d : d;
      if (d > local_worst) local_worst = d, local_bits = (uint32_t)j;
    }
#pragma omp critical
    if (local_worst > worst) worst = local_worst, worst_bits = local_bits;
  }
  fflush(stdout);
  printf("%-8s max %lld ulp (at %a), %lld special-value mismatches\n", name, (long long)worst,
         (double)vm_from_bits32(worst_bits), (long long)mismatches);
  fflush(stdout);
}

int main(int argc, char **argv) {
  stride = argc > 1 ? atoll(argv[1]) : 1;
  n_picked = argc > 2 ? argc - 2 : 0;
  picked = argv + 2;
  sweep("exp", vm_expf, exp, 0);
  sweep("sigmoid", vm_sigmoidf, sigmoid, 0);
  sweep("tanh", vm_tanhf, tanh, 0);
  sweep("erf", vm_erff, erf, 0);
  sweep("gelu", vm_gelu_erff, gelu, 0x1p-24); /* Gelu: 2 ulp or atol 2^-24 */
  return 0;
}
