"""Kernel infrastructure: the program cache, dtypes in OpenCL C, tensor
arguments, calls and the kernel table.

Programs are built once per (device, source, options) and kept in memory. On
disk, a second process finds them in one of two caches, both keyed by source,
options and device: where the driver caches source builds itself (PoCL, under
$XDG_CACHE_HOME/pocl; NVIDIA), in the driver's; elsewhere in pyopencl's binary
cache, kept under $XDG_CACHE_HOME/devkit/opencl (default ~/.cache/devkit/opencl).
Asking PoCL for a program's binary would compile every kernel in it, which its
own cache makes needless (pyopencl.characterize.has_src_build_cache).
"""

from __future__ import annotations

import dataclasses
import importlib
import math
import os
import threading
from collections.abc import Mapping
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pyopencl as cl

from ...abi import C, ffi
from ...ops.spec import dtype_name
from .errors import callback, invalid
from .graph import KernelStep
from .runtime import Device, Mem


def cache_dir() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "devkit" / "opencl"


class ProgramCache:
    """Built programs by (device, source, options), each built once per process."""

    def __init__(self):
        self._programs: dict[tuple[int, str, str], cl.Program] = {}
        self._kernels: dict[tuple[int, str, str, str], tuple[cl.Kernel, threading.Lock]] = {}
        self._lock = threading.Lock()
        self.builds = 0

    def kernel(self, device: Device, source: str, options: str, name: str) -> tuple[cl.Kernel, threading.Lock]:
        """Kernel ``name`` of the program, made once: a new cl.Kernel costs
        pyopencl an argument-setter generation (~1 ms) at its first set_args.
        Its arguments are state, so launches hold the lock from set_args to enqueue."""
        memo_key = (device.index, source, options, name)
        found = self._kernels.get(memo_key)
        if found is None:
            found = (cl.Kernel(self.get(device, source, options), name), threading.Lock())
            with self._lock:
                found = self._kernels.setdefault(memo_key, found)
        return found

    def get(self, device: Device, source: str, options: str = "") -> cl.Program:
        memo_key = (device.index, source, options)
        with self._lock:
            program = self._programs.get(memo_key)
            if program is None:
                program = cl.Program(device.context, source).build(
                    options, devices=[device.cl_device], cache_dir=str(cache_dir()))
                self._programs[memo_key] = program
                self.builds += 1
            return program


programs = ProgramCache()


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

    __slots__ = ("mem", "offset", "shape", "strides", "dtype", "buffer")

    def __init__(self, device: Device, what: str, tensor, itemsize: int | None = None):
        ndim = tensor.ndim
        if not 0 <= ndim <= MAX_DIMS:
            raise invalid(f"{what} has rank {ndim}; the opencl plugin takes 0 to {MAX_DIMS}")
        if ndim and tensor.shape == ffi.NULL:
            raise invalid(f"{what} has a NULL shape")
        if tensor.device.device_type != C.DK_DEVICE_TYPE_OPENCL or tensor.device.device_id != device.index:
            raise invalid(f"{what} is on device (type {tensor.device.device_type}, id {tensor.device.device_id}), "
                          f"not on opencl device {device.index}")
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
        self.mem: Mem = device.mem(what, tensor.data, (self.offset + low) * itemsize,
                                   (high - low) * itemsize)
        # OpenCL has no empty buffers: an empty tensor's kernel argument is a stand-in never read.
        self.buffer: cl.Buffer = self.mem.buffer if self.mem.buffer is not None else _stand_in(device)

    @property
    def size(self) -> int:
        return int(np.prod(self.shape, dtype=np.int64))

    @property
    def ndim(self) -> int:
        return len(self.shape)



def _stand_in(device: Device) -> cl.Buffer:
    if device.stand_in is None:  # a benign race: two threads may each make one
        device.stand_in = cl.Buffer(device.context, cl.mem_flags.READ_WRITE, 8)
    return device.stand_in


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
    ``launch`` enqueues an OpenCL kernel on the call's stream.
    """

    def __init__(self, op: str, call, device_of):
        self.op = op
        self.device: Device = device_of(call.device)
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

    def expect(self, inputs: tuple[int, int], outputs: int) -> None:
        """Refuses a call whose input count is outside [low, high] or whose output count differs."""
        low, high = inputs
        if not low <= len(self.inputs) <= high:
            wanted = str(low) if low == high else f"{low} to {high}"
            raise invalid(f"{self.op} takes {wanted} inputs, got {len(self.inputs)}")
        if len(self.outputs) != outputs:
            raise invalid(f"{self.op} has {outputs} output(s), got {len(self.outputs)}")

    def buffer(self, values, dtype=np.int64) -> cl.Buffer:
        """A read-only device copy of small host data (shapes, strides, indices); never empty."""
        array = np.ascontiguousarray(values, dtype=dtype)
        if array.size == 0:
            array = np.zeros(1, dtype)
        return cl.Buffer(self.device.context, cl.mem_flags.READ_ONLY | cl.mem_flags.COPY_HOST_PTR,
                         hostbuf=array)

    def zeros(self, count: int, dtype=np.int32) -> cl.Buffer:
        """A small zeroed device buffer: a flag or counter kernels write (zeroed
        again before every launch of a graph that recorded it)."""
        host = np.zeros(count, dtype)
        buffer = cl.Buffer(self.device.context, cl.mem_flags.READ_WRITE | cl.mem_flags.COPY_HOST_PTR,
                           hostbuf=host)
        if self.stream is not None and self.stream.capture is not None:
            self.stream.capture.zero_before_launch(buffer, host.nbytes)
        return buffer

    def check_in_stream_order(self, check) -> None:
        """Queues ``check(queue)`` behind the work enqueued so far: it reads back
        what the kernels recorded (blocking copies on ``queue``) and returns a
        PluginError for a failure, or None. The call itself never waits: a
        stream keeps the error for its next synchronization; on the NULL
        stream, where the kernels have already run, it is raised here."""
        stream = self.stream
        # A graph's check fails whichever stream replays it: raised there.
        recorded = stream is not None and stream.capture is not None

        def run(queue: cl.CommandQueue) -> None:
            error = check(queue)
            if error is None:
                return
            if stream is None or recorded:
                raise error
            stream.fail(error)

        self.device.copy_host(stream, run)

    def launch(self, source: str, name: str, args: list, global_size, local_size=None,
               options: str = "") -> None:
        """Builds (cached) and enqueues kernel ``name`` of ``source`` in stream order.

        ``args`` are pyopencl kernel arguments: Tensors (passed as their buffer),
        cl.Buffers, numpy scalars (np.int64(...), ...) or cl.LocalMemory.
        """
        global_size = tuple(int(n) for n in np.atleast_1d(global_size))
        local = None if local_size is None else tuple(int(n) for n in np.atleast_1d(local_size))
        buffers = [a.buffer if isinstance(a, Tensor) else a for a in args]
        if self.stream is not None and self.stream.capture is not None:
            # A graph enqueues this at every launch (graph.py): it gets a kernel of its
            # own, whose arguments stay as set now, and the step keeps them alive.
            kernel = cl.Kernel(programs.get(self.device, source, options), name)
            kernel.set_args(*buffers)
            self.stream.capture.record("kernel", KernelStep(kernel, global_size, local, args))
            return
        kernel, lock = programs.kernel(self.device, source, options, name)
        with lock:  # submit enqueues before it returns, and an enqueue takes the arguments as set
            kernel.set_args(*buffers)
            self.device.submit(self.stream, lambda q: cl.enqueue_nd_range_kernel(q, kernel, global_size, local))


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


def copy(c: Call, x, src: View, y: Tensor, dst: View) -> None:
    """Copies the elements of view ``src`` of x (a Tensor or a cl.Buffer of
    y's dtype) to view ``dst`` of y, both walked in row-major order (their
    shapes hold the same count). Bit-exact."""
    n = int(np.prod(dst[1], dtype=np.int64))
    if n == 0:
        return
    (s_shape, s_strides), (d_shape, d_strides) = collapse(*src[1:]), collapse(*dst[1:])
    source = prelude("X", STORAGE_OF_WIDTH[cl_type(y.dtype).itemsize], False) + _COPY
    launch_items(c, source, "k_copy", [x, np.int64(src[0]), y, np.int64(dst[0]), np.int32(len(s_shape)),
                                       np.int32(len(d_shape)),
                                       c.buffer(s_shape + s_strides + d_shape + d_strides), np.int64(n)], n)


def group_size(c: Call, preferred: int = 256) -> int:
    """The local size of a kind of launch: ``preferred`` (a power of two),
    halved until the device takes it. One size per device whatever the
    shapes, since PoCL compiles a kernel anew for each local size it is
    enqueued with; a power of two, which tree reductions halve."""
    size = preferred
    while size > c.device.cl_device.max_work_group_size:
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
    """The DK_KernelEntry structs and the callbacks and strings they point to."""

    def __init__(self, devices: list[Device], device_of):
        self.devices, self.device_of = devices, device_of
        self.entries: list = []
        self._keepalive: list = []

    def add(self, op: str, dtype_key: int, fn, flags: int) -> None:
        name = ffi.new("char[]", op.encode())
        token = ffi.new("char[]", 1)  # the entry's user_data: a call carries it back

        def checked(call):
            check_raw_call(op, call, token, len(self.devices))
            return fn(call)

        pointer = callback("DK_KernelFn", f"{op} kernel", checked)
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

            def fn(call, key=key, device_of=self.device_of):
                c = Call(op, call, device_of)
                check_against_spec(c, key)
                if c.stream is not None and c.stream.capture is not None:  # graph.py
                    c.stream.capture.add_kernel(call, lambda copy: run(Call(op, copy, device_of), key))
                else:
                    run(c, key)

            self.add(op, key, fn, flags)


def _numpy_dtype(c: Call, what: str, key: int) -> np.dtype:
    from ...engine.calls import key_dtype_of

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
    from ... import ops
    from ...ops import dispatch
    from ...ops.spec import TensorInfo

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


def supported_dtypes(op: str, devices: list[Device]) -> list[int]:
    """The DK keys of the op's key dtypes; float64 only where every device has fp64."""
    from ... import ops
    from ...ops.spec import dtype_name

    names = {dtype_name(d) for d in ops.get(op).dtypes}
    fp64 = all(d.fp64 for d in devices)
    return [t.key for t in CL_TYPES.values() if t.name in names and (fp64 or t.name != "float64")]


# Each module has register(table) and UNCLAIMED: {(op, dtype name): reason}.
FAMILY_MODULES = ("elementwise", "reduce", "linalg", "nn", "movement", "shape", "training")


def family_modules():
    return [importlib.import_module(f"{__package__}.{name}") for name in FAMILY_MODULES]


def build_table(devices: list[Device], device_of) -> KernelTable:
    table = KernelTable(devices, device_of)
    for module in family_modules():
        module.register(table)
    return table


STRIDED = C.DK_KERNEL_STRIDED_INPUTS | C.DK_KERNEL_STRIDED_OUTPUTS
