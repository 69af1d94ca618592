"""Array-API conventions of devkit arrays, against NumPy: the creation keywords,
every operator (arrays and Python scalars on either side), the promotion
table, in-place semantics and the reduction methods. All on the cpu plugin."""

import operator

import numpy as np
import pytest

import devkit
from devkit import dtypes

RNG = np.random.default_rng(18)
NUMERIC = ("uint8", "int32", "int64", "float32", "float64")
INTEGER = ("uint8", "int32", "int64")


def values(dtype, shape=(3, 4), nonzero=False):
    """Exactly representable values: integers in [-9, 9] (from 1 when nonzero), quarters for floats."""
    low = 1 if nonzero or np.dtype(dtype).kind == "u" else -9
    host = RNG.integers(low, 10, shape)
    if nonzero and np.dtype(dtype).kind != "u":
        host = host * RNG.choice([-1, 1], shape)
    if np.dtype(dtype).kind == "f":
        host = host / 4
    return host.astype(dtype)


def check(got, expected, exact=True):
    assert isinstance(got, devkit.Array)
    assert got.dtype == expected.dtype and got.shape == expected.shape
    if exact:
        np.testing.assert_array_equal(got.numpy(), expected)
    else:
        np.testing.assert_allclose(got.numpy(), expected, rtol=1e-6)


# -- creation keywords ------------------------------------------------------------------------------------

def test_asarray_takes_the_array_api_keywords():
    host = values("float32")
    x = devkit.asarray(host, device="cpu:1", dtype="float64")
    assert str(x.device) == "cpu:1" and x.dtype == np.float64
    np.testing.assert_array_equal(x.numpy(), host.astype(np.float64))
    assert devkit.asarray(x) is x and devkit.asarray(x, copy=False) is x
    copied = devkit.asarray(x, copy=True)
    assert copied is not x and copied.buffer is not x.buffer and copied.device is x.device
    with pytest.raises(ValueError, match="copy=False.*host data is always copied"):
        devkit.asarray(host, copy=False)
    with pytest.raises(ValueError, match="copy=False.*on cpu:1, not cpu:0"):
        devkit.asarray(x, device="cpu:0", copy=False)


def test_the_default_device_is_one_for_every_function():
    assert devkit.DEFAULT_DEVICE == "cpu:0"
    placed = [devkit.asarray([1.0]), devkit.empty(2), devkit.zeros(2), devkit.ones(2), devkit.full(2, 3),
              devkit.arange(3), devkit.run_op("Range", [0, 3, 1])[0], devkit.device()]
    assert {str(p if isinstance(p, devkit.Device) else p.device) for p in placed} == {"cpu:0"}
    from devkit.onnx import prepare, zoo

    model, _ = zoo.mlp()
    assert str(prepare(model).device) == "cpu:0"


@pytest.mark.parametrize("make, expected", [
    (lambda: devkit.empty((2, 3), dtype="int32", device="cpu:1"), None),
    (lambda: devkit.zeros((2, 3), dtype="int8", device="cpu:1"), np.zeros((2, 3), np.int8)),
    (lambda: devkit.ones((2, 3), device="cpu:1"), np.ones((2, 3), np.float32)),
    (lambda: devkit.ones(4, dtype="int16", device="cpu:1"), np.ones(4, np.int16)),
    (lambda: devkit.full((2,), 7, device="cpu:1"), np.full((2,), 7, np.int64)),
    (lambda: devkit.full((2,), True, device="cpu:1"), np.full((2,), True)),
    (lambda: devkit.full((2,), 0.5, dtype="float64", device="cpu:1"), np.full((2,), 0.5)),
    (lambda: devkit.arange(5, device="cpu:1"), np.arange(5, dtype=np.int64)),
    (lambda: devkit.arange(1, 10, 3, device="cpu:1"), np.arange(1, 10, 3, dtype=np.int64)),
    (lambda: devkit.arange(0.5, 2, 0.5, device="cpu:1"), np.arange(0.5, 2, 0.5, dtype=np.float32)),
    (lambda: devkit.arange(4, dtype="uint8", device="cpu:1"), np.arange(4, dtype=np.uint8)),
], ids=["empty", "zeros", "ones", "ones_int16", "full_int", "full_bool", "full_dtype", "arange", "arange_step",
        "arange_float", "arange_dtype"])
def test_creation_functions(make, expected):
    array = make()
    assert str(array.device) == "cpu:1"
    if expected is None:  # empty: the values are undefined
        assert array.dtype == np.int32 and array.shape == (2, 3)
    else:
        check(array, expected)


def test_like_functions_follow_their_argument():
    x = devkit.asarray(values("int32"), device="cpu:1")
    for like in (devkit.empty_like(x), devkit.zeros_like(x), devkit.ones_like(x), devkit.full_like(x, 5)):
        assert like.shape == x.shape and like.dtype == x.dtype and like.device is x.device
    np.testing.assert_array_equal(devkit.zeros_like(x).numpy(), np.zeros((3, 4), np.int32))
    np.testing.assert_array_equal(devkit.ones_like(x).numpy(), np.ones((3, 4), np.int32))
    np.testing.assert_array_equal(devkit.full_like(x, 5).numpy(), np.full((3, 4), 5, np.int32))
    other = devkit.zeros_like(x, dtype="float64", device="cpu:0")
    assert other.dtype == np.float64 and str(other.device) == "cpu:0"


def test_to_device_copies_to_the_named_device():
    host = values("float32")
    x = devkit.asarray(host)
    moved = x.to_device("cpu:1")
    assert str(moved.device) == "cpu:1" and moved.buffer is not x.buffer
    np.testing.assert_array_equal(moved.numpy(), host)
    np.testing.assert_array_equal(x.to("cpu:1").numpy(), host)


# -- promotion ----------------------------------------------------------------------------------------------

ALL = ("bool", "int8", "int16", "int32", "int64", "uint8", "uint16", "uint32", "uint64",
       "float16", "float32", "float64")


@pytest.mark.parametrize("a", ALL)
@pytest.mark.parametrize("b", ALL)
def test_promotion_table_is_the_array_apis(a, b):
    kind = {"b": "bool", "i": "int", "u": "int", "f": "float"}
    da, db = np.dtype(a), np.dtype(b)
    if kind[da.kind] != kind[db.kind]:
        with pytest.raises(TypeError, match=f"no promotion between {a} and {b}.*within a kind"):
            devkit.result_type(a, b)
    elif {da.kind, db.kind} == {"i", "u"} and "uint64" in (a, b):
        with pytest.raises(TypeError, match="no signed type holds both"):
            devkit.result_type(a, b)
    else:  # within these, NumPy's table is the standard's
        assert devkit.result_type(a, b) == np.promote_types(da, db)


def test_promotion_of_bfloat16():
    bf16 = dtypes.bfloat16
    assert devkit.result_type(bf16, bf16) == bf16
    assert devkit.result_type(bf16, "float16") == np.float32
    assert devkit.result_type("float32", bf16) == np.float32
    assert devkit.result_type(bf16, "float64") == np.float64
    with pytest.raises(TypeError, match="no promotion between bfloat16 and int8"):
        devkit.result_type(bf16, "int8")


@pytest.mark.parametrize("a, b", [("uint8", "int32"), ("int8", "int32"), ("uint8", "int64"), ("float32", "float64")])
def test_operators_promote_their_operands(a, b):
    x, y = values(a), values(b)
    check(devkit.asarray(x) + devkit.asarray(y), x + y)
    check(devkit.asarray(y) * devkit.asarray(x), y * x)


def test_operands_of_different_kinds_or_unknown_types_are_refused():
    i, f, b = devkit.arange(3), devkit.ones(3), devkit.full(3, True)
    with pytest.raises(TypeError, match="no promotion between int64 and float32"):
        i + f
    with pytest.raises(TypeError, match="a Python float does not combine with a int64 array"):
        i * 0.5
    with pytest.raises(TypeError, match="a Python int does not combine with a bool array"):
        b & 1
    with pytest.raises(TypeError, match="a Python bool does not combine with a float32 array"):
        f + True
    with pytest.raises(TypeError, match="unsupported operand"):
        i + "1"
    with pytest.raises(ValueError, match="Cast: attribute 'to': int16 is not one of"):  # no int16 kernels
        devkit.arange(3, dtype="uint8") + devkit.arange(3, dtype="int8")
    with pytest.raises(OverflowError, match="out of bounds for uint8"):
        devkit.arange(3, dtype="uint8") + 300
    assert (i == "1") is False  # == with a foreign type falls back to identity, as for NumPy


# -- operators ----------------------------------------------------------------------------------------------

ARITHMETIC = {"+": operator.add, "-": operator.sub, "*": operator.mul, "/": operator.truediv,
              "//": operator.floordiv, "%": operator.mod, "**": operator.pow}
COMPARISON = {"==": operator.eq, "!=": operator.ne, "<": operator.lt, "<=": operator.le,
              ">": operator.gt, ">=": operator.ge}
BITWISE = {"&": operator.and_, "|": operator.or_, "^": operator.xor}


def operands(symbol, dtype, shape=(3, 4)):
    """(left, right) host values for ``symbol``: no zero divisors, small non-negative exponents."""
    if symbol == "**":
        return values(dtype, shape), RNG.integers(0, 4, shape).astype(dtype)
    return values(dtype, shape), values(dtype, shape, nonzero=symbol in ("/", "//", "%"))


def expected_result(fn, x, y):
    with np.errstate(divide="ignore", invalid="ignore"):
        return np.asarray(fn(x, y))


@pytest.mark.parametrize("dtype", NUMERIC)
@pytest.mark.parametrize("symbol", [*ARITHMETIC, *COMPARISON])
def test_binary_operators_match_numpy(symbol, dtype):
    fn = {**ARITHMETIC, **COMPARISON}[symbol]
    x, y = operands(symbol, dtype)
    if symbol == "**" and dtype == "uint8":
        with pytest.raises(TypeError, match="Pow: dtype uint8 is not supported"):
            fn(devkit.asarray(x), devkit.asarray(y))
        return
    exact = symbol != "**" or np.dtype(dtype).kind != "f"
    check(fn(devkit.asarray(x), devkit.asarray(y)), expected_result(fn, x, y), exact)
    # broadcasting: a row against the matrix, in both orders
    check(fn(devkit.asarray(x[:1]), devkit.asarray(y)), expected_result(fn, x[:1], y), exact)
    check(fn(devkit.asarray(x), devkit.asarray(y[0])), expected_result(fn, x, y[0]), exact)


@pytest.mark.parametrize("dtype", NUMERIC)
@pytest.mark.parametrize("symbol", [*ARITHMETIC, *COMPARISON])
def test_python_scalars_on_either_side(symbol, dtype):
    fn = {**ARITHMETIC, **COMPARISON}[symbol]
    x = values(dtype, nonzero=symbol in ("/", "//", "%"))
    if symbol == "**" and dtype == "uint8":
        with pytest.raises(TypeError, match="Pow: dtype uint8 is not supported"):
            devkit.asarray(x) ** 2
        return
    scalars = [3, 2] + ([-2.5, 0.75] if np.dtype(dtype).kind == "f" else [])
    exact = symbol != "**" or np.dtype(dtype).kind != "f"
    for scalar in scalars:
        right = 2 if symbol == "**" else scalar
        check(fn(devkit.asarray(x), right), expected_result(fn, x, right), exact)
        if symbol != "**":  # (a negative base to a fractional power is NaN in both; keep it simple)
            check(fn(scalar, devkit.asarray(x)), expected_result(fn, scalar, x), exact)


@pytest.mark.parametrize("dtype", ("bool", *INTEGER))
@pytest.mark.parametrize("symbol", BITWISE)
def test_bitwise_and_logical_operators(symbol, dtype):
    fn = BITWISE[symbol]
    x, y = (RNG.integers(0, 2, (3, 4)).astype(bool), RNG.integers(0, 2, (3, 4)).astype(bool)) \
        if dtype == "bool" else operands(symbol, dtype)
    check(fn(devkit.asarray(x), devkit.asarray(y)), fn(x, y))
    scalar = True if dtype == "bool" else 6
    check(fn(devkit.asarray(x), scalar), np.asarray(fn(x, scalar)))
    check(fn(scalar, devkit.asarray(x)), np.asarray(fn(scalar, x)))


def test_bitwise_operators_refuse_floats():
    with pytest.raises(TypeError, match="operator & does not take float32 arrays"):
        devkit.ones(2) & devkit.ones(2)


@pytest.mark.parametrize("shapes", [((3, 4), (4, 2)), ((2, 3, 4), (4,)), ((4,), (4, 5)), ((2, 1, 3, 4), (5, 4, 2))])
@pytest.mark.parametrize("dtype", ("float32", "float64", "int32", "int64"))
def test_matmul_operator(shapes, dtype):
    x, y = values(dtype, shapes[0]), values(dtype, shapes[1])
    check(devkit.asarray(x) @ devkit.asarray(y), x @ y)


@pytest.mark.parametrize("dtype", NUMERIC)
def test_unary_operators(dtype):
    x = values(dtype)
    check(-devkit.asarray(x), -x)
    positive = +devkit.asarray(x)
    check(positive, +x)
    check(abs(devkit.asarray(x)), abs(x))
    if np.dtype(dtype).kind != "f":
        check(~devkit.asarray(x), ~x)
    booleans = x > 0
    check(~devkit.asarray(booleans), ~booleans)


def test_transpose_and_python_conversions():
    x = values("float32", (2, 3))
    check(devkit.asarray(x).T, x.T)
    check(devkit.asarray(x).T @ devkit.asarray(x), x.T @ x)
    assert float(devkit.asarray(np.float32(2.5))) == 2.5
    assert int(devkit.asarray(np.int64(0)) + 4) == 4 and [10, 20, 30][devkit.asarray(np.int64(1))] == 20
    assert bool(devkit.ones(()) > 0) is True
    with pytest.raises(ValueError, match="truth value of an array with more than one element is ambiguous"):
        bool(devkit.ones(3) > 0)


def test_numpy_operands_are_copied_to_the_arrays_device():
    x = devkit.asarray(values("int32"), device="cpu:1")
    host = values("int64")
    for result, expected in ((x + host, x.numpy() + host), (host - x, host - x.numpy()),
                             (np.int64(3) * x, 3 * x.numpy().astype(np.int64)), (x < host[0], x.numpy() < host[0])):
        assert str(result.device) == "cpu:1"
        check(result, expected)
    with pytest.raises(TypeError, match="no promotion between int32 and float64"):
        x + host.astype(np.float64)


def test_operators_run_on_the_operands_device():
    x = devkit.asarray(values("float32", nonzero=True), device="cpu:1")
    for result in (x + 1, 1 - x, x % 3, 2.5 % x, x @ x.T, x.sum(), x > 0):
        assert str(result.device) == "cpu:1"
    with pytest.raises(ValueError, match="is on cpu:0, but the op runs on cpu:1"):
        x + devkit.ones(4)


def test_astype():
    x = values("float32")
    check(devkit.asarray(x).astype("int32"), x.astype(np.int32))
    array = devkit.asarray(x)
    assert array.astype("float32", copy=False) is array
    assert array.astype("float32").buffer is not array.buffer


# -- in place -------------------------------------------------------------------------------------------------

IN_PLACE = {"+": operator.iadd, "-": operator.isub, "*": operator.imul, "//": operator.ifloordiv,
            "%": operator.imod, "**": operator.ipow, "&": operator.iand, "|": operator.ior, "^": operator.ixor}


@pytest.mark.parametrize("symbol", IN_PLACE)
def test_in_place_operators_write_into_the_array(symbol):
    fn = IN_PLACE[symbol]
    x, y = operands(symbol, "int64")
    array = devkit.asarray(x)
    buffer, view = array.buffer, array[1:]
    result = fn(array, devkit.asarray(y))
    expected = fn(x.copy(), y)
    assert result is array and array.buffer is buffer
    np.testing.assert_array_equal(array.numpy(), expected)
    np.testing.assert_array_equal(view.numpy(), expected[1:])  # views see the write
    fn(array, 3)  # a scalar on the right
    np.testing.assert_array_equal(array.numpy(), fn(expected, 3))


def test_in_place_true_division_and_matmul():
    x, y = values("float64", (3, 3)), values("float64", (3, 3), nonzero=True)
    array = devkit.asarray(x)
    array /= devkit.asarray(y)
    np.testing.assert_array_equal(array.numpy(), x / y)
    array @= devkit.asarray(y)
    np.testing.assert_array_equal(array.numpy(), (x / y) @ y)


def test_in_place_operators_keep_dtype_and_shape():
    small = devkit.arange(4, dtype="int8")
    with pytest.raises(TypeError, match=r"in-place add: the result \(int32, shape \(4,\)\) does not fit the int8"):
        small += devkit.arange(4, dtype="int32")
    with pytest.raises(TypeError, match="in-place truediv: the result .float64"):
        small /= 2
    row = devkit.ones(3)
    with pytest.raises(TypeError, match=r"shape \(2, 3\)\) does not fit the float32 array of shape \(3,\)"):
        row += devkit.ones((2, 3))
    matrix = devkit.zeros((3, 4))
    column = matrix[:, 1]
    with pytest.raises(ValueError, match="in-place add needs a contiguous array"):
        column += 1
    np.testing.assert_array_equal(small.numpy(), np.arange(4))  # nothing was written


# -- reductions -----------------------------------------------------------------------------------------------

@pytest.mark.parametrize("dtype", ("bool", "uint8", "int32", "float32", "float64"))
@pytest.mark.parametrize("axis", [None, 0, 1, (0, 1), -1])
@pytest.mark.parametrize("keepdims", [False, True])
def test_reduction_methods_match_numpy(dtype, axis, keepdims):
    x = values(dtype) if dtype != "bool" else RNG.integers(0, 2, (3, 4)).astype(bool)
    array = devkit.asarray(x)
    kinds = {"b": np.int64, "u": np.int64, "i": np.int64}
    accumulate = kinds.get(np.dtype(dtype).kind, x.dtype)  # devkit sums unsigned integers in int64 too
    check(array.sum(axis=axis, keepdims=keepdims), np.sum(x, axis=axis, keepdims=keepdims, dtype=accumulate))
    # (a float product of 12 quarters needs more bits than float32 has: its rounding depends on the order)
    check(array.prod(axis=axis, keepdims=keepdims), np.prod(x, axis=axis, keepdims=keepdims, dtype=accumulate),
          exact=x.dtype.kind != "f")
    check(array.max(axis=axis, keepdims=keepdims), np.max(x, axis=axis, keepdims=keepdims))
    check(array.min(axis=axis, keepdims=keepdims), np.min(x, axis=axis, keepdims=keepdims))
    if dtype != "bool":
        mean = np.mean(x, axis=axis, keepdims=keepdims)
        check(array.mean(axis=axis, keepdims=keepdims), mean.astype(np.result_type(x.dtype, np.float16)
                                                                    if x.dtype.kind == "f" else np.float64),
              exact=False)
        if axis is None or isinstance(axis, int):
            check(array.argmax(axis=axis, keepdims=keepdims), np.asarray(np.argmax(x, axis=axis, keepdims=keepdims)))
            check(array.argmin(axis=axis, keepdims=keepdims), np.asarray(np.argmin(x, axis=axis, keepdims=keepdims)))


def test_reductions_take_dtype_and_empty_axes():
    x = values("int32")
    check(devkit.asarray(x).sum(dtype="float64"), np.asarray(np.sum(x, dtype=np.float64)))
    check(devkit.asarray(x).sum(axis=()), x.astype(np.int64))
    strided = devkit.asarray(x).T  # argmax of a non-contiguous view flattens a copy
    check(strided.argmax(), np.asarray(np.argmax(x.T)))
