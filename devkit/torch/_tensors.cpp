// devkit.torch's native piece: devkit torch storages and tensors made in one
// call, and the eager replay of a recorded aten op.
//
// From Python a tensor of a given storage and geometry costs an empty tensor
// and a set_ through the dispatcher (about 5 us, most of an eager op's
// budget); here it is one TensorImpl. A storage made here says when it dies
// (reap() takes its allocation into a reuse pool), so devkit.torch reuses
// its allocation without scanning for dead storages. A Replayer runs the
// templates devkit/torch/_replay.py records (key, argument places, outputs
// from the pools, the launches through each kernel's DK_KernelFn, the result
// tensors) without Python in between. Built at first use by
// torch.utils.cpp_extension (devkit/torch/_native.py), which caches it on disk.
// It includes c10 and ATen's TensorBase only, to compile in seconds.

#include <Python.h>

#include <ATen/core/TensorBase.h>
#include <c10/core/Storage.h>
#include <c10/core/TensorImpl.h>
#include <c10/util/SmallVector.h>
#include <torch/csrc/Dtype.h>
#include <torch/csrc/Export.h>

#include <memory>
#include <mutex>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

// Declared by torch/csrc/autograd/python_variable.h and torch/csrc/DynamicTypes.h,
// which bring pybind11 and all of ATen's Tensor: four times this file's compile time.
TORCH_PYTHON_API PyObject* THPVariable_Wrap(at::TensorBase&& var);
TORCH_PYTHON_API PyObject* THPStorage_Wrap(c10::Storage storage);
TORCH_PYTHON_API extern PyObject* THPVariableClass;
TORCH_PYTHON_API extern PyObject* ParameterClass;
namespace torch {
TORCH_PYTHON_API at::Storage createStorage(PyObject* obj);
}

namespace {

// Tokens of the storages made here that have died since the last reap. A storage
// dies in whichever thread drops it last, with or without the GIL, and may die
// during the process's exit, after static objects are destroyed: these two are
// never destroyed.
std::mutex& dead_lock = *new std::mutex;
std::vector<int64_t>& dead = *new std::vector<int64_t>;

// What a storage made here knows of its devkit allocation. ``allocation`` is
// borrowed: devkit.torch's live dict holds it for as long as the storage lives.
struct StorageContext {
  int64_t token;
  void* handle;          // the allocation's device handle
  PyObject* allocation;  // its devkit _Allocation (handle None once freed)
};

void storage_died(void* context) {
  auto* dying = static_cast<StorageContext*>(context);
  {
    std::lock_guard<std::mutex> guard(dead_lock);
    dead.push_back(dying->token);
  }
  delete dying;
}

// Set by configure(): devkit.torch._memory's state, which the functions below share with it.
struct Memory {
  PyObject* live = nullptr;     // token -> (whole Buffer, WeakStorage)
  PyObject* pools = nullptr;    // (Device, nbytes) -> [whole Buffer] of dead storages
  PyObject* address_of = nullptr;  // address_of(allocation) -> int: its handle's address
  Py_ssize_t pool_nbytes = 0, pool_depth = 0;
  int64_t next_token = 0, token_align = 1;
} memory;

PyObject *s_allocation, *s_nbytes, *s_device, *s_handle, *s_torch_token, *s_used_on_streams, *s_holds,
    *s_handle_address, *s_alloc;

// A weak reference to a storage made here: live's second field.
struct WeakStorage {
  PyObject_HEAD
  c10::weak_intrusive_ptr<c10::StorageImpl> ref;
};

void weak_dealloc(PyObject* self) {
  reinterpret_cast<WeakStorage*>(self)->ref.~weak_intrusive_ptr();
  Py_TYPE(self)->tp_free(self);
}

PyObject* weak_expired(PyObject* self, PyObject*) {
  return PyBool_FromLong(reinterpret_cast<WeakStorage*>(self)->ref.expired());
}

PyObject* weak_storage(PyObject* self, PyObject*) {
  auto strong = reinterpret_cast<WeakStorage*>(self)->ref.lock();
  if (!strong) {
    PyErr_SetString(PyExc_RuntimeError, "devkit storage has been released");
    return nullptr;
  }
  return THPStorage_Wrap(c10::Storage(std::move(strong)));
}

PyMethodDef weak_methods[] = {{"expired", weak_expired, METH_NOARGS, nullptr},
                              {"storage", weak_storage, METH_NOARGS, nullptr},
                              {nullptr, nullptr, 0, nullptr}};

// A Python type of this module (PyType_Ready readies it at import).
PyTypeObject python_type(const char* name, Py_ssize_t size, destructor dealloc, PyMethodDef* methods,
                         newfunc make = nullptr) {
  PyTypeObject type{PyVarObject_HEAD_INIT(nullptr, 0)};
  type.tp_name = name;
  type.tp_basicsize = size;
  type.tp_dealloc = dealloc;
  type.tp_flags = Py_TPFLAGS_DEFAULT;
  type.tp_methods = methods;
  type.tp_new = make;
  return type;
}

PyTypeObject WeakStorageType = python_type("devkit_torch.WeakStorage", sizeof(WeakStorage), weak_dealloc, weak_methods);

bool configured() {
  if (memory.live == nullptr) PyErr_SetString(PyExc_RuntimeError, "devkit.torch native memory is not configured");
  return memory.live != nullptr;
}

// configure(live, pools, address_of, pool_nbytes, pool_depth, token_base, token_align)
PyObject* configure(PyObject*, PyObject* args) {
  PyObject *live, *pools, *address_of;
  long long token_base, token_align;
  if (!PyArg_ParseTuple(args, "O!O!OnnLL", &PyDict_Type, &live, &PyDict_Type, &pools, &address_of,
                        &memory.pool_nbytes, &memory.pool_depth, &token_base, &token_align))
    return nullptr;
  if (token_base <= 0 || token_align <= 0) {
    PyErr_SetString(PyExc_ValueError, "configure: token base and alignment must be positive");
    return nullptr;
  }
  Py_INCREF(live);
  Py_INCREF(pools);
  Py_INCREF(address_of);
  Py_XSETREF(memory.live, live);
  Py_XSETREF(memory.pools, pools);
  Py_XSETREF(memory.address_of, address_of);
  if (memory.next_token < token_base) memory.next_token = token_base;
  memory.token_align = token_align;
  Py_RETURN_NONE;
}

// Attribute ``name`` of ``object`` is truthy: -1 on error.
int attribute_true(PyObject* object, PyObject* name) {
  PyObject* value = PyObject_GetAttr(object, name);
  if (value == nullptr) return -1;
  int truth = PyObject_IsTrue(value);
  Py_DECREF(value);
  return truth;
}

// The reuse pool (a list, borrowed) of ``key``, (Device, nbytes), made if new; nullptr on an error.
PyObject* pool_for(PyObject* key) {
  PyObject* pool = PyDict_GetItemWithError(memory.pools, key);
  if (pool != nullptr || PyErr_Occurred()) return pool;
  PyObject* fresh = PyList_New(0);
  if (fresh == nullptr || PyDict_SetItem(memory.pools, key, fresh)) {
    Py_XDECREF(fresh);
    return nullptr;
  }
  Py_DECREF(fresh);  // the dict holds it
  return fresh;
}

// reap(): takes in the storages that died: each allocation goes to its size's reuse pool
// where nothing else can reach its memory (no Array, view, DLPack export or stream work),
// else is dropped. Returns how many were dropped, or -1 with an exception set.
Py_ssize_t reap_dead() {
  std::vector<int64_t> tokens;
  {
    std::lock_guard<std::mutex> guard(dead_lock);
    if (dead.empty()) return 0;
    tokens.swap(dead);
  }
  Py_ssize_t dropped = 0;
  for (size_t taken = 0; taken < tokens.size(); ++taken) {
    PyObject* key = PyLong_FromLongLong(tokens[taken]);
    // On an error, the tokens not taken in yet (from ``first``) wait for the next reap.
    auto fail = [&tokens](size_t first) -> Py_ssize_t {
      std::lock_guard<std::mutex> guard(dead_lock);
      dead.insert(dead.end(), tokens.begin() + first, tokens.end());
      return -1;
    };
    if (key == nullptr) return fail(taken);
    PyObject* entry = PyDict_GetItemWithError(memory.live, key);
    if (entry == nullptr) {
      Py_DECREF(key);
      if (PyErr_Occurred()) return fail(taken);
      continue;
    }
    PyObject* whole = PyTuple_GET_ITEM(entry, 0);
    Py_INCREF(whole);
    int failed = PyDict_DelItem(memory.live, key);  // the entry and its WeakStorage go
    Py_DECREF(key);
    if (failed) {
      Py_DECREF(whole);
      return fail(taken + 1);
    }
    PyObject* allocation = PyObject_GetAttr(whole, s_allocation);
    bool pooled = false;
    if (allocation != nullptr) {
      PyObject* nbytes = PyObject_GetAttr(allocation, s_nbytes);
      Py_ssize_t size = nbytes ? PyLong_AsSsize_t(nbytes) : -1;
      // Only we hold the Buffer, and only it (and we) the allocation.
      if (size >= 0 && size <= memory.pool_nbytes && Py_REFCNT(whole) == 1 && Py_REFCNT(allocation) == 2 &&
          attribute_true(allocation, s_used_on_streams) == 0 && attribute_true(allocation, s_holds) == 0) {
        PyObject* handle = PyObject_GetAttr(allocation, s_handle);
        PyObject* device = PyObject_GetAttr(allocation, s_device);
        if (handle != nullptr && handle != Py_None && device != nullptr) {
          PyObject* pool_key = PyTuple_Pack(2, device, nbytes);
          PyObject* pool = pool_key ? pool_for(pool_key) : nullptr;
          if (pool != nullptr && PyList_GET_SIZE(pool) < memory.pool_depth) pooled = PyList_Append(pool, whole) == 0;
          Py_XDECREF(pool_key);
        }
        Py_XDECREF(handle);
        Py_XDECREF(device);
      }
      Py_XDECREF(nbytes);
      Py_DECREF(allocation);
    }
    Py_DECREF(whole);
    if (PyErr_Occurred()) return fail(taken + 1);
    if (!pooled) ++dropped;
  }
  return dropped;
}

PyObject* reap(PyObject*, PyObject*) {
  if (!configured()) return nullptr;
  Py_ssize_t dropped = reap_dead();
  return dropped < 0 ? nullptr : PyLong_FromSsize_t(dropped);
}

// The device handle of a devkit _Allocation, or nullptr with an exception set.
void* handle_of(PyObject* allocation) {
  PyObject* address = PyObject_GetAttr(allocation, s_handle_address);  // set by address_of, kept while pooled
  if (address == nullptr) {
    PyErr_Clear();
    address = PyObject_CallOneArg(memory.address_of, allocation);
    if (address == nullptr) return nullptr;
  }
  void* handle = PyLong_AsVoidPtr(address);
  Py_DECREF(address);
  if (handle == nullptr && !PyErr_Occurred()) PyErr_SetString(PyExc_ValueError, "devkit allocation has a null handle");
  return handle;
}

// The storage of ``whole`` (a whole devkit allocation's Buffer, which no live
// storage has) on devkit:``index``, registered in live; nullptr with an exception set.
c10::intrusive_ptr<c10::StorageImpl> make_storage(PyObject* whole, c10::DeviceIndex index) {
  if (reap_dead() < 0) return {};
  PyObject* allocation = PyObject_GetAttr(whole, s_allocation);
  if (allocation == nullptr) return {};
  c10::intrusive_ptr<c10::StorageImpl> made;
  PyObject *nbytes = nullptr, *token = nullptr, *weak = nullptr, *entry = nullptr;
  long long size = -1;
  void* handle = nullptr;
  nbytes = PyObject_GetAttr(allocation, s_nbytes);
  if (nbytes == nullptr || (size = PyLong_AsLongLong(nbytes)) < 0) goto done;
  if ((handle = handle_of(allocation)) == nullptr) goto done;
  token = PyObject_GetAttr(allocation, s_torch_token);  // a pooled allocation keeps its token
  if (token == nullptr) PyErr_Clear();
  if (token != nullptr && token != Py_None) {
    int used = PyDict_Contains(memory.live, token);
    if (used < 0) goto done;
    if (used) Py_CLEAR(token);
  } else {
    Py_CLEAR(token);
  }
  if (token == nullptr) {
    token = PyLong_FromLongLong(memory.next_token);
    if (token == nullptr || PyObject_SetAttr(allocation, s_torch_token, token)) goto done;
    memory.next_token += (size / memory.token_align + 2) * memory.token_align;
  }
  try {
    auto* context = new StorageContext{PyLong_AsLongLong(token), handle, allocation};
    void* data = reinterpret_cast<void*>(context->token);
    c10::Device device(c10::DeviceType::PrivateUse1, index);
    made = c10::make_intrusive<c10::StorageImpl>(c10::StorageImpl::use_byte_size_t(), size,
                                                 c10::DataPtr(data, context, &storage_died, device), nullptr, false);
  } catch (const std::exception& error) {
    PyErr_SetString(PyExc_RuntimeError, error.what());
    goto done;
  }
  weak = WeakStorageType.tp_alloc(&WeakStorageType, 0);
  if (weak == nullptr) goto done;
  new (&reinterpret_cast<WeakStorage*>(weak)->ref) c10::weak_intrusive_ptr<c10::StorageImpl>(made);
  entry = PyTuple_Pack(2, whole, weak);
  if (entry == nullptr || PyDict_SetItem(memory.live, token, entry)) made.reset();
done:
  if (PyErr_Occurred()) made.reset();
  Py_XDECREF(entry);
  Py_XDECREF(weak);
  Py_XDECREF(token);
  Py_XDECREF(nbytes);
  Py_DECREF(allocation);
  return made;
}

// new_storage(whole, device_index): the torch.UntypedStorage of ``whole``, a whole devkit
// allocation's Buffer no live storage has; its data pointer is a token naming the allocation.
PyObject* new_storage(PyObject*, PyObject* args) {
  PyObject* whole;
  int index;
  if (!PyArg_ParseTuple(args, "Oi", &whole, &index)) return nullptr;
  if (index < 0 || index > 127) return PyErr_Format(PyExc_ValueError, "new_storage: bad device index %d", index);
  if (!configured()) return nullptr;
  auto made = make_storage(whole, static_cast<c10::DeviceIndex>(index));
  return made ? THPStorage_Wrap(c10::Storage(std::move(made))) : nullptr;
}

bool read_ints(PyObject* values, const char* what, c10::SmallVector<int64_t, 8>& out) {
  PyObject* fast = PySequence_Fast(values, what);
  if (fast == nullptr) return false;
  Py_ssize_t n = PySequence_Fast_GET_SIZE(fast);
  out.resize(n);
  for (Py_ssize_t i = 0; i < n; ++i) {
    out[i] = PyLong_AsLongLong(PySequence_Fast_GET_ITEM(fast, i));
    if (out[i] == -1 && PyErr_Occurred()) {
      Py_DECREF(fast);
      return false;
    }
  }
  Py_DECREF(fast);
  return true;
}

// tensor(storage, dtype, shape, strides, storage_offset): a new tensor on
// ``storage``, a devkit (PrivateUse1) torch.UntypedStorage, with that geometry.
// The caller has checked that the geometry lies inside the storage.
PyObject* tensor(PyObject*, PyObject* const* args, Py_ssize_t nargs) {
  if (nargs != 5 || !THPDtype_Check(args[1])) {
    PyErr_SetString(PyExc_TypeError, "tensor(storage: torch.UntypedStorage, dtype: torch.dtype, shape, strides, "
                                     "storage_offset: int)");
    return nullptr;
  }
  c10::SmallVector<int64_t, 8> shape, strides;
  if (!read_ints(args[2], "shape must be a sequence of ints", shape) ||
      !read_ints(args[3], "strides must be a sequence of ints", strides))
    return nullptr;
  if (shape.size() != strides.size()) {
    PyErr_Format(PyExc_ValueError, "shape has %zd dimensions, strides %zd", (Py_ssize_t)shape.size(),
                 (Py_ssize_t)strides.size());
    return nullptr;
  }
  long long storage_offset = PyLong_AsLongLong(args[4]);
  if (storage_offset == -1 && PyErr_Occurred()) return nullptr;
  try {
    c10::Storage storage = torch::createStorage(args[0]);
    if (storage.device_type() != c10::DeviceType::PrivateUse1) {
      PyErr_SetString(PyExc_ValueError, "storage is not on a devkit device");
      return nullptr;
    }
    auto impl = c10::make_intrusive<c10::TensorImpl>(
        std::move(storage), c10::DispatchKeySet(c10::DispatchKey::PrivateUse1),
        caffe2::TypeMeta::fromScalarType(reinterpret_cast<THPDtype*>(args[1])->scalar_type));
    impl->set_sizes_and_strides(shape, strides, storage_offset);
    return THPVariable_Wrap(at::TensorBase(std::move(impl)));
  } catch (const std::exception& error) {
    PyErr_SetString(PyExc_TypeError, error.what());
    return nullptr;
  }
}

// ---- The eager replay (devkit/torch/_replay.py records the templates) ----

// torch's THPVariable begins so (torch/csrc/autograd/python_variable.h, which brings pybind11).
struct VariableObject {
  PyObject_HEAD
  at::TensorBase cdata;
};

// The tensor of a torch.Tensor or nn.Parameter (not a subclass), else nullptr.
const at::TensorBase* tensor_of(PyObject* object) {
  PyTypeObject* type = Py_TYPE(object);
  if (type != reinterpret_cast<PyTypeObject*>(THPVariableClass) && type != reinterpret_cast<PyTypeObject*>(ParameterClass))
    return nullptr;
  return &reinterpret_cast<VariableObject*>(object)->cdata;
}

template <typename T>
void append(std::string& key, T value) {
  key.append(reinterpret_cast<const char*>(&value), sizeof(value));
}

struct Place {
  void* handle;
  uint64_t byte_offset;
};

struct Input {
  char* slot;  // a DK_Tensor of the call
  size_t source;
  int64_t delta;
};

struct Output {
  char* slot;
  PyObject* pool_key;  // (Device, nbytes): its reuse pool
  PyObject* device;
  Py_ssize_t nbytes;
  c10::DeviceIndex index;
};

// A kernel launch, or (copy_d2d set) an in-place op's write: the contiguous copy of an
// earlier call's output into an argument.
struct Step {
  int32_t (*fn)(const void*) = nullptr;
  const void* call = nullptr;  // its DK_KernelCall
  std::vector<Input> inputs;
  std::vector<Output> outputs;
  int32_t (*copy_d2d)(int32_t, void*, size_t, void*, size_t, size_t, void*) = nullptr;
  int32_t device = 0;
  size_t source = 0, destination = 0, nbytes = 0;
};

struct Geometry {
  c10::SmallVector<int64_t, 8> shape, strides;
  int64_t offset;  // a result's storage offset; a view's, from its base's
};

struct Result {
  Py_ssize_t source;  // -1: None
  bool argument;      // an argument returned as it is
  c10::ScalarType dtype;
  Geometry geometry;
};

struct Template {
  PyObject* owner = nullptr;  // the Python template: keeps the calls alive, raises a failed launch's error
  PyObject* result_type = nullptr;
  bool views = false, single = true;
  std::vector<Step> steps;
  std::vector<size_t> scratch;  // calls' outputs no result keeps
  std::vector<Result> results;
  std::vector<Geometry> view_geometries;
  ~Template() {
    Py_XDECREF(owner);
    Py_XDECREF(result_type);
    for (auto& step : steps)
      for (auto& output : step.outputs) {
        Py_DECREF(output.pool_key);
        Py_DECREF(output.device);
      }
  }
};

struct Replayer {
  PyObject_HEAD
  std::unordered_map<std::string, std::shared_ptr<Template>>* templates;
  std::string* key;  // the last call's
  Py_ssize_t data_offset, byte_offset_offset;  // of DK_Tensor's data and byte_offset
  int32_t ok, not_ready;
};

// Appends a stand-in for ``value`` to the key (its tensors to ``tensors``); false where
// the native key does not cover it (the Python key may).
using Tensors = c10::SmallVector<PyObject*, 8>;  // a call's devkit tensors, borrowed from its arguments

bool describe(PyObject* value, std::string& key, Tensors& tensors, bool in_list) {
  if (const at::TensorBase* tensor = in_list ? nullptr : tensor_of(value)) {
    c10::TensorImpl* impl = tensor->unsafeGetTensorImpl();
    if (impl->device_type() != c10::DeviceType::PrivateUse1) return false;
    tensors.push_back(value);
    key.push_back('T');
    append(key, impl->device().index());
    append(key, static_cast<int8_t>(impl->dtype().toScalarType()));
    append(key, static_cast<int32_t>(impl->dim()));
    for (int64_t size : impl->sizes()) append(key, size);
    for (int64_t stride : impl->strides()) append(key, stride);
    return true;
  }
  if (value == Py_None) {
    key.push_back('n');
  } else if (PyBool_Check(value)) {
    key.push_back(value == Py_True ? 'B' : 'b');
  } else if (PyLong_CheckExact(value)) {
    int overflow = 0;
    long long number = PyLong_AsLongLongAndOverflow(value, &overflow);
    if (overflow) return false;
    key.push_back('i');
    append(key, number);
  } else if (PyFloat_CheckExact(value)) {
    key.push_back('f');
    append(key, PyFloat_AS_DOUBLE(value));
  } else if (!in_list && THPDtype_Check(value)) {
    key.push_back('d');
    append(key, static_cast<int8_t>(reinterpret_cast<THPDtype*>(value)->scalar_type));
  } else if (!in_list && (PyList_CheckExact(value) || PyTuple_CheckExact(value))) {
    key.push_back(PyList_CheckExact(value) ? 'L' : 'U');
    Py_ssize_t n = PySequence_Fast_GET_SIZE(value);
    append(key, static_cast<int64_t>(n));
    PyObject** items = PySequence_Fast_ITEMS(value);
    for (Py_ssize_t i = 0; i < n; ++i)
      if (!describe(items[i], key, tensors, true)) return false;
  } else {
    return false;
  }
  return true;
}

PyObject* replayer_new(PyTypeObject* type, PyObject* args, PyObject*) {
  Py_ssize_t data_offset, byte_offset_offset;
  int ok, not_ready;
  if (!PyArg_ParseTuple(args, "nnii", &data_offset, &byte_offset_offset, &ok, &not_ready)) return nullptr;
  auto* self = reinterpret_cast<Replayer*>(type->tp_alloc(type, 0));
  if (self == nullptr) return nullptr;
  self->templates = new std::unordered_map<std::string, std::shared_ptr<Template>>;
  self->key = new std::string;
  self->data_offset = data_offset;
  self->byte_offset_offset = byte_offset_offset;
  self->ok = ok;
  self->not_ready = not_ready;
  return reinterpret_cast<PyObject*>(self);
}

void replayer_dealloc(PyObject* object) {
  auto* self = reinterpret_cast<Replayer*>(object);
  delete self->templates;
  delete self->key;
  Py_TYPE(object)->tp_free(object);
}

// A new tensor on ``storage`` with that geometry, as a Python object.
PyObject* make_tensor(c10::Storage storage, caffe2::TypeMeta dtype, const Geometry& geometry, int64_t offset) {
  try {
    auto impl = c10::make_intrusive<c10::TensorImpl>(std::move(storage),
                                                     c10::DispatchKeySet(c10::DispatchKey::PrivateUse1), dtype);
    impl->set_sizes_and_strides(geometry.shape, geometry.strides, offset);
    return THPVariable_Wrap(at::TensorBase(std::move(impl)));
  } catch (const std::exception& error) {
    PyErr_SetString(PyExc_RuntimeError, error.what());
    return nullptr;
  }
}

PyObject* run_views(const Template& recorded, PyObject* base_object) {
  const at::TensorBase& base = *tensor_of(base_object);
  const int count = static_cast<int>(recorded.view_geometries.size());
  PyObject* results = recorded.single ? nullptr : PyTuple_New(count);
  if (!recorded.single && results == nullptr) return nullptr;
  for (int i = 0; i < count; ++i) {
    const Geometry& geometry = recorded.view_geometries[i];
    PyObject* view = make_tensor(base.storage(), base.dtype(), geometry, base.storage_offset() + geometry.offset);
    if (recorded.single || view == nullptr) {
      Py_XDECREF(results);
      return view;
    }
    PyTuple_SET_ITEM(results, i, view);
  }
  return results;
}

// A whole allocation of ``output.nbytes`` for a call's output: one whose storages died, else a new one.
PyObject* new_buffer(const Output& output) {
  PyObject* pool = PyDict_GetItemWithError(memory.pools, output.pool_key);
  if (pool != nullptr && PyList_GET_SIZE(pool) > 0) {
    Py_ssize_t last = PyList_GET_SIZE(pool) - 1;
    PyObject* buffer = PyList_GET_ITEM(pool, last);
    Py_INCREF(buffer);
    if (PyList_SetSlice(pool, last, last + 1, nullptr)) {
      Py_DECREF(buffer);
      return nullptr;
    }
    return buffer;
  }
  if (PyErr_Occurred()) return nullptr;
  PyObject* nbytes = PyLong_FromSsize_t(output.nbytes);
  if (nbytes == nullptr) return nullptr;
  PyObject* buffer = PyObject_CallMethodOneArg(output.device, s_alloc, nbytes);
  Py_DECREF(nbytes);
  return buffer;
}

// Pools a scratch output only the replay held.
int give_back(PyObject* buffer, const Output& output) {
  if (output.nbytes > memory.pool_nbytes || Py_REFCNT(buffer) != 1) return 0;
  PyObject* pool = pool_for(output.pool_key);
  if (pool == nullptr) return -1;
  return PyList_GET_SIZE(pool) < memory.pool_depth ? PyList_Append(pool, buffer) : 0;
}

// The plugin's error for step ``index``, which returned ``status``: the Python template raises it.
// Called before anything else can call into the plugin on this thread (dropping the outputs may
// free memory through it), as the ABI requires of reading the message.
PyObject* failed(const Template& recorded, size_t index, int32_t status) {
  PyObject* raised = PyObject_CallMethod(recorded.owner, "failed", "ni", static_cast<Py_ssize_t>(index), status);
  Py_XDECREF(raised);
  if (!PyErr_Occurred()) PyErr_Format(PyExc_RuntimeError, "devkit step %zu failed with status %d", index, status);
  return nullptr;
}

// Python code may run while outputs are allocated (a new allocation, a finalizer), and
// may replay this template: each step's slots are patched only once its outputs exist,
// right before its launch.
PyObject* run_calls(Replayer* self, const Template& recorded, const Tensors& tensors) {
  c10::SmallVector<Place, 8> places;
  for (PyObject* object : tensors) {
    c10::TensorImpl* impl = tensor_of(object)->unsafeGetTensorImpl();
    const c10::DataPtr& data = impl->storage().data_ptr();
    if (data.get_deleter() != &storage_died) Py_RETURN_NONE;  // not made here: the Python path knows it
    auto* context = static_cast<StorageContext*>(data.get_context());
    PyObject* handle = PyObject_GetAttr(context->allocation, s_handle);
    if (handle == nullptr) return nullptr;
    Py_DECREF(handle);
    if (handle == Py_None) Py_RETURN_NONE;  // freed: the Python path raises
    places.push_back({context->handle, static_cast<uint64_t>(impl->storage_offset() * impl->itemsize())});
  }
  c10::SmallVector<PyObject*, 4> buffers;  // owned: every call's outputs
  c10::SmallVector<const Output*, 4> outputs;
  auto release = [&buffers] {
    for (PyObject* buffer : buffers) Py_DECREF(buffer);
  };
  for (size_t index = 0; index < recorded.steps.size(); ++index) {
    const Step& step = recorded.steps[index];
    int32_t status;
    if (step.copy_d2d != nullptr) {  // places hold whole allocations' handles: the byte offsets are absolute
      const Place &to = places[step.destination], &from = places[step.source];
      Py_BEGIN_ALLOW_THREADS
      status = step.copy_d2d(step.device, to.handle, to.byte_offset, from.handle, 0, step.nbytes, nullptr);
      Py_END_ALLOW_THREADS
      if (status != self->ok && status != self->not_ready) {
        PyObject* error = failed(recorded, index, status);
        release();
        return error;
      }
      continue;
    }
    const size_t first_output = places.size();
    for (const Output& output : step.outputs) {
      PyObject* buffer = new_buffer(output);
      PyObject* allocation = buffer ? PyObject_GetAttr(buffer, s_allocation) : nullptr;
      void* handle = allocation ? handle_of(allocation) : nullptr;
      Py_XDECREF(allocation);
      if (buffer != nullptr) buffers.push_back(buffer);
      if (handle == nullptr) {
        release();
        return nullptr;
      }
      outputs.push_back(&output);
      places.push_back({handle, 0});
    }
    for (const Input& input : step.inputs) {
      const Place& place = places[input.source];
      *reinterpret_cast<void**>(input.slot + self->data_offset) = place.handle;
      *reinterpret_cast<uint64_t*>(input.slot + self->byte_offset_offset) = place.byte_offset + input.delta;
    }
    for (size_t i = 0; i < step.outputs.size(); ++i)  // their byte offsets stay 0
      *reinterpret_cast<void**>(step.outputs[i].slot + self->data_offset) = places[first_output + i].handle;
    Py_BEGIN_ALLOW_THREADS
    status = step.fn(step.call);
    Py_END_ALLOW_THREADS
    if (status != self->ok && status != self->not_ready) {
      PyObject* error = failed(recorded, index, status);
      release();
      return error;
    }
  }
  for (size_t index : recorded.scratch)  // later work on the device's queue runs after these calls
    if (give_back(buffers[index], *outputs[index])) {
      release();
      return nullptr;
    }
  const size_t argument_count = tensors.size();
  const int count = static_cast<int>(recorded.results.size());
  PyObject* results = recorded.single ? nullptr : PyList_New(count);
  if (!recorded.single && results == nullptr) {
    release();
    return nullptr;
  }
  for (int i = 0; i < count; ++i) {
    const Result& result = recorded.results[i];
    PyObject* value;
    if (result.source < 0) {
      value = Py_NewRef(Py_None);
    } else if (result.argument) {
      value = Py_NewRef(tensors[result.source]);
    } else {
      size_t output = result.source - argument_count;
      auto storage = make_storage(buffers[output], outputs[output]->index);
      value = storage ? make_tensor(c10::Storage(std::move(storage)), caffe2::TypeMeta::fromScalarType(result.dtype),
                                    result.geometry, result.geometry.offset)
                      : nullptr;
    }
    if (recorded.single || value == nullptr) {
      release();
      Py_XDECREF(results);
      return value;
    }
    PyList_SET_ITEM(results, i, value);
  }
  release();
  if (recorded.result_type == reinterpret_cast<PyObject*>(&PyList_Type)) return results;
  PyObject* typed = recorded.result_type == reinterpret_cast<PyObject*>(&PyTuple_Type)
                        ? PyList_AsTuple(results)
                        : PyObject_CallOneArg(recorded.result_type, results);
  Py_DECREF(results);
  return typed;
}

// replay(op, args, kwargs): the op's result replayed from its template; None where the
// native path cannot (the Python path then runs); on a miss, the key (bytes) for add().
PyObject* replayer_replay(PyObject* object, PyObject* const* args, Py_ssize_t nargs) {
  auto* self = reinterpret_cast<Replayer*>(object);
  if (nargs != 3 || !PyTuple_Check(args[1]) || !PyDict_Check(args[2])) {
    PyErr_SetString(PyExc_TypeError, "replay(op, args: tuple, kwargs: dict)");
    return nullptr;
  }
  if (!configured()) return nullptr;
  std::string& key = *self->key;
  Tensors tensors;
  key.clear();
  append(key, args[0]);  // an OpOverload lives as long as torch
  PyObject* positional = args[1];
  for (Py_ssize_t i = 0; i < PyTuple_GET_SIZE(positional); ++i)
    if (!describe(PyTuple_GET_ITEM(positional, i), key, tensors, false)) Py_RETURN_NONE;
  PyObject *name, *value;
  Py_ssize_t position = 0;
  while (PyDict_Next(args[2], &position, &name, &value)) {
    Py_ssize_t length;
    const char* text = PyUnicode_AsUTF8AndSize(name, &length);
    if (text == nullptr) return nullptr;
    key.push_back('k');
    key.append(text, length + 1);
    if (!describe(value, key, tensors, false)) Py_RETURN_NONE;
  }
  auto found = self->templates->find(key);
  if (found == self->templates->end()) return PyBytes_FromStringAndSize(key.data(), key.size());
  std::shared_ptr<Template> recorded = found->second;  // kept should Python code clear the templates meanwhile
  if (recorded->owner == nullptr) Py_RETURN_NONE;  // the Python template runs
  return recorded->views ? run_views(*recorded, tensors[0]) : run_calls(self, *recorded, tensors);
}

bool read_geometry(PyObject* shape, PyObject* strides, long long offset, Geometry& geometry) {
  if (!read_ints(shape, "shape must be a sequence of ints", geometry.shape) ||
      !read_ints(strides, "strides must be a sequence of ints", geometry.strides))
    return false;
  geometry.offset = offset;
  return true;
}

// Reads add()'s spec of a template of calls: (owner, steps, scratch, results, single, result_type).
bool read_calls(PyObject* spec, Template& recorded) {
  const char* kind;
  PyObject *owner, *steps, *scratch, *results, *result_type;
  int single;
  if (!PyArg_ParseTuple(spec, "sOO!O!O!pO", &kind, &owner, &PyList_Type, &steps, &PyList_Type, &scratch,
                        &PyList_Type, &results, &single, &result_type))
    return false;
  recorded.owner = Py_NewRef(owner);
  recorded.result_type = Py_NewRef(result_type);
  recorded.single = single;
  for (Py_ssize_t i = 0; i < PyList_GET_SIZE(steps); ++i) {
    PyObject* item = PyList_GET_ITEM(steps, i);
    Py_ssize_t fn, call, source, destination, nbytes;
    int device;
    PyObject *inputs, *outputs;
    if (PyTuple_Check(item) && PyTuple_GET_SIZE(item) == 5) {  // (copy_d2d, device, source, destination, nbytes)
      if (!PyArg_ParseTuple(item, "ninnn", &fn, &device, &source, &destination, &nbytes)) return false;
      Step& step = recorded.steps.emplace_back();
      step.copy_d2d = reinterpret_cast<int32_t (*)(int32_t, void*, size_t, void*, size_t, size_t, void*)>(fn);
      step.device = device;
      step.source = source;
      step.destination = destination;
      step.nbytes = nbytes;
      continue;
    }
    if (!PyArg_ParseTuple(item, "nnO!O!", &fn, &call, &PyList_Type, &inputs, &PyList_Type, &outputs)) return false;
    Step& step = recorded.steps.emplace_back();
    step.fn = reinterpret_cast<int32_t (*)(const void*)>(fn);
    step.call = reinterpret_cast<const void*>(call);
    for (Py_ssize_t j = 0; j < PyList_GET_SIZE(inputs); ++j) {
      Py_ssize_t slot, source;
      long long delta;
      if (!PyArg_ParseTuple(PyList_GET_ITEM(inputs, j), "nnL", &slot, &source, &delta)) return false;
      step.inputs.push_back({reinterpret_cast<char*>(slot), static_cast<size_t>(source), delta});
    }
    for (Py_ssize_t j = 0; j < PyList_GET_SIZE(outputs); ++j) {
      Py_ssize_t slot, nbytes;
      PyObject *pool_key, *device;
      int index;
      if (!PyArg_ParseTuple(PyList_GET_ITEM(outputs, j), "nO!Oni", &slot, &PyTuple_Type, &pool_key, &device, &nbytes,
                            &index))
        return false;
      step.outputs.push_back({reinterpret_cast<char*>(slot), Py_NewRef(pool_key), Py_NewRef(device), nbytes,
                              static_cast<c10::DeviceIndex>(index)});
    }
  }
  for (Py_ssize_t i = 0; i < PyList_GET_SIZE(scratch); ++i) {
    Py_ssize_t index = PyLong_AsSsize_t(PyList_GET_ITEM(scratch, i));
    if (index < 0) return false;
    recorded.scratch.push_back(static_cast<size_t>(index));
  }
  for (Py_ssize_t i = 0; i < PyList_GET_SIZE(results); ++i) {
    PyObject* item = PyList_GET_ITEM(results, i);
    Result& result = recorded.results.emplace_back();
    result.source = -1;
    if (item == Py_None) continue;
    PyObject *dtype = Py_None, *shape = nullptr, *strides = nullptr;
    long long offset = 0;
    if (!PyArg_ParseTuple(item, "n|OOOL", &result.source, &dtype, &shape, &strides, &offset)) return false;
    result.argument = dtype == Py_None;
    if (!result.argument) {
      if (!THPDtype_Check(dtype) || shape == nullptr || strides == nullptr) {
        PyErr_SetString(PyExc_TypeError, "a result is (source,) or (source, dtype, shape, strides, storage_offset)");
        return false;
      }
      result.dtype = reinterpret_cast<THPDtype*>(dtype)->scalar_type;
      if (!read_geometry(shape, strides, offset, result.geometry)) return false;
    }
  }
  return true;
}

// Reads add()'s spec of a view template: (owner, views, single), each view (shape, strides, offset delta).
bool read_views(PyObject* spec, Template& recorded) {
  const char* kind;
  PyObject *owner, *views;
  int single;
  if (!PyArg_ParseTuple(spec, "sOO!p", &kind, &owner, &PyList_Type, &views, &single)) return false;
  recorded.owner = Py_NewRef(owner);
  recorded.views = true;
  recorded.single = single;
  for (Py_ssize_t i = 0; i < PyList_GET_SIZE(views); ++i) {
    PyObject *shape, *strides;
    long long delta;
    if (!PyArg_ParseTuple(PyList_GET_ITEM(views, i), "OOL", &shape, &strides, &delta) ||
        !read_geometry(shape, strides, delta, recorded.view_geometries.emplace_back()))
      return false;
  }
  return true;
}

// add(key, spec): the template replay() runs for ``key``; spec None: the Python template runs.
PyObject* replayer_add(PyObject* object, PyObject* args) {
  auto* self = reinterpret_cast<Replayer*>(object);
  PyObject *key, *spec;
  if (!PyArg_ParseTuple(args, "O!O", &PyBytes_Type, &key, &spec)) return nullptr;
  auto recorded = std::make_shared<Template>();
  if (spec != Py_None) {
    const char* kind = PyTuple_Check(spec) && PyTuple_GET_SIZE(spec) > 0 ? PyUnicode_AsUTF8(PyTuple_GET_ITEM(spec, 0))
                                                                          : nullptr;
    bool read = kind != nullptr && (std::string(kind) == "views" ? read_views(spec, *recorded)
                                                                  : std::string(kind) == "calls" && read_calls(spec, *recorded));
    if (!read) {
      if (!PyErr_Occurred()) PyErr_SetString(PyExc_TypeError, "add: spec is ('calls', ...), ('views', ...) or None");
      return nullptr;
    }
  }
  (*self->templates)[std::string(PyBytes_AS_STRING(key), PyBytes_GET_SIZE(key))] = std::move(recorded);
  Py_RETURN_NONE;
}

PyObject* replayer_clear(PyObject* object, PyObject*) {
  reinterpret_cast<Replayer*>(object)->templates->clear();
  Py_RETURN_NONE;
}

PyObject* replayer_len(PyObject* object, PyObject*) {
  return PyLong_FromSize_t(reinterpret_cast<Replayer*>(object)->templates->size());
}

PyMethodDef replayer_methods[] = {
    {"replay", reinterpret_cast<PyCFunction>(reinterpret_cast<void (*)(void)>(replayer_replay)), METH_FASTCALL, nullptr},
    {"add", replayer_add, METH_VARARGS, nullptr},
    {"clear", replayer_clear, METH_NOARGS, nullptr},
    {"size", replayer_len, METH_NOARGS, nullptr},
    {nullptr, nullptr, 0, nullptr}};

PyTypeObject ReplayerType =
    python_type("devkit_torch.Replayer", sizeof(Replayer), replayer_dealloc, replayer_methods, replayer_new);

PyMethodDef methods[] = {
    {"configure", configure, METH_VARARGS, nullptr},
    {"new_storage", new_storage, METH_VARARGS, nullptr},
    {"reap", reap, METH_NOARGS, nullptr},
    {"tensor", reinterpret_cast<PyCFunction>(reinterpret_cast<void (*)(void)>(tensor)), METH_FASTCALL, nullptr},
    {nullptr, nullptr, 0, nullptr}};

#define STRINGIFY_(x) #x
#define STRINGIFY(x) STRINGIFY_(x)
PyModuleDef module = {PyModuleDef_HEAD_INIT, STRINGIFY(TORCH_EXTENSION_NAME), nullptr, -1, methods};

}  // namespace

// torch.utils.cpp_extension names the module (TORCH_EXTENSION_NAME, versioned on a source change).
#define MODULE_INIT_(name) PyInit_##name
#define MODULE_INIT(name) MODULE_INIT_(name)
PyMODINIT_FUNC MODULE_INIT(TORCH_EXTENSION_NAME)() {
  if (PyType_Ready(&WeakStorageType) || PyType_Ready(&ReplayerType)) return nullptr;
  for (auto [name, text] : {std::pair{&s_allocation, "_allocation"}, {&s_nbytes, "nbytes"}, {&s_device, "device"},
                            {&s_handle, "handle"}, {&s_torch_token, "torch_token"}, {&s_used_on_streams, "used_on_streams"},
                            {&s_holds, "_holds"}, {&s_handle_address, "handle_address"}, {&s_alloc, "alloc"}})
    if ((*name = PyUnicode_InternFromString(text)) == nullptr) return nullptr;
  PyObject* made = PyModule_Create(&module);
  if (made != nullptr && PyModule_AddObjectRef(made, "Replayer", reinterpret_cast<PyObject*>(&ReplayerType))) {
    Py_DECREF(made);
    return nullptr;
  }
  return made;
}
