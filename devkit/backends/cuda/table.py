"""DK_PluginInit and the DK_DeviceApi table of the cuda plugin.

Every table function is an ffi.callback with the header's exact function
pointer type, so the host drives this plugin exactly as it drives a C one
(the opencl plugin's table.py is the model). Without CuPy, a driver or a
device, DK_PluginInit answers DK_UNAVAILABLE with that reason, which
devkit.list_plugins() shows.

The kernel table is the opencl plugin's families (the dialect-neutral layer,
devkit/backends/opencl/kernels.py) launched through kernels.CudaCall.

The graph section records a capturing stream's work and launches it as
CUDA graphs (graph.py; docs/cuda.md, "Graphs").
"""

from __future__ import annotations

from ... import __version__
from ...abi import C, ffi
from ..opencl import kernels
from ..support import boundary, graph_capture
from ..support.boundary import PluginInit, copy_out, invalid, not_null
from . import ccl, graph as graphs
from .kernels import CudaCall
from .runtime import (
    CUDA_EVENT_DISABLE_TIMING,
    CUDA_STREAM_NON_BLOCKING,
    Device,
    create_devices,
    key_of,
    refuse_in_callback,
    run_callback,
    status_of,
    unavailable_reason,
)

_devices: list[Device] = []


def _backend_error(exc: Exception) -> tuple[int, str | None]:
    status = status_of(exc)
    if status == C.DK_NOT_READY:  # a query's answer, not a failure: no message
        return status, None
    return status, f"{type(exc).__name__}: {exc}"


def callback(ctype: str, name: str, fn):
    return boundary.callback(ctype, name, fn, _backend_error)


def _device(dev: int) -> Device:
    refuse_in_callback("a devkit function")
    if not 0 <= dev < len(_devices):
        raise invalid(f"device index {dev} out of range [0, {len(_devices)})")
    return _devices[dev]


# -- device and memory ----------------------------------------------------------------


def get_device_count(count):
    not_null(count, "count")
    count[0] = len(_devices)


def get_device_properties(dev, props):
    d = _device(dev)
    not_null(props, "props")
    p = d.properties
    flags = C.DK_DEVICE_FP64 | C.DK_DEVICE_FP16
    if p["major"] >= 8:  # bfloat16 arithmetic from Ampere on
        flags |= C.DK_DEVICE_BF16
    if p.get("integrated"):
        flags |= C.DK_DEVICE_UNIFIED_MEMORY
    runtime = d.runtime
    full = ffi.new("DK_DeviceProperties *", {
        "struct_size": ffi.sizeof("DK_DeviceProperties"),
        "name": p["name"][:127], "vendor": b"NVIDIA",
        "driver_version": f"CUDA driver {runtime.driverGetVersion()}, runtime "
                          f"{runtime.runtimeGetVersion()}, sm_{p['major']}{p['minor']}".encode()[:63],
        "device_type": C.DK_DEVICE_TYPE_CUDA, "compute_units": max(1, int(p["multiProcessorCount"])),
        "total_memory": int(p["totalGlobalMem"]), "max_alloc_size": int(p["totalGlobalMem"]),
        "alloc_alignment": 256, "flags": flags,
    })
    copy_out(props, full, "DK_DeviceProperties")


def device_synchronize(dev):
    d = _device(dev)
    d.refuse_if_device_captures()
    d.synchronize()


def mem_alloc(dev, size, mem):
    d = _device(dev)
    not_null(mem, "mem")
    mem[0] = d.alloc(size)


def mem_free(dev, mem):
    d = _device(dev)
    if mem != ffi.NULL:
        d.refuse_if_device_captures()  # captured work may use it
        d.free(mem)


def mem_get_info(dev, free_bytes, total_bytes):
    d = _device(dev)
    not_null(free_bytes, "free_bytes")
    not_null(total_bytes, "total_bytes")
    free_bytes[0], total_bytes[0] = d.mem_info()


def mem_alloc_async(dev, size, stream, mem):
    d = _device(dev)
    s = d.stream(stream)
    d.refuse_if_capturing(s)
    not_null(mem, "mem")
    mem[0] = d.alloc(size) if s is None else d.alloc(size, s)


def mem_free_async(dev, mem, stream):
    d = _device(dev)
    s = d.stream(stream)
    d.refuse_if_capturing(s)
    if mem == ffi.NULL:
        return
    if s is None:
        d.free(mem)
    else:
        d.free_async(mem, s)


def host_alloc(dev, size, ptr):
    d = _device(dev)
    not_null(ptr, "ptr")
    ptr[0] = ffi.cast("void *", d.host_alloc(size))


def host_free(dev, ptr):
    d = _device(dev)
    if ptr != ffi.NULL:
        d.host_free(key_of(ptr))


def memset(dev, mem, offset, value, size, stream):
    d = _device(dev)
    address = d.mem("mem", mem, offset, size)
    s = d.stream(stream)
    if size:
        d.submit(s, lambda cs: d.runtime.memsetAsync(address, value & 0xFF, size, cs), handles=(mem,))


def copy_h2d(dev, dst, dst_offset, src, size, stream):
    d = _device(dev)
    if size:
        not_null(src, "src")
    to = d.mem("dst", dst, dst_offset, size)
    # Pageable host memory: a CUDA graph cannot hold the copy (run at each launch).
    d.copy(to, key_of(src), size, d.stream(stream), native=False, handles=(dst,))


def copy_d2h(dev, dst, src, src_offset, size, stream):
    d = _device(dev)
    if size:
        not_null(dst, "dst")
    source = d.mem("src", src, src_offset, size)
    d.copy(key_of(dst), source, size, d.stream(stream), native=False, handles=(src,))


def copy_d2d(dev, dst, dst_offset, src, src_offset, size, stream):
    d = _device(dev)
    to = d.mem("dst", dst, dst_offset, size)
    source = d.mem("src", src, src_offset, size)
    s, handles = d.stream(stream), (dst, src)
    if src == dst and abs(dst_offset - src_offset) < size:
        # cudaMemcpy leaves overlapping ranges undefined: through a temporary.
        capture = d.captures.get(s) if s is not None else None
        if capture is not None:  # the graph owns one
            temporary = capture.persistent(size)
            d.copy(temporary, source, size, s, handles=handles)
            d.copy(to, temporary, size, s, handles=handles)
            return
        staging = d.alloc(size, s or d.null_stream)
        temporary = key_of(staging)
        d.copy(temporary, source, size, s)
        d.copy(to, temporary, size, s)
        mem_free_async(dev, staging, stream)
        return
    d.copy(to, source, size, s, handles=handles)


def copy_p2p(dst_dev, dst, dst_offset, src_dev, src, src_offset, size, stream):
    dd, sd = _device(dst_dev), _device(src_dev)
    to = dd.mem("dst", dst, dst_offset, size)
    source = sd.mem("src", src, src_offset, size)
    s = dd.stream(stream)
    if size:
        dd.enable_peer(sd)
        dd.submit(s, lambda cs: dd.runtime.memcpyPeerAsync(to, dd.index, source, sd.index, size, cs))


# -- streams and events ------------------------------------------------------------------


def stream_create(dev, stream):
    d = _device(dev)
    not_null(stream, "stream")
    with d.context():
        s = d.runtime.streamCreateWithFlags(CUDA_STREAM_NON_BLOCKING)
    with d.lock:
        d.streams.add(s)
    stream[0] = ffi.cast("DK_Stream", s)


def stream_destroy(dev, stream):
    d = _device(dev)
    if stream == ffi.NULL:
        return
    s = d.stream(stream)
    d.refuse_if_capturing(s)
    with d.lock:
        d.streams.discard(s)
        d.failures.pop(s, None)
    with d.context():
        d.runtime.streamSynchronize(s)  # destroying returns at once; the ABI's destroy drains
        d.runtime.streamDestroy(s)


def stream_synchronize(dev, stream):
    d = _device(dev)
    s = d.stream(stream)
    d.refuse_if_capturing(s)
    if s is not None:
        with d.context():
            d.runtime.streamSynchronize(s)
        d.report(s)


def stream_query(dev, stream):
    d = _device(dev)
    s = d.stream(stream)
    d.refuse_if_capturing(s)
    if s is None:
        return C.DK_OK
    d.report(s)
    with d.context():
        return C.DK_OK if d.runtime.streamQuery(s) == 0 else C.DK_NOT_READY


def stream_wait_event(dev, stream, event):
    d = _device(dev)
    e = d.event("event", event)
    s = d.stream(stream)
    if s is None:
        if e in d.recorded:  # an event never recorded is complete
            d.runtime.eventSynchronize(e)
        return
    # A graph waits for the record that is the latest at its launch: run then, never captured.
    d.submit(s, lambda cs: e in d.recorded and d.runtime.streamWaitEvent(cs, e, 0), native=False)


def stream_add_callback(dev, stream, fn, user_data):
    d = _device(dev)
    not_null(fn, "fn")
    s = d.stream(stream)
    d.refuse_if_capturing(s)  # a host function would have to outlive every launch
    if s is None:
        fn(user_data)  # the NULL stream has nothing pending to order after
        return
    with d.context():
        d.runtime.launchHostFunc(s, lambda _arg: run_callback(fn, user_data), 0)


def event_create(dev, flags, event):
    d = _device(dev)
    not_null(event, "event")
    if flags & ~C.DK_EVENT_DISABLE_TIMING:
        raise invalid(f"unknown flags {flags:#x} (allowed: DK_EVENT_DISABLE_TIMING = "
                      f"{C.DK_EVENT_DISABLE_TIMING:#x})")
    timing = not flags & C.DK_EVENT_DISABLE_TIMING
    with d.context():
        e = d.runtime.eventCreateWithFlags(0 if timing else CUDA_EVENT_DISABLE_TIMING)
    with d.lock:
        d.events[e] = timing
    event[0] = ffi.cast("DK_Event", e)


def event_destroy(dev, event):
    d = _device(dev)
    if event == ffi.NULL:
        return
    e = d.event("event", event)
    with d.lock:
        d.events.pop(e, None)
        d.recorded.discard(e)
        d.event_failures.pop(e, None)
    d.runtime.eventDestroy(e)


def event_record(dev, event, stream):
    d = _device(dev)
    e = d.event("event", event)
    s = d.stream(stream)

    def record(cs) -> None:  # a graph re-records it at every launch (never captured)
        d.runtime.eventRecord(e, cs)
        with d.lock:
            d.recorded.add(e)
            failure = d.failures.get(cs)  # an event recorded after a stream's failure reports it
            if failure is None:
                d.event_failures.pop(e, None)
            else:
                d.event_failures[e] = failure

    d.submit(s, record, native=False)


def event_query(dev, event):
    d = _device(dev)
    e = d.event("event", event)
    if e not in d.recorded:
        return C.DK_OK
    _report_event(d, e)
    return C.DK_OK if d.runtime.eventQuery(e) == 0 else C.DK_NOT_READY


def event_synchronize(dev, event):
    d = _device(dev)
    e = d.event("event", event)
    if e in d.recorded:
        d.runtime.eventSynchronize(e)
        _report_event(d, e)


def _report_event(d, e: int) -> None:
    with d.lock:
        failure = d.event_failures.get(e)
    if failure is not None:
        raise failure


def event_elapsed_ms(dev, start, end, ms):
    d = _device(dev)
    not_null(ms, "ms")
    events = {"start": d.event("start", start), "end": d.event("end", end)}
    for what, e in events.items():
        if e not in d.recorded:
            raise invalid(f"{what} event was never recorded")
        if not d.events[e]:
            raise invalid(f"{what} event was created with DK_EVENT_DISABLE_TIMING")
    ms[0] = d.runtime.eventElapsedTime(events["start"], events["end"])


# -- graphs (graph.py) ------------------------------------------------------------------


def graph_begin_capture(dev, stream):
    graphs.begin_capture(_device(dev), _device, stream)


def graph_end_capture(dev, stream, graph, num_slots):
    graphs.end_capture(_device(dev), stream, graph, num_slots)


def graph_launch(dev, graph, stream):
    graphs.launch(_device(dev), graph, stream)


def graph_rebind(dev, graph, slot, mem, offset):
    graph_capture.rebind(_device(dev), graph, slot, mem, offset)


def graph_destroy(dev, graph):
    graph_capture.destroy(_device(dev), graph)


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
    "event_elapsed_ms": event_elapsed_ms, "copy_p2p": copy_p2p, "host_alloc": host_alloc,
    "host_free": host_free, "mem_alloc_async": mem_alloc_async, "mem_free_async": mem_free_async,
    "graph_begin_capture": graph_begin_capture, "graph_end_capture": graph_end_capture,
    "graph_launch": graph_launch, "graph_rebind": graph_rebind, "graph_destroy": graph_destroy,
}


def build_kernel_table(devices: list) -> kernels.KernelTable:
    """The kernel table on ``devices`` (sources.py enumerates the programs of this one)."""
    return kernels.build_table(devices, _device, CudaCall, callback)


def _initialise_once() -> tuple[int, str]:
    reason = unavailable_reason()
    if reason is not None:
        return C.DK_UNAVAILABLE, f"DK_PluginInit: {reason}"
    try:
        _devices.extend(create_devices())
    except Exception as exc:
        return C.DK_UNAVAILABLE, f"DK_PluginInit: the CUDA devices cannot be opened: {exc}"
    table = build_kernel_table(_devices)
    functions = dict(_FUNCTIONS)
    functions.update(ccl.functions(_devices))
    _init.publish(functions, table.entries, keep=[table])
    return C.DK_OK, ""


_init = PluginInit("cuda", __version__, "cuda", callback, _initialise_once)
dk_plugin_init = _init.entry
