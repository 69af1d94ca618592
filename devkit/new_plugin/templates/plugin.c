/*
 * plugin.c -- DK_PluginInit and the function table of the devkit plugin
 * for @name@ devices.
 *
 * The table holds every function the ABI requires, the optional memory
 * extras and the graph section (graph.c: captured stream work, launched as
 * one work item). The optional collectives (ccl_unique_id_size ...
 * group_end in devkit.h) are left NULL, which tells the host that the
 * device has none; fill them in when it does.
 */
#include "@name@_internal.h"
#include "kernel.h"

static const DK_DeviceApi k_api = {
    .struct_size = sizeof(DK_DeviceApi),
    .get_device_count = @name@_get_device_count,
    .get_device_properties = @name@_get_device_properties,
    .device_synchronize = @name@_device_synchronize,
    .mem_alloc = @name@_mem_alloc,
    .mem_free = @name@_mem_free,
    .mem_get_info = @name@_mem_get_info,
    .memset = @name@_memset,
    .copy_h2d = @name@_copy_h2d,
    .copy_d2h = @name@_copy_d2h,
    .copy_d2d = @name@_copy_d2d,
    .stream_create = @name@_stream_create,
    .stream_destroy = @name@_stream_destroy,
    .stream_synchronize = @name@_stream_synchronize,
    .stream_query = @name@_stream_query,
    .stream_wait_event = @name@_stream_wait_event,
    .stream_add_callback = @name@_stream_add_callback,
    .event_create = @name@_event_create,
    .event_destroy = @name@_event_destroy,
    .event_record = @name@_event_record,
    .event_query = @name@_event_query,
    .event_synchronize = @name@_event_synchronize,
    .event_elapsed_ms = @name@_event_elapsed_ms,
    .copy_p2p = @name@_copy_p2p,
    .host_alloc = @name@_host_alloc,
    .host_free = @name@_host_free,
    .mem_alloc_async = @name@_mem_alloc_async,
    .mem_free_async = @name@_mem_free_async,
    .graph_begin_capture = @name@_graph_begin_capture,
    .graph_end_capture = @name@_graph_end_capture,
    .graph_launch = @name@_graph_launch,
    .graph_rebind = @name@_graph_rebind,
    .graph_destroy = @name@_graph_destroy,
};

/* The host's log sink. Each DK_PluginInit call installs its host's sink (the
 * header keeps every host's sink valid while the plugin is loaded). */
static pthread_mutex_t g_log_mu = PTHREAD_MUTEX_INITIALIZER;
static DK_LogFn g_log;
static void *g_log_user_data;

/* Whether `field` of struct `type` lies entirely inside `size` bytes. */
#define FITS(size, type, field) \
  ((size) >= offsetof(type, field) + sizeof(((type *)0)->field))

static void log_line(int32_t level, const char *message) {
  pthread_mutex_lock(&g_log_mu);
  DK_LogFn log = g_log;
  void *user_data = g_log_user_data;
  pthread_mutex_unlock(&g_log_mu);
  if (log) log(user_data, level, message); /* outside the lock: may re-enter */
}

DK_Status DK_PluginInit(const DK_HostInfo *host, DK_PluginInfo *out) {
  static const char fn[] = "DK_PluginInit";
  if (!out) return @name@_set_error(DK_INVALID_ARGUMENT, "%s: out is NULL", fn);
  size_t size = out->struct_size;
  /* First, so the host can read why anything below failed. */
  if (FITS(size, DK_PluginInfo, last_error_message))
    out->last_error_message = @name@_last_error;
  if (!host) return @name@_set_error(DK_INVALID_ARGUMENT, "%s: host is NULL", fn);
  if (!FITS(size, DK_PluginInfo, api))
    return @name@_set_error(DK_INVALID_ARGUMENT,
                            "%s: out->struct_size %zu is too small to receive the "
                            "api table (needs at least %zu)",
                            fn, size, offsetof(DK_PluginInfo, api) + sizeof(out->api));

  pthread_mutex_lock(&g_log_mu);
  g_log = FITS(host->struct_size, DK_HostInfo, log) ? host->log : NULL;
  g_log_user_data = FITS(host->struct_size, DK_HostInfo, log_user_data)
                        ? host->log_user_data
                        : NULL;
  pthread_mutex_unlock(&g_log_mu);

  DK_Status st = @name@_runtime_init();
  if (st != DK_OK) return st;
  const DK_KernelEntry *const *kernels;
  size_t num_kernels;
  if ((st = @name@_kernel_table(&kernels, &num_kernels)) != DK_OK) return st;

  DK_PluginInfo info = {
      .struct_size = sizeof info,
      .abi_major = DK_ABI_MAJOR,
      .abi_minor = DK_ABI_MINOR,
      .last_error_message = @name@_last_error,
      .name = "@name@",
      .version = @NAME@_PLUGIN_VERSION,
      .device_type = "@name@",
      .api = &k_api,
      .kernels = kernels,
      .num_kernels = num_kernels,
  };
  @name@_copy_out(out, &info, sizeof info);

  char line[256];
  @name@_runtime_describe(line, sizeof line);
  log_line(DK_LOG_INFO, line);
  return DK_OK;
}
