"""NumPy dtypes <-> DLPack (code, bits) pairs and the packed DK_DTypeKey."""

from __future__ import annotations

import numpy as np

from .abi import C

try:  # bfloat16 has no NumPy dtype of its own; ml_dtypes provides the standard one.
    import ml_dtypes

    bfloat16 = np.dtype(ml_dtypes.bfloat16)
except ImportError:  # pragma: no cover - ml_dtypes is a dependency
    bfloat16 = None

_CODES = {"b": C.DK_DTYPE_CODE_BOOL, "i": C.DK_DTYPE_CODE_INT,
          "u": C.DK_DTYPE_CODE_UINT, "f": C.DK_DTYPE_CODE_FLOAT}

SUPPORTED = tuple(np.dtype(name) for name in (
    "bool", "int8", "int16", "int32", "int64", "uint8", "uint16", "uint32", "uint64",
    "float16", "float32", "float64")) + ((bfloat16,) if bfloat16 is not None else ())


def normalize(dtype) -> np.dtype:
    """The NumPy dtype for ``dtype``, refusing types no device ABI carries."""
    result = np.dtype(dtype)
    if result not in SUPPORTED:
        supported = ", ".join(str(d) for d in SUPPORTED)
        raise TypeError(f"dtype {result} is not supported by devkit arrays (supported: {supported})")
    return result


def code_bits(dtype) -> tuple[int, int]:
    """DLPack (type code, bits) of a supported dtype."""
    dtype = normalize(dtype)
    if bfloat16 is not None and dtype == bfloat16:
        return C.DK_DTYPE_CODE_BFLOAT, 16
    return _CODES[dtype.kind], dtype.itemsize * 8


def dtype_key(dtype) -> int:
    """The packed DK_DTypeKey: code | bits << 8 | lanes << 16."""
    code, bits = code_bits(dtype)
    return code | bits << 8 | 1 << 16
