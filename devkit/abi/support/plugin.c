/*
 * plugin.c -- dks_plugin_init, dks_fill_api and the host's log sink: what a
 * plugin's DK_PluginInit calls.
 */
#include <stdarg.h>
#include <stdio.h>

#include "dks_internal.h"

void dks_fill_api(const dks_device_hooks *hooks, DK_DeviceApi *api) {
  *api = (DK_DeviceApi){
      .struct_size = sizeof(DK_DeviceApi),
      .get_device_count = dks_get_device_count,
      .get_device_properties = dks_get_device_properties,
      .device_synchronize = dks_device_synchronize,
      .mem_alloc = dks_mem_alloc,
      .mem_free = dks_mem_free,
      .mem_get_info = dks_mem_get_info,
      .memset = dks_memset,
      .copy_h2d = dks_copy_h2d,
      .copy_d2h = dks_copy_d2h,
      .copy_d2d = dks_copy_d2d,
      .stream_create = dks_stream_create,
      .stream_destroy = dks_stream_destroy,
      .stream_synchronize = dks_stream_synchronize,
      .stream_query = dks_stream_query,
      .stream_wait_event = dks_stream_wait_event,
      .stream_add_callback = dks_stream_add_callback,
      .event_create = dks_event_create,
      .event_destroy = dks_event_destroy,
      .event_record = dks_event_record,
      .event_query = dks_event_query,
      .event_synchronize = dks_event_synchronize,
      .event_elapsed_ms = dks_event_elapsed_ms,
      .copy_p2p = dks_copy_p2p,
      .host_alloc = dks_host_alloc,
      .host_free = dks_host_free,
      .mem_alloc_async = dks_mem_alloc_async,
      .mem_free_async = dks_mem_free_async,
      .graph_begin_capture = dks_graph_begin_capture,
      .graph_end_capture = dks_graph_end_capture,
      .graph_launch = dks_graph_launch,
      .graph_rebind = dks_graph_rebind,
      .graph_destroy = dks_graph_destroy,
  };
  bool registers = hooks && hooks->struct_size >= offsetof(dks_device_hooks, register_host) +
                                                      sizeof hooks->register_host &&
                   hooks->register_host;
  if (registers) {
    api->mem_register_host = dks_mem_register_host;
    api->mem_unregister_host = dks_mem_unregister_host;
  }
}

/* The host's log sink. Each DK_PluginInit call installs its host's sink (the
 * header keeps every host's sink valid while the plugin is loaded). */
static pthread_mutex_t g_log_mu = PTHREAD_MUTEX_INITIALIZER;
static DK_LogFn g_log;
static void *g_log_user_data;

void dks_log(int32_t level, const char *fmt, ...) {
  pthread_mutex_lock(&g_log_mu);
  DK_LogFn log = g_log;
  void *user_data = g_log_user_data;
  pthread_mutex_unlock(&g_log_mu);
  if (!log) return;
  char line[512];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(line, sizeof line, fmt, ap);
  va_end(ap);
  log(user_data, level, line); /* outside the lock: may re-enter */
}

/* Whether `field` of struct `type` lies entirely inside `size` bytes. */
#define FITS(size, type, field) \
  ((size) >= offsetof(type, field) + sizeof(((type *)0)->field))

/* The library's own table, for dks_plugin_init(hooks, NULL, ...). */
static DK_DeviceApi g_api;
static pthread_once_t g_api_once = PTHREAD_ONCE_INIT;

static void fill_own_api(void) { dks_fill_api(&dks_hooks, &g_api); }

DK_Status dks_plugin_init(const dks_device_hooks *hooks, const DK_DeviceApi *api,
                          const DK_HostInfo *host, DK_PluginInfo *out) {
  static const char fn[] = "DK_PluginInit";
  if (!out) return dks_set_error(DK_INVALID_ARGUMENT, "%s: out is NULL", fn);
  size_t size = out->struct_size;
  /* First, so the host can read why anything below failed. */
  if (FITS(size, DK_PluginInfo, last_error_message))
    out->last_error_message = dks_last_error;
  if (!host) return dks_set_error(DK_INVALID_ARGUMENT, "%s: host is NULL", fn);
  if (!FITS(size, DK_PluginInfo, api))
    return dks_set_error(DK_INVALID_ARGUMENT,
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

  DK_Status st = dks_runtime_init(hooks);
  if (st != DK_OK) return st;
  if (!api) {
    pthread_once(&g_api_once, fill_own_api);
    api = &g_api;
  }
  const DK_KernelEntry *const *kernels;
  size_t num_kernels;
  if ((st = dks_kernel_table(&kernels, &num_kernels)) != DK_OK) return st;

  DK_PluginInfo info = {
      .struct_size = sizeof info,
      .abi_major = DK_ABI_MAJOR,
      .abi_minor = DK_ABI_MINOR,
      .last_error_message = dks_last_error,
      .name = dks_hooks.plugin_name ? dks_hooks.plugin_name : dks_hooks.name,
      .version = dks_hooks.version,
      .device_type = dks_hooks.name,
      .api = api,
      .kernels = kernels,
      .num_kernels = num_kernels,
  };
  dks_copy_out(out, &info, sizeof info);

  char line[256];
  dks_runtime_describe(line, sizeof line);
  dks_log(DK_LOG_INFO, "%s", line);
  return DK_OK;
}
