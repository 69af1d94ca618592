"""The codegen section (ABI 1.2) of the opencl plugin: dialect "opencl-c".

Sources are built with pyopencl; built programs are cached on disk as
program binaries under devkit.codegen.cache_dir("opencl"), keyed by a hash
of the source, the options and the device. A tensor argument is two kernel
parameters: its buffer and its byte offset (ulong); scalars are long, float
or double. Launches go through the stream like the kernels' (so a capturing
stream records them).
"""

from __future__ import annotations

import hashlib
import threading

import numpy as np
import pyopencl as cl

from ...abi import C, ffi
from ...codegen import cache_dir
from ..kernels.layer import Tensor
from ..support.boundary import PluginError, handle_key, invalid
from .runtime import Device, _new_handle

_SCALARS = {C.DK_ARG_INT64: np.int64, C.DK_ARG_FLOAT32: np.float32, C.DK_ARG_FLOAT64: np.float64}
_lock = threading.Lock()
_modules: dict[int, tuple] = {}    # handle key -> (device index, cl.Program, [function keys])
_functions: dict[int, tuple] = {}  # handle key -> (module key, cl.Kernel, kinds, its lock)


_DIALECT = ffi.new("char[]", b"opencl-c")


def dialect(d: Device, out) -> None:
    if out == ffi.NULL:
        raise invalid("dialect is NULL")
    out[0] = _DIALECT


def _build(d: Device, source: str, options: str) -> tuple[cl.Program, bool]:
    digest = hashlib.sha256("\0".join([source, options, d.cl_device.name, d.cl_device.driver_version,
                                       d.cl_device.platform.version]).encode()).hexdigest()[:32]
    path = cache_dir("opencl") / f"{digest}.bin"
    if path.exists():
        try:
            program = cl.Program(d.context, [d.cl_device], [path.read_bytes()]).build(options)
            return program, True
        except cl.Error:
            pass  # a stale or foreign binary: built from source below
    try:
        program = cl.Program(d.context, source).build(options, devices=[d.cl_device])
    except cl.Error as exc:
        raise PluginError(C.DK_INVALID_ARGUMENT, f"the source does not compile:\n{exc}") from None
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        temporary = path.with_suffix(f".{threading.get_ident()}.tmp")
        temporary.write_bytes(program.binaries[0])
        temporary.replace(path)  # atomic: a concurrent reader sees a whole binary or none
    except OSError:
        pass  # no cache to write: the module still works
    return program, False


def compile(d: Device, source, options, module, from_cache) -> None:
    if source == ffi.NULL or module == ffi.NULL:
        raise invalid(f"{'source' if source == ffi.NULL else 'module'} is NULL")
    text = ffi.string(source).decode()
    flags = ffi.string(options).decode() if options != ffi.NULL else ""
    program, hit = _build(d, text, flags)
    key, handle = _new_handle("DK_Module")
    with _lock:
        _modules[key] = (d.index, program, [])
    module[0] = handle
    if from_cache != ffi.NULL:
        from_cache[0] = int(hit)


def get_function(d: Device, module, name, arg_kinds, num_args, function) -> None:
    if name == ffi.NULL or function == ffi.NULL or (num_args and arg_kinds == ffi.NULL):
        raise invalid(f"{'name' if name == ffi.NULL else 'function' if function == ffi.NULL else 'arg_kinds'} is NULL")
    kinds = [int(arg_kinds[k]) for k in range(num_args)]
    for k, kind in enumerate(kinds):
        if kind != C.DK_ARG_TENSOR and kind not in _SCALARS:
            raise invalid(f"argument {k} has unknown kind {kind}")
    with _lock:
        found = _modules.get(handle_key(module)) if module != ffi.NULL else None
    if found is None or found[0] != d.index:
        raise invalid(f"module {handle_key(module):#x} is not a live module on {d.name}")
    text = ffi.string(name).decode()
    try:
        kernel = cl.Kernel(found[1], text)
    except cl.Error:
        raise PluginError(C.DK_NOT_FOUND, f"the module has no function '{text}'") from None
    parameters = sum(2 if kind == C.DK_ARG_TENSOR else 1 for kind in kinds)
    if kernel.num_args != parameters:
        raise invalid(f"'{text}' has {kernel.num_args} parameters; the declared arguments make {parameters} "
                      f"(a tensor is a buffer and a byte offset)")
    key, handle = _new_handle("DK_Function")
    with _lock:
        _functions[key] = (handle_key(module), kernel, kinds, threading.Lock())
        found[2].append(key)
    function[0] = handle


def launch(d: Device, function, args, num_args, shape, stream) -> None:
    if shape == ffi.NULL or (num_args and args == ffi.NULL):
        raise invalid(f"{'shape' if shape == ffi.NULL else 'args'} is NULL")
    if shape.struct_size < ffi.sizeof("DK_LaunchShape"):
        raise invalid(f"shape->struct_size {shape.struct_size} is short (needs {ffi.sizeof('DK_LaunchShape')})")
    ndim = int(shape.ndim)
    if not 1 <= ndim <= 3:
        raise invalid(f"shape->ndim is {ndim}; it must be 1, 2 or 3")
    extent = getattr(shape, "global")
    global_size = tuple(int(extent[k]) for k in range(ndim))
    local = tuple(int(shape.local[k]) for k in range(ndim))
    if any(local) and not all(n and g % n == 0 for n, g in zip(local, global_size)):
        raise invalid(f"shape->local {local} does not divide shape->global {global_size}")
    with _lock:
        found = _functions.get(handle_key(function)) if function != ffi.NULL else None
    if found is None or _modules.get(found[0], (None,))[0] != d.index:
        raise invalid(f"function {handle_key(function):#x} is not a live function on {d.name}")
    _, kernel, kinds, kernel_lock = found
    if num_args != len(kinds):
        raise invalid(f"{num_args} arguments given; the function takes {len(kinds)}")
    values, held = [], []
    for k in range(num_args):
        arg = args[k]
        if arg.kind != kinds[k]:
            raise invalid(f"argument {k} has kind {arg.kind}; the function declared {kinds[k]}")
        if arg.kind == C.DK_ARG_TENSOR:
            if arg.tensor.data == ffi.NULL:
                raise invalid(f"tensor argument {k} has a NULL data handle")
            tensor = Tensor(d, f"argument {k}", arg.tensor)
            values += [tensor.buffer, np.uint64(arg.tensor.byte_offset)]
            held.append(tensor)
        else:
            values.append(_SCALARS[arg.kind](arg.i if arg.kind == C.DK_ARG_INT64 else arg.f))
    if 0 in global_size:
        return
    s = d.stream(stream)
    local_size = local if any(local) else None
    if s is not None and s.capture is not None:
        # Recorded: every graph launch enqueues this kernel, whose arguments stay as set now.
        own = cl.Kernel(kernel.program, kernel.function_name)
        own.set_args(*values)
        d.submit(s, lambda q, kept=held: cl.enqueue_nd_range_kernel(q, own, global_size, local_size))
        return
    with kernel_lock:  # an enqueue takes the arguments as set
        kernel.set_args(*values)
        d.submit(s, lambda q: cl.enqueue_nd_range_kernel(q, kernel, global_size, local_size))


def unload(d: Device, module) -> None:
    if module == ffi.NULL:
        return
    key = handle_key(module)
    with _lock:
        found = _modules.get(key)
        if found is None or found[0] != d.index:
            raise invalid(f"module {key:#x} is not a live module on {d.name}")
        # Enqueued and recorded work holds its own references to the program.
        del _modules[key]
        for function_key in found[2]:
            _functions.pop(function_key, None)
