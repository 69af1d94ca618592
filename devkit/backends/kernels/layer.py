"""The dialect-neutral kernel layer: dtypes in OpenCL C, tensor arguments,
the validation of a kernel call, the launch helpers and the kernel table.

The kernel families (elementwise.py, reduce.py, ...) are written against this
module only, never against pyopencl: the opencl plugin runs them through
``devkit.backends.opencl.launch.OpenCLCall`` (programs built by pyopencl),
the cuda plugin through ``devkit.backends.cuda.kernels.CudaCall`` (the same
OpenCL C rendered as CUDA C and built by NVRTC). A Call subclass provides
what reaches the device:

- ``launch(source, name, args, global_size, local_size=None, options="")``:
  an ND-range of work-items, global_size a multiple of local_size per dim;
  ``args`` are Tensors (their allocation), buffers the Call made, NumPy
  scalars and ``Local(bytes)`` (work-group local memory);
- ``buffer(values, dtype, writable=False)``: a device copy of small host data;
  ``zeros(count, dtype)``: a zeroed flag or counter (zeroed again before each
  launch of a graph that recorded it); ``scratch(nbytes)``: uninitialised;
- ``check_in_stream_order(check)``: ``check(reader)`` runs after the work
  queued so far; ``reader.read(host, buffer, byte_offset=0)`` and
  ``reader.write(buffer, host)`` copy, and it returns a PluginError or None.

Nothing here imports pyopencl or CuPy: machines without either import it.
"""

from __future__ import annotations

import dataclasses
import importlib
import math
from collections.abc import Mapping
from types import SimpleNamespace

import numpy as np

from ... import ops
from ...abi import C, ffi
from ...engine.calls import key_dtype_of
from ...ops import dispatch
from ...ops.spec import TensorInfo, dtype_name
from ..support.boundary import invalid


# ---- dtypes in OpenCL C -----------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class ClType:
    """How one devkit dtype is stored and computed in OpenCL C."""

    key: int            # the DK_DTYPE_* value
    name: str           # devkit's name: "float16", "int8", ...
    storage: str        # the element type buffers are declared with
    itemsize: int
    kind: str           # "float", "int", "uint" or "bool"
    unsigned: str | None = None  # the same-width unsigned type (two's-complement wrap-around)

    @property
    def is_float(self) -> bool:
        return self.kind == "float"


CL_TYPES = {t.key: t for t in (
    ClType(C.DK_DTYPE_FLOAT32, "float32", "float", 4, "float"),
    ClType(C.DK_DTYPE_FLOAT64, "float64", "double", 8, "float"),
    # Storage only: loads and stores convert through float (vload_half /
    # vstore_half_rte are core OpenCL; cl_khr_fp16 is not required).
    ClType(C.DK_DTYPE_FLOAT16, "float16", "half", 2, "float"),
    ClType(C.DK_DTYPE_BFLOAT16, "bfloat16", "ushort", 2, "float"),
    ClType(C.DK_DTYPE_INT8, "int8", "char", 1, "int", "uchar"),
    ClType(C.DK_DTYPE_UINT8, "uint8", "uchar", 1, "uint", "uchar"),
    ClType(C.DK_DTYPE_INT32, "int32", "int", 4, "int", "uint"),
    ClType(C.DK_DTYPE_INT64, "int64", "long", 8, "int", "ulong"),
    ClType(C.DK_DTYPE_BOOL, "bool", "uchar", 1, "bool", "uchar"),
)}


def cl_type(key: int) -> ClType:
    try:
        return CL_TYPES[key]
    except KeyError:
        raise invalid(f"dtype key {key:#x} is not one the opencl plugin stores") from None


def key_of(dtype) -> int:
    """The DK_DTYPE_* key of a DK_DataType struct."""
    return dtype.code | (dtype.bits << 8) | (dtype.lanes << 16)


# Shared by every program: bfloat16 <-> float with round-to-nearest-even (NaN stays NaN),
# and strided indexing.
_COMMON = """#ifndef DEVKIT_COMMON
#define DEVKIT_COMMON
inline float dk_bf16_load(ushort b) { return as_float((uint)b << 16); }
inline ushort dk_bf16_store(float f) {
  uint u = as_uint(f);
  if (isnan(f)) return (ushort)((u >> 16) | 0x40);
  return (ushort)((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
}
/* Element offset of row-major linear index i of `shape` in a tensor with
 * `strides` (both ndim longs; a stride of 0 broadcasts). */
inline long dk_offset(long i, int ndim, global const long *shape, global const long *strides) {
  long offset = 0;
  for (int d = ndim - 1; d >= 0; --d) {
    offset += (i % shape[d]) * strides[d];
    i /= shape[d];
  }
  return offset;
}
#endif
"""


def prelude(prefix: str, key: int, fp64: bool) -> str:
    """OpenCL C that names dtype ``key`` under ``prefix`` (P):

    - ``P_t``: the buffer element type (``global P_t *``);
    - ``P_ct``: the compute type: float for float16/bfloat16, double for
      float32 where the device has fp64 (rounded once on store), the storage
      type otherwise;
    - ``P_acc``: the accumulator for sums and dot products (double for every
      float type where the device has fp64, else float; long for signed
      integers and bool, ulong for unsigned ones);
    - ``P_load(p, i)`` -> P_ct, ``P_store(p, i, v)`` (bool stores v != 0);
    - ``P_U``: the unsigned type of integer dtypes, ``P_IS_FLOAT`` 0/1.
    """
    t = cl_type(key)
    p = prefix
    if t.is_float:
        compute = {"double": "double", "float": "double" if fp64 else "float"}.get(t.storage, "float")
        acc = "double" if fp64 else "float"
    else:
        compute, acc = t.storage, "long" if t.kind != "uint" else "ulong"
    if t.storage == "half":
        load, store = "vload_half((i), (p))", "vstore_half_rte((float)(v), (i), (p))"
    elif t.storage == "ushort" and t.is_float:
        load, store = "dk_bf16_load((p)[i])", "((p)[i] = dk_bf16_store((float)(v)))"
    elif t.kind == "bool":
        load, store = "(p)[i]", "((p)[i] = (uchar)((v) != 0))"
    else:
        load, store = f"(({p}_ct)(p)[i])", f"((p)[i] = ({t.storage})(v))"
    lines = [_COMMON]
    if fp64 or t.storage == "double":
        lines.append("#pragma OPENCL EXTENSION cl_khr_fp64 : enable")
    lines += [f"typedef {t.storage} {p}_t;", f"typedef {compute} {p}_ct;", f"typedef {acc} {p}_acc;",
              f"#define {p}_load(p, i) ({load})", f"#define {p}_store(p, i, v) {store}",
              f"#define {p}_IS_FLOAT {int(t.is_float)}"]
    if t.unsigned:
        lines.append(f"typedef {t.unsigned} {p}_U;")
    return "\n".join(lines) + "\n"


# ---- tensors and calls -----------------------------------------------------------


class Tensor:
    """A DK_Tensor resolved on a device: buffer, element offset, shape, strides."""

    __slots__ = ("offset", "shape", "strides", "dtype", "buffer")

    def __init__(self, device, what: str, tensor, itemsize: int | None = None):
        """``device`` names its plugin (``plugin``, ``device_type``, ``index``) and
        gives ``kernel_buffer(what, handle, offset, size)``: the kernel argument of
        the allocation, once the byte range is checked to lie inside it."""
        ndim = tensor.ndim
        if not 0 <= ndim <= MAX_DIMS:
            raise invalid(f"{what} has rank {ndim}; the {device.plugin} plugin takes 0 to {MAX_DIMS}")
        if ndim and tensor.shape == ffi.NULL:
            raise invalid(f"{what} has a NULL shape")
        if tensor.device.device_type != device.device_type or tensor.device.device_id != device.index:
            raise invalid(f"{what} is on device (type {tensor.device.device_type}, id {tensor.device.device_id}), "
                          f"not on {device.plugin} device {device.index}")
        if tensor.dtype.lanes != 1 or not tensor.dtype.bits or tensor.dtype.bits % 8 or tensor.dtype.bits > 64:
            raise invalid(f"{what} has dtype (code {tensor.dtype.code}, bits {tensor.dtype.bits}, lanes "
                          f"{tensor.dtype.lanes}), which no kernel takes")
        self.dtype = key_of(tensor.dtype)
        # Sized from the dtype's bits, not CL_TYPES: an input need not have a kernel dtype
        # (Pow's exponent may be int16 or uint64, say).
        itemsize = itemsize or max(1, tensor.dtype.bits * tensor.dtype.lanes // 8)
        self.shape = [int(tensor.shape[i]) for i in range(ndim)]
        if any(n < 0 for n in self.shape):
            raise invalid(f"{what} has a negative dimension: shape {self.shape}")
        if math.prod(self.shape) > INT64_MAX:  # kernels count elements in int64 (a zero-stride view too)
            raise invalid(f"{what} has more elements than int64 counts: shape {self.shape}")
        if tensor.strides == ffi.NULL:
            strides, step = [0] * ndim, 1
            for i in reversed(range(ndim)):
                strides[i], step = step, step * self.shape[i]
        else:
            strides = [int(tensor.strides[i]) for i in range(ndim)]
        self.strides = strides
        if tensor.byte_offset % itemsize:
            raise invalid(f"{what}: byte_offset {tensor.byte_offset} is not a multiple of the "
                          f"{itemsize}-byte element")
        self.offset = tensor.byte_offset // itemsize
        empty = any(n == 0 for n in self.shape)
        low = sum(min(0, s) * (n - 1) for s, n in zip(strides, self.shape)) if not empty else 0
        high = sum(max(0, s) * (n - 1) for s, n in zip(strides, self.shape)) + 1 if not empty else 0
        if self.offset + low < 0:
            raise invalid(f"{what}: strides reach before the start of the allocation")
        self.buffer = device.kernel_buffer(what, tensor.data, (self.offset + low) * itemsize,
                                           (high - low) * itemsize)

    @property
    def size(self) -> int:
        return int(np.prod(self.shape, dtype=np.int64))

    @property
    def ndim(self) -> int:
        return len(self.shape)



def broadcast_strides(tensor: Tensor, shape: list[int]) -> list[int]:
    """``tensor``'s strides over the output ``shape`` (0 where it is broadcast)."""
    lead = len(shape) - len(tensor.shape)
    return [0] * lead + [0 if n == 1 and m != 1 else s
                         for s, n, m in zip(tensor.strides, tensor.shape, shape[lead:])]


def attribute_value(attribute):
    kind = attribute.type
    if kind == C.DK_ATTR_INT:
        return int(attribute.i)
    if kind == C.DK_ATTR_FLOAT:
        return float(attribute.f)
    if kind == C.DK_ATTR_INTS:
        return [int(attribute.ints[i]) for i in range(attribute.count)]
    if kind == C.DK_ATTR_FLOATS:
        return [float(attribute.floats[i]) for i in range(attribute.count)]
    if kind == C.DK_ATTR_STRING:
        return ffi.string(attribute.s).decode()
    if kind == C.DK_ATTR_DTYPE:
        return key_of(attribute.dtype)
    raise invalid(f"attribute '{ffi.string(attribute.name).decode()}' has unknown type {kind}")


# More tensors or attributes than this in one call is a malformed call, not a big one.
MAX_CALL_ITEMS = 1 << 16
MAX_DIMS = 64
INT64_MAX = (1 << 63) - 1


def check_raw_call(op: str, call, token, device_count: int) -> None:
    """Refuses a DK_KernelCall that Call could not read safely: NULL, short, another entry's,
    a device out of range, NULL or huge arrays, attributes NULL, short, unnamed, of an
    unknown type or lists without elements. (The tensors check themselves: Tensor.)"""
    if call == ffi.NULL or call.struct_size < ffi.offsetof("DK_KernelCall", "user_data") + ffi.sizeof("void *"):
        raise invalid("the call is NULL or its struct_size is too small")
    if call.user_data != token:
        raise invalid("call->user_data is not this kernel entry's")
    if not 0 <= call.device < device_count:
        raise invalid(f"device {call.device} is out of range (the plugin has {device_count})")
    for count, array, what in ((call.num_inputs, call.inputs, "inputs"), (call.num_outputs, call.outputs, "outputs"),
                               (call.num_attributes, call.attributes, "attributes")):
        if count > MAX_CALL_ITEMS:
            raise invalid(f"{count} {what} is more than a call takes ({MAX_CALL_ITEMS})")
        if count and array == ffi.NULL:
            raise invalid(f"{count} {what} and a NULL array")
    minimum = ffi.offsetof("DK_Attribute", "dtype") + ffi.sizeof("DK_DataType")
    for i in range(call.num_attributes):
        a = call.attributes[i]
        if a == ffi.NULL or a.struct_size < minimum or a.name == ffi.NULL:
            raise invalid(f"attribute {i} is NULL, short or unnamed")
        name = ffi.string(a.name).decode(errors="replace")
        if a.type not in ATTR_KINDS:
            raise invalid(f"attribute '{name}' has unknown type {a.type}")
        elements = a.ints if a.type == C.DK_ATTR_INTS else a.floats if a.type == C.DK_ATTR_FLOATS else None
        if elements is not None and (not 0 <= a.count <= MAX_CALL_ITEMS or (a.count and elements == ffi.NULL)):
            raise invalid(f"attribute '{name}' has count {a.count} and no elements")
        if a.type == C.DK_ATTR_STRING and a.s == ffi.NULL:
            raise invalid(f"string attribute '{name}' is NULL")


ATTR_KINDS = {C.DK_ATTR_INT: "int", C.DK_ATTR_FLOAT: "float", C.DK_ATTR_INTS: "ints",
              C.DK_ATTR_FLOATS: "floats", C.DK_ATTR_STRING: "string", C.DK_ATTR_DTYPE: "dtype"}


class Call:
    """One kernel call, read out of its DK_KernelCall: what every kernel starts from.

    ``inputs`` holds a Tensor per input (None for an omitted optional one),
    ``attrs`` the attributes by name (host inputs arrive here too), and
    ``launch`` enqueues a kernel on the call's stream (a dialect's subclass).
    """

    def __init__(self, op: str, call, device_of):
        self.op, self.device_of = op, device_of
        self.device = device_of(call.device)
        self.stream = self.device.stream(call.stream)
        self.inputs = [None if call.inputs[j].ndim < 0 else Tensor(self.device, f"input {j}", call.inputs[j])
                       for j in range(call.num_inputs)]
        self.outputs = [Tensor(self.device, f"output {j}", call.outputs[j]) for j in range(call.num_outputs)]
        self.attrs = {ffi.string(call.attributes[i].name).decode(): attribute_value(call.attributes[i])
                      for i in range(call.num_attributes)}
        self.attr_kinds = {ffi.string(call.attributes[i].name).decode(): ATTR_KINDS[call.attributes[i].type]
                           for i in range(call.num_attributes)}

    @property
    def fp64(self) -> bool:
        return self.device.fp64

    def input(self, j: int) -> Tensor | None:
        return self.inputs[j] if j < len(self.inputs) else None

    def expect(self, inputs: tuple[int, int], outputs: int | tuple[int, int]) -> None:
        """Refuses a call whose input count is outside [low, high] or whose output
        count differs from ``outputs`` (or lies outside its [low, high])."""
        low, high = inputs
        if not low <= len(self.inputs) <= high:
            wanted = str(low) if low == high else f"{low} to {high}"
            raise invalid(f"{self.op} takes {wanted} inputs, got {len(self.inputs)}")
        low, high = (outputs, outputs) if isinstance(outputs, int) else outputs
        if not low <= len(self.outputs) <= high:
            wanted = str(low) if low == high else f"{low} to {high}"
            raise invalid(f"{self.op} has {wanted} output(s), got {len(self.outputs)}")

    def run(self, call, run) -> None:
        """Runs ``run(self)``; a dialect whose streams capture graphs records the
        DK_KernelCall instead, to run ``run`` on a Call of its copy at each launch."""
        run(self)

    # -- what reaches the device: each dialect's Call subclass (see the module doc) --

    def buffer(self, values, dtype=np.int64, writable: bool = False):
        raise NotImplementedError

    def zeros(self, count: int, dtype=np.int32):
        raise NotImplementedError

    def scratch(self, nbytes: int):
        raise NotImplementedError

    def check_in_stream_order(self, check) -> None:
        raise NotImplementedError

    def launch(self, source: str, name: str, args: list, global_size, local_size=None,
               options: str = "") -> None:
        raise NotImplementedError

    def library_gemm(self, key: int, a, b, y, m: int, n: int, k: int, batch: list, alpha: float,
                     beta: float, addend) -> bool:
        """Runs linalg_gemm.gemm's product (its arguments, batch dims folded)
        through the dialect's BLAS and says so; False leaves it to the kernels."""
        return False


class Local:
    """A kernel argument ``local T *``: ``nbytes`` of work-group local memory."""

    __slots__ = ("nbytes",)

    def __init__(self, nbytes: int):
        self.nbytes = int(nbytes)


@dataclasses.dataclass(frozen=True)
class DeviceLimits:
    """What the kernel families plan launches from (work-group sizes, tiles)."""

    max_group_size: int                 # work-items of a work-group
    max_item_sizes: tuple[int, ...]     # work-items per dim of a work-group
    local_mem_size: int                 # bytes of local memory per work-group
    compute_units: int
    is_cpu: bool                        # CPU devices prefer other tiles (linalg_gemm)
    exact_divide_sqrt: bool             # float division and sqrt correctly rounded on request


# ---- strided copies ------------------------------------------------------------------

# A dtype of each element width whose prelude stores plain integers (bfloat16:
# ushort): copies through its P_t move the bits unchanged, whatever the dtype,
# so every dtype of a width shares one program.
STORAGE_OF_WIDTH = {1: C.DK_DTYPE_UINT8, 2: C.DK_DTYPE_BFLOAT16, 4: C.DK_DTYPE_INT32,
                    8: C.DK_DTYPE_INT64}

# A view of a buffer: (element offset, shape, strides).
View = tuple[int, list[int], list[int]]

_COPY = """
/* meta: the source view's shape then strides (n0 dims), the destination's
 * (n1 dims); both walk the same n elements in row-major order. */
kernel void k_copy(global const X_t *x, long x_off, global X_t *y, long y_off,
                   int n0, int n1, global const long *meta, long n) {
  long i = get_global_id(0);
  if (i >= n) return;
  y[y_off + dk_offset(i, n1, meta + 2 * n0, meta + 2 * n0 + n1)] =
      x[x_off + dk_offset(i, n0, meta, meta + n0)];
}
"""
def collapse(shape, strides) -> tuple[list[int], list[int]]:
    """The fewest dims walking the same elements in the same row-major order:
    size-1 dims dropped, a dim merged into the one before it where that one
    steps exactly over it. A compact tensor becomes one dim of stride 1."""
    dims: list[list[int]] = []
    for n, s in zip(shape, strides):
        if n == 1:
            continue
        if dims and dims[-1][1] == s * n:
            dims[-1] = [dims[-1][0] * n, s]
        else:
            dims.append([n, s])
    return [n for n, _ in dims], [s for _, s in dims]


def whole(t: Tensor) -> View:
    return t.offset, t.shape, t.strides


def copy(c: Call, x, src: View, y, dst: View, key: int | None = None) -> None:
    """Copies the elements of view ``src`` of x to view ``dst`` of y, both walked
    in row-major order (their shapes hold the same count). Bit-exact. y is a
    Tensor, or a device buffer of dtype ``key``; x a Tensor or a device buffer
    of y's dtype."""
    n = int(np.prod(dst[1], dtype=np.int64))
    if n == 0:
        return
    (s_shape, s_strides), (d_shape, d_strides) = collapse(*src[1:]), collapse(*dst[1:])
    source = prelude("X", STORAGE_OF_WIDTH[cl_type(y.dtype if key is None else key).itemsize], False) + _COPY
    launch_items(c, source, "k_copy", [x, np.int64(src[0]), y, np.int64(dst[0]), np.int32(len(s_shape)),
                                       np.int32(len(d_shape)),
                                       c.buffer(s_shape + s_strides + d_shape + d_strides), np.int64(n)], n)


def group_size(c: Call, preferred: int = 256) -> int:
    """The local size of a kind of launch: ``preferred`` (a power of two),
    halved until the device takes it. One size per device whatever the
    shapes, since PoCL compiles a kernel anew for each local size it is
    enqueued with; a power of two, which tree reductions halve."""
    size = preferred
    while size > c.device.limits.max_group_size:
        size //= 2
    return size


def launch_items(c: Call, source: str, name: str, args: list, n: int, options: str = "",
                 preferred: int = 256) -> None:
    """Launches kernel ``name`` with a work-item per element of ``n``, rounded
    up to whole work-groups (the kernel bounds-checks); nothing when n is 0."""
    if n:
        group = group_size(c, preferred)
        c.launch(source, name, args, round_up(n, group), group, options)


def round_up(n: int, multiple: int) -> int:
    return -(-n // multiple) * multiple


class KernelTable:
    """The DK_KernelEntry structs and the callbacks and strings they point to.

    ``call_class`` is the dialect's Call subclass; ``callback(ctype, name, fn)``
    the plugin's C-boundary wrapper (boundary.callback with its errors)."""

    def __init__(self, devices: list, device_of, call_class: type[Call], callback):
        self.devices, self.device_of = devices, device_of
        self.call_class, self.callback = call_class, callback
        self.entries: list = []
        self.runs: list[tuple[str, int, object]] = []  # (op, dtype key, what its entry runs)
        self._keepalive: list = []

    def add(self, op: str, dtype_key: int, fn, flags: int, run=None) -> None:
        """An entry calling ``fn(call)``; ``run`` is what it runs, if not fn itself."""
        self.runs.append((op, dtype_key, run or fn))
        name = ffi.new("char[]", op.encode())
        token = ffi.new("char[]", 1)  # the entry's user_data: a call carries it back

        def checked(call):
            check_raw_call(op, call, token, len(self.devices))
            return fn(call)

        pointer = self.callback("DK_KernelFn", f"{op} kernel", checked)
        entry = ffi.new("DK_KernelEntry *", {
            "struct_size": ffi.sizeof("DK_KernelEntry"), "op": name,
            "dtype": {"code": dtype_key & 0xFF, "bits": (dtype_key >> 8) & 0xFF, "lanes": 1},
            "fn": pointer, "flags": flags, "user_data": token})
        self._keepalive += [name, token, pointer]
        self.entries.append(entry[0])
        self._keepalive.append(entry)

    def claim(self, op: str, run, flags: int = 0, unclaimed: Mapping[tuple[str, str], str] = {}) -> None:
        """Registers ``run(call: Call, key: int)`` for every dtype of op ``op``'s
        spec that the devices support, except the (op, dtype name) pairs in
        ``unclaimed`` (each with the reason it is left out)."""
        for key in supported_dtypes(op, self.devices):
            if (op, CL_TYPES[key].name) in unclaimed:
                continue

            def fn(call, key=key):
                c = self.call_class(op, call, self.device_of)
                check_against_spec(c, key)
                c.run(call, lambda c: run(c, key))

            self.add(op, key, fn, flags, run)


def _numpy_dtype(c: Call, what: str, key: int) -> np.dtype:
    code, bits, lanes = key & 0xFF, (key >> 8) & 0xFF, key >> 16
    try:
        if lanes != 1:
            raise KeyError(lanes)
        return key_dtype_of(SimpleNamespace(dtype=SimpleNamespace(code=code, bits=bits)))
    except (KeyError, TypeError):
        raise invalid(f"{c.op}: {what} has dtype (code {code}, bits {bits}, lanes {lanes}), which the op "
                      f"does not take") from None


def check_against_spec(c: Call, key: int) -> None:
    """Refuses, once per call, what the op spec refuses: tensor counts, the key
    dtype, each attribute's presence, type and value (its choices and check),
    and inputs and outputs whose shapes and dtypes shape inference does not
    give. The devkit host sends valid calls; any other host may not."""
    spec = ops.get(c.op)
    declared = [decl for decl in spec.inputs if not decl.host]
    variadic = bool(declared) and declared[-1].variadic
    required = max((i + 1 for i, decl in enumerate(declared) if not decl.optional), default=0)
    if len(c.inputs) < required or (not variadic and len(c.inputs) > len(declared)):
        raise invalid(f"{c.op}: takes {required} to {'any' if variadic else len(declared)} inputs, "
                      f"got {len(c.inputs)}")
    if not c.outputs:
        raise invalid(f"{c.op}: the call has no outputs")
    attrs, as_attributes = {}, set()
    for attr in spec.attrs:
        if attr.name not in c.attrs:
            if attr.default is not None:
                raise invalid(f"{c.op}: attribute '{attr.name}' is missing")
            continue
        kind = c.attr_kinds[attr.name]
        host_form = any(decl.host and decl.name == attr.name for decl in spec.inputs)
        if kind != attr.kind and not (host_form and kind in ("ints", "floats")):
            raise invalid(f"{c.op}: attribute '{attr.name}' is {kind}; the op takes {attr.kind}")
        value = c.attrs[attr.name]
        if kind == "dtype":
            value = _numpy_dtype(c, f"attribute '{attr.name}'", value)
        if kind != attr.kind:
            continue  # the host input's form (Dropout's ratio as floats), read below
        as_attributes.add(attr.name)
        try:
            attrs[attr.name] = dispatch._coerce_attr(spec, attr, value)
        except (TypeError, ValueError) as exc:
            raise invalid(str(exc)) from None
    tensors = iter(c.inputs)
    infos: list = []
    host_key = isinstance(spec.key, int) and spec.inputs[spec.key].host
    for decl in spec.inputs[:-1] + (spec.inputs[-1:] * max(1, len(c.inputs) - len(declared) + 1)
                                    if variadic else spec.inputs[-1:]):
        if decl.host:
            values = None if decl.name in as_attributes else c.attrs.get(decl.name)
            if values is None and not decl.optional and decl.name not in as_attributes:
                raise invalid(f"{c.op}: attribute '{decl.name}' (the values of input '{decl.name}') is missing")
            if values is not None and c.attr_kinds[decl.name] not in ("ints", "floats"):
                raise invalid(f"{c.op}: attribute '{decl.name}' is {c.attr_kinds[decl.name]}; it carries "
                              f"input '{decl.name}' as ints or floats")
            if values is None:
                infos.append(None)
                continue
            # The ABI carries a host input's values, not its dtype: where the key is a host input (Range's
            # start), the host inputs have the kernel's dtype, elsewhere int64 or float64.
            dtype = (_numpy_dtype(c, decl.name, key) if host_key else
                     np.int64 if c.attr_kinds[decl.name] == "ints" else np.float64)
            array = np.asarray(values).astype(dtype)
            infos.append(TensorInfo(array.shape, array.dtype, array))
            continue
        t = next(tensors, None)
        if decl.read_by_infer:
            return  # the outputs' shapes depend on the data (NonZero): the kernel checks what it reads
        infos.append(None if t is None else TensorInfo(tuple(t.shape), _numpy_dtype(c, decl.name, t.dtype)))
    while infos and infos[-1] is None:
        infos.pop()
    key_info = infos[spec.key] if isinstance(spec.key, int) and spec.key < len(infos) else None
    if key_info is not None and CL_TYPES[key].name != dtype_name(key_info.dtype):
        raise invalid(f"{c.op}: input '{spec.inputs[spec.key].name}' is {dtype_name(key_info.dtype)}; this "
                      f"kernel is for {CL_TYPES[key].name}")
    try:
        expected = spec.infer(infos, attrs)
    except (TypeError, ValueError, IndexError, KeyError) as exc:
        raise invalid(f"{c.op}: {exc}") from None
    if len(c.outputs) > len(expected):
        raise invalid(f"{c.op}: the call has {len(c.outputs)} outputs; the op gives {len(expected)}")
    for j, (t, (shape, dtype)) in enumerate(zip(c.outputs, expected)):
        got = (tuple(t.shape), dtype_name(_numpy_dtype(c, f"output {j}", t.dtype)))
        if got != (tuple(int(n) for n in shape), dtype_name(dtype)):
            raise invalid(f"{c.op}: output {j} is {got[1]} {got[0]}; the inputs and attributes give "
                          f"{dtype_name(dtype)} {tuple(shape)}")


def supported_dtypes(op: str, devices: list) -> list[int]:
    """The DK keys of the op's key dtypes; float64 only where every device has fp64."""
    names = {dtype_name(d) for d in ops.get(op).dtypes}
    fp64 = all(d.fp64 for d in devices)
    return [t.key for t in CL_TYPES.values() if t.name in names and (fp64 or t.name != "float64")]


# Each module has register(table) and UNCLAIMED: {(op, dtype name): reason}.
FAMILY_MODULES = ("elementwise", "reduce", "linalg", "nn", "movement", "shape", "training")


def family_modules():
    return [importlib.import_module(f"{__package__}.{name}") for name in FAMILY_MODULES]


def build_table(devices: list, device_of, call_class: type[Call], callback) -> KernelTable:
    table = KernelTable(devices, device_of, call_class, callback)
    for module in family_modules():
        module.register(table)
    return table


STRIDED = C.DK_KERNEL_STRIDED_INPUTS | C.DK_KERNEL_STRIDED_OUTPUTS
