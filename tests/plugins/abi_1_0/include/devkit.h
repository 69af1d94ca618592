/*
 * devkit.h -- the devkit device plugin ABI.
 *
 * This header is the single source of truth for the interface between a
 * devkit host (the devkit Python runtime, the conformance suite, a framework)
 * and a device plugin. The Python bindings are generated from this file at
 * import time; nothing else declares these types.
 *
 * ========================================================================
 * VERSIONING
 * ========================================================================
 *
 *  1. DK_ABI_MAJOR changes when anything is removed, reordered or changes
 *     type. A host refuses a plugin whose major version differs from its own.
 *  2. DK_ABI_MINOR changes when fields are appended to a struct or functions
 *     are appended to a table. Structs are append-only: a field, once
 *     published, keeps its offset and type for the life of the major version.
 *  3. Every struct that crosses the boundary starts with `size_t struct_size`,
 *     set by whoever allocates the struct to sizeof() of the struct as that
 *     party was compiled. A reader uses only fields that lie entirely inside
 *     `struct_size`; fields past it are treated as absent (zero / NULL).
 *     The only structs without struct_size are DK_Device, DK_DataType and
 *     DK_Tensor, whose layout is DLPack's and is frozen by DLPack itself.
 *  4. For "out" structs the caller allocates, zero-fills and sets
 *     struct_size to its own sizeof(); the callee writes only fields inside
 *     that size and then sets struct_size to the number of bytes it filled
 *     (min of the caller's size and its own sizeof()).
 *  5. A plugin built against an older minor version keeps loading: the host
 *     treats fields and functions past the plugin's struct_size as absent and
 *     uses its documented fallback. A required function that is absent or
 *     NULL makes the host refuse the plugin with a message naming it.
 *
 * ========================================================================
 * ERROR MODEL
 * ========================================================================
 *
 *  Every function returns a DK_Status. On any status other than DK_OK and
 *  DK_NOT_READY the plugin sets a human-readable message that the host reads
 *  with DK_PluginInfo.last_error_message() on the same thread, before making
 *  any other call into the plugin on that thread. Messages name the problem
 *  concretely (the function, the bad value, the limit it broke).
 *  Out-parameters are unspecified when a function fails.
 *  A plugin never aborts the process on bad input: invalid handles, device
 *  indices, NULL pointers and out-of-bounds ranges are reported as
 *  DK_INVALID_ARGUMENT or DK_OUT_OF_RANGE.
 *
 * ========================================================================
 * CONVENTIONS
 * ========================================================================
 *
 *  - Devices are named by index, 0 <= dev < get_device_count(). There is no
 *    hidden "current device" state; every call names its device.
 *  - Device memory is addressed as (DK_Mem handle, byte offset). Handles are
 *    opaque: a raw pointer (cpu, cuda), a cl_mem (opencl). A host never does
 *    arithmetic on a handle unless the device reports
 *    DK_DEVICE_HOST_POINTER_HANDLES, in which case handle + offset is a host
 *    address the host may read and write directly (zero-copy interop).
 *  - Streams are in-order queues. Work submitted to one stream runs in
 *    submission order; work on different streams is unordered unless joined
 *    with events. A NULL stream means the device's default stream: the
 *    operation is complete when the call returns and is not ordered against
 *    work pending on other streams.
 *  - "(in)" pointers are read during the call only, unless stated otherwise;
 *    "(out)" pointers are written by the callee; "(borrowed)" pointers are
 *    owned by the other party and must outlive the stated period; "(owned by
 *    the plugin)" data lives until the plugin is unloaded.
 *  - All functions are thread-safe. Host callbacks (DK_HostFn, DK_LogFn) may
 *    run on a plugin-owned thread; a host callback must not wait for work on
 *    the stream that runs it (the plugin answers DK_FAILED_PRECONDITION).
 *  - Using a handle while another thread destroys it is a host error; the
 *    plugin reports it as DK_INVALID_ARGUMENT wherever it can tell.
 *  - Work that fails after its call returned (a collective whose peer died)
 *    is reported by the stream: the next stream_synchronize, stream_query or
 *    device_synchronize, and event_query / event_synchronize of any event
 *    recorded after it, return its status and message. The error is sticky:
 *    the stream keeps reporting it until it is destroyed. device_synchronize
 *    reports the first failed stream it finds; stream_wait_event does not
 *    carry an error from one stream to another.
 *  - Plugins are never unloaded while the host process runs.
 *
 *  This header is also parsed by cffi. Keep to: integer-constant #defines,
 *  #ifdef __cplusplus blocks, the include guard, DK_EXPORT, and plain C
 *  declarations; enumerator values may be integer expressions.
 */
#ifndef DEVKIT_ABI_DEVKIT_H_
#define DEVKIT_ABI_DEVKIT_H_

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define DK_ABI_MAJOR 1
#define DK_ABI_MINOR 0

#if defined(_WIN32)
#define DK_EXPORT __declspec(dllexport)
#else
#define DK_EXPORT __attribute__((visibility("default")))
#endif

/* ------------------------------------------------------------------------
 * Status codes (abseil numbering; DK_DEVICE_LOST and DK_NOT_READY are ours).
 * ------------------------------------------------------------------------ */
typedef int32_t DK_Status;

enum DK_StatusCode {
  DK_OK = 0,
  DK_CANCELLED = 1,
  DK_UNKNOWN = 2,
  DK_INVALID_ARGUMENT = 3,   /* bad value, handle, device index or NULL */
  DK_DEADLINE_EXCEEDED = 4,  /* a wait timed out (e.g. a collective peer) */
  DK_NOT_FOUND = 5,
  DK_ALREADY_EXISTS = 6,
  DK_PERMISSION_DENIED = 7,
  DK_RESOURCE_EXHAUSTED = 8, /* out of device or host memory */
  DK_FAILED_PRECONDITION = 9,
  DK_ABORTED = 10,
  DK_OUT_OF_RANGE = 11,      /* offset + size past the end of a buffer */
  DK_UNIMPLEMENTED = 12,
  DK_INTERNAL = 13,
  DK_UNAVAILABLE = 14,
  DK_DATA_LOSS = 15,
  DK_UNAUTHENTICATED = 16,
  DK_DEVICE_LOST = 100,      /* the device is unusable until restart */
  DK_NOT_READY = 101         /* not an error: work is still pending */
};

/* Returns the message for the last status other than DK_OK / DK_NOT_READY
 * returned on the calling thread. Never NULL. (owned by the plugin) valid
 * until the next call into the plugin on this thread. */
typedef const char *(*DK_LastErrorFn)(void);

/* ------------------------------------------------------------------------
 * Opaque handles. Each is owned by the plugin and valid from its create /
 * alloc call until its destroy / free call.
 * ------------------------------------------------------------------------ */
typedef struct DK_MemObject *DK_Mem;       /* device memory allocation */
typedef struct DK_StreamObject *DK_Stream; /* in-order work queue */
typedef struct DK_EventObject *DK_Event;   /* a position in a stream */
typedef struct DK_CommObject *DK_Comm;     /* a collective communicator */

/* ------------------------------------------------------------------------
 * DLPack-compatible tensor description (layout identical to DLPack's
 * DLDevice, DLDataType and DLTensor; codes are DLPack's).
 * ------------------------------------------------------------------------ */
enum DK_DeviceType {
  DK_DEVICE_TYPE_CPU = 1,
  DK_DEVICE_TYPE_CUDA = 2,
  DK_DEVICE_TYPE_CUDA_HOST = 3,
  DK_DEVICE_TYPE_OPENCL = 4,
  DK_DEVICE_TYPE_VULKAN = 7,
  DK_DEVICE_TYPE_METAL = 8,
  DK_DEVICE_TYPE_VPI = 9,
  DK_DEVICE_TYPE_ROCM = 10,
  DK_DEVICE_TYPE_EXT_DEV = 12,
  DK_DEVICE_TYPE_ONEAPI = 14
};

enum DK_DataTypeCode {
  DK_DTYPE_CODE_INT = 0,
  DK_DTYPE_CODE_UINT = 1,
  DK_DTYPE_CODE_FLOAT = 2,
  DK_DTYPE_CODE_BFLOAT = 4,
  DK_DTYPE_CODE_COMPLEX = 5,
  DK_DTYPE_CODE_BOOL = 6
};

/* Dtypes passed as function arguments are packed into 32 bits:
 * code | bits << 8 | lanes << 16 (lanes = 1 for every scalar type). */
typedef uint32_t DK_DTypeKey;

enum DK_DTypeKeys {
  DK_DTYPE_BOOL = 6 | (8 << 8) | (1 << 16),
  DK_DTYPE_INT8 = 0 | (8 << 8) | (1 << 16),
  DK_DTYPE_INT16 = 0 | (16 << 8) | (1 << 16),
  DK_DTYPE_INT32 = 0 | (32 << 8) | (1 << 16),
  DK_DTYPE_INT64 = 0 | (64 << 8) | (1 << 16),
  DK_DTYPE_UINT8 = 1 | (8 << 8) | (1 << 16),
  DK_DTYPE_UINT16 = 1 | (16 << 8) | (1 << 16),
  DK_DTYPE_UINT32 = 1 | (32 << 8) | (1 << 16),
  DK_DTYPE_UINT64 = 1 | (64 << 8) | (1 << 16),
  DK_DTYPE_FLOAT16 = 2 | (16 << 8) | (1 << 16),
  DK_DTYPE_FLOAT32 = 2 | (32 << 8) | (1 << 16),
  DK_DTYPE_FLOAT64 = 2 | (64 << 8) | (1 << 16),
  DK_DTYPE_BFLOAT16 = 4 | (16 << 8) | (1 << 16)
};

typedef struct DK_Device {
  int32_t device_type; /* DK_DeviceType (DLDeviceType) */
  int32_t device_id;
} DK_Device;

typedef struct DK_DataType {
  uint8_t code;   /* DK_DataTypeCode */
  uint8_t bits;
  uint16_t lanes;
} DK_DataType;

/* Layout of DLPack's DLTensor. `data` holds the DK_Mem handle (a cl_mem for
 * OpenCL) and `byte_offset` the offset into it. `shape` and `strides` are
 * (borrowed) for the duration of the call that receives the tensor; strides
 * are in elements, NULL for compact row-major. ndim == -1 marks an omitted
 * optional input. */
typedef struct DK_Tensor {
  void *data;
  DK_Device device;
  int32_t ndim;
  DK_DataType dtype;
  int64_t *shape;
  int64_t *strides;
  uint64_t byte_offset;
} DK_Tensor;

/* ------------------------------------------------------------------------
 * Host -> plugin information passed to DK_PluginInit.
 * ------------------------------------------------------------------------ */
enum DK_LogLevel {
  DK_LOG_DEBUG = 0,
  DK_LOG_INFO = 1,
  DK_LOG_WARNING = 2,
  DK_LOG_ERROR = 3
};

/* Host logging sink. `message` is (borrowed) for the call only. May be called
 * from any plugin thread. */
typedef void (*DK_LogFn)(void *user_data, int32_t level, const char *message);

typedef struct DK_HostInfo {
  size_t struct_size;
  uint32_t abi_major;        /* the host's DK_ABI_MAJOR */
  uint32_t abi_minor;        /* the host's DK_ABI_MINOR */
  DK_LogFn log;              /* may be NULL: the plugin then stays silent */
  void *log_user_data;       /* (borrowed) passed back to `log` */
  const char *host_name;     /* (borrowed) e.g. "devkit-python 0.1.0"; may be NULL */
} DK_HostInfo;

/* ------------------------------------------------------------------------
 * Device properties.
 * ------------------------------------------------------------------------ */
enum DK_DeviceFlags {
  DK_DEVICE_FP64 = 1 << 0,            /* float64 arithmetic supported */
  DK_DEVICE_FP16 = 1 << 1,            /* float16 storage supported */
  DK_DEVICE_BF16 = 1 << 2,            /* bfloat16 storage supported */
  DK_DEVICE_UNIFIED_MEMORY = 1 << 3,  /* device and host share memory */
  DK_DEVICE_HOST_POINTER_HANDLES = 1 << 4 /* handle + offset is a host address */
};

typedef struct DK_DeviceProperties {
  size_t struct_size;
  char name[128];            /* NUL-terminated, e.g. "devkit cpu device 0" */
  char vendor[128];          /* NUL-terminated */
  char driver_version[64];   /* NUL-terminated; may be empty */
  int32_t device_type;       /* DK_DeviceType used in DK_Tensor.device */
  int32_t compute_units;     /* >= 1 */
  uint64_t total_memory;     /* bytes */
  uint64_t max_alloc_size;   /* largest single mem_alloc, bytes */
  uint64_t alloc_alignment;  /* every allocation is aligned to this (power of 2) */
  uint64_t flags;            /* DK_DeviceFlags */
} DK_DeviceProperties;

/* ------------------------------------------------------------------------
 * Host functions run in stream order.
 * ------------------------------------------------------------------------ */
typedef void (*DK_HostFn)(void *user_data);

enum DK_EventFlags {
  DK_EVENT_DEFAULT = 0,
  DK_EVENT_DISABLE_TIMING = 1 << 0 /* elapsed_ms is refused for this event */
};

/* ------------------------------------------------------------------------
 * Collectives (optional section; all NULL = "no collectives").
 * ------------------------------------------------------------------------ */
enum DK_ReduceOp {
  DK_REDUCE_SUM = 0,
  DK_REDUCE_PROD = 1,
  DK_REDUCE_MAX = 2,
  DK_REDUCE_MIN = 3,
  DK_REDUCE_AVG = 4
};

/* ------------------------------------------------------------------------
 * Kernels (operator adaptation).
 * ------------------------------------------------------------------------ */
enum DK_AttributeType {
  DK_ATTR_INT = 0,     /* i */
  DK_ATTR_FLOAT = 1,   /* f */
  DK_ATTR_INTS = 2,    /* ints[count] */
  DK_ATTR_FLOATS = 3,  /* floats[count] */
  DK_ATTR_STRING = 4,  /* s, NUL-terminated */
  DK_ATTR_DTYPE = 5    /* dtype */
};

typedef struct DK_Attribute {
  size_t struct_size;
  const char *name;        /* (borrowed) for the call */
  int32_t type;            /* DK_AttributeType: says which field below is set */
  int32_t reserved;
  int64_t count;           /* element count of ints / floats */
  int64_t i;
  double f;
  const int64_t *ints;     /* (borrowed) for the call */
  const double *floats;    /* (borrowed) for the call */
  const char *s;           /* (borrowed) for the call */
  DK_DataType dtype;
} DK_Attribute;

typedef struct DK_KernelCall {
  size_t struct_size;
  int32_t device;
  DK_Stream stream;              /* never NULL: kernels are stream-ordered */
  const DK_Tensor *inputs;       /* (borrowed) array of num_inputs */
  size_t num_inputs;
  const DK_Tensor *outputs;      /* (borrowed) allocated by the host, shapes inferred */
  size_t num_outputs;
  const DK_Attribute *const *attributes; /* (borrowed) array of num_attributes */
  size_t num_attributes;
  void *user_data;               /* DK_KernelEntry.user_data */
} DK_KernelCall;

/* A kernel enqueues its work on call->stream and may return before the work
 * runs. Everything reachable from `call` is (borrowed) for the duration of
 * the call only: a kernel that runs later copies what it needs. */
typedef DK_Status (*DK_KernelFn)(const DK_KernelCall *call);

enum DK_KernelFlags {
  DK_KERNEL_STRIDED_INPUTS = 1 << 0,  /* accepts non-compact input strides */
  DK_KERNEL_STRIDED_OUTPUTS = 1 << 1  /* accepts non-compact output strides */
};

typedef struct DK_KernelEntry {
  size_t struct_size;
  const char *op;        /* (owned by the plugin) ONNX op name, e.g. "Add" */
  DK_DataType dtype;     /* dtype of the op's key input */
  DK_KernelFn fn;
  uint64_t flags;        /* DK_KernelFlags */
  void *user_data;       /* (owned by the plugin) passed in DK_KernelCall */
} DK_KernelEntry;

/* ------------------------------------------------------------------------
 * The device function table. Functions are required unless marked
 * OPTIONAL; an OPTIONAL function may be NULL and the host then uses the
 * documented fallback.
 * ------------------------------------------------------------------------ */
typedef struct DK_DeviceApi {
  size_t struct_size;

  /* --- Device --------------------------------------------------------- */
  /* (out) count >= 0 */
  DK_Status (*get_device_count)(int32_t *count);
  /* (out) props: caller sets struct_size, see VERSIONING rule 4. */
  DK_Status (*get_device_properties)(int32_t dev, DK_DeviceProperties *props);
  /* Blocks until all work on every stream of `dev` has completed. */
  DK_Status (*device_synchronize)(int32_t dev);

  /* --- Memory --------------------------------------------------------- */
  /* (out) *mem: a new allocation of `size` bytes, aligned to
   * alloc_alignment. size == 0 yields a valid handle that must be freed.
   * Contents are undefined. Fails with DK_RESOURCE_EXHAUSTED when the
   * device cannot hold it. */
  DK_Status (*mem_alloc)(int32_t dev, size_t size, DK_Mem *mem);
  /* Frees immediately: the caller guarantees no pending stream work uses
   * `mem` (use mem_free_async otherwise). NULL is accepted and ignored.
   * Freeing a handle not allocated on `dev` fails with DK_INVALID_ARGUMENT. */
  DK_Status (*mem_free)(int32_t dev, DK_Mem mem);
  /* (out) free_bytes, total_bytes */
  DK_Status (*mem_get_info)(int32_t dev, size_t *free_bytes, size_t *total_bytes);
  /* Sets `size` bytes at (mem, offset) to `value`. */
  DK_Status (*memset)(int32_t dev, DK_Mem mem, size_t offset, uint8_t value,
                      size_t size, DK_Stream stream);

  /* --- Copies (stream-ordered; bounds-checked against the allocation) --- */
  /* src: (borrowed) host memory that must stay valid and unchanged until the
   * copy completes on `stream`. */
  DK_Status (*copy_h2d)(int32_t dev, DK_Mem dst, size_t dst_offset,
                        const void *src, size_t size, DK_Stream stream);
  /* dst: (borrowed) host memory that must stay valid until the copy
   * completes on `stream`; its contents are defined only after that. */
  DK_Status (*copy_d2h)(int32_t dev, void *dst, DK_Mem src, size_t src_offset,
                        size_t size, DK_Stream stream);
  /* Both buffers on `dev`. Overlapping ranges behave like memmove. */
  DK_Status (*copy_d2d)(int32_t dev, DK_Mem dst, size_t dst_offset, DK_Mem src,
                        size_t src_offset, size_t size, DK_Stream stream);

  /* --- Streams -------------------------------------------------------- */
  /* (out) *stream */
  DK_Status (*stream_create)(int32_t dev, DK_Stream *stream);
  /* Waits for the stream's pending work, then destroys it. NULL accepted. */
  DK_Status (*stream_destroy)(int32_t dev, DK_Stream stream);
  DK_Status (*stream_synchronize)(int32_t dev, DK_Stream stream);
  /* DK_OK when all submitted work has completed, else DK_NOT_READY. */
  DK_Status (*stream_query)(int32_t dev, DK_Stream stream);
  /* Work submitted to `stream` after this call waits until the most recent
   * record of `event` (at the time of this call) has completed. An event
   * never recorded is complete. The event may belong to another stream of
   * the same device. */
  DK_Status (*stream_wait_event)(int32_t dev, DK_Stream stream, DK_Event event);
  /* Runs fn(user_data) in stream order, on a plugin thread. `user_data` is
   * (borrowed) until fn has run. */
  DK_Status (*stream_add_callback)(int32_t dev, DK_Stream stream, DK_HostFn fn,
                                   void *user_data);

  /* --- Events --------------------------------------------------------- */
  /* (out) *event; flags: DK_EventFlags. */
  DK_Status (*event_create)(int32_t dev, uint32_t flags, DK_Event *event);
  /* May be called while a record is pending; resources are released once it
   * completes. NULL accepted. */
  DK_Status (*event_destroy)(int32_t dev, DK_Event event);
  /* Captures the current end of `stream`; completes (and timestamps) when all
   * work submitted before it has run. Re-recording moves the event. */
  DK_Status (*event_record)(int32_t dev, DK_Event event, DK_Stream stream);
  /* DK_OK when the most recent record has completed, else DK_NOT_READY. */
  DK_Status (*event_query)(int32_t dev, DK_Event event);
  DK_Status (*event_synchronize)(int32_t dev, DK_Event event);
  /* (out) *ms = time between the completion of `start` and of `end`. An
   * event never recorded or created with DK_EVENT_DISABLE_TIMING is
   * DK_INVALID_ARGUMENT; a record still pending is DK_NOT_READY. */
  DK_Status (*event_elapsed_ms)(int32_t dev, DK_Event start, DK_Event end,
                                float *ms);

  /* --- OPTIONAL: memory extras ----------------------------------------- */
  /* Copy between devices. `stream` belongs to dst_dev. Fallback when NULL:
   * the host stages through host memory. */
  DK_Status (*copy_p2p)(int32_t dst_dev, DK_Mem dst, size_t dst_offset,
                        int32_t src_dev, DK_Mem src, size_t src_offset,
                        size_t size, DK_Stream stream);
  /* Page-locked host memory. (out) *ptr, freed with host_free (NULL
   * accepted). Fallback when NULL: ordinary host memory. */
  DK_Status (*host_alloc)(int32_t dev, size_t size, void **ptr);
  DK_Status (*host_free)(int32_t dev, void *ptr);
  /* Stream-ordered allocation: *mem is usable by work submitted to `stream`
   * after this call. Fallback when NULL: stream_synchronize then mem_alloc. */
  DK_Status (*mem_alloc_async)(int32_t dev, size_t size, DK_Stream stream,
                               DK_Mem *mem);
  /* Frees once the work submitted to `stream` before it has run; `mem`
   * becomes invalid to the caller at once. NULL accepted. Fallback when
   * NULL: stream_synchronize then mem_free. */
  DK_Status (*mem_free_async)(int32_t dev, DK_Mem mem, DK_Stream stream);

  /* --- OPTIONAL: collectives -------------------------------------------- */
  /* Ranks are processes (or threads) that each hold one communicator. Every
   * collective is stream-ordered on a stream of the communicator's device,
   * and all ranks must issue the same collectives in the same order. Counts
   * are elements of `dtype`, which is any of int8, uint8, int32, int64,
   * float16, bfloat16, float32, float64; DK_REDUCE_AVG needs a floating
   * dtype. send == recv with equal offsets is in-place. A peer that fails
   * to arrive within the plugin's timeout makes the collective fail with
   * DK_DEADLINE_EXCEEDED (reported through the stream) instead of hanging.
   * Ranks issuing different collectives (kind, count, dtype, op or root) is
   * DK_FAILED_PRECONDITION. The collective that meets a failure reports its
   * cause; the communicator then answers DK_ABORTED to every later call.
   * Buffers are live handles even for count 0, except the unused ones of
   * non-root ranks in broadcast and reduce, which may be NULL. In place is
   * allowed where the collective says so; other overlaps of send and recv
   * are DK_INVALID_ARGUMENT. */
  /* (out) *size: bytes of a unique id, at most 4096. */
  DK_Status (*ccl_unique_id_size)(size_t *size);
  /* (out) id[size], size == ccl_unique_id_size: made once by rank 0 and
   * carried to every rank. */
  DK_Status (*ccl_get_unique_id)(void *id, size_t size);
  /* Blocks until all `nranks` ranks presenting the same id have joined, or
   * fails with DK_DEADLINE_EXCEEDED; not deferred by groups. (out) *comm */
  DK_Status (*ccl_comm_init)(int32_t dev, int32_t nranks, const void *id,
                             size_t id_size, int32_t rank, DK_Comm *comm);
  /* Waits for the communicator's pending work, then releases it. NULL
   * accepted. */
  DK_Status (*ccl_comm_destroy)(DK_Comm comm);
  DK_Status (*all_reduce)(DK_Comm comm, DK_Mem send, size_t send_offset,
                          DK_Mem recv, size_t recv_offset, size_t count,
                          DK_DTypeKey dtype, int32_t op, DK_Stream stream);
  /* `send` is read on `root` only; every rank receives into `recv`. */
  DK_Status (*broadcast)(DK_Comm comm, DK_Mem send, size_t send_offset,
                         DK_Mem recv, size_t recv_offset, size_t count,
                         DK_DTypeKey dtype, int32_t root, DK_Stream stream);
  /* The result lands in `recv` on `root` only. */
  DK_Status (*reduce)(DK_Comm comm, DK_Mem send, size_t send_offset,
                      DK_Mem recv, size_t recv_offset, size_t count,
                      DK_DTypeKey dtype, int32_t op, int32_t root,
                      DK_Stream stream);
  /* recv holds nranks * send_count elements, rank-major. In place when send
   * is recv + rank * send_count elements. */
  DK_Status (*all_gather)(DK_Comm comm, DK_Mem send, size_t send_offset,
                          DK_Mem recv, size_t recv_offset, size_t send_count,
                          DK_DTypeKey dtype, DK_Stream stream);
  /* send holds nranks * recv_count elements. In place when recv is
   * send + rank * recv_count elements. */
  DK_Status (*reduce_scatter)(DK_Comm comm, DK_Mem send, size_t send_offset,
                              DK_Mem recv, size_t recv_offset,
                              size_t recv_count, DK_DTypeKey dtype, int32_t op,
                              DK_Stream stream);
  /* send and recv hold nranks * count elements; block j goes to rank j.
   * In place (send == recv) allowed. */
  DK_Status (*all_to_all)(DK_Comm comm, DK_Mem send, size_t send_offset,
                          DK_Mem recv, size_t recv_offset, size_t count,
                          DK_DTypeKey dtype, DK_Stream stream);
  /* Point-to-point: `count` elements to / from rank `peer`. A send and its
   * matching recv must both be issued, with equal counts (else
   * DK_INVALID_ARGUMENT); inside a group they may be issued in any order. */
  DK_Status (*send)(DK_Comm comm, DK_Mem buf, size_t offset, size_t count,
                    DK_DTypeKey dtype, int32_t peer, DK_Stream stream);
  DK_Status (*recv)(DK_Comm comm, DK_Mem buf, size_t offset, size_t count,
                    DK_DTypeKey dtype, int32_t peer, DK_Stream stream);
  /* Calls between group_start and group_end are issued together at
   * group_end (so paired send/recv cannot deadlock). Groups are per calling
   * thread and nest; only the outermost group_end issues. */
  DK_Status (*group_start)(void);
  DK_Status (*group_end)(void);
} DK_DeviceApi;

/* ------------------------------------------------------------------------
 * Plugin -> host information, filled by DK_PluginInit.
 * ------------------------------------------------------------------------ */
typedef struct DK_PluginInfo {
  size_t struct_size;
  uint32_t abi_major;                 /* the plugin's DK_ABI_MAJOR */
  uint32_t abi_minor;                 /* the plugin's DK_ABI_MINOR */
  /* Set before anything in DK_PluginInit can fail, so that the host can
   * read why initialisation failed. */
  DK_LastErrorFn last_error_message;
  const char *name;                   /* (owned by the plugin) e.g. "cpu" */
  const char *version;                /* (owned by the plugin) e.g. "0.1.0" */
  const char *device_type;            /* (owned by the plugin) e.g. "cpu" */
  const DK_DeviceApi *api;            /* (owned by the plugin) never NULL on DK_OK */
  /* (owned by the plugin) the coverage manifest: num_kernels pointers. */
  const DK_KernelEntry *const *kernels;
  size_t num_kernels;
} DK_PluginInfo;

/* The one symbol every plugin shared library exports.
 * host: (in) the host's information; (borrowed) for the call, except
 *       log / log_user_data, which stay valid while the plugin is loaded.
 * out:  (out) see VERSIONING rule 4. An out->struct_size too small to hold
 *       `api` is DK_INVALID_ARGUMENT. The plugin initialises its devices
 *       once per process; a later call returns the same table and installs
 *       the caller's log sink. */
typedef DK_Status (*DK_PluginInitFn)(const DK_HostInfo *host, DK_PluginInfo *out);

DK_EXPORT DK_Status DK_PluginInit(const DK_HostInfo *host, DK_PluginInfo *out);

#ifdef __cplusplus
} /* extern "C" */
#endif

#endif /* DEVKIT_ABI_DEVKIT_H_ */
