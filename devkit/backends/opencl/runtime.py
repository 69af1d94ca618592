"""Devices, memory, copies, streams and events of the devkit "opencl" plugin.

Handles are opaque integers (never addresses) that index per-device registries:
a DK_Mem names a pyopencl Buffer, addressed as (buffer, byte offset) with no
pointer arithmetic; a DK_Stream names an in-order, profiling command queue; a
DK_Event names its most recent record, a marker on some queue.

Every enqueue on a stream goes through Stream.enqueue, which keeps the
stream's last command (its completion is the stream's) and flushes the queue
so the device starts on it without waiting for a finish.
"""

from __future__ import annotations

import itertools
import os
import queue as queue_module
import re
import threading

import numpy as np
import pyopencl as cl

from ...abi import C, ffi
from ..kernels.layer import DeviceLimits
from ..support.boundary import PluginError, handle_key, invalid
from .errors import status_of_cl_error

DEVICES_ENV = "DEVKIT_OPENCL_DEVICES"
_COMPLETE = cl.command_execution_status.COMPLETE
_PROFILING = cl.command_queue_properties.PROFILING_ENABLE

# Handles come from one counter for every kind, far from small integers, so a
# stale or made-up value is never mistaken for a live one of another kind.
_handle_numbers = itertools.count(1 << 32, 16)

# The stream whose callback worker is the calling thread, if any.
_worker = threading.local()


def _new_handle(ctype: str):
    key = next(_handle_numbers)
    return key, ffi.cast(ctype, key)


def _check_range(what: str, offset: int, size: int, alloc_size: int) -> None:
    if offset > alloc_size or size > alloc_size - offset:
        raise PluginError(C.DK_OUT_OF_RANGE,
                          f"{what} range [offset {offset}, +{size}) exceeds the "
                          f"{alloc_size}-byte allocation")


def _failed(event: cl.Event) -> bool:
    return event.command_execution_status < 0


class Mem:
    __slots__ = ("buffer", "size")

    def __init__(self, buffer: cl.Buffer | None, size: int):
        self.buffer = buffer  # None for a 0-byte allocation: OpenCL has no empty buffers
        self.size = size


class Stream:
    """An in-order command queue, plus a worker thread for host-side work.

    Host-side work (host callbacks and copies to or from host memory) runs on
    the worker once a marker of the earlier work has completed; later work
    waits behind a barrier on a user event set after it has run. Copies go
    this way because PoCL blocks the enqueuing thread on a read or write
    queued behind an incomplete user event, even a non-blocking one; the
    worker does them as blocking copies on a second queue instead.
    """

    def __init__(self, device: Device):
        self.device = device
        self.queue = cl.CommandQueue(device.context, device.cl_device, properties=_PROFILING)
        self.lock = threading.Lock()  # orders enqueues with the update of `last`
        self.last: cl.Event | None = None
        self.error: PluginError | None = None  # sticky: the first asynchronous failure
        # The graph recording this stream's work instead of running it (graph.py);
        # a graph's recorder stream always records and is never run.
        self.capture = None
        self.is_recorder = False
        self._host_work: queue_module.SimpleQueue | None = None
        self._worker: threading.Thread | None = None
        self._transfers: cl.CommandQueue | None = None

    def enqueue(self, submit) -> cl.Event:
        """Runs ``submit(queue)`` (which enqueues one command and returns its event)."""
        if self.capture is not None:
            self.capture.record("enqueue", submit)
            return None
        with self.lock:
            event = self.last = submit(self.queue)
            self.queue.flush()
            return event

    def add_host_work(self, action) -> None:
        """Runs ``action()`` on the worker, in stream order."""
        if self.capture is not None:
            self.capture.record("host", action)
            return
        with self.lock:
            marker = cl.enqueue_marker(self.queue)
            gate = cl.UserEvent(self.device.context)
            self.last = cl.enqueue_barrier(self.queue, wait_for=[gate])
            self.queue.flush()
            if self._worker is None:
                self._transfers = cl.CommandQueue(self.device.context, self.device.cl_device)
                self._host_work = queue_module.SimpleQueue()
                self._worker = threading.Thread(target=self._run_host_work, daemon=True,
                                                name=f"devkit-opencl-stream-{self.device.index}")
                self._worker.start()
            self._host_work.put((marker, gate, action))

    def copy_host(self, copy) -> None:
        """Runs ``copy(queue)``, a blocking host copy, in stream order."""
        if self.capture is not None:
            self.capture.record("copy_host", copy)
            return
        self.add_host_work(lambda: copy(self._transfers))

    def _run_host_work(self) -> None:
        _worker.stream = self
        while (item := self._host_work.get()) is not None:
            marker, gate, action = item
            try:
                marker.wait()
                action()
            except PluginError as exc:  # a check a graph recorded
                self.fail(exc)
            except cl.Error as exc:
                self.fail(PluginError(status_of_cl_error(exc), f"OpenCL error: {exc}"))
            except Exception as exc:  # recorded on the stream, never lost in the thread
                self.fail(PluginError(C.DK_INTERNAL, f"{type(exc).__name__}: {exc}"))
            finally:
                gate.set_status(_COMPLETE)

    def fail(self, error: PluginError) -> None:
        with self.lock:
            if self.error is None:
                self.error = error

    def on_worker(self) -> bool:
        return getattr(_worker, "stream", None) is self

    def check(self, wait: bool) -> int:
        """Reports the sticky error; else DK_OK when idle, DK_NOT_READY when not."""
        if wait:
            self.queue.finish()
        last = self.last
        if last is not None and _failed(last):
            self.fail(PluginError(C.DK_INTERNAL, f"an OpenCL command failed with status "
                                                 f"{last.command_execution_status}"))
        if self.error is not None:
            raise PluginError(self.error.status,
                              f"work queued on stream {id(self):#x} failed: {self.error.message}")
        if last is None or last.command_execution_status == _COMPLETE:
            return C.DK_OK
        return C.DK_NOT_READY

    def close(self) -> None:
        self.queue.finish()
        if self._worker is not None:
            self._host_work.put(None)
            self._worker.join()


class Mark:
    """One event_record: the marker it enqueued."""

    __slots__ = ("event",)

    def __init__(self, event: cl.Event):
        self.event = event

    def status(self, wait: bool) -> int:
        if wait:
            try:
                self.event.wait()
            except cl.Error:
                pass  # reported from the status below
        status = self.event.command_execution_status
        if status < 0:
            raise PluginError(C.DK_INTERNAL,
                              f"work queued before the event failed (OpenCL status {status})")
        return C.DK_OK if status == _COMPLETE else C.DK_NOT_READY


class Event:
    __slots__ = ("mark", "timing")

    def __init__(self, timing: bool):
        self.timing = timing
        self.mark: Mark | None = None


def limits_of(cl_device: cl.Device) -> DeviceLimits:
    return DeviceLimits(
        max_group_size=int(cl_device.max_work_group_size),
        max_item_sizes=tuple(int(n) for n in cl_device.max_work_item_sizes),
        local_mem_size=int(cl_device.local_mem_size),
        compute_units=int(cl_device.max_compute_units),
        is_cpu=bool(cl_device.type & cl.device_type.CPU),
        exact_divide_sqrt=bool(cl_device.single_fp_config & cl.device_fp_config.CORRECTLY_ROUNDED_DIVIDE_SQRT))


class Device:
    def __init__(self, index: int, cl_device: cl.Device, context: cl.Context):
        self.index = index
        self.cl_device = cl_device
        self.context = context
        self.queue = cl.CommandQueue(context, cl_device, properties=_PROFILING)  # the NULL stream
        self.lock = threading.Lock()  # guards the registries and `used`
        self.mems: dict[int, Mem] = {}
        self.streams: dict[int, Stream] = {}
        self.events: dict[int, Event] = {}
        self.graphs: dict = {}  # graph.Graph by handle
        self.used = 0
        self.pending_frees: list[tuple[cl.Event, int]] = []  # mem_free_async: (marker, bytes)
        self.total_memory = int(cl_device.global_mem_size)
        self.max_alloc = int(cl_device.max_mem_alloc_size)
        self.alignment = max(1, int(cl_device.mem_base_addr_align) // 8)  # reported in bits
        self.fp64 = "cl_khr_fp64" in cl_device.extensions.split()
        self.name = f"opencl device {index} ({cl_device.name.strip()})"
        self.stand_in: cl.Buffer | None = None  # an empty tensor's kernel argument (kernel_buffer)
        self.plugin, self.device_type = "opencl", C.DK_DEVICE_TYPE_OPENCL
        self.limits = limits_of(cl_device)

    # -- registries -------------------------------------------------------------

    def mem(self, what: str, handle, offset: int, size: int) -> Mem:
        if handle == ffi.NULL:
            raise invalid(f"{what} handle is NULL")
        with self.lock:
            mem = self.mems.get(handle_key(handle))
        if mem is None:
            raise invalid(f"{what} handle {handle_key(handle):#x} is not a live allocation on {self.name}")
        _check_range(what, offset, size, mem.size)
        return mem

    def kernel_buffer(self, what: str, handle, offset: int, size: int) -> cl.Buffer:
        """The buffer a kernel takes for byte range [offset, +size) of allocation
        ``handle``. OpenCL has no empty buffers: an empty tensor's is a stand-in never read."""
        buffer = self.mem(what, handle, offset, size).buffer
        if buffer is not None:
            return buffer
        if self.stand_in is None:  # a benign race: two threads may each make one
            self.stand_in = cl.Buffer(self.context, cl.mem_flags.READ_WRITE, 8)
        return self.stand_in

    def stream(self, handle) -> Stream | None:
        """The live stream ``handle`` names; None for the NULL (default) stream."""
        if handle == ffi.NULL:
            return None
        with self.lock:
            stream = self.streams.get(handle_key(handle))
        if stream is None:
            raise invalid(f"stream {handle_key(handle):#x} is not a live stream on {self.name}")
        return stream

    def event(self, what: str, handle) -> Event:
        if handle == ffi.NULL:
            raise invalid(f"{what} is NULL")
        with self.lock:
            event = self.events.get(handle_key(handle))
        if event is None:
            raise invalid(f"{what} {handle_key(handle):#x} is not a live event on {self.name}")
        return event

    def capturing(self) -> bool:
        """Whether a stream of the device (not a graph's recorder) is capturing."""
        with self.lock:
            return any(s.capture is not None and not s.is_recorder for s in self.streams.values())

    # -- work -------------------------------------------------------------------

    def record(self, event: Event, stream: Stream | None) -> None:
        """event_record: the event's most recent record becomes this point of ``stream``."""
        if stream is None:
            marker = cl.enqueue_marker(self.queue)
            marker.wait()
        else:
            marker = stream.enqueue(cl.enqueue_marker)
        event.mark = Mark(marker)

    def wait(self, stream: Stream | None, event: Event) -> None:
        """stream_wait_event: later work on ``stream`` waits for the event's current record."""
        mark = event.mark
        if mark is None:
            return
        if stream is None:
            mark.event.wait()
        else:
            stream.enqueue(lambda q: cl.enqueue_barrier(q, wait_for=[mark.event]))

    def submit(self, stream: Stream | None, submit) -> None:
        """Enqueues on ``stream``, or on the NULL stream and waits for completion."""
        if stream is not None:
            stream.enqueue(submit)
            return
        event = submit(self.queue)
        event.wait()
        if _failed(event):
            raise PluginError(C.DK_INTERNAL,
                              f"OpenCL command failed with status {event.command_execution_status}")

    def copy_host(self, stream: Stream | None, copy) -> None:
        """Runs ``copy(queue)``, a blocking copy to or from host memory, on
        ``stream`` (see Stream) or now on the NULL stream."""
        if stream is None:
            copy(self.queue)
        else:
            stream.copy_host(copy)

    def synchronize(self) -> None:
        with self.lock:
            streams = list(self.streams.values())
        for stream in streams:
            if stream.on_worker():
                raise PluginError(C.DK_FAILED_PRECONDITION,
                                  f"called from a callback running on stream {id(stream):#x} of "
                                  f"{self.name}, which would wait for itself")
        self.queue.finish()
        failure = None
        for stream in streams:  # every stream drained; the first failure reported
            try:
                stream.check(wait=True)
            except PluginError as exc:
                failure = failure or exc
        if failure is not None:
            raise failure

    # -- memory -----------------------------------------------------------------

    def _reclaim(self) -> None:
        """Returns the bytes of mem_free_async frees whose stream has reached them."""
        pending = []
        for marker, size in self.pending_frees:
            if marker.command_execution_status == _COMPLETE or _failed(marker):
                self.used -= size
            else:
                pending.append((marker, size))
        self.pending_frees = pending

    def alloc(self, size: int):
        if size > self.max_alloc:
            raise PluginError(C.DK_RESOURCE_EXHAUSTED,
                              f"cannot allocate {size} bytes on {self.name}: its largest "
                              f"single allocation is {self.max_alloc} bytes")
        # Reserve first, so that concurrent requests never overcommit.
        with self.lock:
            self._reclaim()
            free = self.total_memory - self.used
            if size > free:
                raise PluginError(C.DK_RESOURCE_EXHAUSTED,
                                  f"cannot allocate {size} bytes on {self.name}: {free} bytes "
                                  f"free of {self.total_memory}")
            self.used += size
        try:
            buffer = cl.Buffer(self.context, cl.mem_flags.READ_WRITE, size) if size else None
        except BaseException:
            with self.lock:
                self.used -= size
            raise
        key, handle = _new_handle("DK_Mem")
        with self.lock:
            self.mems[key] = Mem(buffer, size)
        return handle

    def _unregister(self, handle) -> Mem:
        with self.lock:
            mem = self.mems.pop(handle_key(handle), None)
        if mem is None:
            raise invalid(f"handle {handle_key(handle):#x} is not a live allocation on {self.name}")
        return mem

    # Neither free releases the cl_mem explicitly: commands already enqueued hold
    # OpenCL's own reference, and host copies still waiting on a stream worker
    # hold the Mem, so the last Python reference releases it.
    def free(self, handle) -> None:
        mem = self._unregister(handle)
        with self.lock:
            self.used -= mem.size

    def free_async(self, handle, stream: Stream) -> None:
        mem = self._unregister(handle)
        # The accounting waits for the stream to reach the free.
        marker = stream.enqueue(cl.enqueue_marker)
        with self.lock:
            self.pending_frees.append((marker, mem.size))

    def mem_info(self) -> tuple[int, int]:
        with self.lock:
            self._reclaim()
            return self.total_memory - self.used, self.total_memory

    # -- copies -----------------------------------------------------------------

    def copy_d2d(self, dst: Mem, dst_offset: int, src: Mem, src_offset: int, size: int,
                 stream: Stream | None) -> None:
        if src is dst and abs(dst_offset - src_offset) < size:
            # clEnqueueCopyBuffer refuses overlapping ranges: go through a temporary.
            staging = cl.Buffer(self.context, cl.mem_flags.READ_WRITE, size)
            self.submit(stream, lambda q: cl.enqueue_copy(
                q, staging, src.buffer, byte_count=size, src_offset=src_offset))
            self.submit(stream, lambda q: cl.enqueue_copy(
                q, dst.buffer, staging, byte_count=size, dst_offset=dst_offset))
            if stream is None or stream.capture is None:  # a graph replays the copies
                staging.release()  # the queued copies keep it until they ran
            return
        self.submit(stream, lambda q: cl.enqueue_copy(
            q, dst.buffer, src.buffer, byte_count=size, src_offset=src_offset,
            dst_offset=dst_offset))


def _all_devices() -> list[tuple[int, int, cl.Device]]:
    try:
        platforms = cl.get_platforms()
    except cl.Error:  # the ICD loader found no platform at all
        return []
    found = []
    for p, platform in enumerate(platforms):
        try:
            devices = platform.get_devices()
        except cl.Error:  # a platform without devices
            continue
        found.extend((p, d, device) for d, device in enumerate(devices))
    return found


def select_devices() -> list[cl.Device]:
    """Every device the ICD loader reports, or those DEVKIT_OPENCL_DEVICES names:
    comma-separated "platform:device" indices or substrings of device names."""
    found = _all_devices()
    spec = os.environ.get(DEVICES_ENV, "").strip()
    if not spec:
        return [device for _, _, device in found]
    available = ", ".join(f"{p}:{d} {device.name.strip()!r}" for p, d, device in found) or "none"
    chosen: list[cl.Device] = []
    for part in (part.strip() for part in spec.split(",")):
        indices = re.fullmatch(r"(\d+):(\d+)", part)
        if indices:
            matches = [dev for p, d, dev in found if (p, d) == (int(indices[1]), int(indices[2]))]
        else:
            matches = [dev for _, _, dev in found if part and part.lower() in dev.name.lower()]
        if not matches:
            raise invalid(f"{DEVICES_ENV}={spec!r}: {part!r} names no OpenCL device "
                          f"(available: {available})")
        chosen.extend(device for device in matches if device not in chosen)
    return chosen


def create_devices(cl_devices: list[cl.Device]) -> list[Device]:
    """One context per platform, shared by its chosen devices (so copies between
    them are a single enqueue_copy)."""
    contexts: dict[int, cl.Context] = {}
    by_platform: dict[int, list[cl.Device]] = {}
    for device in cl_devices:
        by_platform.setdefault(device.platform.int_ptr, []).append(device)
    for key, members in by_platform.items():
        contexts[key] = cl.Context(members)
    return [Device(i, device, contexts[device.platform.int_ptr]) for i, device in enumerate(cl_devices)]


def stage_between_contexts(dst_device: Device, dst: Mem, dst_offset: int, src_device: Device,
                           src: Mem, src_offset: int, size: int, stream: Stream | None) -> None:
    """copy_p2p between devices of different platforms: read on the source's
    NULL stream, then write in the destination stream's order."""
    host = np.empty(size, np.uint8)
    src_device.copy_host(None, lambda q: cl.enqueue_copy(q, host, src.buffer, src_offset=src_offset))
    dst_device.copy_host(stream, lambda q: cl.enqueue_copy(q, dst.buffer, host, dst_offset=dst_offset))
