/*
 * runtime.c -- errors, registries, configuration, devices, memory and copies
 * of the devkit "cpu" reference plugin. Streams and events live in stream.c.
 */
#define _GNU_SOURCE /* posix_memalign, sysconf(_SC_NPROCESSORS_ONLN), sched_getaffinity */

#include <sched.h>

#include <inttypes.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "cpu_internal.h"
#include "kernel.h" /* cpu_parallel_for: large copies */

/* ======================================================================== */
/* Errors                                                                    */
/* ======================================================================== */

static _Thread_local char t_error[1024];

DK_Status cpu_set_error(DK_Status status, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(t_error, sizeof t_error, fmt, ap);
  va_end(ap);
  return status;
}

const char *cpu_last_error(void) {
  return t_error[0] ? t_error : "no error";
}

void cpu_copy_out(void *dst, const void *src, size_t src_size) {
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
static size_t table_index(const cpu_table *t, uintptr_t key) {
  if (key == 0 || t->capacity == 0) return t->capacity;
  size_t mask = t->capacity - 1;
  for (size_t i = table_home(key, mask); t->slots[i].key; i = (i + 1) & mask)
    if (t->slots[i].key == key) return i;
  return t->capacity;
}

bool cpu_table_find(const cpu_table *t, uintptr_t key, size_t *value) {
  size_t i = table_index(t, key);
  if (i == t->capacity) return false;
  if (value) *value = t->slots[i].value;
  return true;
}

static void table_place(cpu_slot *slots, size_t mask, cpu_slot slot) {
  size_t i = table_home(slot.key, mask);
  while (slots[i].key) i = (i + 1) & mask;
  slots[i] = slot;
}

bool cpu_table_insert(cpu_table *t, uintptr_t key, size_t value) {
  /* Keep the load factor <= 1/2 so probe sequences stay short. */
  if (2 * (t->count + 1) > t->capacity) {
    size_t capacity = t->capacity ? 2 * t->capacity : 16;
    cpu_slot *slots = calloc(capacity, sizeof *slots);
    if (!slots) return false;
    for (size_t i = 0; i < t->capacity; i++)
      if (t->slots[i].key) table_place(slots, capacity - 1, t->slots[i]);
    free(t->slots);
    t->slots = slots;
    t->capacity = capacity;
  }
  table_place(t->slots, t->capacity - 1, (cpu_slot){key, value});
  t->count++;
  return true;
}

bool cpu_table_remove(cpu_table *t, uintptr_t key, size_t *value) {
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
  t->slots[i] = (cpu_slot){0, 0};
  t->count--;
  return true;
}

/* ======================================================================== */
/* Configuration and devices                                                 */
/* ======================================================================== */

#define DEFAULT_DEVICES 2
#define DEFAULT_CAPACITY ((uint64_t)4 << 30)
/* A plan's kernels follow each other a few microseconds apart: a worker
 * that waits this long after a job takes the next one without a wake-up,
 * and an idle pool stops spinning this soon. */
#define DEFAULT_SPIN_US 50

static struct {
  int32_t num_devices;
  size_t capacity;        /* bytes per device */
  uint64_t fail_alloc;    /* DEVKIT_CPU_FAIL_ALLOC; 0 = off */
  int32_t lost_device;    /* DEVKIT_CPU_LOST_DEVICE; -1 = none */
  bool primitives_only;   /* DEVKIT_CPU_KERNELS=primitives */
  int32_t compute_units;
  int32_t threads;        /* DEVKIT_CPU_THREADS: the kernels' thread budget */
  int64_t spin_ns;        /* DEVKIT_CPU_SPIN_US: a pool worker's wait before it sleeps */
  DK_Status init_status;
  char init_error[1024];  /* message for init_status, replayed per thread */
} g;

static atomic_uint_fast64_t g_alloc_count; /* mem_alloc(_async) calls so far */
static cpu_device g_devices[CPU_MAX_DEVICES];
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
  if ((s = env("DEVKIT_CPU_DEVICES"))) {
    if (!parse_int(s, 1, CPU_MAX_DEVICES, &v))
      return config_error("DEVKIT_CPU_DEVICES", s, "an integer in [1, 64]");
    g.num_devices = (int32_t)v;
  }

  g.capacity = (size_t)DEFAULT_CAPACITY;
  if ((s = env("DEVKIT_CPU_MEMORY"))) {
    if (!parse_bytes(s, &v))
      return config_error("DEVKIT_CPU_MEMORY", s,
                          "a positive byte count, optionally suffixed "
                          "K, M, G, KiB, MiB or GiB");
    g.capacity = (size_t)v;
  }

  g.fail_alloc = 0;
  if ((s = env("DEVKIT_CPU_FAIL_ALLOC"))) {
    if (!parse_int(s, 1, UINT64_MAX, &v))
      return config_error("DEVKIT_CPU_FAIL_ALLOC", s,
                          "a positive allocation number (1-based)");
    g.fail_alloc = v;
  }

  g.lost_device = -1;
  if ((s = env("DEVKIT_CPU_LOST_DEVICE"))) {
    if (!parse_int(s, 0, (uint64_t)g.num_devices - 1, &v)) {
      char expected[64];
      snprintf(expected, sizeof expected, "a device index in [0, %d)",
               (int)g.num_devices);
      return config_error("DEVKIT_CPU_LOST_DEVICE", s, expected);
    }
    g.lost_device = (int32_t)v;
  }

  g.primitives_only = false;
  if ((s = env("DEVKIT_CPU_KERNELS"))) {
    if (strcmp(s, "primitives") != 0 && strcmp(s, "all") != 0)
      return config_error("DEVKIT_CPU_KERNELS", s, "all or primitives");
    g.primitives_only = strcmp(s, "primitives") == 0;
  }

  long cpus = sysconf(_SC_NPROCESSORS_ONLN);
  g.compute_units = cpus < 1 ? 1 : cpus > INT32_MAX ? INT32_MAX : (int32_t)cpus;

  /* The cores this process may run on (taskset, cgroup cpusets), not the
   * machine's: more threads than those only take turns. */
  unsigned long usable[1024 / (8 * sizeof(unsigned long))]; /* a cpu_set_t's bits */
  g.threads = 0;
  if (sched_getaffinity(0, sizeof usable, (void *)usable) == 0)
    for (size_t i = 0; i < sizeof usable / sizeof usable[0]; i++) g.threads += __builtin_popcountl(usable[i]);
  else
    g.threads = g.compute_units;
  if (g.threads < 1) g.threads = 1;
  if (g.threads > CPU_MAX_THREADS) g.threads = CPU_MAX_THREADS;
  if ((s = env("DEVKIT_CPU_THREADS"))) {
    if (!parse_int(s, 1, CPU_MAX_THREADS, &v))
      return config_error("DEVKIT_CPU_THREADS", s, "an integer in [1, 256]");
    g.threads = (int32_t)v;
  }
  g.spin_ns = DEFAULT_SPIN_US * 1000;
  if ((s = env("DEVKIT_CPU_SPIN_US"))) {
    if (!parse_int(s, 0, 100000, &v))
      return config_error("DEVKIT_CPU_SPIN_US", s, "an integer in [0, 100000]");
    g.spin_ns = (int64_t)v * 1000;
  }
  return DK_OK;
}

static void init_once(void) {
  g.init_status = configure();
  if (g.init_status != DK_OK) {
    g.num_devices = 0; /* the table stays callable but names no device */
    return;
  }
  for (int32_t i = 0; i < g.num_devices; i++) {
    cpu_device *d = &g_devices[i];
    d->index = i;
    pthread_mutex_init(&d->mem_mu, NULL);
    pthread_mutex_init(&d->stream_mu, NULL);
    pthread_mutex_init(&d->event_mu, NULL);
    pthread_mutex_init(&d->graph_mu, NULL);
  }
}

bool cpu_primitives_only(void) { return g.primitives_only; }

int32_t cpu_thread_count(void) { return g.threads; }

int64_t cpu_spin_ns(void) { return g.spin_ns; }

DK_Status cpu_runtime_init(void) {
  pthread_once(&g_once, init_once);
  if (g.init_status != DK_OK)
    return cpu_set_error(g.init_status, "%s", g.init_error);
  return DK_OK;
}

void cpu_runtime_describe(char *buf, size_t size) {
  int n = snprintf(buf, size,
                   "devkit cpu plugin %s: %d device(s), %zu bytes of memory "
                   "each, %d compute units, %d kernel threads (spin %d us)",
                   CPU_PLUGIN_VERSION, (int)g.num_devices, g.capacity,
                   (int)g.compute_units, (int)g.threads, (int)(g.spin_ns / 1000));
  if (n < 0 || (size_t)n >= size) return;
  if (g.fail_alloc)
    n += snprintf(buf + n, size - (size_t)n, ", DEVKIT_CPU_FAIL_ALLOC=%" PRIu64,
                  g.fail_alloc);
  if (n < 0 || (size_t)n >= size) return;
  if (g.lost_device >= 0)
    snprintf(buf + n, size - (size_t)n, ", DEVKIT_CPU_LOST_DEVICE=%d",
             (int)g.lost_device);
}

static DK_Status check_index(const char *fn, int32_t dev) {
  if (dev < 0 || dev >= g.num_devices)
    return cpu_set_error(DK_INVALID_ARGUMENT,
                         "%s: device index %d out of range [0, %d)", fn,
                         (int)dev, (int)g.num_devices);
  return DK_OK;
}

DK_Status cpu_device_get(const char *fn, int32_t dev, cpu_device **out) {
  *out = NULL;
  DK_Status st = check_index(fn, dev);
  if (st != DK_OK) return st;
  if (dev == g.lost_device)
    return cpu_set_error(DK_DEVICE_LOST,
                         "%s: cpu device %d is lost (injected by "
                         "DEVKIT_CPU_LOST_DEVICE=%d)",
                         fn, (int)dev, (int)dev);
  *out = &g_devices[dev];
  return DK_OK;
}

DK_Status cpu_get_device_count(int32_t *count) {
  if (!count)
    return cpu_set_error(DK_INVALID_ARGUMENT, "get_device_count: count is NULL");
  *count = g.num_devices;
  return DK_OK;
}

DK_Status cpu_get_device_properties(int32_t dev, DK_DeviceProperties *props) {
  static const char fn[] = "get_device_properties";
  DK_Status st = check_index(fn, dev);
  if (st != DK_OK) return st;
  if (!props) return cpu_set_error(DK_INVALID_ARGUMENT, "%s: props is NULL", fn);
  if (props->struct_size < sizeof(size_t))
    return cpu_set_error(DK_INVALID_ARGUMENT,
                         "%s: props->struct_size %zu is smaller than the "
                         "struct_size field itself",
                         fn, props->struct_size);
  DK_DeviceProperties p = {
      .struct_size = sizeof p,
      .device_type = DK_DEVICE_TYPE_CPU,
      .compute_units = g.compute_units,
      .total_memory = g.capacity,
      .max_alloc_size = g.capacity,
      .alloc_alignment = CPU_ALLOC_ALIGNMENT,
      .flags = DK_DEVICE_FP64 | DK_DEVICE_FP16 | DK_DEVICE_BF16 |
               DK_DEVICE_UNIFIED_MEMORY | DK_DEVICE_HOST_POINTER_HANDLES,
  };
  snprintf(p.name, sizeof p.name, "devkit cpu device %d", (int)dev);
  snprintf(p.vendor, sizeof p.vendor, "devkit reference");
  snprintf(p.driver_version, sizeof p.driver_version, CPU_PLUGIN_VERSION);
  cpu_copy_out(props, &p, sizeof p);
  return DK_OK;
}

/* ======================================================================== */
/* Memory                                                                    */
/* ======================================================================== */

static DK_Status alloc_on(const char *fn, cpu_device *d, size_t size,
                          DK_Mem *mem) {
  if (!mem) return cpu_set_error(DK_INVALID_ARGUMENT, "%s: mem is NULL", fn);
  if (g.fail_alloc) {
    uint64_t n = atomic_fetch_add(&g_alloc_count, 1) + 1;
    if (n == g.fail_alloc)
      return cpu_set_error(DK_RESOURCE_EXHAUSTED,
                           "%s: allocation #%" PRIu64 " (%zu bytes on cpu "
                           "device %d) failed, injected by "
                           "DEVKIT_CPU_FAIL_ALLOC=%" PRIu64,
                           fn, n, size, (int)d->index, g.fail_alloc);
  }

  /* Reserve capacity first so an oversized request never reaches malloc. */
  pthread_mutex_lock(&d->mem_mu);
  size_t free_bytes = g.capacity - d->used;
  if (size > free_bytes) {
    pthread_mutex_unlock(&d->mem_mu);
    return cpu_set_error(DK_RESOURCE_EXHAUSTED,
                         "%s: cannot allocate %zu bytes on cpu device %d: "
                         "%zu bytes free of %zu capacity",
                         fn, size, (int)d->index, free_bytes, g.capacity);
  }
  d->used += size;
  pthread_mutex_unlock(&d->mem_mu);

  /* size 0 still needs a unique, freeable handle: back it with one byte.
   * Large buffers ask for transparent huge pages, as NumPy's do: first touch
   * of 64 MiB then takes 32 page faults instead of 16384. */
  void *p = NULL;
  bool huge = size >= 2 * CPU_HUGE_PAGE;
  bool ok = posix_memalign(&p, huge ? CPU_HUGE_PAGE : CPU_ALLOC_ALIGNMENT, size ? size : 1) == 0;
  if (ok && huge) madvise(p, size, MADV_HUGEPAGE); /* advice only: failure is harmless */
  pthread_mutex_lock(&d->mem_mu);
  if (ok && !cpu_table_insert(&d->mems, (uintptr_t)p, size)) ok = false;
  if (!ok) d->used -= size;
  pthread_mutex_unlock(&d->mem_mu);
  if (!ok) {
    free(p);
    return cpu_set_error(DK_RESOURCE_EXHAUSTED,
                         "%s: host out of memory allocating %zu bytes for cpu "
                         "device %d",
                         fn, size, (int)d->index);
  }
  *mem = (DK_Mem)p;
  return DK_OK;
}

DK_Status cpu_mem_alloc(int32_t dev, size_t size, DK_Mem *mem) {
  cpu_device *d;
  DK_Status st = cpu_device_get("mem_alloc", dev, &d);
  return st != DK_OK ? st : alloc_on("mem_alloc", d, size, mem);
}

/* Allocation is immediate, so the memory is usable by any later work. */
DK_Status cpu_mem_alloc_async(int32_t dev, size_t size, DK_Stream stream,
                              DK_Mem *mem) {
  static const char fn[] = "mem_alloc_async";
  cpu_device *d;
  cpu_stream *s;
  DK_Status st = cpu_device_get(fn, dev, &d);
  if (st != DK_OK) return st;
  if ((st = cpu_stream_acquire(fn, d, stream, &s)) != DK_OK) return st;
  if (cpu_stream_capture(s)) st = cpu_capture_refused(fn, s);
  cpu_stream_release(s);
  return st != DK_OK ? st : alloc_on(fn, d, size, mem);
}

/* Removes `mem` from the live registry; its capacity stays counted until
 * release_capacity. */
static DK_Status unregister_mem(const char *fn, cpu_device *d, DK_Mem mem,
                                size_t *size) {
  pthread_mutex_lock(&d->mem_mu);
  bool registered = cpu_table_find(&d->registered, (uintptr_t)mem, NULL);
  bool live = !registered && cpu_table_remove(&d->mems, (uintptr_t)mem, size);
  pthread_mutex_unlock(&d->mem_mu);
  if (registered)
    return cpu_set_error(DK_INVALID_ARGUMENT,
                         "%s: handle %p is host memory registered with "
                         "mem_register_host on cpu device %d: end it with "
                         "mem_unregister_host",
                         fn, (void *)mem, (int)d->index);
  if (!live)
    return cpu_set_error(DK_INVALID_ARGUMENT,
                         "%s: handle %p is not a live allocation on cpu "
                         "device %d",
                         fn, (void *)mem, (int)d->index);
  return DK_OK;
}

static void release_capacity(cpu_device *d, size_t size) {
  pthread_mutex_lock(&d->mem_mu);
  d->used -= size;
  pthread_mutex_unlock(&d->mem_mu);
}

DK_Status cpu_mem_free(int32_t dev, DK_Mem mem) {
  cpu_device *d;
  size_t size;
  DK_Status st = cpu_device_get("mem_free", dev, &d);
  if (st != DK_OK || !mem) return st;
  if ((st = cpu_device_capture_check("mem_free", d)) != DK_OK) return st;
  if ((st = unregister_mem("mem_free", d, mem, &size)) != DK_OK) return st;
#ifndef DEVKIT_DEFECT_LEAK
  free(mem);
  release_capacity(d, size);
#endif
  return DK_OK;
}

typedef struct free_args {
  cpu_device *device;
  void *ptr;
  size_t size;
} free_args;

static void run_free(void *arg) {
  free_args *a = arg;
  free(a->ptr);
  release_capacity(a->device, a->size);
}

DK_Status cpu_mem_free_async(int32_t dev, DK_Mem mem, DK_Stream stream) {
  static const char fn[] = "mem_free_async";
  cpu_device *d;
  cpu_stream *s;
  DK_Status st = cpu_device_get(fn, dev, &d);
  if (st != DK_OK) return st;
  if ((st = cpu_stream_acquire(fn, d, stream, &s)) != DK_OK) return st;
  if (!mem || cpu_stream_capture(s)) {
    st = mem ? cpu_capture_refused(fn, s) : DK_OK;
    cpu_stream_release(s);
    return st;
  }
  /* Allocate the work item before unregistering, so that a failure leaves
   * the handle live. */
  free_args *a = cpu_work_new(sizeof *a, run_free, NULL);
  if (!a) {
    cpu_stream_release(s);
    return cpu_set_error(DK_RESOURCE_EXHAUSTED,
                         "%s: host out of memory queuing the free", fn);
  }
  if ((st = unregister_mem(fn, d, mem, &a->size)) != DK_OK) {
    cpu_work_discard(a);
    cpu_stream_release(s);
    return st;
  }
  a->device = d;
  a->ptr = mem;
  cpu_work_submit(s, a);
  cpu_stream_release(s);
  return DK_OK;
}

DK_Status cpu_mem_get_info(int32_t dev, size_t *free_bytes,
                           size_t *total_bytes) {
  static const char fn[] = "mem_get_info";
  cpu_device *d;
  DK_Status st = cpu_device_get(fn, dev, &d);
  if (st != DK_OK) return st;
  if (!free_bytes)
    return cpu_set_error(DK_INVALID_ARGUMENT, "%s: free_bytes is NULL", fn);
  if (!total_bytes)
    return cpu_set_error(DK_INVALID_ARGUMENT, "%s: total_bytes is NULL", fn);
  pthread_mutex_lock(&d->mem_mu);
  *free_bytes = g.capacity - d->used;
  pthread_mutex_unlock(&d->mem_mu);
  *total_bytes = g.capacity;
  return DK_OK;
}

/* The handle is the host pointer itself (DK_DEVICE_HOST_POINTER_HANDLES),
 * entered in the live registry so that every check that accepts an
 * allocation accepts it, and in `registered` so that mem_free refuses it. */
DK_Status cpu_mem_register_host(int32_t dev, void *ptr, size_t size,
                                DK_Mem *mem) {
  static const char fn[] = "mem_register_host";
  cpu_device *d;
  DK_Status st = cpu_device_get(fn, dev, &d);
  if (st != DK_OK) return st;
  if (!ptr) return cpu_set_error(DK_INVALID_ARGUMENT, "%s: ptr is NULL", fn);
  if (!mem) return cpu_set_error(DK_INVALID_ARGUMENT, "%s: mem is NULL", fn);
  if (!size)
    return cpu_set_error(DK_INVALID_ARGUMENT, "%s: size is 0 (a registration "
                         "needs at least one byte)", fn);
  if ((uintptr_t)ptr > UINTPTR_MAX - size)
    return cpu_set_error(DK_OUT_OF_RANGE, "%s: %p + %zu bytes wraps around "
                         "the address space", fn, ptr, size);
  pthread_mutex_lock(&d->mem_mu);
  bool exists = cpu_table_find(&d->mems, (uintptr_t)ptr, NULL);
  bool ok = !exists && cpu_table_insert(&d->mems, (uintptr_t)ptr, size);
  if (ok && !cpu_table_insert(&d->registered, (uintptr_t)ptr, size)) {
    cpu_table_remove(&d->mems, (uintptr_t)ptr, NULL);
    ok = false;
  }
  pthread_mutex_unlock(&d->mem_mu);
  if (exists)
    return cpu_set_error(DK_ALREADY_EXISTS,
                         "%s: %p is already a live handle of cpu device %d "
                         "(an allocation or a registration): use it", fn, ptr,
                         (int)d->index);
  if (!ok)
    return cpu_set_error(DK_RESOURCE_EXHAUSTED,
                         "%s: host out of memory registering %zu bytes", fn,
                         size);
  *mem = (DK_Mem)ptr;
  return DK_OK;
}

DK_Status cpu_mem_unregister_host(int32_t dev, DK_Mem mem) {
  static const char fn[] = "mem_unregister_host";
  cpu_device *d;
  DK_Status st = cpu_device_get(fn, dev, &d);
  if (st != DK_OK || !mem) return st;
  pthread_mutex_lock(&d->mem_mu);
  bool registered = cpu_table_remove(&d->registered, (uintptr_t)mem, NULL);
  if (registered) cpu_table_remove(&d->mems, (uintptr_t)mem, NULL);
  pthread_mutex_unlock(&d->mem_mu);
  if (!registered)
    return cpu_set_error(DK_INVALID_ARGUMENT,
                         "%s: handle %p is not a host registration of cpu "
                         "device %d",
                         fn, (void *)mem, (int)d->index);
  return DK_OK;
}

DK_Status cpu_mem_range(const char *fn, const char *what, cpu_device *d,
                        DK_Mem mem, size_t offset, size_t size,
                        uint8_t **addr) {
  *addr = NULL;
  if (!mem)
    return cpu_set_error(DK_INVALID_ARGUMENT, "%s: %s handle is NULL", fn, what);
  size_t alloc_size;
  pthread_mutex_lock(&d->mem_mu);
  bool live = cpu_table_find(&d->mems, (uintptr_t)mem, &alloc_size);
  pthread_mutex_unlock(&d->mem_mu);
  if (!live)
    return cpu_set_error(DK_INVALID_ARGUMENT,
                         "%s: %s handle %p is not a live allocation on cpu "
                         "device %d",
                         fn, what, (void *)mem, (int)d->index);
  if (offset > alloc_size || size > alloc_size - offset)
    return cpu_set_error(DK_OUT_OF_RANGE,
                         "%s: %s range [offset %zu, +%zu) exceeds the "
                         "%zu-byte allocation",
                         fn, what, offset, size, alloc_size);
  *addr = (uint8_t *)mem + offset;
  return DK_OK;
}

DK_Status cpu_host_alloc(int32_t dev, size_t size, void **ptr) {
  static const char fn[] = "host_alloc";
  cpu_device *d;
  DK_Status st = cpu_device_get(fn, dev, &d);
  if (st != DK_OK) return st;
  if (!ptr) return cpu_set_error(DK_INVALID_ARGUMENT, "%s: ptr is NULL", fn);
  void *p = NULL;
  bool ok = posix_memalign(&p, CPU_ALLOC_ALIGNMENT, size ? size : 1) == 0;
  if (ok) {
    pthread_mutex_lock(&d->mem_mu);
    ok = cpu_table_insert(&d->host, (uintptr_t)p, size);
    pthread_mutex_unlock(&d->mem_mu);
  }
  if (!ok) {
    free(p);
    return cpu_set_error(DK_RESOURCE_EXHAUSTED,
                         "%s: host out of memory allocating %zu bytes", fn,
                         size);
  }
  *ptr = p;
  return DK_OK;
}

DK_Status cpu_host_free(int32_t dev, void *ptr) {
  cpu_device *d;
  DK_Status st = cpu_device_get("host_free", dev, &d);
  if (st != DK_OK || !ptr) return st;
  pthread_mutex_lock(&d->mem_mu);
  bool live = cpu_table_remove(&d->host, (uintptr_t)ptr, NULL);
  pthread_mutex_unlock(&d->mem_mu);
  if (!live)
    return cpu_set_error(DK_INVALID_ARGUMENT,
                         "host_free: %p is not a live host_alloc pointer of "
                         "cpu device %d",
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

/* Copies and fills of at least COPY_SPLIT_BYTES run in COPY_BLOCK pieces
 * over the kernels' thread pool, in chunks of at least COPY_GRAIN blocks:
 * one core does not reach the memory's bandwidth (measured here: 2 MiB in
 * 43 us on one thread, 25 us on two). */
#define COPY_BLOCK ((size_t)64 << 10)
#define COPY_GRAIN 4
#define COPY_SPLIT_BYTES ((size_t)1 << 20)

static void copy_blocks(void *arg, int64_t begin, int64_t end) {
  const copy_args *a = arg;
  size_t first = (size_t)begin * COPY_BLOCK, last = (size_t)end * COPY_BLOCK;
  size_t size = (last < a->size ? last : a->size) - first;
  if (a->src)
    memcpy(a->dst + first, (const uint8_t *)a->src + first, size);
  else
    memset(a->dst + first, a->value, size);
}

/* memmove where the ranges overlap: handles are host pointers, so even an
 * h2d source may alias the destination allocation. */
static void run_copy(void *arg) {
  copy_args *a = arg;
#ifdef DEVKIT_DEFECT_ODD_COPY
  if (a->src && (a->size & 1)) a->size--;
#endif
  const uint8_t *src = a->src;
  bool overlap = src && src < a->dst + a->size && a->dst < src + a->size;
  if (a->size >= COPY_SPLIT_BYTES && !overlap)
    cpu_parallel_for((int64_t)((a->size + COPY_BLOCK - 1) / COPY_BLOCK), COPY_GRAIN, copy_blocks, a);
  else if (src)
    memmove(a->dst, src, a->size);
  else
    memset(a->dst, a->value, a->size);
}

/* A copy's device operands, (mem, offset) on the copy's device; a NULL mem
 * is host memory or another device's. */
typedef struct copy_operands {
  DK_Mem dst_mem;
  size_t dst_offset;
  DK_Mem src_mem;
  size_t src_offset;
} copy_operands;

/* Validates `stream` and queues the (already validated) copy on it; a
 * capturing stream's graph also records the operands, checked at launch. */
static DK_Status submit_copy(const char *fn, cpu_device *d, DK_Stream stream,
                             uint8_t *dst, const void *src, uint8_t value,
                             size_t size, copy_operands ops) {
  cpu_stream *s;
  DK_Status st = cpu_stream_acquire(fn, d, stream, &s);
  if (st != DK_OK || size == 0) {
    cpu_stream_release(s);
    return st;
  }
  cpu_graph *g = cpu_stream_capture(s);
  if (g && ops.dst_mem) st = cpu_graph_add_mem(g, ops.dst_mem, ops.dst_offset, size);
  if (g && ops.src_mem && st == DK_OK)
    st = cpu_graph_add_mem(g, ops.src_mem, ops.src_offset, size);
  if (st != DK_OK) {
    cpu_stream_release(s);
    return st;
  }
  copy_args *a = cpu_work_new(sizeof *a, run_copy, NULL);
  if (!a) {
    cpu_stream_release(s);
    return cpu_set_error(DK_RESOURCE_EXHAUSTED,
                         "%s: host out of memory queuing the copy", fn);
  }
  *a = (copy_args){dst, src, size, value};
  cpu_work_submit(s, a);
  cpu_stream_release(s);
  return DK_OK;
}

DK_Status cpu_memset(int32_t dev, DK_Mem mem, size_t offset, uint8_t value,
                     size_t size, DK_Stream stream) {
  static const char fn[] = "memset";
  cpu_device *d;
  uint8_t *dst;
  DK_Status st = cpu_device_get(fn, dev, &d);
  if (st == DK_OK) st = cpu_mem_range(fn, "mem", d, mem, offset, size, &dst);
  if (st == DK_OK)
    st = submit_copy(fn, d, stream, dst, NULL, value, size,
                     (copy_operands){mem, offset, NULL, 0});
  return st;
}

DK_Status cpu_copy_h2d(int32_t dev, DK_Mem dst, size_t dst_offset,
                       const void *src, size_t size, DK_Stream stream) {
  static const char fn[] = "copy_h2d";
  cpu_device *d;
  uint8_t *to;
  DK_Status st = cpu_device_get(fn, dev, &d);
  if (st != DK_OK) return st;
  if (!src && size)
    return cpu_set_error(DK_INVALID_ARGUMENT, "%s: src is NULL", fn);
  if ((st = cpu_mem_range(fn, "dst", d, dst, dst_offset, size, &to)) != DK_OK)
    return st;
  return submit_copy(fn, d, stream, to, src, 0, size,
                     (copy_operands){dst, dst_offset, NULL, 0});
}

DK_Status cpu_copy_d2h(int32_t dev, void *dst, DK_Mem src, size_t src_offset,
                       size_t size, DK_Stream stream) {
  static const char fn[] = "copy_d2h";
  cpu_device *d;
  uint8_t *from;
  DK_Status st = cpu_device_get(fn, dev, &d);
  if (st != DK_OK) return st;
  if (!dst && size)
    return cpu_set_error(DK_INVALID_ARGUMENT, "%s: dst is NULL", fn);
  if ((st = cpu_mem_range(fn, "src", d, src, src_offset, size, &from)) != DK_OK)
    return st;
  return submit_copy(fn, d, stream, dst, from, 0, size,
                     (copy_operands){NULL, 0, src, src_offset});
}

DK_Status cpu_copy_d2d(int32_t dev, DK_Mem dst, size_t dst_offset, DK_Mem src,
                       size_t src_offset, size_t size, DK_Stream stream) {
  static const char fn[] = "copy_d2d";
  cpu_device *d;
  uint8_t *to, *from;
  DK_Status st = cpu_device_get(fn, dev, &d);
  if (st == DK_OK) st = cpu_mem_range(fn, "dst", d, dst, dst_offset, size, &to);
  if (st == DK_OK)
    st = cpu_mem_range(fn, "src", d, src, src_offset, size, &from);
  if (st == DK_OK)
    st = submit_copy(fn, d, stream, to, from, 0, size,
                     (copy_operands){dst, dst_offset, src, src_offset});
  return st;
}

DK_Status cpu_copy_p2p(int32_t dst_dev, DK_Mem dst, size_t dst_offset,
                       int32_t src_dev, DK_Mem src, size_t src_offset,
                       size_t size, DK_Stream stream) {
  static const char fn[] = "copy_p2p";
  cpu_device *dd, *sd;
  uint8_t *to, *from;
  DK_Status st = cpu_device_get(fn, dst_dev, &dd);
  if (st == DK_OK) st = cpu_device_get(fn, src_dev, &sd);
  if (st == DK_OK)
    st = cpu_mem_range(fn, "dst", dd, dst, dst_offset, size, &to);
  if (st == DK_OK)
    st = cpu_mem_range(fn, "src", sd, src, src_offset, size, &from);
  if (st == DK_OK) /* the source, on another device, is not checked at launch */
    st = submit_copy(fn, dd, stream, to, from, 0, size,
                     (copy_operands){dst, dst_offset, NULL, 0});
  return st;
}
