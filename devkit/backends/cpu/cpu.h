/*
 * cpu.h -- what the devkit "cpu" reference plugin's files share: its device
 * hooks (device.c), on which the support library (devkit/abi/support, dks.h)
 * runs the plugin, and the optional sections plugin.c adds to the table:
 * collectives (ccl.c) and codegen (codegen.c). Its kernels (kernels/) use
 * dks_kernel.h alone.
 */
#ifndef DEVKIT_BACKENDS_CPU_CPU_H_
#define DEVKIT_BACKENDS_CPU_CPU_H_

#include "dks_kernel.h"

#define CPU_PLUGIN_VERSION "0.1.0"
/* Test builds (deliberately broken variants, kernel-less builds) rename the
 * plugin so that it loads beside the real one. */
#ifndef CPU_PLUGIN_NAME
#define CPU_PLUGIN_NAME "cpu"
#endif

/* The device hooks (device.c): memory is aligned host memory, so a handle is
 * its host pointer (DK_DEVICE_HOST_POINTER_HANDLES) and kernels get it as is. */
extern const dks_device_hooks cpu_hooks;

/* Collectives (ccl.c): ranks are processes or threads of one host that meet
 * in a POSIX shared-memory segment named by the unique id; see ccl.c. */
DK_Status cpu_ccl_unique_id_size(size_t *size);
DK_Status cpu_ccl_get_unique_id(void *id, size_t size);
DK_Status cpu_ccl_comm_init(int32_t dev, int32_t nranks, const void *id,
                            size_t id_size, int32_t rank, DK_Comm *comm);
DK_Status cpu_ccl_comm_destroy(DK_Comm comm);
DK_Status cpu_all_reduce(DK_Comm comm, DK_Mem send, size_t send_offset,
                         DK_Mem recv, size_t recv_offset, size_t count,
                         DK_DTypeKey dtype, int32_t op, DK_Stream stream);
DK_Status cpu_broadcast(DK_Comm comm, DK_Mem send, size_t send_offset,
                        DK_Mem recv, size_t recv_offset, size_t count,
                        DK_DTypeKey dtype, int32_t root, DK_Stream stream);
DK_Status cpu_reduce(DK_Comm comm, DK_Mem send, size_t send_offset,
                     DK_Mem recv, size_t recv_offset, size_t count,
                     DK_DTypeKey dtype, int32_t op, int32_t root,
                     DK_Stream stream);
DK_Status cpu_all_gather(DK_Comm comm, DK_Mem send, size_t send_offset,
                         DK_Mem recv, size_t recv_offset, size_t send_count,
                         DK_DTypeKey dtype, DK_Stream stream);
DK_Status cpu_reduce_scatter(DK_Comm comm, DK_Mem send, size_t send_offset,
                             DK_Mem recv, size_t recv_offset,
                             size_t recv_count, DK_DTypeKey dtype, int32_t op,
                             DK_Stream stream);
DK_Status cpu_all_to_all(DK_Comm comm, DK_Mem send, size_t send_offset,
                         DK_Mem recv, size_t recv_offset, size_t count,
                         DK_DTypeKey dtype, DK_Stream stream);
DK_Status cpu_send(DK_Comm comm, DK_Mem buf, size_t offset, size_t count,
                   DK_DTypeKey dtype, int32_t peer, DK_Stream stream);
DK_Status cpu_recv(DK_Comm comm, DK_Mem buf, size_t offset, size_t count,
                   DK_DTypeKey dtype, int32_t peer, DK_Stream stream);
DK_Status cpu_group_start(void);
DK_Status cpu_group_end(void);

/* Codegen (codegen.c): present in the table only when a C compiler is found
 * when the plugin loads (cpu_codegen_available). */
bool cpu_codegen_available(void);
DK_Status cpu_codegen_dialect(int32_t dev, const char **dialect);
DK_Status cpu_codegen_compile(int32_t dev, const char *source, const char *options,
                              DK_Module *module, int32_t *from_cache);
DK_Status cpu_codegen_get_function(int32_t dev, DK_Module module, const char *name,
                                   const int32_t *arg_kinds, size_t num_args,
                                   DK_Function *function);
DK_Status cpu_codegen_launch(int32_t dev, DK_Function function, const DK_LaunchArg *args,
                             size_t num_args, const DK_LaunchShape *shape, DK_Stream stream);
DK_Status cpu_codegen_unload(int32_t dev, DK_Module module);

#endif /* DEVKIT_BACKENDS_CPU_CPU_H_ */
