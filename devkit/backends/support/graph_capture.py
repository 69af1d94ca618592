"""What the graph sections (ABI 1.1) of the plugins written in Python (opencl,
cuda) share: the refusal of a call a capturing stream forbids, a deep copy of
a captured DK_KernelCall, the patching of a slot by graph_rebind, and the
table functions that only handle graphs (end_capture, rebind, destroy).

A plugin's Device has ``lock``, ``name``, ``stream(handle)`` and ``graphs``
(DK_Graph key -> graph); its graphs have ``slots``,
``rebind(slot, mem, offset)`` and ``close()``."""

from __future__ import annotations

import itertools

from ...abi import C, ffi
from .boundary import PluginError, handle_key, invalid


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


def rebind_slot(slots: list, slot: int, mem, offset: int, prepare):
    """Points slot ``slot`` -- (node, its DK_Tensor in the kept call) -- at
    (mem, offset) and runs ``prepare(node)``, which checks the tensor against
    its new memory; if that raises, the slot is left as it was. Returns the node."""
    if not 0 <= slot < len(slots):
        raise PluginError(C.DK_OUT_OF_RANGE, f"slot {slot} does not exist: the graph has {len(slots)} slot(s)")
    node, tensor = slots[slot]
    captured = tensor.data, tensor.byte_offset
    tensor.data, tensor.byte_offset = mem, offset
    try:
        prepare(node)
    except BaseException:
        tensor.data, tensor.byte_offset = captured
        raise
    return node


# DK_Graph values: numbers never reused, so a destroyed graph's handle names no other graph.
_graph_numbers = itertools.count(0x6A000001)


def capturing_stream(d, stream):
    """The device's stream ``stream``, which is not the NULL stream."""
    if stream == ffi.NULL:
        raise invalid("stream is NULL; the default stream cannot capture")
    return d.stream(stream)


def end_capture(d, stream, graph, num_slots, take_capture) -> None:
    """graph_end_capture; ``take_capture(s)`` ends the capture on the plugin's
    stream ``s`` and returns its graph (None when it was not capturing)."""
    s = capturing_stream(d, stream)
    if graph == ffi.NULL or num_slots == ffi.NULL:
        raise invalid(f"{'graph' if graph == ffi.NULL else 'num_slots'} is NULL")
    g = take_capture(s)
    if g is None:
        raise PluginError(C.DK_FAILED_PRECONDITION, f"stream {handle_key(stream):#x} is not capturing")
    key = next(_graph_numbers)
    with d.lock:
        d.graphs[key] = g
    graph[0], num_slots[0] = ffi.cast("DK_Graph", key), len(g.slots)


def lookup(d, graph):
    if graph == ffi.NULL:
        raise invalid("graph is NULL")
    with d.lock:
        found = d.graphs.get(handle_key(graph))
    if found is None:
        raise invalid(f"graph {handle_key(graph):#x} is not a live graph on {d.name}")
    return found


def rebind(d, graph, slot: int, mem, offset: int) -> None:
    lookup(d, graph).rebind(slot, mem, offset)


def destroy(d, graph) -> None:
    if graph == ffi.NULL:
        return
    with d.lock:
        found = d.graphs.pop(handle_key(graph), None)
    if found is None:
        raise invalid(f"graph {handle_key(graph):#x} is not a live graph on {d.name}")
    found.close()  # work already submitted holds its own references
