"""I/O binding: a plan run straight on the caller's memory, as onnxruntime's
IOBinding and PJRT's buffers on a host device.

A plan's calls read their inputs from, and write their outputs to, arena
slots. A bound run points the calls' tensors at other memory for the run
(and back after), so nothing is staged:

- a devkit Array on the plan's device (contiguous, of the input's or the
  output's shape and dtype) is used where it lies;
- a NumPy array is used in place where the plugin registers host memory
  (ABI 1.3, mem_register_host: the cpu plugin), the run waits for its
  results, and the array is C-contiguous, aligned and at least
  BIND_IN_PLACE_BYTES (below that a copy costs less than registering);
- anything else is copied into its arena slot, or out of it, in stream
  order, as an unbound run does.

An output is bound only where a kernel call of the plan writes it and no
other graph output is the same value; the others (host values, weights, a
graph input passed through) are copied into their destination.
"""

from __future__ import annotations

import contextlib
import sys
from collections.abc import Sequence

import numpy as np

from ..abi import C, ffi
from ..runtime import Array, empty
from .calls import launch

# Arrays this large are bound in place; smaller ones are copied.
BIND_IN_PLACE_BYTES = 1 << 16
_DK_OK, _DK_ALREADY_EXISTS = C.DK_OK, C.DK_ALREADY_EXISTS


def slot_references(steps: Sequence) -> dict[int, list]:
    """id(slot) -> every DK_Tensor of the steps' calls that points at the slot."""
    references: dict[int, list] = {}
    for call, inputs, outputs in steps:
        for position, slot in inputs:
            references.setdefault(id(slot), []).append(call.inputs[position])
        for position, slot in outputs:
            references.setdefault(id(slot), []).append(call.outputs[position])
    return references


def _pointers(references: list) -> list:
    """Each DK_Tensor's (data, byte_offset): where a bound run points it back."""
    return [(tensor.data, tensor.byte_offset) for tensor in references]


class Binding:
    """A plan's bound runs: what every one needs, looked up once (per input
    and output the calls' DK_Tensors that point at its slot and where they
    point, the plugin's registration functions and handle cells), and
    ``run``, one bound run (see the module doc). Plan.run holds the plan's
    lock, so one run at a time uses the cells."""

    __slots__ = ("plan", "device", "inputs", "outputs", "large_output", "_register", "_unregister", "_cells",
                 "_cell_array")

    def __init__(self, plan, input_references: list[list], output_references: list[list | None]):
        self.plan = plan
        self.device = device = plan.device
        # Per input: (name, arena Array, its DK_Tensors, their arena pointers).
        self.inputs = [(name, slot, references, _pointers(references))
                       for (name, slot), references in zip(plan._inputs, input_references)]
        # Per output: (value, its DK_Tensors or None (not bindable), their arena pointers).
        self.outputs = [(value, references, None if references is None else _pointers(references))
                        for value, references in zip(plan._outputs, output_references)]
        self._register = self._unregister = self._cells = self._cell_array = None
        if device.plugin.has_host_registration:  # one handle cell per input and output
            api = device.plugin.api
            self._register, self._unregister = api.mem_register_host, api.mem_unregister_host
            self._cell_array = ffi.new("DK_Mem[]", max(len(self.inputs) + len(self.outputs), 1))
            self._cells = [self._cell_array + k for k in range(len(self._cell_array))]
        self.large_output = self._cells is not None and any(
            references is not None and value.nbytes >= BIND_IN_PLACE_BYTES for value, references, _ in self.outputs)

    @property
    def registers(self) -> bool:
        """Whether the plugin registers host memory (NumPy arrays can be bound in place)."""
        return self._cells is not None

    def run(self, feed, stream, wait: bool, outputs: Sequence | None, device_outputs: bool) -> list:
        """One bound run: ``stream`` None is the default stream; with ``wait``
        the results are complete on return, and NumPy arrays may be bound in place."""
        plan = self.plan
        in_place = wait and self._cells is not None
        registered: list = []  # this run's registrations' handles
        patched: list = []     # (DK_Tensors, their arena pointers) to point back
        sources: dict[int, object] = {}  # id(input arena Array) -> where the input lies
        try:
            for name, slot, references, pointers in self.inputs:
                value = feed[name]
                if type(value) is not np.ndarray and isinstance(value, Array):
                    _check_device_array(value, slot, f"input '{name}'", self.device)
                    sources[id(slot)] = value
                    if references:
                        _point(references, value.buffer.handle, value.buffer.offset + value.offset)
                        patched.append((references, pointers))
                    continue
                if not value.size:
                    continue
                mem = self._host_handle(value, False, registered) if in_place and references else None
                if mem is not None:
                    sources[id(slot)] = value
                    _point(references, mem, 0)
                    patched.append((references, pointers))
                    continue
                if not value.flags.c_contiguous:
                    value = value.copy(order="C")
                slot.buffer.copy_from_host(value.reshape(-1).view(np.uint8), stream=stream)
            results, copies = [], []
            for index, (value, references, pointers) in enumerate(self.outputs):
                given = outputs[index] if outputs is not None else None
                fresh = given is None
                if fresh:
                    given = empty(value.shape, value.dtype, self.device) if device_outputs else \
                        np.empty(value.shape, value.dtype)
                elif isinstance(given, Array):
                    _check_device_array(given, value, f"output {index}", self.device)
                else:
                    _check_host_array(given, value, f"output {index}")
                results.append(given)
                if not given.size:
                    continue
                if references is not None and (fresh or not _overlaps_an_input(given, sources.values())):
                    if isinstance(given, Array):
                        _point(references, given.buffer.handle, given.buffer.offset + given.offset)
                        patched.append((references, pointers))
                        continue
                    mem = self._host_handle(given, True, registered) if in_place else None
                    if mem is not None:
                        _point(references, mem, 0)
                        patched.append((references, pointers))
                        continue
                source = value if isinstance(value, np.ndarray) else sources.get(id(value), value)
                copies.append((source, given))
            calls = plan.calls
            handle = ffi.NULL if stream is None else stream.handle
            for call in calls:
                call.cdata.stream = handle
            plan._launcher.forget_stream()  # its calls' stream is this run's now
            for call in calls:
                launch(call)
            for source, given in copies:
                _copy(source, given, stream)
            if stream is not None:
                if wait:
                    stream.synchronize()
                else:
                    stream.retain(plan, feed, results)
            return results
        finally:
            for references, pointers in patched:
                for tensor, (data, offset) in zip(references, pointers):
                    tensor.data, tensor.byte_offset = data, offset
            if registered:
                if stream is not None and sys.exc_info()[0] is not None:
                    # A launch failed after earlier ones were queued: they may still use the
                    # registered memory, so they finish before it is given back.
                    with contextlib.suppress(Exception):
                        stream.synchronize()
                unregister, index = self._unregister, self.device.index
                for mem in registered:
                    status = unregister(index, mem)
                    if status != _DK_OK:
                        self.device.plugin.raise_status(status, "mem_unregister_host")

    def _host_handle(self, host: np.ndarray, writable: bool, registered: list):
        """host's memory registered as a device handle (appended to
        ``registered``), or None where it is to be copied instead."""
        if host.nbytes < BIND_IN_PLACE_BYTES:
            return None
        flags = host.flags  # a new object at every read
        if not (flags.c_contiguous and flags.aligned and (flags.writeable or not writable)):
            return None
        cell = self._cells[len(registered)]
        status = self._register(self.device.index, ffi.from_buffer(host), host.nbytes, cell)
        if status == _DK_ALREADY_EXISTS:  # a view of device memory, or an array given twice
            return None
        if status != _DK_OK:
            self.device.plugin.raise_status(status, "mem_register_host")
        mem = cell[0]
        registered.append(mem)
        return mem


def _point(references: list, handle, offset: int) -> None:
    for tensor in references:
        tensor.data, tensor.byte_offset = handle, offset


def _check_device_array(array: Array, like, what: str, device) -> None:
    if array.device is not device:
        raise ValueError(f"{what} is on {array.device}; the plan runs on {device}")
    _check_layout(array, like, what)
    if not array.is_contiguous:
        raise ValueError(f"{what} must be contiguous (strides {array.strides})")


def _check_host_array(array, like, what: str) -> None:
    if not isinstance(array, np.ndarray):
        raise TypeError(f"{what} must be a NumPy array or a devkit Array, got {type(array).__name__}")
    _check_layout(array, like, what)
    if not array.flags.writeable:
        raise ValueError(f"{what} is read-only")
    if not array.flags.c_contiguous:
        raise ValueError(f"{what} must be C-contiguous (strides {array.strides})")


def _check_layout(array, like, what: str) -> None:
    if tuple(array.shape) != tuple(like.shape) or array.dtype != like.dtype:
        raise ValueError(f"{what} has shape {tuple(array.shape)} and dtype {array.dtype}; the plan "
                         f"gives shape {tuple(like.shape)} and dtype {like.dtype}")


def _overlaps_an_input(given, sources) -> bool:
    """Whether ``given`` shares memory with an input the run reads in place
    (a kernel would then write what later kernels still read)."""
    for source in sources:
        if type(source) is not type(given):
            continue
        if isinstance(given, np.ndarray):
            if np.may_share_memory(given, source):
                return True
        elif given.buffer._allocation is source.buffer._allocation:
            low, high = given.buffer.offset + given.offset, given.buffer.offset + given.offset + given.nbytes
            other = source.buffer.offset + source.offset
            if low < other + source.nbytes and other < high:
                return True
    return False


def _copy(source, destination, stream) -> None:
    """``source`` (a host value, an input as given, or a device Array) into ``destination``."""
    if isinstance(source, np.ndarray):
        if isinstance(destination, np.ndarray):
            np.copyto(destination, source)
        else:
            host = np.ascontiguousarray(source)
            destination.buffer.copy_from_host(host.reshape(-1).view(np.uint8),
                                              offset=destination.offset, stream=stream)
    elif isinstance(destination, np.ndarray):
        flat = destination.reshape(-1).view(np.uint8)
        source.buffer.copy_to_host(flat, offset=source.offset, stream=stream)
    else:
        region = destination.buffer.view(destination.offset, destination.nbytes)
        region.copy_from(source.buffer.view(source.offset, source.nbytes), stream=stream)

