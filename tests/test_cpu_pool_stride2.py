"""The cpu plugin's float32 MaxPool with column stride 2 (linalg_pool.c,
max_pool_stride2, where the CPU has AVX-512): 16 outputs of a row at a
time, each window row's taps from masked loads, folded by the first
maximum. Bit for bit against the op's reference: the first of equal maxima
(-0 before +0 and the reverse), the first NaN, infinities; rows cut at 16
outputs, pads on either side, window rows outside X, ceil_mode; float16
run as float32."""

from __future__ import annotations

import numpy as np
import pytest

import devkit
from devkit import ops


@pytest.fixture(scope="module")
def dev():
    return devkit.load_plugin("cpu").device(0)


def _check(dev, x, attrs):
    op = ops.get("MaxPool")
    full = {a.name: a.default for a in op.attrs if a.default is not None}
    full.update(attrs)
    want = op.reference([x], full)[0].astype(x.dtype)  # a maximum is one of the inputs: exact
    got = ops.MaxPool(devkit.asarray(x, dev), outputs=1, **attrs)
    got = (got[0] if isinstance(got, (list, tuple)) else got).numpy()
    assert got.dtype == x.dtype and got.shape == want.shape
    # NaN where the reference has one (its bits are the cast's), else the same bits
    nan = np.isnan(want.astype(np.float32))
    np.testing.assert_array_equal(np.isnan(got.astype(np.float32)), nan)
    bits = np.uint16 if x.itemsize == 2 else np.uint32
    np.testing.assert_array_equal(got.view(bits)[~nan], want.view(bits)[~nan])


def _with_specials(rng, shape, dtype):
    x = rng.standard_normal(shape).astype(np.float32)
    flat = x.reshape(-1)
    picks = rng.choice(flat.size, size=max(1, flat.size // 8), replace=False)
    flat[picks] = rng.choice(np.array([np.nan, np.inf, -np.inf, 0.0, -0.0, 1.0], np.float32), size=picks.size)
    return x.astype(dtype)


@pytest.mark.parametrize("shape, attrs", [
    ((2, 16, 32, 32), {"kernel_shape": [3, 3], "strides": [2, 2], "pads": [1, 1, 1, 1]}),  # the zoo ResNet's
    ((1, 3, 64, 64), {"kernel_shape": [3, 3], "strides": [2, 2], "pads": [1, 1, 1, 1]}),  # 32 outputs: two runs, the widest
    ((1, 2, 9, 69), {"kernel_shape": [3, 3], "strides": [2, 2], "pads": [0, 1, 1, 0]}),   # 35: a cut run
    ((1, 8, 32, 32), {"kernel_shape": [2, 2], "strides": [2, 2]}),  # the U-Net's
    ((1, 2, 7, 9), {"kernel_shape": [1, 4], "strides": [1, 2], "pads": [0, 2, 0, 1]}),
    ((1, 2, 11, 5), {"kernel_shape": [3, 1], "strides": [3, 2], "pads": [2, 0, 2, 0]}),  # rows outside X
    ((2, 1, 6, 7), {"kernel_shape": [2, 3], "strides": [2, 2], "ceil_mode": 1}),
    ((1, 1, 3, 1), {"kernel_shape": [2, 2], "strides": [1, 2], "pads": [1, 1, 1, 1]}),  # one column
])
@pytest.mark.parametrize("dtype", [np.float32, np.float16])
def test_stride2_max_pool_matches_the_reference_bit_for_bit(dev, shape, attrs, dtype):
    _check(dev, _with_specials(np.random.default_rng(3), shape, dtype), attrs)


@pytest.mark.parametrize("first, second", [(-0.0, 0.0), (0.0, -0.0)])
def test_the_first_of_equal_maxima_wins(dev, first, second):
    x = np.full((1, 1, 2, 4), -1.0, np.float32)
    x[0, 0, 0, 1], x[0, 0, 1, 0] = first, second
    _check(dev, x, {"kernel_shape": [2, 2], "strides": [2, 2]})
