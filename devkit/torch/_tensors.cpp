// devkit.torch's native piece: devkit torch storages and tensors made in one call.
//
// From Python a tensor of a given storage and geometry costs an empty tensor
// and a set_ through the dispatcher (about 5 us, most of an eager op's
// budget); here it is one TensorImpl. A storage made here says when it dies
// (its token joins the list take_dead() hands out), so devkit.torch reuses
// its allocation without scanning for dead storages. Built at first use by
// torch.utils.cpp_extension (devkit/torch/_native.py), which caches it on disk.
// It includes c10 and ATen's TensorBase only, to compile in seconds.

#include <Python.h>

#include <ATen/core/TensorBase.h>
#include <c10/core/Storage.h>
#include <c10/core/TensorImpl.h>
#include <c10/util/SmallVector.h>
#include <torch/csrc/Dtype.h>
#include <torch/csrc/Export.h>

#include <mutex>
#include <vector>

// Declared by torch/csrc/autograd/python_variable.h and torch/csrc/DynamicTypes.h,
// which bring pybind11 and all of ATen's Tensor: four times this file's compile time.
TORCH_PYTHON_API PyObject* THPVariable_Wrap(at::TensorBase&& var);
TORCH_PYTHON_API PyObject* THPStorage_Wrap(c10::Storage storage);
namespace torch {
TORCH_PYTHON_API at::Storage createStorage(PyObject* obj);
}

namespace {

// Tokens of the storages made by storage() that have died since the last take_dead().
// A storage dies in whichever thread drops it last, with or without the GIL, and
// may die during the process's exit, after static objects are destroyed: these
// two are never destroyed.
std::mutex& dead_lock = *new std::mutex;
std::vector<int64_t>& dead = *new std::vector<int64_t>;

void storage_died(void* token) {
  std::lock_guard<std::mutex> guard(dead_lock);
  dead.push_back(reinterpret_cast<int64_t>(token));
}

// storage(token, nbytes, device_index): a devkit torch.UntypedStorage whose data
// pointer is ``token`` (it names a devkit allocation; no host memory behind it).
PyObject* storage(PyObject*, PyObject* const* args, Py_ssize_t nargs) {
  if (nargs != 3) {
    PyErr_SetString(PyExc_TypeError, "storage(token: int, nbytes: int, device_index: int)");
    return nullptr;
  }
  long long token = PyLong_AsLongLong(args[0]);
  long long nbytes = PyLong_AsLongLong(args[1]);
  long index = PyLong_AsLong(args[2]);
  if (PyErr_Occurred()) return nullptr;
  if (token <= 0 || nbytes < 0 || index < 0 || index > 127) {
    PyErr_Format(PyExc_ValueError, "storage: bad token %lld, nbytes %lld or device index %ld", token, nbytes, index);
    return nullptr;
  }
  try {
    void* data = reinterpret_cast<void*>(token);
    c10::Device device(c10::DeviceType::PrivateUse1, static_cast<c10::DeviceIndex>(index));
    return THPStorage_Wrap(c10::Storage(c10::Storage::use_byte_size_t(), nbytes,
                                        c10::DataPtr(data, data, &storage_died, device), nullptr, false));
  } catch (const std::exception& error) {
    PyErr_SetString(PyExc_RuntimeError, error.what());
    return nullptr;
  }
}

// take_dead(): the tokens of storage()'s storages that died since the last call, or None.
PyObject* take_dead(PyObject*, PyObject*) {
  std::vector<int64_t> taken;
  {
    std::lock_guard<std::mutex> guard(dead_lock);
    if (dead.empty()) Py_RETURN_NONE;
    taken.swap(dead);
  }
  PyObject* tokens = PyList_New(static_cast<Py_ssize_t>(taken.size()));
  if (tokens == nullptr) return nullptr;
  for (size_t i = 0; i < taken.size(); ++i) {
    PyObject* token = PyLong_FromLongLong(taken[i]);
    if (token == nullptr) {
      Py_DECREF(tokens);
      return nullptr;
    }
    PyList_SET_ITEM(tokens, static_cast<Py_ssize_t>(i), token);
  }
  return tokens;
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

PyMethodDef methods[] = {
    {"storage", reinterpret_cast<PyCFunction>(reinterpret_cast<void (*)(void)>(storage)), METH_FASTCALL, nullptr},
    {"take_dead", take_dead, METH_NOARGS, nullptr},
    {"tensor", reinterpret_cast<PyCFunction>(reinterpret_cast<void (*)(void)>(tensor)), METH_FASTCALL, nullptr},
    {nullptr, nullptr, 0, nullptr}};

#define STRINGIFY_(x) #x
#define STRINGIFY(x) STRINGIFY_(x)
PyModuleDef module = {PyModuleDef_HEAD_INIT, STRINGIFY(TORCH_EXTENSION_NAME), nullptr, -1, methods};

}  // namespace

// torch.utils.cpp_extension names the module (TORCH_EXTENSION_NAME, versioned on a source change).
#define MODULE_INIT_(name) PyInit_##name
#define MODULE_INIT(name) MODULE_INIT_(name)
PyMODINIT_FUNC MODULE_INIT(TORCH_EXTENSION_NAME)() { return PyModule_Create(&module); }
