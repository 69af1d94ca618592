"""Building and running plans: a graph of ops compiled, for one set of input
shapes and dtypes, into prebuilt kernel calls over one arena.

Everything that does not depend on the inputs' values is done at build:
binding, attribute and dtype checks, shape inference, kernel lookup, the
host evaluation of shape subgraphs (Shape and Size of any value, and small
nodes whose inputs are all host values), and the device nodes that depend
on no input values (weights made by ConstantOfShape, folded constants),
which are computed once and kept resident. What is left are device kernels
on intermediates, each a prebuilt call whose tensors sit at fixed offsets of
the arena (memory.plan_memory). Where a call's kernel prepares its constant
inputs (ABI 1.4, DK_KernelEntry.prepare: packed or widened weights), the
plan has it do so once, keeps the prepared memory and launches the call on
it (``prepare_weights``; ``plan.prepared`` lists what was prepared).

A run copies the inputs into their arena slots, replays the calls on a
stream and copies the outputs out: one synchronisation, or none when the
caller passes a stream (the outputs are then defined once it is synchronized).
A run given devkit Arrays, large NumPy arrays on a plugin that registers
host memory, or output arrays runs on that memory in place
(engine.binding).

A graph whose work depends on values only known while it runs (a shape read
from a device tensor, NonZero's output size) or that needs the cpu fallback
cannot be planned: build_plan raises NotPlannable saying why.
"""

from __future__ import annotations

import contextlib
import dataclasses
import statistics
import threading
import time
from collections.abc import Mapping, Sequence

import numpy as np

from ..abi import ffi
from ..ops import dispatch
from ..ops import spec as _spec
from ..plugin import check
from ..runtime import Array, Device, Stream, _contiguous_strides, asarray
from .binding import BIND_IN_PLACE_BYTES, Binding, slot_references
from .calls import KernelCall, bind, launch, prepare_fn
from .fusion import fuse_steps
from .launch import GraphLaunch, StagedGraph, make_launcher
from .memory import Lifetime, MemoryPlan, plan_memory

# Host values are at most this many elements: initializers that small keep a
# host copy, and nodes on host values making outputs that small run on the host.
HOST_VALUE_LIMIT = 4096
SHAPE_OPS = ("Shape", "Size")


class NotPlannable(Exception):
    """The graph needs something a plan cannot do; the message says what."""


@dataclasses.dataclass(frozen=True)
class Node:
    """One op of a graph, as front ends lower into: its spec (None for a
    constant, whose value is ``constant``), input and output value names
    ("" for an omitted one) and attributes."""

    op: str
    spec: _spec.OpSpec | None
    inputs: tuple[str, ...]
    outputs: tuple[str, ...]
    attrs: dict
    constant: np.ndarray | None = None


def host_eval(spec: _spec.OpSpec, inputs: Sequence, attrs: dict, inferred=None) -> list[np.ndarray]:
    """A node on host values: the spec's reference, cast to the inferred dtypes."""
    if inferred is None:
        inferred = dispatch.infer(spec.name, inputs, attrs)
    arguments, resolved = dispatch.reference_arguments(spec, inputs, attrs)
    with np.errstate(all="ignore"):
        results = spec.reference(arguments, resolved)
    return [np.asarray(r).astype(dtype).reshape(shape) for r, (shape, dtype) in zip(results, inferred)]


def shape_eval(spec: _spec.OpSpec, value, attrs: dict) -> list[np.ndarray]:
    """Shape or Size of a value: only its shape matters, so a zero-stride stand-in has it."""
    return host_eval(spec, [np.broadcast_to(np.uint8(0), value.shape)], attrs)


def fits_host(inferred) -> bool:
    return all(int(np.prod(shape)) <= HOST_VALUE_LIMIT for shape, _ in inferred)


class _Slot:
    """A tensor in the arena: written at step ``first`` (-1: a graph input),
    last read at step ``last``."""

    __slots__ = ("shape", "dtype", "nbytes", "first", "last", "stand_in", "array")

    def __init__(self, shape, dtype, first: int, stand_in_buffer):
        self.shape, self.dtype = tuple(shape), dtype
        self.nbytes = int(np.prod(self.shape)) * dtype.itemsize
        self.first = self.last = first
        # The calls are built on a stand-in; they are pointed at the arena once it is planned.
        self.stand_in = Array.trusted(stand_in_buffer, self.shape, dtype, tuple(_contiguous_strides(self.shape)))
        self.array: Array | None = None


class Plan:
    """A graph compiled for one set of input shapes: see the module doc."""

    def __init__(self, device: Device, inputs: list[tuple[str, Array]], calls: list[KernelCall],
                 outputs: list, memory: MemoryPlan, arena, resident: list,
                 input_references: list[list], output_references: list[list | None]):
        self.device = device
        self.calls = calls
        self.memory = memory
        self._inputs = inputs
        self._outputs = outputs      # per graph output: an arena or resident Array, or a host value
        self._arena = arena
        self._resident = resident    # device values the calls read that nothing else holds
        self._launcher = make_launcher(device, calls)
        # A run that waits, on a plugin with the graph section: made at its first use.
        self._stages = device.plugin.has_graphs
        self._staged: StagedGraph | None = None
        self._feed_order = [name for name, _ in inputs]
        self._host_outputs = any(isinstance(value, np.ndarray) for value in outputs)
        self._stream: Stream | None = None
        self._lock = threading.Lock()
        self._host_pointers = device.properties.host_pointer_handles
        # What bound runs need, looked up once (engine.binding).
        self._binding = Binding(self, input_references, output_references)

    @property
    def launcher(self):
        """What a run without a stream launches: the StagedGraph once made (a
        plugin with the graph section), else the Launcher (GraphLaunch or HostReplay)."""
        return self._staged if self._staged is not None else self._launcher

    @property
    def arena_bytes(self) -> int:
        return self.memory.arena_bytes

    def run(self, feed: Mapping[str, np.ndarray | Array], stream: Stream | None = None, *,
            wait: bool | None = None, outputs: Sequence | None = None,
            device_outputs: bool = False) -> list:
        """Inputs in (copied into the arena), the calls replayed, outputs out.
        Without ``stream`` the work goes to a stream of the plan's own. With
        ``wait`` (the default without a stream) the stream is synchronized
        once before returning; else nothing waits and the outputs are defined
        once ``stream`` has been synchronized. Runs of one plan take turns.

        ``feed`` values are NumPy arrays or devkit Arrays on the plan's
        device. ``outputs``: per graph output a destination (a NumPy array or
        a devkit Array of its shape and dtype, written and returned) or None.
        Outputs without one are new NumPy arrays, or new devkit Arrays with
        ``device_outputs``. Arrays, and large NumPy arrays where the plugin
        registers host memory, are used in place (engine.binding).

        A run without a stream that waits, on a plugin with the graph
        section, is one graph launch holding the copies too (StagedGraph)."""
        if wait is None:
            wait = stream is None
        with self._lock:
            if outputs is not None or device_outputs or self._binds(feed, wait):
                if outputs is not None and len(outputs) != len(self._outputs):
                    raise ValueError(f"outputs: {len(outputs)} given; the graph has {len(self._outputs)}")
                if stream is None and not (wait and self._host_pointers):
                    stream = self._own_stream()  # the default stream would complete each call before the next
                return self._binding.run(feed, stream, wait, outputs, device_outputs)
            if stream is None and wait and self._stages:
                return self._run_staged(feed)
            if stream is None:
                stream = self._own_stream()
            work = stream
            self._copy_in(feed, work)
            self._launcher.replay(work)
            results = []
            for value in self._outputs:
                if isinstance(value, np.ndarray):  # host values are the plan's: the caller gets copies
                    results.append(np.array(value))
                    continue
                out = np.empty(value.shape, value.dtype)
                if out.size:
                    value.buffer.copy_to_host(out.reshape(-1).view(np.uint8), stream=work)
                results.append(out)
            if wait:
                work.synchronize()
            else:
                work.retain(self)
            return results

    def _binds(self, feed: Mapping, wait: bool) -> bool:
        """Whether a run is bound (engine.binding): an input is a devkit Array,
        or memory registration would save a large copy."""
        in_place = wait and self._binding.registers
        if in_place and self._binding.large_output:
            return True
        for value in feed.values():
            if type(value) is not np.ndarray or (in_place and value.nbytes >= BIND_IN_PLACE_BYTES):
                return True
        return False

    def profile(self, feed: Mapping[str, np.ndarray], repeat: int = 5) -> list[tuple[str, float]]:
        """Per call, in order: (op, median seconds) of the call launched alone
        on the default stream (complete when it returns), over ``repeat``
        passes that each copy ``feed`` in and launch every call in order (so
        every call reads the values a run gives it): where a run's kernel
        time goes. The sum understates a run's, whose calls are not timed
        warm and alone (launch_device_work times them as a run does)."""
        calls = self.calls
        times: list[list[float]] = [[] for _ in calls]
        with self._lock, self._calls_on_default_stream():
            for _ in range(repeat):
                self._copy_in(feed, None)
                for call, spent in zip(calls, times):
                    start = time.perf_counter()
                    launch(call)
                    spent.append(time.perf_counter() - start)
        return [(call.op, statistics.median(spent)) for call, spent in zip(calls, times)]

    def launch_device_work(self, feed: Mapping[str, np.ndarray]) -> None:
        """A run's device work alone, on the default stream, complete when it
        returns: where the plan stages, ``feed`` copied into the staging
        arrays and the staged graph launched (the input copies, the calls,
        the output copies); elsewhere the input copies and the calls launched
        one by one. A run's time beyond it is its host work (devkit-bench
        engine times both, interleaved)."""
        with self._lock:
            if self._stages:
                staged = self._staged_graph()
                staged.fill([feed[name] for name in self._feed_order])
                staged.launch()
                return
            with self._calls_on_default_stream():
                self._copy_in(feed, None)
                for call in self.calls:
                    launch(call)

    def launch_calls(self) -> None:
        """The calls alone, on what the arena holds (no input or output copies),
        on the default stream, complete when it returns: one launch of the
        launcher's native graph where it has one (captured on the plan's stream
        at the first use), else each call in turn. What devkit-bench engine's
        host-cost row counts as a run's kernels."""
        with self._lock:
            launcher = self._launcher
            if isinstance(launcher, GraphLaunch):
                if launcher.graph is None:
                    stream = self._own_stream()
                    launcher.replay(stream)
                    stream.synchronize()
                launcher.graph.launch(None)
                return
            with self._calls_on_default_stream():
                for call in self.calls:
                    launch(call)

    def _own_stream(self) -> Stream:
        if self._stream is None:
            self._stream = self.device.create_stream()
        return self._stream

    def _copy_in(self, feed: Mapping[str, np.ndarray], stream: Stream | None) -> None:
        """``feed`` into the inputs' arena slots, on ``stream`` (None: the default stream)."""
        for name, array in self._inputs:
            host = feed[name]
            if host.size:
                if not host.flags.c_contiguous:
                    host = host.copy(order="C")
                array.buffer.copy_from_host(host.reshape(-1).view(np.uint8), stream=stream)

    @contextlib.contextmanager
    def _calls_on_default_stream(self):
        """The calls pointed at the default stream, and back at their stream after."""
        saved = [call.cdata.stream for call in self.calls]
        try:
            for call in self.calls:
                call.cdata.stream = ffi.NULL
            yield
        finally:
            for call, stream in zip(self.calls, saved):
                call.cdata.stream = stream

    def _staged_graph(self) -> StagedGraph:
        """The StagedGraph of a run that waits, made at its first use; the caller holds the lock."""
        if self._staged is None:
            self._staged = StagedGraph(self.device, self.calls, [array for _, array in self._inputs],
                                       [value for value in self._outputs if not isinstance(value, np.ndarray)])
        return self._staged

    def _run_staged(self, feed: Mapping[str, np.ndarray]) -> list[np.ndarray]:
        """The whole run as one graph launch (engine.launch.StagedGraph); the caller holds the lock."""
        computed = self._staged_graph().run([feed[name] for name in self._feed_order])
        if not self._host_outputs:
            return computed
        computed = iter(computed)
        # Host values are the plan's: the caller gets copies.
        return [np.array(value) if isinstance(value, np.ndarray) else next(computed) for value in self._outputs]


def _alignment(device: Device) -> int:
    return max(64, int(device.properties.alloc_alignment or 0))


def build_plan(nodes: Sequence[Node], device: Device, values: Mapping[str, Array | np.ndarray],
               host_twins: Mapping[str, np.ndarray], feed: Mapping[str, tuple[tuple, np.dtype]],
               output_names: Sequence[str], static_cache: dict, fuse: bool = False,
               prepare_weights: bool = True) -> Plan:
    """Compile ``nodes`` for inputs ``feed`` (name -> (shape, dtype)).

    ``values`` are the resident values (initializers not fed); ``host_twins``
    host copies of small ones. ``static_cache`` keeps, across plans of the
    same fed names, the values that depend on no fed input. ``fuse``: run
    the fusion pass (engine.fusion) over the calls; its report is
    ``plan.fusion``. ``prepare_weights``: calls whose kernel prepares
    constant inputs run on prepared copies (``plan.prepared``)."""
    stand_in_buffer = device.alloc(1)
    env: dict[str, object] = dict(values)
    static = set(values)
    slots: list[_Slot] = []
    fed_slots = []
    for name, (shape, dtype) in feed.items():
        slot = _Slot(shape, dtype, -1, stand_in_buffer)
        slots.append(slot)
        fed_slots.append((name, slot))
        env[name] = slot
    steps: list[tuple[KernelCall, list, list]] = []  # (call, [(input index, slot)], [(output index, slot)])
    resident: list = []
    for index, node in enumerate(nodes):
        names = [name for name in node.inputs if name]
        is_static = all(name in static for name in names)
        outputs = [name for name in node.outputs if name]
        if is_static and outputs and all(name in static_cache for name in outputs):
            results = [static_cache.get(name) for name in node.outputs]
        else:
            for name in names:
                if isinstance(env[name], _Slot):
                    env[name].last = index
            results = _build_node(node, index, env, host_twins, device, stand_in_buffer, slots, steps, resident)
        for name, value in zip(node.outputs, results):
            if name:
                env[name] = value
                if is_static:
                    static.add(name)
                    static_cache[name] = value
    outputs = []
    for name in output_names:
        value = env[name]
        if isinstance(value, _Slot):
            value.last = len(nodes)
        outputs.append(value)
    fusion_report = None
    if fuse:
        steps, fusion_report = fuse_steps(device, steps, slots, outputs)
    memory = plan_memory([Lifetime(s.nbytes, s.first, s.last) for s in slots], _alignment(device))
    arena = device.alloc(max(memory.arena_bytes, 1))
    for slot, offset in zip(slots, memory.offsets):
        slot.array = Array(arena.view(offset, slot.nbytes), slot.shape, slot.dtype)
    for call, inputs, outputs_of_call in steps:
        for position, slot in inputs:
            bind(call.inputs[position], slot.array)
        for position, slot in outputs_of_call:
            bind(call.outputs[position], slot.array)
    prepared = _prepare_constants(device, steps, resident) if prepare_weights else []
    references = slot_references(steps)
    # An output is bound where a call writes its slot and no other output is the same value.
    bindable = [isinstance(value, _Slot) and value.first >= 0
                and sum(other is value for other in outputs) == 1 for value in outputs]
    plan = Plan(device, [(name, slot.array) for name, slot in fed_slots], [call for call, _, _ in steps],
                [value.array if isinstance(value, _Slot) else value for value in outputs], memory, arena,
                resident, [references.get(id(slot), []) for _, slot in fed_slots],
                [references.get(id(value), []) if can else None for value, can in zip(outputs, bindable)])
    plan.fusion = fusion_report
    plan.prepared = prepared
    return plan


@dataclasses.dataclass(frozen=True)
class PreparedInput:
    """One constant input a kernel prepared: ``plan.prepared``'s entries."""

    call: str    # the call's label, "kernel Gemm[float32]"
    input: int   # its position in the call
    nbytes: int  # the prepared form's size


def _prepare_constants(device: Device, steps: list, resident: list) -> list[PreparedInput]:
    """Has each call whose kernel prepares inputs (DK_PrepareFn) prepare
    its constant ones (no arena slot: weights, folded constants) into memory
    the plan keeps, and points the call at it."""
    prepared = []
    size = ffi.new("size_t *")
    for call, slot_inputs, _ in steps:
        prepare = prepare_fn(call.entry) if isinstance(call, KernelCall) else None
        if prepare is None:
            continue
        fed = {position for position, _ in slot_inputs}
        for position in range(min(call.cdata.num_inputs, 64)):
            if position in fed or call.inputs[position].ndim < 0:
                continue
            check(call.plugin, prepare(call.cdata, position, ffi.NULL, 0, size), f"{call.label()} prepare")
            if size[0] == 0:
                continue
            buffer = device.alloc(size[0])
            check(call.plugin, prepare(call.cdata, position, buffer.handle, buffer.offset, size),
                  f"{call.label()} prepare")
            call.inputs[position].data = buffer.handle
            call.inputs[position].byte_offset = buffer.offset
            call.cdata.prepared_inputs |= 1 << position
            resident.append(buffer)
            prepared.append(PreparedInput(call.label(), position, size[0]))
    return prepared


def _build_node(node: Node, index: int, env: dict, host_twins: Mapping, device: Device, stand_in_buffer,
                slots: list, steps: list, resident: list) -> list:
    """The node's output values: host values, resident Arrays computed now,
    or arena slots written by a prebuilt call."""
    spec = node.spec
    if spec is None:  # a constant: a host value unless it is too big for one
        value = node.constant
        return [value if value.size <= HOST_VALUE_LIMIT else asarray(value, device)]
    if node.op in SHAPE_OPS:
        return shape_eval(spec, env[node.inputs[0]], node.attrs)
    given = [env[name] if name else None for name in node.inputs]
    host_inputs = [_host_value(name, env, host_twins) if name else None for name in node.inputs]
    if all(value is not None for name, value in zip(node.inputs, host_inputs) if name):
        inferred = dispatch.infer(node.op, host_inputs, node.attrs)
        if fits_host(inferred):
            return host_eval(spec, host_inputs, node.attrs, inferred)
    if not any(isinstance(value, _Slot) for value in given):
        # No input changes between runs: computed once, now, and kept.
        return dispatch.run_op(node.op, given, node.attrs, device=device,
                               outputs=dispatch.outputs_named(node.outputs))
    for decl, value in zip(dispatch._declared(spec, len(given)), given):
        if decl.host and isinstance(value, _Slot):
            raise NotPlannable(f"{_describe(node)}: its input '{decl.name}' is computed on the device, "
                               f"so its value is only known while the graph runs")
        if decl.read_by_infer and isinstance(value, _Slot):
            raise NotPlannable(f"{_describe(node)}: its output shape depends on its input values")
    stand_ins = [value.stand_in if isinstance(value, _Slot) else value for value in given]
    bound = dispatch.bind_call(spec, stand_ins, node.attrs, device,
                               outputs_wanted=dispatch.outputs_named(node.outputs))
    if bound.entry is None:
        raise NotPlannable(f"{_describe(node)}: plugin '{device.plugin.name}' has no kernel for "
                           f"{_spec.dtype_name(bound.key_dtype)}")
    call_inputs, slot_inputs = [], []
    for position_in_call, position in enumerate(bound.call_inputs):
        value = None if position is None else given[position]
        if isinstance(value, _Slot):
            slot_inputs.append((position_in_call, value))
            value = value.stand_in
        elif value is not None and not isinstance(value, Array):  # a host value a kernel reads: upload once
            value = asarray(value, device)
            resident.append(value)
        call_inputs.append(value)
    made = [_Slot(shape, dtype, index, stand_in_buffer) for shape, dtype in bound.outputs]
    slots.extend(made)
    call = KernelCall(device, bound.entry, node.op, call_inputs, [slot.stand_in for slot in made],
                      bound.attributes)
    steps.append((call, slot_inputs, list(enumerate(made))))
    return made


def _host_value(name: str, env: dict, host_twins: Mapping) -> np.ndarray | None:
    """The value on the host (a host value or an initializer's twin), or None."""
    value = env[name]
    return value if isinstance(value, np.ndarray) else host_twins.get(name)


def _describe(node: Node) -> str:
    return f"node '{node.outputs[0] if node.outputs else ''}' ({node.op})"
