"""Reductions and scans: Reduce*, ArgMax, ArgMin, CumSum, TopK, and the
softmax family (Softmax, LogSoftmax, Hardmax).

Conventions of the family:

- Float sums and products accumulate in float64 or better, for every float
  dtype, and float16/bfloat16/float32 results are rounded once; a kernel
  that accumulates in the storage type fails the long-sum cases.
- Integer ReduceSum, ReduceProd, ReduceL1, ReduceSumSquare and CumSum wrap in
  two's complement, as NumPy does with ``dtype=`` the input's (|INT_MIN| is
  INT_MIN). Integer ReduceMean is the exact mean truncated toward zero (its
  sum is held in 64 bits); integer ReduceL2 is the root truncated toward
  zero, saturated at the dtype's maximum.
- Reducing an empty set gives the identity: 0 (Sum, SumSquare, L1, L2), 1
  (Prod), -inf or the dtype's minimum (Max), +inf or the maximum (Min), -inf
  (LogSumExp); float ReduceMean gives NaN (0/0); integer ReduceMean of an
  empty set is an error, as is ArgMax/ArgMin along an empty axis.
- NaN propagates through reductions (Max and Min included, as NumPy's
  max/min). ArgMax and ArgMin treat NaN as the extreme both ways, as NumPy:
  the first NaN wins, the last with select_last_index. TopK orders NaN
  above every number (NumPy's sort order).
"""

from __future__ import annotations

import numpy as np

from . import testing as t
from .spec import (ALL_FLOAT, BOOL, I64, INT, Attr, Case, Input, OpSpec, TensorInfo, Tolerance, normalize_axis,
                   register)

EXACT = Tolerance()
NUMERIC = ALL_FLOAT + INT
LARGE = (1031, 67)       # crosses vector widths in both dims
HUGE = 100_003           # above 1e5 elements


def _flag(name: str, default: int, doc: str) -> Attr:
    return Attr(name, "int", default, choices=(0, 1), doc=doc)


def _axes_array(*axes: int) -> np.ndarray:
    return np.array(axes, dtype=np.int64)


def _host_ints(info: TensorInfo, name: str, *, scalar: bool = False) -> list[int]:
    """The integers of host input ``name`` (one of them when ``scalar``)."""
    value = np.asarray(info.value)
    if value.size and value.dtype.kind not in "iu":
        raise TypeError(f"{name} must hold integers, got {value.dtype}")
    if value.ndim > 1:
        raise ValueError(f"{name} must be a 1-D tensor, got shape {value.shape}")
    if scalar and value.size != 1:
        raise ValueError(f"{name} must hold one value, got {value.size}")
    return [int(v) for v in value.reshape(-1)]


def _ref_int(value) -> int:
    return int(np.asarray(value).reshape(-1)[0])


# -- Reduce* ------------------------------------------------------------------------------

_REDUCE_INPUTS = (
    Input("data"),
    Input("axes", optional=True, host=True,
          doc="int64, the axes to reduce (negative counts from the back); omitted or empty: all "
              "axes, or none with noop_with_empty_axes"),
)
_REDUCE_ATTRS = (
    _flag("keepdims", 1, "keep the reduced axes as size-1 dims"),
    _flag("noop_with_empty_axes", 0, "with axes omitted or empty, reduce nothing instead of everything"),
    Attr("axes", "ints", None, doc="the older attribute form of the axes input (before opset 13 for "
                                   "ReduceSum, 18 for the others); give one or the other"),
)


def _reduced_axes(inputs: list[TensorInfo | None], attrs: dict) -> tuple[int, ...]:
    """The reduced dims of data, sorted, from the axes input or attribute."""
    data = inputs[0]
    given = inputs[1] if len(inputs) > 1 else None
    if given is not None and attrs.get("axes") is not None:
        raise ValueError("axes is given both as an input and as an attribute; give one")
    axes = _host_ints(given, "axes") if given is not None else list(attrs.get("axes") or ())
    if not axes:
        return () if attrs["noop_with_empty_axes"] else tuple(range(data.ndim))
    normalized = [normalize_axis(a, data.ndim, "axes value") for a in axes]
    if len(set(normalized)) != len(normalized):
        raise ValueError(f"axes {axes} name an axis twice")
    return tuple(sorted(normalized))


def _reduced_shape(shape, axes, keepdims) -> tuple[int, ...]:
    if keepdims:
        return tuple(1 if d in axes else n for d, n in enumerate(shape))
    return tuple(n for d, n in enumerate(shape) if d not in axes)


def _reduce_infer(inputs, attrs):
    data = inputs[0]
    axes = _reduced_axes(inputs, attrs)
    return [(_reduced_shape(data.shape, axes, attrs["keepdims"]), data.dtype)]


def _mean_infer(inputs, attrs):
    data = inputs[0]
    axes = _reduced_axes(inputs, attrs)
    shape = _reduced_shape(data.shape, axes, attrs["keepdims"])
    empty_set = any(data.shape[d] == 0 for d in axes)
    if data.dtype.kind in "iu" and empty_set and 0 not in shape:
        raise ValueError(f"the mean of an empty set is undefined for integer dtypes (data shape "
                         f"{data.shape}, reduced axes {list(axes)})")
    return [(shape, data.dtype)]


def _ref_axes(x: np.ndarray, attrs: dict) -> tuple[int, ...]:
    axes = np.asarray(attrs.get("axes", ()), dtype=np.int64).reshape(-1)
    if axes.size == 0:
        return () if attrs["noop_with_empty_axes"] else tuple(range(x.ndim))
    return tuple(int(a) + x.ndim if a < 0 else int(a) for a in axes)


def _reducer(fn):
    """A reference from fn(x, axes, keepdims)."""
    def reference(inputs, attrs):
        x = inputs[0]
        return [np.asarray(fn(x, _ref_axes(x, attrs), bool(attrs["keepdims"])))]
    return reference


def _lowest(dtype):
    """The identity of max: the least value of dtype."""
    if dtype == BOOL:
        return False
    return np.iinfo(dtype).min if dtype.kind in "iu" else -np.inf


def _highest(dtype):
    """The identity of min: the greatest value of dtype."""
    if dtype == BOOL:
        return True
    return np.iinfo(dtype).max if dtype.kind in "iu" else np.inf


def _mean(x, axes, keep):
    count = int(np.prod([x.shape[a] for a in axes]))
    if x.dtype.kind == "f":
        with np.errstate(invalid="ignore"):
            return np.sum(x, axis=axes, keepdims=keep) / count
    total = np.sum(x, axis=axes, keepdims=keep, dtype=np.int64)
    quotient = total // count
    quotient += (total < 0) & (quotient * count != total)  # floor -> toward zero
    return quotient.astype(x.dtype)


def _l2(x, axes, keep):
    root = np.asarray(np.sqrt(np.sum(np.square(x.astype(np.float64)), axis=axes, keepdims=keep)))
    if x.dtype.kind == "f":
        return root
    top = np.iinfo(x.dtype).max
    result = np.full(root.shape, top, x.dtype)
    below = root < float(top)  # float(top) may round up to 2^63: compare before converting
    result[below] = np.trunc(root[below]).astype(x.dtype)
    return result


def _log_sum_exp(x, axes, keep):
    top = np.max(x, axis=axes, keepdims=True, initial=-np.inf)
    shift = np.where(np.isfinite(top), top, 0.0)
    with np.errstate(divide="ignore"):
        result = shift + np.log(np.sum(np.exp(x - shift), axis=axes, keepdims=True))
    return result if keep else np.squeeze(result, axis=axes)


_REDUCE_REFERENCES = {
    "ReduceSum": lambda x, axes, keep: np.sum(x, axis=axes, keepdims=keep, dtype=x.dtype),
    "ReduceMean": _mean,
    "ReduceMax": lambda x, axes, keep: np.max(x, axis=axes, keepdims=keep, initial=_lowest(x.dtype)),
    "ReduceMin": lambda x, axes, keep: np.min(x, axis=axes, keepdims=keep, initial=_highest(x.dtype)),
    "ReduceProd": lambda x, axes, keep: np.prod(x, axis=axes, keepdims=keep, dtype=x.dtype),
    "ReduceL1": lambda x, axes, keep: np.sum(np.abs(x), axis=axes, keepdims=keep, dtype=x.dtype),
    "ReduceL2": _l2,
    "ReduceSumSquare": lambda x, axes, keep: np.sum(x * x, axis=axes, keepdims=keep, dtype=x.dtype),
    "ReduceLogSumExp": _log_sum_exp,
}


def _reduce_values(op: str, rng, shape, dtype) -> np.ndarray:
    """Random inputs for op: products get factors near 1 in magnitude (odd
    ones for integers, so a wrapped product is not just 0); the rest
    uniform values in [-4, 4]."""
    if op != "ReduceProd" or dtype == BOOL:
        return t.random(rng, shape, dtype)
    if dtype.kind in "iu":
        return rng.choice(np.array([-3, -1, 1, 3]), shape).astype(dtype)
    sign = rng.choice(np.array([-1.0, 1.0]), shape)
    return (sign * np.exp(rng.uniform(-0.1, 0.1, shape))).astype(dtype)


def _long_sum_values(rng, dtype) -> np.ndarray:
    """8192 values in [0.3, 0.4): once a float16 running sum passes 256, each
    term rounds to a multiple of 0.25 or coarser, mostly down, so a float16
    accumulator (one, or a few partial sums) ends tens to hundreds of ulp
    low; float32 or wider accumulators are exact to the last bit here."""
    return rng.uniform(0.3, 0.4, 8192).astype(dtype)


def _special_triples(dtype) -> np.ndarray:
    """Each special value of dtype beside two others: a (n, 3) array."""
    values = t.special_values(dtype)
    return np.stack([values, np.roll(values, 3), np.roll(values, 7)], axis=1)


def _reduce_cases(op: str):
    def cases(dtype, rng):
        r = lambda *shape: _reduce_values(op, rng, shape, dtype)  # noqa: E731
        cases = [
            Case("axis1", [r(3, 4, 5), _axes_array(1)]),
            Case("all_axes_default", [r(3, 4, 5)]),
            Case("axis0", [r(3, 4, 5), _axes_array(0)]),
            Case("last_axis_no_keepdims", [r(3, 4, 5), _axes_array(-1)], {"keepdims": 0}),
            Case("axes_0_2", [r(3, 4, 5), _axes_array(0, 2)]),
            Case("axes_unsorted_negative", [r(2, 3, 4, 5), _axes_array(-1, 1)], {"keepdims": 0}),
            Case("empty_axes_reduce_all", [r(3, 4), _axes_array()], {"keepdims": 0}),
            Case("empty_axes_noop", [r(3, 4), _axes_array()], {"noop_with_empty_axes": 1}),
            Case("no_axes_noop", [r(3, 4)], {"noop_with_empty_axes": 1}),
            Case("axes_attribute", [r(3, 4, 5)], {"axes": [2, 0]}),
            Case("size1_axes", [r(1, 5, 1), _axes_array(0, 2)]),
            Case("scalar", [r()]),
            Case("scalar_no_keepdims", [r()], {"keepdims": 0}),
            Case("empty_kept_axis", [r(2, 0, 4), _axes_array(2)]),
            Case("large_last_axis", [r(*LARGE), _axes_array(-1)]),
            Case("large_first_axis", [r(*LARGE), _axes_array(0)]),
            Case("large_all", [r(HUGE)], {"keepdims": 0}),
        ]
        if not (op == "ReduceMean" and dtype in INT):
            cases += [
                Case("empty_set", [r(2, 0, 4), _axes_array(1)]),
                Case("empty_set_all", [r(0, 3)], {"keepdims": 0}),
            ]
        special = _special_triples(dtype)
        cases += [
            Case("special_rows", [special, _axes_array(1)]),
            Case("special_columns", [special, _axes_array(0)]),
        ]
        if dtype in ALL_FLOAT:
            cases.append(Case("long_sum_similar_magnitude", [_long_sum_values(rng, dtype)], {"keepdims": 0}))
        return cases
    return cases


_REDUCE_DOCS = {
    "ReduceSum": "Sum over axes.",
    "ReduceMean": "Mean over axes (integers: truncated toward zero).",
    "ReduceMax": "Maximum over axes; NaN propagates; bool: False < True (opset 20).",
    "ReduceMin": "Minimum over axes; NaN propagates; bool: False < True (opset 20).",
    "ReduceProd": "Product over axes.",
    "ReduceL1": "Sum of absolute values over axes.",
    "ReduceL2": "Square root of the sum of squares over axes (integers: truncated, saturated).",
    "ReduceSumSquare": "Sum of squares over axes.",
    "ReduceLogSumExp": "log(sum(exp(x))) over axes, computed as m + log(sum(exp(x - m))) with m the "
                       "maximum when finite (else 0): +inf in the set gives +inf, a set of -inf "
                       "gives -inf, NaN propagates.",
}
_REDUCE_OPSETS = {"ReduceSum": 13, "ReduceMax": 20, "ReduceMin": 20}
_REDUCE_DTYPES = {"ReduceMax": NUMERIC + (BOOL,), "ReduceMin": NUMERIC + (BOOL,),
                  "ReduceLogSumExp": ALL_FLOAT}

# Measured on the cpu plugin: float32/float16/bfloat16 results, summed in
# double and rounded once, are correctly rounded in every case; 1 ulp leaves
# room for a float32-or-wider sum that crosses a rounding boundary, while
# float16 accumulation misses by 2 to 380 ulp here. float64 sums and products
# over 1e5 terms measure up to 2.5e-14 relative; the atol covers sums that
# cancel to near 0.
_SUM_TOLERANCE = {
    "float32": Tolerance(ulp=1),
    "float16": Tolerance(ulp=1),
    "bfloat16": Tolerance(ulp=1),
    "float64": Tolerance(rtol=1e-13, atol=1e-13),
}
_REDUCE_TOLERANCES = {"ReduceMax": EXACT, "ReduceMin": EXACT}

for _op, _reference in _REDUCE_REFERENCES.items():
    register(OpSpec(
        name=_op, category="reduce", opset=_REDUCE_OPSETS.get(_op, 18),
        inputs=_REDUCE_INPUTS, outputs=("reduced",), attrs=_REDUCE_ATTRS,
        dtypes=_REDUCE_DTYPES.get(_op, NUMERIC),
        infer=_mean_infer if _op == "ReduceMean" else _reduce_infer,
        reference=_reducer(_reference),
        cases=_reduce_cases(_op),
        tolerance=_REDUCE_TOLERANCES.get(_op, _SUM_TOLERANCE),
        doc=_REDUCE_DOCS[_op] + " The axes input (or, in the older form, attribute) lists the "
            "reduced axes; none reduces all of them, or none with noop_with_empty_axes=1.",
    ))


# -- ArgMax / ArgMin ------------------------------------------------------------------------

def _arg_infer(inputs, attrs):
    data = inputs[0]
    axis = normalize_axis(attrs["axis"], data.ndim)
    shape = _reduced_shape(data.shape, (axis,), attrs["keepdims"])
    if data.shape[axis] == 0 and 0 not in shape:
        raise ValueError(f"axis {attrs['axis']} of data shape {data.shape} is empty: there is no extreme to index")
    return [(shape, I64)]


def _arg_reference(find):
    def reference(inputs, attrs):
        x = inputs[0]
        axis = normalize_axis(attrs["axis"], x.ndim)
        if x.shape[axis] == 0:  # then the output is empty (infer checked)
            index = np.zeros(x.shape[:axis] + x.shape[axis + 1:], np.int64)
        elif attrs["select_last_index"]:
            index = x.shape[axis] - 1 - find(np.flip(x, axis), axis=axis)
        else:
            index = find(x, axis=axis)
        if attrs["keepdims"]:
            index = np.expand_dims(index, axis)
        return [np.asarray(index, dtype=np.int64)]
    return reference


def _small_values(rng, shape, dtype) -> np.ndarray:
    """Values from {0, 1, 2}: many ties."""
    return rng.integers(0, 3, shape).astype(dtype)


def _special_grid(dtype) -> np.ndarray:
    """Each row the special values in another rotation, some with a second NaN
    and some without any, so NaN's position and count vary."""
    values = t.special_values(dtype).astype(np.float64)
    grid = np.stack([np.roll(values, i) for i in range(values.size)])
    grid[::3, 5] = np.nan
    grid[1::3][np.isnan(grid[1::3])] = 0.0
    return grid.astype(dtype)


def _arg_cases(dtype, rng):
    r = lambda *shape: t.random(rng, shape, dtype)  # noqa: E731
    ties = _small_values(rng, (6, 7), dtype)
    cases = [
        Case("default_axis", [r(3, 4, 5)]),
        Case("last_axis_no_keepdims", [r(3, 4, 5)], {"axis": -1, "keepdims": 0}),
        Case("middle_axis_select_last", [r(3, 4, 5)], {"axis": 1, "select_last_index": 1}),
        Case("ties_first", [ties], {"axis": 1}),
        Case("ties_last", [ties], {"axis": 1, "select_last_index": 1}),
        Case("ties_axis0_last", [ties], {"axis": 0, "select_last_index": 1, "keepdims": 0}),
        Case("size1_axis", [r(4, 1)], {"axis": 1}),
        Case("empty_outer", [r(0, 5)], {"axis": 1}),
        Case("empty_inner", [r(5, 0)], {"axis": 0}),
        Case("empty_axis_and_output", [r(0, 0)], {"axis": 1, "keepdims": 0}),
        Case("large_last_axis", [r(*LARGE)], {"axis": -1}),
        Case("large_first_axis", [r(*LARGE)], {"axis": 0, "select_last_index": 1}),
        Case("large_1d", [r(HUGE)]),
    ]
    if dtype in ALL_FLOAT:
        grid = _special_grid(dtype)
        cases += [
            Case("special_rows", [grid], {"axis": 1}),
            Case("special_rows_select_last", [grid], {"axis": 1, "select_last_index": 1}),
            Case("special_columns", [grid], {"axis": 0}),
        ]
    else:
        cases.append(Case("extremes", [_special_triples(dtype)], {"axis": 1}))
    return cases


_ARG_ATTRS = (
    Attr("axis", "int", 0, doc="the reduced axis; negative counts from the back"),
    _flag("keepdims", 1, "keep the reduced axis as a size-1 dim"),
    _flag("select_last_index", 0, "on ties, the last index instead of the first"),
)

for _op, _find, _what in (("ArgMax", np.argmax, "largest"), ("ArgMin", np.argmin, "smallest")):
    register(OpSpec(
        name=_op, category="reduce", opset=13,
        inputs=(Input("data"),), outputs=("reduced",), attrs=_ARG_ATTRS,
        dtypes=NUMERIC,
        infer=_arg_infer, reference=_arg_reference(_find), cases=_arg_cases,
        doc=f"int64 index of the {_what} element along axis: the first on ties, the last with "
            f"select_last_index. NaN counts as the {_what} (NumPy's rule): the first NaN wins, the "
            f"last with select_last_index. An empty axis is an error unless the output is empty.",
    ))


# -- CumSum -----------------------------------------------------------------------------------

def _cumsum_infer(inputs, attrs):
    data = inputs[0]
    (axis,) = _host_ints(inputs[1], "axis", scalar=True)
    normalize_axis(axis, data.ndim)
    return [(data.shape, data.dtype)]


def _cumsum_reference(inputs, attrs):
    x = inputs[0]
    axis = normalize_axis(_ref_int(attrs["axis"]), x.ndim)
    if attrs["reverse"]:
        x = np.flip(x, axis)
    y = np.cumsum(x, axis=axis, dtype=x.dtype)
    if attrs["exclusive"]:  # exclusive[i] = inclusive[i - 1], exclusive[0] = 0
        source, target = [slice(None)] * x.ndim, [slice(None)] * x.ndim
        source[axis], target[axis] = slice(0, -1), slice(1, None)
        shifted = np.zeros_like(y)
        shifted[tuple(target)] = y[tuple(source)]
        y = shifted
    if attrs["reverse"]:
        y = np.flip(y, axis)
    return [y]


def _cumsum_cases(dtype, rng):
    r = lambda *shape: t.random(rng, shape, dtype)  # noqa: E731
    axis = lambda a: np.array(a, dtype=np.int64)  # noqa: E731
    x = r(4, 6)
    cases = [
        Case("axis1", [x, axis(1)]),
        Case("1d", [r(10), axis(0)]),
        Case("axis0", [x, axis(0)]),
        Case("negative_axis_int32", [x, np.array(-1, dtype=np.int32)]),
        Case("exclusive", [x, axis(1)], {"exclusive": 1}),
        Case("reverse", [x, axis(0)], {"reverse": 1}),
        Case("reverse_exclusive", [r(3, 5, 4), axis(1)], {"reverse": 1, "exclusive": 1}),
        Case("axis_as_1d", [r(3, 5, 4), np.array([2], dtype=np.int64)]),
        Case("size1_axis", [r(5, 1), axis(1)]),
        Case("empty", [r(0, 5), axis(1)]),
        Case("empty_axis", [r(3, 0), axis(1)], {"exclusive": 1}),
        Case("large_last_axis", [r(*LARGE), axis(-1)]),
        Case("large_first_axis", [r(*LARGE), axis(0)], {"reverse": 1}),
        Case("large_1d", [r(HUGE), axis(0)]),
    ]
    if dtype in ALL_FLOAT:
        cases += [
            Case("special", [_special_triples(dtype), axis(1)]),
            Case("special_exclusive_reverse", [_special_triples(dtype), axis(0)],
                 {"exclusive": 1, "reverse": 1}),
            Case("long_sum_similar_magnitude", [_long_sum_values(rng, dtype), axis(0)]),
        ]
    else:
        cases.append(Case("wrap", [_special_triples(dtype), axis(0)]))
    return cases


register(OpSpec(
    name="CumSum", category="reduce", opset=14,
    inputs=(Input("x"), Input("axis", host=True, doc="int32 or int64, one value: the scanned axis")),
    outputs=("y",),
    attrs=(_flag("exclusive", 0, "leave each element out of its own sum (the first is 0)"),
           _flag("reverse", 0, "sum from the end of the axis")),
    dtypes=NUMERIC,
    infer=_cumsum_infer,
    reference=_cumsum_reference,
    cases=_cumsum_cases,
    tolerance=_SUM_TOLERANCE,
    doc="Running sums along axis; integers wrap. Float results are each rounded once from a "
        "float64 (or better) running sum.",
))


# -- TopK -------------------------------------------------------------------------------------

def _topk_infer(inputs, attrs):
    data = inputs[0]
    axis = normalize_axis(attrs["axis"], data.ndim)
    (k,) = _host_ints(inputs[1], "K", scalar=True)
    if not 0 <= k <= data.shape[axis]:
        raise ValueError(f"K {k} is out of range for axis {attrs['axis']} of size {data.shape[axis]}")
    shape = data.shape[:axis] + (k,) + data.shape[axis + 1:]
    return [(shape, data.dtype), (shape, I64)]


def _topk_reference(inputs, attrs):
    x = inputs[0]
    axis = normalize_axis(attrs["axis"], x.ndim)
    k = _ref_int(attrs["K"])
    if attrs["largest"]:
        # Descending with ties by lower index: a stable ascending sort of the
        # reversed axis, read backwards. NaN, sorted last, comes first.
        n = x.shape[axis]
        order = n - 1 - np.flip(np.argsort(np.flip(x, axis), axis=axis, kind="stable"), axis)
    else:
        order = np.argsort(x, axis=axis, kind="stable")
    indices = np.take(order, np.arange(k), axis=axis)
    return [np.take_along_axis(x, indices, axis), indices.astype(np.int64)]


def _distinct(rng, n: int, dtype) -> np.ndarray | None:
    """n distinct values of dtype in random order, or None if it has too few."""
    if dtype in ALL_FLOAT:
        if dtype.itemsize == 2:  # every finite 16-bit value in [-8, 8]
            every = np.arange(1 << 16, dtype=np.uint16).view(dtype)
            with np.errstate(invalid="ignore"):
                wide = every.astype(np.float64)
            pool = np.unique(every[np.isfinite(wide) & (np.abs(wide) <= 8)])
        else:
            pool = np.unique(rng.uniform(-8, 8, 2 * n).astype(dtype))
    else:
        info = np.iinfo(dtype)
        pool = np.arange(max(info.min, -1000), min(info.max, 1000) + 1).astype(dtype)
    return rng.choice(pool, n, replace=False) if pool.size >= n else None


def _distinct_along(rng, shape, axis, dtype) -> tuple[np.ndarray, bool]:
    """Values that do not repeat along axis (each slice a permutation of one
    set) and True; random values and False where the dtype has too few."""
    values = _distinct(rng, shape[axis], dtype)
    if values is None:
        return t.random(rng, shape, dtype), False
    along = [1] * len(shape)
    along[axis] = shape[axis]
    tiled = np.broadcast_to(values.reshape(along), shape)
    return rng.permuted(tiled, axis=axis), True


def _topk_cases(dtype, rng):
    k = lambda n: np.array([n], dtype=np.int64)  # noqa: E731

    def case(name, shape, kk, attrs=None, axis=-1):
        # Indices are compared only where no value repeats along the axis
        # (ONNX orders ties by index, but conformance leaves that open).
        x, tie_free = _distinct_along(rng, shape, axis, dtype)
        return Case(name, [x, k(kk)], attrs or {}, compare=None if tie_free else (0,))

    ties = _small_values(rng, (6, 10), dtype)
    cases = [
        case("default", (3, 12), 4),
        case("smallest", (3, 12), 4, {"largest": 0}),
        case("axis0", (12, 5), 3, {"axis": 0}, axis=0),
        case("middle_axis_negative", (2, 9, 3), 2, {"axis": -2}, axis=1),
        case("k_equals_axis", (4, 7), 7),
        case("k_equals_axis_smallest", (4, 7), 7, {"largest": 0}),
        case("k_zero", (4, 7), 0),
        case("unsorted_k1", (4, 7), 1, {"sorted": 0}),
        case("size1_axis", (5, 1), 1),
        case("empty_outer", (0, 6), 2),
        case("empty_axis", (4, 0), 0),
        Case("ties", [ties, k(5)], compare=(0,)),
        Case("ties_smallest", [ties, k(5)], {"largest": 0}, compare=(0,)),
        case("large_last_axis", LARGE, 10),
        case("large_first_axis", LARGE, 5, {"axis": 0}, axis=0),
        case("large_1d", (HUGE,), 50, {"largest": 0}),
    ]
    if dtype in ALL_FLOAT:
        grid = _special_grid(dtype)
        cases += [
            Case("special", [grid, k(6)], compare=(0,)),
            Case("special_smallest", [grid, k(6)], {"largest": 0}, compare=(0,)),
        ]
    return cases


register(OpSpec(
    name="TopK", category="reduce", opset=13,  # TopK-11, unchanged through opset 23
    inputs=(Input("X"), Input("K", host=True, doc="int64, one value: how many to take")),
    outputs=("Values", "Indices"),
    attrs=(Attr("axis", "int", -1, doc="the axis to select along; negative counts from the back"),
           _flag("largest", 1, "the largest values (0: the smallest)"),
           _flag("sorted", 1, "return them in order (0: any order)")),
    dtypes=NUMERIC,
    infer=_topk_infer, reference=_topk_reference, cases=_topk_cases,
    doc="The K largest (or smallest) elements along axis and their int64 indices, best first; "
        "equal values by lower index first. NaN orders above every number (NumPy's sort order). "
        "With sorted=0 the order is unspecified (the cpu plugin sorts).",
))


# -- Softmax, LogSoftmax, Hardmax ----------------------------------------------------------------

def _softmax_infer(inputs, attrs):
    normalize_axis(attrs["axis"], inputs[0].ndim)
    return [(inputs[0].shape, inputs[0].dtype)]


def _softmax(inputs, attrs):
    x = inputs[0]
    axis = normalize_axis(attrs["axis"], x.ndim)
    e = np.exp(x - np.max(x, axis=axis, keepdims=True, initial=-np.inf))
    return [e / np.sum(e, axis=axis, keepdims=True)]


def _log_softmax(inputs, attrs):
    x = inputs[0]
    axis = normalize_axis(attrs["axis"], x.ndim)
    shifted = x - np.max(x, axis=axis, keepdims=True, initial=-np.inf)
    with np.errstate(divide="ignore"):
        return [shifted - np.log(np.sum(np.exp(shifted), axis=axis, keepdims=True))]


def _hardmax(inputs, attrs):
    x = inputs[0]
    axis = normalize_axis(attrs["axis"], x.ndim)
    y = np.zeros_like(x)
    if x.size:
        np.put_along_axis(y, np.expand_dims(np.argmax(x, axis=axis), axis), 1, axis)
    return [y]


def _softmax_special(dtype) -> np.ndarray:
    """Rows with -inf beside finite values, only -inf, NaN, +inf, signed
    zeros, and the dtype's extremes."""
    info = t.finfo(dtype)
    rows = [
        [-np.inf, 0.0, 1.0, -np.inf],
        [-np.inf, -np.inf, -np.inf, -np.inf],
        [np.nan, 0.0, 1.0, 2.0],
        [np.inf, 0.0, 1.0, 2.0],
        [-0.0, 0.0, 1.0, 1.0],
        [float(info.max), float(-info.max), float(info.tiny), float(info.smallest_subnormal)],
        [float(info.tiny), float(-info.tiny), float(info.smallest_subnormal), 0.0],
    ]
    return np.array(rows).astype(dtype)


def _softmax_cases(op: str):
    def cases(dtype, rng):
        r = lambda *shape: t.random(rng, shape, dtype)  # noqa: E731
        cases = [
            Case("default_axis", [r(3, 4, 5)]),
            Case("axis0", [r(3, 4, 5)], {"axis": 0}),
            Case("axis1", [r(3, 4, 5)], {"axis": 1}),
            Case("negative_axis", [r(2, 3, 4, 5)], {"axis": -3}),
            Case("size1_axis", [r(4, 1)]),
            Case("large_values", [(t.random(rng, (3, 7), np.float64) + 1000.0).astype(dtype)]),
            Case("special", [_softmax_special(dtype)]),
            Case("special_axis0", [_softmax_special(dtype)], {"axis": 0}),
            Case("empty_outer", [r(0, 5)]),
            Case("empty_axis", [r(3, 0)]),
            Case("large_last_axis", [r(*LARGE)]),
            Case("large_first_axis", [r(*LARGE)], {"axis": 0}),
            Case("large_rows", [r(97, 1031)]),
            Case("large_1d", [r(HUGE)]),
        ]
        if op == "Hardmax":
            ties = _small_values(rng, (6, 7), dtype)
            cases += [Case("ties", [ties]), Case("ties_axis0", [ties], {"axis": 0})]
        return cases
    return cases


_SOFTMAX_AXIS = Attr("axis", "int", -1, doc="the axis the op normalises over; negative counts from the back")
# Computed in double and rounded once: within 1 ulp of the correctly
# rounded result. float64 carries the relative rounding error of the slice's
# long sum (measured up to 9e-15 over 1e5 elements) and of exp.
_SOFTMAX_TOLERANCE = {"float32": Tolerance(ulp=1), "float16": Tolerance(ulp=1), "bfloat16": Tolerance(ulp=1),
                      "float64": Tolerance(ulp=4, rtol=1e-13)}

for _op, _reference, _doc, _tolerance in (
    ("Softmax", _softmax,
     ("exp(x - max) / sum(exp(x - max)) along axis. As in ONNX's reference, a NaN or +inf in a slice, "
      "or a slice of only -inf, makes the whole slice NaN; -inf beside finite values gives 0."),
     _SOFTMAX_TOLERANCE),
    ("LogSoftmax", _log_softmax,
     ("(x - max) - log(sum(exp(x - max))) along axis; special values as for Softmax (-inf beside "
      "finite values gives -inf)."),
     _SOFTMAX_TOLERANCE),
    ("Hardmax", _hardmax,
     "1 at the first maximum along axis, 0 elsewhere; a NaN counts as the maximum (ArgMax's rule).",
     EXACT),
):
    register(OpSpec(
        name=_op, category="reduce", opset=13,
        inputs=(Input("input"),), outputs=("output",), attrs=(_SOFTMAX_AXIS,),
        dtypes=ALL_FLOAT,
        infer=_softmax_infer, reference=_reference, cases=_softmax_cases(_op),
        tolerance=_tolerance, doc=_doc,
    ))
