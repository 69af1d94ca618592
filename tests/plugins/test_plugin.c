/* A minimal plugin for the loader's tests. Each -D variant breaks one rule of
 * devkit.h's VERSIONING section; without one it is a valid one-device plugin
 * whose device functions report DK_UNIMPLEMENTED. */
#include <stddef.h>
#include <string.h>

#include "devkit.h"

#ifndef PLUGIN_NAME
#define PLUGIN_NAME "testplugin"
#endif

static _Thread_local const char *last_message = "";

static const char *last_error_message(void) { return last_message; }

static DK_Status unimplemented(void) {
  last_message = "not implemented by the loader test plugin";
  return DK_UNIMPLEMENTED;
}

static DK_Status get_device_count(int32_t *count) {
  *count = 1;
  return DK_OK;
}

static DK_Status get_device_properties(int32_t dev, DK_DeviceProperties *props) {
  (void)dev;
  size_t size = props->struct_size < sizeof *props ? props->struct_size : sizeof *props;
  memset((char *)props + sizeof(size_t), 0, size - sizeof(size_t));
  strcpy(props->name, "loader test device");
  props->struct_size = size;
  return DK_OK;
}

/* Every other required function: same shape, no behaviour. */
#define UNIMPLEMENTED_FN(name, ...) \
  static DK_Status name(__VA_ARGS__) { return unimplemented(); }
UNIMPLEMENTED_FN(device_synchronize, int32_t d)
UNIMPLEMENTED_FN(mem_alloc, int32_t d, size_t s, DK_Mem *m)
UNIMPLEMENTED_FN(mem_free, int32_t d, DK_Mem m)
UNIMPLEMENTED_FN(mem_get_info, int32_t d, size_t *f, size_t *t)
UNIMPLEMENTED_FN(memset_fn, int32_t d, DK_Mem m, size_t o, uint8_t v, size_t s, DK_Stream st)
UNIMPLEMENTED_FN(copy_h2d, int32_t d, DK_Mem m, size_t o, const void *p, size_t s, DK_Stream st)
UNIMPLEMENTED_FN(copy_d2h, int32_t d, void *p, DK_Mem m, size_t o, size_t s, DK_Stream st)
UNIMPLEMENTED_FN(copy_d2d, int32_t d, DK_Mem a, size_t ao, DK_Mem b, size_t bo, size_t s, DK_Stream st)
UNIMPLEMENTED_FN(stream_create, int32_t d, DK_Stream *s)
UNIMPLEMENTED_FN(stream_destroy, int32_t d, DK_Stream s)
UNIMPLEMENTED_FN(stream_synchronize, int32_t d, DK_Stream s)
UNIMPLEMENTED_FN(stream_query, int32_t d, DK_Stream s)
UNIMPLEMENTED_FN(stream_wait_event, int32_t d, DK_Stream s, DK_Event e)
UNIMPLEMENTED_FN(stream_add_callback, int32_t d, DK_Stream s, DK_HostFn f, void *u)
UNIMPLEMENTED_FN(event_create, int32_t d, uint32_t f, DK_Event *e)
UNIMPLEMENTED_FN(event_destroy, int32_t d, DK_Event e)
UNIMPLEMENTED_FN(event_record, int32_t d, DK_Event e, DK_Stream s)
UNIMPLEMENTED_FN(event_query, int32_t d, DK_Event e)
UNIMPLEMENTED_FN(event_synchronize, int32_t d, DK_Event e)
UNIMPLEMENTED_FN(event_elapsed_ms, int32_t d, DK_Event a, DK_Event b, float *ms)
UNIMPLEMENTED_FN(copy_p2p, int32_t dd, DK_Mem a, size_t ao, int32_t sd, DK_Mem b, size_t bo,
                 size_t s, DK_Stream st)
UNIMPLEMENTED_FN(graph_begin_capture, int32_t d, DK_Stream s)
UNIMPLEMENTED_FN(codegen_dialect, int32_t d, const char **dialect)
UNIMPLEMENTED_FN(mem_register_host, int32_t d, void *ptr, size_t size, DK_Mem *mem)

static DK_DeviceApi api = {
    .struct_size = sizeof(DK_DeviceApi),
    .get_device_count = get_device_count,
    .get_device_properties = get_device_properties,
    .device_synchronize = device_synchronize,
    .mem_alloc = mem_alloc,
    .mem_free = mem_free,
    .mem_get_info = mem_get_info,
    .memset = memset_fn,
    .copy_h2d = copy_h2d,
    .copy_d2h = copy_d2h,
    .copy_d2d = copy_d2d,
    .stream_create = stream_create,
    .stream_destroy = stream_destroy,
    .stream_synchronize = stream_synchronize,
    .stream_query = stream_query,
    .stream_wait_event = stream_wait_event,
    .stream_add_callback = stream_add_callback,
    .event_create = event_create,
    .event_destroy = event_destroy,
    .event_record = event_record,
    .event_query = event_query,
    .event_synchronize = event_synchronize,
    .event_elapsed_ms = event_elapsed_ms,
    .copy_p2p = copy_p2p,
};

#ifndef NO_ENTRY
DK_EXPORT DK_Status DK_PluginInit(const DK_HostInfo *host, DK_PluginInfo *out) {
  (void)host;
  out->last_error_message = last_error_message;
#ifdef INIT_FAILS
  last_message = "no accelerator found on PCI bus 3";
  return DK_FAILED_PRECONDITION;
#endif
  out->abi_major = DK_ABI_MAJOR;
  out->abi_minor = DK_ABI_MINOR;
  out->name = PLUGIN_NAME;
  out->version = "9.9.9";
  out->device_type = "test";
  out->api = &api;
  out->struct_size = sizeof(DK_PluginInfo);
#ifdef WRONG_MAJOR
  out->abi_major = DK_ABI_MAJOR + 1;
#endif
#ifdef NEWER_MINOR
  out->abi_minor = DK_ABI_MINOR + 7;
#endif
#ifdef SHORT_INFO
  out->struct_size = offsetof(DK_PluginInfo, api);
#endif
#ifdef NULL_TABLE
  out->api = NULL;
#endif
#ifdef SHORT_TABLE
  api.struct_size = offsetof(DK_DeviceApi, stream_create);
#endif
#ifdef NULL_FUNCTION
  api.mem_free = NULL;
#endif
#if defined(ABI_1_0) || defined(PARTIAL_GRAPHS)
  /* ABI_1_0: built against 1.0, before the graph section: the bytes past its
   * table are non-NULL here and must be treated as absent. PARTIAL_GRAPHS:
   * one graph function of five, which the host refuses. */
  api.graph_begin_capture = graph_begin_capture;
#endif
#ifdef ABI_1_0
  out->abi_minor = 0;
  api.struct_size = offsetof(DK_DeviceApi, graph_begin_capture);
#endif
#if defined(ABI_1_1) || defined(PARTIAL_CODEGEN)
  /* ABI_1_1: built against 1.1, before the codegen section: the bytes past
   * its table are non-NULL here and must be treated as absent.
   * PARTIAL_CODEGEN: one codegen function of five, which the host refuses. */
  api.codegen_dialect = codegen_dialect;
#endif
#ifdef ABI_1_1
  out->abi_minor = 1;
  api.struct_size = offsetof(DK_DeviceApi, codegen_dialect);
#endif
#if defined(ABI_1_2) || defined(PARTIAL_HOST_REGISTRATION)
  /* ABI_1_2: built against 1.2, before host memory registration: the bytes
   * past its table are non-NULL here and must be treated as absent.
   * PARTIAL_HOST_REGISTRATION: one function of the two, which the host
   * refuses. */
  api.mem_register_host = mem_register_host;
#endif
#ifdef ABI_1_2
  out->abi_minor = 2;
  api.struct_size = offsetof(DK_DeviceApi, mem_register_host);
#endif
#ifdef OLDER_MINOR
  /* Built before the optional functions existed: they lie past struct_size
   * and must be treated as absent although the bytes are non-NULL here. */
  api.struct_size = offsetof(DK_DeviceApi, copy_p2p);
  out->struct_size = offsetof(DK_PluginInfo, kernels);
#endif
  return DK_OK;
}
#else
/* Exports its table under the wrong name, as a misnamed entry point would. */
DK_EXPORT const DK_DeviceApi *PluginInit(void) { return &api; }
#endif
