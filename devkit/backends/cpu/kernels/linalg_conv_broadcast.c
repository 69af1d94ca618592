/*
 * linalg_conv_broadcast.c -- float32 2-D Conv with few channels on small
 * planes where the CPU has AVX-512 (see linalg_conv_broadcast.h), by
 * register blocks of 16 vectors of sums, each a block's filter weight or
 * input value broadcast from memory by the fused multiply-add:
 *
 * - vectors of filters (onnxruntime's NCHWc kernels work this way): 16
 *   positions of a block of 16 filters (8 of each of two rows on rows of 8
 *   or fewer), or 8 positions of a block of 32 in two vectors each; for each
 *   channel and tap the block's filter vector (or two) multiplies each
 *   position's input value. The sums are then transposed in registers into
 *   one vector per filter and row. Strided windows read their columns in
 *   place (no phase planes).
 * - vectors of positions, with unit column strides: 8 filters by 32
 *   consecutive positions of a row, or 16 of each of two rows; for each
 *   channel and tap two vectors of inputs multiply each filter's weight,
 *   broadcast once for both. No transpose, 8 filters fill every lane, and
 *   a multiply-add loads 10 / 16 of a value where the vectors of filters'
 *   load one (up to 16 filters go this way in two blocks: the zoo resnet's
 *   stem and 16x16 layers, 7-8% faster than by one block of 16).
 *
 * Either way each sum runs in channel-major tap order; B and FusedConv's Z
 * are added and the activation applied to each row of sums in registers,
 * then stored into NCHW Y.
 *
 * Each part of the pool's work is an image (of a group) and a band of its
 * output rows: the part copies the rows of X its band reads, zero-padded,
 * into one buffer ([channel][row][column], the padding of every side
 * included), so a window never leaves it. Consecutive Convs split alike (image,
 * then band), so a thread reads what it wrote a layer before, in its cache.
 * A product 0 * inf in the padding gives NaN, as the im2col path's does.
 */
#include "linalg_conv_broadcast.h"
#include "linalg_conv_epilogue.h"
#include "linalg_transpose.h"

#include <stdatomic.h>
#include <stdlib.h>

/* What goes this way, per group: at most this many input channels times
 * taps (a block's filters then fit in L1), output channels, output positions
 * and taps per axis; strides 1 or 2; at least this many filters (8 or fewer
 * with unit column strides only, summed by vectors of positions), output
 * rows of 8 positions or more. */
#define BROADCAST_MIN_FILTERS 5
#define BROADCAST_MAX_ROWS 288
#define BROADCAST_MAX_FILTERS 64
#define BROADCAST_MAX_PLANE 4096
#define BROADCAST_MAX_KERNEL 7
/* Below this many multiply-adds a call runs on its own thread: a split's
 * hand-off through the pool costs more than it saves. */
#define BROADCAST_SPLIT_MACS ((int64_t)1 << 18)
/* The buffer's slack: a block's positions past its row's last read up to
 * 16 * stride + the kernel's width floats beyond it. */
#define BROADCAST_SLACK 64

/* Filters per register block: 8 (by two vectors of positions) for up to 8,
 * and up to 16 on unit column strides and rows of more than 8 (two blocks),
 * else 16 (one vector) for up to 16, else 32. */
int64_t linalg_conv_broadcast_filter_block(const linalg_window *w, int64_t mg) {
  if (mg <= 8 || (mg <= 16 && w->stride[1] == 1 && w->grid[1] > 8)) return 8;
  return mg <= 16 ? 16 : 32;
}

#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)
#include <immintrin.h>

typedef struct broadcast_job {
  int64_t group, cg, mg, x_channels, y_channels;
  int64_t h, wd, oh, ow, sh, sw, pad_h, pad_w, kh, kw;
  int64_t row;           /* the buffer's row length: the columns the windows reach */
  int64_t bands, block, blocks;
  size_t buffer_floats;  /* a band's buffer, the slack included */
  const float *x, *filters, *bias, *z;
  const float *y_start;  /* Y's data: a block's Z lies as far from z */
  bool relu;
  float *y;
  /* the blocks of a band (BROADCAST_BLOCKS, BROADCAST_ROWS), rows_per_block rows at a time */
  void (*blocks_fn)(const struct broadcast_job *, const float *, int64_t, int64_t, int64_t, const float *,
                    int64_t, const float *, float *);
  int64_t rows_per_block;
  atomic_bool failed;
} broadcast_job;

bool linalg_conv_broadcast_fits(const linalg_window *w, DK_DTypeKey dtype, int64_t cg, int64_t mg) {
  if (w->n != 2 || dtype != DK_DTYPE_FLOAT32 || w->dilation[0] != 1 || w->dilation[1] != 1) return false;
  int64_t taps = w->kernel[0] * w->kernel[1];
  return taps > 1 && w->kernel[0] <= BROADCAST_MAX_KERNEL && w->kernel[1] <= BROADCAST_MAX_KERNEL &&
         w->stride[0] >= 1 && w->stride[0] <= 2 && w->stride[1] >= 1 && w->stride[1] <= 2 &&
         cg * taps <= BROADCAST_MAX_ROWS && mg >= BROADCAST_MIN_FILTERS && mg <= BROADCAST_MAX_FILTERS &&
         (mg > 8 || w->stride[1] == 1) &&
         w->grid[0] * w->grid[1] <= BROADCAST_MAX_PLANE && w->grid[1] >= 8 &&
         __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512vl");
}

#define BROADCAST_TARGET __attribute__((target("avx512f,avx512vl")))
#define BROADCAST_INLINE static inline __attribute__((always_inline)) BROADCAST_TARGET

/* The rows of X band [oy0, oy0 + rows) reads, of channels cg from x (an
 * image's, its group's first), zero-padded into xb: [c][rows][j->row]. */
BROADCAST_TARGET static void pad_band(const broadcast_job *j, const float *x, int64_t oy0, int64_t rows,
                                      float *xb) {
  memset(xb, 0, (size_t)(j->cg * rows * j->row + BROADCAST_SLACK) * sizeof *xb);
  int64_t iy0 = oy0 * j->sh - j->pad_h, cols = j->row - j->pad_w < j->wd ? j->row - j->pad_w : j->wd;
  int64_t r0 = iy0 < 0 ? -iy0 : 0, r1 = j->h - iy0 < rows ? j->h - iy0 : rows;
  if (cols <= 0) return;
  __mmask16 last = (__mmask16)((1u << ((cols - 1) % 16 + 1)) - 1); /* the lanes of a row's last vector */
  for (int64_t c = 0; c < j->cg; c++)
    for (int64_t r = r0; r < r1; r++) {
      float *dst = xb + (c * rows + r) * j->row + j->pad_w;
      const float *src = x + (c * j->h + iy0 + r) * j->wd;
      int64_t k = 0;
      for (; k + 16 < cols; k += 16) _mm512_storeu_ps(dst + k, _mm512_loadu_ps(src + k));
      _mm512_mask_storeu_ps(dst + k, last, _mm512_maskz_loadu_ps(last, src + k));
    }
}

/* acc + w * x[0] (broadcast): one multiply-add with its value from memory.
 * In asm because GCC, seeing the next tap's row read the same values one
 * position on, keeps them in registers and broadcasts each from there: on
 * the zoo resnet's rows of 16 that took 12 shuffles and 9 moves per 16
 * multiply-adds, the shuffle port then the bound. */
BROADCAST_INLINE __m512 madd_broadcast(__m512 acc, __m512 w, const float *x) {
  __asm__("vfmadd231ps %[x]%{1to16%}, %[w], %[acc]" : [acc] "+v"(acc) : [w] "v"(w), [x] "m"(*x));
  return acc;
}

/* r[p] = the sums of position p (16 filters; V = 2: r[8 + p] the next 16)
 * over the channels and taps, for L positions stride SW apart from x0 and,
 * S = 2, L from x1; fw: the block's filters, [c][tap][16 * V]. */
BROADCAST_INLINE void block_sums(const float *x0, const float *x1, int64_t cg, int64_t plane, int64_t kh,
                                 int64_t kw, int64_t row, const float *fw, __m512 r[16], const int L, const int S,
                                 const int V, const int SW) {
  __m512 acc[16][2];
#pragma GCC unroll 16
  for (int p = 0; p < 16; p++) acc[p][0] = acc[p][1] = _mm512_setzero_ps();
  for (int64_t c = 0; c < cg; c++)
    for (int64_t ky = 0; ky < kh; ky++) {
      const float *a = x0 + c * plane + ky * row, *b = x1 + c * plane + ky * row;
      for (int64_t kx = 0; kx < kw; kx++, fw += 16 * V) {
        __m512 w0 = _mm512_loadu_ps(fw), w1 = V > 1 ? _mm512_loadu_ps(fw + 16) : w0;
#pragma GCC unroll 16
        for (int p = 0; p < L; p++) {
          if (V > 1) { /* one broadcast load for two multiply-adds */
            __m512 v = _mm512_set1_ps(a[kx + p * SW]);
            acc[p][0] = _mm512_fmadd_ps(w0, v, acc[p][0]);
            acc[p][1] = _mm512_fmadd_ps(w1, v, acc[p][1]);
          } else {
            acc[p][0] = madd_broadcast(acc[p][0], w0, a + kx + p * SW);
          }
        }
        if (S > 1) {
#pragma GCC unroll 16
          for (int p = 0; p < L; p++) acc[L + p][0] = madd_broadcast(acc[L + p][0], w0, b + kx + p * SW);
        }
      }
    }
#pragma GCC unroll 16
  for (int p = 0; p < 16; p++) r[p] = V > 1 ? (p < 8 ? acc[p][0] : acc[p - 8][1]) : acc[p][0];
}

/* With unit column strides, the block the other way round: F filters by P
 * vectors of 16 consecutive positions, vector p at x0 + p * vstep, r[m * P
 * + p] filter m's sums there; for each channel and tap each filter's weight
 * (fw: [c][tap][F]) is broadcast once for the P vectors of inputs. The same
 * sums in the same order as block_sums' (a product's operands swapped).
 * With 8 filters (the U-Net's 3->8, 8->8 and 16->8 layers on 32x32) every
 * lane holds an output, where a vector of 16 filters would be half empty. */
BROADCAST_INLINE void row_sums(const float *x0, int64_t vstep, int64_t cg, int64_t plane, int64_t kh, int64_t kw,
                               int64_t row, const float *fw, __m512 r[16], const int F, const int P) {
  __m512 acc[16];
#pragma GCC unroll 16
  for (int i = 0; i < F * P; i++) acc[i] = _mm512_setzero_ps();
  for (int64_t c = 0; c < cg; c++)
    for (int64_t ky = 0; ky < kh; ky++) {
      const float *a = x0 + c * plane + ky * row;
      for (int64_t kx = 0; kx < kw; kx++, fw += F) {
        __m512 v[2];
#pragma GCC unroll 2
        for (int p = 0; p < P; p++) v[p] = _mm512_loadu_ps(a + kx + vstep * p);
#pragma GCC unroll 16
        for (int m = 0; m < F; m++) {
          __m512 w = _mm512_set1_ps(fw[m]);
#pragma GCC unroll 2
          for (int p = 0; p < P; p++) acc[m * P + p] = _mm512_fmadd_ps(w, v[p], acc[m * P + p]);
        }
      }
    }
#pragma GCC unroll 16
  for (int i = 0; i < F * P; i++) r[i] = acc[i];
}

/* Up to 8 sums of filter m (of a group's mg; bias: the group's B, or NULL)
 * at y (inside Y): + B, + Z, the activation (Relu keeps NaN: max(0, NaN)
 * is NaN), then stored: in the epilogue's order (linalg_conv_epilogue.c). */
BROADCAST_INLINE void finish_half(const broadcast_job *j, __m256 v, const float *bias, int64_t m, float *y,
                                  int64_t count) {
  if (count <= 0 || m >= j->mg) return;
  __mmask8 lanes = (__mmask8)((1u << count) - 1);
  if (bias) v = _mm256_add_ps(v, _mm256_set1_ps(bias[m]));
  if (j->z) v = _mm256_add_ps(v, _mm256_maskz_loadu_ps(lanes, j->z + (y - j->y_start)));
  if (j->relu) v = _mm256_max_ps(_mm256_setzero_ps(), v);
  _mm256_mask_storeu_ps(y, lanes, v);
}

/* finish_half on 16 consecutive outputs of filter m (the first count of them). */
BROADCAST_INLINE void finish_row(const broadcast_job *j, __m512 v, const float *bias, int64_t m, float *y,
                                 int64_t count) {
  if (count <= 0 || m >= j->mg) return;
  __mmask16 lanes = (__mmask16)((1u << count) - 1);
  if (bias) v = _mm512_add_ps(v, _mm512_set1_ps(bias[m]));
  if (j->z) v = _mm512_add_ps(v, _mm512_maskz_loadu_ps(lanes, j->z + (y - j->y_start)));
  if (j->relu) v = _mm512_max_ps(_mm512_setzero_ps(), v);
  _mm512_mask_storeu_ps(y, lanes, v);
}

/* Output rows [oy0, oy1) of a group's filters [m0, m0 + 16 * V) (fw: their
 * packed block; y: the group's first plane in Y; bias: its B or NULL) from
 * the band's buffer xb of `rows` rows, the first under oy0. */
BROADCAST_INLINE void band_blocks(const broadcast_job *j, const float *xb, int64_t rows, int64_t oy0,
                                  int64_t oy1, const float *fw, int64_t m0, const float *bias, float *y,
                                  const int L, const int S, const int V, const int SW) {
  int64_t plane = rows * j->row, out_plane = j->oh * j->ow;
  for (int64_t oy = oy0; oy < oy1; oy += S) {
    bool second = S > 1 && oy + 1 < oy1; /* S = 2: the block's second row is in the band */
    for (int64_t ox = 0; ox < j->ow; ox += L) {
      const float *x0 = xb + (oy - oy0) * j->sh * j->row + ox * SW;
      __m512 r[16];
      block_sums(x0, second ? x0 + j->sh * j->row : x0, j->cg, plane, j->kh, j->kw, j->row, fw, r, L, S, V, SW);
      linalg_transpose16(r);
      int64_t n = j->ow - ox < L ? j->ow - ox : L; /* positions of each row in the block */
      float *at = y + oy * j->ow + ox;
#pragma GCC unroll 16
      for (int i = 0; i < 16; i++) {
        int64_t m = m0 + i;
        float *ym = at + m * out_plane;
        if (V == 1 && (S == 1 || (j->ow == 8 && second))) { /* 16 consecutive outputs */
          finish_row(j, r[i], bias, m, ym, S == 1 ? n : 16);
          continue;
        }
        __m256 lo = _mm512_castps512_ps256(r[i]);
        __m256 hi = _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(r[i]), 1));
        finish_half(j, lo, bias, m, ym, n);
        if (V > 1) /* lanes 8-15: filter m + 16, the same positions */
          finish_half(j, hi, bias, m + 16, ym + 16 * out_plane, n);
        else /* lanes 8-15: the next row */
          finish_half(j, hi, bias, m, ym + j->ow, second ? n : 0);
      }
    }
  }
}

/* band_blocks by row_sums' blocks of F filters by P vectors of 16
 * positions: along a row, or (ACROSS) one in each of P consecutive rows. */
BROADCAST_INLINE void band_rows(const broadcast_job *j, const float *xb, int64_t rows, int64_t oy0, int64_t oy1,
                                const float *fw, int64_t m0, const float *bias, float *y, const int F, const int P,
                                const bool ACROSS) {
  int64_t plane = rows * j->row, out_plane = j->oh * j->ow;
  for (int64_t oy = oy0; oy < oy1; oy += ACROSS ? P : 1) {
    int64_t below = ACROSS ? (oy1 - oy < P ? oy1 - oy : P) : 1; /* the block's rows in the band */
    for (int64_t ox = 0; ox < j->ow; ox += ACROSS ? 16 : 16 * P) {
      __m512 r[16];
      /* a block's rows past the band's last read that row again; they are not stored */
      int64_t vstep = !ACROSS ? 16 : below > 1 ? j->sh * j->row : 0;
      row_sums(xb + (oy - oy0) * j->sh * j->row + ox, vstep, j->cg, plane, j->kh, j->kw, j->row, fw, r, F, P);
      float *at = y + oy * j->ow + ox;
#pragma GCC unroll 16
      for (int i = 0; i < F * P; i++) {
        int64_t m = m0 + i / P, p = i % P, left = ACROSS ? (p < below ? j->ow - ox : 0) : j->ow - ox - 16 * p;
        finish_row(j, r[i], bias, m, at + m * out_plane + (ACROSS ? p * j->ow : 16 * p), left < 16 ? left : 16);
      }
    }
  }
}

#define BROADCAST_ROWS(NAME, F, P, ACROSS)                                                                  \
  static BROADCAST_TARGET void NAME(const broadcast_job *j, const float *xb, int64_t rows, int64_t oy0,      \
                                    int64_t oy1, const float *fw, int64_t m0, const float *bias, float *y) { \
    band_rows(j, xb, rows, oy0, oy1, fw, m0, bias, y, F, P, ACROSS);                                        \
  }
/* 8 filters, unit column strides: 32 positions of a row, or 16 of each of two rows */
BROADCAST_ROWS(row32_filters8, 8, 2, false)
BROADCAST_ROWS(rows16_filters8, 8, 2, true)

/* The register-block shapes: (positions per row L, rows S, vectors per
 * position V) and the column stride SW, fixed so that the block's
 * accumulators stay in registers and its loads are immediate offsets. */
#define BROADCAST_BLOCKS(NAME, L, S, V, SW)                                                                  \
  static BROADCAST_TARGET void NAME(const broadcast_job *j, const float *xb, int64_t rows, int64_t oy0,      \
                                    int64_t oy1, const float *fw, int64_t m0, const float *bias, float *y) { \
    band_blocks(j, xb, rows, oy0, oy1, fw, m0, bias, y, L, S, V, SW);                                       \
  }
BROADCAST_BLOCKS(row16_stride2, 16, 1, 1, 2) /* 16 filters, column stride 2, rows of more than 8 */
BROADCAST_BLOCKS(rows8_stride1, 8, 2, 1, 1) /* 16 filters, rows of 8 or fewer: two at a time */
BROADCAST_BLOCKS(rows8_stride2, 8, 2, 1, 2)
BROADCAST_BLOCKS(wide8_stride1, 8, 1, 2, 1) /* 32 filters */
BROADCAST_BLOCKS(wide8_stride2, 8, 1, 2, 2)

/* Parts [begin, end): (image of a group, band of output rows). */
static void broadcast_parts(void *arg, int64_t begin, int64_t end) {
  broadcast_job *j = arg;
  float *xb = malloc(j->buffer_floats * sizeof *xb);
  if (!xb) {
    atomic_store(&j->failed, true);
    return;
  }
  int64_t taps = j->kh * j->kw, step = j->rows_per_block;
  for (int64_t part = begin; part < end; part++) {
    int64_t image = part / j->bands, band = part % j->bands, n = image / j->group, g = image % j->group;
    /* band edges on whole blocks of rows */
    int64_t oy0 = band * j->oh / j->bands / step * step, oy1 = (band + 1) * j->oh / j->bands / step * step;
    if (band == j->bands - 1) oy1 = j->oh;
    if (oy0 >= oy1) continue;
    int64_t rows = (oy1 - oy0 - 1) * j->sh + j->kh;
    pad_band(j, j->x + (n * j->x_channels + g * j->cg) * j->h * j->wd, oy0, rows, xb);
    float *y = j->y + (n * j->y_channels + g * j->mg) * j->oh * j->ow;
    const float *bias = j->bias ? j->bias + g * j->mg : NULL;
    for (int64_t bi = 0; bi < j->blocks; bi++)
      j->blocks_fn(j, xb, rows, oy0, oy1, j->filters + (g * j->blocks + bi) * j->cg * taps * j->block,
                   bi * j->block, bias, y);
  }
  free(xb);
}

static int64_t gcd(int64_t a, int64_t b) { return b ? gcd(b, a % b) : a; }

DK_Status linalg_conv_broadcast(const dks_kernel_args *k, const dks_tensor *x, const dks_tensor *wt,
                                const dks_tensor *b, const dks_tensor *y, const linalg_window *w, int64_t group) {
  conv_epilogue ep = conv_epilogue_without_bias(k);
  broadcast_job j = {.group = group, .cg = x->shape[1] / group, .mg = y->shape[1] / group,
                     .x_channels = x->shape[1], .y_channels = y->shape[1], .h = w->target[0], .wd = w->target[1],
                     .oh = w->grid[0], .ow = w->grid[1], .sh = w->stride[0], .sw = w->stride[1],
                     .pad_h = w->pad[0], .pad_w = w->pad[1], .kh = w->kernel[0], .kw = w->kernel[1],
                     .x = (const float *)x->data, .bias = b ? (const float *)b->data : NULL,
                     .z = (const float *)ep.z, .y_start = (const float *)ep.y,
                     .relu = ep.activation == CONV_ACTIVATION_RELU, .y = (float *)y->data};
  atomic_init(&j.failed, false);
  j.row = (j.ow - 1) * j.sw + j.kw;
  j.block = linalg_conv_broadcast_filter_block(w, j.mg);
  j.blocks = linalg_ceil_div(j.mg, j.block);
  bool two = j.sw == 2;
  j.blocks_fn = j.block == 32 ? (two ? wide8_stride2 : wide8_stride1)
                : j.block == 8 ? (j.ow > 16 ? row32_filters8 : rows16_filters8)
                : j.ow <= 8    ? (two ? rows8_stride2 : rows8_stride1)
                               : row16_stride2;
  j.rows_per_block = j.blocks_fn == rows16_filters8 || (j.block == 16 && j.ow <= 8) ? 2 : 1;
  /* The split: an image (of a group) per part where the images share out
   * evenly over the threads, else as many bands of rows as make them. */
  int64_t taps = j.kh * j.kw, images = x->shape[0] * group, threads = dks_thread_count();
  int64_t macs = images * j.oh * j.ow * j.mg * j.cg * taps;
  bool split = threads > 1 && macs >= BROADCAST_SPLIT_MACS;
  j.bands = split ? threads / gcd(images, threads) : 1;
  if (j.bands > j.oh) j.bands = j.oh;
  int64_t most_rows = linalg_ceil_div(j.oh, j.bands) + 1; /* a band's most output rows (its edges fall on even rows) */
  if (most_rows > j.oh) most_rows = j.oh;
  j.buffer_floats = (size_t)(j.cg * ((most_rows - 1) * j.sh + j.kh) * j.row + BROADCAST_SLACK);

  /* W prepared (its data are the packed filters) or packed here */
  bool prepared = wt->prepared_bytes != 0;
  float *packed = NULL;
  if (!prepared) {
    int64_t steps = j.cg * j.kh * j.kw;
    packed = malloc((size_t)linalg_conv_filter_block_floats(group, j.mg, steps, j.block) * sizeof *packed);
    if (!packed) return dks_kernel_fail(k, DK_RESOURCE_EXHAUSTED, "out of host memory for the packed filters");
    linalg_conv_filter_blocks((const float *)wt->data, group, j.mg, steps, j.block, packed);
  }
  j.filters = prepared ? (const float *)wt->data : packed;
  int64_t parts = images * j.bands;
  dks_parallel_for(parts, split ? 1 : parts, broadcast_parts, &j);
  free(packed);
  if (atomic_load(&j.failed))
    return dks_kernel_fail(k, DK_RESOURCE_EXHAUSTED, "out of host memory for a band of the input");
  return DK_OK;
}
#else
bool linalg_conv_broadcast_fits(const linalg_window *w, DK_DTypeKey dtype, int64_t cg, int64_t mg) {
  (void)w, (void)dtype, (void)cg, (void)mg;
  return false;
}

DK_Status linalg_conv_broadcast(const dks_kernel_args *k, const dks_tensor *x, const dks_tensor *wt,
                                const dks_tensor *b, const dks_tensor *y, const linalg_window *w, int64_t group) {
  (void)x, (void)wt, (void)b, (void)y, (void)w, (void)group;
  return dks_kernel_fail(k, DK_INTERNAL, "the broadcast Conv needs AVX-512 (its fits test said no)");
}
#endif
