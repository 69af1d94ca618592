/*
 * reduce_topk.c -- TopK (opset 11+: K input, axis, largest, sorted).
 *
 * Each slice along the axis is gathered into an array of keys (double for
 * float types, int64_t for integers). A binary heap of the K best positions
 * selects in O(len log K): its root is the kept element that sorts last,
 * and a newcomer that sorts before it takes its place. Sorting the heap in
 * place then orders the K winners best first.
 *
 * The order is ONNX's: by value (largest or smallest first), equal values by
 * lower index first. NaN sorts above every number (NumPy's sort order), so
 * it comes first with largest=1 and last with largest=0; -0 and +0 are
 * equal. sorted=0 leaves the order to the implementation: this one sorts.
 */
#include "reduce.h"

#define GREATER_F64(x, y) ((x) > (y) || ((x) != (x) && (y) == (y)))
#define GREATER_I64(x, y) ((x) > (y))

#define TOPK_SELECT(S, K, GREATER)                                                             \
  /* Position a sorts before position b. */                                                    \
  static inline bool before_##S(const K *key, int64_t a, int64_t b, bool largest) {            \
    if (GREATER(key[a], key[b])) return largest;                                               \
    if (GREATER(key[b], key[a])) return !largest;                                              \
    return a < b;                                                                              \
  }                                                                                            \
                                                                                               \
  /* Restores the heap below h[i] (each parent sorts after its children). */                   \
  static void sift_down_##S(const K *key, int64_t *h, int64_t size, int64_t i, bool largest) { \
    for (;;) {                                                                                 \
      int64_t worst = i, l = 2 * i + 1, r = l + 1;                                             \
      if (l < size && before_##S(key, h[worst], h[l], largest)) worst = l;                     \
      if (r < size && before_##S(key, h[worst], h[r], largest)) worst = r;                     \
      if (worst == i) return;                                                                  \
      int64_t t = h[i];                                                                        \
      h[i] = h[worst];                                                                         \
      h[worst] = t;                                                                            \
      i = worst;                                                                               \
    }                                                                                          \
  }                                                                                            \
                                                                                               \
  /* h[0..kk) = the kk positions of key[0..len) that sort first, in order. */                  \
  static void select_##S(const K *key, int64_t len, int64_t kk, bool largest, int64_t *h) {    \
    for (int64_t r = 0; r < kk; r++) { /* the first kk positions, heapified upwards */         \
      int64_t i = r;                                                                           \
      h[i] = r;                                                                                \
      while (i > 0 && before_##S(key, h[(i - 1) / 2], h[i], largest)) {                        \
        int64_t p = (i - 1) / 2, t = h[p];                                                     \
        h[p] = h[i];                                                                           \
        h[i] = t;                                                                              \
        i = p;                                                                                 \
      }                                                                                        \
    }                                                                                          \
    for (int64_t r = kk; r < len; r++) {                                                       \
      if (before_##S(key, r, h[0], largest)) {                                                 \
        h[0] = r;                                                                              \
        sift_down_##S(key, h, kk, 0, largest);                                                 \
      }                                                                                        \
    }                                                                                          \
    for (int64_t size = kk; size > 1; size--) { /* the root (last in order) to the back */     \
      int64_t t = h[0];                                                                        \
      h[0] = h[size - 1];                                                                      \
      h[size - 1] = t;                                                                         \
      sift_down_##S(key, h, size - 1, 0, largest);                                             \
    }                                                                                          \
  }

TOPK_SELECT(f64, double, GREATER_F64)
TOPK_SELECT(i64, int64_t, GREATER_I64)

#define TOPK_KERNEL(NAME, T, S, K, LOAD)                                                           \
  static DK_Status NAME(const dks_kernel_args *k) {                                                \
    const dks_tensor *x = &k->in[0];                                                               \
    int64_t nk;                                                                                    \
    const int64_t *kv = dks_attr_ints(k, "K", &nk);                                                \
    if (nk != 1)                                                                                   \
      return dks_kernel_fail(k, DK_INVALID_ARGUMENT, "K must hold one value, got %lld",            \
                             (long long)nk);                                                       \
    int64_t outer, len, inner;                                                                     \
    DK_Status st = reduce_split(k, x, "axis", dks_attr_int(k, "axis", -1), &outer, &len, &inner);  \
    if (st != DK_OK) return st;                                                                    \
    int64_t kk = kv[0];                                                                            \
    if (kk < 0 || kk > len)                                                                        \
      return dks_kernel_fail(k, DK_INVALID_ARGUMENT, "K %lld is out of range for an axis of %lld", \
                             (long long)kk, (long long)len);                                       \
    int64_t n = outer * kk * inner;                                                                \
    if (k->out[0].size != n || k->out[1].size != n || k->out[1].dtype != DK_DTYPE_INT64)           \
      return dks_kernel_fail(k, DK_INVALID_ARGUMENT,                                               \
                             "the outputs must hold %lld values and %lld int64 indices",           \
                             (long long)n, (long long)n);                                          \
    if (n == 0) return DK_OK;                                                                      \
    K *key = malloc((size_t)len * sizeof *key);                                                    \
    int64_t *h = malloc((size_t)kk * sizeof *h);                                                   \
    if (!key || !h) {                                                                              \
      free(key);                                                                                   \
      free(h);                                                                                     \
      return dks_kernel_fail(k, DK_RESOURCE_EXHAUSTED, "out of host memory");                      \
    }                                                                                              \
    bool largest = dks_attr_int(k, "largest", 1) != 0;                                             \
    T *values = (T *)k->out[0].data;                                                               \
    int64_t *indices = (int64_t *)k->out[1].data;                                                  \
    for (int64_t o = 0; o < outer; o++) {                                                          \
      for (int64_t i = 0; i < inner; i++) {                                                        \
        const T *slice = (const T *)x->data + o * len * inner + i;                                 \
        for (int64_t r = 0; r < len; r++) key[r] = (K)LOAD(slice[r * inner]);                      \
        select_##S(key, len, kk, largest, h);                                                      \
        for (int64_t j = 0; j < kk; j++) {                                                         \
          int64_t at = (o * kk + j) * inner + i;                                                   \
          values[at] = slice[h[j] * inner];                                                        \
          indices[at] = h[j];                                                                      \
        }                                                                                          \
      }                                                                                            \
    }                                                                                              \
    free(key);                                                                                     \
    free(h);                                                                                       \
    return DK_OK;                                                                                  \
  }

#define FLOAT_TOPK(S, T, DT, LOAD, STORE) TOPK_KERNEL(topk_##S, T, f64, double, LOAD)
REDUCE_FLOAT_TYPES(FLOAT_TOPK)

#define INT_KEY(x) ((int64_t)(x))
#define INT_TOPK(S, T, U, DT, LO, HI) TOPK_KERNEL(topk_##S, T, i64, int64_t, INT_KEY)
REDUCE_INT_TYPES(INT_TOPK)

#define FLOAT_ROWS(S, T, DT, LOAD, STORE) {"TopK", DT, topk_##S, 0},
#define INT_ROWS(S, T, U, DT, LO, HI) {"TopK", DT, topk_##S, 0},

static const dks_kernel_def k_reduce_topk[] = {
    REDUCE_FLOAT_TYPES(FLOAT_ROWS)
    REDUCE_INT_TYPES(INT_ROWS)
};
DKS_REGISTER_KERNELS(k_reduce_topk)

/* TopK: axis inside X's rank; K one integer in [0, the axis' length];
 * values of X's dtype and int64 indices, both X's shape with K on axis.
 * (The kernel rereads K and the axis, which cannot fail then.) */
static DK_Status validate_topk(const dks_kernel_args *k) {
  const dks_tensor *x = &k->in[0];
  int64_t axis, count, shape[DKS_MAX_DIMS];
  const int64_t *kv = dks_attr_ints(k, "K", &count);
  DK_Status st = dks_check_axis(k, "axis", x->ndim, false, &axis);
  if (st != DK_OK) return st;
  if (count != 1 || kv[0] < 0 || kv[0] > x->shape[axis])
    return dks_invalid(k, "K must be one integer in [0, %lld], the length of axis %lld", (long long)x->shape[axis],
                       (long long)axis);
  memcpy(shape, x->shape, (size_t)x->ndim * sizeof *shape);
  shape[axis] = kv[0];
  if (k->num_outputs != 2) return dks_invalid(k, "has %zu outputs; the kernel writes values and indices", k->num_outputs);
  if ((st = dks_check_dtype(k, "output", 0, x->dtype)) != DK_OK) return st;
  if ((st = dks_check_dtype(k, "output", 1, DK_DTYPE_INT64)) != DK_OK) return st;
  if ((st = dks_check_output(k, 0, x->ndim, shape)) != DK_OK) return st;
  return dks_check_output(k, 1, x->ndim, shape);
}

static const dks_validator v_reduce_topk[] = {{"TopK", validate_topk}};
DKS_REGISTER_VALIDATORS(v_reduce_topk)
