/* A plugin that is the cpu plugin except for one function that crashes and
 * one that hangs: devkit-conformance must report those cases `crashed` and
 * `timeout` and still run the rest.
 *
 *   -DDELEGATE_LIBRARY="/path/libdevkit_cpu.so"  the plugin to forward to
 *   -DCRASH_IN=event_elapsed_ms                  a DK_DeviceApi function that segfaults
 *   -DHANG_IN=host_alloc                         a DK_DeviceApi function that never returns
 */
#define _POSIX_C_SOURCE 200809L
#include <dlfcn.h>
#include <string.h>
#include <unistd.h>

#include "devkit.h"

#ifndef PLUGIN_NAME
#define PLUGIN_NAME "faulty"
#endif

static DK_DeviceApi api;

/* Called through a DK_DeviceApi pointer of another type: their arguments are ignored. */
static DK_Status crash(void) {
  *(volatile int *)0 = 1;
  return DK_OK;
}

static DK_Status hang(void) {
  for (;;) sleep(1000);
  return DK_OK;
}

static const char *load_error(void) { return "cannot dlopen DELEGATE_LIBRARY"; }

DK_EXPORT DK_Status DK_PluginInit(const DK_HostInfo *host, DK_PluginInfo *out) {
  void *delegate = dlopen(DELEGATE_LIBRARY, RTLD_NOW | RTLD_LOCAL);
  if (delegate == NULL) {
    out->last_error_message = load_error;
    return DK_FAILED_PRECONDITION;
  }
  DK_PluginInitFn init;
  *(void **)&init = dlsym(delegate, "DK_PluginInit");
  DK_Status status = init(host, out);
  if (status != DK_OK) return status;
  size_t size = out->api->struct_size < sizeof api ? out->api->struct_size : sizeof api;
  memcpy(&api, out->api, size);
#ifdef CRASH_IN
  api.CRASH_IN = (__typeof__(api.CRASH_IN))(void (*)(void))crash;
#endif
#ifdef HANG_IN
  api.HANG_IN = (__typeof__(api.HANG_IN))(void (*)(void))hang;
#endif
  out->api = &api;
  out->name = PLUGIN_NAME;
  return DK_OK;
}
