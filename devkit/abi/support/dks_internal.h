/*
 * dks_internal.h -- what the support library's sources share beyond the
 * public dks.h / dks_kernel.h: the device registry, the configuration, the
 * capture hooks between streams, graphs and their producers, and the
 * DK_DeviceApi functions that dks_fill_api publishes.
 *
 * Test-only: the sources hold a few `#ifdef DEVKIT_DEFECT_*` blocks, each
 * planting one deliberate defect where no device hook can reach it (stream
 * order, event completion, graph rebinding, call checks, tensor strides and
 * broadcasting). Only devkit's defect variants define them
 * (devkit/backends/cpu/defects.py), to test the conformance suite.
 */
#ifndef DEVKIT_ABI_SUPPORT_DKS_INTERNAL_H_
#define DEVKIT_ABI_SUPPORT_DKS_INTERNAL_H_

#include <pthread.h>
#include <stdatomic.h>

#include "dks_kernel.h"

#pragma GCC visibility push(hidden) /* as in dks.h */

/* ---- Devices -------------------------------------------------------------- */

/* Per-device state. Every lock is per device and per registry, so work on
 * different devices (and lookups of different object kinds) never contends.
 * Aligned so that two devices never share a cache line. */
struct dks_device {
  _Alignas(64) int32_t index;

  pthread_mutex_t mem_mu; /* guards mems, registered, host, used */
  dks_table mems;         /* live DK_Mem handle -> requested size */
  dks_table registered;   /* the mems that mem_register_host made -> size */
  dks_table host;         /* live host_alloc pointer -> size */
  size_t used;            /* bytes of mems counted against the capacity */
  size_t capacity;        /* DEVKIT_<NAME>_MEMORY, else the hooks' total_memory */
  DK_DeviceProperties props; /* the properties hook's, capped at the capacity */

  pthread_mutex_t stream_mu; /* guards streams */
  dks_table streams;         /* live dks_stream pointers */

  pthread_mutex_t event_mu; /* guards events */
  dks_table events;         /* live dks_event pointers */

  pthread_mutex_t graph_mu; /* guards graphs */
  dks_table graphs;         /* live dks_graph pointers */
  atomic_int capturing;     /* streams of this device capturing a graph */
};

/* A copy of the plugin's hooks, made by the first dks_plugin_init before
 * any device exists: fields past the plugin's struct_size are NULL. */
extern dks_device_hooks dks_hooks;
/* The device name ("cpu"), for messages: "<name> device 0". */
const char *dks_name(void);

/* Reads the configuration and sets up the devices from `hooks` once per
 * process; later calls return the first call's result (and its message). */
DK_Status dks_runtime_init(const dks_device_hooks *hooks);
/* DEVKIT_<NAME>_KERNELS=primitives: the kernel table keeps only the
 * primitive set's kernels. */
bool dks_primitives_only(void);
/* DEVKIT_<NAME>_FAIL_ALLOC: DK_RESOURCE_EXHAUSTED, with the message, when
 * this allocation (every call of `fn` on any device counts) is the one to
 * fail; else DK_OK. */
DK_Status dks_injected_alloc_failure(const char *fn, const dks_device *d, size_t size);
/* One-line summary of the configuration, for the init log line. */
void dks_runtime_describe(char *buf, size_t size);
/* The published kernel table (kernel.c): pointers valid while the plugin is
 * loaded. Duplicate (op, dtype) registrations are refused at init. */
DK_Status dks_kernel_table(const DK_KernelEntry *const **entries, size_t *count);

/* ---- Streams (stream.c) --------------------------------------------------- */

/* dks_work_submit to pinned stream `s` for an item a graph may not hold (a
 * graph launch, a callback): false, the caller still owning the item, when
 * `s` is capturing -- checked under the stream's lock, so this closes the
 * gap after the caller's own dks_stream_capture check. */
bool dks_work_submit_uncaptured(dks_stream *s, void *arg);

/* ---- Graphs (graph.c; capture hooks in stream.c, runtime.c, kernel.c) ---- */

/* Captured work: a list of stream work items (kept and re-run at every
 * launch) and event operations, plus the tensor slots of its kernel calls.
 * While a stream captures, dks_work_submit hands its items to the graph
 * instead of the queue. */
typedef struct dks_graph dks_graph;
typedef struct dks_event dks_event;

/* The graph pinned stream `s` is capturing into, or NULL (also for s NULL). */
dks_graph *dks_stream_capture(dks_stream *s);
/* DK_FAILED_PRECONDITION when a stream of `d` is capturing (for calls that
 * would free or wait for memory captured work may use), else DK_OK. */
DK_Status dks_device_capture_check(const char *fn, dks_device *d);
/* Begin / end a capture on pinned stream `s` (stream.c keeps the pointer). */
DK_Status dks_stream_begin_capture(const char *fn, dks_stream *s, dks_graph *g);
dks_graph *dks_stream_end_capture(dks_stream *s);

/* Capture-time appends. add_work takes ownership of a work item's `arg`;
 * add_event takes a reference to `e`; add_tensors records the kernel call's
 * present tensors (resolved in `tensors`, inside the item to be submitted)
 * as the next slots; add_mem records a copy's device operand, checked at
 * every launch. Each returns DK_RESOURCE_EXHAUSTED when out of memory. */
void dks_graph_add_work(dks_graph *g, void *arg);
DK_Status dks_graph_add_event(dks_graph *g, dks_event *e, bool record);
DK_Status dks_graph_add_mem(dks_graph *g, DK_Mem mem, size_t offset, size_t size);
DK_Status dks_graph_add_tensors(dks_graph *g, const DK_KernelCall *call, dks_tensor *tensors);

/* Work-item and event helpers for graph launches (stream.c). rerun runs an
 * item without freeing it and returns what it reported; run_once runs and
 * frees it; free releases one that will not run again. */
DK_Status dks_work_rerun(void *arg);
DK_Status dks_work_run_once(void *arg);
void dks_work_free(void *arg);
void dks_event_retain(dks_event *e);
void dks_event_put(dks_event *e);
void dks_event_lock(dks_event *e);
void dks_event_unlock(dks_event *e);
/* The work item of one launch-time record (record = true: it becomes e's
 * most recent record now) or wait (for the record most recent now) of e.
 * The caller holds dks_event_lock(e). NULL when out of memory. */
void *dks_event_bind(dks_event *e, bool record);

/* ---- DK_DeviceApi entry points (dks_fill_api) ----------------------------- */

DK_Status dks_get_device_count(int32_t *count);
DK_Status dks_get_device_properties(int32_t dev, DK_DeviceProperties *props);
DK_Status dks_device_synchronize(int32_t dev);

DK_Status dks_mem_alloc(int32_t dev, size_t size, DK_Mem *mem);
DK_Status dks_mem_free(int32_t dev, DK_Mem mem);
DK_Status dks_mem_get_info(int32_t dev, size_t *free_bytes, size_t *total_bytes);
DK_Status dks_mem_register_host(int32_t dev, void *ptr, size_t size, DK_Mem *mem);
DK_Status dks_mem_unregister_host(int32_t dev, DK_Mem mem);
DK_Status dks_memset(int32_t dev, DK_Mem mem, size_t offset, uint8_t value,
                     size_t size, DK_Stream stream);

DK_Status dks_copy_h2d(int32_t dev, DK_Mem dst, size_t dst_offset,
                       const void *src, size_t size, DK_Stream stream);
DK_Status dks_copy_d2h(int32_t dev, void *dst, DK_Mem src, size_t src_offset,
                       size_t size, DK_Stream stream);
DK_Status dks_copy_d2d(int32_t dev, DK_Mem dst, size_t dst_offset, DK_Mem src,
                       size_t src_offset, size_t size, DK_Stream stream);

DK_Status dks_stream_create(int32_t dev, DK_Stream *stream);
DK_Status dks_stream_destroy(int32_t dev, DK_Stream stream);
DK_Status dks_stream_synchronize(int32_t dev, DK_Stream stream);
DK_Status dks_stream_query(int32_t dev, DK_Stream stream);
DK_Status dks_stream_wait_event(int32_t dev, DK_Stream stream, DK_Event event);
DK_Status dks_stream_add_callback(int32_t dev, DK_Stream stream, DK_HostFn fn,
                                  void *user_data);

DK_Status dks_event_create(int32_t dev, uint32_t flags, DK_Event *event);
DK_Status dks_event_destroy(int32_t dev, DK_Event event);
DK_Status dks_event_record(int32_t dev, DK_Event event, DK_Stream stream);
DK_Status dks_event_query(int32_t dev, DK_Event event);
DK_Status dks_event_synchronize(int32_t dev, DK_Event event);
DK_Status dks_event_elapsed_ms(int32_t dev, DK_Event start, DK_Event end,
                               float *ms);

DK_Status dks_copy_p2p(int32_t dst_dev, DK_Mem dst, size_t dst_offset,
                       int32_t src_dev, DK_Mem src, size_t src_offset,
                       size_t size, DK_Stream stream);
DK_Status dks_host_alloc(int32_t dev, size_t size, void **ptr);
DK_Status dks_host_free(int32_t dev, void *ptr);
DK_Status dks_mem_alloc_async(int32_t dev, size_t size, DK_Stream stream,
                              DK_Mem *mem);
DK_Status dks_mem_free_async(int32_t dev, DK_Mem mem, DK_Stream stream);

DK_Status dks_graph_begin_capture(int32_t dev, DK_Stream stream);
DK_Status dks_graph_end_capture(int32_t dev, DK_Stream stream, DK_Graph *graph,
                                size_t *num_slots);
DK_Status dks_graph_launch(int32_t dev, DK_Graph graph, DK_Stream stream);
DK_Status dks_graph_rebind(int32_t dev, DK_Graph graph, size_t slot, DK_Mem mem,
                           size_t offset);
DK_Status dks_graph_destroy(int32_t dev, DK_Graph graph);

#pragma GCC visibility pop

#endif /* DEVKIT_ABI_SUPPORT_DKS_INTERNAL_H_ */
