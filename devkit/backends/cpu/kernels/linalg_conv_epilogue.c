/*
 * linalg_conv_epilogue.c -- the Conv epilogue (B, FusedConv's Z and
 * activation), applied by every Conv path to each block of outputs while it
 * is in cache; see linalg_conv_epilogue.h. FusedConv's kernels are Conv's
 * (linalg_conv.c): a Conv call is the epilogue with B only.
 */
#include "linalg_conv_epilogue.h"

#include <stdio.h>

static const dks_tensor *present_input(const dks_kernel_args *k, size_t i) {
  return k->num_inputs > i && k->in[i].ndim >= 0 ? &k->in[i] : NULL;
}

conv_epilogue conv_epilogue_of(const dks_kernel_args *k) {
  const dks_tensor *b = present_input(k, 2), *z = present_input(k, 3);
  const char *activation = dks_attr_string(k, "activation", "");
  conv_epilogue e = {.real = linalg_real_of(&k->out[0]), .bias = b ? b->data : NULL, .z = z ? z->data : NULL,
                     .y = k->out[0].data,
                     .activation = strcmp(activation, "Relu") == 0 ? CONV_ACTIVATION_RELU : CONV_ACTIVATION_NONE};
  return e;
}

conv_epilogue conv_epilogue_without_bias(const dks_kernel_args *k) {
  conv_epilogue e = conv_epilogue_of(k);
  e.bias = NULL;
  return e;
}

/* One pass over each row: (y + B) + Z, then the activation (the flags are
 * loop-invariant: the compiler unswitches them). Relu keeps NaN (NaN < 0 is
 * false), as the op's reference (maximum) does. */
#define EPILOGUE(NAME, T)                                                                                \
  DKS_VECTOR_CLONES static void NAME(T *y, const T *bias, const T *z, bool relu, int64_t channels,      \
                                     int64_t cols, int64_t ld) {                                        \
    for (int64_t m = 0; m < channels; m++) {                                                            \
      T *row = y + m * ld, add = bias ? bias[m] : (T)0;                                                 \
      const T *zr = z ? z + m * ld : NULL;                                                              \
      for (int64_t j = 0; j < cols; j++) {                                                              \
        T v = row[j];                                                                                   \
        if (bias) v += add;                                                                             \
        if (zr) v += zr[j];                                                                             \
        if (relu) v = v < 0 ? (T)0 : v;                                                                 \
        row[j] = v;                                                                                     \
      }                                                                                                 \
    }                                                                                                   \
  }
EPILOGUE(epilogue_f32, float)
EPILOGUE(epilogue_f64, double)

void conv_epilogue_apply(const conv_epilogue *e, void *y, int64_t channel, int64_t channels, int64_t cols,
                         int64_t ld) {
  if (!e->bias && !e->z && e->activation == CONV_ACTIVATION_NONE) return;
  size_t es = e->real == LINALG_F64 ? sizeof(double) : sizeof(float);
  const uint8_t *bias = e->bias ? e->bias + (size_t)channel * es : NULL;
  const uint8_t *z = e->z ? e->z + ((const uint8_t *)y - e->y) : NULL;
  bool relu = e->activation == CONV_ACTIVATION_RELU;
  if (e->real == LINALG_F64)
    epilogue_f64(y, (const double *)bias, (const double *)z, relu, channels, cols, ld);
  else
    epilogue_f32(y, (const float *)bias, (const float *)z, relu, channels, cols, ld);
}

static void format_shape(const dks_tensor *t, char *out, size_t size) {
  out[0] = 0;
  for (int32_t d = 0; d < t->ndim; d++)
    snprintf(out + strlen(out), size - strlen(out), "%s%lld", d ? "," : "", (long long)t->shape[d]);
}

DK_Status conv_epilogue_validate(const dks_kernel_args *k) {
  const char *activation = dks_attr_string(k, "activation", "");
  if (activation[0] && strcmp(activation, "Relu") != 0)
    return dks_invalid(k, "activation '%s' is not one the kernel applies (\"Relu\", or \"\" for none)",
                       activation);
  const dks_tensor *z = present_input(k, 3), *y = &k->out[0];
  if (!z) return DK_OK;
  bool same = z->ndim == y->ndim;
  for (int32_t d = 0; same && d < y->ndim; d++) same = z->shape[d] == y->shape[d];
  if (!same) {
    char got[256], want[256];
    format_shape(z, got, sizeof got);
    format_shape(y, want, sizeof want);
    return dks_invalid(k, "input 3 (Z) has shape (%s); it must have the output's shape (%s)", got, want);
  }
  return DK_OK;
}
