"""The cpu plugin's float32 GlobalAveragePool (linalg_pool.c): planes of 256
or fewer elements 8 at a time, each summed in float64 in order, the rest
(and larger planes, summed pairwise) one by one. Against the float64 mean
within 1 ulp of float32, infinities and NaN where the reference has them."""

from __future__ import annotations

import numpy as np
import pytest

import devkit
from devkit import ops


@pytest.fixture(scope="module")
def dev():
    return devkit.load_plugin("cpu").device(0)


@pytest.mark.parametrize("shape", [
    (2, 32, 8, 8),  # the zoo resnet's: 64 planes, 8 at a time
    (3, 7, 9, 5),  # 21 planes: two groups of 8 and 5 alone
    (1, 9, 16, 16),  # 256 elements, the most summed 8 planes at a time
    (1, 9, 1, 257),  # one more: pairwise, plane by plane
    (1, 3, 2, 2),  # fewer planes than a group
])
@pytest.mark.parametrize("special", [None, "inf", "nan", "inf-and-minus-inf"])
def test_global_average_pool_matches_the_reference(dev, shape, special):
    rng = np.random.default_rng(7)
    x = (rng.standard_normal(shape) * 10).astype(np.float32)
    if special:
        x[0, -1, 0, 0] = np.nan if special == "nan" else np.inf
        if special == "inf-and-minus-inf":
            x[0, -1, -1, -1] = -np.inf
    want = x.astype(np.float64).mean(axis=(2, 3), keepdims=True)
    got = ops.GlobalAveragePool(devkit.asarray(x, dev)).numpy()
    assert got.shape == want.shape and got.dtype == np.float32
    np.testing.assert_array_equal(np.isnan(got), np.isnan(want))
    finite = np.isfinite(want)
    np.testing.assert_array_equal(got[~finite & ~np.isnan(want)], want[~finite & ~np.isnan(want)])
    np.testing.assert_allclose(got[finite], want[finite], rtol=2.0 ** -23, atol=0)
