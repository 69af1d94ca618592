"""The cpu plugin's pointwise Conv path (float32 2-D 1x1 kernels without
padding, any strides; linalg_conv_pointwise.c, on x86-64 with AVX2 and FMA,
elsewhere the GEMM paths): filter blocks cut by the filter count, bands whose
last block is cut by the plane, odd planes at stride 2, unequal strides and
strides beyond the kernel, groups, batches, runs of filters sharing a band's
panel, more channels than a panel is sized for, non-finite values, one
channel and one position, and FusedConv's epilogue (B, Z, Relu). Run with
DEVKIT_CPU_THREADS=1 and 2 (the larger shapes split over the pool).
References are the op specs' float64 ones; tolerances the ops' own
dot-product bound (K products summing to at most S, |B| and |Z| added to S),
and NaN and infinities where the reference has them."""

from __future__ import annotations

import numpy as np
import pytest

import devkit
from devkit import ops
from devkit.ops import testing
from devkit.ops.linalg import dot_tolerance, magnitude

CONV_DEFAULTS = {"group": 1, "auto_pad": "NOTSET"}


@pytest.fixture(scope="module")
def dev():
    return devkit.load_plugin("cpu").device(0)


def _run(dev, op, inputs, attrs):
    return devkit.run_op(op, [None if v is None else devkit.asarray(v, dev) for v in inputs], attrs)[0].numpy()


def _check(dev, x, w, b, attrs, z=None, activation=None):
    """Conv (or, with Z or an activation, FusedConv) against the float64
    reference: within the dot-product bound of the channels' products, with
    |B| and |Z| added to the sums' bound."""
    full = {**CONV_DEFAULTS, **attrs}
    reference = ops.get("Conv").reference
    ref = reference([v.astype(np.float64) for v in (x, w, b) if v is not None], full)[0]
    sums = reference([magnitude(x), magnitude(w)], full)[0]
    if b is not None:
        sums = sums + np.abs(b).max()
    inputs = [v for v in (x, w, b) if v is not None]
    if z is not None or activation is not None:
        if z is not None:
            ref, sums = ref + z, sums + np.abs(z).max()
        if activation == "Relu":
            ref = np.maximum(ref, 0)
        got = _run(dev, "FusedConv", [x, w, b, z], {**attrs, "activation": activation or ""})
    else:
        got = _run(dev, "Conv", inputs, attrs)
    cg = w.shape[1]
    comparison = testing.compare(got, ref, dot_tolerance(np.float32, cg, float(sums.max())))
    assert comparison.ok, comparison.message


SHAPES = [
    ((1, 64, 56, 56), (256, 64, 1, 1), {}),  # ResNet's 56x56 bottleneck: many bands, in place
    ((1, 64, 56, 56), (128, 64, 1, 1), {"strides": [2, 2]}),  # ResNet's downsampling layers
    ((1, 128, 28, 28), (256, 128, 1, 1), {"strides": [2, 2]}),
    ((1, 256, 14, 14), (512, 256, 1, 1), {"strides": [2, 2]}),  # 49 positions: one band, runs of filters
    ((1, 37, 9, 11), (13, 37, 1, 1), {}),  # 99 positions (a last block of 3), 13 filters (a block of 1)
    ((1, 5, 15, 17), (7, 5, 1, 1), {"strides": [2, 2]}),  # odd plane at stride 2: 8 x 9 outputs
    ((1, 6, 14, 13), (5, 6, 1, 1), {"strides": [2, 2]}),  # even rows, odd columns
    ((1, 9, 16, 20), (11, 9, 1, 1), {"strides": [3, 2]}),  # unequal strides
    ((1, 4, 13, 14), (6, 4, 1, 1), {"strides": [4, 5]}),  # strides beyond the kernel: rows and columns skipped
    ((1, 8, 1, 1), (3, 8, 1, 1), {}),  # one position
    ((1, 1, 7, 40), (1, 1, 1, 1), {}),  # one channel, one filter
    ((3, 20, 10, 10), (17, 20, 1, 1), {}),  # a batch
    ((2, 24, 9, 9), (18, 8, 1, 1), {"group": 3, "strides": [2, 2]}),  # groups and a batch
    # enough work to split over the pool (DEVKIT_CPU_THREADS > 1): runs of filters sharing each
    # image's panel; bands of images and groups
    ((2, 32, 30, 30), (48, 32, 1, 1), {"strides": [2, 2]}),
    ((2, 64, 28, 28), (64, 32, 1, 1), {"group": 2}),
    ((1, 700, 6, 6), (40, 700, 1, 1), {}),  # more channels than a band's panel is sized for
    ((1, 16, 20, 24), (30, 16, 1, 1), {"dilations": [3, 2]}),  # dilations do not move a 1x1 tap
]


@pytest.mark.parametrize("x_shape, w_shape, attrs", SHAPES)
@pytest.mark.parametrize("bias", [False, True])
def test_pointwise_conv_matches_the_reference(dev, x_shape, w_shape, attrs, bias):
    rng = np.random.default_rng(0)
    x, w = testing.random(rng, x_shape, np.float32), testing.random(rng, w_shape, np.float32)
    b = testing.random(rng, (w_shape[0],), np.float32) if bias else None
    _check(dev, x, w, b, attrs)


@pytest.mark.parametrize("x_shape, w_shape, attrs", [
    ((1, 64, 56, 56), (256, 64, 1, 1), {}),
    ((1, 128, 28, 28), (256, 128, 1, 1), {"strides": [2, 2]}),
    ((2, 24, 11, 9), (14, 12, 1, 1), {"group": 2}),  # a last block of 3 positions per band, groups
    ((1, 10, 15, 15), (9, 10, 1, 1), {"strides": [2, 2]}),
])
@pytest.mark.parametrize("with_z, activation", [(True, None), (False, "Relu"), (True, "Relu")])
def test_pointwise_fused_conv_applies_the_epilogue(dev, x_shape, w_shape, attrs, with_z, activation):
    """FusedConv (devkit.onnx's Conv + Add + Relu rewrite): B, Z and the
    activation on every block of outputs, the plane's cut blocks included."""
    rng = np.random.default_rng(1)
    x, w = testing.random(rng, x_shape, np.float32), testing.random(rng, w_shape, np.float32)
    b = testing.random(rng, (w_shape[0],), np.float32)
    (y_shape, _), = ops.get("Conv").infer([ops.spec.TensorInfo(x.shape, x.dtype),
                                           ops.spec.TensorInfo(w.shape, w.dtype), None],
                                          {**CONV_DEFAULTS, **attrs})
    z = testing.random(rng, y_shape, np.float32) if with_z else None
    _check(dev, x, w, b, attrs, z=z, activation=activation)


@pytest.mark.parametrize("special", ["x-inf", "x-nan", "w-inf"])
@pytest.mark.parametrize("strides", [[1, 1], [2, 2]])
def test_pointwise_conv_keeps_non_finite_values_to_their_outputs(dev, special, strides):
    """A non-finite input reaches the outputs that read it (every filter at
    its position); an infinite weight, every output of its filter."""
    rng = np.random.default_rng(2)
    x = testing.random(rng, (1, 40, 13, 21), np.float32)
    w = testing.random(rng, (20, 40, 1, 1), np.float32)
    if special == "x-inf":
        x[0, 3, 12, 20] = np.inf  # the plane's last position: in the last, cut block
    elif special == "x-nan":
        x[0, 5, 4, 6] = np.nan
    else:
        w[7, 1, 0, 0] = -np.inf
    _check(dev, x, w, testing.random(rng, (20,), np.float32), {"strides": strides})
