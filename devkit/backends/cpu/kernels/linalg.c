/*
 * linalg.c -- the linalg family's shared helpers (linalg.h) and the MatMul
 * and Gemm kernels.
 *
 * Float products go through OpenBLAS (scipy-openblas32); float16/bfloat16
 * run as float32 (linalg_run_as_f32). Integer MatMul uses a cache-blocked
 * loop with wrapping arithmetic: BLAS has no integer GEMM.
 */
#include "linalg.h"
#include "linalg_packed.h"

#include <cblas.h>
#include <stdlib.h>

/* The largest dimension handed to one BLAS call; a build may lower it (-D)
 * to exercise the splitting on small tensors. */
#ifndef LINALG_BLAS_MAX
#define LINALG_BLAS_MAX INT32_MAX
#endif

/* ---- OpenBLAS threads ---------------------------------------------------- */

/* OpenBLAS runs on one thread: a large product is split over the plugin's
 * pool instead (linalg_gemm), so the kernels have one thread budget
 * (DEVKIT_CPU_THREADS), a product inside a pool chunk stays on that chunk's
 * thread (never nested), and no BLAS thread spins next to the pool's (its
 * own pool busy-waits after each call: next to the host framework's threads
 * on a busy 2-core machine, that made small products 100x slower,
 * 64x128x128: 16 ms against 0.09 ms). */
static DK_Status blas_init(void) {
  scipy_openblas_set_num_threads(1);
  return DK_OK;
}
DKS_REGISTER_INIT(blas_init)

/* ---- GEMM --------------------------------------------------------------- */

static int64_t min64(int64_t a, int64_t b) { return a < b ? a : b; }

static void scale_rows(linalg_real real, int64_t m, int64_t n, double beta, void *c, int64_t ldc) {
  for (int64_t i = 0; i < m; i++) {
    if (real == LINALG_F64) {
      double *row = (double *)c + i * ldc;
      for (int64_t j = 0; j < n; j++) row[j] = beta == 0.0 ? 0.0 : beta * row[j];
    } else {
      float *row = (float *)c + i * ldc;
      for (int64_t j = 0; j < n; j++) row[j] = beta == 0.0 ? 0.0f : (float)beta * row[j];
    }
  }
}

static void gemm_serial(linalg_real real, bool trans_a, bool trans_b, int64_t m, int64_t n,
                        int64_t k, double alpha, const void *a, int64_t lda, const void *b,
                        int64_t ldb, double beta, void *c, int64_t ldc) {
  if (k <= 0) { /* no products: c = beta * c, beta == 0 clearing NaNs as BLAS does */
    scale_rows(real, m, n, beta, c, ldc);
    return;
  }
  const int64_t lim = LINALG_BLAS_MAX;
  /* An operand whose leading dimension is out of range is stepped one stored
   * row at a time, where any leading dimension >= the row width will do. */
  int64_t mc = (ldc > lim || (!trans_a && lda > lim)) ? 1 : lim;
  int64_t kc = ((trans_a && lda > lim) || (!trans_b && ldb > lim)) ? 1 : lim;
  int64_t nc = (trans_b && ldb > lim) ? 1 : lim;
  size_t es = real == LINALG_F64 ? sizeof(double) : sizeof(float);
  for (int64_t i0 = 0; i0 < m; i0 += mc) {
    int64_t mb = min64(mc, m - i0);
    for (int64_t j0 = 0; j0 < n; j0 += nc) {
      int64_t nb = min64(nc, n - j0);
      for (int64_t p0 = 0; p0 < k; p0 += kc) {
        int64_t kb = min64(kc, k - p0);
        const uint8_t *ab = (const uint8_t *)a + (size_t)(trans_a ? p0 * lda + i0 : i0 * lda + p0) * es;
        const uint8_t *bb = (const uint8_t *)b + (size_t)(trans_b ? j0 * ldb + p0 : p0 * ldb + j0) * es;
        uint8_t *cb = (uint8_t *)c + (size_t)(i0 * ldc + j0) * es;
        blasint la = (blasint)(lda > lim ? (trans_a ? mb : kb) : lda);
        blasint lb = (blasint)(ldb > lim ? (trans_b ? kb : nb) : ldb);
        blasint lc = (blasint)(ldc > lim ? nb : ldc);
        double be = p0 == 0 ? beta : 1.0; /* later k blocks accumulate */
        enum CBLAS_TRANSPOSE ta = trans_a ? CblasTrans : CblasNoTrans;
        enum CBLAS_TRANSPOSE tb = trans_b ? CblasTrans : CblasNoTrans;
        if (real == LINALG_F64)
          scipy_cblas_dgemm(CblasRowMajor, ta, tb, (blasint)mb, (blasint)nb, (blasint)kb, alpha,
                            (const double *)ab, la, (const double *)bb, lb, be, (double *)cb, lc);
        else
          scipy_cblas_sgemm(CblasRowMajor, ta, tb, (blasint)mb, (blasint)nb, (blasint)kb,
                            (float)alpha, (const float *)ab, la, (const float *)bb, lb, (float)be,
                            (float *)cb, lc);
      }
    }
  }
}

/* One product, split over the pool by rows of C (or by columns, when C has
 * fewer rows than columns). */
typedef struct gemm_split {
  linalg_real real;
  bool trans_a, trans_b, by_rows;
  int64_t m, n, k, lda, ldb, ldc;
  double alpha, beta;
  const uint8_t *a, *b;
  uint8_t *c;
} gemm_split;

static void gemm_part(void *arg, int64_t begin, int64_t end) {
  const gemm_split *g = arg;
  size_t es = g->real == LINALG_F64 ? sizeof(double) : sizeof(float);
  if (g->by_rows) {
    const uint8_t *a = g->a + (size_t)(g->trans_a ? begin : begin * g->lda) * es;
    gemm_serial(g->real, g->trans_a, g->trans_b, end - begin, g->n, g->k, g->alpha, a, g->lda, g->b,
                g->ldb, g->beta, g->c + (size_t)(begin * g->ldc) * es, g->ldc);
  } else {
    const uint8_t *b = g->b + (size_t)(g->trans_b ? begin * g->ldb : begin) * es;
    gemm_serial(g->real, g->trans_a, g->trans_b, g->m, end - begin, g->k, g->alpha, g->a, g->lda, b,
                g->ldb, g->beta, g->c + (size_t)begin * es, g->ldc);
  }
}

/* Products below this many multiply-adds (about 20 us on one Zen 4 core)
 * stay on one thread: each part packs its operands again, and a hand-off
 * to a pool whose workers sleep costs tens of microseconds. In a plan they
 * are awake (they spin between kernels), and 2^22, the bound before,
 * left a small model's products on one core: llama_decoder's 64x128x344
 * ones took 63 us, 40 us split, and the model 0.38 ms, now 0.285 ms
 * (onnxruntime 0.28); the GPT-style stack 6.9 -> 6.4 ms. A product alone
 * after 1 ms of idling costs 7-14 us more (71 -> 78-85 us). */
#define GEMM_SPLIT_MIN_MACS (INT64_C(1) << 20)

/* ---- GEMV: a product with one row or one column ---------------------------- */

/* y (len outputs, incy apart) = alpha * op(M) x + beta * y, op(M) len x k:
 * M stored row-major with leading dimension ldm, len rows of k (trans
 * false) or k rows of len (trans true); x k elements incx apart. A GEMM
 * call with m or n 1 packs the whole matrix first (Gemm 1x512 by
 * 1000x512^T: 4x the time of reading the matrix once); GEMV streams it. */
typedef struct gemv_split {
  linalg_real real;
  bool trans;
  int64_t len, k, ldm, incx, incy;
  double alpha, beta;
  const uint8_t *m, *x;
  uint8_t *y;
} gemv_split;

static void gemv_part(void *arg, int64_t begin, int64_t end) {
  const gemv_split *g = arg;
  size_t es = g->real == LINALG_F64 ? sizeof(double) : sizeof(float);
  /* Outputs [begin, end): rows of M, or (transposed) its columns. */
  const uint8_t *m = g->m + (size_t)(g->trans ? begin : begin * g->ldm) * es;
  uint8_t *y = g->y + (size_t)(begin * g->incy) * es;
  enum CBLAS_TRANSPOSE t = g->trans ? CblasTrans : CblasNoTrans;
  blasint rows = (blasint)(g->trans ? g->k : end - begin), cols = (blasint)(g->trans ? end - begin : g->k);
  if (g->real == LINALG_F64)
    scipy_cblas_dgemv(CblasRowMajor, t, rows, cols, g->alpha, (const double *)m, (blasint)g->ldm,
                      (const double *)g->x, (blasint)g->incx, g->beta, (double *)y, (blasint)g->incy);
  else
    scipy_cblas_sgemv(CblasRowMajor, t, rows, cols, (float)g->alpha, (const float *)m, (blasint)g->ldm,
                      (const float *)g->x, (blasint)g->incx, (float)g->beta, (float *)y, (blasint)g->incy);
}

/* A GEMV is split from this many multiply-adds (a matrix of 1 MiB of
 * float32: below, a hot one takes about the hand-off's tens of
 * microseconds), in parts of whole blocks of outputs: OpenBLAS's kernels
 * take outputs in small blocks, so with part boundaries on block multiples
 * each output is summed as on one thread. */
#define GEMV_SPLIT_MIN_MACS (INT64_C(1) << 18)
#define GEMV_PART_BLOCK 64

/* Blocks [begin, end) of GEMV_PART_BLOCK outputs (the last one short). */
static void gemv_blocks(void *arg, int64_t begin, int64_t end) {
  const gemv_split *g = arg;
  int64_t last = end * GEMV_PART_BLOCK;
  gemv_part(arg, begin * GEMV_PART_BLOCK, last < g->len ? last : g->len);
}

/* The product as a GEMV when m or n is 1 and every extent fits one BLAS
 * call; false (nothing done) otherwise. */
static bool gemm_as_gemv(linalg_real real, bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k,
                         double alpha, const void *a, int64_t lda, const void *b, int64_t ldb, double beta,
                         void *c, int64_t ldc) {
  const int64_t lim = LINALG_BLAS_MAX;
  if ((m != 1 && n != 1) || k <= 0 || m > lim || n > lim || k > lim || lda > lim || ldb > lim || ldc > lim)
    return false;
  gemv_split g = {.real = real, .alpha = alpha, .beta = beta, .k = k, .y = c};
  if (m == 1) { /* c (1 x n) = a (1 x k) op(B): y = op(B)^T a over c's row */
    g.len = n, g.m = b, g.ldm = ldb, g.trans = !trans_b;
    g.x = a, g.incx = trans_a ? lda : 1, g.incy = 1;
  } else { /* c (m x 1) = op(A) b (k x 1): y = op(A) b down c's column */
    g.len = m, g.m = a, g.ldm = lda, g.trans = trans_a;
    g.x = b, g.incx = trans_b ? 1 : ldb, g.incy = ldc;
  }
  if (beta == 0.0) { /* y's old values, NaN included, drop out as GEMM's beta 0 makes them */
    g.beta = 0.0;
    size_t es = real == LINALG_F64 ? sizeof(double) : sizeof(float);
    for (int64_t i = 0; i < g.len; i++) memset(g.y + (size_t)(i * g.incy) * es, 0, es);
  }
  int64_t threads = dks_thread_count();
  int64_t blocks = (g.len + GEMV_PART_BLOCK - 1) / GEMV_PART_BLOCK;
  if (threads < 2 || g.len * k < GEMV_SPLIT_MIN_MACS || blocks < 2) {
    gemv_part(&g, 0, g.len);
    return true;
  }
  /* One part per thread, of whole blocks. */
  dks_parallel_for(blocks, (blocks + threads - 1) / threads, gemv_blocks, &g);
  return true;
}

void linalg_gemm(linalg_real real, bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k,
                 double alpha, const void *a, int64_t lda, const void *b, int64_t ldb, double beta,
                 void *c, int64_t ldc) {
  if (m <= 0 || n <= 0) return;
  if (gemm_as_gemv(real, trans_a, trans_b, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc)) return;
  int64_t threads = dks_thread_count();
  if (threads < 2 || k <= 0 || (double)m * (double)n * (double)k < (double)GEMM_SPLIT_MIN_MACS) {
    gemm_serial(real, trans_a, trans_b, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
    return;
  }
  gemm_split g = {.real = real, .trans_a = trans_a, .trans_b = trans_b, .by_rows = m >= n,
                  .m = m, .n = n, .k = k, .lda = lda, .ldb = ldb, .ldc = ldc,
                  .alpha = alpha, .beta = beta, .a = a, .b = b, .c = c};
  /* One part per thread: more would pack the shared operand more often. */
  int64_t extent = g.by_rows ? m : n;
  dks_parallel_for(extent, (extent + threads - 1) / threads, gemm_part, &g);
}

/* ---- Scratch, copies, float16/bfloat16 ------------------------------------ */

void *linalg_scratch(const dks_kernel_args *k, size_t count, size_t size) {
  void *p = calloc(count ? count : 1, size);
  if (!p)
    dks_kernel_fail(k, DK_RESOURCE_EXHAUSTED, "out of host memory for %zu scratch elements of %zu bytes",
                    count, size);
  return p;
}

#define COPY_LOOP(NAME, T)                                                                \
  static void NAME(int64_t n, uint8_t *const *p, const int64_t *s, void *ctx) {          \
    (void)ctx;                                                                            \
    uint8_t *o = p[0];                                                                    \
    const uint8_t *x = p[1];                                                              \
    for (int64_t i = 0; i < n; i++, o += s[0], x += s[1]) *(T *)o = *(const T *)x;        \
  }
COPY_LOOP(copy_1, uint8_t)
COPY_LOOP(copy_2, uint16_t)
COPY_LOOP(copy_4, uint32_t)
COPY_LOOP(copy_8, uint64_t)

#define WIDEN_LOOP(NAME, LOAD)                                                            \
  static void NAME(int64_t n, uint8_t *const *p, const int64_t *s, void *ctx) {          \
    (void)ctx;                                                                            \
    uint8_t *o = p[0];                                                                    \
    const uint8_t *x = p[1];                                                              \
    for (int64_t i = 0; i < n; i++, o += s[0], x += s[1])                                 \
      *(float *)o = LOAD(*(const uint16_t *)x);                                           \
  }
WIDEN_LOOP(widen_f16, dks_f16_to_f32)
WIDEN_LOOP(widen_bf16, dks_bf16_to_f32)

/* dst (compact, dst_itemsize bytes per element) = t through `loop`. */
static void gather(const dks_tensor *t, uint8_t *dst, int32_t dst_itemsize, dks_inner_loop loop) {
  int64_t strides[2][DKS_MAX_DIMS], compact[DKS_MAX_DIMS];
  dks_compact_strides(t->ndim, t->shape, compact);
  for (int32_t d = 0; d < t->ndim; d++) {
    strides[0][d] = compact[d] * dst_itemsize;
    strides[1][d] = t->strides[d] * t->itemsize;
  }
  uint8_t *base[2] = {dst, t->data};
  dks_nd_loop(2, t->ndim, t->shape, (const int64_t(*)[DKS_MAX_DIMS])strides, base, loop, NULL);
}

void *linalg_compact_copy(const dks_kernel_args *k, const dks_tensor *t) {
  uint8_t *copy = linalg_scratch(k, (size_t)t->size, (size_t)t->itemsize);
  if (!copy || t->size == 0) return copy;
  dks_inner_loop loop = t->itemsize == 8 ? copy_8 : t->itemsize == 4 ? copy_4
                        : t->itemsize == 2 ? copy_2 : copy_1;
  gather(t, copy, t->itemsize, loop);
  return copy;
}

static bool is_low_float(const dks_tensor *t) {
  return t->ndim >= 0 && (t->dtype == DK_DTYPE_FLOAT16 || t->dtype == DK_DTYPE_BFLOAT16);
}

/* A compact float32 copy of float16/bfloat16 tensor t (scratch the caller
 * frees), or NULL, the failure reported, when out of memory. */
static float *widen_copy(const dks_kernel_args *k, const dks_tensor *t) {
  float *buffer = linalg_scratch(k, (size_t)t->size, sizeof(float));
  if (buffer && t->size)
    gather(t, (uint8_t *)buffer, sizeof(float), t->dtype == DK_DTYPE_FLOAT16 ? widen_f16 : widen_bf16);
  return buffer;
}

DK_Status linalg_run_as_f32(const dks_kernel_args *k, dks_compute_fn core) {
  size_t total = k->num_inputs + k->num_outputs;
  dks_tensor *wide = linalg_scratch(k, total, sizeof *wide);
  if (!wide) return DK_RESOURCE_EXHAUSTED;
  memcpy(wide, k->in, k->num_inputs * sizeof *wide);
  memcpy(wide + k->num_inputs, k->out, k->num_outputs * sizeof *wide);
  DK_Status st = DK_OK;
  for (size_t i = 0; i < total && st == DK_OK; i++) {
    dks_tensor *t = &wide[i];
    if (!is_low_float(t) || t->prepared_bytes) continue; /* a prepared form is the kernel's own */
    float *buffer = i < k->num_inputs ? widen_copy(k, t) : linalg_scratch(k, (size_t)t->size, sizeof(float));
    if (!buffer) {
      st = DK_RESOURCE_EXHAUSTED;
      break;
    }
    t->data = (uint8_t *)buffer;
    t->dtype = DK_DTYPE_FLOAT32;
    t->itemsize = sizeof(float);
    dks_compact_strides(t->ndim, t->shape, t->strides);
  }
  if (st == DK_OK) {
    dks_kernel_args args = *k;
    args.in = wide;
    args.out = wide + k->num_inputs;
    st = core(&args);
  }
  for (size_t o = 0; o < k->num_outputs && st == DK_OK; o++) {
    const dks_tensor *t = &k->out[o];
    if (!is_low_float(t)) continue;
    const float *src = (const float *)wide[k->num_inputs + o].data;
    uint16_t *dst = (uint16_t *)t->data;
    if (t->dtype == DK_DTYPE_FLOAT16)
      for (int64_t i = 0; i < t->size; i++) dst[i] = dks_f32_to_f16(src[i]);
    else
      for (int64_t i = 0; i < t->size; i++) dst[i] = dks_f32_to_bf16(src[i]);
  }
  for (size_t i = 0; i < total; i++) {
    const dks_tensor *original = i < k->num_inputs ? &k->in[i] : &k->out[i - k->num_inputs];
    if (is_low_float(original) && wide[i].dtype == DK_DTYPE_FLOAT32) free(wide[i].data);
  }
  free(wide);
  return st;
}

/* ---- Window geometry -------------------------------------------------------- */

void linalg_window_forward(const dks_kernel_args *k, int32_t n, const int64_t *in,
                           const int64_t *out, const int64_t *kernel, linalg_window *w) {
  int64_t ns, nd, np;
  const int64_t *strides = dks_attr_ints(k, "strides", &ns);
  const int64_t *dilations = dks_attr_ints(k, "dilations", &nd);
  const int64_t *pads = dks_attr_ints(k, "pads", &np);
  const char *auto_pad = dks_attr_string(k, "auto_pad", "NOTSET");
  bool upper = strcmp(auto_pad, "SAME_UPPER") == 0, same = upper || strcmp(auto_pad, "SAME_LOWER") == 0;
  bool explicit_pads = strcmp(auto_pad, "NOTSET") == 0 && np == 2 * n;
  memset(w, 0, sizeof *w);
  w->n = n;
  for (int32_t d = 0; d < n; d++) {
    w->grid[d] = out[d];
    w->target[d] = in[d];
    w->kernel[d] = kernel[d];
    w->stride[d] = ns == n ? strides[d] : 1;
    w->dilation[d] = nd == n ? dilations[d] : 1;
    if (same) {
      int64_t total = (out[d] - 1) * w->stride[d] + (kernel[d] - 1) * w->dilation[d] + 1 - in[d];
      if (total < 0) total = 0;
      w->pad[d] = upper ? total / 2 : total - total / 2;
      w->pad_end[d] = total - w->pad[d];
    } else if (explicit_pads) {
      w->pad[d] = pads[d];
      w->pad_end[d] = pads[n + d];
    }
  }
}

/* Window extents are bounded like the spec's (_EXTENT_LIMIT), so sizes stay far from overflow. */
#define WINDOW_LIMIT ((int64_t)1 << 31)

static DK_Status check_per_axis(const dks_kernel_args *k, const char *name, int64_t count, int64_t min) {
  DK_Status st = dks_check_ints(k, name, count, min);
  if (st != DK_OK) return st;
  int64_t n;
  const int64_t *values = dks_attr_ints(k, name, &n);
  for (int64_t i = 0; i < n; i++)
    if (values[i] >= WINDOW_LIMIT)
      return dks_invalid(k, "attribute '%s' value %lld is %lld; it must be below 2^31", name, (long long)i,
                         (long long)values[i]);
  return DK_OK;
}

static int64_t floor_div(int64_t a, int64_t b) { return a >= 0 ? a / b : -((-a + b - 1) / b); }

DK_Status linalg_check_window(const dks_kernel_args *k, int32_t ndim, const int64_t *x_shape,
                              const int64_t *kernel, bool pool, bool transpose, int64_t *out) {
  if (ndim < 3) return dks_invalid(k, "X has rank %d; it needs (N, C, D1, ...)", ndim);
  int32_t n = ndim - 2;
  DK_Status st;
  if ((st = check_per_axis(k, "kernel_shape", n, 1)) != DK_OK ||
      (st = check_per_axis(k, "strides", n, 1)) != DK_OK ||
      (st = check_per_axis(k, "dilations", n, 1)) != DK_OK ||
      (st = check_per_axis(k, "pads", 2 * n, transpose ? -WINDOW_LIMIT : 0)) != DK_OK ||
      (st = check_per_axis(k, "output_padding", n, 0)) != DK_OK ||
      (st = check_per_axis(k, "output_shape", n, 0)) != DK_OK)
    return st;
  int64_t nk, ns, nd, np, nop, nos;
  const int64_t *kernel_shape = dks_attr_ints(k, "kernel_shape", &nk);
  const int64_t *strides = dks_attr_ints(k, "strides", &ns);
  const int64_t *dilations = dks_attr_ints(k, "dilations", &nd);
  const int64_t *pads = dks_attr_ints(k, "pads", &np);
  const int64_t *output_padding = dks_attr_ints(k, "output_padding", &nop);
  const int64_t *output_shape = dks_attr_ints(k, "output_shape", &nos);
  if (!kernel && !kernel_shape) return dks_invalid(k, "attribute 'kernel_shape' is missing");
  const char *auto_pad = dks_attr_string(k, "auto_pad", "NOTSET");
  bool same = strcmp(auto_pad, "SAME_UPPER") == 0 || strcmp(auto_pad, "SAME_LOWER") == 0;
  bool ceil_mode = pool && dks_attr_int(k, "ceil_mode", 0) == 1;
  for (int32_t d = 0; d < n; d++) {
    if (np && strcmp(auto_pad, "NOTSET") != 0 && (pads[d] || pads[n + d]))
      return dks_invalid(k, "attribute 'pads' cannot be combined with auto_pad %s", auto_pad);
    int64_t size = x_shape[d + 2], kd = kernel ? kernel[d] : kernel_shape[d];
    if (kernel && kernel_shape && kernel_shape[d] != kernel[d])
      return dks_invalid(k, "attribute 'kernel_shape' value %d is %lld; W's spatial size there is %lld", d,
                         (long long)kernel_shape[d], (long long)kernel[d]);
    if (kd < 1 || kd >= WINDOW_LIMIT || size >= WINDOW_LIMIT)
      return dks_invalid(k, "spatial axis %d: kernel size %lld and input size %lld must be in [1, 2^31)", d,
                         (long long)kd, (long long)size);
    int64_t s = ns ? strides[d] : 1, dil = nd ? dilations[d] : 1;
    int64_t b = np && !same ? pads[d] : 0, e = np && !same ? pads[n + d] : 0;
    int64_t extent = (kd - 1) * dil + 1, o;
    if (transpose) {
      int64_t extra = nop ? output_padding[d] : 0;
      if (extra >= (s > dil ? s : dil))
        return dks_invalid(k, "attribute 'output_padding' value %d is %lld; it must be smaller than the "
                           "stride or the dilation", d, (long long)extra);
      int64_t full = size ? s * (size - 1) + extra + extent : 0;
      o = nos ? output_shape[d] : same ? size * s : strcmp(auto_pad, "VALID") == 0 ? full : full - b - e;
      if (o < 0)
        return dks_invalid(k, "spatial axis %d: pads (%lld, %lld) exceed the full output size %lld", d,
                           (long long)b, (long long)e, (long long)full);
    } else if (same) {
      o = floor_div(size + s - 1, s);
    } else {
      if (strcmp(auto_pad, "VALID") == 0) b = e = 0;
      int64_t span = size + b + e - extent;
      if (span < 0)
        return dks_invalid(k, "spatial axis %d: the kernel extent %lld exceeds the padded input size %lld",
                           d, (long long)extent, (long long)(size + b + e));
      o = (ceil_mode ? floor_div(span + s - 1, s) : span / s) + 1;
      if (ceil_mode && (o - 1) * s >= size + b) o--;
      if (pool && (b >= extent || e >= extent))
        return dks_invalid(k, "spatial axis %d: pads (%lld, %lld) must be smaller than the kernel extent %lld",
                           d, (long long)b, (long long)e, (long long)extent);
    }
    out[d] = o;
  }
  return DK_OK;
}

DK_Status linalg_check_conv(const dks_kernel_args *k, const dks_tensor *x, const dks_tensor *wt,
                            const dks_tensor *b, bool transpose, int64_t *y) {
  if (x->ndim < 3 || wt->ndim != x->ndim)
    return dks_invalid(k, "X has rank %d and W rank %d; they need one rank of at least 3", x->ndim, wt->ndim);
  int64_t group = dks_attr_int(k, "group", 1), c = x->shape[1];
  if (group < 1) return dks_invalid(k, "attribute 'group' is %lld; it must be at least 1", (long long)group);
  int64_t m = transpose ? wt->shape[1] * group : wt->shape[0];
  if (transpose ? c != wt->shape[0] || c % group : c != wt->shape[1] * group || m % group)
    return dks_invalid(k, "X has %lld channels, W has shape (%lld, %lld, ...) and group is %lld: they do not fit",
                       (long long)c, (long long)wt->shape[0], (long long)wt->shape[1], (long long)group);
  if (b && (b->ndim != 1 || b->shape[0] != m))
    return dks_invalid(k, "B has rank %d; it needs shape (%lld)", b->ndim, (long long)m);
  y[0] = x->shape[0];
  y[1] = m;
  return linalg_check_window(k, x->ndim, x->shape, wt->shape + 2, false, transpose, y + 2);
}

/* ---- MatMul -------------------------------------------------------------------- */

/* Whether a rows x cols matrix with element strides (rs, cs) is a BLAS
 * operand as it lies: row-major (*trans false) or column-major (*trans true)
 * with leading dimension *ld. */
static bool blas_layout(int64_t rows, int64_t cols, int64_t rs, int64_t cs, bool *trans, int64_t *ld) {
  int64_t r1 = rows > 1 ? rows : 1, c1 = cols > 1 ? cols : 1;
  if ((cols <= 1 || cs == 1) && (rows <= 1 || rs >= c1)) {
    *trans = false;
    *ld = rows <= 1 ? c1 : rs;
    return true;
  }
  if ((rows <= 1 || rs == 1) && (cols <= 1 || cs >= r1)) {
    *trans = true;
    *ld = cols <= 1 ? r1 : cs;
    return true;
  }
  return false;
}

typedef struct mm_geometry {
  int64_t m, n, k;
  int32_t batch_nd;
  int64_t batch_shape[DKS_MAX_DIMS];
  int64_t batches;
} mm_geometry;

/* One MatMul operand: its matrices' element strides and, per output batch
 * dim, the element stride between matrices (0 where it broadcasts). */
typedef struct mm_operand {
  const uint8_t *data;
  int32_t itemsize;
  int64_t rows, cols, rs, cs;
  int64_t batch[DKS_MAX_DIMS];
} mm_operand;

static void mm_setup(const dks_tensor *a, const dks_tensor *b, const dks_tensor *y, mm_geometry *g) {
  bool a1 = a->ndim == 1, b1 = b->ndim == 1;
  g->m = a1 ? 1 : a->shape[a->ndim - 2];
  g->k = a->shape[a->ndim - 1];
  g->n = b1 ? 1 : b->shape[b->ndim - 1];
  g->batch_nd = y->ndim - (a1 ? 0 : 1) - (b1 ? 0 : 1);
  for (int32_t d = 0; d < g->batch_nd; d++) g->batch_shape[d] = y->shape[d];
  g->batches = linalg_prod(g->batch_shape, g->batch_nd);
}

/* t (with `data` and `strides`, possibly a compact copy's) as operand A
 * (rows m, cols k) or B (rows k, cols n) of g. */
static void mm_operand_init(const dks_tensor *t, const uint8_t *data, const int64_t *strides, bool is_a,
                            const mm_geometry *g, mm_operand *op) {
  int32_t nd = t->ndim, matrix_nd = nd == 1 ? 1 : 2, tb = nd - matrix_nd;
  op->data = data;
  op->itemsize = t->itemsize;
  op->rows = is_a ? g->m : g->k;
  op->cols = is_a ? g->k : g->n;
  if (nd == 1) { /* A: one row; B: one column */
    op->rs = is_a ? 0 : strides[0];
    op->cs = is_a ? strides[0] : 0;
  } else {
    op->rs = strides[nd - 2];
    op->cs = strides[nd - 1];
  }
  for (int32_t d = 0; d < g->batch_nd; d++) {
    int32_t td = d - (g->batch_nd - tb);
    op->batch[d] = td < 0 || t->shape[td] == 1 ? 0 : strides[td];
  }
}

/* The operand's BLAS layout; when its strides have none, a compact copy
 * (returned in *copy for the caller to free) replaces it. */
static DK_Status mm_operand_prepare(const dks_kernel_args *k, const dks_tensor *t, bool is_a,
                                    const mm_geometry *g, mm_operand *op, bool *trans, int64_t *ld,
                                    void **copy) {
  mm_operand_init(t, t->data, t->strides, is_a, g, op);
  *copy = NULL;
  if (blas_layout(op->rows, op->cols, op->rs, op->cs, trans, ld)) return DK_OK;
  *copy = linalg_compact_copy(k, t);
  if (!*copy) return DK_RESOURCE_EXHAUSTED;
  int64_t compact[DKS_MAX_DIMS];
  dks_compact_strides(t->ndim, t->shape, compact);
  mm_operand_init(t, *copy, compact, is_a, g, op);
  blas_layout(op->rows, op->cols, op->rs, op->cs, trans, ld);
  return DK_OK;
}

/* Element offsets of batch `index` (odometer over g's batch dims). */
static void mm_batch_offsets(const mm_geometry *g, const int64_t *index, const mm_operand *a,
                             const mm_operand *b, int64_t *a_off, int64_t *b_off) {
  *a_off = *b_off = 0;
  for (int32_t d = 0; d < g->batch_nd; d++) {
    *a_off += index[d] * a->batch[d];
    *b_off += index[d] * b->batch[d];
  }
}

static void mm_next_batch(const mm_geometry *g, int64_t *index) {
  for (int32_t d = g->batch_nd - 1; d >= 0; d--) {
    if (++index[d] < g->batch_shape[d]) return;
    index[d] = 0;
  }
}

/* Whether every batch can be one GEMM: B the same matrix for all of them and
 * A's matrices consecutive runs of rows, lda apart. */
static bool mm_foldable(const mm_geometry *g, const mm_operand *a, bool a_trans, int64_t lda,
                        const mm_operand *b) {
  if (a_trans) return false;
  int64_t expected = g->m * lda;
  for (int32_t d = g->batch_nd - 1; d >= 0; d--) {
    if (g->batch_shape[d] == 1) continue;
    if (b->batch[d] != 0 || a->batch[d] != expected) return false;
    expected *= g->batch_shape[d];
  }
  return true;
}

static bool is_compact(const dks_tensor *t) {
  int64_t compact[DKS_MAX_DIMS];
  dks_compact_strides(t->ndim, t->shape, compact);
  for (int32_t d = 0; d < t->ndim; d++)
    if (t->shape[d] > 1 && t->strides[d] != compact[d]) return false;
  return true;
}

/* ---- Prepared B: packed panels (linalg_packed.h) ------------------------------ */

/* The k x n matrix a MatMul or Gemm multiplies by, as B's element strides:
 * element (i, j) at B + i * rs + j * cs. False where B cannot be prepared
 * (a batched MatMul B). */
static bool product_b(const dks_kernel_args *k, int64_t *kk, int64_t *n, bool *trans) {
  const dks_tensor *b = &k->in[1];
  if (b->ndim != 2) return false;
  *trans = strcmp(k->op, "Gemm") == 0 && dks_attr_int(k, "transB", 0) != 0;
  *kk = b->shape[*trans], *n = b->shape[!*trans];
  return true;
}

/* The prepare of float32/float16/bfloat16 MatMul and Gemm: a constant B
 * packed into float32 panels once, so a call neither packs B (OpenBLAS does
 * at every call: most of a small-M product's time) nor widens it. */
static DK_Status prepare_b(const dks_kernel_args *k, size_t input, uint8_t *dst, size_t *size) {
  int64_t kk, n;
  bool trans;
  *size = 0;
  DK_DTypeKey dtype = k->in[1].dtype;
  bool floats = dtype == DK_DTYPE_FLOAT32 || dtype == DK_DTYPE_FLOAT16 || dtype == DK_DTYPE_BFLOAT16;
  if (input != 1 || !floats || !product_b(k, &kk, &n, &trans)) return DK_OK;
  *size = packed_b_bytes(kk, n);
  if (!dst || !*size) return DK_OK;
  const dks_tensor *b = &k->in[1];
  float *wide = b->dtype == DK_DTYPE_FLOAT32 ? NULL : widen_copy(k, b); /* compact, as B is laid out */
  if (b->dtype != DK_DTYPE_FLOAT32 && !wide) return DK_RESOURCE_EXHAUSTED;
  const int64_t *strides = b->strides, compact[2] = {b->shape[1], 1};
  if (wide) strides = compact;
  packed_b_pack(wide ? wide : (const float *)b->data, strides[trans], strides[!trans], kk, n, dst);
  free(wide);
  return DK_OK;
}

/* y (m x n, compact) (+)= alpha * a @ B for a prepared B, a the m x kk
 * operand as a tensor view (copied when its rows are not compact). */
static DK_Status product_prepared(const dks_kernel_args *k, const dks_tensor *a, int64_t m, int64_t kk,
                                  int64_t n, float alpha, bool accumulate, float *y) {
  const dks_tensor *b = &k->in[1];
  if (!packed_b_check(b->data, b->prepared_bytes, kk, n))
    return dks_kernel_fail(k, DK_INVALID_ARGUMENT,
                           "input 1 is marked prepared and is not this kernel's packed form of a "
                           "%lld x %lld B", (long long)kk, (long long)n);
  bool rows = is_compact(a);
  float *copy = rows ? NULL : linalg_compact_copy(k, a);
  if (!rows && !copy) return DK_RESOURCE_EXHAUSTED;
  packed_gemm(m, n, kk, alpha, copy ? copy : (const float *)a->data, kk, b->data, accumulate, y, n);
  free(copy);
  return DK_OK;
}

static DK_Status matmul_prepared(const dks_kernel_args *k) {
  const dks_tensor *a = &k->in[0], *b = &k->in[1], *y = &k->out[0];
  int64_t kk = b->shape[0], n = b->shape[1];
  return product_prepared(k, a, kk ? a->size / kk : y->size / (n ? n : 1), kk, n, 1.0f, false,
                          (float *)y->data);
}

/* Batched MatMul products [begin, end): each its own GEMM. */
typedef struct mm_batch_job {
  linalg_real real;
  bool ta, tb;
  const mm_geometry *g;
  const mm_operand *a, *b;
  int64_t lda, ldb, es;
  uint8_t *y;
} mm_batch_job;

/* A batch split over the pool takes at least about this many multiply-adds
 * (one 32 x 32 x 32 product: transformer_encoder's 8 heads of Q K^T ran one
 * after another on one thread, 7 us at 2 threads). */
#define MM_BATCH_CHUNK_MACS (INT64_C(1) << 15)

static void mm_batches(void *arg, int64_t begin, int64_t end) {
  const mm_batch_job *j = arg;
  const mm_geometry *g = j->g;
  int64_t index[DKS_MAX_DIMS] = {0}, at = begin;
  for (int32_t d = g->batch_nd - 1; d >= 0; d--) { /* begin's batch index */
    index[d] = at % g->batch_shape[d];
    at /= g->batch_shape[d];
  }
  for (int64_t i = begin; i < end; i++, mm_next_batch(g, index)) {
    int64_t a_off, b_off;
    mm_batch_offsets(g, index, j->a, j->b, &a_off, &b_off);
    linalg_gemm(j->real, j->ta, j->tb, g->m, g->n, g->k, 1.0, j->a->data + a_off * j->es, j->lda,
                j->b->data + b_off * j->es, j->ldb, 0.0, j->y + i * g->m * g->n * j->es, g->n);
  }
}

static DK_Status matmul_float(const dks_kernel_args *k) {
  const dks_tensor *a = &k->in[0], *b = &k->in[1], *y = &k->out[0];
  if (y->size == 0) return DK_OK;
  if (b->prepared_bytes) return matmul_prepared(k);
  linalg_real real = linalg_real_of(y);
  /* zeroed: its address goes to the pool, past which GCC cannot see that mm_setup sets what is
   * read (-Wmaybe-uninitialized) */
  mm_geometry g = {0};
  mm_setup(a, b, y, &g);
  if (g.k == 0) { /* empty sums; A and B are empty (NULL) */
    memset(y->data, 0, (size_t)(y->size * y->itemsize));
    return DK_OK;
  }
  mm_operand oa, ob;
  bool ta, tb;
  int64_t lda, ldb;
  void *a_copy, *b_copy = NULL;
  DK_Status st = mm_operand_prepare(k, a, true, &g, &oa, &ta, &lda, &a_copy);
  if (st == DK_OK) st = mm_operand_prepare(k, b, false, &g, &ob, &tb, &ldb, &b_copy);
  if (st == DK_OK) {
    size_t es = (size_t)y->itemsize;
    if (mm_foldable(&g, &oa, ta, lda, &ob)) {
      linalg_gemm(real, false, tb, g.m * g.batches, g.n, g.k, 1.0, oa.data, lda, ob.data, ldb, 0.0,
                  y->data, g.n);
    } else {
      mm_batch_job job = {.real = real, .ta = ta, .tb = tb, .g = &g, .a = &oa, .b = &ob,
                          .lda = lda, .ldb = ldb, .y = y->data, .es = (int64_t)es};
      /* Products too small to split themselves split the batches among them. */
      double macs = (double)g.m * (double)g.n * (double)g.k;
      int64_t grain = macs >= (double)MM_BATCH_CHUNK_MACS ? 1 : (int64_t)(MM_BATCH_CHUNK_MACS / macs) + 1;
      if (macs >= (double)GEMM_SPLIT_MIN_MACS)
        mm_batches(&job, 0, g.batches);
      else
        dks_parallel_for(g.batches, grain, mm_batches, &job);
    }
  }
  free(a_copy);
  free(b_copy);
  return st;
}

/* Integer GEMM c = a @ b on compact row-major matrices, wrapping around in
 * the unsigned type U. Blocked over k and n so a panel of b stays in cache
 * while every row of a streams past it; the inner loop vectorises. */
#define INT_GEMM(NAME, T, U)                                                              \
  static void NAME(int64_t m, int64_t n, int64_t k, const T *a, const T *b, T *c) {       \
    enum { KB = 128, NB = 512 };                                                          \
    memset(c, 0, (size_t)(m * n) * sizeof(T));                                            \
    for (int64_t p0 = 0; p0 < k; p0 += KB) {                                              \
      int64_t p1 = min64(k, p0 + KB);                                                     \
      for (int64_t j0 = 0; j0 < n; j0 += NB) {                                            \
        int64_t nb = min64(NB, n - j0);                                                   \
        for (int64_t i = 0; i < m; i++) {                                                 \
          U *crow = (U *)c + i * n + j0;                                                  \
          for (int64_t p = p0; p < p1; p++) {                                             \
            U av = (U)a[i * k + p];                                                       \
            const T *brow = b + p * n + j0;                                               \
            for (int64_t j = 0; j < nb; j++) crow[j] += av * (U)brow[j];                  \
          }                                                                               \
        }                                                                                 \
      }                                                                                   \
    }                                                                                     \
  }
INT_GEMM(int_gemm_i32, int32_t, uint32_t)
INT_GEMM(int_gemm_i64, int64_t, uint64_t)

static DK_Status matmul_int(const dks_kernel_args *k) {
  const dks_tensor *a = &k->in[0], *b = &k->in[1], *y = &k->out[0];
  if (y->size == 0) return DK_OK;
  mm_geometry g;
  mm_setup(a, b, y, &g);
  if (g.k == 0) { /* empty sums; A and B are empty (NULL) */
    memset(y->data, 0, (size_t)(y->size * y->itemsize));
    return DK_OK;
  }
  bool a_compact = is_compact(a), b_compact = is_compact(b);
  void *a_copy = a_compact ? NULL : linalg_compact_copy(k, a);
  void *b_copy = b_compact ? NULL : linalg_compact_copy(k, b);
  if ((!a_compact && !a_copy) || (!b_compact && !b_copy)) {
    free(a_copy);
    free(b_copy);
    return DK_RESOURCE_EXHAUSTED;
  }
  int64_t sa[DKS_MAX_DIMS], sb[DKS_MAX_DIMS];
  dks_compact_strides(a->ndim, a->shape, sa);
  dks_compact_strides(b->ndim, b->shape, sb);
  mm_operand oa, ob;
  mm_operand_init(a, a_copy ? a_copy : a->data, sa, true, &g, &oa);
  mm_operand_init(b, b_copy ? b_copy : b->data, sb, false, &g, &ob);
  int64_t index[DKS_MAX_DIMS] = {0};
  for (int64_t i = 0; i < g.batches; i++, mm_next_batch(&g, index)) {
    int64_t a_off, b_off, c_off = i * g.m * g.n;
    mm_batch_offsets(&g, index, &oa, &ob, &a_off, &b_off);
    if (y->dtype == DK_DTYPE_INT32)
      int_gemm_i32(g.m, g.n, g.k, (const int32_t *)oa.data + a_off, (const int32_t *)ob.data + b_off,
                   (int32_t *)y->data + c_off);
    else
      int_gemm_i64(g.m, g.n, g.k, (const int64_t *)oa.data + a_off, (const int64_t *)ob.data + b_off,
                   (int64_t *)y->data + c_off);
  }
  free(a_copy);
  free(b_copy);
  return DK_OK;
}

static DK_Status matmul_low(const dks_kernel_args *k) { return linalg_run_as_f32(k, matmul_float); }

/* ---- Gemm ----------------------------------------------------------------------- */

/* y = beta * c, c broadcast unidirectionally to y (m x n). */
#define GEMM_FILL(NAME, T)                                                                   \
  static void NAME(const dks_tensor *c, double beta, T *y, int64_t m, int64_t n) {          \
    int64_t rs = 0, cs = 0;                                                                  \
    if (c->ndim >= 1 && c->shape[c->ndim - 1] != 1) cs = c->strides[c->ndim - 1];            \
    if (c->ndim == 2 && c->shape[0] != 1) rs = c->strides[0];                                \
    const T *src = (const T *)c->data;                                                       \
    T scale = (T)beta;                                                                       \
    for (int64_t i = 0; i < m; i++)                                                          \
      for (int64_t j = 0; j < n; j++) y[i * n + j] = scale * src[i * rs + j * cs];           \
  }
GEMM_FILL(gemm_fill_f32, float)
GEMM_FILL(gemm_fill_f64, double)

static DK_Status gemm_float(const dks_kernel_args *k) {
  const dks_tensor *a = &k->in[0], *b = &k->in[1], *y = &k->out[0];
  const dks_tensor *c = k->num_inputs > 2 && k->in[2].ndim >= 0 ? &k->in[2] : NULL;
  if (y->size == 0) return DK_OK;
  linalg_real real = linalg_real_of(y);
  bool trans_a = dks_attr_int(k, "transA", 0) != 0, trans_b = dks_attr_int(k, "transB", 0) != 0;
  double alpha = dks_attr_float(k, "alpha", 1.0), beta = dks_attr_float(k, "beta", 1.0);
  int64_t m = y->shape[0], n = y->shape[1], kk = a->shape[trans_a ? 0 : 1];
  /* op(A) and op(B) as MatMul operands: the transposes are stride swaps. */
  dks_tensor va = *a, vb = *b;
  if (trans_a) {
    va.shape[0] = a->shape[1], va.shape[1] = a->shape[0];
    va.strides[0] = a->strides[1], va.strides[1] = a->strides[0];
  }
  if (trans_b) {
    vb.shape[0] = b->shape[1], vb.shape[1] = b->shape[0];
    vb.strides[0] = b->strides[1], vb.strides[1] = b->strides[0];
  }
  if (b->prepared_bytes) {
    if (c) gemm_fill_f32(c, beta, (float *)y->data, m, n);
    return product_prepared(k, &va, m, kk, n, (float)alpha, c != NULL, (float *)y->data);
  }
  mm_geometry g = {.m = m, .n = n, .k = kk, .batch_nd = 0, .batches = 1};
  mm_operand oa, ob;
  bool ta, tb;
  int64_t lda, ldb;
  void *a_copy, *b_copy = NULL;
  DK_Status st = mm_operand_prepare(k, &va, true, &g, &oa, &ta, &lda, &a_copy);
  if (st == DK_OK) st = mm_operand_prepare(k, &vb, false, &g, &ob, &tb, &ldb, &b_copy);
  if (st == DK_OK) {
    if (c) {
      if (real == LINALG_F64)
        gemm_fill_f64(c, beta, (double *)y->data, m, n);
      else
        gemm_fill_f32(c, beta, (float *)y->data, m, n);
    }
    linalg_gemm(real, ta, tb, m, n, kk, alpha, oa.data, lda, ob.data, ldb, c ? 1.0 : 0.0, y->data, n);
  }
  free(a_copy);
  free(b_copy);
  return st;
}

static DK_Status gemm_low(const dks_kernel_args *k) { return linalg_run_as_f32(k, gemm_float); }

/* MatMul and Gemm read strided inputs in place when BLAS can (transposed
 * views included) and copy them otherwise; outputs are compact. */
static const dks_kernel_def k_linalg_gemm[] = {
    {"MatMul", DK_DTYPE_FLOAT32, matmul_float, DK_KERNEL_STRIDED_INPUTS},
    {"MatMul", DK_DTYPE_FLOAT64, matmul_float, DK_KERNEL_STRIDED_INPUTS},
    {"MatMul", DK_DTYPE_FLOAT16, matmul_low, DK_KERNEL_STRIDED_INPUTS},
    {"MatMul", DK_DTYPE_BFLOAT16, matmul_low, DK_KERNEL_STRIDED_INPUTS},
    {"MatMul", DK_DTYPE_INT32, matmul_int, DK_KERNEL_STRIDED_INPUTS},
    {"MatMul", DK_DTYPE_INT64, matmul_int, DK_KERNEL_STRIDED_INPUTS},
    {"Gemm", DK_DTYPE_FLOAT32, gemm_float, DK_KERNEL_STRIDED_INPUTS},
    {"Gemm", DK_DTYPE_FLOAT64, gemm_float, DK_KERNEL_STRIDED_INPUTS},
    {"Gemm", DK_DTYPE_FLOAT16, gemm_low, DK_KERNEL_STRIDED_INPUTS},
    {"Gemm", DK_DTYPE_BFLOAT16, gemm_low, DK_KERNEL_STRIDED_INPUTS},
};
DKS_REGISTER_KERNELS(k_linalg_gemm)

static const dks_preparer p_linalg_gemm[] = {{"MatMul", prepare_b}, {"Gemm", prepare_b}};
DKS_REGISTER_PREPARERS(p_linalg_gemm)

/* ---- Validators ------------------------------------------------------------------- */

/* Every present input and the output have input 0's dtype. */
static DK_Status check_one_dtype(const dks_kernel_args *k) {
  DK_Status st = DK_OK;
  for (size_t i = 1; st == DK_OK && i < k->num_inputs; i++)
    if (k->in[i].ndim >= 0) st = dks_check_dtype(k, "input", i, k->in[0].dtype);
  return st != DK_OK ? st : dks_check_dtype(k, "output", 0, k->in[0].dtype);
}

/* MatMul: A and B of rank >= 1 (1-D: a row of A, a column of B) with one
 * inner size; their batch dims broadcast; Y batch + (M) + (N). */
static DK_Status validate_matmul(const dks_kernel_args *k) {
  DK_Status st = dks_check_rank(k, 0, 1, DKS_MAX_DIMS);
  if (st == DK_OK) st = dks_check_rank(k, 1, 1, DKS_MAX_DIMS);
  if (st == DK_OK) st = check_one_dtype(k);
  if (st != DK_OK) return st;
  const dks_tensor *a = &k->in[0], *b = &k->in[1];
  int64_t ka = a->shape[a->ndim - 1], kb = b->ndim == 1 ? b->shape[0] : b->shape[b->ndim - 2];
  if (ka != kb) return dks_invalid(k, "A's last dim %lld does not match B's %lld", (long long)ka, (long long)kb);
  int32_t na = a->ndim > 2 ? a->ndim - 2 : 0, nb = b->ndim > 2 ? b->ndim - 2 : 0;
  int32_t nbatch = na > nb ? na : nb, n = 0;
  int64_t shape[DKS_MAX_DIMS + 2];
  for (int32_t d = 0; d < nbatch; d++, n++) {
    int32_t da = d - (nbatch - na), db = d - (nbatch - nb);
    int64_t x = da < 0 ? 1 : a->shape[da], y = db < 0 ? 1 : b->shape[db];
    if (x != y && x != 1 && y != 1)
      return dks_invalid(k, "the batch dims of A and B do not broadcast (%lld against %lld)", (long long)x,
                         (long long)y);
    shape[n] = x == 1 ? y : x;
  }
  if (a->ndim >= 2) shape[n++] = a->shape[a->ndim - 2];
  if (b->ndim >= 2) shape[n++] = b->shape[b->ndim - 1];
  if (n > DKS_MAX_DIMS) return dks_invalid(k, "the output's rank exceeds %d", DKS_MAX_DIMS);
  return dks_check_output(k, 0, n, shape);
}

/* Gemm: 2-D A and B whose op()s chain; C broadcasting unidirectionally to
 * Y (M, N). */
static DK_Status validate_gemm(const dks_kernel_args *k) {
  DK_Status st = dks_check_rank(k, 0, 2, 2);
  if (st == DK_OK) st = dks_check_rank(k, 1, 2, 2);
  if (st == DK_OK) st = check_one_dtype(k);
  if (st != DK_OK) return st;
  const dks_tensor *a = &k->in[0], *b = &k->in[1];
  bool ta = dks_attr_int(k, "transA", 0) != 0, tb = dks_attr_int(k, "transB", 0) != 0;
  int64_t m = a->shape[ta ? 1 : 0], ka = a->shape[ta ? 0 : 1], kb = b->shape[tb ? 1 : 0], n = b->shape[tb ? 0 : 1];
  if (ka != kb)
    return dks_invalid(k, "op(A) is %lldx%lld but op(B) is %lldx%lld", (long long)m, (long long)ka, (long long)kb,
                       (long long)n);
  const int64_t y[] = {m, n};
  if (k->num_inputs > 2 && k->in[2].ndim >= 0) {
    const dks_tensor *c = &k->in[2];
    if (c->ndim > 2) return dks_invalid(k, "C has rank %d; at most 2", c->ndim);
    for (int32_t d = 0; d < c->ndim; d++) {
      int64_t cs = c->shape[c->ndim - 1 - d], ys = y[1 - d];
      if (cs != 1 && cs != ys) return dks_invalid(k, "C does not broadcast to the output (%lld, %lld)", (long long)m,
                                                  (long long)n);
    }
  }
  return dks_check_output(k, 0, 2, y);
}

static const dks_validator v_linalg[] = {
    {"MatMul", validate_matmul},
    {"Gemm", validate_gemm},
};
DKS_REGISTER_VALIDATORS(v_linalg)
