"""DK_PluginInit and the DK_DeviceApi table of the opencl plugin: the hooks
of support.table.DeviceTable on pyopencl (runtime.py), plus the codegen
section (codegen.py).

Absent (NULL, the host's documented fallback): host_alloc / host_free, whose
page-locked memory OpenCL only offers as mapped buffers, and the collectives.
"""

from __future__ import annotations

import numpy as np
import pyopencl as cl

from ...abi import C, ffi
from ..support.boundary import PluginError, handle_key, invalid
from ..support.table import DeviceTable
from . import codegen, errors, graph as graphs
from .launch import OpenCLCall
from .runtime import Event, Stream, _new_handle, create_devices, select_devices, stage_between_contexts


def _wait_on_self(s: Stream) -> PluginError:
    return PluginError(C.DK_FAILED_PRECONDITION,
                       f"called from a callback running on stream {id(s):#x}, which would wait for itself")


class OpenCLTable(DeviceTable):
    name, call_class = "opencl", OpenCLCall

    def backend_error(self, exc):
        return errors.backend_error(exc)

    def open_devices(self):
        try:
            cl_devices = select_devices()
            if not cl_devices:
                raise PluginError(C.DK_UNAVAILABLE, "no OpenCL device found: the ICD loader reports no "
                                                    "platform with devices (install one, e.g. 'apt-get "
                                                    "install pocl-opencl-icd')")
            return create_devices(cl_devices)
        except cl.Error as exc:
            raise PluginError(C.DK_UNAVAILABLE, f"OpenCL error while opening the devices: {exc}") from None

    def on_first(self):
        self.log(C.DK_LOG_INFO, "devkit opencl plugin: " + "; ".join(
            f"{d.index}: {d.cl_device.name.strip()} ({d.cl_device.platform.name.strip()})" for d in self.devices))

    def properties(self, d):
        cl_device = d.cl_device
        flags = C.DK_DEVICE_FP16 | C.DK_DEVICE_BF16  # stored as ushort, computed in float32
        if d.fp64:
            flags |= C.DK_DEVICE_FP64
        if getattr(cl_device, "host_unified_memory", False):
            flags |= C.DK_DEVICE_UNIFIED_MEMORY
        return {"name": cl_device.name.strip().encode()[:127], "vendor": cl_device.vendor.strip().encode()[:127],
                "driver_version": cl_device.driver_version.strip().encode()[:63],
                "device_type": C.DK_DEVICE_TYPE_OPENCL, "compute_units": max(1, int(cl_device.max_compute_units)),
                "total_memory": d.total_memory, "max_alloc_size": d.max_alloc, "alloc_alignment": d.alignment,
                "flags": flags}

    def capture_of(self, d, s):
        return s.capture

    # -- memory and copies ----------------------------------------------------------

    def fill(self, d, s, target, offset, value, size, mem):
        d.submit(s, lambda q: cl.enqueue_fill_buffer(q, target.buffer, np.uint8(value), offset, size))

    def upload(self, d, s, to, dst_offset, src, size, dst):
        host = ffi.buffer(src, size)
        d.copy_host(s, lambda q: cl.enqueue_copy(q, to.buffer, host, dst_offset=dst_offset))

    def download(self, d, s, dst, source, src_offset, size, src):
        host = ffi.buffer(dst, size)
        d.copy_host(s, lambda q: cl.enqueue_copy(q, host, source.buffer, src_offset=src_offset))

    def copy(self, d, s, dst, to, dst_offset, src, source, src_offset, size):
        d.copy_d2d(to, dst_offset, source, src_offset, size, s)

    def copy_peer(self, dd, s, to, dst_offset, sd, source, src_offset, size):
        if dd.context is sd.context:  # buffers are context-wide: one copy command
            dd.copy_d2d(to, dst_offset, source, src_offset, size, s)
        else:
            stage_between_contexts(dd, to, dst_offset, sd, source, src_offset, size, s)

    # -- streams and events -----------------------------------------------------------

    def create_stream(self, d):
        s = Stream(d)
        key, handle = _new_handle("DK_Stream")
        with d.lock:
            d.streams[key] = s
        return handle

    def destroy_stream(self, d, stream):
        with d.lock:  # unregistered only if it can be destroyed, so that one destroy wins
            s = d.streams.get(handle_key(stream))
            if s is not None and not s.on_worker() and s.capture is None:
                del d.streams[handle_key(stream)]
        if s is None:
            d.stream(stream)  # raises the "not a live stream" error
        if s.on_worker():
            raise _wait_on_self(s)
        self.refuse_if_capturing(d, s, stream)
        s.close()

    def synchronize_stream(self, d, s):
        if s.on_worker():
            raise _wait_on_self(s)
        return s.check(wait=True)

    def query_stream(self, d, s):
        return s.check(wait=False)

    def wait_event(self, d, s, e):
        if s is not None and s.capture is not None:  # every launch waits for the record current then
            s.capture.record("wait", e)
        else:
            d.wait(s, e)

    def add_callback(self, d, s, fn, user_data):
        s.add_host_work(lambda: fn(user_data))

    def create_event(self, d, timing):
        key, handle = _new_handle("DK_Event")
        with d.lock:
            d.events[key] = Event(timing)
        return handle

    def destroy_event(self, d, event):
        with d.lock:
            found = d.events.pop(handle_key(event), None)
        if found is None:  # a pending marker lives on in its queue; nothing else to release
            raise invalid(f"event {handle_key(event):#x} is not a live event on {d.name}")

    def record_event(self, d, s, e):
        if s is not None and s.capture is not None:  # every launch re-records the event here
            s.capture.record("record", e)
        else:
            d.record(e, s)

    def event_status(self, d, e, wait):
        return C.DK_OK if e.mark is None else e.mark.status(wait)

    def recorded(self, d, e):
        return e.mark is not None

    def timed(self, d, e):
        return e.timing

    def elapsed_ms(self, d, start, end):
        if any(e.mark.status(wait=False) == C.DK_NOT_READY for e in (start, end)):
            return None
        # Profiling timestamps of the markers: device nanoseconds at completion.
        return (end.mark.event.profile.end - start.mark.event.profile.end) / 1e6

    def begin_capture(self, d, s, stream):
        self.refuse_if_capturing(d, s, stream)
        s.capture = graphs.Graph(d)

    def take_capture(self, d, s):
        g, s.capture = s.capture, None
        return g

    # -- codegen (codegen.py) -----------------------------------------------------------

    def codegen_dialect(self, dev, dialect):
        codegen.dialect(self.device(dev), dialect)

    def codegen_compile(self, dev, source, options, module, from_cache):
        codegen.compile(self.device(dev), source, options, module, from_cache)

    def codegen_get_function(self, dev, module, name, kinds, num_args, function):
        codegen.get_function(self.device(dev), module, name, kinds, num_args, function)

    def codegen_launch(self, dev, function, args, num_args, shape, stream):
        codegen.launch(self.device(dev), function, args, num_args, shape, stream)

    def codegen_unload(self, dev, module):
        codegen.unload(self.device(dev), module)


device_table = OpenCLTable()
dk_plugin_init = device_table.init.entry
