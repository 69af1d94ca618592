"""The gradient ops against numerical differentiation.

Each gradient op (and devkit.ops.training's matmul_grad and gemm_grad) runs on
the cpu plugin in float64 and is compared with central differences of its
forward op's float64 NumPy reference (the op spec's): for the scalar
L = sum(dY * forward(inputs)), dL/dx_i is (L(x + h e_i) - L(x - h e_i)) / 2h
with h = 1e-6 * max(1, |x_i|).

Tolerance: |analytic - numeric| <= 1e-7 * (1 + max |numeric|) per input,
normwise. Central differences carry a truncation error O(h^2) and a rounding
error ~ 1e-16 |L| / h, about 1e-9 relative here (measured at most 9e-10);
a wrong formula is off by O(1). Inputs stay away from the ops' kinks (ReLU at
0, MaxPool ties), where no derivative exists.
"""

from __future__ import annotations

import numpy as np
import pytest

import devkit
from devkit import ops
from devkit.ops.dispatch import resolve_attrs
from devkit.ops.training import gemm_grad, matmul_grad

RTOL = 1e-7


@pytest.fixture(scope="module")
def dev():
    return devkit.device("cpu:0")


def _rng(name: str) -> np.random.Generator:
    return ops.testing.rng_for("test_gradients", name)


def reference(op: str, inputs: list, attrs: dict | None = None) -> list[np.ndarray]:
    """The float64 NumPy reference of ``op``, attributes defaulted as run_op does."""
    spec = ops.get(op)
    full = resolve_attrs(spec, {k: v for k, v in (attrs or {}).items() if k not in spec.host_inputs})
    full.update({k: np.asarray(v) for k, v in (attrs or {}).items() if k in spec.host_inputs})
    return spec.reference(inputs, full)


def numeric_gradient(loss, inputs: list, index: int) -> np.ndarray:
    """d loss(inputs) / d inputs[index], by central differences."""
    values = [np.array(v, dtype=np.float64) if v is not None and np.asarray(v).dtype.kind == "f" else v
              for v in inputs]
    x = values[index]
    grad = np.zeros_like(x)
    for i in np.ndindex(x.shape):
        original = x[i]
        h = 1e-6 * max(1.0, abs(original))
        x[i] = original + h
        up = loss(values)
        x[i] = original - h
        down = loss(values)
        x[i] = original
        grad[i] = (up - down) / (2 * h)
    return grad


def assert_gradient(analytic, numeric, what: str) -> None:
    analytic = np.asarray(analytic, np.float64)
    assert analytic.shape == numeric.shape, f"{what}: shape {analytic.shape}, expected {numeric.shape}"
    scale = 1.0 + float(np.max(np.abs(numeric), initial=0.0))
    error = float(np.max(np.abs(analytic - numeric), initial=0.0))
    assert error <= RTOL * scale, f"{what}: max error {error:.3g} exceeds {RTOL} * {scale:.3g}"


def run(op: str, inputs: list, attrs: dict | None = None) -> list[np.ndarray]:
    return [out.numpy() for out in devkit.run_op(op, inputs, attrs or {}, device="cpu:0")]


def check(forward: str, grad_op: str, forward_inputs: list, wrt: list[int], grad_inputs, attrs=None,
          grad_attrs=None, output: int = 0, rng=None) -> None:
    """grad_op's outputs (in order) are the gradients of forward's inputs
    ``wrt`` for L = sum(dY * forward output ``output``); ``grad_inputs(dy)``
    builds grad_op's inputs."""
    y = reference(forward, forward_inputs, attrs)[output]
    dy = rng.uniform(-1.0, 1.0, np.shape(y))
    got = run(grad_op, grad_inputs(dy), grad_attrs if grad_attrs is not None else attrs)
    for result, index in zip(got, wrt):
        numeric = numeric_gradient(lambda v: float(np.sum(dy * reference(forward, v, attrs)[output])),
                                   forward_inputs, index)
        assert_gradient(result, numeric, f"{grad_op} d{index}")


def away_from_zero(rng, *shape, margin=0.05) -> np.ndarray:
    """Uniform in [-3, 3] with |x| >= margin."""
    x = rng.uniform(-3.0, 3.0, shape)
    return np.where(np.abs(x) < margin, np.copysign(margin, x) + x, x)


# -- pointwise activations ------------------------------------------------------------------------

@pytest.mark.parametrize("forward, grad_op, takes_output, attrs", [
    ("Relu", "ReluGrad", False, {}),
    ("LeakyRelu", "LeakyReluGrad", False, {}),
    ("LeakyRelu", "LeakyReluGrad", False, {"alpha": -1.5}),
    ("Sigmoid", "SigmoidGrad", True, {}),
    ("Tanh", "TanhGrad", True, {}),
    ("Gelu", "GeluGrad", False, {}),
    ("Gelu", "GeluGrad", False, {"approximate": "tanh"}),
])
def test_pointwise(forward, grad_op, takes_output, attrs):
    rng = _rng(f"{grad_op}{attrs}")
    x = away_from_zero(rng, 3, 7)
    second = reference(forward, [x], attrs)[0] if takes_output else x
    check(forward, grad_op, [x], [0], lambda dy: [dy, second], attrs, rng=rng)


@pytest.mark.parametrize("forward, grad_op", [("Softmax", "SoftmaxGrad"), ("LogSoftmax", "LogSoftmaxGrad")])
@pytest.mark.parametrize("axis", [-1, 0, 1])
def test_softmax(forward, grad_op, axis):
    rng = _rng(f"{grad_op}{axis}")
    x = rng.uniform(-3.0, 3.0, (3, 4, 5))
    y = reference(forward, [x], {"axis": axis})[0]
    check(forward, grad_op, [x], [0], lambda dy: [dy, y], {"axis": axis}, rng=rng)


# -- convolution and pooling ------------------------------------------------------------------------

@pytest.mark.parametrize("x_shape, w_shape, attrs", [
    ((2, 3, 6, 5), (4, 3, 3, 2), {"pads": [1, 0, 1, 1]}),
    ((1, 2, 7, 7), (3, 2, 3, 3), {"strides": [2, 2], "dilations": [1, 2]}),
    ((2, 4, 5, 5), (6, 2, 3, 3), {"group": 2, "auto_pad": "SAME_UPPER"}),
    ((1, 3, 6, 6), (3, 1, 2, 2), {"group": 3, "auto_pad": "SAME_LOWER", "strides": [2, 2]}),
    ((2, 2, 9), (3, 2, 3), {"strides": [2], "pads": [2, 1], "dilations": [2]}),
    ((1, 2, 4, 3, 4), (2, 2, 2, 2, 2), {"pads": [1, 0, 1, 0, 1, 1], "strides": [1, 2, 1]}),
])
def test_conv(x_shape, w_shape, attrs):
    rng = _rng(f"ConvGrad{x_shape}{attrs}")
    x, w, b = rng.uniform(-1, 1, x_shape), rng.uniform(-1, 1, w_shape), rng.uniform(-1, 1, w_shape[0])
    check("Conv", "ConvGrad", [x, w, b], [0, 1, 2], lambda dy: [dy, x, w], attrs, rng=rng)


@pytest.mark.parametrize("shape, attrs", [
    ((2, 3, 6, 6), {"kernel_shape": [2, 2], "strides": [2, 2]}),
    ((1, 2, 7, 6), {"kernel_shape": [3, 3], "pads": [1, 1, 1, 1]}),
    ((1, 2, 5, 7), {"kernel_shape": [2, 3], "strides": [1, 2], "pads": [1, 1, 0, 1], "storage_order": 1}),
    ((2, 2, 11), {"kernel_shape": [3], "strides": [2], "dilations": [2]}),
    ((1, 1, 4, 5, 4), {"kernel_shape": [2, 2, 2], "ceil_mode": 1, "strides": [2, 2, 2]}),
])
def test_max_pool(shape, attrs):
    rng = _rng(f"MaxPoolGrad{shape}{attrs}")
    # Distinct values a few differentiation steps apart: no ties, no swaps.
    x = rng.permutation(np.arange(np.prod(shape), dtype=np.float64)).reshape(shape) * 1e-3
    indices = reference("MaxPool", [x], attrs)[1]
    order = {"storage_order": attrs.get("storage_order", 0)}
    check("MaxPool", "MaxPoolGrad", [x], [0], lambda dy: [dy, indices, np.array(shape)], attrs,
          grad_attrs=order, rng=rng)


@pytest.mark.parametrize("shape, attrs", [
    ((2, 3, 6, 6), {"kernel_shape": [2, 2], "strides": [2, 2]}),
    ((1, 2, 7, 6), {"kernel_shape": [3, 3], "pads": [1, 1, 1, 1]}),
    ((1, 2, 7, 6), {"kernel_shape": [3, 3], "pads": [1, 1, 1, 1], "count_include_pad": 1}),
    ((1, 2, 5, 6), {"kernel_shape": [2, 3], "strides": [2, 2], "ceil_mode": 1}),
    ((1, 1, 7, 6), {"kernel_shape": [3, 2], "strides": [2, 2], "auto_pad": "SAME_LOWER", "count_include_pad": 1}),
    ((2, 2, 11), {"kernel_shape": [3], "strides": [2], "dilations": [2], "pads": [1, 2]}),
    ((1, 1, 4, 5, 4), {"kernel_shape": [2, 2, 2], "strides": [2, 1, 2], "pads": [1, 0, 1, 0, 1, 1]}),
])
def test_average_pool(shape, attrs):
    rng = _rng(f"AveragePoolGrad{shape}{attrs}")
    x = rng.uniform(-1, 1, shape)
    check("AveragePool", "AveragePoolGrad", [x], [0], lambda dy: [dy, np.array(shape)], attrs, rng=rng)


# -- normalizations -----------------------------------------------------------------------------------

@pytest.mark.parametrize("shape", [(4, 3, 2, 3), (6, 5), (7,)])
def test_batch_normalization(shape):
    rng = _rng(f"BatchNormalizationGrad{shape}")
    c = shape[1] if len(shape) > 1 else 1
    x, scale, bias = rng.uniform(-2, 2, shape), rng.uniform(0.5, 2, c), rng.uniform(-1, 1, c)
    running = [rng.uniform(-1, 1, c), rng.uniform(0.5, 2, c)]
    attrs = {"training_mode": 1, "epsilon": 0.01}
    axes = (0,) + tuple(range(2, len(shape)))
    mean = x.mean(axis=axes).reshape(c)
    inv_std = (1 / np.sqrt(x.var(axis=axes) + 0.01)).reshape(c)
    check("BatchNormalization", "BatchNormalizationGrad", [x, scale, bias, *running], [0, 1, 2],
          lambda dy: [dy, x, scale, mean, inv_std], attrs, grad_attrs={}, rng=rng)


@pytest.mark.parametrize("shape, axis, scale_shape", [
    ((4, 6), -1, (6,)),
    ((2, 3, 4), 1, (3, 4)),
    ((2, 3, 4), 1, (3, 1)),
    ((3, 5), 1, (3, 5)),
])
def test_layer_normalization(shape, axis, scale_shape):
    rng = _rng(f"LayerNormalizationGrad{shape}{axis}{scale_shape}")
    x, scale, bias = rng.uniform(-2, 2, shape), rng.uniform(0.5, 2, scale_shape), rng.uniform(-1, 1, scale_shape)
    attrs = {"axis": axis, "epsilon": 0.01}
    _, mean, inv_std = reference("LayerNormalization", [x, scale, bias], attrs)
    check("LayerNormalization", "LayerNormalizationGrad", [x, scale, bias], [0, 1, 2],
          lambda dy: [dy, x, scale, mean, inv_std], attrs, grad_attrs={"axis": axis}, rng=rng)


@pytest.mark.parametrize("shape, axis, scale_shape", [((4, 6), -1, (6,)), ((2, 3, 4), 1, (3, 1)), ((3, 5), 0, (3, 5))])
def test_rms_normalization(shape, axis, scale_shape):
    rng = _rng(f"RMSNormalizationGrad{shape}{axis}{scale_shape}")
    x, scale = rng.uniform(-2, 2, shape), rng.uniform(0.5, 2, scale_shape)
    attrs = {"axis": axis, "epsilon": 0.01}
    check("RMSNormalization", "RMSNormalizationGrad", [x, scale], [0, 1], lambda dy: [dy, x, scale], attrs,
          rng=rng)


# -- the loss --------------------------------------------------------------------------------------------

@pytest.mark.parametrize("scores_shape, attrs, weighted", [
    ((5, 4), {}, False),
    ((5, 4), {"reduction": "sum"}, True),
    ((3, 4, 2), {"reduction": "none"}, True),
    ((4, 3, 2, 2), {"ignore_index": 1}, True),
    ((4, 3, 2, 2), {"ignore_index": 1, "reduction": "none"}, False),
])
def test_softmax_cross_entropy(scores_shape, attrs, weighted):
    rng = _rng(f"SoftmaxCrossEntropyLossGrad{scores_shape}{attrs}{weighted}")
    scores = rng.uniform(-3, 3, scores_shape)
    labels = rng.integers(0, scores_shape[1], (scores_shape[0],) + scores_shape[2:])
    weights = [rng.uniform(0.2, 2, scores_shape[1])] if weighted else []
    log_prob = reference("SoftmaxCrossEntropyLoss", [scores, labels, *weights], attrs)[1]
    check("SoftmaxCrossEntropyLoss", "SoftmaxCrossEntropyLossGrad", [scores, labels, *weights], [0],
          lambda dy: [dy, log_prob, labels, *weights], attrs, rng=rng)


# -- MatMul and Gemm, composed of forward ops ---------------------------------------------------------------

@pytest.mark.parametrize("a_shape, b_shape", [
    ((3, 4), (4, 5)),
    ((2, 3, 4), (4, 5)),
    ((2, 1, 3, 4), (3, 4, 2)),
    ((4,), (4, 3)),
    ((2, 3, 4), (4,)),
    ((4,), (4,)),
])
def test_matmul(dev, a_shape, b_shape):
    rng = _rng(f"matmul_grad{a_shape}{b_shape}")
    a, b = rng.uniform(-1, 1, a_shape), rng.uniform(-1, 1, b_shape)
    dy = rng.uniform(-1, 1, np.matmul(a, b).shape)
    got = matmul_grad(devkit.asarray(a, dev), devkit.asarray(b, dev), devkit.asarray(dy, dev))
    for result, index in zip(got, (0, 1)):
        numeric = numeric_gradient(lambda v: float(np.sum(dy * np.matmul(v[0], v[1]))), [a, b], index)
        assert_gradient(result.numpy(), numeric, f"matmul_grad d{'AB'[index]}")


@pytest.mark.parametrize("trans_a, trans_b", [(0, 0), (0, 1), (1, 0), (1, 1)])
@pytest.mark.parametrize("c_shape", [None, (5,), (3, 1), (3, 5), ()])
def test_gemm(dev, trans_a, trans_b, c_shape):
    rng = _rng(f"gemm_grad{trans_a}{trans_b}{c_shape}")
    a = rng.uniform(-1, 1, (4, 3) if trans_a else (3, 4))
    b = rng.uniform(-1, 1, (5, 4) if trans_b else (4, 5))
    c = rng.uniform(-1, 1, c_shape) if c_shape is not None else None
    attrs = {"alpha": 0.75, "beta": 1.5, "transA": trans_a, "transB": trans_b}
    inputs = [a, b] + ([c] if c is not None else [])
    dy = rng.uniform(-1, 1, (3, 5))
    device_inputs = [devkit.asarray(v, dev) for v in inputs] + [None] * (3 - len(inputs))
    got = gemm_grad(*device_inputs, devkit.asarray(dy, dev), alpha=0.75, beta=1.5, transA=trans_a, transB=trans_b)
    for index in range(len(inputs)):
        numeric = numeric_gradient(lambda v: float(np.sum(dy * reference("Gemm", v, attrs)[0])), inputs, index)
        assert_gradient(got[index].numpy(), numeric, f"gemm_grad d{'ABC'[index]}")
    if c is None:
        assert got[2] is None


# -- data-dependent errors -------------------------------------------------------------------------------

def test_label_out_of_range():
    scores = np.zeros((2, 3))
    with pytest.raises(devkit.OutOfRangeError, match=r"label 3 \(element 1 of labels\) is out of range for 3"):
        run("SoftmaxCrossEntropyLoss", [scores, np.array([0, 3])])
    with pytest.raises(devkit.OutOfRangeError, match=r"label -1 \(element 0 of labels\)"):
        run("SoftmaxCrossEntropyLossGrad", [np.ones(()), scores, np.array([-1, 0])], {"ignore_index": 2})


def test_max_pool_index_out_of_range():
    dy, indices = np.ones((1, 1, 2, 2)), np.array([0, 1, 16, 2]).reshape(1, 1, 2, 2)
    with pytest.raises(devkit.OutOfRangeError, match=r"index 16 \(element 2 of Indices\) is out of range"):
        run("MaxPoolGrad", [dy, indices, np.array([1, 1, 4, 4])])
