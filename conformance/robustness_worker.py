"""The plugin side of the robustness suite: malformed calls, made in a process that may die.

    python robustness_worker.py PLUGIN

reads one case id per line on stdin and answers each with one JSON line on
stdout: ``{"case": id, "calls": [[status, ...], ...], "messages": [...],
"alive": null | str, "problem": null | str, "skip": null | str}``. ``calls``
holds, per malformed call, what the plugin returned (for a kernel, the
launch's status and the stream's synchronisation after it); ``alive`` is
None when the plugin still allocates, copies, computes and synchronises after
the case, else what failed. A case that kills the process ends the answers: test_robustness.py
reports the signal and starts a new worker for the next case.

The catalogue (``CASES``, ``kernel_cases``) is shared with test_robustness.py,
which turns every id into a test. Per-kernel cases come from the op specs:
each op's first conformance case is the valid call, and every mutation of it
-- a missing, ill-typed or out-of-range attribute, a tensor too few or too
many, a rank or dtype the op does not take -- is kept only when the op spec
itself says the mutated call is invalid (the attribute's choices and check,
or shape inference raising or disagreeing with the outputs passed), so a
correct plugin must refuse every one.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import math
import sys
import traceback
from collections.abc import Callable
from pathlib import Path

import numpy as np

if __package__ in (None, ""):  # run as a script: import the suite's package as installed
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import devkit
from devkit import dtypes as _dtypes
from devkit import ops
from devkit.abi import C, ffi
from devkit.engine import calls
from devkit.ops import dispatch, spec as _spec
from devkit.ops.testing import rng_for

OK = C.DK_OK
MARK = "@robustness "  # starts the worker's answer lines (a plugin may print to stdout too)
# Preferred dtypes of an op's valid call: the first of these the op and the plugin have.
PREFERRED_DTYPES = ("float32", "int32", "int64", "bool", "float64", "float16", "bfloat16", "int8", "uint8")


# -- the ABI cases ------------------------------------------------------------------------


class Context:
    """What a case works with: the plugin, device 0 and a scratch allocation."""

    def __init__(self, plugin: devkit.Plugin):
        self.plugin = plugin
        self.api = plugin.api
        self.dev = plugin.device(0)
        self.count = plugin.device_count

    def raw(self, function: str, *args) -> int:
        return getattr(self.api, function)(*args)

    def alloc(self, nbytes: int):
        out = ffi.new("DK_Mem *")
        assert self.raw("mem_alloc", 0, nbytes, out) == OK, "a valid mem_alloc failed"
        return out[0]

    def free(self, mem) -> None:
        self.raw("mem_free", 0, mem)

    def stream(self):
        out = ffi.new("DK_Stream *")
        assert self.raw("stream_create", 0, out) == OK, "a valid stream_create failed"
        return out[0]


# id -> the case: it makes malformed calls and returns, per call, the statuses it got back.
CASES: dict[str, Callable[[Context], list[list[int]]]] = {}


def case(function):
    CASES[function.__name__.replace("_", "-")] = function
    return function


FOREIGN = 0x5A5A5A5A5A5A50  # an address no plugin handed out


def _foreign(ctype: str):
    return ffi.cast(ctype, FOREIGN)


def each(statuses: list[int]) -> list[list[int]]:
    """One malformed call per status."""
    return [[status] for status in statuses]


@case
def properties_of_a_device_out_of_range(ctx):
    props = ffi.new("DK_DeviceProperties *", {"struct_size": ffi.sizeof("DK_DeviceProperties")})
    return each([ctx.raw("get_device_properties", index, props) for index in (-1, ctx.count, 1 << 30)])


@case
def properties_into_null(ctx):
    return each([ctx.raw("get_device_properties", 0, ffi.NULL)])


@case
def device_count_into_null(ctx):
    return each([ctx.raw("get_device_count", ffi.NULL)])


@case
def alloc_on_a_device_out_of_range(ctx):
    out = ffi.new("DK_Mem *")
    return each([ctx.raw("mem_alloc", index, 16, out) for index in (-1, ctx.count)])


@case
def alloc_into_null(ctx):
    return each([ctx.raw("mem_alloc", 0, 16, ffi.NULL)])


@case
def alloc_of_an_overflowing_size(ctx):
    out = ffi.new("DK_Mem *")
    return each([ctx.raw("mem_alloc", 0, size, out) for size in ((1 << 64) - 1, (1 << 63) + 1)])


@case
def free_of_a_foreign_handle(ctx):
    return each([ctx.raw("mem_free", 0, _foreign("DK_Mem"))])


@case
def double_free(ctx):
    mem = ctx.alloc(64)
    ctx.free(mem)
    return each([ctx.raw("mem_free", 0, mem)])


@case
def free_on_the_wrong_device(ctx):
    mem = ctx.alloc(64)
    try:
        return each([ctx.raw("mem_free", index, mem) for index in (-1, ctx.count)])
    finally:
        ctx.free(mem)


@case
def copy_from_a_freed_handle(ctx):
    mem = ctx.alloc(64)
    ctx.free(mem)
    host = ffi.new("char[]", 64)
    return each([ctx.raw("copy_d2h", 0, host, mem, 0, 64, ffi.NULL),
            ctx.raw("copy_h2d", 0, mem, 0, host, 64, ffi.NULL),
            ctx.raw("memset", 0, mem, 0, 0, 64, ffi.NULL)])


@case
def copy_from_a_foreign_handle(ctx):
    host = ffi.new("char[]", 64)
    return each([ctx.raw("copy_d2h", 0, host, _foreign("DK_Mem"), 0, 64, ffi.NULL),
            ctx.raw("copy_h2d", 0, _foreign("DK_Mem"), 0, host, 64, ffi.NULL)])


@case
def copy_past_the_allocation(ctx):
    mem = ctx.alloc(64)
    host = ffi.new("char[]", 128)
    try:
        return each([ctx.raw("copy_d2h", 0, host, mem, 0, 65, ffi.NULL),
                ctx.raw("copy_d2h", 0, host, mem, 63, 2, ffi.NULL),
                ctx.raw("copy_h2d", 0, mem, 1, host, 64, ffi.NULL),
                ctx.raw("memset", 0, mem, 60, 0, 8, ffi.NULL)])
    finally:
        ctx.free(mem)


@case
def copy_with_an_overflowing_offset(ctx):
    mem = ctx.alloc(64)
    host = ffi.new("char[]", 64)
    huge = (1 << 64) - 8
    try:
        return each([ctx.raw("copy_d2h", 0, host, mem, huge, 16, ffi.NULL),
                ctx.raw("copy_h2d", 0, mem, 16, host, huge, ffi.NULL),
                ctx.raw("memset", 0, mem, huge, 0, 16, ffi.NULL),
                ctx.raw("copy_d2d", 0, mem, 0, mem, huge, 16, ffi.NULL)])
    finally:
        ctx.free(mem)


@case
def copy_with_a_null_host_pointer(ctx):
    mem = ctx.alloc(64)
    try:
        return each([ctx.raw("copy_d2h", 0, ffi.NULL, mem, 0, 16, ffi.NULL),
                ctx.raw("copy_h2d", 0, mem, 0, ffi.NULL, 16, ffi.NULL)])
    finally:
        ctx.free(mem)


@case
def stream_create_on_a_device_out_of_range(ctx):
    out = ffi.new("DK_Stream *")
    return each([ctx.raw("stream_create", index, out) for index in (-1, ctx.count)] +
                [ctx.raw("stream_create", 0, ffi.NULL)])


@case
def event_create_into_null(ctx):
    return each([ctx.raw("event_create", 0, 0, ffi.NULL)])


# -- kernel calls ---------------------------------------------------------------------------


@dataclasses.dataclass
class Tensor:
    """A kernel tensor as the call passes it; the fields may lie."""

    values: np.ndarray | None           # None: an omitted optional input
    shape: tuple[int, ...] | None = None   # defaults to the values'
    strides: tuple[int, ...] | None = None  # elements; None: compact
    byte_offset: int = 0
    dtype: tuple[int, int, int] | None = None  # (code, bits, lanes); defaults to the values'
    device_id: int = 0
    null_shape: bool = False
    data: str = "own"  # "own", "freed" or "foreign"


@dataclasses.dataclass
class Attribute:
    name: str
    kind: str  # an ATTR_KINDS kind, or "raw-dtype" (value: (code, bits))
    value: object


@dataclasses.dataclass
class KernelCall:
    inputs: list[Tensor]
    outputs: list[Tensor]
    attributes: list[Attribute]


def _attribute_cdata(attribute: Attribute, keep: list):
    if attribute.kind == "raw-dtype":
        a = calls._attribute(attribute.name, "int", 0, keep)
        a.type = C.DK_ATTR_DTYPE
        a.dtype.code, a.dtype.bits = attribute.value
        a.dtype.lanes = 1
        return a
    return calls._attribute(attribute.name, attribute.kind, attribute.value, keep)


def run_kernel(ctx: Context, entry, call: KernelCall, patch: Callable | None = None) -> list[list[int]]:
    """Makes ``call`` through ``entry`` on a new stream: [[launch status, synchronisation status]]
    (a kernel may report a bad call in stream order)."""
    keep: list = []
    mems = []
    properties = ctx.dev.properties

    def tensor(slot, t: Tensor):
        if t.values is None:
            slot.ndim = -1
            return
        values = np.ascontiguousarray(t.values)
        nbytes = max(values.nbytes, 1)
        mem = ctx.alloc(nbytes)
        mems.append(mem)
        if values.nbytes:
            host = ffi.from_buffer(values)
            assert ctx.raw("copy_h2d", 0, mem, 0, host, values.nbytes, ffi.NULL) == OK
        shape = t.shape if t.shape is not None else values.shape
        code, bits = _dtypes.code_bits(_dtypes.normalize(values.dtype))
        slot.data = mem
        if t.data == "foreign":
            slot.data = _foreign("DK_Mem")
        slot.device.device_type = properties.device_type
        slot.device.device_id = t.device_id
        slot.ndim = len(shape)
        slot.dtype.code, slot.dtype.bits, slot.dtype.lanes = t.dtype or (code, bits, 1)
        slot.shape = ffi.NULL if t.null_shape else calls._owned(keep, "int64_t[]", list(shape) or [0])
        slot.strides = ffi.NULL if t.strides is None else calls._owned(keep, "int64_t[]",
                                                                           list(t.strides) or [0])
        slot.byte_offset = t.byte_offset

    inputs = ffi.new("DK_Tensor[]", max(len(call.inputs), 1))
    for slot, t in zip(inputs, call.inputs):
        tensor(slot, t)
    outputs = ffi.new("DK_Tensor[]", max(len(call.outputs), 1))
    for slot, t in zip(outputs, call.outputs):
        tensor(slot, t)
    attrs = [_attribute_cdata(a, keep) for a in call.attributes]
    attr_ptrs = ffi.new("DK_Attribute *[]", attrs or [ffi.NULL])
    stream = ctx.stream()
    raw = ffi.new("DK_KernelCall *")
    raw.struct_size = ffi.sizeof("DK_KernelCall")
    raw.device = 0
    raw.stream = stream
    raw.inputs, raw.num_inputs = inputs, len(call.inputs)
    raw.outputs, raw.num_outputs = outputs, len(call.outputs)
    raw.attributes, raw.num_attributes = attr_ptrs, len(attrs)
    raw.user_data = entry.user_data
    for t, slot in zip(call.inputs + call.outputs, list(inputs)[:len(call.inputs)] +
                       list(outputs)[:len(call.outputs)]):
        if t.data == "freed" and t.values is not None:
            ctx.free(slot.data)
            mems.remove(slot.data)
    if patch is not None:
        patch(raw, keep)
    statuses = [entry.fn(raw), ctx.raw("stream_synchronize", 0, stream)]
    ctx.raw("stream_destroy", 0, stream)
    for mem in mems:
        ctx.free(mem)
    return [statuses]


def _entry(ctx: Context, op: str, dtype_name: str | None = None):
    entries = ctx.plugin.kernel_entries(op)
    if not entries:
        return None
    by_name = {_spec.dtype_name(calls.key_dtype_of(e)): e for e in entries}
    if dtype_name is not None:
        return by_name.get(dtype_name)
    return next((by_name[name] for name in PREFERRED_DTYPES if name in by_name), entries[0])


def _relu_call(shape=(4,)) -> KernelCall:
    x = np.arange(int(np.prod(shape)), dtype=np.float32).reshape(shape)
    return KernelCall([Tensor(x)], [Tensor(x.copy())], [])


def _relu(ctx):
    entry = _entry(ctx, "Relu", "float32")
    if entry is None:
        raise NotClaimed("Relu float32")
    return entry


class NotClaimed(Exception):
    """The plugin publishes no kernel the case needs."""


def _register_kernel_case(function):
    CASES[function.__name__.replace("_", "-")] = lambda ctx: function(ctx, _relu(ctx))
    return function


@_register_kernel_case
def kernel_call_null(ctx, entry):
    return [[entry.fn(ffi.NULL)]]


@_register_kernel_case
def kernel_call_struct_size_too_small(ctx, entry):
    return run_kernel(ctx, entry, _relu_call(), lambda raw, keep: setattr(raw, "struct_size", 8))


@_register_kernel_case
def kernel_call_foreign_user_data(ctx, entry):
    def patch(raw, keep):
        raw.user_data = ffi.NULL
    return run_kernel(ctx, entry, _relu_call(), patch)


@_register_kernel_case
def kernel_call_null_tensor_arrays(ctx, entry):
    def null_inputs(raw, keep):
        raw.inputs = ffi.NULL

    def null_attributes(raw, keep):
        raw.attributes, raw.num_attributes = ffi.NULL, 1
    return run_kernel(ctx, entry, _relu_call(), null_inputs) + \
        run_kernel(ctx, entry, _relu_call(), null_attributes)


@_register_kernel_case
def kernel_call_huge_tensor_counts(ctx, entry):
    return run_kernel(ctx, entry, _relu_call(), lambda raw, keep: setattr(raw, "num_inputs", 1 << 40))


@_register_kernel_case
def kernel_call_foreign_stream(ctx, entry):
    return run_kernel(ctx, entry, _relu_call(), lambda raw, keep: setattr(raw, "stream",
                                                                          _foreign("DK_Stream")))[:1]


@_register_kernel_case
def kernel_call_device_out_of_range(ctx, entry):
    results = []
    for index in (-1, ctx.count):
        results += run_kernel(ctx, entry, _relu_call(), lambda raw, keep: setattr(raw, "device", index))[:1]
    return results


def _relu_with(ctx, entry, **fields):
    call = _relu_call()
    for key, value in fields.items():
        setattr(call.inputs[0], key, value)
    return run_kernel(ctx, entry, call)


@_register_kernel_case
def tensor_with_a_null_shape(ctx, entry):
    return _relu_with(ctx, entry, null_shape=True)


@_register_kernel_case
def tensor_of_a_rank_past_any_limit(ctx, entry):
    return _relu_with(ctx, entry, shape=(1,) * 200)


@_register_kernel_case
def tensor_with_a_negative_dimension(ctx, entry):
    return _relu_with(ctx, entry, shape=(-4,))


@_register_kernel_case
def tensor_larger_than_its_allocation(ctx, entry):
    call = _relu_call()
    call.inputs[0].shape = call.outputs[0].shape = (1 << 20,)
    return run_kernel(ctx, entry, call)


@_register_kernel_case
def tensor_strides_reaching_past_the_allocation(ctx, entry):
    return _relu_with(ctx, entry, strides=(1 << 20,))


@_register_kernel_case
def tensor_negative_strides_reaching_before_the_allocation(ctx, entry):
    return _relu_with(ctx, entry, strides=(-1,))


@_register_kernel_case
def tensor_byte_offset_past_the_allocation(ctx, entry):
    return _relu_with(ctx, entry, byte_offset=64) + _relu_with(ctx, entry, byte_offset=(1 << 64) - 4)


@_register_kernel_case
def tensor_element_count_overflowing(ctx, entry):
    """Dims whose product wraps around 2**64 (to 0 or to a small count)."""
    results = []
    for shape in [(1 << 32, 1 << 32), (1 << 32, 1 << 32, 4), ((1 << 62) + 1, 4), (1 << 62, 1 << 3)]:
        call = _relu_call()
        call.inputs[0].shape = call.outputs[0].shape = shape
        results += run_kernel(ctx, entry, call)
    return results


@_register_kernel_case
def tensor_zero_strides_of_2_64_elements(ctx, entry):
    """A broadcast view of one element: 2**64 elements wrap the element count to 0 (issue 17)."""
    call = _relu_call()
    call.inputs[0].shape = call.outputs[0].shape = (1 << 32, 1 << 32)
    call.inputs[0].strides = call.outputs[0].strides = (0, 0)
    return run_kernel(ctx, entry, call)


@_register_kernel_case
def tensor_stride_reach_overflowing(ctx, entry):
    """(n - 1) * stride past int64."""
    return _relu_with(ctx, entry, shape=(4,), strides=(1 << 62,)) + \
        _relu_with(ctx, entry, shape=(3,), strides=(-(1 << 62),))


@_register_kernel_case
def tensor_of_an_unknown_dtype(ctx, entry):
    return _relu_with(ctx, entry, dtype=(C.DK_DTYPE_CODE_FLOAT, 7, 1)) + \
        _relu_with(ctx, entry, dtype=(C.DK_DTYPE_CODE_FLOAT, 32, 4)) + \
        _relu_with(ctx, entry, dtype=(200, 32, 1))


@_register_kernel_case
def tensor_on_another_device(ctx, entry):
    return _relu_with(ctx, entry, device_id=ctx.count) + _relu_with(ctx, entry, device_id=-1)


@_register_kernel_case
def tensor_in_freed_memory(ctx, entry):
    return _relu_with(ctx, entry, data="freed")


@_register_kernel_case
def tensor_in_foreign_memory(ctx, entry):
    return _relu_with(ctx, entry, data="foreign")


@_register_kernel_case
def attribute_null_or_short(ctx, entry):
    def null_attribute(raw, keep):
        raw.attributes = calls._owned(keep, "DK_Attribute *[]", [ffi.NULL])
        raw.num_attributes = 1

    def short_attribute(raw, keep):
        a = calls._attribute("alpha", "float", 1.0, keep)
        a.struct_size = 8
        raw.attributes = calls._owned(keep, "DK_Attribute *[]", [a])
        raw.num_attributes = 1

    def list_without_elements(raw, keep):
        a = calls._attribute("axes", "ints", [0], keep)
        a.ints, a.count = ffi.NULL, 3
        raw.attributes = calls._owned(keep, "DK_Attribute *[]", [a])
        raw.num_attributes = 1

    def negative_count(raw, keep):
        a = calls._attribute("axes", "ints", [0], keep)
        a.count = -1
        raw.attributes = calls._owned(keep, "DK_Attribute *[]", [a])
        raw.num_attributes = 1

    def unknown_type(raw, keep):
        a = calls._attribute("alpha", "int", 1, keep)
        a.type = 99
        raw.attributes = calls._owned(keep, "DK_Attribute *[]", [a])
        raw.num_attributes = 1

    return [call for patch in (null_attribute, short_attribute, list_without_elements, negative_count,
                               unknown_type)
            for call in run_kernel(ctx, entry, _relu_call(), patch)]


# -- per-kernel cases from the op specs ------------------------------------------------------


@dataclasses.dataclass
class Valid:
    """An op's valid call, as the host makes it: device inputs, host values, attributes, outputs."""

    spec: _spec.OpSpec
    dtype: str
    inputs: list          # per declared position: ndarray, host ndarray, or None
    attrs: dict           # resolved spec attributes
    outputs: list         # [(shape, dtype)]


def _infos(spec: _spec.OpSpec, inputs: list) -> list:
    infos = []
    for position, value in enumerate(inputs):
        decl = spec.inputs[min(position, len(spec.inputs) - 1)]
        if value is None:
            infos.append(None)
        else:
            array = np.asarray(value)
            dtype = _dtypes.normalize(array.dtype)
            keep_value = decl.host or decl.read_by_infer
            infos.append(_spec.TensorInfo(tuple(array.shape), dtype, array if keep_value else None))
    return infos


def _outputs(spec: _spec.OpSpec, inputs: list, attrs: dict) -> list:
    return [(tuple(int(n) for n in shape), _dtypes.normalize(dtype))
            for shape, dtype in spec.infer(_infos(spec, inputs), attrs)]


@functools.lru_cache(maxsize=None)
def valid_call(op: str, dtype: str) -> Valid | None:
    spec = ops.get(op)
    dt = next((d for d in spec.dtypes if _spec.dtype_name(d) == dtype), None)
    if dt is None:
        return None
    for c in spec.cases(dt, rng_for(op, dtype, "robustness")):
        try:
            bound, given = dispatch._bind_all(spec, c.inputs, c.attrs)
            attrs = dispatch.resolve_attrs(spec, given)
            inputs = [None if v is None else (np.asarray(v) if decl.host else np.asarray(v))
                      for decl, v in bound]
            outputs = _outputs(spec, inputs, attrs)
        except Exception:  # noqa: BLE001 - a case that needs more than this catalogue builds
            continue
        device = [v for (decl, v) in zip([d for d, _ in bound], inputs) if v is not None and not decl.host]
        if any(np.asarray(v).size == 0 for v in device) or any(math.prod(s) == 0 for s, _ in outputs):
            continue  # empty tensors let a kernel skip what the mutations probe
        return Valid(spec, dtype, inputs, attrs, outputs)
    return None


def _sent_attributes(v: Valid, attrs: dict, inputs: list) -> list[Attribute]:
    """The attributes the host sends: the spec's, then the host inputs' values."""
    sent = [Attribute(name, v.spec.attr(name).kind, value) for name, value in attrs.items()]
    for position, value in enumerate(inputs):
        decl = v.spec.inputs[min(position, len(v.spec.inputs) - 1)]
        if decl.host and value is not None:
            values = np.asarray(value).reshape(-1)
            floating = values.dtype.kind == "f" or values.dtype == _dtypes.bfloat16
            sent.append(Attribute(decl.name, "floats" if floating else "ints",
                                  values.astype(np.float64 if floating else np.int64).tolist()))
    return sent


def _device_tensors(v: Valid, inputs: list) -> list[Tensor]:
    tensors = []
    for position, value in enumerate(inputs):
        decl = v.spec.inputs[min(position, len(v.spec.inputs) - 1)]
        if not decl.host:
            tensors.append(Tensor(None if value is None else np.asarray(value)))
    while tensors and tensors[-1].values is None:
        tensors.pop()
    return tensors


def _output_tensors(outputs) -> list[Tensor]:
    return [Tensor(np.zeros(shape, dtype)) for shape, dtype in outputs]


# -- prepared inputs (ABI 1.4): a bit on memory that is no prepared form ---------------------

def _preparing_matmul(ctx: Context):
    """The plugin's float32 MatMul entry where it prepares inputs (DK_KernelEntry.prepare)."""
    entry = _entry(ctx, "MatMul", "float32")
    if entry is None or calls.prepare_fn(entry) is None:
        raise NotClaimed("float32 MatMul with a prepare (ABI 1.4 prepared weights)")
    return entry


def _matmul_marked(ctx: Context, position: int, b_elements: int) -> list[list[int]]:
    """A valid 4x8 @ 8x6 MatMul whose input ``position`` is marked prepared; B's
    allocation holds ``b_elements`` zeros (its logical shape stays 8x6)."""
    a = np.ones((4, 8), np.float32)
    b = Tensor(np.zeros(b_elements, np.float32), shape=(8, 6))
    call = KernelCall([Tensor(a), b], [Tensor(np.zeros((4, 6), np.float32))], [])
    return run_kernel(ctx, _preparing_matmul(ctx), call,
                      lambda raw, keep: setattr(raw, "prepared_inputs", 1 << position))


@case
def prepared_input_the_kernel_does_not_prepare(ctx):
    """MatMul prepares B, not A."""
    return _matmul_marked(ctx, 0, 48)


@case
def prepared_input_shorter_than_its_form(ctx):
    """B marked prepared in an allocation of B's own 192 bytes, short of any packed form."""
    return _matmul_marked(ctx, 1, 48)


@case
def prepared_input_that_is_not_a_prepared_form(ctx):
    """B marked prepared in an allocation large enough for the form, holding zeros."""
    return _matmul_marked(ctx, 1, 1 << 16)


@case
def prepared_input_past_the_inputs(ctx):
    return _matmul_marked(ctx, 5, 48)


@case
def prepare_of_a_kernel_that_prepares_nothing(ctx):
    """MatMul's prepare called with a Relu call (Relu's entry prepares no input)."""
    prepare = calls.prepare_fn(_preparing_matmul(ctx))
    relu = _relu(ctx)

    def through_prepare(raw, keep):
        size = calls._owned(keep, "size_t *", 0)
        statuses.append(prepare(raw, 0, ffi.NULL, 0, size))

    statuses: list[int] = []
    run_kernel(ctx, relu, _relu_call(), through_prepare)
    return [statuses]


def _is_invalid(v: Valid, attrs: dict, inputs: list, outputs=None) -> bool:
    """Whether the op spec refuses the call, or infers other outputs than those passed."""
    outputs = v.outputs if outputs is None else outputs
    try:
        for name, value in attrs.items():
            dispatch._coerce_attr(v.spec, v.spec.attr(name), value)  # raises for a value the spec refuses
        return _outputs(v.spec, inputs, attrs) != outputs
    except Exception:  # noqa: BLE001 - the spec refusing the call is what is looked for
        return True


def _out_of_range_values(kind: str, value, rank: int, attr: _spec.Attr | None) -> list:
    if kind == "int":
        candidates = [rank, -rank - 1, 0, -1, 1 << 40]
        if attr is not None and attr.choices:
            candidates = [max(attr.choices) + 1, min(attr.choices) - 1] + candidates
        return [c for c in dict.fromkeys(candidates) if c != value]
    if kind == "float":
        return [c for c in (-1.0, 0.0, float("nan"), float("inf")) if c != value]
    if kind in ("ints", "floats"):
        n = len(value) or rank or 1
        one = value[0] if value else 0
        candidates = [[0] * n, [-1] * n, list(value) + [one], list(value)[:-1], [1 << 40] * n, [rank] * n]
        if kind == "floats":
            candidates += [[float("nan")] * n, [1e30] * n]
        return [c for c in candidates if c != list(value)]
    if kind == "string":
        return ["bogus", ""]
    return []


def _host_input(candidate, dtype: np.dtype) -> np.ndarray | None:
    """The candidate as a host input of the valid call's dtype; None when that dtype cannot
    hold it (2^40 as Clip's int8 min: the host could not send it either)."""
    if not candidate:
        return np.asarray(candidate, np.int64)
    if dtype.kind in "iu":
        info = np.iinfo(dtype)
        if any(not isinstance(c, int) or not info.min <= c <= info.max for c in np.ravel(candidate).tolist()):
            return None
    return np.asarray(candidate, dtype)


_WRONG_KIND = {"int": ("string", "x"), "float": ("string", "x"), "ints": ("float", 1.0),
               "floats": ("string", "x"), "string": ("int", 1), "dtype": ("int", 1)}


@dataclasses.dataclass
class Mutation:
    name: str
    call: KernelCall


@functools.lru_cache(maxsize=None)
def mutations(op: str, dtype: str) -> list[Mutation]:
    """Every invalid call derived from the op's valid call (see the module doc)."""
    v = valid_call(op, dtype)
    if v is None:
        return []
    spec = v.spec
    devices = _device_tensors(v, v.inputs)
    rank = max((t.values.ndim for t in devices if t.values is not None), default=1)
    base_attrs = _sent_attributes(v, v.attrs, v.inputs)
    found: list[Mutation] = []

    def add(name, inputs=None, outputs=None, attributes=None):
        if any(m.name == name for m in found):  # an attribute that is also a host input (ReduceSum's axes)
            return
        found.append(Mutation(name, KernelCall(devices if inputs is None else inputs,
                                               _output_tensors(v.outputs) if outputs is None else outputs,
                                               base_attrs if attributes is None else attributes)))

    host_positions = {decl.name: i for i, decl in enumerate(spec.inputs) if decl.host}
    for sent in base_attrs:
        others = [a for a in base_attrs if a.name != sent.name]
        attr = spec.attr(sent.name)
        # Sent as a host input's values, even where an attribute has its name (ReduceSum's axes):
        # mutated there, or the call would carry the name twice.
        host = sent.name in host_positions and v.inputs[host_positions[sent.name]] is not None
        required = (not spec.inputs[host_positions[sent.name]].optional) if host else attr.default is not None
        if required:
            add(f"attribute-{sent.name}-missing", attributes=others)
        kind, wrong = _WRONG_KIND[sent.kind]
        add(f"attribute-{sent.name}-as-{kind}", attributes=others + [Attribute(sent.name, kind, wrong)])
        if sent.kind == "dtype":
            add(f"attribute-{sent.name}-unknown-dtype",
                attributes=others + [Attribute(sent.name, "raw-dtype", (C.DK_DTYPE_CODE_FLOAT, 24))])
        for candidate in _out_of_range_values(sent.kind, sent.value, rank, attr):
            if host:
                inputs = list(v.inputs)
                value = _host_input(candidate, np.asarray(v.inputs[host_positions[sent.name]]).dtype)
                if value is None:
                    continue
                inputs[host_positions[sent.name]] = value
                if not _is_invalid(v, v.attrs, inputs):
                    continue
                attributes = _sent_attributes(v, v.attrs, inputs)
            else:
                attrs = dict(v.attrs, **{sent.name: candidate})
                if not _is_invalid(v, attrs, v.inputs):
                    continue
                attributes = _sent_attributes(v, attrs, v.inputs)
            add(f"attribute-{sent.name}-{_label(candidate)}", attributes=attributes)
    for attr in spec.attrs:  # optional attributes the valid call leaves out (Conv's strides, say)
        if any(a.name == attr.name for a in base_attrs) or attr.kind not in ("int", "ints", "float"):
            continue
        spatial = max(rank - 2, 1)
        candidates = ([[c] * n for n in dict.fromkeys((spatial, 2 * spatial)) for c in (0, -1)]
                      if attr.kind == "ints" else _out_of_range_values(attr.kind, None, rank, attr))
        for candidate in candidates:
            attrs = dict(v.attrs, **{attr.name: candidate})
            if _is_invalid(v, attrs, v.inputs):
                add(f"attribute-{attr.name}-{_label(candidate)}", attributes=_sent_attributes(v, attrs, v.inputs))
    present = [t for t in devices if t.values is not None]
    required_inputs = sum(1 for decl in spec.inputs if not decl.optional and not decl.host)
    if required_inputs and devices:
        add("too-few-inputs", inputs=devices[:required_inputs - 1])
    if not spec.inputs[-1].variadic and present:
        declared = sum(1 for decl in spec.inputs if not decl.host)
        extra = devices + [Tensor(None)] * (declared - len(devices)) + [Tensor(present[0].values)]
        add("too-many-inputs", inputs=extra)
    add("no-outputs", outputs=[])
    if len(v.outputs) == len(spec.outputs):
        add("too-many-outputs", outputs=_output_tensors(v.outputs) + _output_tensors(v.outputs[:1]))
    key = spec.key if isinstance(spec.key, int) else None
    device_positions = [i for i, decl in enumerate(spec.inputs) if not decl.host]
    for position, value in enumerate(v.inputs):
        decl = spec.inputs[min(position, len(spec.inputs) - 1)]
        if value is None or decl.host:
            continue
        array = np.asarray(value)
        label = decl.name if position < len(spec.inputs) else f"{decl.name}{position}"
        for how, changed in (("rank-up", array.reshape((2,) + array.shape[:-1] + (array.shape[-1] // 2,))
                              if array.ndim and array.shape[-1] % 2 == 0 else array.reshape((1,) + array.shape)),
                             ("rank-down", array.reshape(array.shape[:-2] + (-1,)) if array.ndim >= 2 else None),
                             ("dim-grown", np.concatenate([array, array[..., :1]], axis=-1) if array.ndim else None)):
            if changed is None:
                continue
            inputs = list(v.inputs)
            inputs[position] = changed
            if not _is_invalid(v, v.attrs, inputs):
                continue
            add(f"input-{label}-{how}", inputs=_device_tensors(v, inputs))
        other = np.int8 if array.dtype != np.int8 else np.float32
        inputs = list(v.inputs)
        inputs[position] = np.zeros(array.shape, other)
        # The key input's dtype selects the kernel; another input's is checked where the spec refuses it.
        if position == key or (key is None and position == device_positions[0]) or _is_invalid(v, v.attrs, inputs):
            add(f"input-{label}-other-dtype", inputs=_device_tensors(v, inputs))
    for j, (shape, dtype) in enumerate(v.outputs):
        wrong = list(v.outputs)
        wrong[j] = (shape, np.int8 if dtype != np.int8 else np.float32)
        add(f"output-{j}-other-dtype", outputs=_output_tensors(wrong))
        if shape:
            wrong[j] = (shape[:-1] + (shape[-1] + 1,), dtype)
            add(f"output-{j}-shape-lies", outputs=_output_tensors(wrong))
    return found


def _label(value) -> str:
    if isinstance(value, list):
        if not value:
            return "empty"
        return ("x".join(_label(x) for x in value[:3]) + ("-more" if len(value) > 3 else "") +
                f"-len{len(value)}")
    if isinstance(value, float) and math.isnan(value):
        return "nan"
    text = str(value)
    return {"": "empty-string"}.get(text, text.replace("-", "minus").replace(".", "p"))


def kernel_case_ids(op: str, dtype: str) -> list[str]:
    return [f"{op}/{dtype}/{m.name}" for m in mutations(op, dtype)]


def run_kernel_case(ctx: Context, case_id: str) -> list[list[int]]:
    op, dtype, name = case_id.split("/", 2)
    entry = _entry(ctx, op, dtype)
    if entry is None:
        raise NotClaimed(f"{op} {dtype}")
    mutation = next(m for m in mutations(op, dtype) if m.name == name)
    return run_kernel(ctx, entry, mutation.call)


# -- the worker loop -----------------------------------------------------------------------------


def alive(ctx: Context) -> str | None:
    """None when the plugin still allocates, copies, runs Relu and synchronises; else what failed."""
    try:
        dev = ctx.dev
        data = np.arange(-8, 8, dtype=np.float32)
        x = devkit.asarray(data, dev)
        assert np.array_equal(x.numpy(), data), "a copy round trip gave other bytes"
        if _entry(ctx, "Relu", "float32") is not None:
            y = ops.run_op("Relu", [x])[0]
            assert np.array_equal(y.numpy(), np.maximum(data, 0)), "Relu gave a wrong result"
        dev.synchronize()
    except Exception as exc:  # noqa: BLE001 - reported, not raised
        return f"{type(exc).__name__}: {exc}"
    return None


def answer(ctx: Context, case_id: str) -> dict:
    reply: dict = {"case": case_id, "calls": [], "messages": [], "problem": None, "skip": None}
    try:
        if case_id in CASES:
            statuses = CASES[case_id](ctx)
        else:
            statuses = run_kernel_case(ctx, case_id)
        reply["calls"] = [[int(s) for s in call] for call in statuses]
        reply["messages"] = [ctx.plugin.last_error_message()]
    except NotClaimed as exc:
        reply["skip"] = f"the plugin publishes no kernel for {exc}"
    except Exception:  # noqa: BLE001
        reply["problem"] = traceback.format_exc(limit=6)
    reply["alive"] = alive(ctx)
    return reply


def main() -> None:
    ctx = Context(devkit.load_plugin(sys.argv[1]))
    print(MARK + json.dumps({"ready": True}), flush=True)
    for line in sys.stdin:
        print(MARK + json.dumps(answer(ctx, line.strip())), flush=True)


if __name__ == "__main__":
    main()
