/*
 * support_minimal.c -- a whole plugin on the plugin-support library
 * (devkit/abi/support): host-memory hooks and one Relu kernel, for
 * tests/test_support_library.py.
 */
#define _POSIX_C_SOURCE 200809L /* posix_memalign */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "dks_kernel.h"

static DK_Status tiny_init(int32_t *num_devices) {
  *num_devices = 1;
  return DK_OK;
}

static DK_Status tiny_properties(int32_t dev, DK_DeviceProperties *p) {
  snprintf(p->name, sizeof p->name, "tiny device %d", (int)dev);
  p->compute_units = 1;
  p->total_memory = p->max_alloc_size = (uint64_t)1 << 30;
  p->alloc_alignment = 64;
  p->flags = DK_DEVICE_FP64 | DK_DEVICE_UNIFIED_MEMORY | DK_DEVICE_HOST_POINTER_HANDLES;
  return DK_OK;
}

static DK_Status tiny_alloc(int32_t dev, size_t size, DK_Mem *mem) {
  void *p = NULL;
  if (posix_memalign(&p, 64, size ? size : 1) != 0)
    return dks_set_error(DK_RESOURCE_EXHAUSTED, "mem_alloc: out of memory on tiny device %d", (int)dev);
  *mem = (DK_Mem)p;
  return DK_OK;
}

static void tiny_free(int32_t dev, DK_Mem mem, size_t size) {
  (void)dev, (void)size;
  free(mem);
}

static DK_Status tiny_copy(const dks_copy *c) {
  memmove(c->dst, c->src, c->size);
  return DK_OK;
}

static DK_Status tiny_memset(const dks_copy *c) {
  memset(c->dst, c->value, c->size);
  return DK_OK;
}

static const dks_device_hooks k_hooks = {
    .struct_size = sizeof(dks_device_hooks), .name = "tiny", .version = "0.0.1",
    .device_type = DK_DEVICE_TYPE_EXT_DEV, .init = tiny_init, .properties = tiny_properties,
    .alloc = tiny_alloc, .free = tiny_free, .copy = tiny_copy, .memset = tiny_memset};

DK_EXPORT DK_Status DK_PluginInit(const DK_HostInfo *host, DK_PluginInfo *out) {
  return dks_plugin_init(&k_hooks, NULL, host, out);
}

static DK_Status relu_f32(const dks_kernel_args *k) {
  const float *x = (const float *)k->in[0].data;
  float *y = (float *)k->out[0].data;
  for (int64_t i = 0; i < k->out[0].size; i++) y[i] = x[i] > 0 ? x[i] : 0;
  return DK_OK;
}

static const dks_validator k_validators[] = {{"Relu", dks_validate_like_input}};
DKS_REGISTER_VALIDATORS(k_validators)
static const dks_kernel_def k_defs[] = {{"Relu", DK_DTYPE_FLOAT32, relu_f32, 0}};
DKS_REGISTER_KERNELS(k_defs)
