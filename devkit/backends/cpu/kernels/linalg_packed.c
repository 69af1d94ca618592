/*
 * linalg_packed.c -- float32 products on a prepacked B (linalg_packed.h).
 *
 * The block kernel keeps a block of up to PACKED_ROWS rows of c times two
 * panels (32 columns) in registers over the whole k loop: per k step it
 * loads two panel rows and does 2 * rows fused multiply-adds, each with one
 * broadcast a value -- no store or reload of c until the block is done.
 * On AVX-512 it is written with intrinsics (16 accumulators of 16 floats);
 * elsewhere a portable loop of the same shape that the compiler vectorises.
 */
#include "linalg_packed.h"

#include <string.h>

#include "linalg.h"

#if defined(__x86_64__) && defined(__GNUC__)
#include <immintrin.h>
#define PACKED_X86 1
#endif

/* Rows of c one block keeps in registers: 8 x 2 panels = 16 of AVX-512's
 * 32 vector registers, leaving room for the panel rows and broadcasts. */
#define PACKED_ROWS 8
/* Products of at least this many multiply-adds are split over the pool. */
#define PACKED_SPLIT_MIN_MACS (INT64_C(1) << 18)

typedef struct packed_header {
  uint32_t tag; /* PACKED_TAG */
  uint32_t panel;
  int64_t k, n;
  uint8_t pad[40]; /* to 64 bytes: the panels start cache-line aligned */
} packed_header;
_Static_assert(sizeof(packed_header) == 64, "the panels start 64 bytes in");

#define PACKED_TAG 0x42504b44u /* "DKPB" */

static int64_t panels_of(int64_t n) { return (n + PACKED_PANEL - 1) / PACKED_PANEL; }

size_t packed_b_bytes(int64_t k, int64_t n) {
  if (k < 0 || n < 0) return 0;
  int64_t panels = panels_of(n);
  /* k * panels * PACKED_PANEL floats, overflow-checked. */
  if (panels && k > (int64_t)((SIZE_MAX - sizeof(packed_header)) / sizeof(float) / PACKED_PANEL) / panels)
    return 0;
  return sizeof(packed_header) + (size_t)k * (size_t)panels * PACKED_PANEL * sizeof(float);
}

void packed_b_pack(const float *b, int64_t row_stride, int64_t col_stride, int64_t k, int64_t n,
                   void *dst) {
  packed_header h = {.tag = PACKED_TAG, .panel = PACKED_PANEL, .k = k, .n = n};
  memcpy(dst, &h, sizeof h);
  float *out = (float *)((uint8_t *)dst + sizeof h);
  for (int64_t p = 0; p < panels_of(n); p++) {
    int64_t j0 = p * PACKED_PANEL, width = n - j0 < PACKED_PANEL ? n - j0 : PACKED_PANEL;
    for (int64_t i = 0; i < k; i++, out += PACKED_PANEL) {
      const float *row = b + i * row_stride + j0 * col_stride;
      int64_t j = 0;
      for (; j < width; j++) out[j] = row[j * col_stride];
      for (; j < PACKED_PANEL; j++) out[j] = 0.0f;
    }
  }
}

bool packed_b_check(const void *packed, size_t size, int64_t k, int64_t n) {
  packed_header h;
  if (!packed || size < sizeof h) return false;
  memcpy(&h, packed, sizeof h);
  return h.tag == PACKED_TAG && h.panel == PACKED_PANEL && h.k == k && h.n == n &&
         packed_b_bytes(k, n) != 0 && size >= packed_b_bytes(k, n);
}

/* ---- Block kernels -------------------------------------------------------- */

/* One block: `rows` rows of c (at most PACKED_ROWS) times `panels` (1 or 2)
 * panels starting at column j0, of which `width` columns are stored (and
 * read: B's lanes past them count for nothing). Row p of a panel lies
 * p * row_stride floats on from its first, the next panel panel_stride
 * floats on: PACKED_PANEL and k * PACKED_PANEL for packed panels, ldb and
 * PACKED_PANEL for a row-major B. */
typedef struct packed_block {
  int64_t k, lda, ldc, row_stride, panel_stride;
  const int64_t *offsets; /* an indirect A's, one per step (packed_gemm_indirect) */
  float alpha;
  bool accumulate;
} packed_block;

/* A's element (r, p): a[r * lda + p], or with row pointers (an indirect
 * A), rows[r][offsets[p]]. */
static void block_portable_any(const packed_block *g, int rows, int panels, int64_t width, const float *a,
                               const float *const *rp, const float *bp, float *c) {
  float acc[PACKED_ROWS][2 * PACKED_PANEL] = {{0}};
  int64_t w0 = width < PACKED_PANEL ? width : PACKED_PANEL, w1 = width - w0;
  for (int64_t p = 0; p < g->k; p++) {
    const float *b0 = bp + p * g->row_stride, *b1 = b0 + g->panel_stride;
    for (int r = 0; r < rows; r++) {
      float av = rp ? rp[r][g->offsets[p]] : a[r * g->lda + p];
      for (int j = 0; j < w0; j++) acc[r][j] += av * b0[j];
      if (panels == 2)
        for (int j = 0; j < w1; j++) acc[r][PACKED_PANEL + j] += av * b1[j];
    }
  }
  for (int r = 0; r < rows; r++)
    for (int64_t j = 0; j < width; j++) {
      float v = g->alpha * acc[r][j];
      c[r * g->ldc + j] = g->accumulate ? c[r * g->ldc + j] + v : v;
    }
}

static void block_portable(const packed_block *g, int rows, int panels, int64_t width, const float *a,
                           const float *bp, float *c) {
  block_portable_any(g, rows, panels, width, a, NULL, bp, c);
}

static void block_portable_indirect(const packed_block *g, int rows, int panels, int64_t width,
                                    const float *const *rp, const float *prefetch, const float *bp, float *c) {
  (void)prefetch; /* a hint the portable loop goes without */
  block_portable_any(g, rows, panels, width, NULL, rp, bp, c);
}

#ifdef PACKED_X86
/* The AVX-512 block for a compile-time ROWS, A's addressing and
 * prefetching (the switches below instantiate 1..PACKED_ROWS of each, so
 * the accumulators and an indirect A's row pointers stay in registers, and
 * no test is left in the loop). With `prefetching`, `pf`: panels laid out
 * as B's, of which a row of each of the block's two is prefetched a step. */
static inline __attribute__((always_inline, target("avx512f"))) void block_avx512_rows(
    const packed_block *g, const int rows, const bool indirect, const bool prefetching, int panels,
    int64_t width, const float *a, const float *const *rows_in, const float *pf, const float *bp, float *c) {
  __m512 acc0[PACKED_ROWS], acc1[PACKED_ROWS];
  const float *rp[PACKED_ROWS];
#pragma GCC unroll 8
  for (int r = 0; r < rows; r++) {
    acc0[r] = acc1[r] = _mm512_setzero_ps();
    rp[r] = indirect ? rows_in[r] : NULL;
  }
  const int64_t *offsets = g->offsets;
  /* row r's element of step p (an indirect A's offset `off` loaded once a step) */
#define A_AT(r, p, off) (indirect ? rp[r][off] : a[(r) * g->lda + (p)])
  int64_t row_stride = g->row_stride;
  const float *bp1 = bp + g->panel_stride;
  /* masked loads where the block is cut: a row-major B's last columns end
   * where its rows do (whole blocks keep plain loads: GPT's 128 x 1024 x
   * 256 products 0.94x the time of masked ones with all lanes set) */
  __mmask16 mask0 = width >= PACKED_PANEL ? (__mmask16)0xffff : (__mmask16)((1u << width) - 1);
  __mmask16 mask1 = width >= 2 * PACKED_PANEL ? (__mmask16)0xffff
                    : width > PACKED_PANEL    ? (__mmask16)((1u << (width - PACKED_PANEL)) - 1)
                                              : (__mmask16)0;
  if (width == 2 * PACKED_PANEL) { /* whole panels (most blocks): plain loads */
    for (int64_t p = 0; p < g->k; p++) {
      int64_t off = indirect ? offsets[p] : 0;
      if (prefetching) {
        _mm_prefetch((const char *)(pf + p * row_stride), _MM_HINT_T0);
        _mm_prefetch((const char *)(pf + g->panel_stride + p * row_stride), _MM_HINT_T0);
      }
      __m512 b0 = _mm512_loadu_ps(bp + p * row_stride);
      __m512 b1 = _mm512_loadu_ps(bp1 + p * row_stride);
#pragma GCC unroll 8
      for (int r = 0; r < rows; r++) {
        __m512 av = _mm512_set1_ps(A_AT(r, p, off));
        acc0[r] = _mm512_fmadd_ps(av, b0, acc0[r]);
        acc1[r] = _mm512_fmadd_ps(av, b1, acc1[r]);
      }
    }
  } else if (panels == 2) {
    for (int64_t p = 0; p < g->k; p++) {
      int64_t off = indirect ? offsets[p] : 0;
      __m512 b0 = _mm512_maskz_loadu_ps(mask0, bp + p * row_stride);
      __m512 b1 = _mm512_maskz_loadu_ps(mask1, bp1 + p * row_stride);
#pragma GCC unroll 8
      for (int r = 0; r < rows; r++) {
        __m512 av = _mm512_set1_ps(A_AT(r, p, off));
        acc0[r] = _mm512_fmadd_ps(av, b0, acc0[r]);
        acc1[r] = _mm512_fmadd_ps(av, b1, acc1[r]);
      }
    }
  } else {
    for (int64_t p = 0; p < g->k; p++) {
      int64_t off = indirect ? offsets[p] : 0;
      __m512 b0 = _mm512_maskz_loadu_ps(mask0, bp + p * row_stride);
#pragma GCC unroll 8
      for (int r = 0; r < rows; r++)
        acc0[r] = _mm512_fmadd_ps(_mm512_set1_ps(A_AT(r, p, off)), b0, acc0[r]);
    }
  }
#undef A_AT
  /* each accumulator named by a constant index: one picked at run time
   * (acc1 or acc0 by panel) kept them all on the stack, stored and
   * reloaded at every step of the k loop */
  __m512 alpha = _mm512_set1_ps(g->alpha);
#pragma GCC unroll 8
  for (int r = 0; r < rows; r++) {
    float *out = c + r * g->ldc;
    __m512 v = _mm512_mul_ps(alpha, acc0[r]);
    if (g->accumulate) v = _mm512_add_ps(v, _mm512_maskz_loadu_ps(mask0, out));
    _mm512_mask_storeu_ps(out, mask0, v);
    if (mask1) {
      v = _mm512_mul_ps(alpha, acc1[r]);
      if (g->accumulate) v = _mm512_add_ps(v, _mm512_maskz_loadu_ps(mask1, out + PACKED_PANEL));
      _mm512_mask_storeu_ps(out + PACKED_PANEL, mask1, v);
    }
  }
}

static __attribute__((target("avx512f"))) void block_avx512(const packed_block *g, int rows, int panels,
                                                             int64_t width, const float *a,
                                                             const float *bp, float *c) {
  switch (rows) {
#define ROWS_CASE(R) \
  case R: block_avx512_rows(g, R, false, false, panels, width, a, NULL, NULL, bp, c); break;
    ROWS_CASE(1) ROWS_CASE(2) ROWS_CASE(3) ROWS_CASE(4)
    ROWS_CASE(5) ROWS_CASE(6) ROWS_CASE(7) ROWS_CASE(8)
#undef ROWS_CASE
  }
}

static __attribute__((target("avx512f"))) void block_avx512_indirect(const packed_block *g, int rows, int panels,
                                                                      int64_t width, const float *const *rp,
                                                                      const float *prefetch, const float *bp,
                                                                      float *c) {
  switch (rows) {
#define ROWS_CASE(R)                                                                   \
  case R:                                                                              \
    if (prefetch)                                                                      \
      block_avx512_rows(g, R, true, true, panels, width, NULL, rp, prefetch, bp, c);   \
    else                                                                               \
      block_avx512_rows(g, R, true, false, panels, width, NULL, rp, NULL, bp, c);      \
    break;
    ROWS_CASE(1) ROWS_CASE(2) ROWS_CASE(3) ROWS_CASE(4)
    ROWS_CASE(5) ROWS_CASE(6) ROWS_CASE(7) ROWS_CASE(8)
#undef ROWS_CASE
  }
}
#endif

typedef void (*block_fn)(const packed_block *, int, int, int64_t, const float *, const float *, float *);
typedef void (*indirect_block_fn)(const packed_block *, int, int, int64_t, const float *const *, const float *,
                                  const float *, float *);

bool packed_block_avx512(void) {
#ifdef PACKED_X86
  return __builtin_cpu_supports("avx512f");
#else
  return false;
#endif
}

static block_fn pick_block(void) {
#ifdef PACKED_X86
  if (packed_block_avx512()) return block_avx512;
#endif
  return block_portable;
}

static indirect_block_fn pick_indirect_block(void) {
#ifdef PACKED_X86
  if (packed_block_avx512()) return block_avx512_indirect;
#endif
  return block_portable_indirect;
}

/* ---- The product ---------------------------------------------------------- */

typedef struct packed_product {
  packed_block g;
  block_fn block;
  int64_t m, n;
  const float *a, *b; /* B: its first panel */
  float *c;
} packed_product;

/* Column blocks [begin, end) of two panels each: every row block of them. */
static void product_columns(void *arg, int64_t begin, int64_t end) {
  const packed_product *p = arg;
  int64_t panel_count = panels_of(p->n);
  for (int64_t col = begin; col < end; col++) {
    int64_t first = 2 * col, j0 = first * PACKED_PANEL;
    int panels = first + 1 < panel_count ? 2 : 1;
    int64_t width = p->n - j0 < panels * PACKED_PANEL ? p->n - j0 : panels * PACKED_PANEL;
    const float *bp = p->b + first * p->g.panel_stride;
    for (int64_t i = 0; i < p->m; i += PACKED_ROWS) {
      int rows = p->m - i < PACKED_ROWS ? (int)(p->m - i) : PACKED_ROWS;
      p->block(&p->g, rows, panels, width, p->a + i * p->g.lda, bp, p->c + i * p->g.ldc + j0);
    }
  }
}

/* The whole product on the calling thread, B's panels as the strides say. */
static void product_here(int64_t m, int64_t n, int64_t k, const float *a, int64_t lda, const float *b,
                         int64_t row_stride, int64_t panel_stride, bool accumulate, float *c, int64_t ldc) {
  if (m <= 0 || n <= 0) return;
  packed_product p = {.g = {.k = k, .lda = lda, .ldc = ldc, .row_stride = row_stride,
                            .panel_stride = panel_stride, .alpha = 1.0f, .accumulate = accumulate},
                      .block = pick_block(), .m = m, .n = n, .a = a, .b = b, .c = c};
  product_columns(&p, 0, (panels_of(n) + 1) / 2);
}

void packed_gemm_panels(int64_t m, int64_t n, int64_t k, const float *a, int64_t lda, const float *panels,
                        float *c, int64_t ldc) {
  product_here(m, n, k, a, lda, panels, PACKED_PANEL, k * PACKED_PANEL, false, c, ldc);
}

void packed_gemm_rows(int64_t m, int64_t n, int64_t k, const float *a, int64_t lda, const float *b, int64_t ldb,
                      bool accumulate, float *c, int64_t ldc) {
  product_here(m, n, k, a, lda, b, ldb, PACKED_PANEL, accumulate, c, ldc);
}

/* Per column block of two panels, the rows in blocks as even as can be (49
 * rows as 7 blocks of 7, not 6 of 8 and a block of one, which waits on its
 * two accumulators' latency for a quarter of an 8-row block's time); the
 * first block of each prefetches its part of `prefetch`. */
void packed_gemm_indirect(int64_t m, int64_t n, int64_t k, const float *const *rows, const int64_t *offsets,
                          const float *panels, int64_t panel_stride, const float *prefetch, bool accumulate,
                          float *c, int64_t ldc) {
  if (m <= 0 || n <= 0) return;
  packed_block g = {.k = k, .ldc = ldc, .row_stride = PACKED_PANEL, .panel_stride = panel_stride,
                    .offsets = offsets, .alpha = 1.0f, .accumulate = accumulate};
  indirect_block_fn block = pick_indirect_block();
  int64_t panel_count = panels_of(n), row_blocks = (m + PACKED_ROWS - 1) / PACKED_ROWS;
  int64_t shorter = m / row_blocks, longer = m % row_blocks; /* the first `longer` blocks: one row more */
  for (int64_t first = 0; first < panel_count; first += 2) {
    int64_t j0 = first * PACKED_PANEL;
    int pair = first + 1 < panel_count ? 2 : 1;
    int64_t width = n - j0 < pair * PACKED_PANEL ? n - j0 : pair * PACKED_PANEL;
    const float *bp = panels + first * panel_stride, *pf = prefetch ? prefetch + first * panel_stride : NULL;
    for (int64_t b = 0, i = 0; b < row_blocks; b++) {
      int count = (int)(shorter + (b < longer));
      block(&g, count, pair, width, rows + i, b == 0 ? pf : NULL, bp, c + i * ldc + j0);
      i += count;
    }
  }
}

/* ---- The product split into tiles ------------------------------------------ */

/* Tiles [begin, end) of PACKED_ROWS rows by two panels, column-major: a
 * member's run of tiles walks down the row blocks of one column block
 * before the next, reading each pair of panels while it is in cache. */
static void product_tiles(void *arg, int64_t begin, int64_t end) {
  const packed_product *p = arg;
  int64_t panel_count = panels_of(p->n);
  int64_t row_blocks = (p->m + PACKED_ROWS - 1) / PACKED_ROWS;
  for (int64_t t = begin; t < end; t++) {
    int64_t first = 2 * (t / row_blocks), j0 = first * PACKED_PANEL, i = (t % row_blocks) * PACKED_ROWS;
    int panels = first + 1 < panel_count ? 2 : 1;
    int64_t width = p->n - j0 < panels * PACKED_PANEL ? p->n - j0 : panels * PACKED_PANEL;
    int rows = p->m - i < PACKED_ROWS ? (int)(p->m - i) : PACKED_ROWS;
    p->block(&p->g, rows, panels, width, p->a + i * p->g.lda, p->b + first * p->g.panel_stride,
             p->c + i * p->g.ldc + j0);
  }
}

/* Split over the pool by tiles of rows and column blocks, not by column
 * blocks alone: chunks of ceil(columns / threads) column blocks run serially
 * when that is more than half of them (an odd count: llama_decoder's 64 x
 * 344 MLP products, 11 column blocks, ran on one thread), and a product of
 * one or two column blocks cannot split at all. */
void packed_gemm(int64_t m, int64_t n, int64_t k, float alpha, const float *a, int64_t lda,
                 const void *packed, bool accumulate, float *c, int64_t ldc) {
  if (m <= 0 || n <= 0) return;
  packed_product p = {.g = {.k = k, .lda = lda, .ldc = ldc, .row_stride = PACKED_PANEL,
                            .panel_stride = k * PACKED_PANEL, .alpha = alpha, .accumulate = accumulate},
                      .block = pick_block(), .m = m, .n = n, .a = a,
                      .b = (const float *)((const uint8_t *)packed + sizeof(packed_header)), .c = c};
  int64_t tiles = (panels_of(n) + 1) / 2 * ((m + PACKED_ROWS - 1) / PACKED_ROWS);
  if (dks_thread_count() < 2 || (double)m * (double)n * (double)k < (double)PACKED_SPLIT_MIN_MACS) {
    product_tiles(&p, 0, tiles);
    return;
  }
  dks_parallel_for(tiles, 1, product_tiles, &p);
}
