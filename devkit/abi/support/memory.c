/*
 * memory.c -- the memory registry (live handles, sizes, capacity, range
 * checks, host registration) and the copies of the devkit plugin-support
 * library, on the device hooks' alloc, free, copy and memset.
 */
#define _POSIX_C_SOURCE 200809L /* posix_memalign */

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "dks_internal.h"

/* ======================================================================== */
/* Memory                                                                    */
/* ======================================================================== */

static DK_Status alloc_on(const char *fn, dks_device *d, size_t size,
                          DK_Mem *mem) {
  if (!mem) return dks_set_error(DK_INVALID_ARGUMENT, "%s: mem is NULL", fn);
  DK_Status st = dks_injected_alloc_failure(fn, d, size);
  if (st != DK_OK) return st;

  /* Reserve capacity first so an oversized request never reaches the
   * device. */
  pthread_mutex_lock(&d->mem_mu);
  size_t free_bytes = d->capacity - d->used;
  if (size > free_bytes) {
    pthread_mutex_unlock(&d->mem_mu);
    return dks_set_error(DK_RESOURCE_EXHAUSTED,
                         "%s: cannot allocate %zu bytes on %s device %d: "
                         "%zu bytes free of %zu capacity",
                         fn, size, dks_name(), (int)d->index, free_bytes, d->capacity);
  }
  d->used += size;
  pthread_mutex_unlock(&d->mem_mu);

  DK_Mem handle = NULL;
  st = dks_hooks.alloc(d->index, size, &handle);
  bool ok = st == DK_OK;
  pthread_mutex_lock(&d->mem_mu);
  if (ok && !dks_table_insert(&d->mems, (uintptr_t)handle, size)) ok = false;
  if (!ok) d->used -= size;
  pthread_mutex_unlock(&d->mem_mu);
  if (st != DK_OK) return st; /* the hook's message */
  if (!ok) {
    dks_hooks.free(d->index, handle, size);
    return dks_set_error(DK_RESOURCE_EXHAUSTED,
                         "%s: host out of memory registering %zu bytes for %s "
                         "device %d",
                         fn, size, dks_name(), (int)d->index);
  }
  *mem = handle;
  return DK_OK;
}

DK_Status dks_mem_alloc(int32_t dev, size_t size, DK_Mem *mem) {
  dks_device *d;
  DK_Status st = dks_device_get("mem_alloc", dev, &d);
  return st != DK_OK ? st : alloc_on("mem_alloc", d, size, mem);
}

/* Allocation is immediate, so the memory is usable by any later work. */
DK_Status dks_mem_alloc_async(int32_t dev, size_t size, DK_Stream stream,
                              DK_Mem *mem) {
  static const char fn[] = "mem_alloc_async";
  dks_device *d;
  dks_stream *s;
  DK_Status st = dks_device_get(fn, dev, &d);
  if (st != DK_OK) return st;
  if ((st = dks_stream_acquire(fn, d, stream, &s)) != DK_OK) return st;
  if (dks_stream_capturing(s)) st = dks_capture_refused(fn, s);
  dks_stream_release(s);
  return st != DK_OK ? st : alloc_on(fn, d, size, mem);
}

/* Removes `mem` from the live registry; its capacity stays counted until
 * release_capacity. */
static DK_Status unregister_mem(const char *fn, dks_device *d, DK_Mem mem,
                                size_t *size) {
  pthread_mutex_lock(&d->mem_mu);
  bool registered = dks_table_find(&d->registered, (uintptr_t)mem, NULL);
  bool live = !registered && dks_table_remove(&d->mems, (uintptr_t)mem, size);
  pthread_mutex_unlock(&d->mem_mu);
  if (registered)
    return dks_set_error(DK_INVALID_ARGUMENT,
                         "%s: handle %p is host memory registered with "
                         "mem_register_host on %s device %d: end it with "
                         "mem_unregister_host",
                         fn, (void *)mem, dks_name(), (int)d->index);
  if (!live)
    return dks_set_error(DK_INVALID_ARGUMENT,
                         "%s: handle %p is not a live allocation on %s "
                         "device %d",
                         fn, (void *)mem, dks_name(), (int)d->index);
  return DK_OK;
}

static void release_capacity(dks_device *d, size_t size) {
  pthread_mutex_lock(&d->mem_mu);
  d->used -= size;
  pthread_mutex_unlock(&d->mem_mu);
}

DK_Status dks_mem_free(int32_t dev, DK_Mem mem) {
  dks_device *d;
  size_t size;
  DK_Status st = dks_device_get("mem_free", dev, &d);
  if (st != DK_OK || !mem) return st;
  if ((st = dks_device_capture_check("mem_free", d)) != DK_OK) return st;
  if ((st = unregister_mem("mem_free", d, mem, &size)) != DK_OK) return st;
  dks_hooks.free(d->index, mem, size);
  release_capacity(d, size);
  return DK_OK;
}

typedef struct free_args {
  dks_device *device;
  DK_Mem mem;
  size_t size;
} free_args;

static void run_free(void *arg) {
  free_args *a = arg;
  dks_hooks.free(a->device->index, a->mem, a->size);
  release_capacity(a->device, a->size);
}

DK_Status dks_mem_free_async(int32_t dev, DK_Mem mem, DK_Stream stream) {
  static const char fn[] = "mem_free_async";
  dks_device *d;
  dks_stream *s;
  DK_Status st = dks_device_get(fn, dev, &d);
  if (st != DK_OK) return st;
  if ((st = dks_stream_acquire(fn, d, stream, &s)) != DK_OK) return st;
  if (!mem || dks_stream_capturing(s)) {
    st = mem ? dks_capture_refused(fn, s) : DK_OK;
    dks_stream_release(s);
    return st;
  }
  /* Allocate the work item before unregistering, so that a failure leaves
   * the handle live. */
  free_args *a = dks_work_new(sizeof *a, run_free, NULL);
  if (!a) {
    dks_stream_release(s);
    return dks_set_error(DK_RESOURCE_EXHAUSTED,
                         "%s: host out of memory queuing the free", fn);
  }
  if ((st = unregister_mem(fn, d, mem, &a->size)) != DK_OK) {
    dks_work_discard(a);
    dks_stream_release(s);
    return st;
  }
  a->device = d;
  a->mem = mem;
  dks_work_submit(s, a);
  dks_stream_release(s);
  return DK_OK;
}

DK_Status dks_mem_get_info(int32_t dev, size_t *free_bytes,
                           size_t *total_bytes) {
  static const char fn[] = "mem_get_info";
  dks_device *d;
  DK_Status st = dks_device_get(fn, dev, &d);
  if (st != DK_OK) return st;
  if (!free_bytes)
    return dks_set_error(DK_INVALID_ARGUMENT, "%s: free_bytes is NULL", fn);
  if (!total_bytes)
    return dks_set_error(DK_INVALID_ARGUMENT, "%s: total_bytes is NULL", fn);
  size_t driver_free = SIZE_MAX, driver_total;
  if (dks_hooks.mem_info && (st = dks_hooks.mem_info(dev, &driver_free, &driver_total)) != DK_OK)
    return st;
  pthread_mutex_lock(&d->mem_mu);
  *free_bytes = d->capacity - d->used;
  pthread_mutex_unlock(&d->mem_mu);
  if (driver_free < *free_bytes) *free_bytes = driver_free;
  *total_bytes = d->capacity;
  return DK_OK;
}

/* The hook's handle is entered in the live registry so that every check
 * that accepts an allocation accepts it, and in `registered` so that
 * mem_free refuses it. (dks_fill_api publishes these two only when the
 * hooks have register_host.) */
DK_Status dks_mem_register_host(int32_t dev, void *ptr, size_t size,
                                DK_Mem *mem) {
  static const char fn[] = "mem_register_host";
  dks_device *d;
  DK_Status st = dks_device_get(fn, dev, &d);
  if (st != DK_OK) return st;
  if (!ptr) return dks_set_error(DK_INVALID_ARGUMENT, "%s: ptr is NULL", fn);
  if (!mem) return dks_set_error(DK_INVALID_ARGUMENT, "%s: mem is NULL", fn);
  if (!size)
    return dks_set_error(DK_INVALID_ARGUMENT, "%s: size is 0 (a registration "
                         "needs at least one byte)", fn);
  if ((uintptr_t)ptr > UINTPTR_MAX - size)
    return dks_set_error(DK_OUT_OF_RANGE, "%s: %p + %zu bytes wraps around "
                         "the address space", fn, ptr, size);
  DK_Mem handle;
  if ((st = dks_hooks.register_host(dev, ptr, size, &handle)) != DK_OK) return st;
  pthread_mutex_lock(&d->mem_mu);
  bool exists = dks_table_find(&d->mems, (uintptr_t)handle, NULL);
  bool ok = !exists && dks_table_insert(&d->mems, (uintptr_t)handle, size);
  if (ok && !dks_table_insert(&d->registered, (uintptr_t)handle, size)) {
    dks_table_remove(&d->mems, (uintptr_t)handle, NULL);
    ok = false;
  }
  pthread_mutex_unlock(&d->mem_mu);
  if (!ok && dks_hooks.unregister_host) dks_hooks.unregister_host(dev, handle);
  if (exists)
    return dks_set_error(DK_ALREADY_EXISTS,
                         "%s: %p is already a live handle of %s device %d "
                         "(an allocation or a registration): use it", fn, ptr,
                         dks_name(), (int)d->index);
  if (!ok)
    return dks_set_error(DK_RESOURCE_EXHAUSTED,
                         "%s: host out of memory registering %zu bytes", fn,
                         size);
  *mem = handle;
  return DK_OK;
}

DK_Status dks_mem_unregister_host(int32_t dev, DK_Mem mem) {
  static const char fn[] = "mem_unregister_host";
  dks_device *d;
  DK_Status st = dks_device_get(fn, dev, &d);
  if (st != DK_OK || !mem) return st;
  pthread_mutex_lock(&d->mem_mu);
  bool registered = dks_table_remove(&d->registered, (uintptr_t)mem, NULL);
  if (registered) dks_table_remove(&d->mems, (uintptr_t)mem, NULL);
  pthread_mutex_unlock(&d->mem_mu);
  if (!registered)
    return dks_set_error(DK_INVALID_ARGUMENT,
                         "%s: handle %p is not a host registration of %s "
                         "device %d",
                         fn, (void *)mem, dks_name(), (int)d->index);
  if (dks_hooks.unregister_host) dks_hooks.unregister_host(dev, mem);
  return DK_OK;
}

/* The size of live allocation (or registration) `mem` of `d`. */
static DK_Status live_size(const char *fn, const char *what, dks_device *d, DK_Mem mem,
                           size_t *alloc_size) {
  if (!mem)
    return dks_set_error(DK_INVALID_ARGUMENT, "%s: %s handle is NULL", fn, what);
  pthread_mutex_lock(&d->mem_mu);
  bool live = dks_table_find(&d->mems, (uintptr_t)mem, alloc_size);
  pthread_mutex_unlock(&d->mem_mu);
  if (!live)
    return dks_set_error(DK_INVALID_ARGUMENT,
                         "%s: %s handle %p is not a live allocation on %s "
                         "device %d",
                         fn, what, (void *)mem, dks_name(), (int)d->index);
  return DK_OK;
}

static uint8_t *address_of(dks_device *d, DK_Mem mem, size_t offset) {
  return dks_hooks.address ? dks_hooks.address(d->index, mem, offset) : (uint8_t *)mem + offset;
}

DK_Status dks_mem_extent(const char *fn, const char *what, dks_device *d, DK_Mem mem,
                         size_t offset, uint8_t **addr, size_t *size) {
  *addr = NULL;
  size_t alloc_size;
  DK_Status st = live_size(fn, what, d, mem, &alloc_size);
  if (st != DK_OK) return st;
  if (offset >= alloc_size)
    return dks_set_error(DK_OUT_OF_RANGE, "%s: %s offset %zu is not inside the %zu-byte allocation",
                         fn, what, offset, alloc_size);
  *addr = address_of(d, mem, offset);
  *size = alloc_size - offset;
  return DK_OK;
}

DK_Status dks_mem_range(const char *fn, const char *what, dks_device *d,
                        DK_Mem mem, size_t offset, size_t size,
                        uint8_t **addr) {
  *addr = NULL;
  size_t alloc_size;
  DK_Status st = live_size(fn, what, d, mem, &alloc_size);
  if (st != DK_OK) return st;
  if (offset > alloc_size || size > alloc_size - offset)
    return dks_set_error(DK_OUT_OF_RANGE,
                         "%s: %s range [offset %zu, +%zu) exceeds the "
                         "%zu-byte allocation",
                         fn, what, offset, size, alloc_size);
  *addr = address_of(d, mem, offset);
  return DK_OK;
}

/* Without host_alloc / host_free hooks, host memory is malloc's, aligned
 * for every dtype and vector load. */
#define HOST_ALIGNMENT 64

static DK_Status host_alloc_default(int32_t dev, size_t size, void **ptr) {
  void *p = NULL;
  if (posix_memalign(&p, HOST_ALIGNMENT, size ? size : 1) != 0)
    return dks_set_error(DK_RESOURCE_EXHAUSTED,
                         "host_alloc: host out of memory allocating %zu bytes for %s device %d",
                         size, dks_name(), (int)dev);
  *ptr = p;
  return DK_OK;
}

DK_Status dks_host_alloc(int32_t dev, size_t size, void **ptr) {
  static const char fn[] = "host_alloc";
  dks_device *d;
  DK_Status st = dks_device_get(fn, dev, &d);
  if (st != DK_OK) return st;
  if (!ptr) return dks_set_error(DK_INVALID_ARGUMENT, "%s: ptr is NULL", fn);
  void *p = NULL;
  if ((st = (dks_hooks.host_alloc ? dks_hooks.host_alloc : host_alloc_default)(dev, size, &p)) != DK_OK)
    return st;
  pthread_mutex_lock(&d->mem_mu);
  bool ok = dks_table_insert(&d->host, (uintptr_t)p, size);
  pthread_mutex_unlock(&d->mem_mu);
  if (!ok) {
    if (dks_hooks.host_free)
      dks_hooks.host_free(dev, p, size);
    else
      free(p);
    return dks_set_error(DK_RESOURCE_EXHAUSTED,
                         "%s: host out of memory allocating %zu bytes", fn,
                         size);
  }
  *ptr = p;
  return DK_OK;
}

DK_Status dks_host_free(int32_t dev, void *ptr) {
  dks_device *d;
  size_t size;
  DK_Status st = dks_device_get("host_free", dev, &d);
  if (st != DK_OK || !ptr) return st;
  pthread_mutex_lock(&d->mem_mu);
  bool live = dks_table_remove(&d->host, (uintptr_t)ptr, &size);
  pthread_mutex_unlock(&d->mem_mu);
  if (!live)
    return dks_set_error(DK_INVALID_ARGUMENT,
                         "host_free: %p is not a live host_alloc pointer of "
                         "%s device %d",
                         ptr, dks_name(), (int)d->index);
  if (dks_hooks.host_free)
    dks_hooks.host_free(dev, ptr, size);
  else
    free(ptr);
  return DK_OK;
}

/* ======================================================================== */
/* Copies                                                                    */
/* ======================================================================== */

/* Runs a copy or memset through its hook in stream order; a failure is the
 * item's (the stream's sticky error). */
static void run_copy(void *arg) {
  const dks_copy *c = arg;
  DK_Status st = (c->kind == DKS_MEMSET ? dks_hooks.memset : dks_hooks.copy)(c);
  if (st != DK_OK) dks_work_fail(st, "%s", dks_last_error());
}

/* Validates `stream` and queues the (already validated) copy on it; a
 * capturing stream's graph also records the operands on the copy's device,
 * checked at launch (a copy_p2p source, on another device, is not). */
static DK_Status submit_copy(const char *fn, dks_device *d, DK_Stream stream, dks_copy c) {
  dks_stream *s;
  DK_Status st = dks_stream_acquire(fn, d, stream, &s);
  if (st != DK_OK || c.size == 0) {
    dks_stream_release(s);
    return st;
  }
  dks_graph *g = dks_stream_capture(s);
  if (g && c.dst_mem) st = dks_graph_add_mem(g, c.dst_mem, c.dst_offset, c.size);
  if (g && c.src_mem && c.kind != DKS_COPY_P2P && st == DK_OK)
    st = dks_graph_add_mem(g, c.src_mem, c.src_offset, c.size);
  if (st != DK_OK) {
    dks_stream_release(s);
    return st;
  }
  dks_copy *a = dks_work_new(sizeof *a, run_copy, NULL);
  if (!a) {
    dks_stream_release(s);
    return dks_set_error(DK_RESOURCE_EXHAUSTED,
                         "%s: host out of memory queuing the copy", fn);
  }
  *a = c;
  a->device = d->index;
  dks_work_submit(s, a);
  dks_stream_release(s);
  return DK_OK;
}

DK_Status dks_memset(int32_t dev, DK_Mem mem, size_t offset, uint8_t value,
                     size_t size, DK_Stream stream) {
  static const char fn[] = "memset";
  dks_device *d;
  uint8_t *dst;
  DK_Status st = dks_device_get(fn, dev, &d);
  if (st == DK_OK) st = dks_mem_range(fn, "mem", d, mem, offset, size, &dst);
  if (st == DK_OK)
    st = submit_copy(fn, d, stream,
                     (dks_copy){.kind = DKS_MEMSET, .value = value, .dst_mem = mem,
                                .dst_offset = offset, .dst = dst, .size = size});
  return st;
}

DK_Status dks_copy_h2d(int32_t dev, DK_Mem dst, size_t dst_offset,
                       const void *src, size_t size, DK_Stream stream) {
  static const char fn[] = "copy_h2d";
  dks_device *d;
  uint8_t *to;
  DK_Status st = dks_device_get(fn, dev, &d);
  if (st != DK_OK) return st;
  if (!src && size)
    return dks_set_error(DK_INVALID_ARGUMENT, "%s: src is NULL", fn);
  if ((st = dks_mem_range(fn, "dst", d, dst, dst_offset, size, &to)) != DK_OK)
    return st;
  return submit_copy(fn, d, stream,
                     (dks_copy){.kind = DKS_COPY_H2D, .dst_mem = dst, .dst_offset = dst_offset,
                                .dst = to, .src = src, .size = size});
}

DK_Status dks_copy_d2h(int32_t dev, void *dst, DK_Mem src, size_t src_offset,
                       size_t size, DK_Stream stream) {
  static const char fn[] = "copy_d2h";
  dks_device *d;
  uint8_t *from;
  DK_Status st = dks_device_get(fn, dev, &d);
  if (st != DK_OK) return st;
  if (!dst && size)
    return dks_set_error(DK_INVALID_ARGUMENT, "%s: dst is NULL", fn);
  if ((st = dks_mem_range(fn, "src", d, src, src_offset, size, &from)) != DK_OK)
    return st;
  return submit_copy(fn, d, stream,
                     (dks_copy){.kind = DKS_COPY_D2H, .src_mem = src, .src_offset = src_offset,
                                .dst = dst, .src = from, .size = size});
}

DK_Status dks_copy_d2d(int32_t dev, DK_Mem dst, size_t dst_offset, DK_Mem src,
                       size_t src_offset, size_t size, DK_Stream stream) {
  static const char fn[] = "copy_d2d";
  dks_device *d;
  uint8_t *to, *from;
  DK_Status st = dks_device_get(fn, dev, &d);
  if (st == DK_OK) st = dks_mem_range(fn, "dst", d, dst, dst_offset, size, &to);
  if (st == DK_OK)
    st = dks_mem_range(fn, "src", d, src, src_offset, size, &from);
  if (st == DK_OK)
    st = submit_copy(fn, d, stream,
                     (dks_copy){.kind = DKS_COPY_D2D, .src_device = dev, .dst_mem = dst,
                                .dst_offset = dst_offset, .src_mem = src,
                                .src_offset = src_offset, .dst = to, .src = from, .size = size});
  return st;
}

DK_Status dks_copy_p2p(int32_t dst_dev, DK_Mem dst, size_t dst_offset,
                       int32_t src_dev, DK_Mem src, size_t src_offset,
                       size_t size, DK_Stream stream) {
  static const char fn[] = "copy_p2p";
  dks_device *dd, *sd;
  uint8_t *to, *from;
  DK_Status st = dks_device_get(fn, dst_dev, &dd);
  if (st == DK_OK) st = dks_device_get(fn, src_dev, &sd);
  if (st == DK_OK)
    st = dks_mem_range(fn, "dst", dd, dst, dst_offset, size, &to);
  if (st == DK_OK)
    st = dks_mem_range(fn, "src", sd, src, src_offset, size, &from);
  if (st == DK_OK)
    st = submit_copy(fn, dd, stream,
                     (dks_copy){.kind = DKS_COPY_P2P, .src_device = src_dev, .dst_mem = dst,
                                .dst_offset = dst_offset, .src_mem = src,
                                .src_offset = src_offset, .dst = to, .src = from, .size = size});
  return st;
}
