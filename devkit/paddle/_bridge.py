"""The Python half of the bridge library (bridge.cc calls these with the GIL held).

The plugin named by DEVKIT_PADDLE_PLUGIN (default cpu) is loaded here with
``devkit.load_plugin``, so a C plugin and a Python (cffi) plugin are reached
alike; bridge.cc then calls its DK_DeviceApi table directly for copies,
memsets, streams and events, and calls back here for allocations (devkit
Buffers, so kernels can view them as Arrays) and kernels (devkit/paddle/ops.py).

Pointers Paddle sees (bridge.cc resolves offsets into them): on a device
reporting DK_DEVICE_HOST_POINTER_HANDLES an allocation's pointer is its handle,
a host address; otherwise it is a token from a reserved address range, spaced
so that no two allocations' byte ranges overlap (as devkit.torch's tokens are).
"""

from __future__ import annotations

import collections
import ctypes
import functools
import math
import os
import threading
from typing import NamedTuple

import numpy as np

from .. import dtypes, load_plugin
from ..abi import ffi
from ..runtime import Array, Buffer, _contiguous_strides, empty
from . import ops

PLUGIN_ENV = "DEVKIT_PADDLE_PLUGIN"
DEFAULT_PLUGIN = "cpu"

# Tokens start past any heap or mmap address Linux gives a process's data (2**44).
_TOKEN_BASE = 1 << 44
_TOKEN_ALIGN = 1 << 12

# PD_DataType (device_ext.h C_DataType) -> NumPy dtype.
PD_DTYPES = {code: dtype for code, dtype in (
    (1, np.dtype("bool")), (2, np.dtype("uint8")), (6, np.dtype("int8")), (7, np.dtype("int16")),
    (8, np.dtype("int32")), (9, np.dtype("int64")), (10, np.dtype("float16")), (11, np.dtype("float32")),
    (12, np.dtype("float64")), (13, dtypes.bfloat16)) if dtype is not None}

# DK_DTypeKey -> NumPy dtype, for the dtypes Paddle's tensors have.
_KEY_DTYPES = {dtypes.dtype_key(dtype): dtype for dtype in PD_DTYPES.values()}

_lock = threading.Lock()
_state: dict = {}
_buffers: dict[int, Buffer] = {}  # pointer Paddle holds -> the allocation's Buffer
_next_token = _TOKEN_BASE
kernel_counts: collections.Counter = collections.Counter()  # op -> calls on the devkit device


def plugin():
    """The plugin the bridge forwards to (loaded by attach)."""
    return _state["plugin"]


def attach(library: str) -> tuple[int, list[tuple[int, int, int, int]]]:
    """Loads the plugin: the address of its DK_DeviceApi table, and per device
    (alloc_alignment, max_alloc_size, flags, device_type). ``library``, the bridge
    itself, stays loaded while Python runs: Paddle unloads it at exit, before this
    module's teardown frees the function bridge.cc adds to it (direct_calls)."""
    if library:
        _state["library"] = ctypes.CDLL(library)
    loaded = load_plugin(os.environ.get(PLUGIN_ENV) or DEFAULT_PLUGIN)
    _state["plugin"] = loaded
    devices = []
    for dev in loaded.devices():
        props = dev.properties
        devices.append((props.alloc_alignment, props.max_alloc_size, props.flags, props.device_type))
    return int(ffi.cast("uintptr_t", loaded.api)), devices


def kernel_entry(op: str, dtype_key: int) -> int:
    """The address of the plugin's DK_KernelEntry for devkit ``op`` keyed by the dtype
    ``dtype_key`` (a DK_DTypeKey), which bridge.cc calls straight; 0 where the plugin
    lacks it: the phi kernel then runs through ``run``."""
    dtype = _KEY_DTYPES.get(dtype_key)
    entry = None if dtype is None else plugin().kernel_entry(op, dtype)
    return 0 if entry is None else int(ffi.cast("uintptr_t", entry))


def plugin_error_message() -> str:
    return plugin().last_error_message()


def allocate(index: int, nbytes: int) -> tuple[int, int]:
    """A new allocation of nbytes on device ``index``: (the pointer Paddle holds, its DK_Mem handle)."""
    global _next_token
    dev = plugin().device(index)
    buffer = Buffer.allocate(dev, nbytes)
    handle = int(ffi.cast("uintptr_t", buffer.handle))
    with _lock:
        if dev.properties.host_pointer_handles:
            pointer = handle + buffer.offset
        else:
            pointer = _next_token
            _next_token += (nbytes + 2 * _TOKEN_ALIGN - 1) // _TOKEN_ALIGN * _TOKEN_ALIGN
        _buffers[pointer] = buffer
    return pointer, handle


def free(pointer: int) -> None:
    with _lock:
        buffer = _buffers.pop(pointer)
    buffer.free()


def live_allocations() -> int:
    """How many allocations Paddle holds on devkit devices (its allocator caches chunks)."""
    return len(_buffers)


def array(index: int, arg) -> Array | None:
    """The devkit Array viewing a kernel's tensor argument (start, offset, shape, PD dtype, strides)."""
    if arg is None:
        return None
    start, offset, shape, pd_dtype, strides = arg
    dtype = PD_DTYPES.get(pd_dtype)
    if dtype is None:
        raise TypeError(f"Paddle dtype {pd_dtype} has no devkit dtype")
    if start:
        # Paddle's tensor lies inside the allocation bridge.cc resolved it to: no checks to repeat.
        return Array.trusted(_buffers[start], shape, dtype, strides or _strides(shape), offset)
    if not math.prod(shape):  # an empty tensor: Paddle gives it no memory
        return empty(shape, dtype, plugin().device(index))
    return TensorMeta(shape, dtype)


@functools.lru_cache(maxsize=1024)
def _strides(shape: tuple) -> tuple:
    return tuple(_contiguous_strides(shape))


class TensorMeta(NamedTuple):
    """A kernel input whose buffer Paddle did not keep (a NoNeedBuffer input): its shape only."""
    shape: tuple
    dtype: np.dtype


def run(op: str, index: int, args: list) -> None:
    """Runs phi kernel ``op`` on device ``index``: args in Paddle's signature order."""
    kernel = ops.KERNELS[op]
    dev = plugin().device(index)
    converted = [array(index, a) if isinstance(a, tuple) else
                 [array(index, t) for t in a] if isinstance(a, list) and any(isinstance(t, tuple) for t in a) else a
                 for a in args]  # a tensor, a list of tensors (outputs), or an attribute
    kernel(dev, *converted)
    kernel_counts[op] += 1
