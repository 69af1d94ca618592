"""devkit.run_op and the op functions: host-side checks, kernel lookup, CPU
fallback, streams, and the C launcher's own validation."""

from __future__ import annotations

import gc

import numpy as np
import pytest

import devkit
from devkit import ops
from devkit.backends.cpu import build as cpu_build
from devkit.ops import dispatch


@pytest.fixture(scope="module")
def bare(tmp_path_factory):
    """A cpu plugin build without any kernel: a device that claims no ops."""
    path = cpu_build.build(tmp_path_factory.mktemp("bare"), kernels=[], name="bare")
    return devkit.load_plugin(str(path))


def f32(*shape, seed=0):
    return np.random.default_rng(seed).standard_normal(shape).astype(np.float32)


def test_op_function_and_run_op_agree():
    a, b = f32(3, 4), f32(4, seed=1)
    x, y = devkit.asarray(a), devkit.asarray(b)
    np.testing.assert_array_equal(ops.Add(x, y).numpy(), a + b)
    (out,) = devkit.run_op("Add", [x, y])
    np.testing.assert_array_equal(out.numpy(), a + b)
    assert "Add(A, B) -> C" in ops.Add.__doc__


def test_numpy_inputs_are_copied_to_the_device():
    out = devkit.run_op("Add", [f32(2), f32(2, seed=1)], device="cpu:1")[0]
    assert str(out.device) == "cpu:1"


def test_unknown_op():
    with pytest.raises(ValueError, match="op 'Frobnicate' is not in the devkit operator set"):
        devkit.run_op("Frobnicate", [])


def test_input_count_is_checked():
    with pytest.raises(TypeError, match=r"Add: takes inputs \(A, B\); got 1"):
        devkit.run_op("Add", [f32(2)])


def test_unknown_attribute_is_named():
    with pytest.raises(TypeError, match="Add: unknown attribute 'alpha'"):
        devkit.run_op("Add", [f32(2), f32(2)], {"alpha": 1.0})


def test_unsupported_dtype_names_op_and_dtype():
    with pytest.raises(TypeError, match="Add: dtype bool is not supported"):
        devkit.run_op("Add", [np.ones(2, bool), np.ones(2, bool)])


def test_mixed_dtypes_are_refused():
    with pytest.raises(TypeError, match="Add: B has dtype float64 but A has float32"):
        devkit.run_op("Add", [f32(2), np.ones(2)])


def test_shape_errors_name_the_shapes():
    with pytest.raises(ValueError, match=r"Add: shapes \(2, 3\), \(4,\) cannot be broadcast"):
        ops.Add(devkit.asarray(f32(2, 3)), devkit.asarray(f32(4)))


def test_inputs_on_different_devices_are_refused():
    with pytest.raises(ValueError, match="input 'B' is on cpu:1, but the op runs on cpu:0"):
        ops.Add(devkit.asarray(f32(2), "cpu:0"), devkit.asarray(f32(2), "cpu:1"))


def test_missing_kernel_names_op_and_dtype(bare):
    x = devkit.asarray(f32(2), bare.device(0))
    with pytest.raises(devkit.UnimplementedError, match="Add: plugin 'bare' has no kernel for dtype float32"):
        ops.Add(x, x)


def test_cpu_fallback_runs_counts_and_reports(bare):
    a = f32(5)
    x = devkit.asarray(a, bare.device(0))
    ops.resolution.fallback_report(reset=True)
    with ops.cpu_fallback():
        out = ops.Add(x, x)
        out2 = ops.Add(x, x)
    assert str(out.device) == "bare:0"
    np.testing.assert_array_equal(out.numpy(), a + a)
    np.testing.assert_array_equal(out2.numpy(), a + a)
    assert devkit.fallback_report() == [{"plugin": "bare", "op": "Add", "dtype": "float32", "count": 2}]
    assert not ops.fallback_enabled()  # the block restored the setting
    with pytest.raises(devkit.UnimplementedError):
        ops.Add(x, x)
    ops.resolution.fallback_report(reset=True)


def test_work_on_a_stream_keeps_its_inputs_alive():
    dev = devkit.device("cpu:0")
    a, b = f32(1 << 16), f32(1 << 16, seed=1)
    with dev.create_stream() as stream:
        gate = __import__("threading").Event()
        stream.add_callback(lambda: gate.wait(30))  # holds the stream: the op stays queued
        out = ops.Add(devkit.asarray(a), devkit.asarray(b), stream=stream)
        gc.collect()  # the inputs have no Python reference left but the stream's
        gate.set()
        stream.synchronize()
        np.testing.assert_array_equal(out.numpy(), a + b)


def test_strided_views_are_read_through_their_strides():
    a = f32(6, 8)
    x = devkit.asarray(a)
    np.testing.assert_array_equal(ops.Add(x.T, x.T).numpy(), a.T + a.T)
    np.testing.assert_array_equal(ops.Add(x[::2, 1::3], x[1::2, ::3]).numpy(), a[::2, 1::3] + a[1::2, ::3])


def _raw_call(x: devkit.Array, out: devkit.Array):
    entry = x.device.plugin.kernel_entry("Add", x.dtype)
    dispatch._call_kernel(x.device, entry, "Add", [x, x], [out], [], None)


def test_launcher_refuses_a_tensor_past_its_allocation():
    x = devkit.asarray(f32(128))  # 512 bytes: a whole block of the caching allocator
    out = devkit.empty((128,), "float32")
    x.shape, x.strides = (129,), (1,)  # lie about the extent, past the allocation
    with pytest.raises(devkit.OutOfRangeError, match="Add.*input 0"):
        _raw_call(x, out)


def test_launcher_refuses_a_tensor_of_another_device():
    x = devkit.asarray(f32(4), "cpu:1")
    out = devkit.empty((4,), "float32", "cpu:1")
    entry = x.device.plugin.kernel_entry("Add", x.dtype)
    with pytest.raises(devkit.InvalidArgumentError, match="not on cpu device 0"):
        dispatch._call_kernel(devkit.device("cpu:0"), entry, "Add", [x, x], [out], [], None)


def test_launcher_refuses_ranks_above_its_limit():
    x = devkit.asarray(np.ones((1,) * 17, np.float32))
    out = devkit.empty((1,) * 17, "float32")
    with pytest.raises(devkit.InvalidArgumentError, match="rank 17; the cpu plugin supports 0 to 16"):
        _raw_call(x, out)


def test_older_attribute_form_of_a_host_input_binds_as_the_input():
    a = f32(8) * 4
    x = devkit.asarray(a)
    np.testing.assert_array_equal(ops.Clip(x, min=-1.0, max=1.0).numpy(), np.clip(a, -1, 1))
    np.testing.assert_array_equal(ops.Clip(x, np.float32(-1), max=np.float32(1)).numpy(), np.clip(a, -1, 1))
    with pytest.raises(TypeError, match="Clip: 'min' is given both as an input and as an attribute"):
        ops.Clip(x, np.float32(-1), min=-1.0)


@pytest.mark.parametrize("to, expected", [(6, np.int32), ("INT32", np.int32), (11, np.float64), (16, "bfloat16"),
                                          ("float16", np.float16), (np.dtype("uint8"), np.uint8)])
def test_dtype_attributes_take_onnx_encodings(to, expected):
    host = np.array([1.5, 2.25, 3.0], np.float32)  # (non-negative: Cast saturates, NumPy wraps)
    (out,) = devkit.run_op("Cast", [devkit.asarray(host)], {"to": to})
    expected = devkit.dtypes.normalize(expected)
    assert out.dtype == expected
    np.testing.assert_array_equal(out.numpy(), host.astype(expected))
    (filled,) = devkit.run_op("ConstantOfShape", [[2]], {"dtype": to, "value": 1.0})
    assert filled.dtype == expected


@pytest.mark.parametrize("to", [8, "STRING", True, "no-such-type"])
def test_dtype_attributes_refuse_what_is_no_devkit_dtype(to):
    x = devkit.asarray(np.ones(2, np.float32))
    with pytest.raises(TypeError, match=f"Cast: attribute 'to' must be dtype, got {to!r}"):
        devkit.run_op("Cast", [x], {"to": to})


# -- resolution: native, decomposition, fallback, unimplemented --------------------------------------------

def test_explain_native_and_decomposed_on_the_full_cpu_plugin():
    assert ops.explain("Add", "float32").how == "native"
    assert str(ops.explain("Softmax", np.float32)) == "Softmax[float32]: native"


def test_explain_and_coverage_on_a_bare_plugin(bare):
    dev = bare.device(0)
    plan = ops.explain("Softmax", "float32", dev)
    assert plan.how == "unsupported"
    assert {"ReduceMax[float64]", "Exp[float64]", "Cast[float32]"} <= plan.missing()
    with ops.cpu_fallback():
        assert ops.explain("Softmax", "float32", dev).how == "fallback"
    counts = ops.resolution.coverage_counts(dev)
    metadata_only = len(ops.get("Shape").dtypes) + len(ops.get("Size").dtypes)  # rules that call no op
    assert counts == {"native": 0, "decomposed": metadata_only, "fallback": 0,
                      "unsupported": sum(len(s.dtypes) for s in ops.all_specs()) - metadata_only}
    with pytest.raises(TypeError, match="Softmax: dtype int8 is not supported"):
        ops.explain("Softmax", "int8", dev)


def test_missing_decomposition_parts_are_named(bare):
    x = devkit.asarray(f32(2, 3), bare.device(0))
    with pytest.raises(devkit.UnimplementedError,
                       match=r"Softmax: plugin 'bare' has no kernel .* its decomposition needs kernels for .*ReduceMax\[float64\]"):
        ops.Softmax(x)


_PRIMITIVES_ONLY = """
import json, numpy as np, devkit
from devkit import ops
dev = devkit.device("cpu:0")
x = devkit.asarray(np.array([[1.0, 2.0, 3.0], [0.5, -1.0, 4.0]], np.float32))
y = ops.Softmax(x, axis=1).numpy()
e = np.exp(x.numpy() - x.numpy().max(axis=1, keepdims=True))
print(json.dumps({
    "ops": sorted({op for op, *_ in dev.plugin.kernels}),
    "softmax": ops.explain("Softmax", "float32").how,
    "tree": str(ops.explain("Softmax", "float16")),
    "close": bool(np.allclose(y, e / e.sum(axis=1, keepdims=True), rtol=1e-6)),
    "fallbacks": ops.fallback_report(),
    "counts": ops.resolution.coverage_counts(),
}))
"""


def test_primitives_only_cpu_plugin_runs_everything_decomposed():
    """DEVKIT_CPU_KERNELS=primitives (read when the plugin loads: a fresh
    process) publishes exactly devkit.ops.PRIMITIVES, and ops run decomposed."""
    import json
    import os
    import subprocess
    import sys

    env = {**os.environ, "DEVKIT_CPU_KERNELS": "primitives"}
    run = subprocess.run([sys.executable, "-c", _PRIMITIVES_ONLY], env=env, capture_output=True, text=True,
                         timeout=120)
    assert run.returncode == 0, run.stderr
    result = json.loads(run.stdout)
    assert result["ops"] == sorted(ops.PRIMITIVES), "the C list in kernel.c differs from devkit.ops.PRIMITIVES"
    assert result["softmax"] == "decomposed" and result["close"]
    assert result["tree"].splitlines()[:3] == ["Softmax[float16]: decomposed", "  Cast[float16]: native",
                                               "  Softmax[float32]: decomposed"]
    assert result["fallbacks"] == []
    assert result["counts"]["unsupported"] == result["counts"]["fallback"] == 0


def test_a_bad_kernel_selection_fails_the_plugin_load():
    import os
    import subprocess
    import sys

    env = {**os.environ, "DEVKIT_CPU_KERNELS": "some"}
    run = subprocess.run([sys.executable, "-c", "import devkit; devkit.device('cpu:0')"], env=env,
                         capture_output=True, text=True, timeout=120)
    assert run.returncode != 0
    assert 'DEVKIT_CPU_KERNELS="some" is invalid: expected all or primitives' in run.stderr
