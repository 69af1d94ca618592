/*
 * cpu_internal.h -- internal API of the devkit "cpu" reference plugin.
 *
 * Shared by the runtime (devices, memory, copies), the stream/event engine
 * and whatever later enqueues work on streams (kernels, collectives). None of
 * this is exported: the plugin's only public symbol is DK_PluginInit.
 *
 * Calling pattern for code that submits stream work:
 *
 *   cpu_device *d;  cpu_stream *s;  uint8_t *ptr;
 *   if ((st = cpu_device_get(fn, dev, &d))) return st;
 *   if ((st = cpu_mem_range(fn, "dst", d, mem, offset, size, &ptr))) return st;
 *   if ((st = cpu_stream_acquire(fn, d, stream, &s))) return st;
 *   my_args *a = cpu_work_new(sizeof *a, my_run, my_destroy);
 *   if (!a) { cpu_stream_release(s); return cpu_set_error(...); }
 *   ...fill *a...
 *   st = cpu_work_submit(s, a);  // DK_OK, or the failure of a default-stream run
 *   cpu_stream_release(s);
 *   return st;
 *
 * Asynchronous failures (devkit.h CONVENTIONS): a run function that fails
 * calls cpu_work_fail. On a stream the failure becomes the stream's sticky
 * error: the first one is kept, with a copy of its message, until
 * stream_destroy, and stream_synchronize, stream_query, device_synchronize
 * and event_query / event_synchronize of records queued after it report it.
 * Work queued behind a failed item still runs (copies, callbacks, records
 * and frees must not be lost); code whose work depends on earlier work
 * tracks that itself (a failed communicator makes its later collectives fail
 * at once with DK_ABORTED). On the default stream (s == NULL) the failure is
 * returned by cpu_work_submit instead.
 */
#ifndef DEVKIT_BACKENDS_CPU_CPU_INTERNAL_H_
#define DEVKIT_BACKENDS_CPU_CPU_INTERNAL_H_

#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "devkit.h"

#define CPU_PLUGIN_VERSION "0.1.0"
/* Test builds (deliberately broken variants, kernel-less builds) rename the
 * plugin so that it loads beside the real one. */
#ifndef CPU_PLUGIN_NAME
#define CPU_PLUGIN_NAME "cpu"
#endif
#define CPU_MAX_DEVICES 64
#define CPU_ALLOC_ALIGNMENT 64
#define CPU_HUGE_PAGE ((size_t)2 << 20) /* x86-64 and arm64 transparent huge pages */

/* ---- Errors -------------------------------------------------------------- */

/* Formats the calling thread's error message and returns `status`. Messages
 * start with the ABI function name, e.g. "copy_d2h: dst is NULL". */
DK_Status cpu_set_error(DK_Status status, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));
/* DK_PluginInfo.last_error_message: the calling thread's message, never NULL. */
const char *cpu_last_error(void);

/* VERSIONING rule 4 for an "out" struct: copies the fields of `src` (a struct
 * of `src_size` bytes starting with struct_size) that fit in the caller's
 * dst->struct_size, then sets dst->struct_size to the bytes filled. The
 * caller has checked dst->struct_size >= sizeof(size_t). */
void cpu_copy_out(void *dst, const void *src, size_t src_size);

/* ---- Registry: open-addressing hash table, non-zero key -> value ---------- */

typedef struct cpu_slot {
  uintptr_t key; /* 0 = empty */
  size_t value;
} cpu_slot;

typedef struct cpu_table {
  cpu_slot *slots; /* capacity entries, capacity a power of two (or 0) */
  size_t capacity;
  size_t count;
} cpu_table;

/* The caller holds the lock guarding the table. `value` may be NULL. */
bool cpu_table_find(const cpu_table *t, uintptr_t key, size_t *value);
/* `key` must be non-zero and absent. False when out of memory. */
bool cpu_table_insert(cpu_table *t, uintptr_t key, size_t value);
bool cpu_table_remove(cpu_table *t, uintptr_t key, size_t *value);

/* ---- Devices -------------------------------------------------------------- */

/* Per-device state. Every lock is per device and per registry, so work on
 * different devices (and lookups of different object kinds) never contends.
 * Aligned so that two devices never share a cache line. */
typedef struct cpu_device {
  _Alignas(64) int32_t index;

  pthread_mutex_t mem_mu; /* guards mems, registered, host, used */
  cpu_table mems;         /* live DK_Mem handle -> requested size */
  cpu_table registered;   /* the mems that mem_register_host made -> size */
  cpu_table host;         /* live host_alloc pointer -> size */
  size_t used;            /* bytes of mems counted against the capacity */

  pthread_mutex_t stream_mu; /* guards streams */
  cpu_table streams;         /* live cpu_stream pointers */

  pthread_mutex_t event_mu; /* guards events */
  cpu_table events;         /* live cpu_event pointers */

  pthread_mutex_t graph_mu; /* guards graphs */
  cpu_table graphs;         /* live cpu_graph pointers */
  atomic_int capturing;     /* streams of this device capturing a graph */
} cpu_device;

/* Reads the configuration and sets up the devices once per process; later
 * calls return the first call's result (and its message). */
DK_Status cpu_runtime_init(void);

/* DEVKIT_CPU_KERNELS=primitives: the kernel table keeps only the primitive
 * set's kernels (read with the other variables, when the plugin loads). */
bool cpu_primitives_only(void);
/* The kernels' thread budget (DEVKIT_CPU_THREADS, default the usable cores):
 * the pool's size, callers included (threads.c). */
#define CPU_MAX_THREADS 256
int32_t cpu_thread_count(void);
/* DEVKIT_CPU_SPIN_US, in ns: how long a pool thread spins before it sleeps
 * (an idle worker for the next job, a caller for its workers; threads.c). */
int64_t cpu_spin_ns(void);
/* CLOCK_MONOTONIC in ns (threads.c). */
uint64_t cpu_now_ns(void);
/* A spin-wait's hint to the CPU that the thread is spinning (threads.c). */
void cpu_spin_pause(void);
/* Joins the pool's workers (at unload; a later cpu_parallel_for starts new
 * ones). */
void cpu_threads_shutdown(void);
/* One-line summary of the configuration, for the init log line. */
void cpu_runtime_describe(char *buf, size_t size);

/* Validates a device index for a call made by `fn`: DK_INVALID_ARGUMENT when
 * out of range, DK_DEVICE_LOST for the device named by
 * DEVKIT_CPU_LOST_DEVICE. *out is NULL on failure. */
DK_Status cpu_device_get(const char *fn, int32_t dev, cpu_device **out);

/* ---- Memory --------------------------------------------------------------- */

/* Validates that `mem` is a live allocation of `d` and that
 * [offset, offset + size) lies inside it, then stores the host address of
 * mem + offset in *addr (NULL on failure). `what` names the operand in
 * messages ("dst"). */
DK_Status cpu_mem_range(const char *fn, const char *what, cpu_device *d,
                        DK_Mem mem, size_t offset, size_t size, uint8_t **addr);

/* ---- Streams -------------------------------------------------------------- */

/* An in-order queue with its own worker thread. */
typedef struct cpu_stream cpu_stream;

/* Validates that `stream` is a live stream of `d` and pins it (it cannot be
 * destroyed) until cpu_stream_release. A NULL stream is the default stream:
 * *out = NULL and DK_OK. *out is NULL on failure. */
DK_Status cpu_stream_acquire(const char *fn, cpu_device *d, DK_Stream stream,
                             cpu_stream **out);
/* Unpins a stream from cpu_stream_acquire; NULL is ignored. */
void cpu_stream_release(cpu_stream *s);

/* Allocates a work item with `arg_size` zeroed, max-aligned bytes of argument
 * storage and returns that storage, or NULL when out of memory. run(arg) does
 * the work; destroy(arg) (may be NULL) then releases what arg references. */
void *cpu_work_new(size_t arg_size, void (*run)(void *arg),
                   void (*destroy)(void *arg));
/* Submits the item owning `arg` (from cpu_work_new) to pinned stream `s`,
 * behind everything submitted before, and returns DK_OK. With s == NULL (the
 * default stream) it runs in the calling thread, is complete on return, and
 * the result is the status its run passed to cpu_work_fail (DK_OK if none),
 * with the message already in the caller's error buffer. Submission itself
 * cannot fail; the item is freed once it has run. */
DK_Status cpu_work_submit(cpu_stream *s, void *arg);
/* cpu_work_submit to pinned stream `s` for an item a graph may not hold (a
 * graph launch, a callback): false, the caller still owning the item, when
 * `s` is capturing -- checked under the stream's lock, so this closes the
 * gap after the caller's own cpu_stream_capture check. */
bool cpu_work_submit_uncaptured(cpu_stream *s, void *arg);
/* Frees an item that will not be submitted, without calling destroy. */
void cpu_work_discard(void *arg);
/* Called from a run function: reports that the item failed with `status`
 * and a message formatted like cpu_set_error's (the function name first).
 * The last call during one run wins. Returns `status`. */
DK_Status cpu_work_fail(DK_Status status, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));
/* The stream whose worker thread is the caller (a run function or a host
 * callback is running), else NULL. Lets blocking calls refuse to wait for
 * their own stream. */
cpu_stream *cpu_stream_current(void);

/* ---- Graphs (graph.c; capture hooks in stream.c, runtime.c, kernel.c) ---- */

/* Captured work: a list of stream work items (kept and re-run at every
 * launch) and event operations, plus the tensor slots of its kernel calls.
 * While a stream captures, cpu_work_submit hands its items to the graph
 * instead of the queue. */
typedef struct cpu_graph cpu_graph;
typedef struct cpu_event cpu_event;

/* The graph pinned stream `s` is capturing into, or NULL (also for s NULL). */
cpu_graph *cpu_stream_capture(cpu_stream *s);
/* DK_FAILED_PRECONDITION for `fn`, refused because `s` is capturing. */
DK_Status cpu_capture_refused(const char *fn, const cpu_stream *s);
/* DK_FAILED_PRECONDITION when a stream of `d` is capturing (for calls that
 * would free or wait for memory captured work may use), else DK_OK. */
DK_Status cpu_device_capture_check(const char *fn, cpu_device *d);
/* Begin / end a capture on pinned stream `s` (stream.c keeps the pointer). */
DK_Status cpu_stream_begin_capture(const char *fn, cpu_stream *s, cpu_graph *g);
cpu_graph *cpu_stream_end_capture(cpu_stream *s);

/* Capture-time appends. add_work takes ownership of a work item's `arg`;
 * add_event takes a reference to `e`; add_tensors records the kernel call's
 * present tensors (resolved in `tensors`, inside the item to be submitted)
 * as the next slots; add_mem records a copy's device operand, checked at
 * every launch. Each returns DK_RESOURCE_EXHAUSTED when out of memory. */
void cpu_graph_add_work(cpu_graph *g, void *arg);
DK_Status cpu_graph_add_event(cpu_graph *g, cpu_event *e, bool record);
DK_Status cpu_graph_add_mem(cpu_graph *g, DK_Mem mem, size_t offset, size_t size);
struct cpu_tensor;
DK_Status cpu_graph_add_tensors(cpu_graph *g, const DK_KernelCall *call,
                                struct cpu_tensor *tensors);

/* Work-item and event helpers for graph launches (stream.c). rerun runs an
 * item without freeing it and returns what it reported; run_once runs and
 * frees it; free releases one that will not run again. */
DK_Status cpu_work_rerun(void *arg);
DK_Status cpu_work_run_once(void *arg);
void cpu_work_free(void *arg);
void cpu_event_retain(cpu_event *e);
void cpu_event_put(cpu_event *e);
void cpu_event_lock(cpu_event *e);
void cpu_event_unlock(cpu_event *e);
/* The work item of one launch-time record (record = true: it becomes e's
 * most recent record now) or wait (for the record most recent now) of e.
 * The caller holds cpu_event_lock(e). NULL when out of memory. */
void *cpu_event_bind(cpu_event *e, bool record);

/* ---- DK_DeviceApi entry points ------------------------------------------- */

DK_Status cpu_get_device_count(int32_t *count);
DK_Status cpu_get_device_properties(int32_t dev, DK_DeviceProperties *props);
DK_Status cpu_device_synchronize(int32_t dev);

DK_Status cpu_mem_alloc(int32_t dev, size_t size, DK_Mem *mem);
DK_Status cpu_mem_free(int32_t dev, DK_Mem mem);
DK_Status cpu_mem_get_info(int32_t dev, size_t *free_bytes, size_t *total_bytes);
DK_Status cpu_mem_register_host(int32_t dev, void *ptr, size_t size, DK_Mem *mem);
DK_Status cpu_mem_unregister_host(int32_t dev, DK_Mem mem);
DK_Status cpu_memset(int32_t dev, DK_Mem mem, size_t offset, uint8_t value,
                     size_t size, DK_Stream stream);

DK_Status cpu_copy_h2d(int32_t dev, DK_Mem dst, size_t dst_offset,
                       const void *src, size_t size, DK_Stream stream);
DK_Status cpu_copy_d2h(int32_t dev, void *dst, DK_Mem src, size_t src_offset,
                       size_t size, DK_Stream stream);
DK_Status cpu_copy_d2d(int32_t dev, DK_Mem dst, size_t dst_offset, DK_Mem src,
                       size_t src_offset, size_t size, DK_Stream stream);

DK_Status cpu_stream_create(int32_t dev, DK_Stream *stream);
DK_Status cpu_stream_destroy(int32_t dev, DK_Stream stream);
DK_Status cpu_stream_synchronize(int32_t dev, DK_Stream stream);
DK_Status cpu_stream_query(int32_t dev, DK_Stream stream);
DK_Status cpu_stream_wait_event(int32_t dev, DK_Stream stream, DK_Event event);
DK_Status cpu_stream_add_callback(int32_t dev, DK_Stream stream, DK_HostFn fn,
                                  void *user_data);

DK_Status cpu_event_create(int32_t dev, uint32_t flags, DK_Event *event);
DK_Status cpu_event_destroy(int32_t dev, DK_Event event);
DK_Status cpu_event_record(int32_t dev, DK_Event event, DK_Stream stream);
DK_Status cpu_event_query(int32_t dev, DK_Event event);
DK_Status cpu_event_synchronize(int32_t dev, DK_Event event);
DK_Status cpu_event_elapsed_ms(int32_t dev, DK_Event start, DK_Event end,
                               float *ms);

DK_Status cpu_copy_p2p(int32_t dst_dev, DK_Mem dst, size_t dst_offset,
                       int32_t src_dev, DK_Mem src, size_t src_offset,
                       size_t size, DK_Stream stream);
DK_Status cpu_host_alloc(int32_t dev, size_t size, void **ptr);
DK_Status cpu_host_free(int32_t dev, void *ptr);
DK_Status cpu_mem_alloc_async(int32_t dev, size_t size, DK_Stream stream,
                              DK_Mem *mem);
DK_Status cpu_mem_free_async(int32_t dev, DK_Mem mem, DK_Stream stream);

/* Collectives (ccl.c): ranks are processes or threads of one host that meet
 * in a POSIX shared-memory segment named by the unique id; see ccl.c. */
DK_Status cpu_ccl_unique_id_size(size_t *size);
DK_Status cpu_ccl_get_unique_id(void *id, size_t size);
DK_Status cpu_ccl_comm_init(int32_t dev, int32_t nranks, const void *id,
                            size_t id_size, int32_t rank, DK_Comm *comm);
DK_Status cpu_ccl_comm_destroy(DK_Comm comm);
DK_Status cpu_all_reduce(DK_Comm comm, DK_Mem send, size_t send_offset,
                         DK_Mem recv, size_t recv_offset, size_t count,
                         DK_DTypeKey dtype, int32_t op, DK_Stream stream);
DK_Status cpu_broadcast(DK_Comm comm, DK_Mem send, size_t send_offset,
                        DK_Mem recv, size_t recv_offset, size_t count,
                        DK_DTypeKey dtype, int32_t root, DK_Stream stream);
DK_Status cpu_reduce(DK_Comm comm, DK_Mem send, size_t send_offset,
                     DK_Mem recv, size_t recv_offset, size_t count,
                     DK_DTypeKey dtype, int32_t op, int32_t root,
                     DK_Stream stream);
DK_Status cpu_all_gather(DK_Comm comm, DK_Mem send, size_t send_offset,
                         DK_Mem recv, size_t recv_offset, size_t send_count,
                         DK_DTypeKey dtype, DK_Stream stream);
DK_Status cpu_reduce_scatter(DK_Comm comm, DK_Mem send, size_t send_offset,
                             DK_Mem recv, size_t recv_offset,
                             size_t recv_count, DK_DTypeKey dtype, int32_t op,
                             DK_Stream stream);
DK_Status cpu_all_to_all(DK_Comm comm, DK_Mem send, size_t send_offset,
                         DK_Mem recv, size_t recv_offset, size_t count,
                         DK_DTypeKey dtype, DK_Stream stream);
DK_Status cpu_send(DK_Comm comm, DK_Mem buf, size_t offset, size_t count,
                   DK_DTypeKey dtype, int32_t peer, DK_Stream stream);
DK_Status cpu_recv(DK_Comm comm, DK_Mem buf, size_t offset, size_t count,
                   DK_DTypeKey dtype, int32_t peer, DK_Stream stream);
DK_Status cpu_group_start(void);
DK_Status cpu_group_end(void);

DK_Status cpu_graph_begin_capture(int32_t dev, DK_Stream stream);
DK_Status cpu_graph_end_capture(int32_t dev, DK_Stream stream, DK_Graph *graph,
                                size_t *num_slots);
DK_Status cpu_graph_launch(int32_t dev, DK_Graph graph, DK_Stream stream);
DK_Status cpu_graph_rebind(int32_t dev, DK_Graph graph, size_t slot, DK_Mem mem,
                           size_t offset);
DK_Status cpu_graph_destroy(int32_t dev, DK_Graph graph);

/* Codegen (codegen.c): present in the table only when a C compiler is found
 * when the plugin loads (cpu_codegen_available). */
bool cpu_codegen_available(void);
DK_Status cpu_codegen_dialect(int32_t dev, const char **dialect);
DK_Status cpu_codegen_compile(int32_t dev, const char *source, const char *options,
                              DK_Module *module, int32_t *from_cache);
DK_Status cpu_codegen_get_function(int32_t dev, DK_Module module, const char *name,
                                   const int32_t *arg_kinds, size_t num_args,
                                   DK_Function *function);
DK_Status cpu_codegen_launch(int32_t dev, DK_Function function, const DK_LaunchArg *args,
                             size_t num_args, const DK_LaunchShape *shape, DK_Stream stream);
DK_Status cpu_codegen_unload(int32_t dev, DK_Module module);

#endif /* DEVKIT_BACKENDS_CPU_CPU_INTERNAL_H_ */
