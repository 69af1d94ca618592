"""devkit.ops.X returns the outputs ONNX requires; the optional ones only when
asked for, by return_<output>=True or outputs=n (docs/arrays.md)."""

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper
from onnx.reference import ReferenceEvaluator

import devkit
from devkit import ops
from devkit.ops import dispatch
from devkit.ops.dispatch import reference_arguments

from .conftest import run_python

POOL = {"kernel_shape": [3, 3], "strides": [2, 2], "pads": [1, 1, 1, 1]}


@pytest.fixture
def dev():
    return devkit.device("cpu:0")


@pytest.fixture
def x(dev):
    return devkit.asarray(np.random.default_rng(7).standard_normal((2, 3, 9, 9)).astype(np.float32), dev)


@pytest.fixture
def kernel_outputs(monkeypatch):
    """The output count of every kernel call, as (op, count), the call cache cleared."""
    calls = []
    call_kernel = dispatch._call_kernel

    def counting(dev, entry, op, inputs, results, *args):
        calls.append((op, len(results)))
        return call_kernel(dev, entry, op, inputs, results, *args)

    monkeypatch.setattr(dispatch, "_call_kernel", counting)
    dispatch.clear_call_cache()
    yield calls
    dispatch.clear_call_cache()


def onnx_max_pool(x: np.ndarray, attrs: dict) -> list[np.ndarray]:
    """Y and Indices from onnx's reference evaluator."""
    node = helper.make_node("MaxPool", ["x"], ["y", "i"], **attrs)
    graph = helper.make_graph([node], "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, x.shape)],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, None),
                               helper.make_tensor_value_info("i", TensorProto.INT64, None)])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 22)])
    return ReferenceEvaluator(model).run(None, {"x": x})


# -- MaxPool -----------------------------------------------------------------------------------

def test_max_pool_returns_y_alone(x, kernel_outputs):
    y = ops.MaxPool(x, **POOL)
    assert isinstance(y, devkit.Array)
    expected_y, _ = onnx_max_pool(x.numpy(), POOL)
    np.testing.assert_array_equal(y.numpy(), expected_y)
    # The kernel got a call without Indices, and so did the cached second call's kernel call.
    assert kernel_outputs == [("MaxPool", 1)]
    assert isinstance(ops.MaxPool(x, **POOL), devkit.Array)


@pytest.mark.parametrize("ask", [{"return_indices": True}, {"outputs": 2}, {"outputs": 2, "return_indices": True}],
                         ids=["return_indices", "outputs=2", "both"])
def test_max_pool_with_indices(x, kernel_outputs, ask):
    result = ops.MaxPool(x, **POOL, **ask)
    assert isinstance(result, tuple) and len(result) == 2
    y, indices = result
    expected_y, expected_indices = onnx_max_pool(x.numpy(), POOL)
    np.testing.assert_array_equal(y.numpy(), expected_y)
    assert indices.dtype == np.int64
    np.testing.assert_array_equal(indices.numpy(), expected_indices)
    assert kernel_outputs == [("MaxPool", 2)]
    # A cached call returns the same.
    again = ops.MaxPool(x, **POOL, **ask)
    np.testing.assert_array_equal(again[1].numpy(), expected_indices)


def test_max_pool_explicit_false_is_the_default(x):
    y = ops.MaxPool(x, **POOL, return_indices=False)
    assert isinstance(y, devkit.Array)
    np.testing.assert_array_equal(y.numpy(), ops.MaxPool(x, **POOL, outputs=1).numpy())


def test_max_pool_on_a_stream(x, dev):
    stream = dev.create_stream()
    y, indices = ops.MaxPool(x, **POOL, return_indices=True, stream=stream)
    stream.synchronize()
    np.testing.assert_array_equal(indices.numpy(), onnx_max_pool(x.numpy(), POOL)[1])
    assert isinstance(ops.MaxPool(x, **POOL, stream=stream), devkit.Array)
    stream.synchronize()


# -- errors ------------------------------------------------------------------------------------

def test_unknown_return_keyword_is_a_type_error(x):
    with pytest.raises(TypeError, match=r"MaxPool\(\) got an unexpected keyword argument 'return_idx' "
                                        r"\(its optional outputs are asked for with return_indices\)"):
        ops.MaxPool(x, **POOL, return_idx=True)
    with pytest.raises(TypeError, match=r"Relu\(\) got an unexpected keyword argument 'return_mask' "
                                        r"\(it has no optional outputs\)"):
        ops.Relu(x, return_mask=True)


def test_return_keyword_for_a_required_output_is_a_type_error(x):
    with pytest.raises(TypeError, match=r"Relu: return_y: output 'Y' is required and always returned "
                                        r"\(it has no optional outputs\)"):
        ops.Relu(x, return_y=True)
    with pytest.raises(TypeError, match=r"TopK: return_indices: output 'Indices' is required"):
        ops.TopK(x, [2], return_indices=True)
    with pytest.raises(TypeError, match=r"MaxPool: return_y: output 'Y' is required and always returned "
                                        r"\(its optional outputs are asked for with return_indices\)"):
        ops.MaxPool(x, **POOL, return_y=True)


def test_outputs_out_of_range(x):
    with pytest.raises(ValueError, match=r"MaxPool: outputs=3 is out of range: it has 2 outputs "
                                         r"\(outputs= takes 1 to 2\)"):
        ops.MaxPool(x, **POOL, outputs=3)
    with pytest.raises(ValueError, match=r"MaxPool: outputs=0 is out of range: its output Y is required"):
        ops.MaxPool(x, **POOL, outputs=0)
    with pytest.raises(ValueError, match=r"TopK: outputs=1 is out of range: its outputs Values, Indices are "
                                         r"required \(outputs= takes 2 to 2\)"):
        ops.TopK(x, [2], outputs=1)
    with pytest.raises(TypeError, match=r"MaxPool: outputs must be an int .*not True"):
        ops.MaxPool(x, **POOL, outputs=True)
    with pytest.raises(ValueError, match=r"MaxPool: outputs=2 includes 'Indices', but return_indices is false"):
        ops.MaxPool(x, **POOL, outputs=2, return_indices=False)
    with pytest.raises(TypeError, match=r"Split: outputs=2: its outputs are variadic"):
        ops.Split(x, num_outputs=2, outputs=2)


def test_ops_without_optional_outputs_keep_their_returns(x):
    assert isinstance(ops.Relu(x), devkit.Array)
    assert isinstance(ops.Relu(x, outputs=1), devkit.Array)
    values, indices = ops.TopK(x, [2])
    assert values.shape == indices.shape == (2, 3, 9, 2)
    assert len(ops.TopK(x, [2], outputs=2)) == 2
    parts = ops.Split(x, axis=1, num_outputs=3)
    assert isinstance(parts, tuple) and len(parts) == 3


# -- every spec with optional outputs --------------------------------------------------------

OPTIONAL = [spec for spec in ops.all_specs() if spec.optional_outputs]


def _call_inputs(spec, dev):
    """The first conformance case of the op's first dtype: inputs on ``dev``, attributes."""
    case = spec.cases(spec.dtypes[0], np.random.default_rng(0))[0]
    inputs = []
    for position, value in enumerate(case.inputs):
        decl = spec.inputs[min(position, len(spec.inputs) - 1)]
        inputs.append(value if value is None or decl.host else devkit.asarray(value, dev))
    return inputs, case.attrs


def _same(got, expected):
    got, expected = got.numpy(), expected.numpy()
    assert got.shape == expected.shape and got.dtype == expected.dtype and got.tobytes() == expected.tobytes()


def test_the_specs_with_optional_outputs():
    assert {s.name for s in OPTIONAL} == {"Attention", "BatchNormalization", "Dropout", "LayerNormalization",
                                          "MaxPool", "SoftmaxCrossEntropyLoss"}
    assert [s.name for s in ops.all_specs() if s.skippable_outputs] == ["MaxPool"]


@pytest.mark.parametrize("spec", ops.all_specs(), ids=lambda s: s.name)
def test_optional_outputs_follow_the_onnx_schema(spec):
    """optional_outputs counts the trailing outputs ONNX's schema (at the spec's opset) marks optional."""
    try:
        schema = onnx.defs.get_schema(spec.name, spec.opset, spec.domain)
    except onnx.defs.SchemaError:
        assert spec.domain == "devkit" and spec.optional_outputs == 0
        return
    options = [o.option for o in schema.outputs]
    trailing = 0
    while trailing < len(options) and options[len(options) - 1 - trailing] == onnx.defs.OpSchema.FormalParameterOption.Optional:
        trailing += 1
    assert spec.optional_outputs == trailing, f"{spec.name}: ONNX marks {trailing} trailing outputs optional"
    assert len(spec.outputs) == len(schema.outputs) or spec.outputs[-1].endswith("...")


@pytest.mark.parametrize("spec", OPTIONAL, ids=lambda s: s.name)
def test_default_call_returns_the_required_outputs(spec, dev):
    inputs, attrs = _call_inputs(spec, dev)
    op = getattr(ops, spec.name)
    full = devkit.run_op(spec.name, inputs, attrs)
    assert len(full) == len(spec.outputs)
    result = op(*inputs, **attrs)
    required = spec.required_outputs
    got = [result] if required == 1 else list(result)
    assert (required == 1) == isinstance(result, devkit.Array)
    assert len(got) == required
    for a, b in zip(got, full):
        _same(a, b)
    # Every output, by outputs=n, and each optional one by its keyword (after the required ones).
    everything = op(*inputs, **attrs, outputs=len(spec.outputs))
    assert len(everything) == len(spec.outputs)
    for a, b in zip(everything, full):
        _same(a, b)
    for position in range(required, len(spec.outputs)):
        keyword = ops.output_keyword(spec.outputs[position])
        assert keyword in op.__doc__
        asked = op(*inputs, **attrs, **{keyword: True})
        assert isinstance(asked, tuple) and len(asked) == required + 1, keyword
        _same(asked[-1], full[position])
    assert "returned only when asked for" in op.__doc__


@pytest.mark.parametrize("spec", OPTIONAL, ids=lambda s: s.name)
def test_outputs_a_kernel_cannot_skip_are_still_written(spec, dev, kernel_outputs):
    """run_op(outputs=n) returns n outputs; the kernel gets the call without
    only those optional outputs its kernels may skip."""
    inputs, attrs = _call_inputs(spec, dev)
    required = spec.required_outputs
    results = devkit.run_op(spec.name, inputs, attrs, outputs=required)
    assert len(results) == required
    assert kernel_outputs == [(spec.name, len(spec.outputs) - spec.skippable_outputs)]
    assert len(devkit.run_op(spec.name, inputs, attrs, outputs=required)) == required  # cached


def test_layer_normalization_statistics_by_keyword(dev):
    rng = np.random.default_rng(1)
    x = rng.standard_normal((4, 6)).astype(np.float32)
    scale = rng.standard_normal(6).astype(np.float32)
    xa, sa = devkit.asarray(x, dev), devkit.asarray(scale, dev)
    spec = ops.get("LayerNormalization")
    y_ref, mean_ref, inv_ref = spec.reference(*reference_arguments(spec, [x, scale]))
    y = ops.LayerNormalization(xa, sa)
    assert isinstance(y, devkit.Array)
    y, inv_std = ops.LayerNormalization(xa, sa, return_inv_std_dev=True)  # Mean left out
    np.testing.assert_allclose(y.numpy(), y_ref, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(inv_std.numpy(), inv_ref, rtol=1e-5)
    y, mean, inv_std = ops.LayerNormalization(xa, sa, return_mean=True, return_inv_std_dev=True)
    np.testing.assert_allclose(mean.numpy(), mean_ref, rtol=1e-5, atol=1e-6)


def test_decomposed_ops_return_the_required_outputs():
    """Where an op runs decomposed (DEVKIT_CPU_KERNELS=primitives) the rule's
    extra outputs are dropped the same way."""
    code = """
import numpy as np, devkit
from devkit import ops
dev = devkit.device("cpu:0")
x = devkit.asarray(np.random.default_rng(0).standard_normal((1, 2, 6, 6)).astype(np.float32), dev)
scale = devkit.asarray(np.ones(6, np.float32), dev)
assert ops.explain("MaxPool", "float32", dev).how == "decomposed"
y = ops.MaxPool(x, kernel_shape=[2, 2])
assert isinstance(y, devkit.Array) and y.shape == (1, 2, 5, 5)
y, indices = ops.MaxPool(x, kernel_shape=[2, 2], return_indices=True)
assert indices.dtype == np.int64
assert isinstance(ops.LayerNormalization(x, scale), devkit.Array)
y, inv = ops.LayerNormalization(x, scale, return_inv_std_dev=True)
assert inv.shape == (1, 2, 6, 1), inv.shape
print("ok")
"""
    run = run_python(code, {"DEVKIT_CPU_KERNELS": "primitives"})
    assert run.returncode == 0 and run.stdout.strip() == "ok", run.stderr


def test_a_call_without_attributes_returns_the_required_outputs_at_every_call(dev):
    """The op functions' plain call (no attributes, stream or device) goes
    straight to the call cache: a hit returns what the first call did, the
    required output only, and an asked-for optional output is its own entry."""
    dispatch.clear_call_cache()
    x = devkit.asarray(np.random.default_rng(3).standard_normal((4, 6)).astype(np.float32), dev)
    scale = devkit.asarray(np.ones(6, np.float32), dev)
    first, again = ops.LayerNormalization(x, scale), ops.LayerNormalization(x, scale)
    assert isinstance(first, devkit.Array) and isinstance(again, devkit.Array)
    np.testing.assert_array_equal(again.numpy(), first.numpy())
    y, mean = ops.LayerNormalization(x, scale, return_mean=True)
    np.testing.assert_array_equal(y.numpy(), first.numpy())
    np.testing.assert_allclose(mean.numpy().reshape(-1), x.numpy().mean(axis=1), rtol=1e-6, atol=1e-6)
    assert dispatch.call_cache_info() == {"hits": 1, "misses": 2, "entries": 2}
    dispatch.clear_call_cache()
