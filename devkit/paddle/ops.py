"""The phi kernels the bridge registers for the devkit place, lowered to devkit ops.

``KERNELS[name](device, *args)`` gets the kernel's arguments in Paddle's
signature order (bridge.cc's DEVKIT_KERNEL lines): inputs as devkit Arrays
viewing Paddle's memory, attributes as Python values, outputs as Arrays that
Paddle allocated (None where Paddle does not want that output). A kernel runs
devkit ops with ``run_op`` (so decompositions and counted CPU fallback apply)
and writes the results into the outputs, in the dtypes bridge.cc registers.
Most kernels run from bridge.cc on the plugin's kernel table instead (its
direct calls); they come here when a case does not fit the direct path, and
all of them do with DEVKIT_PADDLE_DIRECT=0.
"""

from __future__ import annotations

import math

import numpy as np

from .. import dtypes
from ..abi import ffi
from ..ops import run_op
from ..runtime import Array, asarray, empty


def _op(name: str, inputs: list, attrs: dict | None = None) -> Array:
    return run_op(name, inputs, attrs, outputs=1)[0]


def _write(out: Array | None, result: Array) -> None:
    """Copies a contiguous result into an output (same element count; shapes may differ by 1-dims)."""
    if out is None:
        return
    if out.nbytes != result.nbytes:
        raise ValueError(f"result of shape {result.shape} does not fit the output of shape {out.shape}")
    if out.nbytes:  # both on one device, both compact: one copy_d2d on the default stream
        dst, src, dev = out.buffer, result.buffer, out.device
        dev.call("copy_d2d", dev.index, dst.handle, dst.offset + out.offset, src.handle, src.offset + result.offset,
                 out.nbytes, ffi.NULL)


_HALF = {np.dtype(np.float16)} | ({dtypes.bfloat16} if dtypes.bfloat16 is not None else set())
_FLOAT32 = np.dtype(np.float32)


def _in_float32(outputs: int):
    """A kernel that computes in float32 for 16-bit tensors, as Paddle's GPU kernels do (their
    MPType): 16-bit inputs cast to float32, 16-bit outputs (the last ``outputs`` arguments)
    written through float32 results cast back; float32 ones (BatchNorm's statistics, Adam's
    moments, master weights) pass as they are."""
    def wrap(kernel):
        def in_float32(dev, *args):
            split = len(args) - outputs
            inputs = [_float32_input(a) for a in args[:split]]
            results = [empty(a.shape, _FLOAT32, dev) if _is_half(a) else a for a in args[split:]]
            kernel(dev, *inputs, *results)
            for out, result in zip(args[split:], results):
                if result is not out:
                    _write(out, _op("Cast", [result], {"to": out.dtype}))
        in_float32.__name__ = kernel.__name__
        return in_float32
    return wrap


def _is_half(a) -> bool:
    """A tensor argument (an Array, or _bridge.TensorMeta: shape only) in a 16-bit float dtype."""
    return getattr(a, "dtype", None) in _HALF


def _float32_input(a):
    if not _is_half(a):
        return a
    if not isinstance(a, Array):  # a TensorMeta: no data to cast
        return a._replace(dtype=_FLOAT32)
    return _op("Cast", [a], {"to": _FLOAT32})


def _unbroadcast(grad: Array, shape: tuple) -> Array:
    """The gradient of a broadcast: sums ``grad`` over the dims that broadcasting added or stretched."""
    if grad.shape == shape:
        return grad
    lead = grad.ndim - len(shape)
    axes = list(range(lead)) + [lead + k for k, n in enumerate(shape) if n == 1 and grad.shape[lead + k] != 1]
    if axes:
        grad = _op("ReduceSum", [grad, np.array(axes, np.int64)], {"keepdims": 0})
    return grad.reshape(shape) if grad.shape != shape else grad


def _swapped_axes(ndim: int) -> list[int]:
    axes = list(range(ndim))
    axes[-2], axes[-1] = axes[-1], axes[-2]
    return axes


def _swap(a: Array) -> Array:
    """The last two dims exchanged (a view)."""
    return a.transpose(*_swapped_axes(a.ndim))


# y = f(x): phi kernel -> devkit op.
UNARY = {"relu": "Relu", "exp": "Exp", "tanh": "Tanh", "sigmoid": "Sigmoid", "sqrt": "Sqrt", "log": "Log",
         "sin": "Sin", "cos": "Cos", "abs": "Abs"}
# phi grad kernel -> dx from (its first input: x or out, as Paddle declares it; dout).
UNARY_GRADS = {
    "relu_grad": lambda out, dout: _op("ReluGrad", [dout, out]),
    "exp_grad": lambda out, dout: _op("Mul", [dout, out]),
    "tanh_grad": lambda out, dout: _op("TanhGrad", [dout, out]),
    "sigmoid_grad": lambda out, dout: _op("SigmoidGrad", [dout, out]),
    "sqrt_grad": lambda out, dout: _op("Div", [_op("Mul", [dout, _scalar(0.5)]), out]),
    "log_grad": lambda x, dout: _op("Div", [dout, x]),
    "sin_grad": lambda x, dout: _op("Mul", [dout, _op("Cos", [x])]),
    "cos_grad": lambda x, dout: _op("Neg", [_op("Mul", [dout, _op("Sin", [x])])]),
    "abs_grad": lambda x, dout: _op("Mul", [dout, _op("Sign", [x])]),
    "square_grad": lambda x, dout: _op("Mul", [dout, _op("Mul", [x, _scalar(2.0)])]),
}
# Elementwise binary ops with numpy broadcasting: phi kernel -> devkit op.
BINARY = {"add": "Add", "subtract": "Sub", "multiply": "Mul", "divide": "Div", "equal": "Equal",
          "less_than": "Less", "less_equal": "LessOrEqual", "greater_than": "Greater",
          "greater_equal": "GreaterOrEqual"}


def _unary(op: str):
    def kernel(dev, x, out):
        _write(out, _op(op, [x]))
    return kernel


def _unary_grad(gradient):
    def kernel(dev, x_or_out, dout, dx):
        _write(dx, gradient(x_or_out, dout))
    return kernel


def _binary(op: str):
    def kernel(dev, x, y, out):
        _write(out, _op(op, [x, y]))
    return kernel


def not_equal(dev, x, y, out):
    _write(out, _op("Not", [_op("Equal", [x, y])]))


def cast(dev, x, out_dtype, out):
    _write(out, _op("Cast", [x], {"to": out.dtype}))  # Paddle inferred the output's dtype


def concat(dev, xs, axis, out):
    _write(out, _op("Concat", list(xs), {"axis": int(axis) % xs[0].ndim}))


def split_with_num(dev, x, num, axis, outs):
    axis = int(axis) % x.ndim
    if x.shape[axis] % num:
        raise ValueError(f"split_with_num: {x.shape[axis]} elements on axis {axis} do not split {num} ways")
    for out, part in zip(outs, run_op("Split", [x], {"axis": axis, "num_outputs": num})):
        _write(out, part)


def square(dev, x, out):
    _write(out, _op("Mul", [x, x]))


def _check_axis(what: str, axis: int) -> None:
    if axis != -1:
        raise NotImplementedError(f"{what}: axis={axis} (only -1, numpy broadcasting)")


def add_grad(dev, x, y, dout, axis, dx, dy):
    _check_axis("add_grad", axis)
    _write(dx, _unbroadcast(dout, x.shape))
    _write(dy, _unbroadcast(dout, y.shape))


def subtract_grad(dev, x, y, dout, axis, dx, dy):
    _check_axis("subtract_grad", axis)
    _write(dx, _unbroadcast(dout, x.shape))
    if dy is not None:
        _write(dy, _unbroadcast(_op("Neg", [dout]), y.shape))


def multiply_grad(dev, x, y, dout, axis, dx, dy):
    _check_axis("multiply_grad", axis)
    if dx is not None:
        _write(dx, _unbroadcast(_op("Mul", [dout, y]), x.shape))
    if dy is not None:
        _write(dy, _unbroadcast(_op("Mul", [dout, x]), y.shape))


def divide_grad(dev, x, y, out, dout, axis, dx, dy):
    _check_axis("divide_grad", axis)
    if dx is not None:
        _write(dx, _unbroadcast(_op("Div", [dout, y]), x.shape))
    if dy is not None:  # d(x/y)/dy = -out / y
        _write(dy, _unbroadcast(_op("Neg", [_op("Div", [_op("Mul", [dout, out]), y])]), y.shape))


def gelu(dev, x, approximate, out):
    _write(out, _op("Gelu", [x], {"approximate": "tanh" if approximate else "none"}))


def gelu_grad(dev, x, dout, approximate, dx):
    _write(dx, _op("GeluGrad", [dout, x], {"approximate": "tanh" if approximate else "none"}))


def scale(dev, x, factor, bias, bias_after_scale, out):
    if bias_after_scale:
        result = _op("Add", [_op("Mul", [x, _scalar(factor)]), _scalar(bias)])
    else:
        result = _op("Mul", [_op("Add", [x, _scalar(bias)]), _scalar(factor)])
    _write(out, result)


def _axes(dims, ndim: int) -> list[int]:
    """Paddle's reduce dims: empty means every axis."""
    return [d % ndim for d in dims] if dims else list(range(ndim))


@_in_float32(outputs=1)
def reduce_sum(dev, x, dims, out_dtype, keep_dim, out):
    if x.ndim == 0:
        _write(out, x)
        return
    _write(out, _op("ReduceSum", [x, np.array(_axes(dims, x.ndim), np.int64)], {"keepdims": int(keep_dim)}))


@_in_float32(outputs=1)
def sum_grad(dev, x, dout, dims, keep_dim, reduce_all, dx):
    ndim = len(x.shape)  # x may be shape only
    axes = list(range(ndim)) if reduce_all else _axes(dims, ndim)
    kept = tuple(1 if k in axes else n for k, n in enumerate(x.shape))
    _write(dx, _op("Expand", [dout.reshape(*kept), list(x.shape)]))


def transpose(dev, x, perm, out):
    _write(out, _op("Transpose", [x], {"perm": [p % x.ndim for p in perm]}))


def transpose_grad(dev, dout, perm, dx):
    inverse = [0] * len(perm)
    for k, p in enumerate(perm):
        inverse[p % len(perm)] = k
    _write(dx, _op("Transpose", [dout], {"perm": inverse}))


def _as_matrices(x, y, tx, ty):
    """x and y with 1-D operands made 2-D and the transposes applied (views)."""
    x2 = x.reshape(1, x.shape[0]) if x.ndim == 1 else x
    y2 = y.reshape(y.shape[0], 1) if y.ndim == 1 else y
    return (_swap(x2) if tx and x.ndim > 1 else x2), (_swap(y2) if ty and y.ndim > 1 else y2)


def matmul(dev, x, y, tx, ty, out):
    a, b = _as_matrices(x, y, tx, ty)
    _write(out, _op("MatMul", [a, b]))


def matmul_grad(dev, x, y, dout, tx, ty, dx, dy):
    a, b = _as_matrices(x, y, tx, ty)
    out_shape = tuple(np.broadcast_shapes(a.shape[:-2], b.shape[:-2])) + (a.shape[-2], b.shape[-1])
    dout = dout.reshape(*out_shape)
    if dx is not None:
        da = _op("MatMul", [dout, _swap(b)])  # d(a) = dout b^T
        da = _unbroadcast(da, a.shape)
        if tx and x.ndim > 1:
            da = _op("Transpose", [da], {"perm": _swapped_axes(da.ndim)})
        _write(dx, da)
    if dy is not None:
        db = _op("MatMul", [_swap(a), dout])  # d(b) = a^T dout
        db = _unbroadcast(db, b.shape)
        if ty and y.ndim > 1:
            db = _op("Transpose", [db], {"perm": _swapped_axes(db.ndim)})
        _write(dy, db)


def softmax(dev, x, axis, out):
    _write(out, _op("Softmax", [x], {"axis": axis}))


def softmax_grad(dev, out, dout, axis, dx):
    _write(dx, _op("SoftmaxGrad", [dout, out], {"axis": axis}))


def _hard_labels(logits, label, soft_label, axis, what):
    """The label as a 1-D index per row: hard labels, class axis last, 2-D logits."""
    if soft_label or logits.ndim != 2 or axis not in (-1, 1):
        raise NotImplementedError(f"{what}: only hard labels over the last axis of 2-D logits "
                                  f"(got soft_label={soft_label}, axis={axis}, logits {logits.shape})")
    return label.reshape(label.size)


@_in_float32(outputs=2)
def cross_entropy_with_softmax(dev, logits, label, soft_label, use_softmax, numeric_stable_mode,
                               ignore_index, axis, softmax_out, loss):
    labels = _hard_labels(logits, label, soft_label, axis, "cross_entropy_with_softmax")
    if not use_softmax:
        raise NotImplementedError("cross_entropy_with_softmax: use_softmax=False")
    probabilities = _op("Softmax", [logits], {"axis": -1})
    losses = run_op("SoftmaxCrossEntropyLoss", [logits, labels],
                    {"reduction": "none", "ignore_index": ignore_index}, outputs=1)[0]
    _write(softmax_out, probabilities)
    _write(loss, losses)


@_in_float32(outputs=1)
def cross_entropy_with_softmax_grad(dev, label, softmax_in, loss_grad, soft_label, use_softmax,
                                    numeric_stable_mode, ignore_index, axis, logits_grad):
    labels = _hard_labels(softmax_in, label, soft_label, axis, "cross_entropy_with_softmax_grad")
    log_prob = _op("Log", [softmax_in])
    grad = _op("SoftmaxCrossEntropyLossGrad", [loss_grad.reshape(labels.size), log_prob, labels],
               {"reduction": "none", "ignore_index": ignore_index})
    _write(logits_grad, grad)


@_in_float32(outputs=1)
def mean_all(dev, x, out):
    _write(out, _op("ReduceMean", [x], {"keepdims": 0}))


@_in_float32(outputs=1)
def mean_all_grad(dev, x, dout, dx):
    scaled = _op("Mul", [dout, _scalar(1.0 / max(math.prod(x.shape), 1))])  # x may be shape only
    _write(dx, _op("Expand", [scaled, list(x.shape)]))


@_in_float32(outputs=1)
def mean(dev, x, dims, keep_dim, out):
    axes = np.array(dims if dims else range(x.ndim), np.int64)
    _write(out, _op("ReduceMean", [x, axes], {"keepdims": int(keep_dim)}))


@_in_float32(outputs=1)
def mean_grad(dev, x, dout, dims, keep_dim, reduce_all, dx):
    ndim = len(x.shape)  # x may be shape only
    axes = list(range(ndim)) if reduce_all or not dims else [d % ndim for d in dims]
    count = math.prod(x.shape[a] for a in axes)
    kept = tuple(1 if k in axes else n for k, n in enumerate(x.shape))
    scaled = _op("Mul", [dout.reshape(*kept), _scalar(1.0 / max(count, 1))])
    _write(dx, _op("Expand", [scaled, list(x.shape)]))


@_in_float32(outputs=2)
def sgd(dev, param, learning_rate, grad, master_param, multi_precision, param_out, master_param_out):
    """multi_precision (16-bit parameters): the step moves the float32 master weights, and the
    parameter is their rounding (phi's SGD)."""
    step = _op("Mul", [grad, learning_rate])  # learning_rate has shape [1]: it broadcasts
    updated = _op("Sub", [_master(param, master_param, multi_precision, "sgd"), step])
    _write(param_out, updated)
    if multi_precision:
        _write(master_param_out, updated)


def _master(param, master_param, multi_precision: bool, what: str):
    """The weights an optimizer step moves: the float32 master copy under multi_precision."""
    if not multi_precision:
        return param
    if master_param is None:
        raise ValueError(f"{what}: multi_precision without a master_param")
    return master_param


def layer_norm(dev, x, scale, bias, epsilon, begin_norm_axis, out, mean_out, variance_out):
    normalized = x.shape[begin_norm_axis:]
    scale = scale.reshape(*normalized) if scale is not None else _fill_like(dev, normalized, 1.0)
    inputs = [x, scale] + ([bias.reshape(*normalized)] if bias is not None else [])
    y, mean, inv_std = run_op("LayerNormalization", inputs, {"axis": begin_norm_axis, "epsilon": epsilon})
    _write(out, y)
    _write(mean_out, mean)
    if variance_out is not None:  # Paddle keeps the variance, devkit 1 / sqrt(variance + epsilon)
        squared = _op("Mul", [inv_std, inv_std])
        _write(variance_out, _op("Sub", [_op("Reciprocal", [squared]), _scalar(epsilon)]))


def layer_norm_grad(dev, x, scale, bias, mean, variance, out_grad, epsilon, begin_norm_axis, x_grad, scale_grad,
                    bias_grad):
    normalized = x.shape[begin_norm_axis:]
    stats_shape = x.shape[:begin_norm_axis] + (1,) * len(normalized)
    scale = scale.reshape(*normalized) if scale is not None else _fill_like(dev, normalized, 1.0)
    inv_std = _op("Reciprocal", [_op("Sqrt", [_op("Add", [variance.reshape(*stats_shape),
                                                          _scalar(epsilon)])])])
    dx, dscale, dbias = run_op("LayerNormalizationGrad", [out_grad, x, scale, mean.reshape(*stats_shape), inv_std],
                               {"axis": begin_norm_axis})
    _write(x_grad, dx)
    _write(scale_grad, dscale)
    _write(bias_grad, dbias)


def _channels_first(layout: str, what: str) -> None:
    if layout not in ("NCHW", "NCL", "NC", "AnyLayout"):
        raise NotImplementedError(f"{what}: data_layout {layout!r} (channels first only)")


@_in_float32(outputs=6)
def batch_norm(dev, x, mean, variance, scale, bias, is_test, momentum, epsilon, data_layout, use_global_stats,
               trainable_statistics, y, mean_out, variance_out, saved_mean, saved_variance, reserve_space):
    """Paddle keeps the batch's mean and 1 / sqrt(variance + epsilon) for the grad (saved_*), and
    running statistics that move by ``momentum`` as ONNX's do."""
    _channels_first(data_layout, "batch_norm")
    channels = x.shape[1]
    scale = scale if scale is not None else _fill_like(dev, (channels,), 1.0)
    bias = bias if bias is not None else _fill_like(dev, (channels,), 0.0)
    attrs = {"epsilon": epsilon, "momentum": momentum}
    if is_test or use_global_stats:
        _write(y, _op("BatchNormalization", [x, scale, bias, mean, variance], {**attrs, "training_mode": 0}))
        _write(mean_out, mean)
        _write(variance_out, variance)
        return
    result, running_mean, running_var = run_op("BatchNormalization", [x, scale, bias, mean, variance],
                                               {**attrs, "training_mode": 1})
    axes = np.array([0, *range(2, x.ndim)], np.int64)
    batch_mean = _op("ReduceMean", [x, axes], {"keepdims": 1})
    centred = _op("Sub", [x, batch_mean])
    batch_var = _op("ReduceMean", [_op("Mul", [centred, centred]), axes], {"keepdims": 0})
    _write(y, result)
    _write(mean_out, running_mean)
    _write(variance_out, running_var)
    _write(saved_mean, batch_mean)
    _write(saved_variance, _op("Reciprocal", [_op("Sqrt", [_op("Add", [batch_var, _scalar(epsilon)])])]))


@_in_float32(outputs=3)
def batch_norm_grad(dev, x, scale, bias, mean, variance, saved_mean, saved_variance, reserve_space, y_grad, momentum,
                    epsilon, data_layout, is_test, use_global_stats, trainable_statistics, x_grad, scale_grad,
                    bias_grad):
    _channels_first(data_layout, "batch_norm_grad")
    scale = scale if scale is not None else _fill_like(dev, (x.shape[1],), 1.0)
    if is_test or use_global_stats:  # the statistics are constants: y is affine in x
        dx, dscale, dbias = _batch_norm_grad_global(x, scale, mean, variance, y_grad, epsilon)
    else:
        dx, dscale, dbias = run_op("BatchNormalizationGrad", [y_grad, x, scale, saved_mean, saved_variance])
    _write(x_grad, dx)
    _write(scale_grad, dscale)
    _write(bias_grad, dbias)


def _batch_norm_grad_global(x, scale, mean, variance, y_grad, epsilon):
    per_channel = (1, x.shape[1]) + (1,) * (x.ndim - 2)
    axes = np.array([0, *range(2, x.ndim)], np.int64)
    inv_std = _op("Reciprocal", [_op("Sqrt", [_op("Add", [variance, _scalar(epsilon)])])]).reshape(*per_channel)
    dx = _op("Mul", [y_grad, _op("Mul", [scale.reshape(*per_channel), inv_std])])
    normalized = _op("Mul", [_op("Sub", [x, mean.reshape(*per_channel)]), inv_std])
    dscale = _op("ReduceSum", [_op("Mul", [y_grad, normalized]), axes], {"keepdims": 0})
    return dx, dscale, _op("ReduceSum", [y_grad, axes], {"keepdims": 0})


def _conv_attrs(filter_, strides, paddings, padding_algorithm, dilations, groups, data_format) -> dict:
    if data_format not in ("NCHW", "AnyLayout"):
        raise NotImplementedError(f"conv2d: data_format {data_format!r} (only NCHW)")
    if padding_algorithm == "VALID":
        pads = [0, 0, 0, 0]
    elif padding_algorithm == "EXPLICIT":
        if len(paddings) == 2:
            pads = [paddings[0], paddings[1], paddings[0], paddings[1]]
        elif len(paddings) == 4:  # Paddle: top, bottom, left, right; ONNX: begins, then ends
            pads = [paddings[0], paddings[2], paddings[1], paddings[3]]
        else:
            raise ValueError(f"conv2d: paddings {paddings} (2 or 4 values)")
    else:
        raise NotImplementedError(f"conv2d: padding_algorithm {padding_algorithm!r} (EXPLICIT or VALID)")
    return {"strides": list(strides), "pads": pads, "dilations": list(dilations), "group": groups,
            "kernel_shape": list(filter_.shape[2:])}


def conv2d(dev, x, filter_, strides, paddings, padding_algorithm, dilations, groups, data_format, out):
    attrs = _conv_attrs(filter_, strides, paddings, padding_algorithm, dilations, groups, data_format)
    _write(out, _op("Conv", [x, filter_], attrs))


def conv2d_grad(dev, x, filter_, out_grad, strides, paddings, padding_algorithm, dilations, groups, data_format,
                x_grad, filter_grad):
    attrs = _conv_attrs(filter_, strides, paddings, padding_algorithm, dilations, groups, data_format)
    dx, dw = run_op("ConvGrad", [out_grad, x, filter_], attrs, outputs=2)[:2]  # dB is always returned
    _write(x_grad, dx)
    _write(filter_grad, dw)


def _pool_attrs(x, kernel_size, strides, paddings, ceil_mode, data_format, global_pooling, adaptive,
                padding_algorithm) -> dict | None:
    """pool2d's window as MaxPool's / AveragePool's attributes; None for a pooling over all of each plane."""
    _channels_first(data_format, "pool2d")
    height, width = x.shape[2:]
    kernel = [int(k) for k in kernel_size]
    if global_pooling or (adaptive and kernel == [1, 1]):
        return None
    if adaptive:  # kernel_size is the output's size: windows of equal extent where it divides the input
        if height % kernel[0] or width % kernel[1]:
            raise NotImplementedError(f"pool2d: adaptive output {kernel} does not divide the input {[height, width]}")
        window = [height // kernel[0], width // kernel[1]]
        return {"kernel_shape": window, "strides": window, "pads": [0, 0, 0, 0], "dilations": [1, 1], "ceil_mode": 0}
    attrs = _conv_attrs(x, strides, paddings, padding_algorithm, [1, 1], 1, "NCHW")
    return {"kernel_shape": kernel, "strides": attrs["strides"], "pads": attrs["pads"], "dilations": [1, 1],
            "ceil_mode": int(ceil_mode)}


def _pool_type(pooling_type: str) -> str:
    if pooling_type not in ("max", "avg"):
        raise NotImplementedError(f"pool2d: pooling_type {pooling_type!r} (max or avg)")
    return pooling_type


def pool2d(dev, x, kernel_size, strides, paddings, ceil_mode, exclusive, data_format, pooling_type, global_pooling,
           adaptive, padding_algorithm, out):
    attrs = _pool_attrs(x, kernel_size, strides, paddings, ceil_mode, data_format, global_pooling, adaptive,
                        padding_algorithm)
    if _pool_type(pooling_type) == "max":
        result = _op("GlobalMaxPool", [x]) if attrs is None else _op("MaxPool", [x], attrs)
    else:
        result = _op("GlobalAveragePool", [x]) if attrs is None else \
            _op("AveragePool", [x], {**attrs, "count_include_pad": int(not exclusive)})
    _write(out, result)


def pool2d_grad(dev, x, out, dout, kernel_size, strides, paddings, ceil_mode, exclusive, data_format, pooling_type,
                global_pooling, adaptive, padding_algorithm, dx):
    attrs = _pool_attrs(x, kernel_size, strides, paddings, ceil_mode, data_format, global_pooling, adaptive,
                        padding_algorithm)
    if attrs is None:  # the whole plane is one window
        attrs = {"kernel_shape": list(x.shape[2:]), "strides": [1, 1], "pads": [0, 0, 0, 0], "dilations": [1, 1],
                 "ceil_mode": 0}
    if _pool_type(pooling_type) == "max":  # the maxima's places, found again
        _, indices = run_op("MaxPool", [x], attrs, outputs=2)
        grad = _op("MaxPoolGrad", [dout, indices, list(x.shape)])
    else:
        grad = _op("AveragePoolGrad", [dout, list(x.shape)], {**attrs, "count_include_pad": int(not exclusive)})
    _write(dx, grad)


def _plane_starts(x) -> np.ndarray:
    """The flat index of each (N, C) plane's first element, shaped to broadcast over MaxPool's output."""
    batch, channels, height, width = x.shape
    return (np.arange(batch * channels, dtype=np.int64) * (height * width)).reshape(batch, channels, 1, 1)


def max_pool2d_with_index(dev, x, kernel_size, strides, paddings, global_pooling, adaptive, ceil_mode, out, mask):
    """Max pooling and, per output element, the maximum's index within its plane (Paddle's mask, int32)."""
    attrs = _pool_attrs(x, kernel_size, strides, paddings, ceil_mode, "NCHW", global_pooling, adaptive, "EXPLICIT")
    if attrs is None:
        attrs = {"kernel_shape": list(x.shape[2:]), "strides": [1, 1], "pads": [0, 0, 0, 0], "dilations": [1, 1],
                 "ceil_mode": 0}
    result, indices = run_op("MaxPool", [x], attrs, outputs=2)  # devkit's indices are flat over all of x
    _write(out, result)
    if mask is not None:
        _write(mask, _op("Cast", [_op("Sub", [indices, _plane_starts(x)])], {"to": mask.dtype}))


def max_pool2d_with_index_grad(dev, x, mask, dout, kernel_size, strides, paddings, global_pooling, adaptive,
                               ceil_mode, dx):
    indices = _op("Add", [_op("Cast", [mask], {"to": np.dtype(np.int64)}), _plane_starts(x)])
    _write(dx, _op("MaxPoolGrad", [dout, indices, list(x.shape)]))


def embedding(dev, ids, weight, padding_idx, out):
    """Rows of weight at ids; the rows of ids equal to padding_idx (-1: none) are zeros, as Paddle's."""
    rows = _op("Gather", [weight, ids], {"axis": 0})
    if padding_idx >= 0:
        padding = _op("Equal", [ids, np.array(padding_idx, ids.dtype)]).reshape(*ids.shape, 1)
        rows = _op("Where", [padding, np.zeros((), weight.dtype), rows])
    _write(out, rows)


def embedding_grad(dev, ids, weight, out_grad, padding_idx, weight_grad):
    """out_grad's rows summed into the rows of weight that ids picked; padding_idx's row stays zero."""
    vocabulary, width = weight.shape
    indices = ids.reshape(*ids.shape, 1)
    grad = _op("ScatterND", [_fill_like(dev, (vocabulary, width), 0.0, weight.dtype), indices,
                             out_grad.reshape(*ids.shape, width)], {"reduction": "add"})
    if padding_idx >= 0:
        keep = np.ones((vocabulary, 1), weight.dtype)
        keep[padding_idx] = 0
        grad = _op("Mul", [grad, keep])
    _write(weight_grad, grad)


# Dropout masks are drawn on the host (devkit has no random op) and copied in; with fix_seed,
# from Paddle's seed attribute (or seed_tensor), as Paddle draws its own.
_dropout_rng = np.random.default_rng()


def dropout(dev, x, seed_tensor, p, is_test, mode, seed, fix_seed, out, mask):
    p = float(p)
    if mode not in ("upscale_in_train", "downgrade_in_infer"):  # the kernel's names of the API's modes
        raise ValueError(f"dropout: mode {mode!r} (upscale_in_train or downgrade_in_infer)")
    if is_test:  # no mask: the identity, or the expectation's scaling
        _write(out, x if mode == "upscale_in_train" else _op("Mul", [x, np.array(1.0 - p, x.dtype)]))
        return
    if seed_tensor is not None:
        rng = np.random.default_rng(int(seed_tensor.numpy().reshape(-1)[0]))
    else:
        rng = np.random.default_rng(seed) if fix_seed else _dropout_rng
    kept = rng.random(x.shape) >= p
    scale = 0.0 if p >= 1.0 else (1.0 / (1.0 - p) if mode == "upscale_in_train" else 1.0)
    _write(out, _op("Mul", [x, (kept * scale).astype(x.dtype)]))
    if mask is not None:
        mask.buffer.copy_from_host(np.ascontiguousarray(kept, np.uint8), offset=mask.offset)


def dropout_grad(dev, mask, out_grad, p, is_test, mode, x_grad):
    p = float(p)
    if is_test:
        _write(x_grad, out_grad if mode == "upscale_in_train" else _op("Mul", [out_grad, np.array(1.0 - p,
                                                                                                  out_grad.dtype)]))
        return
    scale = 0.0 if p >= 1.0 else (1.0 / (1.0 - p) if mode == "upscale_in_train" else 1.0)
    kept = _op("Cast", [mask], {"to": out_grad.dtype})
    _write(x_grad, _op("Mul", [_op("Mul", [out_grad, kept]), np.array(scale, out_grad.dtype)]))


@_in_float32(outputs=7)
def adam(dev, param, grad, learning_rate, moment1, moment2, moment2_max, beta1_pow, beta2_pow, master_param,
         skip_update, beta1, beta2, epsilon, lazy_mode, min_row_size_to_use_multithread, multi_precision,
         use_global_beta_pow, amsgrad, param_out, moment1_out, moment2_out, moment2_max_out, beta1_pow_out,
         beta2_pow_out, master_param_out):
    """Paddle's dense Adam, in its order of operations (phi's AdamFunctor); under multi_precision
    on the float32 master weights, the parameter their rounding."""
    if amsgrad or skip_update is not None:
        raise NotImplementedError("adam: amsgrad and skip_update are not supported yet")
    source = _master(param, master_param, multi_precision, "adam")
    f32 = np.float32
    b1, b2, eps = f32(beta1), f32(beta2), f32(epsilon)
    pow1, pow2, lr = (f32(a.numpy().reshape(-1)[0]) for a in (beta1_pow, beta2_pow, learning_rate))
    lr = lr * np.sqrt(f32(1) - pow2) / (f32(1) - pow1)
    m1 = _op("Add", [_op("Mul", [moment1, _scalar(b1)]), _op("Mul", [grad, _scalar(f32(1) - b1)])])
    m2 = _op("Add", [_op("Mul", [moment2, _scalar(b2)]),
                     _op("Mul", [_op("Mul", [grad, grad]), _scalar(f32(1) - b2)])])
    denominator = _op("Add", [_op("Sqrt", [m2]), _scalar(eps * np.sqrt(f32(1) - pow2))])
    step = _op("Mul", [_op("Div", [m1, denominator]), _scalar(lr)])
    updated = _op("Sub", [source, step])
    _write(param_out, updated)
    if multi_precision:
        _write(master_param_out, updated)
    _write(moment1_out, m1)
    _write(moment2_out, m2)
    if not use_global_beta_pow:
        for out, value in ((beta1_pow_out, pow1 * b1), (beta2_pow_out, pow2 * b2)):
            _fill(out, value)


def _scalar(value) -> np.ndarray:
    """A float32 0-d host input (run_op copies it to the device)."""
    return np.array(value, np.float32)


def _fill_like(dev, shape, value, dtype=np.float32) -> Array:
    return asarray(np.full(shape, value, dtype), dev)


def contiguous(dev, x, out):
    _write(out, _op("Identity", [x]))  # a strided input is made compact by run_op or the kernel


def _fill(out, value) -> None:
    if out is not None and out.size:
        host = np.full(out.shape, value, dtype=out.dtype)
        out.buffer.copy_from_host(host.reshape(-1).view(np.uint8), offset=out.offset)  # bytes: bfloat16 has no buffer format


def full(dev, shape, value, dtype, out):
    _fill(out, value)


def full_like(dev, x, value, dtype, out):
    _fill(out, value)


KERNELS = {
    **{name: _unary(op) for name, op in UNARY.items()},
    **{name: _unary_grad(gradient) for name, gradient in UNARY_GRADS.items()},
    **{name: _binary(op) for name, op in BINARY.items()},
    "sum": reduce_sum,
    **{fn.__name__: fn for fn in (
        square, not_equal, cast, concat, split_with_num, add_grad, subtract_grad, multiply_grad, divide_grad, gelu, gelu_grad, scale, sum_grad,
        transpose, transpose_grad, matmul, matmul_grad, softmax, softmax_grad, cross_entropy_with_softmax,
        cross_entropy_with_softmax_grad, mean_all, mean_all_grad, mean, mean_grad, sgd, contiguous, full, full_like, layer_norm,
        layer_norm_grad, conv2d, conv2d_grad, adam, batch_norm, batch_norm_grad, pool2d, pool2d_grad, embedding,
        embedding_grad, dropout, dropout_grad, max_pool2d_with_index, max_pool2d_with_index_grad)},
}
