// Minimal PaddlePaddle CustomDevice plugin: device type "devkit".
// Runtime keeps "device" memory in host malloc, so it is trivially correct.
// One kernel registered through the phi C API: relu, float32, backend "devkit".
#include <cstdlib>
#include <cstring>
#include <cstdio>

#include "paddle/phi/backends/device_ext.h"
#include "paddle/phi/capi/all.h"

static const size_t kTotalMem = 1UL << 30;  // pretend 1 GiB
static size_t g_used = 0;
struct C_Stream_st { int dummy; };
struct C_Event_st { int dummy; };

static C_Status ok_dev(const C_Device) { return C_SUCCESS; }
static C_Status get_device(const C_Device d) { d->id = 0; return C_SUCCESS; }
static C_Status get_device_count(size_t* n) { *n = 1; return C_SUCCESS; }
static C_Status get_device_list(size_t* l) { l[0] = 0; return C_SUCCESS; }
static C_Status dev_alloc(const C_Device, void** p, size_t sz) {
  *p = std::malloc(sz ? sz : 1);
  if (!*p) return C_FAILED;
  g_used += sz;
  return C_SUCCESS;
}
static C_Status dev_free(const C_Device, void* p, size_t sz) {
  std::free(p); g_used -= sz; return C_SUCCESS;
}
static C_Status memset_(const C_Device, void* p, unsigned char v, size_t sz) {
  std::memset(p, v, sz); return C_SUCCESS;
}
static C_Status copy(const C_Device, void* dst, const void* src, size_t sz) {
  std::memcpy(dst, src, sz); return C_SUCCESS;
}
static C_Status acopy(const C_Device, C_Stream, void* dst, const void* src, size_t sz) {
  std::memcpy(dst, src, sz); return C_SUCCESS;
}
static C_Status create_stream(const C_Device, C_Stream* s) { *s = new C_Stream_st(); return C_SUCCESS; }
static C_Status destroy_stream(const C_Device, C_Stream s) { delete s; return C_SUCCESS; }
static C_Status sync_stream(const C_Device, C_Stream) { return C_SUCCESS; }
static C_Status query_stream(const C_Device, C_Stream) { return C_SUCCESS; }
static C_Status create_event(const C_Device, C_Event* e) { *e = new C_Event_st(); return C_SUCCESS; }
static C_Status destroy_event(const C_Device, C_Event e) { delete e; return C_SUCCESS; }
static C_Status record_event(const C_Device, C_Stream, C_Event) { return C_SUCCESS; }
static C_Status sync_event(const C_Device, C_Event) { return C_SUCCESS; }
static C_Status query_event(const C_Device, C_Event) { return C_SUCCESS; }
static C_Status stream_wait_event(const C_Device, C_Stream, C_Event) { return C_SUCCESS; }
static C_Status mem_stats(const C_Device, size_t* total, size_t* free_) {
  *total = kTotalMem; *free_ = kTotalMem - g_used; return C_SUCCESS;
}
static C_Status min_chunk(const C_Device, size_t* n) { *n = 1; return C_SUCCESS; }

extern "C" void InitPlugin(CustomRuntimeParams* params) {
  PADDLE_CUSTOM_RUNTIME_CHECK_VERSION(params);
  params->device_type = (char*)"devkit";
  params->sub_device_type = (char*)"devkit";
  C_DeviceInterface* i = params->interface;
  i->init_device = ok_dev;        i->deinit_device = ok_dev;
  i->set_device = ok_dev;         i->get_device = get_device;
  i->get_device_count = get_device_count;  i->get_device_list = get_device_list;
  i->create_stream = create_stream;        i->destroy_stream = destroy_stream;
  i->query_stream = query_stream;          i->synchronize_stream = sync_stream;
  i->create_event = create_event;          i->destroy_event = destroy_event;
  i->record_event = record_event;          i->synchronize_event = sync_event;
  i->query_event = query_event;            i->stream_wait_event = stream_wait_event;
  i->synchronize_device = ok_dev;
  i->device_memory_allocate = dev_alloc;   i->device_memory_deallocate = dev_free;
  i->device_memory_set = memset_;
  i->memory_copy_h2d = copy; i->memory_copy_d2h = copy; i->memory_copy_d2d = copy;
  i->async_memory_copy_h2d = acopy; i->async_memory_copy_d2h = acopy;
  i->async_memory_copy_d2d = acopy;
  i->device_memory_stats = mem_stats;      i->device_min_chunk_size = min_chunk;
}

// ---- kernel: relu (phi C API; phi::Context / phi::DenseTensor are capi wrappers)
template <typename T>
void DevkitReluKernel(const phi::Context& dev_ctx, const phi::DenseTensor& x,
                      phi::DenseTensor* out) {
  out->Resize(x.dims());
  T* o = dev_ctx.template Alloc<T>(out);
  const T* in = x.data<T>();
  int64_t n = x.numel();
  for (int64_t k = 0; k < n; ++k) o[k] = in[k] > T(0) ? in[k] : T(0);
  if (std::getenv("DEVKIT_TRACE")) std::fprintf(stderr, "[devkit] relu kernel n=%lld\n", (long long)n);
}

PD_BUILD_PHI_KERNEL(relu, devkit, ALL_LAYOUT, DevkitReluKernel, float) {}
