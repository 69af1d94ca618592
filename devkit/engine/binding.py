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


class Registrar:
    """What a plan's bound runs register host memory with, looked up once: the
    plugin's two functions and one handle cell per input and output."""

    __slots__ = ("index", "register", "unregister", "cells", "_array")

    def __init__(self, device, count: int):
        api = device.plugin.api
        self.index = device.index
        self.register, self.unregister = api.mem_register_host, api.mem_unregister_host
        self._array = ffi.new("DK_Mem[]", max(count, 1))  # what the cells point into
        self.cells = [self._array + k for k in range(max(count, 1))]


class BoundRun:
    """One bound run of a plan: see the module doc. ``run`` holds the plan's lock."""

    __slots__ = ("plan", "device", "stream", "wait", "in_place", "_registered", "_patched", "_sources")

    def __init__(self, plan, stream, wait: bool):
        self.plan = plan
        self.device = plan.device
        self.stream = stream  # None: the default stream
        self.wait = wait
        self.in_place = wait and plan._registrar is not None
        self._registered: list = []
        self._patched: list = []     # (tensor, data, byte_offset) to restore
        self._sources: dict[int, object] = {}  # id(input arena Array) -> where the input lies

    def run(self, feed, outputs: Sequence | None, device_outputs: bool) -> list:
        plan, stream = self.plan, self.stream
        try:
            for (name, slot), references in zip(plan._inputs, plan._input_references):
                self._bind_input(name, feed[name], slot, references)
            results, copies = [], []
            for index, (value, references) in enumerate(zip(plan._outputs, plan._output_references)):
                given = outputs[index] if outputs is not None else None
                results.append(self._bind_output(index, value, references, given, device_outputs, copies))
            calls = plan.calls
            handle = ffi.NULL if stream is None else stream.handle
            for call in calls:
                call.cdata.stream = handle
            plan._launcher.forget_stream()  # its calls' stream is this run's now
            for call in calls:
                launch(call)
            for copy in copies:
                copy()
            if stream is not None:
                if self.wait:
                    stream.synchronize()
                else:
                    stream.retain(plan, feed, results)
            return results
        finally:
            for tensor, data, offset in self._patched:
                tensor.data, tensor.byte_offset = data, offset
            if self._registered:
                if stream is not None and sys.exc_info()[0] is not None:
                    # A launch failed after earlier ones were queued: they may still use the
                    # registered memory, so they finish before it is given back.
                    with contextlib.suppress(Exception):
                        stream.synchronize()
                registrar = plan._registrar
                unregister, index = registrar.unregister, registrar.index
                for mem in self._registered:
                    status = unregister(index, mem)
                    if status != _DK_OK:
                        self.device.plugin.raise_status(status, "mem_unregister_host")

    # -- where a value lies ----------------------------------------------------------------

    def _point(self, references: list, handle, offset: int) -> None:
        patched = self._patched
        for tensor in references:
            patched.append((tensor, tensor.data, tensor.byte_offset))
            tensor.data, tensor.byte_offset = handle, offset

    def _register(self, host: np.ndarray, writable: bool):
        """host's memory as a device handle, or None where it is to be copied."""
        if not (self.in_place and host.nbytes >= BIND_IN_PLACE_BYTES):
            return None
        flags = host.flags  # a new object at every read
        if not (flags.c_contiguous and flags.aligned and (flags.writeable or not writable)):
            return None
        registrar = self.plan._registrar
        cell = registrar.cells[len(self._registered)]
        status = registrar.register(registrar.index, ffi.from_buffer(host), host.nbytes, cell)
        if status == _DK_ALREADY_EXISTS:  # a view of device memory, or an array given twice
            return None
        if status != _DK_OK:
            self.device.plugin.raise_status(status, "mem_register_host")
        self._registered.append(cell[0])
        return cell[0]

    def _bind_input(self, name: str, value, slot: Array, references: list) -> None:
        if isinstance(value, Array):
            _check_device_array(value, slot, f"input '{name}'", self.device)
            self._sources[id(slot)] = value
            if references:
                self._point(references, value.buffer.handle, value.buffer.offset + value.offset)
            return
        if not value.size:
            return
        mem = self._register(value, writable=False) if references else None
        if mem is not None:
            self._sources[id(slot)] = value
            self._point(references, mem, 0)
            return
        if not value.flags.c_contiguous:
            value = value.copy(order="C")
        slot.buffer.copy_from_host(value.reshape(-1).view(np.uint8), stream=self.stream)

    def _bind_output(self, index: int, value, references, given, device_outputs: bool, copies: list):
        """The output's destination, bound or with its copy queued in ``copies``."""
        shape, dtype = value.shape, value.dtype
        fresh = given is None
        if fresh:
            given = empty(shape, dtype, self.device) if device_outputs else np.empty(shape, dtype)
        elif isinstance(given, Array):
            _check_device_array(given, value, f"output {index}", self.device)
        else:
            _check_host_array(given, value, f"output {index}")
        if not given.size:
            return given
        if references is not None and (fresh or not _overlaps_an_input(given, self._sources.values())):
            if isinstance(given, Array):
                self._point(references, given.buffer.handle, given.buffer.offset + given.offset)
                return given
            mem = self._register(given, writable=True)
            if mem is not None:
                self._point(references, mem, 0)
                return given
        source = value if isinstance(value, np.ndarray) else self._sources.get(id(value), value)
        copies.append(lambda: _copy(source, given, self.stream))
        return given


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

