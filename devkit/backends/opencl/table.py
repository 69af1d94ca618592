"""DK_PluginInit and the DK_DeviceApi table of the opencl plugin.

Every table function is an ffi.callback with the header's exact function
pointer type, so the host drives this plugin exactly as it drives a C one.
DK_PluginInit and the structs it hands out are boundary.PluginInit's.
"""

from __future__ import annotations

import numpy as np
import pyopencl as cl

from ..._version import __version__
from ...abi import C, ffi, field_end
from . import codegen, graph as graphs, kernels
from .launch import OpenCLCall
from ..support import graph_capture
from ..support.graph_capture import capture_refused
from ..support.boundary import PluginInit, copy_out as _copy_out, not_null as _not_null
from .errors import PluginError, callback, invalid
from .runtime import (
    Device,
    Event,
    Stream,
    _new_handle,
    create_devices,
    handle_key,
    select_devices,
    stage_between_contexts,
)

_devices: list[Device] = []
_log = {"fn": ffi.NULL, "user_data": ffi.NULL}


def log(level: int, message: str) -> None:
    if _log["fn"] != ffi.NULL:
        _log["fn"](_log["user_data"], level, message.encode())


def _device(dev: int) -> Device:
    if not 0 <= dev < len(_devices):
        raise invalid(f"device index {dev} out of range [0, {len(_devices)})")
    return _devices[dev]


def _wait_on_self(what: str, stream: Stream) -> PluginError:
    return PluginError(C.DK_FAILED_PRECONDITION,
                       f"called from a callback running on {what} {id(stream):#x}, which would "
                       f"wait for itself")


# -- device --------------------------------------------------------------------------


def get_device_count(count):
    _not_null(count, "count")
    count[0] = len(_devices)


def get_device_properties(dev, props):
    d = _device(dev)
    _not_null(props, "props")
    cl_device = d.cl_device
    flags = C.DK_DEVICE_FP16 | C.DK_DEVICE_BF16  # stored as ushort, computed in float32
    if d.fp64:
        flags |= C.DK_DEVICE_FP64
    if getattr(cl_device, "host_unified_memory", False):
        flags |= C.DK_DEVICE_UNIFIED_MEMORY
    full = ffi.new("DK_DeviceProperties *", {
        "struct_size": ffi.sizeof("DK_DeviceProperties"),
        "name": cl_device.name.strip().encode()[:127],
        "vendor": cl_device.vendor.strip().encode()[:127],
        "driver_version": cl_device.driver_version.strip().encode()[:63],
        "device_type": C.DK_DEVICE_TYPE_OPENCL,
        "compute_units": max(1, int(cl_device.max_compute_units)),
        "total_memory": d.total_memory,
        "max_alloc_size": d.max_alloc,
        "alloc_alignment": d.alignment,
        "flags": flags,
    })
    _copy_out(props, full, "DK_DeviceProperties")


def device_synchronize(dev):
    d = _device(dev)
    _refuse_if_device_captures(d)
    d.synchronize()


def _refuse_if_device_captures(d: Device) -> None:
    if d.capturing():
        raise capture_refused(f"a stream of {d.name}")


def _refuse_if_capturing(s: Stream | None, stream) -> None:
    if s is not None and s.capture is not None:
        raise capture_refused(f"stream {handle_key(stream):#x}")


# -- memory --------------------------------------------------------------------------


def mem_alloc(dev, size, mem):
    d = _device(dev)
    _not_null(mem, "mem")
    mem[0] = d.alloc(size)


def mem_free(dev, mem):
    d = _device(dev)
    if mem != ffi.NULL:
        _refuse_if_device_captures(d)
        d.free(mem)


def mem_get_info(dev, free_bytes, total_bytes):
    d = _device(dev)
    _not_null(free_bytes, "free_bytes")
    _not_null(total_bytes, "total_bytes")
    free_bytes[0], total_bytes[0] = d.mem_info()


def memset(dev, mem, offset, value, size, stream):
    d = _device(dev)
    m = d.mem("mem", mem, offset, size)
    s = d.stream(stream)
    if size:
        d.submit(s, lambda q: cl.enqueue_fill_buffer(q, m.buffer, np.uint8(value), offset, size))


def copy_h2d(dev, dst, dst_offset, src, size, stream):
    d = _device(dev)
    if size:
        _not_null(src, "src")
    m = d.mem("dst", dst, dst_offset, size)
    s = d.stream(stream)
    if size:
        host = ffi.buffer(src, size)
        d.copy_host(s, lambda q: cl.enqueue_copy(q, m.buffer, host, dst_offset=dst_offset))


def copy_d2h(dev, dst, src, src_offset, size, stream):
    d = _device(dev)
    if size:
        _not_null(dst, "dst")
    m = d.mem("src", src, src_offset, size)
    s = d.stream(stream)
    if size:
        host = ffi.buffer(dst, size)
        d.copy_host(s, lambda q: cl.enqueue_copy(q, host, m.buffer, src_offset=src_offset))


def copy_d2d(dev, dst, dst_offset, src, src_offset, size, stream):
    d = _device(dev)
    to = d.mem("dst", dst, dst_offset, size)
    source = d.mem("src", src, src_offset, size)
    s = d.stream(stream)
    if size:
        d.copy_d2d(to, dst_offset, source, src_offset, size, s)


def copy_p2p(dst_dev, dst, dst_offset, src_dev, src, src_offset, size, stream):
    dd, sd = _device(dst_dev), _device(src_dev)
    to = dd.mem("dst", dst, dst_offset, size)
    source = sd.mem("src", src, src_offset, size)
    s = dd.stream(stream)
    if not size:
        return
    if dd.context is sd.context:  # buffers are context-wide: one copy command
        dd.copy_d2d(to, dst_offset, source, src_offset, size, s)
    else:
        stage_between_contexts(dd, to, dst_offset, sd, source, src_offset, size, s)


def mem_alloc_async(dev, size, stream, mem):
    d = _device(dev)
    _refuse_if_capturing(d.stream(stream), stream)  # allocation is immediate: later work may use it
    _not_null(mem, "mem")
    mem[0] = d.alloc(size)


def mem_free_async(dev, mem, stream):
    d = _device(dev)
    s = d.stream(stream)
    if mem == ffi.NULL:
        return
    _refuse_if_capturing(s, stream)
    if s is None:
        d.free(mem)
    else:
        d.free_async(mem, s)


# -- streams -------------------------------------------------------------------------


def stream_create(dev, stream):
    d = _device(dev)
    _not_null(stream, "stream")
    s = Stream(d)
    key, handle = _new_handle("DK_Stream")
    with d.lock:
        d.streams[key] = s
    stream[0] = handle


def stream_destroy(dev, stream):
    d = _device(dev)
    if stream == ffi.NULL:
        return
    with d.lock:
        s = d.streams.get(handle_key(stream))
        if s is not None and not s.on_worker() and s.capture is None:
            del d.streams[handle_key(stream)]
    if s is None:
        d.stream(stream)  # raises the "not a live stream" error
    if s.on_worker():
        raise _wait_on_self("stream", s)
    _refuse_if_capturing(s, stream)
    s.close()


def stream_synchronize(dev, stream):
    s = _device(dev).stream(stream)
    if s is None:
        return C.DK_OK  # NULL-stream work is complete when its call returns
    _refuse_if_capturing(s, stream)
    if s.on_worker():
        raise _wait_on_self("stream", s)
    return s.check(wait=True)


def stream_query(dev, stream):
    s = _device(dev).stream(stream)
    _refuse_if_capturing(s, stream)
    return C.DK_OK if s is None else s.check(wait=False)


def stream_wait_event(dev, stream, event):
    d = _device(dev)
    e = d.event("event", event)
    s = d.stream(stream)
    if s is not None and s.capture is not None:  # every launch waits for the record current then
        s.capture.record("wait", e)
    else:
        d.wait(s, e)


def stream_add_callback(dev, stream, fn, user_data):
    d = _device(dev)
    _not_null(fn, "fn")
    s = d.stream(stream)
    _refuse_if_capturing(s, stream)
    if s is None:
        fn(user_data)  # the NULL stream has nothing pending to order after
    else:
        s.add_host_work(lambda: fn(user_data))


# -- events --------------------------------------------------------------------------


def event_create(dev, flags, event):
    d = _device(dev)
    _not_null(event, "event")
    if flags & ~C.DK_EVENT_DISABLE_TIMING:
        raise invalid(f"unknown flags {flags:#x} (allowed: DK_EVENT_DISABLE_TIMING = "
                      f"{C.DK_EVENT_DISABLE_TIMING:#x})")
    key, handle = _new_handle("DK_Event")
    with d.lock:
        d.events[key] = Event(timing=not flags & C.DK_EVENT_DISABLE_TIMING)
    event[0] = handle


def event_destroy(dev, event):
    d = _device(dev)
    if event == ffi.NULL:
        return
    with d.lock:
        found = d.events.pop(handle_key(event), None)
    if found is None:  # a pending marker lives on in its queue; nothing else to release
        raise invalid(f"event {handle_key(event):#x} is not a live event on {d.name}")


def event_record(dev, event, stream):
    d = _device(dev)
    e = d.event("event", event)
    s = d.stream(stream)
    if s is not None and s.capture is not None:  # every launch re-records the event here
        s.capture.record("record", e)
    else:
        d.record(e, s)


def event_query(dev, event):
    mark = _device(dev).event("event", event).mark
    return C.DK_OK if mark is None else mark.status(wait=False)


def event_synchronize(dev, event):
    mark = _device(dev).event("event", event).mark
    return C.DK_OK if mark is None else mark.status(wait=True)


def event_elapsed_ms(dev, start, end, ms):
    d = _device(dev)
    _not_null(ms, "ms")
    events = {"start": d.event("start", start), "end": d.event("end", end)}
    for what, e in events.items():
        if e.mark is None:
            raise invalid(f"{what} event was never recorded")
        if not e.timing:
            raise invalid(f"{what} event was created with DK_EVENT_DISABLE_TIMING")
    for e in events.values():
        if e.mark.status(wait=False) == C.DK_NOT_READY:
            return C.DK_NOT_READY
    # Profiling timestamps of the markers: device nanoseconds at completion.
    ms[0] = (events["end"].mark.event.profile.end - events["start"].mark.event.profile.end) / 1e6


# -- the table and DK_PluginInit -------------------------------------------------------

_FUNCTIONS = {
    "get_device_count": get_device_count, "get_device_properties": get_device_properties,
    "device_synchronize": device_synchronize, "mem_alloc": mem_alloc, "mem_free": mem_free,
    "mem_get_info": mem_get_info, "memset": memset, "copy_h2d": copy_h2d, "copy_d2h": copy_d2h,
    "copy_d2d": copy_d2d, "stream_create": stream_create, "stream_destroy": stream_destroy,
    "stream_synchronize": stream_synchronize, "stream_query": stream_query,
    "stream_wait_event": stream_wait_event, "stream_add_callback": stream_add_callback,
    "event_create": event_create, "event_destroy": event_destroy, "event_record": event_record,
    "event_query": event_query, "event_synchronize": event_synchronize,
    "event_elapsed_ms": event_elapsed_ms, "copy_p2p": copy_p2p,
    "mem_alloc_async": mem_alloc_async, "mem_free_async": mem_free_async,
    "graph_begin_capture": lambda dev, stream: graphs.begin_capture(_device(dev), stream),
    "graph_end_capture": lambda dev, stream, graph, num_slots: graphs.end_capture(
        _device(dev), stream, graph, num_slots),
    "graph_launch": lambda dev, graph, stream: graphs.launch(_device(dev), graph, stream),
    "graph_rebind": lambda dev, graph, slot, mem, offset: graph_capture.rebind(
        _device(dev), graph, slot, mem, offset),
    "graph_destroy": lambda dev, graph: graph_capture.destroy(_device(dev), graph),
    "codegen_dialect": lambda dev, dialect: codegen.dialect(_device(dev), dialect),
    "codegen_compile": lambda dev, source, options, module, from_cache: codegen.compile(
        _device(dev), source, options, module, from_cache),
    "codegen_get_function": lambda dev, module, name, kinds, num_args, function: codegen.get_function(
        _device(dev), module, name, kinds, num_args, function),
    "codegen_launch": lambda dev, function, args, num_args, shape, stream: codegen.launch(
        _device(dev), function, args, num_args, shape, stream),
    "codegen_unload": lambda dev, module: codegen.unload(_device(dev), module),
}
# Absent (NULL, the host's documented fallback): host_alloc / host_free, whose
# page-locked memory OpenCL only offers as mapped buffers, and the collectives.


def _initialise_once() -> tuple[int, str]:
    try:
        cl_devices = select_devices()
        if not cl_devices:
            return C.DK_UNAVAILABLE, ("no OpenCL device found: the ICD loader reports no platform "
                                      "with devices (install one, e.g. 'apt-get install "
                                      "pocl-opencl-icd')")
        _devices.extend(create_devices(cl_devices))
        table = kernels.build_table(_devices, _device, OpenCLCall, callback)
    except PluginError as exc:
        return exc.status, f"DK_PluginInit: {exc.message}"
    except cl.Error as exc:
        return C.DK_UNAVAILABLE, f"DK_PluginInit: OpenCL error while opening the devices: {exc}"
    _init.publish(_FUNCTIONS, table.entries, keep=[table])
    return C.DK_OK, ""


def _read_host(host) -> None:
    if host != ffi.NULL and host.struct_size >= field_end("DK_HostInfo", "log_user_data"):
        _log["fn"], _log["user_data"] = host.log, host.log_user_data


def _log_devices() -> None:
    log(C.DK_LOG_INFO, "devkit opencl plugin: " + "; ".join(
        f"{d.index}: {d.cl_device.name.strip()} ({d.cl_device.platform.name.strip()})" for d in _devices))


_init = PluginInit("opencl", __version__, "opencl", callback, _initialise_once, _read_host, _log_devices)
dk_plugin_init = _init.entry
