/*
 * plugin.c -- DK_PluginInit and the function table of the devkit "cpu"
 * reference plugin.
 */
#include "cpu_internal.h"
#include "kernel.h"

static const DK_DeviceApi k_api = {
    .struct_size = sizeof(DK_DeviceApi),
    .get_device_count = cpu_get_device_count,
    .get_device_properties = cpu_get_device_properties,
    .device_synchronize = cpu_device_synchronize,
    .mem_alloc = cpu_mem_alloc,
    .mem_free = cpu_mem_free,
    .mem_get_info = cpu_mem_get_info,
    .mem_register_host = cpu_mem_register_host,
    .mem_unregister_host = cpu_mem_unregister_host,
    .memset = cpu_memset,
    .copy_h2d = cpu_copy_h2d,
    .copy_d2h = cpu_copy_d2h,
    .copy_d2d = cpu_copy_d2d,
    .stream_create = cpu_stream_create,
    .stream_destroy = cpu_stream_destroy,
    .stream_synchronize = cpu_stream_synchronize,
    .stream_query = cpu_stream_query,
    .stream_wait_event = cpu_stream_wait_event,
    .stream_add_callback = cpu_stream_add_callback,
    .event_create = cpu_event_create,
    .event_destroy = cpu_event_destroy,
    .event_record = cpu_event_record,
    .event_query = cpu_event_query,
    .event_synchronize = cpu_event_synchronize,
    .event_elapsed_ms = cpu_event_elapsed_ms,
    .copy_p2p = cpu_copy_p2p,
    .host_alloc = cpu_host_alloc,
    .host_free = cpu_host_free,
    .mem_alloc_async = cpu_mem_alloc_async,
    .mem_free_async = cpu_mem_free_async,
    .ccl_unique_id_size = cpu_ccl_unique_id_size,
    .ccl_get_unique_id = cpu_ccl_get_unique_id,
    .ccl_comm_init = cpu_ccl_comm_init,
    .ccl_comm_destroy = cpu_ccl_comm_destroy,
    .all_reduce = cpu_all_reduce,
    .broadcast = cpu_broadcast,
    .reduce = cpu_reduce,
    .all_gather = cpu_all_gather,
    .reduce_scatter = cpu_reduce_scatter,
    .all_to_all = cpu_all_to_all,
    .send = cpu_send,
    .recv = cpu_recv,
    .group_start = cpu_group_start,
    .group_end = cpu_group_end,
    .graph_begin_capture = cpu_graph_begin_capture,
    .graph_end_capture = cpu_graph_end_capture,
    .graph_launch = cpu_graph_launch,
    .graph_rebind = cpu_graph_rebind,
    .graph_destroy = cpu_graph_destroy,
};

/* k_api plus the codegen section where a C compiler was found at load. */
static DK_DeviceApi g_api;
static pthread_once_t g_api_once = PTHREAD_ONCE_INIT;

static void build_api(void) {
  g_api = k_api;
  if (!cpu_codegen_available()) return;
  g_api.codegen_dialect = cpu_codegen_dialect;
  g_api.codegen_compile = cpu_codegen_compile;
  g_api.codegen_get_function = cpu_codegen_get_function;
  g_api.codegen_launch = cpu_codegen_launch;
  g_api.codegen_unload = cpu_codegen_unload;
}

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
  if (!out) return cpu_set_error(DK_INVALID_ARGUMENT, "%s: out is NULL", fn);
  size_t size = out->struct_size;
  /* First, so the host can read why anything below failed. */
  if (FITS(size, DK_PluginInfo, last_error_message))
    out->last_error_message = cpu_last_error;
  if (!host) return cpu_set_error(DK_INVALID_ARGUMENT, "%s: host is NULL", fn);
  if (!FITS(size, DK_PluginInfo, api))
    return cpu_set_error(DK_INVALID_ARGUMENT,
                         "%s: out->struct_size %zu is too small to receive the "
                         "api table (needs at least %zu)",
                         fn, size,
                         offsetof(DK_PluginInfo, api) + sizeof(out->api));

  pthread_mutex_lock(&g_log_mu);
  g_log = FITS(host->struct_size, DK_HostInfo, log) ? host->log : NULL;
  g_log_user_data = FITS(host->struct_size, DK_HostInfo, log_user_data)
                        ? host->log_user_data
                        : NULL;
  pthread_mutex_unlock(&g_log_mu);

  DK_Status st = cpu_runtime_init();
  if (st != DK_OK) return st;
  pthread_once(&g_api_once, build_api);
  const DK_KernelEntry *const *kernels;
  size_t num_kernels;
  if ((st = cpu_kernel_table(&kernels, &num_kernels)) != DK_OK) return st;

  DK_PluginInfo info = {
      .struct_size = sizeof info,
      .abi_major = DK_ABI_MAJOR,
      .abi_minor = DK_ABI_MINOR,
      .last_error_message = cpu_last_error,
      .name = CPU_PLUGIN_NAME,
      .version = CPU_PLUGIN_VERSION,
      .device_type = "cpu",
      .api = &g_api,
      .kernels = kernels,
      .num_kernels = num_kernels,
  };
  cpu_copy_out(out, &info, sizeof info);

  char line[256];
  cpu_runtime_describe(line, sizeof line);
  log_line(DK_LOG_INFO, line);
  return DK_OK;
}
