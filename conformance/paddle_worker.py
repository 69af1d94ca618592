"""The paddle suite's checks of the bridge against Paddle's own CPU place, in a process of their own.

``python paddle_worker.py`` (DEVKIT_PADDLE_PLUGIN picks the plugin) runs
every case in CASES and prints one JSON object: case -> {"ok", "detail"}.
A process of its own because Paddle reads CUSTOM_DEVICE_ROOT and loads the
plugin once, at import; conformance/test_paddle.py runs it once per plugin
under test. Each op case runs forward and backward on both places from the
same inputs and compares outputs and input gradients, and checks that the op
ran on the devkit device (devkit.paddle.kernel_counts).
"""

from __future__ import annotations

import json
import sys
import traceback

import numpy as np

RTOL, ATOL = 1e-5, 1e-6
LOSS_RTOL = 1e-4
TRAINING_STEPS = 5


def _inputs(seed: int, *shapes):
    rng = np.random.default_rng(seed)
    return [rng.standard_normal(shape).astype(np.float32) for shape in shapes]


# op cases: name -> (phi kernels that must run on the device, inputs, fn(paddle, *tensors) -> tensor)
OP_CASES = {
    "relu": (("relu", "relu_grad"), _inputs(0, (4, 5)), lambda p, x: p.nn.functional.relu(x)),
    "add_broadcast": (("add", "add_grad"), _inputs(1, (3, 4), (4,)), lambda p, x, y: x + y),
    "subtract": (("subtract",), _inputs(2, (3, 4), (3, 4)), lambda p, x, y: x - y),
    "multiply": (("multiply",), _inputs(3, (3, 4), (1, 4)), lambda p, x, y: x * y),
    "matmul": (("matmul", "matmul_grad"), _inputs(4, (3, 4), (4, 5)), lambda p, x, y: p.matmul(x, y)),
    "matmul_transpose_x": (("matmul", "matmul_grad"), _inputs(5, (4, 3), (4, 5)),
                           lambda p, x, y: p.matmul(x, y, transpose_x=True)),
    "matmul_transpose_y": (("matmul", "matmul_grad"), _inputs(6, (3, 4), (5, 4)),
                           lambda p, x, y: p.matmul(x, y, transpose_y=True)),
    "matmul_batched": (("matmul", "matmul_grad"), _inputs(7, (2, 3, 4), (4, 5)), lambda p, x, y: p.matmul(x, y)),
    "linear": (("matmul", "add"), _inputs(8, (6, 4), (4, 3), (3,)),
               lambda p, x, w, b: p.nn.functional.linear(x, w, b)),
    "softmax": (("softmax", "softmax_grad"), _inputs(9, (3, 5)), lambda p, x: p.nn.functional.softmax(x)),
    "softmax_axis0": (("softmax", "softmax_grad"), _inputs(10, (3, 5)),
                      lambda p, x: p.nn.functional.softmax(x, axis=0)),
    "cross_entropy": (("cross_entropy_with_softmax", "cross_entropy_with_softmax_grad"), _inputs(11, (6, 4)),
                      lambda p, x: p.nn.functional.cross_entropy(
                          x, p.to_tensor(np.array([[0], [3], [1], [2], [3], [0]], np.int64)), reduction="none")),
    "cross_entropy_ignore_index": (("cross_entropy_with_softmax", "cross_entropy_with_softmax_grad"),
                                   _inputs(12, (4, 3)),
                                   lambda p, x: p.nn.functional.cross_entropy(
                                       x, p.to_tensor(np.array([[0], [1], [2], [1]], np.int64)),
                                       ignore_index=1, reduction="sum")),
    "mean_all": (("mean_all", "mean_all_grad"), _inputs(13, (3, 4)), lambda p, x: p._C_ops.mean_all(x)),
    "mean_reduce_all": (("mean", "mean_grad"), _inputs(16, (3, 4)), lambda p, x: p.mean(x)),
    "mean_axis": (("mean", "mean_grad"), _inputs(14, (3, 4, 2)), lambda p, x: p.mean(x, axis=1)),
    "mean_axis_keepdim": (("mean", "mean_grad"), _inputs(15, (3, 4)), lambda p, x: p.mean(x, axis=[0], keepdim=True)),
    "layer_norm": (("layer_norm", "layer_norm_grad"), _inputs(17, (4, 5), (5,), (5,)),
                   lambda p, x, w, b: p.nn.functional.layer_norm(x, [5], w, b)),
    "layer_norm_two_axes": (("layer_norm", "layer_norm_grad"), _inputs(18, (2, 3, 4), (12,)),
                            lambda p, x, w: p.nn.functional.layer_norm(x, [3, 4], w, epsilon=1e-3)),
    "conv2d": (("conv2d", "conv2d_grad"), _inputs(19, (2, 3, 6, 6), (4, 3, 3, 3)),
               lambda p, x, w: p.nn.functional.conv2d(x, w, padding=1)),
    "conv2d_strided_groups": (("conv2d", "conv2d_grad"), _inputs(20, (1, 4, 7, 7), (6, 2, 3, 3)),
                              lambda p, x, w: p.nn.functional.conv2d(x, w, stride=2, padding=[1, 0, 2, 1],
                                                                     dilation=1, groups=2)),
    **{name: ((name, f"{name}_grad"), _inputs(30 + k, (3, 4)) if name not in ("sqrt", "log") else
              [np.abs(a) + 0.5 for a in _inputs(30 + k, (3, 4))], lambda p, x, name=name: getattr(p, name)(x))
       for k, name in enumerate(("exp", "tanh", "sigmoid", "sqrt", "log", "sin", "cos", "abs", "square"))},
    "divide": (("divide", "divide_grad"), [_inputs(40, (3, 4))[0], np.abs(_inputs(41, (4,))[0]) + 0.5],
               lambda p, x, y: x / y),
    "subtract_grad": (("subtract", "subtract_grad"), _inputs(42, (2, 3), (3,)), lambda p, x, y: x - y),
    "multiply_grad": (("multiply", "multiply_grad"), _inputs(43, (2, 3), (2, 1)), lambda p, x, y: x * y),
    "gelu": (("gelu", "gelu_grad"), _inputs(44, (3, 4)), lambda p, x: p.nn.functional.gelu(x)),
    "gelu_tanh": (("gelu", "gelu_grad"), _inputs(45, (3, 4)), lambda p, x: p.nn.functional.gelu(x, approximate=True)),
    "scale": (("scale",), _inputs(46, (3, 4)), lambda p, x: p.scale(x, scale=2.5, bias=0.5)),
    "scale_bias_first": (("scale",), _inputs(47, (3, 4)),
                         lambda p, x: p.scale(x, scale=2.5, bias=0.5, bias_after_scale=False)),
    "sum_axis": (("sum", "sum_grad"), _inputs(48, (3, 4, 2)), lambda p, x: p.sum(x, axis=[0, 2])),
    "sum_all_keepdim": (("sum", "sum_grad"), _inputs(49, (3, 4)), lambda p, x: p.sum(x, keepdim=True)),
    # Paddle's transpose makes a strided view: the contiguous kernel compacts it.
    "transpose": (("contiguous",), _inputs(50, (2, 3, 4)), lambda p, x: p.transpose(x, [2, 0, 1])),
    "batch_norm": (("batch_norm", "batch_norm_grad"), _inputs(21, (4, 3, 5, 5), (3,), (3,)),
                   lambda p, x, w, b: p.nn.functional.batch_norm(x, p.zeros([3]), p.ones([3]), w, b, training=True)),
    "batch_norm_inference": (("batch_norm",), _inputs(22, (2, 3, 4, 4)),
                             lambda p, x: p.nn.functional.batch_norm(
                                 x, p.to_tensor(np.array([0.1, -0.2, 0.3], np.float32)),
                                 p.to_tensor(np.array([1.5, 0.5, 2.0], np.float32)), training=False)),
    "max_pool2d": (("pool2d", "pool2d_grad"), _inputs(23, (2, 3, 8, 8)),
                   lambda p, x: p.nn.functional.max_pool2d(x, 3, 2, padding=1)),
    "max_pool2d_ceil": (("pool2d", "pool2d_grad"), _inputs(24, (1, 2, 7, 7)),
                        lambda p, x: p.nn.functional.max_pool2d(x, 3, 2, ceil_mode=True)),
    "avg_pool2d": (("pool2d", "pool2d_grad"), _inputs(25, (2, 3, 8, 8)),
                   lambda p, x: p.nn.functional.avg_pool2d(x, 3, 2, padding=1)),
    "avg_pool2d_with_padding": (("pool2d", "pool2d_grad"), _inputs(26, (2, 3, 8, 8)),
                                lambda p, x: p.nn.functional.avg_pool2d(x, 3, 2, padding=[1, 0], exclusive=False)),
    "adaptive_avg_pool2d": (("pool2d", "pool2d_grad"), _inputs(27, (2, 3, 8, 8)),
                            lambda p, x: p.nn.functional.adaptive_avg_pool2d(x, 4)),
    "global_avg_pool2d": (("pool2d", "pool2d_grad"), _inputs(28, (2, 3, 5, 5)),
                          lambda p, x: p.nn.functional.adaptive_avg_pool2d(x, 1)),
    "adaptive_max_pool2d": (("max_pool2d_with_index", "max_pool2d_with_index_grad"), _inputs(29, (2, 3, 8, 8)),
                            lambda p, x: p.nn.functional.adaptive_max_pool2d(x, 2)),
    "embedding": (("embedding", "embedding_grad"), _inputs(56, (6, 4)),
                  lambda p, w: p.nn.functional.embedding(p.to_tensor(np.array([[1, 3, 0], [3, 3, 5]], np.int64)), w)),
    "embedding_padding_idx": (("embedding", "embedding_grad"), _inputs(57, (6, 4)),
                              lambda p, w: p.nn.functional.embedding(
                                  p.to_tensor(np.array([[1, 3, 0], [3, 3, 5]], np.int64)), w, padding_idx=3)),
}
CASES = ("places", "round_trips", "views_and_copies", "fills", "sgd_step", "adam_steps", *OP_CASES,
         "forward_ops", "batch_norm_running_statistics", "max_pool2d_mask", "dropout_training", "dropout_eval", "float16_ops", "bfloat16_ops", "float16_training", "bfloat16_training", "transpose_without_stride_kernels", "mlp_training", "cnn_training", "transformer_training", "missing_kernel_falls_back",
         "missing_kernel_is_named", "kernel_error_is_raised", "label_error_is_raised")


def _run_op_case(paddle, place: str, fn, arrays):
    paddle.set_device(place)
    tensors = [paddle.to_tensor(a, stop_gradient=False) for a in arrays]
    out = fn(paddle, *tensors)
    weights = paddle.to_tensor(np.linspace(-1, 1, out.size, dtype=np.float32).reshape(out.shape))
    (out * weights).sum().backward()
    return [out.numpy()] + [t.grad.numpy() for t in tensors]


def op_case(paddle, counts, name: str, kernels, arrays, fn) -> str:
    expected = _run_op_case(paddle, "cpu", fn, arrays)
    before = counts()
    got = _run_op_case(paddle, "devkit:0", fn, arrays)
    after = counts()
    for label, e, g in zip(["output"] + [f"grad of input {k}" for k in range(len(arrays))], expected, got):
        # atol scales with the array: a gradient that sums many terms to zero keeps their rounding
        np.testing.assert_allclose(g, e, rtol=RTOL, atol=ATOL * max(1.0, float(np.abs(e).max(initial=0))),
                                   err_msg=f"{name}: {label}")
    missing = [k for k in kernels if after.get(k, 0) <= before.get(k, 0)]
    assert not missing, f"{name}: kernels {missing} did not run on the devkit device"
    return f"{len(expected)} arrays match"


def max_pool2d_mask(paddle, counts) -> str:
    """max_pool2d's mask (return_mask): each maximum's index within its plane, int32, as Paddle CPU's."""
    x = _inputs(58, (2, 3, 7, 7))[0]
    results = []
    for place in ("cpu", "devkit:0"):
        paddle.set_device(place)
        out, mask = paddle.nn.functional.max_pool2d(paddle.to_tensor(x), 3, 2, padding=1, return_mask=True)
        results.append((out.numpy(), mask.numpy(), mask.dtype))
    (out_cpu, mask_cpu, dtype_cpu), (out_dk, mask_dk, dtype_dk) = results
    np.testing.assert_array_equal(out_dk, out_cpu)
    np.testing.assert_array_equal(mask_dk, mask_cpu)
    assert dtype_dk == dtype_cpu, (dtype_dk, dtype_cpu)
    return f"{mask_dk.size} indices equal"


def batch_norm_running_statistics(paddle, counts) -> str:
    """BatchNorm2D's running mean and variance after two training steps, and its eval output with
    them, as Paddle CPU's."""
    x = _inputs(54, (4, 3, 5, 5))[0]
    results = []
    for place in ("cpu", "devkit:0"):
        paddle.set_device(place)
        layer = paddle.nn.BatchNorm2D(3, momentum=0.8)
        layer.train()
        for scale in (1.0, 2.0):
            layer(paddle.to_tensor(x * scale)).sum().backward()
        layer.eval()
        results.append([layer._mean.numpy(), layer._variance.numpy(), layer(paddle.to_tensor(x)).numpy()])
    for label, got, expected in zip(("running mean", "running variance", "eval output"), results[1], results[0]):
        np.testing.assert_allclose(got, expected, rtol=RTOL, atol=ATOL, err_msg=label)
    return "running statistics and eval output match"


def dropout_training(paddle, counts) -> str:
    """Training dropout: a random mask (so checked by its properties, not against Paddle CPU's draw):
    each element is 0 or x / (1 - p), about p of them 0, and the grad is the mask's scaling of dout."""
    p = 0.25
    x = np.abs(_inputs(59, (64, 64))[0]) + 0.5  # no zeros of its own
    paddle.set_device("devkit:0")
    before = counts()
    tensor = paddle.to_tensor(x, stop_gradient=False)
    out = paddle.nn.functional.dropout(tensor, p, training=True)
    out.sum().backward()
    y, grad = out.numpy(), tensor.grad.numpy()
    kept = y != 0
    np.testing.assert_allclose(y[kept], x[kept] / (1 - p), rtol=1e-6)
    np.testing.assert_allclose(grad, kept / (1 - p), rtol=1e-6)
    dropped = 1 - kept.mean()
    assert abs(dropped - p) < 0.03, f"{dropped:.3f} of the elements dropped with p={p}"  # 4096 draws: sd 0.007
    again = paddle.nn.functional.dropout(tensor, p, training=True).numpy() != 0
    assert (again != kept).any(), "two draws gave the same mask"
    downscaled = paddle.nn.functional.dropout(tensor, p, training=True, mode="downscale_in_infer").numpy()
    np.testing.assert_array_equal(downscaled[downscaled != 0], x[downscaled != 0])  # kept as they are
    after = counts()
    missing = [k for k in ("dropout", "dropout_grad") if after.get(k, 0) <= before.get(k, 0)]
    assert not missing, f"kernels {missing} did not run on the devkit device"
    return f"{dropped:.3f} dropped with p={p}"


def dropout_eval(paddle, counts) -> str:
    x = _inputs(55, (4, 5))[0]
    results = []
    for place in ("cpu", "devkit:0"):
        paddle.set_device(place)
        tensor = paddle.to_tensor(x)
        results.append([paddle.nn.functional.dropout(tensor, 0.3, training=False).numpy(),
                        paddle.nn.functional.dropout(tensor, 0.3, training=False, mode="downscale_in_infer").numpy()])
    for got, expected in zip(results[1], results[0]):
        np.testing.assert_allclose(got, expected, rtol=1e-6)
    return "upscale_in_train and downscale_in_infer match"


# 16-bit floats: the ops Linear, Conv2D, BatchNorm, LayerNorm, Softmax, ReLU and CrossEntropyLoss
# networks need, forward and backward in the dtype, against Paddle CPU in float32 on the same
# (rounded) inputs. BatchNorm's scale and bias stay float32 (Paddle's contract for 16-bit x;
# the casts are no-ops on the float32 run). Tolerances:
# a few units of the dtype's rounding (float16 2^-11, bfloat16 2^-8) for the outputs and for
# sums of up to 27 products, relative and scaled by the array's largest magnitude.
HALF_TOLERANCE = {"float16": 1e-2, "bfloat16": 5e-2}
HALF_CASES = {
    "relu": (("relu", "relu_grad"), _inputs(60, (4, 5)), lambda p, x: p.nn.functional.relu(x)),
    "add_broadcast": (("add", "add_grad"), _inputs(61, (3, 4), (4,)), lambda p, x, y: x + y),
    "subtract": (("subtract", "subtract_grad"), _inputs(62, (3, 4), (3, 1)), lambda p, x, y: x - y),
    "multiply": (("multiply", "multiply_grad"), _inputs(63, (3, 4), (1, 4)), lambda p, x, y: x * y),
    "linear": (("matmul", "matmul_grad", "add"), _inputs(64, (6, 4), (4, 3), (3,)),
               lambda p, x, w, b: p.nn.functional.linear(x, w, b)),
    "softmax": (("softmax", "softmax_grad"), _inputs(65, (3, 5)), lambda p, x: p.nn.functional.softmax(x)),
    "conv2d": (("conv2d", "conv2d_grad"), _inputs(66, (2, 3, 6, 6), (4, 3, 3, 3)),
               lambda p, x, w: p.nn.functional.conv2d(x, w, padding=1)),
    "layer_norm": (("layer_norm", "layer_norm_grad"), _inputs(67, (4, 5), (5,), (5,)),
                   lambda p, x, w, b: p.nn.functional.layer_norm(x, [5], w, b)),
    "batch_norm": (("batch_norm", "batch_norm_grad"), _inputs(68, (4, 3, 5, 5), (3,), (3,)),
                   lambda p, x, w, b: p.nn.functional.batch_norm(x, p.zeros([3]), p.ones([3]), w.astype("float32"),
                                                                 b.astype("float32"), training=True)),
    "cross_entropy": (("cross_entropy_with_softmax", "cross_entropy_with_softmax_grad"), _inputs(69, (6, 5)),
                      lambda p, x: p.nn.functional.cross_entropy(x, p.to_tensor(np.array([[0], [4], [1], [2], [4], [3]])),
                                                                 reduction="none")),
    # mean_all is what CrossEntropyLoss's mean reduction calls (x.mean() calls mean)
    "mean_all": (("mean_all", "mean_all_grad"), _inputs(70, (4, 5)), lambda p, x: p._C_ops.mean_all(x)),
    "mean": (("mean", "mean_grad"), _inputs(71, (4, 5)), lambda p, x: x.mean(axis=1)),
    "sum": (("sum", "sum_grad"), _inputs(72, (4, 5)), lambda p, x: x.sum(axis=0)),
}
# Outputs that Paddle infers float32 for a 16-bit input: bfloat16 cross entropy's loss.
HALF_FLOAT32_OUTPUTS = {("bfloat16", "cross_entropy")}


def _half_ops(paddle, counts, dtype: str, flag: int) -> str:
    from devkit.paddle import _bridge

    if not _bridge.plugin().device(0).properties.flags & flag:
        return f"the device does not store {dtype}: not registered for it"
    tolerance = HALF_TOLERANCE[dtype]
    for name, (kernels, arrays, fn) in HALF_CASES.items():
        paddle.set_device("devkit:0")
        rounded = [paddle.to_tensor(a).astype(dtype).astype("float32").numpy() for a in arrays]
        expected = _run_op_case(paddle, "cpu", fn, rounded)
        before = counts()
        paddle.set_device("devkit:0")
        tensors = [paddle.to_tensor(a).astype(dtype) for a in rounded]
        for t in tensors:
            t.stop_gradient = False
        out = fn(paddle, *tensors)
        expected_dtype = paddle.float32 if (dtype, name) in HALF_FLOAT32_OUTPUTS else tensors[0].dtype
        assert out.dtype == expected_dtype, f"{dtype} {name}: the output is {out.dtype}"
        weights = paddle.to_tensor(np.linspace(-1, 1, out.size, dtype=np.float32).reshape(out.shape))
        (out.astype("float32") * weights).sum().backward()
        got = [out.astype("float32").numpy()] + [t.grad.astype("float32").numpy() for t in tensors]
        after = counts()
        for label, e, g in zip(["output"] + [f"grad of input {k}" for k in range(len(arrays))], expected, got):
            np.testing.assert_allclose(g, e, rtol=tolerance, atol=tolerance * max(1.0, float(np.abs(e).max())),
                                       err_msg=f"{dtype} {name}: {label}")
        missing = [k for k in kernels if after.get(k, 0) <= before.get(k, 0)]
        assert not missing, f"{dtype} {name}: kernels {missing} did not run on the devkit device"
    return f"{len(HALF_CASES)} ops forward and backward within {tolerance}"


def float16_ops(paddle, counts) -> str:
    return _half_ops(paddle, counts, "float16", 1 << 1)  # DK_DEVICE_FP16


def bfloat16_ops(paddle, counts) -> str:
    return _half_ops(paddle, counts, "bfloat16", 1 << 2)  # DK_DEVICE_BF16


HALF_TRAINING_STEPS = 3


def _half_training(paddle, counts, dtype: str, flag: int) -> str:
    """Linear-BatchNorm1D-ReLU-Linear with CrossEntropyLoss, 3 steps of SGD and of Adam with
    multi_precision (float32 master weights), in ``dtype`` on the devkit device against the same
    run in float32 on Paddle CPU: losses within the dtype's HALF_TOLERANCE. float16 runs under
    Paddle's AMP (decorate and auto_cast, level O2: BatchNorm kept float32); bfloat16 with the
    Linear layers cast by hand, because Paddle's AMP takes only float16 on a custom place."""
    from devkit.paddle import _bridge

    if not _bridge.plugin().device(0).properties.flags & flag:
        return f"the device does not store {dtype}: not registered for it"
    nn = paddle.nn

    def run(place, optimizer_class, half):
        paddle.set_device(place)
        net = nn.Sequential(nn.Linear(8, 16), nn.BatchNorm1D(16), nn.ReLU(), nn.Linear(16, 4))
        rng = np.random.default_rng(21)
        for parameter in net.parameters():
            parameter.set_value((rng.standard_normal(parameter.shape) * 0.3).astype(np.float32))
        x = paddle.to_tensor(rng.standard_normal((32, 8)).astype(np.float32))
        y = paddle.to_tensor(rng.integers(0, 4, (32, 1)).astype(np.int64))
        amp = half and dtype == "float16"
        if half and not amp:
            for layer in (net[0], net[3]):
                layer.to(dtype=dtype)
            x = x.astype(dtype)
        optimizer = optimizer_class(learning_rate=0.1, parameters=net.parameters(), multi_precision=half)
        if amp:
            net, optimizer = paddle.amp.decorate(models=net, optimizers=optimizer, level="O2", dtype=dtype)
        if half:
            assert net[0].weight.dtype == getattr(paddle, dtype), net[0].weight.dtype
        losses = []
        paddle.set_flags({"FLAGS_enable_api_kernel_fallback": not half})  # every op on the device
        try:
            for _ in range(HALF_TRAINING_STEPS):
                with paddle.amp.auto_cast(enable=amp, level="O2", dtype=dtype):
                    loss = nn.functional.cross_entropy(net(x), y)
                loss.backward()
                optimizer.step()
                optimizer.clear_grad()
                losses.append(float(loss.astype("float32").numpy()))
        finally:
            paddle.set_flags({"FLAGS_enable_api_kernel_fallback": True})
        return losses

    tolerance = HALF_TOLERANCE[dtype]
    details = []
    for optimizer_class, kernel in ((paddle.optimizer.SGD, "sgd"), (paddle.optimizer.Adam, "adam")):
        expected = run("cpu", optimizer_class, False)
        before = counts()
        got = run("devkit:0", optimizer_class, True)
        after = counts()
        np.testing.assert_allclose(got, expected, rtol=tolerance, err_msg=f"{dtype} {kernel} losses")
        assert got[-1] < got[0], got
        missing = [k for k in (kernel, "batch_norm", "batch_norm_grad", "cross_entropy_with_softmax")
                   if after.get(k, 0) <= before.get(k, 0)]
        assert not missing, f"{dtype} {kernel}: kernels {missing} did not run on the devkit device"
        details.append(f"{kernel} {['%.4f' % v for v in got]}")
    return f"losses within {tolerance} of float32: " + ", ".join(details)


def float16_training(paddle, counts) -> str:
    return _half_training(paddle, counts, "float16", 1 << 1)  # DK_DEVICE_FP16


def bfloat16_training(paddle, counts) -> str:
    return _half_training(paddle, counts, "bfloat16", 1 << 2)  # DK_DEVICE_BF16


def forward_ops(paddle, counts) -> str:
    """Ops without gradients (comparisons, casts, integer arithmetic) and concat / split, forward."""
    x = np.array([[1.0, -2.0, 3.0], [0.5, 2.0, -1.0]], np.float32)
    y = np.array([1.0, 2.0, -1.0], np.float32)
    labels = np.array([[3], [0], [2]], np.int64)
    expressions = {
        "equal": lambda p, a, b, n: a == b, "not_equal": lambda p, a, b, n: a != b,
        "less_than": lambda p, a, b, n: a < b, "less_equal": lambda p, a, b, n: a <= b,
        "greater_than": lambda p, a, b, n: a > b, "greater_equal": lambda p, a, b, n: a >= b,
        "cast": lambda p, a, b, n: p.cast(a > b, "float32"),
        "multiply": lambda p, a, b, n: n * (n != 0).astype("int64"),
        "add": lambda p, a, b, n: n + n,
        "concat": lambda p, a, b, n: p.concat([a, p.unsqueeze(b, 0)], axis=0),
        "split_with_num": lambda p, a, b, n: p.split(a, 3, axis=1)[2],
    }
    results = {}
    for place in ("cpu", "devkit:0"):
        paddle.set_device(place)
        a, b, n = (paddle.to_tensor(v) for v in (x, y, labels))
        results[place] = {name: f(paddle, a, b, n).numpy() for name, f in expressions.items()}
    for name, expected in results["cpu"].items():
        got = results["devkit:0"][name]
        assert got.dtype == expected.dtype and np.array_equal(got, expected), (name, got, expected)
    missing = [name for name in expressions if not counts().get(name, 0)]
    assert not missing, f"kernels {missing} did not run on the devkit device"
    return f"{len(expressions)} expressions"


def transpose_without_stride_kernels(paddle, counts) -> str:
    """With Paddle's stride kernels off, transpose and its grad are kernels, not views."""
    paddle.set_flags({"FLAGS_use_stride_kernel": False})
    try:
        return op_case(paddle, counts, "transpose", ("transpose", "transpose_grad"), *OP_CASES["transpose"][1:])
    finally:
        paddle.set_flags({"FLAGS_use_stride_kernel": True})


def places(paddle, counts) -> str:
    assert paddle.device.get_all_custom_device_type() == ["devkit"]
    available = paddle.device.get_available_custom_device()
    assert available == ["devkit"] or available[0] == "devkit:0", available  # one device: its type alone
    paddle.set_device("devkit:0")
    assert paddle.device.get_device() == "devkit:0"
    return f"devices {available}"


def round_trips(paddle, counts) -> str:
    paddle.set_device("devkit:0")
    values = {"float32": np.arange(-3, 9, dtype=np.float32).reshape(3, 4) / 3, "float64": np.linspace(0, 1, 7),
              "int64": np.arange(10, dtype=np.int64), "int32": np.array([[1, -2], [3, 4]], np.int32),
              "bool": np.array([True, False, True])}
    for dtype, value in values.items():
        x = paddle.to_tensor(value)
        assert "devkit" in str(x.place), x.place
        back = x.numpy()
        assert back.dtype == value.dtype and np.array_equal(back, value), dtype
        assert np.array_equal(x.cpu().numpy(), value), dtype
    empty = paddle.to_tensor(np.zeros((0, 3), np.float32))
    assert empty.numpy().shape == (0, 3)
    return f"{len(values)} dtypes and an empty tensor"


def views_and_copies(paddle, counts) -> str:
    paddle.set_device("devkit:0")
    value = np.arange(24, dtype=np.float32).reshape(4, 6)
    x = paddle.to_tensor(value)
    assert np.array_equal(x[1:3].numpy(), value[1:3])
    assert np.array_equal(x[:, 2].numpy(), value[:, 2])
    y = x.clone()
    assert np.array_equal(y.numpy(), value)
    z = paddle.to_tensor(value, place=paddle.CPUPlace()).to("devkit:0")
    assert "devkit" in str(z.place) and np.array_equal(z.numpy(), value)
    devices = len(paddle.device.get_available_custom_device())
    if devices > 1:  # the plugin's last device: a kernel there, and a move back to devkit:0
        last = f"devkit:{devices - 1}"
        paddle.set_device(last)
        w = paddle.nn.functional.relu(paddle.to_tensor(value - 10))
        assert str(w.place) == f"Place({last})", w.place
        back = w.to("devkit:0")
        assert str(back.place) == "Place(devkit:0)" and np.array_equal(back.numpy(), np.maximum(value - 10, 0))
    return f"slices, clone, to(); {devices} device(s)"


def fills(paddle, counts) -> str:
    paddle.set_device("devkit:0")
    for dtype in ("float32", "float64", "int64", "int32", "bool"):
        ones = paddle.ones([2, 3], dtype=dtype)
        assert np.array_equal(ones.numpy(), np.ones((2, 3), dtype)), dtype
        full = paddle.full([4], 7 if dtype != "bool" else True, dtype=dtype)
        assert np.array_equal(full.numpy(), np.full(4, 7 if dtype != "bool" else True, dtype)), dtype
    like = paddle.full_like(paddle.to_tensor(np.zeros((2, 2), np.float32)), 2.5)
    assert np.array_equal(like.numpy(), np.full((2, 2), 2.5, np.float32))
    assert counts().get("full", 0) and counts().get("full_like", 0)
    return "full and full_like, 5 dtypes"


def _optimizer_steps(paddle, counts, optimizer_class, learning_rate: float, steps: int, kernel: str) -> str:
    """``steps`` steps on sum(p^3) from the same parameter, on Paddle CPU and devkit:0."""
    results = []
    for place in ("cpu", "devkit:0"):
        paddle.set_device(place)
        param = paddle.create_parameter([3, 2], "float32",
                                        default_initializer=paddle.nn.initializer.Assign(
                                            np.arange(6, dtype=np.float32).reshape(3, 2) - 2))
        optimizer = optimizer_class(learning_rate=learning_rate, parameters=[param])
        for _ in range(steps):
            (param * param * param).sum().backward()
            optimizer.step()
            optimizer.clear_grad()
        results.append(param.numpy())
    np.testing.assert_allclose(results[1], results[0], rtol=RTOL, atol=ATOL)
    assert counts().get(kernel, 0) >= steps, f"{kernel} did not run on the devkit device"
    return f"{steps} steps"


def sgd_step(paddle, counts) -> str:
    return _optimizer_steps(paddle, counts, paddle.optimizer.SGD, 0.25, 1, "sgd")


def adam_steps(paddle, counts) -> str:
    return _optimizer_steps(paddle, counts, paddle.optimizer.Adam, 0.1, 3, "adam")


def train(paddle, net, optimizer_class, learning_rate: float, x_shape, classes: int) -> list[float]:
    """TRAINING_STEPS steps of ``net`` with CrossEntropyLoss, from fixed weights and data."""
    rng = np.random.default_rng(20)
    for parameter in net.parameters():
        parameter.set_value((rng.standard_normal(parameter.shape) * 0.3).astype(np.float32))
    optimizer = optimizer_class(learning_rate=learning_rate, parameters=net.parameters())
    loss_fn = paddle.nn.CrossEntropyLoss()
    x = paddle.to_tensor(rng.standard_normal(x_shape).astype(np.float32))
    y = paddle.to_tensor(rng.integers(0, classes, (x_shape[0], 1)).astype(np.int64))
    losses = []
    # On the devkit device every step runs there: an op without a devkit kernel is an error, not a
    # silent trip to Paddle's CPU (the initialisers above, uniform and gaussian, may take it).
    on_devkit = paddle.device.get_device().startswith("devkit")
    paddle.set_flags({"FLAGS_enable_api_kernel_fallback": not on_devkit})
    try:
        for _ in range(TRAINING_STEPS):
            loss = loss_fn(net(x), y)
            loss.backward()
            optimizer.step()
            optimizer.clear_grad()
            losses.append(float(loss.numpy()))
    finally:
        paddle.set_flags({"FLAGS_enable_api_kernel_fallback": True})
    return losses


def compare_training(paddle, run) -> str:
    """``run(place)`` trains on a place: the devkit losses match Paddle CPU's and fall."""
    expected, got = run("cpu"), run("devkit:0")
    np.testing.assert_allclose(got, expected, rtol=LOSS_RTOL)
    assert got[-1] < got[0], got
    return f"losses {['%.5f' % v for v in got]}"


def cnn_training(paddle, counts) -> str:
    """Conv2D-BatchNorm2D-ReLU-Conv2D-ReLU-Flatten-Linear-LayerNorm (devkit.paddle.models.cnn) with Adam."""
    from devkit.paddle import models

    def run(place):
        paddle.set_device(place)
        return train(paddle, models.cnn(paddle), paddle.optimizer.Adam, 0.05, models.CNN_INPUT, models.CNN_CLASSES)
    return compare_training(paddle, run)


def transformer_training(paddle, counts) -> str:
    """A pre-norm transformer block (one attention head pair, GELU MLP) and a classifier, with Adam."""
    nn, functional = paddle.nn, paddle.nn.functional

    class Block(nn.Layer):
        def __init__(self, width=8, heads=2):
            super().__init__()
            self.heads = heads
            self.norm1, self.norm2, self.norm3 = nn.LayerNorm(width), nn.LayerNorm(width), nn.LayerNorm(width)
            self.qkv, self.proj = nn.Linear(width, 3 * width), nn.Linear(width, width)
            self.mlp = nn.Sequential(nn.Linear(width, 2 * width), nn.GELU(), nn.Linear(2 * width, width))
            self.head = nn.Linear(width, 3)

        def forward(self, x):
            batch, length, width = x.shape
            q, k, v = paddle.split(self.qkv(self.norm1(x)), 3, axis=-1)
            def heads(t):
                return t.reshape([batch, length, self.heads, width // self.heads]).transpose([0, 2, 1, 3])
            q, k, v = heads(q), heads(k), heads(v)
            attention = functional.softmax(paddle.matmul(q, k, transpose_y=True) * (width // self.heads) ** -0.5)
            mixed = paddle.matmul(attention, v).transpose([0, 2, 1, 3]).reshape([batch, length, width])
            x = x + self.proj(mixed)
            x = x + self.mlp(self.norm2(x))
            return self.head(self.norm3(x).mean(axis=1))

    def run(place):
        paddle.set_device(place)
        return train(paddle, Block(), paddle.optimizer.Adam, 0.01, (4, 5, 8), 3)
    return compare_training(paddle, run)


def mlp_training(paddle, counts) -> str:
    """Linear-ReLU-Linear with SGD."""
    def run(place):
        paddle.set_device(place)
        net = paddle.nn.Sequential(paddle.nn.Linear(8, 16), paddle.nn.ReLU(), paddle.nn.Linear(16, 4))
        return train(paddle, net, paddle.optimizer.SGD, 0.1, (32, 8), 4)
    return compare_training(paddle, run)


def missing_kernel_falls_back(paddle, counts) -> str:
    paddle.set_device("devkit:0")
    value = np.array([0.5, -1.0, 2.0], np.float32)
    y = paddle.atan(paddle.to_tensor(value))  # no devkit kernel: Paddle runs it on its CPU
    assert "devkit" in str(y.place), y.place
    np.testing.assert_allclose(y.numpy(), np.arctan(value), rtol=RTOL)
    return "atan ran on Paddle's CPU, result on devkit:0"


def missing_kernel_is_named(paddle, counts) -> str:
    paddle.set_device("devkit:0")
    x = paddle.to_tensor(np.array([1.0], np.float32))
    paddle.set_flags({"FLAGS_enable_api_kernel_fallback": False})
    try:
        paddle.atan(x)
    except RuntimeError as error:
        message = str(error)
    else:
        raise AssertionError("atan ran without a devkit kernel and without fallback")
    finally:
        paddle.set_flags({"FLAGS_enable_api_kernel_fallback": True})
    assert "NotFound" in message and "`atan`" in message and "devkit" in message, message
    return message.splitlines()[0][:120]


def kernel_error_is_raised(paddle, counts) -> str:
    paddle.set_device("devkit:0")
    logits = paddle.to_tensor(np.zeros((2, 3), np.float32))
    soft = paddle.to_tensor(np.full((2, 3), 1 / 3, np.float32))
    try:
        paddle.nn.functional.cross_entropy(logits, soft, soft_label=True)
    except Exception as error:  # Paddle raises the kernel's exception as OSError
        message = str(error)
    else:
        raise AssertionError("soft labels ran, but the devkit kernel refuses them")
    assert "devkit kernel 'cross_entropy_with_softmax'" in message and "hard labels" in message, message
    np.testing.assert_allclose(paddle.nn.functional.relu(logits).numpy(), 0)  # the process goes on
    return message.splitlines()[0][:120]


def label_error_is_raised(paddle, counts) -> str:
    """A kernel the plugin runs that fails (a label past the classes) raises Paddle's OSError naming the
    phi kernel and the plugin's message; the process goes on."""
    paddle.set_device("devkit:0")
    logits = paddle.to_tensor(np.zeros((2, 3), np.float32))
    try:
        paddle.nn.functional.cross_entropy(logits, paddle.to_tensor(np.array([[0], [7]], np.int64)))
    except OSError as error:
        message = str(error)
    else:
        raise AssertionError("label 7 of 3 classes ran")
    assert "devkit kernel 'cross_entropy_with_softmax'" in message and "7" in message, message
    np.testing.assert_allclose(paddle.nn.functional.relu(logits).numpy(), 0)
    return message.splitlines()[0][:160]


def main() -> int:
    # Imported here, in the worker process only: devkit.paddle sets CUSTOM_DEVICE_ROOT, which
    # Paddle reads when it is imported, and the suite's process imports neither.
    import devkit.paddle
    import paddle

    results = {}
    for case in CASES:
        try:
            if case in OP_CASES:
                detail = op_case(paddle, devkit.paddle.kernel_counts, case, *OP_CASES[case])
            else:
                detail = globals()[case](paddle, devkit.paddle.kernel_counts)
            results[case] = {"ok": True, "detail": detail}
        except Exception:  # reported per case; the others still run
            results[case] = {"ok": False, "detail": traceback.format_exc(limit=4)}
    print(json.dumps(results))
    return 0


if __name__ == "__main__":
    sys.exit(main())
