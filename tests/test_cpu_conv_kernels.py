"""The cpu plugin's convolution paths on shapes the conformance cases do not
reach: Winograd F(2x2, 3x3) on odd planes, asymmetric pads, groups, bias and
batches, and its fallback when a value is not finite (Conv, and ConvGrad's
dX, the Conv of dY with the flipped kernels); the tiled im2col path
and the whole-plane path for small planes; the direct path for few channels
(stride phases, filter blocks cut by the channel count, 7x7 kernels, its
bounds, and strided windows within its wider AVX-512 bounds, FusedConv's
epilogue, its filter blocks prepared at plan time); the register-blocked path for small planes with many channels
(blocks cut by the plane and the filter count, the plane's last positions
by dot products, passes over the steps, groups, batches, non-finite
values, FusedConv's epilogue); ConvTranspose and ConvGrad split
by runs of channels that do not divide evenly. References are the op specs'
float64 ones; tolerances the ops' own dot-product bound (K products summing
to at most S), and NaN and infinities where the reference has them."""

from __future__ import annotations

import math

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
    return [y.numpy() for y in devkit.run_op(op, [devkit.asarray(x, dev) for x in inputs], attrs)]


def _check(got, ref, terms, largest, dtype=np.float32):
    comparison = testing.compare(got, ref, dot_tolerance(dtype, terms, largest))
    assert comparison.ok, comparison.message


def _conv_case(dev, x, w, b, attrs):
    full = {**CONV_DEFAULTS, **attrs}
    reference = ops.get("Conv").reference
    ref = reference([v.astype(np.float64) for v in (x, w, b) if v is not None], full)[0]
    sums = reference([magnitude(x), magnitude(w)], full)[0]
    got = _run(dev, "Conv", [v for v in (x, w, b) if v is not None], attrs)[0]
    _check(got, ref, w.shape[1] * math.prod(w.shape[2:]), float(sums.max()), x.dtype)


@pytest.mark.parametrize("x_shape, w_shape, attrs", [
    # more than 32 input channels per group: not the direct path
    ((1, 40, 17, 19), (8, 40, 3, 3), {"pads": [1, 0, 2, 1]}),  # odd plane, cut tiles, asymmetric pads
    ((2, 33, 16, 15), (9, 33, 3, 3), {}),
    ((1, 33, 5, 70), (8, 33, 3, 3), {"pads": [1, 1, 1, 1]}),  # one row of tiles
    ((1, 33, 70, 5), (8, 33, 3, 3), {"pads": [0, 1, 1, 2]}),
    ((1, 33, 4, 200), (8, 33, 3, 3), {}),
    ((2, 80, 18, 18), (24, 40, 3, 3), {"group": 2, "pads": [2, 2, 0, 1]}),
    ((1, 64, 56, 56), (64, 64, 3, 3), {"pads": [1, 1, 1, 1]}),  # several tile blocks
    ((1, 40, 15, 13), (96, 40, 3, 3), {"pads": [1, 0, 1, 2]}),  # one tile block: runs of filters share its patches
])
@pytest.mark.parametrize("bias", [False, True])
def test_winograd_3x3_matches_the_reference(dev, x_shape, w_shape, attrs, bias):
    rng = np.random.default_rng(0)
    x, w = testing.random(rng, x_shape, np.float32), testing.random(rng, w_shape, np.float32)
    b = testing.random(rng, (w_shape[0],), np.float32) if bias else None
    _conv_case(dev, x, w, b, attrs)


@pytest.mark.parametrize("x_shape, w_shape, attrs", [
    # strided: beyond the direct path's bounds with AVX-512 (588 and 594 channel-taps)
    ((1, 12, 60, 60), (16, 12, 7, 7), {"pads": [3, 3, 3, 3], "strides": [2, 2]}),  # many tiles
    ((1, 64, 5, 5), (64, 64, 3, 3), {"pads": [1, 1, 1, 1]}),  # small plane: computed whole
    ((1, 32, 9, 9), (48, 32, 1, 1), {}),  # pointwise, small plane
    ((3, 16, 40, 40), (20, 16, 1, 1), {}),  # pointwise tiles
    ((1, 16, 30, 30), (24, 16, 1, 1), {"strides": [2, 2]}),
    ((2, 66, 20, 20), (8, 66, 3, 3), {"pads": [1, 1, 1, 1], "strides": [2, 2]}),
])
def test_im2col_paths_with_bias_match_the_reference(dev, x_shape, w_shape, attrs):
    rng = np.random.default_rng(1)
    x, w = testing.random(rng, x_shape, np.float32), testing.random(rng, w_shape, np.float32)
    _conv_case(dev, x, w, testing.random(rng, (w_shape[0],), np.float32), attrs)


@pytest.mark.parametrize("value", [np.inf, -np.inf, np.nan])
def test_winograd_falls_back_on_non_finite_values(dev, value):
    """An infinity in a patch gives inf - inf = NaN across a Winograd tile;
    the direct sums keep it to the outputs whose windows hold it."""
    rng = np.random.default_rng(2)
    x = testing.random(rng, (1, 40, 20, 20), np.float32)
    w = testing.random(rng, (8, 40, 3, 3), np.float32)
    x[0, 3, 7, 9] = value
    _conv_case(dev, x, w, None, {"pads": [1, 1, 1, 1]})


@pytest.mark.parametrize("x_shape, w_shape, attrs", [
    ((2, 3, 32, 32), (16, 3, 3, 3), {"pads": [1, 1, 1, 1]}),
    ((1, 32, 8, 8), (30, 32, 3, 3), {"pads": [1, 1, 1, 1]}),  # 32 x 9 taps, the most; a cut filter block
    # the direct path where the CPU has AVX-512 too: 4 filters (5 or more go the broadcast way), or 8
    # or fewer on column stride 2
    ((1, 32, 8, 8), (4, 32, 3, 3), {"pads": [1, 1, 1, 1]}),
    ((2, 16, 16, 16), (8, 16, 3, 3), {"pads": [1, 1, 1, 1], "strides": [2, 2]}),
    ((1, 4, 64, 64), (5, 4, 3, 3), {"pads": [1, 1, 1, 1]}),  # the largest plane
    ((1, 4, 66, 66), (5, 4, 3, 3), {"pads": [1, 1, 1, 1]}),  # one larger: im2col
    ((2, 16, 16, 16), (32, 16, 3, 3), {"pads": [1, 1, 1, 1], "strides": [2, 2]}),
    ((1, 5, 17, 23), (7, 5, 3, 4), {"pads": [2, 0, 1, 3], "strides": [3, 2]}),  # 3 x 2 phases
    ((1, 3, 19, 21), (8, 3, 7, 7), {"pads": [3, 3, 3, 3], "strides": [2, 2]}),  # a 7x7 stem
    ((1, 4, 13, 14), (6, 4, 2, 2), {"strides": [3, 3]}),  # strides beyond the kernel
    ((2, 12, 9, 10), (9, 4, 3, 3), {"group": 3, "pads": [1, 1, 1, 1]}),
])
@pytest.mark.parametrize("special", [None, np.inf, np.nan])
def test_direct_path_matches_the_reference(dev, x_shape, w_shape, attrs, special):
    """Few channels on small planes: the direct sums over zero-padded
    phase planes, with bias; a non-finite input spreads to the outputs
    whose windows hold it (the padding's 0 * inf as in the im2col product)."""
    rng = np.random.default_rng(5)
    x, w = testing.random(rng, x_shape, np.float32), testing.random(rng, w_shape, np.float32)
    if special is not None:
        x[0, 1, 0, 2] = special
    _conv_case(dev, x, w, testing.random(rng, (w_shape[0],), np.float32), attrs)


@pytest.mark.parametrize("x_shape, w_shape, attrs", [
    ((1, 3, 224, 224), (64, 3, 7, 7), {"pads": [3, 3, 3, 3], "strides": [2, 2]}),  # ResNet's stem: 12544 outputs
    ((1, 64, 56, 56), (128, 64, 3, 3), {"pads": [1, 1, 1, 1], "strides": [2, 2]}),  # its 3x3/2 onto 28x28
    ((1, 3, 151, 133), (21, 3, 7, 7), {"pads": [3, 2, 1, 3], "strides": [2, 2]}),  # odd sizes, uneven pads: 76 x 67
    ((2, 40, 27, 25), (37, 40, 3, 3), {"pads": [1, 1, 1, 1], "strides": [2, 2]}),  # batch; 37 filters: a cut block
    ((1, 64, 21, 30), (128, 64, 3, 3), {"pads": [0, 1, 1, 0], "strides": [2, 3]}),  # 576 steps, 128 filters
    ((2, 36, 17, 17), (70, 18, 3, 3), {"group": 2, "pads": [1, 1, 1, 1], "strides": [2, 2]}),  # groups
    ((1, 5, 150, 150), (16, 5, 5, 5), {"pads": [2, 2, 2, 2], "strides": [2, 1]}),  # 75 x 150 outputs
])
@pytest.mark.parametrize("special", [None, "x-inf", "x-nan", "w-inf"])
def test_wide_direct_path_matches_the_reference(dev, x_shape, w_shape, attrs, special):
    """Strided windows beyond the direct path's bounds for unstrided ones
    (with AVX-512: up to 576 channel-taps, 128 filters, 16384 outputs per
    group; im2col + GEMM elsewhere): filter blocks of 8 cut by the filter
    count, blocks of 48 positions and the rest, with bias; non-finite
    values as in the im2col product."""
    rng = np.random.default_rng(8)
    x, w = testing.random(rng, x_shape, np.float32), testing.random(rng, w_shape, np.float32)
    if special == "x-inf":
        x[-1, 2, 0, 3] = np.inf
    elif special == "x-nan":
        x[0, 1, -1, -2] = np.nan
    elif special == "w-inf":
        w[5, 1, 0, 0] = -np.inf
    _conv_case(dev, x, w, testing.random(rng, (w_shape[0],), np.float32), attrs)


def _check_fused(rng, x, w, b, attrs, run):
    """Relu(Conv + Z) for a Z of the output's shape drawn from rng, as
    ``run(z)`` computes it, against the float64 reference: the Conv's
    tolerance over its sums, B and Z."""
    full = {**CONV_DEFAULTS, **attrs}
    reference = ops.get("Conv").reference
    conv = reference([v.astype(np.float64) for v in (x, w, b)], full)[0]
    z = testing.random(rng, conv.shape, np.float32)
    sums = reference([magnitude(x), magnitude(w)], full)[0] + np.abs(b).max() + np.abs(z).max()
    _check(run(z), np.maximum(conv + z, 0), w.shape[1] * math.prod(w.shape[2:]), float(sums.max()))


def _fused_by_kernel(dev, x, w, b, attrs):
    """run(z) for _check_fused: the FusedConv kernel with Relu."""
    return lambda z: _run(dev, "FusedConv", [x, w, b, z], {**attrs, "activation": "Relu"})[0]


@pytest.mark.parametrize("x_shape, w_shape, attrs", [
    ((2, 3, 61, 58), (20, 3, 7, 7), {"pads": [3, 3, 3, 3], "strides": [2, 2]}),  # the wide direct path
    ((1, 64, 28, 27), (72, 64, 3, 3), {"pads": [1, 1, 1, 1], "strides": [2, 2]}),
    ((1, 4, 20, 21), (6, 4, 3, 3), {"pads": [1, 1, 1, 1]}),  # the direct path's own bounds
])
def test_direct_path_applies_fused_conv_epilogue(dev, x_shape, w_shape, attrs):
    """FusedConv on the direct path: B, then Z and the Relu, as Relu(Conv + Z)."""
    rng = np.random.default_rng(9)
    x, w = testing.random(rng, x_shape, np.float32), testing.random(rng, w_shape, np.float32)
    b = testing.random(rng, (w_shape[0],), np.float32)
    _check_fused(rng, x, w, b, attrs, _fused_by_kernel(dev, x, w, b, attrs))


@pytest.mark.parametrize("x_shape, w_shape, attrs", [
    ((1, 256, 14, 14), (256, 256, 3, 3), {"pads": [1, 1, 1, 1]}),  # ResNet's 14x14 layer
    ((1, 512, 10, 10), (48, 512, 3, 3), {"pads": [1, 1, 1, 1]}),  # 18 passes; a last block of 4 positions
    ((1, 40, 11, 13), (37, 40, 3, 3), {"pads": [1, 1, 1, 1]}),  # odd plane; a filter block cut by 37
    ((1, 64, 12, 12), (33, 64, 3, 3), {"pads": [0, 1, 2, 0]}),  # asymmetric pads: 12 x 11 outputs
    ((2, 96, 10, 11), (64, 48, 3, 3), {"group": 2, "pads": [1, 1, 1, 1]}),  # batch and groups
    ((1, 16, 10, 10), (32, 16, 5, 5), {"pads": [2, 2, 2, 2]}),  # a 5x5 kernel
    ((1, 300, 9, 9), (32, 300, 1, 1), {"pads": [1, 1, 1, 1]}),  # 1x1 with padding: not pointwise
    ((1, 512, 7, 7), (40, 512, 3, 3), {"pads": [1, 1, 1, 1]}),  # ResNet's 7x7 plane: 1 position by dot products
    ((2, 37, 9, 9), (33, 37, 3, 3), {"pads": [1, 1, 1, 1]}),  # 81 = 5 * 16 + 1; passes of 167 steps (dot tails)
    ((1, 64, 5, 10), (38, 64, 3, 3), {"pads": [1, 1, 1, 1]}),  # 50 = 3 * 16 + 2
    ((1, 70, 17, 5), (32, 70, 3, 3), {"pads": [1, 1, 1, 1]}),  # 85 = 5 * 16 + 5: the 8-wide block
    ((2, 128, 7, 7), (64, 64, 3, 3), {"group": 2, "pads": [0, 1, 2, 1]}),  # 7 x 7 outputs, groups, batch
    ((1, 40, 15, 13), (35, 40, 3, 3), {"pads": [0, 0, 0, 0]}),  # 13 x 11 = 143 = 8 * 16 + 15
    ((1, 40, 13, 15), (35, 40, 3, 3), {}),  # 11 x 13 = 143 too, rows cut differently
    ((1, 36, 16, 17), (32, 36, 3, 3), {"pads": [0, 1, 1, 1]}),  # 15 x 17 = 255 = 15 * 16 + 15
    ((1, 36, 15, 17), (32, 36, 3, 3), {}),  # 13 x 15 = 195 = 12 * 16 + 3: dot 2 + 1
    # strided (this path where the CPU has AVX-512; im2col + GEMM elsewhere)
    ((1, 128, 28, 28), (48, 128, 3, 3), {"strides": [2, 2], "pads": [1, 1, 1, 1]}),  # ResNet's, onto 14x14
    ((1, 256, 14, 14), (40, 256, 3, 3), {"strides": [2, 2], "pads": [1, 1, 1, 1]}),  # onto 7x7: dot products
    ((1, 40, 23, 21), (33, 40, 3, 3), {"strides": [2, 2], "pads": [1, 0, 0, 1]}),  # odd planes: 11 x 10
    ((1, 36, 20, 13), (32, 36, 3, 3), {"strides": [2, 1], "pads": [1, 1, 1, 1]}),  # 10 x 13
    ((1, 40, 30, 25), (32, 40, 3, 3), {"strides": [3, 3], "pads": [1, 1, 1, 1]}),  # stride 3: 10 x 9
    ((1, 16, 24, 24), (32, 16, 5, 5), {"strides": [2, 2], "pads": [2, 2, 2, 2]}),  # 5x5: 12 x 12
    ((1, 8, 30, 30), (32, 8, 7, 7), {"strides": [2, 2], "pads": [3, 3, 3, 3]}),  # 7x7: 15 x 15
    ((2, 96, 19, 19), (64, 48, 3, 3), {"group": 2, "strides": [2, 2], "pads": [1, 1, 1, 1]}),  # 10 x 10
])
@pytest.mark.parametrize("special", [None, "x-inf", "x-nan", "x-last-nan", "w-inf"])
def test_register_blocked_path_matches_the_reference(dev, x_shape, w_shape, attrs, special):
    """Small planes with many channels (49 to 256 outputs, at least 256
    channel-taps and 32 filters per group), on x86-64 with AVX2 and FMA
    (strided ones with AVX-512): the register
    blocks over panels of the shift planes, and the plane's last 1 to 4
    positions by dot products (steps not a multiple of 8 in their tails),
    with bias; a non-finite input reaches the
    outputs whose windows hold it, and an infinite weight meets the padding's
    zeros as NaN, as in the im2col product."""
    rng = np.random.default_rng(6)
    x, w = testing.random(rng, x_shape, np.float32), testing.random(rng, w_shape, np.float32)
    if special == "x-inf":
        x[-1, 2, 0, 3] = np.inf
    elif special == "x-nan":
        x[0, 5, 4, 4] = np.nan
    elif special == "x-last-nan":  # under the plane's last outputs (the dot products')
        x[0, 3, -1, -1] = np.nan
    elif special == "w-inf":
        w[7, 1, 0, 0] = -np.inf
    _conv_case(dev, x, w, testing.random(rng, (w_shape[0],), np.float32), attrs)


@pytest.mark.parametrize("x_shape, w_shape, attrs", [
    ((1, 12, 9, 9), (12, 7, 3, 3), {"strides": [2, 2], "pads": [1, 1, 1, 1], "output_padding": [1, 1]}),
    ((2, 6, 5, 7), (6, 5, 3, 2), {"group": 2, "strides": [2, 1]}),
    ((1, 10, 8, 8), (10, 13, 1, 1), {}),  # pointwise
])
def test_conv_transpose_channel_runs_match_the_reference(dev, x_shape, w_shape, attrs):
    rng = np.random.default_rng(3)
    x, w = testing.random(rng, x_shape, np.float32), testing.random(rng, w_shape, np.float32)
    group = attrs.get("group", 1)
    b = testing.random(rng, (w_shape[1] * group,), np.float32)
    full = {**CONV_DEFAULTS, **attrs}
    reference = ops.get("ConvTranspose").reference
    ref = reference([x.astype(np.float64), w.astype(np.float64), b.astype(np.float64)], full)[0]
    sums = reference([magnitude(x), magnitude(w)], full)[0]
    got = _run(dev, "ConvTranspose", [x, w, b], attrs)[0]
    _check(got, ref, w_shape[0] // group * math.prod(w_shape[2:]), float(sums.max()))


@pytest.mark.parametrize("x_shape, w_shape, attrs", [
    ((3, 13, 10, 9), (6, 13, 3, 3), {"pads": [1, 1, 1, 1]}),  # 13 channels in uneven runs
    ((2, 10, 8, 8), (8, 5, 3, 2), {"group": 2, "strides": [2, 1]}),
    ((1, 7, 12, 12), (4, 7, 1, 1), {}),
    ((2, 16, 17, 15), (12, 16, 3, 3), {"pads": [1, 0, 2, 1]}),  # dX by Winograd
    ((1, 16, 20, 20), (8, 16, 3, 3), {"pads": [3, 1, 0, 1]}),  # a begin pad beyond 2: dX by col2im
    ((1, 16, 20, 20), (8, 16, 3, 3), {"pads": [1, 1, 1, 1], "dy_special": np.inf}),  # Winograd falls back
])
def test_conv_grad_channel_runs_match_the_reference(dev, x_shape, w_shape, attrs):
    rng = np.random.default_rng(4)
    attrs = dict(attrs)
    special = attrs.pop("dy_special", None)
    x, w = testing.random(rng, x_shape, np.float32), testing.random(rng, w_shape, np.float32)
    full = {**CONV_DEFAULTS, **attrs}
    (y_shape, _), = ops.get("Conv").infer([ops.spec.TensorInfo(x.shape, x.dtype),
                                           ops.spec.TensorInfo(w.shape, w.dtype), None], full)
    dy = testing.random(rng, y_shape, np.float32)
    if special is not None:
        dy[0, 2, 5, 6] = special
    reference = ops.get("ConvGrad").reference
    refs = reference([dy.astype(np.float64), x.astype(np.float64), w.astype(np.float64)], full)
    bounds = reference([magnitude(dy), magnitude(x), magnitude(w)], full)
    got = _run(dev, "ConvGrad", [dy, x, w], attrs)
    terms = [w_shape[0] // full["group"] * math.prod(w_shape[2:]), y_shape[0] * math.prod(y_shape[2:])]
    for out, ref, bound, k in zip(got, refs, bounds, terms + terms[1:]):
        _check(out, ref, k, float(bound.max()))


@pytest.mark.parametrize("size, channels, filters, stride", [
    (12, 64, 40, 1),   # 144 positions: whole blocks
    (7, 300, 37, 1),   # 49: the last position by dot products; 37 filters cut the last block
    (10, 64, 32, 1),   # 100: the last 4 by dot products
    (14, 256, 36, 2),  # stride 2 onto 7x7 (with AVX-512)
])
def test_register_blocked_path_applies_fused_conv_epilogue(dev, size, channels, filters, stride):
    """FusedConv on a plane the register blocks take: B, Z and the Relu on
    each block of outputs, as Relu(Conv + Z)."""
    rng = np.random.default_rng(7)
    x = testing.random(rng, (1, channels, size, size), np.float32)
    w = testing.random(rng, (filters, channels, 3, 3), np.float32)
    b = testing.random(rng, (filters,), np.float32)
    attrs = {"pads": [1, 1, 1, 1], "strides": [stride, stride]}
    _check_fused(rng, x, w, b, attrs, _fused_by_kernel(dev, x, w, b, attrs))


def _conv_node_model(w, b, attrs, x_shape, residual_shape=None):
    """A Conv of the model's x by constant W (and B); with residual_shape,
    Relu(Conv + z) of a second input z, which the plan fuses into FusedConv."""
    from onnx import TensorProto, helper, numpy_helper

    inputs = ["x", "w"] + (["b"] if b is not None else [])
    inits = [numpy_helper.from_array(w, "w")] + ([numpy_helper.from_array(b, "b")] if b is not None else [])
    graph_inputs = [helper.make_tensor_value_info("x", TensorProto.FLOAT, list(x_shape))]
    nodes = [helper.make_node("Conv", inputs, ["y" if residual_shape is None else "c"], **attrs)]
    if residual_shape is not None:
        graph_inputs.append(helper.make_tensor_value_info("z", TensorProto.FLOAT, list(residual_shape)))
        nodes += [helper.make_node("Add", ["c", "z"], ["s"]), helper.make_node("Relu", ["s"], ["y"])]
    graph = helper.make_graph(nodes, "conv", graph_inputs, [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
                              inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 19)])


def _operands_with(seed, x_shape, w_shape, special):
    """Random float32 X, W and B, with X's [0, 1, 2, 3] inf ("x-inf") or W's [5, 0, 0, 0] NaN ("w-nan")."""
    rng = np.random.default_rng(seed)
    x, w = testing.random(rng, x_shape, np.float32), testing.random(rng, w_shape, np.float32)
    if special == "x-inf":
        x[0, 1, 2, 3] = np.inf
    elif special == "w-nan":
        w[5, 0, 0, 0] = np.nan
    return x, w, testing.random(rng, (w_shape[0],), np.float32)


def _prepared_and_given_of(x, w, b, attrs):
    """A one-Conv model's outputs with W prepared at plan time and as given,
    each checked against the float64 reference with the op's dot-product
    tolerance (NaN and infinities where the reference has them)."""
    import devkit.onnx as donnx

    model = _conv_node_model(w, b, attrs, x.shape)
    full = {**CONV_DEFAULTS, **attrs}
    reference = ops.get("Conv").reference
    ref = reference([v.astype(np.float64) for v in (x, w, b) if v is not None], full)[0]
    sums = reference([magnitude(x), magnitude(w)], full)[0]
    got = [donnx.prepare(model, prepare_weights=p).run({"x": x})[0] for p in (True, False)]
    for g in got:
        _check(g, ref, w.shape[1] * math.prod(w.shape[2:]), float(sums.max()))
    return got


def _prepared_and_given(seed, x_shape, w_shape, attrs, bias):
    """_prepared_and_given_of on random X, W and (with bias) B."""
    rng = np.random.default_rng(seed)
    x, w = testing.random(rng, x_shape, np.float32), testing.random(rng, w_shape, np.float32)
    b = testing.random(rng, (w_shape[0],), np.float32) if bias else None
    return _prepared_and_given_of(x, w, b, attrs)


@pytest.mark.parametrize("x_shape, w_shape, attrs", [
    ((1, 40, 7, 7), (48, 40, 3, 3), {"pads": [1, 1, 1, 1]}),    # 16 tiles: one whole panel
    ((2, 40, 9, 9), (24, 40, 3, 3), {"pads": [1, 1, 1, 1]}),    # 25 tiles: a panel and 9 lanes of the next
    ((1, 64, 14, 14), (70, 64, 3, 3), {"pads": [1, 1, 1, 1]}),  # 49 tiles; 70 filters cut a row block
    ((1, 80, 8, 8), (48, 40, 3, 3), {"pads": [1, 0, 2, 1], "group": 2}),
])
@pytest.mark.parametrize("bias", [False, True])
def test_prepared_winograd_on_small_planes_matches_the_reference(x_shape, w_shape, attrs, bias):
    """With its filter transforms prepared, a 3x3 Conv on a plane of 16
    tiles or more goes by Winograd (with AVX-512), its 16 products on
    panels of 16 tiles; prepared or given, the result is within the op's
    dot-product tolerance of the float64 reference."""
    _prepared_and_given(11, x_shape, w_shape, attrs, bias)


@pytest.mark.parametrize("x_shape, w_shape, attrs", [
    ((2, 3, 32, 32), (16, 3, 3, 3), {"pads": [1, 1, 1, 1]}),  # the zoo resnet's stem
    ((2, 16, 16, 16), (32, 16, 3, 3), {"pads": [1, 1, 1, 1], "strides": [2, 2]}),  # 4 phases
    ((2, 32, 8, 8), (30, 32, 3, 3), {"pads": [1, 1, 1, 1]}),  # 30 filters: a cut filter block
    ((2, 12, 9, 10), (9, 4, 3, 3), {"group": 3, "pads": [0, 1, 2, 1]}),  # groups, asymmetric pads
    ((1, 3, 40, 37), (20, 3, 7, 7), {"pads": [3, 3, 3, 3], "strides": [2, 2]}),  # the wide direct path
])
@pytest.mark.parametrize("bias", [False, True])
def test_prepared_direct_filters_match_the_reference(x_shape, w_shape, attrs, bias):
    """With its filter blocks packed at plan time, the direct path gives what
    it gives with W packed at the call: both within the op's dot-product
    tolerance of the float64 reference, and equal bit for bit (the same sums
    in the same order)."""
    prepared, given = _prepared_and_given(12, x_shape, w_shape, attrs, bias)
    np.testing.assert_array_equal(prepared, given)


@pytest.mark.parametrize("x_shape, w_shape, attrs", [
    ((1, 20, 23, 19), (13, 20, 5, 5), {"pads": [2, 2, 2, 2]}),  # 13 filters: a row block of 8 and one of 5
    ((2, 12, 17, 18), (9, 12, 3, 3), {"strides": [2, 1], "dilations": [1, 2], "pads": [1, 1, 0, 0]}),
    ((4, 80, 11, 13), (30, 80, 2, 2), {}),  # 120 positions: 3 column pairs and a cut one
    ((2, 36, 6, 6), (39, 12, 3, 3), {"group": 3, "pads": [1, 1, 1, 1], "dilations": [2, 2]}),
])
@pytest.mark.parametrize("dtype", [np.float32, np.float16, np.float64])
def test_im2col_tiles_by_the_packed_block_match_the_reference(dev, x_shape, w_shape, attrs, dtype):
    """Windows no other path takes: im2col tiles multiplied by the AVX-512
    packed block in place (float32, and float16 run as float32; float64 by
    the BLAS), blocks cut by the filter and position counts."""
    rng = np.random.default_rng(12)
    x, w = testing.random(rng, x_shape, dtype), testing.random(rng, w_shape, dtype)
    _conv_case(dev, x, w, testing.random(rng, (w_shape[0],), dtype), attrs)


@pytest.mark.parametrize("x_shape, w_shape, attrs", [
    ((1, 3, 40, 36), (64, 3, 7, 7), {"pads": [3, 3, 3, 3], "strides": [2, 2]}),  # a stem: W small, im2col tiles
    ((2, 40, 31, 29), (70, 40, 3, 3), {"pads": [1, 1, 1, 1], "strides": [2, 2]}),  # 240 positions: a cut tile
    ((1, 64, 7, 7), (72, 64, 3, 3), {"pads": [1, 1, 1, 1]}),  # a small plane: 576 steps, 3 passes, cut
    ((1, 300, 5, 6), (64, 300, 1, 2), {"strides": [1, 2], "pads": [0, 1, 0, 0]}),  # 1x2 taps, 600 steps
    ((1, 160, 9, 9), (128, 80, 3, 3), {"group": 2, "pads": [0, 1, 1, 0], "strides": [2, 2]}),
    ((1, 64, 28, 28), (128, 64, 1, 1), {"strides": [2, 2]}),  # ResNet's 1x1/2 projections: im2col tiles
    ((2, 300, 15, 15), (70, 300, 1, 1), {"strides": [2, 3]}),  # 300 steps, a cut filter block
])
@pytest.mark.parametrize("special", [None, "x-inf", "w-nan"])
def test_blocked_path_matches_the_reference(dev, x_shape, w_shape, attrs, special):
    """Many filters on strided windows or small planes, by the packed block:
    with a large W whole-plane columns, items of position tiles and runs
    of filters, passes over the steps adding into the outputs (with a small
    one im2col tiles); bias; non-finite values as in the im2col product."""
    _conv_case(dev, *_operands_with(13, x_shape, w_shape, special), attrs)


def test_blocked_path_applies_fused_conv_epilogue(dev):
    """FusedConv through the blocked path: B, Z and the Relu per item's
    tile and run of filters, as Relu(Conv + Z)."""
    rng = np.random.default_rng(14)
    x = testing.random(rng, (2, 32, 30, 30), np.float32)
    w = testing.random(rng, (80, 32, 3, 3), np.float32)
    b = testing.random(rng, (80,), np.float32)
    attrs = {"pads": [1, 1, 1, 1], "strides": [2, 2]}
    _check_fused(rng, x, w, b, attrs, _fused_by_kernel(dev, x, w, b, attrs))


INDIRECT_CASES = [
    ((1, 3, 40, 36), (64, 3, 7, 7), {"pads": [3, 3, 3, 3], "strides": [2, 2]}),  # a stem: 147 steps, one pass
    ((2, 40, 31, 29), (70, 40, 3, 3), {"pads": [1, 0, 2, 1], "strides": [2, 2]}),  # 360 steps: a cut pass; 70 filters
    ((1, 64, 7, 7), (96, 64, 3, 3), {"pads": [1, 1, 1, 1]}),  # a small plane: 49 positions, rows of 7
    ((1, 32, 8, 8), (64, 32, 3, 3), {"pads": [1, 1, 1, 1]}),  # 64 positions: the largest unit-stride plane
    ((1, 160, 9, 9), (128, 80, 3, 3), {"group": 2, "pads": [0, 1, 1, 0], "strides": [2, 2]}),  # groups
    ((1, 24, 17, 18), (64, 24, 3, 3), {"strides": [2, 1], "dilations": [1, 2], "pads": [1, 1, 0, 0]}),
    ((1, 8, 33, 35), (65, 8, 3, 3), {"strides": [3, 3]}),  # 72 steps, stride 3, no padding; 65 filters: one lane
    ((3, 16, 30, 30), (64, 16, 5, 5), {"pads": [2, 2, 2, 2], "strides": [2, 2]}),  # 225 positions a batch item
]


@pytest.mark.parametrize("x_shape, w_shape, attrs", INDIRECT_CASES)
@pytest.mark.parametrize("special", [None, "x-inf", "w-nan"])
def test_indirect_path_matches_the_reference(x_shape, w_shape, attrs, special):
    """With its filter panels prepared, a Conv with many filters on a
    strided window or a small plane goes by the indirect product (with
    AVX-512): output positions in even blocks of rows of the packed block,
    filters in runs of two panels (the last cut), the steps in passes,
    tiles of positions split for the threads, over batches and groups;
    bias; a non-finite value reaches the outputs whose windows hold it, the
    padding's 0 * inf as in the im2col product."""
    _prepared_and_given_of(*_operands_with(15, x_shape, w_shape, special), attrs)


@pytest.mark.parametrize("x_shape, w_shape, attrs", [
    ((1, 3, 40, 36), (64, 3, 7, 7), {"pads": [3, 3, 3, 3], "strides": [2, 2]}),  # given: im2col tiles, one pass
    ((1, 128, 15, 15), (256, 128, 3, 3), {"pads": [1, 1, 1, 1], "strides": [2, 2]}),  # given: blocked, 4.5 passes
    ((2, 128, 7, 7), (128, 128, 3, 3), {"pads": [1, 1, 1, 1]}),  # given: blocked (a small plane)
])
def test_indirect_path_equals_the_blocked_path_bit_for_bit(x_shape, w_shape, attrs):
    """Prepared, the indirect path sums each output in the order and passes
    of the packed-block paths the W as given takes (LINALG_CONV_PASS steps a
    pass): the two results are equal bit for bit."""
    rng = np.random.default_rng(16)
    x, w = testing.random(rng, x_shape, np.float32), testing.random(rng, w_shape, np.float32)
    prepared, given = _prepared_and_given_of(x, w, testing.random(rng, (w_shape[0],), np.float32), attrs)
    np.testing.assert_array_equal(prepared, given)


@pytest.mark.parametrize("x_shape, w_shape, stride", [
    ((2, 64, 14, 14), (72, 64, 3, 3), 2),  # onto 7x7
    ((1, 32, 12, 12), (64, 32, 3, 3), 1),  # a small plane
])
def test_indirect_path_applies_fused_conv_epilogue(x_shape, w_shape, stride):
    """Conv -> Add -> Relu, fused into FusedConv by the plan, on prepared
    filter panels: B, Z and the Relu on each tile's rows of Y, as Relu(Conv + Z)."""
    import devkit.onnx as donnx

    rng = np.random.default_rng(17)
    x, w = testing.random(rng, x_shape, np.float32), testing.random(rng, w_shape, np.float32)
    b = testing.random(rng, (w_shape[0],), np.float32)
    attrs = {"pads": [1, 1, 1, 1], "strides": [stride, stride]}

    def run(z):
        prepared = donnx.prepare(_conv_node_model(w, b, attrs, x_shape, z.shape))
        (got,) = prepared.run({"x": x, "z": z})
        assert [c.op for plan in prepared.plans.values() for c in plan.calls] == ["FusedConv"]
        return got

    _check_fused(rng, x, w, b, attrs, run)


def test_indirect_form_is_refused_on_a_window_that_path_does_not_take():
    """Through the raw ABI: W's prepared form for the indirect path (filter
    panels, without W) marked prepared on a call whose window goes another
    way (unit strides on a 16x16 plane) is DK_INVALID_ARGUMENT, naming the
    path, not a read of the W the form does not hold."""
    from conformance.robustness_worker import Attribute, Context, KernelCall, Tensor, _entry, run_kernel
    from devkit.abi import C, ffi
    from devkit.engine import calls

    ctx = Context(devkit.load_plugin("cpu"))
    entry = _entry(ctx, "Conv", "float32")
    prepare = calls.prepare_fn(entry)
    rng = np.random.default_rng(18)
    x = testing.random(rng, (1, 8, 16, 16), np.float32)
    w = testing.random(rng, (64, 8, 3, 3), np.float32)

    def conv(stride, w_tensor):
        out = (1, 64, (16 - 1) // stride + 1, (16 - 1) // stride + 1)
        attrs = {"auto_pad": ("string", "NOTSET"), "group": ("int", 1), "dilations": ("ints", [1, 1]),
                 "strides": ("ints", [stride, stride]), "pads": ("ints", [1, 1, 1, 1])}
        return KernelCall([Tensor(x), w_tensor], [Tensor(np.zeros(out, np.float32))],
                          [Attribute(name, kind, value) for name, (kind, value) in attrs.items()])

    forms = []

    def prepare_w(raw, keep):  # W's prepared form for the strided call, copied to the host
        size = ffi.new("size_t *")
        assert prepare(raw, 1, ffi.NULL, 0, size) == C.DK_OK
        mem = ctx.alloc(size[0])
        assert prepare(raw, 1, mem, 0, size) == C.DK_OK
        assert ctx.raw("stream_synchronize", 0, raw.stream) == C.DK_OK
        form = np.zeros(size[0] // 4, np.float32)
        assert ctx.raw("copy_d2h", 0, ffi.from_buffer(form), mem, 0, form.nbytes, ffi.NULL) == C.DK_OK
        ctx.free(mem)
        forms.append(form)

    assert run_kernel(ctx, entry, conv(2, Tensor(w)), prepare_w) == [[C.DK_OK, C.DK_OK]]
    (form,) = forms
    assert form.size == 16 + w.size  # a 64-byte header and the panels (64 filters: no lanes past them): no W
    # an allocation as large as any form the other paths prepare: the library's size check passes
    padded = np.concatenate([form, np.zeros(4 * w.size, np.float32)])
    statuses = run_kernel(ctx, entry, conv(1, Tensor(padded, shape=w.shape)),
                          lambda raw, keep: setattr(raw, "prepared_inputs", 1 << 1))
    assert C.DK_INVALID_ARGUMENT in statuses[0]
    assert "prepared for the indirect Conv path" in ctx.plugin.last_error_message()
