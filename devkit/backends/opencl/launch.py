"""The opencl dialect of the kernel layer (devkit/backends/kernels/layer.py): programs built by
pyopencl, launched on the plugin's streams.

Programs are built once per (device, source, options) and kept in memory. On
disk, a second process finds them in one of two caches, both keyed by source,
options and device: where the driver caches source builds itself (PoCL, under
$XDG_CACHE_HOME/pocl; NVIDIA), in the driver's; elsewhere in pyopencl's binary
cache, kept under $XDG_CACHE_HOME/devkit/opencl (default ~/.cache/devkit/opencl).
Asking PoCL for a program's binary would compile every kernel in it, which its
own cache makes needless (pyopencl.characterize.has_src_build_cache).
"""

from __future__ import annotations

import os
import threading
from pathlib import Path

import numpy as np
import pyopencl as cl

from ..kernels.layer import Call, Local, Tensor
from .graph import KernelStep
from .runtime import Device


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


class _QueueReader:
    """What a stream-order check reads and writes device buffers with: blocking copies on its queue."""

    def __init__(self, queue: cl.CommandQueue):
        self.queue = queue

    def read(self, host: np.ndarray, buffer: cl.Buffer, byte_offset: int = 0) -> None:
        cl.enqueue_copy(self.queue, host, buffer, src_offset=byte_offset)

    def write(self, buffer: cl.Buffer, host: np.ndarray) -> None:
        cl.enqueue_copy(self.queue, buffer, host)


class OpenCLCall(Call):
    """A kernel call on the opencl plugin (see layer.Call)."""

    def run(self, call, run) -> None:
        if self.stream is not None and self.stream.capture is not None:  # graph.py
            self.stream.capture.add_kernel(call, lambda copy: run(OpenCLCall(self.op, copy, self.device_of)))
        else:
            run(self)

    def buffer(self, values, dtype=np.int64, writable: bool = False) -> cl.Buffer:
        """A device copy of small host data (shapes, strides, indices; read-only
        unless ``writable``); never empty."""
        array = np.ascontiguousarray(values, dtype=dtype)
        if array.size == 0:
            array = np.zeros(1, dtype)
        access = cl.mem_flags.READ_WRITE if writable else cl.mem_flags.READ_ONLY
        return cl.Buffer(self.device.context, access | cl.mem_flags.COPY_HOST_PTR, hostbuf=array)

    def zeros(self, count: int, dtype=np.int32) -> cl.Buffer:
        host = np.zeros(count, dtype)
        buffer = self.buffer(host, dtype, writable=True)
        if self.stream is not None and self.stream.capture is not None:
            self.stream.capture.zero_before_launch(buffer, host.nbytes)
        return buffer

    def scratch(self, nbytes: int) -> cl.Buffer:
        return cl.Buffer(self.device.context, cl.mem_flags.READ_WRITE, max(int(nbytes), 1))

    def check_in_stream_order(self, check) -> None:
        """Queues ``check`` behind the work enqueued so far (blocking copies on
        the stream's queue). The call itself never waits: a stream keeps the
        error for its next synchronization; on the NULL stream, where the
        kernels have already run, it is raised here."""
        stream = self.stream
        # A graph's check fails whichever stream replays it: raised there.
        recorded = stream is not None and stream.capture is not None

        def run(queue: cl.CommandQueue) -> None:
            error = check(_QueueReader(queue))
            if error is None:
                return
            if stream is None or recorded:
                raise error
            stream.fail(error)

        self.device.copy_host(stream, run)

    def launch(self, source: str, name: str, args: list, global_size, local_size=None,
               options: str = "") -> None:
        """Builds (cached) and enqueues kernel ``name`` of ``source`` in stream order."""
        global_size = tuple(int(n) for n in np.atleast_1d(global_size))
        local = None if local_size is None else tuple(int(n) for n in np.atleast_1d(local_size))
        buffers = [a.buffer if isinstance(a, Tensor) else cl.LocalMemory(a.nbytes) if isinstance(a, Local) else a
                   for a in args]
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
