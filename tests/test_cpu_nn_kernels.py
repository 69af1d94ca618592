"""The cpu plugin's direct pools and row kernels on the paths the conformance
cases do not reach: odd pads, dilations, strides other than 1 and 2, ceil_mode
windows, 1-D and 3-D pools, MaxPool indices of windows that hold only -inf or
NaN, and Softmax/LogSoftmax rows whose exponentials underflow. References are
brute-force NumPy loops over the ONNX definitions; tolerances are the
operators' own (1 ulp for float32 pools and softmax, exact for MaxPool)."""

from __future__ import annotations

import itertools

import numpy as np
import pytest

import devkit


@pytest.fixture(scope="module")
def dev():
    return devkit.load_plugin("cpu").device(0)


def _run(dev, op, inputs, attrs):
    return [y.numpy() for y in devkit.run_op(op, [devkit.asarray(x, dev) for x in inputs], attrs)]


def _windows(x_shape, y_shape, kernel, strides, pads, dilations):
    """Per output position (n, c, o...): the in-bounds input coordinates of its
    window in row-major tap order, and the count of taps inside the padded X."""
    spatial = x_shape[2:]
    rank = len(spatial)
    for out in itertools.product(*(range(s) for s in y_shape[2:])):
        taps, padded = [], 1
        for d in range(rank):
            first = out[d] * strides[d] - pads[d]
            positions = [first + t * dilations[d] for t in range(kernel[d])]
            taps.append([p for p in positions if 0 <= p < spatial[d]])
            padded *= sum(1 for p in positions if -pads[d] <= p < spatial[d] + pads[rank + d])
        yield out, list(itertools.product(*taps)), padded


def _reference_pools(x, y_shape, kernel, strides, pads, dilations, include_pad):
    """MaxPool (values, row-major flat indices) and AveragePool of x."""
    n, c = x.shape[:2]
    values = np.full(y_shape, -np.inf, x.dtype)
    indices = np.full(y_shape, -1, np.int64)
    means = np.zeros(y_shape, x.dtype)
    plane = int(np.prod(x.shape[2:]))
    for out, taps, padded in _windows(x.shape, y_shape, kernel, strides, pads, dilations):
        for i, j in itertools.product(range(n), range(c)):
            best, best_at = None, -1
            total = 0.0
            for tap in taps:
                v = x[(i, j, *tap)]
                total += float(v)
                if best is None or v > best or (np.isnan(v) and not np.isnan(best)):
                    best, best_at = v, int(np.ravel_multi_index(tap, x.shape[2:]))
            if best is not None:
                values[(i, j, *out)] = best
                indices[(i, j, *out)] = (i * c + j) * plane + best_at
            count = padded if include_pad else len(taps)
            means[(i, j, *out)] = total / count if count else np.nan
    return values, indices, means


POOL_CASES = [
    # (X shape, kernel, strides, pads (begin..., end...), dilations, ceil_mode)
    ((1, 2, 9, 11), (3, 3), (2, 2), (1, 0, 2, 1), (1, 1), 0),
    ((2, 1, 10, 7), (3, 2), (3, 1), (0, 1, 1, 0), (2, 1), 1),
    ((1, 3, 13), (4,), (3,), (2, 1), (1,), 1),
    ((1, 1, 5, 6, 7), (2, 3, 2), (1, 2, 3), (1, 1, 0, 0, 1, 1), (1, 1, 2), 0),
    ((1, 2, 6, 6), (5, 5), (1, 1), (2, 2, 2, 2), (1, 1), 0),
    ((1, 1, 4, 20), (1, 7), (1, 5), (0, 3, 0, 3), (1, 1), 1),
]


@pytest.mark.parametrize("shape,kernel,strides,pads,dilations,ceil_mode", POOL_CASES)
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_pools_match_brute_force_windows(dev, shape, kernel, strides, pads, dilations, ceil_mode, dtype):
    x = np.random.default_rng(len(shape) + sum(kernel)).standard_normal(shape).astype(dtype)
    attrs = {"kernel_shape": list(kernel), "strides": list(strides), "pads": list(pads),
             "dilations": list(dilations), "ceil_mode": ceil_mode}
    y, indices = _run(dev, "MaxPool", [x], attrs)
    want_y, want_indices, _ = _reference_pools(x, y.shape, kernel, strides, pads, dilations, False)
    np.testing.assert_array_equal(y, want_y)
    np.testing.assert_array_equal(indices, want_indices)
    for include_pad in (0, 1):
        (mean,) = _run(dev, "AveragePool", [x], {**attrs, "count_include_pad": include_pad})
        _, _, want_mean = _reference_pools(x, mean.shape, kernel, strides, pads, dilations, include_pad)
        np.testing.assert_array_max_ulp(mean, want_mean, maxulp=1)


# MaxPool without Indices over 2-D windows takes the separable path (row
# maxima, then column maxima), float32 rows in vectors: rows with at least
# 8 interior columns, strides 1 and 2, a last vector that overlaps the one
# before it, border columns in the padding, and shapes that fall back.
SEPARABLE_CASES = [
    # (X shape, kernel, strides, pads (begin..., end...), ceil_mode)
    ((1, 64, 24, 24), (3, 3), (2, 2), (1, 1, 1, 1), 0),  # ResNet's stem pool, smaller
    ((2, 3, 23, 37), (3, 3), (2, 2), (1, 1, 1, 1), 1),
    ((1, 2, 19, 41), (2, 3), (1, 2), (0, 1, 1, 0), 0),
    ((3, 1, 17, 26), (3, 2), (2, 1), (1, 0, 0, 1), 0),
    ((1, 2, 12, 30), (5, 4), (1, 1), (2, 1, 2, 2), 0),
    ((1, 1, 9, 50), (3, 3), (3, 3), (1, 1, 1, 1), 1),  # stride 3: the tap loops
    ((1, 2, 7, 11), (3, 3), (2, 2), (1, 1, 1, 1), 0),  # under 8 interior columns
]


@pytest.mark.parametrize("shape,kernel,strides,pads,ceil_mode", SEPARABLE_CASES)
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_max_pool_values_only_matches_the_tap_walk_bit_for_bit(dev, shape, kernel, strides, pads, ceil_mode,
                                                                dtype):
    rng = np.random.default_rng(sum(shape))
    # Small integers tie often; signed zeros, -inf and NaNs of distinct payloads
    # show which tap won.
    x = rng.integers(-3, 4, shape).astype(dtype)
    x[rng.random(shape) < 0.3] = -0.0
    x[rng.random(shape) < 0.02] = -np.inf
    nan_at = rng.random(shape) < 0.01
    uint = np.uint32 if dtype == np.float32 else np.uint64
    nan_bits = np.array(np.nan, dtype).view(uint) | rng.integers(1, 1 << 20, shape).astype(uint)
    x[nan_at] = nan_bits[nan_at].view(dtype)
    attrs = {"kernel_shape": list(kernel), "strides": list(strides), "pads": list(pads), "ceil_mode": ceil_mode}
    (values,) = [y.numpy() for y in devkit.run_op("MaxPool", [devkit.asarray(x, dev)], attrs, outputs=1)]
    walked, _ = _run(dev, "MaxPool", [x], attrs)  # with Indices: the tap walk
    want, _, _ = _reference_pools(x, values.shape, kernel, strides, pads, (1, 1), False)
    np.testing.assert_array_equal(values.view(uint), walked.view(uint))
    np.testing.assert_array_equal(values.view(uint), want.view(uint))


# float32 AveragePool over 2-D windows without dilation takes the separable path
# (window sums along rows, then sums of kh row sums): the interior columns'
# loops for 2 and 3 taps at strides 1 and 2 and the pass per tap for others,
# border columns and window rows in the padding, ceil_mode windows past the
# end padding, strides above the kernel (input rows no window reads), and
# few planes cut into bands of output rows.
SEPARABLE_AVERAGE_CASES = [
    # (X shape, kernel, strides, pads (begin..., end...), ceil_mode)
    ((1, 4, 56, 56), (3, 3), (1, 1), (1, 1, 1, 1), 0),  # ResNet-like, 3x3/1
    ((2, 3, 28, 28), (2, 2), (2, 2), (0, 0, 0, 0), 0),
    ((1, 2, 23, 37), (3, 3), (2, 2), (1, 1, 1, 1), 1),
    ((1, 2, 19, 41), (2, 3), (1, 2), (0, 1, 1, 0), 0),
    ((1, 1, 40, 33), (5, 4), (1, 3), (2, 1, 2, 2), 1),  # the pass per tap
    ((1, 2, 17, 26), (1, 2), (3, 1), (0, 1, 0, 1), 1),  # rows between windows
    ((1, 1, 300, 9), (4, 1), (2, 1), (3, 0, 3, 0), 0),  # one plane: many bands
    ((3, 1, 2, 5), (3, 3), (1, 1), (2, 2, 2, 2), 0),    # windows over the padding only
]


@pytest.mark.parametrize("shape,kernel,strides,pads,ceil_mode", SEPARABLE_AVERAGE_CASES)
def test_average_pool_separable_sums_match_brute_force_windows(dev, shape, kernel, strides, pads, ceil_mode):
    # float32 (float64 keeps the tap walk), over six decades: the float64 sums stay exact.
    rng = np.random.default_rng(sum(shape) + sum(kernel))
    x = (rng.standard_normal(shape) * 10.0 ** rng.integers(-3, 4, shape)).astype(np.float32)
    x[rng.random(shape) < 0.2] = -0.0
    attrs = {"kernel_shape": list(kernel), "strides": list(strides), "pads": list(pads), "ceil_mode": ceil_mode}
    for include_pad in (0, 1):
        (mean,) = _run(dev, "AveragePool", [x], {**attrs, "count_include_pad": include_pad})
        _, _, want = _reference_pools(x, mean.shape, kernel, strides, pads, (1, 1), include_pad)
        np.testing.assert_array_max_ulp(mean, want, maxulp=1)
    # An infinity reaches the means of the windows that hold it, a NaN (or
    # inf - inf) makes them NaN, and the other means stay finite.
    special = x.copy()
    flat = special.reshape(-1)
    flat[rng.choice(flat.size, 3, replace=False)] = [np.inf, -np.inf, np.nan]
    (mean,) = _run(dev, "AveragePool", [special], attrs)
    _, _, want = _reference_pools(special, mean.shape, kernel, strides, pads, (1, 1), False)
    assert np.isnan(want).any() and np.isinf(want).any()
    np.testing.assert_array_equal(np.isnan(mean), np.isnan(want))
    np.testing.assert_array_equal(np.isinf(mean), np.isinf(want))
    finite = np.isfinite(want)
    np.testing.assert_array_max_ulp(mean[finite], want[finite], maxulp=1)


def test_max_pool_indices_of_minus_inf_and_nan_windows(dev):
    # A window of only -inf takes its first tap; the first NaN wins over numbers and later NaNs.
    x = np.array([[[[-np.inf, -np.inf, 1.0, 2.0],
                    [-np.inf, -np.inf, np.nan, 5.0],
                    [3.0, np.nan, np.nan, 0.0],
                    [-np.inf, 4.0, 7.0, np.nan]]]], np.float32)
    attrs = {"kernel_shape": [2, 2], "strides": [2, 2]}
    y, indices = _run(dev, "MaxPool", [x], attrs)
    np.testing.assert_array_equal(y, [[[[-np.inf, np.nan], [np.nan, np.nan]]]])
    np.testing.assert_array_equal(indices, [[[[0, 6], [9, 10]]]])
    # Column-major indices name the same elements.
    _, col_major = _run(dev, "MaxPool", [x], {**attrs, "storage_order": 1})
    np.testing.assert_array_equal(col_major, [[[[0, 9], [6, 10]]]])


def test_pool_windows_that_miss_x(dev):
    # Dilation 3 with pads 2 around one element: both windows' taps fall in the padding.
    x = np.array([[[4.0]]], np.float32)
    attrs = {"kernel_shape": [2], "dilations": [3], "pads": [2, 2]}
    y, indices = _run(dev, "MaxPool", [x], attrs)
    np.testing.assert_array_equal(y, [[[-np.inf, -np.inf]]])
    np.testing.assert_array_equal(indices, [[[-1, -1]]])
    (mean,) = _run(dev, "AveragePool", [x], attrs)
    assert np.isnan(mean).all()  # nothing to count
    (mean,) = _run(dev, "AveragePool", [x], {**attrs, "count_include_pad": 1})
    np.testing.assert_array_equal(mean, [[[0.0, 0.0]]])  # two padded taps, no element


def _softmax64(x, axis):
    shifted = x.astype(np.float64) - x.astype(np.float64).max(axis=axis, keepdims=True)
    e = np.exp(shifted)
    return e / e.sum(axis=axis, keepdims=True), shifted - np.log(e.sum(axis=axis, keepdims=True))


@pytest.mark.parametrize("shape,axis", [((3, 37), -1), ((5, 1000), 1), ((4, 9, 6), 1), ((2, 3, 17), 0)])
def test_softmax_rows_with_underflowing_exponentials(dev, shape, axis):
    # Spread over 0..-200: exponentials below float32's range beside ordinary ones.
    x = (np.random.default_rng(3).random(shape) * -200).astype(np.float32)
    soft, log_soft = _softmax64(x, axis)
    (y,) = _run(dev, "Softmax", [x], {"axis": axis})
    np.testing.assert_array_max_ulp(y, soft.astype(np.float32), maxulp=1)
    (y,) = _run(dev, "LogSoftmax", [x], {"axis": axis})
    np.testing.assert_array_max_ulp(y, log_soft.astype(np.float32), maxulp=1)


def test_float64_softmax_keeps_subnormal_probabilities(dev):
    # exp(-720) and exp(-744) are subnormal doubles: the fast exp must still form them.
    x = np.array([[0.0, -720.0, -744.0, -800.0, -np.inf, -3.5]])
    (y,) = _run(dev, "Softmax", [x], {"axis": -1})
    want, _ = _softmax64(x, -1)
    assert want[0, 1] > 0 and want[0, 2] > 0 and want[0, 3] == 0
    np.testing.assert_allclose(y[0, :2], want[0, :2], rtol=1e-13)
    np.testing.assert_allclose(y[0, 2], want[0, 2], rtol=1e-2)  # a subnormal keeps few digits
    np.testing.assert_array_equal(y[0, 3:5], [0.0, 0.0])
    np.testing.assert_allclose(y[0, 5], want[0, 5], rtol=1e-13)


def test_softmax_special_values(dev):
    x = np.array([[1.0, -np.inf, 2.0, 0.5], [1.0, np.nan, 2.0, 0.5], [np.inf, 1.0, 2.0, 0.5],
                  [-np.inf] * 4], np.float32)
    (y,) = _run(dev, "Softmax", [x], {"axis": -1})
    (log_y,) = _run(dev, "LogSoftmax", [x], {"axis": -1})
    soft, log_soft = _softmax64(x[:1], -1)
    np.testing.assert_array_max_ulp(y[0], soft[0].astype(np.float32), maxulp=1)
    np.testing.assert_array_max_ulp(log_y[0], log_soft[0].astype(np.float32), maxulp=1)
    assert y[0, 1] == 0 and log_y[0, 1] == -np.inf
    assert np.isnan(y[1:]).all() and np.isnan(log_y[1:]).all()


# Softmax rows run up to 16 at a time, pass by pass: a block's rows keep
# their own maxima and sums, a NaN or all -inf row among them is NaN alone,
# and the last block may be short. 1 ulp against float64 elsewhere.
@pytest.mark.parametrize("rows", [1, 16, 17, 37])
def test_softmax_rows_in_blocks_keep_their_own_statistics(dev, rows):
    x = (np.random.default_rng(rows).standard_normal((rows, 33)) * np.arange(1, rows + 1)[:, None]).astype(np.float32)
    special = {rows // 2: np.nan, rows - 1: -np.inf} if rows > 1 else {}
    for r, value in special.items():
        x[r, 3 if np.isnan(value) else slice(None)] = value
    with np.errstate(invalid="ignore"):  # the special rows' reference is NaN
        soft, log_soft = _softmax64(x, -1)
    for op, want in (("Softmax", soft), ("LogSoftmax", log_soft)):
        (y,) = _run(dev, op, [x], {"axis": -1})
        plain = [r for r in range(rows) if r not in special]
        np.testing.assert_array_max_ulp(y[plain], want[plain].astype(np.float32), maxulp=1)
        for r in special:
            assert np.isnan(y[r]).all()


# Gemm and MatMul with one row or one column run as a GEMV, split over
# blocks of 64 outputs when the matrix is large: a classifier head (ResNet's
# 1x512 by 1000x512^T), both transposes, short last blocks, a bias that
# broadcasts, alpha and beta.
GEMV_CASES = [
    # (M, N, K, transA, transB)
    (1, 1000, 512, 0, 1),
    (1, 1001, 300, 1, 0),
    (1, 70, 1024, 0, 0),
    (129, 1, 777, 0, 0),
    (1000, 1, 130, 1, 1),
    (1, 1, 5000, 0, 1),
]


@pytest.mark.parametrize("m,n,k,trans_a,trans_b", GEMV_CASES)
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_gemm_with_one_row_or_column_matches_float64(dev, m, n, k, trans_a, trans_b, dtype):
    rng = np.random.default_rng(m + n + k)
    a = rng.standard_normal((k, m) if trans_a else (m, k)).astype(dtype)
    b = rng.standard_normal((n, k) if trans_b else (k, n)).astype(dtype)
    c = rng.standard_normal((n,) if m == 1 else (m, 1)).astype(dtype)
    attrs = {"transA": trans_a, "transB": trans_b, "alpha": 0.5, "beta": -2.0}
    (y,) = _run(dev, "Gemm", [a, b, c], attrs)
    op_a = (a.T if trans_a else a).astype(np.float64)
    op_b = (b.T if trans_b else b).astype(np.float64)
    want = 0.5 * op_a @ op_b - 2.0 * c.astype(np.float64)
    # Dot-product tolerance: the sum of |products| times a few units of roundoff.
    bound = 8 * k * np.finfo(dtype).eps * (np.abs(op_a) @ np.abs(op_b) + np.abs(c))
    assert y.shape == (m, n)
    assert np.all(np.abs(y - want) <= bound)
    (no_c,) = _run(dev, "Gemm", [a, b], {"transA": trans_a, "transB": trans_b})
    assert np.all(np.abs(no_c - op_a @ op_b) <= bound)


def test_matmul_vector_operands_match_float64(dev):
    rng = np.random.default_rng(7)
    matrix = rng.standard_normal((700, 300)).astype(np.float32)
    row, column = rng.standard_normal(700).astype(np.float32), rng.standard_normal(300).astype(np.float32)
    for a, b in ((row, matrix), (matrix, column), (row[None, :], matrix), (matrix, column[:, None])):
        (y,) = _run(dev, "MatMul", [a, b], {})
        want = a.astype(np.float64) @ b.astype(np.float64)
        bound = 8 * 700 * np.finfo(np.float32).eps * (np.abs(a).astype(np.float64) @ np.abs(b))
        assert y.shape == want.shape
        assert np.all(np.abs(y - want) <= bound)


# Reductions whose first axis is kept split over it, each output still
# summed in one walk: the same bits as one thread. References in float64,
# rounded once (1 ulp, the op's tolerance); NaN and -inf reach the maxima.
@pytest.mark.parametrize("shape,axes", [((600, 500), [-1]), ((300, 33, 17), [1, 2]), ((640, 3, 70), [1]),
                                        ((5, 4), [1])])
def test_reductions_split_over_the_first_axis(dev, shape, axes):
    x = np.random.default_rng(len(shape)).standard_normal(shape).astype(np.float32)
    x[0, 0] = np.nan
    x[-1, -1] = -np.inf
    for op, reference in (("ReduceSum", np.sum), ("ReduceMax", np.max), ("ReduceMean", np.mean)):
        y = devkit.run_op(op, [devkit.asarray(x, dev), np.array(axes)], {"keepdims": 0})
        want = reference(x.astype(np.float64), axis=tuple(axes)).astype(np.float32)
        np.testing.assert_array_max_ulp(y[0].numpy(), want, maxulp=1)


# Transposes tile the two dims that swap contiguity; 4-byte elements go
# through 8 x 8 register blocks, the rest (and the edges) one at a time, and
# large copies split over the pool by columns of tiles. Exact.
@pytest.mark.parametrize("shape,perm", [((37, 45), None), ((64, 96), None), ((1000, 600), None),
                                        ((3, 40, 50), (0, 2, 1)), ((4, 5, 6, 7), (3, 1, 0, 2)),
                                        ((9, 300, 17), (2, 1, 0))])
@pytest.mark.parametrize("dtype", [np.float32, np.int32, np.float64, np.int8, np.float16])
def test_transpose_matches_numpy_exactly(dev, shape, perm, dtype):
    x = np.random.default_rng(len(shape)).integers(-100, 100, shape).astype(dtype)
    (y,) = _run(dev, "Transpose", [x], {} if perm is None else {"perm": list(perm)})
    np.testing.assert_array_equal(y, np.transpose(x, perm))


# ReduceMax/ReduceMin fold a row of at least 128 elements in 64 lanes (its
# first 64 elements start them, whole blocks of 64 follow, the rest one by
# one): a NaN anywhere there makes the result NaN, and infinities and the
# largest magnitudes win where they are.
@pytest.mark.parametrize("op,fold", [("ReduceMax", np.max), ("ReduceMin", np.min)])
@pytest.mark.parametrize("dtype", [np.float32, np.float64, np.int32, np.int8])
def test_reduce_extrema_over_long_rows(dev, op, fold, dtype):
    rng = np.random.default_rng(7)
    x = rng.integers(-100, 100, (12, 1000)).astype(dtype)
    info = np.finfo(dtype) if np.issubdtype(dtype, np.floating) else np.iinfo(dtype)
    # one extreme per row, in the lanes' start, the blocks and the tail
    for row, at in enumerate((0, 63, 64, 500, 959, 960, 999, 130, 7, 700, 3, 998)):
        x[row, at] = info.max if row % 2 else info.min
    if np.issubdtype(dtype, np.floating):
        x[0, 5], x[1, 64], x[2, 961] = np.nan, np.nan, np.nan  # start, block, tail
        x[3, 400], x[4, 401] = np.inf, -np.inf
    (y,) = _run(dev, op, [x, np.array([-1])], {"keepdims": 0})
    np.testing.assert_array_equal(y, fold(x, axis=-1))  # NaN where a row holds one


# Attention: float32 (and float16/bfloat16, computed in float32) products
# over at most 1024 keys run on K^T and V packed per kv head, longer ones
# through OpenBLAS; causal without a mask adds -inf past each query's last
# key; the softmax rows vectorise. Reference: the ONNX formula in float64 on
# the same (rounded) inputs. Tolerances: float32 rtol 1e-5 and atol 1e-5
# (sums over up to 1100 keys of probabilities times |v| < 5), float16 and
# bfloat16 the op's own (2e-3 / 1e-4 and 1.6e-2 / 1e-3).
def _attention64(q, k, v, mask=None, causal=False, past_k=None, past_v=None):
    """Y and the probabilities of 4-D Q (B, Hq, Lq, D), K/V (B, Hkv, Lkv, .)."""
    q, k, v = (x.astype(np.float64) for x in (q, k, v))
    past = 0 if past_k is None else past_k.shape[2]
    if past_k is not None:
        k = np.concatenate([past_k.astype(np.float64), k], axis=2)
        v = np.concatenate([past_v.astype(np.float64), v], axis=2)
    group = q.shape[1] // k.shape[1]
    k, v = np.repeat(k, group, axis=1), np.repeat(v, group, axis=1)
    lq, total = q.shape[2], k.shape[2]
    bias = np.zeros((lq, total))
    if causal:
        bias[np.arange(total)[None, :] > np.arange(lq)[:, None] + past] = -np.inf  # j <= i + past
    if mask is not None:
        bias = bias + (np.where(mask, 0.0, -np.inf) if mask.dtype == bool else mask.astype(np.float64))
    with np.errstate(invalid="ignore"):
        scores = q @ np.swapaxes(k, -1, -2) / np.sqrt(q.shape[-1]) + bias
        masked = np.all(np.broadcast_to(bias, scores.shape) == -np.inf, axis=-1, keepdims=True)
        e = np.exp(scores - scores.max(axis=-1, keepdims=True))
        p = np.where(masked, 0.0, e / e.sum(axis=-1, keepdims=True))
        return p @ v, p


def _heads3(x):
    """(B, H, L, D) -> (B, L, H * D)."""
    return np.ascontiguousarray(np.swapaxes(x, 1, 2).reshape(x.shape[0], x.shape[2], -1))


_ATTN_TOLERANCE = {np.float32: (1e-5, 1e-5), np.float16: (2e-3, 1e-4), "bfloat16": (1.6e-2, 1e-3)}


ATTENTION_CASES = [
    # (B, Hq, Hkv, Lq, Lkv, past, D, Dv, causal, mask)
    (2, 8, 2, 32, 32, 0, 16, 16, True, None),      # llama_decoder's call
    (1, 4, 2, 1, 1, 0, 16, 16, True, None),        # one query, one key
    (1, 3, 1, 37, 45, 5, 24, 40, True, None),      # lengths off the 8-row blocks, a past, Dv over 2 panels
    (2, 2, 2, 5, 9, 0, 8, 8, True, "bool"),        # mask and causal: the general bias path
    (1, 2, 1, 3, 1100, 0, 8, 8, False, "float"),   # past ATTN_PACKED_KEYS: OpenBLAS
    (1, 2, 2, 4, 1100, 0, 8, 8, True, None),
]


@pytest.mark.parametrize("b,hq,hkv,lq,lkv,past,d,dv,causal,mask", ATTENTION_CASES)
@pytest.mark.parametrize("three_d", [False, True])
def test_attention_products_match_float64(dev, b, hq, hkv, lq, lkv, past, d, dv, causal, mask, three_d):
    rng = np.random.default_rng(lq + lkv + d)
    q = rng.standard_normal((b, hq, lq, d)).astype(np.float32)
    k = rng.standard_normal((b, hkv, lkv, d)).astype(np.float32)
    v = rng.standard_normal((b, hkv, lkv, dv)).astype(np.float32)
    total = past + lkv
    m = None
    if mask == "bool":
        m = rng.random((b, 1, lq, total)) > 0.3
        m[0, 0, 1, :] = False  # a row that attends nothing
    elif mask == "float":
        m = rng.standard_normal((lq, total)).astype(np.float32)
    inputs = [_heads3(x) for x in (q, k, v)] if three_d else [q, k, v]
    attrs = {"is_causal": int(causal), "qk_matmul_output_mode": 3}
    if three_d:
        attrs.update(q_num_heads=hq, kv_num_heads=hkv)
    pk = pv = None
    if past:
        pk = rng.standard_normal((b, hkv, past, d)).astype(np.float32)
        pv = rng.standard_normal((b, hkv, past, dv)).astype(np.float32)
    extra = [m if m is not None else None, pk, pv] if past else ([m] if m is not None else [])
    args = [devkit.asarray(x, dev) for x in inputs] + [None if x is None else devkit.asarray(x, dev)
                                                      for x in extra]
    y, present_k, present_v, probabilities = (a.numpy() for a in devkit.run_op("Attention", args, attrs))
    want, want_p = _attention64(q, k, v, m, causal, pk, pv)
    np.testing.assert_allclose(y, _heads3(want) if three_d else want, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(probabilities, want_p, rtol=1e-5, atol=1e-6)
    np.testing.assert_array_equal(present_k, k if pk is None else np.concatenate([pk, k], axis=2))
    np.testing.assert_array_equal(present_v, v if pv is None else np.concatenate([pv, v], axis=2))


@pytest.mark.parametrize("dtype", [np.float16, "bfloat16"])
def test_attention_narrow_dtypes_on_packed_products(dev, dtype):
    import ml_dtypes

    dt = ml_dtypes.bfloat16 if dtype == "bfloat16" else dtype
    rng = np.random.default_rng(5)
    q, k, v = (rng.standard_normal(s).astype(dt) for s in ((2, 8, 19, 16), (2, 2, 19, 16), (2, 2, 19, 16)))
    (y,) = devkit.run_op("Attention", [devkit.asarray(x, dev) for x in (q, k, v)], {"is_causal": 1})[:1]
    want, _ = _attention64(q, k, v, causal=True)
    rtol, atol = _ATTN_TOLERANCE[dtype]
    np.testing.assert_allclose(y.numpy().astype(np.float64), want, rtol=rtol, atol=atol)


def test_attention_rows_of_nan_and_of_masked_keys(dev):
    # Float masks: row 0 masks every key (zeros), row 1 every key but one
    # negative NaN (it ranks below -inf as an ordered integer: NaN anyway),
    # row 2 one NaN among finite biases, row 3 a +inf score (NaN), row 4 a
    # negative NaN among finite biases (below the finite maximum: NaN).
    rng = np.random.default_rng(11)
    q = rng.standard_normal((1, 1, 5, 8)).astype(np.float32)
    k, v = (rng.standard_normal((1, 1, 4, 8)).astype(np.float32) for _ in range(2))
    mask = np.zeros((5, 20), np.float32)
    mask[4, 9] = np.copysign(np.nan, -1.0)
    mask[0] = -np.inf
    mask[1] = -np.inf
    mask[1, 7] = np.copysign(np.nan, -1.0)
    mask[2, 3] = np.nan
    mask[3, 5] = np.inf
    k = np.concatenate([k] * 5, axis=2)
    v = np.concatenate([v] * 5, axis=2)
    y, _, _, p = (a.numpy() for a in devkit.run_op(
        "Attention", [devkit.asarray(x, dev) for x in (q, k, v, mask)], {"qk_matmul_output_mode": 3}))
    np.testing.assert_array_equal(p[0, 0, 0], 0.0)
    np.testing.assert_array_equal(y[0, 0, 0], 0.0)
    assert np.isnan(p[0, 0, 1:]).all() and np.isnan(y[0, 0, 1:]).all()


# Batched MatMul whose products are too small to split themselves splits
# its batches over the pool, each chunk starting at its own batch index
# (broadcast batch dims included); large products split themselves, one
# batch after another. Reference: float64, a dot-product bound.
@pytest.mark.parametrize("a_shape,b_shape", [((2, 4, 32, 32), (2, 4, 32, 32)), ((3, 1, 5, 7), (1, 4, 7, 6)),
                                             ((2, 3, 1, 9, 33), (3, 4, 33, 1)), ((7, 17, 3), (3, 20)),
                                             ((2, 130, 128), (2, 128, 140))])
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_batched_matmul_split_over_batches_matches_float64(dev, a_shape, b_shape, dtype):
    rng = np.random.default_rng(len(a_shape) + a_shape[-1])
    a, b = rng.standard_normal(a_shape).astype(dtype), rng.standard_normal(b_shape).astype(dtype)
    (y,) = _run(dev, "MatMul", [a, b], {})
    a64, b64 = a.astype(np.float64), b.astype(np.float64)
    bound = 8 * a_shape[-1] * np.finfo(dtype).eps * (np.abs(a64) @ np.abs(b64))
    assert y.shape == (a64 @ b64).shape
    assert np.all(np.abs(y - a64 @ b64) <= bound)
