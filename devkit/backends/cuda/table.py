"""DK_PluginInit and the DK_DeviceApi table of the cuda plugin: the hooks of
support.table.DeviceTable on CuPy's CUDA runtime (runtime.py), plus pinned
host memory and the collectives (ccl.py). Without CuPy, a driver or a
device, DK_PluginInit answers DK_UNAVAILABLE with that reason, which
devkit.list_plugins() shows.

The kernel table is the kernel library's families (devkit/backends/kernels,
which the opencl plugin launches too) launched through kernels.CudaCall.

The graph section records a capturing stream's work and launches it as
CUDA graphs (graph.py; docs/cuda.md, "Graphs").
"""

from __future__ import annotations

from ...abi import C, ffi
from ..support.boundary import PluginError, handle_key, not_null
from ..support.table import DeviceTable
from . import ccl, graph as graphs
from .kernels import CudaCall
from .runtime import (
    CUDA_EVENT_DISABLE_TIMING,
    CUDA_STREAM_NON_BLOCKING,
    create_devices,
    refuse_in_callback,
    run_callback,
    status_of,
    unavailable_reason,
)


class CudaTable(DeviceTable):
    name, call_class = "cuda", CudaCall

    def backend_error(self, exc):
        status = status_of(exc)
        if status == C.DK_NOT_READY:  # a query's answer, not a failure: no message
            return status, None
        return status, f"{type(exc).__name__}: {exc}"

    def open_devices(self):
        reason = unavailable_reason()
        if reason is not None:
            raise PluginError(C.DK_UNAVAILABLE, reason)
        try:
            return create_devices()
        except Exception as exc:
            raise PluginError(C.DK_UNAVAILABLE, f"the CUDA devices cannot be opened: {exc}") from None

    def functions(self):
        return {**super().functions(), **ccl.functions(self.devices)}

    def device(self, dev):
        refuse_in_callback("a devkit function")
        return super().device(dev)

    def properties(self, d):
        p, runtime = d.properties, d.runtime
        flags = C.DK_DEVICE_FP64 | C.DK_DEVICE_FP16
        if p["major"] >= 8:  # bfloat16 arithmetic from Ampere on
            flags |= C.DK_DEVICE_BF16
        if p.get("integrated"):
            flags |= C.DK_DEVICE_UNIFIED_MEMORY
        return {"name": p["name"][:127], "vendor": b"NVIDIA",
                "driver_version": f"CUDA driver {runtime.driverGetVersion()}, runtime "
                                  f"{runtime.runtimeGetVersion()}, sm_{p['major']}{p['minor']}".encode()[:63],
                "device_type": C.DK_DEVICE_TYPE_CUDA, "compute_units": max(1, int(p["multiProcessorCount"])),
                "total_memory": int(p["totalGlobalMem"]), "max_alloc_size": int(p["totalGlobalMem"]),
                "alloc_alignment": 256, "flags": flags}

    def capture_of(self, d, s):
        return d.captures.get(s)

    # -- memory and copies ----------------------------------------------------------

    def alloc_async(self, d, size, s):
        return d.alloc(size, s)  # from the stream-ordered pool on a stream

    def host_alloc(self, dev, size, ptr):
        d = self.device(dev)
        not_null(ptr, "ptr")
        ptr[0] = ffi.cast("void *", d.host_alloc(size))

    def host_free(self, dev, ptr):
        d = self.device(dev)
        if ptr != ffi.NULL:
            d.host_free(handle_key(ptr))

    def fill(self, d, s, target, offset, value, size, mem):
        d.submit(s, lambda cs: d.runtime.memsetAsync(target, value & 0xFF, size, cs), handles=(mem,))

    # Pageable host memory: a CUDA graph cannot hold the copy (run at each launch).
    def upload(self, d, s, to, dst_offset, src, size, dst):
        d.copy(to, handle_key(src), size, s, native=False, handles=(dst,))

    def download(self, d, s, dst, source, src_offset, size, src):
        d.copy(handle_key(dst), source, size, s, native=False, handles=(src,))

    def copy(self, d, s, dst, to, dst_offset, src, source, src_offset, size):
        handles = (dst, src)
        if not (src == dst and abs(dst_offset - src_offset) < size):
            d.copy(to, source, size, s, handles=handles)
            return
        # cudaMemcpy leaves overlapping ranges undefined: through a temporary.
        capture = self.capture_of(d, s) if s is not None else None
        if capture is not None:  # the graph owns one
            temporary = capture.persistent(size)
            d.copy(temporary, source, size, s, handles=handles)
            d.copy(to, temporary, size, s, handles=handles)
            return
        staging = d.alloc(size, s or d.null_stream)
        temporary = handle_key(staging)
        d.copy(temporary, source, size, s)
        d.copy(to, temporary, size, s)
        if s is None:
            d.free(staging)
        else:
            d.free_async(staging, s)

    def copy_peer(self, dd, s, to, dst_offset, sd, source, src_offset, size):
        dd.enable_peer(sd)
        dd.submit(s, lambda cs: dd.runtime.memcpyPeerAsync(to, dd.index, source, sd.index, size, cs))

    # -- streams and events -----------------------------------------------------------

    def create_stream(self, d):
        with d.context():
            s = d.runtime.streamCreateWithFlags(CUDA_STREAM_NON_BLOCKING)
        with d.lock:
            d.streams.add(s)
        return ffi.cast("DK_Stream", s)

    def destroy_stream(self, d, stream):
        s = d.stream(stream)
        self.refuse_if_capturing(d, s, stream)
        with d.lock:
            d.streams.discard(s)
            d.failures.pop(s, None)
        with d.context():
            d.runtime.streamSynchronize(s)  # destroying returns at once; the ABI's destroy drains
            d.runtime.streamDestroy(s)

    def synchronize_stream(self, d, s):
        with d.context():
            d.runtime.streamSynchronize(s)
        d.report(s)

    def query_stream(self, d, s):
        d.report(s)
        with d.context():
            return C.DK_OK if d.runtime.streamQuery(s) == 0 else C.DK_NOT_READY

    def wait_event(self, d, s, e):
        if s is None:
            if e in d.recorded:  # an event never recorded is complete
                d.runtime.eventSynchronize(e)
            return
        # A graph waits for the record that is the latest at its launch: run then, never captured.
        d.submit(s, lambda cs: e in d.recorded and d.runtime.streamWaitEvent(cs, e, 0), native=False)

    def add_callback(self, d, s, fn, user_data):
        with d.context():
            d.runtime.launchHostFunc(s, lambda _arg: run_callback(fn, user_data), 0)

    def create_event(self, d, timing):
        with d.context():
            e = d.runtime.eventCreateWithFlags(0 if timing else CUDA_EVENT_DISABLE_TIMING)
        with d.lock:
            d.events[e] = timing
        return ffi.cast("DK_Event", e)

    def destroy_event(self, d, event):
        e = d.event("event", event)
        with d.lock:
            d.events.pop(e, None)
            d.recorded.discard(e)
            d.event_failures.pop(e, None)
        d.runtime.eventDestroy(e)

    def record_event(self, d, s, e):
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

    def event_status(self, d, e, wait):
        if e not in d.recorded:
            return C.DK_OK
        if wait:
            d.runtime.eventSynchronize(e)
        with d.lock:
            failure = d.event_failures.get(e)
        if failure is not None:
            raise failure
        return C.DK_OK if wait or d.runtime.eventQuery(e) == 0 else C.DK_NOT_READY

    def recorded(self, d, e):
        return e in d.recorded

    def timed(self, d, e):
        return d.events[e]

    def elapsed_ms(self, d, start, end):
        return d.runtime.eventElapsedTime(start, end)

    def begin_capture(self, d, s, stream):
        with d.lock:
            self.refuse_if_capturing(d, s, stream)
            d.captures[s] = graphs.Graph(d, self.device)

    def take_capture(self, d, s):
        return d.captures.pop(s, None)


device_table = CudaTable()
dk_plugin_init = device_table.init.entry
