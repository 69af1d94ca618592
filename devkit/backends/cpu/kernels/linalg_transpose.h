/*
 * linalg_transpose.h -- a 16 x 16 float32 block transposed in AVX-512
 * registers, for the Conv paths whose sums hold filters in the vector lanes
 * (linalg_conv_broadcast.c, linalg_conv_indirect.c): one vector per filter
 * then stores a row of Y.
 */
#ifndef DEVKIT_BACKENDS_CPU_KERNELS_LINALG_TRANSPOSE_H_
#define DEVKIT_BACKENDS_CPU_KERNELS_LINALG_TRANSPOSE_H_

#if defined(__x86_64__) && defined(__GNUC__)
#include <immintrin.h>

/* r transposed: r[i] lane k becomes r[k] lane i (pairs of lanes, then of
 * pairs, then of 128-bit quarters). */
static inline __attribute__((always_inline, target("avx512f"))) void linalg_transpose16(__m512 r[16]) {
  __m512 t[16];
#pragma GCC unroll 8
  for (int i = 0; i < 8; i++) {
    t[2 * i] = _mm512_unpacklo_ps(r[2 * i], r[2 * i + 1]);
    t[2 * i + 1] = _mm512_unpackhi_ps(r[2 * i], r[2 * i + 1]);
  }
#pragma GCC unroll 4
  for (int i = 0; i < 4; i++) {
    __m512d a = _mm512_castps_pd(t[4 * i]), b = _mm512_castps_pd(t[4 * i + 1]);
    __m512d c = _mm512_castps_pd(t[4 * i + 2]), d = _mm512_castps_pd(t[4 * i + 3]);
    r[4 * i] = _mm512_castpd_ps(_mm512_unpacklo_pd(a, c));
    r[4 * i + 1] = _mm512_castpd_ps(_mm512_unpackhi_pd(a, c));
    r[4 * i + 2] = _mm512_castpd_ps(_mm512_unpacklo_pd(b, d));
    r[4 * i + 3] = _mm512_castpd_ps(_mm512_unpackhi_pd(b, d));
  }
#pragma GCC unroll 4
  for (int i = 0; i < 4; i++) {
    t[i] = _mm512_shuffle_f32x4(r[i], r[4 + i], 0x88);
    t[4 + i] = _mm512_shuffle_f32x4(r[i], r[4 + i], 0xdd);
    t[8 + i] = _mm512_shuffle_f32x4(r[8 + i], r[12 + i], 0x88);
    t[12 + i] = _mm512_shuffle_f32x4(r[8 + i], r[12 + i], 0xdd);
  }
#pragma GCC unroll 4
  for (int i = 0; i < 4; i++) {
    r[i] = _mm512_shuffle_f32x4(t[i], t[8 + i], 0x88);
    r[8 + i] = _mm512_shuffle_f32x4(t[i], t[8 + i], 0xdd);
    r[4 + i] = _mm512_shuffle_f32x4(t[4 + i], t[12 + i], 0x88);
    r[12 + i] = _mm512_shuffle_f32x4(t[4 + i], t[12 + i], 0xdd);
  }
}
#endif

#endif /* DEVKIT_BACKENDS_CPU_KERNELS_LINALG_TRANSPOSE_H_ */
