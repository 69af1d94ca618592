"""Kernel infrastructure: the program cache, tensor arguments and the kernel table.

Programs are built once per (source, options, device) and kept in memory; their
binaries also go to disk under $XDG_CACHE_HOME/devkit/opencl (default
~/.cache/devkit/opencl), keyed by a hash of source, options and the device's
identity, so that a second process loads them instead of compiling.
"""

from __future__ import annotations

import dataclasses
import hashlib
import importlib
import os
import tempfile
import threading
from collections.abc import Mapping
from pathlib import Path

import numpy as np
import pyopencl as cl

from ...abi import C, ffi
from .errors import callback, invalid
from .runtime import Device, Mem


def cache_dir() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "devkit" / "opencl"


class ProgramCache:
    """Built programs by (device, source, options); binaries persisted on disk."""

    def __init__(self):
        self._programs: dict[tuple[int, str, str], cl.Program] = {}
        self._lock = threading.Lock()
        self.disk_hits = 0
        self.compiles = 0

    @staticmethod
    def _key(device: Device, source: str, options: str) -> str:
        d = device.cl_device
        identity = "\0".join([d.platform.name, d.platform.version, d.name, d.vendor,
                              d.driver_version, options, source])
        return hashlib.sha256(identity.encode()).hexdigest()

    def get(self, device: Device, source: str, options: str = "") -> cl.Program:
        memo_key = (device.index, source, options)
        with self._lock:
            program = self._programs.get(memo_key)
            if program is None:
                program = self._programs[memo_key] = self._load_or_build(device, source, options)
            return program

    def _load_or_build(self, device: Device, source: str, options: str) -> cl.Program:
        path = cache_dir() / f"{self._key(device, source, options)}.bin"
        if path.exists():
            try:
                program = cl.Program(device.context, [device.cl_device], [path.read_bytes()])
                program.build(options)
                self.disk_hits += 1
                return program
            except (cl.Error, OSError):
                pass  # a stale or truncated entry: rebuild and overwrite it below
        program = cl.Program(device.context, source).build(options, devices=[device.cl_device])
        self.compiles += 1
        binary = program.get_info(cl.program_info.BINARIES)[0]
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            # Written whole, then renamed: a concurrent reader never sees a partial file.
            with tempfile.NamedTemporaryFile(dir=path.parent, delete=False) as tmp:
                tmp.write(binary)
            os.replace(tmp.name, path)
        except OSError:
            pass  # an unwritable cache only costs the next process a compile
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
      float type where the device has fp64, else float; long for integers);
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
        load, store = f"vload_half((i), (p))", f"vstore_half_rte((float)(v), (i), (p))"
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
        self.dtype = key_of(tensor.dtype)
        itemsize = itemsize or cl_type(self.dtype).itemsize
        self.shape = [int(tensor.shape[i]) for i in range(ndim)]
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

    def launch(self, source: str, name: str, args: list, global_size, local_size=None,
               options: str = "") -> None:
        """Builds (cached) and enqueues kernel ``name`` of ``source`` in stream order.

        ``args`` are pyopencl kernel arguments: Tensors (passed as their buffer),
        cl.Buffers, numpy scalars (np.int64(...), ...) or cl.LocalMemory.
        """
        kernel = cl.Kernel(programs.get(self.device, source, options), name)
        kernel.set_args(*[a.buffer if isinstance(a, Tensor) else a for a in args])
        global_size = tuple(int(n) for n in np.atleast_1d(global_size))
        local = None if local_size is None else tuple(int(n) for n in np.atleast_1d(local_size))
        self.device.submit(self.stream,
                           lambda q: cl.enqueue_nd_range_kernel(q, kernel, global_size, local))


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
        pointer = callback("DK_KernelFn", f"{op} kernel", fn)
        entry = ffi.new("DK_KernelEntry *", {
            "struct_size": ffi.sizeof("DK_KernelEntry"), "op": name,
            "dtype": {"code": dtype_key & 0xFF, "bits": (dtype_key >> 8) & 0xFF, "lanes": 1},
            "fn": pointer, "flags": flags})
        self._keepalive += [name, pointer]
        self.entries.append(entry[0])
        self._keepalive.append(entry)

    def claim(self, op: str, run, flags: int = 0, unclaimed: Mapping[tuple[str, str], str] = {}) -> None:
        """Registers ``run(call: Call, key: int)`` for every dtype of op ``op``'s
        spec that the devices support, except the (op, dtype name) pairs in
        ``unclaimed`` (each with the reason it is left out)."""
        for key in supported_dtypes(op, self.devices):
            if (op, CL_TYPES[key].name) in unclaimed:
                continue
            device_of = self.device_of

            def fn(call, key=key):
                run(Call(op, call, device_of), key)

            self.add(op, key, fn, flags)


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
