/*
 * relu.c -- an example kernel: ONNX Relu for float32.
 *
 * A kernel file defines compute functions and registers them with
 * ACME_REGISTER_KERNELS; linking the file in is all it takes (setup.py
 * compiles every .c file of src/kernels). kernel.h explains what the
 * launcher does before a compute function runs on the stream's worker
 * thread.
 */
#include "kernel.h"

/* The inner loop acme_elementwise runs: operand 0 is the output, operand 1
 * the input; each pointer advances by its step in bytes (0 for a broadcast
 * operand), so strided views need nothing more. NaN stays NaN. */
static void relu_f32_loop(int64_t n, uint8_t *const *p, const int64_t *s, void *ctx) {
  (void)ctx;
  uint8_t *out = p[0];
  const uint8_t *in = p[1];
  for (int64_t i = 0; i < n; i++, out += s[0], in += s[1]) {
    float x = *(const float *)in;
    *(float *)out = x < 0 ? 0.0f : x;
  }
}

static DK_Status relu_f32(const acme_kernel_args *k) {
  acme_elementwise(k, 1, relu_f32_loop, NULL);
  return DK_OK;
}

/* (ONNX op, dtype of its key input, compute function, DK_KernelFlags) */
static const acme_kernel_def k_defs[] = {
    {"Relu", DK_DTYPE_FLOAT32, relu_f32, ACME_STRIDED},
};
ACME_REGISTER_KERNELS(k_defs)

/* Any host may call the table, so the launcher checks each call before it
 * queues it: the schema (one input, one output, the input keys the dtype,
 * no attributes), then the validator -- what relu_f32 reads: Y has X's
 * shape and dtype. A bad call gets DK_INVALID_ARGUMENT with a message. */
static const acme_op_schema k_schemas[] = {
    {"Relu", 1, 1, 1, 1, 0, NULL, 0},
};
ACME_REGISTER_SCHEMAS(k_schemas)

static DK_Status validate_relu(const acme_kernel_args *k) {
  DK_Status st = acme_check_output_like(k, 0, 0);
  return st != DK_OK ? st : acme_check_dtype(k, "output", 0, k->in[0].dtype);
}

static const acme_validator k_validators[] = {
    {"Relu", validate_relu},
};
ACME_REGISTER_VALIDATORS(k_validators)
