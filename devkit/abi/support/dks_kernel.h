/*
 * dks_kernel.h -- the devkit plugin-support library, kernel half: how a
 * plugin's operator kernels are written.
 *
 * A kernel is a compute function over resolved tensors:
 *
 *   static DK_Status relu_f32(const dks_kernel_args *k) { ... }
 *
 * registered with its ONNX op name and the dtype of the op's key input:
 *
 *   static const dks_kernel_def k_defs[] = {
 *       {"Relu", DK_DTYPE_FLOAT32, relu_f32, DKS_STRIDED},
 *   };
 *   DKS_REGISTER_KERNELS(k_defs)
 *
 * The library's launcher is the DK_KernelFn of every entry. On the caller's
 * thread it validates the call (device, stream, tensor devices, rank, and
 * that every tensor's elements lie inside its allocation), then copies the
 * call -- tensors, shapes, strides, attributes -- into a stream work item.
 * The compute function runs later, in stream order, on the stream's worker
 * thread, with every tensor resolved to the address the device hooks give
 * (dks.h: the address hook).
 *
 * The launcher also validates the call against the op's schema (op_schema.c,
 * generated from the op specs: tensor counts, the key input's dtype, and
 * every attribute's presence, type and allowed values) and runs the op's
 * validators (DKS_REGISTER_VALIDATORS): what a compute function reads --
 * ranks, shapes, axes, kernel sizes -- is checked there, once per call, and
 * a bad call returns DK_INVALID_ARGUMENT before anything is queued. The
 * devkit host sends valid calls, but any host may call the table, so a
 * compute function trusts only what a validator checked. It still reports
 * what only it can see (an index out of range in Gather data, say) with
 * dks_kernel_fail, which becomes the stream's sticky error.
 *
 * Strides: without DKS_STRIDED the host passes compact row-major tensors
 * only (it copies non-contiguous inputs first), and the compute function may
 * index by flat position. With it, the function must honour `strides` --
 * including 0 strides and negative ones.
 *
 * Threads: a compute function runs on one thread at a time per call, and
 * calls on different streams run at once: it keeps no unlocked global state.
 * It may split its work with dks_parallel_for.
 */
#ifndef DEVKIT_ABI_SUPPORT_DKS_KERNEL_H_
#define DEVKIT_ABI_SUPPORT_DKS_KERNEL_H_

#include <math.h>
#include <stdbool.h>
#include <stdint.h>
#include <string.h>

#include "dks.h"

#pragma GCC visibility push(hidden) /* as in dks.h */

/* ONNX sets no rank limit; this is the library's, checked at launch. */
#define DKS_MAX_DIMS 16
/* Flag for dks_kernel_def.flags: the kernel honours input and output strides. */
#define DKS_STRIDED (DK_KERNEL_STRIDED_INPUTS | DK_KERNEL_STRIDED_OUTPUTS)

typedef struct dks_tensor {
  uint8_t *data;    /* address of element (0, ..., 0); NULL when size == 0 */
  int32_t ndim;     /* -1: an omitted optional input */
  DK_DTypeKey dtype;
  int32_t itemsize; /* bytes */
  int64_t size;     /* element count */
  int64_t shape[DKS_MAX_DIMS];
  int64_t strides[DKS_MAX_DIMS]; /* elements; compact row-major unless DKS_STRIDED */
  /* A prepared input (DK_KernelCall.prepared_inputs; see dks_prepare_fn):
   * the bytes from `data` to the end of its allocation, where the kernel's
   * prepare wrote its prepared form; shape, dtype and strides describe the
   * original tensor. 0 for every other tensor. */
  size_t prepared_bytes;
} dks_tensor;

/* Validates tensor `t` of a call made by `op` (role "input"/"output"/...,
 * position i; an input may be omitted, ndim -1) and resolves it into *r;
 * `strided`: non-compact strides are accepted. */
DK_Status dks_resolve_tensor(const char *op, dks_device *d, int32_t dev, bool strided,
                             const char *role, size_t i, const DK_Tensor *t, dks_tensor *r);

typedef struct dks_kernel_args {
  const char *op;    /* the entry's op name, for messages */
  DK_DTypeKey dtype; /* the entry's key dtype (ConstantOfShape's and Range's output dtype) */
  int32_t device;
  size_t num_inputs, num_outputs, num_attributes;
  const dks_tensor *in;
  const dks_tensor *out;
  const DK_Attribute *attributes; /* deep copies, valid during the compute */
} dks_kernel_args;

typedef DK_Status (*dks_compute_fn)(const dks_kernel_args *k);

typedef struct dks_kernel_def {
  const char *op;    /* ONNX op name */
  DK_DTypeKey dtype; /* dtype of the op's key input (see devkit/ops) */
  dks_compute_fn compute;
  uint64_t flags;    /* DK_KernelFlags */
} dks_kernel_def;

/* Definitions of op OP for every dtype of the op set (bool, the four integer
 * and the four float types), all served by compute function FN. */
#define DKS_ALL_DTYPES(OP, FN, FLAGS)                                     \
  {OP, DK_DTYPE_BOOL, FN, FLAGS}, {OP, DK_DTYPE_INT8, FN, FLAGS},         \
      {OP, DK_DTYPE_UINT8, FN, FLAGS}, {OP, DK_DTYPE_INT32, FN, FLAGS},   \
      {OP, DK_DTYPE_INT64, FN, FLAGS}, {OP, DK_DTYPE_FLOAT16, FN, FLAGS}, \
      {OP, DK_DTYPE_BFLOAT16, FN, FLAGS}, {OP, DK_DTYPE_FLOAT32, FN, FLAGS}, \
      {OP, DK_DTYPE_FLOAT64, FN, FLAGS}

/* Adds `count` definitions (static storage) to the plugin's kernel table.
 * Called before DK_PluginInit, from DKS_REGISTER_KERNELS constructors, so a
 * kernel file needs no central list: linking it in registers it. */
void dks_register_kernels(const dks_kernel_def *defs, size_t count);
#define DKS_REGISTER_KERNELS(defs)                                        \
  __attribute__((constructor)) static void dks_register_##defs(void) {   \
    dks_register_kernels(defs, sizeof(defs) / sizeof((defs)[0]));         \
  }

/* A kernel file's one-time setup (a library's threads, say), run by the
 * first DK_PluginInit before the table is published. A failure fails the
 * plugin's load with the message set through dks_set_error. */
typedef DK_Status (*dks_init_fn)(void);
void dks_register_init(dks_init_fn fn);
#define DKS_REGISTER_INIT(fn)                                            \
  __attribute__((constructor)) static void dks_register_init_##fn(void) { \
    dks_register_init(fn);                                               \
  }

/* From a compute function: reports a failure as "<op>: <message>" and
 * returns `status` (the stream's sticky error; see dks.h). */
DK_Status dks_kernel_fail(const dks_kernel_args *k, DK_Status status,
                          const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

/* ---- Validation (at launch, on the caller's thread) ------------------------ */

/* type of a dks_attr_rule for a host input's values: DK_ATTR_INTS or DK_ATTR_FLOATS. */
#define DKS_ATTR_NUMBERS (-1)
/* type of a dks_attr_rule that is an attribute or a host input: any of the four number types. */
#define DKS_ATTR_NUMBER_OR_NUMBERS (-2)

/* One attribute of an op schema. */
typedef struct dks_attr_rule {
  const char *name;
  int32_t type;                /* DK_AttributeType, DKS_ATTR_NUMBERS or DKS_ATTR_NUMBER_OR_NUMBERS */
  bool required;               /* the host always sends it (it has a default, or is required) */
  const char *const *strings;  /* a string attribute's allowed values, NULL-terminated; NULL: any */
  const int64_t *ints;         /* an int attribute's allowed values; NULL: any */
  int32_t num_ints;
} dks_attr_rule;

/* What every call of an op must look like (kernels/op_schema.c). */
typedef struct dks_op_schema {
  const char *op;
  int32_t min_inputs, max_inputs;   /* tensor inputs (host inputs arrive as attributes); max -1: any */
  int32_t min_outputs, max_outputs; /* max -1: any */
  int32_t key_input;                /* the input whose dtype keys the kernel; -1: a dtype attribute */
  const dks_attr_rule *attrs;
  int32_t num_attrs;
} dks_op_schema;

void dks_register_schemas(const dks_op_schema *schemas, size_t count);
#define DKS_REGISTER_SCHEMAS(schemas)                                      \
  __attribute__((constructor)) static void dks_register_##schemas(void) {  \
    dks_register_schemas(schemas, sizeof(schemas) / sizeof((schemas)[0])); \
  }

/* An op's validator: checks what the op's compute functions read beyond the
 * schema and returns DK_OK or, through dks_invalid, DK_INVALID_ARGUMENT. */
typedef DK_Status (*dks_validate_fn)(const dks_kernel_args *k);
typedef struct dks_validator {
  const char *op;
  dks_validate_fn validate;
} dks_validator;

void dks_register_validators(const dks_validator *validators, size_t count);
#define DKS_REGISTER_VALIDATORS(validators)                                         \
  __attribute__((constructor)) static void dks_register_##validators(void) {        \
    dks_register_validators(validators, sizeof(validators) / sizeof((validators)[0])); \
  }

/* ---- Prepared weights (devkit.h, DK_PrepareFn) ------------------------------ */

/* An op's prepare, for its entries of every dtype: with dst NULL, sets
 * *size to the bytes of the prepared form of input `input` of the call in
 * `k` (0: not prepared -- another input, a dtype or shape it does not
 * prepare), reading nothing but the call's geometry and attributes; with
 * dst, writes that form (*size bytes) there from the input's values, in
 * stream order like a compute. The library has validated the call as it
 * validates a launch (schema, validators, every tensor's memory) and
 * checked dst's range. A compute then finds the form at k->in[input].data,
 * with prepared_bytes set, and checks it before it reads it: a raw call may
 * mark any memory as prepared. */
typedef DK_Status (*dks_prepare_fn)(const dks_kernel_args *k, size_t input, uint8_t *dst,
                                    size_t *size);
typedef struct dks_preparer {
  const char *op;
  dks_prepare_fn prepare;
} dks_preparer;

void dks_register_preparers(const dks_preparer *preparers, size_t count);
#define DKS_REGISTER_PREPARERS(preparers)                                        \
  __attribute__((constructor)) static void dks_register_##preparers(void) {      \
    dks_register_preparers(preparers, sizeof(preparers) / sizeof((preparers)[0])); \
  }

/* From a validator: sets "<op>: <message>" and returns DK_INVALID_ARGUMENT. */
DK_Status dks_invalid(const dks_kernel_args *k, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));

/* Shared checks; each returns DK_OK or dks_invalid's status, naming the op,
 * the tensor or attribute and the value. */
/* Input i is present with a rank in [min_rank, max_rank]. */
DK_Status dks_check_rank(const dks_kernel_args *k, size_t i, int32_t min_rank, int32_t max_rank);
/* Int attribute `name` (which the schema made present) as an axis of a
 * rank-`rank` tensor, in [-rank, rank) (or [-rank - 1, rank] with
 * `insert`); *axis gets it normalised. */
DK_Status dks_check_axis(const dks_kernel_args *k, const char *name, int32_t rank, bool insert,
                         int64_t *axis);
/* Ints attribute `name`, when present, has `count` elements (count < 0: any)
 * each >= min. */
DK_Status dks_check_ints(const dks_kernel_args *k, const char *name, int64_t count, int64_t min);
/* Attribute `name`, when present, is a list of integers: ints, or an empty
 * list of either type (the values of an empty host input, which NumPy makes
 * float64). */
DK_Status dks_check_int_list(const dks_kernel_args *k, const char *name);
/* Ints attribute `name` as a list of distinct axes of a rank-`rank` tensor:
 * axes[0..*count) get them normalised; absent: *count = -1. */
DK_Status dks_check_axes(const dks_kernel_args *k, const char *name, int32_t rank, int32_t *axes,
                         int64_t *count);
/* Float attribute `name`, when present, is finite and at least `min`
 * (-INFINITY: any finite value). */
DK_Status dks_check_float(const dks_kernel_args *k, const char *name, double min);
/* Output j has rank ndim and the given shape. */
DK_Status dks_check_output(const dks_kernel_args *k, size_t j, int32_t ndim, const int64_t *shape);
/* Output j has input i's shape. */
DK_Status dks_check_output_like(const dks_kernel_args *k, size_t j, size_t i);
/* Inputs 0..nin-1 broadcast together to output 0's shape. */
DK_Status dks_check_broadcast(const dks_kernel_args *k, size_t nin);
/* Validators many ops share: every present input and output 0 have input
 * 0's dtype, and output 0 (and input 1 with `_pair`: dY and X, say) input
 * 0's shape; `_axis`: also the int attribute "axis" lies inside its rank. */
DK_Status dks_validate_like_input(const dks_kernel_args *k);
DK_Status dks_validate_pair_like_input(const dks_kernel_args *k);
DK_Status dks_validate_axis_like_input(const dks_kernel_args *k);
DK_Status dks_validate_axis_pair_like_input(const dks_kernel_args *k);
/* Tensor t (an input, role "input", or output) has dtype `dtype`. */
DK_Status dks_check_dtype(const dks_kernel_args *k, const char *role, size_t i, DK_DTypeKey dtype);
/* Tensor t (as for dks_check_dtype) has one of the four float dtypes. */
DK_Status dks_check_float_dtype(const dks_kernel_args *k, const char *role, size_t i);

/* ---- Attributes (present, after host-side defaults) ----------------------- */

const DK_Attribute *dks_attr(const dks_kernel_args *k, const char *name);
int64_t dks_attr_int(const dks_kernel_args *k, const char *name, int64_t fallback);
double dks_attr_float(const dks_kernel_args *k, const char *name, double fallback);
/* Element pointer and *count; NULL and *count = 0 when absent. */
const int64_t *dks_attr_ints(const dks_kernel_args *k, const char *name, int64_t *count);
const double *dks_attr_floats(const dks_kernel_args *k, const char *name, int64_t *count);
const char *dks_attr_string(const dks_kernel_args *k, const char *name, const char *fallback);
DK_DTypeKey dks_attr_dtype(const dks_kernel_args *k, const char *name, DK_DTypeKey fallback);

/* ---- Element loops ------------------------------------------------------- */

/* On a function with a vectorisable loop: compiled for AVX-512, AVX2 and
 * baseline x86-64, the best the CPU has picked when the plugin loads, so the
 * library runs on any x86-64 without -march=native. Elsewhere (aarch64: NEON
 * is baseline) a plain function. The clones compute the same bits: C's
 * rounding rules hold in each and no product is fused into an FMA (ISO C
 * mode: -ffp-contract=off). */
#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)
#define DKS_VECTOR_CLONES __attribute__((target_clones("avx512f", "avx2", "default")))
#else
#define DKS_VECTOR_CLONES
#endif

/* An inner loop over n elements of nops operands: operand i starts at ptrs[i]
 * and advances by steps[i] bytes (0 for a broadcast operand). */
typedef void (*dks_inner_loop)(int64_t n, uint8_t *const *ptrs,
                               const int64_t *steps, void *ctx);

/* Runs `loop` over every index of `shape` (ndim dims), in row-major order on
 * the calling thread (so loops may accumulate, into ctx or a broadcast
 * operand). byte_strides[i] holds operand i's ndim byte strides. Dimensions
 * that are contiguous for every operand are merged, so compact operands get
 * one long inner loop.
 * nops <= DKS_MAX_OPERANDS. */
#define DKS_MAX_OPERANDS 8
void dks_nd_loop(int nops, int32_t ndim, const int64_t *shape,
                 const int64_t byte_strides[][DKS_MAX_DIMS], uint8_t *const *base,
                 dks_inner_loop loop, void *ctx);

/* Byte strides of `t` read as an operand of an out_ndim-dim result under
 * NumPy/ONNX multidirectional broadcasting: `t`'s dims align to the right; a
 * missing or size-1 dim gets stride 0. */
void dks_broadcast_strides(const dks_tensor *t, int32_t out_ndim, int64_t *byte_strides);

/* Elementwise driver: out[0] = f(in[0], ..., in[nin-1]) with broadcasting.
 * The loop sees the output as operand 0 and the inputs as operands 1..nin.
 * Outputs of DKS_ELEMENTWISE_GRAIN * 2 elements or more are split over the
 * thread pool, so the loop may run on several threads at once: it must only
 * read ctx. Each element's value does not depend on the split. */
#define DKS_ELEMENTWISE_GRAIN 16384
void dks_elementwise(const dks_kernel_args *k, int nin, dks_inner_loop loop, void *ctx);
/* dks_elementwise split from 2 * grain elements: a smaller grain for loops
 * whose elements cost many times a copy's (transcendental functions). */
void dks_elementwise_grain(const dks_kernel_args *k, int nin, dks_inner_loop loop, void *ctx, int64_t grain);

/* ---- Reduced-precision storage types -------------------------------------- */

/* IEEE binary16 and bfloat16 <-> float32, round to nearest even; NaN stays
 * NaN (quiet), infinities and signed zeros are kept. */
static inline float dks_f16_to_f32(uint16_t h) {
  uint32_t sign = (uint32_t)(h & 0x8000) << 16, exp = (h >> 10) & 0x1f, man = h & 0x3ff, bits;
  if (exp == 0x1f) {
    bits = sign | 0x7f800000u | (man << 13) | (man ? 0x400000u : 0);
  } else if (exp) {
    bits = sign | ((exp + 112) << 23) | (man << 13);
  } else if (man) { /* subnormal: normalise */
    int shift = 0;
    while (!(man & 0x400)) { man <<= 1; shift++; }
    bits = sign | ((uint32_t)(113 - shift) << 23) | ((man & 0x3ff) << 13);
  } else {
    bits = sign;
  }
  float f;
  memcpy(&f, &bits, sizeof f);
  return f;
}

static inline uint16_t dks_f32_to_f16(float f) {
  uint32_t x;
  memcpy(&x, &f, sizeof x);
  uint16_t sign = (uint16_t)((x >> 16) & 0x8000);
  uint32_t abs = x & 0x7fffffffu;
  if (abs > 0x7f800000u) return sign | 0x7e00 | (uint16_t)((abs >> 13) & 0x3ff);
  if (abs >= 0x477ff000u) return sign | 0x7c00; /* rounds to >= 65520: inf */
  if (abs < 0x38800000u) {                      /* result is subnormal or 0 */
    if (abs < 0x33000000u) return sign;         /* below half the smallest subnormal */
    uint32_t man = (abs & 0x7fffff) | 0x800000;
    int shift = 126 - (int)(abs >> 23);          /* 14..24 */
    uint32_t half = 1u << (shift - 1), rest = man & ((1u << shift) - 1);
    uint32_t r = man >> shift;
    if (rest > half || (rest == half && (r & 1))) r++;
    return sign | (uint16_t)r;
  }
  uint32_t r = abs - 0x38000000u; /* rebias exponent 127 -> 15 */
  uint32_t rest = r & 0x1fff;
  r >>= 13;
  if (rest > 0x1000 || (rest == 0x1000 && (r & 1))) r++;
  return sign | (uint16_t)r;
}

static inline float dks_bf16_to_f32(uint16_t h) {
  uint32_t bits = (uint32_t)h << 16;
  float f;
  memcpy(&f, &bits, sizeof f);
  return f;
}

static inline uint16_t dks_f32_to_bf16(float f) {
  uint32_t x;
  memcpy(&x, &f, sizeof x);
  if ((x & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((x >> 16) | 0x40);
  x += 0x7fff + ((x >> 16) & 1);
  return (uint16_t)(x >> 16);
}

/* double and int64 -> float16/bfloat16, rounded once to nearest even.
 * Rounding to float32 first and then to float16/bfloat16 would round twice
 * and can land one ulp off; rounding the first step to odd -- truncate, and
 * set the last bit when anything was cut off -- keeps what the second
 * rounding needs, as the final format has at least two fewer significand
 * bits (float16: 11, bfloat16: 8, float32: 24). */
static inline float dks_f64_to_f32_odd(double d) {
  float f = (float)d;
  if (isfinite(d) && (double)f != d) {
    if (fabs((double)f) > fabs(d)) f = nextafterf(f, 0.0f); /* truncate; inf -> FLT_MAX */
    uint32_t bits;
    memcpy(&bits, &f, sizeof bits);
    bits |= 1u;
    memcpy(&f, &bits, sizeof f);
  }
  return f;
}

static inline float dks_i64_to_f32_odd(int64_t v) {
  uint64_t magnitude = v < 0 ? 0 - (uint64_t)v : (uint64_t)v;
  if (magnitude >> 24) { /* keep the top 24 significant bits, the last or-ed with the rest */
    int shift = 40 - __builtin_clzll(magnitude);
    uint64_t kept = magnitude >> shift;
    if (magnitude & ((UINT64_C(1) << shift) - 1)) kept |= 1;
    magnitude = kept << shift;
  }
  float f = (float)magnitude;
  return v < 0 ? -f : f;
}

static inline uint16_t dks_f64_to_f16(double d) { return dks_f32_to_f16(dks_f64_to_f32_odd(d)); }
static inline uint16_t dks_f64_to_bf16(double d) { return dks_f32_to_bf16(dks_f64_to_f32_odd(d)); }
static inline uint16_t dks_i64_to_f16(int64_t v) { return dks_f32_to_f16(dks_i64_to_f32_odd(v)); }
static inline uint16_t dks_i64_to_bf16(int64_t v) { return dks_f32_to_bf16(dks_i64_to_f32_odd(v)); }

/* Float -> integer is undefined in C outside the target's range: truncate
 * toward zero and saturate, NaN -> 0 (ONNX leaves it undefined too). */
#define DKS_SATURATE(T, lo, hi, v) \
  ((v) != (v) ? (T)0 : (v) <= (double)(lo) ? (T)(lo) : (v) >= (double)(hi) ? (T)(hi) : (T)(v))

/* Any supported scalar <-> double, for kernels that are generic over dtype
 * (data movement, Cast, reference-speed paths). Stores round floats once and
 * saturate integers (DKS_SATURATE); int64 stores into integers wrap. */
double dks_load_as_double(const uint8_t *p, DK_DTypeKey dtype);
void dks_store_from_double(uint8_t *p, DK_DTypeKey dtype, double value);
/* int64 round trip without passing through double (exact for all int64). */
int64_t dks_load_as_int64(const uint8_t *p, DK_DTypeKey dtype);
void dks_store_from_int64(uint8_t *p, DK_DTypeKey dtype, int64_t value);

/* Compact row-major strides (elements) of a shape. */
void dks_compact_strides(int32_t ndim, const int64_t *shape, int64_t *strides);

#pragma GCC visibility pop

#endif /* DEVKIT_ABI_SUPPORT_DKS_KERNEL_H_ */
