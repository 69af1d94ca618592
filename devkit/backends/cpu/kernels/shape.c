/*
 * shape.c -- the shape family's data movement and generators: Identity,
 * Reshape, Flatten, Squeeze, Unsqueeze, DepthToSpace, SpaceToDepth, Shape,
 * Size, NonZero, Range, ConstantOfShape, EyeLike, OneHot. (Cast and Resize
 * live in shape_cast.c and shape_resize.c.)
 *
 * The data movement kernels are dtype-agnostic byte copies by itemsize; one
 * function serves every dtype's entry.
 */
#include "shape.h"

/* ---- Strided copies -------------------------------------------------------- */

/* dks_inner_loop: operand 0 (destination) <- operand 1; ctx: the itemsize. */
#define COPY_LOOP(T) \
  for (int64_t i = 0; i < n; i++, o += s[0], a += s[1]) *(T *)o = *(const T *)a

static void copy_loop(int64_t n, uint8_t *const *p, const int64_t *s, void *ctx) {
  int64_t size = *(const int64_t *)ctx;
  uint8_t *o = p[0];
  const uint8_t *a = p[1];
  if (s[0] == size && s[1] == size) {
    memcpy(o, a, (size_t)(n * size));
    return;
  }
  switch (size) {
    case 1: COPY_LOOP(uint8_t); break;
    case 2: COPY_LOOP(uint16_t); break;
    case 4: COPY_LOOP(uint32_t); break;
    default: COPY_LOOP(uint64_t); break;
  }
}

/* Copies the elements of an ndim-dim index space: element (i...) of the
 * destination, at dst + sum(i * dst_strides), gets the source's at src +
 * sum(i * src_strides) (byte strides). */
static void copy_nd(int32_t ndim, const int64_t *shape, uint8_t *dst, const int64_t *dst_strides,
                    const uint8_t *src, const int64_t *src_strides, int64_t itemsize) {
  int64_t strides[2][DKS_MAX_DIMS];
  memcpy(strides[0], dst_strides, (size_t)ndim * sizeof(int64_t));
  memcpy(strides[1], src_strides, (size_t)ndim * sizeof(int64_t));
  uint8_t *base[2] = {dst, (uint8_t *)src};
  dks_nd_loop(2, ndim, shape, (const int64_t(*)[DKS_MAX_DIMS])strides, base, copy_loop, &itemsize);
}

/* Identity: any strides on both sides, same shape. */
static DK_Status identity(const dks_kernel_args *k) {
  int64_t itemsize = k->in[0].itemsize;
  dks_elementwise(k, 1, copy_loop, &itemsize);
  return DK_OK;
}

/* Dropout at inference: the data unchanged, and a mask that keeps everything. */
static DK_Status dropout(const dks_kernel_args *k) {
  int64_t itemsize = k->in[0].itemsize;
  dks_elementwise(k, 1, copy_loop, &itemsize);
  if (k->num_outputs > 1) memset(k->out[1].data, 1, (size_t)k->out[1].size);
  return DK_OK;
}

/* Reshape, Flatten, Squeeze, Unsqueeze: the input's elements in row-major
 * order into the compact output, read through the input's strides. */
static DK_Status copy_in_order(const dks_kernel_args *k) {
  const dks_tensor *in = &k->in[0];
  int64_t src[DKS_MAX_DIMS], dst[DKS_MAX_DIMS];
  dks_compact_strides(in->ndim, in->shape, dst);
  for (int32_t d = 0; d < in->ndim; d++) {
    dst[d] *= in->itemsize;
    src[d] = in->strides[d] * in->itemsize;
  }
  copy_nd(in->ndim, in->shape, k->out[0].data, dst, in->data, src, in->itemsize);
  return DK_OK;
}

/* ---- DepthToSpace, SpaceToDepth --------------------------------------------- */

/* Both walk the output in a 6-D view whose blocked dims split a spatial dim
 * (stride s) into (outer stride s * b, inner stride s). */
static DK_Status depth_to_space(const dks_kernel_args *k) {
  const dks_tensor *in = &k->in[0], *out = &k->out[0];
  int64_t b = dks_attr_int(k, "blocksize", 1), size = in->itemsize;
  bool crd = strcmp(dks_attr_string(k, "mode", "DCR"), "CRD") == 0;
  int64_t c_out = out->shape[1];
  const int64_t *is = in->strides, *os = out->strides;
  /* The output as [N, C', H, b (row in block), W, b (column in block)]. */
  int64_t shape[6] = {in->shape[0], c_out, in->shape[2], b, in->shape[3], b};
  int64_t dst[6] = {os[0], os[1], os[2] * b, os[2], os[3] * b, os[3]};
  /* Input channel: DCR (row * b + column) * C' + c; CRD (c * b + row) * b + column. */
  int64_t src[6] = {is[0], crd ? is[1] * b * b : is[1], is[2], crd ? is[1] * b : is[1] * b * c_out,
                    is[3], crd ? is[1] : is[1] * c_out};
  for (int d = 0; d < 6; d++) {
    dst[d] *= size;
    src[d] *= size;
  }
  copy_nd(6, shape, out->data, dst, in->data, src, size);
  return DK_OK;
}

static DK_Status space_to_depth(const dks_kernel_args *k) {
  const dks_tensor *in = &k->in[0], *out = &k->out[0];
  int64_t b = dks_attr_int(k, "blocksize", 1), size = in->itemsize;
  bool crd = strcmp(dks_attr_string(k, "mode", "DCR"), "CRD") == 0;
  int64_t c_in = in->shape[1];
  const int64_t *is = in->strides, *os = out->strides;
  /* The output as [N, b (row in block), b (column in block), C, H', W'];
   * output channel DCR (row * b + column) * C + c, CRD (c * b + row) * b + column. */
  int64_t shape[6] = {in->shape[0], b, b, c_in, out->shape[2], out->shape[3]};
  int64_t dst[6] = {os[0], crd ? os[1] * b : os[1] * b * c_in, crd ? os[1] : os[1] * c_in,
                    crd ? os[1] * b * b : os[1], os[2], os[3]};
  int64_t src[6] = {is[0], is[2], is[3], is[1], is[2] * b, is[3] * b};
  for (int d = 0; d < 6; d++) {
    dst[d] *= size;
    src[d] *= size;
  }
  copy_nd(6, shape, out->data, dst, in->data, src, size);
  return DK_OK;
}

/* ---- Shape, Size, NonZero -------------------------------------------------- */

/* The input's data is never read. */
static DK_Status shape_of(const dks_kernel_args *k) {
  const dks_tensor *in = &k->in[0];
  int64_t start = dks_attr_int(k, "start", 0);
  if (start < 0) start += in->ndim;
  start = start < 0 ? 0 : start > in->ndim ? in->ndim : start;
  int64_t *out = (int64_t *)k->out[0].data;
  for (int64_t i = 0; i < k->out[0].size && start + i < in->ndim; i++) out[i] = in->shape[start + i];
  return DK_OK;
}

static DK_Status size_of(const dks_kernel_args *k) {
  *(int64_t *)k->out[0].data = k->in[0].size;
  return DK_OK;
}

/* Zero tests by bits, the sign bit masked off for floats: -0 is zero, NaN is not. */
#define NONZERO_TEST(NAME, T, MASK)               \
  static inline bool NAME(const uint8_t *p) {     \
    T bits;                                       \
    memcpy(&bits, p, sizeof bits);                \
    return (bits & (MASK)) != 0;                  \
  }
NONZERO_TEST(nonzero_8, uint8_t, 0xffu)
NONZERO_TEST(nonzero_32, uint32_t, 0xffffffffu)
NONZERO_TEST(nonzero_64, uint64_t, UINT64_MAX)
NONZERO_TEST(nonzero_half, uint16_t, 0x7fffu)
NONZERO_TEST(nonzero_float, uint32_t, 0x7fffffffu)
NONZERO_TEST(nonzero_double, uint64_t, UINT64_C(0x7fffffffffffffff))

/* The host sized the output [rank, count] from the data it read; should the
 * kernel find another count (the data changed while the op was queued), it
 * writes no further than the output and fails. */
#define NONZERO_KERNEL(NAME, TEST)                                                             \
  static DK_Status NAME(const dks_kernel_args *k) {                                            \
    const dks_tensor *x = &k->in[0];                                                           \
    int64_t count = k->out[0].ndim == 2 ? k->out[0].shape[1] : 0, found = 0;                   \
    int64_t *out = (int64_t *)k->out[0].data, index[DKS_MAX_DIMS] = {0};                       \
    for (int64_t i = 0; i < x->size; i++) {                                                    \
      if (TEST(x->data + i * x->itemsize)) {                                                   \
        for (int32_t d = 0; found < count && d < x->ndim; d++) out[d * count + found] = index[d]; \
        found++;                                                                               \
      }                                                                                        \
      for (int32_t d = x->ndim - 1; d >= 0 && ++index[d] == x->shape[d]; d--) index[d] = 0;    \
    }                                                                                          \
    if (found != count)                                                                        \
      return dks_kernel_fail(k, DK_FAILED_PRECONDITION,                                        \
                             "X has %lld nonzero elements, but shape inference counted %lld "  \
                             "(did the data change while the op was queued?)",                 \
                             (long long)found, (long long)count);                              \
    return DK_OK;                                                                              \
  }

NONZERO_KERNEL(nonzero_bytes, nonzero_8)
NONZERO_KERNEL(nonzero_i32, nonzero_32)
NONZERO_KERNEL(nonzero_i64, nonzero_64)
NONZERO_KERNEL(nonzero_f16, nonzero_half)
NONZERO_KERNEL(nonzero_f32, nonzero_float)
NONZERO_KERNEL(nonzero_f64, nonzero_double)

/* ---- Range, ConstantOfShape, EyeLike, OneHot ---------------------------------- */

/* Range's start and delta arrive as one-element host attributes. */
static DK_Status range_float(const dks_kernel_args *k) {
  int64_t n;
  const double *start = dks_attr_floats(k, "start", &n);
  const double *delta = dks_attr_floats(k, "delta", &n);
  const dks_tensor *out = &k->out[0];
  if (out->size && (!start || !delta))
    return dks_kernel_fail(k, DK_INVALID_ARGUMENT, "start and delta must be float host inputs");
  for (int64_t i = 0; i < out->size; i++)
    dks_store_from_double(out->data + i * out->itemsize, out->dtype, *start + (double)i * *delta);
  return DK_OK;
}

/* start + i * delta in uint64: wraps exactly like the true value, which fits. */
static DK_Status range_int(const dks_kernel_args *k) {
  int64_t n;
  const int64_t *start = dks_attr_ints(k, "start", &n);
  const int64_t *delta = dks_attr_ints(k, "delta", &n);
  const dks_tensor *out = &k->out[0];
  if (out->size && (!start || !delta))
    return dks_kernel_fail(k, DK_INVALID_ARGUMENT, "start and delta must be integer host inputs");
  for (int64_t i = 0; i < out->size; i++) {
    int64_t value = (int64_t)((uint64_t)*start + (uint64_t)i * (uint64_t)*delta);
    if (out->itemsize == 4)
      ((int32_t *)out->data)[i] = (int32_t)value;
    else
      ((int64_t *)out->data)[i] = value;
  }
  return DK_OK;
}

/* Fills a compact tensor with copies of one element: doubling memcpys. */
static void fill(const dks_tensor *t, const uint8_t *element) {
  size_t total = (size_t)t->size * (size_t)t->itemsize, filled = (size_t)t->itemsize;
  if (!total) return;
  memcpy(t->data, element, filled);
  while (filled < total) {
    size_t chunk = filled < total - filled ? filled : total - filled;
    memcpy(t->data + filled, t->data, chunk);
    filled += chunk;
  }
}

static DK_Status constant_of_shape(const dks_kernel_args *k) {
  uint8_t element[8];
  dks_store_from_double(element, k->out[0].dtype, dks_attr_float(k, "value", 0.0));
  fill(&k->out[0], element);
  return DK_OK;
}

/* The input's data is never read; zero bits are 0 in every dtype. */
static DK_Status eye_like(const dks_kernel_args *k) {
  const dks_tensor *out = &k->out[0];
  if (!out->size) return DK_OK;
  int64_t rows = out->shape[0], cols = out->shape[1], diagonal = dks_attr_int(k, "k", 0);
  uint8_t one[8];
  dks_store_from_double(one, out->dtype, 1.0);
  memset(out->data, 0, (size_t)(out->size * out->itemsize));
  /* Clamped first, so that any int64 k is safe to negate: beyond the matrix
   * either way nothing is set. */
  diagonal = diagonal > cols ? cols : diagonal < -rows ? -rows : diagonal;
  /* Row i holds its one at column i + diagonal, for i in [first, last). */
  int64_t first = diagonal < 0 ? -diagonal : 0;
  int64_t last = cols - diagonal < rows ? cols - diagonal : rows;
  for (int64_t i = first; i < last; i++)
    memcpy(out->data + (i * cols + i + diagonal) * out->itemsize, one, (size_t)out->itemsize);
  return DK_OK;
}

/* Index -> position on the one-hot axis, or -1 when outside [-depth, depth):
 * integers exactly, floats truncated toward zero first (NaN and inf fall
 * outside). */
static int64_t one_hot_position(const dks_tensor *indices, int64_t i, int64_t depth) {
  const uint8_t *p = indices->data + i * indices->itemsize;
  int64_t position;
  if (shape_is_float(indices->dtype)) {
    double v = trunc(dks_load_as_double(p, indices->dtype));
    if (!(v >= -(double)depth && v < (double)depth)) return -1;
    position = (int64_t)v;
  } else {
    position = dks_load_as_int64(p, indices->dtype);
    if (position < -depth || position >= depth) return -1;
  }
  return position < 0 ? position + depth : position;
}

/* The output as [outer, depth, inner]: all off_value, then on_value at each
 * index's position. */
static DK_Status one_hot(const dks_kernel_args *k) {
  const dks_tensor *indices = &k->in[0], *values = &k->in[1], *out = &k->out[0];
  if (!out->size) return DK_OK;
  int64_t axis = dks_attr_int(k, "axis", -1);
  if (axis < 0) axis += out->ndim;
  int64_t depth = out->shape[axis], inner = 1, size = out->itemsize;
  for (int32_t d = (int32_t)axis + 1; d < out->ndim; d++) inner *= out->shape[d];
  fill(out, values->data);
  const uint8_t *on = values->data + size;
  for (int64_t i = 0; i < indices->size; i++) {
    int64_t position = one_hot_position(indices, i, depth);
    if (position < 0) continue;
    int64_t outer = i / inner, within = i % inner;
    memcpy(out->data + ((outer * depth + position) * inner + within) * size, on, (size_t)size);
  }
  return DK_OK;
}

/* ---- Registration ------------------------------------------------------------ */

/* Kernels that read their input through its strides but write a compact
 * output, or never read the input at all. */
#define READS_STRIDED DK_KERNEL_STRIDED_INPUTS

static const dks_kernel_def k_shape[] = {
    DKS_ALL_DTYPES("Identity", identity, DKS_STRIDED),
    {"Dropout", DK_DTYPE_FLOAT16, dropout, DK_KERNEL_STRIDED_INPUTS},
    {"Dropout", DK_DTYPE_BFLOAT16, dropout, DK_KERNEL_STRIDED_INPUTS},
    {"Dropout", DK_DTYPE_FLOAT32, dropout, DK_KERNEL_STRIDED_INPUTS},
    {"Dropout", DK_DTYPE_FLOAT64, dropout, DK_KERNEL_STRIDED_INPUTS},
    DKS_ALL_DTYPES("Reshape", copy_in_order, READS_STRIDED),
    DKS_ALL_DTYPES("Flatten", copy_in_order, READS_STRIDED),
    DKS_ALL_DTYPES("Squeeze", copy_in_order, READS_STRIDED),
    DKS_ALL_DTYPES("Unsqueeze", copy_in_order, READS_STRIDED),
    DKS_ALL_DTYPES("DepthToSpace", depth_to_space, DKS_STRIDED),
    DKS_ALL_DTYPES("SpaceToDepth", space_to_depth, DKS_STRIDED),
    DKS_ALL_DTYPES("Shape", shape_of, READS_STRIDED),
    DKS_ALL_DTYPES("Size", size_of, READS_STRIDED),
    DKS_ALL_DTYPES("EyeLike", eye_like, READS_STRIDED),
    DKS_ALL_DTYPES("ConstantOfShape", constant_of_shape, 0),
    DKS_ALL_DTYPES("OneHot", one_hot, 0),
    {"NonZero", DK_DTYPE_BOOL, nonzero_bytes, 0},
    {"NonZero", DK_DTYPE_INT8, nonzero_bytes, 0},
    {"NonZero", DK_DTYPE_UINT8, nonzero_bytes, 0},
    {"NonZero", DK_DTYPE_INT32, nonzero_i32, 0},
    {"NonZero", DK_DTYPE_INT64, nonzero_i64, 0},
    {"NonZero", DK_DTYPE_FLOAT16, nonzero_f16, 0},
    {"NonZero", DK_DTYPE_BFLOAT16, nonzero_f16, 0},
    {"NonZero", DK_DTYPE_FLOAT32, nonzero_f32, 0},
    {"NonZero", DK_DTYPE_FLOAT64, nonzero_f64, 0},
    {"Range", DK_DTYPE_FLOAT32, range_float, 0},
    {"Range", DK_DTYPE_FLOAT64, range_float, 0},
    {"Range", DK_DTYPE_INT32, range_int, 0},
    {"Range", DK_DTYPE_INT64, range_int, 0},
};
DKS_REGISTER_KERNELS(k_shape)

/* ---- Validators ------------------------------------------------------------------- */

/* Flatten: a 2-D output of the dims before `axis` times those from it on. */
static DK_Status validate_flatten(const dks_kernel_args *k) {
  const dks_tensor *in = &k->in[0];
  int64_t axis = dks_attr_int(k, "axis", 1), shape[2] = {1, 1};
  if (axis < -in->ndim || axis > in->ndim) /* in [-rank, rank]: a negative one counts from the back */
    return dks_invalid(k, "attribute 'axis' is %lld, out of range for rank %d", (long long)axis, in->ndim);
  if (axis < 0) axis += in->ndim;
  DK_Status st = dks_check_dtype(k, "output", 0, in->dtype);
  if (st != DK_OK) return st;
  for (int32_t d = 0; d < in->ndim; d++) shape[d < axis ? 0 : 1] *= in->shape[d]; /* in->size did not overflow */
  return dks_check_output(k, 0, 2, shape);
}

/* DepthToSpace and SpaceToDepth: rank-4 X (N, C, H, W), blocksize b >= 1; DepthToSpace
 * gives (N, C / b^2, H b, W b), SpaceToDepth (N, C b^2, H / b, W / b). */
static DK_Status validate_block_move(const dks_kernel_args *k) {
  const dks_tensor *x = &k->in[0];
  int64_t b = dks_attr_int(k, "blocksize", 0), square, shape[4];
  DK_Status st = dks_check_rank(k, 0, 4, 4);
  if (st == DK_OK) st = dks_check_dtype(k, "output", 0, x->dtype);
  if (st != DK_OK) return st;
  if (b < 1 || __builtin_mul_overflow(b, b, &square))
    return dks_invalid(k, "attribute 'blocksize' is %lld; it must be at least 1", (long long)b);
  bool to_space = strcmp(k->op, "DepthToSpace") == 0;
  bool fits = to_space ? x->shape[1] % square == 0 : x->shape[2] % b == 0 && x->shape[3] % b == 0;
  shape[0] = x->shape[0];
  if (fits && to_space) {
    shape[1] = x->shape[1] / square;
    fits = !__builtin_mul_overflow(x->shape[2], b, &shape[2]) && !__builtin_mul_overflow(x->shape[3], b, &shape[3]);
  } else if (fits) {
    fits = !__builtin_mul_overflow(x->shape[1], square, &shape[1]);
    shape[2] = x->shape[2] / b;
    shape[3] = x->shape[3] / b;
  }
  if (!fits)
    return dks_invalid(k, "blocksize %lld does not divide input shape (%lld, %lld, %lld, %lld)", (long long)b,
                       (long long)x->shape[0], (long long)x->shape[1], (long long)x->shape[2],
                       (long long)x->shape[3]);
  return dks_check_output(k, 0, 4, shape);
}

/* EyeLike: a matrix; the output of its shape, in the "dtype" attribute's
 * dtype (default the input's). */
static DK_Status validate_eye_like(const dks_kernel_args *k) {
  DK_Status st = dks_check_rank(k, 0, 2, 2);
  if (st == DK_OK) st = dks_check_output_like(k, 0, 0);
  return st != DK_OK ? st : dks_check_dtype(k, "output", 0, dks_attr_dtype(k, "dtype", k->in[0].dtype));
}

/* Dropout: output like data; the optional mask of data's shape, bool. */
static DK_Status validate_dropout(const dks_kernel_args *k) {
  DK_Status st = dks_check_output_like(k, 0, 0);
  if (st == DK_OK) st = dks_check_dtype(k, "output", 0, k->in[0].dtype);
  if (st == DK_OK && k->num_outputs > 1) st = dks_check_output_like(k, 1, 0);
  if (st == DK_OK && k->num_outputs > 1) st = dks_check_dtype(k, "output", 1, DK_DTYPE_BOOL);
  return st;
}

/* Reshape: `shape` (the host input) as devkit/ops/shape.py's _reshape_shape
 * reads it -- a 0 copies the input's dimension unless allowzero, one -1 is
 * inferred -- giving as many elements as the input. */
static DK_Status validate_reshape(const dks_kernel_args *k) {
  const dks_tensor *in = &k->in[0];
  DK_Status st = dks_check_int_list(k, "shape");
  if (st == DK_OK) st = dks_check_dtype(k, "output", 0, in->dtype);
  if (st != DK_OK) return st;
  int64_t count, known = 1, shape[DKS_MAX_DIMS];
  const int64_t *target = dks_attr_ints(k, "shape", &count);
  bool allowzero = dks_attr_int(k, "allowzero", 0) != 0, zero = false, overflows = false;
  if (count > DKS_MAX_DIMS)
    return dks_invalid(k, "attribute 'shape' has %lld values, over %d", (long long)count, DKS_MAX_DIMS);
  int32_t inferred = -1;
  for (int32_t d = 0; d < count; d++) {
    int64_t n = target[d];
    if (n < -1) return dks_invalid(k, "attribute 'shape' value %d is %lld; only -1 may be negative", d, (long long)n);
    if (n == -1 && inferred >= 0) return dks_invalid(k, "attribute 'shape' has more than one -1");
    if (n == -1) {
      inferred = d;
      continue;
    }
    if (n == 0 && !allowzero) {
      if (d >= in->ndim)
        return dks_invalid(k, "attribute 'shape' value %d is 0 (copy the input's dimension), but the input has "
                           "rank %d", d, in->ndim);
      n = in->shape[d];
    }
    shape[d] = n;
    zero = zero || n == 0;
    overflows = overflows || __builtin_mul_overflow(known, n, &known);
  }
  if (zero) known = 0;
  if (inferred >= 0) {
    if (known == 0 || overflows || in->size % known)
      return dks_invalid(k, "cannot infer the -1 in attribute 'shape' for an input of %lld elements",
                         (long long)in->size);
    shape[inferred] = in->size / known;
  } else if (overflows || known != in->size) {
    return dks_invalid(k, "attribute 'shape' does not give the input's %lld elements", (long long)in->size);
  }
  return dks_check_output(k, 0, (int32_t)count, shape);
}

/* Squeeze: the axes (the host input; omitted or empty: every size-1 dim)
 * are distinct dims of size 1, removed. */
static DK_Status validate_squeeze(const dks_kernel_args *k) {
  const dks_tensor *in = &k->in[0];
  int32_t axes[DKS_MAX_DIMS], ndim = 0;
  int64_t count, shape[DKS_MAX_DIMS];
  DK_Status st = dks_check_axes(k, "axes", in->ndim, axes, &count);
  if (st == DK_OK) st = dks_check_dtype(k, "output", 0, in->dtype);
  if (st != DK_OK) return st;
  bool removed[DKS_MAX_DIMS] = {false};
  for (int64_t i = 0; i < count; i++) {
    if (in->shape[axes[i]] != 1)
      return dks_invalid(k, "attribute 'axes' names axis %d, of size %lld, not 1", axes[i],
                         (long long)in->shape[axes[i]]);
    removed[axes[i]] = true;
  }
  for (int32_t d = 0; d < in->ndim; d++)
    if (count > 0 ? !removed[d] : in->shape[d] != 1) shape[ndim++] = in->shape[d];
  return dks_check_output(k, 0, ndim, shape);
}

/* Unsqueeze: the axes (the host input) are distinct positions in the output,
 * of rank the input's plus their count; size-1 dims go there. */
static DK_Status validate_unsqueeze(const dks_kernel_args *k) {
  const dks_tensor *in = &k->in[0];
  int32_t axes[DKS_MAX_DIMS];
  int64_t count, shape[DKS_MAX_DIMS];
  dks_attr_ints(k, "axes", &count);
  DK_Status st = dks_check_int_list(k, "axes");
  if (st == DK_OK) st = dks_check_dtype(k, "output", 0, in->dtype);
  if (st != DK_OK) return st;
  if (count > DKS_MAX_DIMS - in->ndim)
    return dks_invalid(k, "attribute 'axes' has %lld values; the output's rank would pass %d", (long long)count,
                       DKS_MAX_DIMS);
  int32_t ndim = in->ndim + (int32_t)count;
  if ((st = dks_check_axes(k, "axes", ndim, axes, &count)) != DK_OK) return st;
  bool inserted[DKS_MAX_DIMS] = {false};
  for (int64_t i = 0; i < count; i++) inserted[axes[i]] = true;
  for (int32_t d = 0, next = 0; d < ndim; d++) shape[d] = inserted[d] ? 1 : in->shape[next++];
  return dks_check_output(k, 0, ndim, shape);
}

/* Shape: an int64 vector of the dims in [start, end), both clamped to [0, rank]. */
static int64_t clamp_to_rank(int64_t axis, int32_t rank) {
  if (axis < 0) axis += rank;
  return axis < 0 ? 0 : axis > rank ? rank : axis;
}

static DK_Status validate_shape(const dks_kernel_args *k) {
  int32_t rank = k->in[0].ndim;
  int64_t start = clamp_to_rank(dks_attr_int(k, "start", 0), rank);
  int64_t end = dks_attr(k, "end") ? clamp_to_rank(dks_attr_int(k, "end", rank), rank) : rank;
  int64_t length = end > start ? end - start : 0;
  DK_Status st = dks_check_dtype(k, "output", 0, DK_DTYPE_INT64);
  return st != DK_OK ? st : dks_check_output(k, 0, 1, &length);
}

/* Host attribute `name` holds one value of the kernel's kind (floats for a
 * float kernel, ints otherwise); *value gets it as double, *ivalue as int64. */
static DK_Status check_host_scalar(const dks_kernel_args *k, const char *name, bool floating, double *value,
                                   int64_t *ivalue) {
  const DK_Attribute *a = dks_attr(k, name);
  if (a->count != 1 || a->type != (floating ? DK_ATTR_FLOATS : DK_ATTR_INTS))
    return dks_invalid(k, "attribute '%s' must be one %s value, got %lld %s", name, floating ? "float" : "integer",
                       (long long)a->count, a->type == DK_ATTR_INTS ? "ints" : "floats");
  *value = floating ? a->floats[0] : (double)a->ints[0];
  *ivalue = floating ? 0 : a->ints[0];
  return DK_OK;
}

/* Range: start, limit and delta one value each, of the kernel's dtype (an
 * int32 kernel's inside int32); the output a vector of the kernel's dtype
 * with max(ceil((limit - start) / delta), 0) elements (exact for integers). */
static DK_Status validate_range(const dks_kernel_args *k) {
  static const char *const names[3] = {"start", "limit", "delta"};
  bool floating = shape_is_float(k->dtype);
  double v[3];
  int64_t iv[3], count;
  DK_Status st = dks_check_dtype(k, "output", 0, k->dtype);
  for (int i = 0; st == DK_OK && i < 3; i++) {
    st = check_host_scalar(k, names[i], floating, &v[i], &iv[i]);
    if (st == DK_OK && k->dtype == DK_DTYPE_INT32 && (iv[i] < INT32_MIN || iv[i] > INT32_MAX))
      st = dks_invalid(k, "attribute '%s' is %lld, outside int32", names[i], (long long)iv[i]);
  }
  if (st != DK_OK) return st;
  if (v[2] == 0.0) return dks_invalid(k, "attribute 'delta' is 0");
  if (floating) {
    double quotient = ceil((v[1] - v[0]) / v[2]);
    if (!isfinite(quotient) || quotient >= 0x1p63)
      return dks_invalid(k, "start %g, limit %g and delta %g give no finite element count", v[0], v[1], v[2]);
    count = quotient > 0 ? (int64_t)quotient : 0;
  } else { /* ceil((limit - start) / delta) in 128 bits: the difference may pass int64 */
    __int128 span = (__int128)iv[1] - iv[0], step = iv[2];
    __int128 n = span / step + (span % step != 0 && (span < 0) == (step < 0));
    if (n > INT64_MAX) return dks_invalid(k, "start, limit and delta give more elements than int64 counts");
    count = n > 0 ? (int64_t)n : 0;
  }
  return dks_check_output(k, 0, 1, &count);
}

/* ConstantOfShape: the output of the shape (the host input, entries >= 0)
 * and of the dtype attribute, which is the kernel's; a value that dtype
 * holds: any for floats, 0 or 1 for bool, an integer in range otherwise. */
static DK_Status validate_constant_of_shape(const dks_kernel_args *k) {
  int64_t count;
  const int64_t *shape = dks_attr_ints(k, "input", &count);
  DK_Status st = dks_check_int_list(k, "input");
  if (st == DK_OK) st = dks_check_ints(k, "input", -1, 0);
  if (st == DK_OK && dks_attr_dtype(k, "dtype", 0) != k->dtype)
    st = dks_invalid(k, "attribute 'dtype' is dtype key 0x%x; this kernel is for 0x%x",
                     (unsigned)dks_attr_dtype(k, "dtype", 0), (unsigned)k->dtype);
  if (st == DK_OK) st = dks_check_dtype(k, "output", 0, k->dtype);
  if (st != DK_OK) return st;
  if (count > DKS_MAX_DIMS)
    return dks_invalid(k, "attribute 'input' has %lld values, over %d", (long long)count, DKS_MAX_DIMS);
  double value = dks_attr_float(k, "value", 0.0), low, past_high; /* the integer range [low, past_high) */
  switch ((int)k->dtype) {
    case DK_DTYPE_BOOL: low = 0, past_high = 2; break;
    case DK_DTYPE_INT8: low = INT8_MIN, past_high = 0x1p7; break;
    case DK_DTYPE_UINT8: low = 0, past_high = 0x1p8; break;
    case DK_DTYPE_INT32: low = INT32_MIN, past_high = 0x1p31; break;
    case DK_DTYPE_INT64: low = -0x1p63, past_high = 0x1p63; break;
    default: low = -INFINITY, past_high = INFINITY; break; /* a float dtype takes any value */
  }
  if (!shape_is_float(k->dtype) && !(value >= low && value < past_high && value == trunc(value)))
    return dks_invalid(k, "attribute 'value' is %g, which the output dtype does not hold", value);
  return dks_check_output(k, 0, (int32_t)count, shape);
}

/* OneHot: numeric indices; depth (the host input) one value, a float one
 * finite and truncated, at least 0; values [off, on]; the output the
 * indices' shape with depth inserted at axis, in the values' dtype. */
static DK_Status validate_one_hot(const dks_kernel_args *k) {
  const dks_tensor *indices = &k->in[0], *values = &k->in[1];
  static const DK_DTypeKey numeric[] = {DK_DTYPE_INT8,    DK_DTYPE_UINT8,    DK_DTYPE_INT32,   DK_DTYPE_INT64,
                                        DK_DTYPE_FLOAT16, DK_DTYPE_BFLOAT16, DK_DTYPE_FLOAT32, DK_DTYPE_FLOAT64};
  bool known = false;
  for (size_t i = 0; i < sizeof numeric / sizeof numeric[0]; i++) known = known || indices->dtype == numeric[i];
  if (!known) return dks_invalid(k, "input 0 (indices) has dtype key 0x%x; indices are numeric", (unsigned)indices->dtype);
  if (values->ndim != 1 || values->shape[0] != 2)
    return dks_invalid(k, "input 1 (values) must have shape (2) ([off, on])");
  if (indices->ndim >= DKS_MAX_DIMS) return dks_invalid(k, "the output's rank would pass %d", DKS_MAX_DIMS);
  const DK_Attribute *a = dks_attr(k, "depth");
  double depth = a->count != 1 ? NAN : a->type == DK_ATTR_INTS ? (double)a->ints[0] : trunc(a->floats[0]);
  if (!(depth >= 0 && depth < 0x1p63))
    return dks_invalid(k, "attribute 'depth' must be one finite value >= 0");
  int64_t axis, shape[DKS_MAX_DIMS];
  DK_Status st = dks_check_axis(k, "axis", indices->ndim, true, &axis);
  if (st == DK_OK) st = dks_check_dtype(k, "output", 0, values->dtype);
  if (st != DK_OK) return st;
  for (int32_t d = 0, next = 0; d <= indices->ndim; d++)
    shape[d] = d == axis ? (a->type == DK_ATTR_INTS ? a->ints[0] : (int64_t)depth) : indices->shape[next++];
  return dks_check_output(k, 0, indices->ndim + 1, shape);
}

/* Size: an int64 scalar. */
static DK_Status validate_size(const dks_kernel_args *k) {
  DK_Status st = dks_check_dtype(k, "output", 0, DK_DTYPE_INT64);
  return st != DK_OK ? st : dks_check_output(k, 0, 0, NULL);
}

/* NonZero: int64 (rank, count); the count is the data's, which the kernel
 * checks as it reads it. */
static DK_Status validate_nonzero(const dks_kernel_args *k) {
  const dks_tensor *out = &k->out[0];
  DK_Status st = dks_check_dtype(k, "output", 0, DK_DTYPE_INT64);
  if (st != DK_OK) return st;
  int64_t shape[2] = {k->in[0].ndim, out->ndim == 2 ? out->shape[1] : 0};
  return dks_check_output(k, 0, 2, shape);
}

static const dks_validator v_shape[] = {
    {"Size", validate_size},
    {"NonZero", validate_nonzero},
    {"Reshape", validate_reshape},
    {"Squeeze", validate_squeeze},
    {"Unsqueeze", validate_unsqueeze},
    {"Shape", validate_shape},
    {"Range", validate_range},
    {"ConstantOfShape", validate_constant_of_shape},
    {"OneHot", validate_one_hot},
    {"Identity", dks_validate_like_input},
    {"EyeLike", validate_eye_like},
    {"Dropout", validate_dropout},
    {"Flatten", validate_flatten},
    {"DepthToSpace", validate_block_move},
    {"SpaceToDepth", validate_block_move},
};
DKS_REGISTER_VALIDATORS(v_shape)
