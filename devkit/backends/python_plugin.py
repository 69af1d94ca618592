"""What every built-in plugin written in Python (opencl, cuda) shares at the
C boundary: statuses raised as exceptions inside the plugin, the thread-local
message of last_error_message, and structs copied out as far as the
caller's struct_size reaches."""

from __future__ import annotations

import functools
import threading
from collections.abc import Callable

from ..abi import C, ffi

_tls = threading.local()


class PluginError(Exception):
    """A failure with the status a plugin function returns for it."""

    def __init__(self, status: int, message: str):
        super().__init__(message)
        self.status = status
        self.message = message


def invalid(message: str) -> PluginError:
    return PluginError(C.DK_INVALID_ARGUMENT, message)


def set_error(status: int, message: str) -> int:
    # Kept alive until the next failure on this thread, as last_error_message promises.
    _tls.message = ffi.new("char[]", message.encode("utf-8", errors="replace"))
    return status


def last_error_message():
    message = getattr(_tls, "message", None)
    if message is None:
        message = _tls.message = ffi.new("char[]", b"no error")
    return message


def not_null(pointer, what: str) -> None:
    if pointer == ffi.NULL:
        raise invalid(f"{what} is NULL")


def copy_out(dst, src, ctype: str) -> None:
    """VERSIONING rule 4: write only what the caller's struct_size holds."""
    size_field = ffi.sizeof("size_t")
    if dst.struct_size < size_field:
        raise invalid(f"struct_size {dst.struct_size} is smaller than the struct_size field itself")
    n = min(dst.struct_size, ffi.sizeof(ctype))
    ffi.memmove(ffi.cast("char *", dst) + size_field, ffi.cast("char *", src) + size_field,
                n - size_field)
    dst.struct_size = n


def entry(name: str, fn, backend_error: Callable[[Exception], tuple[int, str | None]]):
    """Wraps a table function: every exception becomes a status and a message,
    so nothing propagates into the C caller. ``backend_error`` maps any other
    exception than PluginError and MemoryError to (status, message); a None
    message returns the status without setting one."""

    @functools.wraps(fn)
    def call(*args):
        try:
            status = fn(*args)
            return C.DK_OK if status is None else status
        except PluginError as exc:
            return set_error(exc.status, f"{name}: {exc.message}")
        except MemoryError as exc:
            return set_error(C.DK_RESOURCE_EXHAUSTED, f"{name}: host out of memory: {exc}")
        except Exception as exc:
            status, message = backend_error(exc)
            return status if message is None else set_error(status, f"{name}: {message}")
    return call


def callback(ctype: str, name: str, fn, backend_error: Callable[[Exception], tuple[int, str | None]]):
    """An ffi.callback of ``ctype`` running ``entry(name, fn, backend_error)``;
    a BaseException escaping even that (KeyboardInterrupt) still yields DK_INTERNAL."""

    def on_error(exc_type, exc, _tb):
        set_error(C.DK_INTERNAL, f"{name}: interrupted: {exc_type.__name__}: {exc}")

    return ffi.callback(ctype, entry(name, fn, backend_error), error=C.DK_INTERNAL, onerror=on_error)
