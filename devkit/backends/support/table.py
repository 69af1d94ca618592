"""The DK_DeviceApi table of a plugin written in Python, filled from a
narrow set of device hooks.

DeviceTable is what the opencl and cuda tables share: each function's
argument checks and handle lookups, the calls a capturing stream refuses,
the NULL stream's cases, graph end, launch, rebind and destroy, the kernel
table, the host's log and DK_PluginInit. A subclass (opencl/table.py,
cuda/table.py) gives what runs on its device: the hooks below that raise
NotImplementedError, called once the arguments are checked (the copy and
fill hooks only for a nonzero size). Every method named after a
DK_DeviceApi field is published; the fields without one stay NULL (the
host's documented fallbacks).

What the table reads of a plugin's Device: ``name``, ``lock``, ``graphs``
(graph_capture), ``mem(what, handle, offset, size)`` (the range, checked to
lie in a live allocation), ``stream(handle)`` (the live stream, None for the
NULL stream), ``event(what, handle)``, ``alloc(size)``, ``free(handle)``,
``free_async(handle, stream)``, ``mem_info()``, ``synchronize()`` and
``capturing()`` (whether any stream of it captures).
"""

from __future__ import annotations

from ..._version import __version__
from ...abi import C, ffi, field_end
from ..kernels import layer
from . import boundary, graph_capture
from .boundary import PluginError, PluginInit, copy_out, handle_key, invalid, not_null
from .graph_capture import capture_refused, capturing_stream


class DeviceTable:
    name: str               # the plugin's name, which is also its device_type string
    call_class: type[layer.Call]  # the dialect's Call (the kernel layer)

    def __init__(self):
        self.devices: list = []
        self._log = (ffi.NULL, ffi.NULL)  # DK_HostInfo's log and log_user_data
        self.init = PluginInit(self.name, __version__, self.name, self.callback, self._initialise,
                               self._read_host, self.on_first)

    # -- the hooks: what a plugin gives ------------------------------------------------

    def backend_error(self, exc: Exception) -> tuple[int, str | None]:
        """(status, message) of an exception other than PluginError and MemoryError
        (boundary.entry); a None message returns the status without setting one."""
        raise NotImplementedError

    def open_devices(self) -> list:
        """The plugin's devices, opened; a PluginError (DK_UNAVAILABLE) says why not."""
        raise NotImplementedError

    def on_first(self) -> None:
        """Runs after the first successful DK_PluginInit."""

    def properties(self, d) -> dict:
        """The DK_DeviceProperties fields of ``d`` but struct_size."""
        raise NotImplementedError

    def capture_of(self, d, s):
        """The graph stream ``s`` records into, or None."""
        raise NotImplementedError

    def alloc_async(self, d, size: int, s):
        """mem_alloc_async's DK_Mem; the allocation is immediate unless a plugin orders it."""
        return d.alloc(size)

    def fill(self, d, s, target, offset: int, value: int, size: int, mem) -> None:
        """memset of ``target`` (d.mem's range of ``mem`` at ``offset``)."""
        raise NotImplementedError

    def upload(self, d, s, to, dst_offset: int, src, size: int, dst) -> None:
        """copy_h2d from host memory ``src`` to ``to`` (d.mem's range of ``dst``)."""
        raise NotImplementedError

    def download(self, d, s, dst, source, src_offset: int, size: int, src) -> None:
        """copy_d2h from ``source`` (d.mem's range of ``src``) to host memory ``dst``."""
        raise NotImplementedError

    def copy(self, d, s, dst, to, dst_offset: int, src, source, src_offset: int, size: int) -> None:
        """copy_d2d; ``dst`` and ``src`` may be the same allocation, the ranges overlapping."""
        raise NotImplementedError

    def copy_peer(self, dd, s, to, dst_offset: int, sd, source, src_offset: int, size: int) -> None:
        """copy_p2p from device ``sd`` to device ``dd``, in the order of ``s`` (of dd)."""
        raise NotImplementedError

    def create_stream(self, d):
        """A new stream of ``d``, registered: its DK_Stream."""
        raise NotImplementedError

    def destroy_stream(self, d, stream) -> None:
        """stream_destroy of ``stream`` (not NULL): its checks, draining and release."""
        raise NotImplementedError

    def synchronize_stream(self, d, s) -> int | None:
        """stream_synchronize of ``s`` (not capturing): its status."""
        raise NotImplementedError

    def query_stream(self, d, s) -> int:
        """DK_OK when ``s`` (not capturing) is idle, DK_NOT_READY when not; its sticky error raised."""
        raise NotImplementedError

    def wait_event(self, d, s, e) -> None:
        """stream_wait_event: later work on ``s`` (or the NULL stream's caller) waits for ``e``."""
        raise NotImplementedError

    def add_callback(self, d, s, fn, user_data) -> None:
        """Calls ``fn(user_data)`` once the work queued on ``s`` (not NULL) has run."""
        raise NotImplementedError

    def create_event(self, d, timing: bool):
        """A new event of ``d``, registered: its DK_Event."""
        raise NotImplementedError

    def destroy_event(self, d, event) -> None:
        """event_destroy of ``event`` (not NULL); a dead one is INVALID_ARGUMENT."""
        raise NotImplementedError

    def record_event(self, d, s, e) -> None:
        raise NotImplementedError

    def event_status(self, d, e, wait: bool) -> int:
        """DK_OK once ``e``'s latest record has completed (or it has none), else
        DK_NOT_READY; with ``wait``, once it has. A failure before it is raised."""
        raise NotImplementedError

    def recorded(self, d, e) -> bool:
        raise NotImplementedError

    def timed(self, d, e) -> bool:
        """Whether ``e`` was created without DK_EVENT_DISABLE_TIMING."""
        raise NotImplementedError

    def elapsed_ms(self, d, start, end) -> float | None:
        """Milliseconds between two recorded, timed events; None while either is pending."""
        raise NotImplementedError

    def begin_capture(self, d, s, stream) -> None:
        """graph_begin_capture on ``s`` (not NULL); refuse_if_capturing refuses a nested one."""
        raise NotImplementedError

    def take_capture(self, d, s):
        """Ends the capture on ``s``: its graph, or None when it was not capturing."""
        raise NotImplementedError

    # -- what the hooks share ----------------------------------------------------------

    def device(self, dev: int):
        if not 0 <= dev < len(self.devices):
            raise invalid(f"device index {dev} out of range [0, {len(self.devices)})")
        return self.devices[dev]

    def refuse_if_capturing(self, d, s, stream) -> None:
        if s is not None and self.capture_of(d, s) is not None:
            raise capture_refused(f"stream {handle_key(stream):#x}")

    def refuse_if_device_captures(self, d) -> None:
        if d.capturing():
            raise capture_refused(f"a stream of {d.name}")

    def callback(self, ctype: str, name: str, fn):
        """The C-boundary wrapper (boundary.callback) with the plugin's errors mapped."""
        return boundary.callback(ctype, name, fn, self.backend_error)

    def build_kernel_table(self, devices: list) -> layer.KernelTable:
        """The kernel table on ``devices``."""
        return layer.build_table(devices, self.device, self.call_class, self.callback)

    def functions(self) -> dict:
        """The table's functions by DK_DeviceApi field name."""
        return {name: getattr(self, name) for name, _ in ffi.typeof("DK_DeviceApi").fields
                if hasattr(self, name)}

    def log(self, level: int, message: str) -> None:
        fn, user_data = self._log
        if fn != ffi.NULL:
            fn(user_data, level, message.encode())

    def _read_host(self, host) -> None:
        if host != ffi.NULL and host.struct_size >= field_end("DK_HostInfo", "log_user_data"):
            self._log = host.log, host.log_user_data

    def _initialise(self) -> tuple[int, str]:
        try:
            self.devices.extend(self.open_devices())
            table = self.build_kernel_table(self.devices)
        except PluginError as exc:
            return exc.status, f"DK_PluginInit: {exc.message}"
        self.init.publish(self.functions(), table.entries, keep=[table])
        return C.DK_OK, ""

    # -- device and memory --------------------------------------------------------------

    def get_device_count(self, count):
        not_null(count, "count")
        count[0] = len(self.devices)

    def get_device_properties(self, dev, props):
        d = self.device(dev)
        not_null(props, "props")
        full = ffi.new("DK_DeviceProperties *",
                       {"struct_size": ffi.sizeof("DK_DeviceProperties"), **self.properties(d)})
        copy_out(props, full, "DK_DeviceProperties")

    def device_synchronize(self, dev):
        d = self.device(dev)
        self.refuse_if_device_captures(d)
        d.synchronize()

    def mem_alloc(self, dev, size, mem):
        d = self.device(dev)
        not_null(mem, "mem")
        mem[0] = d.alloc(size)

    def mem_free(self, dev, mem):
        d = self.device(dev)
        if mem != ffi.NULL:
            self.refuse_if_device_captures(d)  # captured work may use it
            d.free(mem)

    def mem_get_info(self, dev, free_bytes, total_bytes):
        d = self.device(dev)
        not_null(free_bytes, "free_bytes")
        not_null(total_bytes, "total_bytes")
        free_bytes[0], total_bytes[0] = d.mem_info()

    def mem_alloc_async(self, dev, size, stream, mem):
        d = self.device(dev)
        s = d.stream(stream)
        self.refuse_if_capturing(d, s, stream)  # later work may use it
        not_null(mem, "mem")
        mem[0] = self.alloc_async(d, size, s)

    def mem_free_async(self, dev, mem, stream):
        d = self.device(dev)
        s = d.stream(stream)
        if mem == ffi.NULL:
            return
        self.refuse_if_capturing(d, s, stream)
        if s is None:
            d.free(mem)
        else:
            d.free_async(mem, s)

    def memset(self, dev, mem, offset, value, size, stream):
        d = self.device(dev)
        target = d.mem("mem", mem, offset, size)
        s = d.stream(stream)
        if size:
            self.fill(d, s, target, offset, value, size, mem)

    # -- copies -----------------------------------------------------------------------

    def copy_h2d(self, dev, dst, dst_offset, src, size, stream):
        d = self.device(dev)
        if size:
            not_null(src, "src")
        to = d.mem("dst", dst, dst_offset, size)
        s = d.stream(stream)
        if size:
            self.upload(d, s, to, dst_offset, src, size, dst)

    def copy_d2h(self, dev, dst, src, src_offset, size, stream):
        d = self.device(dev)
        if size:
            not_null(dst, "dst")
        source = d.mem("src", src, src_offset, size)
        s = d.stream(stream)
        if size:
            self.download(d, s, dst, source, src_offset, size, src)

    def copy_d2d(self, dev, dst, dst_offset, src, src_offset, size, stream):
        d = self.device(dev)
        to = d.mem("dst", dst, dst_offset, size)
        source = d.mem("src", src, src_offset, size)
        s = d.stream(stream)
        if size:
            self.copy(d, s, dst, to, dst_offset, src, source, src_offset, size)

    def copy_p2p(self, dst_dev, dst, dst_offset, src_dev, src, src_offset, size, stream):
        dd, sd = self.device(dst_dev), self.device(src_dev)
        to = dd.mem("dst", dst, dst_offset, size)
        source = sd.mem("src", src, src_offset, size)
        s = dd.stream(stream)
        if size:
            self.copy_peer(dd, s, to, dst_offset, sd, source, src_offset, size)

    # -- streams ----------------------------------------------------------------------

    def stream_create(self, dev, stream):
        d = self.device(dev)
        not_null(stream, "stream")
        stream[0] = self.create_stream(d)

    def stream_destroy(self, dev, stream):
        d = self.device(dev)
        if stream != ffi.NULL:
            self.destroy_stream(d, stream)

    def stream_synchronize(self, dev, stream):
        d = self.device(dev)
        s = d.stream(stream)
        if s is None:
            return C.DK_OK  # NULL-stream work is complete when its call returns
        self.refuse_if_capturing(d, s, stream)
        return self.synchronize_stream(d, s)

    def stream_query(self, dev, stream):
        d = self.device(dev)
        s = d.stream(stream)
        self.refuse_if_capturing(d, s, stream)
        return C.DK_OK if s is None else self.query_stream(d, s)

    def stream_wait_event(self, dev, stream, event):
        d = self.device(dev)
        e = d.event("event", event)
        self.wait_event(d, d.stream(stream), e)

    def stream_add_callback(self, dev, stream, fn, user_data):
        d = self.device(dev)
        not_null(fn, "fn")
        s = d.stream(stream)
        self.refuse_if_capturing(d, s, stream)  # a host function would have to outlive every launch
        if s is None:
            fn(user_data)  # the NULL stream has nothing pending to order after
        else:
            self.add_callback(d, s, fn, user_data)

    # -- events -----------------------------------------------------------------------

    def event_create(self, dev, flags, event):
        d = self.device(dev)
        not_null(event, "event")
        if flags & ~C.DK_EVENT_DISABLE_TIMING:
            raise invalid(f"unknown flags {flags:#x} (allowed: DK_EVENT_DISABLE_TIMING = "
                          f"{C.DK_EVENT_DISABLE_TIMING:#x})")
        event[0] = self.create_event(d, timing=not flags & C.DK_EVENT_DISABLE_TIMING)

    def event_destroy(self, dev, event):
        d = self.device(dev)
        if event != ffi.NULL:
            self.destroy_event(d, event)

    def event_record(self, dev, event, stream):
        d = self.device(dev)
        e = d.event("event", event)
        self.record_event(d, d.stream(stream), e)

    def event_query(self, dev, event):
        d = self.device(dev)
        return self.event_status(d, d.event("event", event), wait=False)

    def event_synchronize(self, dev, event):
        d = self.device(dev)
        return self.event_status(d, d.event("event", event), wait=True)

    def event_elapsed_ms(self, dev, start, end, ms):
        d = self.device(dev)
        not_null(ms, "ms")
        events = {"start": d.event("start", start), "end": d.event("end", end)}
        for what, e in events.items():
            if not self.recorded(d, e):
                raise invalid(f"{what} event was never recorded")
            if not self.timed(d, e):
                raise invalid(f"{what} event was created with DK_EVENT_DISABLE_TIMING")
        elapsed = self.elapsed_ms(d, events["start"], events["end"])
        if elapsed is None:
            return C.DK_NOT_READY
        ms[0] = elapsed

    # -- graphs (graph_capture) ---------------------------------------------------------

    def graph_begin_capture(self, dev, stream):
        d = self.device(dev)
        self.begin_capture(d, capturing_stream(d, stream), stream)

    def graph_end_capture(self, dev, stream, graph, num_slots):
        d = self.device(dev)
        graph_capture.end_capture(d, stream, graph, num_slots, lambda s: self.take_capture(d, s))

    def graph_launch(self, dev, graph, stream):
        d = self.device(dev)
        g = graph_capture.lookup(d, graph)
        s = d.stream(stream)
        self.refuse_if_capturing(d, s, stream)
        g.launch(s)

    def graph_rebind(self, dev, graph, slot, mem, offset):
        graph_capture.rebind(self.device(dev), graph, slot, mem, offset)

    def graph_destroy(self, dev, graph):
        graph_capture.destroy(self.device(dev), graph)
