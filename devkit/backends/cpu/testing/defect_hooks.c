/*
 * defect_hooks.c -- TEST-ONLY. Deliberately broken wrappers of the cpu
 * plugin's device hooks, compiled only into the defect variants that test
 * the conformance suite (devkit/backends/cpu/defects.py); the variant's
 * DEVKIT_DEFECT_* define picks the wrapper, and plugin.c then runs on
 * cpu_defect_hooks() instead of cpu_hooks.
 */
#include <pthread.h>
#include <stdatomic.h>

#include "cpu.h"

static dks_device_hooks g_hooks;

#ifdef DEVKIT_DEFECT_ODD_COPY
/* A copy drops its last byte at odd sizes (memsets are left alone). */
static DK_Status odd_copy(const dks_copy *c) {
  dks_copy shorter = *c;
  if (shorter.size & 1) shorter.size--;
  return shorter.size ? cpu_hooks.copy(&shorter) : DK_OK;
}
#endif

#ifdef DEVKIT_DEFECT_LEAK
/* mem_free does not free: the device, as its driver counts (mem_info), has
 * less memory after every alloc and free. */
static atomic_size_t g_held[DKS_MAX_DEVICES];

static DK_Status counted_alloc(int32_t dev, size_t size, DK_Mem *mem) {
  DK_Status st = cpu_hooks.alloc(dev, size, mem);
  if (st == DK_OK) atomic_fetch_add(&g_held[dev], size);
  return st;
}

static void leaking_free(int32_t dev, DK_Mem mem, size_t size) { (void)dev, (void)mem, (void)size; }

static DK_Status driver_info(int32_t dev, size_t *free_bytes, size_t *total_bytes) {
  DK_DeviceProperties p = {.struct_size = sizeof p};
  DK_Status st = cpu_hooks.properties(dev, &p);
  size_t held = atomic_load(&g_held[dev]);
  *total_bytes = (size_t)p.total_memory;
  *free_bytes = held < *total_bytes ? *total_bytes - held : 0;
  return st;
}
#endif

static void wrap(void) {
  g_hooks = cpu_hooks;
#ifdef DEVKIT_DEFECT_ODD_COPY
  g_hooks.copy = odd_copy;
#endif
#ifdef DEVKIT_DEFECT_LEAK
  g_hooks.alloc = counted_alloc;
  g_hooks.free = leaking_free;
  g_hooks.mem_info = driver_info;
#endif
}

const dks_device_hooks *cpu_defect_hooks(void) {
  static pthread_once_t once = PTHREAD_ONCE_INIT;
  pthread_once(&once, wrap);
  return &g_hooks;
}
