"""The plugin's error model: statuses raised as exceptions inside the plugin,
turned into a DK_Status and a thread-local message at the C boundary."""

from __future__ import annotations

import pyopencl as cl

from ...abi import C
from ..support import boundary
from ..support.boundary import PluginError, invalid, last_error_message, set_error

__all__ = ["PluginError", "invalid", "last_error_message", "set_error", "callback",
           "status_of_cl_error"]

# OpenCL codes that mean "the device (or host) has no memory for this".
_OOM_CODES = {cl.status_code.MEM_OBJECT_ALLOCATION_FAILURE, cl.status_code.OUT_OF_RESOURCES,
              cl.status_code.OUT_OF_HOST_MEMORY}


def status_of_cl_error(exc: cl.Error) -> int:
    code = getattr(exc, "code", None)
    if isinstance(exc, cl.MemoryError) or code in _OOM_CODES:
        return C.DK_RESOURCE_EXHAUSTED
    return C.DK_INTERNAL


def _backend_error(exc: Exception) -> tuple[int, str]:
    if isinstance(exc, cl.Error):
        return status_of_cl_error(exc), f"OpenCL error: {exc}"
    return C.DK_INTERNAL, f"internal error: {type(exc).__name__}: {exc}"  # a plugin bug: reported, never raised


def callback(ctype: str, name: str, fn):
    """The shared C-boundary wrapper (boundary.callback) with OpenCL's errors mapped."""
    return boundary.callback(ctype, name, fn, _backend_error)
