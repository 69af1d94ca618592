"""devkit memory behind torch tensors of device type ``devkit``.

A devkit torch tensor is an ordinary torch TensorImpl whose storage carries no
host pointer: its data pointer is a token naming a devkit allocation. Views
share the storage (so torch's aliasing, version counters and autograd views
work) and reach the same devkit Buffer with their own sizes, strides and
offset. A storage holds no reference torch can release, so the reference to an
allocation whose storages have all died is dropped by ``collect()`` (which runs
on its own as allocations accumulate); the memory goes back once no devkit
Array holds it either.
"""

from __future__ import annotations

import math
import threading

import numpy as np
import torch

from .. import dtypes
from ..abi import ffi
from ..runtime import Array, Buffer, Device, empty
from . import _native as _native_module
from . import _seeds

DEVICE_TYPE = "devkit"

TORCH_TO_NUMPY = {
    torch.float32: np.dtype("float32"), torch.float64: np.dtype("float64"),
    torch.float16: np.dtype("float16"), torch.bfloat16: dtypes.bfloat16,
    torch.int8: np.dtype("int8"), torch.int32: np.dtype("int32"),
    torch.int64: np.dtype("int64"), torch.uint8: np.dtype("uint8"), torch.bool: np.dtype("bool"),
}
NUMPY_TO_TORCH = {v: k for k, v in TORCH_TO_NUMPY.items()}

# Tokens are spaced so that no two allocations' byte ranges overlap.
_TOKEN_BASE = 1 << 44
_TOKEN_ALIGN = 1 << 12
_lock = threading.Lock()
_next_token = _TOKEN_BASE
# token -> (the allocation's Buffer, a weak reference to its storage: _WeakStorage, or the native module's)
live: dict[int, tuple[Buffer, object]] = {}
_live_after_collect = 0
_set_storage = torch.ops.aten.set_.source_Storage_storage_offset
_CPU = torch._C.DispatchKey.CPU
_EMPTY = (0,)
_expired = torch.UntypedStorage._expired
_native = None  # the native module (_native.py), once use_native() found it
_native_tensor = None  # its tensor()
# Reuse pools of allocations whose storages died, per (device, nbytes): an eager op's
# output skips the driver's allocator. Small allocations only, a few per size.
_POOL_NBYTES = 1 << 16
_POOL_DEPTH = 16
_pools: dict[tuple[Device, int], list[Buffer]] = {}
_torch_devices: dict = {}


def _torch_device(dev: Device) -> torch.device:
    """The torch device ``devkit:N`` of a devkit Device (its index on its plugin)."""
    try:
        return _torch_devices[dev.index]
    except KeyError:
        return _torch_devices.setdefault(dev.index, torch.device(DEVICE_TYPE, dev.index))


class Unsupported(NotImplementedError):
    """An aten op, or a form or dtype of one, that devkit cannot run (the CPU fallback may)."""


def numpy_dtype(dtype: torch.dtype) -> np.dtype:
    try:
        return TORCH_TO_NUMPY[dtype]
    except KeyError:
        raise Unsupported(f"devkit's op set has no dtype torch.{str(dtype).split('.')[-1]}") from None


def torch_dtype(dtype) -> torch.dtype:
    return NUMPY_TO_TORCH[np.dtype(dtype)]


def collect() -> int:
    """Drop the devkit allocations of storages torch no longer holds (the reuse pools'
    too); returns how many."""
    global _live_after_collect
    if _native is not None:
        dropped = _native.reap()  # the native storages that died: to the reuse pools, or dropped
        with _lock:
            dropped += sum(len(pool) for pool in _pools.values())
            _pools.clear()
        return dropped
    with _lock:
        dead = [token for token, (_, ref) in live.items() if ref.expired()]
        for token in dead:
            del live[token]
        _live_after_collect = len(live)
    return len(dead)


def new_buffer(dev: Device, nbytes: int) -> Buffer:
    """A whole allocation of ``nbytes`` for a new tensor's storage: one whose storages
    died (it skips the driver's allocator and the token), else a new one."""
    pool = _pools.get((dev, nbytes))
    if pool:
        try:
            return pool.pop()
        except IndexError:  # another thread took the last one
            pass
    return dev.alloc(nbytes)


def give_back(whole: Buffer) -> None:
    """Pool a whole allocation only the caller held (a replay's scratch output)."""
    allocation = whole._allocation
    if _native is not None and allocation.nbytes <= _POOL_NBYTES and not allocation.used_on_streams:
        pool = _pools.setdefault((allocation.device, allocation.nbytes), [])
        if len(pool) < _POOL_DEPTH:
            pool.append(whole)


def live_allocations() -> int:
    return len(live)


def _storage_for(buffer: Buffer) -> torch.UntypedStorage:
    """The torch storage of ``buffer``'s allocation (one per allocation)."""
    allocation = buffer._allocation
    token = getattr(allocation, "torch_token", None)
    if token is not None and token in live and not live[token][1].expired():
        return live[token][1].storage()
    return _new_storage(Buffer(allocation, 0, allocation.nbytes))


def _new_token(nbytes: int) -> int:
    global _next_token
    with _lock:
        token = _next_token
        _next_token += (nbytes // _TOKEN_ALIGN + 2) * _TOKEN_ALIGN
    return token


def _new_storage(whole: Buffer) -> torch.UntypedStorage:
    """A torch storage for ``whole``, an allocation no storage has yet."""
    allocation = whole._allocation
    if _native is not None:  # it takes in the storages that died, keeps a pooled allocation's token
        return _native.new_storage(whole, allocation.device.index)
    if len(live) > 2 * _live_after_collect + 256:
        collect()
    nbytes = allocation.nbytes
    token = _new_token(nbytes)
    storage = torch._C._construct_storage_from_data_pointer(token, _torch_device(allocation.device), nbytes)
    live[token] = (whole, _WeakStorage(storage))
    allocation.torch_token = token
    return storage


class _WeakStorage:
    """A weak reference to a storage that can still hand out the storage while it lives
    (torch's StorageWeakRef, in a third of its time)."""

    __slots__ = ("cdata",)

    def __init__(self, storage):
        self.cdata = storage._weak_ref()

    def expired(self) -> bool:
        return _expired(self.cdata)

    def storage(self) -> torch.UntypedStorage:
        if _expired(self.cdata):
            raise RuntimeError("devkit storage has been released")
        return torch.UntypedStorage._new_with_weak_ptr(self.cdata)

    def __del__(self, free=torch.UntypedStorage._free_weak_ref):  # bound now: torch may be gone at exit
        free(self.cdata)


def wrap(array: Array) -> torch.Tensor:
    """A devkit torch tensor viewing ``array`` (no copy)."""
    dtype = torch_dtype(array.dtype)
    storage = _storage_for(array.buffer)
    byte_offset = array.buffer.offset + array.offset
    if byte_offset % array.itemsize:
        raise ValueError(f"array offset {byte_offset} is not a multiple of its itemsize {array.itemsize}")
    return _tensor(storage, dtype, array.shape, array.strides, byte_offset // array.itemsize)


def use_native() -> None:
    """Make tensors with the native module (``_native``) where it builds; it shares ``live``
    and the reuse pools."""
    global _native, _native_tensor
    _native = _native_module.module()
    _native_tensor = _native.tensor if _native is not None else None
    if _native is not None:
        _native.configure(live, _pools, _handle_address, _POOL_NBYTES, _POOL_DEPTH, _TOKEN_BASE, _TOKEN_ALIGN)


def _handle_address(allocation) -> int:
    """The address of an allocation's device handle, kept on it for the native module."""
    if allocation.handle is None:
        raise ValueError("buffer has been freed")
    allocation.handle_address = address = int(ffi.cast("uintptr_t", allocation.handle))
    return address


def _tensor(storage: torch.UntypedStorage, dtype: torch.dtype, shape, strides, storage_offset: int) -> torch.Tensor:
    if _native_tensor is not None:
        return _native_tensor(storage, dtype, shape, strides, storage_offset)
    index = storage.device.index
    tensor = torch._C._acc.create_empty_tensor(_EMPTY, dtype) if not index else \
        _seeds.empty_on(index, dtype, lambda seed: _set_storage._op_dk(
            _CPU, seed, torch._C._construct_storage_from_data_pointer(0, storage.device, 0), 0, _EMPTY, (1,)))
    _set_storage._op_dk(_CPU, tensor, storage, storage_offset, shape, strides)
    return tensor


def tensor_on(buffer: Buffer, dtype: torch.dtype, shape, strides, storage_offset: int) -> torch.Tensor:
    """A devkit tensor on ``buffer``, a new allocation's whole Buffer, geometry already checked."""
    return _tensor(_new_storage(buffer), dtype, shape, strides, storage_offset)


def view(tensor: torch.Tensor, shape, strides, storage_offset: int) -> torch.Tensor:
    """A new devkit tensor on ``tensor``'s storage with the given geometry."""
    return _tensor(tensor.untyped_storage(), tensor.dtype, shape, strides, storage_offset)


def buffer_of(tensor: torch.Tensor) -> Buffer:
    token = tensor.untyped_storage().data_ptr()
    try:
        return live[token][0]
    except KeyError:
        raise RuntimeError(f"tensor on {tensor.device} has no devkit memory (storage token {token:#x})") from None


def to_array(tensor: torch.Tensor) -> Array:
    """The devkit Array a devkit torch tensor views (no copy)."""
    dtype = numpy_dtype(tensor.dtype)
    # An empty view may start past its storage's end (the second half of a split of nothing): it reaches no bytes.
    offset = tensor.storage_offset() * dtype.itemsize if tensor.numel() else 0
    return Array(buffer_of(tensor), tuple(tensor.shape), dtype, tuple(tensor.stride()), offset)


def empty_tensor(shape, dtype: torch.dtype, dev: Device) -> torch.Tensor:
    return wrap(empty(tuple(shape), numpy_dtype(dtype), dev))


def empty_strided_tensor(shape, strides, dtype: torch.dtype, dev: Device) -> torch.Tensor:
    shape, strides = tuple(shape), tuple(strides)
    np_dtype = numpy_dtype(dtype)
    extent = 1 + sum((n - 1) * s for n, s in zip(shape, strides)) if math.prod(shape) else 0
    buffer = dev.alloc(extent * np_dtype.itemsize)
    return wrap(Array(buffer, shape, np_dtype, strides, 0))
