"""devkit: one C ABI for device plugins, and the runtime that drives them.

Layers, each importing only itself and those below (tests/test_layering.py
checks it; README.md, "Layers"):

1. abi, errors, dtypes, _version, openblas
2. driver: Device, Stream, Event, Buffer
3. plugin: finding and loading plugins (built-ins through a table: the host
   core imports no backend)
4. runtime (Array, device specs), creation
5. engine.calls, engine.launch, engine.memory: prebuilt kernel calls
6. ops (specs, resolution, dispatch), operators
7. engine: graph capture, plans, fusion, codegen, the interpreter
8. this package's public names (this module)
9. backends: the reference plugins, loaded by name
10. frameworks and tools: onnx, torch, paddle, distributed, bench,
    conformance_cli, cli, new_plugin, ops.reference_doc
"""

from ._version import __version__  # noqa: F401
from .abi import ABI_MAJOR, ABI_MINOR, ffi  # noqa: E402
from .errors import (  # noqa: E402
    AbortedError, DeadlineExceededError, DevkitError, DeviceError, DeviceLostError, FailedPreconditionError,
    InternalError, InvalidArgumentError, NotFoundError, NotReadyError, OutOfMemoryError, OutOfRangeError,
    PluginLoadError, UnavailableError, UnimplementedError,
)
from .plugin import Plugin, PluginDescriptor, check, list_plugins, load_plugin  # noqa: E402
from .runtime import (  # noqa: E402
    DEFAULT_DEVICE, Array, Buffer, Device, DeviceProperties, Event, Stream, asarray, device, empty,
    empty_cache, memory_stats, set_allocator, zeros,
)
from .creation import arange, empty_like, full, full_like, ones, ones_like, zeros_like  # noqa: E402
from . import ops  # noqa: E402
from .ops import fallback_report, run_op  # noqa: E402
from .operators import astype, result_type  # noqa: E402  (importing it gives Array its operators)
from .engine import graph as _graph  # noqa: E402,F401  (importing it gives Stream its capture())

__all__ = [
    "ABI_MAJOR", "ABI_MINOR", "DEFAULT_DEVICE", "arange", "astype", "empty_like", "full", "full_like", "ones",
    "ones_like", "result_type", "zeros_like", "AbortedError", "Array", "Buffer", "DeadlineExceededError", "Device",
    "DeviceError", "DeviceLostError", "DeviceProperties", "DevkitError", "Event",
    "FailedPreconditionError", "InternalError", "InvalidArgumentError", "NotFoundError", "NotReadyError",
    "OutOfMemoryError", "OutOfRangeError", "Plugin", "PluginDescriptor", "PluginLoadError",
    "Stream", "UnavailableError", "UnimplementedError", "asarray", "check", "device", "empty",
    "empty_cache", "fallback_report", "ffi", "list_plugins", "load_plugin", "memory_stats", "ops", "run_op",
    "set_allocator", "zeros",
]
