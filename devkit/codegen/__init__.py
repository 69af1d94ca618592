"""Runtime code generation through the ABI's codegen section (ABI 1.2).

``compile_module(device, source, options)`` compiles a source in the
device's dialect (``dialect(device)``: "c", "opencl-c" or "cuda-c", None
without the section) into a Module, once per process for each (plugin,
device, source, options); the plugins cache compiled modules on disk by
source hash too (``cache_dir``). ``Module.function(name, kinds)`` looks a
function up, ``Function.launch`` launches it. Expression rules (rules.py)
and dialect printers (printers.py) write fused kernels (render.py) for the
engine's fusion pass (devkit.engine.fusion). See docs/fusion.md.
"""

from __future__ import annotations

import hashlib
import os
import threading
from pathlib import Path

from ..abi import C, ffi
from ..engine.calls import _fill_tensor
from .printers import PRINTERS, Printer, printer
from .render import Group, GroupOp, Kernel, TensorArg, render
from .rules import REDUCTIONS, RULES

__all__ = ["ARG_KINDS", "Function", "Group", "GroupOp", "Kernel", "Module", "PRINTERS", "Printer", "REDUCTIONS",
           "RULES", "TensorArg", "cache_dir", "cache_root", "compile_module", "dialect", "printer", "render"]

ARG_KINDS = {"tensor": C.DK_ARG_TENSOR, "int64": C.DK_ARG_INT64, "float32": C.DK_ARG_FLOAT32,
             "float64": C.DK_ARG_FLOAT64}
ARG_STRUCT_SIZE = ffi.sizeof("DK_LaunchArg")
SHAPE_STRUCT_SIZE = ffi.sizeof("DK_LaunchShape")


def cache_root() -> Path:
    """devkit's on-disk cache: $DEVKIT_CACHE_DIR, else $XDG_CACHE_HOME/devkit, else ~/.cache/devkit."""
    root = os.environ.get("DEVKIT_CACHE_DIR")
    if not root:
        root = os.path.join(os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "devkit")
    return Path(root)


def cache_dir(plugin_name: str) -> Path:
    """Where devkit's plugins keep compiled modules: codegen/<plugin> under ``cache_root()``."""
    return cache_root() / "codegen" / plugin_name


def dialect(device) -> str | None:
    """The device's source dialect, or None when its plugin has no codegen section."""
    if not device.plugin.has_codegen:
        return None
    out = ffi.new("const char **")
    device.call("codegen_dialect", device.index, out)
    return ffi.string(out[0]).decode()


class Function:
    """A function of a Module, declared with its argument kinds."""

    def __init__(self, module: Module, name: str, kinds: list[str]):
        self.module, self.name, self.kinds = module, name, list(kinds)
        codes = ffi.new("int32_t[]", [ARG_KINDS[k] for k in kinds] or [0])
        out = ffi.new("DK_Function *")
        device = module.device
        device.call("codegen_get_function", device.index, module.handle, name.encode(), codes, len(kinds), out)
        self.handle = out[0]

    def launch(self, args: list, global_size, local_size=(), stream=None) -> None:
        """Launch over ``global_size`` (1 to 3 dims) with ``args``: devkit
        Arrays for tensors, ints and floats for scalars, as declared."""
        keep: list = []
        arguments = launch_args(list(zip(self.kinds, args)), keep)
        device = self.module.device
        device.call("codegen_launch", device.index, self.handle, arguments, len(args),
                    launch_shape(global_size, local_size), stream.handle if stream is not None else ffi.NULL)


def launch_args(values: list[tuple[str, object]], keep: list):
    """A DK_LaunchArg array of (kind, value) pairs; tensors are Arrays."""
    arguments = ffi.new("DK_LaunchArg[]", max(len(values), 1))
    for slot, (kind, value) in zip(arguments, values):
        slot.struct_size = ARG_STRUCT_SIZE
        slot.kind = ARG_KINDS[kind]
        if kind == "tensor":
            _fill_tensor(slot.tensor, value, keep)
        elif kind == "int64":
            slot.i = int(value)
        else:
            slot.f = float(value)
    return arguments


def launch_shape(global_size, local_size=()):
    shape = ffi.new("DK_LaunchShape *")
    shape.struct_size = SHAPE_STRUCT_SIZE
    shape.ndim = len(global_size)
    extent = getattr(shape, "global")  # a C keyword only in Python's eyes
    for d, n in enumerate(global_size[:3]):
        extent[d] = n
    for d, n in enumerate(local_size[:3]):
        shape.local[d] = n
    return shape


class Module:
    """A compiled source; unloaded when collected."""

    def __init__(self, device, source: str, options: str = ""):
        self.device, self.source, self.options = device, source, options
        out = ffi.new("DK_Module *")
        cached = ffi.new("int32_t *")
        device.call("codegen_compile", device.index, source.encode(), options.encode(), out, cached)
        self.handle = out[0]
        self.from_cache = bool(cached[0])  # loaded from the plugin's disk cache
        self._functions: dict[tuple, Function] = {}

    def function(self, name: str, kinds: list[str]) -> Function:
        key = (name, tuple(kinds))
        if key not in self._functions:
            self._functions[key] = Function(self, name, kinds)
        return self._functions[key]

    def __del__(self):
        handle = getattr(self, "handle", None)
        if handle is not None:
            self.device.plugin.api.codegen_unload(self.device.index, handle)


_modules: dict[tuple, Module] = {}
_modules_lock = threading.Lock()


def compile_module(device, source: str, options: str = "") -> Module:
    """The module of ``source`` on ``device``, compiled once per process. A
    source that does not compile raises the plugin's InvalidArgumentError,
    whose message carries the compiler's log."""
    key = (id(device.plugin), device.index, hashlib.sha256(source.encode()).hexdigest(), options)
    with _modules_lock:
        module = _modules.get(key)
        if module is None:
            module = _modules[key] = Module(device, source, options)
        return module
