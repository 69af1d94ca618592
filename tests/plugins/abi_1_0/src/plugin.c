/*
 * plugin.c -- DK_PluginInit and the function table of the devkit plugin
 * for acme devices.
 *
 * The table holds every function the ABI requires and the optional memory
 * extras. The optional collectives (ccl_unique_id_size ... group_end in
 * devkit.h) are left NULL, which tells the host that the device has none;
 * fill them in when it does.
 */
#include "acme_internal.h"
#include "kernel.h"

static const DK_DeviceApi k_api = {
    .struct_size = sizeof(DK_DeviceApi),
    .get_device_count = acme_get_device_count,
    .get_device_properties = acme_get_device_properties,
    .device_synchronize = acme_device_synchronize,
    .mem_alloc = acme_mem_alloc,
    .mem_free = acme_mem_free,
    .mem_get_info = acme_mem_get_info,
    .memset = acme_memset,
    .copy_h2d = acme_copy_h2d,
    .copy_d2h = acme_copy_d2h,
    .copy_d2d = acme_copy_d2d,
    .stream_create = acme_stream_create,
    .stream_destroy = acme_stream_destroy,
    .stream_synchronize = acme_stream_synchronize,
    .stream_query = acme_stream_query,
    .stream_wait_event = acme_stream_wait_event,
    .stream_add_callback = acme_stream_add_callback,
    .event_create = acme_event_create,
    .event_destroy = acme_event_destroy,
    .event_record = acme_event_record,
    .event_query = acme_event_query,
    .event_synchronize = acme_event_synchronize,
    .event_elapsed_ms = acme_event_elapsed_ms,
    .copy_p2p = acme_copy_p2p,
    .host_alloc = acme_host_alloc,
    .host_free = acme_host_free,
    .mem_alloc_async = acme_mem_alloc_async,
    .mem_free_async = acme_mem_free_async,
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
  if (!out) return acme_set_error(DK_INVALID_ARGUMENT, "%s: out is NULL", fn);
  size_t size = out->struct_size;
  /* First, so the host can read why anything below failed. */
  if (FITS(size, DK_PluginInfo, last_error_message))
    out->last_error_message = acme_last_error;
  if (!host) return acme_set_error(DK_INVALID_ARGUMENT, "%s: host is NULL", fn);
  if (!FITS(size, DK_PluginInfo, api))
    return acme_set_error(DK_INVALID_ARGUMENT,
                            "%s: out->struct_size %zu is too small to receive the "
                            "api table (needs at least %zu)",
                            fn, size, offsetof(DK_PluginInfo, api) + sizeof(out->api));

  pthread_mutex_lock(&g_log_mu);
  g_log = FITS(host->struct_size, DK_HostInfo, log) ? host->log : NULL;
  g_log_user_data = FITS(host->struct_size, DK_HostInfo, log_user_data)
                        ? host->log_user_data
                        : NULL;
  pthread_mutex_unlock(&g_log_mu);

  DK_Status st = acme_runtime_init();
  if (st != DK_OK) return st;
  const DK_KernelEntry *const *kernels;
  size_t num_kernels;
  if ((st = acme_kernel_table(&kernels, &num_kernels)) != DK_OK) return st;

  DK_PluginInfo info = {
      .struct_size = sizeof info,
      .abi_major = DK_ABI_MAJOR,
      .abi_minor = DK_ABI_MINOR,
      .last_error_message = acme_last_error,
      .name = "acme",
      .version = ACME_PLUGIN_VERSION,
      .device_type = "acme",
      .api = &k_api,
      .kernels = kernels,
      .num_kernels = num_kernels,
  };
  acme_copy_out(out, &info, sizeof info);

  char line[256];
  acme_runtime_describe(line, sizeof line);
  log_line(DK_LOG_INFO, line);
  return DK_OK;
}
