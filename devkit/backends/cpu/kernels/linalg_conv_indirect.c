/*
 * linalg_conv_indirect.c -- the float32 2-D Conv as an indirect product
 * (linalg_conv_indirect.h): Y^T (positions x filters) = A (positions x
 * (channel, tap) steps) @ W^T, on linalg_packed.h's AVX-512 block with the
 * output positions as its rows and the filters as its columns, in panels
 * of 16. A is not built: the image is copied once into a zero-padded plane
 * per channel, and row (position) p's element of step (c, ky, kx) lies at
 * a fixed offset from the position's first tap, so the block reads it
 * through one pointer per row and one offset per step.
 *
 * Vectorised over filters, the block uses every lane on the small planes
 * ResNet ends with (49 positions: the position-vectorised paths fill 49
 * of 64 lanes), and reads no column buffer (the strided 3x3 layers' im2col
 * wrote a 1.8 MB buffer per call). Each item, (image, group, tile of
 * positions, run of filters), sums in passes over the steps into a buffer
 * of its tile's outputs, [position][filter], which stays in L2 while each
 * pass's panel rows (INDIRECT_KC steps of a run's two panels, 32 KiB) are
 * read once per block of rows; then writes them into Y's rows (a
 * transpose) and applies the epilogue (B, Z, the activation) there. Each
 * sum runs in (channel, tap) order with fused multiply-adds, per pass,
 * within the op's dot-product tolerance; a non-finite value reaches the
 * outputs whose windows hold it, and the padding's zeros meet W as im2col's
 * do (0 * inf is NaN).
 */
#include "linalg_conv_indirect.h"

#include <stdatomic.h>
#include <stdlib.h>

#include "linalg_packed.h"
#include "linalg_transpose.h"

/* Steps per pass: a run's two panels for the pass, 32 KiB, stay in L1. */
#define INDIRECT_KC LINALG_CONV_PASS
/* Filters per item: the packed block's two panels. */
#define INDIRECT_RUN (2 * PACKED_PANEL)
/* Positions per tile, at most: the tile's outputs for a run (28 KiB).
 * ResNet-18's 3x3/2 layer onto 28x28 (784 positions, 4 runs): 0.90-0.95x
 * the time of tiles of 112 (fewer reads of each run's panels, fewer
 * items' fixed costs); the stem and the 14x14 outputs within 2%. */
#define INDIRECT_TILE 224
/* Items per thread the tiles are cut down for (to INDIRECT_MIN_TILE
 * positions), so that a thread the OS delays leaves little to the others. */
#define INDIRECT_ITEMS 4
#define INDIRECT_MIN_TILE 32

/* What goes this way (with its filters prepared): 2-D kernels of more
 * than one tap, with at least these many (channel, tap) steps and filters
 * per group, on strided windows or planes of at most INDIRECT_SMALL_PLANE
 * positions. Measured in ResNet-18 (batch 1, 2 threads, interleaved with
 * the paths they took): the 7x7/2 stem 0.78-0.95x im2col tiles' time; the
 * 3x3/2 layers 0.70-0.92x the blocked path's; the 7x7 3x3 layers
 * 0.72-0.78x (the blocked path filled 49 of 64 lanes; prepared Winograd
 * took 1.4x). 1x1/2 kernels stay on their paths (1.1-1.2x here: the padded
 * copy and the transposes cost what their few steps save), and so do
 * larger planes of unit strides, where Winograd's 16 products for 36
 * multiply-adds win (14x14 layers in the model: 1.09x Winograd's time;
 * 28x28 and 56x56 alone: 1.25-1.35x). */
#define INDIRECT_MIN_STEPS 64
#define INDIRECT_MIN_FILTERS 64
#define INDIRECT_SMALL_PLANE 64

bool linalg_conv_indirect_fits(const linalg_window *w, DK_DTypeKey dtype, int64_t cg, int64_t mg) {
  if (w->n != 2 || dtype != DK_DTYPE_FLOAT32 || !packed_block_avx512()) return false;
  int64_t taps = w->kernel[0] * w->kernel[1], positions = w->grid[0] * w->grid[1];
  bool strided = w->stride[0] != 1 || w->stride[1] != 1;
  return taps > 1 && cg * taps >= INDIRECT_MIN_STEPS && mg >= INDIRECT_MIN_FILTERS &&
         (strided || positions <= INDIRECT_SMALL_PLANE);
}

static int64_t panels_of(int64_t mg) { return linalg_ceil_div(mg, PACKED_PANEL); }

typedef struct indirect_job {
  int64_t cg, mg, x_channels, y_channels, h, wd, ow, sh, sw, pad_h, pad_w;
  int64_t hp, wp;    /* the padded planes' sizes */
  int64_t steps;     /* cg * taps */
  int64_t positions, tile, tiles, runs;
  const float *x;    /* the image */
  float *xp;         /* its padded planes, [channel][hp][wp] */
  const float *panels;
  const int64_t *offsets; /* per step (c, ky, kx): its element's offset from a position's first tap */
  const conv_epilogue *ep;
  float *y; /* the image's outputs */
  atomic_bool failed;
} indirect_job;

/* The padded planes of channels [begin, end). */
static void pad_planes(void *arg, int64_t begin, int64_t end) {
  const indirect_job *j = arg;
  for (int64_t c = begin; c < end; c++) {
    float *out = j->xp + c * j->hp * j->wp;
    for (int64_t r = 0; r < j->hp; r++, out += j->wp)
      linalg_padded_row(out, j->x + c * j->h * j->wd, j->h, j->wd, r - j->pad_h, -j->pad_w, 1, j->wp);
  }
}

#if defined(__x86_64__) && defined(__GNUC__)

/* y[m * ldy + q] = sums[q * INDIRECT_RUN + m] for m < filters, q < count:
 * a tile's sums into Y's rows, 16 x 16 at a time transposed in registers
 * (the scalar copy took a quarter of the stem's time). */
__attribute__((target("avx512f"))) static void sums_to_rows(const float *sums, int64_t count, int64_t filters,
                                                            float *y, int64_t ldy) {
  for (int64_t m0 = 0; m0 < filters; m0 += 16)
    for (int64_t q0 = 0; q0 < count; q0 += 16) {
      int64_t rows = count - q0 < 16 ? count - q0 : 16, cols = filters - m0 < 16 ? filters - m0 : 16;
      __mmask16 store = (__mmask16)((1u << rows) - 1);
      __m512 r[16];
      for (int i = 0; i < 16; i++)
        r[i] = i < rows ? _mm512_loadu_ps(sums + (q0 + i) * INDIRECT_RUN + m0) : _mm512_setzero_ps();
      linalg_transpose16(r);
      for (int j = 0; j < cols; j++) _mm512_mask_storeu_ps(y + (m0 + j) * ldy + q0, store, r[j]);
    }
}
#else
/* Never reached (linalg_conv_indirect_fits is false): the scalar copy. */
static void sums_to_rows(const float *sums, int64_t count, int64_t filters, float *y, int64_t ldy) {
  for (int64_t m = 0; m < filters; m++)
    for (int64_t q = 0; q < count; q++) y[m * ldy + q] = sums[q * INDIRECT_RUN + m];
}
#endif

/* Items [begin, end) of (group, run of filters, tile of positions): the
 * tile's sums in passes into a buffer, then into Y with the epilogue. */
static void indirect_items(void *arg, int64_t begin, int64_t end) {
  indirect_job *j = arg;
  float *sums = aligned_alloc(64, (size_t)(j->tile * INDIRECT_RUN) * sizeof(float));
  if (!sums) {
    atomic_store(&j->failed, true);
    return;
  }
  const float *rows[INDIRECT_TILE];
  for (int64_t i = begin; i < end; i++) {
    int64_t t = i % j->tiles, r = i / j->tiles % j->runs, g = i / j->tiles / j->runs;
    int64_t p0 = t * j->positions / j->tiles, count = (t + 1) * j->positions / j->tiles - p0;
    int64_t m0 = r * INDIRECT_RUN, filters = j->mg - m0 < INDIRECT_RUN ? j->mg - m0 : INDIRECT_RUN;
    const float *xg = j->xp + g * j->cg * j->hp * j->wp;
    for (int64_t q = 0, oy = p0 / j->ow, ox = p0 % j->ow; q < count; q++) {
      rows[q] = xg + oy * j->sh * j->wp + ox * j->sw;
      if (++ox == j->ow) ox = 0, oy++;
    }
    const float *panels = j->panels + (g * panels_of(j->mg) + m0 / PACKED_PANEL) * j->steps * PACKED_PANEL;
    for (int64_t k0 = 0; k0 < j->steps; k0 += INDIRECT_KC) {
      int64_t kc = j->steps - k0 < INDIRECT_KC ? j->steps - k0 : INDIRECT_KC;
      const float *next = k0 + kc < j->steps ? panels + (k0 + kc) * PACKED_PANEL : NULL;
      packed_gemm_indirect(count, filters, kc, rows, j->offsets + k0, panels + k0 * PACKED_PANEL,
                           j->steps * PACKED_PANEL, next, k0 > 0, sums, INDIRECT_RUN);
    }
    float *yt = j->y + (g * j->mg + m0) * j->positions + p0;
    sums_to_rows(sums, count, filters, yt, j->positions);
    conv_epilogue_apply(j->ep, yt, g * j->mg + m0, filters, count, j->positions);
  }
  free(sums);
}

DK_Status linalg_conv_indirect(const dks_kernel_args *k, const dks_tensor *x, const float *panels,
                               const conv_epilogue *ep, const dks_tensor *y, const linalg_window *w,
                               int64_t group) {
  indirect_job j = {.cg = x->shape[1] / group, .mg = y->shape[1] / group, .x_channels = x->shape[1],
                    .y_channels = y->shape[1], .h = w->target[0], .wd = w->target[1], .ow = w->grid[1],
                    .sh = w->stride[0], .sw = w->stride[1], .pad_h = w->pad[0], .pad_w = w->pad[1], .ep = ep};
  int64_t kh = w->kernel[0], kw = w->kernel[1], taps = kh * kw, oh = w->grid[0];
  j.hp = (oh - 1) * j.sh + (kh - 1) * w->dilation[0] + 1;
  j.wp = (j.ow - 1) * j.sw + (kw - 1) * w->dilation[1] + 1;
  j.steps = j.cg * taps;
  j.positions = oh * j.ow;
  j.runs = linalg_ceil_div(j.mg, INDIRECT_RUN);
  j.tiles = linalg_ceil_div(j.positions, INDIRECT_TILE);
  int64_t threads = dks_thread_count(), most = linalg_ceil_div(j.positions, INDIRECT_MIN_TILE);
  if (threads > 1 && group * j.runs * j.tiles < INDIRECT_ITEMS * threads) {
    int64_t want = linalg_ceil_div(INDIRECT_ITEMS * threads, group * j.runs);
    j.tiles = want < most ? want : most > j.tiles ? most : j.tiles;
  }
  j.tile = linalg_ceil_div(j.positions, j.tiles);
  atomic_init(&j.failed, false);
  float *xp = aligned_alloc(64, (size_t)(j.x_channels * j.hp * j.wp + 15) / 16 * 64);
  int64_t *offsets = malloc((size_t)j.steps * sizeof(int64_t));
  if (!xp || !offsets) {
    free(xp);
    free(offsets);
    return dks_kernel_fail(k, DK_RESOURCE_EXHAUSTED, "out of host memory for the indirect Conv's padded image");
  }
  j.panels = panels;
  j.xp = xp;
  for (int64_t c = 0, s = 0; c < j.cg; c++)
    for (int64_t t = 0; t < taps; t++, s++)
      offsets[s] = (c * j.hp + t / kw * w->dilation[0]) * j.wp + t % kw * w->dilation[1];
  j.offsets = offsets;
  for (int64_t n = 0; n < x->shape[0]; n++) { /* about 16 Ki padded elements per chunk */
    j.x = (const float *)x->data + n * j.x_channels * j.h * j.wd;
    j.y = (float *)y->data + n * j.y_channels * j.positions;
    dks_parallel_for(j.x_channels, linalg_ceil_div(1 << 14, j.hp * j.wp), pad_planes, &j);
    dks_parallel_for(group * j.runs * j.tiles, 1, indirect_items, &j);
  }
  free(xp);
  free(offsets);
  if (atomic_load(&j.failed))
    return dks_kernel_fail(k, DK_RESOURCE_EXHAUSTED, "out of host memory for a thread's sums");
  return DK_OK;
}
