"""Exceptions raised for plugin statuses and loading failures.

Every exception carries the status code and the plugin's own message, and
pickles (the conformance runner moves them across processes).
"""

from __future__ import annotations

from .abi import C


class DevkitError(Exception):
    """Base of every devkit exception."""


class PluginLoadError(DevkitError):
    """A plugin could not be found, opened, initialised or accepted."""


class DeviceError(DevkitError):
    """A plugin call returned a non-OK status."""

    status: int = C.DK_UNKNOWN

    def __init__(self, message: str, status: int | None = None):
        super().__init__(message)
        self.message = message
        if status is not None:
            self.status = status

    def __reduce__(self):
        return (type(self), (self.message, self.status))

    def __str__(self) -> str:
        return f"[{STATUS_NAMES.get(self.status, self.status)}] {self.message}"


class InvalidArgumentError(DeviceError, ValueError):
    status = C.DK_INVALID_ARGUMENT


class OutOfRangeError(DeviceError, IndexError):
    status = C.DK_OUT_OF_RANGE


class OutOfMemoryError(DeviceError, MemoryError):
    status = C.DK_RESOURCE_EXHAUSTED


class NotFoundError(DeviceError, LookupError):
    status = C.DK_NOT_FOUND


class FailedPreconditionError(DeviceError):
    status = C.DK_FAILED_PRECONDITION


class UnimplementedError(DeviceError, NotImplementedError):
    status = C.DK_UNIMPLEMENTED


class DeadlineExceededError(DeviceError, TimeoutError):
    status = C.DK_DEADLINE_EXCEEDED


class UnavailableError(DeviceError):
    status = C.DK_UNAVAILABLE


class AbortedError(DeviceError):
    """A communicator (or other object) failed earlier and refuses further work."""

    status = C.DK_ABORTED


class InternalError(DeviceError):
    status = C.DK_INTERNAL


class DeviceLostError(DeviceError):
    status = C.DK_DEVICE_LOST


class NotReadyError(DeviceError):
    """Raised where a result was asked for before the work producing it completed."""

    status = C.DK_NOT_READY


STATUS_NAMES: dict[int, str] = {
    getattr(C, name): name[len("DK_"):]
    for name in (
        "DK_OK", "DK_CANCELLED", "DK_UNKNOWN", "DK_INVALID_ARGUMENT",
        "DK_DEADLINE_EXCEEDED", "DK_NOT_FOUND", "DK_ALREADY_EXISTS",
        "DK_PERMISSION_DENIED", "DK_RESOURCE_EXHAUSTED", "DK_FAILED_PRECONDITION",
        "DK_ABORTED", "DK_OUT_OF_RANGE", "DK_UNIMPLEMENTED", "DK_INTERNAL",
        "DK_UNAVAILABLE", "DK_DATA_LOSS", "DK_UNAUTHENTICATED", "DK_DEVICE_LOST",
        "DK_NOT_READY",
    )
}

_EXCEPTION_FOR_STATUS: dict[int, type[DeviceError]] = {
    cls.status: cls
    for cls in (
        InvalidArgumentError, OutOfRangeError, OutOfMemoryError, NotFoundError,
        FailedPreconditionError, UnimplementedError, DeadlineExceededError,
        UnavailableError, AbortedError, InternalError, DeviceLostError, NotReadyError,
    )
}


def error_for_status(status: int, message: str) -> DeviceError:
    """The exception instance that represents ``status`` with ``message``."""
    cls = _EXCEPTION_FOR_STATUS.get(status, DeviceError)
    return cls(message, status)
