/*
 * plugin.c -- DK_PluginInit of the devkit plugin for @name@ devices.
 *
 * devkit's plugin-support library (dks.h), compiled into this library from
 * the installed devkit, implements the ABI's function table -- devices,
 * memory, copies, streams, events, graphs, the kernel launcher -- on top of
 * the device hooks of hooks.c, and publishes the kernels that the files of
 * kernels/ register.
 */
#include "hooks.h"

DK_Status DK_PluginInit(const DK_HostInfo *host, DK_PluginInfo *out) {
  /* NULL: the library's function table. To add an optional section of
   * devkit.h (collectives, codegen), fill a DK_DeviceApi of static storage
   * once with dks_fill_api(&@name@_hooks, &api), set the section's functions
   * and pass &api here. */
  return dks_plugin_init(&@name@_hooks, NULL, host, out);
}
