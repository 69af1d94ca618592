/*
 * reduce_softmax.c -- Softmax and LogSoftmax (opset 13: along one axis).
 *
 * The input splits around the axis into outer x len x inner. With inner 1
 * (the axis is the last) every slice is a contiguous row: passes over it
 * for its maximum, its exponentials (kept in a row of doubles), their sum
 * and the outputs, each a loop of independent lanes the compiler
 * vectorises. With inner > 1 the passes keep one running value per inner
 * position instead, so every inner loop is contiguous. Work splits over
 * rows (or outer blocks) with dks_parallel_for.
 *
 * Precision: the operators' tolerance is 1 ulp of float32, so values go
 * through double: x - max is exact there (in float32 it rounds by up to half
 * an ulp of |x - max|, an error exp multiplies by |x - max|), the fast exp
 * (vmath.h) is good to a few double ulps, and each output rounds once.
 *
 * Stable form: y = exp(x - max) / sum(exp(x - max)) and
 * log y = (x - max) - log(sum(exp(x - max))). As in ONNX's reference (and
 * NumPy with that formula), a NaN or +inf in a slice, or a slice of only
 * -inf, makes the whole slice NaN; -inf elements beside finite ones give 0
 * (-inf for LogSoftmax).
 */
#include "reduce.h"
#include "vmath.h"

/* The block is processed `width` inner positions at a time, so that
 * the cache of exp(x - max) (len x width doubles) stays small. */
#define TILE_DOUBLES (1 << 16)
/* Independent accumulators of a row pass: vector lanes. */
#define LANES 8
/* Rows of a row kernel's passes (softmax_row_*). */
#define SOFTMAX_BLOCK_ROWS 16
/* Elements per dks_parallel_for chunk, about. */
#define CHUNK_ELEMENTS ((int64_t)1 << 15)

/* The exponential of the row kernels (x <= 0): to a few double ulps for a
 * float64 output, to 2^-32 relative (half the work) for a narrower one,
 * which rounds it once. `wide` is a constant in every kernel. */
static inline __attribute__((always_inline)) double softmax_exp(double x, bool wide) {
  return wide ? vm_exp_nonpositive(x, -746.0) : vm_exp_nonpositive_narrow(x);
}

typedef struct softmax_job {
  const uint8_t *x;
  uint8_t *y;
  int64_t len, inner, width;
  bool log_form;
  int failed; /* a chunk ran out of memory */
} softmax_job;

#define SOFTMAX_KERNELS(S, T, DT, LOAD, STORE)                                                    \
  /* The maximum of a contiguous row of len elements. */                                         \
  static inline __attribute__((always_inline)) double softmax_max_##S(const T *x, int64_t len) {  \
    if (DT == DK_DTYPE_FLOAT32) return vm_max_f32((const float *)x, len);                         \
    /* float64 in a row of lanes, which vectorises; float16/bfloat16 convert element by          \
     * element and keep 8 lanes in registers (64 measured 9% slower there) */                     \
    enum { W = DT == DK_DTYPE_FLOAT64 ? REDUCE_EXTREMUM_LANES : LANES };                          \
    double lanes[W], m = -INFINITY;                                                               \
    int64_t whole = len - len % W;                                                                \
    for (int j = 0; j < W; j++) lanes[j] = -INFINITY;                                             \
    for (int64_t i = 0; i < whole; i += W)                                                        \
      for (int j = 0; j < W; j++) lanes[j] = REDUCE_FMAX(lanes[j], LOAD(x[i + j]));               \
    for (int j = 0; j < W; j++) m = REDUCE_FMAX(m, lanes[j]);                                     \
    for (int64_t i = whole; i < len; i++) m = REDUCE_FMAX(m, LOAD(x[i]));                         \
    return m;                                                                                     \
  }                                                                                               \
  /* `rows` contiguous rows of len elements; e: rows x len doubles of scratch, m and s: rows. Each \
   * step is a pass over all the rows, so that the rows' chains (maximum, exponentials, sum,     \
   * outputs) overlap: row by row, each waited for the one before (256 rows of 32 float32, as    \
   * transformer_encoder's: 8.4 us a call, 1 thread, Zen 5). */                                   \
  static inline __attribute__((always_inline)) void softmax_row_##S(const T *x, T *y, int64_t rows, \
                                     int64_t len, double *e, double *m, double *s, bool log_form, bool wide) { \
    int64_t body = len - len % LANES;                                                             \
    for (int64_t r = 0; r < rows; r++) m[r] = softmax_max_##S(x + r * len, len);                  \
    /* The exponentials in a loop of their own, then their sum: one loop doing both ran          \
     * 1.26 ns an element on a Zen 4 (AVX-512 clone, from L1), these two 0.75 + 0.11. */          \
    for (int64_t r = 0; r < rows; r++)                                                            \
      for (int64_t i = 0; i < len; i++) e[r * len + i] = softmax_exp(LOAD(x[r * len + i]) - m[r], wide); \
    for (int64_t r = 0; r < rows; r++) {                                                          \
      const double *er = e + r * len;                                                             \
      double lane[LANES], sum = 0.0;                                                              \
      for (int j = 0; j < LANES; j++) lane[j] = 0.0;                                              \
      for (int64_t i = 0; i < body; i += LANES)                                                   \
        for (int j = 0; j < LANES; j++) lane[j] += er[i + j];                                     \
      for (int64_t i = body; i < len; i++) sum += er[i];                                          \
      sum += ((lane[0] + lane[1]) + (lane[2] + lane[3])) + ((lane[4] + lane[5]) + (lane[6] + lane[7])); \
      s[r] = log_form ? log(sum) : 1.0 / sum;                                                     \
    }                                                                                             \
    for (int64_t r = 0; r < rows; r++) {                                                          \
      const T *xr = x + r * len;                                                                  \
      T *yr = y + r * len;                                                                        \
      if (log_form) {                                                                             \
        double max = m[r], log_s = s[r];                                                          \
        for (int64_t i = 0; i < len; i++) yr[i] = STORE((LOAD(xr[i]) - max) - log_s);             \
      } else {                                                                                    \
        double inv = s[r];                                                                        \
        for (int64_t i = 0; i < len; i++) yr[i] = STORE(e[r * len + i] * inv);                    \
      }                                                                                           \
    }                                                                                             \
  }                                                                                               \
  DKS_VECTOR_CLONES static void softmax_rows_##S(void *ctx, int64_t begin, int64_t end) {             \
    softmax_job *job = ctx;                                                                       \
    /* rows passed over together: up to SOFTMAX_BLOCK_ROWS, within TILE_DOUBLES of exponentials */ \
    int64_t block = TILE_DOUBLES / job->len;                                                      \
    block = block < 1 ? 1 : block > SOFTMAX_BLOCK_ROWS ? SOFTMAX_BLOCK_ROWS : block;              \
    double *e = malloc((size_t)(job->len * block + 2 * block) * sizeof *e);                       \
    if (!e) {                                                                                     \
      __atomic_store_n(&job->failed, 1, __ATOMIC_RELAXED);                                        \
      return;                                                                                     \
    }                                                                                             \
    bool wide = DT == DK_DTYPE_FLOAT64;                     \
    for (int64_t r = begin; r < end; r += block)                                                  \
      softmax_row_##S((const T *)job->x + r * job->len, (T *)job->y + r * job->len,               \
                      end - r < block ? end - r : block, job->len, e, e + job->len * block,        \
                      e + job->len * block + block, job->log_form, wide);                         \
    free(e);                                                                                      \
  }                                                                                               \
  /* The len x inner block at x, in tiles of `width` inner positions; m and s hold                \
   * width running values, e len x width exponentials. Inlined into the vector                    \
   * clones below: a call from them ran the baseline code. */                                     \
  static inline __attribute__((always_inline)) void softmax_block_##S(                            \
      const T *x, T *y, int64_t len, int64_t inner, int64_t width, double *m, double *s, double *e, \
      bool log_form, bool wide) {                                                                 \
    for (int64_t i0 = 0; i0 < inner; i0 += width) {                                               \
      int64_t w = inner - i0 < width ? inner - i0 : width;                                        \
      const T *xt = x + i0;                                                                       \
      T *yt = y + i0;                                                                             \
      for (int64_t j = 0; j < w; j++) {                                                           \
        m[j] = -INFINITY;                                                                         \
        s[j] = 0.0;                                                                               \
      }                                                                                           \
      for (int64_t r = 0; r < len; r++)                                                           \
        for (int64_t j = 0; j < w; j++) m[j] = REDUCE_FMAX(m[j], LOAD(xt[r * inner + j]));        \
      /* the exponentials, then their sums (as in the rows: apart, each loop is faster) */        \
      for (int64_t r = 0; r < len; r++)                                                           \
        for (int64_t j = 0; j < w; j++) e[r * w + j] = softmax_exp(LOAD(xt[r * inner + j]) - m[j], wide); \
      for (int64_t r = 0; r < len; r++)                                                           \
        for (int64_t j = 0; j < w; j++) s[j] += e[r * w + j];                                     \
      if (log_form) {                                                                             \
        for (int64_t j = 0; j < w; j++) s[j] = log(s[j]);                                         \
        for (int64_t r = 0; r < len; r++)                                                         \
          for (int64_t j = 0; j < w; j++)                                                         \
            yt[r * inner + j] = STORE((LOAD(xt[r * inner + j]) - m[j]) - s[j]);                   \
      } else {                                                                                    \
        for (int64_t j = 0; j < w; j++) s[j] = 1.0 / s[j];                                        \
        for (int64_t r = 0; r < len; r++)                                                         \
          for (int64_t j = 0; j < w; j++) yt[r * inner + j] = STORE(e[r * w + j] * s[j]);         \
      }                                                                                           \
    }                                                                                             \
  }                                                                                               \
  DKS_VECTOR_CLONES static void softmax_blocks_##S(void *ctx, int64_t begin, int64_t end) {           \
    softmax_job *job = ctx;                                                                       \
    size_t cache = (size_t)(job->len * job->width);                                               \
    double *m = malloc((2 * (size_t)job->width + cache) * sizeof *m);                             \
    if (!m) {                                                                                     \
      __atomic_store_n(&job->failed, 1, __ATOMIC_RELAXED);                                        \
      return;                                                                                     \
    }                                                                                             \
    bool wide = DT == DK_DTYPE_FLOAT64;                     \
    int64_t block = job->len * job->inner;                                                        \
    for (int64_t o = begin; o < end; o++)                                                         \
      softmax_block_##S((const T *)job->x + o * block, (T *)job->y + o * block, job->len,         \
                        job->inner, job->width, m, m + job->width, m + 2 * job->width,            \
                        job->log_form, wide);                                                    \
    free(m);                                                                                      \
  }                                                                                               \
                                                                                                  \
  static DK_Status softmax_run_##S(const dks_kernel_args *k, bool log_form) {                     \
    const dks_tensor *x = &k->in[0];                                                              \
    int64_t outer, len, inner;                                                                    \
    DK_Status st = reduce_split(k, x, "axis", dks_attr_int(k, "axis", -1), &outer, &len, &inner); \
    if (st != DK_OK || x->size == 0) return st;                                                   \
    if (k->out[0].size != x->size)                                                                \
      return dks_kernel_fail(k, DK_INVALID_ARGUMENT, "the output must have the input's shape");   \
    int64_t width = len * inner <= TILE_DOUBLES ? inner : TILE_DOUBLES / len;                     \
    softmax_job job = {.x = x->data, .y = k->out[0].data, .len = len, .inner = inner,             \
                       .width = width < 1 ? 1 : width, .log_form = log_form};                     \
    int64_t per_item = len * inner, grain = per_item >= CHUNK_ELEMENTS ? 1 : CHUNK_ELEMENTS / per_item; \
    dks_parallel_for(outer, grain, inner == 1 ? softmax_rows_##S : softmax_blocks_##S, &job);     \
    if (job.failed) return dks_kernel_fail(k, DK_RESOURCE_EXHAUSTED, "out of host memory");       \
    return DK_OK;                                                                                 \
  }                                                                                               \
                                                                                                  \
  static DK_Status softmax_##S(const dks_kernel_args *k) { return softmax_run_##S(k, false); }    \
  static DK_Status log_softmax_##S(const dks_kernel_args *k) { return softmax_run_##S(k, true); }

REDUCE_FLOAT_TYPES(SOFTMAX_KERNELS)

#define ROWS(S, T, DT, LOAD, STORE) \
  {"Softmax", DT, softmax_##S, 0}, {"LogSoftmax", DT, log_softmax_##S, 0},

static const dks_kernel_def k_reduce_softmax[] = {REDUCE_FLOAT_TYPES(ROWS)};
DKS_REGISTER_KERNELS(k_reduce_softmax)

static const dks_validator v_reduce_softmax[] = {
    {"Softmax", dks_validate_axis_like_input},
    {"LogSoftmax", dks_validate_axis_like_input},
};
DKS_REGISTER_VALIDATORS(v_reduce_softmax)
