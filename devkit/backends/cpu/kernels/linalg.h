/*
 * linalg.h -- what the linalg kernels (linalg*.c) share: the OpenBLAS GEMM
 * wrapper, running a float32 kernel for float16/bfloat16 tensors, scratch
 * allocation, and window geometry for Conv, ConvTranspose and the pools.
 */
#ifndef DEVKIT_BACKENDS_CPU_KERNELS_LINALG_H_
#define DEVKIT_BACKENDS_CPU_KERNELS_LINALG_H_

#include "dks_kernel.h"

/* The compute type of a float kernel: float16/bfloat16 run as float32. */
typedef enum { LINALG_F32, LINALG_F64 } linalg_real;

static inline linalg_real linalg_real_of(const dks_tensor *t) {
  return t->dtype == DK_DTYPE_FLOAT64 ? LINALG_F64 : LINALG_F32;
}

/* Row-major c[m x n] = alpha * op(a)[m x k] * op(b)[k x n] + beta * c through
 * scipy_cblas_sgemm/dgemm, op transposing when trans_* is set; ld* are the
 * row strides (elements) of the matrices as stored. Dimensions and leading
 * dimensions beyond blasint's range are split into several calls. k == 0
 * gives beta * c (0 when beta is 0); m == 0 or n == 0 does nothing. */
void linalg_gemm(linalg_real real, bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k,
                 double alpha, const void *a, int64_t lda, const void *b, int64_t ldb, double beta,
                 void *c, int64_t ldc);

/* Runs `core`, a kernel written for float32/float64, on a call whose
 * float16/bfloat16 tensors are replaced by float32 copies: inputs are
 * widened (honouring their strides), the core computes float32 outputs, and
 * these are rounded once into the call's outputs. */
DK_Status linalg_run_as_f32(const dks_kernel_args *k, dks_compute_fn core);

/* calloc(count, size) for scratch (count 0 still allocates, so NULL means
 * failure, reported as DK_RESOURCE_EXHAUSTED through dks_kernel_fail). */
void *linalg_scratch(const dks_kernel_args *k, size_t count, size_t size);

/* A compact row-major copy of `t` (any strides) in fresh scratch; NULL after
 * reporting failure. */
void *linalg_compact_copy(const dks_kernel_args *k, const dks_tensor *t);

/* The product of n sizes. */
static inline int64_t linalg_prod(const int64_t *sizes, int32_t n) {
  int64_t p = 1;
  for (int32_t i = 0; i < n; i++) p *= sizes[i];
  return p;
}

/* a / b rounded up (a >= 0, b >= 1). */
static inline int64_t linalg_ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

/* Positions j in [0, count) with 0 <= start + j * step < limit (step >= 1)
 * form the range [*lo, *hi) (empty: *lo == *hi). */
static inline void linalg_valid_range(int64_t start, int64_t step, int64_t count, int64_t limit,
                                      int64_t *lo, int64_t *hi) {
  int64_t a = start >= 0 ? 0 : (-start - 1) / step + 1;
  int64_t b = start >= limit ? 0 : (limit - start - 1) / step + 1;
  if (a > count) a = count;
  if (b > count) b = count;
  *lo = a;
  *hi = b > a ? b : a;
}

/* Window geometry of one call: `n` spatial axes; along axis d, grid position
 * q and kernel tap t meet target position q * stride - pad + t * dilation.
 * Conv and the pools walk output positions (the grid) and read the input
 * (the target); ConvTranspose walks input positions and writes the output. */
typedef struct linalg_window {
  int32_t n;
  int64_t grid[DKS_MAX_DIMS];   /* grid sizes */
  int64_t target[DKS_MAX_DIMS]; /* target sizes */
  int64_t kernel[DKS_MAX_DIMS];
  int64_t stride[DKS_MAX_DIMS];
  int64_t dilation[DKS_MAX_DIMS];
  int64_t pad[DKS_MAX_DIMS];     /* begin padding (ConvTranspose: may be negative) */
  int64_t pad_end[DKS_MAX_DIMS]; /* end padding (AveragePool counts it) */
} linalg_window;

/* im2col: col[(c, tap)][p] = image[c] (a compact plane per channel) at
 * kernel tap `tap` of grid position p0 + p, 0 in the padding, for
 * `channels` channels and `count` positions (col is channels * taps rows of
 * `count`). col2im, its adjoint: image[c] there += col[(c, tap)][p]. */
void linalg_im2col(linalg_real real, const linalg_window *w, const void *image, int64_t channels, int64_t p0,
                   int64_t count, void *col);
void linalg_col2im(linalg_real real, const linalg_window *w, const void *col, int64_t channels, int64_t p0,
                   int64_t count, void *image);

/* Winograd F(2x2, 3x3) (linalg_conv.c): whether a Conv of window `w`,
 * dtype and cg input, mg output channels per group goes that way (float32,
 * 2-D, 3x3, unit strides and dilations, enough channels and tiles); and the
 * Conv y = x * wt (+ b, NULL: none) computed so, split over the pool. *redo
 * is set when an output is not finite: the transforms spread a non-finite
 * value differently than the direct sums, so the caller computes y again
 * the direct way. u: the filters' transforms (linalg_winograd_filters) made
 * beforehand (a prepared W), or NULL: made now. */
bool linalg_winograd_fits(const linalg_window *w, DK_DTypeKey dtype, int64_t cg, int64_t mg);
DK_Status linalg_conv_winograd(const dks_kernel_args *k, const dks_tensor *x, const dks_tensor *wt,
                               const float *u, const dks_tensor *b, const dks_tensor *y, const linalg_window *w,
                               int64_t group, bool *redo);
/* The transforms U = G g G^T of the 3x3 filters of W (group * mg * cg of
 * them) into u[group][16][mg][cg], split over the pool. */
void linalg_winograd_filters(const float *wt, int64_t group, int64_t mg, int64_t cg, float *u);

/* W (group * mg filters of `steps` (channel, tap) weights each, compact
 * float32) in blocks of `block` filters: dst[group][block][step][filter in
 * block], 0 past mg (linalg_conv_filter_block_floats floats). The filters'
 * layout of the Conv paths whose vectors hold a block's filters or
 * broadcast its weights -- the direct, broadcast and indirect paths, each
 * with its own block -- packed at the call or prepared at plan time (each
 * filter's steps read in order: a gather per element took about a quarter
 * of a 32-filter 8x8 layer's sums). Split over the pool by block. */
int64_t linalg_conv_filter_block_floats(int64_t group, int64_t mg, int64_t steps, int64_t block);
void linalg_conv_filter_blocks(const float *wt, int64_t group, int64_t mg, int64_t steps, int64_t block,
                               float *dst);

/* One row of a zero-padded, strided copy of a float32 plane (h x wd), as the
 * direct Convs lay out their inputs: dst[j] = plane[iy][x0 + j * step] for
 * j in [0, count), 0 outside the plane (linalg_conv_direct.c). */
void linalg_padded_row(float *dst, const float *plane, int64_t h, int64_t wd, int64_t iy, int64_t x0,
                       int64_t step, int64_t count);

/* The direct Conv (linalg_conv_direct.c): whether a Conv of window `w`,
 * dtype and cg input, mg output channels per group goes that way (float32,
 * 2-D, no dilation, few channels and taps, a small output plane, or with
 * AVX-512 a strided window within wider bounds); and the
 * Conv y = x * wt (+ b, NULL: none) computed so, split over the pool when
 * it is worth a hand-off. */
bool linalg_conv_direct_fits(const linalg_window *w, DK_DTypeKey dtype, int64_t cg, int64_t mg);
DK_Status linalg_conv_direct(const dks_kernel_args *k, const dks_tensor *x, const dks_tensor *wt,
                             const dks_tensor *b, const dks_tensor *y, const linalg_window *w, int64_t group);

/* Conv and the pools: geometry from the attributes (auto_pad, pads, strides,
 * dilations) and the input, output and kernel spatial sizes; SAME_* pads
 * come from the output sizes as the spec derives them. */
void linalg_window_forward(const dks_kernel_args *k, int32_t n, const int64_t *in,
                           const int64_t *out, const int64_t *kernel, linalg_window *w);

/* Validation of the window ops (Conv, ConvTranspose, the pools and their
 * gradients): X (input i) has rank >= 3; kernel_shape (when given), strides,
 * dilations and pads have one value per spatial axis (two for pads), in
 * range; `kernel` (the spatial kernel sizes, NULL: kernel_shape) is >= 1.
 * *out gets the spatial output sizes the spec derives (ConvTranspose:
 * `transpose`), ready for dks_check_output. `x` is input i's shape. */
DK_Status linalg_check_window(const dks_kernel_args *k, int32_t ndim, const int64_t *x_shape,
                              const int64_t *kernel, bool pool, bool transpose, int64_t *out);

/* Conv's (or ConvTranspose's) X, W (of X's rank) and optional B against
 * group and the window attributes; *y gets Y's shape (X's rank). */
DK_Status linalg_check_conv(const dks_kernel_args *k, const dks_tensor *x, const dks_tensor *wt,
                            const dks_tensor *b, bool transpose, int64_t *y);

#endif /* DEVKIT_BACKENDS_CPU_KERNELS_LINALG_H_ */
