"""Kernel infrastructure: the program cache, tensor arguments and the kernel table.

Programs are built once per (source, options, device) and kept in memory; their
binaries also go to disk under $XDG_CACHE_HOME/devkit/opencl (default
~/.cache/devkit/opencl), keyed by a hash of source, options and the device's
identity, so that a second process loads them instead of compiling.
"""

from __future__ import annotations

import hashlib
import os
import tempfile
import threading
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


class Tensor:
    """A DK_Tensor resolved on a device: buffer, element offset, shape, strides."""

    __slots__ = ("mem", "offset", "shape", "strides")

    def __init__(self, device: Device, what: str, tensor, itemsize: int):
        ndim = tensor.ndim
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

    @property
    def size(self) -> int:
        return int(np.prod(self.shape, dtype=np.int64))


def broadcast_strides(tensor: Tensor, shape: list[int]) -> list[int]:
    """``tensor``'s strides over the output ``shape`` (0 where it is broadcast)."""
    lead = len(shape) - len(tensor.shape)
    return [0] * lead + [0 if n == 1 and m != 1 else s
                         for s, n, m in zip(tensor.strides, tensor.shape, shape[lead:])]


class KernelTable:
    """The DK_KernelEntry structs and the callbacks and strings they point to."""

    def __init__(self):
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


def build_table(devices: list[Device], device_of) -> KernelTable:
    from . import elementwise

    table = KernelTable()
    elementwise.register(table, devices, device_of)
    return table


STRIDED = C.DK_KERNEL_STRIDED_INPUTS | C.DK_KERNEL_STRIDED_OUTPUTS
