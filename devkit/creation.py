"""The array API's creation functions beyond runtime's empty, zeros and asarray.

Each takes ``dtype=`` and ``device=`` keywords (None: the default dtype and
devkit.runtime.DEFAULT_DEVICE). Values are made on the host with NumPy, which
the standard's semantics follow, and copied to the device once.
"""

from __future__ import annotations

import numpy as np

from .runtime import Array, Device, Stream, asarray, empty, zeros

_DEFAULT_FLOAT = np.dtype("float32")  # devkit's default floating dtype (empty's, zeros')


def _default_dtype(value) -> np.dtype:
    """bool, int64 or float32 for a Python fill value, as the array API infers it."""
    if isinstance(value, (bool, np.bool_)):
        return np.dtype(bool)
    if isinstance(value, (int, np.integer)):
        return np.dtype("int64")
    return _DEFAULT_FLOAT


def full(shape, fill_value, *, dtype=None, device: str | Device | None = None,
         stream: Stream | None = None) -> Array:
    """An array of ``shape`` holding ``fill_value`` (dtype inferred from it when None)."""
    dtype = _default_dtype(fill_value) if dtype is None else dtype
    return asarray(np.full(shape, fill_value, dtype), device, stream=stream)


def ones(shape, *, dtype=None, device: str | Device | None = None, stream: Stream | None = None) -> Array:
    return full(shape, 1, dtype=_DEFAULT_FLOAT if dtype is None else dtype, device=device, stream=stream)


def arange(start, /, stop=None, step=1, *, dtype=None, device: str | Device | None = None,
           stream: Stream | None = None) -> Array:
    """``numpy.arange``'s values; int64 for integer arguments, float32 otherwise, unless ``dtype``."""
    if dtype is None:
        dtype = _default_dtype(0) if all(isinstance(v, int) for v in (start, stop, step) if v is not None) \
            else _DEFAULT_FLOAT
    return asarray(np.arange(start, stop, step).astype(dtype), device, stream=stream)


def empty_like(x: Array, /, *, dtype=None, device: str | Device | None = None,
               stream: Stream | None = None) -> Array:
    """An uninitialised array of ``x``'s shape (and dtype and device unless given)."""
    return empty(x.shape, x.dtype if dtype is None else dtype, x.device if device is None else device, stream)


def zeros_like(x: Array, /, *, dtype=None, device: str | Device | None = None,
               stream: Stream | None = None) -> Array:
    return zeros(x.shape, x.dtype if dtype is None else dtype, x.device if device is None else device, stream)


def full_like(x: Array, /, fill_value, *, dtype=None, device: str | Device | None = None,
              stream: Stream | None = None) -> Array:
    return full(x.shape, fill_value, dtype=x.dtype if dtype is None else dtype,
                device=x.device if device is None else device, stream=stream)


def ones_like(x: Array, /, *, dtype=None, device: str | Device | None = None,
              stream: Stream | None = None) -> Array:
    return full_like(x, 1, dtype=dtype, device=device, stream=stream)
