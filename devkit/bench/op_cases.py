"""The cases devkit-bench ops times (OpBench), and the NumPy forms they are checked against."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

import numpy as np

MI = 1 << 20


@dataclasses.dataclass
class OpBench:
    name: str
    op: str
    inputs: Callable[[np.random.Generator], list[np.ndarray]]
    numpy: Callable[..., np.ndarray]
    attrs: dict = dataclasses.field(default_factory=dict)
    memory_bound: bool = False  # report GB/s: the inputs read and the output written
    blas: bool = False  # NumPy runs it through its BLAS (its threads), not on one core


def _f32(rng, *shape):
    return rng.standard_normal(shape, dtype=np.float32)


def _softmax(x, axis=-1):
    e = np.exp(x - x.max(axis=axis, keepdims=True))
    return e / e.sum(axis=axis, keepdims=True)


def _layer_norm(x, scale, bias, eps=1e-5):
    mean = x.mean(-1, keepdims=True)
    var = ((x - mean) ** 2).mean(-1, keepdims=True)
    return (x - mean) / np.sqrt(var + eps) * scale + bias


def _sigmoid(x):
    return 1 / (1 + np.exp(-x))


def _gelu(x):
    """NumPy's Gelu, the tanh form: NumPy has no erf, and math.erf per element
    would time Python. devkit and onnxruntime run the op's default erf form,
    so max |diff| is the forms' difference (~5e-4)."""
    return 0.5 * x * (1 + np.tanh(np.float32(0.7978845608) * (x + np.float32(0.044715) * x * x * x)))
