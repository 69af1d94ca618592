"""Graphs: stream work captured once and launched many times.

    with stream.capture() as graph:
        y = devkit.ops.Relu(devkit.ops.Add(x, b, stream=stream), stream=stream)
    graph.launch(stream)          # any number of times, on any stream of the device
    graph.rebind(x, other_x)      # the captured kernels now read other_x
    graph.launch(stream); stream.synchronize()
    graph.destroy()               # or ``with graph: ...``

Work submitted to the stream inside the block is recorded, not run: kernel
calls (every op of devkit.ops), copies, memsets, event records and waits.
On a plugin with the graph section (ABI 1.1) the plugin records it and a
launch is one submission; on a plugin without it the host records the
prebuilt kernel calls and table calls and replays them itself (``mode``
"host" forces that path, "native" requires the section).

Memory works as in CUDA graphs: whatever the captured ops allocate (their
outputs, temporaries) is allocated at capture time with plain ``mem_alloc``
and kept alive by the graph until it is destroyed, so every launch writes
into the same buffers. Buffers freed during the capture are freed when it
ends. Calls that would wait for or free work on the capturing stream are
refused with FailedPreconditionError (see devkit.h, "graphs").

Slots are the tensors of the captured kernel calls, in capture order, each
call's inputs before its outputs (omitted optional inputs are not slots).
``graph.rebind(captured_array, new_array)`` moves every slot lying in the
captured array's memory to the same place in the new one; ``rebind(slot,
array_or_buffer)`` moves one slot.

On the host path a kernel validates its call when it is replayed: a call it
refuses raises from ``launch()``, after the steps before it were submitted.

``stream.capture(fuse=True)``: the host records the block on every plugin
and, when it ends, fuses each run of kernels between two other steps
(engine.fusion): the memory something besides the graph still refers to is
an output, the rest internal (released then). The steps are then submitted
to the plugin's capture (native) or kept for host replay. Slots are the
tensors of the fused calls, in order; a rebind of a native fused graph
captures it again at its next launch. ``graph.fusion`` is the report. See
docs/fusion.md.
"""

from __future__ import annotations

import contextlib
import dataclasses
import sys
import weakref

from .. import driver as _driver
from ..abi import C, ffi
from ..driver import _allocation_of
from ..errors import error_for_status
from ..plugin import check
from ..runtime import Array, Buffer, Destroyable, Device, Stream, _stream_handle
from .calls import KernelCall

MODES = ("auto", "native", "host")

# Table functions the host records while it captures (host mode), and the
# position of their stream argument.
_RECORDED = {"memset": 5, "copy_h2d": 5, "copy_d2h": 5, "copy_d2d": 6, "event_record": 2,
             "stream_wait_event": 1}
# Refused on a capturing stream, with the position of the stream argument.
_REFUSED = {"stream_synchronize": 1, "stream_query": 1, "stream_destroy": 1,
            "stream_add_callback": 1, "mem_alloc_async": 2, "mem_free_async": 2}


@dataclasses.dataclass
class _Slot:
    """A captured tensor: where it points now, and the bytes it reaches."""

    allocation: object    # driver._Allocation of the memory it points into
    byte_offset: int      # of element 0 in the allocation
    low: int              # bytes its elements reach, relative to element 0
    high: int
    shape: tuple
    strides: tuple
    dtype: object
    tensor: object = None  # host replay: the DK_Tensor inside the recorded call


def _slot_of(array: Array, tensor=None) -> _Slot:
    low, high = array._extent()
    origin = array.buffer.offset + array.offset
    return _Slot(array.buffer._allocation, origin, low - array.offset, high - array.offset,
                 array.shape, array.strides, array.dtype, tensor)


def _refused(dev: Device, function: str, why: str):
    return error_for_status(C.DK_FAILED_PRECONDITION, f"{dev.plugin.name}.{function}: {why}")


class Graph(Destroyable):
    """Captured work of one device; obtained from ``Stream.capture()``."""

    def __init__(self, stream: Stream, native: bool, fuse: bool = False):
        self.device: Device = stream.device
        self.native = native
        self.fuse = fuse
        self.fusion = None                    # fused: engine.fusion's report, once the capture ends
        # Fused: the block's work as the host recorded it, the memory it uses, and the
        # native graph's own capture stream (a rebind captures the calls again).
        self._recorded: list = []
        self._memory: dict[int, object] = {}  # id(allocation) -> driver._Allocation
        self._native_stream: Stream | None = None
        self._stale = False
        self._stream: Stream | None = None    # while capturing
        self._handle = None                   # native: the DK_Graph
        self._steps: list = []                # host replay: what launch() calls, in order
        self._slots: list[_Slot] = []
        self._keepalive: list = []            # what the captured work uses
        self._launched_on: weakref.WeakSet[Stream] = weakref.WeakSet()
        self._destroyed = False

    # -- capture -----------------------------------------------------------------

    def _begin(self, stream: Stream) -> None:
        dev = self.device
        if stream.capturing is not None:
            raise _refused(dev, "graph_begin_capture", "the stream is already capturing a graph")
        if self.native and not self.fuse:
            dev.call("graph_begin_capture", dev.index, stream.handle)
        self._stream = stream
        stream.capturing = self
        dev._captures.append(self)
        dev._capture_hook = _device_call

    def _end(self, complete: bool = True) -> None:
        """Ends the capture; ``complete``: the block ran to its end (else nothing is fused or submitted)."""
        dev, stream = self.device, self._stream
        try:
            if self.fuse:
                if complete:
                    self._fuse_recorded()
            elif self.native:
                out, count = ffi.new("DK_Graph *"), ffi.new("size_t *")
                dev.call("graph_end_capture", dev.index, stream.handle, out, count)
                self._handle = out[0]
                if count[0] != len(self._slots):  # kernels called around devkit.ops: slots unknown here
                    self._slots = None
        finally:
            self._stream = None
            stream.capturing = None
            dev._captures.remove(self)
            if not dev._captures:
                dev._capture_hook = None
                deferred, dev._deferred_frees = dev._deferred_frees, []
                for handle in deferred:
                    dev.plugin.call("mem_free", dev.index, handle)

    @property
    def records_on_host(self) -> bool:
        """Whether the host records the block's work (host replay, or a fused capture)."""
        return not self.native or self.fuse

    def keep(self, objects) -> None:
        """Keep ``objects`` alive as long as the graph (Stream.retain while capturing)."""
        if self.fuse:  # the memory, not the Arrays: the capture's end tells which the caller holds
            objects = [obj for obj in objects if self._hold(obj) is None]
        self._keepalive.extend(objects)

    def _hold(self, obj):
        """A fused capture keeps the allocation an Array or Buffer lies in (else None)."""
        allocation = _allocation_of(obj)
        if allocation is not None:
            self._memory[id(allocation)] = allocation
        return allocation

    def add_kernel(self, entry, call, keep: list, inputs: list, outputs: list, label: str) -> None:
        """A kernel call submitted to the capturing stream (devkit.ops' launch point)."""
        if self.fuse:
            kernel_call = next(k for k in keep if isinstance(k, KernelCall))
            self._recorded.append((kernel_call, [self._place(a) for a in inputs], [self._place(a) for a in outputs]))
            self._keepalive.append(keep)
            return
        arrays = [*inputs, *outputs]
        tensors = [call.inputs[i] for i in range(len(inputs))] + \
                  [call.outputs[i] for i in range(len(outputs))]
        if self.native:
            check(self.device.plugin, entry.fn(call), label)
        else:
            self._steps.append((_launch_kernel, (entry.fn, call, label)))
            self._keepalive.append(keep)
        self._slots.extend(_slot_of(a, None if self.native else t)
                           for a, t in zip(arrays, tensors) if a is not None)
        self._keepalive.extend(a for a in arrays if a is not None)

    def _record_call(self, function: str, args: tuple, position: int) -> None:
        step = (_launch_call, (function, list(args), position))
        (self._recorded if self.fuse else self._steps).append(step)
        self._keepalive.append(args)

    def _place(self, array: Array | None):
        """Where a fused capture's kernel tensor lies: (id(allocation), _Slot), or None."""
        if array is None:
            return None
        # The slot names its allocation once the capture ends: until then only _memory refers to it.
        return id(self._hold(array)), dataclasses.replace(_slot_of(array), allocation=None)

    # -- fusion (capture(fuse=True)) ----------------------------------------------

    def _fuse_recorded(self) -> None:
        """The end of a fused capture: the recorded kernels fused (each run of
        them between two other steps), the memory the caller still refers to
        an output; the rest of it released; the steps submitted to the
        plugin's capture where the graph is native."""
        # Deferred for start-up: devkit imports this module (Stream.capture), and codegen
        # and fusion add about 20 ms to it that only a fused capture needs.
        from .. import codegen
        from . import fusion

        live = self._referenced_elsewhere()
        recorded, self._recorded = self._recorded, []
        # Memory the recorded copies, memsets and events name: read or written outside the kernels.
        handles = {int(ffi.cast("uintptr_t", a)) for step in recorded if not isinstance(step[0], KernelCall)
                   for a in step[1][1] if isinstance(a, ffi.CData)}
        named = {key for key, allocation in self._memory.items()
                 if int(ffi.cast("uintptr_t", allocation.handle)) in handles}
        segments = _segments(recorded)
        read_in: dict[int, set] = {}  # id(allocation) -> the kernel segments reading it
        for index, segment in enumerate(segments):
            for _, ins, _ in segment if isinstance(segment, list) else ():
                for place in filter(None, ins):
                    read_in.setdefault(place[0], set()).add(index)
        self.fusion = fusion.FusionReport(codegen.dialect(self.device))
        steps = []
        for index, segment in enumerate(segments):
            if not isinstance(segment, list):
                steps.append(segment)
                continue
            passed, natural = _fusion_steps(segment)
            kept = [value for allocation, value in natural.items()
                    if allocation in live or allocation in named or read_in.get(allocation, set()) - {index}]
            fused, report = fusion.fuse_steps(self.device, passed, [], kept)
            self.fusion.groups += report.groups
            self.fusion.fallbacks += report.fallbacks
            steps += fused
        self._steps, self._slots = [], []
        used = live | named
        for step in steps:
            if not isinstance(step[0], (KernelCall, fusion.FusedCall)):
                self._steps.append(step)
                continue
            call, read, made = step
            self._steps.append((_launch_kernel, (call.fn, call.cdata, call.label())))
            for tensors, pieces in ((call.inputs, read), (call.outputs, made)):
                for position, value in sorted(pieces, key=lambda piece: piece[0]):
                    allocation = value.key[0]
                    self._slots.append(dataclasses.replace(value.slot, allocation=self._memory[allocation],
                                                           tensor=tensors[position]))
                    used.add(allocation)
        # The memory only fused-away values used goes back with the capture's end.
        self._keepalive += [allocation for key, allocation in self._memory.items() if key in used]
        self._memory = {}
        if self.native:
            self._capture_natively()

    def _referenced_elsewhere(self) -> set:
        """The ids of the recorded memory something besides this graph refers to."""
        self._memory[0] = object()  # a probe held as the allocations are: its count is the graph's own
        counts = {key: sys.getrefcount(self._memory[key]) for key in list(self._memory)}
        del self._memory[0]
        baseline = counts.pop(0)
        return {key for key, count in counts.items() if count > baseline}

    def _capture_natively(self) -> None:
        """A fused graph's steps captured into a native graph, on a stream of the graph's own."""
        dev = self.device
        if self._native_stream is None:
            self._native_stream = dev.create_stream()
        handle = self._native_stream.handle
        dev.call("graph_begin_capture", dev.index, handle)
        out, count = ffi.new("DK_Graph *"), ffi.new("size_t *")
        try:
            for step, arguments in self._steps:
                step(dev, handle, *arguments)
        except BaseException:
            dev.call("graph_end_capture", dev.index, handle, out, count)
            dev.call("graph_destroy", dev.index, out[0])
            raise
        dev.call("graph_end_capture", dev.index, handle, out, count)
        previous, self._handle, self._stale = self._handle, out[0], False
        if previous is not None:
            dev.call("graph_destroy", dev.index, previous)

    # -- use ----------------------------------------------------------------------

    @property
    def num_slots(self) -> int:
        self._require_ready("num_slots")
        return len(self._slots)

    def launch(self, stream: Stream | None = None) -> None:
        """Run the captured work on ``stream`` (None: the default stream, complete on return)."""
        self._require_ready("launch")
        dev = self.device
        if stream is not None and stream.capturing is not None:
            raise _refused(dev, "graph_launch", "the stream is capturing a graph")
        handle = _stream_handle(stream, dev)
        if self._stale:
            self._capture_natively()
        if self.native:
            dev.call("graph_launch", dev.index, self._handle, handle)
        else:
            for step, arguments in self._steps:
                step(dev, handle, *arguments)
        if stream is not None:
            stream.retain(self._keepalive)
            self._launched_on.add(stream)

    def rebind(self, target: int | Array, new: Array | Buffer, offset: int = 0) -> int:
        """Point captured tensors at other memory; returns how many slots moved.

        ``rebind(slot, array)`` needs an array of the slot's shape, dtype and
        strides; ``rebind(slot, buffer, offset)`` places the slot's element 0
        at ``offset`` in the buffer. ``rebind(captured_array, array)`` moves
        every slot inside the captured array's memory (views included) by the
        same displacement into ``array``, which must match its shape, dtype and
        strides. Pending launches of a native graph are waited for first."""
        self._require_ready("rebind")
        if self._slots is None:
            raise ValueError("this graph's kernels were not all captured through devkit.ops: "
                             "its slots are unknown to the host")
        if isinstance(target, Array):
            moves = self._moves_for_array(target, new)
        else:
            moves = [self._move_for_slot(int(target), new, offset)]
        for stream in list(self._launched_on) if self.native and not self.fuse else ():
            stream.synchronize()
        self._launched_on = weakref.WeakSet()
        for slot, allocation, byte_offset in moves:
            self._point(slot, allocation, byte_offset)
        self._keepalive.append(new)
        return len(moves)

    def _move_for_slot(self, slot: int, new: Array | Buffer, offset: int):
        if not 0 <= slot < len(self._slots):
            raise error_for_status(C.DK_OUT_OF_RANGE, f"graph_rebind: slot {slot} does not exist: "
                                                      f"the graph has {len(self._slots)} slot(s)")
        captured = self._slots[slot]
        if isinstance(new, Array):
            _require_same_layout(captured, new, f"slot {slot}")
            return slot, new.buffer._allocation, new.buffer.offset + new.offset
        if not isinstance(new, Buffer):
            raise TypeError(f"graph_rebind: expected an Array or a Buffer, got {type(new).__name__}")
        if offset + captured.low < 0 or offset + captured.high > new.nbytes:
            raise error_for_status(C.DK_OUT_OF_RANGE, (
                f"graph_rebind: slot {slot} reaches bytes [{offset + captured.low}, "
                f"{offset + captured.high}) of the {new.nbytes}-byte buffer"))
        return slot, new._allocation, new.offset + offset

    def _moves_for_array(self, captured: Array, new: Array):
        region = _slot_of(captured)
        _require_same_layout(region, new, "the captured array")
        first, last = region.byte_offset + region.low, region.byte_offset + region.high
        shift = (new.buffer.offset + new.offset) - region.byte_offset
        moves = [(i, new.buffer._allocation, s.byte_offset + shift)
                 for i, s in enumerate(self._slots)
                 if s.allocation is captured.buffer._allocation
                 and first <= s.byte_offset + s.low and s.byte_offset + s.high <= last]
        if not moves:
            raise ValueError(f"no captured tensor of this graph lies in {captured!r}")
        return moves

    def _point(self, slot: int, allocation, byte_offset: int) -> None:
        dev = self.device
        if allocation.device is not dev:
            raise ValueError(f"graph_rebind: the memory is on {allocation.device}, the graph on {dev}")
        if self.native and not self.fuse:
            dev.call("graph_rebind", dev.index, self._handle, slot, allocation.handle, byte_offset)
        else:  # a fused native graph is captured again at its next launch
            self._stale = self.native
            tensor = self._slots[slot].tensor
            tensor.data, tensor.byte_offset = allocation.handle, byte_offset
        self._slots[slot].allocation, self._slots[slot].byte_offset = allocation, byte_offset

    def _require_ready(self, what: str) -> None:
        if self._destroyed:
            raise ValueError(f"graph {what}: the graph has been destroyed")
        if self._stream is not None:
            raise _refused(self.device, f"graph {what}", "the graph is still being captured")

    def destroy(self) -> None:
        """Release the graph; launches already submitted still complete."""
        if self._destroyed:
            return
        if self._stream is not None:
            self._end(complete=False)
        self._destroyed = True
        handle, self._handle = self._handle, None
        self._steps, self._slots, self._keepalive, self._recorded, self._memory = [], [], [], [], {}
        if handle is not None:
            self.device.call("graph_destroy", self.device.index, handle)
        if self._native_stream is not None:
            self._native_stream.destroy()
            self._native_stream = None

    def __repr__(self) -> str:
        state = "destroyed" if self._destroyed else "capturing" if self._stream else "ready"
        kind = "native" if self.native else "host replay"
        return f"<devkit.Graph {kind} on {self.device}, {state}>"


def _segments(recorded: list) -> list:
    """A fused capture's recorded steps: each run of kernels a list, each other step on its own."""
    segments: list = [[]]
    for step in recorded:
        if isinstance(step[0], KernelCall):
            segments[-1].append(step)
        else:
            segments += [step, []]
    return segments


def _fusion_steps(segment: list) -> tuple[list, dict]:
    """A run of recorded kernels as engine.fusion's steps, (call, [(position,
    value)] read, [(position, value)] made), and per id(allocation) the value
    a call of the run wrote into it."""
    natural: dict = {}
    values: dict[tuple, _Value] = {}  # one per memory and geometry
    steps = []
    for call, ins, outs in segment:
        made = []
        for position, place in enumerate(outs):
            value = natural[place[0]] = values[_key(place)] = _Value(place, first=len(steps))
            made.append((position, value))
        read = []
        for position, place in enumerate(ins):
            if place is not None:
                if _key(place) not in values:  # a view of a call's output, or memory the block reads
                    values[_key(place)] = _Value(place, base=natural.get(place[0]))
                read.append((position, values[_key(place)]))
        steps.append((call, read, made))
    return steps, natural


def _key(place) -> tuple:
    """A fused capture's tensor: its memory, geometry and dtype."""
    allocation, slot = place
    return allocation, slot.byte_offset, slot.shape, slot.strides, slot.dtype


class _Value:
    """A fused capture's kernel tensor as the fusion pass sees it: its _Slot,
    and ``base``, the value its memory's producing call wrote (else itself)."""

    __slots__ = ("slot", "key", "base", "first", "last")

    def __init__(self, place, base=None, first: int = -1):
        self.slot = place[1]
        self.key = _key(place)
        self.base = self if base is None else base
        self.first = self.last = first


def _require_same_layout(captured: _Slot, new: Array, what: str) -> None:
    if (captured.shape, captured.strides, captured.dtype) != (new.shape, new.strides, new.dtype):
        raise ValueError(
            f"graph_rebind: {what} has shape {captured.shape}, strides {captured.strides}, dtype "
            f"{captured.dtype}; the new array has {new.shape}, {new.strides}, {new.dtype}")


def _launch_kernel(dev: Device, stream_handle, fn, call, label: str) -> None:
    call.stream = stream_handle
    check(dev.plugin, fn(call), label)


def _launch_call(dev: Device, stream_handle, function: str, args: list, position: int) -> None:
    args[position] = stream_handle
    dev.plugin.call(function, *args)


def _device_call(dev: Device, function: str, args: tuple) -> int:
    """Device.call while a capture is open on one of the device's streams."""
    if function == "mem_free":  # refused by the ABI while capturing: freed when the capture ends
        dev._deferred_frees.append(args[1])
        return C.DK_OK
    host_captures = [g for g in dev._captures if g.records_on_host]
    if function == "device_synchronize" and host_captures:
        raise _refused(dev, function, "a stream of the device is capturing a graph")
    position = _RECORDED.get(function, _REFUSED.get(function))
    if position is not None and position < len(args):
        for graph in host_captures:
            if graph._stream.handle == args[position]:
                if function in _REFUSED:
                    raise _refused(dev, function, "the stream is capturing a graph; this call is "
                                                  "refused until the capture ends")
                graph._record_call(function, args, position)
                return C.DK_OK
    return dev.plugin.call(function, *args)


@contextlib.contextmanager
def capture(stream: Stream, mode: str = "auto", fuse: bool = False):
    """``with capture(stream) as graph:`` records the stream's work into ``graph``.

    ``fuse``: the host records the block's work and fuses it when the block
    ends (see the module doc). If the block raises, the partial graph is destroyed."""
    if mode not in MODES:
        raise ValueError(f"capture mode {mode!r}: expected one of {', '.join(MODES)}")
    plugin = stream.device.plugin
    if mode == "native" and not plugin.has_graphs:
        raise error_for_status(C.DK_UNIMPLEMENTED, (
            f"{plugin.name}: the plugin has no graph section (ABI 1.1); capture(mode='host') "
            f"replays the work on the host"))
    graph = Graph(stream, plugin.has_graphs if mode == "auto" else mode == "native", bool(fuse))
    graph._begin(stream)
    try:
        yield graph
    except BaseException:
        graph.destroy()
        raise
    try:
        graph._end()
    except BaseException:  # a fused capture's kernel refused its call: nothing is left
        graph.destroy()
        raise


_driver._graph_capture = capture  # Stream.capture: the driver, below this module, calls it
