"""Devices, memory, copies, streams and events of the devkit "cuda" plugin, on
CuPy's CUDA runtime bindings (cupy.cuda.runtime).

Handles are CUDA's own values: a DK_Mem is the device pointer (the ABI's
"raw pointer for CUDA"), a DK_Stream a cudaStream_t, a DK_Event a
cudaEvent_t. Each device keeps registries of the live ones, so a stale or
made-up handle is an INVALID_ARGUMENT, never a fault; allocations also keep
their size for the range checks of every copy and kernel.

CuPy is imported on first use (``cuda()``), never at import time: without it
the plugin still imports, and DK_PluginInit answers UNAVAILABLE with the
reason (``unavailable_reason``).
"""

from __future__ import annotations

import threading

import numpy as np

from ...abi import C, ffi
from ..kernels.layer import DeviceLimits
from ..support.boundary import PluginError, handle_key, invalid

# cudaError values the plugin tells apart.
CUDA_ERROR_MEMORY_ALLOCATION = 2
CUDA_ERROR_INSUFFICIENT_DRIVER = 35
CUDA_ERROR_NO_DEVICE = 100
CUDA_ERROR_NOT_READY = 600
CUDA_MEMCPY_DEFAULT = 4          # cudaMemcpyDefault: the direction from the pointers (UVA)
CUDA_STREAM_NON_BLOCKING = 1     # no implicit order with the legacy default stream
CUDA_EVENT_DISABLE_TIMING = 2
CUDA_HOST_ALLOC_PORTABLE = 1

INSTALL_HINT = ("pip install 'devkit[cuda]' (cupy-cuda13x; for a CUDA 12 driver, "
                "pip install cupy-cuda12x)")

_cupy = None
_in_callback = threading.local()  # set while a stream callback runs on CUDA's callback thread


def cuda():
    """cupy, imported once."""
    global _cupy
    if _cupy is None:
        import cupy
        _cupy = cupy
    return _cupy


class _StreamPointer:
    """A cudaStream_t in the CUDA stream protocol (``__cuda_stream__``)."""

    def __init__(self, pointer: int):
        self.pointer = pointer

    def __cuda_stream__(self) -> tuple[int, int]:
        return 0, self.pointer


def current_stream(pointer: int):
    """A context in which CuPy's work (kernel launches, cuBLAS) goes on the
    cudaStream_t ``pointer`` (CuPy's ExternalStream is deprecated)."""
    return cuda().cuda.Stream.from_external(_StreamPointer(int(pointer)))


def unavailable_reason() -> str | None:
    """Why the plugin cannot open a device here (no CuPy, no driver, no
    device), or None when it can."""
    try:
        cupy = cuda()
    except ImportError as exc:
        return f"CuPy is not installed ({exc}): {INSTALL_HINT}"
    try:
        count = cupy.cuda.runtime.getDeviceCount()
    except cupy.cuda.runtime.CUDARuntimeError as exc:
        if exc.status == CUDA_ERROR_NO_DEVICE:
            return f"no CUDA device found ({exc})"
        if exc.status == CUDA_ERROR_INSUFFICIENT_DRIVER:
            return f"no usable CUDA driver: the installed one is missing or older than CuPy's runtime ({exc})"
        return f"the CUDA runtime cannot count devices: {exc}"
    except Exception as exc:  # CuPy imports without libcuda and fails when first used
        return f"no CUDA driver: {type(exc).__name__}: {exc}"
    if count == 0:
        return "no CUDA device found"
    return None


def status_of(exc) -> int:
    status = getattr(exc, "status", None)
    if status == CUDA_ERROR_MEMORY_ALLOCATION:
        return C.DK_RESOURCE_EXHAUSTED
    if status == CUDA_ERROR_NOT_READY:
        return C.DK_NOT_READY
    return C.DK_INTERNAL


def refuse_in_callback(what: str) -> None:
    if getattr(_in_callback, "active", False):
        raise PluginError(C.DK_FAILED_PRECONDITION,
                          f"{what} called from a stream callback: CUDA forbids CUDA calls there")


def run_callback(fn, user_data) -> None:
    _in_callback.active = True
    try:
        fn(user_data)
    finally:
        _in_callback.active = False


def limits_of(properties: dict) -> DeviceLimits:
    """A CUDA device's cudaDeviceProp as the limits the families plan with."""
    return DeviceLimits(
        max_group_size=int(properties["maxThreadsPerBlock"]),
        max_item_sizes=tuple(int(n) for n in properties["maxThreadsDim"]),
        local_mem_size=int(properties.get("sharedMemPerBlockOptin") or properties["sharedMemPerBlock"]),
        compute_units=int(properties["multiProcessorCount"]),
        is_cpu=False,
        exact_divide_sqrt=True)  # dialect.COMPILE_OPTIONS: --prec-div=true --prec-sqrt=true


class Device:
    def __init__(self, index: int):
        cupy = cuda()
        runtime = cupy.cuda.runtime
        self.index = index
        self.properties = runtime.getDeviceProperties(index)
        self.name = f"cuda device {index} ({self.properties['name'].decode(errors='replace')})"
        self.lock = threading.Lock()
        self.mems: dict[int, int] = {}       # pointer -> size
        self.internal: dict[int, int] = {}   # the plugin's own allocations (temporaries, graph tables) -> size
        self.streams: set[int] = set()
        self.events: dict[int, bool] = {}    # cudaEvent_t -> has timing
        self.recorded: set[int] = set()      # events recorded at least once
        self.hosts: set[int] = set()         # pinned host pointers
        self.peers: set[int] = set()         # devices whose memory this one accesses directly
        self.captures: dict = {}             # capturing cudaStream_t -> graph.Graph recording its work
        self.graphs: dict = {}               # DK_Graph key -> graph.Graph
        self.failures: dict[int, PluginError] = {}  # sticky: a stream's first failure inside a graph
        self.event_failures: dict[int, PluginError] = {}  # events recorded on a stream after its failure
        self._capture_stream: int | None = None
        self.capture_lock = threading.Lock()  # CUDA graphs are captured one at a time (graph.py)
        # What the kernel layer (devkit/backends/kernels/layer.py) reads of a device.
        self.plugin, self.device_type, self.fp64 = "cuda", C.DK_DEVICE_TYPE_CUDA, True
        self.limits = limits_of(self.properties)
        with self.context():
            # The NULL stream's work runs on a private stream and completes before the call returns.
            self.null_stream = runtime.streamCreateWithFlags(CUDA_STREAM_NON_BLOCKING)
            # mem_info's free memory counts down from this (see mem_info).
            self.free_at_open = runtime.memGetInfo()[0]

    def context(self):
        return cuda().cuda.Device(self.index)

    @property
    def runtime(self):
        return cuda().cuda.runtime

    # -- registries -------------------------------------------------------------

    def mem(self, what: str, handle, offset: int, size: int) -> int:
        """The device address of byte ``offset`` of allocation ``handle``."""
        if handle == ffi.NULL:
            raise invalid(f"{what} handle is NULL")
        pointer = handle_key(handle)
        with self.lock:
            alloc_size = self.mems.get(pointer)
        if alloc_size is None:
            raise invalid(f"{what} handle {pointer:#x} is not a live allocation on {self.name}")
        if offset > alloc_size or size > alloc_size - offset:
            raise PluginError(C.DK_OUT_OF_RANGE, f"{what} range [offset {offset}, +{size}) exceeds the "
                                                 f"{alloc_size}-byte allocation")
        return pointer + offset

    def kernel_buffer(self, what: str, handle, offset: int, size: int):
        """A kernel's pointer argument for [offset, +size) of allocation
        ``handle``: the allocation's start (kernels add element offsets)."""
        self.mem(what, handle, offset, size)
        return np.uint64(handle_key(handle))

    def stream(self, handle) -> int | None:
        """The cudaStream_t; None for the NULL stream."""
        if handle == ffi.NULL:
            return None
        stream = handle_key(handle)
        with self.lock:
            live = stream in self.streams
        if not live:
            raise invalid(f"stream {stream:#x} is not a live stream on {self.name}")
        return stream

    def event(self, what: str, handle) -> int:
        if handle == ffi.NULL:
            raise invalid(f"{what} is NULL")
        event = handle_key(handle)
        with self.lock:
            live = event in self.events
        if not live:
            raise invalid(f"{what} {event:#x} is not a live event on {self.name}")
        return event

    # -- graphs and failures ---------------------------------------------------

    def capturing(self) -> bool:
        """Whether a stream of the device is capturing."""
        return bool(self.captures)

    def capture_stream(self) -> int:
        """The private stream CUDA graphs are captured on (graph.py)."""
        with self.lock:
            if self._capture_stream is None:
                with self.context():
                    self._capture_stream = self.runtime.streamCreateWithFlags(CUDA_STREAM_NON_BLOCKING)
            return self._capture_stream

    def fail(self, stream: int, error: PluginError) -> None:
        with self.lock:
            self.failures.setdefault(stream, error)

    def report(self, stream: int) -> None:
        """Raises ``stream``'s sticky error, if it has one."""
        with self.lock:
            error = self.failures.get(stream)
        if error is not None:
            raise error

    # -- work -------------------------------------------------------------------

    def submit(self, stream: int | None, enqueue, native: bool = True, handles=()) -> None:
        """Runs ``enqueue(cuda_stream)`` on ``stream``, or on the NULL stream
        and waits for it. On a capturing stream it is recorded instead, as
        work a CUDA graph can hold (``native``) or not; ``handles`` are the
        allocations it uses."""
        capture = self.captures.get(stream) if stream is not None else None
        if capture is not None:
            capture.record(native, enqueue, handles)
            return
        with self.context():
            if stream is not None:
                enqueue(stream)
                return
            enqueue(self.null_stream)
            self.runtime.streamSynchronize(self.null_stream)

    def synchronize(self) -> None:
        with self.context():
            self.runtime.deviceSynchronize()
        with self.lock:
            failed = next(iter(self.failures.values()), None)
        if failed is not None:
            raise failed

    # -- memory -----------------------------------------------------------------

    def _malloc(self, nbytes: int, stream: int | None) -> int:
        """cudaMalloc, or cudaMallocAsync from the device's stream-ordered
        pool when ``stream`` is given. 0 bytes take 1: a pointer is never NULL."""
        with self.context():
            if stream is None:
                return self.runtime.malloc(max(int(nbytes), 1))
            return self.runtime.mallocAsync(max(int(nbytes), 1), stream)

    def _free(self, pointer: int, stream: int | None) -> None:
        """cudaFree (which waits for the work that may use it), or cudaFreeAsync in ``stream``'s order."""
        with self.context():
            if stream is None:
                self.runtime.free(pointer)
            else:
                self.runtime.freeAsync(pointer, stream)

    def alloc(self, size: int, stream: int | None = None):
        """A DK_Mem: a raw allocation, or one from the stream-ordered pool
        when ``stream`` is given."""
        pointer = self._malloc(size, stream)
        with self.lock:
            self.mems[pointer] = size
        return ffi.cast("DK_Mem", pointer)

    def _unregister(self, handle) -> int:
        pointer = handle_key(handle)
        with self.lock:
            if self.mems.pop(pointer, None) is None:
                raise invalid(f"handle {pointer:#x} is not a live allocation on {self.name}")
        return pointer

    def free(self, handle) -> None:
        self._free(self._unregister(handle), None)

    def free_async(self, handle, stream: int) -> None:
        self._free(self._unregister(handle), stream)

    def malloc_internal(self, nbytes: int, stream: int | None = None) -> int:
        """Device memory the plugin itself uses (no DK_Mem), counted by
        mem_info; freed by ``free_internal``."""
        pointer = self._malloc(nbytes, stream)
        with self.lock:
            self.internal[pointer] = int(nbytes)
        return pointer

    def free_internal(self, pointer: int, stream: int | None = None) -> None:
        with self.lock:
            del self.internal[pointer]
        self._free(pointer, stream)

    def mem_info(self) -> tuple[int, int]:
        """(free, total): the free memory when the plugin opened the device,
        less what this process holds through the plugin now. A GPU is shared
        with other processes and CUDA's own lazily made state (modules,
        cuBLAS workspaces, the pools' reserve), none of which a DK_Mem
        owns: counting only the plugin's allocations makes "memory returns
        to its baseline" exact for each process."""
        with self.context():
            total = self.runtime.memGetInfo()[1]
        with self.lock:
            held = sum(self.mems.values()) + sum(self.internal.values())
        return max(self.free_at_open - held, 0), total

    def host_alloc(self, size: int) -> int:
        with self.context():
            pointer = self.runtime.hostAlloc(max(size, 1), CUDA_HOST_ALLOC_PORTABLE)
        with self.lock:
            self.hosts.add(pointer)
        return pointer

    def host_free(self, pointer: int) -> None:
        with self.lock:
            if pointer not in self.hosts:
                raise invalid(f"{pointer:#x} is not pinned host memory of {self.name}")
            self.hosts.discard(pointer)
        self.runtime.freeHost(pointer)

    def copy(self, dst: int, src: int, size: int, stream: int | None, native: bool = True, handles=()) -> None:
        """Any direction (unified addressing tells them apart); from or to
        pageable host memory CUDA stages the copy, which keeps the ABI's rule
        that the host buffer may be reused once the call (NULL stream) or the
        stream's work has completed."""
        if size:
            self.submit(stream, lambda s: self.runtime.memcpyAsync(dst, src, size, CUDA_MEMCPY_DEFAULT, s),
                        native, handles)

    def enable_peer(self, src: Device) -> None:
        """Direct access to ``src``'s memory where the devices allow it; copies
        between devices that do not are staged by the driver."""
        if src.index == self.index or src.index in self.peers:
            return
        if self.runtime.deviceCanAccessPeer(self.index, src.index):
            with self.context():
                try:
                    self.runtime.deviceEnablePeerAccess(src.index)
                except self.runtime.CUDARuntimeError as exc:
                    if "PeerAccessAlreadyEnabled" not in str(exc):
                        raise
        self.peers.add(src.index)


def create_devices() -> list[Device]:
    return [Device(i) for i in range(cuda().cuda.runtime.getDeviceCount())]
