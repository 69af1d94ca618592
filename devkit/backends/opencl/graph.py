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
first -- becomes one Batch when a launch first needs it: enqueued in one
tight loop under one stream lock and one flush, so the Python cost of a
kernel at launch is the pyopencl enqueue alone. Other steps (copies, host copies and checks, event
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

from ...abi import C
from ..support.boundary import PluginError, handle_key
from ..support.graph_capture import copy_kernel_call, rebind_slot
from .runtime import Device, Stream, _failed, _new_handle


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
        copy, keep = copy_kernel_call(call, self.recorder_handle)
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
            rebind_slot(self.slots, slot, mem, offset, self._prepare)

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
