/*
 * relu.c -- an example kernel: ONNX Relu for float32, on strided views.
 *
 * A kernel file registers compute functions with DKS_REGISTER_KERNELS;
 * linking it in is all it takes (setup.py compiles every .c file of
 * src/kernels). The library's launcher checks each call -- devices, ranks,
 * extents, the op's schema, then the validators registered below -- and
 * queues it; the compute function runs in stream order on the stream's
 * worker thread, with every tensor's address resolved (dks_kernel.h).
 */
#include "dks_kernel.h"

/* The inner loop dks_elementwise runs: operand 0 is the output, operand 1
 * the input; each pointer advances by its step in bytes, so strided views
 * need nothing more. NaN stays NaN. */
static void relu_f32_loop(int64_t n, uint8_t *const *p, const int64_t *s, void *ctx) {
  (void)ctx;
  uint8_t *out = p[0];
  const uint8_t *in = p[1];
  for (int64_t i = 0; i < n; i++, out += s[0], in += s[1]) {
    float x = *(const float *)in;
    *(float *)out = x < 0 ? 0.0f : x;
  }
}

/* DEVICE: launch the device's Relu on k->in[0] and k->out[0] (data, shape,
 * strides in elements) and wait for it. */
static DK_Status relu_f32(const dks_kernel_args *k) {
  dks_elementwise(k, 1, relu_f32_loop, NULL);
  return DK_OK;
}

/* (ONNX op, dtype of its key input, compute function, DK_KernelFlags) */
static const dks_kernel_def k_defs[] = {
    {"Relu", DK_DTYPE_FLOAT32, relu_f32, DKS_STRIDED},
};
DKS_REGISTER_KERNELS(k_defs)

/* Any host may call the table, so what relu_f32 reads is checked at launch:
 * Y has X's shape and dtype. A bad call gets DK_INVALID_ARGUMENT. */
static const dks_validator k_validators[] = {
    {"Relu", dks_validate_like_input},
};
DKS_REGISTER_VALIDATORS(k_validators)
