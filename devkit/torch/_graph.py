"""A torch.compile FX graph as one devkit plan: one launch per run, one sync.

The graph's first run with given input dtypes, shapes, strides and devices
runs its nodes op by op under a GraphRecorder (the eager fast path's
Recorder, ``_replay``), which builds every kernel call as a prebuilt
engine.KernelCall and notes where its tensors come from. View nodes need no
call (their consumers find them by memory). Factory nodes whose results do
not depend on the inputs' values (``full``, ``arange``, ``full_like`` ...)
run once and stay resident as constants.

Where the plugin has the codegen section the calls are fused first
(engine.fusion: a value another call reads through a view stays in memory;
the compile option ``fuse`` turns it off); ``GraphPlan.fusion`` reports it.
The plan then places every input and every call's output in one arena
(engine.plan_memory: liveness-based reuse), points the calls at it once and
hands them to engine.make_launcher: a native graph where the plugin has the
graph section, host replay elsewhere. A run copies the inputs into the
arena, launches, copies the outputs out into fresh allocations and
synchronizes once. A graph with anything a plan cannot redo (a value read
back, a host copy, an op without a lowering or kernel) runs op by op.
"""

from __future__ import annotations

import threading

import torch

from ..abi import ffi
from ..engine import Lifetime, fusion, make_launcher, plan_memory
from . import _memory, _replay

aten = torch.ops.aten

# Nodes whose results depend on their arguments' shapes and values given in the graph only.
CONSTANT_FACTORIES = frozenset(
    overload for packet in (aten.full, aten.full_like, aten.zeros, aten.zeros_like, aten.ones, aten.ones_like,
                            aten.arange, aten.scalar_tensor, aten.new_full, aten.new_zeros, aten.new_ones)
    for overload in (getattr(packet, name) for name in packet.overloads())
    if "out" not in overload._overloadname)


class NotPlannable(Exception):
    """The graph run did something a plan cannot redo."""


class GraphRecorder(_replay.Recorder):
    """A Recorder across a whole graph: views are geometry only, constants are kept."""

    def __init__(self, tensors: list):
        super().__init__(tensors)
        self.constants: list[torch.Tensor] = []

    def view(self, base, geometries) -> None:
        """A view needs no call: the calls reading it find it by its memory."""

    def write(self, destination, source) -> bool:
        self.replayable = False  # a graph input written: the plan would write its staged copy
        return False

    def add_constant(self, tensor: torch.Tensor) -> None:
        array = _memory.to_array(tensor)
        self.constants.append(tensor)
        self._origins.setdefault(id(array.buffer._allocation),
                                 (-len(self.constants), array.buffer.offset + array.offset))


def input_key(tensors) -> tuple | None:
    parts = []
    for value in tensors:
        if not isinstance(value, torch.Tensor) or value.is_cpu:
            return None
        parts.append((value.get_device(), value.dtype, value.shape, value.stride()))
    return tuple(parts)


class _Value:
    """What the fusion pass sees of one source read through one geometry:
    ``base`` is the value its producing call wrote (itself for that value and
    for an input's or constant's reads); ``first``/``last`` are the pass's."""

    __slots__ = ("source", "delta", "base", "first", "last")

    def __init__(self, source: int, delta: int, base=None, first: int = -1):
        self.source, self.delta, self.base = source, delta, self if base is None else base
        self.first = self.last = first


def _address(tensor) -> int:
    return int(ffi.cast("uintptr_t", ffi.addressof(tensor)))


def _fuse(device, steps: list, count: int, kept: set) -> tuple[list, fusion.FusionReport]:
    """``steps`` (call, [(tensor, source, byte offset)], [(tensor, source, nbytes)]) with the
    fusion pass run over them; ``kept``: the sources the graph returns."""
    values: dict = {}  # (source, delta, shape, strides, dtype) -> _Value
    natural: dict[int, _Value] = {}  # a call's output source -> the value it writes
    sizes = {}
    passed = []
    for index, (call, ins, outs) in enumerate(steps):
        made = []
        for tensor, source, nbytes in outs:
            position = next(k for k in range(call.cdata.num_outputs) if _address(call.outputs[k]) == _address(tensor))
            value = natural[source] = _Value(source, 0, first=index)
            values[(source, 0, *fusion._tensor_info(tensor))] = value
            sizes[source] = nbytes
            made.append((position, value))
        read = []
        positions = {_address(call.inputs[k]): k for k in range(call.cdata.num_inputs)}
        for tensor, source, delta in ins:
            key = (source, delta, *fusion._tensor_info(tensor))  # a bitcast view is another value
            value = values.get(key)
            if value is None:  # a view: of a call's output, or of an input or a constant
                value = values[key] = _Value(source, delta, natural.get(source))
            value.last = index
            read.append((positions[_address(tensor)], value))
        passed.append((call, read, made))
    fused, report = fusion.fuse_steps(device, passed, [], [natural[source] for source in kept])
    return [(call, [(call.inputs[k], v.source, v.delta) for k, v in read],
             [(call.outputs[k], v.source, sizes[v.source]) for k, v in made]) for call, read, made in fused], report


class GraphPlan:
    """A recorded graph run: see the module doc. ``fuse`` (default: where the
    plugin has the codegen section) runs engine.fusion over the calls;
    ``fusion`` is its report (None unfused)."""

    def __init__(self, recording: GraphRecorder, results: list, fuse: bool | None = None):
        if not recording.replayable:
            raise NotPlannable("the graph has an op a plan cannot redo")
        devices = {device for step in recording.steps for _, _, device in step.outputs}
        if len(devices) != 1:
            raise NotPlannable(f"the graph's calls run on {len(devices)} devices, a plan on one")
        self.device = device = devices.pop()
        self.constants = recording.constants
        self.resident = recording.resident
        inputs = recording.tensors
        count = len(inputs)
        # Per call: (call, [(tensor, source, byte offset from the source's start)], [(tensor, source, nbytes)]).
        steps, source = [], count
        for step in recording.steps:
            outs = []
            for tensor, nbytes, _ in step.outputs:
                outs.append((tensor, source, nbytes))
                source += 1
            steps.append((step.call, step.inputs, outs))
        output_sizes = [nbytes for _, _, outs in steps for _, _, nbytes in outs]
        self.results = [self._result(recording, value, count) for value in results]
        returned = {result[1] for result in self.results if result is not None and result[0] == "output"}
        self.fusion = None
        if device.plugin.has_codegen if fuse is None else fuse:
            steps, self.fusion = _fuse(device, steps, count, returned)
        # Where each input's bytes lie: (byte offset of the tensor from its extent's start, extent size).
        extents = []
        for tensor in inputs:
            array = _memory.to_array(tensor)
            low, high = array._extent()
            extents.append((array.offset - low, high - low))
        last_read = [-1] * (count + len(output_sizes))
        first_written = [None] * len(output_sizes)  # None: fused away, it takes no memory
        for index, (_, ins, outs) in enumerate(steps):
            for _, source, _ in ins:
                if source >= 0:
                    last_read[source] = index
            for _, source, _ in outs:
                first_written[source - count] = index
        for source in returned:  # copied out after the last call
            last_read[source] = len(steps)
        lifetimes = [Lifetime(size, -1, last_read[i]) for i, (_, size) in enumerate(extents)]
        # An output nothing reads is still written: it lives for its own step.
        lifetimes += [Lifetime(0, 0, 0) if first is None else Lifetime(size, first, max(first, last_read[count + i]))
                      for i, (size, first) in enumerate(zip(output_sizes, first_written))]
        alignment = max(64, int(device.properties.alloc_alignment or 0))
        self.memory = plan_memory(lifetimes, alignment)
        self.arena = arena = device.alloc(max(self.memory.arena_bytes, 1))
        offsets = self.memory.offsets
        handle = arena.handle
        # Per input, the (slot, byte offset from the input's start) of every call that reads it.
        self.readers: list[list] = [[] for _ in inputs]
        for _, ins, outs in steps:
            for slot, source, delta in ins:
                if source < 0:  # a resident constant
                    constant = _memory.to_array(self.constants[-source - 1])
                    slot.data = constant.buffer.handle
                    slot.byte_offset = constant.buffer.offset + constant.offset + delta
                elif source < count:
                    self.readers[source].append((slot, delta))
                else:
                    slot.data = handle
                    slot.byte_offset = arena.offset + offsets[source] + delta
            for slot, source, _ in outs:
                slot.data = handle
                slot.byte_offset = arena.offset + offsets[source]
        # Inputs no call reads are not copied in.
        self.staging = [(arena.view(offsets[i], size), lead, size if last_read[i] >= 0 else 0, tensor.element_size())
                        for i, ((lead, size), tensor) in enumerate(zip(extents, inputs))]
        # An input the calls read in place, where it lies: (storage token, byte offset), or None
        # once it has moved (it is then copied into its place in the arena at every run). The
        # calls read each input in place at first: weights stay where they are from run to run.
        self.homes: list[tuple[int, int] | None] = [None] * count
        for index, tensor in enumerate(inputs):
            if self.staging[index][2]:
                self.homes[index] = self._bind_in_place(index, tensor)
        self.output_sizes = output_sizes
        self.count = count
        self.calls = [call for call, _, _ in steps]
        self.launcher = make_launcher(device, self.calls)
        self.stream = device.create_stream()
        self.lock = threading.Lock()

    def _bind_in_place(self, index: int, tensor: torch.Tensor) -> tuple[int, int]:
        """Point the calls reading input ``index`` at ``tensor``'s own memory; returns where it lies."""
        token = tensor.untyped_storage().data_ptr()
        handle, start = _memory.live[token][0].handle, tensor.storage_offset() * tensor.element_size()
        for slot, delta in self.readers[index]:
            slot.data = handle
            slot.byte_offset = start + delta
        return token, start

    def _bind_staged(self, index: int) -> None:
        """Point the calls reading input ``index`` at its place in the arena."""
        staged, lead, _, _ = self.staging[index]
        for slot, delta in self.readers[index]:
            slot.data = staged.handle
            slot.byte_offset = staged.offset + lead + delta

    @staticmethod
    def _result(recording, value, count):
        """How the plan makes one graph output: None, an input, a view of one, or an output of a call."""
        if value is None:
            return None
        if not isinstance(value, torch.Tensor) or value.is_cpu:
            raise NotPlannable(f"a graph output is {type(value).__name__}, not a devkit tensor")
        for index, tensor in enumerate(recording.tensors):
            if value is tensor:
                return ("input", index)
        origin = recording._source(_memory.to_array(value))
        if origin is None or origin[0] < 0:
            raise NotPlannable("a graph output is neither an input nor computed by the graph")
        source, delta = origin
        geometry = (tuple(value.shape), tuple(value.stride()))
        if source < count:
            return ("input view", source, geometry, delta // value.element_size())
        return ("output", source, (value.dtype, *geometry, value.storage_offset()))

    def run(self, inputs: list) -> list:
        live = _memory.live
        stream = self.stream
        with self.lock:
            moved = False
            for index, (tensor, (staged, lead, size, itemsize)) in enumerate(zip(inputs, self.staging)):
                if not size:
                    continue
                token, start = tensor.untyped_storage().data_ptr(), tensor.storage_offset() * itemsize
                home = self.homes[index]
                if home is not None:
                    if home == (token, start):  # read in place: no copy
                        continue
                    self.homes[index] = None  # it moved: staged from now on
                    self._bind_staged(index)
                    moved = True
                staged.copy_from(live[token][0].view(start - lead, size), stream=stream)
            if moved:  # the calls' pointers changed: a native graph is captured again
                self.launcher = make_launcher(self.device, self.calls)
            self.launcher.replay(stream)
            copies = {}
            for result in self.results:
                if result is not None and result[0] == "output" and result[1] not in copies:
                    source = result[1]
                    nbytes = self.output_sizes[source - self.count]
                    buffer = self.device.alloc(nbytes)
                    buffer.copy_from(self.arena.view(self.memory.offsets[source], nbytes), stream=stream)
                    copies[source] = buffer
            stream.synchronize()
        storages = {source: _memory._new_storage(buffer) for source, buffer in copies.items()}
        outputs = []
        for result in self.results:
            if result is None:
                outputs.append(None)
            elif result[0] == "input":
                outputs.append(inputs[result[1]])
            elif result[0] == "input view":
                _, index, (shape, strides), delta = result
                base = inputs[index]
                outputs.append(_memory.view(base, shape, strides, base.storage_offset() + delta))
            else:
                _, source, (dtype, shape, strides, storage_offset) = result
                outputs.append(_memory._tensor(storages[source], dtype, shape, strides, storage_offset))
        return outputs
