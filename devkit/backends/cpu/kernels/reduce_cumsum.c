/*
 * reduce_cumsum.c -- CumSum (opset 14: axis input, exclusive, reverse).
 *
 * The input splits around the axis into outer x len x inner; a running sum
 * per inner position advances row by row (backwards with reverse), so the
 * inner loop is contiguous. Float types sum in double and round each output
 * once; integers sum in uint64_t, which wraps like the dtype's arithmetic.
 */
#include "reduce.h"

/* The slice at x of len contiguous elements (the last axis): one running
 * sum in a register. */
#define CUMSUM_SLICE(NAME, T, AT, LOAD, STORE)                                    \
  static void NAME(const T *x, T *y, int64_t len, bool exclusive, bool reverse) { \
    AT sum = 0;                                                                   \
    int64_t step = reverse ? -1 : 1;                                              \
    for (int64_t n = 0, r = reverse ? len - 1 : 0; n < len; n++, r += step) {     \
      AT v = (AT)LOAD(x[r]);                                                      \
      if (exclusive) {                                                            \
        y[r] = STORE(sum);                                                        \
        sum += v;                                                                 \
      } else {                                                                    \
        sum += v;                                                                 \
        y[r] = STORE(sum);                                                        \
      }                                                                           \
    }                                                                             \
  }

/* The len x inner block at x: `inner` running sums advance row by row. */
#define CUMSUM_BLOCK(NAME, T, AT, LOAD, STORE)                                            \
  static void NAME(const T *x, T *y, int64_t len, int64_t inner, AT *sum, bool exclusive, \
                   bool reverse) {                                                        \
    for (int64_t i = 0; i < inner; i++) sum[i] = 0;                                       \
    for (int64_t step = 0; step < len; step++) {                                          \
      int64_t r = reverse ? len - 1 - step : step;                                        \
      const T *row = x + r * inner;                                                       \
      T *out = y + r * inner;                                                             \
      if (exclusive) {                                                                    \
        for (int64_t i = 0; i < inner; i++) {                                             \
          AT v = (AT)LOAD(row[i]);                                                        \
          out[i] = STORE(sum[i]);                                                         \
          sum[i] += v;                                                                    \
        }                                                                                 \
      } else {                                                                            \
        for (int64_t i = 0; i < inner; i++) {                                             \
          sum[i] += (AT)LOAD(row[i]);                                                     \
          out[i] = STORE(sum[i]);                                                         \
        }                                                                                 \
      }                                                                                   \
    }                                                                                     \
  }

#define CUMSUM_KERNEL(NAME, T, AT, LOAD, STORE)                                                 \
  CUMSUM_SLICE(NAME##_slice, T, AT, LOAD, STORE)                                                \
  CUMSUM_BLOCK(NAME##_block, T, AT, LOAD, STORE)                                                \
  static DK_Status NAME(const dks_kernel_args *k) {                                             \
    const dks_tensor *x = &k->in[0];                                                            \
    int64_t naxis;                                                                              \
    const int64_t *axis = dks_attr_ints(k, "axis", &naxis);                                     \
    if (naxis != 1)                                                                             \
      return dks_kernel_fail(k, DK_INVALID_ARGUMENT, "axis must hold one value, got %lld",      \
                             (long long)naxis);                                                 \
    int64_t outer, len, inner;                                                                  \
    DK_Status st = reduce_split(k, x, "axis", axis[0], &outer, &len, &inner);                   \
    if (st != DK_OK || x->size == 0) return st;                                                 \
    if (k->out[0].size != x->size)                                                              \
      return dks_kernel_fail(k, DK_INVALID_ARGUMENT, "the output must have the input's shape"); \
    bool exclusive = dks_attr_int(k, "exclusive", 0) != 0;                                      \
    bool reverse = dks_attr_int(k, "reverse", 0) != 0;                                          \
    const T *xs = (const T *)x->data;                                                           \
    T *ys = (T *)k->out[0].data;                                                                \
    if (inner == 1) {                                                                           \
      for (int64_t o = 0; o < outer; o++)                                                       \
        NAME##_slice(xs + o * len, ys + o * len, len, exclusive, reverse);                      \
      return DK_OK;                                                                             \
    }                                                                                           \
    AT *sum = malloc((size_t)inner * sizeof *sum);                                              \
    if (!sum) return dks_kernel_fail(k, DK_RESOURCE_EXHAUSTED, "out of host memory");           \
    for (int64_t o = 0; o < outer; o++)                                                         \
      NAME##_block(xs + o * len * inner, ys + o * len * inner, len, inner, sum, exclusive,      \
                   reverse);                                                                    \
    free(sum);                                                                                  \
    return DK_OK;                                                                               \
  }

#define FLOAT_CUMSUM(S, T, DT, LOAD, STORE) CUMSUM_KERNEL(cumsum_##S, T, double, LOAD, STORE)
REDUCE_FLOAT_TYPES(FLOAT_CUMSUM)

#define INT_LOAD(x) ((int64_t)(x))
/* STORE is the cast pair (T)(U): it keeps the low bits of the running sum. */
#define INT_CUMSUM(S, T, U, DT, LO, HI) CUMSUM_KERNEL(cumsum_##S, T, uint64_t, INT_LOAD, (T)(U))
REDUCE_INT_TYPES(INT_CUMSUM)

#define FLOAT_ROWS(S, T, DT, LOAD, STORE) {"CumSum", DT, cumsum_##S, 0},
#define INT_ROWS(S, T, U, DT, LO, HI) {"CumSum", DT, cumsum_##S, 0},

static const dks_kernel_def k_reduce_cumsum[] = {
    REDUCE_FLOAT_TYPES(FLOAT_ROWS)
    REDUCE_INT_TYPES(INT_ROWS)
};
DKS_REGISTER_KERNELS(k_reduce_cumsum)

/* CumSum: the axis input (sent as the attribute "axis") is one value inside
 * x's rank; y like x. */
static DK_Status validate_cumsum(const dks_kernel_args *k) {
  int64_t n;
  const int64_t *axis = dks_attr_ints(k, "axis", &n);
  DK_Status st = dks_check_int_list(k, "axis");
  if (st != DK_OK) return st;
  int32_t rank = k->in[0].ndim;
  if (n != 1) return dks_invalid(k, "axis must hold one value, got %lld", (long long)n);
  if (axis[0] < -rank || axis[0] >= rank)
    return dks_invalid(k, "axis %lld is out of range for rank %d", (long long)axis[0], rank);
  return dks_validate_like_input(k);
}

static const dks_validator v_reduce_cumsum[] = {{"CumSum", validate_cumsum}};
DKS_REGISTER_VALIDATORS(v_reduce_cumsum)
