"""Tensors of devkit:1, devkit:2, ... from Python.

torch's Python backend route makes empty tensors on ``devkit:0`` only
(``torch._C._acc.create_empty_tensor``), and a tensor's storage cannot move
to another device. DLPack can name any device: a DLPack tensor of device
type kDLExtDev (which torch reads as PrivateUse1) and index N, with no data,
becomes the *seed* of devkit:N for one dtype, and every later tensor of
devkit:N is an alias of its seed given a storage of its own.
"""

from __future__ import annotations

import ctypes
import threading

import torch

_KDL_EXT_DEV = 12
_DLPACK_DTYPES = {  # torch dtype -> (DLPack type code, bits)
    torch.float32: (2, 32), torch.float64: (2, 64), torch.float16: (2, 16), torch.bfloat16: (4, 16),
    torch.int8: (0, 8), torch.int32: (0, 32), torch.int64: (0, 64), torch.uint8: (1, 8), torch.bool: (6, 8),
}


class _DLDevice(ctypes.Structure):
    _fields_ = [("device_type", ctypes.c_int), ("device_id", ctypes.c_int)]


class _DLDataType(ctypes.Structure):
    _fields_ = [("code", ctypes.c_uint8), ("bits", ctypes.c_uint8), ("lanes", ctypes.c_uint16)]


class _DLTensor(ctypes.Structure):
    _fields_ = [("data", ctypes.c_void_p), ("device", _DLDevice), ("ndim", ctypes.c_int), ("dtype", _DLDataType),
                ("shape", ctypes.POINTER(ctypes.c_int64)), ("strides", ctypes.POINTER(ctypes.c_int64)),
                ("byte_offset", ctypes.c_uint64)]


class _DLManagedTensor(ctypes.Structure):
    _fields_ = [("dl_tensor", _DLTensor), ("manager_ctx", ctypes.c_void_p), ("deleter", ctypes.c_void_p)]


_new_capsule = ctypes.pythonapi.PyCapsule_New
_new_capsule.restype = ctypes.py_object
_new_capsule.argtypes = [ctypes.c_void_p, ctypes.c_char_p, ctypes.c_void_p]
_alias = torch.ops.aten.alias.default
_COMPOSITE = torch._C.DispatchKey.CompositeExplicitAutograd
_lock = threading.Lock()
_seeds: dict = {}


def _seed(index: int, dtype: torch.dtype, set_storage) -> torch.Tensor:
    """devkit:``index``'s seed of ``dtype``: an empty tensor with a storage of devkit's own."""
    code, bits = _DLPACK_DTYPES[dtype]
    shape = (ctypes.c_int64 * 1)(0)
    managed = _DLManagedTensor()
    managed.dl_tensor.device = _DLDevice(_KDL_EXT_DEV, index)
    managed.dl_tensor.ndim = 1
    managed.dl_tensor.dtype = _DLDataType(code, bits, 1)
    managed.dl_tensor.shape = shape
    managed.dl_tensor.strides = shape  # one zero: any stride of an empty tensor
    # No deleter: the DLPack tensor lives only until its alias below has a storage of its own.
    dlpack = torch.from_dlpack(_new_capsule(ctypes.addressof(managed), b"dltensor", None))
    seed = _alias._op_dk(_COMPOSITE, dlpack)
    set_storage(seed)
    del dlpack
    return seed


def empty_on(index: int, dtype: torch.dtype, set_storage) -> torch.Tensor:
    """A new tensor of ``dtype`` on devkit:``index`` (index > 0) for the caller to give a storage;
    ``set_storage(tensor)`` gives a seed an empty storage of that device."""
    seed = _seeds.get((index, dtype))
    if seed is None:
        with _lock:
            seed = _seeds.get((index, dtype))
            if seed is None:
                seed = _seeds[(index, dtype)] = _seed(index, dtype, set_storage)
    return _alias._op_dk(_COMPOSITE, seed)
