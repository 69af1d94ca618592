"""devkit.paddle's set-up on the cpu plugin: the build and its cache, the
environment it sets, the pointer rule, and a plugin that does not load.
Each case runs in a fresh interpreter: Paddle reads CUSTOM_DEVICE_ROOT and
loads the plugin once, at import. The bridge on every plugin under test
(ops, training, errors) is conformance/test_paddle.py."""

import importlib.util
import json
import os

import numpy as np

import pytest

from .conftest import run_python

pytestmark = pytest.mark.skipif(importlib.util.find_spec("paddle") is None,
                                reason="PaddlePaddle is not installed: pip install 'devkit[paddle]'")

QUIET = {"GLOG_minloglevel": "2", "DEVKIT_PADDLE_PLUGIN": "cpu"}


def _run(code: str, **env) -> str:
    environment = {**QUIET, **env}
    if "CUSTOM_DEVICE_ROOT" not in env:
        os.environ.pop("CUSTOM_DEVICE_ROOT", None)
    done = run_python(code, env=environment)
    assert done.returncode == 0, done.stderr[-3000:]
    return done.stdout


def test_root_is_the_cached_build_and_holds_only_the_bridge():
    first = _run("import runpy, sys; sys.argv = ['devkit.paddle', '--root']; "
                 "runpy.run_module('devkit.paddle', run_name='__main__')").strip()
    assert os.listdir(first) == ["libpaddle-devkit.so"]
    again = _run("import devkit.paddle, os; print(os.environ['CUSTOM_DEVICE_ROOT'])").strip()
    assert again == first


def test_import_sets_defaults_and_keeps_what_is_set():
    out = _run("import os; os.environ.pop('DEVKIT_PADDLE_PLUGIN'); import devkit.paddle; "
               "print(os.environ['DEVKIT_PADDLE_PLUGIN'], bool(os.environ['CUSTOM_DEVICE_ROOT']))")
    assert out.split() == ["cpu", "True"]
    out = _run("import devkit.paddle, os; print(os.environ['CUSTOM_DEVICE_ROOT'], os.environ['DEVKIT_PADDLE_PLUGIN'])",
               CUSTOM_DEVICE_ROOT="/elsewhere", DEVKIT_PADDLE_PLUGIN="opencl")
    assert out.split() == ["/elsewhere", "opencl"]


def test_importing_after_paddle_warns():
    out = _run("import warnings, paddle\n"
               "with warnings.catch_warnings(record=True) as caught:\n"
               "    warnings.simplefilter('always')\n"
               "    import devkit.paddle\n"
               "print([str(w.message) for w in caught if 'import devkit.paddle first' in str(w.message)])")
    assert "import devkit.paddle first" in out


def test_cpu_pointers_are_the_plugins_host_addresses():
    # The cpu plugin reports DK_DEVICE_HOST_POINTER_HANDLES: the pointer Paddle holds is the
    # handle itself, a host address whose bytes are the tensor's.
    out = _run("import ctypes, numpy as np, devkit.paddle, paddle\n"
               "paddle.set_device('devkit:0')\n"
               "x = paddle.to_tensor(np.arange(6, dtype=np.float32))\n"
               "view = np.ctypeslib.as_array((ctypes.c_float * 6).from_address(x.data_ptr()))\n"
               "print(view.tolist(), devkit.paddle.kernel_counts())")
    assert out.startswith("[0.0, 1.0, 2.0, 3.0, 4.0, 5.0]")


def test_a_plugin_that_does_not_load_leaves_the_device_type_without_devices():
    done = run_python("import devkit.paddle, paddle\n"
                      "print(paddle.device.get_all_custom_device_type(), "
                      "paddle.device.get_available_custom_device())\n"
                      "try:\n"
                      "    paddle.set_device('devkit:0')\n"
                      "except Exception as error:\n"
                      "    print('refused:', type(error).__name__)\n",
                      env={**QUIET, "DEVKIT_PADDLE_PLUGIN": "nosuch"})
    assert done.returncode == 0, done.stderr[-3000:]
    assert "[devkit.paddle] loading the devkit plugin: PluginLoadError" in done.stderr
    assert "nosuch" in done.stderr
    assert "refused:" in done.stdout


def test_every_registered_kernel_has_a_lowering():
    # bridge.cc registers the phi kernels; devkit/paddle/ops.py lowers them: the two lists agree.
    out = _run("import pathlib, re, devkit.paddle\n"
               "from devkit.paddle import ops\n"
               "source = pathlib.Path(devkit.paddle.__file__).with_name('bridge.cc').read_text()\n"
               "found = re.findall(r'^DEVKIT_(\\w+?)\\((\\w+)', source, re.M)\n"
               "names = {n + '_grad' if kind.endswith('GRAD_KERNEL') else n for kind, n in found}\n"
               "print(sorted(names ^ set(ops.KERNELS)), len(names))")
    missing, count = out.rsplit(" ", 1)
    assert missing == "[]" and int(count) >= 50, out


def _both_paths(code: str) -> tuple[dict, dict]:
    """What ``code`` prints (JSON, its last line) with direct calls on, then with DEVKIT_PADDLE_DIRECT=0."""
    return tuple(json.loads(_run(code, **env).splitlines()[-1]) for env in ({}, {"DEVKIT_PADDLE_DIRECT": "0"}))


# The kernels that ran, as the checks below print them.
COUNTS = "'direct': _bridge.direct_calls(), 'python': dict(_bridge.kernel_counts)"

DIRECT_CHECK = ("import json, numpy as np, devkit.paddle, paddle\n"
                "from devkit.paddle import _bridge\n"
                "paddle.set_device('devkit:0')\n"
                "x = paddle.to_tensor(np.array([[-1.5, 2.0, 0.25]], np.float32))\n"
                "y = paddle.to_tensor(np.array([2.0, -4.0, 0.5], np.float32))\n"
                "n = paddle.to_tensor(np.array([3, -2], np.int64))\n"
                "values = [paddle.nn.functional.relu(x), paddle.exp(x), x + y, x * y, x / y, x - y, n * n,\n"
                "          paddle.transpose(x, [1, 0]) + 1.0]\n"
                f"print(json.dumps({{'values': [v.numpy().tolist() for v in values], {COUNTS}}}))\n")


def test_elementwise_kernels_call_the_plugin_directly_and_match_the_python_path():
    # relu, exp, + - * / on compact float32 and int64 tensors: bridge.cc calls the cpu plugin's
    # kernel table itself; with DEVKIT_PADDLE_DIRECT=0 the same ops go through run_op.
    direct, python = _both_paths(DIRECT_CHECK)
    assert direct["values"] == python["values"]
    elementwise = {"relu", "exp", "add", "multiply", "divide", "subtract"}
    assert elementwise <= set(direct["direct"]) and not elementwise & set(direct["python"])
    assert python["direct"] == {} and elementwise <= set(python["python"])


TRAINING_CHECK = ("import json, numpy as np, devkit.paddle, paddle\n"
                  "from devkit.paddle import _bridge, models\n"
                  "paddle.set_device('devkit:0')\n"
                  "paddle.seed(0)\n"
                  "net = models.cnn(paddle)\n"
                  "optimizer = paddle.optimizer.Adam(learning_rate=0.05, parameters=net.parameters())\n"
                  "step = models.training_step(paddle, net, optimizer, models.CNN_INPUT, models.CNN_CLASSES)\n"
                  "losses = [float(step()) for _ in range(3)]\n"
                  "trained = [p for p in net.parameters() if not p.stop_gradient]\n"
                  "params = [p.numpy().ravel().tolist() for p in trained]\n"
                  f"print(json.dumps({{'losses': losses, 'params': params, {COUNTS}}}))\n")


def test_training_kernels_call_the_plugin_directly_and_match_the_python_path():
    # The CNN's kernels with attributes (conv2d, batch_norm, layer_norm, matmul, cross entropy, Adam as one
    # devkit Adam call...) run from bridge.cc on the cpu plugin's kernel table; with DEVKIT_PADDLE_DIRECT=0
    # every one goes through run_op. Both train alike: devkit's Adam computes in float64, the Python
    # path's chain of ops in float32, hence rtol 1e-5 on the losses. (Not on every parameter: the first
    # conv's bias feeds BatchNorm, so its gradient is rounding noise that Adam scales to full steps.)
    direct, python = _both_paths(TRAINING_CHECK)
    np.testing.assert_allclose(direct["losses"], python["losses"], rtol=1e-5)
    np.testing.assert_allclose(direct["params"][-1], python["params"][-1], rtol=1e-5, atol=1e-6)  # LayerNorm's bias
    kernels = {"conv2d", "conv2d_grad", "batch_norm", "batch_norm_grad", "layer_norm", "layer_norm_grad", "matmul",
               "matmul_grad", "cross_entropy_with_softmax", "cross_entropy_with_softmax_grad", "mean_all",
               "mean_all_grad", "add_grad", "relu_grad", "adam", "full", "cast"}
    assert kernels <= set(direct["direct"]) and not kernels & set(direct["python"]), direct
    assert python["direct"] == {} and kernels - {"full"} <= set(python["python"])
    assert direct["direct"]["adam"] == 3 * len(direct["params"])  # one call per parameter and step


VIEW_CHECK = ("import json, numpy as np, devkit.paddle, paddle\n"
              "from devkit.paddle import _bridge\n"
              "F = paddle.nn.functional\n"
              "paddle.set_device('devkit:0')\n"
              "rng = np.random.default_rng(3)\n"
              "q, k, x, w = (paddle.to_tensor(rng.standard_normal(s).astype(np.float32), stop_gradient=False)\n"
              "              for s in ((2, 3, 5, 4), (2, 3, 5, 4), (2, 3, 8, 8), (6, 4)))\n"
              "ids = paddle.to_tensor(np.array([[0, 5, 2], [2, 2, 1]], np.int64))\n"
              "scores = F.softmax(paddle.matmul(q, k, transpose_y=True) * 0.5)\n"
              "mixed = paddle.matmul(scores, k).transpose([0, 2, 1, 3]).reshape([2, 5, 12])\n"
              "a, b, c = paddle.split(F.gelu(mixed), 3, axis=-1)\n"
              "joined = paddle.concat([c, a], axis=-1)\n"
              "pooled = F.max_pool2d(x, 2, 2) + F.avg_pool2d(x, 2, 2)\n"
              "rows = F.embedding(ids, w)\n"
              "(joined.sum() + pooled.sum() * 0.5 + (rows * rows).sum()).backward()\n"
              "values = [t.numpy().ravel().tolist() for t in (joined, pooled, rows, q.grad, k.grad, x.grad, w.grad)]\n"
              f"print(json.dumps({{'values': values, {COUNTS}}}))\n")


def test_attention_pooling_and_embedding_kernels_call_the_plugin_directly_and_match_the_python_path():
    # Batched matmul with a transposed operand (a strided view into MatMul), transpose's contiguous (a
    # strided Identity), scale, gelu, split, concat, pooling and embedding, forward and backward.
    direct, python = _both_paths(VIEW_CHECK)
    for got, expected in zip(direct["values"], python["values"]):
        np.testing.assert_allclose(got, expected, rtol=1e-6, atol=1e-6)
    kernels = {"matmul", "matmul_grad", "contiguous", "scale", "gelu", "gelu_grad", "split_with_num", "concat",
               "pool2d", "pool2d_grad", "embedding", "embedding_grad"}
    assert kernels <= set(direct["direct"]) and not kernels & set(direct["python"]), direct
    assert python["direct"] == {} and kernels <= set(python["python"])
