"""Normalization, attention and other neural-network ops: BatchNormalization
(inference and training mode), LayerNormalization, RMSNormalization,
GroupNormalization, InstanceNormalization, LRN, Attention, RotaryEmbedding and
Trilu.

Every op but Trilu takes the four float dtypes. float16 and bfloat16 are
storage types: kernels compute in float32 or better and round once on store.
Statistics (means, variances, mean squares) are accumulated in float64, so
``stash_type=1`` (float32 statistics, the only value ONNX's reference
implements) is met or exceeded for every dtype; the Mean and InvStdDev outputs
of LayerNormalization are float32 as ONNX's type inference makes them.
Trilu moves elements and takes every dtype, exactly.
"""

from __future__ import annotations

import math

import numpy as np

from . import testing as t
from .spec import (ALL, ALL_FLOAT, BOOL, F32, F64, I64, REQUIRED, Attr, Case, Input, OpSpec, TensorInfo,
                   Tolerance, dtype_name, normalize_axis, register, require_same_dtype)

# ONNX's float attributes are float32: its default epsilon is 1e-5 rounded so.
_EPS_DEFAULT = float(np.float32(1e-5))


def _non_negative(value) -> str | None:
    return None if math.isfinite(value) and value >= 0 else f"must be finite and >= 0, got {value}"


def _positive(value) -> str | None:
    return None if value >= 1 else f"must be >= 1, got {value}"


def _stash_type_check(value) -> str | None:
    if value != 1:
        return (f"{value} is not supported: only 1 (statistics in float32 or better), as in ONNX's "
                f"reference implementation")
    return None


_EPSILON = Attr("epsilon", "float", _EPS_DEFAULT, check=_non_negative,
                doc="added to the variance (mean square) before the square root")
_STASH_TYPE = Attr("stash_type", "int", 1, check=_stash_type_check,
                   doc="precision of the statistics: 1 (float32; devkit accumulates in float64)")


def _require_float(info: TensorInfo, name: str) -> None:
    if info.dtype not in ALL_FLOAT:
        raise TypeError(f"input '{name}' must be a float tensor, got {dtype_name(info.dtype)}")


def _require_shape(info: TensorInfo, shape: tuple[int, ...], name: str, what: str) -> None:
    if tuple(info.shape) != tuple(shape):
        raise ValueError(f"input '{name}' has shape {tuple(info.shape)}; expected {tuple(shape)} ({what})")


def _unidirectional(info: TensorInfo, target: tuple[int, ...], name: str) -> None:
    """ONNX unidirectional broadcasting: ``info`` broadcasts to ``target``."""
    shape = tuple(info.shape)
    if len(shape) > len(target) or any(s not in (1, n) for s, n in zip(reversed(shape), reversed(target))):
        raise ValueError(f"input '{name}' of shape {shape} does not broadcast to X's shape {tuple(target)}")


def _channel_view(param: np.ndarray, ndim: int) -> np.ndarray:
    """A per-channel (C,) parameter shaped to broadcast against (N, C, ...)."""
    return param.reshape((-1,) + (1,) * (ndim - 2)) if ndim >= 2 else param


def _moments(x: np.ndarray, axes: tuple[int, ...]) -> tuple[np.ndarray, np.ndarray]:
    """Mean and (population) variance over ``axes``, keepdims; NaN over no elements."""
    count = math.prod(x.shape[a] for a in axes)
    with np.errstate(invalid="ignore", divide="ignore"):
        mean = np.sum(x, axis=axes, keepdims=True) / count
        var = np.sum(np.square(x - mean), axis=axes, keepdims=True) / count
    return mean, var


def _with_specials(x: np.ndarray, dtype) -> np.ndarray:
    """``x`` with NaN, +inf, -inf and -0 planted along its flattened start."""
    x = x.copy()
    flat = x.reshape(-1)
    flat[:4] = np.array([np.nan, np.inf, -np.inf, -0.0]).astype(dtype)
    return x


# The cpu plugin (float64 statistics) is correctly rounded for float32 and
# bfloat16 on these cases and within 1 ulp for float16. The bounds are what
# an implementation computing in float32 with pairwise sums reaches (measured
# on these cases: at most 0.7 of the float32 bound and 0.4 of the float16 and
# bfloat16 ones) with a margin, stash_type=1 allowing float32 statistics.
# float64 needs compensated or pairwise statistics.
_NORM_TOLERANCE = {
    "float32": Tolerance(rtol=2e-6, atol=2e-6),
    "float64": Tolerance(rtol=2e-14, atol=2e-14),
    "float16": Tolerance(rtol=2e-3, atol=2e-3),
    "bfloat16": Tolerance(rtol=1.6e-2, atol=1.6e-2),
}


# -- BatchNormalization ----------------------------------------------------------------


def _batchnorm_infer(inputs, attrs):
    x, scale, bias, mean, var = inputs
    if x.ndim < 1:
        raise ValueError("input 'X' must have rank >= 1 (N, C, D1, ...)")
    channels = x.shape[1] if x.ndim >= 2 else 1
    for info, name in ((scale, "scale"), (bias, "B"), (mean, "input_mean"), (var, "input_var")):
        _require_float(info, name)
        _require_shape(info, (channels,), name, "one value per channel")
    require_same_dtype([scale, bias], ["scale", "B"])
    require_same_dtype([mean, var], ["input_mean", "input_var"])
    return [(x.shape, x.dtype), (mean.shape, mean.dtype), (var.shape, var.dtype)]


def _batchnorm_reference(inputs, attrs):
    x, scale, bias, mean, var = inputs
    v = lambda p: _channel_view(p, x.ndim)  # noqa: E731
    running_mean, running_var = mean, var
    if attrs["training_mode"]:
        axes = (0,) + tuple(range(2, x.ndim))
        batch_mean, batch_var = (m.reshape(-1) for m in _moments(x, axes))
        momentum = attrs["momentum"]
        running_mean = mean * momentum + batch_mean * (1 - momentum)
        running_var = var * momentum + batch_var * (1 - momentum)
        mean, var = batch_mean, batch_var
    y = v(scale) * (x - v(mean)) / np.sqrt(v(var) + attrs["epsilon"]) + v(bias)
    return [y, running_mean, running_var]


def _batchnorm_cases(dtype, rng):
    r = lambda *shape: t.random(rng, shape, dtype)  # noqa: E731

    def params(c, dtype=dtype):
        return [t.random(rng, (c,), dtype), t.random(rng, (c,), dtype),
                t.random(rng, (c,), dtype), t.random(rng, (c,), dtype, 0.1, 3.0)]

    other = F64 if dtype == F32 else F32
    zero_var = params(3)
    zero_var[3][1] = 0
    return [
        Case("nchw", [r(2, 3, 4, 5), *params(3)]),
        Case("epsilon", [r(2, 3, 4, 5), *params(3)], {"epsilon": 0.01}),
        Case("zero_variance", [r(2, 3, 7), *zero_var], {"epsilon": 0.5}),
        Case("nc_only", [r(5, 7), *params(7)]),
        Case("1d_one_channel", [r(9), *params(1)]),
        Case("5d", [r(2, 3, 2, 3, 5), *params(3)]),
        Case("params_in_other_dtype", [r(2, 3, 5), *params(3, other)]),
        Case("training_mode_0", [r(2, 4, 3), *params(4)], {"training_mode": 0, "momentum": 0.5}),
        Case("empty", [r(0, 3, 4), *params(3)]),
        Case("large", [r(2, 67, 1031), *params(67)]),
        Case("special", [_with_specials(r(2, 3, 5), dtype), *params(3)]),
        Case("training", [r(2, 3, 4, 5), *params(3)], {"training_mode": 1}),
        Case("training_momentum", [r(4, 3, 5), *params(3)], {"training_mode": 1, "momentum": 0.25}),
        Case("training_epsilon", [r(3, 2, 3, 3), *params(2)], {"training_mode": 1, "epsilon": 0.1}),
        Case("training_nc_only", [r(6, 5), *params(5)], {"training_mode": 1}),
        Case("training_1d", [r(9), *params(1)], {"training_mode": 1}),
        Case("training_one_per_channel", [r(1, 3, 1), *params(3)], {"training_mode": 1}),
        Case("training_params_in_other_dtype", [r(2, 3, 5), *params(3, other)], {"training_mode": 1}),
        Case("training_empty", [r(0, 3, 4), *params(3)], {"training_mode": 1}),
        Case("training_large", [r(16, 67, 129), *params(67)], {"training_mode": 1}),
        Case("training_special", [_with_specials(r(2, 3, 5), dtype), *params(3)], {"training_mode": 1}),
    ]


register(OpSpec(
    name="BatchNormalization", category="nn", opset=15,
    inputs=(Input("X", doc="(N, C, D1, ...), or (N) with one channel"),
            Input("scale", doc="(C)"), Input("B", doc="(C)"),
            Input("input_mean", doc="(C), the estimated mean"),
            Input("input_var", doc="(C), the estimated variance")),
    outputs=("Y", "running_mean", "running_var"), optional_outputs=2,
    attrs=(_EPSILON,
           Attr("momentum", "float", float(np.float32(0.9)),
                doc="training mode: the weight of the running statistics in their update"),
           Attr("training_mode", "int", 0, choices=(0, 1),
                doc="1: normalize with the batch statistics and update the running ones")),
    dtypes=ALL_FLOAT,
    infer=_batchnorm_infer,
    reference=_batchnorm_reference,
    cases=_batchnorm_cases,
    tolerance=_NORM_TOLERANCE,
    doc="Y = (X - mean) / sqrt(var + epsilon) * scale + B per channel. Inference (training_mode 0): mean and "
        "var are input_mean and input_var, and running_mean and running_var return them unchanged. Training "
        "mode: mean and var are the batch's (over N and the spatial dims; var the population variance, as "
        "ONNX's reference), and running_mean = input_mean * momentum + mean * (1 - momentum), likewise "
        "running_var; an empty batch gives NaN statistics. scale and B share a float dtype, input_mean and "
        "input_var share one (the running outputs take it); either may differ from X's.",
))


# -- LayerNormalization, RMSNormalization -----------------------------------------------


def _row_norm_infer(inputs, attrs, names):
    x = inputs[0]
    require_same_dtype(inputs, names)
    axis = normalize_axis(attrs["axis"], x.ndim)
    for info, name in zip(inputs[1:], names[1:]):
        if info is not None:
            _unidirectional(info, x.shape, name)
    return x, axis


def _layernorm_infer(inputs, attrs):
    x, axis = _row_norm_infer(inputs, attrs, ["X", "Scale", "B"])
    stats = tuple(x.shape[:axis]) + (1,) * (x.ndim - axis)
    return [(x.shape, x.dtype), (stats, F32), (stats, F32)]


def _layernorm_reference(inputs, attrs):
    x, scale, bias = (list(inputs) + [None])[:3]
    axes = tuple(range(normalize_axis(attrs["axis"], x.ndim), x.ndim))
    mean, var = _moments(x, axes)
    inv_std = 1.0 / np.sqrt(var + attrs["epsilon"])
    y = (x - mean) * inv_std * scale
    return [y if bias is None else y + bias, mean, inv_std]


def _rmsnorm_infer(inputs, attrs):
    x, _ = _row_norm_infer(inputs, attrs, ["X", "scale"])
    return [(x.shape, x.dtype)]


def _rmsnorm_reference(inputs, attrs):
    x, scale = inputs
    axes = tuple(range(normalize_axis(attrs["axis"], x.ndim), x.ndim))
    count = math.prod(x.shape[a] for a in axes)
    with np.errstate(invalid="ignore", divide="ignore"):
        mean_square = np.sum(np.square(x), axis=axes, keepdims=True) / count
    return [x / np.sqrt(mean_square + attrs["epsilon"]) * scale]


def _row_norm_cases(dtype, rng, with_bias: bool):
    r = lambda *shape: t.random(rng, shape, dtype)  # noqa: E731

    def case(name, x, axis, scale_shape, bias_shape=None, **attrs):
        inputs = [x, r(*scale_shape)]
        if with_bias and bias_shape is not None:
            inputs.append(r(*bias_shape))
        return Case(name, inputs, {"axis": axis, **attrs})

    constant_rows = r(3, 9)
    constant_rows[1] = constant_rows[1, 0]
    return [
        case("last_axis", r(4, 67), -1, (67,), (67,)),
        case("axis_minus2", r(3, 5, 7), -2, (5, 7), (7,)),
        case("axis1_4d", r(2, 3, 4, 5), 1, (3, 4, 5), (3, 1, 5)),
        case("axis0_full_shape_params", r(2, 3, 5), 0, (2, 3, 5), (2, 3, 5)),
        case("params_vary_over_rows", r(4, 6), 1, (4, 6), (4, 1)),
        case("no_bias", r(3, 17), -1, (17,)),
        case("scalar_params", r(5, 3), -1, (), ()),
        case("epsilon", r(3, 9), -1, (9,), (9,), epsilon=0.25),
        case("constant_rows", constant_rows, -1, (9,), (9,), epsilon=1e-3),
        case("stash_type", r(2, 11), 1, (11,), (11,), stash_type=1),
        case("one_element_rows", r(6, 1), -1, (1,), (1,)),
        case("empty_rows", r(0, 5), -1, (5,), (5,)),
        case("empty_normalized", r(3, 0), -1, (0,), (0,)),
        case("large", r(2, 1031, 67), -1, (67,), (67,)),
        case("large_rows", r(3, 40000), -1, (40000,), (40000,)),
        case("special", _with_specials(r(3, 7), dtype), -1, (7,), (7,)),
    ]


register(OpSpec(
    name="LayerNormalization", category="nn", opset=17,
    inputs=(Input("X"), Input("Scale"), Input("B", optional=True)),
    outputs=("Y", "Mean", "InvStdDev"), optional_outputs=2,
    attrs=(Attr("axis", "int", -1, doc="the first normalized dim; negative counts from the back"),
           _EPSILON, _STASH_TYPE),
    dtypes=ALL_FLOAT,
    infer=_layernorm_infer,
    reference=_layernorm_reference,
    cases=lambda dtype, rng: _row_norm_cases(dtype, rng, with_bias=True),
    tolerance=_NORM_TOLERANCE,
    doc="Normalizes X over dims [axis, rank): Y = (X - Mean) * InvStdDev * Scale + B, with "
        "InvStdDev = 1 / sqrt(variance + epsilon) (population variance). Scale and B broadcast "
        "unidirectionally to X. Mean and InvStdDev have X's shape with the normalized dims set to 1 "
        "and are float32 (stash_type 1), whatever X's dtype; over zero elements they are NaN.",
))

register(OpSpec(
    name="RMSNormalization", category="nn", opset=23,
    inputs=(Input("X"), Input("scale")),
    outputs=("Y",),
    attrs=(Attr("axis", "int", -1, doc="the first normalized dim; negative counts from the back"),
           _EPSILON, _STASH_TYPE),
    dtypes=ALL_FLOAT,
    infer=_rmsnorm_infer,
    reference=_rmsnorm_reference,
    cases=lambda dtype, rng: _row_norm_cases(dtype, rng, with_bias=False),
    tolerance=_NORM_TOLERANCE,
    doc="Y = X / sqrt(mean(X^2 over dims [axis, rank)) + epsilon) * scale; scale broadcasts "
        "unidirectionally to X and has X's dtype.",
))


# -- GroupNormalization, InstanceNormalization ------------------------------------------


def _channel_norm_infer(inputs, names):
    x, scale, bias = inputs
    if x.ndim < 2:
        raise ValueError(f"input '{names[0]}' must have rank >= 2 (N, C, D1, ...), got rank {x.ndim}")
    require_same_dtype(inputs, names)
    for info, name in ((scale, names[1]), (bias, names[2])):
        _require_shape(info, (x.shape[1],), name, "one value per channel")
    return x


def _groupnorm_infer(inputs, attrs):
    x = _channel_norm_infer(inputs, ["X", "scale", "bias"])
    if x.shape[1] % attrs["num_groups"]:
        raise ValueError(f"num_groups {attrs['num_groups']} does not divide the {x.shape[1]} channels")
    return [(x.shape, x.dtype)]


def _groupnorm_reference(inputs, attrs):
    x, scale, bias = inputs
    n, c, g = x.shape[0], x.shape[1], attrs["num_groups"]
    groups = x.reshape(n, g, c // g * math.prod(x.shape[2:]))
    mean, var = _moments(groups, (2,))
    normalized = ((groups - mean) / np.sqrt(var + attrs["epsilon"])).reshape(x.shape)
    return [normalized * _channel_view(scale, x.ndim) + _channel_view(bias, x.ndim)]


def _groupnorm_cases(dtype, rng):
    r = lambda *shape: t.random(rng, shape, dtype)  # noqa: E731

    def case(name, shape, groups, x=None, **attrs):
        c = shape[1]
        return Case(name, [r(*shape) if x is None else x, r(c), r(c)], {"num_groups": groups, **attrs})

    return [
        case("nchw", (2, 6, 3, 5), 3),
        case("epsilon", (3, 4, 2, 2), 2, epsilon=0.01),
        case("one_group", (2, 5, 7), 1),
        case("group_per_channel", (2, 5, 7), 5),
        case("nc_only", (4, 6), 2),
        case("3d_spatial", (1, 4, 3, 2, 5), 2),
        case("stash_type", (2, 4, 9), 4, stash_type=1),
        case("empty_batch", (0, 4, 3), 2),
        case("empty_spatial", (2, 4, 0), 2),
        case("large", (2, 64, 33, 31), 8),
        case("special", (2, 4, 5), 2, x=_with_specials(r(2, 4, 5), dtype)),
    ]


register(OpSpec(
    name="GroupNormalization", category="nn", opset=21,
    inputs=(Input("X", doc="(N, C, D1, ...)"), Input("scale", doc="(C)"), Input("bias", doc="(C)")),
    outputs=("Y",),
    attrs=(Attr("num_groups", "int", REQUIRED, check=_positive, doc="divides C"), _EPSILON, _STASH_TYPE),
    dtypes=ALL_FLOAT,
    infer=_groupnorm_infer,
    reference=_groupnorm_reference,
    cases=_groupnorm_cases,
    tolerance=_NORM_TOLERANCE,
    doc="Normalizes each group of C / num_groups consecutive channels (with the spatial dims) of each "
        "instance to zero mean and unit variance, then Y = normalized * scale[c] + bias[c] (opset 21: "
        "per-channel scale and bias).",
))


def _instancenorm_infer(inputs, attrs):
    x = _channel_norm_infer(inputs, ["input", "scale", "B"])
    return [(x.shape, x.dtype)]


def _instancenorm_reference(inputs, attrs):
    x, scale, bias = inputs
    mean, var = _moments(x, tuple(range(2, x.ndim)))
    v = lambda p: _channel_view(p, x.ndim)  # noqa: E731
    return [v(scale) * (x - mean) / np.sqrt(var + attrs["epsilon"]) + v(bias)]


def _instancenorm_cases(dtype, rng):
    r = lambda *shape: t.random(rng, shape, dtype)  # noqa: E731

    def case(name, shape, x=None, **attrs):
        return Case(name, [r(*shape) if x is None else x, r(shape[1]), r(shape[1])], attrs)

    return [
        case("nchw", (2, 3, 4, 5)),
        case("epsilon", (2, 3, 4, 5), epsilon=0.01),
        case("1d_spatial", (3, 5, 67)),
        case("3d_spatial", (1, 2, 3, 4, 5)),
        case("one_element", (2, 3, 1, 1)),
        case("empty_batch", (0, 3, 4)),
        case("empty_spatial", (2, 3, 0)),
        case("large", (2, 3, 131, 257)),
        case("special", (2, 3, 5), x=_with_specials(r(2, 3, 5), dtype)),
    ]


register(OpSpec(
    name="InstanceNormalization", category="nn", opset=22,
    inputs=(Input("input", doc="(N, C, D1, ...)"), Input("scale", doc="(C)"), Input("B", doc="(C)")),
    outputs=("output",),
    attrs=(_EPSILON,),
    dtypes=ALL_FLOAT,
    infer=_instancenorm_infer,
    reference=_instancenorm_reference,
    cases=_instancenorm_cases,
    tolerance=_NORM_TOLERANCE,
    doc="output = scale * (x - mean) / sqrt(variance + epsilon) + B, statistics per instance and channel "
        "over the spatial dims.",
))


# -- LRN ---------------------------------------------------------------------------------


def _lrn_infer(inputs, attrs):
    x = inputs[0]
    if x.ndim < 2:
        raise ValueError(f"input 'X' must have rank >= 2 (N, C, D1, ...), got rank {x.ndim}")
    return [(x.shape, x.dtype)]


def _lrn_reference(inputs, attrs):
    x = inputs[0]
    size, channels = attrs["size"], x.shape[1]
    before, after = (size - 1) // 2, size // 2  # floor and ceil of (size - 1) / 2
    square_sum = np.zeros_like(x)
    for c in range(channels):
        square_sum[:, c] = np.sum(np.square(x[:, max(0, c - before):min(channels, c + after + 1)]), axis=1)
    return [x / (attrs["bias"] + attrs["alpha"] / size * square_sum) ** attrs["beta"]]


def _lrn_cases(dtype, rng):
    r = lambda *shape: t.random(rng, shape, dtype)  # noqa: E731
    return [
        Case("size3", [r(2, 5, 4, 4)], {"size": 3, "alpha": 0.0002, "beta": 0.5, "bias": 2.0}),
        Case("defaults", [r(2, 5, 3, 3)], {"size": 3}),
        Case("size1", [r(1, 4, 3, 3)], {"size": 1, "alpha": 0.5}),
        Case("even_size", [r(2, 7, 3, 2)], {"size": 4, "alpha": 0.3, "beta": 0.9}),
        Case("size_beyond_channels", [r(1, 3, 5)], {"size": 9, "alpha": 0.7, "bias": 0.5}),
        Case("nc_only", [r(6, 11)], {"size": 5, "alpha": 0.1}),
        Case("5d", [r(1, 6, 2, 3, 4)], {"size": 5, "alpha": 0.1, "beta": 1.5}),
        Case("empty", [r(0, 4, 3, 3)], {"size": 3}),
        Case("large", [r(2, 13, 67, 67)], {"size": 5, "alpha": 0.01}),
        Case("special", [_with_specials(r(1, 5, 3), dtype)], {"size": 3, "alpha": 0.1}),
    ]


register(OpSpec(
    name="LRN", category="nn", opset=13,
    inputs=(Input("X", doc="(N, C, D1, ...)"),),
    outputs=("Y",),
    attrs=(Attr("size", "int", REQUIRED, check=_positive, doc="channels in the window"),
           Attr("alpha", "float", float(np.float32(1e-4))),
           Attr("beta", "float", 0.75),
           Attr("bias", "float", 1.0)),
    dtypes=ALL_FLOAT,
    infer=_lrn_infer,
    reference=_lrn_reference,
    cases=_lrn_cases,
    tolerance={
        "float32": Tolerance(ulp=4),
        "float64": Tolerance(ulp=4),
        "float16": Tolerance(ulp=1),
        "bfloat16": Tolerance(ulp=1),
    },
    doc="Y = X / (bias + alpha / size * square_sum) ** beta, square_sum over the channels "
        "[c - floor((size - 1) / 2), c + ceil((size - 1) / 2)] clipped to [0, C).",
))


# -- Attention ---------------------------------------------------------------------------

# softmax_precision takes ONNX TensorProto codes: FLOAT, FLOAT16, DOUBLE, BFLOAT16.
_SOFTMAX_PRECISIONS = (1, 10, 11, 16)


def _attention_dims(inputs, attrs):
    """(batch, q_heads, kv_heads, q_len, kv_len, past_len, head_size, v_head_size), checked."""
    q, k, v, mask, past_key, past_value = (list(inputs) + [None] * 6)[:6]
    require_same_dtype([q, k, v, past_key, past_value], ["Q", "K", "V", "past_key", "past_value"])
    if not q.ndim == k.ndim == v.ndim or q.ndim not in (3, 4):
        raise ValueError(f"Q, K and V must all be 3-D or all 4-D, got ranks {q.ndim}, {k.ndim}, {v.ndim}")
    hq, hkv = attrs.get("q_num_heads"), attrs.get("kv_num_heads")
    if q.ndim == 3:
        if hq is None or hkv is None:
            raise ValueError("3-D Q, K and V need the q_num_heads and kv_num_heads attributes")
        for name, hidden, heads in (("Q", q.shape[2], hq), ("K", k.shape[2], hkv), ("V", v.shape[2], hkv)):
            if hidden % heads:
                raise ValueError(f"{name}'s hidden size {hidden} is not a multiple of its {heads} heads")
        batch, lq, lkv = q.shape[0], q.shape[1], k.shape[1]
        d, dk, dv = q.shape[2] // hq, k.shape[2] // hkv, v.shape[2] // hkv
        kv_batch, v_len = (k.shape[0], v.shape[0]), v.shape[1]
    else:
        batch, lq, lkv = q.shape[0], q.shape[2], k.shape[2]
        for name, given, actual in (("q_num_heads", hq, q.shape[1]), ("kv_num_heads", hkv, k.shape[1])):
            if given is not None and given != actual:
                raise ValueError(f"attribute {name}={given} disagrees with the 4-D inputs' {actual} heads")
        hq, hkv = q.shape[1], k.shape[1]
        if v.shape[1] != hkv:
            raise ValueError(f"K has {hkv} heads but V has {v.shape[1]}")
        d, dk, dv = q.shape[3], k.shape[3], v.shape[3]
        kv_batch, v_len = (k.shape[0], v.shape[0]), v.shape[2]
    if kv_batch != (batch, batch):
        raise ValueError(f"Q, K and V have batch sizes {batch}, {kv_batch[0]}, {kv_batch[1]}")
    if dk != d:
        raise ValueError(f"K's head size {dk} differs from Q's {d}")
    if v_len != lkv:
        raise ValueError(f"K has sequence length {lkv} but V has {v_len}")
    if (hq % hkv) if hkv else hq:
        raise ValueError(f"q_num_heads {hq} is not a multiple of kv_num_heads {hkv}")
    past = 0
    if (past_key is None) != (past_value is None):
        raise ValueError("past_key and past_value must be given together")
    if past_key is not None:
        if past_key.ndim != 4:
            raise ValueError(f"past_key must be 4-D (batch, kv_num_heads, past_len, head_size), "
                             f"got shape {tuple(past_key.shape)}")
        past = past_key.shape[2]
        _require_shape(past_key, (batch, hkv, past, d), "past_key", "(batch, kv_num_heads, past_len, head_size)")
        _require_shape(past_value, (batch, hkv, past, dv), "past_value",
                       "(batch, kv_num_heads, past_len, v_head_size)")
    total = past + lkv
    if mask is not None:
        if mask.dtype not in (BOOL, q.dtype):
            raise TypeError(f"attn_mask must be bool or Q's dtype {dtype_name(q.dtype)}, "
                            f"got {dtype_name(mask.dtype)}")
        target = (batch, hq, lq, total)
        if mask.ndim > 4 or any(m not in (1, n) for m, n in zip(reversed(mask.shape), reversed(target))):
            raise ValueError(f"attn_mask of shape {tuple(mask.shape)} does not broadcast to "
                             f"(batch, q_num_heads, q_len, past_len + kv_len) = {target}")
    return batch, hq, hkv, lq, lkv, past, d, dv


def _attention_infer(inputs, attrs):
    q = inputs[0]
    batch, hq, hkv, lq, lkv, past, d, dv = _attention_dims(inputs, attrs)
    total = past + lkv
    y = (batch, lq, hq * dv) if q.ndim == 3 else (batch, hq, lq, dv)
    return [(y, q.dtype), ((batch, hkv, total, d), q.dtype), ((batch, hkv, total, dv), q.dtype),
            ((batch, hq, lq, total), q.dtype)]


def _attention_reference(inputs, attrs):
    q, k, v, mask, past_key, past_value = (list(inputs) + [None] * 6)[:6]
    batch, hq, hkv, lq, lkv, past, d, dv = _attention_dims(
        [TensorInfo(x.shape, np.dtype(x.dtype)) if x is not None else None for x in inputs], attrs)
    three_d = q.ndim == 3
    if three_d:  # (batch, len, heads * size) -> (batch, heads, len, size)
        q = q.reshape(batch, lq, hq, d).transpose(0, 2, 1, 3)
        k = k.reshape(batch, lkv, hkv, d).transpose(0, 2, 1, 3)
        v = v.reshape(batch, lkv, hkv, dv).transpose(0, 2, 1, 3)
    present_key = k if past_key is None else np.concatenate([past_key, k], axis=2)
    present_value = v if past_value is None else np.concatenate([past_value, v], axis=2)
    total = past + lkv
    group = hq // hkv if hkv else 1
    keys = np.repeat(present_key, group, axis=1)
    values = np.repeat(present_value, group, axis=1)
    scale = attrs.get("scale", 1 / math.sqrt(d) if d else 1.0)
    scores = np.matmul(q, keys.transpose(0, 1, 3, 2)) * scale
    raw = scores
    if attrs["softcap"] > 0:
        scores = attrs["softcap"] * np.tanh(scores / attrs["softcap"])
    softcapped = scores
    bias = np.zeros((lq, total))
    if mask is not None:
        bias = bias + (np.where(mask, 0.0, -np.inf) if mask.dtype == BOOL else mask)
    if attrs["is_causal"]:
        bias = bias + np.where(np.arange(total)[None, :] <= np.arange(lq)[:, None] + past, 0.0, -np.inf)
    scores = scores + bias
    bias = np.broadcast_to(bias, scores.shape)
    if total:
        masked_rows = np.isneginf(bias.max(axis=-1, keepdims=True))
        top = scores.max(axis=-1, keepdims=True)
        exp = np.exp(scores - np.where(np.isneginf(top), 0.0, top))
        sums = exp.sum(axis=-1, keepdims=True)
        probs = np.where(masked_rows, 0.0, exp / np.where(sums == 0, 1.0, sums))
    else:
        probs = np.zeros(scores.shape)
    y = np.matmul(probs, values)
    if three_d:
        y = y.transpose(0, 2, 1, 3).reshape(batch, lq, hq * dv)
    qk = (raw, softcapped, scores, probs)[attrs["qk_matmul_output_mode"]]
    return [y, present_key, present_value, qk]


def _attention_cases(dtype, rng):
    r = lambda *shape: t.random(rng, shape, dtype, -2.0, 2.0)  # noqa: E731

    def qkv4(b, hq, hkv, lq, lkv, d, dv):
        return [r(b, hq, lq, d), r(b, hkv, lkv, d), r(b, hkv, lkv, dv)]

    def bool_mask(*shape):
        return rng.random(shape) < 0.7

    float_mask = r(3, 9)
    float_mask[0, 2] = float_mask[1, :4] = -np.inf
    float_mask[2, :] = -np.inf  # a fully masked row
    masked_rows = bool_mask(1, 4, 5)
    masked_rows[0, 1, :] = False
    special = qkv4(1, 2, 2, 4, 5, 3, 3)
    special[0][0, 0, 1, 2] = np.nan
    special[2][0, 1, 3, 0] = np.inf
    past = [r(1, 2, 4, 8), r(1, 2, 4, 8)]
    # Enough work that the cpu plugin splits the (batch, query head) pairs
    # over its pool: 3-D GQA with a past, causal, a mask per batch with a
    # fully masked row, and the probabilities as qk_matmul_output.
    heads_mask = r(2, 1, 40, 48)
    heads_mask[0, 0, 5, :] = -np.inf
    heads_mask[1, 0, :, 3] = -np.inf
    heads_split = [r(2, 40, 8 * 16), r(2, 40, 2 * 16), r(2, 40, 2 * 16), heads_mask,
                   r(2, 2, 8, 16), r(2, 2, 8, 16)]
    return [
        Case("4d", qkv4(2, 3, 3, 4, 6, 8, 8)),
        Case("3d_gqa", [r(2, 3, 4 * 5), r(2, 7, 2 * 5), r(2, 7, 2 * 3)], {"q_num_heads": 4, "kv_num_heads": 2}),
        Case("mqa_diff_v_head", qkv4(1, 4, 1, 5, 7, 6, 3)),
        Case("causal_square", qkv4(1, 2, 2, 5, 5, 4, 4), {"is_causal": 1}),
        Case("causal_q_shorter", qkv4(1, 2, 2, 3, 7, 4, 4), {"is_causal": 1}),
        Case("causal_past_gqa_head_mask", [*qkv4(1, 6, 2, 3, 5, 8, 8), bool_mask(6, 1, 9), *past],
             {"is_causal": 1, "qk_matmul_output_mode": 2}),
        Case("past_3d_float_mask", [r(1, 3, 2 * 8), r(1, 5, 2 * 8), r(1, 5, 2 * 8), float_mask, *past],
             {"q_num_heads": 2, "kv_num_heads": 2, "qk_matmul_output_mode": 2}),
        Case("bool_mask_broadcast", [*qkv4(2, 3, 3, 4, 5, 4, 4), bool_mask(1, 5)]),
        Case("bool_mask_masked_row", [*qkv4(2, 4, 2, 4, 5, 4, 4), masked_rows], {"qk_matmul_output_mode": 3}),
        Case("bool_mask_causal", [*qkv4(2, 2, 2, 4, 4, 4, 4), bool_mask(2, 1, 4, 4)],
             {"is_causal": 1, "qk_matmul_output_mode": 3}),
        Case("float_mask_4d_causal", [*qkv4(2, 2, 2, 3, 4, 4, 4), r(2, 2, 3, 4)], {"is_causal": 1}),
        Case("scale", qkv4(1, 2, 2, 3, 4, 5, 5), {"scale": 0.3}),
        Case("softcap_raw_scores", qkv4(1, 2, 2, 3, 4, 8, 8), {"softcap": 1.5, "scale": 2.0}),
        Case("softcap_output", qkv4(1, 2, 2, 3, 4, 8, 8), {"softcap": 1.5, "qk_matmul_output_mode": 1}),
        Case("softmax_precision_double", qkv4(1, 2, 1, 3, 6, 4, 4),
             {"softmax_precision": 11, "qk_matmul_output_mode": 3}),
        Case("softmax_precision_float", qkv4(1, 2, 1, 3, 6, 4, 4),
             {"softmax_precision": 1, "qk_matmul_output_mode": 3}),
        Case("empty_query", qkv4(1, 2, 2, 0, 4, 4, 4)),
        Case("empty_keys", qkv4(1, 2, 2, 3, 0, 4, 4), {"qk_matmul_output_mode": 3}),
        Case("empty_batch_3d", [r(0, 3, 8), r(0, 4, 8), r(0, 4, 8)], {"q_num_heads": 2, "kv_num_heads": 2}),
        Case("odd_sizes", qkv4(1, 3, 3, 67, 33, 17, 9)),
        Case("large", qkv4(1, 4, 2, 128, 256, 64, 32)),
        Case("large_heads_3d_gqa_causal_past_mask", heads_split,
             {"q_num_heads": 8, "kv_num_heads": 2, "is_causal": 1, "qk_matmul_output_mode": 3}),
        Case("special", special),
    ]


register(OpSpec(
    name="Attention", category="nn", opset=23,
    inputs=(Input("Q", doc="(B, Hq, Lq, D) or (B, Lq, Hq * D)"),
            Input("K", doc="(B, Hkv, Lkv, D) or (B, Lkv, Hkv * D)"),
            Input("V", doc="(B, Hkv, Lkv, Dv) or (B, Lkv, Hkv * Dv)"),
            Input("attn_mask", optional=True, doc="bool (True attends) or additive, broadcast to (B, Hq, Lq, T)"),
            Input("past_key", optional=True, doc="(B, Hkv, P, D)"),
            Input("past_value", optional=True, doc="(B, Hkv, P, Dv)")),
    outputs=("Y", "present_key", "present_value", "qk_matmul_output"), optional_outputs=3,
    attrs=(Attr("is_causal", "int", 0, choices=(0, 1),
                doc="query i attends key j iff j <= i + past_len (bottom-right aligned with past)"),
           Attr("kv_num_heads", "int", None, check=_positive, doc="3-D inputs: heads of K and V"),
           Attr("q_num_heads", "int", None, check=_positive, doc="3-D inputs: heads of Q"),
           Attr("qk_matmul_output_mode", "int", 0, choices=(0, 1, 2, 3),
                doc="qk_matmul_output: 0 scaled QK^T, 1 after softcap, 2 after the mask, 3 after softmax"),
           Attr("scale", "float", None, check=_non_negative, doc="default 1 / sqrt(D)"),
           Attr("softcap", "float", 0.0, check=_non_negative, doc="> 0: scores = softcap * tanh(scores / softcap)"),
           Attr("softmax_precision", "int", None, choices=_SOFTMAX_PRECISIONS,
                doc="ONNX dtype code: FLOAT (1), FLOAT16 (10), DOUBLE (11), BFLOAT16 (16)")),
    dtypes=ALL_FLOAT,
    infer=_attention_infer,
    reference=_attention_reference,
    cases=_attention_cases,
    tolerance={
        "float32": Tolerance(rtol=1e-5, atol=1e-6),
        "float64": Tolerance(rtol=1e-13, atol=1e-14),
        "float16": Tolerance(rtol=2e-3, atol=1e-4),
        "bfloat16": Tolerance(rtol=1.6e-2, atol=1e-3),
    },
    doc="Scaled dot-product attention (MHA, GQA, MQA): softmax(softcap(scale * Q K^T) + bias) V, with "
        "bias from attn_mask (bool: False -> -inf; float: added) and is_causal. K and V are appended to "
        "past_key/past_value; present_key/present_value return the result (B, Hkv, P + Lkv, .), also for "
        "3-D inputs. Query head h reads key/value head h // (Hq / Hkv). A query row whose bias is -inf "
        "everywhere (or that has no keys) gets zero probabilities and a zero output row (ONNX 23 errata). "
        "qk_matmul_output mode 0 is the scaled QK^T before softcap, as ONNX's function body has it "
        "(onnx.reference returns the softcapped scores there). Q, K, V and the past share one dtype; "
        "attn_mask is bool or that dtype and broadcasts (opset 24's padding of a shorter last dim is not "
        "supported). softmax_precision DOUBLE computes the softmax in float64; every other value, and "
        "no value, computes it in float32 (float64 for float64 inputs), which meets FLOAT16 and BFLOAT16. "
        "The cpu plugin needs the per-head sizes (D, Dv, P + Lkv, hidden sizes) below 2^31.",
))


# -- RotaryEmbedding -----------------------------------------------------------------------


def _rotary_dims(inputs, attrs):
    """(batch, seq, heads, head_size, rotary_dim), checked."""
    x, cos, sin, position_ids = (list(inputs) + [None])[:4]
    require_same_dtype([x, cos, sin], ["X", "cos_cache", "sin_cache"])
    heads = attrs.get("num_heads")
    if x.ndim == 4:
        batch, given, seq, head_size = x.shape
        if heads is not None and heads != given:
            raise ValueError(f"num_heads={heads} disagrees with X's {given} heads")
        heads = given
    elif x.ndim == 3:
        if heads is None:
            raise ValueError("3-D X needs the num_heads attribute")
        batch, seq, hidden = x.shape
        if hidden % heads:
            raise ValueError(f"X's hidden size {hidden} is not a multiple of num_heads {heads}")
        head_size = hidden // heads
    else:
        raise ValueError(f"X must be 3-D (B, S, hidden) or 4-D (B, heads, S, head_size), got rank {x.ndim}")
    rotary = attrs["rotary_embedding_dim"] or head_size
    if rotary % 2 or rotary > head_size:
        raise ValueError(f"the rotary dim {rotary} must be even and at most the head size {head_size}")
    if position_ids is not None:
        if position_ids.dtype != I64:
            raise TypeError(f"position_ids must be int64, got {dtype_name(position_ids.dtype)}")
        _require_shape(position_ids, (batch, seq), "position_ids", "(batch, seq)")
        if cos.ndim != 2 or cos.shape[1] != rotary // 2:
            raise ValueError(f"with position_ids, cos_cache must be (max_position + 1, {rotary // 2}), "
                             f"got {tuple(cos.shape)}")
    elif tuple(cos.shape) != (batch, seq, rotary // 2):
        raise ValueError(f"without position_ids, cos_cache must be (batch, seq, rotary_dim / 2) = "
                         f"{(batch, seq, rotary // 2)}, got {tuple(cos.shape)}")
    _require_shape(sin, cos.shape, "sin_cache", "cos_cache's shape")
    return batch, seq, heads, head_size, rotary


def _rotary_infer(inputs, attrs):
    _rotary_dims(inputs, attrs)
    return [(inputs[0].shape, inputs[0].dtype)]


def _rotary_reference(inputs, attrs):
    x, cos, sin, position_ids = (list(inputs) + [None])[:4]
    batch, seq, heads, head_size, rotary = _rotary_dims(
        [TensorInfo(a.shape, np.dtype(a.dtype)) if a is not None else None for a in inputs], attrs)
    rows = x.transpose(0, 2, 1, 3) if x.ndim == 4 else x.reshape(batch, seq, heads, head_size)
    if position_ids is not None:
        cos, sin = cos[position_ids], sin[position_ids]
    cos, sin = cos[:, :, None, :], sin[:, :, None, :]  # (batch, seq, 1, rotary / 2)
    out = rows.copy()
    part = rows[..., :rotary]
    x1, x2 = (part[..., 0::2], part[..., 1::2]) if attrs["interleaved"] else np.split(part, 2, axis=-1)
    real, imag = cos * x1 - sin * x2, sin * x1 + cos * x2
    if attrs["interleaved"]:
        out[..., 0:rotary:2], out[..., 1:rotary:2] = real, imag
    else:
        out[..., :rotary] = np.concatenate([real, imag], axis=-1)
    return [out.transpose(0, 2, 1, 3) if x.ndim == 4 else out.reshape(x.shape)]


def _rotary_cases(dtype, rng):
    r = lambda *shape: t.random(rng, shape, dtype)  # noqa: E731

    def caches(*shape):
        angles = rng.uniform(-math.pi, math.pi, shape)
        return [np.cos(angles).astype(dtype), np.sin(angles).astype(dtype)]

    def ids(batch, seq, limit):
        return rng.integers(0, limit, (batch, seq)).astype(np.int64)

    special = r(1, 2, 3, 6)
    special[0, 0, 0, :4] = np.array([np.nan, np.inf, -np.inf, -0.0]).astype(dtype)
    return [
        Case("position_ids", [r(2, 3, 5, 10), *caches(20, 5), ids(2, 5, 20)]),
        Case("interleaved", [r(2, 3, 5, 10), *caches(20, 5), ids(2, 5, 20)], {"interleaved": 1}),
        Case("partial", [r(2, 2, 4, 12), *caches(9, 3), ids(2, 4, 9)], {"rotary_embedding_dim": 6}),
        Case("partial_interleaved", [r(1, 3, 4, 10), *caches(1, 4, 4)],
             {"rotary_embedding_dim": 8, "interleaved": 1}),
        Case("3d_no_position_ids", [r(2, 5, 3 * 8), *caches(2, 5, 4)], {"num_heads": 3}),
        Case("3d_partial_position_ids", [r(2, 4, 2 * 10), *caches(7, 2), ids(2, 4, 7)],
             {"num_heads": 2, "rotary_embedding_dim": 4, "interleaved": 1}),
        Case("4d_num_heads_given", [r(1, 2, 3, 4), *caches(1, 3, 2)], {"num_heads": 2}),
        Case("empty_seq", [r(2, 3, 0, 8), *caches(2, 0, 4)]),
        Case("large", [r(2, 8, 130, 64), *caches(256, 32), ids(2, 130, 256)]),
        Case("special", [special, *caches(1, 3, 3)]),
    ]


register(OpSpec(
    name="RotaryEmbedding", category="nn", opset=23,
    inputs=(Input("X", doc="(B, heads, S, head_size) or (B, S, heads * head_size)"),
            Input("cos_cache", doc="(max_position + 1, rotary_dim / 2) with position_ids, else (B, S, rotary_dim / 2)"),
            Input("sin_cache", doc="cos_cache's shape"),
            Input("position_ids", optional=True, doc="int64 (B, S), each in [0, max_position]")),
    outputs=("Y",),
    attrs=(Attr("interleaved", "int", 0, choices=(0, 1),
                doc="1: rotate pairs (2i, 2i + 1); 0: pairs (i, i + rotary_dim / 2)"),
           Attr("rotary_embedding_dim", "int", 0, check=lambda v: None if v >= 0 else f"must be >= 0, got {v}",
                doc="rotate the first rotary_embedding_dim of each head; 0: all of it"),
           Attr("num_heads", "int", None, check=_positive, doc="required for 3-D X")),
    dtypes=ALL_FLOAT,
    infer=_rotary_infer,
    reference=_rotary_reference,
    cases=_rotary_cases,
    tolerance={
        "float32": Tolerance(ulp=1, atol=1e-6),
        "float64": Tolerance(ulp=1, atol=4e-15),
        "float16": Tolerance(ulp=1),
        "bfloat16": Tolerance(ulp=1),
    },
    doc="Rotary position embedding: each pair (x1, x2) of the rotated part of a head becomes "
        "(cos * x1 - sin * x2, sin * x1 + cos * x2) with the cos/sin of the token's position; the rest of "
        "the head is copied. A position id outside [0, max_position] fails the kernel (OutOfRangeError). "
        "float64 is accepted beyond ONNX's float/float16/bfloat16.",
))


# -- Trilu -----------------------------------------------------------------------------------


def _trilu_k(k) -> int:
    value = k.value if isinstance(k, TensorInfo) else np.asarray(k)
    if value.dtype.kind not in "iu":
        raise TypeError(f"input 'k' must hold an integer, got {dtype_name(value.dtype)}")
    if value.size != 1:
        raise ValueError(f"input 'k' must hold one value, got shape {tuple(value.shape)}")
    return int(value.reshape(-1)[0])


def _trilu_infer(inputs, attrs):
    x = inputs[0]
    if x.ndim < 2:
        raise ValueError(f"input 'input' must have rank >= 2, got rank {x.ndim}")
    if len(inputs) > 1 and inputs[1] is not None:
        _trilu_k(inputs[1])
    return [(x.shape, x.dtype)]


def _trilu_reference(inputs, attrs):
    x = inputs[0]
    k = _trilu_k(attrs["k"]) if "k" in attrs else 0
    rows, cols = np.arange(x.shape[-2])[:, None], np.arange(x.shape[-1])[None, :]
    keep = cols - rows >= k if attrs["upper"] else cols - rows <= k
    return [np.where(keep, x, np.zeros((), x.dtype))]


def _trilu_cases(dtype, rng):
    r = lambda *shape: t.random(rng, shape, dtype)  # noqa: E731
    k = lambda value: np.array(value, np.int64)  # noqa: E731
    cases = [
        Case("upper", [r(4, 5)]),
        Case("lower", [r(3, 5, 4)], {"upper": 0}),
        Case("upper_k_positive", [r(5, 6), k(2)]),
        Case("upper_k_negative", [r(2, 5, 4), k(-2)]),
        Case("lower_k_positive", [r(4, 6), k(3)], {"upper": 0}),
        Case("lower_k_negative", [r(6, 4), k(-1)], {"upper": 0}),
        Case("upper_k_beyond", [r(3, 4), k(9)]),
        Case("upper_k_before", [r(3, 4), k(-9)]),
        Case("lower_k_beyond", [r(3, 4), k(9)], {"upper": 0}),
        Case("lower_k_before", [r(3, 4), k(-9)], {"upper": 0}),
        Case("k_extreme", [r(3, 4), k(np.iinfo(np.int64).min)], {"upper": 0}),
        Case("k_one_element_1d", [r(4, 4), np.array([1], np.int64)]),
        Case("one_row", [r(2, 1, 5), k(1)], {"upper": 0}),
        Case("one_column", [r(5, 1), k(-2)]),
        Case("empty_batch", [r(0, 3, 3)]),
        Case("empty_matrix", [r(2, 0, 3), k(1)], {"upper": 0}),
        Case("large", [r(3, 131, 257), k(5)]),
    ]
    if t.is_float(dtype):
        cases.append(Case("special", [np.resize(t.special_values(dtype), (4, 4)), k(-1)]))
    return cases


register(OpSpec(
    name="Trilu", category="nn", opset=14,
    inputs=(Input("input", doc="(..., N, M)"),
            Input("k", optional=True, host=True, doc="one integer: the diagonal offset, default 0")),
    outputs=("output",),
    attrs=(Attr("upper", "int", 1, choices=(0, 1), doc="1: keep j - i >= k; 0: keep j - i <= k"),),
    dtypes=ALL,
    infer=_trilu_infer,
    reference=_trilu_reference,
    cases=_trilu_cases,
    doc="Keeps the upper (j - i >= k) or lower (j - i <= k) triangle of each matrix of the last two dims "
        "and zeroes the rest; k may lie beyond the matrix.",
))
