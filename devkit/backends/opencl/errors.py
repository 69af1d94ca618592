"""pyopencl's errors as statuses: what the table's C-boundary wrapper
(support.table.DeviceTable.callback) and a stream's worker report."""

from __future__ import annotations

import pyopencl as cl

from ...abi import C

# OpenCL codes that mean "the device (or host) has no memory for this".
_OOM_CODES = {cl.status_code.MEM_OBJECT_ALLOCATION_FAILURE, cl.status_code.OUT_OF_RESOURCES,
              cl.status_code.OUT_OF_HOST_MEMORY}


def status_of_cl_error(exc: cl.Error) -> int:
    code = getattr(exc, "code", None)
    if isinstance(exc, cl.MemoryError) or code in _OOM_CODES:
        return C.DK_RESOURCE_EXHAUSTED
    return C.DK_INTERNAL


def backend_error(exc: Exception) -> tuple[int, str]:
    if isinstance(exc, cl.Error):
        return status_of_cl_error(exc), f"OpenCL error: {exc}"
    return C.DK_INTERNAL, f"internal error: {type(exc).__name__}: {exc}"  # a plugin bug: reported, never raised
