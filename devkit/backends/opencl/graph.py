"""The graph section (ABI 1.1) of the opencl plugin: pre-bound kernels replayed in one go.

While a stream captures, everything that would be enqueued on it -- OpenCL
commands (kernels with their arguments already set, copies, fills), host
copies, the stream-order checks some kernels queue -- is recorded as the
closure that would have been enqueued, and a launch enqueues those closures
on the launch stream. No kernel argument is prepared again at launch.

A kernel call is kept as a deep copy of its DK_KernelCall whose stream is the
graph's recorder, a stream that is never run and always records; a rebind
patches one tensor of that copy and prepares that kernel again, through the
recorder, into new closures. Buffers a kernel zero-fills for its checks
(error flags) are zero-filled again at the start of every launch.

cl_khr_command_buffer (which PoCL reports) would make a launch one OpenCL
command; pyopencl has no binding for it, so launches enqueue the recorded
commands one by one.
"""

from __future__ import annotations

import threading

import numpy as np
import pyopencl as cl

from ...abi import C
from .. import graph_capture
from ..graph_capture import capture_refused, capturing_stream, copy_kernel_call, lookup, rebind_slot
from .errors import PluginError
from .runtime import Device, Stream, _failed, _new_handle, handle_key


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
        self.recorder = Stream(device)
        self.recorder.capture, self.recorder.is_recorder = self, True
        key, self.recorder_handle = _new_handle("DK_Stream")
        with device.lock:
            device.streams[key] = self.recorder

    # -- capture -------------------------------------------------------------------

    def record(self, kind: str, closure) -> None:
        """Stream.enqueue / add_host_work / copy_host of a capturing stream."""
        with self.lock:
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
        copy, keep = copy_kernel_call(call, self.recorder_handle)
        node = _Node(prepare, copy, keep)
        self._prepare(node)
        with self.lock:
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
            rebind_slot(self.slots, slot, mem, offset, self._prepare)

    def launch(self, stream: Stream | None) -> None:
        d = self.device
        with self.lock:
            nodes = [(list(n.steps), list(n.zeroed)) for n in self.nodes]
        if stream is None:
            self._run_now(nodes)
            return
        for _, zeroed in nodes:
            for buffer, nbytes in zeroed:
                d.submit(stream, lambda q, b=buffer, n=nbytes: cl.enqueue_fill_buffer(
                    q, b, np.uint8(0), 0, n))
        for steps, _ in nodes:
            for kind, closure in steps:
                if kind == "enqueue":
                    d.submit(stream, closure)
                elif kind == "copy_host":
                    d.copy_host(stream, closure)
                elif kind == "host":
                    closure() if stream is None else stream.add_host_work(closure)
                elif kind == "record":
                    d.record(closure, stream)
                else:
                    d.wait(stream, closure)

    def _run_now(self, nodes: list) -> None:
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

        for _, zeroed in nodes:
            pending += [cl.enqueue_fill_buffer(queue, buffer, np.uint8(0), 0, nbytes) for buffer, nbytes in zeroed]
        for steps, _ in nodes:
            for kind, closure in steps:
                if kind == "enqueue":
                    pending.append(closure(queue))
                elif kind == "copy_host":  # blocking (the in-order queue runs what precedes it first)
                    closure(queue)
                else:
                    drain()
                    if kind == "host":
                        closure()
                    elif kind == "record":
                        d.record(closure, None)
                    else:
                        d.wait(None, closure)
        drain()

    def close(self) -> None:
        with self.device.lock:
            self.device.streams.pop(handle_key(self.recorder_handle), None)
        self.recorder.close()
        self.nodes, self.slots = [], []


# -- the table functions (graph_capture has the rest) ----------------------------------


def begin_capture(d: Device, stream) -> None:
    s = capturing_stream(d, stream)
    if s.capture is not None:
        raise capture_refused(f"stream {handle_key(stream):#x}")
    s.capture = Graph(d)


def _take_capture(s: Stream) -> Graph | None:
    g, s.capture = s.capture, None
    return g


def end_capture(d: Device, stream, graph, num_slots) -> None:
    graph_capture.end_capture(d, stream, graph, num_slots, _take_capture)


def launch(d: Device, graph, stream) -> None:
    g = lookup(d, graph)
    s = d.stream(stream)
    if s is not None and s.capture is not None:
        raise capture_refused(f"stream {handle_key(stream):#x}")
    g.launch(s)
