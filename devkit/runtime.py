"""The Python runtime API: devices, streams, events, buffers and arrays.

Objects own their plugin resources (RAII): a Buffer, Stream or Event frees its
handle when it is garbage-collected, closed explicitly, or leaves a ``with``
block. Work submitted to a stream may still be pending when a call returns;
the Python objects it uses (host arrays, buffers, callbacks) are kept alive by
the stream until it is known to be complete (``synchronize`` or a ``query``
that finds it idle).
"""

from __future__ import annotations

import dataclasses
import math
import threading
import weakref

import numpy as np

from . import dtypes
from .abi import C, ffi
from .errors import NotReadyError
from .plugin import Plugin, load_plugin, parse_device_spec


def _flag(bit: int) -> property:
    return property(lambda self: bool(self.flags & bit), doc=f"DK_DeviceFlags bit {bit:#x}")


@dataclasses.dataclass(frozen=True)
class DeviceProperties:
    name: str
    vendor: str
    driver_version: str
    device_type: int
    compute_units: int
    total_memory: int
    max_alloc_size: int
    alloc_alignment: int
    flags: int

    fp64 = _flag(C.DK_DEVICE_FP64)
    fp16 = _flag(C.DK_DEVICE_FP16)
    bf16 = _flag(C.DK_DEVICE_BF16)
    unified_memory = _flag(C.DK_DEVICE_UNIFIED_MEMORY)
    host_pointer_handles = _flag(C.DK_DEVICE_HOST_POINTER_HANDLES)


class Device:
    """One device of a plugin. Obtain with ``devkit.device("cpu:1")`` or ``plugin.device(1)``."""

    def __init__(self, plugin: Plugin, index: int):
        self.plugin = plugin
        self.index = index
        self._properties: DeviceProperties | None = None
        self._streams: weakref.WeakSet[Stream] = weakref.WeakSet()

    def call(self, function: str, *args) -> int:
        return self.plugin.call(function, *args)

    @property
    def properties(self) -> DeviceProperties:
        if self._properties is None:
            props = ffi.new("DK_DeviceProperties *", {"struct_size": ffi.sizeof("DK_DeviceProperties")})
            self.call("get_device_properties", self.index, props)
            self._properties = DeviceProperties(
                name=ffi.string(props.name).decode(errors="replace"),
                vendor=ffi.string(props.vendor).decode(errors="replace"),
                driver_version=ffi.string(props.driver_version).decode(errors="replace"),
                device_type=int(props.device_type),
                compute_units=int(props.compute_units),
                total_memory=int(props.total_memory),
                max_alloc_size=int(props.max_alloc_size),
                alloc_alignment=int(props.alloc_alignment),
                flags=int(props.flags),
            )
        return self._properties

    def mem_get_info(self) -> tuple[int, int]:
        """(free bytes, total bytes)."""
        free, total = ffi.new("size_t *"), ffi.new("size_t *")
        self.call("mem_get_info", self.index, free, total)
        return int(free[0]), int(total[0])

    def synchronize(self) -> None:
        self.call("device_synchronize", self.index)
        for stream in list(self._streams):
            stream._release_completed()

    def alloc(self, nbytes: int, stream: Stream | None = None) -> Buffer:
        return Buffer.allocate(self, nbytes, stream)

    def create_stream(self) -> Stream:
        return Stream(self)

    def create_event(self, timing: bool = True) -> Event:
        return Event(self, timing)

    def __str__(self) -> str:
        label = f"{self.plugin.name}:{self.index}"
        return f"{label} (plugin at {self.plugin.location})" if self.plugin.name_is_shared else label

    def __repr__(self) -> str:
        return f"<devkit.Device {self}>"


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


def _stream_handle(stream: Stream | None, dev: Device):
    if stream is None:
        return ffi.NULL
    if stream.device is not dev:
        raise ValueError(f"stream belongs to device {stream.device}, not {dev}")
    return stream.handle


def _host_span(obj, writable: bool):
    """A C pointer over a contiguous host buffer and its size in bytes."""
    view = memoryview(obj)
    if not view.c_contiguous:
        raise ValueError("host buffer must be C-contiguous")
    if writable and view.readonly:
        raise ValueError("host destination buffer is read-only")
    return ffi.from_buffer(obj, require_writable=writable), view.nbytes


class Destroyable:
    """RAII for objects owning a plugin handle: ``destroy()`` at the end of a
    ``with`` block or on garbage collection. Subclasses define ``destroy``."""

    def destroy(self) -> None:
        raise NotImplementedError

    def __enter__(self):
        return self

    def __exit__(self, *exc_info) -> None:
        self.destroy()

    def __del__(self):
        try:
            self.destroy()
        except Exception:  # interpreter shutdown or an already-failed plugin
            pass


class Stream(Destroyable):
    """An in-order queue of device work."""

    def __init__(self, dev: Device):
        self.device = dev
        out = ffi.new("DK_Stream *")
        dev.call("stream_create", dev.index, out)
        self._handle = out[0]
        self._lock = threading.Lock()
        self._pending: list = []  # objects pending work still uses
        self._callback_errors: list[BaseException] = []
        dev._streams.add(self)

    @property
    def handle(self):
        if self._handle is None:
            raise ValueError("stream has been destroyed")
        return self._handle

    def retain(self, *objects) -> None:
        """Keep ``objects`` alive until work submitted so far has completed."""
        with self._lock:
            self._pending.extend(objects)

    def _release_completed(self) -> None:
        with self._lock:
            self._pending.clear()
            errors, self._callback_errors = self._callback_errors, []
        if errors:
            raise errors[0]

    def synchronize(self) -> None:
        self.device.call("stream_synchronize", self.device.index, self.handle)
        self._release_completed()

    def query(self) -> bool:
        """True when all submitted work has completed."""
        done = self.device.call("stream_query", self.device.index, self.handle) == C.DK_OK
        if done:
            self._release_completed()
        return done

    def wait_event(self, event: Event) -> None:
        """Work submitted after this waits for the event's most recent record."""
        self.device.call("stream_wait_event", self.device.index, self.handle, event.handle)
        self.retain(event)

    def record(self, event: Event | None = None) -> Event:
        event = event if event is not None else Event(self.device)
        event.record(self)
        return event

    def add_callback(self, fn) -> None:
        """Run ``fn()`` on a plugin thread once all earlier work on the stream has run.

        An exception from ``fn`` is raised by the next ``synchronize()``.
        """
        errors = self._callback_errors

        @ffi.callback("DK_HostFn")
        def trampoline(_user_data):
            try:
                fn()
            except BaseException as exc:  # reported on synchronize, never lost
                errors.append(exc)

        self.device.call("stream_add_callback", self.device.index, self.handle, trampoline, ffi.NULL)
        self.retain(trampoline, fn)

    def destroy(self) -> None:
        """Wait for pending work, then release the stream."""
        if self._handle is not None:
            handle, self._handle = self._handle, None
            self.device.call("stream_destroy", self.device.index, handle)
            self._release_completed()


class Event(Destroyable):
    """A position in a stream, with a completion timestamp."""

    def __init__(self, dev: Device, timing: bool = True):
        self.device = dev
        self.timing = timing
        out = ffi.new("DK_Event *")
        flags = C.DK_EVENT_DEFAULT if timing else C.DK_EVENT_DISABLE_TIMING
        dev.call("event_create", dev.index, flags, out)
        self._handle = out[0]

    @property
    def handle(self):
        if self._handle is None:
            raise ValueError("event has been destroyed")
        return self._handle

    def record(self, stream: Stream | None = None) -> Event:
        self.device.call("event_record", self.device.index, self.handle,
                         _stream_handle(stream, self.device))
        return self

    def query(self) -> bool:
        return self.device.call("event_query", self.device.index, self.handle) == C.DK_OK

    def synchronize(self) -> None:
        self.device.call("event_synchronize", self.device.index, self.handle)

    def elapsed_ms(self, end: Event) -> float:
        """Milliseconds from this event's completion to ``end``'s."""
        ms = ffi.new("float *")
        status = self.device.call("event_elapsed_ms", self.device.index, self.handle, end.handle, ms)
        if status == C.DK_NOT_READY:
            raise NotReadyError(f"{self.device.plugin.name}.event_elapsed_ms: an event has not "
                                f"completed yet", status)
        return float(ms[0])

    def destroy(self) -> None:
        if self._handle is not None:
            handle, self._handle = self._handle, None
            self.device.call("event_destroy", self.device.index, handle)


class _Allocation:
    """Owns one DK_Mem handle; frees it when the last Buffer viewing it goes."""

    def __init__(self, dev: Device, handle, nbytes: int):
        self.device = dev
        self.handle = handle
        self.nbytes = nbytes

    def free(self, stream: Stream | None = None) -> None:
        if self.handle is None:
            return
        handle, self.handle = self.handle, None
        dev = self.device
        if stream is None:
            dev.call("mem_free", dev.index, handle)
        elif dev.plugin.has("mem_free_async"):
            dev.call("mem_free_async", dev.index, handle, stream.handle)
        else:
            stream.synchronize()
            dev.call("mem_free", dev.index, handle)

    def __del__(self):
        try:
            self.free()
        except Exception:
            pass


class Buffer:
    """Device memory addressed as (handle, byte offset): an allocation or a view of one."""

    def __init__(self, allocation: _Allocation, offset: int, nbytes: int):
        self._allocation = allocation
        self.offset = offset
        self.nbytes = nbytes

    @classmethod
    def allocate(cls, dev: Device, nbytes: int, stream: Stream | None = None) -> Buffer:
        nbytes = _check_size(nbytes, "nbytes")
        out = ffi.new("DK_Mem *")
        if stream is not None and dev.plugin.has("mem_alloc_async"):
            dev.call("mem_alloc_async", dev.index, nbytes, _stream_handle(stream, dev), out)
        else:
            if stream is not None:
                stream.synchronize()
            dev.call("mem_alloc", dev.index, nbytes, out)
        return cls(_Allocation(dev, out[0], nbytes), 0, nbytes)

    @property
    def device(self) -> Device:
        return self._allocation.device

    @property
    def handle(self):
        handle = self._allocation.handle
        if handle is None:
            raise ValueError("buffer has been freed")
        return handle

    def view(self, offset: int, nbytes: int) -> Buffer:
        """The bytes [offset, offset + nbytes) of this buffer, sharing its memory."""
        offset, nbytes = _check_size(offset, "offset"), _check_size(nbytes, "nbytes")
        if offset + nbytes > self.nbytes:
            raise IndexError(
                f"view [{offset}, {offset + nbytes}) exceeds the {self.nbytes}-byte buffer")
        return Buffer(self._allocation, self.offset + offset, nbytes)

    def copy_from_host(self, src, *, offset: int = 0, stream: Stream | None = None) -> None:
        """Copy a contiguous host buffer to ``offset`` in this buffer."""
        dev = self.device
        pointer, nbytes = _host_span(src, writable=False)
        dev.call("copy_h2d", dev.index, self.handle, self.offset + offset, pointer, nbytes,
                 _stream_handle(stream, dev))
        if stream is not None:
            stream.retain(self, src, pointer)

    def copy_to_host(self, dst=None, *, offset: int = 0, nbytes: int | None = None,
                     stream: Stream | None = None) -> np.ndarray:
        """Copy ``nbytes`` from ``offset`` into ``dst`` (a new uint8 array if None).

        With a stream the data is defined once that stream has been synchronized.
        """
        dev = self.device
        if dst is None:
            dst = np.empty(self.nbytes - offset if nbytes is None else nbytes, dtype=np.uint8)
        pointer, size = _host_span(dst, writable=True)
        dev.call("copy_d2h", dev.index, pointer, self.handle, self.offset + offset, size,
                 _stream_handle(stream, dev))
        if stream is not None:
            stream.retain(self, dst, pointer)
        return dst

    def copy_from(self, src: Buffer, *, stream: Stream | None = None) -> None:
        """Copy all of ``src`` (same size) into this buffer, across devices if needed."""
        if src.nbytes != self.nbytes:
            raise ValueError(f"copy_from: source has {src.nbytes} bytes, destination {self.nbytes}")
        dst_dev, src_dev = self.device, src.device
        if dst_dev is src_dev:
            dst_dev.call("copy_d2d", dst_dev.index, self.handle, self.offset, src.handle, src.offset,
                         self.nbytes, _stream_handle(stream, dst_dev))
        elif dst_dev.plugin is src_dev.plugin and dst_dev.plugin.has("copy_p2p"):
            dst_dev.call("copy_p2p", dst_dev.index, self.handle, self.offset, src_dev.index,
                         src.handle, src.offset, self.nbytes, _stream_handle(stream, dst_dev))
        else:  # no peer path: stage through host memory
            self.copy_from_host(src.copy_to_host(), stream=stream)
        if stream is not None:
            stream.retain(self, src)

    def fill(self, value: int, *, stream: Stream | None = None) -> None:
        """Set every byte to ``value``."""
        if not 0 <= value <= 255:
            raise ValueError(f"fill value {value} is not a byte (0..255)")
        dev = self.device
        dev.call("memset", dev.index, self.handle, self.offset, value, self.nbytes,
                 _stream_handle(stream, dev))
        if stream is not None:
            stream.retain(self)

    def free(self, stream: Stream | None = None) -> None:
        """Free the allocation now, or in stream order when ``stream`` is given."""
        self._allocation.free(stream)

    def __enter__(self) -> Buffer:
        return self

    def __exit__(self, *exc_info) -> None:
        self.free()

    def __repr__(self) -> str:
        return f"<devkit.Buffer {self.nbytes} bytes at offset {self.offset} on {self.device}>"


def _check_size(value: int, what: str) -> int:
    value = int(value)
    if value < 0:
        raise ValueError(f"{what} must be non-negative, got {value}")
    return value


class _HostMemory:
    """Exposes host-addressable device memory to NumPy, keeping the owner alive."""

    def __init__(self, owner, address: int, shape, byte_strides, dtype: np.dtype):
        self.owner = owner
        self.__array_interface__ = {
            "version": 3, "data": (address, False), "shape": tuple(shape),
            "strides": tuple(byte_strides), "typestr": dtype.str,
        }


class Array:
    """An n-dimensional view of a Buffer: shape, dtype, strides (elements), offset (bytes)."""

    def __init__(self, buffer: Buffer, shape, dtype, strides=None, offset: int = 0):
        self.buffer = buffer
        self.shape = tuple(int(n) for n in shape)
        self.dtype = dtypes.normalize(dtype)
        self.strides = tuple(_contiguous_strides(self.shape) if strides is None else strides)
        self.offset = int(offset)
        if any(n < 0 for n in self.shape) or len(self.strides) != len(self.shape):
            raise ValueError(f"invalid shape {self.shape} with strides {self.strides}")
        low, high = self._extent()
        if self.size and (low < 0 or high > buffer.nbytes):
            raise IndexError(
                f"array of shape {self.shape}, strides {self.strides} at offset {self.offset} "
                f"reaches bytes [{low}, {high}) outside the {buffer.nbytes}-byte buffer")

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
