/*
 * reduce_arg.c -- ArgMax, ArgMin and Hardmax.
 *
 * The input splits around the axis into outer x len x inner. For each outer
 * block the running winner of the `inner` positions is updated row by row,
 * so the inner loop reads contiguous memory whichever axis is reduced.
 *
 * NaN wins both ways, as in NumPy's argmax/argmin: the first NaN (the last
 * one with select_last_index). Otherwise the first extreme, or the last with
 * select_last_index. Hardmax marks ArgMax's first winner.
 */
#include "reduce.h"

/* "v replaces the running winner b"; for integer keys the NaN tests fold away. */
#define BEATS_MAX_FIRST(v, b) ((v) > (b) || ((v) != (v) && (b) == (b)))
#define BEATS_MAX_LAST(v, b) ((v) >= (b) || (v) != (v))
#define BEATS_MIN_FIRST(v, b) ((v) < (b) || ((v) != (v) && (b) == (b)))
#define BEATS_MIN_LAST(v, b) ((v) <= (b) || (v) != (v))

/* idx[i] = the winning row among the len rows of `inner` elements at x;
 * best holds `inner` keys of scratch. */
#define ARG_SCAN(NAME, T, K, LOAD, BEATS)                                           \
  static void NAME(const T *x, int64_t len, int64_t inner, K *best, int64_t *idx) { \
    if (inner == 1) { /* the last axis: one contiguous scan */                      \
      K b = (K)LOAD(x[0]);                                                          \
      int64_t at = 0;                                                               \
      for (int64_t r = 1; r < len; r++) {                                           \
        K v = (K)LOAD(x[r]);                                                        \
        if (BEATS(v, b)) {                                                          \
          b = v;                                                                    \
          at = r;                                                                   \
        }                                                                           \
      }                                                                             \
      *idx = at;                                                                    \
      return;                                                                       \
    }                                                                               \
    for (int64_t i = 0; i < inner; i++) {                                           \
      best[i] = (K)LOAD(x[i]);                                                      \
      idx[i] = 0;                                                                   \
    }                                                                               \
    for (int64_t r = 1; r < len; r++) {                                             \
      const T *row = x + r * inner;                                                 \
      for (int64_t i = 0; i < inner; i++) {                                         \
        K v = (K)LOAD(row[i]);                                                      \
        if (BEATS(v, best[i])) {                                                    \
          best[i] = v;                                                              \
          idx[i] = r;                                                               \
        }                                                                           \
      }                                                                             \
    }                                                                               \
  }

/* Splits the input around attribute "axis" and checks the output holds one
 * element per (outer, inner) position. */
static DK_Status arg_layout(const dks_kernel_args *k, int64_t *outer, int64_t *len,
                            int64_t *inner) {
  DK_Status st = reduce_split(k, &k->in[0], "axis", dks_attr_int(k, "axis", 0), outer, len, inner);
  if (st != DK_OK) return st;
  if (k->out[0].dtype != DK_DTYPE_INT64 || k->out[0].size != *outer * *inner)
    return dks_kernel_fail(k, DK_INVALID_ARGUMENT,
                           "the output must be int64 with %lld elements (one per reduced slice)",
                           (long long)(*outer * *inner));
  if (*len == 0 && *outer * *inner != 0)
    return dks_kernel_fail(k, DK_INVALID_ARGUMENT,
                           "the reduced axis is empty: there is no extreme to index");
  return DK_OK;
}

#define ARG_KERNEL(NAME, T, K, LOAD, FIRST, LAST)                                      \
  ARG_SCAN(NAME##_first, T, K, LOAD, FIRST)                                            \
  ARG_SCAN(NAME##_last, T, K, LOAD, LAST)                                              \
  static DK_Status NAME(const dks_kernel_args *k) {                                    \
    int64_t outer, len, inner;                                                         \
    DK_Status st = arg_layout(k, &outer, &len, &inner);                                \
    if (st != DK_OK || outer * inner == 0) return st;                                  \
    K *best = malloc((size_t)inner * sizeof *best);                                    \
    if (!best) return dks_kernel_fail(k, DK_RESOURCE_EXHAUSTED, "out of host memory"); \
    bool last = dks_attr_int(k, "select_last_index", 0) != 0;                          \
    const T *x = (const T *)k->in[0].data;                                             \
    int64_t *out = (int64_t *)k->out[0].data;                                          \
    for (int64_t o = 0; o < outer; o++) {                                              \
      if (last)                                                                        \
        NAME##_last(x + o * len * inner, len, inner, best, out + o * inner);           \
      else                                                                             \
        NAME##_first(x + o * len * inner, len, inner, best, out + o * inner);          \
    }                                                                                  \
    free(best);                                                                        \
    return DK_OK;                                                                      \
  }

/* Hardmax: 1 at ArgMax's first winner along the axis, 0 elsewhere. */
#define HARDMAX_KERNEL(NAME, T, LOAD, STORE)                                                      \
  ARG_SCAN(NAME##_scan, T, double, LOAD, BEATS_MAX_FIRST)                                         \
  static DK_Status NAME(const dks_kernel_args *k) {                                               \
    const dks_tensor *x = &k->in[0];                                                              \
    int64_t outer, len, inner;                                                                    \
    DK_Status st = reduce_split(k, x, "axis", dks_attr_int(k, "axis", -1), &outer, &len, &inner); \
    if (st != DK_OK || x->size == 0) return st;                                                   \
    if (k->out[0].size != x->size)                                                                \
      return dks_kernel_fail(k, DK_INVALID_ARGUMENT, "the output must have the input's shape");   \
    double *best = malloc((size_t)inner * sizeof *best);                                          \
    int64_t *idx = malloc((size_t)inner * sizeof *idx);                                           \
    if (!best || !idx) {                                                                          \
      free(best);                                                                                 \
      free(idx);                                                                                  \
      return dks_kernel_fail(k, DK_RESOURCE_EXHAUSTED, "out of host memory");                     \
    }                                                                                             \
    const T *xs = (const T *)x->data;                                                             \
    T *y = (T *)k->out[0].data;                                                                   \
    const T one = STORE(1.0);                                                                     \
    memset(y, 0, (size_t)x->size * sizeof *y); /* +0 is all-zero bits in every float type */      \
    for (int64_t o = 0; o < outer; o++) {                                                         \
      NAME##_scan(xs + o * len * inner, len, inner, best, idx);                                   \
      for (int64_t i = 0; i < inner; i++) y[(o * len + idx[i]) * inner + i] = one;                \
    }                                                                                             \
    free(best);                                                                                   \
    free(idx);                                                                                    \
    return DK_OK;                                                                                 \
  }

#define FLOAT_ARG_KERNELS(S, T, DT, LOAD, STORE)                           \
  ARG_KERNEL(argmax_##S, T, double, LOAD, BEATS_MAX_FIRST, BEATS_MAX_LAST) \
  ARG_KERNEL(argmin_##S, T, double, LOAD, BEATS_MIN_FIRST, BEATS_MIN_LAST) \
  HARDMAX_KERNEL(hardmax_##S, T, LOAD, STORE)
REDUCE_FLOAT_TYPES(FLOAT_ARG_KERNELS)

#define INT_KEY(x) ((int64_t)(x))
#define INT_ARG_KERNELS(S, T, U, DT, LO, HI)                                   \
  ARG_KERNEL(argmax_##S, T, int64_t, INT_KEY, BEATS_MAX_FIRST, BEATS_MAX_LAST) \
  ARG_KERNEL(argmin_##S, T, int64_t, INT_KEY, BEATS_MIN_FIRST, BEATS_MIN_LAST)
REDUCE_INT_TYPES(INT_ARG_KERNELS)

#define FLOAT_ROWS(S, T, DT, LOAD, STORE) \
  {"ArgMax", DT, argmax_##S, 0}, {"ArgMin", DT, argmin_##S, 0}, {"Hardmax", DT, hardmax_##S, 0},
#define INT_ROWS(S, T, U, DT, LO, HI) {"ArgMax", DT, argmax_##S, 0}, {"ArgMin", DT, argmin_##S, 0},

static const dks_kernel_def k_reduce_arg[] = {
    REDUCE_FLOAT_TYPES(FLOAT_ROWS)
    REDUCE_INT_TYPES(INT_ROWS)
};
DKS_REGISTER_KERNELS(k_reduce_arg)

/* ArgMax/ArgMin: "axis" inside data's rank; an int64 output, the axis
 * dropped or kept as 1. */
static DK_Status validate_arg(const dks_kernel_args *k) {
  int64_t axis;
  DK_Status st = dks_check_rank(k, 0, 0, DKS_MAX_DIMS);
  if (st == DK_OK) st = dks_check_axis(k, "axis", k->in[0].ndim, false, &axis);
  if (st != DK_OK) return st;
  bool reduced[DKS_MAX_DIMS] = {false};
  reduced[axis] = true;
  return reduce_check_output(k, reduced, DK_DTYPE_INT64);
}

static const dks_validator v_reduce_arg[] = {
    {"ArgMax", validate_arg},
    {"ArgMin", validate_arg},
    {"Hardmax", dks_validate_axis_like_input},
};
DKS_REGISTER_VALIDATORS(v_reduce_arg)
