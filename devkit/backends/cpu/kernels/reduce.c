/*
 * reduce.c -- ReduceSum, ReduceMean, ReduceMax, ReduceMin, ReduceProd,
 * ReduceL1, ReduceL2, ReduceSumSquare and ReduceLogSumExp.
 *
 * A reduction walks the compact input once, in memory order, with
 * dks_nd_loop, alongside an array of accumulators laid out like the output
 * (stride 0 along the reduced axes). The walk's innermost run is then either
 * a contiguous span folded into one accumulator (reducing the last axes) or
 * an elementwise update of contiguous accumulators (reducing leading axes);
 * both vectorise. A last pass turns accumulators into outputs (Mean
 * divides, L2 takes the square root, ...).
 *
 * Accumulators: float types in double (results rounded once into the
 * dtype); integer sums and products in uint64_t, whose wrap-around modulo
 * 2^64 leaves the dtype's two's-complement result in the low bits; integer
 * max/min in int64_t; integer ReduceL2 in double.
 *
 * The host validated axes, keepdims and noop_with_empty_axes against the
 * input; the kernel still checks what it indexes with.
 */
#include "reduce.h"

/* One accumulator per output element. */
typedef union acc {
  double f;
  int64_t i;
  uint64_t u;
} acc;
/* ACCUMULATE_LOOP walks a row of accumulators through a pointer to a member. */
_Static_assert(sizeof(acc) == sizeof(double) && sizeof(acc) == sizeof(int64_t), "acc members fill it");

/* Independent partial results per contiguous run: they break the chain of
 * dependent adds so the loop pipelines and vectorises (maxima and minima:
 * REDUCE_EXTREMUM_LANES). */
#define LANES 8

#define MAP_ID(v) (v)
#define MAP_SQ(v) ((v) * (v))
/* |v| of a two's complement value held in uint64_t */
#define MAP_UABS(v) ((v) >> 63 ? 0 - (v) : (v))
#define ADD(a, v) ((a) + (v))
#define MUL(a, v) ((a) * (v))
#define MAX(a, v) ((v) > (a) ? (v) : (a))
#define MIN(a, v) ((v) < (a) ? (v) : (a))

/* The combine step of ReduceSum/ReduceMean per float dtype. */
#define SUM_f32 ADD
#define SUM_f64 ADD
#define SUM_bf16 ADD
#ifdef DEVKIT_DEFECT_F16_ACCUMULATE
/* The defect (devkit/backends/cpu/defects.py): float16 sums accumulate in float16. */
#define SUM_f16(a, v) ((double)dks_f16_to_f32(dks_f32_to_f16((float)((a) + (v)))))
#else
#define SUM_f16 ADD
#endif

/* Folds MAP(LOAD(x)) into member M (of type AT) of the accumulators with
 * COMBINE. A compact input advances one element per step of the inner run;
 * the accumulators advance one per step (s[0] != 0) or stay put (s[0] == 0).
 * In vector clones: the same sums in every clone (the lanes fix the order). */
#define ACCUMULATE_LOOP(NAME, T, M, AT, LOAD, MAP, COMBINE, WIDTH)                                \
  DKS_VECTOR_CLONES static void NAME(int64_t n, uint8_t *const *p, const int64_t *s, void *ctx) { \
    (void)ctx;                                                                                    \
    acc *a = (acc *)p[0];                                                                         \
    const T *x = (const T *)p[1];                                                                 \
    if (s[0] != 0) { /* through an AT pointer: a loop over a[i].M did not vectorise */          \
      AT *am = &a->M;                                                                             \
      for (int64_t i = 0; i < n; i++) {                                                           \
        AT v = (AT)LOAD(x[i]);                                                                    \
        v = MAP(v);                                                                               \
        am[i] = COMBINE(am[i], v);                                                                \
      }                                                                                           \
      return;                                                                                     \
    }                                                                                             \
    AT r = a->M;                                                                                  \
    int64_t i = 0;                                                                                \
    if (n >= 2 * WIDTH) {                                                                         \
      AT part[WIDTH];                                                                             \
      for (int j = 0; j < WIDTH; j++) {                                                           \
        part[j] = (AT)LOAD(x[j]);                                                                 \
        part[j] = MAP(part[j]);                                                                   \
      }                                                                                           \
      for (i = WIDTH; i + WIDTH <= n; i += WIDTH) {                                               \
        const T *xi = x + i;                                                                      \
        for (int j = 0; j < WIDTH; j++) {                                                         \
          AT v = (AT)LOAD(xi[j]);                                                                 \
          v = MAP(v);                                                                             \
          part[j] = COMBINE(part[j], v);                                                          \
        }                                                                                         \
      }                                                                                           \
      for (int j = 0; j < WIDTH; j++) r = COMBINE(r, part[j]);                                    \
    }                                                                                             \
    for (; i < n; i++) {                                                                          \
      AT v = (AT)LOAD(x[i]);                                                                      \
      v = MAP(v);                                                                                 \
      r = COMBINE(r, v);                                                                          \
    }                                                                                             \
    a->M = r;                                                                                     \
  }

/* LogSumExp's second pass: sum[i] += exp(x - shift[i]), operands (sum, shift, x). */
#define LSE_LOOP(NAME, T, LOAD)                                                 \
  static void NAME(int64_t n, uint8_t *const *p, const int64_t *s, void *ctx) { \
    (void)ctx;                                                                  \
    acc *sum = (acc *)p[0];                                                     \
    const acc *shift = (const acc *)p[1];                                       \
    const T *x = (const T *)p[2];                                               \
    if (s[0] != 0) {                                                            \
      for (int64_t i = 0; i < n; i++) sum[i].f += exp(LOAD(x[i]) - shift[i].f); \
      return;                                                                   \
    }                                                                           \
    double c = shift->f, r = 0.0;                                               \
    for (int64_t i = 0; i < n; i++) r += exp(LOAD(x[i]) - c);                   \
    sum->f += r;                                                                \
  }

/* Accumulators -> outputs; `count` is the number of elements reduced into each. */
typedef void (*finish_fn)(int64_t n, const acc *a, uint8_t *out, int64_t count);

#define FINISH(NAME, T, EXPR)                                                    \
  static void NAME(int64_t n, const acc *a, uint8_t *out_bytes, int64_t count) { \
    (void)count;                                                                 \
    T *out = (T *)out_bytes;                                                     \
    for (int64_t i = 0; i < n; i++) out[i] = EXPR;                               \
  }

typedef void (*lse_finish_fn)(int64_t n, const acc *shift, const acc *sum, uint8_t *out);

#define FINISH_LSE(NAME, T, STORE)                                                    \
  static void NAME(int64_t n, const acc *shift, const acc *sum, uint8_t *out_bytes) { \
    T *out = (T *)out_bytes;                                                          \
    for (int64_t i = 0; i < n; i++) out[i] = STORE(shift[i].f + log(sum[i].f));       \
  }

static inline int64_t as_signed(uint64_t u) {
  int64_t v;
  memcpy(&v, &u, sizeof v);
  return v;
}

/* ---- The walk ------------------------------------------------------------ */

typedef struct reduce_layout {
  int64_t acc_strides[DKS_MAX_DIMS]; /* bytes; 0 along reduced axes */
  int64_t in_strides[DKS_MAX_DIMS];  /* bytes */
  int64_t out_size;                  /* accumulators (= output elements) */
  int64_t count;                     /* input elements per accumulator */
} reduce_layout;

static DK_Status reduce_layout_of(const dks_kernel_args *k, reduce_layout *layout) {
  const dks_tensor *x = &k->in[0];
  bool reduced[DKS_MAX_DIMS] = {false};
  int64_t naxes;
  const int64_t *axes = dks_attr_ints(k, "axes", &naxes);
  if (naxes == 0 && !dks_attr_int(k, "noop_with_empty_axes", 0))
    for (int32_t d = 0; d < x->ndim; d++) reduced[d] = true;
  for (int64_t i = 0; i < naxes; i++) {
    int64_t axis = axes[i] < 0 ? axes[i] + x->ndim : axes[i];
    if (axis < 0 || axis >= x->ndim)
      return dks_kernel_fail(k, DK_INVALID_ARGUMENT, "axis %lld is out of range for rank %d",
                             (long long)axes[i], x->ndim);
    reduced[axis] = true;
  }
  int64_t step = 1;
  layout->count = 1;
  for (int32_t d = x->ndim - 1; d >= 0; d--) {
    layout->in_strides[d] = x->strides[d] * x->itemsize;
    if (reduced[d]) {
      layout->acc_strides[d] = 0;
      layout->count *= x->shape[d];
    } else {
      layout->acc_strides[d] = step * (int64_t)sizeof(acc);
      step *= x->shape[d];
    }
  }
  layout->out_size = step;
  if (k->out[0].size != step)
    return dks_kernel_fail(k, DK_INVALID_ARGUMENT,
                           "the output has %lld elements; reducing the input gives %lld",
                           (long long)k->out[0].size, (long long)step);
  return DK_OK;
}

typedef struct reduce_op {
  dks_inner_loop accumulate;
  finish_fn finish;
  acc init;
  const char *empty_error; /* non-NULL: reducing an empty set is an error */
} reduce_op;

static DK_Status out_of_memory(const dks_kernel_args *k, int64_t n) {
  return dks_kernel_fail(k, DK_RESOURCE_EXHAUSTED, "out of host memory for %lld accumulators",
                         (long long)n);
}

/* The walk over x's indices [begin, end) along its first kept axis (all
 * of x when every axis is reduced: then one chunk, [0, 1)). */
typedef struct reduce_walk {
  const dks_tensor *x;
  dks_inner_loop accumulate;
  acc *a;
  int64_t strides[2][DKS_MAX_DIMS]; /* bytes: the accumulators', x's */
  int32_t split;                    /* the first kept axis; -1: none */
} reduce_walk;

/* Input elements per chunk of a split reduction. */
#define REDUCE_CHUNK ((int64_t)1 << 16)

static void reduce_rows(void *ctx, int64_t begin, int64_t end) {
  const reduce_walk *w = ctx;
  int64_t shape[DKS_MAX_DIMS];
  memcpy(shape, w->x->shape, sizeof shape);
  uint8_t *base[2] = {(uint8_t *)w->a, w->x->data};
  if (w->split >= 0) {
    shape[w->split] = end - begin;
    base[0] += begin * w->strides[0][w->split];
    base[1] += begin * w->strides[1][w->split];
  }
  dks_nd_loop(2, w->x->ndim, shape, (const int64_t(*)[DKS_MAX_DIMS])w->strides, base, w->accumulate, NULL);
}

static DK_Status reduce_run(const dks_kernel_args *k, const reduce_op *op) {
  reduce_layout layout;
  DK_Status st = reduce_layout_of(k, &layout);
  if (st != DK_OK || layout.out_size == 0) return st;
  if (layout.count == 0 && op->empty_error)
    return dks_kernel_fail(k, DK_INVALID_ARGUMENT, "%s", op->empty_error);
  acc *a = malloc((size_t)layout.out_size * sizeof *a);
  if (!a) return out_of_memory(k, layout.out_size);
  for (int64_t i = 0; i < layout.out_size; i++) a[i] = op->init;
  const dks_tensor *x = &k->in[0];
  reduce_walk walk = {.x = x, .accumulate = op->accumulate, .a = a};
  memcpy(walk.strides[0], layout.acc_strides, sizeof walk.strides[0]);
  memcpy(walk.strides[1], layout.in_strides, sizeof walk.strides[1]);
  /* Split over the first kept axis: each chunk then owns its accumulators
   * and folds them in the same order as one thread would. */
  walk.split = -1;
  for (int32_t d = x->ndim - 1; d >= 0; d--)
    if (layout.acc_strides[d] != 0) walk.split = d;
  int64_t rows = walk.split >= 0 ? x->shape[walk.split] : 1;
  int64_t row_size = rows > 0 ? x->size / rows : 0;
  dks_parallel_for(rows, row_size >= REDUCE_CHUNK ? 1 : REDUCE_CHUNK / (row_size > 0 ? row_size : 1),
                   reduce_rows, &walk);
  op->finish(layout.out_size, a, k->out[0].data, layout.count);
  free(a);
  return DK_OK;
}

/* log(sum(exp(x))) = shift + log(sum(exp(x - shift))), with shift the
 * maximum when it is finite (no overflow, and the largest term is 1) and 0
 * otherwise: an infinite maximum gives +inf, an empty set or all -inf gives
 * log(0) = -inf, and a NaN maximum propagates through exp. */
static DK_Status reduce_logsumexp(const dks_kernel_args *k, dks_inner_loop max_loop,
                                  dks_inner_loop sum_loop, lse_finish_fn finish) {
  reduce_layout layout;
  DK_Status st = reduce_layout_of(k, &layout);
  if (st != DK_OK || layout.out_size == 0) return st;
  acc *shift = malloc(2 * (size_t)layout.out_size * sizeof *shift);
  if (!shift) return out_of_memory(k, 2 * layout.out_size);
  acc *sum = shift + layout.out_size;
  for (int64_t i = 0; i < layout.out_size; i++) {
    shift[i].f = -INFINITY;
    sum[i].f = 0.0;
  }
  const dks_tensor *x = &k->in[0];
  int64_t strides[3][DKS_MAX_DIMS];
  memcpy(strides[0], layout.acc_strides, sizeof strides[0]);
  memcpy(strides[1], layout.in_strides, sizeof strides[1]);
  uint8_t *base[3] = {(uint8_t *)shift, x->data, NULL};
  dks_nd_loop(2, x->ndim, x->shape, (const int64_t(*)[DKS_MAX_DIMS])strides, base, max_loop, NULL);
  for (int64_t i = 0; i < layout.out_size; i++)
    if (!isfinite(shift[i].f)) shift[i].f = 0.0;
  memcpy(strides[1], layout.acc_strides, sizeof strides[1]);
  memcpy(strides[2], layout.in_strides, sizeof strides[2]);
  base[0] = (uint8_t *)sum;
  base[1] = (uint8_t *)shift;
  base[2] = x->data;
  dks_nd_loop(3, x->ndim, x->shape, (const int64_t(*)[DKS_MAX_DIMS])strides, base, sum_loop, NULL);
  finish(layout.out_size, shift, sum, k->out[0].data);
  free(shift);
  return DK_OK;
}

#define REDUCE_KERNEL(NAME, LOOP, FINISH_FN, INIT, EMPTY_ERROR)         \
  static DK_Status NAME(const dks_kernel_args *k) {                     \
    static const reduce_op op = {LOOP, FINISH_FN, {INIT}, EMPTY_ERROR}; \
    return reduce_run(k, &op);                                          \
  }

/* ---- Float types ------------------------------------------------------------- */

#define FLOAT_REDUCTIONS(S, T, DT, LOAD, STORE)                                            \
  ACCUMULATE_LOOP(sum_##S, T, f, double, LOAD, MAP_ID, SUM_##S, LANES)                     \
  ACCUMULATE_LOOP(sumsq_##S, T, f, double, LOAD, MAP_SQ, ADD, LANES)                       \
  ACCUMULATE_LOOP(l1_##S, T, f, double, LOAD, fabs, ADD, LANES)                            \
  ACCUMULATE_LOOP(prod_##S, T, f, double, LOAD, MAP_ID, MUL, LANES)                        \
  ACCUMULATE_LOOP(max_##S, T, f, double, LOAD, MAP_ID, REDUCE_FMAX, REDUCE_EXTREMUM_LANES) \
  ACCUMULATE_LOOP(min_##S, T, f, double, LOAD, MAP_ID, REDUCE_FMIN, REDUCE_EXTREMUM_LANES) \
  LSE_LOOP(lse_##S, T, LOAD)                                                               \
  FINISH(put_##S, T, STORE(a[i].f))                                                        \
  FINISH(put_mean_##S, T, STORE(a[i].f / (double)count))                                   \
  FINISH(put_sqrt_##S, T, STORE(sqrt(a[i].f)))                                             \
  FINISH_LSE(put_lse_##S, T, STORE)                                                        \
  REDUCE_KERNEL(reduce_sum_##S, sum_##S, put_##S, .f = 0.0, NULL)                          \
  REDUCE_KERNEL(reduce_mean_##S, sum_##S, put_mean_##S, .f = 0.0, NULL)                    \
  REDUCE_KERNEL(reduce_sumsq_##S, sumsq_##S, put_##S, .f = 0.0, NULL)                      \
  REDUCE_KERNEL(reduce_l1_##S, l1_##S, put_##S, .f = 0.0, NULL)                            \
  REDUCE_KERNEL(reduce_l2_##S, sumsq_##S, put_sqrt_##S, .f = 0.0, NULL)                    \
  REDUCE_KERNEL(reduce_prod_##S, prod_##S, put_##S, .f = 1.0, NULL)                        \
  REDUCE_KERNEL(reduce_max_##S, max_##S, put_##S, .f = -INFINITY, NULL)                    \
  REDUCE_KERNEL(reduce_min_##S, min_##S, put_##S, .f = INFINITY, NULL)                     \
  static DK_Status reduce_lse_##S(const dks_kernel_args *k) {                              \
    return reduce_logsumexp(k, max_##S, lse_##S, put_lse_##S);                             \
  }

REDUCE_FLOAT_TYPES(FLOAT_REDUCTIONS)

/* ---- Integer types ----------------------------------------------------------- */

#define INT_LOAD(x) ((int64_t)(x))

/* Sums, products, L1 and SumSquare wrap like the dtype's arithmetic; Mean
 * divides the sum (exact unless it passes 2^63 in magnitude) and truncates
 * toward zero; L2 truncates the root toward zero and saturates at the
 * dtype's maximum. */
#define INT_REDUCTIONS(S, T, U, DT, LO, HI)                                             \
  ACCUMULATE_LOOP(sum_##S, T, u, uint64_t, INT_LOAD, MAP_ID, ADD, LANES)                \
  ACCUMULATE_LOOP(sumsq_##S, T, u, uint64_t, INT_LOAD, MAP_SQ, ADD, LANES)              \
  ACCUMULATE_LOOP(l1_##S, T, u, uint64_t, INT_LOAD, MAP_UABS, ADD, LANES)               \
  ACCUMULATE_LOOP(prod_##S, T, u, uint64_t, INT_LOAD, MAP_ID, MUL, LANES)               \
  ACCUMULATE_LOOP(max_##S, T, i, int64_t, INT_LOAD, MAP_ID, MAX, REDUCE_EXTREMUM_LANES) \
  ACCUMULATE_LOOP(min_##S, T, i, int64_t, INT_LOAD, MAP_ID, MIN, REDUCE_EXTREMUM_LANES) \
  ACCUMULATE_LOOP(l2_##S, T, f, double, INT_LOAD, MAP_SQ, ADD, LANES)                   \
  FINISH(put_wrap_##S, T, (T)(U)a[i].u)                                                 \
  FINISH(put_##S, T, (T)a[i].i)                                                         \
  FINISH(put_mean_##S, T, (T)(as_signed(a[i].u) / count))                               \
  FINISH(put_sqrt_##S, T, sqrt(a[i].f) >= (double)(HI) ? (T)(HI) : (T)sqrt(a[i].f))     \
  REDUCE_KERNEL(reduce_sum_##S, sum_##S, put_wrap_##S, .u = 0, NULL)                    \
  REDUCE_KERNEL(reduce_mean_##S, sum_##S, put_mean_##S, .u = 0,                         \
                "the mean of an empty set is undefined for integer dtypes")             \
  REDUCE_KERNEL(reduce_sumsq_##S, sumsq_##S, put_wrap_##S, .u = 0, NULL)                \
  REDUCE_KERNEL(reduce_l1_##S, l1_##S, put_wrap_##S, .u = 0, NULL)                      \
  REDUCE_KERNEL(reduce_l2_##S, l2_##S, put_sqrt_##S, .f = 0.0, NULL)                    \
  REDUCE_KERNEL(reduce_prod_##S, prod_##S, put_wrap_##S, .u = 1, NULL)                  \
  REDUCE_KERNEL(reduce_max_##S, max_##S, put_##S, .i = (LO), NULL)                      \
  REDUCE_KERNEL(reduce_min_##S, min_##S, put_##S, .i = (HI), NULL)

REDUCE_INT_TYPES(INT_REDUCTIONS)

/* ---- bool (ReduceMax/ReduceMin, opset 20: False < True) ------------------------ */

#define BOOL_LOAD(x) ((int64_t)((x) != 0))
ACCUMULATE_LOOP(max_bool, uint8_t, i, int64_t, BOOL_LOAD, MAP_ID, MAX, REDUCE_EXTREMUM_LANES)
ACCUMULATE_LOOP(min_bool, uint8_t, i, int64_t, BOOL_LOAD, MAP_ID, MIN, REDUCE_EXTREMUM_LANES)
FINISH(put_bool, uint8_t, (uint8_t)a[i].i)
REDUCE_KERNEL(reduce_max_bool, max_bool, put_bool, .i = 0, NULL)
REDUCE_KERNEL(reduce_min_bool, min_bool, put_bool, .i = 1, NULL)

/* ---- Registration ---------------------------------------------------------------- */

#define COMMON_ROWS(S, DT)                      \
  {"ReduceSum", DT, reduce_sum_##S, 0},         \
  {"ReduceMean", DT, reduce_mean_##S, 0},       \
  {"ReduceSumSquare", DT, reduce_sumsq_##S, 0}, \
  {"ReduceL1", DT, reduce_l1_##S, 0},           \
  {"ReduceL2", DT, reduce_l2_##S, 0},           \
  {"ReduceProd", DT, reduce_prod_##S, 0},       \
  {"ReduceMax", DT, reduce_max_##S, 0},         \
  {"ReduceMin", DT, reduce_min_##S, 0},
#define FLOAT_ROWS(S, T, DT, LOAD, STORE) \
  COMMON_ROWS(S, DT) {"ReduceLogSumExp", DT, reduce_lse_##S, 0},
#define INT_ROWS(S, T, U, DT, LO, HI) COMMON_ROWS(S, DT)

static const dks_kernel_def k_reduce[] = {
    REDUCE_FLOAT_TYPES(FLOAT_ROWS)
    REDUCE_INT_TYPES(INT_ROWS)
    {"ReduceMax", DK_DTYPE_BOOL, reduce_max_bool, 0},
    {"ReduceMin", DK_DTYPE_BOOL, reduce_min_bool, 0},
};
DKS_REGISTER_KERNELS(k_reduce)

/* ---- Validators ---------------------------------------------------------------- */

DK_Status reduce_check_output(const dks_kernel_args *k, const bool *reduced, DK_DTypeKey dtype) {
  const dks_tensor *x = &k->in[0];
  bool keep = dks_attr_int(k, "keepdims", 1) != 0;
  int64_t shape[DKS_MAX_DIMS];
  int32_t n = 0;
  for (int32_t d = 0; d < x->ndim; d++)
    if (!reduced[d] || keep) shape[n++] = reduced[d] ? 1 : x->shape[d];
  DK_Status st = dks_check_output(k, 0, n, shape);
  return st != DK_OK ? st : dks_check_dtype(k, "output", 0, dtype);
}

/* Reduce*: distinct axes inside data's rank (the axes input arrives as the
 * attribute); none: every axis, or none with noop_with_empty_axes. */
static DK_Status validate_reduce(const dks_kernel_args *k) {
  int32_t axes[DKS_MAX_DIMS];
  int64_t naxes;
  DK_Status st = dks_check_axes(k, "axes", k->in[0].ndim, axes, &naxes);
  if (st != DK_OK) return st;
  bool reduced[DKS_MAX_DIMS] = {false};
  bool all = naxes <= 0 && !dks_attr_int(k, "noop_with_empty_axes", 0);
  for (int32_t d = 0; all && d < k->in[0].ndim; d++) reduced[d] = true;
  for (int64_t i = 0; i < naxes; i++) reduced[axes[i]] = true;
  return reduce_check_output(k, reduced, k->in[0].dtype);
}

static const dks_validator v_reduce[] = {
    {"ReduceSum", validate_reduce},  {"ReduceMean", validate_reduce},
    {"ReduceSumSquare", validate_reduce}, {"ReduceL1", validate_reduce},
    {"ReduceL2", validate_reduce},   {"ReduceProd", validate_reduce},
    {"ReduceMax", validate_reduce},  {"ReduceMin", validate_reduce},
    {"ReduceLogSumExp", validate_reduce},
};
DKS_REGISTER_VALIDATORS(v_reduce)
