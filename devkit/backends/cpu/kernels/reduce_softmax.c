/*
 * reduce_softmax.c -- Softmax and LogSoftmax (opset 13: along one axis).
 *
 * The input splits around the axis into outer x len x inner; for each outer
 * block, three passes over its rows (maximum, sum of exponentials, outputs)
 * keep one running value per inner position, so every inner loop is
 * contiguous. Softmax caches the exponentials between the last two passes.
 * Everything computes in double and rounds once into the dtype.
 *
 * Stable form: y = exp(x - max) / sum(exp(x - max)) and
 * log y = (x - max) - log(sum(exp(x - max))). As in ONNX's reference (and
 * NumPy with that formula), a NaN or +inf in a slice, or a slice of only
 * -inf, makes the whole slice NaN; -inf elements beside finite ones give 0
 * (-inf for LogSoftmax).
 */
#include "reduce.h"

/* The block is processed `width` inner positions at a time, so that
 * Softmax's cache of exp(x - max) (len x width doubles) stays small. */
#define TILE_DOUBLES (1 << 16)

#define SOFTMAX_KERNELS(S, T, DT, LOAD, STORE)                                                    \
  /* The len x inner block at x, in tiles of `width` inner positions; m and s hold                \
   * width running values, e (Softmax only) len x width exponentials. */                          \
  static void softmax_block_##S(const T *x, T *y, int64_t len, int64_t inner, int64_t width,      \
                                double *m, double *s, double *e, bool log_form) {                 \
    for (int64_t i0 = 0; i0 < inner; i0 += width) {                                               \
      int64_t w = inner - i0 < width ? inner - i0 : width;                                        \
      const T *xt = x + i0;                                                                       \
      T *yt = y + i0;                                                                             \
      for (int64_t j = 0; j < w; j++) {                                                           \
        m[j] = -INFINITY;                                                                         \
        s[j] = 0.0;                                                                               \
      }                                                                                           \
      for (int64_t r = 0; r < len; r++) {                                                         \
        for (int64_t j = 0; j < w; j++) {                                                         \
          double v = LOAD(xt[r * inner + j]);                                                     \
          m[j] = REDUCE_FMAX(m[j], v);                                                            \
        }                                                                                         \
      }                                                                                           \
      if (log_form) {                                                                             \
        for (int64_t r = 0; r < len; r++)                                                         \
          for (int64_t j = 0; j < w; j++) s[j] += exp(LOAD(xt[r * inner + j]) - m[j]);            \
        for (int64_t j = 0; j < w; j++) s[j] = log(s[j]);                                         \
        for (int64_t r = 0; r < len; r++)                                                         \
          for (int64_t j = 0; j < w; j++)                                                         \
            yt[r * inner + j] = STORE((LOAD(xt[r * inner + j]) - m[j]) - s[j]);                   \
      } else {                                                                                    \
        for (int64_t r = 0; r < len; r++) {                                                       \
          for (int64_t j = 0; j < w; j++) {                                                       \
            double v = exp(LOAD(xt[r * inner + j]) - m[j]);                                       \
            e[r * w + j] = v;                                                                     \
            s[j] += v;                                                                            \
          }                                                                                       \
        }                                                                                         \
        for (int64_t r = 0; r < len; r++)                                                         \
          for (int64_t j = 0; j < w; j++) yt[r * inner + j] = STORE(e[r * w + j] / s[j]);         \
      }                                                                                           \
    }                                                                                             \
  }                                                                                               \
                                                                                                  \
  static DK_Status softmax_run_##S(const cpu_kernel_args *k, bool log_form) {                     \
    const cpu_tensor *x = &k->in[0];                                                              \
    int64_t outer, len, inner;                                                                    \
    DK_Status st = reduce_split(k, x, "axis", cpu_attr_int(k, "axis", -1), &outer, &len, &inner); \
    if (st != DK_OK || x->size == 0) return st;                                                   \
    if (k->out[0].size != x->size)                                                                \
      return cpu_kernel_fail(k, DK_INVALID_ARGUMENT, "the output must have the input's shape");   \
    int64_t width = len * inner <= TILE_DOUBLES ? inner : TILE_DOUBLES / len;                     \
    if (width < 1) width = 1;                                                                     \
    size_t cache = log_form ? 0 : (size_t)(len * width);                                          \
    double *m = malloc((2 * (size_t)width + cache) * sizeof *m);                                  \
    if (!m) return cpu_kernel_fail(k, DK_RESOURCE_EXHAUSTED, "out of host memory");               \
    const T *xs = (const T *)x->data;                                                             \
    T *ys = (T *)k->out[0].data;                                                                  \
    for (int64_t o = 0; o < outer; o++)                                                           \
      softmax_block_##S(xs + o * len * inner, ys + o * len * inner, len, inner, width, m,         \
                        m + width, m + 2 * width, log_form);                                      \
    free(m);                                                                                      \
    return DK_OK;                                                                                 \
  }                                                                                               \
                                                                                                  \
  static DK_Status softmax_##S(const cpu_kernel_args *k) { return softmax_run_##S(k, false); }    \
  static DK_Status log_softmax_##S(const cpu_kernel_args *k) { return softmax_run_##S(k, true); }

REDUCE_FLOAT_TYPES(SOFTMAX_KERNELS)

#define ROWS(S, T, DT, LOAD, STORE) \
  {"Softmax", DT, softmax_##S, 0}, {"LogSoftmax", DT, log_softmax_##S, 0},

static const cpu_kernel_def k_reduce_softmax[] = {REDUCE_FLOAT_TYPES(ROWS)};
CPU_REGISTER_KERNELS(k_reduce_softmax)

static const cpu_validator v_reduce_softmax[] = {
    {"Softmax", cpu_validate_axis_like_input},
    {"LogSoftmax", cpu_validate_axis_like_input},
};
CPU_REGISTER_VALIDATORS(v_reduce_softmax)
