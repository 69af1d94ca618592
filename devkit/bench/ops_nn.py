"""The neural-network cases of devkit-bench ops: row kernels (Softmax,
LogSoftmax, LayerNormalization, RMSNormalization), pools, BatchNormalization
and convolutions at ResNet shapes.

ops.BENCHMARKS takes NN_BENCHMARKS as its last block; `devkit-bench ops
--only MaxPool,Conv` runs a part of it.
"""

from __future__ import annotations

import numpy as np

from .op_cases import OpBench, _f32, _layer_norm, _softmax


def _log_softmax(x, axis=-1):
    shifted = x - x.max(axis=axis, keepdims=True)
    return shifted - np.log(np.exp(shifted).sum(axis=axis, keepdims=True))


def _rms_norm(x, scale, eps=1e-5):
    return x / np.sqrt((x * x).mean(-1, keepdims=True) + eps) * scale


def _windows(x, kernel, stride, pads, dilation=(1, 1), fill=0.0):
    """(N, C, OH, OW, KH, KW) views of the padded NCHW x under a 2-D window."""
    padded = np.pad(x, ((0, 0), (0, 0), (pads[0], pads[2]), (pads[1], pads[3])), constant_values=fill)
    span = [(k - 1) * d + 1 for k, d in zip(kernel, dilation)]
    views = np.lib.stride_tricks.sliding_window_view(padded, span, axis=(2, 3))
    return views[:, :, ::stride[0], ::stride[1], ::dilation[0], ::dilation[1]]


def _conv(kernel, stride=(1, 1), pads=(0, 0, 0, 0)):
    """NumPy Conv (no bias, group 1) as window views @ weights."""
    def conv(x, w):
        cols = _windows(x, kernel, stride, pads)
        return np.einsum("nchwij,mcij->nmhw", cols, w, optimize=True)
    return conv


def _max_pool(kernel, stride, pads):
    return lambda x: _windows(x, kernel, stride, pads, fill=-np.inf).max(axis=(4, 5))


def _average_pool(kernel, stride, pads):
    """count_include_pad 0: the padded taps are left out of the count."""
    def pool(x):
        sums = _windows(x, kernel, stride, pads).sum(axis=(4, 5))
        counts = _windows(np.ones_like(x[:1, :1]), kernel, stride, pads).sum(axis=(4, 5))
        return sums / counts
    return pool


def _batch_norm(x, scale, bias, mean, var, eps=1e-5):
    shape = (1, -1) + (1,) * (x.ndim - 2)
    return (x - mean.reshape(shape)) / np.sqrt(var.reshape(shape) + eps) * scale.reshape(shape) + bias.reshape(shape)


def _conv_transpose_s2(x, w):
    """ConvTranspose 3x3, stride 2, pads 1, output_padding 1 (NumPy scatter of taps)."""
    n, c, h, wd = x.shape
    m = w.shape[1]
    full = np.zeros((n, m, 2 * h + 2, 2 * wd + 2), np.float32)
    for i in range(3):
        for j in range(3):
            full[:, :, i:i + 2 * h:2, j:j + 2 * wd:2] += np.einsum("nchw,cm->nmhw", x, w[:, :, i, j])
    return full[:, :, 1:1 + 2 * h, 1:1 + 2 * wd]


def _conv_case(name, c, size, m, kernel, stride=1, pad=0):
    attrs = {"kernel_shape": [kernel, kernel], "strides": [stride, stride], "pads": [pad] * 4}
    return OpBench(name, "Conv", lambda r: [_f32(r, 1, c, size, size), _f32(r, m, c, kernel, kernel) * 0.1],
                   _conv((kernel, kernel), (stride, stride), (pad,) * 4), attrs)


def _positive(r, *shape):
    return r.random(shape, dtype=np.float32) + 0.5


NN_BENCHMARKS = [
    OpBench("Softmax 4096x4096", "Softmax", lambda r: [_f32(r, 4096, 4096)], _softmax),
    OpBench("LogSoftmax 4096x4096", "LogSoftmax", lambda r: [_f32(r, 4096, 4096)], _log_softmax),
    OpBench("Softmax 64x1024x64 axis 1", "Softmax", lambda r: [_f32(r, 64, 1024, 64)],
            lambda x: _softmax(x, 1), {"axis": 1}),
    OpBench("LayerNormalization 16384x768", "LayerNormalization",
            lambda r: [_f32(r, 16384, 768), _f32(r, 768), _f32(r, 768)], _layer_norm),
    OpBench("RMSNormalization 4096x1024", "RMSNormalization",
            lambda r: [_f32(r, 4096, 1024), _f32(r, 1024)], _rms_norm),
    OpBench("MaxPool 1x64x112x112 k3 s2 p1", "MaxPool", lambda r: [_f32(r, 1, 64, 112, 112)],
            _max_pool((3, 3), (2, 2), (1, 1, 1, 1)),
            {"kernel_shape": [3, 3], "strides": [2, 2], "pads": [1, 1, 1, 1]}),
    OpBench("AveragePool 1x64x56x56 k3 s1 p1", "AveragePool", lambda r: [_f32(r, 1, 64, 56, 56)],
            _average_pool((3, 3), (1, 1), (1, 1, 1, 1)),
            {"kernel_shape": [3, 3], "strides": [1, 1], "pads": [1, 1, 1, 1]}),
    OpBench("AveragePool 1x256x28x28 k2 s2", "AveragePool", lambda r: [_f32(r, 1, 256, 28, 28)],
            _average_pool((2, 2), (2, 2), (0, 0, 0, 0)), {"kernel_shape": [2, 2], "strides": [2, 2]}),
    OpBench("BatchNormalization 1x64x112x112", "BatchNormalization",
            lambda r: [_f32(r, 1, 64, 112, 112), _f32(r, 64), _f32(r, 64), _f32(r, 64), _positive(r, 64)],
            _batch_norm),
    _conv_case("Conv 1x64x56x56 k3 -> 64", 64, 56, 64, 3, pad=1),
    _conv_case("Conv 1x128x28x28 k3 -> 128", 128, 28, 128, 3, pad=1),
    _conv_case("Conv 1x256x14x14 k3 -> 256", 256, 14, 256, 3, pad=1),
    _conv_case("Conv 1x512x7x7 k3 -> 512", 512, 7, 512, 3, pad=1),
    _conv_case("Conv 1x3x224x224 k7 s2 -> 64", 3, 224, 64, 7, stride=2, pad=3),
    _conv_case("Conv 1x64x56x56 k3 s2 -> 128", 64, 56, 128, 3, stride=2, pad=1),
    _conv_case("Conv 1x64x56x56 k1 -> 256", 64, 56, 256, 1),
    _conv_case("Conv 1x64x56x56 k1 s2 -> 128", 64, 56, 128, 1, stride=2),
    _conv_case("Conv 1x128x28x28 k1 s2 -> 256", 128, 28, 256, 1, stride=2),
    OpBench("Conv 8x64x28x28 k3 -> 64", "Conv", lambda r: [_f32(r, 8, 64, 28, 28), _f32(r, 64, 64, 3, 3) * 0.1],
            _conv((3, 3), (1, 1), (1, 1, 1, 1)), {"kernel_shape": [3, 3], "pads": [1, 1, 1, 1]}),
    OpBench("ConvTranspose 1x64x28x28 k3 s2 -> 32", "ConvTranspose",
            lambda r: [_f32(r, 1, 64, 28, 28), _f32(r, 64, 32, 3, 3) * 0.1], _conv_transpose_s2,
            {"kernel_shape": [3, 3], "strides": [2, 2], "pads": [1, 1, 1, 1], "output_padding": [1, 1]}),
]
