/*
 * add.c -- a second example kernel: ONNX Add for float32, broadcasting its
 * inputs (NumPy's rules) and on strided views, as relu.c is written.
 */
#include "dks_kernel.h"

/* Operand 0 is the output, operands 1 and 2 the inputs; a broadcast
 * operand's step is 0. */
static void add_f32_loop(int64_t n, uint8_t *const *p, const int64_t *s, void *ctx) {
  (void)ctx;
  uint8_t *out = p[0];
  const uint8_t *a = p[1], *b = p[2];
  for (int64_t i = 0; i < n; i++, out += s[0], a += s[1], b += s[2])
    *(float *)out = *(const float *)a + *(const float *)b;
}

/* DEVICE: launch the device's Add and wait for it. */
static DK_Status add_f32(const dks_kernel_args *k) {
  dks_elementwise(k, 2, add_f32_loop, NULL);
  return DK_OK;
}

static const dks_kernel_def k_defs[] = {
    {"Add", DK_DTYPE_FLOAT32, add_f32, DKS_STRIDED},
};
DKS_REGISTER_KERNELS(k_defs)

/* What add_f32 reads: A and B broadcast to Y's shape; all three have A's
 * dtype. */
static DK_Status validate_add(const dks_kernel_args *k) {
  DK_Status st = dks_check_broadcast(k, 2);
  if (st == DK_OK) st = dks_check_dtype(k, "input", 1, k->in[0].dtype);
  return st != DK_OK ? st : dks_check_dtype(k, "output", 0, k->in[0].dtype);
}

static const dks_validator k_validators[] = {
    {"Add", validate_add},
};
DKS_REGISTER_VALIDATORS(k_validators)
