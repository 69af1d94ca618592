/*
 * linalg_conv_epilogue.h -- what Conv and FusedConv do to a block of
 * outputs after its sums, while the block is in cache: add B (one value per
 * output channel), add Z (FusedConv's residual, laid out as Y), apply the
 * activation. Each Conv path (im2col tiles, whole small planes, Winograd,
 * direct sums) calls conv_epilogue_apply where it used to add the bias.
 */
#ifndef DEVKIT_BACKENDS_CPU_KERNELS_LINALG_CONV_EPILOGUE_H_
#define DEVKIT_BACKENDS_CPU_KERNELS_LINALG_CONV_EPILOGUE_H_

#include "linalg.h"

typedef enum { CONV_ACTIVATION_NONE, CONV_ACTIVATION_RELU } conv_activation;

typedef struct conv_epilogue {
  linalg_real real;
  const uint8_t *bias; /* B; NULL: none */
  const uint8_t *z;    /* Z (compact, Y's shape, not overlapping Y); NULL: none */
  const uint8_t *y;    /* Y's data: a block's Z lies as far from z as the block from y */
  conv_activation activation;
} conv_epilogue;

/* The epilogue of a Conv or FusedConv call (inputs X, W, [B], [Z], attribute
 * "activation", output Y), as its validator accepted it. */
conv_epilogue conv_epilogue_of(const dks_kernel_args *k);

/* The same without B: for a path that adds B itself (Winograd adds it in
 * its output transform, before checking the sums are finite). */
conv_epilogue conv_epilogue_without_bias(const dks_kernel_args *k);

/* Applies `e` to `channels` rows of `cols` outputs, `ld` elements apart, at
 * y (inside Y); row r is in output channel `channel + r` (of an image):
 * y = activation(y + B[channel + r] + Z). */
void conv_epilogue_apply(const conv_epilogue *e, void *y, int64_t channel, int64_t channels, int64_t cols,
                         int64_t ld);

/* FusedConv's validator beyond Conv's: Z (when given) has Y's shape, and the
 * activation is one the kernel applies. */
DK_Status conv_epilogue_validate(const dks_kernel_args *k);

#endif /* DEVKIT_BACKENDS_CPU_KERNELS_LINALG_CONV_EPILOGUE_H_ */
