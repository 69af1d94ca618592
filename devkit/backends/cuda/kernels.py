"""The cuda dialect of the kernel layer (devkit/backends/kernels/layer.py):
the kernel library's families, their OpenCL C rendered as CUDA C
(dialect.py) and built by NVRTC through CuPy, launched on CUDA streams.

The families plan every launch (argument lists, ND-ranges, work-group sizes,
the dtype each program is built for) in the dialect-neutral layer, so PoCL
runs the same planning on every CI run; what this module adds is pure
arithmetic on those plans (``plan_launch``: an OpenCL ND-range as a CUDA
grid and block, local-memory arguments as offsets into the dynamic shared
memory) and the CuPy calls that carry them out.

Programs are compiled at first use by NVRTC (CuPy's bindings, called
directly: CuPy's own compile path appends -ftz=true, which would flush
denormals), one module per (device, source, options) kept for the process.
On disk the cubins are kept under kernels/cuda in devkit's cache
(codegen.cache_root()), named by a hash of the NVRTC version, the
architecture, the options and the source, so a second process compiles
nothing.

Temporaries a kernel call makes (shape and stride tables, scratch, flags)
come from the device's stream-ordered pool (cudaMallocAsync on the call's
stream) and are freed in stream order once the call has queued its
kernels; the stream-order checks (bad indices, say) wait for the call's
stream, and an error they find is the stream's sticky error.

MatMul and Gemm products go through cuBLAS where their operands' layout
allows (blas.py); other dtypes and layouts run the rendered tiled product.
"""

from __future__ import annotations

import dataclasses
import hashlib
import math
import os
import threading
from pathlib import Path

import numpy as np

from ... import codegen
from ...abi import C
from ..kernels.layer import Call, DeviceLimits, Local, Tensor
from ..support.boundary import PluginError
from . import blas, dialect
from .runtime import cuda, current_stream

CUDA_MEMCPY_HOST_TO_DEVICE = 1
CUDA_MEMCPY_DEVICE_TO_HOST = 2
# The dynamic shared memory a kernel gets without opting in (cudaFuncAttributeMaxDynamicSharedMemorySize).
DEFAULT_SHARED_BYTES = 48 * 1024
# gridDim limits: x up to 2^31 - 1, y and z up to 65535.
MAX_GRID = (2 ** 31 - 1, 65535, 65535)


@dataclasses.dataclass(frozen=True)
class LaunchPlan:
    grid: tuple[int, int, int]
    block: tuple[int, int, int]
    shared_bytes: int
    args: tuple  # the kernel's arguments, Local ones as np.uint64 offsets into the shared memory


def _largest_divisor(n: int, limit: int) -> int:
    for d in range(min(n, limit), 0, -1):
        if n % d == 0:
            return d
    return 1


def plan_launch(global_size, local_size, args, limits: DeviceLimits) -> LaunchPlan:
    """The CUDA launch of an OpenCL ND-range: ``global_size`` work-items per dim
    in work-groups of ``local_size`` (which divides it, as OpenCL requires); with
    no local size, work-groups of the largest sizes that divide the range (an
    OpenCL kernel launched so reads no id past it). Tensors pass their
    allocation, Local arguments an offset into the dynamic shared memory
    (dialect.render), each aligned to dialect.SHARED_ALIGNMENT."""
    global_size = [int(n) for n in np.atleast_1d(global_size)]
    if not 1 <= len(global_size) <= 3:
        raise PluginError(C.DK_INTERNAL, f"an ND-range of {len(global_size)} dims (CUDA launches 1 to 3)")
    if local_size is None:
        block, budget = [], limits.max_group_size
        for d, n in enumerate(global_size):
            block.append(_largest_divisor(n, min(budget, limits.max_item_sizes[d])))
            budget //= block[-1]
    else:
        block = [int(n) for n in np.atleast_1d(local_size)]
        if len(block) != len(global_size) or any(b < 1 or n % b for n, b in zip(global_size, block)):
            raise PluginError(C.DK_INTERNAL, f"work-groups {block} do not divide the ND-range {global_size}")
        if math.prod(block) > limits.max_group_size:
            raise PluginError(C.DK_INTERNAL, f"work-groups of {math.prod(block)} work-items; the device "
                                             f"takes at most {limits.max_group_size}")
    grid = [n // b for n, b in zip(global_size, block)]
    grid += [1] * (3 - len(grid))
    block += [1] * (3 - len(block))
    for d, (g, most) in enumerate(zip(grid, MAX_GRID)):
        if g > most:
            raise PluginError(C.DK_OUT_OF_RANGE, f"the launch needs {g} blocks along grid dim {d}; CUDA "
                                                 f"allows at most {most}")
    shared, kernel_args = 0, []
    for a in args:
        if isinstance(a, Local):
            shared = -(-shared // dialect.SHARED_ALIGNMENT) * dialect.SHARED_ALIGNMENT
            kernel_args.append(np.uint64(shared))
            shared += a.nbytes
        elif isinstance(a, Tensor):
            kernel_args.append(a.buffer)
        else:
            kernel_args.append(a)
    if shared > limits.local_mem_size:
        raise PluginError(C.DK_RESOURCE_EXHAUSTED, f"{shared} bytes of shared memory; the device has "
                                                   f"{limits.local_mem_size} per block")
    return LaunchPlan(tuple(grid), tuple(block), shared, tuple(kernel_args))


def nvrtc_options(options: str, include_dirs: list[str]) -> tuple[str, ...]:
    """NVRTC's options for a program built with OpenCL build ``options``."""
    return (*dialect.COMPILE_OPTIONS, *dialect.defines(options), *(f"-I{d}" for d in include_dirs))


def _include_dirs() -> list[str]:
    """Where cuda_fp16.h is: the toolkit CuPy finds, else the headers of the
    NVIDIA wheels (cuda-pathfinder, which CuPy itself uses)."""
    root = cuda().cuda.get_cuda_path()
    include = os.path.join(root, "include") if root else None
    if include and os.path.isdir(include):
        return [include]
    try:
        from cuda.pathfinder import find_nvidia_header_directory
    except ImportError:
        return []
    found = find_nvidia_header_directory("cudart")
    return [found] if found else []


def cache_dir() -> Path:
    return codegen.cache_root() / "kernels" / "cuda"


def compile_cubin(code: str, options: tuple[str, ...], arch: str) -> bytes:
    """``code`` compiled by NVRTC for sm_``arch`` (PTX for a newer device
    than NVRTC knows); a failure raises the compiler's log."""
    nvrtc = cuda().cuda.nvrtc
    native = int(arch) <= max(nvrtc.getSupportedArchs())
    program = nvrtc.createProgram(code, "devkit.cu", (), ())
    try:
        try:
            nvrtc.compileProgram(program, (*options, f"-arch={'sm' if native else 'compute'}_{arch}"))
        except nvrtc.NVRTCError as exc:
            raise PluginError(C.DK_INTERNAL, f"NVRTC: {exc}\n{nvrtc.getProgramLog(program)}") from None
        return nvrtc.getCUBIN(program) if native else nvrtc.getPTX(program).encode()
    finally:
        nvrtc.destroyProgram(program)


class ModuleCache:
    """Compiled programs by (device, source, options); functions by name."""

    def __init__(self):
        self._modules: dict[tuple[int, str, str], object] = {}
        self._functions: dict[tuple[int, str, str, str], object] = {}
        self._lock = threading.Lock()
        self.builds = 0

    def function(self, device_index: int, source: str, options: str, name: str):
        memo_key = (device_index, source, options, name)
        found = self._functions.get(memo_key)
        if found is not None:
            return found
        with self._lock:
            module = self._modules.get(memo_key[:3])
            if module is None:
                module = self._load(device_index, source, options)
                self._modules[memo_key[:3]] = module
            found = self._functions.setdefault(memo_key, module.get_function(name))
        return found

    def _load(self, device_index: int, source: str, options: str):
        """The program's module, from the disk cache or compiled into it."""
        cupy = cuda()
        code, flags = dialect.render(source), nvrtc_options(options, _include_dirs())
        arch = str(cupy.cuda.Device(device_index).compute_capability)
        identity = repr((cupy.cuda.nvrtc.getVersion(), arch, flags, code)).encode()
        path = cache_dir() / f"{hashlib.sha256(identity).hexdigest()}.cubin"
        if not path.is_file():
            binary = compile_cubin(code, flags, arch)
            self.builds += 1
            path.parent.mkdir(parents=True, exist_ok=True)
            partial = path.with_suffix(f".{os.getpid()}.{threading.get_ident()}.part")
            partial.write_bytes(binary)
            os.replace(partial, path)  # whole or absent for another process
        return cupy.RawModule(path=str(path))


modules = ModuleCache()


class SyncReader:
    """A stream-order check's copies, once the call's stream has drained."""

    def read(self, host: np.ndarray, buffer, byte_offset: int = 0) -> None:
        cuda().cuda.runtime.memcpy(host.ctypes.data, int(buffer) + byte_offset, host.nbytes,
                                   CUDA_MEMCPY_DEVICE_TO_HOST)

    def write(self, buffer, host: np.ndarray) -> None:
        host = np.ascontiguousarray(host)
        cuda().cuda.runtime.memcpy(int(buffer), host.ctypes.data, host.nbytes, CUDA_MEMCPY_HOST_TO_DEVICE)


class CudaCall(Call):
    """A kernel call on the cuda plugin (see the layer's Call)."""

    def __init__(self, op: str, call, device_of):
        super().__init__(op, call, device_of)
        self._temporaries: list[int] = []

    def run(self, call, run) -> None:
        capture = self.device.captures.get(self.stream) if self.stream is not None else None
        if capture is not None:  # recorded for a graph (graph.py), run at its launches
            capture.add_kernel(self.op, call, run)
            return
        try:
            run(self)
        finally:  # in stream order after the kernels that use them
            stream = self.cuda_stream()
            for pointer in self._temporaries:
                self.device.free_internal(pointer, stream)
            if self.stream is None:
                self.device.runtime.streamSynchronize(stream)

    def cuda_stream(self) -> int:
        """The cudaStream_t the call's work goes on (the NULL stream's private one)."""
        return self.stream if self.stream is not None else self.device.null_stream

    def scratch(self, nbytes: int) -> np.uint64:
        pointer = self.device.malloc_internal(nbytes, self.cuda_stream())
        self._temporaries.append(pointer)
        return np.uint64(pointer)

    def buffer(self, values, dtype=np.int64, writable: bool = False) -> np.uint64:
        array = np.ascontiguousarray(values, dtype=dtype)
        if array.size == 0:
            array = np.zeros(1, dtype)
        pointer = self.scratch(array.nbytes)
        with self.device.context():  # from pageable memory: staged before the call returns
            self.device.runtime.memcpyAsync(int(pointer), array.ctypes.data, array.nbytes,
                                            CUDA_MEMCPY_HOST_TO_DEVICE, self.cuda_stream())
        return pointer

    def zeros(self, count: int, dtype=np.int32) -> np.uint64:
        return self.buffer(np.zeros(count, dtype), dtype, writable=True)

    def enqueue(self, fn) -> None:
        """Runs ``fn(cuda_stream)``, which queues library work (cuBLAS) on the call's stream."""
        with self.device.context():
            fn(self.cuda_stream())

    def check_in_stream_order(self, check) -> None:
        """Waits for the call's stream (CUDA's host functions may not call
        CUDA) and runs the check: its error becomes the stream's sticky error,
        as the ABI has work that fails in stream order reported (the opencl
        plugin's, and this plugin's CUDA graphs'); a NULL-stream call raises it."""
        with self.device.context():
            self.device.runtime.streamSynchronize(self.cuda_stream())
            error = check(SyncReader())
        if error is None:
            return
        if self.stream is None:
            raise error
        self.device.fail(self.stream, error)

    def launch(self, source: str, name: str, args: list, global_size, local_size=None,
               options: str = "") -> None:
        plan = plan_launch(global_size, local_size, args, self.device.limits)
        if 0 in plan.grid:
            return  # an empty ND-range: nothing to run
        with self.device.context():
            kernel = modules.function(self.device.index, source, options, name)
            if plan.shared_bytes > DEFAULT_SHARED_BYTES:
                kernel.max_dynamic_shared_size_bytes = plan.shared_bytes
            with current_stream(self.cuda_stream()):
                kernel(plan.grid, plan.block, plan.args, shared_mem=plan.shared_bytes)

    def library_gemm(self, key, a, b, y, m, n, k, batch, alpha, beta, addend) -> bool:
        return blas.gemm(self, key, a, b, y, m, n, k, batch, alpha, beta, addend)
