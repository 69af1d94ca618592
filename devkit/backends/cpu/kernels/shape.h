/*
 * shape.h -- helpers shared by the shape family's kernels (shape.c,
 * shape_cast.c, shape_resize.c). Every float result is rounded once, to
 * nearest even, from the exact value: see dks_f64_to_f16 in dks_kernel.h.
 */
#ifndef DEVKIT_BACKENDS_CPU_KERNELS_SHAPE_H_
#define DEVKIT_BACKENDS_CPU_KERNELS_SHAPE_H_

#include "dks_kernel.h"

static inline bool shape_is_float(DK_DTypeKey dtype) {
  int code = (int)(dtype & 0xff);
  return code == DK_DTYPE_CODE_FLOAT || code == DK_DTYPE_CODE_BFLOAT;
}

#endif /* DEVKIT_BACKENDS_CPU_KERNELS_SHAPE_H_ */
