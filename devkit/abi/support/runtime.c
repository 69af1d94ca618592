/*
 * runtime.c -- errors, handle tables, configuration and devices of the
 * devkit plugin-support library. Memory and copies live in memory.c,
 * streams and events in stream.c.
 */
#define _GNU_SOURCE /* sysconf(_SC_NPROCESSORS_ONLN), sched_getaffinity */

#include <sched.h>

#include <inttypes.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "dks_internal.h"

/* ======================================================================== */
/* Errors                                                                    */
/* ======================================================================== */

static _Thread_local char t_error[1024];

DK_Status dks_set_error(DK_Status status, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(t_error, sizeof t_error, fmt, ap);
  va_end(ap);
  return status;
}

const char *dks_last_error(void) {
  return t_error[0] ? t_error : "no error";
}

void dks_copy_out(void *dst, const void *src, size_t src_size) {
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
static size_t table_index(const dks_table *t, uintptr_t key) {
  if (key == 0 || t->capacity == 0) return t->capacity;
  size_t mask = t->capacity - 1;
  for (size_t i = table_home(key, mask); t->slots[i].key; i = (i + 1) & mask)
    if (t->slots[i].key == key) return i;
  return t->capacity;
}

bool dks_table_find(const dks_table *t, uintptr_t key, size_t *value) {
  size_t i = table_index(t, key);
  if (i == t->capacity) return false;
  if (value) *value = t->slots[i].value;
  return true;
}

static void table_place(dks_slot *slots, size_t mask, dks_slot slot) {
  size_t i = table_home(slot.key, mask);
  while (slots[i].key) i = (i + 1) & mask;
  slots[i] = slot;
}

bool dks_table_insert(dks_table *t, uintptr_t key, size_t value) {
  /* Keep the load factor <= 1/2 so probe sequences stay short. */
  if (2 * (t->count + 1) > t->capacity) {
    size_t capacity = t->capacity ? 2 * t->capacity : 16;
    dks_slot *slots = calloc(capacity, sizeof *slots);
    if (!slots) return false;
    for (size_t i = 0; i < t->capacity; i++)
      if (t->slots[i].key) table_place(slots, capacity - 1, t->slots[i]);
    free(t->slots);
    t->slots = slots;
    t->capacity = capacity;
  }
  table_place(t->slots, t->capacity - 1, (dks_slot){key, value});
  t->count++;
  return true;
}

bool dks_table_remove(dks_table *t, uintptr_t key, size_t *value) {
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
  t->slots[i] = (dks_slot){0, 0};
  t->count--;
  return true;
}


/* ======================================================================== */
/* Configuration and devices                                                 */
/* ======================================================================== */

/* A plan's kernels follow each other a few microseconds apart: a worker
 * that waits this long after a job takes the next one without a wake-up,
 * and an idle pool stops spinning this soon. */
#define DEFAULT_SPIN_US 50

dks_device_hooks dks_hooks;

static struct {
  char env_prefix[48];    /* "DEVKIT_CPU_" */
  int32_t num_devices;
  uint64_t fail_alloc;    /* DEVKIT_<NAME>_FAIL_ALLOC; 0 = off */
  int32_t lost_device;    /* DEVKIT_<NAME>_LOST_DEVICE; -1 = none */
  bool memory_set;        /* DEVKIT_<NAME>_MEMORY, in memory */
  size_t memory;
  bool primitives_only;   /* DEVKIT_<NAME>_KERNELS=primitives */
  int32_t threads;        /* DEVKIT_<NAME>_THREADS: the kernels' thread budget */
  int64_t spin_ns;        /* DEVKIT_<NAME>_SPIN_US: a pool worker's wait before it sleeps */
  DK_Status init_status;
  char init_error[1024];  /* message for init_status, replayed per thread */
} g;

static atomic_uint_fast64_t g_alloc_count; /* mem_alloc(_async) calls so far */
static dks_device g_devices[DKS_MAX_DEVICES];
static pthread_once_t g_once = PTHREAD_ONCE_INIT;

const char *dks_name(void) { return dks_hooks.name; }

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

bool dks_parse_int(const char *s, uint64_t lo, uint64_t hi, uint64_t *out) {
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

const char *dks_env(const char *suffix) {
  char name[128];
  snprintf(name, sizeof name, "%s%s", g.env_prefix, suffix);
  const char *v = getenv(name);
  return v && *v ? v : NULL;
}

DK_Status dks_config_error(const char *suffix, const char *value, const char *expected) {
  return dks_set_error(DK_INVALID_ARGUMENT,
                       "DK_PluginInit: %s%s=\"%s\" is invalid: expected %s",
                       g.env_prefix, suffix, value, expected);
}

/* Copies the plugin's hooks (fields past its struct_size stay NULL) and
 * checks the required ones. */
static DK_Status take_hooks(const dks_device_hooks *hooks) {
  static const char fn[] = "DK_PluginInit";
  if (!hooks || hooks->struct_size < offsetof(dks_device_hooks, name) + sizeof hooks->name)
    return dks_set_error(DK_INVALID_ARGUMENT, "%s: the device hooks are NULL or their struct_size "
                         "is too small", fn);
  size_t n = hooks->struct_size < sizeof dks_hooks ? hooks->struct_size : sizeof dks_hooks;
  memcpy(&dks_hooks, hooks, n);
  dks_hooks.struct_size = sizeof dks_hooks;
  const dks_device_hooks *h = &dks_hooks;
  const char *missing = !h->version ? "version" : !h->init ? "init" : !h->properties ? "properties"
                        : !h->alloc ? "alloc" : !h->free ? "free" : !h->copy ? "copy"
                        : !h->memset ? "memset" : NULL;
  bool named = h->name && *h->name && strlen(h->name) < 32;
  for (const char *c = h->name; named && *c; c++)
    named = (*c >= 'a' && *c <= 'z') || (*c >= '0' && *c <= '9' && c != h->name) || *c == '_';
  if (!named)
    return dks_set_error(DK_INVALID_ARGUMENT, "%s: the device hooks' name must be a lowercase C "
                         "identifier of 1 to 31 characters", fn);
  if (missing)
    return dks_set_error(DK_INVALID_ARGUMENT, "%s: the %s device hooks have no %s", fn, h->name,
                         missing);
  size_t len = (size_t)snprintf(g.env_prefix, sizeof g.env_prefix, "DEVKIT_%s_", h->name);
  for (size_t i = 0; i < len; i++)
    if (g.env_prefix[i] >= 'a' && g.env_prefix[i] <= 'z') g.env_prefix[i] -= 'a' - 'A';
  return DK_OK;
}

static DK_Status configure(const dks_device_hooks *hooks) {
  uint64_t v;
  const char *s;
  DK_Status st = take_hooks(hooks);
  if (st != DK_OK) return st;

  if ((st = dks_hooks.init(&g.num_devices)) != DK_OK) return st;
  if (g.num_devices < 1 || g.num_devices > DKS_MAX_DEVICES)
    return dks_set_error(DK_INTERNAL, "DK_PluginInit: the %s device hooks report %d devices; "
                         "the support library takes 1 to %d", dks_name(), (int)g.num_devices,
                         DKS_MAX_DEVICES);

  g.memory_set = false;
  if ((s = dks_env("MEMORY"))) {
    if (!parse_bytes(s, &v))
      return dks_config_error("MEMORY", s,
                              "a positive byte count, optionally suffixed "
                              "K, M, G, KiB, MiB or GiB");
    g.memory_set = true;
    g.memory = (size_t)v;
  }

  g.fail_alloc = 0;
  if ((s = dks_env("FAIL_ALLOC"))) {
    if (!dks_parse_int(s, 1, UINT64_MAX, &v))
      return dks_config_error("FAIL_ALLOC", s, "a positive allocation number (1-based)");
    g.fail_alloc = v;
  }

  g.lost_device = -1;
  if ((s = dks_env("LOST_DEVICE"))) {
    if (!dks_parse_int(s, 0, (uint64_t)g.num_devices - 1, &v)) {
      char expected[64];
      snprintf(expected, sizeof expected, "a device index in [0, %d)",
               (int)g.num_devices);
      return dks_config_error("LOST_DEVICE", s, expected);
    }
    g.lost_device = (int32_t)v;
  }

  g.primitives_only = false;
  if ((s = dks_env("KERNELS"))) {
    if (strcmp(s, "primitives") != 0 && strcmp(s, "all") != 0)
      return dks_config_error("KERNELS", s, "all or primitives");
    g.primitives_only = strcmp(s, "primitives") == 0;
  }

  /* The cores this process may run on (taskset, cgroup cpusets), not the
   * machine's: more threads than those only take turns. */
  unsigned long usable[1024 / (8 * sizeof(unsigned long))]; /* a cpu_set_t's bits */
  g.threads = 0;
  if (sched_getaffinity(0, sizeof usable, (void *)usable) == 0) {
    for (size_t i = 0; i < sizeof usable / sizeof usable[0]; i++) g.threads += __builtin_popcountl(usable[i]);
  } else {
    long cpus = sysconf(_SC_NPROCESSORS_ONLN);
    g.threads = cpus < 1 ? 1 : cpus > DKS_MAX_THREADS ? DKS_MAX_THREADS : (int32_t)cpus;
  }
  if (g.threads < 1) g.threads = 1;
  if (g.threads > DKS_MAX_THREADS) g.threads = DKS_MAX_THREADS;
  if ((s = dks_env("THREADS"))) {
    if (!dks_parse_int(s, 1, DKS_MAX_THREADS, &v))
      return dks_config_error("THREADS", s, "an integer in [1, 256]");
    g.threads = (int32_t)v;
  }
  g.spin_ns = DEFAULT_SPIN_US * 1000;
  if ((s = dks_env("SPIN_US"))) {
    if (!dks_parse_int(s, 0, 100000, &v))
      return dks_config_error("SPIN_US", s, "an integer in [0, 100000]");
    g.spin_ns = (int64_t)v * 1000;
  }

  for (int32_t i = 0; i < g.num_devices; i++) {
    dks_device *d = &g_devices[i];
    d->props = (DK_DeviceProperties){.struct_size = sizeof d->props};
    if ((st = dks_hooks.properties(i, &d->props)) != DK_OK) return st;
    d->props.struct_size = sizeof d->props;
    d->props.device_type = dks_hooks.device_type;
    d->capacity = g.memory_set ? g.memory : (size_t)d->props.total_memory;
    d->props.total_memory = d->capacity;
    if (d->props.max_alloc_size > d->capacity) d->props.max_alloc_size = d->capacity;
  }
  return DK_OK;
}

static const dks_device_hooks *g_init_hooks; /* dks_runtime_init's argument, for init_once */

static void init_once(void) {
  g.init_status = configure(g_init_hooks);
  if (g.init_status != DK_OK) {
    snprintf(g.init_error, sizeof g.init_error, "%s", dks_last_error());
    g.num_devices = 0; /* the table stays callable but names no device */
    return;
  }
  for (int32_t i = 0; i < g.num_devices; i++) {
    dks_device *d = &g_devices[i];
    d->index = i;
    pthread_mutex_init(&d->mem_mu, NULL);
    pthread_mutex_init(&d->stream_mu, NULL);
    pthread_mutex_init(&d->event_mu, NULL);
    pthread_mutex_init(&d->graph_mu, NULL);
  }
}

bool dks_primitives_only(void) { return g.primitives_only; }

int32_t dks_thread_count(void) { return g.threads; }

int64_t dks_spin_ns(void) { return g.spin_ns; }

DK_Status dks_runtime_init(const dks_device_hooks *hooks) {
  static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
  pthread_mutex_lock(&mu); /* the first caller's hooks win */
  if (!g_init_hooks) g_init_hooks = hooks;
  pthread_mutex_unlock(&mu);
  pthread_once(&g_once, init_once);
  if (g.init_status != DK_OK)
    return dks_set_error(g.init_status, "%s", g.init_error);
  return DK_OK;
}

void dks_runtime_describe(char *buf, size_t size) {
  const dks_device *d = &g_devices[0];
  int n = snprintf(buf, size,
                   "devkit %s plugin %s (support library %s): %d device(s), %zu bytes "
                   "of memory each, %d compute units, %d kernel threads (spin %d us)",
                   dks_name(), dks_hooks.version, DKS_VERSION, (int)g.num_devices,
                   d->capacity, (int)d->props.compute_units, (int)g.threads,
                   (int)(g.spin_ns / 1000));
  if (n < 0 || (size_t)n >= size) return;
  if (g.fail_alloc)
    n += snprintf(buf + n, size - (size_t)n, ", %sFAIL_ALLOC=%" PRIu64, g.env_prefix,
                  g.fail_alloc);
  if (n < 0 || (size_t)n >= size) return;
  if (g.lost_device >= 0)
    snprintf(buf + n, size - (size_t)n, ", %sLOST_DEVICE=%d", g.env_prefix,
             (int)g.lost_device);
}

static DK_Status check_index(const char *fn, int32_t dev) {
  if (dev < 0 || dev >= g.num_devices)
    return dks_set_error(DK_INVALID_ARGUMENT,
                         "%s: device index %d out of range [0, %d)", fn,
                         (int)dev, (int)g.num_devices);
  return DK_OK;
}

DK_Status dks_device_get(const char *fn, int32_t dev, dks_device **out) {
  *out = NULL;
  DK_Status st = check_index(fn, dev);
  if (st != DK_OK) return st;
  if (dev == g.lost_device)
    return dks_set_error(DK_DEVICE_LOST,
                         "%s: %s device %d is lost (injected by "
                         "%sLOST_DEVICE=%d)",
                         fn, dks_name(), (int)dev, g.env_prefix, (int)dev);
  *out = &g_devices[dev];
  return DK_OK;
}

DK_Status dks_get_device_count(int32_t *count) {
  if (!count)
    return dks_set_error(DK_INVALID_ARGUMENT, "get_device_count: count is NULL");
  *count = g.num_devices;
  return DK_OK;
}

DK_Status dks_get_device_properties(int32_t dev, DK_DeviceProperties *props) {
  static const char fn[] = "get_device_properties";
  DK_Status st = check_index(fn, dev);
  if (st != DK_OK) return st;
  if (!props) return dks_set_error(DK_INVALID_ARGUMENT, "%s: props is NULL", fn);
  if (props->struct_size < sizeof(size_t))
    return dks_set_error(DK_INVALID_ARGUMENT,
                         "%s: props->struct_size %zu is smaller than the "
                         "struct_size field itself",
                         fn, props->struct_size);
  dks_copy_out(props, &g_devices[dev].props, sizeof g_devices[dev].props);
  return DK_OK;
}

DK_Status dks_injected_alloc_failure(const char *fn, const dks_device *d, size_t size) {
  if (!g.fail_alloc) return DK_OK;
  uint64_t n = atomic_fetch_add(&g_alloc_count, 1) + 1;
  if (n != g.fail_alloc) return DK_OK;
  return dks_set_error(DK_RESOURCE_EXHAUSTED,
                       "%s: allocation #%" PRIu64 " (%zu bytes on %s "
                       "device %d) failed, injected by "
                       "%sFAIL_ALLOC=%" PRIu64,
                       fn, n, size, dks_name(), (int)d->index, g.env_prefix, g.fail_alloc);
}
