/*
 * movement.c -- the strided copy engine of the data-movement kernels, and
 * the kernels that are views plus one copy: Transpose, Concat, Split, Slice,
 * Expand and Tile. Each builds, for the output's index space, the byte
 * strides at which its input is read, and hands both to movement_copy; so
 * they all honour input and output strides (DKS_STRIDED).
 */
#include "movement.h"

/* Edge of a transposing block, in elements: a 32 x 32 block of 8-byte
 * elements is 8 KiB on each side, inside L1. */
#define TILE 32

void movement_copy_run(uint8_t *dst, int64_t dst_step, const uint8_t *src, int64_t src_step,
                       int64_t n, int32_t itemsize) {
  if (n == 1) {
    movement_copy_element(dst, src, itemsize);
    return;
  }
  if (dst_step == itemsize && src_step == itemsize) {
    memcpy(dst, src, (size_t)(n * itemsize));
    return;
  }
#define RUN(SIZE)                                                        \
  for (int64_t i = 0; i < n; i++, dst += dst_step, src += src_step)      \
    memcpy(dst, src, SIZE);                                              \
  break;
  switch (itemsize) {
    case 1: RUN(1)
    case 2: RUN(2)
    case 4: RUN(4)
    case 8: RUN(8)
    default: RUN((size_t)itemsize)
  }
#undef RUN
}

/* The copy's dims without size-1 ones, merged where both sides are
 * contiguous across them; innermost first. */
typedef struct merged_dims {
  int n;
  int64_t size[MOVEMENT_MAX_DIMS], dst[MOVEMENT_MAX_DIMS], src[MOVEMENT_MAX_DIMS];
} merged_dims;

/* False when the shape has no elements. */
static bool merge_dims(int32_t ndim, const int64_t *shape, const int64_t *dst, const int64_t *src,
                       merged_dims *m) {
  m->n = 0;
  for (int32_t d = ndim - 1; d >= 0; d--) {
    if (shape[d] == 0) return false;
    if (shape[d] == 1) continue;
    int last = m->n - 1;
    if (last >= 0 && dst[d] == m->dst[last] * m->size[last] &&
        src[d] == m->src[last] * m->size[last]) {
      m->size[last] *= shape[d];
      continue;
    }
    m->size[m->n] = shape[d];
    m->dst[m->n] = dst[d];
    m->src[m->n] = src[d];
    m->n++;
  }
  return true;
}

/* Dims 0 and 1 of `m` in TILE x TILE blocks: dim 0 is contiguous in dst and
 * dim 1 in src, so each block reads and writes whole cache lines. Large
 * copies split over the thread pool by columns of blocks. */
typedef struct tiled_copy {
  const merged_dims *m;
  uint8_t *dst;
  const uint8_t *src;
  int32_t itemsize;
} tiled_copy;

/* Elements (i, j) for i in [i0, i1), j in [j0, j1), one at a time. */
static void copy_block(const tiled_copy *t, int64_t i0, int64_t i1, int64_t j0, int64_t j1) {
  const int64_t d0 = t->m->dst[0], d1 = t->m->dst[1], s0 = t->m->src[0], s1 = t->m->src[1];
  uint8_t *dst = t->dst;
  const uint8_t *src = t->src;
#define BLOCK(SIZE)                                               \
  for (int64_t j = j0; j < j1; j++)                               \
    for (int64_t i = i0; i < i1; i++)                             \
      memcpy(dst + j * d1 + i * d0, src + j * s1 + i * s0, SIZE); \
  break;
  switch (t->itemsize) {
    case 1: BLOCK(1)
    case 2: BLOCK(2)
    case 4: BLOCK(4)
    case 8: BLOCK(8)
    default: BLOCK((size_t)t->itemsize)
  }
#undef BLOCK
}

#if defined(__has_builtin)
#if __has_builtin(__builtin_shufflevector)
#define MOVEMENT_HAS_SHUFFLE 1
/* 4-byte elements in 8 x 8 blocks through vector registers (GCC vector
 * extensions: AVX2 in the avx2 clone): 8 loads of 8 along src's contiguous
 * dim, the transpose in three rounds of two-vector shuffles (unpack,
 * pairs, halves), 8 stores along dst's. */
typedef uint32_t tile_vec __attribute__((vector_size(8 * sizeof(uint32_t))));

static inline __attribute__((always_inline)) void transpose_8x8(uint8_t *dst, int64_t d1, const uint8_t *src,
                                                                int64_t s0) {
  tile_vec r[8], t[8], u[8];
  for (int k = 0; k < 8; k++) memcpy(&r[k], src + k * s0, sizeof r[k]); /* r[k][j]: element (i0 + k, j0 + j) */
  for (int k = 0; k < 8; k += 2) {
    t[k] = __builtin_shufflevector(r[k], r[k + 1], 0, 8, 1, 9, 4, 12, 5, 13);
    t[k + 1] = __builtin_shufflevector(r[k], r[k + 1], 2, 10, 3, 11, 6, 14, 7, 15);
  }
  for (int k = 0; k < 8; k += 4)
    for (int h = 0; h < 2; h++) {
      u[k + 2 * h] = __builtin_shufflevector(t[k + h], t[k + h + 2], 0, 1, 8, 9, 4, 5, 12, 13);
      u[k + 2 * h + 1] = __builtin_shufflevector(t[k + h], t[k + h + 2], 2, 3, 10, 11, 6, 7, 14, 15);
    }
  for (int j = 0; j < 4; j++) { /* u[j] and u[j + 4] hold column j's and j + 4's halves */
    tile_vec lo = __builtin_shufflevector(u[j], u[j + 4], 0, 1, 2, 3, 8, 9, 10, 11);
    tile_vec hi = __builtin_shufflevector(u[j], u[j + 4], 4, 5, 6, 7, 12, 13, 14, 15);
    memcpy(dst + j * d1, &lo, sizeof lo);
    memcpy(dst + (j + 4) * d1, &hi, sizeof hi);
  }
}
#endif
#endif

/* Columns of blocks [begin, end). */
DKS_VECTOR_CLONES static void copy_tiles(void *ctx, int64_t begin, int64_t end) {
  const tiled_copy *t = ctx;
  const merged_dims *m = t->m;
  int64_t last = end * TILE < m->size[1] ? end * TILE : m->size[1];
  for (int64_t j0 = begin * TILE; j0 < last; j0 += TILE) {
    int64_t j1 = last - j0 < TILE ? last : j0 + TILE;
    for (int64_t i0 = 0; i0 < m->size[0]; i0 += TILE) {
      int64_t i1 = m->size[0] - i0 < TILE ? m->size[0] : i0 + TILE;
      int64_t i8 = i0, j8 = j0; /* the ends of the 8 x 8 blocks */
#ifdef MOVEMENT_HAS_SHUFFLE
      if (t->itemsize == 4) {
        i8 = i0 + (i1 - i0) / 8 * 8, j8 = j0 + (j1 - j0) / 8 * 8;
        for (int64_t j = j0; j < j8; j += 8)
          for (int64_t i = i0; i < i8; i += 8)
            transpose_8x8(t->dst + j * m->dst[1] + i * m->dst[0], m->dst[1], t->src + j * m->src[1] + i * m->src[0],
                          m->src[0]);
      }
#endif
      copy_block(t, i8, i1, j0, j8); /* the rows below the 8 x 8 blocks ... */
      copy_block(t, i0, i1, j8, j1); /* ... and the columns right of them */
    }
  }
}

/* A tiled copy splits from this many bytes. */
#define TILED_SPLIT_BYTES ((int64_t)1 << 20)

static void copy_tiled(const merged_dims *m, uint8_t *dst, const uint8_t *src, int32_t itemsize) {
  tiled_copy t = {.m = m, .dst = dst, .src = src, .itemsize = itemsize};
  int64_t columns = (m->size[1] + TILE - 1) / TILE, column_bytes = m->size[0] * TILE * itemsize;
  dks_parallel_for(columns, column_bytes >= TILED_SPLIT_BYTES ? 1 : TILED_SPLIT_BYTES / column_bytes, copy_tiles,
                   &t);
}

void movement_copy(int32_t ndim, const int64_t *shape, uint8_t *dst, const int64_t *dst_strides,
                   const uint8_t *src, const int64_t *src_strides, int32_t itemsize) {
  merged_dims m;
  if (!merge_dims(ndim, shape, dst_strides, src_strides, &m)) return;
  if (m.n == 0) {
    movement_copy_element(dst, src, itemsize);
    return;
  }
  /* A transpose: dst's innermost dim is strided in src, and some other dim
   * is contiguous there. Bring that dim next to the innermost and tile the
   * pair. (Elements are independent, so any walk order is a valid copy.) */
  int inner = 1;
  if (m.dst[0] == itemsize && m.src[0] != itemsize && m.src[0] != 0) {
    for (int j = 1; j < m.n; j++) {
      if (m.src[j] != itemsize) continue;
      int64_t size = m.size[j], d = m.dst[j], s = m.src[j];
      m.size[j] = m.size[1], m.dst[j] = m.dst[1], m.src[j] = m.src[1];
      m.size[1] = size, m.dst[1] = d, m.src[1] = s;
      inner = 2;
      break;
    }
  }
  int64_t index[MOVEMENT_MAX_DIMS] = {0};
  for (;;) {
    if (inner == 2)
      copy_tiled(&m, dst, src, itemsize);
    else
      movement_copy_run(dst, m.dst[0], src, m.src[0], m.size[0], itemsize);
    int d = inner;
    for (; d < m.n; d++) { /* odometer over the outer dims */
      dst += m.dst[d];
      src += m.src[d];
      if (++index[d] < m.size[d]) break;
      dst -= m.dst[d] * m.size[d];
      src -= m.src[d] * m.size[d];
      index[d] = 0;
    }
    if (d == m.n) return;
  }
}

DK_Status movement_index_error(const dks_kernel_args *k, int64_t value, int64_t position,
                               int32_t axis, int64_t dim) {
  return dks_kernel_fail(k, DK_OUT_OF_RANGE,
                         "index %lld (element %lld of indices) is out of range for axis %d of "
                         "size %lld: valid indices are in [%lld, %lld)",
                         (long long)value, (long long)position, axis, (long long)dim,
                         (long long)-dim, (long long)dim);
}

DK_Status movement_check_indices(const dks_kernel_args *k, const dks_tensor *indices,
                                 int64_t dim, int32_t axis) {
  for (int64_t i = 0; i < indices->size; i++) {
    int64_t v = movement_index(indices, i);
    if (v < -dim || v >= dim) return movement_index_error(k, v, i, axis, dim);
  }
  return DK_OK;
}

/* ---- Kernels ------------------------------------------------------------- */

static int32_t normalized_axis(int64_t axis, int32_t ndim) {
  return (int32_t)(axis < 0 ? axis + ndim : axis);
}

/* Output dim d is input dim perm[d] (the dims reversed without perm), so it
 * reads the input with that dim's stride. */
static DK_Status transpose(const dks_kernel_args *k) {
  const dks_tensor *in = &k->in[0], *out = &k->out[0];
  if (out->size == 0) return DK_OK;
  int64_t count;
  const int64_t *perm = dks_attr_ints(k, "perm", &count);
  int64_t src[DKS_MAX_DIMS], dst[DKS_MAX_DIMS];
  movement_byte_strides(out, dst);
  for (int32_t d = 0; d < out->ndim; d++) {
    int64_t axis = perm ? perm[d] : out->ndim - 1 - d;
    src[d] = in->strides[axis] * in->itemsize;
  }
  movement_copy(out->ndim, out->shape, out->data, dst, in->data, src, in->itemsize);
  return DK_OK;
}

/* Each input is copied into its slab of the output along `axis`. */
static DK_Status concat(const dks_kernel_args *k) {
  const dks_tensor *out = &k->out[0];
  if (out->size == 0) return DK_OK;
  int32_t axis = normalized_axis(dks_attr_int(k, "axis", 0), out->ndim);
  int64_t dst[DKS_MAX_DIMS], src[DKS_MAX_DIMS];
  movement_byte_strides(out, dst);
  int64_t position = 0;
  for (size_t i = 0; i < k->num_inputs; i++) {
    const dks_tensor *in = &k->in[i];
    movement_byte_strides(in, src);
    movement_copy(in->ndim, in->shape, out->data + position * dst[axis], dst, in->data, src,
                  in->itemsize);
    position += in->shape[axis];
  }
  return DK_OK;
}

/* The outputs' extents along `axis` are the split sizes. */
static DK_Status split(const dks_kernel_args *k) {
  const dks_tensor *in = &k->in[0];
  if (in->size == 0) return DK_OK;
  int32_t axis = normalized_axis(dks_attr_int(k, "axis", 0), in->ndim);
  int64_t dst[DKS_MAX_DIMS], src[DKS_MAX_DIMS];
  movement_byte_strides(in, src);
  int64_t position = 0;
  for (size_t i = 0; i < k->num_outputs; i++) {
    const dks_tensor *out = &k->out[i];
    movement_byte_strides(out, dst);
    movement_copy(out->ndim, out->shape, out->data, dst, in->data + position * src[axis], src,
                  in->itemsize);
    position += out->shape[axis];
  }
  return DK_OK;
}

/* Output index i of dim d reads input index start[d] + i * step[d]; the
 * starts are clamped as ONNX specifies (the host derived the output shape
 * from the same rules). */
static DK_Status slice(const dks_kernel_args *k) {
  const dks_tensor *in = &k->in[0], *out = &k->out[0];
  if (out->size == 0) return DK_OK;
  int64_t n, n_axes, n_steps;
  const int64_t *starts = dks_attr_ints(k, "starts", &n);
  const int64_t *axes = dks_attr_ints(k, "axes", &n_axes);
  const int64_t *steps = dks_attr_ints(k, "steps", &n_steps);
  int64_t start[DKS_MAX_DIMS] = {0}, step[DKS_MAX_DIMS];
  for (int32_t d = 0; d < in->ndim; d++) step[d] = 1;
  for (int64_t i = 0; i < n; i++) {
    int32_t axis = normalized_axis(axes ? axes[i] : i, in->ndim);
    int64_t dim = in->shape[axis], s = starts[i];
    step[axis] = steps ? steps[i] : 1;
    if (s < 0) s += dim;
    int64_t high = step[axis] > 0 ? dim : dim - 1;
    start[axis] = s < 0 ? 0 : s > high ? high : s;
  }
  const uint8_t *first = in->data;
  int64_t src[DKS_MAX_DIMS], dst[DKS_MAX_DIMS];
  movement_byte_strides(out, dst);
  for (int32_t d = 0; d < in->ndim; d++) {
    first += start[d] * in->strides[d] * in->itemsize;
    /* A dim with one output element never steps (and a huge step times the
     * stride could overflow). */
    src[d] = out->shape[d] > 1 ? step[d] * in->strides[d] * in->itemsize : 0;
  }
  movement_copy(out->ndim, out->shape, out->data, dst, first, src, in->itemsize);
  return DK_OK;
}

/* Broadcasting: size-1 (and missing leading) input dims are read with
 * stride 0. */
static DK_Status expand(const dks_kernel_args *k) {
  const dks_tensor *in = &k->in[0], *out = &k->out[0];
  if (out->size == 0) return DK_OK;
  int64_t src[DKS_MAX_DIMS], dst[DKS_MAX_DIMS];
  movement_byte_strides(out, dst);
  dks_broadcast_strides(in, out->ndim, src);
  movement_copy(out->ndim, out->shape, out->data, dst, in->data, src, in->itemsize);
  return DK_OK;
}

/* Output dim d of extent repeats[d] * in[d] is viewed as two dims
 * (repeats[d], in[d]); the repeat dim reads the input with stride 0. The
 * repeats follow from the shapes. */
static DK_Status tile(const dks_kernel_args *k) {
  const dks_tensor *in = &k->in[0], *out = &k->out[0];
  if (out->size == 0) return DK_OK;
  int64_t shape[MOVEMENT_MAX_DIMS], src[MOVEMENT_MAX_DIMS], dst[MOVEMENT_MAX_DIMS];
  for (int32_t d = 0; d < in->ndim; d++) {
    int64_t out_step = out->strides[d] * out->itemsize;
    shape[2 * d] = out->shape[d] / in->shape[d];
    shape[2 * d + 1] = in->shape[d];
    dst[2 * d] = in->shape[d] * out_step;
    dst[2 * d + 1] = out_step;
    src[2 * d] = 0;
    src[2 * d + 1] = in->strides[d] * in->itemsize;
  }
  movement_copy(2 * in->ndim, shape, out->data, dst, in->data, src, in->itemsize);
  return DK_OK;
}

static const dks_kernel_def k_movement[] = {
    DKS_ALL_DTYPES("Transpose", transpose, DKS_STRIDED),
    DKS_ALL_DTYPES("Concat", concat, DKS_STRIDED),
    DKS_ALL_DTYPES("Split", split, DKS_STRIDED),
    DKS_ALL_DTYPES("Slice", slice, DKS_STRIDED),
    DKS_ALL_DTYPES("Expand", expand, DKS_STRIDED),
    DKS_ALL_DTYPES("Tile", tile, DKS_STRIDED),
};
DKS_REGISTER_KERNELS(k_movement)

/* ---- Validators ------------------------------------------------------------------- */

static DK_Status same_dtype_everywhere(const dks_kernel_args *k) {
  DK_Status st = DK_OK;
  for (size_t i = 1; st == DK_OK && i < k->num_inputs; i++) st = dks_check_dtype(k, "input", i, k->in[0].dtype);
  for (size_t j = 0; st == DK_OK && j < k->num_outputs; j++) st = dks_check_dtype(k, "output", j, k->in[0].dtype);
  return st;
}

static DK_Status validate_transpose(const dks_kernel_args *k) {
  const dks_tensor *in = &k->in[0];
  int32_t axes[DKS_MAX_DIMS];
  int64_t count, shape[DKS_MAX_DIMS];
  DK_Status st = same_dtype_everywhere(k);
  if (st == DK_OK) st = dks_check_axes(k, "perm", in->ndim, axes, &count);
  if (st != DK_OK) return st;
  if (count >= 0 && count != in->ndim)
    return dks_invalid(k, "attribute 'perm' has %lld axes; the input has rank %d", (long long)count, in->ndim);
  for (int32_t d = 0; d < in->ndim; d++) shape[d] = in->shape[count >= 0 ? axes[d] : in->ndim - 1 - d];
  return dks_check_output(k, 0, in->ndim, shape);
}

/* Concat's inputs and Split's outputs (`parts`) against the whole, along `axis`. */
static DK_Status check_parts(const dks_kernel_args *k, const dks_tensor *whole, const dks_tensor *parts,
                             size_t count, const char *role) {
  int64_t axis;
  DK_Status st = same_dtype_everywhere(k);
  if (st == DK_OK) st = dks_check_axis(k, "axis", whole->ndim, false, &axis);
  if (st != DK_OK) return st;
  int64_t total = 0;
  for (size_t i = 0; i < count; i++) {
    const dks_tensor *t = &parts[i];
    bool fits = t->ndim == whole->ndim;
    for (int32_t d = 0; fits && d < t->ndim; d++) fits = d == axis || t->shape[d] == whole->shape[d];
    if (!fits)
      return dks_invalid(k, "%s %zu (rank %d) does not match the other tensors outside axis %lld", role, i,
                         t->ndim, (long long)axis);
    total += t->shape[axis];
  }
  if (total != whole->shape[axis])
    return dks_invalid(k, "the %ss' extents along axis %lld add up to %lld, not %lld", role, (long long)axis,
                       (long long)total, (long long)whole->shape[axis]);
  return DK_OK;
}

static DK_Status validate_concat(const dks_kernel_args *k) {
  for (size_t i = 0; i < k->num_inputs; i++)
    if (k->in[i].ndim < 0) return dks_invalid(k, "input %zu is omitted", i);
  return check_parts(k, &k->out[0], k->in, k->num_inputs, "input");
}

/* The outputs are the parts; `split` (their sizes) or `num_outputs`, when given, must describe them. */
static DK_Status validate_split(const dks_kernel_args *k) {
  DK_Status st = check_parts(k, &k->in[0], k->out, k->num_outputs, "output");
  if (st != DK_OK) return st;
  int64_t axis = normalized_axis(dks_attr_int(k, "axis", 0), k->in[0].ndim), count;
  const int64_t *sizes = dks_attr_ints(k, "split", &count);
  if (dks_attr(k, "split")) {
    if (count != (int64_t)k->num_outputs)
      return dks_invalid(k, "attribute 'split' has %lld sizes for %zu outputs", (long long)count, k->num_outputs);
    for (int64_t i = 0; i < count; i++)
      if (sizes[i] != k->out[i].shape[axis])
        return dks_invalid(k, "attribute 'split' value %lld is %lld; output %lld has %lld along axis %lld",
                           (long long)i, (long long)sizes[i], (long long)i, (long long)k->out[i].shape[axis],
                           (long long)axis);
  }
  if (dks_attr(k, "num_outputs") && dks_attr_int(k, "num_outputs", 0) != (int64_t)k->num_outputs)
    return dks_invalid(k, "attribute 'num_outputs' is %lld; the call has %zu outputs",
                       (long long)dks_attr_int(k, "num_outputs", 0), k->num_outputs);
  return DK_OK;
}

static DK_Status validate_slice(const dks_kernel_args *k) {
  const dks_tensor *in = &k->in[0];
  int64_t n, n_ends, n_axes, n_steps;
  const int64_t *starts = dks_attr_ints(k, "starts", &n);
  const int64_t *ends = dks_attr_ints(k, "ends", &n_ends);
  const int64_t *steps = dks_attr_ints(k, "steps", &n_steps);
  int32_t axes[DKS_MAX_DIMS];
  DK_Status st = same_dtype_everywhere(k);
  if (st == DK_OK) st = dks_check_axes(k, "axes", in->ndim, axes, &n_axes);
  if (st == DK_OK) st = dks_check_int_list(k, "starts");
  if (st == DK_OK) st = dks_check_int_list(k, "ends");
  if (st == DK_OK) st = dks_check_int_list(k, "steps");
  if (st != DK_OK) return st;
  if (n > in->ndim || n_ends != n || (n_axes >= 0 && n_axes != n) || (dks_attr(k, "steps") && n_steps != n))
    return dks_invalid(k, "starts, ends, axes and steps have lengths %lld, %lld, %lld, %lld; they must agree "
                       "and be at most the rank %d", (long long)n, (long long)n_ends, (long long)n_axes,
                       (long long)(dks_attr(k, "steps") ? n_steps : n), in->ndim);
  int64_t shape[DKS_MAX_DIMS];
  for (int32_t d = 0; d < in->ndim; d++) shape[d] = in->shape[d];
  for (int64_t i = 0; i < n; i++) {
    int32_t axis = n_axes >= 0 ? axes[i] : (int32_t)i;
    int64_t step = steps ? steps[i] : 1, dim = in->shape[axis], start = starts[i], end = ends[i];
    if (step == 0) return dks_invalid(k, "attribute 'steps' value %lld is 0", (long long)i);
    if (start < 0) start += dim;
    if (end < 0) end += dim;
    /* Clamped to [-1, dim], so the differences below cannot overflow. */
    start = start < -1 ? -1 : start > dim ? dim : start;
    end = end < -1 ? -1 : end > dim ? dim : end;
    if (step > 0) {
      start = start < 0 ? 0 : start;
      end = end < 0 ? 0 : end;
      shape[axis] = end > start ? (end - start - 1) / step + 1 : 0;
    } else {
      start = start > dim - 1 ? dim - 1 : start;
      end = end > dim - 1 ? dim - 1 : end;
      shape[axis] = start > end ? (start - end - 1) / (step == INT64_MIN ? INT64_MAX : -step) + 1 : 0;
    }
  }
  return dks_check_output(k, 0, in->ndim, shape);
}

static DK_Status validate_expand(const dks_kernel_args *k) {
  DK_Status st = same_dtype_everywhere(k);
  if (st != DK_OK) return st;
  if ((st = dks_check_int_list(k, "shape")) != DK_OK) return st;
  const dks_tensor *in = &k->in[0];
  int64_t count;
  const int64_t *given = dks_attr_ints(k, "shape", &count);
  if (count > DKS_MAX_DIMS) return dks_invalid(k, "attribute 'shape' has %lld values, over %d", (long long)count, DKS_MAX_DIMS);
  int32_t ndim = in->ndim > count ? in->ndim : (int32_t)count;
  int64_t shape[DKS_MAX_DIMS];
  for (int32_t d = 0; d < ndim; d++) { /* numpy broadcasting of the input's shape with `shape` */
    int32_t di = d - (ndim - in->ndim), ds = d - (ndim - (int32_t)count);
    int64_t n = di < 0 ? 1 : in->shape[di], m = ds < 0 ? 1 : given[ds];
    if (m < 0) return dks_invalid(k, "attribute 'shape' value %d is %lld, negative", ds, (long long)m);
    if (n != m && n != 1 && m != 1)
      return dks_invalid(k, "the input's dimension %d (%lld) does not broadcast with %lld", di, (long long)n,
                         (long long)m);
    shape[d] = n == 1 ? m : n;
  }
  return dks_check_output(k, 0, ndim, shape);
}

static DK_Status validate_tile(const dks_kernel_args *k) {
  DK_Status st = same_dtype_everywhere(k);
  if (st != DK_OK) return st;
  const dks_tensor *in = &k->in[0], *out = &k->out[0];
  if (in->ndim != out->ndim)
    return dks_invalid(k, "the output has rank %d; the input has %d", out->ndim, in->ndim);
  int64_t count, tiled;
  const int64_t *repeats = dks_attr_ints(k, "repeats", &count);
  if (dks_attr(k, "repeats") && count != in->ndim)
    return dks_invalid(k, "attribute 'repeats' has %lld values; the input has rank %d", (long long)count, in->ndim);
  for (int32_t d = 0; d < in->ndim; d++) {
    if (in->shape[d] ? out->shape[d] % in->shape[d] : out->shape[d])
      return dks_invalid(k, "output dimension %d (%lld) is not a multiple of the input's (%lld)", d,
                         (long long)out->shape[d], (long long)in->shape[d]);
    if (repeats && (repeats[d] < 0 || __builtin_mul_overflow(in->shape[d], repeats[d], &tiled) ||
                    tiled != out->shape[d]))
      return dks_invalid(k, "attribute 'repeats' value %d is %lld; it does not tile input dimension %lld to "
                         "the output's %lld", d, (long long)repeats[d], (long long)in->shape[d],
                         (long long)out->shape[d]);
  }
  return DK_OK;
}

static const dks_validator v_movement[] = {
    {"Transpose", validate_transpose}, {"Concat", validate_concat}, {"Split", validate_split},
    {"Slice", validate_slice},         {"Expand", validate_expand}, {"Tile", validate_tile},
};
DKS_REGISTER_VALIDATORS(v_movement)
