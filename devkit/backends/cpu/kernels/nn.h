/*
 * nn.h -- element access shared by the nn kernel files: load any float
 * storage dtype as double, store a double rounded once (float16 and bfloat16
 * through float32, as every float16/bfloat16 kernel rounds).
 */
#ifndef DEVKIT_BACKENDS_CPU_KERNELS_NN_H_
#define DEVKIT_BACKENDS_CPU_KERNELS_NN_H_

#include "dks_kernel.h"

static inline double nn_ld_f32(const float *p, int64_t i) { return p[i]; }
static inline double nn_ld_f64(const double *p, int64_t i) { return p[i]; }
static inline double nn_ld_f16(const uint16_t *p, int64_t i) { return dks_f16_to_f32(p[i]); }
static inline double nn_ld_bf16(const uint16_t *p, int64_t i) { return dks_bf16_to_f32(p[i]); }
static inline void nn_st_f32(float *p, int64_t i, double v) { p[i] = (float)v; }
static inline void nn_st_f64(double *p, int64_t i, double v) { p[i] = v; }
static inline void nn_st_f16(uint16_t *p, int64_t i, double v) { p[i] = dks_f32_to_f16((float)v); }
static inline void nn_st_bf16(uint16_t *p, int64_t i, double v) { p[i] = dks_f32_to_bf16((float)v); }

#endif /* DEVKIT_BACKENDS_CPU_KERNELS_NN_H_ */
