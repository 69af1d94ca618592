/*
 * acme_internal.h -- internal API of the devkit "acme" plugin.
 *
 * Shared by the runtime (devices, memory, copies), the stream/event engine
 * and whatever later enqueues work on streams (kernels, collectives). None of
 * this is exported: the plugin's only public symbol is DK_PluginInit.
 *
 * Calling pattern for code that submits stream work:
 *
 *   acme_device *d;  acme_stream *s;  uint8_t *ptr;
 *   if ((st = acme_device_get(fn, dev, &d))) return st;
 *   if ((st = acme_mem_range(fn, "dst", d, mem, offset, size, &ptr))) return st;
 *   if ((st = acme_stream_acquire(fn, d, stream, &s))) return st;
 *   my_args *a = acme_work_new(sizeof *a, my_run, my_destroy);
 *   if (!a) { acme_stream_release(s); return acme_set_error(...); }
 *   ...fill *a...
 *   st = acme_work_submit(s, a);  // DK_OK, or the failure of a default-stream run
 *   acme_stream_release(s);
 *   return st;
 *
 * Asynchronous failures (devkit.h CONVENTIONS): a run function that fails
 * calls acme_work_fail. On a stream the failure becomes the stream's sticky
 * error: the first one is kept, with a copy of its message, until
 * stream_destroy, and stream_synchronize, stream_query, device_synchronize
 * and event_query / event_synchronize of records queued after it report it.
 * Work queued behind a failed item still runs (copies, callbacks, records
 * and frees must not be lost); code whose work depends on earlier work
 * tracks that itself (a failed communicator makes its later collectives fail
 * at once with DK_ABORTED). On the default stream (s == NULL) the failure is
 * returned by acme_work_submit instead.
 */
#ifndef ACME_INTERNAL_H_
#define ACME_INTERNAL_H_

#include <pthread.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "devkit.h"

#define ACME_PLUGIN_VERSION "1.0.0"
/* An Acme board carries up to 8 NPUs. */
#define ACME_MAX_DEVICES 8
/* DLPack's device type for tensors on an NPU (DK_Tensor.device): an NPU is
 * not the host CPU, even where its memory is host-addressable. */
#define ACME_DEVICE_TYPE DK_DEVICE_TYPE_EXT_DEV
#define ACME_ALLOC_ALIGNMENT 64

/* ---- Errors -------------------------------------------------------------- */

/* Formats the calling thread's error message and returns `status`. Messages
 * start with the ABI function name, e.g. "copy_d2h: dst is NULL". */
DK_Status acme_set_error(DK_Status status, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));
/* DK_PluginInfo.last_error_message: the calling thread's message, never NULL. */
const char *acme_last_error(void);

/* VERSIONING rule 4 for an "out" struct: copies the fields of `src` (a struct
 * of `src_size` bytes starting with struct_size) that fit in the caller's
 * dst->struct_size, then sets dst->struct_size to the bytes filled. The
 * caller has checked dst->struct_size >= sizeof(size_t). */
void acme_copy_out(void *dst, const void *src, size_t src_size);

/* ---- Registry: open-addressing hash table, non-zero key -> value ---------- */

typedef struct acme_slot {
  uintptr_t key; /* 0 = empty */
  size_t value;
} acme_slot;

typedef struct acme_table {
  acme_slot *slots; /* capacity entries, capacity a power of two (or 0) */
  size_t capacity;
  size_t count;
} acme_table;

/* The caller holds the lock guarding the table. `value` may be NULL. */
bool acme_table_find(const acme_table *t, uintptr_t key, size_t *value);
/* `key` must be non-zero and absent. False when out of memory. */
bool acme_table_insert(acme_table *t, uintptr_t key, size_t value);
bool acme_table_remove(acme_table *t, uintptr_t key, size_t *value);

/* ---- Devices -------------------------------------------------------------- */

/* Per-device state. Every lock is per device and per registry, so work on
 * different devices (and lookups of different object kinds) never contends.
 * Aligned so that two devices never share a cache line. */
typedef struct acme_device {
  _Alignas(64) int32_t index;

  pthread_mutex_t mem_mu; /* guards mems, host, used */
  acme_table mems;         /* live DK_Mem handle -> requested size */
  acme_table host;         /* live host_alloc pointer -> size */
  size_t used;            /* bytes of mems counted against the capacity */

  pthread_mutex_t stream_mu; /* guards streams */
  acme_table streams;         /* live acme_stream pointers */

  pthread_mutex_t event_mu; /* guards events */
  acme_table events;         /* live acme_event pointers */
} acme_device;

/* Reads the configuration and sets up the devices once per process; later
 * calls return the first call's result (and its message). */
DK_Status acme_runtime_init(void);
/* One-line summary of the configuration, for the init log line. */
void acme_runtime_describe(char *buf, size_t size);

/* Validates a device index for a call made by `fn`: DK_INVALID_ARGUMENT when
 * out of range, DK_DEVICE_LOST for the device named by
 * ACME_LOST_DEVICE. *out is NULL on failure. */
DK_Status acme_device_get(const char *fn, int32_t dev, acme_device **out);

/* ---- Memory --------------------------------------------------------------- */

/* Validates that `mem` is a live allocation of `d` and that
 * [offset, offset + size) lies inside it, then stores the host address of
 * mem + offset in *addr (NULL on failure). `what` names the operand in
 * messages ("dst"). */
DK_Status acme_mem_range(const char *fn, const char *what, acme_device *d,
                        DK_Mem mem, size_t offset, size_t size, uint8_t **addr);

/* ---- Streams -------------------------------------------------------------- */

/* An in-order queue with its own worker thread. */
typedef struct acme_stream acme_stream;

/* Validates that `stream` is a live stream of `d` and pins it (it cannot be
 * destroyed) until acme_stream_release. A NULL stream is the default stream:
 * *out = NULL and DK_OK. *out is NULL on failure. */
DK_Status acme_stream_acquire(const char *fn, acme_device *d, DK_Stream stream,
                             acme_stream **out);
/* Unpins a stream from acme_stream_acquire; NULL is ignored. */
void acme_stream_release(acme_stream *s);

/* Allocates a work item with `arg_size` zeroed, max-aligned bytes of argument
 * storage and returns that storage, or NULL when out of memory. run(arg) does
 * the work; destroy(arg) (may be NULL) then releases what arg references. */
void *acme_work_new(size_t arg_size, void (*run)(void *arg),
                   void (*destroy)(void *arg));
/* Submits the item owning `arg` (from acme_work_new) to pinned stream `s`,
 * behind everything submitted before, and returns DK_OK. With s == NULL (the
 * default stream) it runs in the calling thread, is complete on return, and
 * the result is the status its run passed to acme_work_fail (DK_OK if none),
 * with the message already in the caller's error buffer. Submission itself
 * cannot fail; the item is freed once it has run. */
DK_Status acme_work_submit(acme_stream *s, void *arg);
/* Frees an item that will not be submitted, without calling destroy. */
void acme_work_discard(void *arg);
/* Called from a run function: reports that the item failed with `status`
 * and a message formatted like acme_set_error's (the function name first).
 * The last call during one run wins. Returns `status`. */
DK_Status acme_work_fail(DK_Status status, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));
/* The stream whose worker thread is the caller (a run function or a host
 * callback is running), else NULL. Lets blocking calls refuse to wait for
 * their own stream. */
acme_stream *acme_stream_current(void);

/* ---- DK_DeviceApi entry points ------------------------------------------- */

DK_Status acme_get_device_count(int32_t *count);
DK_Status acme_get_device_properties(int32_t dev, DK_DeviceProperties *props);
DK_Status acme_device_synchronize(int32_t dev);

DK_Status acme_mem_alloc(int32_t dev, size_t size, DK_Mem *mem);
DK_Status acme_mem_free(int32_t dev, DK_Mem mem);
DK_Status acme_mem_get_info(int32_t dev, size_t *free_bytes, size_t *total_bytes);
DK_Status acme_memset(int32_t dev, DK_Mem mem, size_t offset, uint8_t value,
                     size_t size, DK_Stream stream);

DK_Status acme_copy_h2d(int32_t dev, DK_Mem dst, size_t dst_offset,
                       const void *src, size_t size, DK_Stream stream);
DK_Status acme_copy_d2h(int32_t dev, void *dst, DK_Mem src, size_t src_offset,
                       size_t size, DK_Stream stream);
DK_Status acme_copy_d2d(int32_t dev, DK_Mem dst, size_t dst_offset, DK_Mem src,
                       size_t src_offset, size_t size, DK_Stream stream);

DK_Status acme_stream_create(int32_t dev, DK_Stream *stream);
DK_Status acme_stream_destroy(int32_t dev, DK_Stream stream);
DK_Status acme_stream_synchronize(int32_t dev, DK_Stream stream);
DK_Status acme_stream_query(int32_t dev, DK_Stream stream);
DK_Status acme_stream_wait_event(int32_t dev, DK_Stream stream, DK_Event event);
DK_Status acme_stream_add_callback(int32_t dev, DK_Stream stream, DK_HostFn fn,
                                  void *user_data);

DK_Status acme_event_create(int32_t dev, uint32_t flags, DK_Event *event);
DK_Status acme_event_destroy(int32_t dev, DK_Event event);
DK_Status acme_event_record(int32_t dev, DK_Event event, DK_Stream stream);
DK_Status acme_event_query(int32_t dev, DK_Event event);
DK_Status acme_event_synchronize(int32_t dev, DK_Event event);
DK_Status acme_event_elapsed_ms(int32_t dev, DK_Event start, DK_Event end,
                               float *ms);

DK_Status acme_copy_p2p(int32_t dst_dev, DK_Mem dst, size_t dst_offset,
                       int32_t src_dev, DK_Mem src, size_t src_offset,
                       size_t size, DK_Stream stream);
DK_Status acme_host_alloc(int32_t dev, size_t size, void **ptr);
DK_Status acme_host_free(int32_t dev, void *ptr);
DK_Status acme_mem_alloc_async(int32_t dev, size_t size, DK_Stream stream,
                              DK_Mem *mem);
DK_Status acme_mem_free_async(int32_t dev, DK_Mem mem, DK_Stream stream);

#endif /* ACME_INTERNAL_H_ */
