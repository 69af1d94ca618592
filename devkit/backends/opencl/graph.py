"""The graph section (ABI 1.1) of the opencl plugin: pre-bound kernels replayed in one go.

While a stream captures, everything that would be enqueued on it -- OpenCL
commands (kernels with their arguments already set, copies, fills), host
copies, the stream-order checks some kernels queue -- is recorded: a kernel
as a KernelStep (the kernel and its launch shape), the rest as the closure
that would have been enqueued; a launch enqueues them on the launch stream.
No kernel argument is prepared again at launch.

A kernel call is kept as a deep copy of its DK_KernelCall whose stream is the
graph's recorder, a stream that is never run and always records; a rebind
patches one tensor of that copy and prepares that kernel again, through the
recorder, into new closures. Buffers a kernel zero-fills for its checks
(error flags) are zero-filled again at the start of every launch.

Each run of consecutive kernels -- with the zero-fills, which lead the
first -- becomes one Batch when a launch first needs it: enqueued in one tight loop under one
stream lock and one flush, so the Python cost of a kernel at launch is the
pyopencl enqueue alone. Other steps (copies, host copies and checks, event
records and waits) are enqueued one by one between the batches. A rebind or
a new node drops the batches; the next launch makes them again.

cl_khr_command_buffer (PoCL 3.1 reports 0.9.0) would make a batch one
OpenCL command, but PoCL's enqueue of a command buffer costs as much per
recorded command as enqueueing each (2.2-3.6 us on the development
machine, measured), so it is not used.
"""

from __future__ import annotations

import threading

import numpy as np
import pyopencl as cl

from ...abi import C, ffi
from .errors import PluginError, invalid
from .runtime import Device, Stream, _failed, _new_handle, handle_key


def refused(what: str) -> PluginError:
    return PluginError(C.DK_FAILED_PRECONDITION,
                       f"{what} is capturing a graph; this call is refused until graph_end_capture")


def _copy_call(call, stream_handle):
    """A deep copy of a DK_KernelCall on ``stream_handle`` and what keeps it alive."""
    keep = []

    def tensors(source, count):
        array = ffi.new("DK_Tensor[]", max(count, 1))
        for i in range(count):
            t, original = array[i], source[i]
            ffi.memmove(ffi.addressof(t), ffi.addressof(original), ffi.sizeof("DK_Tensor"))
            if original.ndim > 0:
                shape = ffi.new("int64_t[]", [original.shape[k] for k in range(original.ndim)])
                keep.append(shape)
                t.shape = shape
                if original.strides != ffi.NULL:
                    strides = ffi.new("int64_t[]", [original.strides[k] for k in range(original.ndim)])
                    keep.append(strides)
                    t.strides = strides
        keep.append(array)
        return array

    def attribute(a):
        copy = ffi.new("DK_Attribute *")
        ffi.memmove(copy, a, ffi.sizeof("DK_Attribute"))
        keep.append(copy)
        copy.name = _owned(keep, "char[]", ffi.string(a.name))
        if a.type == C.DK_ATTR_INTS:
            copy.ints = _owned(keep, "int64_t[]", [a.ints[k] for k in range(a.count)] or [0])
        elif a.type == C.DK_ATTR_FLOATS:
            copy.floats = _owned(keep, "double[]", [a.floats[k] for k in range(a.count)] or [0.0])
        elif a.type == C.DK_ATTR_STRING:
            copy.s = _owned(keep, "char[]", ffi.string(a.s))
        return copy

    copy = ffi.new("DK_KernelCall *")
    ffi.memmove(copy, call, ffi.sizeof("DK_KernelCall"))
    copy.stream = stream_handle
    copy.inputs = tensors(call.inputs, call.num_inputs)
    copy.outputs = tensors(call.outputs, call.num_outputs)
    attributes = [attribute(call.attributes[i]) for i in range(call.num_attributes)]
    copy.attributes = _owned(keep, "DK_Attribute *[]", attributes or [ffi.NULL])
    keep.append(copy)
    return copy, keep


def _owned(keep: list, ctype: str, init):
    cdata = ffi.new(ctype, init)
    keep.append(cdata)
    return cdata


class KernelStep:
    """A captured kernel: its arguments set at capture (``held`` keeps what
    they point at alive) and its launch shape."""

    __slots__ = ("kernel", "global_size", "local_size", "held")

    def __init__(self, kernel: cl.Kernel, global_size: tuple, local_size: tuple | None, held):
        self.kernel, self.global_size, self.local_size, self.held = kernel, global_size, local_size, held


class Batch:
    """Consecutive kernels of a graph, after the buffers to zero-fill first."""

    __slots__ = ("fills", "kernels")

    def __init__(self):
        self.fills: list[tuple[cl.Buffer, int]] = []
        self.kernels: list[tuple[cl.Kernel, tuple, tuple | None]] = []

    def enqueue(self, queue: cl.CommandQueue) -> cl.Event:
        """Every command on ``queue``, in order; the event is the last one's."""
        event = None
        for buffer, nbytes in self.fills:
            event = cl.enqueue_fill_buffer(queue, buffer, _ZERO, 0, nbytes)
        enqueue = cl.enqueue_nd_range_kernel
        for kernel, global_size, local_size in self.kernels:
            event = enqueue(queue, kernel, global_size, local_size)
        return event


_ZERO = np.uint8(0)


class _Node:
    """Recorded work: steps (kind, closure), and buffers zero-filled before each launch."""

    def __init__(self, prepare=None, call=None, keep=None):
        self.prepare, self.call, self.keep = prepare, call, keep
        self.steps: list[tuple[str, object]] = []
        self.zeroed: list[tuple[cl.Buffer, int]] = []


class Graph:
    def __init__(self, device: Device):
        self.device = device
        self.lock = threading.RLock()  # the node being prepared, and the lists
        self.nodes: list[_Node] = []
        self.slots: list[tuple[_Node, object]] = []  # (kernel node, its DK_Tensor)
        self._preparing: _Node | None = None
        self._launchable: list | None = None  # (kind, step or Batch) per launch step, made at a launch
        self.recorder = Stream(device)
        self.recorder.capture, self.recorder.is_recorder = self, True
        key, self.recorder_handle = _new_handle("DK_Stream")
        with device.lock:
            device.streams[key] = self.recorder

    # -- capture -------------------------------------------------------------------

    def record(self, kind: str, closure) -> None:
        """Stream.enqueue / add_host_work / copy_host of a capturing stream;
        ("kernel", KernelStep) from a kernel's launch."""
        with self.lock:
            self._launchable = None
            if self._preparing is not None:
                self._preparing.steps.append((kind, closure))
            else:
                node = _Node()
                node.steps.append((kind, closure))
                self.nodes.append(node)

    def zero_before_launch(self, buffer: cl.Buffer, nbytes: int) -> None:
        with self.lock:
            if self._preparing is not None:
                self._preparing.zeroed.append((buffer, nbytes))

    def add_kernel(self, call, prepare) -> None:
        """A kernel call on the capturing stream: kept, prepared now (its errors raised now)."""
        copy, keep = _copy_call(call, self.recorder_handle)
        node = _Node(prepare, copy, keep)
        self._prepare(node)
        with self.lock:
            self._launchable = None
            self.nodes.append(node)
            for i in range(copy.num_inputs):
                if copy.inputs[i].ndim >= 0:
                    self.slots.append((node, copy.inputs[i]))
            self.slots.extend((node, copy.outputs[i]) for i in range(copy.num_outputs))

    def _prepare(self, node: _Node) -> None:
        with self.lock:
            steps, zeroed = node.steps, node.zeroed
            node.steps, node.zeroed = [], []
            self._preparing = node
            self._launchable = None
            try:
                node.prepare(node.call)
            except BaseException:
                node.steps, node.zeroed = steps, zeroed
                raise
            finally:
                self._preparing = None

    # -- use -------------------------------------------------------------------------

    def rebind(self, slot: int, mem, offset: int) -> None:
        with self.lock:
            if not 0 <= slot < len(self.slots):
                raise PluginError(C.DK_OUT_OF_RANGE, f"slot {slot} does not exist: the graph has "
                                                     f"{len(self.slots)} slot(s)")
            node, tensor = self.slots[slot]
            captured = tensor.data, tensor.byte_offset
            tensor.data, tensor.byte_offset = mem, offset
            try:
                self._prepare(node)  # checks the tensor against its new memory
            except BaseException:
                tensor.data, tensor.byte_offset = captured
                raise

    def _launch_steps(self) -> list:
        """What a launch enqueues, in order: ("batch", Batch) for each run of
        kernels (the zero-fills lead the first), the other steps as recorded."""
        with self.lock:
            if self._launchable is None:
                first = Batch()
                first.fills = [zeroed for node in self.nodes for zeroed in node.zeroed]
                steps: list = [("batch", first)]
                for node in self.nodes:
                    for kind, step in node.steps:
                        if kind != "kernel":
                            steps.append((kind, step))
                            continue
                        if steps[-1][0] != "batch":
                            steps.append(("batch", Batch()))
                        steps[-1][1].kernels.append((step.kernel, step.global_size, step.local_size))
                self._launchable = [(kind, step) for kind, step in steps
                                    if kind != "batch" or step.fills or step.kernels]
            return self._launchable

    def launch(self, stream: Stream | None) -> None:
        steps = self._launch_steps()
        if stream is None:
            self._run_now(steps)
            return
        d = self.device
        for kind, step in steps:
            if kind == "batch":
                d.submit(stream, step.enqueue)
            elif kind == "enqueue":
                d.submit(stream, step)
            elif kind == "copy_host":
                d.copy_host(stream, step)
            elif kind == "host":
                stream.add_host_work(step)
            elif kind == "record":
                d.record(step, stream)
            else:
                d.wait(stream, step)

    def _run_now(self, steps: list) -> None:
        """A launch on the NULL stream: the commands enqueued on the device's
        (in-order) queue one after another and waited for once -- before host
        work, which must see their results, and at the end."""
        d = self.device
        queue, pending = d.queue, []

        def drain() -> None:
            cl.wait_for_events(pending)
            failed = next((event for event in pending if _failed(event)), None)
            pending.clear()
            if failed is not None:
                raise PluginError(C.DK_INTERNAL, f"OpenCL command failed with status "
                                                 f"{failed.command_execution_status}")

        for kind, step in steps:
            if kind == "batch":
                pending.append(step.enqueue(queue))
            elif kind == "enqueue":
                pending.append(step(queue))
            elif kind == "copy_host":  # blocking (the in-order queue runs what precedes it first)
                step(queue)
            else:
                drain()
                if kind == "host":
                    step()
                elif kind == "record":
                    d.record(step, None)
                else:
                    d.wait(None, step)
        drain()

    def close(self) -> None:
        with self.device.lock:
            self.device.streams.pop(handle_key(self.recorder_handle), None)
        self.recorder.close()
        with self.lock:
            self._launchable, self.nodes, self.slots = None, [], []


# -- the table functions ----------------------------------------------------------------


def _capturing_stream(d: Device, stream) -> Stream:
    if stream == ffi.NULL:
        raise invalid("stream is NULL; the default stream cannot capture")
    return d.stream(stream)


def begin_capture(d: Device, stream) -> None:
    s = _capturing_stream(d, stream)
    if s.capture is not None:
        raise refused(f"stream {handle_key(stream):#x}")
    s.capture = Graph(d)


def end_capture(d: Device, stream, graph, num_slots) -> None:
    s = _capturing_stream(d, stream)
    if graph == ffi.NULL or num_slots == ffi.NULL:
        raise invalid(f"{'graph' if graph == ffi.NULL else 'num_slots'} is NULL")
    g, s.capture = s.capture, None
    if g is None:
        raise PluginError(C.DK_FAILED_PRECONDITION, f"stream {handle_key(stream):#x} is not capturing")
    key, handle = _new_handle("DK_Graph")
    with d.lock:
        d.graphs[key] = g
    graph[0], num_slots[0] = handle, len(g.slots)


def lookup(d: Device, graph) -> Graph:
    if graph == ffi.NULL:
        raise invalid("graph is NULL")
    with d.lock:
        g = d.graphs.get(handle_key(graph))
    if g is None:
        raise invalid(f"graph {handle_key(graph):#x} is not a live graph on {d.name}")
    return g


def launch(d: Device, graph, stream) -> None:
    g = lookup(d, graph)
    s = d.stream(stream)
    if s is not None and s.capture is not None:
        raise refused(f"stream {handle_key(stream):#x}")
    g.launch(s)


def rebind(d: Device, graph, slot: int, mem, offset: int) -> None:
    lookup(d, graph).rebind(slot, mem, offset)


def destroy(d: Device, graph) -> None:
    if graph == ffi.NULL:
        return
    with d.lock:
        g = d.graphs.pop(handle_key(graph), None)
    if g is None:
        raise invalid(f"graph {handle_key(graph):#x} is not a live graph on {d.name}")
    g.close()  # commands already enqueued hold their own references
