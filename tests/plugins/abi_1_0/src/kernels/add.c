/*
 * add.c -- ONNX Add for float32, with multidirectional broadcasting.
 *
 * acme_elementwise broadcasts: it gives a missing or size-1 dimension of an
 * input a step of 0, so this loop serves every pair of broadcastable shapes
 * and every strided view as it is.
 */
#include "kernel.h"

/* Operand 0 is the output, operands 1 and 2 the inputs A and B. */
static void add_f32_loop(int64_t n, uint8_t *const *p, const int64_t *s, void *ctx) {
  (void)ctx;
  uint8_t *out = p[0];
  const uint8_t *a = p[1], *b = p[2];
  for (int64_t i = 0; i < n; i++, out += s[0], a += s[1], b += s[2])
    *(float *)out = *(const float *)a + *(const float *)b;
}

static DK_Status add_f32(const acme_kernel_args *k) {
  acme_elementwise(k, 2, add_f32_loop, NULL);
  return DK_OK;
}

static const acme_kernel_def k_defs[] = {
    {"Add", DK_DTYPE_FLOAT32, add_f32, ACME_STRIDED},
};
ACME_REGISTER_KERNELS(k_defs)

/* Checked at launch: two inputs that broadcast to the output's shape, all float32. */
static const acme_op_schema k_schemas[] = {
    {"Add", 2, 2, 1, 1, 0, NULL, 0},
};
ACME_REGISTER_SCHEMAS(k_schemas)

static DK_Status validate_add(const acme_kernel_args *k) {
  DK_Status st = acme_check_broadcast(k, 2);
  if (st == DK_OK) st = acme_check_dtype(k, "input", 1, k->in[0].dtype);
  return st != DK_OK ? st : acme_check_dtype(k, "output", 0, k->in[0].dtype);
}

static const acme_validator k_validators[] = {
    {"Add", validate_add},
};
ACME_REGISTER_VALIDATORS(k_validators)
