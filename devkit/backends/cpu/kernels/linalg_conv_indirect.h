/*
 * linalg_conv_indirect.h -- the float32 2-D Conv as an indirect product on
 * the AVX-512 packed block, vectorised over output channels
 * (linalg_conv_indirect.c). Its filters lie in panels of PACKED_PANEL
 * filters, [group][panel][channel][tap][filter in panel], 0 past the filter
 * count (linalg_conv_filter_blocks' layout, blocks of PACKED_PANEL),
 * prepared once at plan time (linalg_conv.c's prepare hook): the
 * path runs on prepared filters only (a W as given takes the other paths).
 */
#ifndef DEVKIT_BACKENDS_CPU_KERNELS_LINALG_CONV_INDIRECT_H_
#define DEVKIT_BACKENDS_CPU_KERNELS_LINALG_CONV_INDIRECT_H_

#include "linalg_conv_epilogue.h"

/* (channel, tap) steps per pass of the Conv paths that sum on the packed
 * block in passes (this one and linalg_conv.c's blocked path): the same
 * passes give the same sums, so a Conv whose W is prepared for this path
 * equals, bit for bit, the blocked path's on the W as given. */
#define LINALG_CONV_PASS 256

/* Whether a Conv of window `w`, dtype and cg input, mg output channels per
 * group goes this way (float32, 2-D, a CPU with AVX-512, the geometries
 * linalg_conv_indirect.c names). */
bool linalg_conv_indirect_fits(const linalg_window *w, DK_DTypeKey dtype, int64_t cg, int64_t mg);

/* y = the Conv of x by the filters in `panels`, then the epilogue `ep` (B,
 * Z, the activation), split over the pool. */
DK_Status linalg_conv_indirect(const dks_kernel_args *k, const dks_tensor *x, const float *panels,
                               const conv_epilogue *ep, const dks_tensor *y, const linalg_window *w,
                               int64_t group);

#endif /* DEVKIT_BACKENDS_CPU_KERNELS_LINALG_CONV_INDIRECT_H_ */
