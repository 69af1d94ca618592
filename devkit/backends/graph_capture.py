"""What the graph sections (ABI 1.1) of the plugins written in Python (opencl,
cuda) share: the refusal of a call a capturing stream forbids, a deep copy of
a captured DK_KernelCall, and the slot-range error of graph_rebind."""

from __future__ import annotations

from ..abi import C, ffi
from .python_plugin import PluginError


def capture_refused(what: str) -> PluginError:
    return PluginError(C.DK_FAILED_PRECONDITION,
                       f"{what} is capturing a graph; this call is refused until graph_end_capture")


def copy_kernel_call(call, stream_handle):
    """A deep copy of a DK_KernelCall on ``stream_handle`` and what keeps it alive."""
    keep = []

    def tensors(source, count):
        array = ffi.new("DK_Tensor[]", max(count, 1))
        for i in range(count):
            t, original = array[i], source[i]
            ffi.memmove(ffi.addressof(t), ffi.addressof(original), ffi.sizeof("DK_Tensor"))
            if original.ndim > 0:
                shape = ffi.new("int64_t[]", [original.shape[k] for k in range(original.ndim)])
                keep.append(shape)
                t.shape = shape
                if original.strides != ffi.NULL:
                    strides = ffi.new("int64_t[]", [original.strides[k] for k in range(original.ndim)])
                    keep.append(strides)
                    t.strides = strides
        keep.append(array)
        return array

    def attribute(a):
        copy = ffi.new("DK_Attribute *")
        ffi.memmove(copy, a, ffi.sizeof("DK_Attribute"))
        keep.append(copy)
        copy.name = owned(keep, "char[]", ffi.string(a.name))
        if a.type == C.DK_ATTR_INTS:
            copy.ints = owned(keep, "int64_t[]", [a.ints[k] for k in range(a.count)] or [0])
        elif a.type == C.DK_ATTR_FLOATS:
            copy.floats = owned(keep, "double[]", [a.floats[k] for k in range(a.count)] or [0.0])
        elif a.type == C.DK_ATTR_STRING:
            copy.s = owned(keep, "char[]", ffi.string(a.s))
        return copy

    copy = ffi.new("DK_KernelCall *")
    ffi.memmove(copy, call, ffi.sizeof("DK_KernelCall"))
    copy.stream = stream_handle
    copy.inputs = tensors(call.inputs, call.num_inputs)
    copy.outputs = tensors(call.outputs, call.num_outputs)
    attributes = [attribute(call.attributes[i]) for i in range(call.num_attributes)]
    copy.attributes = owned(keep, "DK_Attribute *[]", attributes or [ffi.NULL])
    keep.append(copy)
    return copy, keep


def owned(keep: list, ctype: str, init):
    cdata = ffi.new(ctype, init)
    keep.append(cdata)
    return cdata


def no_such_slot(slot: int, count: int) -> PluginError:
    return PluginError(C.DK_OUT_OF_RANGE, f"slot {slot} does not exist: the graph has {count} slot(s)")
