"""The plugin's error model: statuses raised as exceptions inside the plugin,
turned into a DK_Status and a thread-local message at the C boundary."""

from __future__ import annotations

import functools

import pyopencl as cl

from ...abi import C, ffi
from ..python_plugin import PluginError, invalid, last_error_message, set_error

__all__ = ["PluginError", "invalid", "last_error_message", "set_error", "callback", "entry",
           "status_of_cl_error"]

# OpenCL codes that mean "the device (or host) has no memory for this".
_OOM_CODES = {cl.status_code.MEM_OBJECT_ALLOCATION_FAILURE, cl.status_code.OUT_OF_RESOURCES,
              cl.status_code.OUT_OF_HOST_MEMORY}


def status_of_cl_error(exc: cl.Error) -> int:
    code = getattr(exc, "code", None)
    if isinstance(exc, cl.MemoryError) or code in _OOM_CODES:
        return C.DK_RESOURCE_EXHAUSTED
    return C.DK_INTERNAL


def entry(name: str):
    """Wraps a table function: every exception becomes a status and a message,
    so nothing propagates into the C caller."""

    def wrap(fn):
        @functools.wraps(fn)
        def call(*args):
            try:
                status = fn(*args)
                return C.DK_OK if status is None else status
            except PluginError as exc:
                return set_error(exc.status, f"{name}: {exc.message}")
            except cl.Error as exc:
                return set_error(status_of_cl_error(exc), f"{name}: OpenCL error: {exc}")
            except MemoryError as exc:
                return set_error(C.DK_RESOURCE_EXHAUSTED, f"{name}: host out of memory: {exc}")
            except Exception as exc:  # a plugin bug: reported, never raised into C
                return set_error(C.DK_INTERNAL, f"{name}: internal error: {type(exc).__name__}: {exc}")
        return call

    return wrap


def callback(ctype: str, name: str, fn):
    """An ffi.callback of ``ctype`` running ``entry(name)(fn)``; a BaseException
    escaping even that (KeyboardInterrupt) still yields DK_INTERNAL."""

    def on_error(exc_type, exc, _tb):
        set_error(C.DK_INTERNAL, f"{name}: interrupted: {exc_type.__name__}: {exc}")

    return ffi.callback(ctype, entry(name)(fn), error=C.DK_INTERNAL, onerror=on_error)
