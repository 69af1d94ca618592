/*
 * linalg_packed.h -- float32 products on a prepacked right operand: the
 * prepared form (DK_KernelEntry.prepare) of a constant MatMul / Gemm B.
 *
 * B (k x n, any element strides) is packed once into panels of
 * PACKED_PANEL columns: panel p holds rows 0..k-1 of columns
 * p*PACKED_PANEL.. as k contiguous rows of PACKED_PANEL floats, the last
 * panel's missing columns zero. A product then streams each panel once per
 * block of rows of A, with no packing of B per call (OpenBLAS packs B again
 * at every call, most of a small-M product's time). The packed form starts
 * with a header that names it and the geometry it was packed for, which a
 * kernel checks before it reads a prepared input (the ABI's rule: a call
 * through the raw ABI may mark any memory as prepared).
 */
#ifndef DEVKIT_BACKENDS_CPU_KERNELS_LINALG_PACKED_H_
#define DEVKIT_BACKENDS_CPU_KERNELS_LINALG_PACKED_H_

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define PACKED_PANEL 16

/* Whether the products run on the AVX-512 block (else on a portable loop):
 * the callers' test for the paths built on it. */
bool packed_block_avx512(void);

/* Bytes of the packed form of a k x n B (header included); 0 when it would
 * overflow. */
size_t packed_b_bytes(int64_t k, int64_t n);

/* Packs B, element (i, j) at b[i * row_stride + j * col_stride], into dst
 * (packed_b_bytes(k, n) bytes, 64-byte aligned for the fastest reads). */
void packed_b_pack(const float *b, int64_t row_stride, int64_t col_stride, int64_t k, int64_t n,
                   void *dst);

/* Whether `size` bytes at `packed` are a packed form of a k x n B. */
bool packed_b_check(const void *packed, size_t size, int64_t k, int64_t n);

/* c[i, j] = alpha * sum_p a[i * lda + p] * B[p, j] + (accumulate ? c[i, j] : 0)
 * for m rows, B the packed form of a k x n matrix; rows of c are ldc apart.
 * Split over the plugin's pool, by tiles of rows and column blocks, when the
 * product is large enough. */
void packed_gemm(int64_t m, int64_t n, int64_t k, float alpha, const float *a, int64_t lda,
                 const void *packed, bool accumulate, float *c, int64_t ldc);

/* c[i, j] = sum_p a[i * lda + p] * panels[j / PACKED_PANEL][p][j % PACKED_PANEL]
 * for m rows and n columns: B already in panels of k rows (no header; the
 * last panel's lanes past n are not read). On the calling thread: for
 * products inside a kernel's own split (Conv's). */
void packed_gemm_panels(int64_t m, int64_t n, int64_t k, const float *a, int64_t lda, const float *panels,
                        float *c, int64_t ldc);

/* packed_gemm_panels on a row-major k x n B (rows ldb apart) read in place
 * by the same block (Conv's column buffers), adding to c with accumulate. */
void packed_gemm_rows(int64_t m, int64_t n, int64_t k, const float *a, int64_t lda, const float *b, int64_t ldb,
                      bool accumulate, float *c, int64_t ldc);

/* c[i, j] = sum_p rows[i][offsets[p]] * panels[j / PACKED_PANEL][p][j % PACKED_PANEL]
 * (+ c[i, j] with accumulate) for m rows and n columns: an indirect A, each
 * row's elements found through its pointer and one offset per step (a
 * Conv's rows are output positions, its steps (channel, tap) offsets into a
 * padded image: no im2col). B's panels of k rows lie panel_stride floats
 * apart (the last panel's lanes past n are not read). `prefetch` (NULL:
 * none): panels laid out as B's, k rows of which are prefetched into L1 as
 * the first block of rows runs (the next pass's, while this one's are read
 * again by the other blocks). On the calling thread. */
void packed_gemm_indirect(int64_t m, int64_t n, int64_t k, const float *const *rows, const int64_t *offsets,
                          const float *panels, int64_t panel_stride, const float *prefetch, bool accumulate,
                          float *c, int64_t ldc);

#endif /* DEVKIT_BACKENDS_CPU_KERNELS_LINALG_PACKED_H_ */
