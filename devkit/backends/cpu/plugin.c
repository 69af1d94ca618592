/*
 * plugin.c -- DK_PluginInit of the devkit "cpu" reference plugin: the
 * support library's table on the cpu hooks, plus the collective section and,
 * where a C compiler is found at load, the codegen section.
 */
#include <pthread.h>

#include "cpu.h"

/* The defect variants (defects.py) run on test-only wrappers of the hooks
 * (testing/defect_hooks.c). */
#ifdef DEVKIT_DEFECT_HOOKS
const dks_device_hooks *cpu_defect_hooks(void);
#define HOOKS cpu_defect_hooks()
#else
#define HOOKS (&cpu_hooks)
#endif

static DK_DeviceApi g_api;
static pthread_once_t g_api_once = PTHREAD_ONCE_INIT;

static void build_api(void) {
  dks_fill_api(HOOKS, &g_api);
  g_api.ccl_unique_id_size = cpu_ccl_unique_id_size;
  g_api.ccl_get_unique_id = cpu_ccl_get_unique_id;
  g_api.ccl_comm_init = cpu_ccl_comm_init;
  g_api.ccl_comm_destroy = cpu_ccl_comm_destroy;
  g_api.all_reduce = cpu_all_reduce;
  g_api.broadcast = cpu_broadcast;
  g_api.reduce = cpu_reduce;
  g_api.all_gather = cpu_all_gather;
  g_api.reduce_scatter = cpu_reduce_scatter;
  g_api.all_to_all = cpu_all_to_all;
  g_api.send = cpu_send;
  g_api.recv = cpu_recv;
  g_api.group_start = cpu_group_start;
  g_api.group_end = cpu_group_end;
  if (!cpu_codegen_available()) return;
  g_api.codegen_dialect = cpu_codegen_dialect;
  g_api.codegen_compile = cpu_codegen_compile;
  g_api.codegen_get_function = cpu_codegen_get_function;
  g_api.codegen_launch = cpu_codegen_launch;
  g_api.codegen_unload = cpu_codegen_unload;
}

DK_EXPORT DK_Status DK_PluginInit(const DK_HostInfo *host, DK_PluginInfo *out) {
  pthread_once(&g_api_once, build_api);
  return dks_plugin_init(HOOKS, &g_api, host, out);
}
