/*
 * hooks.c -- the @name@ device: the calls the plugin-support library makes
 * to count the devices, describe them, and allocate, free, copy and fill
 * their memory. The library does the rest, and has checked every handle,
 * range, capacity and stream before a hook runs.
 *
 * As generated, @name@ memory is host memory, as in devkit's cpu plugin:
 * handles are host pointers and copies are memmove, so the plugin builds,
 * loads and passes devkit-conformance before a driver exists. Each DEVICE:
 * comment marks where a driver call goes. A hook that fails returns
 * dks_set_error(status, "<what>: <why>"); hooks may run on any thread at
 * once (init excepted), so state of their own needs a lock.
 */
#define _POSIX_C_SOURCE 200809L /* posix_memalign, sysconf */

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "hooks.h"

#define DEFAULT_DEVICES 2
#define ALIGNMENT 64
/* The memory each device reports, and what the library lets it allocate
 * (DEVKIT_@NAME@_MEMORY: another amount). */
#define TOTAL_MEMORY ((uint64_t)4 << 30)

/* Once, by the first DK_PluginInit. DEVICE: open the driver and count its
 * devices. Until then DEVKIT_@NAME@_DEVICES says how many there are. */
static DK_Status @name@_init(int32_t *num_devices) {
  uint64_t count = DEFAULT_DEVICES;
  const char *s = dks_env("DEVICES");
  if (s && !dks_parse_int(s, 1, DKS_MAX_DEVICES, &count))
    return dks_config_error("DEVICES", s, "an integer in [1, 64]");
  *num_devices = (int32_t)count;
  return DK_OK;
}

/* Once per device, after init. DEVICE: ask the driver. */
static DK_Status @name@_properties(int32_t dev, DK_DeviceProperties *p) {
  long cores = sysconf(_SC_NPROCESSORS_ONLN);
  snprintf(p->name, sizeof p->name, "@name@ device %d", (int)dev);
  snprintf(p->vendor, sizeof p->vendor, "@name@");
  snprintf(p->driver_version, sizeof p->driver_version, "host memory");
  p->compute_units = cores < 1 ? 1 : (int32_t)cores;
  p->total_memory = p->max_alloc_size = TOTAL_MEMORY;
  p->alloc_alignment = ALIGNMENT;
  /* The last two flags let the host read and write the memory in place. Drop
   * them once handles are device memory: the host then copies. */
  p->flags = DK_DEVICE_FP64 | DK_DEVICE_FP16 | DK_DEVICE_BF16 |
             DK_DEVICE_UNIFIED_MEMORY | DK_DEVICE_HOST_POINTER_HANDLES;
  return DK_OK;
}

/* DEVICE: the driver's allocator. A handle must be unique even for size 0.
 * Handles that are not addresses (offset arithmetic) need the hooks'
 * `address` too (dks.h). */
static DK_Status @name@_alloc(int32_t dev, size_t size, DK_Mem *mem) {
  void *p = NULL;
  if (posix_memalign(&p, ALIGNMENT, size ? size : 1) != 0)
    return dks_set_error(DK_RESOURCE_EXHAUSTED,
                         "mem_alloc: out of memory allocating %zu bytes on @name@ device %d",
                         size, (int)dev);
  *mem = (DK_Mem)p;
  return DK_OK;
}

/* DEVICE: the driver's free. */
static void @name@_free(int32_t dev, DK_Mem mem, size_t size) {
  (void)dev, (void)size;
  free(mem);
}

/* In stream order, on the stream's worker thread (or the caller's, for the
 * default stream): c->kind says which way (DKS_COPY_H2D, _D2H, _D2D, _P2P).
 * DEVICE: issue the DMA and wait for it. The ranges may overlap. */
static DK_Status @name@_copy(const dks_copy *c) {
  memmove(c->dst, c->src, c->size);
  return DK_OK;
}

/* As copy, for a DKS_MEMSET of c->size bytes of c->value. DEVICE: the
 * driver's fill. */
static DK_Status @name@_memset(const dks_copy *c) {
  memset(c->dst, c->value, c->size);
  return DK_OK;
}

const dks_device_hooks @name@_hooks = {
    .struct_size = sizeof(dks_device_hooks),
    .name = "@name@",
    .version = "0.1.0",
    .device_type = DK_DEVICE_TYPE_EXT_DEV,
    .init = @name@_init,
    .properties = @name@_properties,
    .alloc = @name@_alloc,
    .free = @name@_free,
    .copy = @name@_copy,
    .memset = @name@_memset,
};
