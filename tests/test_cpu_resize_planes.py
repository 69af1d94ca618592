"""The cpu plugin's float32 Resize of the last two dims in one pass per
output row (shape_resize.c, resize_last_two): the same sums in the same
order as the separable float64 passes, so the result equals the op's
NumPy reference bit for bit -- linear and cubic, antialiased downscales,
each coordinate mode but tf_crop_and_resize (which keeps the general
passes, as do float64 and windows that resize other dims)."""

from __future__ import annotations

import numpy as np
import pytest

import devkit
from devkit import ops


@pytest.fixture(scope="module")
def dev():
    return devkit.load_plugin("cpu").device(0)


def _check(dev, x, scales, attrs):
    op = ops.get("Resize")
    full = {a.name: a.default for a in op.attrs if a.default is not None}
    full.update(attrs, scales=scales)
    want = op.reference([x], full)[0].astype(x.dtype)  # float64 sums, rounded once
    got = ops.Resize(devkit.asarray(x, dev), scales=scales, **attrs).numpy()
    assert got.dtype == x.dtype and got.shape == want.shape
    np.testing.assert_array_equal(got, want)


@pytest.mark.parametrize("shape, scales, attrs", [
    ((1, 16, 16, 16), [1, 1, 2, 2], {"mode": "linear"}),  # the U-Net's upsampling
    ((2, 3, 5, 7), [1, 1, 2, 1.5], {"mode": "linear"}),
    ((1, 2, 9, 11), [1, 1, 0.5, 0.4], {"mode": "linear", "antialias": 1}),  # more than 2 taps
    ((1, 2, 6, 5), [1, 1, 1.7, 2.3], {"mode": "cubic"}),
    ((1, 2, 6, 5), [1, 1, 1.7, 2.3], {"mode": "cubic", "exclude_outside": 1}),
    ((1, 2, 12, 10), [1, 1, 0.6, 0.7], {"mode": "cubic", "antialias": 1}),
    ((3, 4, 8), [1, 2, 3], {"mode": "linear"}),  # 3-D: the last two dims of one plane per batch
    ((1, 1, 4, 4), [1, 1, 3, 3], {"mode": "linear", "coordinate_transformation_mode": "align_corners"}),
    ((1, 1, 4, 5), [1, 1, 2, 2], {"mode": "linear", "coordinate_transformation_mode": "asymmetric"}),
    ((1, 1, 1, 5), [1, 1, 4, 2], {"mode": "linear", "coordinate_transformation_mode": "pytorch_half_pixel"}),
    ((1, 1, 4, 5), [1, 1, 2.5, 1.5], {"mode": "linear", "coordinate_transformation_mode": "half_pixel_symmetric"}),
    # not this path: one resized dim, a resized channel dim, float32 beside them
    ((1, 2, 4, 5), [1, 1, 1, 2], {"mode": "linear"}),
    ((1, 2, 4, 5), [1, 1, 2, 1], {"mode": "linear"}),
    ((1, 2, 4, 5), [1, 2, 2, 2], {"mode": "linear"}),
])
def test_resize_of_the_last_two_dims_matches_the_reference_bit_for_bit(dev, shape, scales, attrs):
    x = np.random.default_rng(0).standard_normal(shape).astype(np.float32)
    _check(dev, x, np.asarray(scales, np.float32), attrs)


def test_non_finite_values_spread_as_in_the_reference(dev):
    x = np.random.default_rng(1).standard_normal((1, 2, 6, 6)).astype(np.float32)
    x[0, 0, 2, 3], x[0, 1, 4, 1] = np.inf, np.nan
    _check(dev, x, np.asarray([1, 1, 2, 2], np.float32), {"mode": "linear"})
