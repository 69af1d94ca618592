"""Array's Python operators and methods, each mapped onto devkit's op set.

``a + b``, ``a < 2``, ``a @ b``, ``-a``, ``a += 1``, ``a.sum(axis=0)``: every
one runs ops on the arrays' device and returns a new Array (in-place forms
write the result back into ``a``). Operands follow the Python array API
standard's type promotion (``result_type``), Python scalars take the array's
dtype. See docs/arrays.md for the table of operators and their ops.

The methods are attached to ``devkit.runtime.Array`` when devkit is imported:
they need ``devkit.ops``, which itself imports ``devkit.runtime``.
"""

from __future__ import annotations

import numpy as np

from . import dtypes as _dtypes
from . import ops
from .runtime import Array

_KINDS = {"b": "bool", "i": "integer", "u": "integer", "f": "floating"}
_FLOAT32, _FLOAT64, _INT64 = np.dtype("float32"), np.dtype("float64"), np.dtype("int64")


def _kind(dtype: np.dtype) -> str:
    return "floating" if dtype == _dtypes.bfloat16 else _KINDS[dtype.kind]


def result_type(*dtypes) -> np.dtype:
    """The array API's promotion of array dtypes: within a kind only (bool,
    integer, floating), signed with unsigned to the next wider signed type;
    bfloat16 (outside the standard) with float16 gives float32."""
    result, *rest = (_dtypes.normalize(d) for d in dtypes)
    for other in rest:
        if _kind(result) != _kind(other):
            raise TypeError(f"no promotion between {result} and {other}: the array API promotes within "
                            f"a kind (bool, integer, floating); convert one with .astype()")
        if result == other:
            continue
        if _dtypes.bfloat16 in (result, other):
            wider = max(result.itemsize, other.itemsize, 4)
            result = _FLOAT32 if wider == 4 else _FLOAT64
        elif np.dtype("uint64") in (result, other) and "i" in (result.kind, other.kind):
            raise TypeError(f"no promotion between {result} and {other}: no signed type holds both")
        else:
            result = np.promote_types(result, other)
    return result


def _scalar_dtype(value, array_dtype: np.dtype) -> np.dtype:
    """A Python scalar takes the array's dtype where the standard allows it."""
    if isinstance(value, bool):
        allowed = _kind(array_dtype) == "bool"
    elif isinstance(value, int):
        allowed = _kind(array_dtype) != "bool"
    else:
        allowed = _kind(array_dtype) == "floating"
    if not allowed:
        raise TypeError(f"a Python {type(value).__name__} does not combine with a {array_dtype} array "
                        f"(the array API's scalar rule); convert one with .astype()")
    return array_dtype


def _is_scalar(value) -> bool:
    return isinstance(value, (bool, int, float))


def _operands(x: Array, y) -> tuple[object, object, np.dtype] | None:
    """Both operands in their common dtype (NumPy values stay on the host:
    run_op copies them to x's device), or None for an operand of another type."""
    if isinstance(y, (Array, np.ndarray, np.generic)):
        dtype = result_type(x.dtype, y.dtype)
        return _in_dtype(x, dtype), _in_dtype(np.asarray(y) if isinstance(y, np.generic) else y, dtype), dtype
    if _is_scalar(y):
        dtype = _scalar_dtype(y, x.dtype)
        return x, np.asarray(y, dtype=dtype), dtype  # NumPy raises OverflowError outside the dtype
    return None


def _in_dtype(value, dtype: np.dtype):
    """An Array or NumPy operand converted to ``dtype`` (itself when it has it)."""
    return astype(value, dtype, copy=False) if isinstance(value, Array) else value.astype(dtype, copy=False)


def astype(x: Array, dtype, /, *, copy: bool = True) -> Array:
    """``x`` converted to ``dtype`` (Cast); ``x`` itself when it has it and copy is False."""
    dtype = _dtypes.normalize(dtype)
    if x.dtype == dtype:
        return x.copy() if copy else x
    return ops.Cast(x, to=dtype)


def _pick(by_kind: dict, dtype: np.dtype, symbol: str) -> str:
    op = by_kind.get(_kind(dtype))
    if op is None:
        raise TypeError(f"operator {symbol} does not take {dtype} arrays")
    return op


def _true_divide(x, y, dtype):
    if _kind(dtype) == "integer":  # NumPy's choice: integers divide in float64
        x, y = _in_dtype(x, _FLOAT64), _in_dtype(y, _FLOAT64)
    return ops.Div(x, y)


def _floor_divide(x, y, dtype):
    if _kind(dtype) == "floating":
        return ops.Floor(ops.Div(x, y))
    # x - x % y is a multiple of y, so Div's truncation is exact there; x // 0 is 0.
    return ops.Div(ops.Sub(x, ops.Mod(x, y)), y)


def _remainder(x, y, dtype):
    if _kind(dtype) == "integer":
        return ops.Mod(x, y)  # fmod=0: the divisor's sign, as Python's %
    remainder = ops.Mod(x, y, fmod=1)  # the dividend's sign: move it to the divisor's
    zero = np.zeros((), dtype)
    divisor_negative = ops.Less(y, zero) if isinstance(y, Array) else np.less(y, zero)  # on y's side
    wrong_sign = ops.And(ops.Not(ops.Equal(remainder, zero)),
                         ops.Xor(ops.Less(remainder, zero), divisor_negative))
    return ops.Where(wrong_sign, ops.Add(remainder, y), remainder)


def _not_equal(x, y, dtype):
    return ops.Not(ops.Equal(x, y))


def _bitwise(bool_op: str, integer_op: str, symbol: str):
    by_kind = {"bool": bool_op, "integer": integer_op}
    return lambda x, y, dtype: getattr(ops, _pick(by_kind, dtype, symbol))(x, y)


def _op(name: str):
    return lambda x, y, dtype: getattr(ops, name)(x, y)


# Python operator -> (dunder stem, how it runs on operands of a common dtype).
_BINARY = {
    "+": ("add", _op("Add")), "-": ("sub", _op("Sub")), "*": ("mul", _op("Mul")),
    "/": ("truediv", _true_divide), "//": ("floordiv", _floor_divide), "%": ("mod", _remainder),
    "**": ("pow", _op("Pow")), "@": ("matmul", _op("MatMul")),
    "&": ("and", _bitwise("And", "BitwiseAnd", "&")), "|": ("or", _bitwise("Or", "BitwiseOr", "|")),
    "^": ("xor", _bitwise("Xor", "BitwiseXor", "^")),
}
_COMPARISONS = {
    "==": ("eq", _op("Equal")), "!=": ("ne", _not_equal), "<": ("lt", _op("Less")),
    "<=": ("le", _op("LessOrEqual")), ">": ("gt", _op("Greater")), ">=": ("ge", _op("GreaterOrEqual")),
}


def _binary_methods(stem: str, compute) -> dict:
    def forward(self, other):
        operands = _operands(self, other)
        return NotImplemented if operands is None else compute(*operands)

    def reflected(self, other):
        operands = _operands(self, other)
        if operands is None:
            return NotImplemented
        x, y, dtype = operands
        return compute(y, x, dtype)

    def in_place(self, other):
        operands = _operands(self, other)
        if operands is None:
            return NotImplemented
        result = compute(*operands)
        if result.dtype != self.dtype or result.shape != self.shape:
            raise TypeError(f"in-place {stem}: the result ({result.dtype}, shape {result.shape}) does not "
                            f"fit the {self.dtype} array of shape {self.shape}")
        if not self.is_contiguous:
            raise ValueError(f"in-place {stem} needs a contiguous array; this view has strides {self.strides}")
        self.buffer.view(self.offset, self.nbytes).copy_from(result.buffer.view(result.offset, result.nbytes))
        return self

    return {f"__{stem}__": forward, f"__r{stem}__": reflected, f"__i{stem}__": in_place}


def _invert(x: Array) -> Array:
    return getattr(ops, _pick({"bool": "Not", "integer": "BitwiseNot"}, x.dtype, "~"))(x)


# -- reductions ---------------------------------------------------------------------------------------

def _reduce(op: str, x: Array, axis, keepdims: bool) -> Array:
    """ONNX's reduction ``op`` over an array-API ``axis``: None is every axis, () none."""
    if axis is None:
        return getattr(ops, op)(x, keepdims=int(keepdims))
    axes = [axis] if isinstance(axis, int) else list(axis)
    return getattr(ops, op)(x, axes, keepdims=int(keepdims), noop_with_empty_axes=int(not axes))


def _accumulating(op: str, default_dtype):
    """sum, prod, mean: run in ``dtype`` (default: ``default_dtype`` of the input's)."""

    def method(self, /, *, axis=None, dtype=None, keepdims: bool = False) -> Array:
        target = default_dtype(self.dtype) if dtype is None else dtype
        return _reduce(op, astype(self, target, copy=False), axis, keepdims)

    method.__name__ = op
    return method


def _extreme(op: str):
    def method(self, /, *, axis=None, keepdims: bool = False) -> Array:
        return _reduce(op, self, axis, keepdims)

    method.__name__ = op
    return method


def _sum_dtype(dtype: np.dtype) -> np.dtype:
    """The array API sums integers in the default integer dtype (int64; devkit
    has no uint64 kernels, so unsigned integers too) and keeps floats."""
    return dtype if _kind(dtype) == "floating" else _INT64


def _mean_dtype(dtype: np.dtype) -> np.dtype:
    return dtype if _kind(dtype) == "floating" else _FLOAT64


def _arg_reduction(op: str):
    def method(self, /, *, axis: int | None = None, keepdims: bool = False) -> Array:
        if axis is not None:
            return getattr(ops, op)(self, axis=axis, keepdims=int(keepdims))
        flat = (self if self.is_contiguous else self.copy()).reshape(-1)
        index = getattr(ops, op)(flat, axis=0, keepdims=0)
        return index.reshape((1,) * self.ndim) if keepdims else index

    method.__name__ = op
    return method


def _host_scalar(convert):
    return lambda self: convert(self.numpy())


METHODS = {
    **{name: method for stem, compute in _BINARY.values() for name, method in _binary_methods(stem, compute).items()},
    **{f"__{stem}__": _binary_methods(stem, compute)[f"__{stem}__"] for stem, compute in _COMPARISONS.values()},
    "__neg__": lambda self: ops.Neg(self), "__pos__": lambda self: self.copy(), "__abs__": lambda self: ops.Abs(self),
    "__invert__": _invert,
    "__bool__": _host_scalar(bool), "__int__": _host_scalar(int), "__float__": _host_scalar(float),
    "__index__": _host_scalar(lambda host: host.__index__()),
    "astype": astype,
    "sum": _accumulating("ReduceSum", _sum_dtype), "prod": _accumulating("ReduceProd", _sum_dtype),
    "mean": _accumulating("ReduceMean", _mean_dtype),
    "max": _extreme("ReduceMax"), "min": _extreme("ReduceMin"),
    "argmax": _arg_reduction("ArgMax"), "argmin": _arg_reduction("ArgMin"),
}

for _name, _method in METHODS.items():
    setattr(Array, _name, _method)
Array.__array_ufunc__ = None  # numpy_array + x: NumPy defers to Array's reflected operators
# == is elementwise, yet Arrays keep hashing by identity as before (Python only drops
# __hash__ for an __eq__ defined in the class body).
