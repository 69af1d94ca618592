/*
 * linalg_conv_direct.h -- the direct Conv's filters, prepared once at plan
 * time (linalg_conv.c's prepare hook) instead of at every call: in filter
 * blocks of the direct path's register block, [group][block][channel][tap]
 * [filter in block], 0 past the filter count (linalg_conv_filter_blocks'
 * layout). linalg_conv_direct takes them
 * as its W when W's prepared_bytes is not 0.
 */
#ifndef DEVKIT_BACKENDS_CPU_KERNELS_LINALG_CONV_DIRECT_H_
#define DEVKIT_BACKENDS_CPU_KERNELS_LINALG_CONV_DIRECT_H_

#include "linalg.h"

/* Filters per block: the direct path's register block's (its filters in
 * linalg_conv_filter_blocks' layout). */
int64_t linalg_conv_direct_filter_block(void);

#endif /* DEVKIT_BACKENDS_CPU_KERNELS_LINALG_CONV_DIRECT_H_ */
