"""The driver layer: a plugin's devices, and their streams, events and memory.

Objects own their plugin resources (RAII): a Buffer, Stream or Event frees its
handle when it is garbage-collected, closed explicitly, or leaves a ``with``
block. Work submitted to a stream may still be pending when a call returns;
the Python objects it uses (host arrays, buffers, callbacks) are kept alive by
the stream until it is known to be complete (``synchronize`` or a ``query``
that finds it idle), and memory it uses is never released under it: freeing
a buffer orders the release after that work (see "the rule" below and
docs/framework-guide.md). Allocations go through a per-device caching
allocator (``memory_stats``, ``empty_cache``; ``DEVKIT_ALLOCATOR=none``
bypasses it).

This module knows a plugin only as the object it is given: devkit.plugin
makes a plugin's Device objects from here, and devkit.runtime (arrays, device
specs) builds on both, so none of the three imports one above it.
"""

from __future__ import annotations

import collections
import dataclasses
import operator
import os
import threading
import weakref
from typing import TYPE_CHECKING

import numpy as np

from .abi import C, ffi
from .errors import DevkitError, NotReadyError, OutOfMemoryError

if TYPE_CHECKING:
    from .plugin import Plugin

# Stream.capture's implementation: devkit.engine.graph (the graph layer, above the
# runtime) sets it when it is imported, as devkit's __init__ does.
_graph_capture = None


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
        # Graph captures open on this device's streams (devkit/engine/graph.py), which
        # see every call while they are open, and the frees they deferred.
        self._captures: list = []
        self._capture_hook = None
        self._deferred_frees: list = []
        self._streams_lock = threading.Lock()
        self._memory = _DeviceMemory(self)

    def call(self, function: str, *args) -> int:
        if self._capture_hook is not None:
            return self._capture_hook(self, function, args)
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
        with self._streams_lock:
            streams = list(self._streams)
        for stream in streams:
            stream._release_completed()

    def alloc(self, nbytes: int, stream: Stream | None = None) -> Buffer:
        """``nbytes`` of memory (see ``Buffer.allocate``)."""
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
        self._allocations: set[_Allocation] = set()  # the device memory among them
        self._callback_errors: list[BaseException] = []
        self.capturing = None  # the devkit.engine.graph.Graph being captured from this stream
        with dev._streams_lock:
            dev._streams.add(self)

    @property
    def handle(self):
        if self._handle is None:
            raise ValueError("stream has been destroyed")
        return self._handle

    def capture(self, mode: str = "auto", *, fuse: bool = False):
        """``with stream.capture() as graph:`` records the block's work on this
        stream into a graph (devkit/engine/graph.py); ``mode`` "host" replays it on the
        host even where the plugin has the graph section. ``fuse``: the host
        records the block and fuses its elementwise kernels when it ends, every
        Array still referenced then an output (docs/fusion.md)."""
        return _graph_capture(self, mode, fuse)

    def retain(self, *objects) -> None:
        """Keep ``objects`` alive until work submitted so far has completed
        (while capturing: as long as the graph).

        Every Array or Buffer among them is recorded as used by this stream's
        pending work: freeing it orders the release after that work.
        """
        if self.capturing is not None:
            self.capturing.keep(objects)
            return
        allocations = [allocation for allocation in map(_allocation_of, objects) if allocation]
        for allocation in allocations:
            allocation.used_on_streams = True
        with self._lock:
            self._pending.extend(objects)
            self._allocations.update(allocations)

    def _release_completed(self) -> None:
        with self._lock:
            self._pending.clear()
            self._allocations.clear()
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


def _allocation_of(obj) -> _Allocation | None:
    """The allocation a Buffer or an Array (any object whose ``buffer`` is a Buffer) uses."""
    if isinstance(obj, Buffer):
        return obj._allocation
    buffer = getattr(obj, "buffer", None)
    return buffer._allocation if isinstance(buffer, Buffer) else None


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
        if stream is not None:
            stream.retain(self)
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


# -- memory -------------------------------------------------------------------------
#
# The rule: the runtime never hands a plugin memory that pending work still
# uses. A stream records which allocations its pending work touches (retain);
# releasing an allocation orders the release after that work: the caching
# allocator tags the block with an event per such stream, the direct path
# frees with mem_free_async on one of them (or waits where the plugin has no
# mem_free_async). DLPack exports and collective groups hold an allocation:
# its release waits for the last hold to go.

ALLOCATOR_ENV = "DEVKIT_ALLOCATOR"
ALLOCATORS = ("caching", "none")
_INT64_MAX = (1 << 63) - 1
_SIZE_MAX = (1 << 64) - 1


def _allocator_from_environment() -> str:
    kind = os.environ.get(ALLOCATOR_ENV, "caching")
    if kind not in ALLOCATORS:
        raise ValueError(f"{ALLOCATOR_ENV}={kind!r} is not an allocator (choose from "
                         f"{', '.join(ALLOCATORS)})")
    return kind


_allocator = _allocator_from_environment()


def set_allocator(kind: str) -> str:
    """Choose how later allocations are made: "caching" (the default) keeps
    freed blocks for reuse; "none" calls the plugin's mem_alloc/mem_free for
    every buffer. Returns the previous kind. Blocks already cached stay
    cached until ``empty_cache()``."""
    global _allocator
    if kind not in ALLOCATORS:
        raise ValueError(f"allocator {kind!r} is not one of {', '.join(ALLOCATORS)}")
    previous, _allocator = _allocator, kind
    return previous


def _size_class(nbytes: int) -> int:
    """The capacity the cache reserves for a request: at least 512 bytes, four
    classes per power of two (at most 25% slack) up to 16 MiB, then whole
    2 MiB steps."""
    if nbytes <= 512:
        return 512
    step = 2 << 20 if nbytes >= 16 << 20 else 1 << (nbytes.bit_length() - 3)
    return -(-nbytes // step) * step


class _Block:
    """Device memory the caching allocator reserved from the plugin."""

    __slots__ = ("handle", "capacity", "waits")

    def __init__(self, handle, capacity: int):
        self.handle = handle
        self.capacity = capacity
        self.waits: list[tuple[weakref.ref, Event]] = []  # stream work that may still use it


_STAT_NAMES = ("allocated_bytes", "peak_allocated_bytes", "reserved_bytes", "peak_reserved_bytes",
               "cached_bytes", "allocations", "allocation_count", "free_count", "cache_hits",
               "device_allocations", "device_frees")


class _DeviceMemory:
    """One device's allocator: the cache of free blocks by size class and the statistics.

    Releases from finalizers (``__del__``) only append to ``returned``, which
    the next call under the lock takes in: a finalizer may run in the middle
    of any code, this class's included.
    """

    _all: list[_DeviceMemory] = []

    def __init__(self, dev: Device):
        self.device = dev
        self._lock = threading.Lock()
        self._cache: dict[int, list[_Block]] = {}
        self._returned: collections.deque = collections.deque()  # (nbytes, capacity, block or None)
        self._idle_events: list[Event] = []
        self._stats = dict.fromkeys(_STAT_NAMES, 0)
        # Steady-state reuses not yet in _stats: each is a free, a cache hit and an
        # allocation, counted in one integer on the eager path and folded in by stats().
        self._recycled = 0
        self._max_alloc_size = 0  # read from the properties at the first allocation
        _DeviceMemory._all.append(self)

    # -- allocation ---------------------------------------------------------------

    def allocate(self, nbytes: int, stream: Stream | None) -> _Allocation:
        limit = self._max_alloc_size or self._read_max_alloc_size()
        if nbytes > limit:
            raise OutOfMemoryError(f"cannot allocate {nbytes} bytes on {self.device}: more than its "
                                   f"max_alloc_size of {self.device.properties.max_alloc_size} bytes")
        capacity = _size_class(nbytes)
        if _allocator == "none" or capacity > limit:
            return self._allocate_direct(nbytes, stream)
        return self.allocate_class(nbytes, capacity, stream)

    def allocate_class(self, nbytes: int, capacity: int, stream: Stream | None) -> _Allocation:
        """``allocate`` from the cache, for a request already checked:
        ``capacity`` is ``_size_class(nbytes)``, within max_alloc_size, and
        the caching allocator is the one in use (what eager calls cache)."""
        stats = self._stats
        with self._lock:
            returned = self._returned
            if len(returned) == 1:
                freed, returned_capacity, block = returned[0]
                if returned_capacity != capacity or block is None or block.waits:
                    block = None
            else:
                block = None
            if block is not None:
                # An eager op's steady state: the block the last result gave back, reused
                # as it is (what _take_returned and the cache's pop would do, in one step).
                returned.popleft()  # not clear(): a finalizer may have appended since
                self._recycled += 1
                if freed != nbytes:
                    allocated = stats["allocated_bytes"] = stats["allocated_bytes"] + nbytes - freed
                    if allocated > stats["peak_allocated_bytes"]:
                        stats["peak_allocated_bytes"] = allocated
                return _Allocation(self, block.handle, nbytes, block)
            if returned:
                self._take_returned()
            blocks = self._cache.get(capacity)
            if blocks and not blocks[-1].waits:  # the common case: no stream work may still use it
                block = blocks.pop()
            else:
                block = self._reuse(capacity, stream)
            if block is None:
                block = _Block(self._device_alloc(capacity), capacity)
            else:
                stats["cache_hits"] += 1
                stats["cached_bytes"] -= capacity
            # _count_allocation, inlined
            allocated = stats["allocated_bytes"] = stats["allocated_bytes"] + nbytes
            if allocated > stats["peak_allocated_bytes"]:
                stats["peak_allocated_bytes"] = allocated
            stats["allocations"] += 1
            stats["allocation_count"] += 1
        return _Allocation(self, block.handle, nbytes, block)

    def caches(self, nbytes: int) -> int | None:
        """The size class ``allocate_class`` takes for ``nbytes`` while the caching
        allocator is in use and the class fits the device, else None."""
        capacity = _size_class(nbytes)
        return capacity if capacity <= (self._max_alloc_size or self._read_max_alloc_size()) else None

    def _read_max_alloc_size(self) -> int:
        self._max_alloc_size = self.device.properties.max_alloc_size or _SIZE_MAX  # 0: none reported
        return self._max_alloc_size

    def _allocate_direct(self, nbytes: int, stream: Stream | None) -> _Allocation:
        dev = self.device
        out = ffi.new("DK_Mem *")
        if stream is not None and dev.plugin.has("mem_alloc_async"):
            dev.call("mem_alloc_async", dev.index, nbytes, _stream_handle(stream, dev), out)
        else:
            if stream is not None:
                stream.synchronize()
            dev.call("mem_alloc", dev.index, nbytes, out)
        with self._lock:
            self._take_returned()
            self._count_reserved(nbytes)
            self._count_allocation(nbytes)
        return _Allocation(self, out[0], nbytes, None)

    def _reuse(self, capacity: int, stream: Stream | None) -> _Block | None:
        """A cached block of ``capacity`` that work submitted to ``stream`` may use now."""
        blocks = self._cache.get(capacity)
        for i in range(len(blocks) - 1 if blocks else -1, -1, -1):
            if self._ready(blocks[i], stream):
                return blocks.pop(i)
        return None

    def _ready(self, block: _Block, stream: Stream | None) -> bool:
        """True when only ``stream``'s own (earlier, so ordered) work may still use the block."""
        if not block.waits:
            return True

        def ordered(ref) -> bool:
            return stream is not None and ref() is stream

        if not all(ordered(ref) or _completed(event) for ref, event in block.waits):
            return False
        kept = []
        for ref, event in block.waits:
            if ordered(ref):
                kept.append((ref, event))
            else:
                self._idle_events.append(event)
        block.waits = kept
        return True

    def _device_alloc(self, capacity: int):
        dev = self.device
        out = ffi.new("DK_Mem *")
        try:
            dev.call("mem_alloc", dev.index, capacity, out)
        except OutOfMemoryError:
            if not self._stats["cached_bytes"]:
                raise
            self._release_cache()  # what the cache holds may make room
            dev.call("mem_alloc", dev.index, capacity, out)
        self._count_reserved(capacity)
        return out[0]

    def _count_allocation(self, nbytes: int) -> None:
        stats = self._stats
        allocated = stats["allocated_bytes"] = stats["allocated_bytes"] + nbytes
        if allocated > stats["peak_allocated_bytes"]:
            stats["peak_allocated_bytes"] = allocated
        stats["allocations"] += 1
        stats["allocation_count"] += 1

    def _count_reserved(self, capacity: int) -> None:
        stats = self._stats
        stats["reserved_bytes"] += capacity
        stats["peak_reserved_bytes"] = max(stats["peak_reserved_bytes"], stats["reserved_bytes"])
        stats["device_allocations"] += 1

    # -- release ------------------------------------------------------------------

    def release(self, allocation: _Allocation, handle, stream: Stream | None,
                finalizing: bool) -> None:
        """Give ``handle`` back after the pending work that uses it (see the rule above)."""
        block = allocation.block
        if block is not None and stream is None and not allocation.used_on_streams:
            self._returned.append((allocation.nbytes, block.capacity, block))  # no work can be pending on it
            return
        pending = self._pending_streams(allocation)
        if block is None:
            self._free_on_device(handle, pending, stream)
            self._returned.append((allocation.nbytes, allocation.nbytes, None))
        else:
            self._add_waits(block, pending, stream)
            self._returned.append((allocation.nbytes, block.capacity, block))
        if not finalizing:
            with self._lock:
                self._take_returned()

    def _pending_streams(self, allocation: _Allocation) -> list[Stream]:
        if not allocation.used_on_streams:
            return []
        with self.device._streams_lock:
            streams = list(self.device._streams)
        return [s for s in streams if s._handle is not None and allocation in s._allocations]

    def _free_on_device(self, handle, pending: list[Stream], stream: Stream | None) -> None:
        dev = self.device
        if stream is None and pending:
            stream = pending[0]
        if stream is not None and dev.plugin.has("mem_free_async"):
            self._join(stream, pending)
            dev.call("mem_free_async", dev.index, handle, stream.handle)
            return
        try:
            for waited in {*pending, stream} - {None}:
                waited.synchronize()
        finally:  # a stream that failed has finished too
            dev.call("mem_free", dev.index, handle)

    def _add_waits(self, block: _Block, pending: list[Stream], stream: Stream | None) -> None:
        """Tag the block with an event on every stream whose work may use it."""
        if stream is not None:  # free(stream): order the other streams' work into `stream`
            self._join(stream, pending)
            pending = [stream]
        for waited in pending:
            earlier = [e for r, e in block.waits if r() is waited]  # superseded: later on the same stream
            block.waits = [(r, e) for r, e in block.waits if r() is not waited]
            self._idle_events += earlier
            block.waits.append((weakref.ref(waited), self._idle_event().record(waited)))

    def _join(self, stream: Stream, others: list[Stream]) -> None:
        """Work submitted to ``stream`` from now on runs after what ``others`` have so far."""
        for other in others:
            if other is not stream:
                stream.wait_event(other.record(Event(self.device, timing=False)))

    def _idle_event(self) -> Event:
        try:
            return self._idle_events.pop()
        except IndexError:
            return Event(self.device, timing=False)

    def _take_returned(self) -> None:
        """Account for (and cache) what was released since; the caller holds the lock."""
        stats, returned = self._stats, self._returned
        while returned:
            nbytes, capacity, block = returned.popleft()
            stats["allocated_bytes"] -= nbytes
            stats["allocations"] -= 1
            stats["free_count"] += 1
            if block is None:
                stats["reserved_bytes"] -= capacity
                stats["device_frees"] += 1
                continue
            blocks = self._cache.get(capacity)
            if blocks is None:
                self._cache[capacity] = [block]
            else:
                blocks.append(block)
            stats["cached_bytes"] += capacity

    def _release_cache(self) -> None:
        """Free every cached block on the device, each once its pending work ran."""
        dev = self.device
        cache, self._cache = self._cache, {}
        for blocks in cache.values():
            for block in blocks:
                for _, event in block.waits:
                    _completed(event, wait=True)
                dev.call("mem_free", dev.index, block.handle)
                self._stats["reserved_bytes"] -= block.capacity
                self._stats["cached_bytes"] -= block.capacity
                self._stats["device_frees"] += 1
        self._idle_events.clear()

    def empty_cache(self) -> None:
        with self._lock:
            self._take_returned()
            self._release_cache()

    def stats(self) -> dict[str, int]:
        with self._lock:
            self._take_returned()
            stats, recycled = self._stats, self._recycled
            self._recycled = 0
            for name in ("free_count", "cache_hits", "allocation_count"):
                stats[name] += recycled
            return dict(stats)


def _completed(event: Event, wait: bool = False) -> bool:
    """Whether the work before the event's record has run; a failed stream's has too."""
    try:
        if wait:
            event.synchronize()
            return True
        return event.query()
    except DevkitError:
        return True


_holds_lock = threading.Lock()


class _Allocation:
    """Owns one allocation's memory; releases it when freed or when the last Buffer viewing it goes.

    ``handle`` is None once freed; the memory itself goes back (to the cache
    or the plugin) when no hold remains, ordered after the pending work.
    """

    # Slots: every eager op makes one and drops one (a __dict__ for what bridges attach,
    # and for the fields below, which keep their class defaults until set).
    __slots__ = ("memory", "device", "handle", "nbytes", "block", "_owned", "__dict__")
    used_on_streams = False  # set by Stream.retain: only then can work be pending on it
    _holds = 0
    _free_stream: Stream | None = None

    def __init__(self, memory: _DeviceMemory, handle, nbytes: int, block: _Block | None):
        self.memory = memory
        self.device = memory.device
        self.handle = handle
        self.nbytes = nbytes
        self.block = block
        self._owned = handle  # until released

    def hold(self) -> None:
        """Keep the memory from being released until ``unhold`` (a DLPack export, a group)."""
        with _holds_lock:
            if self.handle is None:
                raise ValueError("buffer has been freed")
            self._holds += 1

    def unhold(self, finalizing: bool = False) -> None:
        with _holds_lock:
            self._holds -= 1
            release = not self._holds and self.handle is None and self._owned is not None
        if release:
            self._release(self._pending_free_stream(), finalizing)

    def _pending_free_stream(self) -> Stream | None:
        stream = self._free_stream
        return stream if stream is not None and stream._handle is not None else None

    def free(self, stream: Stream | None = None, finalizing: bool = False) -> None:
        with _holds_lock:
            if self.handle is None:
                return
            self.handle = None
            self._free_stream = stream
            deferred = self._holds > 0
        if not deferred:
            self._release(stream, finalizing)

    def _release(self, stream: Stream | None, finalizing: bool) -> None:
        handle, self._owned = self._owned, None
        if handle is not None:
            self.memory.release(self, handle, stream, finalizing)

    def __del__(self):
        # Nothing refers to the allocation any more, so nothing holds it or frees it
        # concurrently: free()'s lock is not needed.
        handle = self._owned
        if handle is None:
            return
        try:
            block = self.block
            if self._free_stream is None and not self.used_on_streams and block is not None:
                # memory.release's first case, inlined: no work can be pending on it
                self._owned = None
                self.memory._returned.append((self.nbytes, block.capacity, block))
                return
            self._release(self._pending_free_stream(), True)
        except Exception:  # interpreter shutdown or an already-failed plugin
            pass


class Buffer:
    """Device memory addressed as (handle, byte offset): an allocation or a view of one.

    Freeing follows one rule: the runtime never hands a plugin memory that
    pending work still uses. After ``free()`` (or the end of a ``with``
    block, or the last view's garbage collection) the Buffer is unusable at
    once, while its memory goes back only after the work already submitted
    to any stream that uses it (and, for ``free(stream)``, everything
    submitted to ``stream``), and after every DLPack export of it is dropped.
    """

    __slots__ = ("_allocation", "offset", "nbytes", "__dict__")

    def __init__(self, allocation: _Allocation, offset: int, nbytes: int):
        self._allocation = allocation
        self.offset = offset
        self.nbytes = nbytes

    @classmethod
    def allocate(cls, dev: Device, nbytes: int, stream: Stream | None = None) -> Buffer:
        """``nbytes`` of device memory, usable by work submitted to ``stream`` from now on
        (by any stream when None). Past the device's max_alloc_size: OutOfMemoryError."""
        nbytes = _check_size(nbytes, "nbytes")
        if stream is not None and stream.capturing is not None:
            stream = None  # allocated at capture time, kept by the graph (devkit/engine/graph.py)
        if stream is not None:
            _stream_handle(stream, dev)
        return cls(dev._memory.allocate(nbytes, stream), 0, nbytes)

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
        self._check_range("view", offset, nbytes)
        return Buffer(self._allocation, self.offset + offset, nbytes)

    def _check_range(self, what: str, offset: int, nbytes: int) -> None:
        """Bytes [offset, offset + nbytes) must lie inside this buffer (or view)."""
        offset, nbytes = _check_size(offset, f"{what}: offset"), _check_size(nbytes, f"{what}: nbytes")
        if offset + nbytes > self.nbytes:
            raise IndexError(f"{what}: bytes [{offset}, {offset + nbytes}) (offset {offset}, "
                             f"{nbytes} bytes) exceed the {self.nbytes}-byte buffer")

    def copy_from_host(self, src, *, offset: int = 0, stream: Stream | None = None) -> None:
        """Copy a contiguous host buffer to ``offset`` in this buffer."""
        dev = self.device
        pointer, nbytes = _host_span(src, writable=False)
        self._check_range("copy_from_host", offset, nbytes)
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
        offset = _check_size(offset, "copy_to_host: offset")
        if dst is None:
            dst = np.empty(max(self.nbytes - offset, 0) if nbytes is None else
                           _check_size(nbytes, "copy_to_host: nbytes"), dtype=np.uint8)
        pointer, size = _host_span(dst, writable=True)
        if nbytes is not None and nbytes != size:
            raise ValueError(f"copy_to_host: nbytes={nbytes} but the destination holds {size} bytes")
        self._check_range("copy_to_host", offset, size)
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
        """Free the allocation (every view of it) now; its memory goes back once the
        pending work that uses it, and for ``free(stream)`` all work submitted to
        ``stream``, has run, and once no DLPack export of it is left."""
        if stream is not None:
            _stream_handle(stream, self.device)
        self._allocation.free(stream)

    def __enter__(self) -> Buffer:
        return self

    def __exit__(self, *exc_info) -> None:
        self.free()

    def __repr__(self) -> str:
        return f"<devkit.Buffer {self.nbytes} bytes at offset {self.offset} on {self.device}>"


def _check_size(value: int, what: str) -> int:
    """A byte count or offset: an integer (never a float truncated), non-negative."""
    try:
        value = operator.index(value)
    except TypeError:
        raise TypeError(f"{what} must be an integer, got {type(value).__name__} {value!r}") from None
    if value < 0:
        raise ValueError(f"{what} must be non-negative, got {value}")
    return value
