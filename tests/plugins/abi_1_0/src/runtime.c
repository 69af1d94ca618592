/*
 * runtime.c -- errors, registries, configuration, devices, memory and copies
 * of the devkit "acme" plugin. Streams and events live in stream.c.
 */
#define _GNU_SOURCE /* posix_memalign, sysconf(_SC_NPROCESSORS_ONLN) */

#include <inttypes.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "acme_internal.h"

/* ======================================================================== */
/* Errors                                                                    */
/* ======================================================================== */

static _Thread_local char t_error[1024];

DK_Status acme_set_error(DK_Status status, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(t_error, sizeof t_error, fmt, ap);
  va_end(ap);
  return status;
}

const char *acme_last_error(void) {
  return t_error[0] ? t_error : "no error";
}

void acme_copy_out(void *dst, const void *src, size_t src_size) {
  size_t n = *(const size_t *)dst;
  if (n > src_size) n = src_size;
  memcpy((char *)dst + sizeof(size_t), (const char *)src + sizeof(size_t),
         n - sizeof(size_t));
  *(size_t *)dst = n;
}

/* ======================================================================== */
/* Registry                                                                  */
/* ======================================================================== */

/* Handles are 64-byte aligned, so mix the bits (murmur3 finaliser) before
 * masking. */
static size_t table_home(uintptr_t key, size_t mask) {
  uint64_t x = key;
  x ^= x >> 33;
  x *= UINT64_C(0xff51afd7ed558ccd);
  x ^= x >> 33;
  return (size_t)x & mask;
}

/* Index of `key` in t, or t->capacity when absent. */
static size_t table_index(const acme_table *t, uintptr_t key) {
  if (key == 0 || t->capacity == 0) return t->capacity;
  size_t mask = t->capacity - 1;
  for (size_t i = table_home(key, mask); t->slots[i].key; i = (i + 1) & mask)
    if (t->slots[i].key == key) return i;
  return t->capacity;
}

bool acme_table_find(const acme_table *t, uintptr_t key, size_t *value) {
  size_t i = table_index(t, key);
  if (i == t->capacity) return false;
  if (value) *value = t->slots[i].value;
  return true;
}

static void table_place(acme_slot *slots, size_t mask, acme_slot slot) {
  size_t i = table_home(slot.key, mask);
  while (slots[i].key) i = (i + 1) & mask;
  slots[i] = slot;
}

bool acme_table_insert(acme_table *t, uintptr_t key, size_t value) {
  /* Keep the load factor <= 1/2 so probe sequences stay short. */
  if (2 * (t->count + 1) > t->capacity) {
    size_t capacity = t->capacity ? 2 * t->capacity : 16;
    acme_slot *slots = calloc(capacity, sizeof *slots);
    if (!slots) return false;
    for (size_t i = 0; i < t->capacity; i++)
      if (t->slots[i].key) table_place(slots, capacity - 1, t->slots[i]);
    free(t->slots);
    t->slots = slots;
    t->capacity = capacity;
  }
  table_place(t->slots, t->capacity - 1, (acme_slot){key, value});
  t->count++;
  return true;
}

bool acme_table_remove(acme_table *t, uintptr_t key, size_t *value) {
  size_t i = table_index(t, key);
  if (i == t->capacity) return false;
  if (value) *value = t->slots[i].value;
  /* Backward-shift deletion (no tombstones): pull later entries of the probe
   * run into the hole when the hole lies between their home and their slot. */
  size_t mask = t->capacity - 1;
  for (size_t j = (i + 1) & mask; t->slots[j].key; j = (j + 1) & mask) {
    size_t home = table_home(t->slots[j].key, mask);
    if (((j - home) & mask) >= ((j - i) & mask)) {
      t->slots[i] = t->slots[j];
      i = j;
    }
  }
  t->slots[i] = (acme_slot){0, 0};
  t->count--;
  return true;
}

/* ======================================================================== */
/* Configuration and devices                                                 */
/* ======================================================================== */

#define DEFAULT_DEVICES 2
#define DEFAULT_CAPACITY ((uint64_t)4 << 30)

static struct {
  int32_t num_devices;
  size_t capacity;        /* bytes per device */
  uint64_t fail_alloc;    /* ACME_FAIL_ALLOC; 0 = off */
  int32_t lost_device;    /* ACME_LOST_DEVICE; -1 = none */
  int32_t compute_units;
  DK_Status init_status;
  char init_error[1024];  /* message for init_status, replayed per thread */
} g;

static atomic_uint_fast64_t g_alloc_count; /* mem_alloc(_async) calls so far */
static acme_device g_devices[ACME_MAX_DEVICES];
static pthread_once_t g_once = PTHREAD_ONCE_INIT;

/* Parses leading decimal digits into *out; false when there are none or the
 * value overflows. *rest points past the digits. */
static bool parse_u64(const char *s, uint64_t *out, const char **rest) {
  if (*s < '0' || *s > '9') return false;
  uint64_t v = 0;
  for (; *s >= '0' && *s <= '9'; s++) {
    unsigned digit = (unsigned)(*s - '0');
    if (v > (UINT64_MAX - digit) / 10) return false;
    v = v * 10 + digit;
  }
  *out = v;
  *rest = s;
  return true;
}

static bool parse_int(const char *s, uint64_t lo, uint64_t hi, uint64_t *out) {
  const char *rest;
  return parse_u64(s, out, &rest) && *rest == '\0' && *out >= lo && *out <= hi;
}

static bool parse_bytes(const char *s, uint64_t *out) {
  static const struct {
    const char *suffix;
    unsigned shift;
  } units[] = {{"", 0},   {"K", 10},   {"KiB", 10}, {"M", 20},
               {"MiB", 20}, {"G", 30}, {"GiB", 30}};
  uint64_t v;
  const char *rest;
  if (!parse_u64(s, &v, &rest) || v == 0) return false;
  for (size_t i = 0; i < sizeof units / sizeof units[0]; i++) {
    if (strcmp(rest, units[i].suffix) != 0) continue;
    if (v > (SIZE_MAX >> units[i].shift)) return false;
    *out = v << units[i].shift;
    return true;
  }
  return false;
}

/* An unset or empty variable means "use the default". */
static const char *env(const char *name) {
  const char *v = getenv(name);
  return v && *v ? v : NULL;
}

static DK_Status config_error(const char *name, const char *value,
                              const char *expected) {
  snprintf(g.init_error, sizeof g.init_error,
           "DK_PluginInit: %s=\"%s\" is invalid: expected %s", name, value,
           expected);
  return DK_INVALID_ARGUMENT;
}

static DK_Status configure(void) {
  uint64_t v;
  const char *s;

  g.num_devices = DEFAULT_DEVICES;
  if ((s = env("ACME_NPU_COUNT"))) {
    if (!parse_int(s, 1, ACME_MAX_DEVICES, &v))
      return config_error("ACME_NPU_COUNT", s, "an integer in [1, 8]");
    g.num_devices = (int32_t)v;
  }

  g.capacity = (size_t)DEFAULT_CAPACITY;
  if ((s = env("ACME_MEMORY"))) {
    if (!parse_bytes(s, &v))
      return config_error("ACME_MEMORY", s,
                          "a positive byte count, optionally suffixed "
                          "K, M, G, KiB, MiB or GiB");
    g.capacity = (size_t)v;
  }

  g.fail_alloc = 0;
  if ((s = env("ACME_FAIL_ALLOC"))) {
    if (!parse_int(s, 1, UINT64_MAX, &v))
      return config_error("ACME_FAIL_ALLOC", s,
                          "a positive allocation number (1-based)");
    g.fail_alloc = v;
  }

  g.lost_device = -1;
  if ((s = env("ACME_LOST_DEVICE"))) {
    if (!parse_int(s, 0, (uint64_t)g.num_devices - 1, &v)) {
      char expected[64];
      snprintf(expected, sizeof expected, "a device index in [0, %d)",
               (int)g.num_devices);
      return config_error("ACME_LOST_DEVICE", s, expected);
    }
    g.lost_device = (int32_t)v;
  }

  long cpus = sysconf(_SC_NPROCESSORS_ONLN);
  g.compute_units = cpus < 1 ? 1 : cpus > INT32_MAX ? INT32_MAX : (int32_t)cpus;
  return DK_OK;
}

static void init_once(void) {
  g.init_status = configure();
  if (g.init_status != DK_OK) {
    g.num_devices = 0; /* the table stays callable but names no device */
    return;
  }
  for (int32_t i = 0; i < g.num_devices; i++) {
    acme_device *d = &g_devices[i];
    d->index = i;
    pthread_mutex_init(&d->mem_mu, NULL);
    pthread_mutex_init(&d->stream_mu, NULL);
    pthread_mutex_init(&d->event_mu, NULL);
  }
}

DK_Status acme_runtime_init(void) {
  pthread_once(&g_once, init_once);
  if (g.init_status != DK_OK)
    return acme_set_error(g.init_status, "%s", g.init_error);
  return DK_OK;
}

void acme_runtime_describe(char *buf, size_t size) {
  int n = snprintf(buf, size,
                   "Acme NPU plugin %s: %d NPU(s), %zu bytes of memory "
                   "each, %d compute units",
                   ACME_PLUGIN_VERSION, (int)g.num_devices, g.capacity,
                   (int)g.compute_units);
  if (n < 0 || (size_t)n >= size) return;
  if (g.fail_alloc)
    n += snprintf(buf + n, size - (size_t)n, ", ACME_FAIL_ALLOC=%" PRIu64,
                  g.fail_alloc);
  if (n < 0 || (size_t)n >= size) return;
  if (g.lost_device >= 0)
    snprintf(buf + n, size - (size_t)n, ", ACME_LOST_DEVICE=%d",
             (int)g.lost_device);
}

static DK_Status check_index(const char *fn, int32_t dev) {
  if (dev < 0 || dev >= g.num_devices)
    return acme_set_error(DK_INVALID_ARGUMENT,
                         "%s: device index %d out of range [0, %d)", fn,
                         (int)dev, (int)g.num_devices);
  return DK_OK;
}

DK_Status acme_device_get(const char *fn, int32_t dev, acme_device **out) {
  *out = NULL;
  DK_Status st = check_index(fn, dev);
  if (st != DK_OK) return st;
  if (dev == g.lost_device)
    return acme_set_error(DK_DEVICE_LOST,
                         "%s: acme device %d is lost (injected by "
                         "ACME_LOST_DEVICE=%d)",
                         fn, (int)dev, (int)dev);
  *out = &g_devices[dev];
  return DK_OK;
}

DK_Status acme_get_device_count(int32_t *count) {
  if (!count)
    return acme_set_error(DK_INVALID_ARGUMENT, "get_device_count: count is NULL");
  *count = g.num_devices;
  return DK_OK;
}

DK_Status acme_get_device_properties(int32_t dev, DK_DeviceProperties *props) {
  static const char fn[] = "get_device_properties";
  DK_Status st = check_index(fn, dev);
  if (st != DK_OK) return st;
  if (!props) return acme_set_error(DK_INVALID_ARGUMENT, "%s: props is NULL", fn);
  if (props->struct_size < sizeof(size_t))
    return acme_set_error(DK_INVALID_ARGUMENT,
                         "%s: props->struct_size %zu is smaller than the "
                         "struct_size field itself",
                         fn, props->struct_size);
  DK_DeviceProperties p = {
      .struct_size = sizeof p,
      .device_type = ACME_DEVICE_TYPE,
      .compute_units = g.compute_units,
      .total_memory = g.capacity,
      .max_alloc_size = g.capacity,
      .alloc_alignment = ACME_ALLOC_ALIGNMENT,
      .flags = DK_DEVICE_FP64 | DK_DEVICE_FP16 | DK_DEVICE_BF16 |
               DK_DEVICE_UNIFIED_MEMORY | DK_DEVICE_HOST_POINTER_HANDLES,
  };
  snprintf(p.name, sizeof p.name, "Acme NPU %d", (int)dev);
  snprintf(p.vendor, sizeof p.vendor, "Acme Corporation");
  snprintf(p.driver_version, sizeof p.driver_version,
           "acme-npu-simulator " ACME_PLUGIN_VERSION);
  acme_copy_out(props, &p, sizeof p);
  return DK_OK;
}

/* ======================================================================== */
/* Memory                                                                    */
/* ======================================================================== */

static DK_Status alloc_on(const char *fn, acme_device *d, size_t size,
                          DK_Mem *mem) {
  if (!mem) return acme_set_error(DK_INVALID_ARGUMENT, "%s: mem is NULL", fn);
  if (g.fail_alloc) {
    uint64_t n = atomic_fetch_add(&g_alloc_count, 1) + 1;
    if (n == g.fail_alloc)
      return acme_set_error(DK_RESOURCE_EXHAUSTED,
                           "%s: allocation #%" PRIu64 " (%zu bytes on acme "
                           "device %d) failed, injected by "
                           "ACME_FAIL_ALLOC=%" PRIu64,
                           fn, n, size, (int)d->index, g.fail_alloc);
  }

  /* Reserve capacity first so an oversized request never reaches malloc. */
  pthread_mutex_lock(&d->mem_mu);
  size_t free_bytes = g.capacity - d->used;
  if (size > free_bytes) {
    pthread_mutex_unlock(&d->mem_mu);
    return acme_set_error(DK_RESOURCE_EXHAUSTED,
                         "%s: cannot allocate %zu bytes on acme device %d: "
                         "%zu bytes free of %zu capacity",
                         fn, size, (int)d->index, free_bytes, g.capacity);
  }
  d->used += size;
  pthread_mutex_unlock(&d->mem_mu);

  /* size 0 still needs a unique, freeable handle: back it with one byte. */
  void *p = NULL;
  bool ok = posix_memalign(&p, ACME_ALLOC_ALIGNMENT, size ? size : 1) == 0;
  pthread_mutex_lock(&d->mem_mu);
  if (ok && !acme_table_insert(&d->mems, (uintptr_t)p, size)) ok = false;
  if (!ok) d->used -= size;
  pthread_mutex_unlock(&d->mem_mu);
  if (!ok) {
    free(p);
    return acme_set_error(DK_RESOURCE_EXHAUSTED,
                         "%s: host out of memory allocating %zu bytes for acme "
                         "device %d",
                         fn, size, (int)d->index);
  }
  *mem = (DK_Mem)p;
  return DK_OK;
}

DK_Status acme_mem_alloc(int32_t dev, size_t size, DK_Mem *mem) {
  acme_device *d;
  DK_Status st = acme_device_get("mem_alloc", dev, &d);
  return st != DK_OK ? st : alloc_on("mem_alloc", d, size, mem);
}

/* Allocation is immediate, so the memory is usable by any later work. */
DK_Status acme_mem_alloc_async(int32_t dev, size_t size, DK_Stream stream,
                              DK_Mem *mem) {
  static const char fn[] = "mem_alloc_async";
  acme_device *d;
  acme_stream *s;
  DK_Status st = acme_device_get(fn, dev, &d);
  if (st != DK_OK) return st;
  if ((st = acme_stream_acquire(fn, d, stream, &s)) != DK_OK) return st;
  acme_stream_release(s);
  return alloc_on(fn, d, size, mem);
}

/* Removes `mem` from the live registry; its capacity stays counted until
 * release_capacity. */
static DK_Status unregister_mem(const char *fn, acme_device *d, DK_Mem mem,
                                size_t *size) {
  pthread_mutex_lock(&d->mem_mu);
  bool live = acme_table_remove(&d->mems, (uintptr_t)mem, size);
  pthread_mutex_unlock(&d->mem_mu);
  if (!live)
    return acme_set_error(DK_INVALID_ARGUMENT,
                         "%s: handle %p is not a live allocation on acme "
                         "device %d",
                         fn, (void *)mem, (int)d->index);
  return DK_OK;
}

static void release_capacity(acme_device *d, size_t size) {
  pthread_mutex_lock(&d->mem_mu);
  d->used -= size;
  pthread_mutex_unlock(&d->mem_mu);
}

DK_Status acme_mem_free(int32_t dev, DK_Mem mem) {
  acme_device *d;
  size_t size;
  DK_Status st = acme_device_get("mem_free", dev, &d);
  if (st != DK_OK || !mem) return st;
  if ((st = unregister_mem("mem_free", d, mem, &size)) != DK_OK) return st;
  free(mem);
  release_capacity(d, size);
  return DK_OK;
}

typedef struct free_args {
  acme_device *device;
  void *ptr;
  size_t size;
} free_args;

static void run_free(void *arg) {
  free_args *a = arg;
  free(a->ptr);
  release_capacity(a->device, a->size);
}

DK_Status acme_mem_free_async(int32_t dev, DK_Mem mem, DK_Stream stream) {
  static const char fn[] = "mem_free_async";
  acme_device *d;
  acme_stream *s;
  DK_Status st = acme_device_get(fn, dev, &d);
  if (st != DK_OK) return st;
  if ((st = acme_stream_acquire(fn, d, stream, &s)) != DK_OK) return st;
  if (!mem) {
    acme_stream_release(s);
    return DK_OK;
  }
  /* Allocate the work item before unregistering, so that a failure leaves
   * the handle live. */
  free_args *a = acme_work_new(sizeof *a, run_free, NULL);
  if (!a) {
    acme_stream_release(s);
    return acme_set_error(DK_RESOURCE_EXHAUSTED,
                         "%s: host out of memory queuing the free", fn);
  }
  if ((st = unregister_mem(fn, d, mem, &a->size)) != DK_OK) {
    acme_work_discard(a);
    acme_stream_release(s);
    return st;
  }
  a->device = d;
  a->ptr = mem;
  acme_work_submit(s, a);
  acme_stream_release(s);
  return DK_OK;
}

DK_Status acme_mem_get_info(int32_t dev, size_t *free_bytes,
                           size_t *total_bytes) {
  static const char fn[] = "mem_get_info";
  acme_device *d;
  DK_Status st = acme_device_get(fn, dev, &d);
  if (st != DK_OK) return st;
  if (!free_bytes)
    return acme_set_error(DK_INVALID_ARGUMENT, "%s: free_bytes is NULL", fn);
  if (!total_bytes)
    return acme_set_error(DK_INVALID_ARGUMENT, "%s: total_bytes is NULL", fn);
  pthread_mutex_lock(&d->mem_mu);
  *free_bytes = g.capacity - d->used;
  pthread_mutex_unlock(&d->mem_mu);
  *total_bytes = g.capacity;
  return DK_OK;
}

DK_Status acme_mem_range(const char *fn, const char *what, acme_device *d,
                        DK_Mem mem, size_t offset, size_t size,
                        uint8_t **addr) {
  *addr = NULL;
  if (!mem)
    return acme_set_error(DK_INVALID_ARGUMENT, "%s: %s handle is NULL", fn, what);
  size_t alloc_size;
  pthread_mutex_lock(&d->mem_mu);
  bool live = acme_table_find(&d->mems, (uintptr_t)mem, &alloc_size);
  pthread_mutex_unlock(&d->mem_mu);
  if (!live)
    return acme_set_error(DK_INVALID_ARGUMENT,
                         "%s: %s handle %p is not a live allocation on acme "
                         "device %d",
                         fn, what, (void *)mem, (int)d->index);
  if (offset > alloc_size || size > alloc_size - offset)
    return acme_set_error(DK_OUT_OF_RANGE,
                         "%s: %s range [offset %zu, +%zu) exceeds the "
                         "%zu-byte allocation",
                         fn, what, offset, size, alloc_size);
  *addr = (uint8_t *)mem + offset;
  return DK_OK;
}

DK_Status acme_host_alloc(int32_t dev, size_t size, void **ptr) {
  static const char fn[] = "host_alloc";
  acme_device *d;
  DK_Status st = acme_device_get(fn, dev, &d);
  if (st != DK_OK) return st;
  if (!ptr) return acme_set_error(DK_INVALID_ARGUMENT, "%s: ptr is NULL", fn);
  void *p = NULL;
  bool ok = posix_memalign(&p, ACME_ALLOC_ALIGNMENT, size ? size : 1) == 0;
  if (ok) {
    pthread_mutex_lock(&d->mem_mu);
    ok = acme_table_insert(&d->host, (uintptr_t)p, size);
    pthread_mutex_unlock(&d->mem_mu);
  }
  if (!ok) {
    free(p);
    return acme_set_error(DK_RESOURCE_EXHAUSTED,
                         "%s: host out of memory allocating %zu bytes", fn,
                         size);
  }
  *ptr = p;
  return DK_OK;
}

DK_Status acme_host_free(int32_t dev, void *ptr) {
  acme_device *d;
  DK_Status st = acme_device_get("host_free", dev, &d);
  if (st != DK_OK || !ptr) return st;
  pthread_mutex_lock(&d->mem_mu);
  bool live = acme_table_remove(&d->host, (uintptr_t)ptr, NULL);
  pthread_mutex_unlock(&d->mem_mu);
  if (!live)
    return acme_set_error(DK_INVALID_ARGUMENT,
                         "host_free: %p is not a live host_alloc pointer of "
                         "acme device %d",
                         ptr, (int)d->index);
  free(ptr);
  return DK_OK;
}

/* ======================================================================== */
/* Copies                                                                    */
/* ======================================================================== */

typedef struct copy_args {
  uint8_t *dst;
  const void *src; /* NULL: fill dst with value */
  size_t size;
  uint8_t value;
} copy_args;

/* memmove throughout: handles are host pointers, so even an h2d source may
 * alias the destination allocation. */
static void run_copy(void *arg) {
  copy_args *a = arg;
  if (a->src)
    memmove(a->dst, a->src, a->size);
  else
    memset(a->dst, a->value, a->size);
}

/* Validates `stream` and queues the (already validated) copy on it. */
static DK_Status submit_copy(const char *fn, acme_device *d, DK_Stream stream,
                             uint8_t *dst, const void *src, uint8_t value,
                             size_t size) {
  acme_stream *s;
  DK_Status st = acme_stream_acquire(fn, d, stream, &s);
  if (st != DK_OK || size == 0) {
    acme_stream_release(s);
    return st;
  }
  copy_args *a = acme_work_new(sizeof *a, run_copy, NULL);
  if (!a) {
    acme_stream_release(s);
    return acme_set_error(DK_RESOURCE_EXHAUSTED,
                         "%s: host out of memory queuing the copy", fn);
  }
  *a = (copy_args){dst, src, size, value};
  acme_work_submit(s, a);
  acme_stream_release(s);
  return DK_OK;
}

DK_Status acme_memset(int32_t dev, DK_Mem mem, size_t offset, uint8_t value,
                     size_t size, DK_Stream stream) {
  static const char fn[] = "memset";
  acme_device *d;
  uint8_t *dst;
  DK_Status st = acme_device_get(fn, dev, &d);
  if (st == DK_OK) st = acme_mem_range(fn, "mem", d, mem, offset, size, &dst);
  if (st == DK_OK) st = submit_copy(fn, d, stream, dst, NULL, value, size);
  return st;
}

DK_Status acme_copy_h2d(int32_t dev, DK_Mem dst, size_t dst_offset,
                       const void *src, size_t size, DK_Stream stream) {
  static const char fn[] = "copy_h2d";
  acme_device *d;
  uint8_t *to;
  DK_Status st = acme_device_get(fn, dev, &d);
  if (st != DK_OK) return st;
  if (!src && size)
    return acme_set_error(DK_INVALID_ARGUMENT, "%s: src is NULL", fn);
  if ((st = acme_mem_range(fn, "dst", d, dst, dst_offset, size, &to)) != DK_OK)
    return st;
  return submit_copy(fn, d, stream, to, src, 0, size);
}

DK_Status acme_copy_d2h(int32_t dev, void *dst, DK_Mem src, size_t src_offset,
                       size_t size, DK_Stream stream) {
  static const char fn[] = "copy_d2h";
  acme_device *d;
  uint8_t *from;
  DK_Status st = acme_device_get(fn, dev, &d);
  if (st != DK_OK) return st;
  if (!dst && size)
    return acme_set_error(DK_INVALID_ARGUMENT, "%s: dst is NULL", fn);
  if ((st = acme_mem_range(fn, "src", d, src, src_offset, size, &from)) != DK_OK)
    return st;
  return submit_copy(fn, d, stream, dst, from, 0, size);
}

DK_Status acme_copy_d2d(int32_t dev, DK_Mem dst, size_t dst_offset, DK_Mem src,
                       size_t src_offset, size_t size, DK_Stream stream) {
  static const char fn[] = "copy_d2d";
  acme_device *d;
  uint8_t *to, *from;
  DK_Status st = acme_device_get(fn, dev, &d);
  if (st == DK_OK) st = acme_mem_range(fn, "dst", d, dst, dst_offset, size, &to);
  if (st == DK_OK)
    st = acme_mem_range(fn, "src", d, src, src_offset, size, &from);
  if (st == DK_OK) st = submit_copy(fn, d, stream, to, from, 0, size);
  return st;
}

DK_Status acme_copy_p2p(int32_t dst_dev, DK_Mem dst, size_t dst_offset,
                       int32_t src_dev, DK_Mem src, size_t src_offset,
                       size_t size, DK_Stream stream) {
  static const char fn[] = "copy_p2p";
  acme_device *dd, *sd;
  uint8_t *to, *from;
  DK_Status st = acme_device_get(fn, dst_dev, &dd);
  if (st == DK_OK) st = acme_device_get(fn, src_dev, &sd);
  if (st == DK_OK)
    st = acme_mem_range(fn, "dst", dd, dst, dst_offset, size, &to);
  if (st == DK_OK)
    st = acme_mem_range(fn, "src", sd, src, src_offset, size, &from);
  if (st == DK_OK) st = submit_copy(fn, dd, stream, to, from, 0, size);
  return st;
}
