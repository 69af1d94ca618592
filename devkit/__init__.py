"""devkit: one C ABI for device plugins, and the runtime that drives them."""

__version__ = "0.1.0"

from .abi import ABI_MAJOR, ABI_MINOR, ffi  # noqa: E402
from .errors import (  # noqa: E402
    AbortedError, DeadlineExceededError, DevkitError, DeviceError, DeviceLostError, FailedPreconditionError,
    InternalError, InvalidArgumentError, NotFoundError, NotReadyError, OutOfMemoryError, OutOfRangeError,
    PluginLoadError, UnavailableError, UnimplementedError,
)
from .plugin import Plugin, PluginDescriptor, check, list_plugins, load_plugin  # noqa: E402
from .runtime import (  # noqa: E402
    Array, Buffer, Device, DeviceProperties, Event, Stream, asarray, device, empty, empty_cache,
    memory_stats, set_allocator, zeros,
)
from . import ops  # noqa: E402
from .ops import fallback_report, run_op  # noqa: E402

__all__ = [
    "ABI_MAJOR", "ABI_MINOR", "AbortedError", "Array", "Buffer", "DeadlineExceededError", "Device",
    "DeviceError", "DeviceLostError", "DeviceProperties", "DevkitError", "Event",
    "FailedPreconditionError", "InternalError", "InvalidArgumentError", "NotFoundError", "NotReadyError",
    "OutOfMemoryError", "OutOfRangeError", "Plugin", "PluginDescriptor", "PluginLoadError",
    "Stream", "UnavailableError", "UnimplementedError", "asarray", "check", "device", "empty",
    "empty_cache", "fallback_report", "ffi", "list_plugins", "load_plugin", "memory_stats", "ops", "run_op",
    "set_allocator", "zeros",
]
