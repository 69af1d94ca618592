/*
 * dks.h -- the devkit plugin-support library ("dks"), runtime half.
 *
 * The library implements the generic part of a devkit plugin -- errors,
 * handle tables, the device and memory registry (live handles, sizes,
 * capacity, range checks, host registration), copies and memsets, streams
 * with worker threads, events, graph capture and replay, the thread pool,
 * configuration from DEVKIT_<NAME>_* variables, and (dks_kernel.h) the kernel
 * table, launcher, schema checks and validators -- on top of a small struct
 * of device hooks that the plugin gives. It is compiled into each plugin
 * library, unrenamed and with hidden visibility (no separate .so), from the
 * sources devkit ships: a plugin rebuilt against a newer devkit gets every
 * fix of the library.
 *
 * Usage. A plugin is its hooks, its kernels and one DK_PluginInit:
 *
 *   #include "dks_kernel.h"
 *
 *   static DK_Status my_init(int32_t *num_devices) { *num_devices = 1; return DK_OK; }
 *   static DK_Status my_properties(int32_t dev, DK_DeviceProperties *p) {
 *     snprintf(p->name, sizeof p->name, "my device %d", (int)dev);
 *     p->compute_units = 1; p->total_memory = p->max_alloc_size = 1 << 30;
 *     p->alloc_alignment = 64; p->flags = DK_DEVICE_UNIFIED_MEMORY;
 *     return DK_OK;
 *   }
 *   ...my_alloc, my_free, my_copy, my_memset (below: dks_device_hooks)...
 *   static const dks_device_hooks k_hooks = {
 *       .struct_size = sizeof(dks_device_hooks), .name = "my", .version = "0.1.0",
 *       .device_type = DK_DEVICE_TYPE_EXT_DEV, .init = my_init,
 *       .properties = my_properties, .alloc = my_alloc, .free = my_free,
 *       .copy = my_copy, .memset = my_memset};
 *   DK_EXPORT DK_Status DK_PluginInit(const DK_HostInfo *host, DK_PluginInfo *out) {
 *     return dks_plugin_init(&k_hooks, NULL, host, out);
 *   }
 *
 *   static DK_Status relu_f32(const dks_kernel_args *k) { ...k->in[0], k->out[0]... }
 *   static const dks_kernel_def k_defs[] = {{"Relu", DK_DTYPE_FLOAT32, relu_f32, 0}};
 *   DKS_REGISTER_KERNELS(k_defs)
 *
 * Build it with the library's sources (devkit.abi.support_sources()) into
 * one shared library: cc -std=c11 -O2 -fPIC -shared -fvisibility=hidden
 * -pthread -I<devkit.abi.include_dir()> -I<devkit.abi.support_dir()>
 * plugin.c <kernel files> <support sources> -lm. The plugin exports only
 * DK_PluginInit; everything here stays hidden inside it.
 *
 * Configuration: a plugin whose hooks are named "tpu" reads DEVKIT_TPU_*
 * (the name upper-cased): _THREADS (the thread pool's size, default the
 * usable cores), _SPIN_US (a pool thread's spin before it sleeps, default
 * 50), _MEMORY (bytes the library lets each device allocate, default the
 * device's total_memory), _KERNELS (all | primitives: publish only the
 * primitive set's kernels), and two fault injections for tests, _FAIL_ALLOC
 * (the Nth allocation fails) and _LOST_DEVICE (a device index that answers
 * DK_DEVICE_LOST). The plugin's own variables use dks_env and
 * dks_config_error, so their messages read the same.
 *
 * Threads: every DK_DeviceApi function the library implements is
 * thread-safe. Stream work (copies, memsets, kernels' compute functions,
 * callbacks, a plugin's own items) runs in stream order on the stream's
 * worker thread, or -- on the default stream (NULL), or when a thread
 * waiting for the stream finds the next item idle -- on the calling thread;
 * never two items of one stream at once.
 */
#ifndef DEVKIT_ABI_SUPPORT_DKS_H_
#define DEVKIT_ABI_SUPPORT_DKS_H_

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "devkit.h"

/* Every symbol of the library stays inside the plugin, whatever the build's
 * flags: two plugins in one process each have their own copy. */
#pragma GCC visibility push(hidden)

/* The library's version: MINOR grows with additions, MAJOR with changes a
 * plugin's sources must follow. DKS_VERSION is the two as a string. */
#define DKS_VERSION_MAJOR 1
#define DKS_VERSION_MINOR 0
#define DKS_VERSION "1.0"

#define DKS_MAX_DEVICES 64
/* The thread pool's largest size, callers included. */
#define DKS_MAX_THREADS 256

/* ======================================================================== */
/* Device hooks                                                              */
/* ======================================================================== */

/* A copy or memset, as the library hands it to the copy / memset hook, after
 * checking every handle and range. A device operand is (mem, offset) on its
 * device, and `dst` / `src` hold what the address hook gives for it (the
 * address kernels receive); a host operand has mem NULL and a host pointer.
 * For copy_p2p, `device` is the destination's device and `src_device` the
 * source's. The ranges of a copy may overlap (on a device whose handles are
 * host pointers, even an h2d source may alias the destination). */
typedef enum dks_copy_kind {
  DKS_COPY_H2D = 0, /* dst device, src host */
  DKS_COPY_D2H = 1, /* dst host, src device */
  DKS_COPY_D2D = 2, /* both on `device` */
  DKS_COPY_P2P = 3, /* dst on `device`, src on `src_device` */
  DKS_MEMSET = 4    /* dst device, filled with `value`; no src */
} dks_copy_kind;

typedef struct dks_copy {
  int32_t kind; /* dks_copy_kind */
  int32_t device;
  int32_t src_device;
  uint8_t value; /* DKS_MEMSET's byte */
  DK_Mem dst_mem;
  size_t dst_offset;
  DK_Mem src_mem;
  size_t src_offset;
  void *dst;
  const void *src;
  size_t size; /* bytes; never 0 (the library completes empty copies itself) */
} dks_copy;

/* What a plugin gives the library: a struct of static storage (the library
 * keeps the pointer) that starts with struct_size, versioned like the ABI's
 * structs: fields are only appended; the library treats fields past the
 * plugin's struct_size as NULL. Required fields are marked; the library
 * refuses to initialise, naming the field, when one is missing.
 *
 * Errors: a hook that fails calls dks_set_error ("<what>: <why>") and returns
 * the status; the library passes both on to the host.
 *
 * Threads: hooks are called from any thread, concurrently, except init;
 * a hook that keeps state of its own locks it. The library never calls a
 * hook while holding a lock of its own, so a hook may call back into the
 * library (dks_set_error, dks_parallel_for, ...). */
typedef struct dks_device_hooks {
  size_t struct_size; /* sizeof(dks_device_hooks) as the plugin was compiled */

  /* Required. The device's name, a lowercase C identifier: DK_PluginInfo's
   * device_type, the "<name> device N" of messages, and the prefix of the
   * configuration variables (DEVKIT_<NAME>_...). */
  const char *name;
  /* DK_PluginInfo.name; NULL: `name`. (A test build of a plugin renames the
   * plugin, so that it loads beside the real one, and keeps its device.) */
  const char *plugin_name;
  /* Required. DK_PluginInfo.version, e.g. "0.1.0". */
  const char *version;
  /* DK_DeviceType of the plugin's tensors (DK_Tensor.device.device_type),
   * which the launcher checks; the library reports it in the properties. */
  int32_t device_type;

  /* Required. Called once, by the first DK_PluginInit, before anything
   * else: opens the driver, reads the plugin's own configuration, and sets
   * *num_devices (1 to DKS_MAX_DEVICES). A failure fails every
   * DK_PluginInit of the process with its status and message. */
  DK_Status (*init)(int32_t *num_devices);

  /* Required. Fills *props (struct_size is sizeof(DK_DeviceProperties),
   * the rest zeroed) for device `dev`. Called once per device by the
   * first DK_PluginInit, after init; the library keeps the result.
   * total_memory is the default capacity the library accounts (DEVKIT_
   * <NAME>_MEMORY replaces it), and the library reports max_alloc_size at
   * most that capacity. */
  DK_Status (*properties)(int32_t dev, DK_DeviceProperties *props);

  /* Required. Allocates `size` bytes (size may be 0: a unique handle all
   * the same) and stores a non-NULL handle, or fails with
   * DK_RESOURCE_EXHAUSTED. The library has checked the capacity and
   * registers the handle; a handle is live once alloc returns it. */
  DK_Status (*alloc)(int32_t dev, size_t size, DK_Mem *mem);
  /* Required. Releases a handle from alloc (`size` as allocated). Called
   * once per handle, after it left the registry, when no work uses it:
   * from mem_free, or in stream order for mem_free_async. */
  void (*free)(int32_t dev, DK_Mem mem, size_t size);

  /* Required. Performs a copy (kinds H2D, D2H, D2D, P2P) and returns when
   * it is complete. Runs in stream order, on the stream's worker thread or
   * the calling thread (see Threads above); a failure becomes the stream's
   * sticky error (dks_work_fail semantics). */
  DK_Status (*copy)(const dks_copy *c);
  /* Required. Performs a DKS_MEMSET, as copy does a copy. */
  DK_Status (*memset)(const dks_copy *c);

  /* Optional. The address kernels, copies and dks_mem_range receive for
   * byte `offset` of allocation `mem` -- for a flat address space the
   * device's pointer, with address(mem, o) + k == address(mem, o + k).
   * NULL: handles are addresses, (uint8_t *)mem + offset (the cpu plugin's
   * host pointers, CUDA's device pointers). Called on every range check:
   * no locks, no allocation. */
  void *(*address)(int32_t dev, DK_Mem mem, size_t offset);

  /* Optional. The device's free and total bytes as its driver counts them;
   * mem_get_info reports at most this free (its own count is the capacity
   * less the live allocations). NULL: the library's count alone. */
  DK_Status (*mem_info)(int32_t dev, size_t *free_bytes, size_t *total_bytes);

  /* Optional. host_alloc / host_free of the table (memory the device
   * copies from fastest). NULL: 64-byte aligned malloc. */
  DK_Status (*host_alloc)(int32_t dev, size_t size, void **ptr);
  void (*host_free)(int32_t dev, void *ptr, size_t size);

  /* Optional (both, or register_host alone). Makes `size` bytes of host
   * memory at `ptr` a handle kernels and copies accept (ABI 1.3 host
   * registration); the library registers and checks it like an allocation
   * (counted against no capacity). unregister_host releases it, once no work
   * uses it. NULL register_host: the table's registration section is
   * absent and the host stages through its own memory. */
  DK_Status (*register_host)(int32_t dev, void *ptr, size_t size, DK_Mem *mem);
  void (*unregister_host)(int32_t dev, DK_Mem mem);
} dks_device_hooks;

/* ======================================================================== */
/* Plugin entry                                                              */
/* ======================================================================== */

/* The body of a plugin's DK_PluginInit. The first call initialises the
 * library from `hooks` (kept: static storage) and the configuration, calls
 * the kernels' DKS_REGISTER_INIT functions and builds the kernel table;
 * every call installs the host's log sink, fills *out (DK_PluginInfo: ABI
 * version, name, version, device_type, kernels, last_error_message) and logs
 * one line describing the configuration and DKS_VERSION. `api` is the
 * function table to publish: NULL for the library's own (dks_fill_api's),
 * or a plugin's table of static storage that dks_fill_api filled and the
 * plugin extended with optional sections (collectives, codegen). */
DK_Status dks_plugin_init(const dks_device_hooks *hooks, const DK_DeviceApi *api,
                          const DK_HostInfo *host, DK_PluginInfo *out);

/* Fills *api with struct_size = sizeof(DK_DeviceApi) and the library's
 * functions: devices, memory, copies, streams, events, host memory, graphs,
 * and host registration when `hooks` has register_host. The collective and
 * codegen sections stay NULL, for the plugin to set. */
void dks_fill_api(const dks_device_hooks *hooks, DK_DeviceApi *api);

/* Sends a formatted line to the host's log sink (DK_LogLevel), if any. */
void dks_log(int32_t level, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

/* ======================================================================== */
/* Errors                                                                    */
/* ======================================================================== */

/* Formats the calling thread's error message and returns `status`. Messages
 * start with the ABI function's name, e.g. "copy_d2h: dst is NULL". */
DK_Status dks_set_error(DK_Status status, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));
/* DK_PluginInfo.last_error_message: the calling thread's message, never NULL. */
const char *dks_last_error(void);

/* VERSIONING rule 4 for an "out" struct: copies the fields of `src` (a struct
 * of `src_size` bytes starting with struct_size) that fit in the caller's
 * dst->struct_size, then sets dst->struct_size to the bytes filled. The
 * caller has checked dst->struct_size >= sizeof(size_t). */
void dks_copy_out(void *dst, const void *src, size_t src_size);

/* ======================================================================== */
/* Configuration                                                             */
/* ======================================================================== */

/* DEVKIT_<NAME>_<suffix> (NAME: the hooks' name upper-cased), or NULL when
 * unset or empty (an empty variable means "the default"). Valid from init on. */
const char *dks_env(const char *suffix);
/* For an invalid variable: sets "DK_PluginInit: DEVKIT_<NAME>_<suffix>=
 * "<value>" is invalid: expected <expected>" and returns DK_INVALID_ARGUMENT. */
DK_Status dks_config_error(const char *suffix, const char *value, const char *expected);
/* Decimal digits only, in [lo, hi]. */
bool dks_parse_int(const char *s, uint64_t lo, uint64_t hi, uint64_t *out);

/* The thread pool's size, callers included (DEVKIT_<NAME>_THREADS). */
int32_t dks_thread_count(void);
/* How long a pool thread spins before it sleeps, in ns (DEVKIT_<NAME>_SPIN_US). */
int64_t dks_spin_ns(void);
/* CLOCK_MONOTONIC in ns. */
uint64_t dks_now_ns(void);
/* A spin-wait's hint to the CPU that the thread is spinning. */
void dks_spin_pause(void);

/* ======================================================================== */
/* Handle tables: open addressing, non-zero key -> value                      */
/* ======================================================================== */

typedef struct dks_slot {
  uintptr_t key; /* 0 = empty */
  size_t value;
} dks_slot;

typedef struct dks_table {
  dks_slot *slots; /* capacity entries, capacity a power of two (or 0) */
  size_t capacity;
  size_t count;
} dks_table;

/* The caller holds the lock guarding the table. `value` may be NULL. */
bool dks_table_find(const dks_table *t, uintptr_t key, size_t *value);
/* `key` must be non-zero and absent. False when out of memory. */
bool dks_table_insert(dks_table *t, uintptr_t key, size_t value);
bool dks_table_remove(dks_table *t, uintptr_t key, size_t *value);

/* ======================================================================== */
/* Devices and memory                                                        */
/* ======================================================================== */

/* A device's registry (opaque). */
typedef struct dks_device dks_device;

/* Validates a device index for a call made by `fn`: DK_INVALID_ARGUMENT when
 * out of range, DK_DEVICE_LOST for DEVKIT_<NAME>_LOST_DEVICE. *out is NULL
 * on failure. */
DK_Status dks_device_get(const char *fn, int32_t dev, dks_device **out);

/* Validates that `mem` is a live allocation (or registration) of `d` and
 * that [offset, offset + size) lies inside it, then stores the address of
 * mem + offset (the address hook's) in *addr (NULL on failure). `what`
 * names the operand in messages ("dst"). */
DK_Status dks_mem_range(const char *fn, const char *what, dks_device *d, DK_Mem mem,
                        size_t offset, size_t size, uint8_t **addr);
/* As dks_mem_range for the bytes from `offset` to the end of `mem`'s
 * allocation (offset inside it): their address in *addr and their count in
 * *size. */
DK_Status dks_mem_extent(const char *fn, const char *what, dks_device *d, DK_Mem mem,
                         size_t offset, uint8_t **addr, size_t *size);

/* ======================================================================== */
/* Streams and work items                                                    */
/* ======================================================================== */

/* Calling pattern for code that submits stream work (a plugin's collectives,
 * say):
 *
 *   dks_device *d;  dks_stream *s;  uint8_t *ptr;
 *   if ((st = dks_device_get(fn, dev, &d))) return st;
 *   if ((st = dks_mem_range(fn, "dst", d, mem, offset, size, &ptr))) return st;
 *   if ((st = dks_stream_acquire(fn, d, stream, &s))) return st;
 *   my_args *a = dks_work_new(sizeof *a, my_run, my_destroy);
 *   if (!a) { dks_stream_release(s); return dks_set_error(...); }
 *   ...fill *a...
 *   st = dks_work_submit(s, a);  // DK_OK, or the failure of a default-stream run
 *   dks_stream_release(s);
 *   return st;
 *
 * Asynchronous failures (devkit.h CONVENTIONS): a run function that fails
 * calls dks_work_fail. On a stream the failure becomes the stream's sticky
 * error: the first one is kept until stream_destroy, and stream_synchronize,
 * stream_query, device_synchronize and event_query / event_synchronize of
 * records queued after it report it. Work queued behind a failed item still
 * runs (copies, callbacks, records and frees must not be lost); code whose
 * work depends on earlier work tracks that itself. On the default stream
 * (s == NULL) the failure is returned by dks_work_submit instead. While a
 * stream captures a graph, dks_work_submit hands the item to the graph,
 * which runs it again at every launch (run must allow that; destroy runs
 * when the graph is destroyed). */
typedef struct dks_stream dks_stream;

/* Validates that `stream` is a live stream of `d` and pins it (it cannot be
 * destroyed) until dks_stream_release. A NULL stream is the default stream:
 * *out = NULL and DK_OK. *out is NULL on failure. */
DK_Status dks_stream_acquire(const char *fn, dks_device *d, DK_Stream stream, dks_stream **out);
/* Unpins a stream from dks_stream_acquire; NULL is ignored. */
void dks_stream_release(dks_stream *s);

/* Allocates a work item with `arg_size` zeroed, max-aligned bytes of argument
 * storage and returns that storage, or NULL when out of memory. run(arg) does
 * the work; destroy(arg) (may be NULL) then releases what arg references. */
void *dks_work_new(size_t arg_size, void (*run)(void *arg), void (*destroy)(void *arg));
/* Submits the item owning `arg` (from dks_work_new) to pinned stream `s`,
 * behind everything submitted before, and returns DK_OK. With s == NULL (the
 * default stream) it runs in the calling thread, is complete on return, and
 * the result is the status its run passed to dks_work_fail (DK_OK if none),
 * with the message already in the caller's error buffer. Submission itself
 * cannot fail; the item is freed once it has run. */
DK_Status dks_work_submit(dks_stream *s, void *arg);
/* Frees an item that will not be submitted, without calling destroy. */
void dks_work_discard(void *arg);
/* Called from a run function: reports that the item failed with `status`
 * and a message formatted like dks_set_error's (the function name first).
 * The last call during one run wins. Returns `status`. */
DK_Status dks_work_fail(DK_Status status, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));
/* The stream whose item the calling thread runs, else NULL. Lets blocking
 * calls refuse to wait for their own stream. */
dks_stream *dks_stream_current(void);
/* Whether pinned stream `s` is capturing a graph (false for NULL): calls
 * whose work a graph may not hold refuse with dks_capture_refused. */
bool dks_stream_capturing(const dks_stream *s);
/* DK_FAILED_PRECONDITION for `fn`, refused because `s` is capturing. */
DK_Status dks_capture_refused(const char *fn, const dks_stream *s);

/* ======================================================================== */
/* Thread pool                                                               */
/* ======================================================================== */

/* Runs fn(ctx, begin, end) over disjoint chunks covering [0, n), each at
 * least `grain` items long (the last may be shorter), and returns when every
 * chunk has run. Chunks run on the plugin's one thread pool of
 * dks_thread_count() threads, shared by every stream (the caller is one of
 * them); work under 2 * grain items, or a call made from inside a chunk
 * (never nested), runs on the calling thread. Pick `grain` so a chunk is
 * worth a thread hand-off (tens of microseconds of work). */
typedef void (*dks_range_fn)(void *ctx, int64_t begin, int64_t end);
void dks_parallel_for(int64_t n, int64_t grain, dks_range_fn fn, void *ctx);
/* Wakes the pool's sleeping workers to spin for dks_spin_ns() waiting for a
 * job, without posting one: called where a batch of kernels is about to run
 * (a graph launch), so that the first kernel that splits finds its workers
 * awake instead of paying a wake-up (tens of microseconds on a virtual
 * machine) on the critical path. Does nothing when none sleeps. */
void dks_threads_wake(void);
/* Joins the pool's workers (done at unload; a later dks_parallel_for starts
 * new ones). */
void dks_threads_shutdown(void);

#pragma GCC visibility pop

#endif /* DEVKIT_ABI_SUPPORT_DKS_H_ */
