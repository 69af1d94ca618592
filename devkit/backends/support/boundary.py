"""What every built-in plugin written in Python (opencl, cuda) shares at the
C boundary: statuses raised as exceptions inside the plugin, the thread-local
message of last_error_message, structs copied out as far as the caller's
struct_size reaches, and DK_PluginInit with the table it hands out."""

from __future__ import annotations

import functools
import threading
from collections.abc import Callable

from ...abi import ABI_MAJOR, ABI_MINOR, C, ffi, field_end

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


def handle_key(handle) -> int:
    """A handle's value: the key of the plugin's registry of its kind."""
    return int(ffi.cast("uintptr_t", handle))


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


class PluginInit:
    """DK_PluginInit of a Python plugin (``entry``, a DK_PluginInitFn) and the
    structs it hands out, which outlive every host reference (plugins are
    never unloaded).

    ``initialise()`` runs once, on the first DK_PluginInit: it opens the
    devices and calls ``publish`` with the table's functions and kernel
    entries, and returns (status, message); its result answers every later
    call too. ``on_host(host)`` reads the DK_HostInfo of each call;
    ``on_first()`` runs after the first successful initialisation.
    """

    def __init__(self, name: str, version: str, device_type: str, callback, initialise,
                 on_host=None, on_first=None):
        self.callback, self.initialise = callback, initialise
        self.on_host, self.on_first = on_host, on_first
        self.last_error_fn = ffi.callback("DK_LastErrorFn", last_error_message)
        self._strings = {key: ffi.new("char[]", value.encode())
                         for key, value in (("name", name), ("version", version), ("device_type", device_type))}
        self._lock = threading.Lock()
        self._result: tuple[int, str] | None = None
        self._info = None
        self._keepalive: list = []
        self.entry = callback("DK_PluginInitFn", "DK_PluginInit", self._plugin_init)

    def publish(self, functions: dict, entries: list, keep=()) -> None:
        """The DK_PluginInfo every DK_PluginInit copies out: a table of
        ``functions`` (name -> Python function; absent ones stay NULL) and the
        DK_KernelEntry structs ``entries``; ``keep`` lives as long."""
        api = ffi.new("DK_DeviceApi *", {"struct_size": ffi.sizeof("DK_DeviceApi")})
        api_type = dict(ffi.typeof("DK_DeviceApi").fields)
        for name, fn in functions.items():
            pointer = self.callback(api_type[name].type, name, fn)
            self._keepalive.append(pointer)
            setattr(api, name, pointer)
        pointers = ffi.new("DK_KernelEntry *[]", [ffi.addressof(e) for e in entries] or 1)
        self._info = ffi.new("DK_PluginInfo *", {
            "struct_size": ffi.sizeof("DK_PluginInfo"), "abi_major": ABI_MAJOR, "abi_minor": ABI_MINOR,
            "last_error_message": self.last_error_fn, "name": self._strings["name"],
            "version": self._strings["version"], "device_type": self._strings["device_type"], "api": api,
            "kernels": pointers, "num_kernels": len(entries),
        })
        self._keepalive.extend([api, pointers, *keep])

    def _plugin_init(self, host, out):
        if out == ffi.NULL:
            return set_error(C.DK_INVALID_ARGUMENT, "DK_PluginInit: out is NULL")
        if out.struct_size >= field_end("DK_PluginInfo", "last_error_message"):
            out.last_error_message = self.last_error_fn
        if out.struct_size < field_end("DK_PluginInfo", "api"):
            return set_error(C.DK_INVALID_ARGUMENT,
                             f"DK_PluginInit: out->struct_size {out.struct_size} cannot hold 'api' "
                             f"(needs {field_end('DK_PluginInfo', 'api')})")
        if self.on_host is not None:
            self.on_host(host)
        with self._lock:
            first = self._result is None
            if first:
                self._result = self.initialise()
        status, message = self._result
        if status != C.DK_OK:
            return set_error(status, message)
        if first and self.on_first is not None:
            self.on_first()
        copy_out(out, self._info, "DK_PluginInfo")
        return C.DK_OK
