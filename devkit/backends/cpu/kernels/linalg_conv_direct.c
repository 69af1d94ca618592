/*
 * linalg_conv_direct.c -- float32 2-D Conv with few channels on small
 * planes, computed directly: no im2col and no GEMM call, whose setup (pack
 * the operands, split the product) costs more than such a convolution's
 * few hundred thousand multiply-adds; and, where the CPU has AVX-512,
 * strided ones with more channels or larger planes (ResNet's stem), whose
 * im2col copy and its packing cost more than the direct sums' phase planes.
 *
 * The input is first copied, zero-padded, into one plane per stride phase
 * (for strides sh, sw, the phase (ry, rx) plane holds the padded input's
 * elements (i * sh + ry, j * sw + rx)), each row pw long: the output row
 * length plus what the kernel reaches beyond it. Then output position
 * (oy, ox) meets tap (ky, kx) at flat offset (oy + ky / sh) * pw + ox +
 * kx / sw of its tap's phase plane, for every tap the same offset from
 * oy * pw + ox: the output is computed over those flat positions (the last
 * pw - ow of each row are discarded), a register block of DIRECT_MB output
 * channels by DIRECT_LANES positions at a time (with AVX-512, DIRECT_MB_512
 * by DIRECT_LANES_512), each sum in tap order over
 * the channels (within the op's dot-product tolerance; 0 * inf in the
 * padding gives NaN as the im2col path's product does). The filters, in
 * those blocks' order, are packed at the call or at plan time
 * (linalg_conv_direct.h).
 */
#include "linalg_conv_direct.h"
#include "linalg_conv_epilogue.h"

#include <stdatomic.h>
#include <stdlib.h>

#define DIRECT_MB 4
#define DIRECT_VEC 8 /* floats per vector */
#define DIRECT_VECS 2
#define DIRECT_LANES (DIRECT_VEC * DIRECT_VECS)
#define DIRECT_MAX_TAPS 49
typedef float direct_vec __attribute__((vector_size(DIRECT_VEC * sizeof(float))));

/* What goes this way (a build may change the bounds, -D, to compare paths):
 * per group at most this many input channels times taps, output channels,
 * and output positions. */
#ifndef DIRECT_MAX_ROWS
#define DIRECT_MAX_ROWS 288
#endif
#ifndef DIRECT_MAX_FILTERS
#define DIRECT_MAX_FILTERS 64
#endif
#ifndef DIRECT_MAX_PLANE
#define DIRECT_MAX_PLANE 4096
#endif
/* Where the CPU has AVX-512 (the wide block), strided windows go this way
 * within wider bounds: ResNet-18's 7x7/2 stem (147 steps, 64 filters, 12544
 * positions) and its 3x3/2 onto 28x28 (576 steps, 128 filters), both
 * about 0.92x im2col + GEMM's time on one thread (CPU time; a loaded 2-core
 * Zen 4); its 3x3/2 layers with 1152 steps and more take the register
 * blocks (linalg_conv.c). */
#define DIRECT_WIDE_MAX_ROWS 576
#define DIRECT_WIDE_MAX_FILTERS 128
#define DIRECT_WIDE_MAX_PLANE 16384

/* A chunk of the pool is worth it from about this many multiply-adds. */
#define DIRECT_CHUNK_MACS ((int64_t)1 << 18)
/* A part covers flat positions of about this many multiply-adds. */
#define DIRECT_PART_MACS ((int64_t)1 << 16)

typedef struct direct_job {
  int64_t group, cg, mg, x_channels, y_channels;
  int64_t h, wd, oh, ow, sh, sw, pad_h, pad_w, kh, kw, taps;
  int64_t phases_w, phases; /* column phases, all phases */
  int64_t ph, pw, plane;    /* a phase plane's rows, row length and floats (with the slack a block reads) */
  int64_t mb, mblocks, span, spans; /* filters per block (DIRECT_MB, or DIRECT_MB_512), filter blocks; flat positions per part (whole blocks), parts per plane */
  int64_t offset[DIRECT_MAX_TAPS]; /* per tap: its phase plane's start plus its shift there */
  const float *x, *wt, *b;
  conv_epilogue rest; /* Z and the activation, after b */
  float *y;
  float *xp; /* [image][cg][phases][plane] */
  float *wp; /* [group][mblock][cg][taps][mb] */
  atomic_bool failed;
} direct_job;

static bool direct_wide(void);

bool linalg_conv_direct_fits(const linalg_window *w, DK_DTypeKey dtype, int64_t cg, int64_t mg) {
  if (w->n != 2 || dtype != DK_DTYPE_FLOAT32 || w->dilation[0] != 1 || w->dilation[1] != 1) return false;
  int64_t taps = w->kernel[0] * w->kernel[1], plane = w->grid[0] * w->grid[1];
  /* 1x1 kernels: a GEMM on the image (or its im2col copy) is as fast */
  if (taps == 1 || taps > DIRECT_MAX_TAPS) return false;
  if (cg * taps <= DIRECT_MAX_ROWS && mg <= DIRECT_MAX_FILTERS && plane <= DIRECT_MAX_PLANE) return true;
  bool strided = w->stride[0] != 1 || w->stride[1] != 1;
  return strided && direct_wide() && cg * taps <= DIRECT_WIDE_MAX_ROWS && mg <= DIRECT_WIDE_MAX_FILTERS &&
         plane <= DIRECT_WIDE_MAX_PLANE;
}

/* to[j] = from[2 * j]: the rows of stride-2 planes (the direct path's
 * phase planes, the register blocks' shift planes) as vector shuffles. */
DKS_VECTOR_CLONES static void gather_even(float *to, const float *from, int64_t n) {
  for (int64_t j = 0; j < n; j++) to[j] = from[2 * j];
}

void linalg_padded_row(float *dst, const float *plane, int64_t h, int64_t wd, int64_t iy, int64_t x0,
                       int64_t step, int64_t count) {
  int64_t lo, hi; /* columns [lo, hi) lie inside the plane */
  linalg_valid_range(x0, step, count, wd, &lo, &hi);
  if (iy < 0 || iy >= h) lo = hi = count;
  memset(dst, 0, (size_t)lo * sizeof *dst);
  if (hi > lo) {
    const float *first = plane + iy * wd + x0 + lo * step; /* under column lo */
    if (step == 1)
      memcpy(dst + lo, first, (size_t)(hi - lo) * sizeof *dst);
    else if (step == 2)
      gather_even(dst + lo, first, hi - lo);
    else
      for (int64_t c = 0; c < hi - lo; c++) dst[lo + c] = first[c * step];
  }
  memset(dst + hi, 0, (size_t)(count - hi) * sizeof *dst);
}

#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)
#include <immintrin.h>
/* dst[c] = row[2 * c] for c in [0, n): a stride-2 phase row in vectors of
 * 16 (two loads, one permute), reading no element past row[2 * n - 2]. On
 * the zoo resnet's 3x3/2 layer (rows of 8) the scalar copy took as long as
 * the sums. */
#define DIRECT_EVEN_512
__attribute__((target("avx512f"))) static void copy_even_512(float *dst, const float *row, int64_t n) {
  const __m512i even = _mm512_setr_epi32(0, 2, 4, 6, 8, 10, 12, 14, 16, 18, 20, 22, 24, 26, 28, 30);
  for (int64_t c = 0; c < n; c += 16) {
    int64_t m = n - c < 16 ? n - c : 16, reads = 2 * m - 1;
    __mmask16 first = reads >= 16 ? 0xffff : (__mmask16)((1u << reads) - 1);
    __mmask16 second = reads > 16 ? (__mmask16)((1u << (reads - 16)) - 1) : 0;
    __m512 v = _mm512_permutex2var_ps(_mm512_maskz_loadu_ps(first, row + 2 * c), even,
                                      _mm512_maskz_loadu_ps(second, row + 2 * c + 16));
    _mm512_mask_storeu_ps(dst + c, (__mmask16)((1u << m) - 1), v);
  }
}
#endif

/* The phase planes of channels [begin, end) (over images and channels).
 * A phase's columns inside the plane are the same for each of its rows, so
 * they are found once per call; the rows are copied inline (a strided
 * layer's rows are a few floats: a call per row, its bounds' divisions and
 * the memsets cost more than the copy). */
static void direct_pack_inputs(void *arg, int64_t begin, int64_t end) {
  direct_job *j = arg;
  int64_t phases_h = j->phases / j->phases_w, lo[DIRECT_MAX_TAPS], hi[DIRECT_MAX_TAPS];
#ifdef DIRECT_EVEN_512
  bool even_512 = j->sw == 2 && __builtin_cpu_supports("avx512f");
#endif
  for (int64_t rx = 0; rx < j->phases_w; rx++) linalg_valid_range(rx - j->pad_w, j->sw, j->pw, j->wd, &lo[rx], &hi[rx]);
  for (int64_t i = begin; i < end; i++) {
    const float *src = j->x + i * j->h * j->wd;
    for (int64_t ry = 0; ry < phases_h; ry++)
      for (int64_t rx = 0; rx < j->phases_w; rx++) {
        float *dst = j->xp + (i * j->phases + ry * j->phases_w + rx) * j->plane;
        int64_t x0 = rx - j->pad_w, a = lo[rx], b = hi[rx];
        for (int64_t r = 0; r < j->ph; r++, dst += j->pw) {
          int64_t iy = r * j->sh + ry - j->pad_h;
          if (iy < 0 || iy >= j->h || a == b) {
            memset(dst, 0, (size_t)j->pw * sizeof *dst);
            continue;
          }
          const float *row = src + iy * j->wd;
          for (int64_t c = 0; c < a; c++) dst[c] = 0.0f;
          if (j->sw == 1)
            memcpy(dst + a, row + x0 + a, (size_t)(b - a) * sizeof *dst);
#ifdef DIRECT_EVEN_512
          else if (even_512)
            copy_even_512(dst + a, row + x0 + 2 * a, b - a);
#endif
          else if (j->sw == 2 && b - a >= 32)
            gather_even(dst + a, row + x0 + 2 * a, b - a);
          else
            for (int64_t c = a; c < b; c++) dst[c] = row[x0 + c * j->sw];
          for (int64_t c = b; c < j->pw; c++) dst[c] = 0.0f;
        }
        memset(dst, 0, (size_t)(j->plane - j->ph * j->pw) * sizeof *dst); /* the slack */
      }
  }
}

/* out[m][q] for q in [0, count) (a multiple of DIRECT_LANES), m <
 * DIRECT_MB, out_step apart: the sums over cg channels (channel_step
 * apart from xc) and the taps (offsets from position q) of the filters at
 * wb, [c][tap][m]; MADD(acc, w, v) adds w * v to acc. */
#define DIRECT_BLOCK(NAME, ATTRIBUTES, MADD)                                                           \
  ATTRIBUTES static void NAME(const float *xc, int64_t channel_step, int64_t cg, const int64_t *offset, \
                              int64_t taps, const float *wb, float *out, int64_t out_step, int64_t count) { \
    for (int64_t q = 0; q < count; q += DIRECT_LANES) {                                                \
      direct_vec acc[DIRECT_MB][DIRECT_VECS] = {{{0}}};                                                \
      const float *wk = wb;                                                                            \
      for (int64_t c = 0; c < cg; c++) {                                                               \
        const float *xq = xc + c * channel_step + q;                                                   \
        for (int64_t t = 0; t < taps; t++, wk += DIRECT_MB) {                                          \
          direct_vec v[DIRECT_VECS];                                                                   \
          for (int i = 0; i < DIRECT_VECS; i++) memcpy(&v[i], xq + offset[t] + i * DIRECT_VEC, sizeof v[i]); \
          for (int m = 0; m < DIRECT_MB; m++) {                                                        \
            float w = wk[m];                                                                           \
            direct_vec weight = {w, w, w, w, w, w, w, w};                                              \
            for (int i = 0; i < DIRECT_VECS; i++) acc[m][i] = MADD(acc[m][i], weight, v[i]);            \
          }                                                                                            \
        }                                                                                              \
      }                                                                                                \
      for (int m = 0; m < DIRECT_MB; m++)                                                              \
        for (int i = 0; i < DIRECT_VECS; i++)                                                          \
          memcpy(out + m * out_step + q + i * DIRECT_VEC, &acc[m][i], sizeof acc[m][i]);               \
    }                                                                                                  \
  }

#define DIRECT_MUL_ADD(acc, w, v) ((acc) + (w) * (v))
DIRECT_BLOCK(direct_block_plain, DKS_VECTOR_CLONES, DIRECT_MUL_ADD)

/* Where the CPU fuses multiply-adds (x86-64 with AVX2 and FMA), a clone
 * that does: half the vector operations, and a closer sum (one rounding per
 * product and add), which the other paths' BLAS products also use there. */
#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)
#define DIRECT_FUSED(acc, w, v) __builtin_ia32_vfmaddps256((w), (v), (acc))
DIRECT_BLOCK(direct_block_fused, __attribute__((target("avx2,fma"))), DIRECT_FUSED)

/* Where the CPU has AVX-512: DIRECT_MB_512 filters by VECS vectors of 16
 * positions (24 accumulators at 3: the AVX2 block's 8 take 2 vector loads
 * and 4 broadcasts per 8 multiply-adds, this one 3 and 8 per 24), each sum
 * in the same order with fused multiply-adds as the AVX2 block's (the same
 * sums, bit for bit). */
#define DIRECT_MB_512 8
#define DIRECT_LANES_512 48 /* positions per block */
#define DIRECT_BLOCK_512(NAME, VECS)                                                                   \
  __attribute__((target("avx512f"))) static void NAME(const float *xq, int64_t channel_step, int64_t cg, \
                                                      const int64_t *offset, int64_t taps, const float *wb, \
                                                      float *out, int64_t out_step) {                  \
    __m512 acc[DIRECT_MB_512][VECS];                                                                   \
    for (int m = 0; m < DIRECT_MB_512; m++)                                                            \
      for (int i = 0; i < VECS; i++) acc[m][i] = _mm512_setzero_ps();                                  \
    const float *wk = wb;                                                                              \
    for (int64_t c = 0; c < cg; c++) {                                                                 \
      const float *xc = xq + c * channel_step;                                                         \
      for (int64_t t = 0; t < taps; t++, wk += DIRECT_MB_512) {                                        \
        __m512 v[VECS];                                                                                \
        for (int i = 0; i < VECS; i++) v[i] = _mm512_loadu_ps(xc + offset[t] + 16 * i);                \
        for (int m = 0; m < DIRECT_MB_512; m++) {                                                      \
          __m512 weight = _mm512_set1_ps(wk[m]);                                                       \
          for (int i = 0; i < VECS; i++) acc[m][i] = _mm512_fmadd_ps(weight, v[i], acc[m][i]);         \
        }                                                                                              \
      }                                                                                                \
    }                                                                                                  \
    for (int m = 0; m < DIRECT_MB_512; m++)                                                            \
      for (int i = 0; i < VECS; i++) _mm512_storeu_ps(out + m * out_step + 16 * i, acc[m][i]);         \
  }
DIRECT_BLOCK_512(direct_block_512_3, 3)
DIRECT_BLOCK_512(direct_block_512_2, 2)
DIRECT_BLOCK_512(direct_block_512_1, 1)

/* count (a multiple of DIRECT_LANES, 16) in blocks of DIRECT_LANES_512, then one of the rest. */
static void direct_block_avx512(const float *xc, int64_t channel_step, int64_t cg, const int64_t *offset,
                                int64_t taps, const float *wb, float *out, int64_t out_step, int64_t count) {
  int64_t q = 0;
  for (; q + DIRECT_LANES_512 <= count; q += DIRECT_LANES_512)
    direct_block_512_3(xc + q, channel_step, cg, offset, taps, wb, out + q, out_step);
  if (count - q == 32) direct_block_512_2(xc + q, channel_step, cg, offset, taps, wb, out + q, out_step);
  if (count - q == 16) direct_block_512_1(xc + q, channel_step, cg, offset, taps, wb, out + q, out_step);
}

static bool direct_wide(void) { return __builtin_cpu_supports("avx512f"); }

static void direct_block(const float *xc, int64_t channel_step, int64_t cg, const int64_t *offset, int64_t taps,
                         const float *wb, float *out, int64_t out_step, int64_t count) {
  if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma"))
    direct_block_fused(xc, channel_step, cg, offset, taps, wb, out, out_step, count);
  else
    direct_block_plain(xc, channel_step, cg, offset, taps, wb, out, out_step, count);
}
#else
#define direct_block direct_block_plain
#define DIRECT_MB_512 DIRECT_MB
#define DIRECT_LANES_512 DIRECT_LANES
#define direct_block_avx512 direct_block_plain /* never called: direct_wide() is false */
static bool direct_wide(void) { return false; }
#endif

/* y[i] = sums[i] + bias: a row of the sums into Y, in vectors (the zoo
 * resnet's 32x32 stem spent about half its sums' time here in 4-wide ones). */
DKS_VECTOR_CLONES static void add_bias_row(float *y, const float *sums, float bias, int64_t n) {
  for (int64_t i = 0; i < n; i++) y[i] = sums[i] + bias;
}

/* Parts [begin, end): (image, span of flat positions, filter block): the
 * filter blocks of a span run one after another, on its inputs while they
 * are in cache (on a large plane the phase planes are not). */
static void direct_parts(void *arg, int64_t begin, int64_t end) {
  direct_job *j = arg;
  float *out = malloc((size_t)(j->mb * j->span) * sizeof *out);
  if (!out) {
    atomic_store(&j->failed, true);
    return;
  }
  int64_t positions = j->oh * j->pw;
  for (int64_t i = begin; i < end; i++) {
    int64_t mi = i % j->mblocks, span = i / j->mblocks % j->spans, image = i / j->mblocks / j->spans;
    int64_t g = image % j->group, n = image / j->group;
    int64_t q0 = span * j->span, q1 = positions - q0 < j->span ? positions : q0 + j->span;
    int64_t m0 = mi * j->mb, mb = j->mg - m0 < j->mb ? j->mg - m0 : j->mb;
    const float *xc = j->xp + (n * j->x_channels + g * j->cg) * j->phases * j->plane + q0;
    const float *wb = j->wp + (g * j->mblocks + mi) * j->cg * j->taps * j->mb;
    (j->mb == DIRECT_MB ? direct_block : direct_block_avx512)(xc, j->phases * j->plane, j->cg, j->offset, j->taps, wb, out, j->span,
                 linalg_ceil_div(q1 - q0, DIRECT_LANES) * DIRECT_LANES);
    /* the outputs among flat positions [q0, q1), row by row */
    for (int64_t m = 0; m < mb; m++) {
      int64_t channel = n * j->y_channels + g * j->mg + m0 + m;
      float bias = j->b ? j->b[g * j->mg + m0 + m] : 0.0f, *y = j->y + channel * j->oh * j->ow;
      int64_t first = -1, last = 0; /* the outputs written: one run of y (rows between are whole) */
      for (int64_t oy = q0 / j->pw; oy * j->pw < q1; oy++) {
        int64_t lo = q0 - oy * j->pw > 0 ? q0 - oy * j->pw : 0;
        int64_t hi = q1 - oy * j->pw < j->ow ? q1 - oy * j->pw : j->ow;
        const float *src = out + m * j->span + oy * j->pw - q0;
        if (hi > lo) add_bias_row(y + oy * j->ow + lo, src + lo, bias, hi - lo);
        if (lo < hi) first = first < 0 ? oy * j->ow + lo : first, last = oy * j->ow + hi;
      }
      if (first >= 0) conv_epilogue_apply(&j->rest, y + first, g * j->mg + m0 + m, 1, last - first, j->ow);
    }
  }
  free(out);
}

int64_t linalg_conv_direct_filter_block(void) { return direct_wide() ? DIRECT_MB_512 : DIRECT_MB; }

DK_Status linalg_conv_direct(const dks_kernel_args *k, const dks_tensor *x, const dks_tensor *wt,
                             const dks_tensor *b, const dks_tensor *y, const linalg_window *w, int64_t group) {
  direct_job j = {.group = group, .cg = x->shape[1] / group, .mg = y->shape[1] / group,
                  .x_channels = x->shape[1], .y_channels = y->shape[1], .h = w->target[0], .wd = w->target[1],
                  .oh = w->grid[0], .ow = w->grid[1], .sh = w->stride[0], .sw = w->stride[1],
                  .pad_h = w->pad[0], .pad_w = w->pad[1], .kh = w->kernel[0], .kw = w->kernel[1],
                  .x = (const float *)x->data, .wt = (const float *)wt->data,
                  .b = b ? (const float *)b->data : NULL, .y = (float *)y->data};
  atomic_init(&j.failed, false);
  j.rest = conv_epilogue_without_bias(k);
  j.taps = j.kh * j.kw;
  j.phases_w = j.sw < j.kw ? j.sw : j.kw;
  j.phases = (j.sh < j.kh ? j.sh : j.kh) * j.phases_w;
  j.ph = j.oh + (j.kh - 1) / j.sh;
  j.pw = j.ow + (j.kw - 1) / j.sw;
  /* A block past the last row reads up to DIRECT_LANES - 1 positions and the
   * furthest tap's shift beyond it. */
  j.plane = j.ph * j.pw + DIRECT_LANES + (j.kw - 1) / j.sw;
  for (int64_t t = 0; t < j.taps; t++) {
    int64_t ky = t / j.kw, kx = t % j.kw;
    j.offset[t] = ((ky % j.sh) * j.phases_w + kx % j.sw) * j.plane + ky / j.sh * j.pw + kx / j.sw;
  }
  j.mb = linalg_conv_direct_filter_block();
  j.mblocks = linalg_ceil_div(j.mg, j.mb);
  int64_t position_macs = j.mb * j.cg * j.taps, images = x->shape[0] * group;
  int64_t positions = linalg_ceil_div(j.oh * j.pw, DIRECT_LANES) * DIRECT_LANES;
  int64_t lanes = j.mb == DIRECT_MB ? DIRECT_LANES : DIRECT_LANES_512; /* whole blocks per part */
  j.span = linalg_ceil_div(linalg_ceil_div(DIRECT_PART_MACS, position_macs), lanes) * lanes;
  if (j.span > positions) j.span = positions;
  j.spans = linalg_ceil_div(j.oh * j.pw, j.span);

  int64_t channels = x->shape[0] * x->shape[1];
  j.xp = malloc((size_t)(channels * j.phases * j.plane) * sizeof *j.xp);
  /* W prepared (wt->prepared_bytes: its data are wp, linalg_conv_filter_blocks') or packed here */
  bool prepared = wt->prepared_bytes != 0;
  j.wp = prepared ? (float *)wt->data : malloc((size_t)(group * j.mblocks * j.cg * j.taps * j.mb) * sizeof *j.wp);
  if (!j.xp || !j.wp) {
    free(j.xp);
    if (!prepared) free(j.wp);
    return dks_kernel_fail(k, DK_RESOURCE_EXHAUSTED, "out of host memory for the direct convolution's copies");
  }
  if (!prepared) linalg_conv_filter_blocks(j.wt, group, j.mg, j.cg * j.taps, j.mb, j.wp);
  dks_parallel_for(channels, linalg_ceil_div(1 << 15, j.phases * j.plane), direct_pack_inputs, &j);
  int64_t parts = images * j.mblocks * j.spans, part_macs = position_macs * j.span;
  dks_parallel_for(parts, linalg_ceil_div(DIRECT_CHUNK_MACS, part_macs), direct_parts, &j);
  free(j.xp);
  if (!prepared) free(j.wp);
  if (atomic_load(&j.failed))
    return dks_kernel_fail(k, DK_RESOURCE_EXHAUSTED, "out of host memory for a thread's output block");
  return DK_OK;
}
