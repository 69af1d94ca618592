/*
 * kernel.h -- how the acme plugin's operator kernels are written.
 *
 * A kernel is a compute function over resolved tensors:
 *
 *   static DK_Status relu_f32(const acme_kernel_args *k) { ... }
 *
 * registered with its ONNX op name and the dtype of the op's key input:
 *
 *   static const acme_kernel_def k_defs[] = {
 *       {"Relu", DK_DTYPE_FLOAT32, relu_f32, ACME_STRIDED},
 *   };
 *   ACME_REGISTER_KERNELS(k_defs)
 *
 * The shared launcher (kernel.c) is the DK_KernelFn of every entry. On the
 * caller's thread it validates the call (device, stream, tensor devices,
 * rank, and that every tensor's elements lie inside its allocation), then
 * copies the call -- tensors, shapes, strides, attributes -- into a stream
 * work item. The compute function runs later, in stream order, on the
 * stream's worker thread, with every tensor resolved to a host address.
 *
 * The launcher also validates the call against the op's schema (kernels/
 * op_schema.c, generated from the op specs: tensor counts, the key input's
 * dtype, and every attribute's presence, type and allowed values) and runs
 * the op's validators (ACME_REGISTER_VALIDATORS): what a compute function
 * reads -- ranks, shapes, axes, kernel sizes -- is checked there, once per
 * call, and a bad call returns DK_INVALID_ARGUMENT before anything is
 * queued. The devkit host sends valid calls, but any host may call the
 * table, so a compute function trusts only what a validator checked. It
 * still reports what only it can see (an index out of range in Gather data,
 * say) with acme_kernel_fail, which becomes the stream's sticky error.
 *
 * Strides: without ACME_STRIDED the host passes compact row-major tensors
 * only (it copies non-contiguous inputs first), and the compute function may
 * index by flat position. With it, the function must honour `strides` --
 * including 0 strides and negative ones.
 */
#ifndef ACME_KERNEL_H_
#define ACME_KERNEL_H_

#include <math.h>
#include <stdbool.h>
#include <stdint.h>
#include <string.h>

#include "acme_internal.h"

/* ONNX sets no rank limit; this is the acme plugin's, checked at launch. */
#define ACME_MAX_DIMS 16
/* Flag for acme_kernel_def.flags: the kernel honours input and output strides. */
#define ACME_STRIDED (DK_KERNEL_STRIDED_INPUTS | DK_KERNEL_STRIDED_OUTPUTS)

typedef struct acme_tensor {
  uint8_t *data;    /* address of element (0, ..., 0); NULL when size == 0 */
  int32_t ndim;     /* -1: an omitted optional input */
  DK_DTypeKey dtype;
  int32_t itemsize; /* bytes */
  int64_t size;     /* element count */
  int64_t shape[ACME_MAX_DIMS];
  int64_t strides[ACME_MAX_DIMS]; /* elements; compact row-major unless ACME_STRIDED */
} acme_tensor;

typedef struct acme_kernel_args {
  const char *op; /* the entry's op name, for messages */
  int32_t device;
  size_t num_inputs, num_outputs, num_attributes;
  const acme_tensor *in;
  const acme_tensor *out;
  const DK_Attribute *attributes; /* deep copies, valid during the compute */
} acme_kernel_args;

typedef DK_Status (*acme_compute_fn)(const acme_kernel_args *k);

typedef struct acme_kernel_def {
  const char *op;    /* ONNX op name */
  DK_DTypeKey dtype; /* dtype of the op's key input (see devkit/ops) */
  acme_compute_fn compute;
  uint64_t flags;    /* DK_KernelFlags */
} acme_kernel_def;

/* Adds `count` definitions (static storage) to the plugin's kernel table.
 * Called before DK_PluginInit, from ACME_REGISTER_KERNELS constructors, so a
 * kernel file needs no central list: linking it in registers it. */
void acme_register_kernels(const acme_kernel_def *defs, size_t count);
#define ACME_REGISTER_KERNELS(defs)                                        \
  __attribute__((constructor)) static void acme_register_##defs(void) {   \
    acme_register_kernels(defs, sizeof(defs) / sizeof((defs)[0]));         \
  }

/* The published table (plugin.c): pointers valid while the plugin is loaded.
 * Duplicate (op, dtype) registrations are refused at init. */
DK_Status acme_kernel_table(const DK_KernelEntry *const **entries, size_t *count);

/* From a compute function: reports a failure as "<op>: <message>" and
 * returns `status` (the stream's sticky error; see acme_internal.h). */
DK_Status acme_kernel_fail(const acme_kernel_args *k, DK_Status status,
                          const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

/* ---- Validation (at launch, on the caller's thread) ------------------------ */

/* type of a acme_attr_rule for a host input's values: DK_ATTR_INTS or DK_ATTR_FLOATS. */
#define ACME_ATTR_NUMBERS (-1)
/* type of a acme_attr_rule that is an attribute or a host input: any of the four number types. */
#define ACME_ATTR_NUMBER_OR_NUMBERS (-2)

/* One attribute of an op schema. */
typedef struct acme_attr_rule {
  const char *name;
  int32_t type;                /* DK_AttributeType, ACME_ATTR_NUMBERS or ACME_ATTR_NUMBER_OR_NUMBERS */
  bool required;               /* the host always sends it (it has a default, or is required) */
  const char *const *strings;  /* a string attribute's allowed values, NULL-terminated; NULL: any */
  const int64_t *ints;         /* an int attribute's allowed values; NULL: any */
  int32_t num_ints;
} acme_attr_rule;

/* What every call of an op must look like (kernels/op_schema.c). */
typedef struct acme_op_schema {
  const char *op;
  int32_t min_inputs, max_inputs;   /* tensor inputs (host inputs arrive as attributes); max -1: any */
  int32_t min_outputs, max_outputs; /* max -1: any */
  int32_t key_input;                /* the input whose dtype keys the kernel; -1: a dtype attribute */
  const acme_attr_rule *attrs;
  int32_t num_attrs;
} acme_op_schema;

void acme_register_schemas(const acme_op_schema *schemas, size_t count);
#define ACME_REGISTER_SCHEMAS(schemas)                                      \
  __attribute__((constructor)) static void acme_register_##schemas(void) {  \
    acme_register_schemas(schemas, sizeof(schemas) / sizeof((schemas)[0])); \
  }

/* An op's validator: checks what the op's compute functions read beyond the
 * schema and returns DK_OK or, through acme_invalid, DK_INVALID_ARGUMENT. */
typedef DK_Status (*acme_validate_fn)(const acme_kernel_args *k);
typedef struct acme_validator {
  const char *op;
  acme_validate_fn validate;
} acme_validator;

void acme_register_validators(const acme_validator *validators, size_t count);
#define ACME_REGISTER_VALIDATORS(validators)                                         \
  __attribute__((constructor)) static void acme_register_##validators(void) {        \
    acme_register_validators(validators, sizeof(validators) / sizeof((validators)[0])); \
  }

/* From a validator: sets "<op>: <message>" and returns DK_INVALID_ARGUMENT. */
DK_Status acme_invalid(const acme_kernel_args *k, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));

/* Shared checks; each returns DK_OK or acme_invalid's status, naming the op,
 * the tensor or attribute and the value. */
/* Input i is present with a rank in [min_rank, max_rank]. */
DK_Status acme_check_rank(const acme_kernel_args *k, size_t i, int32_t min_rank, int32_t max_rank);
/* Int attribute `name` (which the schema made present) as an axis of a
 * rank-`rank` tensor, in [-rank, rank) (or [-rank - 1, rank] with
 * `insert`); *axis gets it normalised. */
DK_Status acme_check_axis(const acme_kernel_args *k, const char *name, int32_t rank, bool insert,
                         int64_t *axis);
/* Ints attribute `name`, when present, has `count` elements (count < 0: any)
 * each >= min. */
DK_Status acme_check_ints(const acme_kernel_args *k, const char *name, int64_t count, int64_t min);
/* Ints attribute `name` as a list of distinct axes of a rank-`rank` tensor:
 * axes[0..*count) get them normalised; absent: *count = -1. */
DK_Status acme_check_axes(const acme_kernel_args *k, const char *name, int32_t rank, int32_t *axes,
                         int64_t *count);
/* Output j has rank ndim and the given shape. */
DK_Status acme_check_output(const acme_kernel_args *k, size_t j, int32_t ndim, const int64_t *shape);
/* Output j has input i's shape. */
DK_Status acme_check_output_like(const acme_kernel_args *k, size_t j, size_t i);
/* Inputs 0..nin-1 broadcast together to output 0's shape. */
DK_Status acme_check_broadcast(const acme_kernel_args *k, size_t nin);
/* Tensor t (an input, role "input", or output) has dtype `dtype`. */
DK_Status acme_check_dtype(const acme_kernel_args *k, const char *role, size_t i, DK_DTypeKey dtype);

/* ---- Attributes (present, after host-side defaults) ----------------------- */

const DK_Attribute *acme_attr(const acme_kernel_args *k, const char *name);
int64_t acme_attr_int(const acme_kernel_args *k, const char *name, int64_t fallback);
double acme_attr_float(const acme_kernel_args *k, const char *name, double fallback);
/* Element pointer and *count; NULL and *count = 0 when absent. */
const int64_t *acme_attr_ints(const acme_kernel_args *k, const char *name, int64_t *count);
const double *acme_attr_floats(const acme_kernel_args *k, const char *name, int64_t *count);
const char *acme_attr_string(const acme_kernel_args *k, const char *name, const char *fallback);
DK_DTypeKey acme_attr_dtype(const acme_kernel_args *k, const char *name, DK_DTypeKey fallback);

/* ---- Element loops ------------------------------------------------------- */

/* An inner loop over n elements of nops operands: operand i starts at ptrs[i]
 * and advances by steps[i] bytes (0 for a broadcast operand). */
typedef void (*acme_inner_loop)(int64_t n, uint8_t *const *ptrs,
                               const int64_t *steps, void *ctx);

/* Runs `loop` over every index of `shape` (ndim dims). byte_strides[i] holds
 * operand i's ndim byte strides. Dimensions that are contiguous for every
 * operand are merged, so compact operands get one long inner loop.
 * nops <= ACME_MAX_OPERANDS. */
#define ACME_MAX_OPERANDS 8
void acme_nd_loop(int nops, int32_t ndim, const int64_t *shape,
                 const int64_t byte_strides[][ACME_MAX_DIMS], uint8_t *const *base,
                 acme_inner_loop loop, void *ctx);

/* Byte strides of `t` read as an operand of an out_ndim-dim result under
 * NumPy/ONNX multidirectional broadcasting: `t`'s dims align to the right; a
 * missing or size-1 dim gets stride 0. */
void acme_broadcast_strides(const acme_tensor *t, int32_t out_ndim, int64_t *byte_strides);

/* Elementwise driver: out[0] = f(in[0], ..., in[nin-1]) with broadcasting.
 * The loop sees the output as operand 0 and the inputs as operands 1..nin. */
void acme_elementwise(const acme_kernel_args *k, int nin, acme_inner_loop loop, void *ctx);

/* ---- Reduced-precision storage types -------------------------------------- */

/* IEEE binary16 and bfloat16 <-> float32, round to nearest even; NaN stays
 * NaN (quiet), infinities and signed zeros are kept. */
static inline float acme_f16_to_f32(uint16_t h) {
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

static inline uint16_t acme_f32_to_f16(float f) {
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

static inline float acme_bf16_to_f32(uint16_t h) {
  uint32_t bits = (uint32_t)h << 16;
  float f;
  memcpy(&f, &bits, sizeof f);
  return f;
}

static inline uint16_t acme_f32_to_bf16(float f) {
  uint32_t x;
  memcpy(&x, &f, sizeof x);
  if ((x & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((x >> 16) | 0x40);
  x += 0x7fff + ((x >> 16) & 1);
  return (uint16_t)(x >> 16);
}

/* Any supported scalar <-> double, for kernels that are generic over dtype
 * (data movement, Cast, reference-speed paths). */
double acme_load_as_double(const uint8_t *p, DK_DTypeKey dtype);
void acme_store_from_double(uint8_t *p, DK_DTypeKey dtype, double value);
/* int64 round trip without passing through double (exact for all int64). */
int64_t acme_load_as_int64(const uint8_t *p, DK_DTypeKey dtype);
void acme_store_from_int64(uint8_t *p, DK_DTypeKey dtype, int64_t value);

/* Compact row-major strides (elements) of a shape. */
void acme_compact_strides(int32_t ndim, const int64_t *shape, int64_t *strides);

#endif /* ACME_KERNEL_H_ */
