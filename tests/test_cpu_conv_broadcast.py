"""The cpu plugin's broadcast Conv path (linalg_conv_broadcast.c, where the
CPU has AVX-512): float32 2-D convolutions with 5-64 filters per group on
small planes. Its register blocks -- 8 filters by 32 positions of a row or
16 of each of two rows (vectors of positions; up to 16 filters in blocks of
8 on unit column strides), 16 filters by 16 positions of a row or 8 of each
of two rows and 32 filters by 8 positions (vectors of filters) -- cut by the
filter count, the row's end and the band's last row;
strides 1 and 2 read in place from each part's zero-padded band of X;
splits by image or by bands of rows (odd row counts, batches that do not
share out over the threads); groups; FusedConv's B, Z and Relu in the
transposed block; non-finite values; filters prepared at plan time equal
bit for bit to filters packed at the call. References are the op's float64
one; the tolerance the op's dot-product bound (K products summing to at
most S), and NaN and infinities where the reference has them."""

from __future__ import annotations

import math

import numpy as np
import pytest

import devkit
from devkit import ops
from devkit.ops import testing
from devkit.ops.linalg import dot_tolerance, magnitude

from .test_cpu_conv_kernels import _conv_node_model

CONV_DEFAULTS = {"group": 1, "auto_pad": "NOTSET"}


@pytest.fixture(scope="module")
def dev():
    return devkit.load_plugin("cpu").device(0)


def _reference(x, w, b, z, attrs, relu):
    """Relu?(Conv(x, w) + b + z) in float64, and the sum of the magnitudes
    its tolerance scales with."""
    full = {**CONV_DEFAULTS, **attrs}
    reference = ops.get("Conv").reference
    want = reference([v.astype(np.float64) for v in (x, w, b) if v is not None], full)[0]
    largest = reference([magnitude(x), magnitude(w)], full)[0]
    if b is not None:
        largest = largest + np.abs(b.astype(np.float64)).reshape(1, -1, 1, 1)
    if z is not None:
        want, largest = want + z, largest + np.abs(z.astype(np.float64))
    return (np.maximum(want, 0) if relu else want), float(np.nanmax(largest[np.isfinite(largest)], initial=0.0))


def _check(got, want, w, largest):
    comparison = testing.compare(got, want, dot_tolerance(np.float32, w.shape[1] * math.prod(w.shape[2:]), largest))
    assert comparison.ok, comparison.message


def _case(rng, x_shape, w_shape, bias=True):
    x, w = testing.random(rng, x_shape, np.float32), testing.random(rng, w_shape, np.float32)
    return x, w, testing.random(rng, (w_shape[0],), np.float32) if bias else None


# (x shape, W shape, attributes): the register-block shapes and their edges
SHAPES = [
    ((2, 3, 32, 32), (16, 3, 3, 3), {"pads": [1, 1, 1, 1]}),  # the zoo resnet's stem: rows of 16, two a row
    ((2, 16, 16, 16), (16, 16, 3, 3), {"pads": [1, 1, 1, 1]}),  # its 16x16 layers
    ((2, 16, 16, 16), (32, 16, 3, 3), {"pads": [1, 1, 1, 1], "strides": [2, 2]}),  # its 3x3/2: 32 filters
    ((2, 32, 8, 8), (32, 32, 3, 3), {"pads": [1, 1, 1, 1]}),  # its 8x8 layer: 288 channel-taps, the most
    ((1, 16, 16, 16), (16, 16, 3, 3), {"pads": [1, 1, 1, 1]}),  # one image: two bands of rows
    ((3, 8, 9, 8), (16, 8, 3, 3), {"pads": [1, 1, 1, 1]}),  # rows of 8 in pairs, an odd row count
    ((1, 8, 14, 13), (12, 8, 3, 3), {"pads": [1, 0, 1, 2]}),  # 12 filters: a cut block; rows of 13
    ((1, 4, 11, 37), (16, 4, 3, 3), {"pads": [0, 1, 2, 1]}),  # rows of 37: two blocks of 16 and 5
    ((1, 8, 20, 19), (30, 8, 3, 3), {"pads": [1, 1, 1, 1]}),  # 30 filters: a cut block of 32; rows of 19
    ((2, 8, 10, 12), (48, 8, 3, 3), {"pads": [1, 1, 1, 1]}),  # two blocks of 32, the second cut
    ((1, 4, 10, 10), (64, 4, 3, 3), {}),  # 64 filters, the most; no padding
    ((1, 5, 23, 34), (24, 5, 3, 3), {"pads": [2, 1, 0, 1], "strides": [2, 2]}),  # stride 2, uneven pads
    ((1, 6, 19, 40), (16, 6, 2, 3), {"pads": [0, 1, 1, 0], "strides": [1, 2]}),  # strides by axis
    ((1, 6, 30, 17), (16, 6, 3, 2), {"pads": [1, 0, 1, 1], "strides": [2, 1]}),
    ((1, 3, 40, 37), (20, 3, 7, 7), {"pads": [3, 3, 3, 3], "strides": [2, 2]}),  # 7x7: the largest window
    ((1, 4, 64, 64), (16, 4, 3, 3), {"pads": [1, 1, 1, 1]}),  # 4096 outputs, the largest plane
    ((2, 12, 9, 10), (48, 4, 3, 3), {"group": 3, "pads": [1, 1, 1, 1]}),  # groups: images of 3 groups
    ((1, 16, 12, 12), (32, 8, 5, 5), {"group": 2, "pads": [2, 2, 2, 2]}),
    ((1, 4, 8, 8), (16, 4, 3, 3), {"pads": [5, 5, 5, 5]}),  # pads wider than the window: all-padding windows
    ((2, 6, 11, 13), (18, 3, 3, 3), {"group": 2, "auto_pad": "SAME_UPPER"}),  # 9 filters a group
    ((1, 3, 32, 32), (8, 3, 3, 3), {"pads": [1, 1, 1, 1]}),  # the U-Net's 8-filter layers: rows of 32
    ((1, 16, 32, 32), (8, 16, 3, 3), {"pads": [1, 1, 1, 1]}),
    ((2, 4, 13, 20), (5, 4, 3, 3), {"pads": [1, 1, 1, 1]}),  # 5 filters, the fewest; rows of 20: 32 cut
    ((1, 6, 18, 16), (6, 6, 3, 3), {"pads": [0, 1, 2, 1], "strides": [2, 1]}),  # rows of 16, row stride 2
    ((1, 8, 11, 12), (16, 4, 5, 5), {"group": 2, "pads": [2, 2, 2, 2]}),  # groups of 8 filters
    ((1, 8, 15, 12), (16, 8, 3, 3), {"pads": [1, 1, 1, 1]}),  # two blocks of 8; bands of 8 and 7 rows
]


@pytest.mark.parametrize("x_shape, w_shape, attrs", SHAPES)
@pytest.mark.parametrize("bias", [False, True])
def test_broadcast_path_matches_the_reference(dev, x_shape, w_shape, attrs, bias):
    x, w, b = _case(np.random.default_rng(21), x_shape, w_shape, bias)
    want, largest = _reference(x, w, b, None, attrs, relu=False)
    inputs = [v for v in (x, w, b) if v is not None]
    got = devkit.run_op("Conv", [devkit.asarray(v, dev) for v in inputs], attrs)[0].numpy()
    _check(got, want, w, largest)


@pytest.mark.parametrize("x_shape, w_shape, attrs", [SHAPES[i] for i in (0, 1, 2, 3, 5, 6, 8, 11, 16, 21, 22, 25)])
def test_broadcast_path_applies_fused_conv_epilogue(dev, x_shape, w_shape, attrs):
    """FusedConv: B, then Z, then the Relu, on each block shape's halves."""
    rng = np.random.default_rng(22)
    x, w, b = _case(rng, x_shape, w_shape)
    y_shape = ops.get("Conv").reference([x, w], {**CONV_DEFAULTS, **attrs})[0].shape
    z = testing.random(rng, y_shape, np.float32)
    want, largest = _reference(x, w, b, z, attrs, relu=True)
    got = devkit.run_op("FusedConv", [devkit.asarray(v, dev) for v in (x, w, b, z)],
                        {**attrs, "activation": "Relu"})[0].numpy()
    _check(got, want, w, largest)


@pytest.mark.parametrize("x_shape, w_shape, attrs", [SHAPES[i] for i in (0, 3, 5, 11, 21)])
@pytest.mark.parametrize("special", ["x-inf", "x-nan", "x-edge-nan", "w-inf", "relu-nan"])
def test_broadcast_path_spreads_non_finite_values(dev, x_shape, w_shape, attrs, special):
    """A non-finite input reaches the outputs whose windows hold it, the
    padding's 0 * inf gives NaN as in the reference's product, and the Relu
    keeps NaN."""
    x, w, b = _case(np.random.default_rng(23), x_shape, w_shape)
    if special == "x-inf":
        x[0, 1, 2, 3] = np.inf
    elif special in ("x-nan", "relu-nan"):
        x[-1, 0, -1, -2] = np.nan
    elif special == "x-edge-nan":
        x[0, -1, 0, 0] = np.nan  # a corner: the padded windows around it
    else:
        w[-1, 0, 1, 1] = -np.inf
    relu = special == "relu-nan"
    want, largest = _reference(x, w, b, None, attrs, relu=relu)
    op, extra = ("FusedConv", {"activation": "Relu"}) if relu else ("Conv", {})
    got = devkit.run_op(op, [devkit.asarray(v, dev) for v in (x, w, b)], {**attrs, **extra})[0].numpy()
    assert not np.isfinite(want).all()
    _check(got, want, w, largest)


@pytest.mark.parametrize("x_shape, w_shape, attrs", [SHAPES[i] for i in (0, 2, 3, 5, 8, 9, 16, 21, 23)])
@pytest.mark.parametrize("bias", [False, True])
def test_prepared_broadcast_filters_match_the_reference(x_shape, w_shape, attrs, bias):
    """Filters packed at plan time and at the call give the same bits (the
    same sums in the same order), within the tolerance of the reference."""
    import devkit.onnx as donnx

    x, w, b = _case(np.random.default_rng(24), x_shape, w_shape, bias)
    model = _conv_node_model(w, b, attrs, x_shape)
    got = [donnx.prepare(model, prepare_weights=p).run({"x": x})[0] for p in (True, False)]
    want, largest = _reference(x, w, b, None, attrs, relu=False)
    for g in got:
        _check(g, want, w, largest)
    np.testing.assert_array_equal(got[0], got[1])
