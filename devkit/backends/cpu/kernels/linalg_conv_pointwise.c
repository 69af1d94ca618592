/*
 * linalg_conv_pointwise.c -- float32 2-D Conv with a 1x1 kernel and no
 * padding (ResNet's bottleneck and downsampling layers, strides 1 and 2):
 * y[m][p] = sum over c of W[m][c] * x[c][p * stride], summed by an AVX2
 * register block of PW_MB output channels by PW_NV output positions (12
 * accumulators), each weight broadcast from W's rows as stored and each
 * input row read with unit strides: no GEMM call, whose packing and split
 * cost about as much as the product at these sizes (64 to 512 input
 * channels: OpenBLAS reached 0.75x onnxruntime's speed on the 56x56 layer,
 * 0.65-0.77x on the stride-2 ones). On one thread of a Zen 4 it sums at
 * about 90% of the FMA peak (the 56x56 layer: 1.0 ms for 51 M
 * multiply-adds); an AVX-512 block of 6 by 32 (two panel blocks, half the
 * instructions) measured within 2% of it on every ResNet 1x1 layer, the
 * 512-bit FMAs being two 256-bit halves there.
 *
 * The output positions of each image and group are cut into bands; a
 * band's inputs are gathered into a panel, [block][c][lane] (PW_NV
 * positions a block, zero past the plane), which the register blocks read
 * with unit strides. One hand-off to the pool covers it all: its items,
 * claimed one at a time, are (image and group, run of filter blocks, band)
 * products. A band of one run packs its panel as its product starts (in
 * cache for it); runs of one band share its panel, packed by items claimed
 * before the products (a run of its channels each, one a thread), a product
 * waiting for its band's packs (claimed earlier, so in progress) when they
 * are not done yet. Each sum runs in channel order with fused
 * multiply-adds, as the BLAS products of the other paths do here, within
 * the op's dot-product tolerance; a non-finite input reaches the outputs
 * that read it, as there. The epilogue (B, Z, the activation) runs on each
 * block of filters of a band while it is in cache.
 */
#include "linalg_conv_pointwise.h"

#include <sched.h>
#include <stdatomic.h>
#include <stdlib.h>

#define PW_MB 6  /* output channels per register block */
#define PW_NV 16 /* output positions per register block: two vectors of 8 */
/* The blocking (a build may change the values, -D, to compare them).
 * Measured on a loaded 2-core Zen 4, two threads, so within about 10%:
 * 64 KB panels beat 16 KB ones by 5-10% on ResNet's 1x1 layers (32 KB
 * ones, about the L1 size, were 1.3x slower with 256 channels); 4 products
 * a thread matched or beat 2 and 8. */
/* A band's panel (its input channels by its positions) stays in L2 while
 * its filter blocks run through it. */
#ifndef PW_PANEL_BYTES
#define PW_PANEL_BYTES ((int64_t)64 << 10)
#endif
/* Channels the packing prefetches ahead (pw_pack). */
#define PW_PREFETCH 2
/* A plane whose panel is at most this large is one band: each band reads
 * all the filters' weights (ResNet's 28x28 downsampling layer: 128 KB for
 * 196 positions, measured 1.15x faster whole than in two bands). */
#define PW_PLANE_BYTES ((int64_t)256 << 10)
/* A band spans at most this many positions: a block of filters' outputs
 * for it stays in L1 for the epilogue. */
#define PW_MAX_BAND 512
/* Bands cut for more products keep at least this many positions before
 * runs of filters share them: a band of one run packs its own panel, in
 * cache, and waits for no pack (ResNet's 56x56 stride-2 layer, 2 threads:
 * 8 bands of 112 positions about 1.1x faster than 4 bands in 2 runs). */
#define PW_MIN_BAND 64
/* Products per thread, when there are enough positions and filters: a
 * thread the OS delays (the machine is shared) holds the others up by at
 * most one product at the end. */
#ifndef PW_ITEMS_PER_THREAD
#define PW_ITEMS_PER_THREAD 4
#endif
/* A Conv of fewer multiply-adds runs on the calling thread: a hand-off to
 * the pool costs about as much. */
#ifndef PW_SPLIT_MACS
#define PW_SPLIT_MACS ((int64_t)1 << 19)
#endif

typedef struct pw_job {
  int64_t group, cg, mg, x_channels, y_channels, wd, ow, sh, sw;
  int64_t in_plane, positions;      /* an input and an output plane's elements */
  int64_t band, bands, mrun, mruns; /* positions per band (whole blocks) and bands; filters per run and runs */
  int64_t panels, parts, items;     /* shared panels (image and group, band), packs a panel; all items */
  atomic_int_fast64_t next;         /* the next item not yet claimed */
  const float *x, *wt;
  float *y;
  const conv_epilogue *ep;
  float *panel;       /* with runs of filters: the bands' panels, [image and group][band][block][c][lane] */
  atomic_int_fast64_t *ready; /* per shared panel: its packs done */
  atomic_bool failed; /* a member could not allocate its panel */
} pw_job;

/* A run of a band's panel: lanes [to, to + len) of the panel (as offsets
 * of channel 0's) hold the plane's elements from + i * sw, i < len. */
typedef struct pw_run {
  int64_t to, from, len;
} pw_run;

/* The runs of the band's positions [p0, p0 + count): within a block of
 * PW_NV, along output rows, merged where the next row continues the source
 * (unit strides: one run a block). Returns how many. */
static int64_t pw_runs(const pw_job *j, int64_t p0, int64_t count, pw_run *runs) {
  int64_t n = 0;
  for (int64_t q = 0; q < count;) {
    int64_t oy = (p0 + q) / j->ow, ox = (p0 + q) % j->ow, lane = q % PW_NV;
    int64_t len = PW_NV - lane;
    if (len > j->ow - ox) len = j->ow - ox;
    if (len > count - q) len = count - q;
    int64_t to = q / PW_NV * j->cg * PW_NV + lane, from = oy * j->sh * j->wd + ox * j->sw;
    if (n > 0 && lane > 0 && runs[n - 1].from + runs[n - 1].len * j->sw == from)
      runs[n - 1].len += len;
    else
      runs[n++] = (pw_run){.to = to, .from = from, .len = len};
    q += len;
  }
  return n;
}

#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)
#include <immintrin.h>

/* c[i][q] = sum over k < count of w[i * ldw + k] * x[k * PW_NV + q] for
 * rows i < rows (<= PW_MB; the rows past it repeat the last and are not
 * stored) and positions q < 8 * VECS: x is a block of the panel. */
#define PW_BLOCK(NAME, VECS)                                                                              \
  __attribute__((target("avx2,fma"))) static void NAME(const float *x, int64_t count, const float *w,     \
                                                       int64_t ldw, int64_t rows, float *c, int64_t ldc) { \
    const float *wr[PW_MB];                                                                               \
    for (int i = 0; i < PW_MB; i++) wr[i] = w + (i < rows ? i : rows - 1) * ldw;                          \
    __m256 acc[PW_MB][VECS];                                                                              \
    _Pragma("GCC unroll 6") for (int i = 0; i < PW_MB; i++)                                               \
      _Pragma("GCC unroll 2") for (int v = 0; v < VECS; v++) acc[i][v] = _mm256_setzero_ps();            \
    for (int64_t k = 0; k < count; k++, x += PW_NV) {                                                     \
      __m256 in[VECS];                                                                                    \
      _Pragma("GCC unroll 2") for (int v = 0; v < VECS; v++) in[v] = _mm256_loadu_ps(x + 8 * v);          \
      _Pragma("GCC unroll 6") for (int i = 0; i < PW_MB; i++) {                                           \
        __m256 weight = _mm256_broadcast_ss(wr[i] + k);                                                   \
        _Pragma("GCC unroll 2") for (int v = 0; v < VECS; v++)                                            \
          acc[i][v] = _mm256_fmadd_ps(weight, in[v], acc[i][v]);                                          \
      }                                                                                                   \
    }                                                                                                     \
    _Pragma("GCC unroll 6") for (int i = 0; i < PW_MB; i++) if (i < rows)                                 \
      _Pragma("GCC unroll 2") for (int v = 0; v < VECS; v++) _mm256_storeu_ps(c + i * ldc + 8 * v, acc[i][v]); \
  }
PW_BLOCK(pw_block, 2)
PW_BLOCK(pw_block_8, 1) /* a band's last block of at most 8 positions (7x7 planes: 1 of 49) */

/* The band's panel, [block][c][lane]: lane q % PW_NV of block q / PW_NV
 * holds x[c][oy * sh][ox * sw] for the band's position q (output position
 * p0 + q = oy * ow + ox); 0 past the band's `count` positions. Unit and
 * stride-2 columns copy 8 lanes at a time (stride 2: two loads and a
 * shuffle, where the loads stay inside the plane). The rows the band
 * reads of channel c + PW_PREFETCH are prefetched while channel c is
 * copied: a band reads a few short rows a channel, too few for the
 * hardware prefetchers (ResNet's stride-2 layers, 2 threads: 1.15-1.25x
 * faster, 1 channel ahead slower, 4 no better). */
__attribute__((target("avx2,fma"))) static void pw_pack(const pw_job *j, const float *xg, int64_t p0,
                                                        int64_t count, int64_t c0, int64_t c1, float *panel) {
  pw_run runs[PW_MAX_BAND];
  int64_t n = pw_runs(j, p0, count, runs), sw = j->sw, tail = count % PW_NV;
  float *last = panel + (count - tail) * j->cg;
  int64_t oy0 = p0 / j->ow, oy1 = (p0 + count - 1) / j->ow, span = (j->ow - 1) * sw + 1;
  for (int64_t c = c0; c < c1; c++) {
    const float *plane = xg + c * j->in_plane;
    if (c + PW_PREFETCH < j->cg) {
      const float *ahead = plane + PW_PREFETCH * j->in_plane;
      for (int64_t oy = oy0; oy <= oy1; oy++)
        for (int64_t e = 0; e < span; e += 16) __builtin_prefetch(ahead + oy * j->sh * j->wd + e, 0, 3);
    }
    float *dst = panel + c * PW_NV;
    for (int64_t r = 0; r < n; r++) {
      float *to = dst + runs[r].to;
      const float *from = plane + runs[r].from;
      int64_t i = 0, len = runs[r].len;
      if (sw == 1)
        for (; i + 8 <= len; i += 8) _mm256_storeu_ps(to + i, _mm256_loadu_ps(from + i));
      else if (sw == 2)
        for (; i + 8 <= len && runs[r].from + 2 * i + 16 <= j->in_plane; i += 8) {
          __m256 even = _mm256_shuffle_ps(_mm256_loadu_ps(from + 2 * i), _mm256_loadu_ps(from + 2 * i + 8), 0x88);
          _mm256_storeu_ps(to + i, _mm256_castpd_ps(_mm256_permute4x64_pd(_mm256_castps_pd(even), 0xd8)));
        }
      for (; i < len; i++) to[i] = from[i * sw];
    }
    if (tail) memset(last + c * PW_NV + tail, 0, (size_t)(PW_NV - tail) * sizeof *last);
  }
}

static bool pw_supported(void) { return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma"); }
#else
/* Never called: pw_supported() keeps every Conv off this path. */
static void pw_block(const float *x, int64_t count, const float *w, int64_t ldw, int64_t rows, float *c,
                     int64_t ldc) {
  (void)x, (void)count, (void)w, (void)ldw, (void)rows, (void)c, (void)ldc;
}
#define pw_block_8 pw_block
static void pw_pack(const pw_job *j, const float *xg, int64_t p0, int64_t count, int64_t c0, int64_t c1,
                    float *panel) {
  (void)j, (void)xg, (void)p0, (void)count, (void)c0, (void)c1, (void)panel;
}
static bool pw_supported(void) { return false; }
#endif

bool linalg_conv_pointwise_fits(const linalg_window *w, DK_DTypeKey dtype, int64_t cg, int64_t mg) {
  if (w->n != 2 || dtype != DK_DTYPE_FLOAT32 || cg < 1 || mg < 1 || !pw_supported()) return false;
  for (int32_t d = 0; d < 2; d++) /* every output position reads inside the input */
    if (w->kernel[d] != 1 || w->pad[d] != 0 || (w->grid[d] - 1) * w->stride[d] >= w->target[d]) return false;
  return true;
}

static int64_t pw_band_count(const pw_job *j, int64_t p0) {
  return j->positions - p0 < j->band ? j->positions - p0 : j->band;
}

static const float *pw_group_x(const pw_job *j, int64_t ng) {
  return j->x + (ng / j->group * j->x_channels + ng % j->group * j->cg) * j->in_plane;
}

/* The product of item i (past the packs): a run of filter blocks over a
 * band, whose panel is the shared one or, with one run a band, `own` packed now. */
static void pw_product(const pw_job *j, int64_t i, float *own) {
  int64_t bi = i % j->bands, ri = i / j->bands % j->mruns, ng = i / j->bands / j->mruns;
  int64_t n = ng / j->group, g = ng % j->group, panel = ng * j->bands + bi;
  int64_t p0 = bi * j->band, count = pw_band_count(j, p0);
  int64_t m0 = ri * j->mrun, m1 = m0 + j->mrun < j->mg ? m0 + j->mrun : j->mg;
  const float *wg = j->wt + (g * j->mg + m0) * j->cg, *xp = own;
  float *yg = j->y + (n * j->y_channels + g * j->mg + m0) * j->positions + p0;
  if (own) {
    pw_pack(j, pw_group_x(j, ng), p0, count, 0, j->cg, own);
  } else {
    xp = j->panel + panel * j->cg * j->band;
    while (atomic_load_explicit(&j->ready[panel], memory_order_acquire) < j->parts) sched_yield();
  }
  for (int64_t m = 0; m < m1 - m0; m += PW_MB) {
    int64_t rows = m1 - m0 - m < PW_MB ? m1 - m0 - m : PW_MB;
    const float *wm = wg + m * j->cg;
    float *ym = yg + m * j->positions;
    for (int64_t q = 0; q < count; q += PW_NV) {
      if (count - q >= PW_NV) {
        pw_block(xp + q * j->cg, j->cg, wm, j->cg, rows, ym + q, j->positions);
        continue;
      }
      float part[PW_MB * PW_NV]; /* the band's last, cut block: its lanes past the band are dropped */
      (count - q <= 8 ? pw_block_8 : pw_block)(xp + q * j->cg, j->cg, wm, j->cg, rows, part, PW_NV);
      for (int64_t r = 0; r < rows; r++)
        memcpy(ym + r * j->positions + q, part + r * PW_NV, (size_t)(count - q) * sizeof *part);
    }
    conv_epilogue_apply(j->ep, ym, g * j->mg + m0 + m, rows, count, j->positions);
  }
}

/* A member of the pool: claims items one at a time until none is left. */
static void pw_parts(void *arg, int64_t begin, int64_t end) {
  (void)begin, (void)end;
  pw_job *j = arg;
  float *own = NULL;
  if (!j->panel && !(own = malloc((size_t)(j->cg * j->band) * sizeof *own))) {
    atomic_store(&j->failed, true);
    return;
  }
  for (int64_t i; (i = atomic_fetch_add(&j->next, 1)) < j->items;) {
    if (i >= j->panels * j->parts) {
      pw_product(j, i - j->panels * j->parts, own);
      continue;
    }
    int64_t panel = i / j->parts, part = i % j->parts, p0 = panel % j->bands * j->band;
    int64_t c0 = part * j->cg / j->parts, c1 = (part + 1) * j->cg / j->parts;
    pw_pack(j, pw_group_x(j, panel / j->bands), p0, pw_band_count(j, p0), c0, c1,
            j->panel + panel * j->cg * j->band);
    atomic_fetch_add_explicit(&j->ready[panel], 1, memory_order_release);
  }
  free(own);
}

DK_Status linalg_conv_pointwise(const dks_kernel_args *k, const dks_tensor *x, const dks_tensor *wt,
                                const conv_epilogue *ep, const dks_tensor *y, const linalg_window *w,
                                int64_t group) {
  pw_job j = {.group = group, .cg = x->shape[1] / group, .mg = y->shape[1] / group, .x_channels = x->shape[1],
              .y_channels = y->shape[1], .wd = w->target[1], .ow = w->grid[1],
              .sh = w->stride[0], .sw = w->stride[1], .in_plane = w->target[0] * w->target[1],
              .positions = w->grid[0] * w->grid[1],
              .x = (const float *)x->data, .wt = (const float *)wt->data, .y = (float *)y->data, .ep = ep};
  atomic_init(&j.next, 0);
  atomic_init(&j.failed, false);
  /* Bands whose panels fit PW_PANEL_BYTES (or the whole plane, as above),
   * of even length; with fewer than PW_ITEMS_PER_THREAD products a thread,
   * on a plane of more than PW_MAX_BAND positions shorter bands (down to
   * PW_MIN_BAND), then runs of filter blocks (a band reads the filters'
   * weights once: 512 KB on ResNet's 14x14 downsampling layer), then
   * shorter bands again. */
  int64_t images = x->shape[0] * group, mblocks = linalg_ceil_div(j.mg, PW_MB);
  int64_t threads = images * j.positions * j.mg * j.cg < PW_SPLIT_MACS ? 1 : dks_thread_count();
  int64_t want = threads > 1 ? PW_ITEMS_PER_THREAD * threads : 1;
  int64_t band = PW_PANEL_BYTES / (j.cg * (int64_t)sizeof(float)) / PW_NV * PW_NV;
  if (band > PW_MAX_BAND) band = PW_MAX_BAND;
  if (band < PW_NV) band = PW_NV;
  int64_t plane_bytes = j.cg * linalg_ceil_div(j.positions, PW_NV) * PW_NV * (int64_t)sizeof(float);
  if (j.positions <= PW_MAX_BAND && plane_bytes <= PW_PLANE_BYTES) band = j.positions;
  int64_t bands = linalg_ceil_div(j.positions, band);
  if (images * bands < want && j.positions > PW_MAX_BAND) {
    int64_t shorter = linalg_ceil_div(want, images);
    if (shorter > j.positions / PW_MIN_BAND) shorter = j.positions / PW_MIN_BAND;
    if (shorter > bands) bands = shorter;
  }
  int64_t runs = linalg_ceil_div(want, images * bands);
  if (runs > mblocks) runs = mblocks;
  if (images * bands * runs < want) bands = linalg_ceil_div(want, images * runs);
  j.band = linalg_ceil_div(linalg_ceil_div(j.positions, bands), PW_NV) * PW_NV;
  j.bands = linalg_ceil_div(j.positions, j.band);
  j.mrun = linalg_ceil_div(mblocks, runs) * PW_MB;
  j.mruns = linalg_ceil_div(j.mg, j.mrun);
  /* Runs of one band share its panel, packed first; a band of one run packs
   * its own as its product starts, so the panel is in cache for it. */
  j.panels = j.mruns > 1 ? images * j.bands : 0;
  j.parts = threads; /* a shared panel's packs: runs of its channels, one a thread */
  j.items = j.panels * j.parts + images * j.mruns * j.bands;
  if (j.panels) {
    j.panel = malloc((size_t)(j.panels * j.cg * j.band) * sizeof *j.panel);
    j.ready = malloc((size_t)j.panels * sizeof *j.ready);
    if (!j.panel || !j.ready) {
      free(j.panel);
      free(j.ready);
      return dks_kernel_fail(k, DK_RESOURCE_EXHAUSTED, "out of host memory for the input panels");
    }
    for (int64_t i = 0; i < j.panels; i++) atomic_init(&j.ready[i], 0);
  }
  dks_parallel_for(threads, 1, pw_parts, &j);
  free(j.panel);
  free(j.ready);
  if (atomic_load(&j.failed))
    return dks_kernel_fail(k, DK_RESOURCE_EXHAUSTED, "out of host memory for a thread's input panel");
  return DK_OK;
}
