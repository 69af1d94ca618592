"""devkit.onnx.prepare / PreparedModel.run, devkit.onnx.Backend (also under
onnx's own backend test runner) and devkit.onnx.zoo, on the cpu plugin."""

from __future__ import annotations

import gc
import io
import unittest

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

import devkit
from devkit import onnx as donnx
from devkit.onnx import UnsupportedNodeError, zoo
from devkit.onnx.model import check_model
from devkit.ops import dispatch

F = TensorProto.FLOAT
OPSET = 21


def value(name, shape, elem_type=F):
    return helper.make_tensor_value_info(name, elem_type, shape)


def make_model(nodes, inputs, outputs, initializers=(), opset=OPSET, ir_version=None):
    graph = helper.make_graph(nodes, "test", inputs, outputs, list(initializers))
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    if ir_version is not None:
        model.ir_version = ir_version
    return model


def init(name, array):
    return numpy_helper.from_array(np.asarray(array), name)


def affine_model():
    """y = x @ w + b, with w and b initializers."""
    rng = np.random.default_rng(1)
    w, b = rng.standard_normal((4, 3)).astype(np.float32), rng.standard_normal(3).astype(np.float32)
    nodes = [helper.make_node("MatMul", ["x", "w"], ["xw"]), helper.make_node("Add", ["xw", "b"], ["y"])]
    model = make_model(nodes, [value("x", ["batch", 4])], [value("y", ["batch", 3])], [init("w", w), init("b", b)])
    return model, w, b


# -- prepare and run ----------------------------------------------------------------------------

def test_list_and_dict_inputs():
    model, w, b = affine_model()
    x = np.random.default_rng(2).standard_normal((5, 4)).astype(np.float32)
    prepared = donnx.prepare(model, "cpu:0")
    (by_list,) = prepared.run([x])
    (by_dict,) = prepared.run({"x": x})
    np.testing.assert_allclose(by_list, x.astype(np.float64) @ w + b, rtol=1e-5, atol=1e-6)
    np.testing.assert_array_equal(by_list, by_dict)
    assert prepared.feed_names == ["x"] and prepared.output_names == ["y"]


def test_model_as_bytes_or_path(tmp_path):
    model, _, _ = affine_model()
    x = np.ones((2, 4), np.float32)
    path = tmp_path / "affine.onnx"
    onnx.save(model, path)
    (from_path,) = donnx.prepare(path).run([x])
    (from_bytes,) = donnx.prepare(model.SerializeToString()).run([x])
    np.testing.assert_array_equal(from_path, from_bytes)
    with pytest.raises(TypeError, match="expected an onnx.ModelProto, bytes or a path"):
        donnx.prepare(42)


def test_initializer_inputs_are_overridable_defaults():
    """ONNX IR >= 4: a graph input that is also an initializer is an input with a default."""
    model = make_model([helper.make_node("Mul", ["x", "scale"], ["y"])],
                       [value("x", [3]), value("scale", [3])], [value("y", [3])],
                       [init("scale", np.array([1, 2, 3], np.float32))], ir_version=8)
    prepared = donnx.prepare(model)
    x = np.ones(3, np.float32)
    assert prepared.feed_names == ["x"] and prepared.input_names == ["x", "scale"]
    np.testing.assert_array_equal(prepared.run([x])[0], [1, 2, 3])
    override = np.array([5, 6, 7], np.float32)
    np.testing.assert_array_equal(prepared.run({"x": x, "scale": override})[0], [5, 6, 7])
    np.testing.assert_array_equal(prepared.run([x, override])[0], [5, 6, 7])  # a list of every graph input
    np.testing.assert_array_equal(prepared.run([x])[0], [1, 2, 3])  # the default is untouched


def test_values_of_initializers_alone_are_folded_once(device_ops):
    """The interpreter: Transpose(w) depends on no input: it runs at the first
    run only, unless a feed overrides w, which it then reads (plans:
    tests/test_engine.py)."""
    w = np.arange(80 * 60, dtype=np.float32).reshape(80, 60) / 1000  # above the host-value size
    nodes = [helper.make_node("Transpose", ["w"], ["wt"]), helper.make_node("MatMul", ["x", "wt"], ["y"])]
    model = make_model(nodes, [value("x", [2, 60]), value("w", [80, 60])], [value("y", [2, 80])],
                       [init("w", w)], ir_version=8)
    prepared = donnx.prepare(model, plan=False)
    x = np.random.default_rng(3).standard_normal((2, 60)).astype(np.float32)
    for _ in range(3):
        np.testing.assert_allclose(prepared.run([x])[0], x.astype(np.float64) @ w.T, rtol=1e-5, atol=1e-5)
    assert device_ops == {"Transpose": 1, "MatMul": 3}
    fed = w[::-1].copy()
    np.testing.assert_allclose(prepared.run({"x": x, "w": fed})[0], x.astype(np.float64) @ fed.T,
                               rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(prepared.run([x])[0], x.astype(np.float64) @ w.T, rtol=1e-5, atol=1e-5)
    assert device_ops == {"Transpose": 2, "MatMul": 5}


def shape_subgraph_model():
    """Reshape(x, Concat(Shape(x)[0:1], [2, 3])) -> Relu: x (batch, 6) -> (batch, 2, 3)."""
    nodes = [
        helper.make_node("Shape", ["x"], ["shape"]),
        helper.make_node("Gather", ["shape", "zero"], ["batch"], axis=0),
        helper.make_node("Unsqueeze", ["batch", "axes"], ["batch_1d"]),
        helper.make_node("Concat", ["batch_1d", "tail"], ["target"], axis=0),
        helper.make_node("Reshape", ["x", "target"], ["reshaped"]),
        helper.make_node("Relu", ["reshaped"], ["y"]),
    ]
    initializers = [init("zero", np.array(0, np.int64)), init("axes", np.array([0], np.int64)),
                    init("tail", np.array([2, 3], np.int64))]
    return make_model(nodes, [value("x", ["batch", 6])], [value("y", ["batch", 2, 3])], initializers)


def test_shape_subgraph_stays_on_the_host(device_ops):
    prepared = donnx.prepare(shape_subgraph_model(), plan=False)
    for batch in (4, 4, 1, 4):
        x = np.random.default_rng(batch).standard_normal((batch, 6)).astype(np.float32)
        (y,) = prepared.run([x])
        np.testing.assert_array_equal(y, np.maximum(x.reshape(batch, 2, 3), 0))
    # Shape, Gather, Unsqueeze and Concat never reached the device.
    assert device_ops == {"Reshape": 4, "Relu": 4}


def test_host_outputs_are_copies():
    model = make_model([helper.make_node("Shape", ["x"], ["s"])], [value("x", [None, 3])],
                       [value("s", [2], TensorProto.INT64)])
    prepared = donnx.prepare(model)
    (first,) = prepared.run([np.zeros((5, 3), np.float32)])
    first[:] = -1  # the caller's array: the cached shape must not change
    np.testing.assert_array_equal(prepared.run([np.zeros((5, 3), np.float32)])[0], [5, 3])


def relu_chain_model(length: int, size: int):
    """h0 (size,) -> ``length`` Relus -> h{length}."""
    nodes = [helper.make_node("Relu", [f"h{i}"], [f"h{i + 1}"]) for i in range(length)]
    return make_model(nodes, [value("h0", [size])], [value(f"h{length}", [size])])


def test_intermediate_values_are_freed_after_their_last_use(monkeypatch):
    """The interpreter: a chain of Relus holds two activations at a time, not
    the whole chain (a plan's arena: tests/test_engine.py)."""
    dev = devkit.device("cpu:0")
    model = relu_chain_model(8, 1 << 18)
    prepared = donnx.prepare(model, dev, plan=False)
    x = np.random.default_rng(4).standard_normal(1 << 18).astype(np.float32)
    baseline = devkit.memory_stats(dev)["allocated_bytes"]
    peak = 0
    run_op = dispatch.run_op

    def sampling(*args, **kwargs):
        nonlocal peak
        outputs = run_op(*args, **kwargs)
        peak = max(peak, devkit.memory_stats(dev)["allocated_bytes"] - baseline)
        return outputs

    monkeypatch.setattr(dispatch, "run_op", sampling)
    np.testing.assert_array_equal(prepared.run([x])[0], np.maximum(x, 0))
    assert 2 * x.nbytes <= peak <= 3 * x.nbytes


@pytest.mark.parametrize("plan", [True, False], ids=["plan", "interpreter"])
def test_prepared_model_releases_its_device_memory(plan):
    dev = devkit.device("cpu:0")
    gc.collect()
    devkit.empty_cache(dev)
    before = dev.mem_get_info()[0], devkit.memory_stats(dev)["allocated_bytes"]
    model, inputs = zoo.resnet()
    prepared = donnx.prepare(model, dev, plan=plan)
    prepared.run(inputs)
    held = devkit.memory_stats(dev)["allocated_bytes"] - before[1]  # weights, folded constants, an arena
    assert held > (prepared.plans[(("x", inputs["x"].shape),)].arena_bytes if plan else 0)
    del prepared
    gc.collect()
    assert devkit.memory_stats(dev)["allocated_bytes"] == before[1]
    devkit.empty_cache(dev)
    assert dev.mem_get_info()[0] == before[0]


def test_opset_9_model_is_upgraded():
    """Opset 9 semantics: Unsqueeze's axes attribute, Softmax over the flattened
    trailing dims, Upsample (removed in opset 10) -- all through onnx's version converter."""
    nodes = [helper.make_node("Unsqueeze", ["x"], ["u"], axes=[0]),
             helper.make_node("Softmax", ["u"], ["s"], axis=2),
             helper.make_node("Upsample", ["s", "scales"], ["up"], mode="nearest"),
             helper.make_node("ReduceSum", ["up"], ["y"], axes=[3], keepdims=0)]
    model = make_model(nodes, [value("x", [2, 3, 4])], [value("y", None)],
                       [init("scales", np.array([1, 1, 2, 2], np.float32))], opset=9, ir_version=4)
    prepared = donnx.prepare(model)
    assert [e.version for e in prepared.model.opset_import if e.domain == ""] == [13]
    x = np.random.default_rng(5).standard_normal((2, 3, 4)).astype(np.float32)
    exp = np.exp(x.astype(np.float64).reshape(2, 12))  # opset < 13: softmax over dims [axis, rank) together
    softmax = (exp / exp.sum(axis=1, keepdims=True)).reshape(1, 2, 3, 4)
    upsampled = softmax.repeat(2, axis=2).repeat(2, axis=3)
    np.testing.assert_allclose(prepared.run([x])[0], upsampled.sum(axis=3), rtol=1e-6, atol=1e-7)


def test_model_the_converter_cannot_upgrade_fails_at_prepare():
    # Opset 9 dropped Scan's sequence_lens input: the 8 -> 9 adapter refuses a Scan that has one.
    body = helper.make_graph([helper.make_node("Identity", ["s"], ["t"])], "body", [value("s", [1])], [value("t", [1])])
    model = make_model([helper.make_node("Scan", ["lens", "x"], ["y"], num_scan_inputs=1, body=body)],
                       [value("lens", [1], TensorProto.INT32), value("x", [1, 1, 1])], [value("y", [1, 1, 1])],
                       opset=8, ir_version=4)
    with pytest.raises(UnsupportedNodeError, match="opset 8, and onnx's version converter could not bring it to 13"):
        donnx.prepare(model)


def max_pool_model(outputs):
    """y = MaxPool(Relu(x)), 3x3 stride 2 pad 1 (ResNet's stem), the node's outputs named ``outputs``."""
    nodes = [helper.make_node("Relu", ["x"], ["r"]),
             helper.make_node("MaxPool", ["r"], outputs, kernel_shape=[3, 3], strides=[2, 2], pads=[1, 1, 1, 1])]
    graph_outputs = [value("y", [2, 3, 5, 5])] + ([value("i", [2, 3, 5, 5], TensorProto.INT64)] if "i" in outputs
                                                  else [])
    return make_model(nodes, [value("x", [2, 3, 9, 9])], graph_outputs)


@pytest.mark.parametrize("plan", [True, False], ids=["plan", "interpreter"])
@pytest.mark.parametrize("outputs", [["y"], ["y", ""]], ids=["one-output", "empty-name"])
def test_max_pool_node_without_indices_computes_only_y(plan, outputs, monkeypatch):
    """A MaxPool node that does not use Indices gets a kernel call with only Y,
    and the same Y as a node with both outputs."""
    x = np.random.default_rng(3).standard_normal((2, 3, 9, 9)).astype(np.float32)
    padded = np.pad(np.maximum(x, 0), [(0, 0), (0, 0), (1, 1), (1, 1)], constant_values=-np.inf)
    reference = np.max([padded[:, :, i:i + 9:2, j:j + 9:2] for i in range(3) for j in range(3)], axis=0)
    output_counts = []
    call_kernel = dispatch._call_kernel

    def counting(dev, entry, op, inputs, results, *args):
        if op == "MaxPool":
            output_counts.append(len(results))
        return call_kernel(dev, entry, op, inputs, results, *args)

    monkeypatch.setattr(dispatch, "_call_kernel", counting)
    dispatch.clear_call_cache()
    prepared = donnx.prepare(max_pool_model(outputs), "cpu:0", plan=plan)
    (y,) = prepared.run([x])
    (y_of_both, indices) = donnx.prepare(max_pool_model(["y", "i"]), "cpu:0", plan=plan).run([x])
    np.testing.assert_array_equal(y, reference)
    np.testing.assert_array_equal(y, y_of_both)
    assert indices.dtype == np.int64 and indices.shape == y.shape
    if plan:
        (signature,) = prepared.plans
        output_counts = [call.cdata.num_outputs for call in prepared.plans[signature].calls
                         if getattr(call, "op", None) == "MaxPool"]
    assert output_counts[:1] == [1]


# -- errors ----------------------------------------------------------------------------------------

def relu_model(**attrs):
    return make_model([helper.make_node("Relu", ["x"], ["y"], name="act", **attrs)], [value("x", [2, 3])],
                      [value("y", [2, 3])])


def test_op_outside_the_set_fails_at_prepare():
    model = make_model([helper.make_node("Relu", ["x"], ["h"]),
                        helper.make_node("Shrink", ["h"], ["y"], name="shrinker")],
                       [value("x", [3])], [value("y", [3])])
    with pytest.raises(UnsupportedNodeError, match=r"node 'shrinker' \(Shrink\): op Shrink is not in"):
        donnx.prepare(model)


def test_attribute_outside_the_set_fails_at_prepare():
    with pytest.raises(UnsupportedNodeError, match=r"node 'act' \(Relu\): attribute 'alpha' is not supported"):
        donnx.prepare(relu_model(alpha=0.5))
    norm = make_model([helper.make_node("LayerNormalization", ["x", "scale"], ["y"], name="norm", stash_type=0)],
                      [value("x", [2, 3])], [value("y", [2, 3])], [init("scale", np.ones(3, np.float32))])
    with pytest.raises(UnsupportedNodeError, match=r"node 'norm' \(LayerNormalization\): .*'stash_type'"):
        donnx.prepare(norm)


def test_dtype_outside_the_set_fails_at_prepare():
    model = make_model([helper.make_node("Sqrt", ["x"], ["y"], name="root")], [value("x", [3], TensorProto.INT32)],
                       [value("y", [3], TensorProto.INT32)])
    with pytest.raises(UnsupportedNodeError, match=r"node 'root' \(Sqrt\): Sqrt on int32 is outside the op set"):
        donnx.prepare(model)
    strings = make_model([helper.make_node("Identity", ["s"], ["y"])], [value("s", [3], TensorProto.STRING)],
                         [value("y", [3], TensorProto.STRING)])
    with pytest.raises(UnsupportedNodeError, match="STRING is not a devkit dtype"):
        donnx.prepare(strings)


def test_opset_beyond_the_policy_fails_at_prepare():
    model = make_model([helper.make_node("Relu", ["x"], ["y"])], [value("x", [3])], [value("y", [3])], opset=24)
    with pytest.raises(UnsupportedNodeError, match="opset 24; devkit runs opsets 13 to 23"):
        donnx.prepare(model)


def test_bad_inputs_fail_with_their_name():
    prepared = donnx.prepare(relu_model())
    with pytest.raises(TypeError, match="input 'x' has dtype float64, the model declares float32"):
        prepared.run([np.zeros((2, 3))])
    with pytest.raises(ValueError, match="input 'x' is missing"):
        prepared.run({})
    with pytest.raises(ValueError, match="unknown input 'z'"):
        prepared.run({"x": np.zeros((2, 3), np.float32), "z": np.zeros(1, np.float32)})
    with pytest.raises(ValueError, match="2 inputs given; the model takes 1"):
        prepared.run([np.zeros((2, 3), np.float32)] * 2)
    with pytest.raises(ValueError, match=r"input 'x' has shape \(3, 2\), the model declares \(2, 3\)"):
        prepared.run([np.zeros((3, 2), np.float32)])



# -- malformed models: devkit.onnx's own error naming the node or value -----------------------------

def node(op, inputs, outputs, name="", **attrs):
    return helper.make_node(op, inputs, outputs, name=name, **attrs)


MALFORMED = {
    "cycle": (
        [node("Add", ["x", "b"], ["a"], "first"), node("Relu", ["a"], ["b"], "second"), node("Relu", ["a"], ["y"])],
        r"the graph has a cycle: node 0 'first' \(Add\) <- node 1 'second' \(Relu\) <- node 0 'first' \(Add\) "
        r"\(each reads an output of the next\)$"),
    "self_loop": ([node("Add", ["x", "y"], ["y"], "loop")],
                  r"cycle: node 0 'loop' \(Add\) <- node 0 'loop' \(Add\)"),
    "graph_output_nothing_produces": ([node("Relu", ["x"], ["h"])],
                                      r"^graph output 'y' is not a graph input, an initializer or any node's output$"),
    "missing_graph_input": ([node("Add", ["x", "w"], ["y"], "adder")],
                            r"^node 0 'adder' \(Add\): input 'w' is not a graph input, an initializer or any "
                            r"node's output$"),
    "constant_without_value": ([node("Constant", [], ["c"]), node("Add", ["x", "c"], ["y"])],
                               r"^node 'c' \(Constant\): a Constant has exactly one value attribute .*; "
                               r"this one has none$"),
    "constant_with_two_values": ([node("Constant", [], ["c"], value_float=1.0, value_int=2),
                                  node("Add", ["x", "c"], ["y"])],
                                 r"this one has 'value_float', 'value_int'$"),
    "nameless_node_without_outputs": ([node("Relu", ["x"], ["y"]), node("Relu", ["x"], [])],
                                      r"^node 1 \(Relu, nameless\) has no outputs$"),
    "value_produced_twice": ([node("Relu", ["x"], ["y"], "one"), node("Neg", ["x"], ["y"], "two")],
                             r"^value 'y' is produced twice: by node 0 'one' \(Relu\) and by node 1 'two' \(Neg\)$"),
    "output_named_as_a_graph_input": ([node("Relu", ["x"], ["x"], "clobber"), node("Neg", ["x"], ["y"])],
                                      r"^value 'x' is produced twice: by a graph input or initializer and by "
                                      r"node 0 'clobber' \(Relu\)$"),
}


@pytest.mark.parametrize("case", sorted(MALFORMED))
def test_malformed_model_raises_invalid_model_error_naming_the_node(case):
    nodes, message = MALFORMED[case]
    model = make_model(nodes, [value("x", [3])], [value("y", [3])])
    for check in (donnx.prepare, check_model):
        with pytest.raises(donnx.InvalidModelError, match=message):
            check(model)
    assert not donnx.Backend.is_compatible(model)


def test_nodes_out_of_order_are_sorted():
    nodes = [node("Neg", ["h"], ["y"], "last"), node("Mul", ["x", "two"], ["t"], "first"),
             node("Relu", ["t"], ["h"], "middle")]
    model = make_model(nodes, [value("x", [3])], [value("y", [3])], [init("two", np.float32([2, 2, 2]))])
    x = np.float32([-1, 0.5, 3])
    (y,) = donnx.prepare(model).run([x])
    np.testing.assert_array_equal(y, -np.maximum(x * 2, 0))
    # Independent nodes keep the model's order (a stable sort, as onnxruntime's).
    sorted_names = [step.node.name for step in donnx.model._Checked(model).steps]
    assert sorted_names == ["first", "middle", "last"]
    parallel = make_model([node("Neg", ["x"], ["b"], "b"), node("Relu", ["x"], ["a"], "a"),
                           node("Add", ["a", "b"], ["y"], "sum")], [value("x", [3])], [value("y", [3])])
    assert [step.node.name for step in donnx.model._Checked(parallel).steps] == ["b", "a", "sum"]

# -- Backend ------------------------------------------------------------------------------------------

def test_backend_run_node():
    node = helper.make_node("Add", ["a", "b"], ["c"])
    a, b = np.arange(6, dtype=np.float32).reshape(2, 3), np.float32([10, 20, 30])
    (c,) = donnx.Backend.run_node(node, [a, b])
    np.testing.assert_array_equal(c, a + b)
    with pytest.raises(UnsupportedNodeError, match="Shrink"):
        donnx.Backend.run_node(helper.make_node("Shrink", ["a"], ["y"]), [a])


def test_backend_devices():
    assert donnx.Backend.supports_device("CPU")
    assert donnx.Backend.supports_device("cpu:1")
    assert not donnx.Backend.supports_device("cpu:99")
    assert not donnx.Backend.supports_device("nonexistent:0")
    assert not donnx.Backend.supports_device("CUDA")
    second = donnx.Backend.for_device("cpu:1")
    model, w, b = affine_model()
    rep = second.prepare(model)
    assert rep.prepared.device.index == 1
    x = np.ones((1, 4), np.float32)
    np.testing.assert_allclose(rep.run([x])[0], x @ w + b, rtol=1e-6)
    np.testing.assert_array_equal(second.run_model(model, [x])[0], rep.run([x])[0])


def test_backend_is_compatible():
    model, _, _ = affine_model()
    assert donnx.Backend.is_compatible(model)
    shrink = make_model([helper.make_node("Shrink", ["x"], ["y"])], [value("x", [3])], [value("y", [3])])
    assert not donnx.Backend.is_compatible(shrink)


# Node tests and model tests of onnx's own runner, on donnx.Backend's "CPU" (cpu:0).
RUNNER_TESTS = [
    "test_relu", "test_add_bcast", "test_softmax_axis_1", "test_gemm_default_matrix_bias",
    "test_conv_with_strides_padding", "test_gather_0", "test_maxpool_2d_pads",
    "test_layer_normalization_2d_axis0", "test_split_equal_parts_1d_opset13", "test_attention_4d",
    "test_rms_normalization_2d_axis0", "test_rotary_embedding",
    "test_single_relu_model", "test_sign_model", "test_expand_shape_model1",
    "test_Conv2d", "test_BatchNorm2d_eval", "test_operator_add_broadcast", "test_operator_chunk",
]


def test_onnx_backend_test_runner():
    from onnx.backend.test import BackendTest

    backend_test = BackendTest(donnx.Backend, __name__)
    for name in RUNNER_TESTS:
        backend_test.include(f"^{name}_cpu$")
    output = io.StringIO()
    result = unittest.TextTestRunner(stream=output, verbosity=2).run(backend_test.test_suite)
    assert result.wasSuccessful(), output.getvalue()
    assert result.testsRun - len(result.skipped) == len(RUNNER_TESTS), output.getvalue()


# -- zoo ------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("name", sorted(zoo.MODELS))
def test_zoo_model_is_valid_and_seeded(name):
    model, inputs = zoo.MODELS[name]()
    onnx.checker.check_model(model, full_check=True)
    # The opset's own IR version, which an onnxruntime older than onnx loads too.
    assert model.ir_version == onnx.helper.find_min_ir_version_for(model.opset_import) < onnx.IR_VERSION
    assert [i.name for i in model.graph.input] == list(inputs)
    again, again_inputs = zoo.MODELS[name]()
    assert again.SerializeToString() == model.SerializeToString()
    for key in inputs:
        np.testing.assert_array_equal(again_inputs[key], inputs[key])
    other, _ = zoo.MODELS[name](seed=1)
    assert other.SerializeToString() != model.SerializeToString()
    check_model(model)  # every op, attribute and dtype in the set
