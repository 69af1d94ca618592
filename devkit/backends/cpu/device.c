/*
 * device.c -- the device hooks of the devkit "cpu" reference plugin: its
 * devices are the host's memory and cores. The support library (dks.h) does
 * the rest: registry, capacity, streams, events, graphs, kernel launches.
 */
#define _GNU_SOURCE /* madvise, sysconf(_SC_NPROCESSORS_ONLN) */

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "cpu.h"

#define DEFAULT_DEVICES 2
#define DEFAULT_CAPACITY ((uint64_t)4 << 30)
#define ALLOC_ALIGNMENT 64
#define HUGE_PAGE ((size_t)2 << 20) /* x86-64 and arm64 transparent huge pages */

/* Set once by cpu_init, before any other hook runs. */
static int32_t g_compute_units;

/* DEVKIT_CPU_DEVICES picks the device count. */
static DK_Status cpu_init(int32_t *num_devices) {
  uint64_t v = DEFAULT_DEVICES;
  const char *s = dks_env("DEVICES");
  if (s && !dks_parse_int(s, 1, DKS_MAX_DEVICES, &v))
    return dks_config_error("DEVICES", s, "an integer in [1, 64]");
  *num_devices = (int32_t)v;
  long cpus = sysconf(_SC_NPROCESSORS_ONLN);
  g_compute_units = cpus < 1 ? 1 : cpus > INT32_MAX ? INT32_MAX : (int32_t)cpus;
  return DK_OK;
}

/* Any size up to the capacity (DEVKIT_CPU_MEMORY, default 4 GiB) fits. */
static DK_Status cpu_properties(int32_t dev, DK_DeviceProperties *p) {
  p->compute_units = g_compute_units;
  p->total_memory = DEFAULT_CAPACITY;
  p->max_alloc_size = UINT64_MAX;
  p->alloc_alignment = ALLOC_ALIGNMENT;
  p->flags = DK_DEVICE_FP64 | DK_DEVICE_FP16 | DK_DEVICE_BF16 | DK_DEVICE_UNIFIED_MEMORY |
             DK_DEVICE_HOST_POINTER_HANDLES;
  snprintf(p->name, sizeof p->name, "devkit cpu device %d", (int)dev);
  snprintf(p->vendor, sizeof p->vendor, "devkit reference");
  snprintf(p->driver_version, sizeof p->driver_version, CPU_PLUGIN_VERSION);
  return DK_OK;
}

/* size 0 still needs a unique, freeable handle: back it with one byte.
 * Large buffers ask for transparent huge pages, as NumPy's do: first touch
 * of 64 MiB then takes 32 page faults instead of 16384. */
static DK_Status cpu_alloc(int32_t dev, size_t size, DK_Mem *mem) {
  void *p = NULL;
  bool huge = size >= 2 * HUGE_PAGE;
  if (posix_memalign(&p, huge ? HUGE_PAGE : ALLOC_ALIGNMENT, size ? size : 1) != 0)
    return dks_set_error(DK_RESOURCE_EXHAUSTED,
                         "mem_alloc: host out of memory allocating %zu bytes for cpu device %d",
                         size, (int)dev);
  if (huge) madvise(p, size, MADV_HUGEPAGE); /* advice only: failure is harmless */
  *mem = (DK_Mem)p;
  return DK_OK;
}

static void cpu_free(int32_t dev, DK_Mem mem, size_t size) {
  (void)dev, (void)size;
  free(mem);
}

/* Copies and fills of at least COPY_SPLIT_BYTES run in COPY_BLOCK pieces
 * over the kernels' thread pool, in chunks of at least COPY_GRAIN blocks:
 * one core does not reach the memory's bandwidth (measured here: 2 MiB in
 * 43 us on one thread, 25 us on two). */
#define COPY_BLOCK ((size_t)64 << 10)
#define COPY_GRAIN 4
#define COPY_SPLIT_BYTES ((size_t)1 << 20)

static void copy_blocks(void *arg, int64_t begin, int64_t end) {
  const dks_copy *c = arg;
  size_t first = (size_t)begin * COPY_BLOCK, last = (size_t)end * COPY_BLOCK;
  size_t size = (last < c->size ? last : c->size) - first;
  if (c->src)
    memcpy((uint8_t *)c->dst + first, (const uint8_t *)c->src + first, size);
  else
    memset((uint8_t *)c->dst + first, c->value, size);
}

/* Every kind is a host copy (a memset has no src). memmove where the ranges
 * overlap: handles are host pointers, so even an h2d source may alias the
 * destination allocation. */
static DK_Status cpu_copy(const dks_copy *c) {
  uint8_t *dst = c->dst;
  const uint8_t *src = c->src;
  bool overlap = src && src < dst + c->size && dst < src + c->size;
  if (c->size >= COPY_SPLIT_BYTES && !overlap)
    dks_parallel_for((int64_t)((c->size + COPY_BLOCK - 1) / COPY_BLOCK), COPY_GRAIN, copy_blocks,
                     (void *)c);
  else if (src)
    memmove(dst, src, c->size);
  else
    memset(dst, c->value, c->size);
  return DK_OK;
}

/* The handle is the host pointer itself, as for an allocation. */
static DK_Status cpu_register_host(int32_t dev, void *ptr, size_t size, DK_Mem *mem) {
  (void)dev, (void)size;
  *mem = (DK_Mem)ptr;
  return DK_OK;
}

const dks_device_hooks cpu_hooks = {
    .struct_size = sizeof(dks_device_hooks),
    .name = "cpu",
    .plugin_name = CPU_PLUGIN_NAME,
    .version = CPU_PLUGIN_VERSION,
    .device_type = DK_DEVICE_TYPE_CPU,
    .init = cpu_init,
    .properties = cpu_properties,
    .alloc = cpu_alloc,
    .free = cpu_free,
    .copy = cpu_copy,
    .memset = cpu_copy,
    .register_host = cpu_register_host,
};
