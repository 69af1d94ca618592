"""Shape and conversion ops: Cast, Reshape, Flatten, Squeeze, Unsqueeze,
Identity, Range, ConstantOfShape, OneHot, Resize, DepthToSpace, SpaceToDepth,
NonZero, Shape, Size and EyeLike.

Conversions round the same way everywhere in this family: a float result is
the exact value rounded once to the nearest even in the output type
(overflow to inf), never rounded first to float32 and again to
float16/bfloat16; a float stored into an integer type is truncated toward
zero and saturated, NaN giving 0 (ONNX leaves that undefined); an integer
stored into a narrower integer type wraps (two's complement).
"""

from __future__ import annotations

import math

import numpy as np

from . import testing as t
from .spec import (ALL, BF16, BOOL, EXACT, F16, F32, F64, I8, I32, I64, NUMERIC, REQUIRED, U8,
                   Attr, Case, Input, OpSpec, Tolerance, dtype_name, normalize_axis, register)

# -- conversions shared by the references ---------------------------------------------


def _f32_round_to_odd(x: np.ndarray) -> np.ndarray:
    """``x`` (float64 or integer) in float32, rounded to odd: truncated, with
    the last bit set when inexact. Rounding that once more to a type at least
    two bits narrower (float16, bfloat16) gives the correctly rounded result,
    where rounding to nearest twice may not."""
    x = np.asarray(x)
    if x.dtype.kind in "biu":
        v = x.astype(np.int64)
        magnitude = np.where(v < 0, np.uint64(0) - v.astype(np.uint64), v.astype(np.uint64))
        # frexp's exponent is at least the bit length (magnitude may round up): the
        # shift then keeps at most 24 bits, which float32 holds exactly.
        _, exponent = np.frexp(magnitude.astype(np.float64))
        shift = np.maximum(exponent - 24, 0).astype(np.uint64)
        kept = magnitude >> shift
        sticky = (magnitude & ((np.uint64(1) << shift) - np.uint64(1))) != 0
        kept |= sticky.astype(np.uint64)
        result = np.ldexp(kept.astype(np.float64), shift.astype(np.int64))
        return np.where(v < 0, -result, result).astype(np.float32)
    x = x.astype(np.float64)
    with np.errstate(over="ignore", invalid="ignore"):
        f = x.astype(np.float32)
        back = f.astype(np.float64)
        inexact = np.isfinite(x) & (back != x)
        f = np.where(inexact & (np.abs(back) > np.abs(x)), np.nextafter(f, np.float32(0)), f)
    return (f.view(np.uint32) | inexact.astype(np.uint32)).view(np.float32)


def _to_float(x, dtype) -> np.ndarray:
    """``x`` (float64 or integer) rounded once to the nearest even in float ``dtype``."""
    x = np.asarray(x)
    dtype = np.dtype(dtype)
    with np.errstate(over="ignore"):
        if dtype in (F32, F64):
            return x.astype(dtype)  # NumPy rounds float64 and int64 correctly here
        return _f32_round_to_odd(x).astype(dtype)


def _float_to_int(x: np.ndarray, dtype) -> np.ndarray:
    """Truncation toward zero, saturated to ``dtype``'s range; NaN gives 0."""
    info = np.iinfo(dtype)
    y = np.trunc(np.where(np.isnan(x), 0.0, x))
    low, high = float(info.min), float(info.max)  # int64's high rounds up to 2**63
    inside = (y > low) & (y < high)
    out = np.where(y <= low, info.min, info.max).astype(dtype)
    out[inside] = y[inside].astype(dtype)
    return out


def _convert(x, dtype) -> np.ndarray:
    """The family's conversion of a reference value (float64, integer or
    bool array) to ``dtype`` (see the module doc)."""
    x = np.asarray(x)
    dtype = np.dtype(dtype)
    if dtype == BOOL:
        return x != 0
    if t.is_float(dtype):
        return _to_float(x, dtype)
    if x.dtype.kind == "f":
        return _float_to_int(x, dtype)
    return x.astype(dtype)  # integers and bools: wraps


def _dtype_check(allowed):
    names = ", ".join(dtype_name(d) for d in allowed)
    return lambda d: None if d in allowed else f"{dtype_name(d)} is not one of {names}"


# -- host-input helpers -------------------------------------------------------------------


def _present(info) -> bool:
    """An optional host input counts as given only when it has elements (ONNX
    passes an empty tensor for an input it leaves out)."""
    return info is not None and info.value is not None and info.value.size > 0


def _host_ints(info, name: str) -> list[int]:
    if info.value.dtype.kind not in "iu":
        raise TypeError(f"input '{name}' must be an integer tensor, got {dtype_name(info.value.dtype)}")
    if info.value.ndim > 1:
        raise ValueError(f"input '{name}' must be 1-D, got shape {info.value.shape}")
    return [int(v) for v in info.value.reshape(-1)]


def _host_floats(info, name: str) -> list[float]:
    if info.value.dtype.kind != "f":
        raise TypeError(f"input '{name}' must be a float tensor, got {dtype_name(info.value.dtype)}")
    if info.value.ndim > 1:
        raise ValueError(f"input '{name}' must be 1-D, got shape {info.value.shape}")
    return [float(v) for v in info.value.reshape(-1)]


def _host_scalar(info, name: str):
    if info.value.size != 1:
        raise ValueError(f"input '{name}' must be a scalar, got shape {info.value.shape}")
    return info.value.reshape(-1)[0]


def _axes(values, rank: int, what: str = "axes") -> list[int]:
    axes = [normalize_axis(a, rank, f"{what} entry") for a in values]
    if len(set(axes)) != len(axes):
        raise ValueError(f"{what} {list(values)} repeats an axis")
    return axes


# -- common cases ---------------------------------------------------------------------


def _special_or_random(dtype, rng, shape):
    """Random values of ``shape`` with the dtype's edge values in front."""
    values = t.random(rng, shape, dtype).reshape(-1)
    special = t.special_values(dtype)[: values.size]
    values[: special.size] = special
    return values.reshape(shape)


LARGE = (3, 1031, 37)  # above 1e5 elements, odd sizes


# -- Cast ----------------------------------------------------------------------------------------

_FLOAT_EDGES = [
    0.0, -0.0, np.nan, -np.nan, np.inf, -np.inf, 0.5, -0.5, 1.5, 2.5, -2.5, -0.7, 0.1, 1 / 3, -7.9,
    127.0, 127.5, 128.0, -128.5, -129.0, 255.5, 256.0, -1.0, 300.0, 1e10, -1e10, 1e20, -1e30,
    2.0**31 - 0.5, 2.0**31, -(2.0**31) - 1.0, 2.0**53 + 2, 2.0**63, -(2.0**63), 2.0**64, 1e300,
    # float16: largest, the rounding boundary to inf, halfway cases, subnormals
    65504.0, 65519.0, 65520.0, 1 + 2.0**-11, 1 + 3 * 2.0**-11, 1 + 2.0**-11 + 2.0**-30,
    2.0**-24, 2.0**-25, 2.0**-25 + 2.0**-40, 3 * 2.0**-25, 5 * 2.0**-26, 2.0**-15, 6.1e-5, 1e-8,
    # bfloat16 and float32: halfway cases, the overflow boundary, subnormals
    1 + 2.0**-8, 1 + 3 * 2.0**-8, 1 + 2.0**-8 + 2.0**-40, 3.3961e38, 3.4e38, (2 - 2.0**-24) * 2.0**127,
    2.0**-130, 1e-40, 1.4e-45, 7e-46, 1e-50,
]

_INT_EDGES = [
    0, 1, -1, 2, 7, -7, 100, 127, 128, -128, -129, 255, 256, 300, -300, 65504, 65519, 65520, 65536,
    2**24 + 1, 2**24 + 3, -(2**24) - 1, 2**31 - 1, -(2**31), 2**31, 2**31 + 2**23 + 1, 2**32 + 5,
    2**53 + 1, 2**62 + 2**38 + 1, -(2**62) - 2**38 - 1, 2**63 - 1, -(2**63),
]


def _cast_inputs(dtype, rng) -> np.ndarray:
    """A vector of the dtype's edge values and random ones across its range."""
    dtype = np.dtype(dtype)
    if dtype == BOOL:
        return np.concatenate([[False, True], t.random(rng, (30,), BOOL)])
    if t.is_float(dtype):
        info = t.finfo(dtype)
        edges = _FLOAT_EDGES + [float(info.max), -float(info.max), float(info.tiny),
                                float(info.smallest_subnormal), -float(info.smallest_subnormal)]
        scaled = rng.standard_normal(48) * 2.0 ** rng.integers(-30, 40, 48)
        with np.errstate(over="ignore"):
            return np.concatenate([np.array(edges), rng.uniform(-300, 300, 32), scaled]).astype(dtype)
    info = np.iinfo(dtype)
    edges = [v for v in _INT_EDGES if info.min <= v <= info.max] + [info.min, info.max]
    spread = rng.integers(info.min, info.max, 48, endpoint=True, dtype=np.int64)
    return np.concatenate([np.array(edges, dtype=np.int64), spread]).astype(dtype)


def _cast_cases(dtype, rng):
    values = _cast_inputs(dtype, rng)
    cases = [Case(f"to_{dtype_name(to)}", [values], {"to": to}) for to in ALL]
    other = I32 if t.is_float(dtype) else F32
    cases += [
        Case("matrix", [t.random(rng, (7, 13), dtype, -300, 300)], {"to": other}),
        Case("scalar", [t.random(rng, (), dtype)], {"to": F64}),
        Case("empty", [t.random(rng, (0, 3), dtype)], {"to": other}),
        Case("large", [t.random(rng, LARGE, dtype, -200, 200)], {"to": other}),
        Case("large_to_float16", [t.random(rng, LARGE, dtype, -200, 200)], {"to": F16}),
        Case("saturate_0", [values], {"to": BF16, "saturate": 0}),
    ]
    return cases


register(OpSpec(
    name="Cast", category="shape", opset=23,
    inputs=(Input("input"),), outputs=("output",),
    dtypes=ALL,
    attrs=(Attr("to", "dtype", REQUIRED, check=_dtype_check(ALL), doc="the output dtype"),
           Attr("saturate", "int", 1, choices=(0, 1),
                doc="float8 targets only in ONNX; accepted, no effect on the types here")),
    infer=lambda x, a: [(x[0].shape, a["to"])],
    reference=lambda x, a: [_convert(x[0], a["to"])],
    cases=_cast_cases,
    doc="Converts every element to dtype `to`. Float -> float: rounded once to nearest even, "
        "overflow to inf (float64 -> float16/bfloat16 directly, not through float32). "
        "Integer -> float: rounded once to nearest even (int64 -> bfloat16 as well). "
        "Float -> integer: truncated toward zero and saturated to the target's range, NaN -> 0 "
        "(ONNX: undefined). Integer -> integer: wraps (two's complement). Anything -> bool: "
        "x != 0 (NaN -> true); bool -> number: 0 or 1.",
))


# -- Reshape, Flatten, Squeeze, Unsqueeze, Identity -------------------------------------------


def _reshape_shape(in_shape, target, allowzero: int) -> tuple[int, ...]:
    if any(v < -1 for v in target):
        raise ValueError(f"shape {target} has a negative entry other than -1")
    if target.count(-1) > 1:
        raise ValueError(f"shape {target} has more than one -1")
    if allowzero and 0 in target and -1 in target:
        raise ValueError(f"shape {target} has both 0 and -1, which allowzero=1 does not allow")
    out = []
    for i, v in enumerate(target):
        if v == 0 and not allowzero:
            if i >= len(in_shape):
                raise ValueError(f"shape[{i}] is 0 (copy the input's dimension), but the input "
                                 f"{tuple(in_shape)} has rank {len(in_shape)}")
            v = in_shape[i]
        out.append(v)
    size = math.prod(in_shape)
    if -1 in out:
        known = math.prod(v for v in out if v != -1)
        if known == 0 or size % known:
            raise ValueError(f"cannot infer the -1 in shape {target} for an input of shape "
                             f"{tuple(in_shape)} ({size} elements)")
        out[out.index(-1)] = size // known
    elif math.prod(out) != size:
        raise ValueError(f"shape {target} ({math.prod(out)} elements) does not match the input "
                         f"shape {tuple(in_shape)} ({size} elements)")
    return tuple(out)


def _reshape_infer(inputs, attrs):
    data, shape = inputs
    return [(_reshape_shape(data.shape, _host_ints(shape, "shape"), attrs["allowzero"]), data.dtype)]


def _reshape_reference(x, attrs):
    shape = [int(v) for v in np.asarray(attrs["shape"]).reshape(-1)]
    return [x[0].reshape(_reshape_shape(x[0].shape, shape, attrs["allowzero"]))]


def _shape_arg(values):
    return np.array(values, dtype=np.int64)


def _reshape_cases(dtype, rng):
    r = lambda *shape: _special_or_random(dtype, rng, shape)
    return [
        Case("reorder", [r(2, 3, 4), _shape_arg([4, 2, 3])]),
        Case("copy_zero_and_infer", [r(2, 3, 4), _shape_arg([0, -1])]),
        Case("infer_only", [r(2, 3, 4), _shape_arg([-1])]),
        Case("rank_up", [r(24), _shape_arg([2, -1, 4])]),
        Case("to_scalar", [r(1, 1), _shape_arg([])]),
        Case("from_scalar", [r(), _shape_arg([1, 1, 1])]),
        Case("empty_copy_zero", [r(0, 4), _shape_arg([0, 2, 2])]),
        Case("empty_allowzero", [r(2, 0, 3), _shape_arg([3, 0])], {"allowzero": 1}),
        Case("allowzero_no_zero", [r(3, 4), _shape_arg([2, -1])], {"allowzero": 1}),
        Case("large", [r(*LARGE), _shape_arg([37, -1, 3])]),
    ]


register(OpSpec(
    name="Reshape", category="shape", opset=23,
    inputs=(Input("data"), Input("shape", host=True, doc="int64, the new shape")),
    outputs=("reshaped",),
    dtypes=ALL,
    attrs=(Attr("allowzero", "int", 0, choices=(0, 1),
                doc="1: a 0 in shape is a 0-size dimension, not a copy of the input's"),),
    infer=_reshape_infer, reference=_reshape_reference, cases=_reshape_cases,
    doc="The data in row-major order with a new shape: a 0 copies the input's dimension (unless "
        "allowzero=1), one -1 is inferred; the element counts must match.",
))


def _flatten_infer(inputs, attrs):
    x = inputs[0]
    axis = attrs["axis"]
    if not -x.ndim <= axis <= x.ndim:
        raise ValueError(f"axis {axis} is out of range [-{x.ndim}, {x.ndim}] for rank {x.ndim}")
    axis = axis + x.ndim if axis < 0 else axis
    return [((math.prod(x.shape[:axis]), math.prod(x.shape[axis:])), x.dtype)]


def _flatten_cases(dtype, rng):
    r = lambda *shape: _special_or_random(dtype, rng, shape)
    return [
        Case("default_axis", [r(2, 3, 4, 5)]),
        Case("axis0", [r(2, 3, 4)], {"axis": 0}),
        Case("axis2", [r(2, 3, 4, 5)], {"axis": 2}),
        Case("axis_rank", [r(2, 3, 4)], {"axis": 3}),
        Case("negative_axis", [r(2, 3, 4, 5)], {"axis": -1}),
        Case("negative_axis_first", [r(2, 3, 4)], {"axis": -3}),
        Case("empty", [r(2, 0, 4)], {"axis": 2}),
        Case("large", [r(*LARGE)], {"axis": 2}),
    ]


register(OpSpec(
    name="Flatten", category="shape", opset=23,
    inputs=(Input("input"),), outputs=("output",),
    dtypes=ALL,
    attrs=(Attr("axis", "int", 1, doc="in [-r, r]: the dims before it form the first output dim"),),
    infer=_flatten_infer,
    reference=lambda x, a: [x[0].reshape(_flatten_infer([x[0]], a)[0][0])],
    cases=_flatten_cases,
    doc="A 2-D copy: (product of the dims before axis, product of the rest).",
))


def _squeeze_shape(shape, axes) -> tuple[int, ...]:
    """``axes``: a list, or None for every size-1 dim."""
    if axes is None:
        return tuple(n for n in shape if n != 1)
    axes = _axes(axes, len(shape))
    for a in axes:
        if shape[a] != 1:
            raise ValueError(f"axis {a} of the input shape {tuple(shape)} is {shape[a]}, not 1")
    return tuple(n for i, n in enumerate(shape) if i not in axes)


def _squeeze_infer(inputs, attrs):
    axes = inputs[1] if len(inputs) > 1 else None
    return [(_squeeze_shape(inputs[0].shape, _host_ints(axes, "axes") if _present(axes) else None),
             inputs[0].dtype)]


def _squeeze_reference(x, attrs):
    return [x[0].reshape(_squeeze_shape(x[0].shape, _given(attrs, "axes")))]


def _squeeze_cases(dtype, rng):
    r = lambda *shape: _special_or_random(dtype, rng, shape)
    return [
        Case("all_size1", [r(1, 3, 1, 4)]),
        Case("axes", [r(1, 3, 1, 4), _shape_arg([0, 2])]),
        Case("negative_axes", [r(3, 1, 4, 1), _shape_arg([-1, -3])]),
        Case("to_scalar", [r(1, 1)]),
        Case("nothing_to_squeeze", [r(2, 3)]),
        Case("empty_axes_input", [r(1, 2), _shape_arg([])]),
        Case("empty", [r(1, 0, 3), _shape_arg([0])]),
        Case("large", [r(1, *LARGE), _shape_arg([0])]),
    ]


register(OpSpec(
    name="Squeeze", category="shape", opset=23,
    inputs=(Input("data"), Input("axes", optional=True, host=True, doc="int64; omitted: every size-1 dim")),
    outputs=("squeezed",),
    dtypes=ALL,
    infer=_squeeze_infer, reference=_squeeze_reference,
    cases=_squeeze_cases,
    doc="Removes the size-1 dims named by axes (negative counts from the back), or every "
        "size-1 dim when axes is omitted or empty; naming a dim that is not 1 is an error.",
))


def _unsqueeze_shape(shape, axes_values):
    rank = len(shape) + len(axes_values)
    axes = _axes(axes_values, rank)
    rest = iter(shape)
    return tuple(1 if i in axes else next(rest) for i in range(rank))


def _unsqueeze_cases(dtype, rng):
    r = lambda *shape: _special_or_random(dtype, rng, shape)
    return [
        Case("axis0", [r(3, 4), _shape_arg([0])]),
        Case("middle_and_last", [r(3, 4), _shape_arg([1, 3])]),
        Case("negative_axes", [r(3, 4), _shape_arg([-1, 0])]),
        Case("unsorted", [r(3, 4, 5), _shape_arg([5, 0, 2])]),
        Case("scalar", [r(), _shape_arg([0, 1])]),
        Case("empty", [r(0, 3), _shape_arg([1])]),
        Case("large", [r(*LARGE), _shape_arg([-2])]),
    ]


register(OpSpec(
    name="Unsqueeze", category="shape", opset=23,
    inputs=(Input("data"), Input("axes", host=True, doc="int64, positions in the output")),
    outputs=("expanded",),
    dtypes=ALL,
    infer=lambda x, a: [(_unsqueeze_shape(x[0].shape, _host_ints(x[1], "axes")), x[0].dtype)],
    reference=lambda x, a: [x[0].reshape(_unsqueeze_shape(
        x[0].shape, [int(v) for v in np.asarray(a["axes"]).reshape(-1)]))],
    cases=_unsqueeze_cases,
    doc="Inserts size-1 dims at the given output positions (in [-r', r'-1] of the output rank r').",
))


def _identity_cases(dtype, rng):
    r = lambda *shape: _special_or_random(dtype, rng, shape)
    return [
        Case("matrix", [r(5, 7)]),
        Case("scalar", [r()]),
        Case("empty", [r(0, 3)]),
        Case("rank5", [r(2, 1, 3, 2, 4)]),
        Case("large", [r(*LARGE)]),
    ]


register(OpSpec(
    name="Identity", category="shape", opset=23,
    inputs=(Input("input"),), outputs=("output",),
    dtypes=ALL,
    infer=lambda x, a: [(x[0].shape, x[0].dtype)],
    reference=lambda x, a: [x[0]],
    cases=_identity_cases,
    doc="A copy. Kernels should accept any strides: the dispatcher uses Identity to make "
        "strided inputs compact for kernels that take compact tensors only.",
))


def _dropout_infer(x, a):
    ratio, training = (list(x[1:]) + [None, None])[:2]
    rate = 0.5 if ratio is None else float(ratio.value.reshape(-1)[0])
    if not 0 <= rate < 1:
        raise ValueError(f"ratio {rate} is outside [0, 1)")
    if training is not None and np.any(training.value) and rate != 0:
        raise ValueError("training_mode is true with a nonzero ratio: devkit runs Dropout at inference "
                         "only (training-mode Dropout draws random masks)")
    return [(x[0].shape, x[0].dtype), (x[0].shape, BOOL)]


def _dropout_cases(dtype, rng):
    x = t.random(rng, (3, 5, 7), dtype)
    return [
        Case("default", [x]),
        Case("ratio_inference", [x, np.array(0.5, np.float32), np.array(False)]),
        Case("training_zero_ratio", [x, np.array(0.0, np.float32), np.array(True)]),
        Case("empty", [t.random(rng, (0, 4), dtype)]),
        Case("special", [t.special_values(dtype)]),
    ]


register(OpSpec(
    name="Dropout", category="shape", opset=22,
    inputs=(Input("data"), Input("ratio", optional=True, host=True),
            Input("training_mode", optional=True, host=True)),
    outputs=("output", "mask"), optional_outputs=1,
    attrs=(Attr("seed", "int", doc="unused at inference"),
           Attr("ratio", "float", doc="opsets before 12; unused at inference")),
    dtypes=(F32, F64, F16, BF16),
    infer=_dropout_infer,
    reference=lambda x, a: [x[0], np.ones(x[0].shape, bool)],
    cases=_dropout_cases,
    doc="Inference only: output is the data and mask is all true. training_mode true is refused "
        "unless the ratio is 0 (the same result); the random masks of training are not drawn.",
))


# -- Shape, Size -------------------------------------------------------------------------------


def _shape_slice(shape, attrs) -> tuple[int, ...]:
    rank = len(shape)

    def clamp(axis: int) -> int:
        return min(max(axis + rank if axis < 0 else axis, 0), rank)

    start = clamp(attrs["start"])
    end = clamp(attrs["end"]) if "end" in attrs else rank
    return tuple(shape[start:end])


def _shape_cases(dtype, rng):
    x = t.random(rng, (2, 3, 4, 5), dtype)
    return [
        Case("all", [x]),
        Case("start", [x], {"start": 1}),
        Case("end", [x], {"end": -1}),
        Case("start_negative", [x], {"start": -1}),
        Case("start_end", [x], {"start": 1, "end": 3}),
        Case("clipped", [x], {"start": -10, "end": 10}),
        Case("start_after_end", [x], {"start": 3, "end": 1}),
        Case("scalar", [t.random(rng, (), dtype)]),
        Case("empty", [t.random(rng, (0, 3), dtype)]),
    ]


register(OpSpec(
    name="Shape", category="shape", opset=23,
    inputs=(Input("data"),), outputs=("shape",),
    dtypes=ALL,
    attrs=(Attr("start", "int", 0), Attr("end", "int", None, doc="exclusive; omitted: the rank")),
    infer=lambda x, a: [((len(_shape_slice(x[0].shape, a)),), I64)],
    reference=lambda x, a: [np.array(_shape_slice(x[0].shape, a), dtype=np.int64)],
    cases=_shape_cases,
    doc="The input's shape as int64, sliced [start, end) with negative axes counted from the "
        "back and both clamped to [0, rank].",
))


register(OpSpec(
    name="Size", category="shape", opset=23,
    inputs=(Input("data"),), outputs=("size",),
    dtypes=ALL,
    infer=lambda x, a: [((), I64)],
    reference=lambda x, a: [np.array(x[0].size, dtype=np.int64)],
    cases=lambda dtype, rng: [
        Case("matrix", [t.random(rng, (2, 3, 4), dtype)]),
        Case("scalar", [t.random(rng, (), dtype)]),
        Case("empty", [t.random(rng, (5, 0), dtype)]),
    ],
    doc="The element count, as an int64 scalar.",
))


# -- Range ------------------------------------------------------------------------------------------


def _range_count(start, limit, delta) -> int:
    if isinstance(start, (int, np.integer)):
        start, limit, delta = int(start), int(limit), int(delta)
        if delta == 0:
            raise ValueError("delta is 0")
        return max(-((start - limit) // delta), 0)  # exact ceil((limit - start) / delta)
    start, limit, delta = float(start), float(limit), float(delta)
    if delta == 0:
        raise ValueError("delta is 0")
    quotient = (limit - start) / delta
    if not math.isfinite(quotient):
        raise ValueError(f"start {start}, limit {limit}, delta {delta} give no finite element count")
    return max(math.ceil(quotient), 0)


def _range_infer(inputs, attrs):
    values = [_host_scalar(info, name) for info, name in zip(inputs, ("start", "limit", "delta"))]
    dtype = inputs[0].dtype
    for info, name in zip(inputs[1:], ("limit", "delta")):
        if info.dtype != dtype:
            raise TypeError(f"{name} has dtype {dtype_name(info.dtype)} but start has {dtype_name(dtype)}")
    return [((_range_count(*values),), dtype)]


def _range_reference(x, attrs):
    start, limit, delta = (np.asarray(v).reshape(-1)[0] for v in x)
    dtype = np.asarray(x[0]).dtype
    n = _range_count(start, limit, delta)
    if dtype.kind == "f":
        return [(float(start) + np.arange(n, dtype=np.float64) * float(delta)).astype(dtype)]
    # start + i * delta wraps in uint64 exactly as the kernel's does; the true values fit.
    steps = np.arange(n, dtype=np.uint64) * np.uint64(int(delta) & (2**64 - 1))
    return [(steps + np.uint64(int(start) & (2**64 - 1))).view(np.int64).astype(dtype)]


def _range_cases(dtype, rng):
    s = lambda v: np.array(v, dtype=dtype)
    cases = [
        Case("positive_delta", [s(3), s(9), s(3)]),
        Case("negative_delta", [s(10), s(4), s(-2)]),
        Case("empty_wrong_direction", [s(5), s(10), s(-1)]),
        Case("empty_start_at_limit", [s(7), s(7), s(2)]),
        Case("one_element", [s(-3), s(-2), s(5)]),
        Case("large", [s(-50000), s(70000), s(1)]),
    ]
    if t.is_float(dtype):
        cases += [
            Case("fractional", [s(0.5), s(3.7), s(0.3)]),
            Case("negative_fractional", [s(1.0), s(-2.0), s(-0.25)]),
            Case("large_fractional", [s(-1.0), s(1.0), s(1.0 / 65536)]),
        ]
    else:
        info = np.iinfo(dtype)
        cases += [Case("extremes", [s(info.min), s(info.max), s(info.max // 3 + 1)]),
                  Case("extremes_negative", [s(info.max), s(info.min), s(-(info.max // 2))])]
    return cases


register(OpSpec(
    name="Range", category="shape", opset=13,
    inputs=(Input("start", host=True), Input("limit", host=True), Input("delta", host=True)),
    outputs=("output",),
    dtypes=(F32, F64, I32, I64),
    infer=_range_infer, reference=_range_reference, cases=_range_cases,
    doc="(Range-11, unchanged through opset 23.) "
        "start + i * delta for i < max(ceil((limit - start) / delta), 0). The inputs are "
        "scalars of one dtype, the output's; run_op's device= places the op. Integers: exact. "
        "Floats: the count and each value are computed in float64 (value = start + i * delta, "
        "rounded once to the output dtype); delta 0 or a non-finite count is an error.",
))


# -- ConstantOfShape, EyeLike -------------------------------------------------------------------


def _constant_value(value: float, dtype):
    dtype = np.dtype(dtype)
    if t.is_float(dtype):
        return _to_float(np.float64(value), dtype)
    if dtype == BOOL:
        if value not in (0.0, 1.0):
            raise ValueError(f"value {value} is not a bool (0 or 1)")
        return np.bool_(value)
    info = np.iinfo(dtype)
    if not (math.isfinite(value) and value.is_integer() and info.min <= value <= info.max):
        raise ValueError(f"value {value} is not an integer in the range of {dtype_name(dtype)}")
    return dtype.type(int(value))


def _constant_infer(inputs, attrs):
    shape = _host_ints(inputs[0], "input")
    if any(n < 0 for n in shape):
        raise ValueError(f"shape {shape} has a negative dimension")
    _constant_value(attrs["value"], attrs["dtype"])
    return [(tuple(shape), attrs["dtype"])]


def _constant_cases(dtype, rng):
    shape = _shape_arg
    if t.is_float(dtype):
        values = [("nan", np.nan), ("neg_inf", -np.inf), ("neg_zero", -0.0), ("inexact", 0.1),
                  ("max", float(t.finfo(dtype).max)), ("tiny", 1e-300)]
    elif dtype == BOOL:
        values = [("true", 1.0)]
    else:
        info = np.iinfo(dtype)
        top = float(info.max)  # int64's max is not a float64: take the largest one below it
        top = top if top <= info.max else float(np.nextafter(top, 0))
        values = [("min", float(info.min)), ("max", top), ("negative_one", -1.0 if info.min else 1.0)]
    cases = [
        Case("default_value", [shape([2, 3])], {"dtype": dtype}),
        Case("scalar", [shape([])], {"dtype": dtype, "value": 1.0}),
        Case("empty", [shape([0, 4])], {"dtype": dtype, "value": 1.0}),
        Case("large", [shape(list(LARGE))], {"dtype": dtype, "value": 1.0}),
    ]
    return cases + [Case(f"value_{name}", [shape([3, 5])], {"dtype": dtype, "value": v}) for name, v in values]


register(OpSpec(
    name="ConstantOfShape", category="shape", opset=23,
    inputs=(Input("input", host=True, doc="int64, the output shape"),), outputs=("output",),
    dtypes=ALL, key="dtype",
    attrs=(Attr("value", "float", 0.0, doc="the fill value (ONNX: a one-element tensor)"),
           Attr("dtype", "dtype", F32, check=_dtype_check(ALL), doc="the output dtype (ONNX: the "
                "value tensor's)")),
    infer=_constant_infer,
    reference=lambda x, a: [np.full(tuple(int(v) for v in np.asarray(a["input"]).reshape(-1)),
                                    _constant_value(a["value"], a["dtype"]), dtype=a["dtype"])],
    cases=_constant_cases,
    doc="A tensor of the given shape filled with value. ONNX's one-element `value` tensor is "
        "split into a float `value` and a `dtype`; a float value rounds to nearest even in a float "
        "dtype; an integer dtype needs an integral value in its range, bool 0 or 1. Integer "
        "values beyond 2**53 are not representable this way.",
))


def _eyelike_infer(inputs, attrs):
    x = inputs[0]
    if x.ndim != 2:
        raise ValueError(f"input must be 2-D, got shape {x.shape}")
    return [(x.shape, attrs.get("dtype", x.dtype))]


def _eyelike_reference(x, attrs):
    rows, cols = x[0].shape
    dtype = attrs.get("dtype", x[0].dtype)
    return [np.eye(rows, cols, attrs["k"]).astype(dtype)]


def _eyelike_cases(dtype, rng):
    r = lambda *shape: t.random(rng, shape, dtype)
    return [
        Case("square", [r(4, 4)]),
        Case("wide_upper", [r(3, 6)], {"k": 2}),
        Case("tall_lower", [r(6, 3)], {"k": -1}),
        Case("off_the_matrix", [r(3, 4)], {"k": 4}),
        Case("off_the_matrix_negative", [r(3, 4)], {"k": -3}),
        Case("empty", [r(0, 3)]),
        Case("dtype_float32", [r(3, 3)], {"dtype": F32}),
        Case("dtype_int64", [r(2, 5)], {"dtype": I64, "k": 1}),
        Case("dtype_bool", [r(5, 2)], {"dtype": BOOL, "k": -2}),
        Case("large", [r(331, 317)], {"k": 5}),
    ]


register(OpSpec(
    name="EyeLike", category="shape", opset=22,
    inputs=(Input("input"),), outputs=("output",),
    dtypes=ALL,
    attrs=(Attr("dtype", "dtype", None, check=_dtype_check(ALL), doc="default: the input's"),
           Attr("k", "int", 0, doc="the diagonal: output[i, i + k] = 1")),
    infer=_eyelike_infer, reference=_eyelike_reference, cases=_eyelike_cases,
    doc="A 2-D tensor of the input's shape with ones on diagonal k and zeros elsewhere; the "
        "input's values are not read.",
))


# -- OneHot -----------------------------------------------------------------------------------------


def _onehot_depth(info) -> int:
    depth = _host_scalar(info, "depth")
    if isinstance(depth, (float, np.floating)) and not math.isfinite(depth):
        raise ValueError(f"depth is {depth}")
    depth = int(depth)  # ONNX: a float depth is cast to int64 (truncated)
    if depth < 0:
        raise ValueError(f"depth is {depth}; it must be >= 0")
    return depth


def _onehot_infer(inputs, attrs):
    indices, depth, values = inputs
    if indices.dtype not in NUMERIC:
        raise TypeError(f"indices have dtype {dtype_name(indices.dtype)}; they must be numeric")
    if values.shape != (2,):
        raise ValueError(f"values must have shape (2,) ([off, on]), got {values.shape}")
    axis = attrs["axis"]
    rank = indices.ndim + 1
    axis = normalize_axis(axis, rank)
    shape = list(indices.shape)
    shape.insert(axis, _onehot_depth(depth))
    return [(tuple(shape), values.dtype)]


def _onehot_reference(x, attrs):
    indices, _, values = x
    depth = int(np.asarray(attrs["depth"]).reshape(-1)[0])
    axis = normalize_axis(attrs["axis"], indices.ndim + 1)
    position = np.trunc(indices.astype(np.float64)) if indices.dtype.kind == "f" else indices.astype(np.int64)
    with np.errstate(invalid="ignore"):
        valid = (position >= -depth) & (position < depth)
    position = np.where(valid, position, 0).astype(np.int64)
    position = np.where(position < 0, position + depth, position)
    classes = np.arange(depth).reshape((depth,) + (1,) * (indices.ndim - axis))
    hot = (np.expand_dims(position, axis) == classes) & np.expand_dims(valid, axis)
    return [np.where(hot, values[1], values[0])]


def _onehot_cases(dtype, rng):
    values = t.random(rng, (2,), dtype)
    if dtype == BOOL:
        values = np.array([False, True])
    elif values[0] == values[1]:
        values = np.array([0, 1]).astype(dtype)
    depth = np.array(5, dtype=np.int64)

    def idx(shape, index_dtype=I64, low=-7, high=7):
        return t.random(rng, shape, index_dtype, low, high)

    return [
        Case("last_axis", [idx((3, 4)), depth, values]),
        Case("axis0", [idx((3, 4)), depth, values], {"axis": 0}),
        Case("middle_axis", [idx((2, 3, 4)), depth, values], {"axis": 1}),
        Case("negative_axis", [idx((3, 4)), depth, values], {"axis": -2}),
        Case("negative_indices", [np.array([-1, -5, -3, 0, 4], dtype=np.int64), depth, values]),
        Case("out_of_range", [np.array([5, -6, 100, -100, 2**40], dtype=np.int64), depth, values]),
        Case("int32_indices", [idx((4, 3), I32), np.array(6, dtype=np.int32), values]),
        Case("float_indices", [np.array([[0.7, -1.5, 4.99, 5.0], [-5.9, -6.0, np.nan, np.inf]],
                                        dtype=np.float32), depth, values], {"axis": 0}),
        Case("float_depth", [idx((6,)), np.array(4.8, dtype=np.float32), values]),
        Case("scalar_indices", [np.array(2, dtype=np.int64), depth, values]),
        Case("empty", [idx((0, 3)), depth, values]),
        Case("large", [idx((331, 37), I64, -40, 40), np.array(37, dtype=np.int64), values], {"axis": 1}),
    ]


register(OpSpec(
    name="OneHot", category="shape", opset=13,
    inputs=(Input("indices"), Input("depth", host=True, doc="a scalar; a float one is truncated"),
            Input("values", doc="[off_value, on_value]")),
    outputs=("output",),
    dtypes=ALL, key=2,
    attrs=(Attr("axis", "int", -1, doc="where the one-hot dim goes, in [-r-1, r]"),),
    infer=_onehot_infer, reference=_onehot_reference, cases=_onehot_cases,
    doc="(OneHot-11, unchanged through opset 23.) "
        "output[..., i, ...] = on_value where i (on axis) is the index, off_value elsewhere. "
        "Indices of any numeric dtype; float indices are truncated toward zero. An index in "
        "[-depth, -1] counts from the end; one outside [-depth, depth-1] (NaN and inf included) "
        "gives an all-off row. The key dtype is the values'.",
))


# -- DepthToSpace, SpaceToDepth -------------------------------------------------------------------


def _depth_to_space_infer(inputs, attrs):
    x = inputs[0]
    if x.ndim != 4:
        raise ValueError(f"input must be 4-D [N, C, H, W], got shape {x.shape}")
    b = attrs["blocksize"]
    n, c, h, w = x.shape
    if c % (b * b):
        raise ValueError(f"channels {c} are not a multiple of blocksize**2 = {b * b}")
    return [((n, c // (b * b), h * b, w * b), x.dtype)]


def _depth_to_space_reference(x, attrs):
    b = attrs["blocksize"]
    n, c, h, w = x[0].shape
    if attrs["mode"] == "DCR":
        tmp = x[0].reshape(n, b, b, c // (b * b), h, w).transpose(0, 3, 4, 1, 5, 2)
    else:
        tmp = x[0].reshape(n, c // (b * b), b, b, h, w).transpose(0, 1, 4, 2, 5, 3)
    return [tmp.reshape(n, c // (b * b), h * b, w * b)]


def _space_to_depth_infer(inputs, attrs):
    x = inputs[0]
    if x.ndim != 4:
        raise ValueError(f"input must be 4-D [N, C, H, W], got shape {x.shape}")
    b = attrs["blocksize"]
    n, c, h, w = x.shape
    if h % b or w % b:
        raise ValueError(f"height {h} and width {w} must be multiples of blocksize {b}")
    return [((n, c * b * b, h // b, w // b), x.dtype)]


def _space_to_depth_reference(x, attrs):
    b = attrs["blocksize"]
    n, c, h, w = x[0].shape
    tmp = x[0].reshape(n, c, h // b, b, w // b, b)
    tmp = tmp.transpose(0, 3, 5, 1, 2, 4) if attrs["mode"] == "DCR" else tmp.transpose(0, 1, 3, 5, 2, 4)
    return [tmp.reshape(n, c * b * b, h // b, w // b)]


def _positive(value):
    return None if value > 0 else f"must be positive, got {value}"


def _depth_to_space_cases(dtype, rng):
    r = lambda *shape: _special_or_random(dtype, rng, shape)
    return [
        Case("dcr", [r(1, 8, 2, 3)], {"blocksize": 2}),
        Case("crd", [r(2, 8, 3, 2)], {"blocksize": 2, "mode": "CRD"}),
        Case("dcr_block3", [r(1, 18, 2, 2)], {"blocksize": 3}),
        Case("crd_block3", [r(1, 18, 2, 2)], {"blocksize": 3, "mode": "CRD"}),
        Case("block1", [r(2, 3, 2, 2)], {"blocksize": 1}),
        Case("empty", [r(0, 4, 2, 2)], {"blocksize": 2}),
        Case("large", [r(2, 36, 41, 43)], {"blocksize": 3, "mode": "CRD"}),
    ]


def _space_to_depth_cases(dtype, rng):
    r = lambda *shape: _special_or_random(dtype, rng, shape)
    return [
        Case("block2", [r(1, 2, 4, 6)], {"blocksize": 2}),
        Case("block2_crd", [r(1, 2, 4, 6)], {"blocksize": 2, "mode": "CRD"}),
        Case("block3", [r(2, 3, 6, 3)], {"blocksize": 3}),
        Case("block3_crd", [r(2, 3, 6, 3)], {"blocksize": 3, "mode": "CRD"}),
        Case("block1", [r(2, 3, 2, 2)], {"blocksize": 1}),
        Case("empty", [r(1, 0, 4, 4)], {"blocksize": 2}),
        Case("large", [r(2, 4, 123, 129)], {"blocksize": 3}),
    ]


register(OpSpec(
    name="DepthToSpace", category="shape", opset=13,
    inputs=(Input("input", doc="[N, C, H, W]"),), outputs=("output",),
    dtypes=ALL,
    attrs=(Attr("blocksize", "int", REQUIRED, check=_positive),
           Attr("mode", "string", "DCR", choices=("DCR", "CRD"))),
    infer=_depth_to_space_infer, reference=_depth_to_space_reference, cases=_depth_to_space_cases,
    doc="Moves blocksize x blocksize blocks of channels into space: [N, C, H, W] -> "
        "[N, C/b^2, H*b, W*b], channels ordered depth-column-row (DCR) or column-row-depth (CRD).",
))

register(OpSpec(
    name="SpaceToDepth", category="shape", opset=13,
    inputs=(Input("input", doc="[N, C, H, W]"),), outputs=("output",),
    dtypes=ALL,
    attrs=(Attr("blocksize", "int", REQUIRED, check=_positive),
           Attr("mode", "string", "DCR", choices=("DCR", "CRD"), doc="from opset 28; DCR is opset 13's")),
    infer=_space_to_depth_infer, reference=_space_to_depth_reference, cases=_space_to_depth_cases,
    doc="The inverse of DepthToSpace: [N, C, H, W] -> [N, C*b^2, H/b, W/b], output channels "
        "ordered depth-column-row (DCR, opset 13) or column-row-depth (CRD, opset 28's mode).",
))


# -- NonZero -----------------------------------------------------------------------------------------


def _nonzero_infer(inputs, attrs):
    x = inputs[0]
    return [((x.ndim, int(np.count_nonzero(x.value != 0))), I64)]


def _nonzero_reference(x, attrs):
    if x[0].ndim == 0:
        return [np.zeros((0, int(x[0] != 0)), dtype=np.int64)]
    return [np.array(np.nonzero(x[0]), dtype=np.int64)]


def _nonzero_cases(dtype, rng):
    def sparse(*shape):
        values = t.random(rng, shape, dtype)
        return np.where(rng.random(shape) < 0.5, values, np.zeros((), dtype)).astype(dtype)

    cases = [
        Case("matrix", [sparse(4, 5)]),
        Case("vector", [sparse(17)]),
        Case("rank4", [sparse(2, 3, 1, 4)]),
        Case("all_zero", [np.zeros((3, 4), dtype)]),
        Case("all_nonzero", [np.ones((3, 4), dtype)]),
        Case("scalar_nonzero", [np.ones((), dtype)]),
        Case("scalar_zero", [np.zeros((), dtype)]),
        Case("empty", [np.ones((0, 3), dtype)]),
        Case("large", [sparse(*LARGE)]),
    ]
    if t.is_float(dtype):
        cases.append(Case("special", [t.special_values(dtype).reshape(3, 5)]))
    return cases


register(OpSpec(
    name="NonZero", category="shape", opset=13,
    inputs=(Input("X", read_by_infer=True),), outputs=("Y",),
    dtypes=ALL,
    infer=_nonzero_infer, reference=_nonzero_reference, cases=_nonzero_cases,
    doc="The indices of the nonzero elements, [rank, count] int64 in row-major order. NaN is "
        "nonzero, -0 is zero. A scalar has rank 0: its output is [0, 0 or 1]. The output shape "
        "depends on the data, so the host reads X before the kernel runs (a synchronisation).",
))


# -- Resize --------------------------------------------------------------------------------------------

_RESIZE_DTYPES = (F32, F64, F16, BF16, I8, U8)
_COORDINATE_MODES = ("half_pixel", "half_pixel_symmetric", "pytorch_half_pixel", "align_corners",
                     "asymmetric", "tf_crop_and_resize")


def _resize_geometry(in_shape, roi, scales, sizes, attrs):
    """(axes in processing order, per-dim scale, output shape, roi starts, roi ends).

    ``roi``, ``scales`` and ``sizes`` are lists or None."""
    rank = len(in_shape)
    axes = _axes(attrs.get("axes", range(rank)), rank)
    if (scales is None) == (sizes is None):
        raise ValueError("exactly one of scales and sizes must be given (non-empty)")
    scale = [1.0] * rank
    out = list(in_shape)
    given = scales if scales is not None else sizes
    if len(given) != len(axes):
        raise ValueError(f"{'scales' if scales is not None else 'sizes'} has {len(given)} entries "
                         f"for {len(axes)} axes")
    if scales is not None:
        for a, s in zip(axes, scales):
            if not (math.isfinite(s) and s > 0):
                raise ValueError(f"scale {s} for axis {a} is not a positive number")
            scale[a], out[a] = s, math.floor(in_shape[a] * s)
    else:
        policy = attrs["keep_aspect_ratio_policy"]
        for a, n in zip(axes, sizes):
            if n < 0:
                raise ValueError(f"size {n} for axis {a} is negative")
            if in_shape[a] == 0 and (n or policy != "stretch"):
                raise ValueError(f"axis {a} is empty and cannot be resized to {n}")
        ratios = [n / in_shape[a] if in_shape[a] else 1.0 for a, n in zip(axes, sizes)]
        if policy == "stretch":
            for a, n, ratio in zip(axes, sizes, ratios):
                scale[a], out[a] = ratio, n
        else:
            common = min(ratios) if policy == "not_larger" else max(ratios)
            for a in axes:
                scale[a], out[a] = common, math.floor(common * in_shape[a] + 0.5)
    starts, ends = [0.0] * rank, [1.0] * rank
    if roi is not None:
        if len(roi) != 2 * len(axes):
            raise ValueError(f"roi has {len(roi)} entries; {2 * len(axes)} expected (starts, then ends)")
        if not all(math.isfinite(v) for v in roi):
            raise ValueError(f"roi {roi} has a non-finite entry")
        for i, a in enumerate(axes):
            starts[a], ends[a] = roi[i], roi[len(axes) + i]
    elif attrs["coordinate_transformation_mode"] == "tf_crop_and_resize":
        raise ValueError("coordinate_transformation_mode tf_crop_and_resize needs roi")
    return axes, scale, tuple(out), starts, ends


def _resize_infer(inputs, attrs):
    x, roi, scales, sizes = (list(inputs) + [None] * 4)[:4]
    _, _, out, _, _ = _resize_geometry(
        x.shape,
        _host_floats(roi, "roi") if _present(roi) else None,
        _host_floats(scales, "scales") if _present(scales) else None,
        _host_ints(sizes, "sizes") if _present(sizes) else None,
        attrs)
    return [(out, x.dtype)]


def _source_coordinates(y, mode, scale, n_in, n_out, roi_start, roi_end):
    """Output positions y -> input coordinates (float64), and which are
    outside the input (tf_crop_and_resize only). ``width`` is the fractional
    output length scale * n_in, ONNX's length_resized."""
    width = scale * n_in
    outside = np.zeros(y.shape, bool)
    if mode == "half_pixel":
        x = (y + 0.5) / scale - 0.5
    elif mode == "half_pixel_symmetric":
        adjustment = n_out / width
        center = n_in / 2
        offset = center * (1 - adjustment)
        x = offset + (y + 0.5) / scale - 0.5
    elif mode == "pytorch_half_pixel":
        x = (y + 0.5) / scale - 0.5 if width > 1 else np.zeros_like(y)
    elif mode == "align_corners":
        x = y * (n_in - 1) / (width - 1) if width != 1 else np.zeros_like(y)
    elif mode == "asymmetric":
        x = y / scale
    else:
        if width != 1:
            x = y * (roi_end - roi_start) * (n_in - 1) / (width - 1)
        else:
            x = np.full(y.shape, (roi_end - roi_start) * (n_in - 1) / 2)
        x = x + roi_start * (n_in - 1)
        outside = (x < 0) | (x > n_in - 1)
    return x, outside


def _nearest_index(x, nearest_mode):
    floor = np.floor(x)
    fraction = x - floor
    if nearest_mode == "round_prefer_floor":
        up = fraction > 0.5
    elif nearest_mode == "round_prefer_ceil":
        up = fraction >= 0.5
    elif nearest_mode == "floor":
        up = np.zeros(x.shape, bool)
    else:
        up = fraction > 0
    return floor.astype(np.int64) + up


def _cubic_weights(ratio, a):
    """Keys' cubic convolution weights of the taps at -1, 0, 1, 2 from the
    left neighbour, in ONNX's evaluation order."""
    r1, q, q1 = ratio + 1, 1 - ratio, (1 - ratio) + 1
    return [((a * r1 - 5 * a) * r1 + 8 * a) * r1 - 4 * a,
            ((a + 2) * ratio - (a + 3)) * ratio * ratio + 1,
            ((a + 2) * q - (a + 3)) * q * q + 1,
            ((a * q1 - 5 * a) * q1 + 8 * a) * q1 - 4 * a]


def _filter(kind, x, a):
    x = np.abs(x)
    if kind == "linear":
        return np.clip(1 - x, 0, 1)
    x2 = x * x
    x3 = x * x2
    return np.where(x <= 1, (a + 2) * x3 - (a + 3) * x2 + 1,
                    np.where(x < 2, a * x3 - 5 * a * x2 + 8 * a * x - 4 * a, 0.0))


def _interpolation_taps(x, mode, scale, n_in, attrs):
    """(indices, weights), each [n_out, taps]: the input positions (unclamped)
    and their weights for linear or cubic interpolation at coordinates x."""
    floor = np.floor(x)
    left = np.where(x == floor, x - 1, floor)  # ratio in (0, 1]: prefer the left neighbour
    ratio = x - left
    a = attrs["cubic_coeff_a"]
    if attrs["antialias"]:
        support = 1 if mode == "linear" else 2
        stretch = min(scale, 1.0)
        first = math.floor(-support / stretch) + 1
        offsets = np.arange(first, 2 - first)
        weights = _filter(mode, (offsets[None, :] - ratio[:, None]) * stretch, a)
        total = np.zeros(x.shape)
        for k in range(offsets.size):
            total = total + weights[:, k]
        weights = weights / total[:, None]
    elif mode == "linear":
        offsets = np.array([0, 1])
        weights = np.stack([1 - ratio, ratio], axis=1)
    else:
        offsets = np.array([-1, 0, 1, 2])
        weights = np.stack(_cubic_weights(ratio, a), axis=1)
    indices = left.astype(np.int64)[:, None] + offsets[None, :]
    if attrs["exclude_outside"]:
        weights = np.where((indices < 0) | (indices >= n_in), 0.0, weights)
        total = np.zeros(x.shape)
        for k in range(offsets.size):
            total = total + weights[:, k]
        weights = np.where(total[:, None] != 0, weights / np.where(total == 0, 1, total)[:, None], weights)
    return indices, weights


def _given(attrs, name: str) -> list | None:
    """A reference's optional host input as a list; None when omitted or empty."""
    value = attrs.get(name)
    return None if value is None or np.size(value) == 0 else np.asarray(value).reshape(-1).tolist()


def _resize_reference(x, attrs):
    data = x[0]
    axes, scale, out_shape, starts, ends = _resize_geometry(
        data.shape, _given(attrs, "roi"), _given(attrs, "scales"), _given(attrs, "sizes"), attrs)
    mode, coordinates = attrs["mode"], attrs["coordinate_transformation_mode"]
    fill = attrs["extrapolation_value"]
    integer = data.dtype.kind in "iu"
    result = data
    for axis in axes:
        n_in, n_out = result.shape[axis], out_shape[axis]
        if n_out == 0 or result.size == 0:
            result = np.empty(result.shape[:axis] + (n_out,) + result.shape[axis + 1:], result.dtype)
            continue
        y = np.arange(n_out, dtype=np.float64)
        coordinate, outside = _source_coordinates(y, coordinates, scale[axis], n_in, n_out,
                                                  starts[axis], ends[axis])
        mask_shape = (1,) * axis + (n_out,) + (1,) * (data.ndim - axis - 1)
        if mode == "nearest":
            index = np.clip(_nearest_index(coordinate, attrs["nearest_mode"]), 0, n_in - 1)
            result = np.take(result, index, axis=axis)
            if outside.any():
                filler = _convert(np.round(fill) if integer else np.float64(fill), data.dtype)
                result = np.where(outside.reshape(mask_shape), filler, result)
            continue
        indices, weights = _interpolation_taps(coordinate, mode, scale[axis], n_in, attrs)
        clamped = np.clip(indices, 0, n_in - 1)
        source = result.astype(np.float64)
        total = np.zeros(source.shape[:axis] + (n_out,) + source.shape[axis + 1:])
        with np.errstate(invalid="ignore", over="ignore"):
            for k in range(indices.shape[1]):
                w = weights[:, k].reshape(mask_shape)
                total = total + np.where(w != 0, np.take(source, clamped[:, k], axis=axis) * w, 0.0)
        result = np.where(outside.reshape(mask_shape), fill, total)
    if mode != "nearest" and integer:
        return [_float_to_int(np.round(result.astype(np.float64)), data.dtype)]
    return [result]


def _resize_cases(dtype, rng):
    integer = not t.is_float(dtype)
    low, high = (0, 255) if dtype == U8 else (-128, 127) if dtype == I8 else (-4, 4)

    def image(*shape):
        return t.random(rng, shape, dtype, low, high)

    f = lambda *v: np.array(v, dtype=np.float32)
    z = lambda *v: np.array(v, dtype=np.int64)
    x = image(1, 2, 5, 7)
    cases = []
    for nearest_mode in ("round_prefer_floor", "round_prefer_ceil", "floor", "ceil"):
        cases += [
            Case(f"nearest_up_{nearest_mode}", [x, None, f(1, 1, 2.5, 1.7)], {"nearest_mode": nearest_mode}),
            Case(f"nearest_down_{nearest_mode}", [x, None, f(1, 1, 0.6, 0.45)], {"nearest_mode": nearest_mode}),
        ]
    cases += [Case(f"nearest_{mode}", [x, None, None, z(1, 2, 8, 3)], {"coordinate_transformation_mode": mode})
              for mode in _COORDINATE_MODES if mode != "tf_crop_and_resize"]
    cases += [
        Case("nearest_tf_crop_and_resize", [x, f(0.1, -0.2, 0.9, 1.3), None, z(4, 6)],
             {"coordinate_transformation_mode": "tf_crop_and_resize", "axes": [2, 3],
              "extrapolation_value": 7.0}),
        Case("nearest_axes_reversed", [x, None, f(3.0, 0.5)], {"axes": [-1, -2]}),
        Case("nearest_empty_output", [x, None, None, z(1, 0, 5, 7)]),
        Case("nearest_empty_input", [image(0, 2, 3, 3), None, f(1, 1, 2, 2)]),
        Case("nearest_1d", [image(11), None, f(2.3)], {"nearest_mode": "round_prefer_ceil"}),
    ]
    for case in cases:
        case.tolerance = EXACT  # nearest only copies elements
    linear = [
        Case(f"linear_{mode}", [x, None, f(1, 1, 1.6, 2.5)], {"mode": "linear", "coordinate_transformation_mode": mode})
        for mode in _COORDINATE_MODES if mode != "tf_crop_and_resize"]
    linear += [
        Case(f"linear_down_{mode}", [x, None, None, z(1, 2, 3, 1)], {"mode": "linear", "coordinate_transformation_mode": mode})
        for mode in ("half_pixel", "pytorch_half_pixel", "align_corners")]
    linear += [
        Case("linear_up2", [x, None, f(1, 1, 2, 2)], {"mode": "linear"}),
        Case("linear_down_scales", [x, None, f(1, 1, 0.6, 0.5)], {"mode": "linear"}),
        Case("linear_tf_crop_and_resize", [x, f(0, 0, 0.2, 0.1, 1, 1, 0.9, 1.2), None, z(1, 2, 4, 5)],
             {"mode": "linear", "coordinate_transformation_mode": "tf_crop_and_resize",
              "extrapolation_value": -1.0}),
        Case("linear_1d", [image(2, 3, 9), None, f(1.7)], {"mode": "linear", "axes": [2]}),
        Case("linear_3d", [image(1, 2, 3, 4, 5), None, f(1.5, 0.8, 2.0)], {"mode": "linear", "axes": [2, 3, 4]}),
        Case("linear_not_larger", [x, None, None, z(7, 7)],
             {"mode": "linear", "axes": [2, 3], "keep_aspect_ratio_policy": "not_larger"}),
        Case("linear_not_smaller", [x, None, None, z(7, 7)],
             {"mode": "linear", "axes": [2, 3], "keep_aspect_ratio_policy": "not_smaller"}),
        Case("linear_antialias_down", [image(1, 1, 12, 17), None, f(1, 1, 0.3, 0.45)],
             {"mode": "linear", "antialias": 1}),
        Case("linear_antialias_up", [x, None, f(1, 1, 1.5, 2)], {"mode": "linear", "antialias": 1}),
        Case("linear_exclude_outside", [x, None, f(1, 1, 1.5, 2)], {"mode": "linear", "exclude_outside": 1}),
        Case("cubic_up", [x, None, f(1, 1, 2, 1.5)], {"mode": "cubic"}),
        Case("cubic_down", [image(1, 1, 9, 8), None, f(1, 1, 0.5, 0.7)], {"mode": "cubic"}),
        Case("cubic_align_corners", [x, None, f(1, 1, 1.4, 0.8)],
             {"mode": "cubic", "coordinate_transformation_mode": "align_corners"}),
        Case("cubic_exclude_outside", [x, None, f(1, 1, 2, 2)],
             {"mode": "cubic", "exclude_outside": 1, "cubic_coeff_a": -0.5}),
        Case("cubic_antialias_down", [image(1, 1, 12, 10), None, f(1, 1, 0.4, 0.6)],
             {"mode": "cubic", "antialias": 1}),
        Case("linear_large", [image(1, 3, 160, 200), None, f(1, 1, 1.3, 0.9)], {"mode": "linear"}),
    ]
    if not integer:
        special = t.special_values(dtype)
        linear.append(Case("linear_special", [np.resize(special, (1, 1, 4, 6)), None, f(1, 1, 1.5, 2)],
                           {"mode": "linear"}))
        cases.append(Case("nearest_special", [np.resize(special, (1, 1, 4, 6)), None, f(1, 1, 1.5, 2)],
                          tolerance=EXACT))
    return cases + linear


register(OpSpec(
    name="Resize", category="shape", opset=19,
    inputs=(Input("X"), Input("roi", optional=True, host=True, doc="float: starts, then ends"),
            Input("scales", optional=True, host=True, doc="float"),
            Input("sizes", optional=True, host=True, doc="int64")),
    outputs=("Y",),
    dtypes=_RESIZE_DTYPES,
    attrs=(Attr("antialias", "int", 0, choices=(0, 1)),
           Attr("axes", "ints", None, doc="the dims roi/scales/sizes refer to; default all"),
           Attr("coordinate_transformation_mode", "string", "half_pixel", choices=_COORDINATE_MODES),
           Attr("cubic_coeff_a", "float", -0.75),
           Attr("exclude_outside", "int", 0, choices=(0, 1)),
           Attr("extrapolation_value", "float", 0.0),
           Attr("keep_aspect_ratio_policy", "string", "stretch", choices=("stretch", "not_larger", "not_smaller")),
           Attr("mode", "string", "nearest", choices=("nearest", "linear", "cubic")),
           Attr("nearest_mode", "string", "round_prefer_floor",
                choices=("round_prefer_floor", "round_prefer_ceil", "floor", "ceil"))),
    infer=_resize_infer, reference=_resize_reference, cases=_resize_cases,
    # Nearest cases are exact. Linear and cubic admit coordinates, weights and
    # sums in float32, as common runtimes compute them: such an implementation
    # measures up to 7.8e-5 (float32), 2e-3 (float16, 1 ulp), 1.6e-2 (bfloat16,
    # 1 ulp) on these cases (|x| <= 4); float64 allows another order of
    # operations. The cpu plugin computes in float64 and measures 0 (1 ulp in
    # bfloat16, from the comparison's own float64 -> bfloat16 rounding).
    tolerance={"float64": Tolerance(rtol=1e-12, atol=1e-12), "float32": Tolerance(rtol=1e-4, atol=1e-4),
               "float16": Tolerance(ulp=1, atol=4e-3), "bfloat16": Tolerance(ulp=1, atol=3e-2)},
    doc="ONNX Resize (opset 19): nearest (every nearest_mode), linear and cubic (N-linear / "
        "N-cubic, separable, one axis at a time in the order of axes), antialias, "
        "exclude_outside, every coordinate_transformation_mode, keep_aspect_ratio_policy, axes. "
        "Exactly one of scales and sizes (an empty tensor counts as omitted); output length: "
        "floor(length * scale), or the size. ONNX's length_resized is scale * length (fractional, "
        "as ONNX's reference computes it); pytorch_half_pixel maps to 0 when it is <= 1. Linear "
        "and cubic compute in float64, taps of weight exactly 0 are skipped (an inf neighbour does "
        "not turn into NaN), and integer results round half to even and saturate. antialias "
        "applies to linear and cubic; nearest ignores it.",
))
