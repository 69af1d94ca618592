"""Training regression: two small models trained for 20 steps on the plugin under test.

Forward pass, backward pass and optimizer update are all devkit ops run on the
plugin: an MLP (MatMul + Add, Relu, SoftmaxCrossEntropyLoss; Adam) and a
small CNN (Conv, Relu, MaxPool, Reshape, Gemm, SoftmaxCrossEntropyLoss;
Momentum with weight decay). The same 20 steps are computed by hand in
float64 NumPy here -- forward, backward and ONNX's update rules, written
independently of the op specs -- on the same seeded data and initial weights.

At every step the loss, and at the end every weight tensor, must match the
reference: |loss - ref| <= rtol * |ref| and max |w - ref| <= rtol * max |ref|
per tensor. Float32 on the device is held to rtol 1e-5 (measured on the cpu
plugin: at most 4.9e-7 on the losses and 4.8e-7 on the weights; the margin
leaves room for plugins that compute in float32 where the cpu plugin uses
float64); float64 to 1e-12 (measured 3.7e-15). The loss curves, the device's
and the reference's, go into the report (record_property).
"""

from __future__ import annotations

import numpy as np
import pytest

import devkit
from devkit import ops
from devkit.ops.spec import dtype_name
from devkit.ops.training import gemm_grad, matmul_grad

STEPS = 20
RTOL = {"float32": 1e-5, "float64": 1e-12}

MLP_OPS = ("MatMul", "Add", "Relu", "SoftmaxCrossEntropyLoss", "SoftmaxCrossEntropyLossGrad", "ReluGrad",
           "Transpose", "ReduceSum", "Reshape", "Adam")
CNN_OPS = ("Conv", "Relu", "MaxPool", "Reshape", "Gemm", "SoftmaxCrossEntropyLoss", "SoftmaxCrossEntropyLossGrad",
           "ReduceSum", "MaxPoolGrad", "ReluGrad", "ConvGrad", "Momentum")

ADAM = {"alpha": 0.9, "beta": 0.999, "epsilon": 1e-6}
ADAM_RATE = 0.02
MOMENTUM = {"alpha": 0.9, "beta": 1.0, "mode": "standard", "norm_coefficient": 1e-3}
MOMENTUM_RATE = 0.05


def _require(dev: devkit.Device, names, dtype) -> None:
    with ops.cpu_fallback(False):
        missing = [name for name in names if ops.explain(name, dtype, dev).how == "unsupported"]
    if missing:
        pytest.skip(reason=f"plugin '{dev.plugin.name}' has no {dtype_name(dtype)} kernel for "
                           f"{', '.join(missing)} (not claimed) and no decomposition into its kernels")


def _run(op, inputs, attrs=None):
    return devkit.run_op(op, inputs, attrs or {})


# -- the float64 NumPy reference --------------------------------------------------------------------

def _log_softmax(logits):
    shifted = logits - logits.max(axis=1, keepdims=True)
    return shifted - np.log(np.exp(shifted).sum(axis=1, keepdims=True))


def _cross_entropy(logits, labels):
    """Mean loss and d loss / d logits."""
    log_prob = _log_softmax(logits)
    rows = np.arange(len(labels))
    grad = np.exp(log_prob)
    grad[rows, labels] -= 1.0
    return -log_prob[rows, labels].mean(), grad / len(labels)


def _adam(params, grads, v, h, step):
    """ONNX Adam (norm coefficients 0) at update count ``step``."""
    alpha, beta, eps = ADAM["alpha"], ADAM["beta"], ADAM["epsilon"]
    rate = ADAM_RATE * np.sqrt(1 - beta ** step) / (1 - alpha ** step)
    for i, g in enumerate(grads):
        v[i] = alpha * v[i] + (1 - alpha) * g
        h[i] = beta * h[i] + (1 - beta) * g * g
        params[i] = params[i] - rate * (v[i] / (np.sqrt(h[i]) + eps))


def _momentum(params, grads, v, step):
    """ONNX Momentum, standard mode, at update count ``step``."""
    for i, g in enumerate(grads):
        g = MOMENTUM["norm_coefficient"] * params[i] + g
        v[i] = MOMENTUM["alpha"] * v[i] + (MOMENTUM["beta"] if step > 0 else 1.0) * g
        params[i] = params[i] - MOMENTUM_RATE * v[i]


def mlp_reference(x, labels, params):
    params = [p.astype(np.float64) for p in params]
    v, h = [np.zeros_like(p) for p in params], [np.zeros_like(p) for p in params]
    losses = []
    for step in range(STEPS):
        w1, b1, w2, b2 = params
        pre = x @ w1 + b1
        hidden = np.maximum(pre, 0.0)
        loss, dlogits = _cross_entropy(hidden @ w2 + b2, labels)
        losses.append(loss)
        dhidden = dlogits @ w2.T
        dpre = np.where(pre > 0, dhidden, 0.0)
        _adam(params, [x.T @ dpre, dpre.sum(0), hidden.T @ dlogits, dlogits.sum(0)], v, h, step + 1)
    return losses, params


def _conv3x3(x, w, b):
    """Conv with pads 1, stride 1: (N, C, H, W) * (M, C, 3, 3) -> (N, M, H, W); and the padded x."""
    padded = np.pad(x, [(0, 0), (0, 0), (1, 1), (1, 1)])
    height, width = x.shape[2:]
    y = np.zeros((x.shape[0], w.shape[0], height, width)) + b[:, None, None]
    for i in range(3):
        for j in range(3):
            y += np.einsum("nchw,mc->nmhw", padded[:, :, i:i + height, j:j + width], w[:, :, i, j])
    return y, padded


def cnn_reference(x, labels, params):
    params = [p.astype(np.float64) for p in params]
    v = [np.zeros_like(p) for p in params]
    losses = []
    for step in range(STEPS):
        w1, b1, w2, b2 = params
        conv, padded = _conv3x3(x, w1, b1)
        act = np.maximum(conv, 0.0)
        n, m, height, width = act.shape
        # 2x2 windows, stride 2; the first maximum in row-major window order wins.
        windows = act.reshape(n, m, height // 2, 2, width // 2, 2).transpose(0, 1, 2, 4, 3, 5).reshape(
            n, m, height // 2, width // 2, 4)
        best = windows.argmax(axis=-1)
        flat = windows.max(axis=-1).reshape(n, -1)
        loss, dlogits = _cross_entropy(flat @ w2.T + b2, labels)
        losses.append(loss)
        dwindows = np.zeros_like(windows)
        np.put_along_axis(dwindows, best[..., None], (dlogits @ w2).reshape(best.shape + (1,)), axis=-1)
        dact = dwindows.reshape(n, m, height // 2, width // 2, 2, 2).transpose(0, 1, 2, 4, 3, 5).reshape(act.shape)
        dconv = np.where(conv > 0, dact, 0.0)
        dw1 = np.zeros_like(w1)
        for i in range(3):
            for j in range(3):
                dw1[:, :, i, j] = np.einsum("nmhw,nchw->mc", dconv, padded[:, :, i:i + height, j:j + width])
        _momentum(params, [dw1, dconv.sum((0, 2, 3)), dlogits.T @ flat, dlogits.sum(0)], v, step)
    return losses, params


# -- the same steps on the device ------------------------------------------------------------------------

def mlp_on_device(dev, dtype, x, labels, params):
    x, labels = devkit.asarray(x.astype(dtype), dev), devkit.asarray(labels, dev)
    params = [devkit.asarray(p.astype(dtype), dev) for p in params]
    state = [devkit.asarray(np.zeros(p.shape, dtype), dev) for p in params] * 2
    seed = np.array(1.0, dtype)
    losses = []
    for step in range(STEPS):
        w1, b1, w2, b2 = params
        (pre,) = _run("Add", [_run("MatMul", [x, w1])[0], b1])
        (hidden,) = _run("Relu", [pre])
        (logits,) = _run("Add", [_run("MatMul", [hidden, w2])[0], b2])
        loss, log_prob = _run("SoftmaxCrossEntropyLoss", [logits, labels])
        losses.append(float(loss.numpy()))
        (dlogits,) = _run("SoftmaxCrossEntropyLossGrad", [seed, log_prob, labels])
        dhidden, dw2 = matmul_grad(hidden, w2, dlogits)
        (dpre,) = _run("ReluGrad", [dhidden, pre])
        _, dw1 = matmul_grad(x, w1, dpre)
        sums = [_run("ReduceSum", [d, np.array([0])], {"keepdims": 0})[0] for d in (dpre, dlogits)]
        grads = [dw1, sums[0], dw2, sums[1]]
        outputs = _run("Adam", [np.array(ADAM_RATE, dtype), np.array(step + 1), *params, *grads, *state], ADAM)
        params, state = outputs[:4], outputs[4:]
    return losses, [p.numpy() for p in params]


def cnn_on_device(dev, dtype, x, labels, params):
    x, labels = devkit.asarray(x.astype(dtype), dev), devkit.asarray(labels, dev)
    params = [devkit.asarray(p.astype(dtype), dev) for p in params]
    state = [devkit.asarray(np.zeros(p.shape, dtype), dev) for p in params]
    seed = np.array(1.0, dtype)
    conv_attrs, pool_attrs = {"pads": [1, 1, 1, 1]}, {"kernel_shape": [2, 2], "strides": [2, 2]}
    losses = []
    for step in range(STEPS):
        w1, b1, w2, b2 = params
        (conv,) = _run("Conv", [x, w1, b1], conv_attrs)
        (act,) = _run("Relu", [conv])
        pooled, indices = _run("MaxPool", [act], pool_attrs)
        (flat,) = _run("Reshape", [pooled, np.array([pooled.shape[0], -1])])
        (logits,) = _run("Gemm", [flat, w2, b2], {"transB": 1})
        loss, log_prob = _run("SoftmaxCrossEntropyLoss", [logits, labels])
        losses.append(float(loss.numpy()))
        (dlogits,) = _run("SoftmaxCrossEntropyLossGrad", [seed, log_prob, labels])
        dflat, dw2, db2 = gemm_grad(flat, w2, b2, dlogits, transB=1)
        (dpooled,) = _run("Reshape", [dflat, np.array(pooled.shape)])
        (dact,) = _run("MaxPoolGrad", [dpooled, indices, np.array(act.shape)])
        (dconv,) = _run("ReluGrad", [dact, conv])
        _, dw1, db1 = _run("ConvGrad", [dconv, x, w1], conv_attrs)
        outputs = _run("Momentum", [np.array(MOMENTUM_RATE, dtype), np.array(step), *params,
                                    dw1, db1, dw2, db2, *state], MOMENTUM)
        params, state = outputs[:4], outputs[4:]
    return losses, [p.numpy() for p in params]


# -- the cases ---------------------------------------------------------------------------------------------

def _mlp_problem():
    rng = np.random.default_rng(20240601)
    x = rng.normal(size=(32, 10))
    labels = np.argmax(x @ rng.normal(size=(10, 4)) + 0.5 * rng.normal(size=(32, 4)), axis=1).astype(np.int64)
    params = [rng.normal(size=(10, 16)) / np.sqrt(10), rng.normal(size=16) * 0.1,
              rng.normal(size=(16, 4)) / 4, rng.normal(size=4) * 0.1]
    return x, labels, params


def _cnn_problem():
    rng = np.random.default_rng(20240602)
    labels = rng.integers(0, 3, 8).astype(np.int64)
    # A bright 3x3 patch whose position says the class, on noise.
    x = rng.normal(scale=0.3, size=(8, 1, 8, 8))
    for n, label in enumerate(labels):
        x[n, 0, 1 + 2 * label:4 + 2 * label, 2:5] += 1.0
    params = [rng.normal(size=(4, 1, 3, 3)) / 3, rng.normal(size=4) * 0.1,
              rng.normal(size=(3, 64)) / 8, rng.normal(size=3) * 0.1]
    return x, labels, params


MODELS = {
    "mlp": (_mlp_problem, mlp_reference, mlp_on_device, MLP_OPS),
    "cnn": (_cnn_problem, cnn_reference, cnn_on_device, CNN_OPS),
}


@pytest.mark.parametrize("dtype", ["float32", "float64"])
@pytest.mark.parametrize("model", sorted(MODELS))
def test_training_matches_reference(dev, model, dtype, record_property):
    problem, reference, on_device, needed = MODELS[model]
    _require(dev, needed, np.dtype(dtype))
    x, labels, params = problem()
    want_losses, want_params = reference(x, labels, params)
    got_losses, got_params = on_device(dev, np.dtype(dtype), x, labels, params)

    loss_errors = [abs(g - w) / abs(w) for g, w in zip(got_losses, want_losses)]
    weight_errors = [float(np.max(np.abs(g - w)) / np.max(np.abs(w))) for g, w in zip(got_params, want_params)]
    record_property("model", model)
    record_property("dtype", dtype)
    record_property("loss_curve", [round(v, 7) for v in got_losses])
    record_property("reference_loss_curve", [round(float(v), 7) for v in want_losses])
    record_property("max_loss_rel_error", max(loss_errors))
    record_property("max_weight_rel_error", max(weight_errors))
    record_property("tolerance", f"rtol {RTOL[dtype]:g}")
    assert want_losses[-1] < 0.8 * want_losses[0], "the reference should learn: its loss barely moved"
    bad = [f"step {i}: loss {g!r}, reference {w!r}" for i, (g, w, e) in
           enumerate(zip(got_losses, want_losses, loss_errors)) if not e <= RTOL[dtype]]
    assert not bad, f"{model} losses beyond rtol {RTOL[dtype]:g}: " + "; ".join(bad)
    names = ("W1", "b1", "W2", "b2")
    bad = [f"{name}: {e:.3g}" for name, e in zip(names, weight_errors) if not e <= RTOL[dtype]]
    assert not bad, f"{model} final weights beyond rtol {RTOL[dtype]:g} (max abs error / max abs value): " + \
        ", ".join(bad)
