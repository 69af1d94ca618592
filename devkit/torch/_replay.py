"""The eager fast path: an aten op's lowering, recorded once and replayed.

The first call of an aten op with given argument dtypes, shapes, strides and
devices (and given values of its other arguments) runs its lowering under a
Recorder, which builds each devkit kernel call it makes as a prebuilt
engine.KernelCall (binding, checks, shape inference and kernel lookup done
once, as a plan does) and notes where each call's tensors come from: an
argument tensor, the output of an earlier call, or a constant uploaded once.
A later call with the same key replays the calls: it points them at the
argument tensors' memory and at fresh outputs, launches them, and wraps the
outputs as torch tensors, with no lowering, promotion or devkit.ops checks on
the way. View ops replay the geometry torch's meta kernel gave. Where the
native module is built, its Replayer (one per thread, holding the same
templates) does all of that in C++ for the calls it can key; the Python
replay below runs the others.

A lowering is recorded only when every device effect it has is one of
those; anything else (a value read back to the host, a host copy, a nested
aten op, a kernel-less op, a strided input a kernel cannot take) makes the
op run its lowering every time, as before.
"""

from __future__ import annotations

import contextlib
import threading
import weakref

import torch

from ..abi import ffi
from ..engine.calls import KernelCall, launch
from ..ops import dispatch as _ops
from ..ops import spec as _spec
from ..runtime import Array, asarray, empty
from . import _memory

CACHE_SIZE = 4096  # templates per thread; the cache starts over when full

_thread = threading.local()
_NOT_REPLAYABLE = object()


def recorder():
    """The Recorder of the op running in this thread, or None."""
    return getattr(_thread, "recorder", None)


@contextlib.contextmanager
def recording(active):
    """Ops in the block record into ``active`` (None: they run as they are)."""
    previous = getattr(_thread, "recorder", None)
    _thread.recorder = active
    try:
        yield active
    finally:
        _thread.recorder = previous


def refuse() -> None:
    """The running op did something a replay would not redo: it is not replayable."""
    active = getattr(_thread, "recorder", None)
    if active is not None:
        active.replayable = False


class _Templates(dict):
    """One thread's templates (a replay patches its calls, so threads keep their own), and
    ``native``: the native module's Replayer of the same templates, or None without it."""

    def __init__(self):
        super().__init__()
        module = _memory._native
        self.native = None if module is None else module.Replayer(
            _DATA_OFFSET, _BYTE_OFFSET_OFFSET, _ops.C.DK_OK, _ops.C.DK_NOT_READY)

    def clear(self) -> None:
        super().clear()
        if self.native is not None:
            self.native.clear()


_DATA_OFFSET, _BYTE_OFFSET_OFFSET = ffi.offsetof("DK_Tensor", "data"), ffi.offsetof("DK_Tensor", "byte_offset")
_every_thread: list = []  # weak references to each thread's _Templates


def _templates() -> _Templates:
    try:
        return _thread.templates
    except AttributeError:
        _thread.templates = _Templates()
        _every_thread[:] = [ref for ref in _every_thread if ref() is not None] + [weakref.ref(_thread.templates)]
        return _thread.templates


def clear() -> None:
    """Forget every thread's templates (autograd runs backward ops in threads of its own)."""
    for ref in list(_every_thread):
        templates = ref()
        if templates is not None:
            templates.clear()


_SCALARS = frozenset({bool, int, float, str, type(None), torch.dtype, torch.device, torch.memory_format,
                      torch.layout})


def _describe(value, parts: list, tensors: list) -> bool:
    """Adds a hashable stand-in for one argument to ``parts`` and its devkit tensors to
    ``tensors``; False where the argument's values matter (a CPU tensor) or cannot be keyed."""
    cls = type(value)
    if cls in _SCALARS:
        parts += (cls, value)  # the type too: 2 and 2.0 promote differently
        return True
    if isinstance(value, torch.Tensor):
        device = value.get_device()  # -1: a CPU (or meta) tensor
        if device < 0:
            return False
        tensors.append(value)
        parts += (device, value.dtype, value.shape, value.stride())
        return True
    if cls is list or cls is tuple:
        types = tuple(map(type, value))
        if _SCALARS.issuperset(types):  # sizes, dims: the common case, in one piece
            parts += (types, tuple(value))
            return True
        parts.append(len(value))
        for item in value:
            if not _describe(item, parts, tensors):
                return False
        return True
    return False


def key_of(op, args, kwargs) -> tuple[tuple | None, list]:
    """(the template key of a call, its devkit tensors in order), or (None, _) when not keyable."""
    tensors: list = []
    parts = [id(op), len(args)]  # an OpOverload lives as long as torch; its own hash is Python code
    for value in args:
        if isinstance(value, torch.Tensor):  # _describe's first case, inline: the common argument
            device = value.get_device()
            if device < 0:
                return None, tensors
            tensors.append(value)
            parts += (device, value.dtype, value.shape, value.stride())
        elif not _describe(value, parts, tensors):
            return None, tensors
    for name, value in kwargs.items():
        parts.append(name)
        if not _describe(value, parts, tensors):
            return None, tensors
    return tuple(parts), tensors


def run(op, impl, args, kwargs):
    """``impl(*args, **kwargs)``, replayed from its template when one exists."""
    if getattr(_thread, "recorder", None) is not None:  # an op inside a lowering being recorded
        _thread.recorder.refuse()
        return impl(*args, **kwargs)
    templates = _templates()
    native = templates.native
    native_key = None
    if native is not None:
        result = native.replay(op, args, kwargs)  # None: this call is the Python key's to handle
        if result is not None:
            if type(result) is not bytes:
                return result
            native_key = result  # not seen yet: the template recorded below serves it
    key, tensors = key_of(op, args, kwargs)
    if key is None:
        _check_one_device(op, (args, kwargs))
        return impl(*args, **kwargs)
    template = templates.get(key)
    if template is not None:
        if template is _NOT_REPLAYABLE:
            return impl(*args, **kwargs)
        return template.run(tensors)
    _check_one_device(op, tensors)
    with recording(Recorder(tensors)) as recorded:
        result = impl(*args, **kwargs)
    if len(templates) >= CACHE_SIZE:
        templates.clear()
    templates[key] = template = recorded.template(result) or _NOT_REPLAYABLE
    if native_key is not None:
        native.add(native_key, None if template is _NOT_REPLAYABLE else template.native_spec())
    return result


# Ops that take tensors on two devices: the copies between them.
_CROSS_DEVICE = frozenset({torch.ops.aten._copy_from.default, torch.ops.aten._copy_from_and_resize.default,
                           torch.ops.aten.copy_.default, torch.ops.aten.copy.default})


def _devices(value, found: dict) -> None:
    if isinstance(value, torch.Tensor):
        if value.device.type == _memory.DEVICE_TYPE:
            found.setdefault(value.get_device(), value.device)
    elif isinstance(value, (list, tuple)):
        for item in value:
            _devices(item, found)
    elif isinstance(value, dict):
        _devices(list(value.values()), found)


def _check_one_device(op, values) -> None:
    """torch's error for an op given tensors on two devkit devices."""
    found: dict = {}
    _devices(values, found)
    if len(found) > 1 and op not in _CROSS_DEVICE:
        first, second = list(found.values())[:2]
        raise RuntimeError(f"Expected all tensors to be on the same device, but found at least two devices, "
                           f"{first} and {second}! (aten::{op._schema.name.split('::')[1]}.{op._overloadname})")


def _address(cdata) -> int:
    return int(ffi.cast("uintptr_t", cdata))


class _Step:
    """One prebuilt call: per input slot its source, per output its size."""

    __slots__ = ("call", "inputs", "outputs")

    def __init__(self, call: KernelCall, inputs: list, outputs: list):
        self.call = call
        self.inputs = inputs    # (slot, source index, byte offset from the source's start)
        self.outputs = outputs  # (slot, nbytes, device)


class _Copy:
    """A contiguous copy of an earlier call's output into an argument (an in-place op's write)."""

    __slots__ = ("source", "destination", "nbytes", "device")

    def __init__(self, source: int, destination: int, nbytes: int, device):
        self.source, self.destination, self.nbytes, self.device = source, destination, nbytes, device


class Recorder:
    """Runs a lowering's devkit calls as prebuilt calls and notes their sources.

    Sources are numbered: the argument tensors first, then every output of
    every call in order. ``refuse()`` marks the op as not replayable."""

    def __init__(self, tensors: list):
        self.tensors = tensors
        self.replayable = True
        self.steps: list = []
        self.resident: list = []       # constants the calls read
        self.outputs: list[Array] = []  # every call's outputs, in order (source len(tensors) + i)
        self.views = None
        self._origins: dict[int, tuple[int, int]] = {}  # id(allocation) -> (source, byte offset)
        for index, tensor in enumerate(tensors):
            try:
                array = _memory.to_array(tensor)
            except (IndexError, ValueError, RuntimeError):  # no devkit Array (an empty view past its storage)
                self.replayable = False
                continue
            allocation = id(array.buffer._allocation)
            if allocation in self._origins:  # arguments sharing memory: replay would not know
                self.replayable = False
            self._origins.setdefault(allocation, (index, array.buffer.offset + array.offset))

    def refuse(self) -> None:
        self.replayable = False

    def _source(self, array: Array):
        origin = self._origins.get(id(array.buffer._allocation))
        if origin is None:
            return None
        source, start = origin
        return source, array.buffer.offset + array.offset - start

    def run_op(self, name: str, inputs, attrs, device):
        """devkit.ops.run_op, as a prebuilt call this recorder notes."""
        if self.replayable:
            results = self._record_call(name, inputs, attrs, device)
            if results is not None:
                return results
            self.replayable = False
        return _ops.run_op(name, inputs, attrs, device=device)

    def _record_call(self, name, inputs, attrs, device):
        bound = _ops.bind_call(_spec.get(name), inputs, attrs, device)
        entry = bound.entry
        if entry is None or bound.reads_values:
            return None
        dev = bound.device
        strided = entry.flags & _ops.C.DK_KERNEL_STRIDED_INPUTS
        call_inputs, sources = [], []
        for slot, position in enumerate(bound.call_inputs):
            value = None if position is None else inputs[position]
            if isinstance(value, Array):
                source = self._source(value)
                if source is None or not (strided or value.is_contiguous):
                    return None
                sources.append((slot, *source))
            elif value is not None:  # a host value the kernel reads: uploaded once
                value = asarray(value, dev)
                self.resident.append(value)
            call_inputs.append(value)
        results = [empty(shape, dtype, dev) for shape, dtype in bound.outputs]
        call = KernelCall(dev, entry, name, call_inputs, results, bound.attributes)
        launch(call)
        outputs = []
        for slot, array in enumerate(results):
            self._origins[id(array.buffer._allocation)] = (len(self.tensors) + len(self.outputs), 0)
            self.outputs.append(array)
            outputs.append((call.outputs[slot], array.nbytes, dev))
        self.steps.append(_Step(call, [(call.inputs[slot], source, delta) for slot, source, delta in sources],
                                outputs))
        return results

    def write(self, destination: torch.Tensor, source) -> bool:
        """Records and runs ``destination[...] = source`` when it is a contiguous copy of an
        earlier call's whole output into an argument; False otherwise (the op is then not replayable)."""
        if not self.replayable:
            return False
        index = next((i for i, t in enumerate(self.tensors) if t is destination), None)
        origin = self._source(source) if isinstance(source, Array) else None
        target = _memory.to_array(destination)
        if (index is None or origin is None or origin[0] < len(self.tensors) or origin[1]
                or source.dtype != target.dtype or source.shape != target.shape
                or not source.is_contiguous or not target.is_contiguous or not target.size):
            self.replayable = False
            return False
        target.buffer.view(target.offset, target.nbytes).copy_from(source.buffer.view(0, source.nbytes))
        self.steps.append(_Copy(origin[0], index, target.nbytes, source.device))
        return True

    def view(self, base: torch.Tensor, geometries: list) -> None:
        """A view op's results: (shape, strides, storage offset) each, on ``base``'s storage."""
        if self.steps or base is not self.tensors[0] or self.views is not None:
            self.replayable = False
            return
        offset = base.storage_offset()
        self.views = [(tuple(shape), tuple(strides), storage_offset - offset)
                      for shape, strides, storage_offset in geometries]

    def template(self, result):
        """The template replaying what was recorded, producing ``result``'s structure; or None."""
        if not self.replayable:
            return None
        single = isinstance(result, torch.Tensor)
        results = [result] if single else result
        if not isinstance(results, (list, tuple)):
            return None
        if self.views is not None:
            return _ViewTemplate(self.views, single) if len(self.views) == len(results) else None
        produced, seen = [], set()
        for value in results:
            if value is None:
                produced.append(None)
                continue
            if not isinstance(value, torch.Tensor):
                return None
            index = next((i for i, t in enumerate(self.tensors) if t is value), None)
            if index is not None:
                produced.append((index, None))
                continue
            origin = self._source(_memory.to_array(value))
            if origin is None or origin[0] < len(self.tensors) or origin[0] in seen:
                return None
            seen.add(origin[0])
            produced.append((origin[0], (value.dtype, tuple(value.shape), tuple(value.stride()),
                                         value.storage_offset())))
        return _Template(self, produced, single, type(result))


class _Template:
    """Recorded calls replayed: see the module doc."""

    __slots__ = ("steps", "resident", "argument_count", "itemsizes", "results", "single",
                 "result_type", "scratch")

    def __init__(self, recording: Recorder, results: list, single: bool, result_type):
        self.steps = recording.steps
        self.resident = recording.resident
        self.argument_count = count = len(recording.tensors)
        self.itemsizes = [t.element_size() for t in recording.tensors]
        self.results = results
        self.single = single
        self.result_type = result_type
        # The calls' outputs no result keeps (an in-place op's value before its copy): reused after the run.
        kept = {result[0] for result in results if result is not None}
        self.scratch = [i for i in range(len(recording.outputs)) if count + i not in kept]

    def native_spec(self):
        """What the native Replayer runs: the addresses of the calls, their tensor slots and
        kernel functions, and of the plugin's copy_d2d for an in-place op's write."""
        steps = []
        for step in self.steps:
            if type(step) is _Copy:
                device = step.device
                steps.append((_address(device.plugin.api.copy_d2d), device.index, step.source, step.destination,
                              step.nbytes))
                continue
            steps.append((_address(step.call.fn), _address(step.call.cdata),
                          [(_address(ffi.addressof(slot)), source, delta) for slot, source, delta in step.inputs],
                          [(_address(ffi.addressof(slot)), (device, nbytes), device, nbytes, device.index)
                           for slot, nbytes, device in step.outputs]))
        results = [None if result is None else (result[0],) if result[1] is None else (result[0], *result[1])
                   for result in self.results]
        return ("calls", self, steps, self.scratch, results, self.single, self.result_type)

    def failed(self, index: int, status: int) -> None:
        """Raises the error of step ``index``, which returned ``status`` in a native replay."""
        step = self.steps[index]
        if type(step) is _Copy:
            step.device.plugin.raise_status(status, "copy_d2d")
        step.call.plugin.raise_status(status, step.call.label())

    def run(self, tensors: list):
        live, new_buffer = _memory.live, _memory.new_buffer
        # Per source, where it starts: (handle, byte offset); the arguments, then every call's outputs.
        places = []
        for tensor, itemsize in zip(tensors, self.itemsizes):
            places.append((live[tensor.untyped_storage().data_ptr()][0].handle, tensor.storage_offset() * itemsize))
        buffers = []  # the calls' outputs
        for step in self.steps:
            if type(step) is _Copy:  # places hold whole allocations' handles: the byte offsets are absolute
                handle, offset = places[step.destination]
                device = step.device
                device.call("copy_d2d", device.index, handle, offset, buffers[step.source - self.argument_count].handle,
                            0, step.nbytes, ffi.NULL)
                continue
            for slot, source, delta in step.inputs:
                handle, offset = places[source]
                slot.data = handle
                slot.byte_offset = offset + delta
            for slot, nbytes, device in step.outputs:  # their byte offsets stay 0
                buffer = new_buffer(device, nbytes)
                buffers.append(buffer)
                slot.data = handle = buffer.handle
                places.append((handle, 0))
            launch(step.call)
        for index in self.scratch:  # later work on the device's queue runs after these calls
            _memory.give_back(buffers[index])
        if self.single:
            index, geometry = self.results[0]
            if geometry is None:
                return tensors[index]
            return _memory.tensor_on(buffers[index - self.argument_count], *geometry)
        results = []
        for result in self.results:
            if result is None:
                results.append(None)
            elif result[1] is None:
                results.append(tensors[result[0]])
            else:
                dtype, shape, strides, storage_offset = result[1]
                results.append(_memory.tensor_on(buffers[result[0] - self.argument_count], dtype, shape,
                                                 strides, storage_offset))
        return self.result_type(results)


class _ViewTemplate:
    """A view op replayed: the geometry of each result relative to its base."""

    __slots__ = ("views", "single")

    def __init__(self, views: list, single: bool):
        self.views = views
        self.single = single

    def native_spec(self):
        return ("views", self, [(list(shape), list(strides), delta) for shape, strides, delta in self.views],
                self.single)

    def run(self, tensors: list):
        base = tensors[0]
        offset = base.storage_offset()
        results = [_memory.view(base, shape, strides, offset + delta) for shape, strides, delta in self.views]
        return results[0] if self.single else tuple(results)

