/*
 * nn_attention.c -- Attention (opset 23) and RotaryEmbedding kernels.
 *
 * Attention runs per (batch, query head) on blocks of query rows: the
 * scores block is scale * Q K^T (one GEMM), then each row gets softcap, the
 * additive bias (attn_mask, causal), a max-subtracted softmax, and the block
 * is multiplied by V (a second GEMM). The heads split over the thread
 * pool; each is computed as on one thread. float32, float16 and bfloat16
 * compute in float32 (float16/bfloat16 converted on the way in and out),
 * float64 in float64. The float32 GEMMs of up to ATTN_PACKED_KEYS keys run
 * on K^T and V packed per kv head (linalg_packed.h), the others through
 * OpenBLAS. Inputs are compact.
 */
#include <cblas.h>
#include <stdatomic.h>
#include <stdlib.h>

#include "linalg_packed.h"
#include "nn.h"
#include "vmath.h"

/* Elements of the scores block a query-row block may take; bounds scratch
 * memory for long key sequences. */
#define ATTN_SCORE_BUDGET ((int64_t)1 << 20)
/* Query heads split over the pool from about this many multiply-adds a
 * chunk (llama_decoder's 16 heads of 32 x 32 scores, d 16: one a chunk). */
#define ATTN_CHUNK_MACS ((int64_t)1 << 15)
/* float32 products over at most this many keys run on operands packed per
 * kv head: OpenBLAS packs both operands and sets up its buffers at every
 * call, most of the time of llama_decoder's 32 x 32 x 16 products (16 heads:
 * the Attention call took 53 us of its 0.21 ms plan, 2 threads, Zen 5);
 * beyond, a head's packed K^T and V outgrow L2 and OpenBLAS's cache
 * blocking pays. */
#define ATTN_PACKED_KEYS 1024
/* ONNX TensorProto code of softmax_precision=DOUBLE. */
#define ATTN_PRECISION_DOUBLE 11

typedef struct attn_geom {
  int64_t batch, hq, hkv, lq, lkv, past, total, d, dv;
  /* Element strides of Q, K, V and Y between batches (_b), heads (_h) and
   * sequence rows (_r); 3-D inputs interleave the heads within a row. */
  int64_t q_b, q_h, q_r, k_b, k_h, k_r, v_b, v_h, v_r, y_b, y_h, y_r;
  const dks_tensor *mask; /* NULL when absent */
  int64_t mask_strides[4]; /* against (batch, hq, lq, total); 0 where it broadcasts */
  bool causal, wide_softmax;
  int mode; /* qk_matmul_output_mode */
  double scale, softcap;
} attn_geom;

/* One Attention call split over query heads (attention_heads_*). */
typedef struct attn_job {
  const dks_kernel_args *k;
  const attn_geom *g;
  int64_t block;              /* query rows scored at a time */
  atomic_size_t failed_bytes; /* a chunk's scratch that could not be allocated; 0: none */
} attn_job;

static void attn_layout(int64_t heads, int64_t len, int64_t size, bool three_d, int64_t *b,
                        int64_t *h, int64_t *r) {
  *b = heads * len * size;
  *h = three_d ? size : len * size;
  *r = three_d ? heads * size : size;
}

static DK_Status attn_geometry(const dks_kernel_args *k, attn_geom *g) {
  const dks_tensor *q = &k->in[0], *kk = &k->in[1], *v = &k->in[2];
  bool three_d = q->ndim == 3;
  memset(g, 0, sizeof *g);
  g->batch = q->shape[0];
  if (three_d) {
    g->hq = dks_attr_int(k, "q_num_heads", 1);
    g->hkv = dks_attr_int(k, "kv_num_heads", 1);
    g->lq = q->shape[1];
    g->lkv = kk->shape[1];
    g->d = q->shape[2] / g->hq;
    g->dv = v->shape[2] / g->hkv;
  } else {
    g->hq = q->shape[1];
    g->hkv = kk->shape[1];
    g->lq = q->shape[2];
    g->lkv = kk->shape[2];
    g->d = q->shape[3];
    g->dv = v->shape[3];
  }
  g->past = k->num_inputs > 4 && k->in[4].ndim == 4 ? k->in[4].shape[2] : 0;
  g->total = g->past + g->lkv;
  attn_layout(g->hq, g->lq, g->d, three_d, &g->q_b, &g->q_h, &g->q_r);
  attn_layout(g->hkv, g->lkv, g->d, three_d, &g->k_b, &g->k_h, &g->k_r);
  attn_layout(g->hkv, g->lkv, g->dv, three_d, &g->v_b, &g->v_h, &g->v_r);
  attn_layout(g->hq, g->lq, g->dv, three_d, &g->y_b, &g->y_h, &g->y_r);
  if (k->num_inputs > 3 && k->in[3].ndim >= 0) {
    const dks_tensor *m = &k->in[3];
    g->mask = m;
    for (int32_t d = 0; d < 4; d++) {
      int32_t md = d - (4 - m->ndim);
      g->mask_strides[d] = md < 0 || m->shape[md] == 1 ? 0 : m->strides[md];
    }
  }
  g->causal = dks_attr_int(k, "is_causal", 0) != 0;
  g->mode = (int)dks_attr_int(k, "qk_matmul_output_mode", 0);
  g->softcap = dks_attr_float(k, "softcap", 0.0);
  g->wide_softmax = dks_attr_int(k, "softmax_precision", 1) == ATTN_PRECISION_DOUBLE;
  g->scale = dks_attr(k, "scale") ? dks_attr_float(k, "scale", 1.0)
             : g->d ? 1.0 / sqrt((double)g->d) : 1.0;
  /* OpenBLAS takes 32-bit sizes and leading dimensions. */
  const int64_t sizes[] = {g->d, g->dv, g->total, g->q_r, g->y_r};
  for (size_t i = 0; i < sizeof sizes / sizeof sizes[0]; i++)
    if (sizes[i] > INT32_MAX)
      return dks_kernel_fail(k, DK_UNIMPLEMENTED,
                             "a per-head size (head sizes %lld/%lld, %lld keys, rows of %lld/%lld) "
                             "exceeds the 32-bit range of the BLAS",
                             (long long)g->d, (long long)g->dv, (long long)g->total,
                             (long long)g->q_r, (long long)g->y_r);
  return DK_OK;
}

/* present = concat(past, new) along the sequence, in (batch, hkv, total, size)
 * layout whatever the rank of the new keys/values. */
static void attn_present(const attn_geom *g, const dks_tensor *past, const dks_tensor *fresh,
                         int64_t size, int64_t f_b, int64_t f_h, int64_t f_r,
                         const dks_tensor *present) {
  int64_t item = present->itemsize, row = size * item;
  if (present->size == 0) return;
  for (int64_t b = 0; b < g->batch; b++) {
    for (int64_t h = 0; h < g->hkv; h++) {
      uint8_t *dst = present->data + (b * g->hkv + h) * g->total * row;
      if (g->past) {
        memcpy(dst, past->data + (b * g->hkv + h) * g->past * row, (size_t)(g->past * row));
        dst += g->past * row;
      }
      for (int64_t r = 0; r < g->lkv; r++)
        memcpy(dst + r * row, fresh->data + (b * f_b + h * f_h + r * f_r) * item, (size_t)row);
    }
  }
}

/* The additive bias of score (b, h, qi, j): attn_mask (bool: False -> -inf)
 * plus the causal -inf for keys after qi + past. */
static inline double attn_bias(const attn_geom *g, const uint8_t *mask_row, int64_t qi, int64_t j) {
  double bias = 0.0;
  if (mask_row) {
    const uint8_t *p = mask_row + j * g->mask_strides[3] * g->mask->itemsize;
    bias = g->mask->dtype == DK_DTYPE_BOOL ? (*p ? 0.0 : -INFINITY) : dks_load_as_double(p, g->mask->dtype);
  }
  if (g->causal && j > qi + g->past) bias += -INFINITY;
  return bias;
}

/* Softmax of the rows of a block of scores in place, with the rules of
 * ONNX's reference: a row with a NaN (or +inf) is all NaN; a row whose
 * maximum is -inf (every key masked) is all zero. Sums are double.
 * float64 rows, and float32 rows with `wide` (softmax_precision=DOUBLE: a
 * row of doubles for the exponentials), take libm's exp one row at a time.
 * `row_scratch`: `rows` values of the compute type. */
static void attn_softmax_row_f64(double *s, int64_t n) {
  bool has_nan = false;
  double top = -INFINITY;
  for (int64_t j = 0; j < n; j++) {
    has_nan |= isnan(s[j]);
    if (s[j] > top) top = s[j];
  }
  if (has_nan || top == -INFINITY) {
    for (int64_t j = 0; j < n; j++) s[j] = has_nan ? NAN : 0;
    return;
  }
  double sum = 0.0;
  for (int64_t j = 0; j < n; j++) sum += s[j] = exp(s[j] - top);
  for (int64_t j = 0; j < n; j++) s[j] /= sum;
}

static void attn_softmax_f64(double *s, int64_t rows, int64_t n, double *wide, double *row_scratch) {
  (void)wide, (void)row_scratch; /* the exponentials are double already */
  for (int64_t i = 0; i < rows; i++) attn_softmax_row_f64(s + i * n, n);
}

/* Independent double accumulators of a float32 row's sum: vector lanes, in
 * the same order in every clone (the same bits on every ISA). */
#define ATTN_SUM_LANES 8

/* float32 rows: the maximum as ordered integers, vm_expf of the float32
 * differences (as expf did before: at most 1 ulp from it), the sum in
 * ATTN_SUM_LANES double lanes and the product by its reciprocal, each a pass
 * over every row of the block in loops the compiler vectorises: the rows'
 * dependency chains (maximum, exponentials, sum, reciprocal) overlap, where
 * row by row each waited for the one before (512 rows of 32: 35 -> 16 ns a
 * row, Zen 5). A NaN may rank below -inf as an ordered integer, so a row
 * whose maximum is not finite is looked through for one; row_scratch[i]
 * holds row i's maximum, then the reciprocal of its sum, NaN for a row
 * already set (NaN or zero). */
DKS_VECTOR_CLONES static void attn_softmax_f32(float *s, int64_t rows, int64_t n, double *wide,
                                                float *row_scratch) {
  if (wide) {
    for (int64_t i = 0; i < rows; i++) {
      float *r = s + i * n;
      for (int64_t j = 0; j < n; j++) wide[j] = r[j];
      attn_softmax_row_f64(wide, n);
      for (int64_t j = 0; j < n; j++) r[j] = (float)wide[j];
    }
    return;
  }
  for (int64_t i = 0; i < rows; i++) {
    float *r = s + i * n, top = vm_max_f32(r, n);
    row_scratch[i] = top;
    if (top == -INFINITY || top == INFINITY || isnan(top)) {
      bool has_nan = false;
      for (int64_t j = 0; j < n; j++) has_nan |= isnan(r[j]);
      for (int64_t j = 0; j < n; j++) r[j] = top == -INFINITY && !has_nan ? 0.0f : NAN;
      row_scratch[i] = NAN;
    }
  }
  for (int64_t i = 0; i < rows; i++) {
    float *r = s + i * n, top = row_scratch[i];
    if (isnan(top)) continue;
    for (int64_t j = 0; j < n; j++) r[j] = vm_expf(r[j] - top);
  }
  int64_t body = n - n % ATTN_SUM_LANES;
  for (int64_t i = 0; i < rows; i++) {
    float *r = s + i * n;
    if (isnan(row_scratch[i])) continue;
    double lane[ATTN_SUM_LANES] = {0}, sum = 0.0;
    for (int64_t j = 0; j < body; j += ATTN_SUM_LANES)
      for (int l = 0; l < ATTN_SUM_LANES; l++) lane[l] += r[j + l];
    for (int64_t j = body; j < n; j++) sum += r[j];
    for (int l = 0; l < ATTN_SUM_LANES; l++) sum += lane[l];
    if (isnan(sum)) /* a NaN that ranked below the maximum */
      for (int64_t j = 0; j < n; j++) r[j] = NAN;
    row_scratch[i] = isnan(sum) ? NAN : (float)(1.0 / sum); /* the sum is at least 1: the maximum's term */
  }
  for (int64_t i = 0; i < rows; i++) {
    float *r = s + i * n, inv = row_scratch[i];
    if (isnan(inv)) continue;
    for (int64_t j = 0; j < n; j++) r[j] *= inv;
  }
}

/* c = alpha * a b (b^T with trans_b): on `packed`, b's packed form
 * (attn_pack), when given, else through OpenBLAS. */
static void attn_gemm_f32(bool trans_b, int64_t m, int64_t n, int64_t kk, double alpha, const float *a,
                          int64_t lda, const float *b, int64_t ldb, const void *packed, float *c,
                          int64_t ldc) {
  if (packed) {
    packed_gemm(m, n, kk, (float)alpha, a, lda, packed, false, c, ldc);
    return;
  }
  scipy_cblas_sgemm(CblasRowMajor, CblasNoTrans, trans_b ? CblasTrans : CblasNoTrans, (blasint)m,
                    (blasint)n, (blasint)kk, (float)alpha, a, (blasint)lda, b, (blasint)ldb, 0.0f, c,
                    (blasint)ldc);
}

static void attn_gemm_f64(bool trans_b, int64_t m, int64_t n, int64_t kk, double alpha, const double *a,
                          int64_t lda, const double *b, int64_t ldb, const void *packed, double *c,
                          int64_t ldc) {
  (void)packed; /* float64 has no packed form: attn_pack_bytes_f64 is 0 */
  scipy_cblas_dgemm(CblasRowMajor, CblasNoTrans, trans_b ? CblasTrans : CblasNoTrans, (blasint)m,
                    (blasint)n, (blasint)kk, alpha, a, (blasint)lda, b, (blasint)ldb, 0.0, c,
                    (blasint)ldc);
}

/* Bytes of a chunk's packed K^T and V (0: the products go through OpenBLAS). */
static size_t attn_pack_bytes_f32(const attn_geom *g) {
  if (g->total > ATTN_PACKED_KEYS || !g->d || !g->dv) return 0;
  return packed_b_bytes(g->d, g->total) + packed_b_bytes(g->total, g->dv);
}

static size_t attn_pack_bytes_f64(const attn_geom *g) {
  (void)g;
  return 0;
}

/* Packs the rows x cols matrix at b (row stride ldb), or its transpose, as
 * the B of a product into dst; returns dst (NULL: nothing to pack). */
static const void *attn_pack(void *dst, const void *b, bool trans, int64_t ldb, int64_t rows, int64_t cols) {
  if (!dst) return NULL;
  if (trans)
    packed_b_pack(b, 1, ldb, cols, rows, dst);
  else
    packed_b_pack(b, ldb, 1, rows, cols, dst);
  return dst;
}

/* A rows x cols matrix (row stride ld) of a tensor as compute-type values:
 * the tensor's own memory for float32 (*out_ld = ld), else converted into
 * `scratch` (*out_ld = cols). */
static const float *attn_view_f32(const uint8_t *src, DK_DTypeKey dtype, int64_t rows, int64_t cols,
                                  int64_t ld, float *scratch, int64_t *out_ld) {
  if (dtype == DK_DTYPE_FLOAT32) {
    *out_ld = ld;
    return (const float *)src;
  }
  for (int64_t r = 0; r < rows; r++) {
    const uint16_t *in = (const uint16_t *)src + r * ld;
    float *out = scratch + r * cols;
    if (dtype == DK_DTYPE_FLOAT16)
      for (int64_t c = 0; c < cols; c++) out[c] = dks_f16_to_f32(in[c]);
    else
      for (int64_t c = 0; c < cols; c++) out[c] = dks_bf16_to_f32(in[c]);
  }
  *out_ld = cols;
  return scratch;
}

/* float64 is its own compute type: never converted. */
static const double *attn_view_f64(const uint8_t *src, DK_DTypeKey dtype, int64_t rows, int64_t cols,
                                   int64_t ld, double *scratch, int64_t *out_ld) {
  (void)dtype, (void)rows, (void)cols, (void)scratch;
  *out_ld = ld;
  return (const double *)src;
}

/* Stores n compute-type values into a tensor of `dtype`. */
static void attn_put_f32(uint8_t *dst, DK_DTypeKey dtype, const float *src, int64_t n) {
  if (dtype == DK_DTYPE_FLOAT32) {
    memcpy(dst, src, (size_t)n * sizeof *src);
    return;
  }
  uint16_t *out = (uint16_t *)dst;
  if (dtype == DK_DTYPE_FLOAT16)
    for (int64_t i = 0; i < n; i++) out[i] = dks_f32_to_f16(src[i]);
  else
    for (int64_t i = 0; i < n; i++) out[i] = dks_f32_to_bf16(src[i]);
}

static void attn_put_f64(uint8_t *dst, DK_DTypeKey dtype, const double *src, int64_t n) {
  (void)dtype;
  memcpy(dst, src, (size_t)n * sizeof *src);
}

/* Row qi of query head (b, h) in qk_matmul_output. */
static uint8_t *attn_qk_row(const attn_geom *g, const dks_tensor *qk, int64_t b, int64_t h, int64_t qi) {
  return qk->data + ((b * g->hq + h) * g->lq + qi) * g->total * qk->itemsize;
}

/* One instantiation per compute type CT: f32 (float32, float16 and bfloat16
 * storage) and f64.
 *
 * attn_scores: scores[rows x total] = scale * Q[b, h, i0 .. i0 + rows) K^T.
 * attn_row: one query row of scores -> softcap, bias (and the
 *   qk_matmul_output of modes 0-2) in place; the block's rows then go
 *   through attn_softmax together (mode 3 written after).
 * attention_heads: (batch, query head) pairs, each over its row blocks:
 *   Y rows = probabilities V; attention splits the pairs over the pool. */
#define ATTN_IMPL(SUF, CT, TANH)                                                                  \
  static void attn_scores_##SUF(const dks_kernel_args *k, const attn_geom *g, int64_t b,          \
                                int64_t h, int64_t i0, int64_t rows, const CT *keys, int64_t ldk, \
                                const void *kpack, CT *qbuf, CT *scores) {                        \
    const dks_tensor *q = &k->in[0];                                                              \
    if (!g->d) { /* empty dot products */                                                         \
      memset(scores, 0, (size_t)(rows * g->total) * sizeof(CT));                                  \
      return;                                                                                     \
    }                                                                                             \
    int64_t ldq;                                                                                  \
    const uint8_t *src = q->data + (b * g->q_b + h * g->q_h + i0 * g->q_r) * q->itemsize;         \
    const CT *qs = attn_view_##SUF(src, q->dtype, rows, g->d, g->q_r, qbuf, &ldq);                \
    attn_gemm_##SUF(true, rows, g->total, g->d, g->scale, qs, ldq, keys, ldk, kpack, scores,      \
                    g->total);                                                                    \
  }                                                                                               \
                                                                                                  \
  static void attn_row_##SUF(const attn_geom *g, const dks_tensor *qk, int64_t b, int64_t h,      \
                             int64_t qi, CT *s) {                                                 \
    int64_t total = g->total;                                                                     \
    uint8_t *qk_row = attn_qk_row(g, qk, b, h, qi);                                               \
    if (g->mode == 0) attn_put_##SUF(qk_row, qk->dtype, s, total);                                \
    if (g->softcap > 0)                                                                           \
      for (int64_t j = 0; j < total; j++) s[j] = (CT)(g->softcap * TANH(s[j] / (CT)g->softcap));  \
    if (g->mode == 1) attn_put_##SUF(qk_row, qk->dtype, s, total);                                \
    bool all_masked = false;                                                                      \
    if (!g->mask && g->causal) /* key 0 is always seen: never all masked */                       \
      for (int64_t j = qi + g->past + 1; j < total; j++) s[j] = (CT)(s[j] + (CT)-INFINITY);        \
    else if (g->mask || g->causal) {                                                              \
      const uint8_t *mask_row =                                                                   \
          g->mask ? g->mask->data + (b * g->mask_strides[0] + h * g->mask_strides[1] +            \
                                     qi * g->mask_strides[2]) * g->mask->itemsize                 \
                  : NULL;                                                                         \
      all_masked = true;                                                                          \
      for (int64_t j = 0; j < total; j++) {                                                       \
        double bias = attn_bias(g, mask_row, qi, j);                                              \
        all_masked &= bias == -INFINITY;                                                          \
        s[j] = (CT)(s[j] + bias);                                                                 \
      }                                                                                           \
    }                                                                                             \
    if (g->mode == 2) attn_put_##SUF(qk_row, qk->dtype, s, total);                                \
    /* A row whose bias masks every key attends nothing (ONNX 23 errata): all -inf, which the     \
     * softmax makes all zero (a NaN score there must not make it NaN). */                        \
    if (all_masked)                                                                               \
      for (int64_t j = 0; j < total; j++) s[j] = (CT)-INFINITY;                                   \
  }                                                                                               \
                                                                                                  \
  /* Query heads [begin, end) over (batch, head): each its scores, softmax rows and Y rows,      \
   * which no other head's touch, in scratch of the chunk's own. */                              \
  static void attention_heads_##SUF(void *ctx, int64_t begin, int64_t end) {                      \
    attn_job *job = ctx;                                                                          \
    const dks_kernel_args *k = job->k;                                                            \
    const attn_geom *g = job->g;                                                                  \
    const dks_tensor *y = &k->out[0], *pk = &k->out[1], *pv = &k->out[2], *qk = &k->out[3];       \
    DK_DTypeKey dt = y->dtype;                                                                    \
    int64_t item = y->itemsize;                                                                   \
    bool direct = sizeof(CT) == (size_t)item; /* the tensors hold CT: no conversions */           \
    int64_t total = g->total, d = g->d, dv = g->dv, block = job->block;                           \
    /* the scores block, then a value per row for the softmax */                                 \
    size_t n_scores = (size_t)(block * total + block), n_wide = g->wide_softmax ? (size_t)total : 0; \
    size_t n_conv = direct ? 0 : (size_t)((total + block) * (d + dv));                            \
    /* The packed K^T and V first: their panels are read 64-byte aligned. */                      \
    size_t n_pack = attn_pack_bytes_##SUF(g);                                                     \
    size_t bytes = n_pack + (n_scores + n_conv) * sizeof(CT) + n_wide * sizeof(double);           \
    bytes = (bytes + 63) / 64 * 64; /* aligned_alloc takes a multiple of the alignment */        \
    uint8_t *scratch = aligned_alloc(64, bytes ? bytes : 64);                                     \
    if (!scratch) {                                                                               \
      atomic_store(&job->failed_bytes, bytes ? bytes : 64);                                       \
      return;                                                                                     \
    }                                                                                             \
    void *kpack = n_pack ? scratch : NULL;                                                        \
    void *vpack = n_pack ? scratch + packed_b_bytes(d, total) : NULL;                             \
    double *wide = n_wide ? (double *)(scratch + n_pack) : NULL;                                  \
    CT *scores = (CT *)(scratch + n_pack + n_wide * sizeof(double));                              \
    CT *kbuf = NULL, *vbuf = NULL, *qbuf = NULL, *ybuf = NULL; /* float16/bfloat16 in CT */      \
    if (!direct) {                                                                                \
      kbuf = scores + n_scores;                                                                   \
      vbuf = kbuf + total * d;                                                                    \
      qbuf = vbuf + total * dv;                                                                   \
      ybuf = qbuf + block * d;                                                                    \
    }                                                                                             \
    int64_t group = g->hq / g->hkv, ready_kv = -1, ldk = d, ldv = dv;                             \
    const CT *keys = NULL, *vals = NULL;                                                          \
    const void *kp = NULL, *vp = NULL; /* their packed forms */                                   \
    for (int64_t head = begin; head < end; head++) {                                              \
      int64_t b = head / g->hq, h = head % g->hq, kv = b * g->hkv + h / group;                    \
      /* The keys and values of its kv head (float16/bfloat16 converted, then packed), which     \
       * the chunk's next query heads of the group reuse. */                                      \
      if (kv != ready_kv) {                                                                       \
        if (total && d) {                                                                         \
          keys = attn_view_##SUF(pk->data + kv * total * d * item, dt, total, d, d, kbuf, &ldk);  \
          kp = attn_pack(kpack, keys, true, ldk, total, d);                                       \
        }                                                                                         \
        if (total && dv) {                                                                        \
          vals = attn_view_##SUF(pv->data + kv * total * dv * item, dt, total, dv, dv, vbuf, &ldv); \
          vp = attn_pack(vpack, vals, false, ldv, total, dv);                                     \
        }                                                                                         \
        ready_kv = kv;                                                                            \
      }                                                                                           \
      for (int64_t i0 = 0; i0 < g->lq; i0 += block) {                                            \
        int64_t rows = g->lq - i0 < block ? g->lq - i0 : block;                                   \
        if (total) {                                                                              \
          attn_scores_##SUF(k, g, b, h, i0, rows, keys, ldk, kp, qbuf, scores);                   \
          for (int64_t i = 0; i < rows; i++) attn_row_##SUF(g, qk, b, h, i0 + i, scores + i * total); \
          attn_softmax_##SUF(scores, rows, total, wide, scores + block * total);                  \
          for (int64_t i = 0; g->mode == 3 && i < rows; i++)                                      \
            attn_put_##SUF(attn_qk_row(g, qk, b, h, i0 + i), qk->dtype, scores + i * total, total); \
        }                                                                                         \
        if (!dv) continue;                                                                        \
        uint8_t *yrow = y->data + (b * g->y_b + h * g->y_h + i0 * g->y_r) * item;                 \
        CT *out = direct ? (CT *)yrow : ybuf;                                                     \
        int64_t ldy = direct ? g->y_r : dv;                                                       \
        if (total)                                                                                \
          attn_gemm_##SUF(false, rows, dv, total, 1.0, scores, total, vals, ldv, vp, out, ldy);   \
        else /* no keys: every row is fully masked */                                             \
          for (int64_t i = 0; i < rows; i++) memset(out + i * ldy, 0, (size_t)dv * sizeof(CT));   \
        if (!direct)                                                                              \
          for (int64_t i = 0; i < rows; i++)                                                      \
            attn_put_##SUF(yrow + i * g->y_r * item, dt, ybuf + i * dv, dv);                      \
      }                                                                                           \
    }                                                                                             \
    free(scratch);                                                                                \
  }                                                                                               \
                                                                                                  \
  static DK_Status attention_##SUF(const dks_kernel_args *k, const attn_geom *g) {                \
    int64_t total = g->total, block = g->lq;                                                      \
    if (total && block > ATTN_SCORE_BUDGET / total)                                               \
      block = ATTN_SCORE_BUDGET / total > 1 ? ATTN_SCORE_BUDGET / total : 1;                      \
    attn_job job = {.k = k, .g = g, .block = block};                                              \
    atomic_init(&job.failed_bytes, 0);                                                            \
    int64_t heads = g->batch * g->hq, head_macs = g->lq * total * (g->d + g->dv);                 \
    dks_parallel_for(heads, head_macs >= ATTN_CHUNK_MACS ? 1 : ATTN_CHUNK_MACS / (head_macs + 1), \
                     attention_heads_##SUF, &job);                                                \
    size_t failed = atomic_load(&job.failed_bytes);                                               \
    if (failed)                                                                                   \
      return dks_kernel_fail(k, DK_RESOURCE_EXHAUSTED,                                            \
                             "out of host memory for %zu bytes of scratch", failed);              \
    return DK_OK;                                                                                 \
  }

ATTN_IMPL(f32, float, tanhf)
ATTN_IMPL(f64, double, tanh)

static DK_Status attention(const dks_kernel_args *k) {
  attn_geom g;
  DK_Status st = attn_geometry(k, &g);
  if (st != DK_OK) return st;
  const dks_tensor *past_key = k->num_inputs > 4 ? &k->in[4] : NULL;
  const dks_tensor *past_value = k->num_inputs > 5 ? &k->in[5] : NULL;
  attn_present(&g, past_key, &k->in[1], g.d, g.k_b, g.k_h, g.k_r, &k->out[1]);
  attn_present(&g, past_value, &k->in[2], g.dv, g.v_b, g.v_h, g.v_r, &k->out[2]);
  /* Nothing more to compute (this covers zero heads: hkv > 0 below). */
  if (k->out[0].size == 0 && k->out[3].size == 0) return DK_OK;
  return k->in[0].dtype == DK_DTYPE_FLOAT64 ? attention_f64(k, &g) : attention_f32(k, &g);
}

/* ---- RotaryEmbedding ------------------------------------------------------ */

typedef struct rope_geom {
  int64_t batch, seq, heads, head_size, half;
  int64_t x_b, x_s, x_h; /* element strides of X (and Y) */
  bool interleaved;
} rope_geom;

/* Rotates a token's heads: in each, pairs (i, i + half) or (2i, 2i + 1) of
 * the first 2 * half elements; the rest is copied. Products and sums in
 * double. One call a token, the heads' loops inline (a call and a zero-byte
 * memcpy a head took most of llama_decoder's 512 heads of 8 pairs). */
#define ROPE_ROW(SUF, T)                                                                         \
  static void rope_row_##SUF(const rope_geom *g, const T *x, T *y, const T *cos, const T *sin) { \
    int64_t rest = g->head_size - 2 * g->half;                                                   \
    for (int64_t h = 0; h < g->heads; h++, x += g->x_h, y += g->x_h) {                           \
      if (g->interleaved)                                                                        \
        for (int64_t i = 0; i < g->half; i++) {                                                  \
          double c = nn_ld_##SUF(cos, i), s = nn_ld_##SUF(sin, i);                               \
          double x1 = nn_ld_##SUF(x, 2 * i), x2 = nn_ld_##SUF(x, 2 * i + 1);                     \
          nn_st_##SUF(y, 2 * i, c * x1 - s * x2);                                                \
          nn_st_##SUF(y, 2 * i + 1, s * x1 + c * x2);                                            \
        }                                                                                        \
      else                                                                                       \
        for (int64_t i = 0; i < g->half; i++) {                                                  \
          double c = nn_ld_##SUF(cos, i), s = nn_ld_##SUF(sin, i);                               \
          double x1 = nn_ld_##SUF(x, i), x2 = nn_ld_##SUF(x, i + g->half);                       \
          nn_st_##SUF(y, i, c * x1 - s * x2);                                                    \
          nn_st_##SUF(y, i + g->half, s * x1 + c * x2);                                          \
        }                                                                                        \
      if (rest) memcpy(y + 2 * g->half, x + 2 * g->half, (size_t)rest * sizeof(T));              \
    }                                                                                            \
  }

ROPE_ROW(f32, float)
ROPE_ROW(f64, double)
ROPE_ROW(f16, uint16_t)
ROPE_ROW(bf16, uint16_t)

static DK_Status rotary_embedding(const dks_kernel_args *k) {
  const dks_tensor *x = &k->in[0], *cos = &k->in[1], *sin = &k->in[2], *y = &k->out[0];
  const dks_tensor *ids = k->num_inputs > 3 && k->in[3].ndim >= 0 ? &k->in[3] : NULL;
  rope_geom g;
  g.batch = x->shape[0];
  if (x->ndim == 4) {
    g.heads = x->shape[1];
    g.seq = x->shape[2];
    g.head_size = x->shape[3];
  } else {
    g.heads = dks_attr_int(k, "num_heads", 1);
    g.seq = x->shape[1];
    g.head_size = x->shape[2] / g.heads;
  }
  int64_t rotary = dks_attr_int(k, "rotary_embedding_dim", 0);
  g.half = (rotary ? rotary : g.head_size) / 2;
  g.interleaved = dks_attr_int(k, "interleaved", 0) != 0;
  g.x_b = g.heads * g.seq * g.head_size;
  g.x_s = x->ndim == 4 ? g.head_size : g.heads * g.head_size;
  g.x_h = x->ndim == 4 ? g.seq * g.head_size : g.head_size;
  if (x->size == 0) return DK_OK;
  const int64_t *pos = ids ? (const int64_t *)ids->data : NULL;
  int64_t positions = ids ? cos->shape[0] : 0;
  for (int64_t i = 0; pos && i < g.batch * g.seq; i++)
    if (pos[i] < 0 || pos[i] >= positions)
      return dks_kernel_fail(k, DK_OUT_OF_RANGE,
                             "position_ids[%lld, %lld] = %lld is outside [0, %lld), the rows of cos_cache",
                             (long long)(i / g.seq), (long long)(i % g.seq), (long long)pos[i],
                             (long long)positions);
  int64_t item = x->itemsize;
  for (int64_t b = 0; b < g.batch; b++) {
    for (int64_t s = 0; s < g.seq; s++) {
      /* The cache row: the token's position, or its own (b, s) row. */
      int64_t cache_row = pos ? pos[b * g.seq + s] : b * g.seq + s;
      const uint8_t *c = cos->data + cache_row * g.half * item;
      const uint8_t *sn = sin->data + cache_row * g.half * item;
      int64_t off = (b * g.x_b + s * g.x_s) * item;
      const uint8_t *xr = x->data + off;
      uint8_t *yr = y->data + off;
      switch ((int)x->dtype) {
        case DK_DTYPE_FLOAT32:
          rope_row_f32(&g, (const float *)xr, (float *)yr, (const float *)c, (const float *)sn);
          break;
        case DK_DTYPE_FLOAT64:
          rope_row_f64(&g, (const double *)xr, (double *)yr, (const double *)c, (const double *)sn);
          break;
        case DK_DTYPE_FLOAT16:
          rope_row_f16(&g, (const uint16_t *)xr, (uint16_t *)yr, (const uint16_t *)c,
                       (const uint16_t *)sn);
          break;
        default:
          rope_row_bf16(&g, (const uint16_t *)xr, (uint16_t *)yr, (const uint16_t *)c,
                        (const uint16_t *)sn);
          break;
      }
    }
  }
  return DK_OK;
}

static const dks_kernel_def k_nn_attention[] = {
    {"Attention", DK_DTYPE_FLOAT32, attention, 0},
    {"Attention", DK_DTYPE_FLOAT64, attention, 0},
    {"Attention", DK_DTYPE_FLOAT16, attention, 0},
    {"Attention", DK_DTYPE_BFLOAT16, attention, 0},
    {"RotaryEmbedding", DK_DTYPE_FLOAT32, rotary_embedding, 0},
    {"RotaryEmbedding", DK_DTYPE_FLOAT64, rotary_embedding, 0},
    {"RotaryEmbedding", DK_DTYPE_FLOAT16, rotary_embedding, 0},
    {"RotaryEmbedding", DK_DTYPE_BFLOAT16, rotary_embedding, 0},
};
DKS_REGISTER_KERNELS(k_nn_attention)

/* ---- Validators ------------------------------------------------------------ */

/* Input i, when present, has dtype `dtype` and the given shape. */
static DK_Status check_input_shape(const dks_kernel_args *k, size_t i, int32_t ndim, const int64_t *shape,
                                   DK_DTypeKey dtype) {
  const dks_tensor *t = &k->in[i];
  bool same = t->ndim == ndim;
  for (int32_t d = 0; same && d < ndim; d++) same = t->shape[d] == shape[d];
  if (!same) return dks_invalid(k, "input %zu's shape disagrees with the other inputs'", i);
  return dks_check_dtype(k, "input", i, dtype);
}

/* Int attribute `name`, when present, is at least 1 (heads). */
static DK_Status check_heads(const dks_kernel_args *k, const char *name) {
  int64_t n = dks_attr_int(k, name, 1);
  return n >= 1 ? DK_OK : dks_invalid(k, "attribute '%s' is %lld; it must be at least 1", name, (long long)n);
}

/* Attention: Q, K, V all 3-D (heads from the attributes, dividing the hidden
 * sizes) or all 4-D; one batch, head size and key length; Hkv divides Hq;
 * past_key/past_value together, (B, Hkv, P, D/Dv); attn_mask bool or Q's
 * dtype, broadcasting to (B, Hq, Lq, P + Lkv); the four outputs, which the
 * kernel always writes, with the shapes those give. */
static DK_Status validate_attention(const dks_kernel_args *k) {
  DK_Status st = dks_check_rank(k, 0, 3, 4);
  const dks_tensor *q = &k->in[0], *kk = &k->in[1], *v = &k->in[2];
  if (st == DK_OK) st = dks_check_rank(k, 1, q->ndim, q->ndim);
  if (st == DK_OK) st = dks_check_rank(k, 2, q->ndim, q->ndim);
  if (st == DK_OK) st = check_heads(k, "q_num_heads");
  if (st == DK_OK) st = check_heads(k, "kv_num_heads");
  for (size_t i = 1; st == DK_OK && i < 3; i++) st = dks_check_dtype(k, "input", i, q->dtype);
  if (st != DK_OK) return st;
  if (k->num_outputs != 4) return dks_invalid(k, "the kernel writes all 4 outputs; the call has %zu", k->num_outputs);
  int64_t batch = q->shape[0], hq, hkv, lq, lkv, d, dk, dv, v_len;
  if (q->ndim == 3) {
    if (!dks_attr(k, "q_num_heads") || !dks_attr(k, "kv_num_heads"))
      return dks_invalid(k, "3-D Q, K and V need the q_num_heads and kv_num_heads attributes");
    hq = dks_attr_int(k, "q_num_heads", 1);
    hkv = dks_attr_int(k, "kv_num_heads", 1);
    if (q->shape[2] % hq || kk->shape[2] % hkv || v->shape[2] % hkv)
      return dks_invalid(k, "hidden sizes %lld, %lld, %lld are not multiples of the heads %lld, %lld",
                         (long long)q->shape[2], (long long)kk->shape[2], (long long)v->shape[2],
                         (long long)hq, (long long)hkv);
    lq = q->shape[1], lkv = kk->shape[1], v_len = v->shape[1];
    d = q->shape[2] / hq, dk = kk->shape[2] / hkv, dv = v->shape[2] / hkv;
  } else {
    hq = q->shape[1], hkv = kk->shape[1], lq = q->shape[2], lkv = kk->shape[2], v_len = v->shape[2];
    d = q->shape[3], dk = kk->shape[3], dv = v->shape[3];
    if (dks_attr_int(k, "q_num_heads", hq) != hq || dks_attr_int(k, "kv_num_heads", hkv) != hkv ||
        v->shape[1] != hkv)
      return dks_invalid(k, "the heads of Q (%lld), K (%lld), V (%lld) and the attributes disagree",
                         (long long)hq, (long long)hkv, (long long)v->shape[1]);
  }
  if (kk->shape[0] != batch || v->shape[0] != batch || dk != d || v_len != lkv)
    return dks_invalid(k, "Q, K and V disagree on the batch, the head size or the key length");
  if (hkv ? hq % hkv : hq)
    return dks_invalid(k, "q_num_heads %lld is not a multiple of kv_num_heads %lld", (long long)hq, (long long)hkv);
  bool has_past_key = k->num_inputs > 4 && k->in[4].ndim >= 0;
  bool has_past_value = k->num_inputs > 5 && k->in[5].ndim >= 0;
  if (has_past_key != has_past_value) return dks_invalid(k, "past_key and past_value must be given together");
  int64_t past = 0;
  if (has_past_key) {
    if (k->in[4].ndim != 4) return dks_invalid(k, "past_key must be 4-D, got rank %d", k->in[4].ndim);
    past = k->in[4].shape[2];
    const int64_t past_key[] = {batch, hkv, past, d}, past_value[] = {batch, hkv, past, dv};
    st = check_input_shape(k, 4, 4, past_key, q->dtype);
    if (st == DK_OK) st = check_input_shape(k, 5, 4, past_value, q->dtype);
    if (st != DK_OK) return st;
  }
  int64_t total = past + lkv;
  const int64_t scores[] = {batch, hq, lq, total};
  if (k->num_inputs > 3 && k->in[3].ndim >= 0) {
    const dks_tensor *m = &k->in[3];
    if (m->dtype != DK_DTYPE_BOOL && m->dtype != q->dtype)
      return dks_invalid(k, "attn_mask must be bool or Q's dtype");
    if (m->ndim > 4) return dks_invalid(k, "attn_mask has rank %d; at most 4", m->ndim);
    for (int32_t i = 0; i < m->ndim; i++) {
      int64_t n = m->shape[m->ndim - 1 - i];
      if (n != 1 && n != scores[3 - i])
        return dks_invalid(k, "attn_mask does not broadcast to (B, Hq, Lq, P + Lkv)");
    }
  }
  if ((st = dks_check_float(k, "scale", 0.0)) != DK_OK || (st = dks_check_float(k, "softcap", 0.0)) != DK_OK)
    return st;
  const int64_t y3[] = {batch, lq, hq * dv}, y4[] = {batch, hq, lq, dv};
  const int64_t present_key[] = {batch, hkv, total, d}, present_value[] = {batch, hkv, total, dv};
  st = dks_check_output(k, 0, q->ndim, q->ndim == 3 ? y3 : y4);
  if (st == DK_OK) st = dks_check_output(k, 1, 4, present_key);
  if (st == DK_OK) st = dks_check_output(k, 2, 4, present_value);
  if (st == DK_OK) st = dks_check_output(k, 3, 4, scores);
  for (size_t j = 0; st == DK_OK && j < 4; j++) st = dks_check_dtype(k, "output", j, q->dtype);
  return st;
}

/* RotaryEmbedding: X 4-D, or 3-D with num_heads dividing its hidden size; an
 * even rotary dim within the head size; the caches (B, S, R/2), or, with
 * int64 position_ids (B, S), (positions, R/2); Y like X. */
static DK_Status validate_rotary_embedding(const dks_kernel_args *k) {
  DK_Status st = dks_check_rank(k, 0, 3, 4);
  if (st == DK_OK) st = check_heads(k, "num_heads");
  if (st != DK_OK) return st;
  const dks_tensor *x = &k->in[0], *cos = &k->in[1];
  int64_t batch = x->shape[0], seq, head_size, heads = dks_attr_int(k, "num_heads", 1);
  if (x->ndim == 4) {
    if (dks_attr(k, "num_heads") && heads != x->shape[1])
      return dks_invalid(k, "num_heads=%lld disagrees with X's %lld heads", (long long)heads,
                         (long long)x->shape[1]);
    seq = x->shape[2], head_size = x->shape[3];
  } else {
    if (!dks_attr(k, "num_heads")) return dks_invalid(k, "3-D X needs the num_heads attribute");
    if (x->shape[2] % heads)
      return dks_invalid(k, "X's hidden size %lld is not a multiple of num_heads %lld", (long long)x->shape[2],
                         (long long)heads);
    seq = x->shape[1], head_size = x->shape[2] / heads;
  }
  int64_t rotary = dks_attr_int(k, "rotary_embedding_dim", 0);
  if (!rotary) rotary = head_size;
  if (rotary < 0 || rotary % 2 || rotary > head_size)
    return dks_invalid(k, "the rotary dim %lld must be even and at most the head size %lld", (long long)rotary,
                       (long long)head_size);
  bool ids = k->num_inputs > 3 && k->in[3].ndim >= 0;
  if (ids) {
    const int64_t want[] = {batch, seq};
    st = check_input_shape(k, 3, 2, want, DK_DTYPE_INT64);
    if (st == DK_OK && (cos->ndim != 2 || cos->shape[1] != rotary / 2))
      st = dks_invalid(k, "with position_ids, cos_cache must be (positions, %lld)", (long long)(rotary / 2));
  } else {
    const int64_t want[] = {batch, seq, rotary / 2};
    st = check_input_shape(k, 1, 3, want, x->dtype);
  }
  if (st == DK_OK) st = check_input_shape(k, 1, cos->ndim, cos->shape, x->dtype);
  if (st == DK_OK) st = check_input_shape(k, 2, cos->ndim, cos->shape, x->dtype);
  if (st == DK_OK) st = dks_check_output_like(k, 0, 0);
  return st != DK_OK ? st : dks_check_dtype(k, "output", 0, x->dtype);
}

static const dks_validator v_nn_attention[] = {
    {"Attention", validate_attention},
    {"RotaryEmbedding", validate_rotary_embedding},
};
DKS_REGISTER_VALIDATORS(v_nn_attention)
