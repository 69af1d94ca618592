"""Decompositions of the reductions, softmax family and TopK.

float32 sums run at float64 between Casts (``float64=(F32,)``), as the
kernels accumulate in double; integer means sum in int64. ReduceMin is
ReduceMax of the negation (bitwise not for integers, Not for bool, both
order-reversing without overflow); ArgMax/ArgMin take the least (or last)
index where the extreme is met; TopK ranks every element against the others
of its row (n^2 comparisons) and scatters each to its rank.
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

def _topk(b, xs, a):
    x = xs[0]
    axis = normalize_axis(a["axis"], x.ndim)
    k = int(np.asarray(a["K"]).reshape(-1)[0])
    n = x.shape[axis]
    perm = [d for d in range(x.ndim) if d != axis] + [axis]
    moved_shape = [x.shape[d] for d in perm]
    m = math.prod(moved_shape[:-1])
    rows = reshape(b, b("Transpose", x, perm=perm), [m, n])
    mine = reshape(b, rows, [m, n, 1])     # element i of the row
    other = reshape(b, rows, [m, 1, n])    # element j
    ahead = b("Less", mine, other) if a["largest"] else b("Less", other, mine)
    tie = b("Equal", mine, other)
    if _is_float(x.dtype):
        nan_i, nan_j = b("IsNaN", mine), b("IsNaN", other)
        # NaN ranks above every number when largest, below every number otherwise.
        ahead = b("Or", ahead, b("And", nan_j, b("Not", nan_i)) if a["largest"] else b("And", nan_i, b("Not", nan_j)))
        tie = b("Or", tie, b("And", nan_i, nan_j))
    index_i = reshape(b, coordinate(b, (n,), 0), [1, n, 1])
    index_j = reshape(b, coordinate(b, (n,), 0), [1, 1, n])
    before = b("Or", ahead, b("And", tie, b("Less", index_j, index_i)))
    rank = b("ReduceSum", b("Cast", before, to=I64), np.array([2], np.int64), keepdims=0)
    order = b("ScatterElements", b("Expand", b.const(0, I64), np.array([m, n], np.int64)), rank,
              b("Expand", reshape(b, coordinate(b, (n,), 0), [1, n]), np.array([m, n], np.int64)), axis=1)
    order = b("Slice", order, [0], [k], [1])
    values = b("GatherElements", rows, order, axis=1)
    back = [0] * x.ndim
    for i, d in enumerate(perm):
        back[d] = i
    out_moved = moved_shape[:-1] + [k]
    values = b("Transpose", reshape(b, values, out_moved), perm=back)
    indices = b("Transpose", reshape(b, order, out_moved), perm=back)
    return [values, indices]


def _topk_uses(dtype):
    floating = ("IsNaN", "Not[bool]", "And[bool]") if _is_float(dtype) else ()
    return ("Transpose", "Reshape", "Less", "Equal", "Or[bool]", "And[bool]", "Less[int64]", "Cast[bool]",
            "ReduceSum[int64]", "ScatterElements[int64]", "Expand[int64]", "CumSum[int64]", "Reshape[int64]",
            "Slice[int64]", "GatherElements", "Transpose[int64]") + floating


set_decompositions({**_REDUCE, **_SOFTMAX,
                    "TopK": Decomposition(_topk, _topk_uses, float32=())})
