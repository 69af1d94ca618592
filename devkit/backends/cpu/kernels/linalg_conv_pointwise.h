/*
 * linalg_conv_pointwise.h -- the float32 2-D 1x1 Conv without padding (any
 * strides) as register-blocked sums over the input channels
 * (linalg_conv_pointwise.c).
 */
#ifndef DEVKIT_BACKENDS_CPU_KERNELS_LINALG_CONV_POINTWISE_H_
#define DEVKIT_BACKENDS_CPU_KERNELS_LINALG_CONV_POINTWISE_H_

#include "linalg_conv_epilogue.h"

/* Whether a Conv of window `w`, dtype and cg input, mg output channels per
 * group goes this way: float32, 2-D, a 1x1 kernel, no padding, on a CPU
 * with AVX2 and FMA (elsewhere the GEMM paths take it). */
bool linalg_conv_pointwise_fits(const linalg_window *w, DK_DTypeKey dtype, int64_t cg, int64_t mg);

/* y = the Conv of x by wt, then the epilogue `ep` (B, Z, the activation),
 * split over the pool. */
DK_Status linalg_conv_pointwise(const dks_kernel_args *k, const dks_tensor *x, const dks_tensor *wt,
                                const conv_epilogue *ep, const dks_tensor *y, const linalg_window *w,
                                int64_t group);

#endif /* DEVKIT_BACKENDS_CPU_KERNELS_LINALG_CONV_POINTWISE_H_ */
