"""The Python runtime API: device specs, arrays, and (from devkit.driver)
devices, streams, events and buffers.

The driver objects own their plugin resources (RAII) and follow the freeing
rule described in devkit/driver.py and docs/framework-guide.md.
"""

from __future__ import annotations

import math
import operator

import numpy as np

from . import dtypes
from .abi import C, ffi
from .driver import (  # noqa: F401  (the driver's public names are re-exported here)
    _INT64_MAX, Buffer, Destroyable, Device, DeviceProperties, Event, Stream, _check_size, _DeviceMemory,
    _stream_handle, set_allocator,
)
from .errors import OutOfMemoryError
from .plugin import load_plugin, parse_device_spec


DEFAULT_DEVICE = "cpu:0"  # where everything that takes ``device=`` runs when given None


def device(spec: str | Device | None = None) -> Device:
    """Parse ``"name:index"`` (or ``"name"``, meaning index 0) into a Device;
    None is DEFAULT_DEVICE. The name is a plugin name, never a path
    (``load_plugin(path).device(i)``)."""
    if isinstance(spec, Device):
        return spec
    name, index = parse_device_spec(DEFAULT_DEVICE if spec is None else str(spec))
    return load_plugin(name).device(index)


_device = device  # for the functions whose array-API parameter ``device`` shadows it


def _memories(device) -> list[_DeviceMemory]:
    return _DeviceMemory._all if device is None else [_device(device)._memory]


def empty_cache(device: str | Device | None = None) -> None:
    """Return every cached free block to its plugin (of one device, or of all).

    Blocks that pending work may still use are freed once it has run (this waits).
    """
    for memory in _memories(device):
        memory.empty_cache()


def memory_stats(device: str | Device | None = None) -> dict:
    """The allocator's counters for one device, or ``{"cpu:0": {...}, ...}`` for every device.

    allocated_bytes: bytes of live buffers (as requested); reserved_bytes:
    bytes held from the plugin (live and cached blocks); cached_bytes: the
    cached part; peak_*: the highest value so far; allocations: live
    buffers; allocation_count / free_count: buffers made / released so far;
    cache_hits: allocations served from the cache; device_allocations /
    device_frees: mem_alloc / mem_free(_async) calls into the plugin.
    """
    if device is not None:
        return _memories(device)[0].stats()
    return {str(memory.device): memory.stats() for memory in list(_DeviceMemory._all)}


class _HostMemory:
    """Exposes host-addressable device memory to NumPy: holds the allocation, so
    that freeing it waits until the last consumer (a DLPack deleter) lets go."""

    def __init__(self, owner: Array, address: int, shape, byte_strides, dtype: np.dtype):
        self.owner = owner
        self.__array_interface__ = {
            "version": 3, "data": (address, False), "shape": tuple(shape),
            "strides": tuple(byte_strides), "typestr": dtype.str,
        }
        self._allocation = None
        owner.buffer._allocation.hold()
        self._allocation = owner.buffer._allocation

    def __del__(self):
        if self._allocation is not None:
            try:
                self._allocation.unhold(finalizing=True)
            except Exception:  # interpreter shutdown or an already-failed plugin
                pass


class Array:
    """An n-dimensional view of a Buffer: shape, dtype, strides (elements), offset (bytes)."""

    _layout: str | None = None  # the eager call cache's key for it (ops.dispatch.layout), made at first use

    def __init__(self, buffer: Buffer, shape, dtype, strides=None, offset: int = 0):
        self.buffer = buffer
        self.shape = tuple(int(n) for n in shape)
        self.dtype = dtypes.normalize(dtype)
        self.strides = tuple(_contiguous_strides(self.shape) if strides is None else strides)
        self.offset = int(offset)
        if any(n < 0 for n in self.shape) or len(self.strides) != len(self.shape):
            raise ValueError(f"invalid shape {self.shape} with strides {self.strides}")
        if (not 0 <= self.offset <= buffer.nbytes or self.size * self.itemsize > _INT64_MAX
                or max(self.shape, default=0) > _INT64_MAX
                or max(map(abs, self.strides), default=0) > _INT64_MAX):
            self._refuse_unaddressable()
        low, high = self._extent()
        if self.size and (low < 0 or high > buffer.nbytes):
            raise IndexError(
                f"array of shape {self.shape}, strides {self.strides} at offset {self.offset} "
                f"reaches bytes [{low}, {high}) outside the {buffer.nbytes}-byte buffer")

    @classmethod
    def trusted(cls, buffer: Buffer, shape: tuple, dtype: np.dtype, strides: tuple, offset: int = 0) -> Array:
        """An Array from values already checked (a normalized dtype, int
        tuples that fit the buffer): what cached calls and plans use."""
        array = cls.__new__(cls)
        array.buffer, array.shape, array.dtype, array.strides, array.offset = buffer, shape, dtype, strides, offset
        return array

    def _refuse_unaddressable(self) -> None:
        """Kernels take shapes, strides and byte counts as int64: say what does not fit."""
        if not 0 <= self.offset <= self.buffer.nbytes:
            raise IndexError(f"array offset {self.offset} is outside the {self.buffer.nbytes}-byte "
                             f"buffer")
        if self.nbytes > _INT64_MAX:
            raise OutOfMemoryError(
                f"array of shape {self.shape} ({self.dtype}) holds {self.size} elements, "
                f"{self.nbytes} bytes: past any device's reach (past int64; {self.device}'s "
                f"max_alloc_size is {self.device.properties.max_alloc_size} bytes)")
        raise ValueError(f"shape {self.shape} with strides {self.strides} does not fit int64")

    @property
    def device(self) -> Device:
        return self.buffer.device

    @property
    def ndim(self) -> int:
        return len(self.shape)

    @property
    def size(self) -> int:
        return math.prod(self.shape)

    @property
    def itemsize(self) -> int:
        return self.dtype.itemsize

    @property
    def nbytes(self) -> int:
        return self.size * self.itemsize

    @property
    def is_contiguous(self) -> bool:
        return self.size == 0 or all(
            n == 1 or s == c
            for n, s, c in zip(self.shape, self.strides, _contiguous_strides(self.shape)))

    def _extent(self) -> tuple[int, int]:
        """Byte range [low, high) of the buffer that the elements touch."""
        if self.size == 0:
            return self.offset, self.offset
        low = sum(min(0, (n - 1) * s) for n, s in zip(self.shape, self.strides))
        high = sum(max(0, (n - 1) * s) for n, s in zip(self.shape, self.strides))
        return self.offset + low * self.itemsize, self.offset + (high + 1) * self.itemsize

    # -- host transfers ---------------------------------------------------------

    def numpy(self, stream: Stream | None = None) -> np.ndarray:
        """Copy to a new NumPy array (after the work already submitted to ``stream``)."""
        result = np.empty(self.shape, self.dtype)
        if self.size == 0:
            return result
        if self.is_contiguous:
            self.buffer.copy_to_host(result.reshape(-1).view(np.uint8), offset=self.offset,
                                     stream=stream)
        else:  # fetch the covering byte range, then gather the elements on the host
            low, high = self._extent()
            span = self.buffer.copy_to_host(offset=low, nbytes=high - low, stream=stream)
            if stream is not None:
                stream.synchronize()
            result[...] = np.ndarray(self.shape, self.dtype, buffer=span, offset=self.offset - low,
                                     strides=[s * self.itemsize for s in self.strides])
            return result
        if stream is not None:
            stream.synchronize()
        return result

    def __array__(self, dtype=None, copy=None):
        result = self.numpy()
        return result if dtype is None else result.astype(dtype, copy=False)

    # -- views ----------------------------------------------------------------

    def __getitem__(self, key) -> Array:
        key = key if isinstance(key, tuple) else (key,)
        if not all(isinstance(k, (int, np.integer, slice)) or k is None or k is Ellipsis for k in key):
            raise TypeError("device arrays support basic indexing only (ints, slices, None, ...)")
        if Ellipsis not in key:
            key = key + (Ellipsis,)  # keeps a full integer index an array, not a scalar
        probe = np.lib.stride_tricks.as_strided(
            np.zeros(1, np.uint8), self.shape, [s * self.itemsize for s in self.strides])
        view = probe[key]
        moved = view.__array_interface__["data"][0] - probe.__array_interface__["data"][0]
        return Array(self.buffer, view.shape, self.dtype,
                     [s // self.itemsize for s in view.strides], self.offset + moved)

    def transpose(self, *axes) -> Array:
        axes = axes[0] if len(axes) == 1 and isinstance(axes[0], (tuple, list)) else axes
        order = tuple(axes) if axes else tuple(reversed(range(self.ndim)))
        if sorted(order) != list(range(self.ndim)):
            raise ValueError(f"axes {order} are not a permutation of {self.ndim} dimensions")
        return Array(self.buffer, [self.shape[a] for a in order], self.dtype,
                     [self.strides[a] for a in order], self.offset)

    @property
    def T(self) -> Array:
        return self.transpose()

    def reshape(self, *shape) -> Array:
        shape = shape[0] if len(shape) == 1 and isinstance(shape[0], (tuple, list)) else shape
        new_shape = np.empty(self.size, np.uint8).reshape(shape).shape  # resolves -1, checks size
        if not self.is_contiguous:
            raise ValueError("reshape needs a contiguous array; copy() it first")
        return Array(self.buffer, new_shape, self.dtype, None, self.offset)

    # -- copies -----------------------------------------------------------------

    def copy(self, stream: Stream | None = None) -> Array:
        return self.to(self.device, stream)

    def to(self, target: str | Device, stream: Stream | None = None) -> Array:
        """A contiguous copy on ``target`` (this device when it is the same)."""
        dev = device(target)
        if not self.is_contiguous:
            return asarray(self.numpy(), dev, stream=stream)
        out = empty(self.shape, self.dtype, dev, stream=stream)
        out.buffer.copy_from(self.buffer.view(self.offset, self.nbytes), stream=stream)
        return out

    def to_device(self, device: str | Device, /, *, stream: Stream | None = None) -> Array:
        """The array API's name for ``to``."""
        return self.to(device, stream)

    # -- DLPack -------------------------------------------------------------------

    def __dlpack_device__(self) -> tuple[int, int]:
        self._require_host_addressable()
        return (C.DK_DEVICE_TYPE_CPU, 0)

    def __dlpack__(self, *, stream=None, max_version=None, dl_device=None, copy=None):
        """Zero-copy export for devices whose handles are host addresses."""
        self._require_host_addressable()
        self.device.synchronize()
        address = int(ffi.cast("uintptr_t", self.buffer.handle)) + self.buffer.offset + self.offset
        raw_dtype = np.dtype(f"V{self.itemsize}") if self.dtype == dtypes.bfloat16 else self.dtype
        host = np.asarray(_HostMemory(self, address, self.shape,
                                      [s * self.itemsize for s in self.strides], raw_dtype))
        if raw_dtype != self.dtype:
            host = host.view(self.dtype)
        options = {"stream": stream, "max_version": max_version, "dl_device": dl_device, "copy": copy}
        return host.__dlpack__(**{k: v for k, v in options.items() if v is not None})

    def _require_host_addressable(self) -> None:
        if not self.device.properties.host_pointer_handles:
            raise BufferError(
                f"{self.device} memory is not host-addressable; DLPack export is only zero-copy "
                f"on such devices: use .numpy() to copy")

    def __len__(self) -> int:
        if not self.shape:
            raise TypeError("len() of a 0-d array")
        return self.shape[0]

    def __repr__(self) -> str:
        return f"<devkit.Array shape={self.shape} dtype={self.dtype} device={self.device}>"


def _contiguous_strides(shape) -> list[int]:
    strides, step = [], 1
    for n in reversed(shape):
        strides.append(step)
        step *= max(n, 1)
    return strides[::-1]


def empty(shape, dtype=None, device: str | Device | None = None,
          stream: Stream | None = None) -> Array:
    """An uninitialised array on a device (``dtype`` None: float32)."""
    shape = (shape,) if isinstance(shape, int) else tuple(shape)
    try:
        shape = tuple(map(operator.index, shape))
    except TypeError:
        shape = tuple(_check_size(n, f"dimension of shape {shape}") for n in shape)  # raises, naming it
    if min(shape, default=0) < 0:
        _check_size(min(shape), f"dimension of shape {shape}")
    dtype = dtypes.normalize("float32" if dtype is None else dtype)
    dev = _device(device)
    return Array(dev.alloc(math.prod(shape) * dtype.itemsize, stream), shape, dtype)


def zeros(shape, dtype=None, device: str | Device | None = None,
          stream: Stream | None = None) -> Array:
    out = empty(shape, dtype, device, stream)
    out.buffer.fill(0, stream=stream)
    return out


def asarray(obj, /, device: str | Device | None = None, *, dtype=None, copy: bool | None = None,
            stream: Stream | None = None) -> Array:
    """Copy a NumPy array (or anything ``numpy.asarray`` takes) to a device.

    An Array already on ``device`` (None: the Array's own device) is returned
    as it is unless ``copy=True``; ``copy=False`` refuses to copy."""
    if isinstance(obj, Array):
        if dtype is not None and dtypes.normalize(dtype) != obj.dtype:
            raise TypeError("asarray cannot convert dtypes of device arrays: use devkit.ops.Cast")
        dev = obj.device if device is None else _device(device)
        if obj.device is dev and not copy:
            return obj
        if copy is False:
            raise ValueError(f"asarray(copy=False): the array is on {obj.device}, not {dev}")
        return obj.to(dev, stream)
    if copy is False:
        raise ValueError("asarray(copy=False): host data is always copied to the device")
    dev = _device(device)
    host = np.asarray(obj, dtype=dtype)
    if not host.flags.c_contiguous:
        host = host.copy(order="C")  # not ascontiguousarray: it turns 0-d arrays into 1-d
    out = empty(host.shape, host.dtype, dev, stream)
    if host.size:
        out.buffer.copy_from_host(host.reshape(-1).view(np.uint8), stream=stream)
    return out
