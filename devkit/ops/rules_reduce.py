"""Decompositions of the reductions, softmax family and TopK.

float32 sums run at float64 between Casts (``float64=(F32,)``), as the
kernels accumulate in double; integer means sum in int64. ReduceMin is
ReduceMax of the negation (bitwise not for integers, Not for bool, both
order-reversing without overflow); ArgMax/ArgMin take the least (or last)
index where the extreme is met; TopK ranks every element against the others
of its row with a bitonic sorting network (log^2 n steps of Slice, Less and
Where) and keeps the first K.
"""

from __future__ import annotations

import math

import numpy as np

from . import reduce as family
from .rules_movement import coordinate, reshape
from .spec import BOOL, F32, F64, I64, Decomposition, normalize_axis, set_decompositions


def _is_float(dtype) -> bool:
    return np.dtype(dtype).kind == "f" or np.dtype(dtype).name == "bfloat16"


def _axes(x, a):
    return np.array(family._ref_axes(x, a), np.int64)


def _reduce(b, op, x, axes, keepdims):
    return b(op, x, axes, keepdims=keepdims, noop_with_empty_axes=1)


def _reduce_rule(body):
    """A rule from body(b, x, axes, keepdims) with the axes resolved."""
    return lambda b, xs, a: [body(b, xs[0], _axes(xs[0], a), a["keepdims"])]


def _reverse_order(b, x):
    """An order-reversing map that cannot overflow: -x, ~x or not x."""
    if x.dtype == BOOL:
        return b("Not", x)
    if _is_float(x.dtype):
        return b("Neg", x)
    return b("BitwiseNot", x)


def _reduce_min(b, x, axes, keep):
    return _reverse_order(b, _reduce(b, "ReduceMax", _reverse_order(b, x), axes, keep))


def _reduce_min_uses(dtype):
    reverse = "Not" if dtype == BOOL else "Neg" if _is_float(dtype) else "BitwiseNot"
    return ("ReduceMax", reverse)


def _reduce_mean(b, x, axes, keep):
    count = math.prod(x.shape[d] for d in axes)
    if _is_float(x.dtype):
        return b("Div", _reduce(b, "ReduceSum", x, axes, keep), b.const(count, x.dtype))
    total = _reduce(b, "ReduceSum", b("Cast", x, to=I64), axes, keep)
    return b("Cast", b("Div", total, b.const(max(count, 1), I64)), to=x.dtype)  # Div truncates toward zero


def _reduce_l2(b, x, axes, keep):
    if _is_float(x.dtype):
        return b("Sqrt", _reduce(b, "ReduceSumSquare", x, axes, keep))
    root = b("Sqrt", _reduce(b, "ReduceSumSquare", b("Cast", x, to=F64), axes, keep))
    return b("Cast", root, to=x.dtype)


def _reduce_prod(b, x, axes, keep):
    """A pairwise product of the reduced axes, moved last and flattened."""
    out_shape = family._reduced_shape(x.shape, tuple(int(d) for d in axes), keep)
    kept = [d for d in range(x.ndim) if d not in axes]
    n = math.prod(x.shape[d] for d in axes)
    if n == 0 or x.size == 0:
        return b("Expand", b.const(1, x.dtype), np.array(out_shape, np.int64))
    y = reshape(b, b("Transpose", x, perm=kept + [int(d) for d in axes]), [-1, n])
    while n > 1:
        if n % 2:
            ones = b("Expand", b.const(1, x.dtype), np.array([y.shape[0], 1], np.int64))
            y, n = b("Concat", y, ones, axis=1), n + 1
        half = n // 2
        y = b("Mul", b("Slice", y, [0], [half], [1]), b("Slice", y, [half], [n], [1]))
        n = half
    return reshape(b, y, out_shape)


def _log_sum_exp(b, x, axes, keep):
    top = _reduce(b, "ReduceMax", x, axes, 1)
    finite = b("Equal", b("Sub", top, top), b.const(0, x.dtype))  # inf - inf and NaN are NaN
    shift = b("Where", finite, top, b.const(0, x.dtype))
    total = _reduce(b, "ReduceSum", b("Exp", b("Sub", x, shift)), axes, 1)
    result = b("Add", shift, b("Log", total))
    return result if keep else reshape(b, result, family._reduced_shape(x.shape, tuple(int(d) for d in axes), 0))


_WIDE_SUM = dict(float64=(F32,))
_REDUCE = {
    "ReduceMin": Decomposition(_reduce_rule(_reduce_min), _reduce_min_uses, float32=()),
    "ReduceMean": Decomposition(_reduce_rule(_reduce_mean),
                                lambda d: ("ReduceSum", "Div") if _is_float(d) else
                                ("Cast", "ReduceSum[int64]", "Div[int64]", "Cast[int64]"), **_WIDE_SUM),
    "ReduceL1": Decomposition(_reduce_rule(lambda b, x, axes, k: _reduce(b, "ReduceSum", b("Abs", x), axes, k)),
                              ("ReduceSum", "Abs"), **_WIDE_SUM),
    "ReduceSumSquare": Decomposition(
        _reduce_rule(lambda b, x, axes, k: _reduce(b, "ReduceSum", b("Mul", x, x), axes, k)),
        ("ReduceSum", "Mul"), **_WIDE_SUM),
    "ReduceL2": Decomposition(_reduce_rule(_reduce_l2),
                              lambda d: ("Sqrt", "ReduceSumSquare") if _is_float(d) else
                              ("Cast", "ReduceSumSquare[float64]", "Sqrt[float64]", "Cast[float64]"), **_WIDE_SUM),
    "ReduceProd": Decomposition(_reduce_rule(_reduce_prod), ("Expand", "Transpose", "Reshape", "Concat", "Mul",
                                                             "Slice"), **_WIDE_SUM,
                                tolerance={"float64": family._SUM_TOLERANCE["float64"]},
                                reason="a pairwise product: another order than the kernel's"),
    "ReduceLogSumExp": Decomposition(_reduce_rule(_log_sum_exp), ("ReduceMax", "Sub", "Equal", "Where",
                                                                  "ReduceSum", "Exp", "Add", "Log", "Reshape"),
                                     **_WIDE_SUM),
}


# -- ArgMax, ArgMin, softmax family ------------------------------------------------------------------

def _arg(extreme):
    def rule(b, xs, a):
        x = xs[0]
        axis = normalize_axis(a["axis"], x.ndim)
        shape = family._reduced_shape(x.shape, (axis,), a["keepdims"])
        if x.shape[axis] == 0:
            return [b("Expand", b.const(0, I64), np.array(shape, np.int64))]
        m = b(extreme, x, np.array([axis], np.int64), keepdims=1)
        hit = b("Equal", x, m)
        if _is_float(x.dtype):  # a NaN is the extreme: m is NaN then
            hit = b("Or", hit, b("IsNaN", x))
        position = coordinate(b, x.shape, axis)
        last = a["select_last_index"]
        miss = b.const(-1 if last else x.shape[axis], I64)
        found = b("ReduceMax" if last else "ReduceMin", b("Where", hit, position, miss),
                  np.array([axis], np.int64), keepdims=a["keepdims"])
        return [found]
    return rule


def _arg_uses(extreme):
    return lambda d: (extreme, "Equal", "Expand[int64]", "CumSum[int64]", "Reshape[int64]", "Where[int64]",
                      "ReduceMin[int64]", "ReduceMax[int64]") + (("Or[bool]", "IsNaN") if _is_float(d) else ())


def _softmax_parts(b, x, a):
    axis = np.array([normalize_axis(a["axis"], x.ndim)], np.int64)
    shifted = b("Sub", x, b("ReduceMax", x, axis, keepdims=1))
    return shifted, axis


def _softmax_rule(b, xs, a):
    shifted, axis = _softmax_parts(b, xs[0], a)
    e = b("Exp", shifted)
    return [b("Div", e, b("ReduceSum", e, axis, keepdims=1))]


def _log_softmax_rule(b, xs, a):
    shifted, axis = _softmax_parts(b, xs[0], a)
    return [b("Sub", shifted, b("Log", b("ReduceSum", b("Exp", shifted), axis, keepdims=1)))]


def _hardmax_rule(b, xs, a):
    x = xs[0]
    axis = normalize_axis(a["axis"], x.ndim)
    if x.size == 0:
        return [b("Expand", b.const(0, x.dtype), np.array(x.shape, np.int64))]
    first = b("ArgMax", x, axis=axis, keepdims=1)
    return [b("Cast", b("Equal", coordinate(b, x.shape, axis), first), to=x.dtype)]


_SOFTMAX_USES = ("Sub", "ReduceMax", "Exp", "ReduceSum", "Div")
_SOFTMAX = {
    "ArgMax": Decomposition(_arg("ReduceMax"), _arg_uses("ReduceMax"), float32=()),
    "ArgMin": Decomposition(_arg("ReduceMin"), _arg_uses("ReduceMin"), float32=()),
    "Softmax": Decomposition(_softmax_rule, _SOFTMAX_USES, **_WIDE_SUM),
    "LogSoftmax": Decomposition(_log_softmax_rule, _SOFTMAX_USES[:-1] + ("Log",), **_WIDE_SUM),
    "Hardmax": Decomposition(_hardmax_rule, ("Expand", "ArgMax", "Expand[int64]", "CumSum[int64]",
                                             "Reshape[int64]", "Equal[int64]", "Cast[bool]"), float32=()),
}


# -- TopK ---------------------------------------------------------------------------------------------

def _before(b, largest, floating):
    """Whether (value, index) a sorts before b: by value (NaN first when
    largest, last otherwise), ties by the lower index, as a stable sort."""
    def before(av, ai, bv, bi):
        ahead = b("Less", bv, av) if largest else b("Less", av, bv)
        tie = b("Equal", av, bv)
        if floating:
            nan_a, nan_b = b("IsNaN", av), b("IsNaN", bv)
            ahead = b("Or", ahead, b("And", nan_a, b("Not", nan_b)) if largest else b("And", nan_b, b("Not", nan_a)))
            tie = b("Or", tie, b("And", nan_a, nan_b))
        return b("Or", ahead, b("And", tie, b("Less", ai, bi)))
    return before


_REVERSE = ([-1], [-(2 ** 62)], [3], [-1])  # Slice arguments after the start: the last axis backwards


def _exchange(b, values, index, before, width, flip):
    """One column of a bitonic network over rows of length N: element i meets
    i + width in blocks of 2 width (or, with flip, its mirror 2 width - 1 - i)."""
    m, n = values.shape
    halves = []
    for x in (values, index):
        x = reshape(b, x, [m, n // (2 * width), 2, width])
        lo, hi = b("Slice", x, [0], [1], [2]), b("Slice", x, [1], [2], [2])
        halves.append((lo, b("Slice", hi, [width - 1], *_REVERSE[1:]) if flip else hi))
    (lo_v, hi_v), (lo_i, hi_i) = halves
    swap = before(hi_v, hi_i, lo_v, lo_i)
    merged = []
    for lo, hi in ((lo_v, hi_v), (lo_i, hi_i)):
        new_lo, new_hi = b("Where", swap, hi, lo), b("Where", swap, lo, hi)
        if flip:
            new_hi = b("Slice", new_hi, [width - 1], *_REVERSE[1:])
        merged.append(reshape(b, b("Concat", new_lo, new_hi, axis=2), [m, n]))
    return merged


def _sort_rows(b, values, index, before):
    """Bitonic sort of each row (length a power of two), every comparator one way."""
    n, block = values.shape[1], 1
    while block < n:
        values, index = _exchange(b, values, index, before, block, flip=True)
        width = block // 2
        while width:
            values, index = _exchange(b, values, index, before, width, flip=False)
            width //= 2
        block *= 2
    return values, index


def _topk(b, xs, a):
    """The rows sorted by a bitonic network (log^2 n steps of elementwise
    work), padded to a power of two with values that sort last."""
    x = xs[0]
    axis = normalize_axis(a["axis"], x.ndim)
    k = int(np.asarray(a["K"]).reshape(-1)[0])
    n = x.shape[axis]
    perm = [d for d in range(x.ndim) if d != axis] + [axis]
    moved_shape = [x.shape[d] for d in perm]
    m = math.prod(moved_shape[:-1])
    rows = reshape(b, b("Transpose", x, perm=perm), [m, n])
    floating = _is_float(x.dtype)
    index = b("Expand", reshape(b, coordinate(b, (n,), 0), [1, n]), np.array([m, n], np.int64))
    size = 1 << max(n - 1, 0).bit_length()
    if size > n and m:
        if floating:
            pad = -np.inf if a["largest"] else np.nan
        else:
            info = np.iinfo(x.dtype)
            pad = info.min if a["largest"] else info.max
        rows = b("Concat", rows, b("Expand", b.const(pad, x.dtype), np.array([m, size - n], np.int64)), axis=1)
        index = b("Concat", index, b("Expand", reshape(b, b("Add", coordinate(b, (size - n,), 0), b.const(n, I64)),
                                                       [1, size - n]), np.array([m, size - n], np.int64)), axis=1)
    if m and n > 1:
        rows, index = _sort_rows(b, rows, index, _before(b, a["largest"], floating))
    values, order = b("Slice", rows, [0], [k], [1]), b("Slice", index, [0], [k], [1])
    back = [0] * x.ndim
    for i, d in enumerate(perm):
        back[d] = i
    out_moved = moved_shape[:-1] + [k]
    values = b("Transpose", reshape(b, values, out_moved), perm=back)
    indices = b("Transpose", reshape(b, order, out_moved), perm=back)
    return [values, indices]


def _topk_uses(dtype):
    floating = ("IsNaN", "Not[bool]") if _is_float(dtype) else ()
    return ("Transpose", "Reshape", "Slice", "Concat", "Expand", "Where", "Less", "Equal", "Or[bool]",
            "And[bool]", "Less[int64]", "Expand[int64]", "CumSum[int64]", "Reshape[int64]", "Add[int64]",
            "Concat[int64]", "Slice[int64]", "Where[int64]", "Transpose[int64]") + floating


set_decompositions({**_REDUCE, **_SOFTMAX,
                    "TopK": Decomposition(_topk, _topk_uses, float32=())})
