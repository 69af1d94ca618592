// The devkit PaddlePaddle bridge: a CustomDevice library (device type
// "devkit") that forwards Paddle's C_DeviceInterface to the DK_DeviceApi of
// the devkit plugin named by DEVKIT_PADDLE_PLUGIN, and registers phi kernels
// that run devkit ops. devkit.paddle builds it against the installed wheel's
// headers (docs/paddle.md).
//
// The plugin is loaded in-process by the Python devkit (devkit.paddle._bridge),
// so C plugins and Python (cffi) plugins are reached alike: the bridge takes
// the table's address from Python once, then calls the table directly for
// device, memory, copy, stream and event hooks. Allocations go through Python
// (the GIL is taken with PyGILState_Ensure): they are devkit Buffers, so
// kernels that run_op serves can view them as devkit Arrays. Most kernels
// build their DK_KernelCalls here and call the plugin's kernel table
// directly ("direct calls" below); the others, and any case a direct path
// does not cover, go through Python's run_op (devkit/paddle/ops.py).
//
// Pointers Paddle sees: on a device reporting DK_DEVICE_HOST_POINTER_HANDLES
// an allocation's pointer is its handle (a host address); otherwise it is a
// token from a reserved address range, one range per allocation. Paddle
// offsets these pointers (its allocator carves chunks, tensors take slices),
// so every hook resolves a pointer to (handle, byte offset) through the
// table of live allocations below.
//
// Execution is synchronous: kernels and copies, the
// async ones included, run on the device's default (NULL) stream, which
// completes before returning. Streams and events are still the plugin's, so
// Paddle's stream and event calls are forwarded and answer correctly.
#include <Python.h>
#include <dlfcn.h>

#include <cstdio>
#include <cstdlib>
#include <algorithm>
#include <cstring>
#include <map>
#include <mutex>
#include <string>
#include <tuple>
#include <vector>

#include "bridge_ccl.h"
#include "devkit.h"
#include "paddle/phi/backends/device_ext.h"
#include "paddle/phi/capi/all.h"

namespace {

const DK_DeviceApi* g_api = nullptr;
int32_t g_count = 0;
std::vector<size_t> g_alignment;   // per device: alloc_alignment
std::vector<size_t> g_max_alloc;   // per device: max_alloc_size
std::vector<uint64_t> g_flags;     // per device: DK_DeviceFlags
std::vector<int32_t> g_device_types;  // per device: DK_DeviceProperties.device_type, for DK_Tensor.device
thread_local int32_t t_current = 0;  // Paddle has a current device; devkit does not

struct Region {
  DK_Mem mem;
  size_t size;
};
std::mutex g_regions_lock;
std::map<uintptr_t, Region> g_regions;  // allocation start -> its handle and size

// Takes the GIL for the scope (hooks may run on any Paddle thread).
struct Gil {
  PyGILState_STATE state;
  Gil() : state(PyGILState_Ensure()) {}
  ~Gil() { PyGILState_Release(state); }
};

PyObject* g_module = nullptr;  // devkit.paddle._bridge

// The pending Python exception as one line, cleared.
std::string python_error() {
  PyObject *type, *value, *trace;
  PyErr_Fetch(&type, &value, &trace);
  PyErr_NormalizeException(&type, &value, &trace);
  std::string text = "unknown Python error";
  if (value != nullptr) {
    PyObject* name = type ? PyObject_GetAttrString(type, "__name__") : nullptr;
    PyObject* str = PyObject_Str(value);
    const char* n = name ? PyUnicode_AsUTF8(name) : nullptr;
    const char* s = str ? PyUnicode_AsUTF8(str) : nullptr;
    text = std::string(n ? n : "Error") + ": " + (s ? s : "");
    Py_XDECREF(name);
    Py_XDECREF(str);
  }
  PyErr_Clear();
  Py_XDECREF(type);
  Py_XDECREF(value);
  Py_XDECREF(trace);
  return text;
}

void report(const std::string& what) {
  std::fprintf(stderr, "[devkit.paddle] %s\n", what.c_str());
}

// Calls devkit.paddle._bridge.<fn>(*args) with the GIL held; a new reference or
// NULL with the Python exception pending.
PyObject* call_python(const char* fn, PyObject* args) {
  PyObject* result = nullptr;
  if (g_module != nullptr) {
    PyObject* callable = PyObject_GetAttrString(g_module, fn);
    if (callable != nullptr) {
      result = PyObject_CallObject(callable, args);
      Py_DECREF(callable);
    }
  }
  Py_XDECREF(args);
  return result;
}

// The plugin's message for the last failed call on this thread.
std::string plugin_message() {
  Gil gil;
  PyObject* text = call_python("plugin_error_message", PyTuple_New(0));
  std::string message = text ? PyUnicode_AsUTF8(text) : python_error();
  Py_XDECREF(text);
  return message;
}

// A DK_Status as a C_Status, reporting the plugin's message on failure.
C_Status status(DK_Status s, const char* function) {
  if (s == DK_OK) return C_SUCCESS;
  if (s == DK_NOT_READY) return C_FAILED;  // Paddle's "not complete yet" for queries
  report(std::string(function) + " failed (status " + std::to_string(s) +
         "): " + plugin_message());
  return (s == DK_INVALID_ARGUMENT || s == DK_OUT_OF_RANGE) ? C_ERROR : C_FAILED;
}

bool valid(const C_Device device) {
  return device != nullptr && device->id >= 0 && device->id < g_count;
}

// (handle, offset) of a pointer inside a live allocation.
bool resolve(const void* pointer, DK_Mem* mem, size_t* offset) {
  uintptr_t address = reinterpret_cast<uintptr_t>(pointer);
  std::lock_guard<std::mutex> lock(g_regions_lock);
  auto it = g_regions.upper_bound(address);
  if (it == g_regions.begin()) return false;
  --it;
  if (address - it->first > it->second.size) return false;  // one past the end is a valid empty view
  *mem = it->second.mem;
  *offset = address - it->first;
  return true;
}

C_Status unresolved(const char* function, const void* pointer) {
  report(std::string(function) + ": pointer " + std::to_string(reinterpret_cast<uintptr_t>(pointer)) +
         " is not inside a live devkit allocation");
  return C_ERROR;
}

// ---- direct kernel calls ---------------------------------------------------------------
// Elementwise kernels whose devkit op the plugin has for the dtype, on compact
// tensors, skip Python: the plugin's DK_KernelFn runs on Paddle's memory in
// place (no output copy) on the default stream, complete when it returns, as
// the devkit runtime's own eager calls run. _bridge.direct_entry decides which
// (DEVKIT_PADDLE_DIRECT=0: none).

std::mutex g_direct_lock;
std::map<std::pair<std::string, int>, const DK_KernelEntry*> g_direct_entries;  // (devkit op, DK_DTypeKey) -> entry or NULL
std::map<std::string, long long> g_direct_calls;  // op -> direct calls so far

// _bridge.direct_calls(): op -> direct calls so far (devkit.paddle.kernel_counts adds them).
PyObject* direct_calls(PyObject*, PyObject*) {
  PyObject* counts = PyDict_New();
  std::lock_guard<std::mutex> lock(g_direct_lock);
  for (const auto& item : g_direct_calls) {
    PyObject* value = PyLong_FromLongLong(item.second);
    PyDict_SetItemString(counts, item.first.c_str(), value);
    Py_DECREF(value);
  }
  return counts;
}
PyMethodDef g_bridge_functions[] = {
    {"direct_calls", direct_calls, METH_NOARGS, "op -> calls that bridge.cc made to the plugin's kernel directly"},
    {nullptr, nullptr, 0, nullptr}};

// ---- device ------------------------------------------------------------------------

C_Status init_device(const C_Device device) { return valid(device) ? C_SUCCESS : C_ERROR; }
C_Status set_device(const C_Device device) {
  if (!valid(device)) return C_ERROR;
  t_current = device->id;
  return C_SUCCESS;
}
C_Status get_device(const C_Device device) {
  device->id = t_current;
  return C_SUCCESS;
}
C_Status deinit_device(const C_Device) { return C_SUCCESS; }
C_Status get_device_count(size_t* count) {
  *count = static_cast<size_t>(g_count);
  return C_SUCCESS;
}
C_Status get_device_list(size_t* devices) {
  for (int32_t i = 0; i < g_count; ++i) devices[i] = static_cast<size_t>(i);
  return C_SUCCESS;
}
C_Status synchronize_device(const C_Device device) {
  if (!valid(device)) return C_ERROR;
  return status(g_api->device_synchronize(device->id), "device_synchronize");
}
C_Status memory_stats(const C_Device device, size_t* total, size_t* free_bytes) {
  if (!valid(device)) return C_ERROR;
  return status(g_api->mem_get_info(device->id, free_bytes, total), "mem_get_info");
}
C_Status min_chunk_size(const C_Device device, size_t* size) {
  if (!valid(device)) return C_ERROR;
  *size = g_alignment[device->id];
  return C_SUCCESS;
}
C_Status max_alloc_size(const C_Device device, size_t* size) {
  if (!valid(device)) return C_ERROR;
  *size = g_max_alloc[device->id];
  return C_SUCCESS;
}
C_Status is_float16_supported(const C_Device device, bool* supported) {
  if (!valid(device)) return C_ERROR;
  *supported = (g_flags[device->id] & DK_DEVICE_FP16) != 0;
  return C_SUCCESS;
}
C_Status is_bfloat16_supported(const C_Device device, bool* supported) {
  if (!valid(device)) return C_ERROR;
  *supported = (g_flags[device->id] & DK_DEVICE_BF16) != 0;
  return C_SUCCESS;
}

// ---- memory ------------------------------------------------------------------------

C_Status allocate(const C_Device device, void** pointer, size_t size) {
  if (!valid(device)) return C_ERROR;
  Gil gil;
  PyObject* result = call_python("allocate", Py_BuildValue("(in)", device->id, (Py_ssize_t)size));
  unsigned long long token = 0, handle = 0;
  if (result == nullptr || !PyArg_ParseTuple(result, "KK", &token, &handle)) {
    Py_XDECREF(result);
    report("device_memory_allocate of " + std::to_string(size) + " bytes: " + python_error());
    return C_FAILED;
  }
  Py_DECREF(result);
  {
    std::lock_guard<std::mutex> lock(g_regions_lock);
    g_regions[static_cast<uintptr_t>(token)] = Region{reinterpret_cast<DK_Mem>(handle), size};
  }
  *pointer = reinterpret_cast<void*>(token);
  return C_SUCCESS;
}

C_Status deallocate(const C_Device device, void* pointer, size_t) {
  if (!valid(device)) return C_ERROR;
  {
    std::lock_guard<std::mutex> lock(g_regions_lock);
    if (g_regions.erase(reinterpret_cast<uintptr_t>(pointer)) == 0) {
      report("device_memory_deallocate: pointer is not a live devkit allocation");
      return C_ERROR;
    }
  }
  // Paddle may release its cached chunks after Python has finalized, at exit:
  // the process is ending and takes the memory with it.
  if (!Py_IsInitialized() || _Py_IsFinalizing()) return C_SUCCESS;
  Gil gil;
  PyObject* result = call_python("free", Py_BuildValue("(K)", (unsigned long long)(uintptr_t)pointer));
  if (result == nullptr) {
    report("device_memory_deallocate: " + python_error());
    return C_FAILED;
  }
  Py_DECREF(result);
  return C_SUCCESS;
}

C_Status memory_set(const C_Device device, void* pointer, unsigned char value, size_t size) {
  DK_Mem mem;
  size_t offset;
  if (!valid(device)) return C_ERROR;
  if (!resolve(pointer, &mem, &offset)) return unresolved("device_memory_set", pointer);
  return status(g_api->memset(device->id, mem, offset, value, size, nullptr), "memset");
}

C_Status copy_h2d(const C_Device device, void* dst, const void* src, size_t size) {
  DK_Mem mem;
  size_t offset;
  if (!valid(device)) return C_ERROR;
  if (size == 0) return C_SUCCESS;
  if (!resolve(dst, &mem, &offset)) return unresolved("memory_copy_h2d", dst);
  return status(g_api->copy_h2d(device->id, mem, offset, src, size, nullptr), "copy_h2d");
}

C_Status copy_d2h(const C_Device device, void* dst, const void* src, size_t size) {
  DK_Mem mem;
  size_t offset;
  if (!valid(device)) return C_ERROR;
  if (size == 0) return C_SUCCESS;
  if (!resolve(src, &mem, &offset)) return unresolved("memory_copy_d2h", src);
  return status(g_api->copy_d2h(device->id, dst, mem, offset, size, nullptr), "copy_d2h");
}

C_Status copy_d2d(const C_Device device, void* dst, const void* src, size_t size) {
  DK_Mem dst_mem, src_mem;
  size_t dst_offset, src_offset;
  if (!valid(device)) return C_ERROR;
  if (size == 0) return C_SUCCESS;
  if (!resolve(dst, &dst_mem, &dst_offset)) return unresolved("memory_copy_d2d", dst);
  if (!resolve(src, &src_mem, &src_offset)) return unresolved("memory_copy_d2d", src);
  return status(g_api->copy_d2d(device->id, dst_mem, dst_offset, src_mem, src_offset, size, nullptr),
                "copy_d2d");
}

// Async copies complete before returning (see the top of the file): correct,
// as a copy may finish early.
C_Status async_copy_h2d(const C_Device device, C_Stream, void* dst, const void* src, size_t size) {
  return copy_h2d(device, dst, src, size);
}
C_Status async_copy_d2h(const C_Device device, C_Stream, void* dst, const void* src, size_t size) {
  return copy_d2h(device, dst, src, size);
}
C_Status async_copy_d2d(const C_Device device, C_Stream, void* dst, const void* src, size_t size) {
  return copy_d2d(device, dst, src, size);
}

// ---- streams and events -------------------------------------------------------------

C_Status create_stream(const C_Device device, C_Stream* stream) {
  if (!valid(device)) return C_ERROR;
  DK_Stream s = nullptr;
  C_Status st = status(g_api->stream_create(device->id, &s), "stream_create");
  *stream = reinterpret_cast<C_Stream>(s);
  return st;
}
C_Status destroy_stream(const C_Device device, C_Stream stream) {
  if (!valid(device)) return C_ERROR;
  return status(g_api->stream_destroy(device->id, reinterpret_cast<DK_Stream>(stream)), "stream_destroy");
}
C_Status query_stream(const C_Device device, C_Stream stream) {
  if (!valid(device)) return C_ERROR;
  return status(g_api->stream_query(device->id, reinterpret_cast<DK_Stream>(stream)), "stream_query");
}
C_Status synchronize_stream(const C_Device device, C_Stream stream) {
  if (!valid(device)) return C_ERROR;
  return status(g_api->stream_synchronize(device->id, reinterpret_cast<DK_Stream>(stream)),
                "stream_synchronize");
}
C_Status create_event(const C_Device device, C_Event* event) {
  if (!valid(device)) return C_ERROR;
  DK_Event e = nullptr;
  C_Status st = status(g_api->event_create(device->id, DK_EVENT_DISABLE_TIMING, &e), "event_create");
  *event = reinterpret_cast<C_Event>(e);
  return st;
}
C_Status destroy_event(const C_Device device, C_Event event) {
  if (!valid(device)) return C_ERROR;
  return status(g_api->event_destroy(device->id, reinterpret_cast<DK_Event>(event)), "event_destroy");
}
C_Status record_event(const C_Device device, C_Stream stream, C_Event event) {
  if (!valid(device)) return C_ERROR;
  return status(g_api->event_record(device->id, reinterpret_cast<DK_Event>(event),
                                    reinterpret_cast<DK_Stream>(stream)), "event_record");
}
C_Status query_event(const C_Device device, C_Event event) {
  if (!valid(device)) return C_ERROR;
  return status(g_api->event_query(device->id, reinterpret_cast<DK_Event>(event)), "event_query");
}
C_Status synchronize_event(const C_Device device, C_Event event) {
  if (!valid(device)) return C_ERROR;
  return status(g_api->event_synchronize(device->id, reinterpret_cast<DK_Event>(event)),
                "event_synchronize");
}
C_Status stream_wait_event(const C_Device device, C_Stream stream, C_Event event) {
  if (!valid(device)) return C_ERROR;
  return status(g_api->stream_wait_event(device->id, reinterpret_cast<DK_Stream>(stream),
                                         reinterpret_cast<DK_Event>(event)), "stream_wait_event");
}

// Loads the plugin through the Python devkit; on failure the device type
// registers with no devices, and set_device("devkit:0") then says so.
void attach() {
  if (!Py_IsInitialized()) {
    report("Python is not initialised: the bridge runs inside a Python process that imports paddle");
    return;
  }
  Gil gil;
  g_module = PyImport_ImportModule("devkit.paddle._bridge");
  if (g_module == nullptr) {
    report("importing devkit.paddle._bridge: " + python_error());
    return;
  }
  // Python keeps the library loaded: Paddle unloads its custom-device libraries at
  // exit, before the module teardown that frees direct_calls (it reads its PyMethodDef).
  Dl_info self;
  const char* path = dladdr(reinterpret_cast<void*>(&attach), &self) != 0 ? self.dli_fname : "";
  PyObject* result = call_python("attach", Py_BuildValue("(s)", path));
  unsigned long long api = 0;
  PyObject* devices = nullptr;
  if (result == nullptr || !PyArg_ParseTuple(result, "KO", &api, &devices)) {
    Py_XDECREF(result);
    report("loading the devkit plugin: " + python_error());
    return;
  }
  Py_ssize_t count = PyList_Size(devices);
  for (Py_ssize_t i = 0; i < count; ++i) {
    unsigned long long alignment, max_alloc, flags;
    int device_type;
    if (!PyArg_ParseTuple(PyList_GetItem(devices, i), "KKKi", &alignment, &max_alloc, &flags, &device_type)) {
      report("reading device properties: " + python_error());
      Py_DECREF(result);
      return;
    }
    g_alignment.push_back(alignment);
    g_max_alloc.push_back(max_alloc);
    g_flags.push_back(flags);
    g_device_types.push_back(device_type);
  }
  Py_DECREF(result);
  g_api = reinterpret_cast<const DK_DeviceApi*>(api);
  g_count = static_cast<int32_t>(count);
  if (PyModule_AddFunctions(g_module, g_bridge_functions) != 0) report("adding direct_calls: " + python_error());
}

}  // namespace

extern "C" void InitPlugin(CustomRuntimeParams* params) {
  PADDLE_CUSTOM_RUNTIME_CHECK_VERSION(params);
  params->device_type = const_cast<char*>("devkit");
  params->sub_device_type = const_cast<char*>("devkit");
  attach();
  C_DeviceInterface* i = params->interface;
  // Paddle needs these non-NULL to register the device type at all.
  i->set_device = set_device;
  i->get_device = get_device;
  i->get_device_count = get_device_count;
  i->get_device_list = get_device_list;
  i->create_event = create_event;
  i->destroy_event = destroy_event;
  i->record_event = record_event;
  i->synchronize_event = synchronize_event;
  i->device_memory_allocate = allocate;
  i->device_memory_deallocate = deallocate;
  i->init_device = init_device;
  i->deinit_device = deinit_device;
  i->create_stream = create_stream;
  i->destroy_stream = destroy_stream;
  i->query_stream = query_stream;
  i->synchronize_stream = synchronize_stream;
  i->query_event = query_event;
  i->stream_wait_event = stream_wait_event;
  i->synchronize_device = synchronize_device;
  i->device_memory_set = memory_set;
  i->memory_copy_h2d = copy_h2d;
  i->memory_copy_d2h = copy_d2h;
  i->memory_copy_d2d = copy_d2d;
  i->async_memory_copy_h2d = async_copy_h2d;
  i->async_memory_copy_d2h = async_copy_d2h;
  i->async_memory_copy_d2d = async_copy_d2d;
  i->device_memory_stats = memory_stats;
  i->device_min_chunk_size = min_chunk_size;
  i->device_max_alloc_size = max_alloc_size;
  i->is_float16_supported = is_float16_supported;
  i->is_bfloat16_supported = is_bfloat16_supported;
  devkit_paddle::register_collectives(i, {g_api, resolve, status, [] { return t_current; }, report});
}

// ---- kernels -------------------------------------------------------------------------
// Every kernel packs its arguments, in Paddle's signature order, into a Python
// list and calls devkit.paddle._bridge.run(op, device, args); devkit/paddle/ops.py
// lowers the op to devkit ops. Tensors travel as (allocation token, byte
// offset, shape, PD_DataType, strides); outputs are allocated here first (their shapes
// were inferred by Paddle), and an output or optional input Paddle leaves out
// is None.

namespace {

using phi::capi::DenseTensor;

PyObject* int_tuple(const std::vector<int64_t>& values) {
  PyObject* tuple = PyTuple_New(static_cast<Py_ssize_t>(values.size()));
  for (size_t k = 0; k < values.size(); ++k) PyTuple_SET_ITEM(tuple, k, PyLong_FromLongLong(values[k]));
  return tuple;
}

PyObject* tensor_arg(const DenseTensor& t, const void* data) {
  uintptr_t start = 0;
  size_t offset = 0;
  // An empty tensor, or one whose buffer the kernel does not need (Paddle's
  // NoNeedBuffer inputs, such as mean_all_grad's x), travels as shape only.
  if (t.numel() > 0 && data != nullptr) {
    DK_Mem mem;
    if (!resolve(data, &mem, &offset)) PD_THROW("a kernel argument is not in devkit memory");
    start = reinterpret_cast<uintptr_t>(data) - offset;
  }
  // Strides are in elements; only a view (the input of contiguous) has other than compact ones.
  std::vector<int64_t> strides = t.strides();
  if (strides.size() != t.dims().size()) strides.clear();  // no strides set: compact
  return Py_BuildValue("(KnNiN)", (unsigned long long)start, (Py_ssize_t)offset, int_tuple(t.dims()),
                       static_cast<int>(t.dtype()), int_tuple(strides));
}

struct Args {
  const phi::Context& ctx;
  PD_DataType kernel_dtype;
  PyObject* list;
};

void append(Args& a, PyObject* o) {
  PyList_Append(a.list, o);
  Py_DECREF(o);
}
void add(Args& a, const DenseTensor& t) {
  append(a, tensor_arg(t, t.initialized() ? t.data<void>() : nullptr));
}
void add(Args& a, const paddle::optional<DenseTensor>& t) {
  if (t) {
    add(a, *t);
  } else {
    PyList_Append(a.list, Py_None);
  }
}
void add(Args& a, DenseTensor* t) {
  if (t == nullptr || !t->valid()) {  // an output Paddle does not want, or gave no meta (reserve_space)
    PyList_Append(a.list, Py_None);
    return;
  }
  PD_DataType dtype = t->dtype() == PD_DataType::UNDEFINED ? a.kernel_dtype : t->dtype();
  void* data = a.ctx.Alloc(t, dtype);
  append(a, tensor_arg(*t, data));
}
void add(Args& a, const std::vector<const DenseTensor*>& inputs) {
  PyObject* list = PyList_New(0);
  Args items{a.ctx, a.kernel_dtype, list};
  for (const DenseTensor* t : inputs) add(items, *t);
  append(a, list);
}
void add(Args& a, const std::vector<DenseTensor*>& outputs) {
  PyObject* list = PyList_New(0);
  Args items{a.ctx, a.kernel_dtype, list};
  for (DenseTensor* t : outputs) add(items, t);
  append(a, list);
}
void add(Args& a, bool v) { PyList_Append(a.list, v ? Py_True : Py_False); }
void add(Args& a, int v) { append(a, PyLong_FromLong(v)); }
void add(Args& a, int64_t v) { append(a, PyLong_FromLongLong(v)); }
void add(Args& a, float v) { append(a, PyFloat_FromDouble(v)); }
// A list of integers (an int_tuple's values as a Python list).
template <typename Int>
void add(Args& a, const std::vector<Int>& v) {
  PyObject* o = PyList_New(0);
  for (Int x : v) {
    PyObject* item = PyLong_FromLongLong(static_cast<long long>(x));
    PyList_Append(o, item);
    Py_DECREF(item);
  }
  append(a, o);
}
void add(Args& a, const phi::IntArray& v) { add(a, v.GetData()); }
void add(Args& a, const std::string& v) { append(a, PyUnicode_FromString(v.c_str())); }
void add(Args& a, const phi::Scalar& v) { append(a, PyFloat_FromDouble(v.to<double>())); }
void add(Args& a, PD_DataType v) { append(a, PyLong_FromLong(static_cast<long>(v))); }

// ---- direct calls: phi tensors straight into a DK_KernelCall ------------------------
// A kernel with a direct path builds every devkit call it needs first
// (Paddle's tensors as (handle, offset), compact, shapes as the devkit op
// wants them; attributes as the op's schema names them; scratch memory for
// intermediate results and outputs Paddle does not want), and only then runs
// them; when something does not fit (a strided view, an empty tensor, an
// attribute value the direct path does not cover, an op the plugin lacks)
// it returns false before running anything and the kernel goes through
// run_op instead.

bool dk_dtype(PD_DataType dtype, DK_DataType* out) {
  switch (dtype) {
    case PD_DataType::FLOAT32: *out = {DK_DTYPE_CODE_FLOAT, 32, 1}; return true;
    case PD_DataType::FLOAT64: *out = {DK_DTYPE_CODE_FLOAT, 64, 1}; return true;
    case PD_DataType::FLOAT16: *out = {DK_DTYPE_CODE_FLOAT, 16, 1}; return true;
    case PD_DataType::BFLOAT16: *out = {DK_DTYPE_CODE_BFLOAT, 16, 1}; return true;
    case PD_DataType::INT32: *out = {DK_DTYPE_CODE_INT, 32, 1}; return true;
    case PD_DataType::INT64: *out = {DK_DTYPE_CODE_INT, 64, 1}; return true;
    case PD_DataType::INT8: *out = {DK_DTYPE_CODE_INT, 8, 1}; return true;
    case PD_DataType::UINT8: *out = {DK_DTYPE_CODE_UINT, 8, 1}; return true;
    case PD_DataType::BOOL: *out = {DK_DTYPE_CODE_BOOL, 8, 1}; return true;
    default: return false;
  }
}

const DK_DataType kFloat32{DK_DTYPE_CODE_FLOAT, 32, 1};

// A tensor of a devkit call: where its bytes are and how the op sees them.
struct Operand {
  DK_Mem mem = nullptr;
  size_t offset = 0;
  std::vector<int64_t> shape;
  DK_DataType dtype{};
  std::vector<int64_t> strides;  // in elements; empty: compact
};

int64_t numel(const std::vector<int64_t>& shape) {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

// Paddle's tensor (its memory at data) as an operand: false unless compact,
// non-empty, in devkit memory and of a dtype the ABI keys. shape, where given,
// replaces Paddle's (same element count: a reshape).
// Paddle's tensor (its memory at data) as an operand: false unless non-empty, in devkit
// memory, of a dtype the ABI keys and compact, or a view (Paddle's stride kernels) where
// `view` allows one (its strides kept; a call whose kernel takes no strided inputs declines).
// shape, where given, replaces Paddle's (same element count: a reshape of a compact tensor).
bool operand(const DenseTensor& t, const void* data, std::vector<int64_t> shape, Operand* out, bool view = false) {
  if (data == nullptr || t.numel() == 0 || !dk_dtype(t.dtype(), &out->dtype)) return false;
  std::vector<int64_t> dims = t.dims(), strides = t.strides();
  bool compact = true;
  int64_t step = 1;
  for (size_t k = strides.size(); k-- > 0;) {  // compact row-major, or no strides at all
    if (strides.size() == dims.size() && dims[k] != 1 && strides[k] != step) compact = false;
    step *= dims[k];
  }
  if (!compact && (!view || !shape.empty())) return false;
  if (!resolve(data, &out->mem, &out->offset)) return false;
  if (shape.empty() && !dims.empty()) shape = dims;
  if (numel(shape) != t.numel()) return false;
  out->shape = std::move(shape);
  out->strides = compact ? std::vector<int64_t>{} : std::move(strides);
  return true;
}
bool input(const DenseTensor& t, Operand* out, std::vector<int64_t> shape = {}) {
  return t.initialized() && operand(t, t.data<void>(), std::move(shape), out);
}
// An input that may be a strided view.
bool view_input(const DenseTensor& t, Operand* out) {
  return t.initialized() && operand(t, t.data<void>(), {}, out, true);
}
// An output, allocated now; Paddle leaves some outputs' dtype unset until then: they take
// `dtype` (the kernel's).
bool output(const phi::Context& ctx, DenseTensor* t, Operand* out, std::vector<int64_t> shape = {},
            PD_DataType dtype = PD_DataType::FLOAT32) {
  if (t == nullptr || !t->valid()) return false;
  return operand(*t, ctx.Alloc(t, t->dtype() == PD_DataType::UNDEFINED ? dtype : t->dtype()), std::move(shape), out);
}

// value's bytes in a float dtype (float16 and bfloat16 rounded as Paddle rounds them).
bool encode_float(double value, DK_DataType dtype, unsigned char* bytes) {
  if (dtype.code == DK_DTYPE_CODE_FLOAT && dtype.bits == 32) {
    float v = static_cast<float>(value);
    std::memcpy(bytes, &v, 4);
  } else if (dtype.code == DK_DTYPE_CODE_FLOAT && dtype.bits == 64) {
    std::memcpy(bytes, &value, 8);
  } else if (dtype.code == DK_DTYPE_CODE_FLOAT && dtype.bits == 16) {
    phi::dtype::float16 v(static_cast<float>(value));
    std::memcpy(bytes, &v, 2);
  } else if (dtype.code == DK_DTYPE_CODE_BFLOAT && dtype.bits == 16) {
    phi::dtype::bfloat16 v(static_cast<float>(value));
    std::memcpy(bytes, &v, 2);
  } else {
    return false;
  }
  return true;
}

// Scratch device memory for intermediate results: blocks kept per device and
// reused, so a warm training step allocates nothing. A Scratch hands its
// blocks back when it goes out of scope; kernels run to completion on the
// default stream before that (see the top of the file).
std::mutex g_scratch_lock;
std::vector<std::multimap<size_t, DK_Mem>> g_scratch_free;  // per device: size -> free block
std::map<std::tuple<int32_t, uint32_t, uint32_t>, Operand> g_constants;  // (device, dtype, float bits) -> scalar

class Scratch {
 public:
  explicit Scratch(int32_t dev) : dev_(dev) {}
  ~Scratch() {
    std::lock_guard<std::mutex> lock(g_scratch_lock);
    for (auto& block : taken_) g_scratch_free[dev_].emplace(block.first, block.second);
  }
  Scratch(const Scratch&) = delete;
  Scratch& operator=(const Scratch&) = delete;

  // A compact operand of shape and dtype in a scratch block.
  Operand take(std::vector<int64_t> shape, DK_DataType dtype) {
    size_t bytes = static_cast<size_t>(std::max<int64_t>(numel(shape), 1)) * ((dtype.bits + 7) / 8);
    Operand o;
    o.shape = std::move(shape);
    o.dtype = dtype;
    {
      std::lock_guard<std::mutex> lock(g_scratch_lock);
      if (g_scratch_free.size() < static_cast<size_t>(g_count)) g_scratch_free.resize(g_count);
      auto& free_blocks = g_scratch_free[dev_];
      auto it = free_blocks.lower_bound(bytes);
      if (it != free_blocks.end()) {
        taken_.emplace_back(it->first, it->second);
        free_blocks.erase(it);
        o.mem = taken_.back().second;
        return o;
      }
    }
    size_t size = 256;
    while (size < bytes) size *= 2;  // powers of two: blocks fit many later requests
    DK_Mem mem = nullptr;
    if (g_api->mem_alloc(dev_, size, &mem) != DK_OK)
      PD_THROW("devkit scratch memory of " + std::to_string(size) + " bytes: " + plugin_message());
    taken_.emplace_back(size, mem);
    o.mem = mem;
    return o;
  }
  // A scalar (shape []) of a float dtype holding value: the device's constants are written once
  // and kept (epsilons, scales: a few per model); past kMaxConstants, a scratch block each time.
  Operand scalar(float value, DK_DataType dtype = kFloat32) {
    static constexpr size_t kMaxConstants = 256;
    uint32_t bits;
    std::memcpy(&bits, &value, sizeof bits);
    auto key = std::make_tuple(dev_, dtype.code | (dtype.bits << 8), bits);
    {
      std::lock_guard<std::mutex> lock(g_scratch_lock);
      auto it = g_constants.find(key);
      if (it != g_constants.end()) return it->second;
      if (g_constants.size() >= kMaxConstants) return filled({}, value, dtype);
    }
    Operand o;
    o.dtype = dtype;
    unsigned char bytes[8];
    if (!encode_float(value, dtype, bytes)) PD_THROW("devkit constant: a dtype that is not a float");
    check(g_api->mem_alloc(dev_, 256, &o.mem), "mem_alloc");
    check(g_api->copy_h2d(dev_, o.mem, 0, bytes, (dtype.bits + 7) / 8, nullptr), "copy_h2d");
    std::lock_guard<std::mutex> lock(g_scratch_lock);
    auto inserted = g_constants.emplace(key, o);
    if (!inserted.second) g_api->mem_free(dev_, o.mem);  // another thread wrote it first
    return inserted.first->second;
  }
  // A tensor of shape and a float dtype filled with value.
  Operand filled(std::vector<int64_t> shape, float value, DK_DataType dtype = kFloat32) {
    Operand o = take(std::move(shape), dtype);
    size_t item = (dtype.bits + 7) / 8, n = static_cast<size_t>(std::max<int64_t>(numel(o.shape), 1));
    unsigned char bytes[8];
    if (!encode_float(value, dtype, bytes)) PD_THROW("devkit scratch: a constant of a dtype that is not a float");
    std::vector<unsigned char> host(n * item);
    for (size_t k = 0; k < n; ++k) std::memcpy(host.data() + k * item, bytes, item);
    check(g_api->copy_h2d(dev_, o.mem, o.offset, host.data(), host.size(), nullptr), "copy_h2d");
    return o;
  }
  static void check(DK_Status s, const char* what) {
    if (s != DK_OK) PD_THROW(std::string("devkit ") + what + ": " + plugin_message());
  }

 private:
  int32_t dev_;
  std::vector<std::pair<size_t, DK_Mem>> taken_;
};

// The plugin's kernel entry for a devkit op and the dtype of its key input,
// asked of Python once (NULL: the plugin lacks it).
const DK_KernelEntry* kernel_entry(const char* op, DK_DataType dtype) {
  uint32_t key = dtype.code | (dtype.bits << 8) | (dtype.lanes << 16);
  std::pair<std::string, int> cache_key(op, static_cast<int>(key));
  {
    std::lock_guard<std::mutex> lock(g_direct_lock);
    auto it = g_direct_entries.find(cache_key);
    if (it != g_direct_entries.end()) return it->second;
  }
  unsigned long long address = 0;
  {
    Gil gil;
    PyObject* result = call_python("kernel_entry", Py_BuildValue("(sI)", op, key));
    if (result == nullptr) {
      report(std::string("kernel_entry: ") + python_error());  // the Python path still runs the op
    } else {
      address = PyLong_AsUnsignedLongLong(result);
      Py_DECREF(result);
    }
  }
  const DK_KernelEntry* entry = reinterpret_cast<const DK_KernelEntry*>(address);
  std::lock_guard<std::mutex> lock(g_direct_lock);
  g_direct_entries[cache_key] = entry;
  return entry;
}

// One devkit kernel call: its operands and attributes, run on the default stream. Storage is
// inline (no allocation but the operands' shapes); attribute lists point into it only while
// the call runs, so a Call may be moved.
class Call {
 public:
  static constexpr size_t kMaxOperands = 6, kMaxAttributes = 10, kMaxInts = 32, kMaxFloats = 2;

  Call(const char* op, DK_DataType key) : op_(op), entry_(kernel_entry(op, key)) {}
  // Whether the plugin has the kernel, and takes the strided inputs given.
  bool available() const {
    if (entry_ == nullptr) return false;
    for (size_t k = 0; k < num_ins_; ++k)
      if (!ins_[k].strides.empty() && !(entry_->flags & DK_KERNEL_STRIDED_INPUTS)) return false;
    return true;
  }
  Call& in(const Operand& o) { return put(ins_, num_ins_, o); }
  Call& out(const Operand& o) { return put(outs_, num_outs_, o); }
  Call& attr(const char* name, int64_t v) {
    add(name, DK_ATTR_INT).i = v;
    return *this;
  }
  Call& attr(const char* name, double v) {
    add(name, DK_ATTR_FLOAT).f = v;
    return *this;
  }
  Call& attr(const char* name, const char* v) {
    add(name, DK_ATTR_STRING).s = v;
    return *this;
  }
  Call& attr(const char* name, DK_DataType v) {
    add(name, DK_ATTR_DTYPE).dtype = v;
    return *this;
  }
  Call& attr(const char* name, const std::vector<int64_t>& v) {
    if (num_ints_ + v.size() > kMaxInts) PD_THROW(std::string("devkit kernel ") + op_ + ": too many ints attributes");
    DK_Attribute& a = add(name, DK_ATTR_INTS);
    a.count = static_cast<int64_t>(v.size());
    a.i = static_cast<int64_t>(num_ints_);  // where its values start; made a pointer when the call runs
    std::copy(v.begin(), v.end(), ints_ + num_ints_);
    num_ints_ += v.size();
    return *this;
  }
  Call& attr_float(const char* name, double v) {  // a floats attribute of one value
    if (num_floats_ == kMaxFloats) PD_THROW(std::string("devkit kernel ") + op_ + ": too many floats attributes");
    DK_Attribute& a = add(name, DK_ATTR_FLOATS);
    a.count = 1;
    a.i = static_cast<int64_t>(num_floats_);
    floats_[num_floats_++] = v;
    return *this;
  }

  // Runs the kernel; a failure throws, naming the phi kernel it serves.
  void run(const char* phi_op, int32_t dev) {
    DK_Tensor ins[kMaxOperands], outs[kMaxOperands];
    for (size_t k = 0; k < num_ins_; ++k) ins[k] = tensor(ins_[k], dev);
    for (size_t k = 0; k < num_outs_; ++k) outs[k] = tensor(outs_[k], dev);
    DK_Attribute attrs[kMaxAttributes];
    const DK_Attribute* pointers[kMaxAttributes];
    for (size_t k = 0; k < num_attrs_; ++k) {
      attrs[k] = attrs_[k];
      if (attrs[k].type == DK_ATTR_INTS) attrs[k].ints = ints_ + attrs[k].i;
      if (attrs[k].type == DK_ATTR_FLOATS) attrs[k].floats = floats_ + attrs[k].i;
      pointers[k] = &attrs[k];
    }
    DK_KernelCall call{};
    call.struct_size = sizeof(call);
    call.device = dev;
    call.stream = nullptr;
    call.inputs = ins;
    call.num_inputs = num_ins_;
    call.outputs = outs;
    call.num_outputs = num_outs_;
    call.attributes = pointers;
    call.num_attributes = num_attrs_;
    call.user_data = entry_->user_data;
    DK_Status s = entry_->fn(&call);
    // The run_op path's form: Paddle raises it as an OSError naming the phi kernel.
    if (s != DK_OK) PD_THROW(std::string("devkit kernel '") + phi_op + "': " + op_ + ": " + plugin_message());
  }

 private:
  Call& put(Operand* list, size_t& count, const Operand& o) {
    if (count == kMaxOperands) PD_THROW(std::string("devkit kernel ") + op_ + ": too many operands");
    list[count++] = o;
    return *this;
  }
  DK_Attribute& add(const char* name, int32_t type) {
    if (num_attrs_ == kMaxAttributes) PD_THROW(std::string("devkit kernel ") + op_ + ": too many attributes");
    DK_Attribute& a = attrs_[num_attrs_++];
    a = DK_Attribute{};
    a.struct_size = sizeof(a);
    a.name = name;
    a.type = type;
    return a;
  }
  static DK_Tensor tensor(Operand& o, int32_t dev) {
    return DK_Tensor{o.mem, DK_Device{g_device_types[dev], dev}, static_cast<int32_t>(o.shape.size()), o.dtype,
                     o.shape.data(), o.strides.empty() ? nullptr : o.strides.data(), o.offset};
  }
  const char* op_;
  const DK_KernelEntry* entry_;
  Operand ins_[kMaxOperands], outs_[kMaxOperands];
  size_t num_ins_ = 0, num_outs_ = 0;
  DK_Attribute attrs_[kMaxAttributes];
  size_t num_attrs_ = 0;
  int64_t ints_[kMaxInts];
  size_t num_ints_ = 0;
  double floats_[kMaxFloats];
  size_t num_floats_ = 0;
};

// DEVKIT_PADDLE_DIRECT=0 sends every kernel through run_op (read once, as Paddle reads its flags).
const bool g_direct_enabled = [] {
  const char* value = std::getenv("DEVKIT_PADDLE_DIRECT");
  return value == nullptr || std::strcmp(value, "0") != 0;
}();

// The device of this thread's kernels, or -1 when direct calls cannot run.
int32_t direct_device() {
  int32_t dev = t_current;
  return (!g_direct_enabled || g_api == nullptr || dev < 0 || dev >= g_count) ? -1 : dev;
}

// The calls of one phi kernel, in order.
class Calls : public std::vector<Call> {
 public:
  Calls() { reserve(6); }  // the most one phi kernel makes: one allocation
};

// Counts one direct call of the phi kernel.
void count_direct(const char* phi_op) {
  std::lock_guard<std::mutex> lock(g_direct_lock);
  ++g_direct_calls[phi_op];
}

bool all_available(const Calls& calls) {
  for (const Call& c : calls)
    if (!c.available()) return false;
  return true;
}

// A kernel that is one devkit op of its inputs (in the op's order) into one output of the first
// input's dtype; `attrs` gives the op its attributes (elementwise ops have none).
template <typename Attrs>
bool run_direct(const char* phi_op, const char* op, const phi::Context& ctx,
                const std::initializer_list<const DenseTensor*>& inputs, DenseTensor* result, Attrs attrs) {
  int32_t dev = direct_device();
  const DenseTensor& first = **inputs.begin();
  DK_DataType key;
  if (dev < 0 || result == nullptr || !dk_dtype(first.dtype(), &key) ||
      (result->dtype() != PD_DataType::UNDEFINED && result->dtype() != first.dtype()))
    return false;
  Call call(op, key);
  for (const DenseTensor* t : inputs) {
    Operand o;
    if (!input(*t, &o)) return false;
    call.in(o);
  }
  Operand out;
  if (!call.available() || !output(ctx, result, &out, {}, first.dtype())) return false;
  attrs(call.out(out));
  call.run(phi_op, dev);
  count_direct(phi_op);
  return true;
}
bool run_direct(const char* phi_op, const char* op, const phi::Context& ctx,
                const std::initializer_list<const DenseTensor*>& inputs, DenseTensor* result) {
  return run_direct(phi_op, op, ctx, inputs, result, [](Call&) {});
}

template <typename T, typename... Ts>
void run(const char* op, const phi::Context& ctx, Ts&&... args) {
  Gil gil;
  Args a{ctx, phi::capi::CppTypeToPDType<T>::Type(), PyList_New(0)};
  (add(a, std::forward<Ts>(args)), ...);
  PyObject* result = call_python("run", Py_BuildValue("(siN)", op, t_current, a.list));
  if (result == nullptr) PD_THROW(std::string("devkit kernel '") + op + "': " + python_error());
  Py_DECREF(result);
}


// ---- kernels with a direct path (see "direct calls" above) -------------------------------------

using Shape = std::vector<int64_t>;
using phi::Context;

// The axes of `from` that a numpy broadcast to `to` added or stretched: what its grad sums over.
Shape broadcast_axes(const Shape& to, const Shape& from) {
  Shape axes;
  size_t lead = from.size() - to.size();
  for (size_t k = 0; k < from.size(); ++k)
    if (k < lead || (to[k - lead] == 1 && from[k] != 1)) axes.push_back(static_cast<int64_t>(k));
  return axes;
}

// dout summed to target's shape (a broadcast's grad), into target.
bool unbroadcast(const Context& ctx, const Operand& dout, DenseTensor* target, Calls& calls,
                 std::vector<std::pair<Operand, Operand>>& copies) {
  if (target == nullptr) return true;
  if (target->dims().size() > dout.shape.size()) return false;
  Shape axes = broadcast_axes(target->dims(), dout.shape);
  Shape kept = dout.shape;
  for (int64_t a : axes) kept[a] = 1;
  Operand out;
  if (!output(ctx, target, &out, axes.empty() ? Shape{} : kept)) return false;
  if (axes.empty()) {
    copies.emplace_back(out, dout);
    return true;
  }
  calls.emplace_back("ReduceSum", dout.dtype);
  calls.back().in(dout).out(out).attr("axes", axes).attr("keepdims", int64_t{1}).attr("noop_with_empty_axes", int64_t{0});
  return true;
}

void copy(int32_t dev, const Operand& dst, const Operand& src) {
  size_t bytes = static_cast<size_t>(numel(src.shape)) * ((src.dtype.bits + 7) / 8);
  if (dst.mem == src.mem && dst.offset == src.offset) return;
  Scratch::check(g_api->copy_d2d(dev, dst.mem, dst.offset, src.mem, src.offset, bytes, nullptr), "copy_d2d");
}

bool run_with_copies(const char* phi_op, int32_t dev, Calls& calls,
                     const std::vector<std::pair<Operand, Operand>>& copies) {
  if (!all_available(calls)) return false;
  for (Call& call : calls) call.run(phi_op, dev);
  for (const auto& c : copies) copy(dev, c.first, c.second);  // a copy may read a call's result
  count_direct(phi_op);
  return true;
}

// The grads of a broadcasting add, subtract or multiply: each the broadcast's grad of dout
// (negated for subtract's y, times the other operand for multiply).
enum class Binary { kAdd, kSubtract, kMultiply };

bool binary_grad_direct(const char* phi_op, Binary kind, const Context& c, const DenseTensor& x_,
                        const DenseTensor& y_, const DenseTensor& dout, int axis, DenseTensor* dx, DenseTensor* dy) {
  int32_t dev = direct_device();
  Operand g, x, y;
  if (dev < 0 || axis != -1 || !input(dout, &g)) return false;
  if (kind == Binary::kMultiply && ((dx != nullptr && !input(y_, &y)) || (dy != nullptr && !input(x_, &x))))
    return false;
  Scratch scratch(dev);
  Calls calls;
  std::vector<std::pair<Operand, Operand>> copies;
  auto term = [&](const char* op, std::vector<const Operand*> operands) {
    Operand result = scratch.take(g.shape, g.dtype);
    calls.emplace_back(op, g.dtype);
    for (const Operand* o : operands) calls.back().in(*o);
    calls.back().out(result);
    return result;
  };
  Operand gx = kind == Binary::kMultiply && dx != nullptr ? term("Mul", {&g, &y}) : g;
  Operand gy = kind == Binary::kMultiply && dy != nullptr ? term("Mul", {&g, &x})
               : kind == Binary::kSubtract && dy != nullptr ? term("Neg", {&g}) : g;
  // A term's broadcast grad reads the term: the reductions come after the calls that make them.
  if (!unbroadcast(c, gx, dx, calls, copies) || !unbroadcast(c, gy, dy, calls, copies)) return false;
  return run_with_copies(phi_op, dev, calls, copies);
}
bool add_grad_direct(const Context& c, const DenseTensor& x, const DenseTensor& y, const DenseTensor& dout, int axis,
                     DenseTensor* dx, DenseTensor* dy) {
  return binary_grad_direct("add_grad", Binary::kAdd, c, x, y, dout, axis, dx, dy);
}
bool subtract_grad_direct(const Context& c, const DenseTensor& x, const DenseTensor& y, const DenseTensor& dout,
                          int axis, DenseTensor* dx, DenseTensor* dy) {
  return binary_grad_direct("subtract_grad", Binary::kSubtract, c, x, y, dout, axis, dx, dy);
}
bool multiply_grad_direct(const Context& c, const DenseTensor& x, const DenseTensor& y, const DenseTensor& dout,
                          int axis, DenseTensor* dx, DenseTensor* dy) {
  return binary_grad_direct("multiply_grad", Binary::kMultiply, c, x, y, dout, axis, dx, dy);
}

// Paddle's 2-D paddings (2 values, or top, bottom, left, right) under its padding_algorithm as
// ONNX's pads (begins, then ends); false for SAME and other counts.
template <typename Int>
bool onnx_pads(const std::vector<Int>& p, const std::string& algorithm, Shape* pads) {
  if (algorithm == "VALID") {
    *pads = {0, 0, 0, 0};
  } else if (algorithm != "EXPLICIT") {
    return false;
  } else if (p.size() == 2) {
    *pads = {p[0], p[1], p[0], p[1]};
  } else if (p.size() == 4) {
    *pads = {p[0], p[2], p[1], p[3]};
  } else {
    return false;
  }
  return true;
}

// conv2d's attributes as Conv's (NCHW, explicit or valid padding); false for others.
struct ConvAttrs {
  Shape strides, pads, dilations, kernel;
  int64_t group = 1;
  bool parse(const DenseTensor& filter, const std::vector<int>& s, const std::vector<int>& p,
             const std::string& algorithm, const std::vector<int>& d, int groups, const std::string& format) {
    if ((format != "NCHW" && format != "AnyLayout") || filter.dims().size() != 4 || !onnx_pads(p, algorithm, &pads))
      return false;
    strides.assign(s.begin(), s.end());
    dilations.assign(d.begin(), d.end());
    Shape f = filter.dims();
    kernel = {f[2], f[3]};
    group = groups;
    return true;
  }
  Call& apply(Call& call) const {
    return call.attr("strides", strides).attr("pads", pads).attr("dilations", dilations).attr("kernel_shape", kernel)
        .attr("group", group).attr("auto_pad", "NOTSET");
  }
};

bool conv2d_direct(const Context& c, const DenseTensor& input_, const DenseTensor& filter,
                   const std::vector<int>& strides, const std::vector<int>& paddings,
                   const std::string& padding_algorithm, const std::vector<int>& dilations, int groups,
                   const std::string& data_format, DenseTensor* out) {
  ConvAttrs attrs;
  return attrs.parse(filter, strides, paddings, padding_algorithm, dilations, groups, data_format) &&
         run_direct("conv2d", "Conv", c, {&input_, &filter}, out, [&](Call& k) { attrs.apply(k); });
}

bool conv2d_grad_direct(const Context& c, const DenseTensor& input_, const DenseTensor& filter,
                        const DenseTensor& out_grad, const std::vector<int>& strides,
                        const std::vector<int>& paddings, const std::string& padding_algorithm,
                        const std::vector<int>& dilations, int groups, const std::string& data_format,
                        DenseTensor* input_grad, DenseTensor* filter_grad) {
  int32_t dev = direct_device();
  ConvAttrs attrs;
  Operand x, w, dy;
  if (dev < 0 || !attrs.parse(filter, strides, paddings, padding_algorithm, dilations, groups, data_format) ||
      !input(input_, &x) || !input(filter, &w) || !input(out_grad, &dy))
    return false;
  Scratch scratch(dev);
  Operand dx, dw;  // the grads Paddle does not want go to scratch, as dB always does
  if (input_grad == nullptr) dx = scratch.take(x.shape, x.dtype);
  else if (!output(c, input_grad, &dx)) return false;
  if (filter_grad == nullptr) dw = scratch.take(w.shape, w.dtype);
  else if (!output(c, filter_grad, &dw)) return false;
  Calls calls;
  calls.emplace_back("ConvGrad", x.dtype);
  attrs.apply(calls.back().in(dy).in(x).in(w).out(dx).out(dw).out(scratch.take({w.shape[0]}, w.dtype)));
  return run_with_copies("conv2d_grad", dev, calls, {});
}

bool channels_first(const std::string& layout) {
  return layout == "NCHW" || layout == "NCL" || layout == "NC" || layout == "AnyLayout";
}

// An optional per-channel parameter, or a constant of `value` in scratch.
bool param_or(const paddle::optional<DenseTensor>& t, Shape shape, float value, DK_DataType dtype, Scratch& scratch,
              Operand* out) {
  if (t) return input(*t, out, shape);
  *out = scratch.filled(std::move(shape), value, dtype);
  return true;
}

// inv_std = 1 / sqrt(variance + epsilon), into out.
void inv_std_calls(const Operand& variance, float epsilon, const Operand& out, Scratch& scratch,
                   Calls& calls) {
  Operand sum = scratch.take(variance.shape, variance.dtype), root = scratch.take(variance.shape, variance.dtype);
  calls.emplace_back("Add", variance.dtype);
  calls.back().in(variance).in(scratch.scalar(epsilon, variance.dtype)).out(sum);
  calls.emplace_back("Sqrt", variance.dtype);
  calls.back().in(sum).out(root);
  calls.emplace_back("Reciprocal", variance.dtype);
  calls.back().in(root).out(out);
}

bool batch_norm_direct(const Context& c, const DenseTensor& x_, const DenseTensor& mean, const DenseTensor& variance,
                       const paddle::optional<DenseTensor>& scale, const paddle::optional<DenseTensor>& bias,
                       bool is_test, float momentum, float epsilon, const std::string& data_layout,
                       bool use_global_stats, bool trainable_statistics, DenseTensor* y, DenseTensor* mean_out,
                       DenseTensor* variance_out, DenseTensor* saved_mean, DenseTensor* saved_variance,
                       DenseTensor*) {
  int32_t dev = direct_device();
  Operand x, m, v, out;
  // 16-bit x keeps float32 statistics, scale and bias (Paddle's contract): devkit's op takes one
  // dtype, so that case goes through Python, which computes in float32 as Paddle's GPU kernel does.
  if (dev < 0 || x_.dtype() != mean.dtype() || !channels_first(data_layout) || x_.dims().size() < 2 ||
      !input(x_, &x) || !input(mean, &m) || !input(variance, &v) || !output(c, y, &out))
    return false;
  Shape channels{x.shape[1]};
  Scratch scratch(dev);
  Operand gamma, beta, m_out, v_out;
  if (!param_or(scale, channels, 1.0f, x.dtype, scratch, &gamma) || !param_or(bias, channels, 0.0f, x.dtype, scratch, &beta) ||
      !output(c, mean_out, &m_out) || !output(c, variance_out, &v_out))
    return false;
  Calls calls;
  std::vector<std::pair<Operand, Operand>> copies;
  auto bn = [&](double bn_momentum, int64_t training) -> Call& {
    calls.emplace_back("BatchNormalization", x.dtype);
    return calls.back().in(x).in(gamma).in(beta).in(m).in(v).attr("epsilon", static_cast<double>(epsilon))
        .attr("momentum", bn_momentum).attr("training_mode", training);
  };
  if (is_test || use_global_stats) {
    bn(momentum, 0).out(out).out(scratch.take(channels, m.dtype)).out(scratch.take(channels, v.dtype));
    copies = {{m_out, m}, {v_out, v}};
    return run_with_copies("batch_norm", dev, calls, copies);
  }
  // Paddle keeps the batch's mean and 1 / sqrt(variance + epsilon) for the grad: a first call
  // with momentum 0 gives the batch statistics as its running ones; the second normalizes and
  // moves the running statistics by `momentum` (into scratch: mean_out may be mean itself).
  Operand batch_mean, batch_var = scratch.take(channels, m.dtype), inv_std;
  if (!output(c, saved_mean, &batch_mean) || !output(c, saved_variance, &inv_std)) return false;
  bn(0.0, 1).out(scratch.take(x.shape, x.dtype)).out(batch_mean).out(batch_var);
  Operand running_mean = scratch.take(channels, m.dtype), running_var = scratch.take(channels, v.dtype);
  bn(momentum, 1).out(out).out(running_mean).out(running_var);
  inv_std_calls(batch_var, epsilon, inv_std, scratch, calls);
  return run_with_copies("batch_norm", dev, calls, {{m_out, running_mean}, {v_out, running_var}});
}

bool batch_norm_grad_direct(const Context& c, const DenseTensor& x_, const paddle::optional<DenseTensor>& scale,
                            const paddle::optional<DenseTensor>&, const paddle::optional<DenseTensor>&,
                            const paddle::optional<DenseTensor>&, const DenseTensor& saved_mean,
                            const DenseTensor& saved_variance, const paddle::optional<DenseTensor>&,
                            const DenseTensor& y_grad, float, float, const std::string& data_layout, bool is_test,
                            bool use_global_stats, bool, DenseTensor* x_grad, DenseTensor* scale_grad,
                            DenseTensor* bias_grad) {
  int32_t dev = direct_device();
  Operand x, dy, mean, inv_std;
  if (dev < 0 || is_test || use_global_stats || x_.dtype() != saved_mean.dtype() || !channels_first(data_layout) ||
      x_.dims().size() < 2 || !input(x_, &x) || !input(y_grad, &dy) || !input(saved_mean, &mean) || !input(saved_variance, &inv_std))
    return false;
  Shape channels{x.shape[1]};
  Scratch scratch(dev);
  Operand gamma, dx, dscale, dbias;
  if (!param_or(scale, channels, 1.0f, x.dtype, scratch, &gamma)) return false;
  auto grad = [&](DenseTensor* t, const Operand& like, Operand* o) {
    if (t != nullptr) return output(c, t, o);
    *o = scratch.take(like.shape, like.dtype);
    return true;
  };
  if (!grad(x_grad, x, &dx) || !grad(scale_grad, gamma, &dscale) || !grad(bias_grad, gamma, &dbias)) return false;
  Calls calls;
  calls.emplace_back("BatchNormalizationGrad", x.dtype);
  calls.back().in(dy).in(x).in(gamma).in(mean).in(inv_std).out(dx).out(dscale).out(dbias);
  return run_with_copies("batch_norm_grad", dev, calls, {});
}

// LayerNorm's normalized dims (from begin_norm_axis on: the scale's shape) and its statistics'
// shape (the leading dims, then 1s); false for an axis outside x.
bool norm_shapes(const Shape& dims, int begin_norm_axis, Shape* normalized, Shape* stats) {
  if (begin_norm_axis < 0 || static_cast<size_t>(begin_norm_axis) >= dims.size()) return false;
  normalized->assign(dims.begin() + begin_norm_axis, dims.end());
  stats->assign(dims.begin(), dims.begin() + begin_norm_axis);
  stats->resize(dims.size(), 1);
  return true;
}

bool layer_norm_direct(const Context& c, const DenseTensor& x_, const paddle::optional<DenseTensor>& scale,
                       const paddle::optional<DenseTensor>& bias, float epsilon, int begin_norm_axis,
                       DenseTensor* out, DenseTensor* mean_out, DenseTensor* variance_out) {
  int32_t dev = direct_device();
  Shape normalized, stats;
  if (dev < 0 || !norm_shapes(x_.dims(), begin_norm_axis, &normalized, &stats)) return false;
  Scratch scratch(dev);
  Operand x, gamma, beta, y, mean;
  if (!input(x_, &x) || !param_or(scale, normalized, 1.0f, x.dtype, scratch, &gamma) || !output(c, out, &y) ||
      !output(c, mean_out, &mean, stats))
    return false;
  Calls calls;
  Operand inv_std = scratch.take(stats, mean.dtype);  // Paddle's statistics' dtype (float32 for 16-bit x)
  calls.emplace_back("LayerNormalization", x.dtype);
  Call& ln = calls.back().in(x).in(gamma);
  if (bias) {
    if (!input(*bias, &beta, normalized)) return false;
    ln.in(beta);
  }
  ln.out(y).out(mean).out(inv_std).attr("axis", int64_t{begin_norm_axis}).attr("epsilon", static_cast<double>(epsilon))
      .attr("stash_type", int64_t{1});
  if (variance_out != nullptr) {  // Paddle keeps the variance: 1 / inv_std^2 - epsilon
    Operand variance, squared = scratch.take(stats, mean.dtype), reciprocal = scratch.take(stats, mean.dtype);
    if (!output(c, variance_out, &variance, stats)) return false;
    calls.emplace_back("Mul", mean.dtype);
    calls.back().in(inv_std).in(inv_std).out(squared);
    calls.emplace_back("Reciprocal", mean.dtype);
    calls.back().in(squared).out(reciprocal);
    calls.emplace_back("Sub", mean.dtype);
    calls.back().in(reciprocal).in(scratch.scalar(epsilon, inv_std.dtype)).out(variance);
  }
  return run_with_copies("layer_norm", dev, calls, {});
}

bool layer_norm_grad_direct(const Context& c, const DenseTensor& x_, const paddle::optional<DenseTensor>& scale,
                            const paddle::optional<DenseTensor>&, const DenseTensor& mean_,
                            const DenseTensor& variance_, const DenseTensor& out_grad, float epsilon,
                            int begin_norm_axis, DenseTensor* x_grad, DenseTensor* scale_grad,
                            DenseTensor* bias_grad) {
  int32_t dev = direct_device();
  Shape normalized, stats;
  if (dev < 0 || !norm_shapes(x_.dims(), begin_norm_axis, &normalized, &stats)) return false;
  Scratch scratch(dev);
  Operand x, gamma, mean, variance, dy, dx, dscale, dbias;
  if (!input(x_, &x) || !param_or(scale, normalized, 1.0f, x.dtype, scratch, &gamma) || !input(mean_, &mean, stats) ||
      !input(variance_, &variance, stats) || !input(out_grad, &dy))
    return false;
  auto grad = [&](DenseTensor* t, const Operand& like, Operand* o) {
    if (t != nullptr) return output(c, t, o, like.shape);
    *o = scratch.take(like.shape, like.dtype);
    return true;
  };
  if (!grad(x_grad, x, &dx) || !grad(scale_grad, gamma, &dscale) || !grad(bias_grad, gamma, &dbias)) return false;
  Calls calls;
  Operand inv_std = scratch.take(stats, variance.dtype);
  inv_std_calls(variance, epsilon, inv_std, scratch, calls);
  calls.emplace_back("LayerNormalizationGrad", x.dtype);
  calls.back().in(dy).in(x).in(gamma).in(mean).in(inv_std).out(dx).out(dscale).out(dbias)
      .attr("axis", int64_t{begin_norm_axis});
  return run_with_copies("layer_norm_grad", dev, calls, {});
}

// matmul as a Gemm of 2-D operands: x's leading dims merged where y is 2-D and x not transposed.
struct Matrices {
  Operand x, y;
  bool parse(const DenseTensor& x_, const DenseTensor& y_, bool tx) {
    size_t xd = x_.dims().size(), yd = y_.dims().size();
    if (yd != 2 || xd < 2 || (xd > 2 && tx)) return false;
    return input(x_, &x, xd > 2 ? merged_to_2d(x_.dims()) : Shape{}) && input(y_, &y);
  }
  static Shape merged_to_2d(const Shape& d) {
    int64_t rows = 1;
    for (size_t k = 0; k + 1 < d.size(); ++k) rows *= d[k];
    return {rows, d.back()};
  }
};

Call& gemm(Calls& calls, const Operand& a, const Operand& b, bool ta, bool tb, const Operand& out) {
  calls.emplace_back("Gemm", a.dtype);
  return calls.back().in(a).in(b).out(out).attr("transA", int64_t{ta}).attr("transB", int64_t{tb})
      .attr("alpha", 1.0).attr("beta", 1.0);
}

// The operand with its last two dims exchanged: a strided view (compact again after two swaps).
Operand swapped(Operand o) {
  size_t n = o.shape.size();
  Shape compact(n);
  for (int64_t k = static_cast<int64_t>(n) - 1, step = 1; k >= 0; step *= o.shape[k], --k) compact[k] = step;
  if (o.strides.empty()) o.strides = compact;
  std::swap(o.shape[n - 2], o.shape[n - 1]);
  std::swap(o.strides[n - 2], o.strides[n - 1]);
  for (int64_t k = static_cast<int64_t>(n) - 1, step = 1; k >= 0; step *= o.shape[k], --k) compact[k] = step;
  if (o.strides == compact) o.strides.clear();
  return o;
}

// Batched operands (2-D or more each) for MatMul, transposes as views; their batch dims
// broadcast in the forward op.
bool batched(const DenseTensor& x_, const DenseTensor& y_, bool tx, bool ty, Operand* a, Operand* b) {
  if (x_.dims().size() < 2 || y_.dims().size() < 2 || !input(x_, a) || !input(y_, b)) return false;
  if (tx) *a = swapped(*a);
  if (ty) *b = swapped(*b);
  return true;
}

bool matmul_direct(const Context& c, const DenseTensor& x_, const DenseTensor& y_, bool tx, bool ty,
                   DenseTensor* out) {
  int32_t dev = direct_device();
  Matrices m;
  Operand o;
  Calls calls;
  if (dev < 0) return false;
  if (m.parse(x_, y_, tx)) {
    int64_t rows = m.x.shape[tx ? 1 : 0], cols = m.y.shape[ty ? 0 : 1];
    if (!output(c, out, &o, {rows, cols})) return false;
    gemm(calls, m.x, m.y, tx, ty, o);
  } else {
    Operand a, b;
    if (!batched(x_, y_, tx, ty, &a, &b) || !output(c, out, &o)) return false;
    calls.emplace_back("MatMul", a.dtype);
    calls.back().in(a).in(b).out(o);
  }
  return run_with_copies("matmul", dev, calls, {});
}

// matmul_grad of batched operands with the same batch dims (no broadcast to sum back).
bool batched_matmul_grad(const Context& c, const DenseTensor& x_, const DenseTensor& y_, const DenseTensor& dout_,
                         bool tx, bool ty, DenseTensor* dx_, DenseTensor* dy_, Calls& calls) {
  Shape xd = x_.dims(), yd = y_.dims();
  Operand a, b, g, dx, dy;
  if (xd.size() < 3 || xd.size() != yd.size() || !std::equal(xd.begin(), xd.end() - 2, yd.begin()) ||
      !batched(x_, y_, tx, ty, &a, &b) || !input(dout_, &g))
    return false;
  // out = A B with A = op(x), B = op(y): dA = dout B^T, dB = A^T dout; a transposed operand's
  // grad is the transpose: dx = B dout^T, dy = dout^T A.
  if (dx_ != nullptr) {
    if (!output(c, dx_, &dx)) return false;
    calls.emplace_back("MatMul", g.dtype);
    if (!tx) calls.back().in(g).in(swapped(b)).out(dx);
    else calls.back().in(b).in(swapped(g)).out(dx);
  }
  if (dy_ != nullptr) {
    if (!output(c, dy_, &dy)) return false;
    calls.emplace_back("MatMul", g.dtype);
    if (!ty) calls.back().in(swapped(a)).in(g).out(dy);
    else calls.back().in(swapped(g)).in(a).out(dy);
  }
  return true;
}

bool matmul_grad_direct(const Context& c, const DenseTensor& x_, const DenseTensor& y_, const DenseTensor& dout_,
                        bool tx, bool ty, DenseTensor* dx_, DenseTensor* dy_) {
  int32_t dev = direct_device();
  Matrices m;
  Operand g, dx, dy;
  Calls calls;
  if (dev < 0) return false;
  if (!m.parse(x_, y_, tx)) {
    return batched_matmul_grad(c, x_, y_, dout_, tx, ty, dx_, dy_, calls) &&
           run_with_copies("matmul_grad", dev, calls, {});
  }
  int64_t rows = m.x.shape[tx ? 1 : 0], cols = m.y.shape[ty ? 0 : 1];
  if (!input(dout_, &g, {rows, cols})) return false;
  // out = op(x) op(y): d op(x) = dout op(y)^T, d op(y) = op(x)^T dout, each transposed back where op is.
  if (dx_ != nullptr) {
    if (!output(c, dx_, &dx, m.x.shape)) return false;
    if (!tx) gemm(calls, g, m.y, false, !ty, dx);
    else gemm(calls, m.y, g, ty, true, dx);
  }
  if (dy_ != nullptr) {
    if (!output(c, dy_, &dy, m.y.shape)) return false;
    if (!ty) gemm(calls, m.x, g, !tx, false, dy);
    else gemm(calls, g, m.x, true, tx, dy);
  }
  return run_with_copies("matmul_grad", dev, calls, {});
}

bool softmax_direct(const Context& c, const DenseTensor& x, int axis, DenseTensor* out) {
  return run_direct("softmax", "Softmax", c, {&x}, out, [&](Call& k) { k.attr("axis", int64_t{axis}); });
}

bool softmax_grad_direct(const Context& c, const DenseTensor& out, const DenseTensor& dout, int axis,
                         DenseTensor* dx) {
  return run_direct("softmax_grad", "SoftmaxGrad", c, {&dout, &out}, dx,
                    [&](Call& k) { k.attr("axis", int64_t{axis}); });
}

// Hard labels over the last axis of 2-D logits: the direct path's case.
bool hard_labels(const Shape& logits, bool soft_label, bool use_softmax, int axis) {
  return !soft_label && use_softmax && logits.size() == 2 && (axis == -1 || axis == 1);
}

bool cross_entropy_with_softmax_direct(const Context& c, const DenseTensor& logits_, const DenseTensor& label_,
                                       bool soft_label, bool use_softmax, bool, int ignore_index, int axis,
                                       DenseTensor* softmax_, DenseTensor* loss_) {
  int32_t dev = direct_device();
  Operand logits, labels, probabilities, loss;
  // 16-bit logits go through Python, which computes in float32 as Paddle's GPU kernel does (and
  // devkit's SoftmaxCrossEntropyLoss gives a bfloat16 input a float32 loss, not Paddle's dtype).
  if (dev < 0 || logits_.dtype() != PD_DataType::FLOAT32 ||
      !hard_labels(logits_.dims(), soft_label, use_softmax, axis) || !input(logits_, &logits) ||
      !input(label_, &labels, {label_.numel()}) || !output(c, softmax_, &probabilities) ||
      !output(c, loss_, &loss, {label_.numel()}))
    return false;
  Scratch scratch(dev);
  Calls calls;
  calls.emplace_back("Softmax", logits.dtype);
  calls.back().in(logits).out(probabilities).attr("axis", int64_t{-1});
  calls.emplace_back("SoftmaxCrossEntropyLoss", logits.dtype);
  calls.back().in(logits).in(labels).out(loss).out(scratch.take(logits.shape, logits.dtype))
      .attr("reduction", "none").attr("ignore_index", int64_t{ignore_index});
  return run_with_copies("cross_entropy_with_softmax", dev, calls, {});
}

bool cross_entropy_with_softmax_grad_direct(const Context& c, const DenseTensor& label_,
                                            const DenseTensor& softmax_, const DenseTensor& loss_grad,
                                            bool soft_label, bool use_softmax, bool, int ignore_index, int axis,
                                            DenseTensor* logits_grad) {
  int32_t dev = direct_device();
  Operand labels, probabilities, dloss, dlogits;
  if (dev < 0 || softmax_.dtype() != PD_DataType::FLOAT32 || !hard_labels(softmax_.dims(), soft_label, use_softmax, axis) ||
      !input(label_, &labels, {label_.numel()}) || !input(softmax_, &probabilities) ||
      !input(loss_grad, &dloss, {label_.numel()}) || !output(c, logits_grad, &dlogits))
    return false;
  Scratch scratch(dev);
  Operand log_prob = scratch.take(probabilities.shape, probabilities.dtype);
  Calls calls;
  calls.emplace_back("Log", probabilities.dtype);
  calls.back().in(probabilities).out(log_prob);
  calls.emplace_back("SoftmaxCrossEntropyLossGrad", probabilities.dtype);
  calls.back().in(dloss).in(log_prob).in(labels).out(dlogits).attr("reduction", "none")
      .attr("ignore_index", int64_t{ignore_index});
  return run_with_copies("cross_entropy_with_softmax_grad", dev, calls, {});
}

Shape all_axes(size_t ndim) {
  Shape axes(ndim);
  for (size_t k = 0; k < ndim; ++k) axes[k] = static_cast<int64_t>(k);
  return axes;
}

// Paddle's reduce dims (empty: every axis) as devkit axes.
Shape reduce_axes(const std::vector<int64_t>& dims, size_t ndim, bool reduce_all) {
  if (reduce_all || dims.empty()) return all_axes(ndim);
  Shape axes;
  for (int64_t d : dims) axes.push_back(((d % static_cast<int64_t>(ndim)) + ndim) % ndim);
  return axes;
}

bool reduce_direct(const char* phi_op, const char* op, const Context& c, const DenseTensor& x_, const Shape& axes,
                   DenseTensor* out_) {
  int32_t dev = direct_device();
  Operand x, out;
  if (dev < 0 || x_.dims().empty() || !input(x_, &x)) return false;
  Shape kept = x.shape;
  for (int64_t a : axes) kept[a] = 1;
  if (!output(c, out_, &out, kept)) return false;
  Calls calls;
  calls.emplace_back(op, x.dtype);
  calls.back().in(x).out(out).attr("axes", axes).attr("keepdims", int64_t{1}).attr("noop_with_empty_axes", int64_t{0});
  return run_with_copies(phi_op, dev, calls, {});
}

bool mean_all_direct(const Context& c, const DenseTensor& x, DenseTensor* out) {
  return reduce_direct("mean_all", "ReduceMean", c, x, all_axes(x.dims().size()), out);
}
bool mean_direct(const Context& c, const DenseTensor& x, const phi::IntArray& dims, bool, DenseTensor* out) {
  return reduce_direct("mean", "ReduceMean", c, x, reduce_axes(dims.GetData(), x.dims().size(), false), out);
}
bool sum_direct(const Context& c, const DenseTensor& x, const phi::IntArray& dims, PD_DataType out_dtype, bool,
                DenseTensor* out) {
  if (out_dtype != PD_DataType::UNDEFINED && out_dtype != x.dtype()) return false;
  return reduce_direct("sum", "ReduceSum", c, x, reduce_axes(dims.GetData(), x.dims().size(), false), out);
}

// dx = dout (with the reduced axes kept as 1s) times factor, expanded to x's shape.
bool reduce_grad_direct(const char* phi_op, const Context& c, const DenseTensor& x_, const DenseTensor& dout_,
                        const Shape& axes, bool mean, DenseTensor* dx_) {
  int32_t dev = direct_device();
  Shape shape = x_.dims();  // x may be shape only (NoNeedBuffer)
  Shape kept = shape;
  for (int64_t a : axes) kept[a] = 1;
  Operand g, dx;
  if (dev < 0 || shape.empty() || !input(dout_, &g, kept) || !output(c, dx_, &dx)) return false;
  Scratch scratch(dev);
  Calls calls;
  if (mean) {
    int64_t count = numel(shape) / std::max<int64_t>(numel(kept), 1);
    Operand scaled = scratch.take(kept, g.dtype);
    calls.emplace_back("Mul", g.dtype);
    calls.back().in(g).in(scratch.scalar(1.0f / static_cast<float>(std::max<int64_t>(count, 1)), g.dtype)).out(scaled);
    g = scaled;
  }
  calls.emplace_back("Expand", g.dtype);
  calls.back().in(g).out(dx).attr("shape", shape);
  return run_with_copies(phi_op, dev, calls, {});
}

bool mean_all_grad_direct(const Context& c, const DenseTensor& x, const DenseTensor& dout, DenseTensor* dx) {
  return reduce_grad_direct("mean_all_grad", c, x, dout, all_axes(x.dims().size()), true, dx);
}
bool mean_grad_direct(const Context& c, const DenseTensor& x, const DenseTensor& dout, const phi::IntArray& dims,
                      bool, bool reduce_all, DenseTensor* dx) {
  return reduce_grad_direct("mean_grad", c, x, dout, reduce_axes(dims.GetData(), x.dims().size(), reduce_all), true,
                            dx);
}
bool sum_grad_direct(const Context& c, const DenseTensor& x, const DenseTensor& dout, const phi::IntArray& dims,
                     bool, bool reduce_all, DenseTensor* dx) {
  return reduce_grad_direct("sum_grad", c, x, dout, reduce_axes(dims.GetData(), x.dims().size(), reduce_all), false,
                            dx);
}

// A one-element float32 tensor's value, read from the device.
bool read_scalar(const DenseTensor& t, float* value) {
  Operand o;
  int32_t dev = direct_device();
  if (t.dtype() != PD_DataType::FLOAT32 || t.numel() != 1 || !input(t, &o)) return false;
  Scratch::check(g_api->copy_d2h(dev, value, o.mem, o.offset, sizeof(float), nullptr), "copy_d2h");
  return true;
}

// Paddle's dense Adam as one devkit Adam call: with its bias corrections folded into the
// learning rate and epsilon (phi's AdamFunctor: lr' = lr sqrt(1 - beta2^t) / (1 - beta1^t),
// param -= lr' m1 / (sqrt(m2) + epsilon sqrt(1 - beta2^t))) and T = 0, devkit's update is
// Paddle's.
bool adam_direct(const Context& c, const DenseTensor& param, const DenseTensor& grad, const DenseTensor& lr,
                 const DenseTensor& moment1, const DenseTensor& moment2, const paddle::optional<DenseTensor>&,
                 const DenseTensor& beta1_pow, const DenseTensor& beta2_pow,
                 const paddle::optional<DenseTensor>&, const paddle::optional<DenseTensor>& skip_update,
                 const phi::Scalar& beta1_, const phi::Scalar& beta2_, const phi::Scalar& epsilon_, bool, int64_t,
                 bool multi_precision, bool use_global_beta_pow, bool amsgrad, DenseTensor* param_out,
                 DenseTensor* moment1_out, DenseTensor* moment2_out, DenseTensor*, DenseTensor* beta1_pow_out,
                 DenseTensor* beta2_pow_out, DenseTensor*) {
  int32_t dev = direct_device();
  Operand x, g, v, h, x_new, v_new, h_new;
  if (dev < 0 || multi_precision || amsgrad || skip_update || param.dtype() != PD_DataType::FLOAT32 ||
      !input(param, &x) || !input(grad, &g) || !input(moment1, &v) || !input(moment2, &h) ||
      !output(c, param_out, &x_new) || !output(c, moment1_out, &v_new) || !output(c, moment2_out, &h_new))
    return false;
  Call adam("Adam", x.dtype);
  float rate, pow1, pow2;
  if (!adam.available()) return false;
  if (!read_scalar(lr, &rate) || !read_scalar(beta1_pow, &pow1) || !read_scalar(beta2_pow, &pow2)) return false;
  float beta1 = beta1_.to<float>(), beta2 = beta2_.to<float>(), epsilon = epsilon_.to<float>();
  float corrected = rate * std::sqrt(1.0f - pow2) / (1.0f - pow1);
  adam.in(x).in(g).in(v).in(h).out(x_new).out(v_new).out(h_new).attr_float("R", corrected)
      .attr("T", Shape{0}).attr("alpha", static_cast<double>(beta1)).attr("beta", static_cast<double>(beta2))
      .attr("epsilon", static_cast<double>(epsilon * std::sqrt(1.0f - pow2))).attr("norm_coefficient", 0.0)
      .attr("norm_coefficient_post", 0.0)
      .run("adam", dev);
  count_direct("adam");
  if (!use_global_beta_pow) {
    for (auto [out, value] : {std::make_pair(beta1_pow_out, pow1 * beta1), std::make_pair(beta2_pow_out, pow2 * beta2)}) {
      Operand o;
      if (out == nullptr) continue;
      if (!output(c, out, &o)) PD_THROW("adam: a beta power output is not a float32 devkit tensor");
      Scratch::check(g_api->copy_h2d(dev, o.mem, o.offset, &value, sizeof value, nullptr), "copy_h2d");
    }
  }
  return true;
}

// A fill: one memset where the value's bytes are all alike (zeros), else a copy of a host pattern.
bool fill(const Context& c, const phi::Scalar& value, PD_DataType dtype, DenseTensor* out_, const char* phi_op) {
  int32_t dev = direct_device();
  Operand out;
  if (dev < 0 || out_ == nullptr || out_->numel() == 0 || !output(c, out_, &out, {}, dtype)) return false;
  size_t item = (out.dtype.bits + 7) / 8, n = static_cast<size_t>(out_->numel());
  unsigned char bytes[8];
  switch (out_->dtype()) {
    case PD_DataType::FLOAT32:
    case PD_DataType::FLOAT64:
    case PD_DataType::FLOAT16:
    case PD_DataType::BFLOAT16: encode_float(value.to<double>(), out.dtype, bytes); break;
    case PD_DataType::INT32: { int32_t v = value.to<int32_t>(); std::memcpy(bytes, &v, 4); break; }
    case PD_DataType::INT64: { int64_t v = value.to<int64_t>(); std::memcpy(bytes, &v, 8); break; }
    case PD_DataType::BOOL: bytes[0] = value.to<bool>() ? 1 : 0; break;
    default: return false;
  }
  if (std::all_of(bytes, bytes + item, [&](unsigned char b) { return b == bytes[0]; })) {
    Scratch::check(g_api->memset(dev, out.mem, out.offset, bytes[0], n * item, nullptr), "memset");
  } else {
    thread_local std::vector<unsigned char> pattern;
    pattern.resize(n * item);
    for (size_t k = 0; k < n; ++k) std::memcpy(pattern.data() + k * item, bytes, item);
    Scratch::check(g_api->copy_h2d(dev, out.mem, out.offset, pattern.data(), pattern.size(), nullptr), "copy_h2d");
  }
  count_direct(phi_op);
  return true;
}
bool full_direct(const Context& c, const phi::IntArray&, const phi::Scalar& value, PD_DataType dtype,
                 DenseTensor* out) {
  return fill(c, value, dtype, out, "full");
}
bool full_like_direct(const Context& c, const DenseTensor& x, const phi::Scalar& value, PD_DataType dtype,
                      DenseTensor* out) {
  return fill(c, value, dtype == PD_DataType::UNDEFINED ? x.dtype() : dtype, out, "full_like");
}

// pool2d's window as MaxPool's / AveragePool's attributes (NCHW; adaptive where the output
// divides the input); global: one window over each whole plane.
struct PoolWindow {
  bool global = false;
  Shape kernel, strides, pads;
  int64_t ceil = 0;
  bool parse(const Shape& x, const std::vector<int64_t>& kernel_size, const std::vector<int64_t>& s,
             const std::vector<int64_t>& p, bool ceil_mode, const std::string& format, bool global_pooling,
             bool adaptive, const std::string& algorithm) {
    if (x.size() != 4 || !channels_first(format) || kernel_size.size() != 2) return false;
    kernel = kernel_size;
    if (global_pooling || (adaptive && kernel == Shape{1, 1})) {
      global = true;
      return true;
    }
    if (adaptive) {  // kernel_size is the output's size
      if (kernel[0] <= 0 || kernel[1] <= 0 || x[2] % kernel[0] || x[3] % kernel[1]) return false;
      kernel = {x[2] / kernel[0], x[3] / kernel[1]};
      strides = kernel;
      pads = {0, 0, 0, 0};
      return true;
    }
    if (s.size() != 2 || !onnx_pads(p, algorithm, &pads)) return false;
    strides = s;
    ceil = ceil_mode;
    return true;
  }
  // The window for a grad: a global one spans the plane.
  void spell_out(const Shape& x) {
    if (!global) return;
    kernel = {x[2], x[3]};
    strides = {1, 1};
    pads = {0, 0, 0, 0};
  }
  Call& apply(Call& call) const {
    return call.attr("kernel_shape", kernel).attr("strides", strides).attr("pads", pads).attr("dilations", Shape{1, 1})
        .attr("ceil_mode", ceil).attr("auto_pad", "NOTSET");
  }
};

bool pool_type(const std::string& type, bool* max) {
  *max = type == "max";
  return type == "max" || type == "avg";
}

bool pool2d_direct(const Context& c, const DenseTensor& x_, const phi::IntArray& kernel_size,
                   const std::vector<int64_t>& strides, const std::vector<int64_t>& paddings, bool ceil_mode,
                   bool exclusive, const std::string& data_format, const std::string& pooling_type,
                   bool global_pooling, bool adaptive, const std::string& padding_algorithm, DenseTensor* out_) {
  int32_t dev = direct_device();
  PoolWindow window;
  bool max;
  Operand x, out;
  if (dev < 0 || !pool_type(pooling_type, &max) ||
      !window.parse(x_.dims(), kernel_size.GetData(), strides, paddings, ceil_mode, data_format, global_pooling,
                    adaptive, padding_algorithm) ||
      !input(x_, &x) || !output(c, out_, &out))
    return false;
  Scratch scratch(dev);
  Calls calls;
  if (window.global) {
    calls.emplace_back(max ? "GlobalMaxPool" : "GlobalAveragePool", x.dtype);
    calls.back().in(x).out(out);
  } else if (max) {
    calls.emplace_back("MaxPool", x.dtype);
    window.apply(calls.back().in(x).out(out).out(scratch.take(out.shape, DK_DataType{DK_DTYPE_CODE_INT, 64, 1})))
        .attr("storage_order", int64_t{0});
  } else {
    calls.emplace_back("AveragePool", x.dtype);
    window.apply(calls.back().in(x).out(out)).attr("count_include_pad", int64_t{!exclusive});
  }
  return run_with_copies("pool2d", dev, calls, {});
}

bool pool2d_grad_direct(const Context& c, const DenseTensor& x_, const DenseTensor&, const DenseTensor& dout_,
                        const phi::IntArray& kernel_size, const std::vector<int64_t>& strides,
                        const std::vector<int64_t>& paddings, bool ceil_mode, bool exclusive,
                        const std::string& data_format, const std::string& pooling_type, bool global_pooling,
                        bool adaptive, const std::string& padding_algorithm, DenseTensor* dx_) {
  int32_t dev = direct_device();
  PoolWindow window;
  bool max;
  Operand x, dout, dx;
  if (dev < 0 || !pool_type(pooling_type, &max) ||
      !window.parse(x_.dims(), kernel_size.GetData(), strides, paddings, ceil_mode, data_format, global_pooling,
                    adaptive, padding_algorithm) ||
      !input(x_, &x) || !input(dout_, &dout) || !output(c, dx_, &dx))
    return false;
  window.spell_out(x.shape);
  Scratch scratch(dev);
  Calls calls;
  if (max) {  // the maxima's places, found again
    Operand indices = scratch.take(dout.shape, DK_DataType{DK_DTYPE_CODE_INT, 64, 1});
    calls.emplace_back("MaxPool", x.dtype);
    window.apply(calls.back().in(x).out(scratch.take(dout.shape, x.dtype)).out(indices))
        .attr("storage_order", int64_t{0});
    calls.emplace_back("MaxPoolGrad", x.dtype);
    calls.back().in(dout).in(indices).out(dx).attr("X_shape", x.shape).attr("storage_order", int64_t{0});
  } else {
    calls.emplace_back("AveragePoolGrad", x.dtype);
    window.apply(calls.back().in(dout).out(dx)).attr("count_include_pad", int64_t{!exclusive})
        .attr("X_shape", x.shape);
  }
  return run_with_copies("pool2d_grad", dev, calls, {});
}

// embedding without padding_idx: Gather of weight's rows (with it, run_op zeroes those rows).
bool embedding_direct(const Context& c, const DenseTensor& ids_, const DenseTensor& weight_, int64_t padding_idx,
                      DenseTensor* out_) {
  int32_t dev = direct_device();
  Operand ids, weight, out;
  if (dev < 0 || padding_idx >= 0 || !input(ids_, &ids) || !input(weight_, &weight) || !output(c, out_, &out))
    return false;
  Calls calls;
  calls.emplace_back("Gather", weight.dtype);
  calls.back().in(weight).in(ids).out(out).attr("axis", int64_t{0});
  return run_with_copies("embedding", dev, calls, {});
}

// embedding_grad without padding_idx: out_grad's rows added into zeros at ids (ScatterND add).
bool embedding_grad_direct(const Context& c, const DenseTensor& ids_, const DenseTensor& weight_,
                           const DenseTensor& out_grad, int64_t padding_idx, DenseTensor* weight_grad) {
  int32_t dev = direct_device();
  Shape index_shape = ids_.dims(), weight_shape = weight_.dims();
  if (dev < 0 || padding_idx >= 0 || weight_shape.size() != 2) return false;
  Shape update_shape = index_shape;
  update_shape.push_back(weight_shape[1]);
  index_shape.push_back(1);
  Operand ids, updates, grad;
  if (!input(ids_, &ids, index_shape) || !input(out_grad, &updates, update_shape) || !output(c, weight_grad, &grad))
    return false;
  Scratch scratch(dev);
  Operand zeros = scratch.take(grad.shape, grad.dtype);
  Calls calls;
  calls.emplace_back("ScatterND", grad.dtype);
  calls.back().in(zeros).in(ids).in(updates).out(grad).attr("reduction", "add");
  if (!all_available(calls)) return false;
  size_t bytes = static_cast<size_t>(numel(grad.shape)) * ((grad.dtype.bits + 7) / 8);
  Scratch::check(g_api->memset(dev, zeros.mem, zeros.offset, 0, bytes, nullptr), "memset");
  return run_with_copies("embedding_grad", dev, calls, {});
}

// scale: x * scale + bias (or (x + bias) * scale), Mul and Add with scalars of x's dtype.
bool scale_direct(const Context& c, const DenseTensor& x_, const phi::Scalar& factor, const phi::Scalar& bias,
                  bool bias_after_scale, DenseTensor* out_) {
  int32_t dev = direct_device();
  Operand x, out;
  unsigned char probe[8];
  if (dev < 0 || !input(x_, &x) || !encode_float(0.0, x.dtype, probe) || !output(c, out_, &out)) return false;
  Scratch scratch(dev);
  Calls calls;
  float s = factor.to<float>(), b = bias.to<float>();
  auto step = [&](const char* op, const Operand& in, float value, const Operand& result) {
    calls.emplace_back(op, x.dtype);
    calls.back().in(in).in(scratch.scalar(value, x.dtype)).out(result);
  };
  if (b == 0.0f) {
    step("Mul", x, s, out);
  } else {
    Operand partial = scratch.take(x.shape, x.dtype);
    if (bias_after_scale) {
      step("Mul", x, s, partial);
      step("Add", partial, b, out);
    } else {
      step("Add", x, b, partial);
      step("Mul", partial, s, out);
    }
  }
  return run_with_copies("scale", dev, calls, {});
}

bool gelu_direct(const Context& c, const DenseTensor& x, bool approximate, DenseTensor* out) {
  return run_direct("gelu", "Gelu", c, {&x}, out,
                    [&](Call& k) { k.attr("approximate", approximate ? "tanh" : "none"); });
}

bool gelu_grad_direct(const Context& c, const DenseTensor& x, const DenseTensor& dout, bool approximate,
                      DenseTensor* dx) {
  return run_direct("gelu_grad", "GeluGrad", c, {&dout, &x}, dx,
                    [&](Call& k) { k.attr("approximate", approximate ? "tanh" : "none"); });
}

// A view made compact: Identity of the strided input (kernels that take strided inputs).
bool contiguous_direct(const Context& c, const DenseTensor& x_, DenseTensor* out_) {
  int32_t dev = direct_device();
  Operand x, out;
  // Paddle may hand the output the input's strides: it is written compact all the same (run_op's
  // path writes it so too; Paddle's own contiguous kernels make its meta compact).
  if (dev < 0 || !view_input(x_, &x) || out_ == nullptr || !out_->valid() ||
      !operand(*out_, c.Alloc(out_, x_.dtype()), {}, &out, true))
    return false;
  out.strides.clear();
  Calls calls;
  calls.emplace_back("Identity", x.dtype);
  calls.back().in(x).out(out);
  return run_with_copies("contiguous", dev, calls, {});
}

int64_t axis_of(const phi::Scalar& axis, size_t ndim) {
  int64_t a = axis.to<int64_t>(), n = static_cast<int64_t>(ndim);
  return ((a % n) + n) % n;
}

bool split_with_num_direct(const Context& c, const DenseTensor& x_, int num, const phi::Scalar& axis_,
                           std::vector<DenseTensor*> outs) {
  int32_t dev = direct_device();
  Operand x;
  if (dev < 0 || x_.dims().empty() || num < 1 || outs.size() != static_cast<size_t>(num) ||
      outs.size() > Call::kMaxOperands || !input(x_, &x))
    return false;
  int64_t axis = axis_of(axis_, x.shape.size());
  if (x.shape[axis] % num) return false;  // run_op says why
  Calls calls;
  calls.emplace_back("Split", x.dtype);
  calls.back().in(x).attr("axis", axis).attr("num_outputs", int64_t{num});
  for (DenseTensor* t : outs) {
    Operand o;
    if (!output(c, t, &o, {}, x_.dtype())) return false;
    calls.back().out(o);
  }
  return run_with_copies("split_with_num", dev, calls, {});
}

bool concat_direct(const Context& c, const std::vector<const DenseTensor*>& xs, const phi::Scalar& axis_,
                   DenseTensor* out_) {
  int32_t dev = direct_device();
  Operand out;
  if (dev < 0 || xs.empty() || xs.size() > Call::kMaxOperands || xs[0]->dims().empty()) return false;
  Operand first;
  if (!input(*xs[0], &first)) return false;
  Calls calls;
  calls.emplace_back("Concat", first.dtype);
  for (const DenseTensor* t : xs) {
    Operand o;
    if (!input(*t, &o)) return false;
    calls.back().in(o);
  }
  if (!output(c, out_, &out, {}, xs[0]->dtype())) return false;
  calls.back().out(out).attr("axis", axis_of(axis_, first.shape.size()));
  return run_with_copies("concat", dev, calls, {});
}

// A comparison into Paddle's bool output; not_equal is Not of Equal.
bool compare_direct(const char* phi_op, const char* op, bool negate, const Context& c, const DenseTensor& x_,
                    const DenseTensor& y_, DenseTensor* out_) {
  int32_t dev = direct_device();
  Operand x, y, out;
  if (dev < 0 || !input(x_, &x) || !input(y_, &y) || !output(c, out_, &out, {}, PD_DataType::BOOL) ||
      out.dtype.code != DK_DTYPE_CODE_BOOL)
    return false;
  Scratch scratch(dev);
  Calls calls;
  calls.emplace_back(op, x.dtype);
  calls.back().in(x).in(y);
  if (!negate) {
    calls.back().out(out);
  } else {
    Operand equal = scratch.take(out.shape, out.dtype);
    calls.back().out(equal);
    calls.emplace_back("Not", out.dtype);
    calls.back().in(equal).out(out);
  }
  return run_with_copies(phi_op, dev, calls, {});
}

bool cast_direct(const Context& c, const DenseTensor& x_, PD_DataType out_dtype, DenseTensor* out_) {
  int32_t dev = direct_device();
  Operand x, out;
  if (dev < 0 || !input(x_, &x) || !output(c, out_, &out, {}, out_dtype)) return false;
  Calls calls;
  calls.emplace_back("Cast", x.dtype);
  calls.back().in(x).out(out).attr("to", out.dtype).attr("saturate", int64_t{1});
  return run_with_copies("cast", dev, calls, {});
}

}  // namespace

// A kernel registered for the dtypes `types` (a macro naming the list) that
// run_op runs; with _DIRECT, name##_direct first runs it on the plugin's
// kernel table, or declines (false) and run_op runs it.
#define DEVKIT_KERNEL_OF(types, name, params, ...)                    \
  template <typename T>                                               \
  void name##_kernel params { run<T>(#name, __VA_ARGS__); }           \
  PD_BUILD_PHI_KERNEL(name, devkit, ALL_LAYOUT, name##_kernel, types) {}
#define DEVKIT_DIRECT_KERNEL_OF(types, name, params, ...)             \
  template <typename T>                                               \
  void name##_kernel params {                                         \
    if (!name##_direct(__VA_ARGS__)) run<T>(#name, __VA_ARGS__);      \
  }                                                                   \
  PD_BUILD_PHI_KERNEL(name, devkit, ALL_LAYOUT, name##_kernel, types) {}

#define DEVKIT_FLOAT32 float
// The float dtypes of the kernels that Linear, Conv2D, BatchNorm, LayerNorm, Softmax, ReLU,
// CrossEntropyLoss, SGD and Adam need: float16 and bfloat16 run where the plugin has the devkit
// op for them (else the kernel's error names the op the plugin lacks).
#define DEVKIT_FLOATS float, phi::dtype::float16, phi::dtype::bfloat16
// Every dtype: fills, because Paddle's CPU fallback for them writes the output's memory from
// the host (set_constant_with_place), which only a device with host-pointer handles survives;
// cast; contiguous, because Paddle has no fallback for it.
#define DEVKIT_ALL_DTYPES DEVKIT_FLOATS, double, int32_t, int64_t, bool

#define DEVKIT_KERNEL(name, params, ...) DEVKIT_KERNEL_OF(DEVKIT_FLOAT32, name, params, __VA_ARGS__)
#define DEVKIT_DIRECT_KERNEL(name, params, ...) DEVKIT_DIRECT_KERNEL_OF(DEVKIT_FLOAT32, name, params, __VA_ARGS__)
#define DEVKIT_FLOATS_KERNEL(name, params, ...) DEVKIT_KERNEL_OF(DEVKIT_FLOATS, name, params, __VA_ARGS__)
#define DEVKIT_DIRECT_FLOATS_KERNEL(name, params, ...) DEVKIT_DIRECT_KERNEL_OF(DEVKIT_FLOATS, name, params, __VA_ARGS__)
#define DEVKIT_ALL_DTYPES_KERNEL(name, params, ...) DEVKIT_KERNEL_OF(DEVKIT_ALL_DTYPES, name, params, __VA_ARGS__)
#define DEVKIT_ALL_DTYPES_DIRECT_KERNEL(name, params, ...) \
  DEVKIT_DIRECT_KERNEL_OF(DEVKIT_ALL_DTYPES, name, params, __VA_ARGS__)

using phi::Context;

// A comparison (bool out) for float and the dtypes listed; not_equal negates Equal.
#define DEVKIT_COMPARE_KERNEL(name, op, negate, ...)                                             \
  template <typename T>                                                                         \
  void name##_kernel(const Context& c, const DenseTensor& x, const DenseTensor& y, DenseTensor* out) { \
    if (!compare_direct(#name, op, negate, c, x, y, out)) run<T>(#name, c, x, y, out);          \
  }                                                                                             \
  PD_BUILD_PHI_KERNEL(name, devkit, ALL_LAYOUT, name##_kernel, float, __VA_ARGS__) {}

// y = f(x), and grads taking (x or out, dout): the Python side knows which.
#define DEVKIT_UNARY_KERNEL(name, op, ...)                                                   \
  template <typename T>                                                                     \
  void name##_kernel(const Context& c, const DenseTensor& x, DenseTensor* out) {            \
    if (!run_direct(#name, op, c, {&x}, out)) run<T>(#name, c, x, out);                     \
  }                                                                                         \
  PD_BUILD_PHI_KERNEL(name, devkit, ALL_LAYOUT, name##_kernel, __VA_ARGS__) {}
#define DEVKIT_UNARY_GRAD_KERNEL(name)                                                              \
  DEVKIT_KERNEL(name##_grad, (const Context& c, const DenseTensor& x_or_out, const DenseTensor& dout, \
                              DenseTensor* dx), c, x_or_out, dout, dx)
// A grad that is one devkit op of (dout, x or out).
#define DEVKIT_UNARY_DIRECT_GRAD_KERNEL(name, op, ...)                                              \
  template <typename T>                                                                             \
  void name##_grad_kernel(const Context& c, const DenseTensor& x_or_out, const DenseTensor& dout,   \
                          DenseTensor* dx) {                                                        \
    if (!run_direct(#name "_grad", op, c, {&dout, &x_or_out}, dx)) run<T>(#name "_grad", c, x_or_out, dout, dx); \
  }                                                                                                 \
  PD_BUILD_PHI_KERNEL(name##_grad, devkit, ALL_LAYOUT, name##_grad_kernel, __VA_ARGS__) {}
// Elementwise binary ops with numpy broadcasting, for the float dtypes listed and the other
// numeric ones (integer arithmetic runs on the device too: labels, masks).
#define DEVKIT_BINARY_KERNEL(name, op, ...)                                                                  \
  template <typename T>                                                                                       \
  void name##_kernel(const Context& c, const DenseTensor& x, const DenseTensor& y, DenseTensor* out) {        \
    if (!run_direct(#name, op, c, {&x, &y}, out)) run<T>(#name, c, x, y, out);                                \
  }                                                                                                           \
  PD_BUILD_PHI_KERNEL(name, devkit, ALL_LAYOUT, name##_kernel, __VA_ARGS__, double, int32_t, int64_t) {}
DEVKIT_UNARY_KERNEL(exp, "Exp", float)
DEVKIT_UNARY_GRAD_KERNEL(exp)
DEVKIT_UNARY_KERNEL(tanh, "Tanh", float)
DEVKIT_UNARY_DIRECT_GRAD_KERNEL(tanh, "TanhGrad", float)
DEVKIT_UNARY_KERNEL(sigmoid, "Sigmoid", float)
DEVKIT_UNARY_DIRECT_GRAD_KERNEL(sigmoid, "SigmoidGrad", float)
DEVKIT_UNARY_KERNEL(sqrt, "Sqrt", float)
DEVKIT_UNARY_GRAD_KERNEL(sqrt)
DEVKIT_UNARY_KERNEL(log, "Log", float)
DEVKIT_UNARY_GRAD_KERNEL(log)
DEVKIT_UNARY_KERNEL(sin, "Sin", float)
DEVKIT_UNARY_GRAD_KERNEL(sin)
DEVKIT_UNARY_KERNEL(cos, "Cos", float)
DEVKIT_UNARY_GRAD_KERNEL(cos)
DEVKIT_UNARY_KERNEL(abs, "Abs", float)
DEVKIT_UNARY_GRAD_KERNEL(abs)
DEVKIT_KERNEL(square, (const Context& c, const DenseTensor& x, DenseTensor* out), c, x, out)
DEVKIT_UNARY_GRAD_KERNEL(square)
DEVKIT_BINARY_KERNEL(divide, "Div", float)
DEVKIT_KERNEL(divide_grad, (const Context& c, const DenseTensor& x, const DenseTensor& y, const DenseTensor& out,
                            const DenseTensor& dout, int axis, DenseTensor* dx, DenseTensor* dy),
              c, x, y, out, dout, axis, dx, dy)
DEVKIT_DIRECT_FLOATS_KERNEL(subtract_grad, (const Context& c, const DenseTensor& x, const DenseTensor& y,
                                            const DenseTensor& dout, int axis, DenseTensor* dx, DenseTensor* dy),
                            c, x, y, dout, axis, dx, dy)
DEVKIT_DIRECT_FLOATS_KERNEL(multiply_grad, (const Context& c, const DenseTensor& x, const DenseTensor& y,
                                            const DenseTensor& dout, int axis, DenseTensor* dx, DenseTensor* dy),
                            c, x, y, dout, axis, dx, dy)
DEVKIT_DIRECT_KERNEL(gelu, (const Context& c, const DenseTensor& x, bool approximate, DenseTensor* out), c, x, approximate,
              out)
DEVKIT_DIRECT_KERNEL(gelu_grad, (const Context& c, const DenseTensor& x, const DenseTensor& dout, bool approximate,
                          DenseTensor* dx), c, x, dout, approximate, dx)
DEVKIT_DIRECT_KERNEL(scale, (const Context& c, const DenseTensor& x, const phi::Scalar& scale, const phi::Scalar& bias,
                      bool bias_after_scale, DenseTensor* out), c, x, scale, bias, bias_after_scale, out)
DEVKIT_DIRECT_FLOATS_KERNEL(sum, (const Context& c, const DenseTensor& x, const phi::IntArray& dims, PD_DataType out_dtype,
                    bool keep_dim, DenseTensor* out), c, x, dims, out_dtype, keep_dim, out)
DEVKIT_DIRECT_FLOATS_KERNEL(sum_grad, (const Context& c, const DenseTensor& x, const DenseTensor& dout, const phi::IntArray& dims,
                         bool keep_dim, bool reduce_all, DenseTensor* dx), c, x, dout, dims, keep_dim, reduce_all, dx)
DEVKIT_KERNEL(transpose, (const Context& c, const DenseTensor& x, const std::vector<int>& perm, DenseTensor* out),
              c, x, perm, out)
DEVKIT_KERNEL(transpose_grad, (const Context& c, const DenseTensor& dout, const std::vector<int>& perm,
                               DenseTensor* dx), c, dout, perm, dx)

DEVKIT_UNARY_KERNEL(relu, "Relu", DEVKIT_FLOATS)
DEVKIT_UNARY_DIRECT_GRAD_KERNEL(relu, "ReluGrad", DEVKIT_FLOATS)
DEVKIT_BINARY_KERNEL(add, "Add", DEVKIT_FLOATS)
DEVKIT_DIRECT_FLOATS_KERNEL(add_grad, (const Context& c, const DenseTensor& x, const DenseTensor& y, const DenseTensor& dout,
                                 int axis, DenseTensor* dx, DenseTensor* dy), c, x, y, dout, axis, dx, dy)
DEVKIT_BINARY_KERNEL(subtract, "Sub", DEVKIT_FLOATS)
DEVKIT_BINARY_KERNEL(multiply, "Mul", DEVKIT_FLOATS)
DEVKIT_DIRECT_FLOATS_KERNEL(matmul, (const Context& c, const DenseTensor& x, const DenseTensor& y, bool tx, bool ty,
                       DenseTensor* out), c, x, y, tx, ty, out)
DEVKIT_DIRECT_FLOATS_KERNEL(matmul_grad, (const Context& c, const DenseTensor& x, const DenseTensor& y, const DenseTensor& dout,
                            bool tx, bool ty, DenseTensor* dx, DenseTensor* dy), c, x, y, dout, tx, ty, dx, dy)
DEVKIT_DIRECT_FLOATS_KERNEL(softmax, (const Context& c, const DenseTensor& x, int axis, DenseTensor* out), c, x, axis, out)
DEVKIT_DIRECT_FLOATS_KERNEL(softmax_grad, (const Context& c, const DenseTensor& out, const DenseTensor& dout, int axis,
                             DenseTensor* dx), c, out, dout, axis, dx)
DEVKIT_DIRECT_FLOATS_KERNEL(cross_entropy_with_softmax,
              (const Context& c, const DenseTensor& logits, const DenseTensor& label, bool soft_label,
               bool use_softmax, bool numeric_stable_mode, int ignore_index, int axis, DenseTensor* softmax,
               DenseTensor* loss),
              c, logits, label, soft_label, use_softmax, numeric_stable_mode, ignore_index, axis, softmax, loss)
DEVKIT_DIRECT_FLOATS_KERNEL(cross_entropy_with_softmax_grad,
              (const Context& c, const DenseTensor& label, const DenseTensor& softmax, const DenseTensor& loss_grad,
               bool soft_label, bool use_softmax, bool numeric_stable_mode, int ignore_index, int axis,
               DenseTensor* logits_grad),
              c, label, softmax, loss_grad, soft_label, use_softmax, numeric_stable_mode, ignore_index, axis,
              logits_grad)
DEVKIT_DIRECT_FLOATS_KERNEL(mean_all, (const Context& c, const DenseTensor& x, DenseTensor* out), c, x, out)
DEVKIT_DIRECT_FLOATS_KERNEL(mean_all_grad, (const Context& c, const DenseTensor& x, const DenseTensor& dout, DenseTensor* dx),
              c, x, dout, dx)
DEVKIT_DIRECT_FLOATS_KERNEL(mean, (const Context& c, const DenseTensor& x, const phi::IntArray& dims, bool keep_dim,
                     DenseTensor* out), c, x, dims, keep_dim, out)
DEVKIT_DIRECT_FLOATS_KERNEL(mean_grad, (const Context& c, const DenseTensor& x, const DenseTensor& dout,
                          const phi::IntArray& dims, bool keep_dim, bool reduce_all, DenseTensor* dx),
              c, x, dout, dims, keep_dim, reduce_all, dx)
DEVKIT_FLOATS_KERNEL(sgd, (const Context& c, const DenseTensor& param, const DenseTensor& lr, const DenseTensor& grad,
                    const paddle::optional<DenseTensor>& master_param, bool multi_precision,
                    DenseTensor* param_out, DenseTensor* master_param_out),
              c, param, lr, grad, master_param, multi_precision, param_out, master_param_out)
DEVKIT_DIRECT_FLOATS_KERNEL(layer_norm, (const Context& c, const DenseTensor& x, const paddle::optional<DenseTensor>& scale,
                           const paddle::optional<DenseTensor>& bias, float epsilon, int begin_norm_axis,
                           DenseTensor* out, DenseTensor* mean, DenseTensor* variance),
              c, x, scale, bias, epsilon, begin_norm_axis, out, mean, variance)
DEVKIT_DIRECT_FLOATS_KERNEL(layer_norm_grad, (const Context& c, const DenseTensor& x, const paddle::optional<DenseTensor>& scale,
                                const paddle::optional<DenseTensor>& bias, const DenseTensor& mean,
                                const DenseTensor& variance, const DenseTensor& out_grad, float epsilon,
                                int begin_norm_axis, DenseTensor* x_grad, DenseTensor* scale_grad,
                                DenseTensor* bias_grad),
              c, x, scale, bias, mean, variance, out_grad, epsilon, begin_norm_axis, x_grad, scale_grad, bias_grad)
DEVKIT_DIRECT_FLOATS_KERNEL(conv2d, (const Context& c, const DenseTensor& input, const DenseTensor& filter,
                       const std::vector<int>& strides, const std::vector<int>& paddings,
                       const std::string& padding_algorithm, const std::vector<int>& dilations, int groups,
                       const std::string& data_format, DenseTensor* out),
              c, input, filter, strides, paddings, padding_algorithm, dilations, groups, data_format, out)
DEVKIT_DIRECT_FLOATS_KERNEL(conv2d_grad, (const Context& c, const DenseTensor& input, const DenseTensor& filter,
                            const DenseTensor& out_grad, const std::vector<int>& strides,
                            const std::vector<int>& paddings, const std::string& padding_algorithm,
                            const std::vector<int>& dilations, int groups, const std::string& data_format,
                            DenseTensor* input_grad, DenseTensor* filter_grad),
              c, input, filter, out_grad, strides, paddings, padding_algorithm, dilations, groups, data_format,
              input_grad, filter_grad)
DEVKIT_DIRECT_FLOATS_KERNEL(batch_norm, (const Context& c, const DenseTensor& x, const DenseTensor& mean,
                           const DenseTensor& variance, const paddle::optional<DenseTensor>& scale,
                           const paddle::optional<DenseTensor>& bias, bool is_test, float momentum, float epsilon,
                           const std::string& data_layout, bool use_global_stats, bool trainable_statistics,
                           DenseTensor* y, DenseTensor* mean_out, DenseTensor* variance_out, DenseTensor* saved_mean,
                           DenseTensor* saved_variance, DenseTensor* reserve_space),
              c, x, mean, variance, scale, bias, is_test, momentum, epsilon, data_layout, use_global_stats,
              trainable_statistics, y, mean_out, variance_out, saved_mean, saved_variance, reserve_space)
DEVKIT_DIRECT_FLOATS_KERNEL(batch_norm_grad, (const Context& c, const DenseTensor& x, const paddle::optional<DenseTensor>& scale,
                                const paddle::optional<DenseTensor>& bias, const paddle::optional<DenseTensor>& mean,
                                const paddle::optional<DenseTensor>& variance, const DenseTensor& saved_mean,
                                const DenseTensor& saved_variance, const paddle::optional<DenseTensor>& reserve_space,
                                const DenseTensor& y_grad, float momentum, float epsilon,
                                const std::string& data_layout, bool is_test, bool use_global_stats,
                                bool trainable_statistics, DenseTensor* x_grad, DenseTensor* scale_grad,
                                DenseTensor* bias_grad),
              c, x, scale, bias, mean, variance, saved_mean, saved_variance, reserve_space, y_grad, momentum, epsilon,
              data_layout, is_test, use_global_stats, trainable_statistics, x_grad, scale_grad, bias_grad)
DEVKIT_DIRECT_FLOATS_KERNEL(adam, (const Context& c, const DenseTensor& param, const DenseTensor& grad, const DenseTensor& lr,
                     const DenseTensor& moment1, const DenseTensor& moment2,
                     const paddle::optional<DenseTensor>& moment2_max, const DenseTensor& beta1_pow,
                     const DenseTensor& beta2_pow, const paddle::optional<DenseTensor>& master_param,
                     const paddle::optional<DenseTensor>& skip_update, const phi::Scalar& beta1,
                     const phi::Scalar& beta2, const phi::Scalar& epsilon, bool lazy_mode,
                     int64_t min_row_size_to_use_multithread, bool multi_precision, bool use_global_beta_pow,
                     bool amsgrad, DenseTensor* param_out, DenseTensor* moment1_out, DenseTensor* moment2_out,
                     DenseTensor* moment2_max_out, DenseTensor* beta1_pow_out, DenseTensor* beta2_pow_out,
                     DenseTensor* master_param_out),
              c, param, grad, lr, moment1, moment2, moment2_max, beta1_pow, beta2_pow, master_param, skip_update,
              beta1, beta2, epsilon, lazy_mode, min_row_size_to_use_multithread, multi_precision,
              use_global_beta_pow, amsgrad, param_out, moment1_out, moment2_out, moment2_max_out, beta1_pow_out,
              beta2_pow_out, master_param_out)
// A strided view made compact (Paddle's stride kernels make views: transpose, slices).
DEVKIT_ALL_DTYPES_DIRECT_KERNEL(contiguous, (const Context& c, const DenseTensor& x, DenseTensor* out), c, x, out)
DEVKIT_COMPARE_KERNEL(equal, "Equal", false, double, int32_t, int64_t, bool)
DEVKIT_COMPARE_KERNEL(not_equal, "Equal", true, double, int32_t, int64_t, bool)
DEVKIT_COMPARE_KERNEL(less_than, "Less", false, double, int32_t, int64_t)
DEVKIT_COMPARE_KERNEL(less_equal, "LessOrEqual", false, double, int32_t, int64_t)
DEVKIT_COMPARE_KERNEL(greater_than, "Greater", false, double, int32_t, int64_t)
DEVKIT_COMPARE_KERNEL(greater_equal, "GreaterOrEqual", false, double, int32_t, int64_t)
DEVKIT_ALL_DTYPES_DIRECT_KERNEL(cast, (const Context& c, const DenseTensor& x, PD_DataType out_dtype, DenseTensor* out),
                         c, x, out_dtype, out)
DEVKIT_DIRECT_KERNEL(concat, (const Context& c, const std::vector<const DenseTensor*>& xs, const phi::Scalar& axis,
                       DenseTensor* out), c, xs, axis, out)
DEVKIT_DIRECT_KERNEL(split_with_num, (const Context& c, const DenseTensor& x, int num, const phi::Scalar& axis,
                               std::vector<DenseTensor*> outs), c, x, num, axis, outs)
DEVKIT_ALL_DTYPES_DIRECT_KERNEL(full, (const Context& c, const phi::IntArray& shape, const phi::Scalar& value, PD_DataType dtype,
                           DenseTensor* out), c, shape, value, dtype, out)
DEVKIT_ALL_DTYPES_DIRECT_KERNEL(full_like, (const Context& c, const DenseTensor& x, const phi::Scalar& value, PD_DataType dtype,
                               DenseTensor* out), c, x, value, dtype, out)
// Pooling (max or average; global, adaptive where the output divides the input), embedding and
// dropout (its mask drawn on the host: devkit has no random op; through run_op).
DEVKIT_DIRECT_KERNEL(pool2d, (const Context& c, const DenseTensor& x, const phi::IntArray& kernel_size,
                       const std::vector<int64_t>& strides, const std::vector<int64_t>& paddings, bool ceil_mode,
                       bool exclusive, const std::string& data_format, const std::string& pooling_type,
                       bool global_pooling, bool adaptive, const std::string& padding_algorithm, DenseTensor* out),
              c, x, kernel_size, strides, paddings, ceil_mode, exclusive, data_format, pooling_type, global_pooling,
              adaptive, padding_algorithm, out)
DEVKIT_DIRECT_KERNEL(pool2d_grad, (const Context& c, const DenseTensor& x, const DenseTensor& out, const DenseTensor& dout,
                            const phi::IntArray& kernel_size, const std::vector<int64_t>& strides,
                            const std::vector<int64_t>& paddings, bool ceil_mode, bool exclusive,
                            const std::string& data_format, const std::string& pooling_type, bool global_pooling,
                            bool adaptive, const std::string& padding_algorithm, DenseTensor* dx),
              c, x, out, dout, kernel_size, strides, paddings, ceil_mode, exclusive, data_format, pooling_type,
              global_pooling, adaptive, padding_algorithm, dx)
DEVKIT_KERNEL(max_pool2d_with_index, (const Context& c, const DenseTensor& x, const std::vector<int>& kernel_size,
                                      const std::vector<int>& strides, const std::vector<int>& paddings,
                                      bool global_pooling, bool adaptive, bool ceil_mode, DenseTensor* out,
                                      DenseTensor* mask),
              c, x, kernel_size, strides, paddings, global_pooling, adaptive, ceil_mode, out, mask)
DEVKIT_KERNEL(max_pool2d_with_index_grad, (const Context& c, const DenseTensor& x, const DenseTensor& mask,
                                           const DenseTensor& dout, const std::vector<int>& kernel_size,
                                           const std::vector<int>& strides, const std::vector<int>& paddings,
                                           bool global_pooling, bool adaptive, bool ceil_mode, DenseTensor* dx),
              c, x, mask, dout, kernel_size, strides, paddings, global_pooling, adaptive, ceil_mode, dx)
DEVKIT_DIRECT_KERNEL(embedding, (const Context& c, const DenseTensor& ids, const DenseTensor& weight, int64_t padding_idx,
                          DenseTensor* out), c, ids, weight, padding_idx, out)
DEVKIT_DIRECT_KERNEL(embedding_grad, (const Context& c, const DenseTensor& ids, const DenseTensor& weight,
                               const DenseTensor& out_grad, int64_t padding_idx, DenseTensor* weight_grad),
              c, ids, weight, out_grad, padding_idx, weight_grad)
DEVKIT_KERNEL(dropout, (const Context& c, const DenseTensor& x, const paddle::optional<DenseTensor>& seed_tensor,
                        const phi::Scalar& p, bool is_test, const std::string& mode, int seed, bool fix_seed,
                        DenseTensor* out, DenseTensor* mask),
              c, x, seed_tensor, p, is_test, mode, seed, fix_seed, out, mask)
DEVKIT_KERNEL(dropout_grad, (const Context& c, const DenseTensor& mask, const DenseTensor& out_grad,
                             const phi::Scalar& p, bool is_test, const std::string& mode, DenseTensor* x_grad),
              c, mask, out_grad, p, is_test, mode, x_grad)
