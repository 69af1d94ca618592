// The devkit PaddlePaddle bridge: a CustomDevice library (device type
// "devkit") that forwards Paddle's C_DeviceInterface to the DK_DeviceApi of
// the devkit plugin named by DEVKIT_PADDLE_PLUGIN, and registers phi kernels
// that run devkit ops. devkit.paddle builds it against the installed wheel's
// headers (docs/paddle.md).
//
// The plugin is loaded in-process by the Python devkit (devkit.paddle._bridge),
// so C plugins and Python (cffi) plugins are reached alike: the bridge takes
// the table's address from Python once, then calls the table directly for
// device, memory, copy, stream and event hooks. Allocations and kernels go
// through Python (the GIL is taken with PyGILState_Ensure): allocations are
// devkit Buffers, so kernels can view them as devkit Arrays and run run_op;
// elementwise kernels call the plugin's kernel table directly where they can
// (run_direct below).
//
// Pointers Paddle sees: on a device reporting DK_DEVICE_HOST_POINTER_HANDLES
// an allocation's pointer is its handle (a host address); otherwise it is a
// token from a reserved address range, one range per allocation. Paddle
// offsets these pointers (its allocator carves chunks, tensors take slices),
// so every hook resolves a pointer to (handle, byte offset) through the
// table of live allocations below.
//
// Execution is synchronous in this first slice: kernels and copies, the
// async ones included, run on the device's default (NULL) stream, which
// completes before returning. Streams and events are still the plugin's, so
// Paddle's stream and event calls are forwarded and answer correctly.
#include <Python.h>
#include <dlfcn.h>

#include <cstdio>
#include <cstring>
#include <map>
#include <mutex>
#include <string>
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
std::map<std::pair<std::string, int>, const DK_KernelEntry*> g_direct_entries;  // (op, PD dtype) -> entry or NULL
std::map<std::string, long long> g_direct_calls;  // op -> direct calls so far

// The entry for (op, dtype), asked of Python once.
const DK_KernelEntry* direct_entry(const char* op, PD_DataType dtype) {
  std::pair<std::string, int> key(op, static_cast<int>(dtype));
  {
    std::lock_guard<std::mutex> lock(g_direct_lock);
    auto it = g_direct_entries.find(key);
    if (it != g_direct_entries.end()) return it->second;
  }
  unsigned long long address = 0;
  {
    Gil gil;
    PyObject* result = call_python("direct_entry", Py_BuildValue("(si)", op, static_cast<int>(dtype)));
    if (result == nullptr) {
      report(std::string("direct_entry: ") + python_error());  // the Python path still runs the op
    } else {
      address = PyLong_AsUnsignedLongLong(result);
      Py_DECREF(result);
    }
  }
  const DK_KernelEntry* entry = reinterpret_cast<const DK_KernelEntry*>(address);
  std::lock_guard<std::mutex> lock(g_direct_lock);
  g_direct_entries[key] = entry;
  return entry;
}

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
void add(Args& a, const phi::IntArray& v) {
  std::vector<int64_t> data = v.GetData();
  PyObject* o = PyList_New(0);
  for (int64_t x : data) {
    PyObject* item = PyLong_FromLongLong(x);
    PyList_Append(o, item);
    Py_DECREF(item);
  }
  append(a, o);
}

void add(Args& a, const std::vector<int>& v) {
  PyObject* o = PyList_New(0);
  for (int x : v) {
    PyObject* item = PyLong_FromLong(x);
    PyList_Append(o, item);
    Py_DECREF(item);
  }
  append(a, o);
}
void add(Args& a, const std::string& v) { append(a, PyUnicode_FromString(v.c_str())); }
void add(Args& a, const phi::Scalar& v) { append(a, PyFloat_FromDouble(v.to<double>())); }
void add(Args& a, PD_DataType v) { append(a, PyLong_FromLong(static_cast<long>(v))); }

// A tensor for a direct call: compact, non-empty, in devkit memory, of a dtype the ABI keys.
struct DirectTensor {
  DK_Tensor tensor;
  std::vector<int64_t> shape;
};

bool direct_tensor(const DenseTensor& t, void* data, int32_t dev, DirectTensor* out) {
  static const std::map<int, DK_DataType> kDtypes = {
      {PD_DataType::FLOAT32, {DK_DTYPE_CODE_FLOAT, 32, 1}}, {PD_DataType::FLOAT64, {DK_DTYPE_CODE_FLOAT, 64, 1}},
      {PD_DataType::INT32, {DK_DTYPE_CODE_INT, 32, 1}}, {PD_DataType::INT64, {DK_DTYPE_CODE_INT, 64, 1}}};
  auto dtype = kDtypes.find(static_cast<int>(t.dtype()));
  if (dtype == kDtypes.end() || data == nullptr || t.numel() == 0) return false;
  out->shape = t.dims();
  std::vector<int64_t> strides = t.strides();
  int64_t step = 1;
  for (size_t k = strides.size(); k-- > 0;) {  // compact row-major, or no strides at all
    if (strides.size() == out->shape.size() && out->shape[k] != 1 && strides[k] != step) return false;
    step *= out->shape[k];
  }
  DK_Mem mem;
  size_t offset;
  if (!resolve(data, &mem, &offset)) return false;
  out->tensor = DK_Tensor{mem, DK_Device{g_device_types[dev], dev}, static_cast<int32_t>(out->shape.size()),
                          dtype->second, nullptr, nullptr, offset};
  return true;
}

// Runs op on the plugin's kernel straight from here; false when it cannot (the Python path then runs it).
bool run_direct(const char* op, const phi::Context& ctx, PD_DataType dtype,
                const std::vector<const DenseTensor*>& inputs, DenseTensor* output) {
  int32_t dev = t_current;
  if (output == nullptr || g_api == nullptr || dev < 0 || dev >= g_count) return false;
  const DK_KernelEntry* entry = direct_entry(op, dtype);
  if (entry == nullptr) return false;
  std::vector<DirectTensor> ins(inputs.size());
  for (size_t k = 0; k < inputs.size(); ++k) {
    if (!direct_tensor(*inputs[k], inputs[k]->initialized() ? inputs[k]->data<void>() : nullptr, dev, &ins[k]))
      return false;
  }
  DirectTensor out;
  if (output->dtype() != inputs[0]->dtype() || output->numel() == 0) return false;
  if (!direct_tensor(*output, ctx.Alloc(output, output->dtype()), dev, &out)) return false;
  std::vector<DK_Tensor> in_tensors;
  for (auto& t : ins) {
    t.tensor.shape = t.shape.data();
    in_tensors.push_back(t.tensor);
  }
  out.tensor.shape = out.shape.data();
  DK_KernelCall call{};
  call.struct_size = sizeof(call);
  call.device = dev;
  call.stream = nullptr;
  call.inputs = in_tensors.data();
  call.num_inputs = in_tensors.size();
  call.outputs = &out.tensor;
  call.num_outputs = 1;
  call.user_data = entry->user_data;
  DK_Status s = entry->fn(&call);
  if (s != DK_OK) PD_THROW(std::string("devkit kernel '") + op + "': " + plugin_message());
  std::lock_guard<std::mutex> lock(g_direct_lock);
  ++g_direct_calls[op];
  return true;
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

}  // namespace

#define DEVKIT_KERNEL(name, params, ...)                              \
  template <typename T>                                               \
  void name##_kernel params { run<T>(#name, __VA_ARGS__); }           \
  PD_BUILD_PHI_KERNEL(name, devkit, ALL_LAYOUT, name##_kernel, float) {}

// Kernels for every dtype: fills, because Paddle's CPU fallback for them
// writes the output's memory from the host (set_constant_with_place), which
// only a device with host-pointer handles survives; contiguous, because
// Paddle has no fallback for it.
#define DEVKIT_ALL_DTYPES_KERNEL(name, params, ...)                         \
  template <typename T>                                               \
  void name##_kernel params { run<T>(#name, __VA_ARGS__); }           \
  PD_BUILD_PHI_KERNEL(name, devkit, ALL_LAYOUT, name##_kernel, float, double, int32_t, int64_t, bool) {}

using phi::Context;

// y = f(x), and grads taking (x or out, dout): the Python side knows which.
#define DEVKIT_UNARY_KERNEL(name)                                                            \
  template <typename T>                                                                     \
  void name##_kernel(const Context& c, const DenseTensor& x, DenseTensor* out) {            \
    if (!run_direct(#name, c, phi::capi::CppTypeToPDType<T>::Type(), {&x}, out)) run<T>(#name, c, x, out); \
  }                                                                                         \
  PD_BUILD_PHI_KERNEL(name, devkit, ALL_LAYOUT, name##_kernel, float) {}
#define DEVKIT_UNARY_GRAD_KERNEL(name)                                                              \
  DEVKIT_KERNEL(name##_grad, (const Context& c, const DenseTensor& x_or_out, const DenseTensor& dout, \
                              DenseTensor* dx), c, x_or_out, dout, dx)
// Elementwise binary ops with numpy broadcasting, for the numeric dtypes (integer
// arithmetic runs on the device too: labels, masks), and their grads (axis is -1).
#define DEVKIT_BINARY_KERNEL(name)                                                                           \
  template <typename T>                                                                                       \
  void name##_kernel(const Context& c, const DenseTensor& x, const DenseTensor& y, DenseTensor* out) {        \
    if (!run_direct(#name, c, phi::capi::CppTypeToPDType<T>::Type(), {&x, &y}, out)) run<T>(#name, c, x, y, out); \
  }                                                                                                           \
  PD_BUILD_PHI_KERNEL(name, devkit, ALL_LAYOUT, name##_kernel, float, double, int32_t, int64_t) {}
#define DEVKIT_BINARY_GRAD_KERNEL(name)                                                          \
  DEVKIT_KERNEL(name##_grad, (const Context& c, const DenseTensor& x, const DenseTensor& y,        \
                              const DenseTensor& dout, int axis, DenseTensor* dx, DenseTensor* dy), \
                c, x, y, dout, axis, dx, dy)

DEVKIT_UNARY_KERNEL(exp)
DEVKIT_UNARY_GRAD_KERNEL(exp)
DEVKIT_UNARY_KERNEL(tanh)
DEVKIT_UNARY_GRAD_KERNEL(tanh)
DEVKIT_UNARY_KERNEL(sigmoid)
DEVKIT_UNARY_GRAD_KERNEL(sigmoid)
DEVKIT_UNARY_KERNEL(sqrt)
DEVKIT_UNARY_GRAD_KERNEL(sqrt)
DEVKIT_UNARY_KERNEL(log)
DEVKIT_UNARY_GRAD_KERNEL(log)
DEVKIT_UNARY_KERNEL(sin)
DEVKIT_UNARY_GRAD_KERNEL(sin)
DEVKIT_UNARY_KERNEL(cos)
DEVKIT_UNARY_GRAD_KERNEL(cos)
DEVKIT_UNARY_KERNEL(abs)
DEVKIT_UNARY_GRAD_KERNEL(abs)
DEVKIT_UNARY_KERNEL(square)
DEVKIT_UNARY_GRAD_KERNEL(square)
DEVKIT_BINARY_KERNEL(divide)
DEVKIT_KERNEL(divide_grad, (const Context& c, const DenseTensor& x, const DenseTensor& y, const DenseTensor& out,
                            const DenseTensor& dout, int axis, DenseTensor* dx, DenseTensor* dy),
              c, x, y, out, dout, axis, dx, dy)
DEVKIT_BINARY_GRAD_KERNEL(subtract)
DEVKIT_BINARY_GRAD_KERNEL(multiply)
DEVKIT_KERNEL(gelu, (const Context& c, const DenseTensor& x, bool approximate, DenseTensor* out), c, x, approximate,
              out)
DEVKIT_KERNEL(gelu_grad, (const Context& c, const DenseTensor& x, const DenseTensor& dout, bool approximate,
                          DenseTensor* dx), c, x, dout, approximate, dx)
DEVKIT_KERNEL(scale, (const Context& c, const DenseTensor& x, const phi::Scalar& scale, const phi::Scalar& bias,
                      bool bias_after_scale, DenseTensor* out), c, x, scale, bias, bias_after_scale, out)
DEVKIT_KERNEL(sum, (const Context& c, const DenseTensor& x, const phi::IntArray& dims, PD_DataType out_dtype,
                    bool keep_dim, DenseTensor* out), c, x, dims, out_dtype, keep_dim, out)
DEVKIT_KERNEL(sum_grad, (const Context& c, const DenseTensor& x, const DenseTensor& dout, const phi::IntArray& dims,
                         bool keep_dim, bool reduce_all, DenseTensor* dx), c, x, dout, dims, keep_dim, reduce_all, dx)
DEVKIT_KERNEL(transpose, (const Context& c, const DenseTensor& x, const std::vector<int>& perm, DenseTensor* out),
              c, x, perm, out)
DEVKIT_KERNEL(transpose_grad, (const Context& c, const DenseTensor& dout, const std::vector<int>& perm,
                               DenseTensor* dx), c, dout, perm, dx)

DEVKIT_UNARY_KERNEL(relu)
DEVKIT_UNARY_GRAD_KERNEL(relu)
DEVKIT_BINARY_KERNEL(add)
DEVKIT_BINARY_GRAD_KERNEL(add)
DEVKIT_BINARY_KERNEL(subtract)
DEVKIT_BINARY_KERNEL(multiply)
DEVKIT_KERNEL(matmul, (const Context& c, const DenseTensor& x, const DenseTensor& y, bool tx, bool ty,
                       DenseTensor* out), c, x, y, tx, ty, out)
DEVKIT_KERNEL(matmul_grad, (const Context& c, const DenseTensor& x, const DenseTensor& y, const DenseTensor& dout,
                            bool tx, bool ty, DenseTensor* dx, DenseTensor* dy), c, x, y, dout, tx, ty, dx, dy)
DEVKIT_KERNEL(softmax, (const Context& c, const DenseTensor& x, int axis, DenseTensor* out), c, x, axis, out)
DEVKIT_KERNEL(softmax_grad, (const Context& c, const DenseTensor& out, const DenseTensor& dout, int axis,
                             DenseTensor* dx), c, out, dout, axis, dx)
DEVKIT_KERNEL(cross_entropy_with_softmax,
              (const Context& c, const DenseTensor& logits, const DenseTensor& label, bool soft_label,
               bool use_softmax, bool numeric_stable_mode, int ignore_index, int axis, DenseTensor* softmax,
               DenseTensor* loss),
              c, logits, label, soft_label, use_softmax, numeric_stable_mode, ignore_index, axis, softmax, loss)
DEVKIT_KERNEL(cross_entropy_with_softmax_grad,
              (const Context& c, const DenseTensor& label, const DenseTensor& softmax, const DenseTensor& loss_grad,
               bool soft_label, bool use_softmax, bool numeric_stable_mode, int ignore_index, int axis,
               DenseTensor* logits_grad),
              c, label, softmax, loss_grad, soft_label, use_softmax, numeric_stable_mode, ignore_index, axis,
              logits_grad)
DEVKIT_KERNEL(mean_all, (const Context& c, const DenseTensor& x, DenseTensor* out), c, x, out)
DEVKIT_KERNEL(mean_all_grad, (const Context& c, const DenseTensor& x, const DenseTensor& dout, DenseTensor* dx),
              c, x, dout, dx)
DEVKIT_KERNEL(mean, (const Context& c, const DenseTensor& x, const phi::IntArray& dims, bool keep_dim,
                     DenseTensor* out), c, x, dims, keep_dim, out)
DEVKIT_KERNEL(mean_grad, (const Context& c, const DenseTensor& x, const DenseTensor& dout,
                          const phi::IntArray& dims, bool keep_dim, bool reduce_all, DenseTensor* dx),
              c, x, dout, dims, keep_dim, reduce_all, dx)
DEVKIT_KERNEL(sgd, (const Context& c, const DenseTensor& param, const DenseTensor& lr, const DenseTensor& grad,
                    const paddle::optional<DenseTensor>& master_param, bool multi_precision,
                    DenseTensor* param_out, DenseTensor* master_param_out),
              c, param, lr, grad, master_param, multi_precision, param_out, master_param_out)
DEVKIT_KERNEL(layer_norm, (const Context& c, const DenseTensor& x, const paddle::optional<DenseTensor>& scale,
                           const paddle::optional<DenseTensor>& bias, float epsilon, int begin_norm_axis,
                           DenseTensor* out, DenseTensor* mean, DenseTensor* variance),
              c, x, scale, bias, epsilon, begin_norm_axis, out, mean, variance)
DEVKIT_KERNEL(layer_norm_grad, (const Context& c, const DenseTensor& x, const paddle::optional<DenseTensor>& scale,
                                const paddle::optional<DenseTensor>& bias, const DenseTensor& mean,
                                const DenseTensor& variance, const DenseTensor& out_grad, float epsilon,
                                int begin_norm_axis, DenseTensor* x_grad, DenseTensor* scale_grad,
                                DenseTensor* bias_grad),
              c, x, scale, bias, mean, variance, out_grad, epsilon, begin_norm_axis, x_grad, scale_grad, bias_grad)
DEVKIT_KERNEL(conv2d, (const Context& c, const DenseTensor& input, const DenseTensor& filter,
                       const std::vector<int>& strides, const std::vector<int>& paddings,
                       const std::string& padding_algorithm, const std::vector<int>& dilations, int groups,
                       const std::string& data_format, DenseTensor* out),
              c, input, filter, strides, paddings, padding_algorithm, dilations, groups, data_format, out)
DEVKIT_KERNEL(conv2d_grad, (const Context& c, const DenseTensor& input, const DenseTensor& filter,
                            const DenseTensor& out_grad, const std::vector<int>& strides,
                            const std::vector<int>& paddings, const std::string& padding_algorithm,
                            const std::vector<int>& dilations, int groups, const std::string& data_format,
                            DenseTensor* input_grad, DenseTensor* filter_grad),
              c, input, filter, out_grad, strides, paddings, padding_algorithm, dilations, groups, data_format,
              input_grad, filter_grad)
DEVKIT_KERNEL(batch_norm, (const Context& c, const DenseTensor& x, const DenseTensor& mean,
                           const DenseTensor& variance, const paddle::optional<DenseTensor>& scale,
                           const paddle::optional<DenseTensor>& bias, bool is_test, float momentum, float epsilon,
                           const std::string& data_layout, bool use_global_stats, bool trainable_statistics,
                           DenseTensor* y, DenseTensor* mean_out, DenseTensor* variance_out, DenseTensor* saved_mean,
                           DenseTensor* saved_variance, DenseTensor* reserve_space),
              c, x, mean, variance, scale, bias, is_test, momentum, epsilon, data_layout, use_global_stats,
              trainable_statistics, y, mean_out, variance_out, saved_mean, saved_variance, reserve_space)
DEVKIT_KERNEL(batch_norm_grad, (const Context& c, const DenseTensor& x, const paddle::optional<DenseTensor>& scale,
                                const paddle::optional<DenseTensor>& bias, const paddle::optional<DenseTensor>& mean,
                                const paddle::optional<DenseTensor>& variance, const DenseTensor& saved_mean,
                                const DenseTensor& saved_variance, const paddle::optional<DenseTensor>& reserve_space,
                                const DenseTensor& y_grad, float momentum, float epsilon,
                                const std::string& data_layout, bool is_test, bool use_global_stats,
                                bool trainable_statistics, DenseTensor* x_grad, DenseTensor* scale_grad,
                                DenseTensor* bias_grad),
              c, x, scale, bias, mean, variance, saved_mean, saved_variance, reserve_space, y_grad, momentum, epsilon,
              data_layout, is_test, use_global_stats, trainable_statistics, x_grad, scale_grad, bias_grad)
DEVKIT_KERNEL(adam, (const Context& c, const DenseTensor& param, const DenseTensor& grad, const DenseTensor& lr,
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
DEVKIT_ALL_DTYPES_KERNEL(contiguous, (const Context& c, const DenseTensor& x, DenseTensor* out), c, x, out)
DEVKIT_ALL_DTYPES_KERNEL(equal, (const Context& c, const DenseTensor& x, const DenseTensor& y, DenseTensor* out),
                         c, x, y, out)
DEVKIT_ALL_DTYPES_KERNEL(not_equal, (const Context& c, const DenseTensor& x, const DenseTensor& y,
                                     DenseTensor* out), c, x, y, out)
DEVKIT_BINARY_KERNEL(less_than)
DEVKIT_BINARY_KERNEL(less_equal)
DEVKIT_BINARY_KERNEL(greater_than)
DEVKIT_BINARY_KERNEL(greater_equal)
DEVKIT_ALL_DTYPES_KERNEL(cast, (const Context& c, const DenseTensor& x, PD_DataType out_dtype, DenseTensor* out),
                         c, x, out_dtype, out)
DEVKIT_KERNEL(concat, (const Context& c, const std::vector<const DenseTensor*>& xs, const phi::Scalar& axis,
                       DenseTensor* out), c, xs, axis, out)
DEVKIT_KERNEL(split_with_num, (const Context& c, const DenseTensor& x, int num, const phi::Scalar& axis,
                               std::vector<DenseTensor*> outs), c, x, num, axis, outs)
DEVKIT_ALL_DTYPES_KERNEL(full, (const Context& c, const phi::IntArray& shape, const phi::Scalar& value, PD_DataType dtype,
                           DenseTensor* out), c, shape, value, dtype, out)
DEVKIT_ALL_DTYPES_KERNEL(full_like, (const Context& c, const DenseTensor& x, const phi::Scalar& value, PD_DataType dtype,
                               DenseTensor* out), c, x, value, dtype, out)
