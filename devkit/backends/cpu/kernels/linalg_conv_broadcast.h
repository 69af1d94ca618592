/*
 * linalg_conv_broadcast.h -- float32 2-D Conv with few channels on small
 * planes (AVX-512: the zoo ResNet's and U-Net's 3x3 layers) by register
 * blocks whose weights or inputs the multiply-add broadcasts from memory,
 * where the direct path's vectors over flat positions waste lanes on short
 * rows and copy strided inputs into phase planes. Its filters are prepared
 * once at plan time (linalg_conv.c's prepare hook) as [group][block]
 * [channel][ky][kx][filter in block] (linalg_conv_filter_blocks' layout),
 * blocks of 8, 16 or 32 filters (by the filter count), 0 past the filter
 * count.
 */
#ifndef DEVKIT_BACKENDS_CPU_KERNELS_LINALG_CONV_BROADCAST_H_
#define DEVKIT_BACKENDS_CPU_KERNELS_LINALG_CONV_BROADCAST_H_

#include "linalg.h"

/* Whether a Conv of window `w`, dtype and cg input, mg output channels per
 * group goes this way (only where the CPU has AVX-512). */
bool linalg_conv_broadcast_fits(const linalg_window *w, DK_DTypeKey dtype, int64_t cg, int64_t mg);

/* Filters per register block (8, 16 or 32, by the filter count and the
 * window): its filters in linalg_conv_filter_blocks' layout. */
int64_t linalg_conv_broadcast_filter_block(const linalg_window *w, int64_t mg);

/* y = x * W (+ b, NULL: none), then the epilogue of `k` (FusedConv's Z and
 * activation); wt is W, or its packed filters when wt->prepared_bytes is not
 * 0. Split over the pool by (image, band of output rows). */
DK_Status linalg_conv_broadcast(const dks_kernel_args *k, const dks_tensor *x, const dks_tensor *wt,
                                const dks_tensor *b, const dks_tensor *y, const linalg_window *w, int64_t group);

#endif /* DEVKIT_BACKENDS_CPU_KERNELS_LINALG_CONV_BROADCAST_H_ */
