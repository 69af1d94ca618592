"""run_op: checks a call against the op spec, allocates the outputs and calls
the plugin's kernel for (op, dtype) on the inputs' device and stream; where
the plugin has none, runs the op the way devkit.ops.resolution resolves it
(its decomposition, each op of the rule through run_op again, or the cpu
plugin)."""

from __future__ import annotations

import dataclasses
import math
import threading
from collections.abc import Mapping, Sequence

import numpy as np

from .. import driver as _driver
from .. import dtypes as _dtypes
from ..abi import C, ffi
from ..engine.calls import _DK_NOT_READY, _DK_OK, KernelCall, key_dtype_of, launch
from ..errors import UnimplementedError
from ..runtime import Array, Buffer, Device, Stream, _contiguous_strides, _stream_handle, asarray, device, empty
from . import resolution
from . import spec as _spec
from .primitives import PRIMITIVES
from .spec import OpSpec, TensorInfo, dtype_name
from .testing import upcast

# -- binding --------------------------------------------------------------------------

def _bind(spec: OpSpec, inputs: Sequence) -> list[tuple[_spec.Input, object]]:
    """Pairs every given input with its Input declaration."""
    declared = list(spec.inputs)
    variadic = declared[-1].variadic if declared else False
    required = sum(1 for i in declared if not i.optional)
    limit = None if variadic else len(declared)
    if len(inputs) < required or (limit is not None and len(inputs) > limit):
        names = ", ".join(i.name + ("..." if i.variadic else "?" if i.optional else "") for i in declared)
        raise TypeError(f"{spec.name}: takes inputs ({names}); got {len(inputs)}")
    bound = []
    for position, value in enumerate(inputs):
        decl = declared[min(position, len(declared) - 1)]
        if value is None and not decl.optional:
            raise TypeError(f"{spec.name}: input '{decl.name}' is required")
        bound.append((decl, value))
    return bound


def _coerce_attr(spec: OpSpec, attr: _spec.Attr, value):
    where = f"{spec.name}: attribute '{attr.name}'"
    try:
        if attr.kind == "int":
            if isinstance(value, (float, np.floating)) and not float(value).is_integer():
                raise TypeError
            value = int(value)
        elif attr.kind == "float":
            value = float(value)
        elif attr.kind == "ints":
            value = tuple(int(v) for v in np.asarray(value).reshape(-1).tolist())
        elif attr.kind == "floats":
            value = tuple(float(v) for v in np.asarray(value, dtype=np.float64).reshape(-1))
        elif attr.kind == "string":
            value = value.decode() if isinstance(value, bytes) else value
            if not isinstance(value, str):
                raise TypeError
        else:
            value = _dtypes.from_attribute(value)
    except (TypeError, ValueError):
        raise TypeError(f"{where} must be {attr.kind}, got {value!r}") from None
    if attr.choices is not None and value not in attr.choices:
        raise ValueError(f"{where} is {value!r}; allowed: {', '.join(map(repr, attr.choices))}")
    if attr.check is not None and (problem := attr.check(value)):
        raise ValueError(f"{where}: {problem}")
    return value


def _host_input_from_attribute(spec: OpSpec, bound: list, name: str, value) -> None:
    """The older ONNX form of a host input is an attribute of the same name
    (Clip's min/max, Squeeze's axes, Split's split): bind it as the input."""
    index = next(i for i, decl in enumerate(spec.inputs) if decl.name == name)
    if index < len(bound) and bound[index][1] is not None:
        raise TypeError(f"{spec.name}: '{name}' is given both as an input and as an attribute")
    while len(bound) <= index:
        bound.append((spec.inputs[len(bound)], None))
    bound[index] = (spec.inputs[index], value)


def _bind_all(spec: OpSpec, inputs: Sequence, attrs: Mapping | None) -> tuple[list, dict]:
    """The bound inputs, older attribute forms of host inputs included, and the other attributes."""
    bound = _bind(spec, list(inputs))
    attrs = dict(attrs or {})
    for name in spec.host_inputs:
        if name in attrs and spec.attr(name) is None:
            _host_input_from_attribute(spec, bound, name, attrs.pop(name))
    return bound, attrs


def resolve_attrs(spec: OpSpec, given: Mapping | None) -> dict:
    """Attributes with defaults applied, each coerced and validated."""
    given = dict(given or {})
    unknown = [name for name in given if spec.attr(name) is None]
    if unknown:
        known = ", ".join(a.name for a in spec.attrs) or "none"
        raise TypeError(f"{spec.name}: unknown attribute '{unknown[0]}' (it takes: {known})")
    attrs = {}
    for attr in spec.attrs:
        if attr.name in given and given[attr.name] is not None:
            attrs[attr.name] = _coerce_attr(spec, attr, given[attr.name])
        elif attr.default is _spec.REQUIRED:
            raise TypeError(f"{spec.name}: attribute '{attr.name}' is required")
        elif attr.default is not None:
            attrs[attr.name] = _coerce_attr(spec, attr, attr.default)
    return attrs


def _host_value(spec: OpSpec, decl: _spec.Input, value) -> np.ndarray:
    array = value.numpy() if isinstance(value, Array) else np.asarray(value)
    if array.dtype.kind not in "biuf" and array.dtype != _dtypes.bfloat16:
        raise TypeError(f"{spec.name}: input '{decl.name}' must be numeric, got {array.dtype}")
    return array


# -- kernel calls -----------------------------------------------------------------------

def _call_kernel(dev: Device, entry, op: str, inputs: list[Array | None], outputs: list[Array],
                 attributes: list[tuple[str, str, object]], stream: Stream | None) -> KernelCall:
    """Build a call and launch it (through engine.calls.launch, the one launch
    point), or record it into the graph its stream is capturing (devkit/engine/graph.py);
    returns the call, which a later launch may reuse."""
    call = KernelCall(dev, entry, op, inputs, outputs, attributes, _stream_handle(stream, dev))
    if stream is not None and stream.capturing is not None:
        stream.capturing.add_kernel(entry, call.cdata, [call], inputs, outputs, call.label())
    else:
        launch(call)
    if stream is not None:
        stream.retain(*inputs, *outputs)
    return call


def _attribute_list(spec: OpSpec, attrs: dict, host_values: dict) -> list[tuple[str, str, object]]:
    result = [(name, spec.attr(name).kind, value) for name, value in attrs.items()]
    for name, value in host_values.items():
        values = value.reshape(-1)
        if values.dtype.kind == "f" or values.dtype == _dtypes.bfloat16:
            result.append((name, "floats", values.astype(np.float64).tolist()))
        else:
            result.append((name, "ints", values.astype(np.int64).tolist()))
    return result


def _make_compact(dev: Device, array: Array, stream: Stream | None) -> Array:
    """A compact copy of a strided input, for kernels that take compact tensors."""
    entry = dev.plugin.kernel_entry("Identity", array.dtype)
    if entry is not None and entry.flags & C.DK_KERNEL_STRIDED_INPUTS:
        out = empty(array.shape, array.dtype, dev, stream)
        _call_kernel(dev, entry, "Identity", [array], [out], [], stream)
        return out
    return array.to(dev, stream)


def _prepare(spec: OpSpec, inputs: Sequence, attrs: Mapping | None, placement,
             stream: Stream | None = None):
    """Binds and checks a call: (device, device inputs, host values, infos, attrs, key dtype)."""
    bound, attrs = _bind_all(spec, inputs, attrs)
    attrs = resolve_attrs(spec, attrs)
    given = [v for d, v in bound if isinstance(v, Array)]
    dev = given[0].device if given else device(placement)
    infos: list[TensorInfo | None] = []
    device_inputs: list[tuple[int, _spec.Input, object]] = []
    host_values: dict[str, np.ndarray] = {}
    for position, (decl, value) in enumerate(bound):
        if value is None:
            infos.append(None)
        elif decl.host:
            host = _host_value(spec, decl, value)
            host_values[decl.name] = host
            infos.append(TensorInfo(host.shape, host.dtype, host))
        else:
            host = None
            if isinstance(value, Array):
                if value.device is not dev:
                    raise ValueError(f"{spec.name}: input '{decl.name}' is on {value.device}, "
                                     f"but the op runs on {dev} (where its first input is)")
                dtype, shape = value.dtype, value.shape
                if decl.read_by_infer:
                    host = value.numpy(stream)
            else:
                host = np.asarray(value)
                dtype, shape = _dtypes.normalize(host.dtype), host.shape
            infos.append(TensorInfo(tuple(shape), dtype, host if decl.read_by_infer else None))
            device_inputs.append((position, decl, value))
    if isinstance(spec.key, str):
        key_dtype = attrs.get(spec.key)
    else:
        key_info = infos[spec.key] if spec.key < len(infos) else None
        key_dtype = key_info.dtype if key_info is not None else None
    if key_dtype is None:
        raise TypeError(f"{spec.name}: the key input or attribute ({spec.key}) is missing")
    if key_dtype not in spec.dtypes:
        supported = ", ".join(dtype_name(d) for d in spec.dtypes)
        raise TypeError(f"{spec.name}: dtype {dtype_name(key_dtype)} is not supported "
                        f"(the op takes {supported})")
    return dev, device_inputs, host_values, infos, attrs, np.dtype(key_dtype)


def reference_arguments(spec: OpSpec, inputs: Sequence, attrs: Mapping | None = None) -> tuple[list, dict]:
    """What ``spec.reference`` takes for a call: the inputs (floats upcast to
    float64, host inputs as arrays) and the attributes, defaults applied and
    the host inputs' values added under their names."""
    bound, attrs = _bind_all(spec, inputs, attrs)
    resolved = resolve_attrs(spec, attrs)
    arguments = []
    for decl, value in bound:
        if value is not None and decl.host:
            resolved[decl.name] = _host_value(spec, decl, value)
            arguments.append(resolved[decl.name])
        else:
            arguments.append(upcast(value.numpy() if isinstance(value, Array) else value))
    return arguments, resolved


def infer(name: str, inputs: Sequence, attrs: Mapping | None = None):
    """Shape inference only: [(shape, dtype), ...] for the outputs."""
    spec = _spec.get(name)
    _, _, _, infos, attrs, _ = _prepare(spec, inputs, attrs, None)
    return _infer(spec, infos, attrs)


def _infer(spec: OpSpec, infos, attrs) -> list[tuple[tuple[int, ...], np.dtype]]:
    try:
        outputs = spec.infer(infos, attrs)
    except (ValueError, TypeError) as exc:
        raise type(exc)(f"{spec.name}: {exc}") from None
    return [(tuple(int(n) for n in shape), _dtypes.normalize(dtype)) for shape, dtype in outputs]


@dataclasses.dataclass
class BoundCall:
    """A call bound, checked and shape-inferred, its kernel found: what to
    launch for it, nothing allocated.

    ``call_inputs`` gives, per kernel input, the position of its value in the
    given inputs (None: an omitted optional input keeping its place)."""

    spec: OpSpec
    device: Device
    entry: object  # the DK_KernelEntry, or None when the plugin has no kernel
    key_dtype: np.dtype
    attrs: dict
    outputs: list[tuple[tuple[int, ...], np.dtype]]
    call_inputs: list[int | None]
    attributes: list[tuple[str, str, object]]
    reads_values: bool  # the call read a device array's values: a host input, NonZero's input
    host_values: dict  # the host inputs' values by name (a decomposition reads them)
    # How many leading outputs the caller gets: ``outputs`` (what the kernel writes) may hold more,
    # optional outputs the caller left out that the op's kernels cannot skip (spec.skippable_outputs).
    returned: int | None = None

    @property
    def returned_outputs(self) -> int:
        return len(self.outputs) if self.returned is None else self.returned


def bind_call(spec: OpSpec, inputs: Sequence, attrs: Mapping | None, placement=None,
              stream: Stream | None = None, outputs_wanted: int | None = None) -> BoundCall:
    """Bind, check and shape-infer a call and find its kernel. ``outputs_wanted``:
    how many leading outputs the caller uses (None: all); the spec's optional
    trailing outputs past them are not returned (``BoundCall.returned``), and
    those its kernels may skip (``spec.skippable_outputs``) are left out of the
    call. Required outputs are always returned."""
    dev, device_inputs, host_values, infos, attrs, key_dtype = _prepare(spec, inputs, attrs, placement, stream)
    outputs = _infer(spec, infos, attrs)
    returned = None
    if outputs_wanted is not None and spec.optional_outputs:
        count = len(outputs)
        returned = min(count, max(outputs_wanted, count - spec.optional_outputs))
        del outputs[max(returned, count - spec.skippable_outputs):]
        if returned == len(outputs):
            returned = None
    entry = dev.plugin.kernel_entry(spec.name, key_dtype)
    # Omitted optional inputs keep their place (ndim -1) unless nothing follows them.
    call_inputs: list[int | None] = []
    for position, (decl, info) in enumerate(zip(_declared(spec, len(infos)), infos)):
        if not decl.host:
            call_inputs.append(None if info is None else position)
    while call_inputs and call_inputs[-1] is None:
        call_inputs.pop()
    # A host input given as a device Array (its values read back) or a device input
    # shape inference reads: the call depends on values, not only on shapes.
    reads_values = (any(decl.read_by_infer for _, decl, _ in device_inputs)
                    or any(decl.host and isinstance(value, Array)
                           for decl, value in zip(_declared(spec, len(inputs)), inputs)))
    return BoundCall(spec, dev, entry, key_dtype, attrs, outputs, call_inputs,
                     _attribute_list(spec, attrs, host_values), reads_values, host_values, returned)


def outputs_named(names: Sequence[str]) -> int:
    """How many leading outputs a node uses: up to its last named one (ONNX
    leaves an unused optional output out or gives it an empty name)."""
    return max((position + 1 for position, name in enumerate(names) if name), default=0)


def run_op(name: str, inputs: Sequence, attrs: Mapping | None = None, *,
           stream: Stream | None = None, device: str | Device | None = None,
           outputs: int | None = None) -> list[Array]:
    """Run op ``name`` (its ONNX name) and return its outputs as new Arrays.

    ``inputs`` are Arrays on one device (NumPy arrays are copied there; host
    inputs such as Reshape's shape may also be lists), ``None`` for an omitted
    optional input. ``device`` places an op without device inputs. The work is
    queued on ``stream`` (the default stream completes before returning).

    A call like an earlier one (same op, device, input dtypes, shapes and
    strides, host-input values and attributes) skips the checks: it reuses
    the earlier call's resolution and prebuilt kernel call (see call_cache_info).

    ``outputs``: how many leading outputs the caller wants (None: all). Optional
    trailing outputs past them (MaxPool's Indices, LayerNormalization's Mean and
    InvStdDev: docs/operators.md marks them) are not returned, and not computed
    where the op's kernels may skip them (MaxPool's Indices); required ones
    always are returned."""
    # A capturing stream records each call it is given, so it gets calls of its own.
    capturing = stream is not None and stream.capturing is not None
    # (device, outputs): the placement run_plain keys its calls by too.
    key = None if capturing else _call_key(name, inputs, attrs, (device, outputs))
    cache = _call_cache()
    try:
        cached = cache.get(key) if key is not None else None
    except TypeError:  # an attribute value that cannot be hashed: not worth a key
        key = cached = None
    if cached is not None:
        _cache_counts[0] += 1
        return cached.run(inputs, stream)
    _cache_counts[1] += 1
    spec = _spec.get(name)
    bound = bind_call(spec, inputs, attrs, device, stream, outputs)
    dev, entry = bound.device, bound.entry
    if entry is None:
        return run_without_kernel(spec, dev, inputs, bound.attrs, bound.host_values, bound.key_dtype,
                                  stream)[:bound.returned_outputs]
    compacted = False
    call_inputs: list[Array | None] = []
    for position in bound.call_inputs:
        if position is None:
            call_inputs.append(None)
            continue
        value = inputs[position]
        array = value if isinstance(value, Array) else asarray(value, dev, stream=stream)
        if not array.is_contiguous and not entry.flags & C.DK_KERNEL_STRIDED_INPUTS:
            array, compacted = _make_compact(dev, array, stream), True
        call_inputs.append(array)
    results = [empty(shape, dtype, dev, stream) for shape, dtype in bound.outputs]
    call = _call_kernel(dev, entry, name, call_inputs, results, bound.attributes, stream)
    if key is not None and not compacted and not bound.reads_values:
        if len(cache) >= CALL_CACHE_SIZE:
            cache.clear()
        cache[key] = _CachedCall(bound, call)
    return results if bound.returned is None else results[:bound.returned]


def run_plain(name: str, inputs: tuple, placement: tuple) -> list[Array]:
    """``run_op(name, inputs, outputs=placement[1])`` for a call with no
    attributes, stream or device (``placement`` is ``(None, outputs)``): the op
    functions' common call. A cache hit costs the key and the cached run only."""
    parts = [name, placement]
    for value in inputs:
        if type(value) is not Array:
            return run_op(name, inputs, outputs=placement[1])
        parts.append(value._layout or layout(value))
    try:
        cached = _thread.calls.get(tuple(parts))
    except AttributeError:  # this thread's first call
        cached = None
    if cached is None:
        return run_op(name, inputs, outputs=placement[1])
    _cache_counts[0] += 1
    return cached.run(inputs, None)


# -- the call cache ----------------------------------------------------------------------

# Entries per thread; the cache starts over when full.
CALL_CACHE_SIZE = 4096
# Host values (NumPy arrays, lists, scalars) up to this many elements are keyed by value.
_KEYED_HOST_VALUE_LIMIT = 4096
_thread = threading.local()
_cache_counts = [0, 0]  # hits, misses


def _call_cache() -> dict:
    try:
        return _thread.calls
    except AttributeError:
        _thread.calls = {}
        return _thread.calls


def call_cache_info() -> dict:
    """The eager call cache: hits and misses so far, entries in this thread's cache."""
    return {"hits": _cache_counts[0], "misses": _cache_counts[1], "entries": len(_call_cache())}


def clear_call_cache() -> None:
    """Forget this thread's cached calls and reset the counts."""
    _call_cache().clear()
    _cache_counts[:] = [0, 0]


def _freeze(value):
    """A hashable stand-in for an input or attribute value, or None when it has none."""
    if isinstance(value, Array):  # a subclass of Array: not worth a key
        return None
    if isinstance(value, (list, tuple, np.ndarray, np.generic)):
        array = np.asarray(value)
        if array.dtype == object or array.size > _KEYED_HOST_VALUE_LIMIT:
            return None
        return array.dtype.str, array.shape, array.tobytes()
    return (type(value), value)


def _layout_of(dev: Device, dtype: np.dtype, shape: tuple, strides: tuple) -> str:
    # A string: Python keeps its hash, where a tuple's is computed at every lookup.
    return f"{id(dev)} {dtype.name} {dtype.str} {shape} {strides}"


def layout(array: Array) -> str:
    """What the call cache keys an Array input by: its device, dtype, shape and
    strides, made once per Array (``Array._layout``)."""
    made = array._layout = _layout_of(array.buffer._allocation.device, array.dtype, array.shape, array.strides)
    return made


def _call_key(name: str, inputs: Sequence, attrs: Mapping | None, placement) -> tuple | None:
    """What a call's resolution depends on, or None for a call not worth caching."""
    parts: list = [name, placement]
    for value in inputs:
        if type(value) is Array:
            parts.append(value._layout or layout(value))
        elif value is None:
            parts.append(None)
        else:
            frozen = _freeze(value)
            if frozen is None:
                return None
            parts.append(frozen)
    if attrs:
        for attr_name, value in attrs.items():
            frozen = _freeze(value)
            if frozen is None:
                return None
            parts.append((attr_name, frozen))
    return tuple(parts)  # run_op finds out whether it hashes at the lookup


class _CachedCall:
    """A bound call and its prebuilt kernel call: a run allocates the
    outputs and patches the data pointers."""

    __slots__ = ("device", "call", "inputs", "outputs", "returned", "_stream", "_held")

    def __init__(self, bound: BoundCall, call: KernelCall):
        self.device = bound.device
        self.call = call
        self.returned = bound.returned  # None: every output the kernel writes
        self.inputs = [(call.inputs[slot], position) for slot, position in enumerate(bound.call_inputs)
                       if position is not None]
        memory = bound.device._memory
        self.outputs = []
        for slot, (shape, dtype) in enumerate(bound.outputs):
            nbytes = math.prod(shape) * dtype.itemsize
            strides = tuple(_contiguous_strides(shape))
            self.outputs.append((call.outputs[slot], shape, dtype, strides, nbytes, memory.caches(nbytes),
                                 _layout_of(bound.device, dtype, shape, strides)))
            call.outputs[slot].byte_offset = 0  # every run's outputs are fresh allocations
        self._stream = None  # the stream handle the call holds
        # Per input slot then output slot: the (handle, byte offset) it points at, so that a run
        # writes only what changed (a handle object is its block's, reused with the block).
        self._held = [(None, 0)] * (len(self.inputs) + len(self.outputs))

    def run(self, inputs: Sequence, stream: Stream | None) -> list[Array]:
        # engine.calls.bind and launch, inlined: this is most of an eager op's host cost.
        dev = self.device
        held = self._held
        # The inputs as Arrays, for the stream to retain, or (without a stream) None
        # until one is made here from a NumPy value: alive until the launch.
        arrays = None if stream is None else []
        index = 0
        for slot, position in self.inputs:
            value = inputs[position]
            if type(value) is not Array:
                value = asarray(value, dev, stream=stream)
                if arrays is None:
                    arrays = []
            if arrays is not None:
                arrays.append(value)
            buffer = value.buffer
            handle = buffer._allocation.handle
            if handle is None:
                raise ValueError("buffer has been freed")
            offset = buffer.offset + value.offset
            was_handle, was_offset = held[index]
            if handle is not was_handle or offset != was_offset:
                slot.data, slot.byte_offset = handle, offset
                held[index] = (handle, offset)
            index += 1
        results = []
        memory = dev._memory
        caching = _driver._allocator == "caching"
        for slot, shape, dtype, strides, nbytes, capacity, layout_key in self.outputs:
            # Buffer.allocate's checks passed when the call was cached; a capturing stream gets no cached call.
            if caching and capacity is not None:
                allocation = memory.allocate_class(nbytes, capacity, stream)
            else:
                allocation = memory.allocate(nbytes, stream)
            handle = allocation.handle
            if handle is not held[index][0]:
                slot.data = handle
                held[index] = (handle, 0)
            index += 1
            result = Array.trusted(Buffer(allocation, 0, nbytes), shape, dtype, strides)
            result._layout = layout_key  # what the next op's key takes of it, made once
            results.append(result)
        call = self.call
        handle = ffi.NULL if stream is None else _stream_handle(stream, dev)
        if handle is not self._stream:  # identity: NULL is one object, a stream's handle too
            call.cdata.stream = self._stream = handle
        status = call.fn(call.cdata)
        if status != _DK_OK and status != _DK_NOT_READY:
            call.plugin.raise_status(status, call.label())
        if stream is not None:
            stream.retain(*arrays, *results)
        return results if self.returned is None else results[:self.returned]


def _declared(spec: OpSpec, count: int) -> list[_spec.Input]:
    return [spec.inputs[min(i, len(spec.inputs) - 1)] for i in range(count)]



# -- running a decomposition ---------------------------------------------------------------

class Builder:
    """What a decomposition rule calls ops through: on the op's device and stream."""

    def __init__(self, dev: Device, stream: Stream | None, dtype: np.dtype, record: list | None = None):
        self.device, self.stream, self.dtype = dev, stream, dtype
        self._record = record

    def __call__(self, op: str, *inputs, **attrs):
        spec = _spec.get(op)
        if self._record is not None:
            self._record.append((op, _key_dtype(spec, inputs, attrs)))
        outputs = run_op(op, inputs, attrs, stream=self.stream, device=self.device)
        single = len(spec.outputs) == 1 and not spec.outputs[0].endswith("...")
        return outputs[0] if single else tuple(outputs)

    def infer(self, op: str, *inputs, **attrs) -> list[tuple[tuple[int, ...], np.dtype]]:
        """The output shapes and dtypes of a call, without running it."""
        return infer(op, inputs, attrs)

    @staticmethod
    def spec_attr(op: str, name: str) -> bool:
        """Whether ``name`` is an attribute of ``op`` (not a host input's value)."""
        return _spec.get(op).attr(name) is not None

    def const(self, value, dtype=None) -> Array:
        """A constant (a scalar or a small table computed from shapes) on the
        device; integers wrap into ``dtype`` (-1 is 255 in uint8)."""
        value = np.asarray(value)
        dtype = _dtypes.normalize(dtype) if dtype is not None else (
            np.dtype(bool) if value.dtype == bool else self.dtype)
        return asarray(value.astype(dtype), self.device, stream=self.stream)


def _key_dtype(spec: OpSpec, inputs: Sequence, attrs: dict) -> np.dtype:
    if isinstance(spec.key, str):
        return _dtypes.normalize(attrs[spec.key])
    value = inputs[spec.key]
    return value.dtype if isinstance(value, Array) else _dtypes.normalize(np.asarray(value).dtype)


def rule_inputs(spec: OpSpec, dev: Device, inputs: Sequence, host_values: dict,
                stream: Stream | None) -> list:
    """The positional inputs a rule gets: device Arrays (NumPy inputs copied
    there), None where omitted, host inputs as their NumPy values."""
    host_positions = [i for i, d in enumerate(spec.inputs) if d.host and d.name in host_values]
    result = []
    for position in range(max([len(inputs)] + [i + 1 for i in host_positions])):
        decl = spec.inputs[min(position, len(spec.inputs) - 1)]
        if decl.host:
            result.append(host_values.get(decl.name))
            continue
        value = inputs[position] if position < len(inputs) else None
        if value is not None and not isinstance(value, Array):
            value = asarray(np.asarray(value), dev, stream=stream)
        result.append(value)
    return result


def decompose(spec: OpSpec, dev: Device, xs: list, attrs: dict, host_values: dict, dtype: np.dtype,
              stream: Stream | None, record: list | None = None) -> list[Array]:
    """Runs ``spec``'s rule on rule inputs ``xs`` (see rule_inputs) and the
    resolved attributes; the rule sees the host values among the attributes.
    ``record`` collects the calls."""
    b = Builder(dev, stream, dtype, record)
    rule = spec.decompose
    if (wide := rule.wider(dtype)) is not None:
        return _widened(spec, b, xs, attrs, dtype, wide)
    outputs = rule.rule(b, xs, {**attrs, **host_values})
    return list(outputs) if isinstance(outputs, (list, tuple)) else [outputs]


def _widened(spec: OpSpec, b: Builder, xs: list, attrs: dict, dtype: np.dtype, wide: np.dtype) -> list[Array]:
    """The op at a wider float dtype between Casts: what a float16/bfloat16
    kernel computes (float32), or a float32 one that accumulates in double."""
    widened = [b("Cast", x, to=wide) if isinstance(x, Array) and x.dtype == dtype else x for x in xs]
    own = dict(attrs)
    if isinstance(spec.key, str):
        own[spec.key] = wide
    wanted = [d for _, d in b.infer(spec.name, *xs, **attrs)]
    outputs = b(spec.name, *widened, **own)
    outputs = list(outputs) if isinstance(outputs, tuple) else [outputs]
    return [b("Cast", y, to=d) if y.dtype != d else y for y, d in zip(outputs, wanted)]


def run_without_kernel(spec: OpSpec, dev: Device, inputs: Sequence, attrs: dict, host_values: dict,
                       key_dtype: np.dtype, stream: Stream | None) -> list[Array]:
    """After the native kernel: the decomposition, then fallback, then UnimplementedError."""
    plugin = dev.plugin
    plan = resolution.resolve(plugin, spec.name, key_dtype)
    if plan.how == resolution.DECOMPOSED:
        xs = rule_inputs(spec, dev, inputs, host_values, stream)
        return decompose(spec, dev, xs, attrs, host_values, key_dtype, stream)
    if not resolution.may_fall_back(dev):
        have = sorted({dtype_name(key_dtype_of(e)) for e in plugin.kernel_entries(spec.name)})
        detail = f"it has {', '.join(have)}" if have else "it has no kernel for the op"
        if spec.decompose is not None:
            lacking = sorted(plan.missing())
            shown = ", ".join(lacking[:8]) + (f" and {len(lacking) - 8} more" if len(lacking) > 8 else "")
            detail += f", and its decomposition needs kernels for {shown}"
        raise UnimplementedError(
            f"{spec.name}: plugin '{plugin.name}' has no kernel for dtype {dtype_name(key_dtype)} "
            f"({detail}); devkit.ops.set_fallback(True) allows running it on the cpu plugin",
            C.DK_UNIMPLEMENTED)
    resolution.count_fallback(plugin.name, spec.name, key_dtype)
    moved = [value.numpy(stream) if isinstance(value, Array) else value for value in inputs]
    results = run_op(spec.name, moved, attrs, device=device("cpu:0"))
    return [result.to(dev, stream) for result in results]


def run_decomposed(op: str, inputs: Sequence, attrs=None, *, device=None, stream: Stream | None = None,
                   record: list | None = None) -> list[Array]:
    """Runs ``op`` through its decomposition even where a native kernel exists
    (the ops it uses resolve as usual): for checking a rule against the op's
    reference, and for timing it against the kernel. ``record`` collects the
    (op, key dtype) calls the rule makes."""
    spec = _spec.get(op)
    if spec.decompose is None:
        raise ValueError(f"{op} has no decomposition (it is {'a primitive' if op in PRIMITIVES else 'undecomposed'})")
    dev, _, host_values, _, resolved, key_dtype = _prepare(spec, inputs, attrs, device, stream)
    xs = rule_inputs(spec, dev, inputs, host_values, stream)
    return decompose(spec, dev, xs, resolved, host_values, key_dtype, stream, record)
