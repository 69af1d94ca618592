"""The graph section (ABI 1.1) of the cuda plugin: recorded work, launched as CUDA graphs.

While a stream captures, nothing is sent to CUDA. A kernel call is kept as a
deep copy of its DK_KernelCall and *prepared* at once: its family runs on a
``RecordingCall``, which plans every launch (errors surface now), builds its
programs, makes its small tables device-resident (``cudaMalloc`` and a
synchronous upload, owned by the graph) and records each piece of stream
work as a step ``fn(cuda_stream)``. Memsets and device-to-device copies are
steps too; host copies, event records and waits are steps that are never
captured (see below).

At the first launch for a binding set, runs of consecutive capturable steps
are captured (cudaStreamBeginCapture in relaxed mode on a private stream,
then cudaStreamEndCapture and cudaGraphInstantiate) into one CUDA graph
each; a launch is then a ``cudaGraphLaunch`` per run, with the steps that
cannot be captured run directly between them, in capture order:

- a stream-order check (an index range a kernel reads): it waits for the
  launch stream and reads device memory, which a CUDA graph cannot do; its
  error becomes the launch stream's sticky error (the rest still runs);
- ``copy_h2d`` / ``copy_d2h``: the host memory may be pageable, and CUDA
  cannot capture a copy from or to pageable memory;
- ``event_record`` / ``stream_wait_event``: re-recorded, and waited for on
  the record that is the most recent when the graph is launched;
- cuBLAS products: CuPy's cuBLAS bindings refuse to run on a capturing
  stream (cuBLAS itself could be captured);
- a run whose capture CUDA refuses (it raises): replayed step by step.

``stats`` counts how many steps each launch ran each way.

A rebind patches one tensor of the copied call and prepares that call again
for its new memory (its tables are cached by the call's bound addresses).
The instantiated CUDA graphs are cached by the bound addresses of every
slot (at most ``CACHED_BINDINGS`` sets): alternating between buffers
captures once per set, not at every rebind.
"""

from __future__ import annotations

import collections
import dataclasses
import threading

import numpy as np

from ...abi import ffi
from ..support.boundary import handle_key, invalid
from ..support.graph_capture import copy_kernel_call, rebind_slot
from . import kernels
from .kernels import CUDA_MEMCPY_HOST_TO_DEVICE, DEFAULT_SHARED_BYTES, CudaCall, SyncReader, plan_launch
from .runtime import CUDA_MEMCPY_DEFAULT, Device, current_stream

CUDA_STREAM_CAPTURE_MODE_RELAXED = 2  # other threads may call CUDA (compile, cudaMalloc) meanwhile
CACHED_BINDINGS = 4  # instantiated binding sets kept per graph

# A step: (kind, fn). "native": fn(cuda_stream) enqueues work a CUDA graph can capture;
# "direct": fn(cuda_stream) enqueues work that is run, never captured; "check": fn(reader)
# returns a PluginError or None once the launch stream has drained.
NATIVE, DIRECT, CHECK = "native", "direct", "check"


@dataclasses.dataclass
class GraphStats:
    """Steps launched inside CUDA graphs and steps run directly (not capturable), since load."""

    cuda_graphs_instantiated: int = 0
    native_steps: int = 0
    direct_steps: int = 0
    checks: int = 0
    capture_failures: int = 0  # runs CUDA refused to capture, replayed step by step


stats = GraphStats()


class RecordingCall(CudaCall):
    """A kernel call prepared for a graph: its work recorded as steps, its
    tables device-resident and owned by the graph (``owned``)."""

    def __init__(self, op: str, call, device_of):
        super().__init__(op, call, device_of)
        self.steps: list[tuple[str, object]] = []
        self.owned: list[int] = []

    def run(self, call, run) -> None:
        run(self)

    def _persistent(self, nbytes: int) -> int:
        pointer = self.device.malloc_internal(nbytes)
        self.owned.append(pointer)
        return pointer

    def scratch(self, nbytes: int) -> np.uint64:
        return np.uint64(self._persistent(nbytes))

    def buffer(self, values, dtype=np.int64, writable: bool = False) -> np.uint64:
        array = np.ascontiguousarray(values, dtype=dtype)
        if array.size == 0:
            array = np.zeros(1, dtype)
        pristine = self._persistent(array.nbytes)
        with self.device.context():
            self.device.runtime.memcpy(pristine, array.ctypes.data, array.nbytes, CUDA_MEMCPY_HOST_TO_DEVICE)
        if not writable:
            return np.uint64(pristine)
        working, n = self._persistent(array.nbytes), array.nbytes
        runtime = self.device.runtime  # every launch starts from the values given now
        self.steps.append((NATIVE, lambda s: runtime.memcpyAsync(working, pristine, n, CUDA_MEMCPY_DEFAULT, s)))
        return np.uint64(working)

    def zeros(self, count: int, dtype=np.int32) -> np.uint64:
        n = np.dtype(dtype).itemsize * max(int(count), 1)
        pointer, runtime = self._persistent(n), self.device.runtime
        self.steps.append((NATIVE, lambda s: runtime.memsetAsync(pointer, 0, n, s)))
        return np.uint64(pointer)

    def check_in_stream_order(self, check) -> None:
        self.steps.append((CHECK, check))

    def enqueue(self, fn) -> None:
        # Library work (cuBLAS): CuPy's cuBLAS bindings refuse a capturing
        # stream (NotImplementedError), so it runs between the CUDA graphs.
        self.steps.append((DIRECT, fn))

    def launch(self, source: str, name: str, args: list, global_size, local_size=None,
               options: str = "") -> None:
        plan = plan_launch(global_size, local_size, args, self.device.limits)
        if 0 in plan.grid:
            return
        with self.device.context():
            kernel = kernels.modules.function(self.device.index, source, options, name)
            if plan.shared_bytes > DEFAULT_SHARED_BYTES:
                kernel.max_dynamic_shared_size_bytes = plan.shared_bytes

        def enqueue(s):
            with current_stream(s):
                kernel(plan.grid, plan.block, plan.args, shared_mem=plan.shared_bytes)

        self.steps.append((NATIVE, enqueue))


class _Node:
    """Recorded work: fixed steps (a memset, a copy), or a kernel call whose
    steps are prepared per binding of its tensors (``variants``)."""

    def __init__(self, steps=None, handles=(), op=None, call=None, keep=None, run=None):
        self.fixed, self.handles = steps, list(handles)
        self.op, self.call, self.keep, self.run = op, call, keep, run
        self.variants: dict[tuple, RecordingCall] = {}

    def tensors(self):
        if self.call is None:
            return []
        return [self.call.inputs[i] for i in range(self.call.num_inputs) if self.call.inputs[i].ndim >= 0] + \
               [self.call.outputs[i] for i in range(self.call.num_outputs)]

    def binding(self) -> tuple:
        return tuple((handle_key(t.data), t.byte_offset) for t in self.tensors())

    def steps(self, device_of) -> list:
        """The steps for the current binding, prepared (and kept) on first use."""
        if self.fixed is not None:
            return self.fixed
        key = self.binding()
        prepared = self.variants.get(key)
        if prepared is None:
            prepared = RecordingCall(self.op, self.call, device_of)
            try:
                self.run(prepared)
            except BaseException:
                _free(prepared.device, prepared.owned)
                raise
            self.variants[key] = prepared
        return prepared.steps


def _abandon_capture(runtime, stream: int) -> None:
    """Ends a capture that failed, dropping what it captured (CUDA may refuse to end it at all)."""
    try:
        runtime.graphDestroy(runtime.streamEndCapture(stream))
    except runtime.CUDARuntimeError:
        pass


def _free(d: Device, pointers) -> None:
    for pointer in pointers:  # cudaFree waits for the work that may still use them
        d.free_internal(pointer)


@dataclasses.dataclass
class _Instance:
    """The launch plan of one binding set: pieces ("graph", cudaGraphExec_t) or (kind, fn)."""

    node_keys: list
    pieces: list


class Graph:
    def __init__(self, device: Device, device_of):
        self.device, self.device_of = device, device_of
        self.lock = threading.RLock()
        self.nodes: list[_Node] = []
        self.slots: list[tuple[_Node, object]] = []
        self.owned: list[int] = []  # staging of overlapping copies
        self.instances: collections.OrderedDict[tuple, _Instance] = collections.OrderedDict()

    # -- capture -------------------------------------------------------------------

    def record(self, native: bool, fn, handles=()) -> None:
        """Table work on the capturing stream (Device.submit): ``fn(cuda_stream)``."""
        with self.lock:
            self.nodes.append(_Node(steps=[(NATIVE if native else DIRECT, fn)], handles=handles))

    def persistent(self, nbytes: int) -> int:
        pointer = self.device.malloc_internal(nbytes)
        self.owned.append(pointer)
        return pointer

    def add_kernel(self, op: str, call, run) -> None:
        """A kernel call on the capturing stream: copied and prepared now (its errors raised now)."""
        copy, keep = copy_kernel_call(call, ffi.NULL)
        node = _Node(op=op, call=copy, keep=keep, run=run)
        node.steps(self.device_of)
        with self.lock:
            self.nodes.append(node)
            self.slots.extend((node, t) for t in node.tensors())

    # -- use -------------------------------------------------------------------------

    def rebind(self, slot: int, mem, offset: int) -> None:
        with self.lock:
            node = rebind_slot(self.slots, slot, mem, offset, lambda n: n.steps(self.device_of))
            self._drop_unused_variants([self.nodes.index(node)])

    def _instance(self) -> _Instance:
        """The launch plan of the current binding set, captured on first use."""
        key = tuple(n.binding() for n in self.nodes)
        found = self.instances.get(key)
        if found is not None:
            self.instances.move_to_end(key)
            return found
        steps = [step for n in self.nodes for step in n.steps(self.device_of)]
        instance = _Instance(list(key), self._capture(steps))
        self.instances[key] = instance
        if len(self.instances) > CACHED_BINDINGS:
            self._release(self.instances.popitem(last=False)[1])
        return instance

    def _capture(self, steps: list) -> list:
        pieces, run = [], []

        def close_run() -> None:
            if run:
                pieces.extend(self._capture_run(list(run)))
                run.clear()

        for kind, fn in steps:
            if kind == NATIVE:
                run.append(fn)
            else:
                close_run()
                pieces.append((kind, fn))
        close_run()
        return pieces

    def _capture_run(self, run: list) -> list:
        """One CUDA graph of the steps ``run``; the steps themselves where CUDA refuses."""
        d = self.device
        runtime = d.runtime
        with d.capture_lock, d.context():  # one capture at a time on the device's capture stream
            stream = d.capture_stream()
            runtime.streamBeginCapture(stream, CUDA_STREAM_CAPTURE_MODE_RELAXED)
            try:
                for fn in run:
                    fn(stream)
            except BaseException as exc:
                _abandon_capture(runtime, stream)
                if not isinstance(exc, runtime.CUDARuntimeError):
                    raise
                stats.capture_failures += 1
                return [(DIRECT, fn) for fn in run]
            try:
                graph = runtime.streamEndCapture(stream)  # raises when the capture was invalidated
                try:
                    executable = runtime.graphInstantiate(graph)
                finally:
                    runtime.graphDestroy(graph)
            except runtime.CUDARuntimeError:
                stats.capture_failures += 1
                return [(DIRECT, fn) for fn in run]
        stats.cuda_graphs_instantiated += 1
        return [("graph", (executable, len(run)))]

    def _release(self, instance: _Instance) -> None:
        """An evicted binding set: its CUDA graphs, and the tables no kept set uses."""
        self._release_execs(instance)
        self._drop_unused_variants(range(len(self.nodes)))

    def _drop_unused_variants(self, indices) -> None:
        """Frees the prepared tables of nodes ``indices`` that neither a kept binding set nor the current one uses."""
        for index in indices:
            node = self.nodes[index]
            wanted = {i.node_keys[index] for i in self.instances.values()} | {node.binding()}
            for key in [k for k in node.variants if k not in wanted]:
                _free(self.device, node.variants.pop(key).owned)

    def launch(self, stream: int | None) -> None:
        d = self.device
        target = stream if stream is not None else d.null_stream
        failure = None
        # Held while submitting: a launch elsewhere may evict (and destroy) a binding set's graphs.
        with self.lock, d.context():
            for node in self.nodes:
                for handle in node.handles + [t.data for t in node.tensors()]:
                    if handle_key(handle) not in d.mems:
                        raise invalid(f"the graph uses memory {handle_key(handle):#x}, which has been freed")
            for kind, value in self._instance().pieces:
                if kind == "graph":
                    d.runtime.graphLaunch(value[0], target)
                    stats.native_steps += value[1]
                elif kind == CHECK:
                    d.runtime.streamSynchronize(target)
                    error = value(SyncReader())
                    stats.checks += 1
                    if error is not None and failure is None:
                        failure = error
                        if stream is not None:
                            d.fail(stream, error)
                else:
                    value(target)
                    stats.direct_steps += 1
            if stream is None:
                d.runtime.streamSynchronize(target)
        if stream is None and failure is not None:
            raise failure

    def close(self) -> None:
        with self.lock:
            for instance in self.instances.values():
                self._release_execs(instance)
            self.instances.clear()
            owned = self.owned + [p for n in self.nodes for v in n.variants.values() for p in v.owned]
            self.nodes, self.slots, self.owned = [], [], []
        _free(self.device, owned)

    def _release_execs(self, instance: _Instance) -> None:
        with self.device.context():
            for kind, value in instance.pieces:
                if kind == "graph":
                    self.device.runtime.graphExecDestroy(value[0])
