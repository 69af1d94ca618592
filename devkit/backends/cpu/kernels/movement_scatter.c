/*
 * movement_scatter.c -- ScatterElements and ScatterND, with the reductions
 * none, add, mul, max and min.
 *
 * The output starts as a copy of data; updates are then applied in the
 * row-major order of the indices, so duplicate indices under "none" leave the
 * last update (ONNX leaves that order unspecified). Reductions follow NumPy,
 * as ONNX's reference does: integers wrap; max/min propagate NaN; float16
 * and bfloat16 combine in float32 and round on every store; on bool, add
 * and max are "or", mul and min are "and". Every index is checked before
 * anything is written. Tensors are compact.
 */
#include "movement.h"

/* dst[i] = f(dst[i], src[i]) for i < n. */
typedef void (*combine_fn)(uint8_t *dst, const uint8_t *src, int64_t n);

#define COMBINE(NAME, T, EXPR)                                             \
  static void NAME(uint8_t *dst, const uint8_t *src, int64_t n) {          \
    T *o = (T *)dst;                                                       \
    const T *u = (const T *)src;                                           \
    for (int64_t i = 0; i < n; i++) {                                      \
      T a = o[i], b = u[i];                                                \
      o[i] = (T)(EXPR);                                                    \
    }                                                                      \
  }

#define COMBINE_LOW(NAME, LOAD, STORE, EXPR)                               \
  static void NAME(uint8_t *dst, const uint8_t *src, int64_t n) {          \
    uint16_t *o = (uint16_t *)dst;                                         \
    const uint16_t *u = (const uint16_t *)src;                             \
    for (int64_t i = 0; i < n; i++) {                                      \
      float a = LOAD(o[i]), b = LOAD(u[i]);                                \
      o[i] = STORE(EXPR);                                                  \
    }                                                                      \
  }

/* NumPy's maximum/minimum: a NaN on either side wins. */
#define FMAX ((a >= b || a != a) ? a : b)
#define FMIN ((a <= b || a != a) ? a : b)
#define IMAX (a >= b ? a : b)
#define IMIN (a <= b ? a : b)

#define FLOAT_COMBINES(SUFFIX, T)           \
  COMBINE(add_##SUFFIX, T, a + b)           \
  COMBINE(mul_##SUFFIX, T, a * b)           \
  COMBINE(max_##SUFFIX, T, FMAX)            \
  COMBINE(min_##SUFFIX, T, FMIN)

#define LOW_COMBINES(SUFFIX, LOAD, STORE)           \
  COMBINE_LOW(add_##SUFFIX, LOAD, STORE, a + b)     \
  COMBINE_LOW(mul_##SUFFIX, LOAD, STORE, a * b)     \
  COMBINE_LOW(max_##SUFFIX, LOAD, STORE, FMAX)      \
  COMBINE_LOW(min_##SUFFIX, LOAD, STORE, FMIN)

/* Wrapping arithmetic through the unsigned type U (no signed overflow). */
#define INT_COMBINES(SUFFIX, T, U)                  \
  COMBINE(add_##SUFFIX, T, (U)a + (U)b)             \
  COMBINE(mul_##SUFFIX, T, (U)a * (U)b)             \
  COMBINE(max_##SUFFIX, T, IMAX)                    \
  COMBINE(min_##SUFFIX, T, IMIN)

FLOAT_COMBINES(f32, float)
FLOAT_COMBINES(f64, double)
LOW_COMBINES(f16, dks_f16_to_f32, dks_f32_to_f16)
LOW_COMBINES(bf16, dks_bf16_to_f32, dks_f32_to_bf16)
INT_COMBINES(i8, int8_t, uint8_t)
INT_COMBINES(u8, uint8_t, uint32_t)
INT_COMBINES(i32, int32_t, uint32_t)
INT_COMBINES(i64, int64_t, uint64_t)
COMBINE(or_bool, uint8_t, (a != 0) | (b != 0))
COMBINE(and_bool, uint8_t, (a != 0) & (b != 0))

typedef struct combines {
  DK_DTypeKey dtype;
  combine_fn add, mul, max, min;
} combines;

static const combines k_combines[] = {
    {DK_DTYPE_FLOAT32, add_f32, mul_f32, max_f32, min_f32},
    {DK_DTYPE_FLOAT64, add_f64, mul_f64, max_f64, min_f64},
    {DK_DTYPE_FLOAT16, add_f16, mul_f16, max_f16, min_f16},
    {DK_DTYPE_BFLOAT16, add_bf16, mul_bf16, max_bf16, min_bf16},
    {DK_DTYPE_INT8, add_i8, mul_i8, max_i8, min_i8},
    {DK_DTYPE_UINT8, add_u8, mul_u8, max_u8, min_u8},
    {DK_DTYPE_INT32, add_i32, mul_i32, max_i32, min_i32},
    {DK_DTYPE_INT64, add_i64, mul_i64, max_i64, min_i64},
    {DK_DTYPE_BOOL, or_bool, and_bool, or_bool, and_bool},
};

/* The reduction's function for `dtype`; NULL for "none" (plain copy). */
static combine_fn combine_for(DK_DTypeKey dtype, const char *reduction) {
  for (size_t i = 0; i < sizeof k_combines / sizeof k_combines[0]; i++) {
    const combines *c = &k_combines[i];
    if (c->dtype != dtype) continue;
    if (strcmp(reduction, "add") == 0) return c->add;
    if (strcmp(reduction, "mul") == 0) return c->mul;
    if (strcmp(reduction, "max") == 0) return c->max;
    if (strcmp(reduction, "min") == 0) return c->min;
  }
  return NULL;
}

/* Applies n updates at dst: a copy, or the reduction. */
static void apply(combine_fn combine, uint8_t *dst, const uint8_t *src, int64_t n,
                  int32_t itemsize) {
  if (combine)
    combine(dst, src, n);
  else
    movement_copy_run(dst, itemsize, src, itemsize, n, itemsize);
}

/* output[i with i[axis] replaced by indices[i]] (op)= updates[i]. */
static DK_Status scatter_elements(const dks_kernel_args *k) {
  const dks_tensor *data = &k->in[0], *indices = &k->in[1], *updates = &k->in[2];
  const dks_tensor *out = &k->out[0];
  int64_t axis = dks_attr_int(k, "axis", 0);
  if (axis < 0) axis += data->ndim;
  int64_t dim = data->shape[axis];
  DK_Status st = movement_check_indices(k, indices, dim, (int32_t)axis);
  if (st != DK_OK || out->size == 0) return st;
  int32_t itemsize = data->itemsize;
  memcpy(out->data, data->data, (size_t)(data->size * itemsize));
  combine_fn combine = combine_for(data->dtype, dks_attr_string(k, "reduction", "none"));
  /* The walk over the indices tracks the output offset of every dim but axis. */
  int64_t walk[DKS_MAX_DIMS], index[DKS_MAX_DIMS] = {0}, offset = 0;
  for (int32_t d = 0; d < out->ndim; d++) walk[d] = d == axis ? 0 : out->strides[d];
  int64_t axis_stride = out->strides[axis];
  for (int64_t p = 0; p < indices->size; p++) {
    int64_t v = movement_index(indices, p);
    apply(combine, out->data + (offset + (v < 0 ? v + dim : v) * axis_stride) * itemsize,
          updates->data + p * itemsize, 1, itemsize);
    movement_advance(indices->ndim, indices->shape, walk, index, &offset);
  }
  return DK_OK;
}

/* For each k-tuple t of indices (k = indices.shape[-1]): the slice
 * output[t, ...] of prod(data.shape[k:]) contiguous elements (op)= the
 * matching slice of updates. */
static DK_Status scatter_nd(const dks_kernel_args *k) {
  const dks_tensor *data = &k->in[0], *indices = &k->in[1], *updates = &k->in[2];
  const dks_tensor *out = &k->out[0];
  int32_t depth = (int32_t)indices->shape[indices->ndim - 1];
  for (int64_t e = 0; e < indices->size; e++) {
    int32_t axis = (int32_t)(e % depth);
    int64_t v = movement_index(indices, e), dim = data->shape[axis];
    if (v < -dim || v >= dim) return movement_index_error(k, v, e, axis, dim);
  }
  if (out->size == 0) return DK_OK;
  int32_t itemsize = data->itemsize;
  memcpy(out->data, data->data, (size_t)(data->size * itemsize));
  combine_fn combine = combine_for(data->dtype, dks_attr_string(k, "reduction", "none"));
  int64_t tuples = 1, slice = 1;
  for (int32_t d = 0; d < indices->ndim - 1; d++) tuples *= indices->shape[d];
  for (int32_t d = depth; d < data->ndim; d++) slice *= data->shape[d];
  int64_t e = 0;
  for (int64_t t = 0; t < tuples; t++) {
    int64_t offset = 0;
    for (int32_t j = 0; j < depth; j++, e++) {
      int64_t v = movement_index(indices, e);
      offset += (v < 0 ? v + data->shape[j] : v) * out->strides[j];
    }
    apply(combine, out->data + offset * itemsize, updates->data + t * slice * itemsize, slice,
          itemsize);
  }
  return DK_OK;
}

static const dks_kernel_def k_movement_scatter[] = {
    DKS_ALL_DTYPES("ScatterElements", scatter_elements, 0),
    DKS_ALL_DTYPES("ScatterND", scatter_nd, 0),
};
DKS_REGISTER_KERNELS(k_movement_scatter)

/* ---- Validators ------------------------------------------------------------ */

/* updates (input 2) have data's dtype and the given shape; output like data. */
static DK_Status check_updates(const dks_kernel_args *k, int32_t ndim, const int64_t *shape) {
  DK_Status st = dks_check_rank(k, 2, ndim, ndim);
  for (int32_t d = 0; st == DK_OK && d < ndim; d++)
    if (k->in[2].shape[d] != shape[d])
      st = dks_invalid(k, "updates dim %d is %lld; data and indices give %lld", d, (long long)k->in[2].shape[d],
                       (long long)shape[d]);
  if (st == DK_OK) st = dks_check_dtype(k, "input", 2, k->in[0].dtype);
  if (st == DK_OK) st = dks_check_output_like(k, 0, 0);
  return st != DK_OK ? st : dks_check_dtype(k, "output", 0, k->in[0].dtype);
}

/* ScatterElements: updates of indices' shape. */
static DK_Status validate_scatter_elements(const dks_kernel_args *k) {
  int64_t axis;
  DK_Status st = movement_check_elementwise_indices(k, &axis);
  return st != DK_OK ? st : check_updates(k, k->in[1].ndim, k->in[1].shape);
}

/* ScatterND: updates of shape indices.shape[:-1] + data.shape[depth:]. */
static DK_Status validate_scatter_nd(const dks_kernel_args *k) {
  int32_t depth;
  DK_Status st = movement_check_nd_indices(k, 0, &depth);
  if (st != DK_OK) return st;
  const dks_tensor *data = &k->in[0], *indices = &k->in[1];
  int64_t shape[2 * DKS_MAX_DIMS];
  int32_t n = 0;
  for (int32_t d = 0; d < indices->ndim - 1; d++) shape[n++] = indices->shape[d];
  for (int32_t d = depth; d < data->ndim; d++) shape[n++] = data->shape[d];
  if (n > DKS_MAX_DIMS) return dks_invalid(k, "updates would have rank %d, over %d", n, DKS_MAX_DIMS);
  return check_updates(k, n, shape);
}

static const dks_validator v_movement_scatter[] = {
    {"ScatterElements", validate_scatter_elements},
    {"ScatterND", validate_scatter_nd},
};
DKS_REGISTER_VALIDATORS(v_movement_scatter)
