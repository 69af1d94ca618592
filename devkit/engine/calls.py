"""Prebuilt kernel calls: a DK_KernelCall with its tensors and attributes
built once, and the one function every kernel launch goes through.

A call is built from the arrays of its first use; a later launch only
patches the data pointers (``bind``) and the stream. The ABI lends a call to
the kernel for the duration of the call only, so one prebuilt call may be
launched any number of times, one launch at a time.
"""

from __future__ import annotations

import numpy as np

from .. import dtypes as _dtypes
from ..abi import C, ffi, field_end

_DK_OK, _DK_NOT_READY = C.DK_OK, C.DK_NOT_READY
_ATTRIBUTE_STRUCT_SIZE = ffi.sizeof("DK_Attribute")
_CALL_STRUCT_SIZE = ffi.sizeof("DK_KernelCall")
_PREPARE_END = field_end("DK_KernelEntry", "prepare")


def _fill_tensor(slot, array, keep: list) -> None:
    shape = ffi.new("int64_t[]", array.shape or [0])
    strides = ffi.new("int64_t[]", array.strides or [0])
    keep += [shape, strides]
    code, bits = _dtypes.code_bits(array.dtype)
    slot.device.device_type = array.device.properties.device_type
    slot.device.device_id = array.device.index
    slot.ndim = array.ndim
    slot.dtype.code, slot.dtype.bits, slot.dtype.lanes = code, bits, 1
    slot.shape = shape
    slot.strides = strides
    bind(slot, array)


def bind(slot, array) -> None:
    """Point a DK_Tensor slot at ``array``'s memory (shape and dtype stay)."""
    buffer = array.buffer
    slot.data = buffer.handle
    slot.byte_offset = buffer.offset + array.offset


def _owned(keep: list, ctype: str, init):
    """A new cdata that ``keep`` owns: a struct field assigned a fresh ffi.new
    does not keep it alive by itself."""
    cdata = ffi.new(ctype, init)
    keep.append(cdata)
    return cdata


def _attribute(name: str, kind: str, value, keep: list):
    a = _owned(keep, "DK_Attribute *", None)
    a.struct_size = _ATTRIBUTE_STRUCT_SIZE
    a.name = _owned(keep, "char[]", name.encode())
    if kind == "int":
        a.type, a.i = C.DK_ATTR_INT, value
    elif kind == "float":
        a.type, a.f = C.DK_ATTR_FLOAT, value
    elif kind == "ints":
        a.type, a.count = C.DK_ATTR_INTS, len(value)
        a.ints = _owned(keep, "int64_t[]", list(value) or [0])
    elif kind == "floats":
        a.type, a.count = C.DK_ATTR_FLOATS, len(value)
        a.floats = _owned(keep, "double[]", list(value) or [0.0])
    elif kind == "string":
        a.type = C.DK_ATTR_STRING
        a.s = _owned(keep, "char[]", value.encode())
    else:
        a.type = C.DK_ATTR_DTYPE
        a.dtype.code, a.dtype.bits = _dtypes.code_bits(value)
        a.dtype.lanes = 1
    return a


def key_dtype_of(entry) -> np.dtype:
    """The key dtype of a DK_KernelEntry."""
    code, bits = entry.dtype.code, entry.dtype.bits
    if code == C.DK_DTYPE_CODE_BFLOAT:
        return _dtypes.bfloat16
    kind = {C.DK_DTYPE_CODE_BOOL: "bool", C.DK_DTYPE_CODE_INT: "int", C.DK_DTYPE_CODE_UINT: "uint",
            C.DK_DTYPE_CODE_FLOAT: "float"}[code]
    return np.dtype("bool" if kind == "bool" else f"{kind}{bits}")


def prepare_fn(entry):
    """The entry's DK_PrepareFn (ABI 1.4 prepared weights), or None: NULL, or
    past the struct_size of an entry an older plugin wrote."""
    if entry.struct_size < _PREPARE_END or entry.prepare == ffi.NULL:
        return None
    return entry.prepare


class KernelCall:
    """One kernel call, built once. ``inputs``/``outputs`` are the DK_Tensor
    slots (an omitted optional input has ndim -1); ``bind`` repoints one."""

    __slots__ = ("plugin", "op", "entry", "fn", "cdata", "inputs", "outputs", "attributes", "_keep")

    def __init__(self, dev, entry, op: str, inputs: list, outputs: list,
                 attributes: list[tuple[str, str, object]], stream_handle=ffi.NULL):
        keep: list = []
        tensors_in = ffi.new("DK_Tensor[]", max(len(inputs), 1))
        for slot, array in zip(tensors_in, inputs):
            if array is None:
                slot.ndim = -1
            else:
                _fill_tensor(slot, array, keep)
        tensors_out = ffi.new("DK_Tensor[]", max(len(outputs), 1))
        for slot, array in zip(tensors_out, outputs):
            _fill_tensor(slot, array, keep)
        attrs = [_attribute(name, kind, value, keep) for name, kind, value in attributes]
        attr_ptrs = _owned(keep, "DK_Attribute *[]", attrs or [ffi.NULL])
        call = ffi.new("DK_KernelCall *")
        call.struct_size = _CALL_STRUCT_SIZE
        call.device = dev.index
        call.stream = stream_handle
        call.inputs, call.num_inputs = tensors_in, len(inputs)
        call.outputs, call.num_outputs = tensors_out, len(outputs)
        call.attributes, call.num_attributes = attr_ptrs, len(attrs)
        call.user_data = entry.user_data
        self.plugin = dev.plugin
        self.op = op
        self.entry = entry
        self.fn = entry.fn
        self.cdata = call
        self.inputs = tensors_in
        self.outputs = tensors_out
        self.attributes = attributes  # (name, kind, value), as given: what the fusion pass reads
        self._keep = keep

    def label(self) -> str:
        """What an error names: ``kernel Add[float32]``."""
        return f"kernel {self.op}[{_dtypes.dtype_name(key_dtype_of(self.entry))}]"


def launch(call: KernelCall) -> None:
    """Launch a prebuilt call on the stream it holds: the one place every
    kernel call goes through (eager ops and plans alike). A failing status
    raises the plugin's error; the label is built only then."""
    status = call.fn(call.cdata)
    if status != _DK_OK and status != _DK_NOT_READY:
        call.plugin.raise_status(status, call.label())
