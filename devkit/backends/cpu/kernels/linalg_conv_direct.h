/*
 * linalg_conv_direct.h -- the direct Conv's filters, prepared once at plan
 * time (linalg_conv.c's prepare hook) instead of at every call: in filter
 * blocks of the direct path's register block, [group][block][channel][tap]
 * [filter in block], 0 past the filter count. linalg_conv_direct takes them
 * as its W when W's prepared_bytes is not 0.
 */
#ifndef DEVKIT_BACKENDS_CPU_KERNELS_LINALG_CONV_DIRECT_H_
#define DEVKIT_BACKENDS_CPU_KERNELS_LINALG_CONV_DIRECT_H_

#include "linalg.h"

/* The packed filters' bytes for a Conv of window `w` (2-D) with these counts per group. */
size_t linalg_conv_direct_filters_bytes(const linalg_window *w, int64_t group, int64_t cg, int64_t mg);

/* Packs W (group * mg filters of cg channels, compact float32) into wp. */
void linalg_conv_direct_pack_filters(const float *wt, const linalg_window *w, int64_t group, int64_t cg, int64_t mg,
                                     float *wp);

#endif /* DEVKIT_BACKENDS_CPU_KERNELS_LINALG_CONV_DIRECT_H_ */
