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


# ONNX's TensorProto.DataType codes of the dtypes above (onnx.proto: FLOAT = 1, ...).
ONNX_CODES = {1: "float32", 2: "uint8", 3: "int8", 4: "uint16", 5: "int16", 6: "int32", 7: "int64",
              9: "bool", 10: "float16", 11: "float64", 12: "uint32", 13: "uint64", 16: "bfloat16"}


def from_onnx(code: int) -> np.dtype:
    """The dtype of an ONNX TensorProto element type code; ValueError for one devkit lacks."""
    if code not in ONNX_CODES:
        raise ValueError(f"ONNX element type {code} is not a devkit dtype")
    name = ONNX_CODES[code]
    return bfloat16 if name == "bfloat16" else np.dtype(name)


def from_attribute(value) -> np.dtype:
    """A dtype attribute in any of its spellings: a dtype or its name, or ONNX's
    encodings, a TensorProto code (``6``) or its name (``"INT32"``)."""
    if isinstance(value, (int, np.integer)) and not isinstance(value, bool):
        return from_onnx(int(value))
    if isinstance(value, str) and value.isupper():
        codes = {"FLOAT": 1, "UINT8": 2, "INT8": 3, "UINT16": 4, "INT16": 5, "INT32": 6, "INT64": 7,
                 "BOOL": 9, "FLOAT16": 10, "DOUBLE": 11, "UINT32": 12, "UINT64": 13, "BFLOAT16": 16}
        if value not in codes:
            raise ValueError(f"ONNX element type {value} is not a devkit dtype")
        return from_onnx(codes[value])
    return normalize(value)


def dtype_name(dtype) -> str:
    """The dtype's name as the op set spells it (float32, bfloat16)."""
    return "bfloat16" if dtype == bfloat16 else np.dtype(dtype).name


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
