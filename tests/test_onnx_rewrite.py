"""devkit.onnx.prepare's graph rewrites (devkit/onnx/rewrite.py): the
BatchNormalization fold into Conv and FusedConv, where each applies and where
it must not; and FusedConv's kernel call through the cpu plugin's raw ABI
(the op itself runs in the op conformance suite)."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper

import devkit
from devkit import onnx as donnx
from devkit.abi import C
from devkit.engine.calls import KernelCall
from devkit.onnx import zoo
from devkit.onnx.rewrite import Rewrite
from devkit.ops import testing
from devkit.ops.linalg import dot_tolerance, magnitude

F, D = TensorProto.FLOAT, TensorProto.DOUBLE
# Zoo models, rewritten or not, agree as the models suite holds them to onnxruntime.
ZOO_TOLERANCE = {"rtol": 1e-4, "atol": 1e-5}


def init(name, array):
    return numpy_helper.from_array(np.asarray(array), name)


def conv_block(rng, *, dtype=np.float32, channels=4, size=6, residual=False, conv_bias=True,
               graph_inputs=(), extra_outputs=(), extra_nodes=(), bn_params=None, epsilon=1e-5):
    """x (1, 3, size, size) -> Conv (3x3, pads 1) -> BatchNormalization [-> Add(r)] -> Relu -> y.
    ``graph_inputs``: initializers also listed as graph inputs; ``extra_outputs``:
    intermediates also made graph outputs; ``extra_nodes``: appended as they are."""
    elem = F if dtype == np.float32 else D
    w = rng.standard_normal((channels, 3, 3, 3)).astype(dtype)
    params = bn_params or [rng.uniform(0.5, 1.5, channels), rng.standard_normal(channels) * 0.1,
                           rng.standard_normal(channels) * 0.1, rng.uniform(0.5, 1.5, channels)]
    initializers = {"w": w, "scale": params[0], "bias": params[1], "mean": params[2], "var": params[3]}
    if conv_bias:
        initializers["b"] = rng.standard_normal(channels)
    initializers = {name: np.asarray(value, dtype) for name, value in initializers.items()}
    nodes = [helper.make_node("Conv", ["x", "w"] + (["b"] if conv_bias else []), ["c"], name="conv",
                              pads=[1, 1, 1, 1]),
             helper.make_node("BatchNormalization", ["c", "scale", "bias", "mean", "var"], ["n"], name="bn",
                              epsilon=epsilon)]
    last = "n"
    if residual:
        nodes.append(helper.make_node("Add", ["n", "r"], ["s"], name="add"))
        last = "s"
    nodes += [helper.make_node("Relu", [last], ["y"], name="relu"), *extra_nodes]
    shape = [1, channels, size, size]
    inputs = [helper.make_tensor_value_info("x", elem, [1, 3, size, size])]
    if residual:
        inputs.append(helper.make_tensor_value_info("r", elem, shape))
    inputs += [helper.make_tensor_value_info(name, elem, list(initializers[name].shape)) for name in graph_inputs]
    outputs = [helper.make_tensor_value_info(name, elem, None) for name in ["y", *extra_outputs]]
    graph = helper.make_graph(nodes, "block", inputs, outputs, [init(n, a) for n, a in initializers.items()])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 19)])
    feed = {"x": rng.standard_normal((1, 3, size, size)).astype(dtype)}
    if residual:
        feed["r"] = rng.standard_normal(shape).astype(dtype)
    return model, feed


def _runs(model, feed, **options):
    """The outputs as a plan and as the interpreter (which must agree bit for bit), and the report."""
    planned = donnx.prepare(model, "cpu:0", **options)
    interpreted = donnx.prepare(model, "cpu:0", plan=False, **options)
    got = planned.run(feed)
    for a, b in zip(got, interpreted.run(feed)):
        np.testing.assert_array_equal(a, b)
    return got, planned.rewrites


# -- where the rewrites apply -------------------------------------------------------------------------

def test_the_fold_is_exact_where_its_arithmetic_is():
    """Integer weights and inputs, and scale / sqrt(var + epsilon) powers of two:
    W', B' and every sum are exact, so folded and unfolded models agree bit
    for bit, and with the float64 NumPy reference."""
    rng = np.random.default_rng(0)
    params = [[2.0, 4.0, -2.0, 1.0], [1.0, -3.0, 0.0, 2.0], [-1.0, 2.0, 5.0, 0.0], [3.0, 3.0, 3.0, 3.0]]
    model, _ = conv_block(rng, bn_params=params, epsilon=1.0)  # sqrt(3 + 1) = 2
    for proto in model.graph.initializer:
        if proto.name in ("w", "b"):
            proto.CopyFrom(init(proto.name, rng.integers(-2, 3, numpy_helper.to_array(proto).shape).astype(np.float32)))
    x = rng.integers(-3, 4, (1, 3, 6, 6)).astype(np.float32)
    (folded,), report = _runs(model, {"x": x})
    (unfolded,), off = _runs(model, {"x": x}, optimize=False)
    assert report.applied == [Rewrite("fold_batchnorm", ("conv", "bn"), "conv"),
                              Rewrite("fused_conv", ("conv", "relu"), "conv")]
    assert not off.enabled and not off.applied
    np.testing.assert_array_equal(folded, unfolded)
    w, b = (numpy_helper.to_array(p).astype(np.float64) for p in model.graph.initializer if p.name in ("w", "b"))
    scale, bias, mean, var = (np.asarray(p, np.float64)[:, None, None] for p in params)
    conv = donnx_conv_reference(x, w, b)
    np.testing.assert_array_equal(folded[0], np.maximum(scale * (conv - mean) / np.sqrt(var + 1.0) + bias, 0))


def donnx_conv_reference(x, w, b):
    from devkit import ops

    return ops.get("Conv").reference([x.astype(np.float64), w, b], {"group": 1, "auto_pad": "NOTSET",
                                                                      "pads": [1, 1, 1, 1]})[0][0]


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("residual", [False, True])
@pytest.mark.parametrize("conv_bias", [False, True])
def test_rewritten_block_is_within_the_conv_tolerance_of_the_unrewritten_one(dtype, residual, conv_bias):
    """Folded and fused, the block differs from the node-by-node one by the
    rounding of W' = W * s and of BatchNormalization: held to the Conv
    tolerance over the 27 products (plus B and Z), with S the largest sum of
    |x| |W'| (+ |B'| + |Z|)."""
    rng = np.random.default_rng(1)
    model, feed = conv_block(rng, dtype=dtype, residual=residual, conv_bias=conv_bias)
    (got,), report = _runs(model, feed)
    (want,), _ = _runs(model, feed, optimize=False)
    assert [r.kind for r in report.applied] == ["fold_batchnorm", "fused_conv"]
    assert report.applied[1].nodes == (("conv", "add", "relu") if residual else ("conv", "relu"))
    values = {p.name: numpy_helper.to_array(p).astype(np.float64) for p in model.graph.initializer}
    factor = values["scale"] / np.sqrt(values["var"] + 1e-5)
    folded_w = values["w"] * factor[:, None, None, None]
    sums = donnx_conv_reference(magnitude(feed["x"]), magnitude(folded_w), None)
    sums += np.abs((values.get("b", 0) - values["mean"]) * factor + values["bias"])[:, None, None]
    if residual:
        sums += magnitude(feed["r"])[0]
    comparison = testing.compare(got, want, dot_tolerance(dtype, 27 + 2, float(sums.max())))
    assert comparison.ok, comparison.message


@pytest.mark.parametrize("name", ["resnet", "unet"])
def test_zoo_models_agree_rewritten_or_not_and_with_onnxruntime(name):
    ort = pytest.importorskip("onnxruntime", reason="compared with onnxruntime: pip install 'devkit[test]'")
    model, feed = zoo.MODELS[name]()
    (got,), report = _runs(model, feed)
    (unrewritten,), _ = _runs(model, feed, optimize=False)
    (want,) = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, feed)
    np.testing.assert_allclose(got, unrewritten, **ZOO_TOLERANCE)
    np.testing.assert_allclose(got, want, **ZOO_TOLERANCE)
    counts = report.as_dict()
    if name == "resnet":  # 6 Conv + BatchNormalization; 3 Relu after a Conv, 2 after a residual Add
        assert (counts["folded_batchnorms"], counts["fused_convs"]) == (6, 5), counts
    else:  # 7 Conv -> Relu, no BatchNormalization
        assert (counts["folded_batchnorms"], counts["fused_convs"]) == (0, 7), counts


def test_the_rewrite_drops_the_weights_it_folded():
    rng = np.random.default_rng(2)
    model, _ = conv_block(rng)
    prepared = donnx.prepare(model, "cpu:0")
    assert not {"w", "b", "scale", "bias", "mean", "var"} & set(prepared._initializers)
    assert len(prepared._initializers) == 2  # W' and B'


# -- where they must not apply --------------------------------------------------------------------------

def _kept(report, rewrite_kind_absent: str) -> str:
    assert rewrite_kind_absent not in [r.kind for r in report.applied], report.applied
    return "\n".join(report.kept)


def test_no_fold_when_a_parameter_is_a_graph_input():
    """An initializer that is also a graph input is a default a feed may override: not a constant."""
    rng = np.random.default_rng(3)
    model, feed = conv_block(rng, graph_inputs=["scale"])
    (got,), report = _runs(model, feed)
    assert "conv -> bn: 'scale' is not a constant" in _kept(report, "fold_batchnorm")
    # Overriding the default changes the result, as it must when nothing folded it in.
    prepared = donnx.prepare(model, "cpu:0")
    (doubled,) = prepared.run({**feed, "scale": 2 * numpy_helper.to_array(model.graph.initializer[1])})
    assert not np.array_equal(got, doubled)


def test_no_fold_when_a_parameter_is_computed():
    rng = np.random.default_rng(4)
    model, feed = conv_block(rng)
    bn = next(n for n in model.graph.node if n.op_type == "BatchNormalization")
    bn.input[1] = "scale_copy"
    model.graph.node.insert(0, helper.make_node("Identity", ["scale"], ["scale_copy"], name="copy"))
    (got,), report = _runs(model, feed)
    assert "conv -> bn: 'scale_copy' is not a constant" in _kept(report, "fold_batchnorm")
    (want,), _ = _runs(model, feed, optimize=False)
    np.testing.assert_array_equal(got, want)


def test_no_fold_when_the_conv_output_has_another_reader_or_is_a_graph_output():
    rng = np.random.default_rng(5)
    two_readers, feed = conv_block(rng, extra_nodes=[helper.make_node("Neg", ["c"], ["minus"], name="neg")],
                                   extra_outputs=["minus"])
    (y, minus), report = _runs(two_readers, feed)
    assert "conv -> bn: the Conv's output 'c' has other readers or is a graph output" in _kept(report, "fold_batchnorm")
    graph_output, _ = conv_block(rng, extra_outputs=["c"])
    (y2, c), report = _runs(graph_output, feed)
    assert "conv -> bn: the Conv's output 'c' has other readers" in _kept(report, "fold_batchnorm")
    (y_want, c_want), _ = _runs(graph_output, feed, optimize=False)
    np.testing.assert_array_equal(c, c_want)


def test_no_fold_in_training_mode():
    rng = np.random.default_rng(6)
    model, feed = conv_block(rng)
    bn = next(n for n in model.graph.node if n.op_type == "BatchNormalization")
    bn.attribute.append(helper.make_attribute("training_mode", 1))
    _, report = _runs(model, feed)
    assert "conv -> bn: the BatchNormalization is in training mode" in _kept(report, "fold_batchnorm")


def test_no_fusion_when_an_intermediate_has_another_reader_or_is_a_graph_output():
    rng = np.random.default_rng(7)
    model, feed = conv_block(rng, residual=True, extra_outputs=["s"])
    (y, s), report = _runs(model, feed)
    assert "conv -> add -> relu: 's' has other readers or is a graph output" in _kept(report, "fused_conv")
    assert [r.kind for r in report.applied] == ["fold_batchnorm"]
    model, feed = conv_block(rng, residual=True,
                             extra_nodes=[helper.make_node("Neg", ["n"], ["minus"], name="neg")],
                             extra_outputs=["minus"])
    _, report = _runs(model, feed)
    assert "'n' has other readers or is a graph output" in _kept(report, "fused_conv")


def test_no_fusion_when_the_add_broadcasts():
    """Z must have the Conv output's shape; a broadcast Add stays an Add."""
    rng = np.random.default_rng(8)
    model, feed = conv_block(rng, residual=True)
    r = next(v for v in model.graph.input if v.name == "r")
    r.CopyFrom(helper.make_tensor_value_info("r", F, [1, 4, 1, 1]))
    feed["r"] = rng.standard_normal((1, 4, 1, 1)).astype(np.float32)
    (got,), report = _runs(model, feed)
    assert "are not known to have one shape" in _kept(report, "fused_conv")
    (want,), _ = _runs(model, feed, optimize=False)
    comparison = testing.compare(got, want, dot_tolerance(np.float32, 27, 64.0))
    assert comparison.ok, comparison.message


def test_no_fusion_where_the_plugin_has_no_fused_conv_kernel(monkeypatch):
    """The Add and Relu stay for the fusion pass, which fuses them into one generated kernel."""
    monkeypatch.setattr(donnx.PreparedModel, "_has_fused_conv", lambda self, dtype: False)
    rng = np.random.default_rng(9)
    model, feed = conv_block(rng, residual=True)
    prepared = donnx.prepare(model, "cpu:0", fuse=True)
    prepared.run(feed)
    assert "the plugin has no FusedConv kernel for float32" in _kept(prepared.rewrites, "fused_conv")
    if prepared.device.plugin.has_codegen:
        (fusion,) = prepared.fusion.values()
        assert fusion["groups"] == 1, fusion


def test_on_opencl_the_fold_applies_and_fusedconv_does_not():
    """opencl runs FusedConv by decomposition only: the Conv, Add and Relu stay."""
    pytest.importorskip("pyopencl", reason="pyopencl is not installed (scripts/install-opencl.sh)")
    try:
        plugin = devkit.load_plugin("opencl")
    except devkit.PluginLoadError as exc:
        pytest.skip(reason=f"no usable OpenCL device: {exc}")
    rng = np.random.default_rng(10)
    model, feed = conv_block(rng, residual=True)
    prepared = donnx.prepare(model, plugin.device(0))
    (got,) = prepared.run(feed)
    assert [r.kind for r in prepared.rewrites.applied] == ["fold_batchnorm"]
    assert "conv -> add -> relu: the plugin has no FusedConv kernel for float32" in prepared.rewrites.kept
    (want,), _ = _runs(model, feed)
    np.testing.assert_allclose(got, want, **ZOO_TOLERANCE)


# -- FusedConv through the raw ABI ------------------------------------------------------------------------

def _fused_conv_call(dev, z_shape=(1, 2, 4, 4), activation="Relu", z_dtype=np.float32):
    entry = dev.plugin.kernel_entry("FusedConv", np.float32)
    x = devkit.asarray(np.ones((1, 3, 4, 4), np.float32), dev)
    w = devkit.asarray(np.ones((2, 3, 3, 3), np.float32), dev)
    z = devkit.asarray(np.ones(z_shape, z_dtype), dev)
    y = devkit.empty((1, 2, 4, 4), np.float32, dev)
    attributes = [("pads", "ints", [1, 1, 1, 1]), ("group", "int", 1), ("auto_pad", "string", "NOTSET"),
                  ("activation", "string", activation)]
    return KernelCall(dev, entry, "FusedConv", [x, w, None, z], [y], attributes), y


@pytest.mark.parametrize("change, message", [
    ({"z_shape": (1, 2, 4, 3)}, "input 3 (Z) has shape (1,2,4,3); it must have the output's shape (1,2,4,4)"),
    ({"z_shape": (2, 4, 4)}, "input 3 (Z) has shape (2,4,4)"),
    ({"activation": "Tanh"}, "activation"),
    ({"z_dtype": np.float64}, "input 3"),
])
def test_a_bad_fused_conv_call_returns_an_error_status(change, message):
    dev = devkit.load_plugin("cpu").device(0)
    call, _ = _fused_conv_call(dev, **change)
    assert call.fn(call.cdata) == C.DK_INVALID_ARGUMENT
    assert message in dev.plugin.last_error_message()


def test_a_good_fused_conv_call_computes_the_epilogue():
    dev = devkit.load_plugin("cpu").device(0)
    call, y = _fused_conv_call(dev)
    assert call.fn(call.cdata) == C.DK_OK
    dev.synchronize()
    # Each output sums the 3 x (taps inside the padded plane) ones, plus Z = 1.
    taps = np.array([2, 3, 3, 2])
    want = 3 * taps[:, None] * taps[None, :] + 1.0
    np.testing.assert_array_equal(y.numpy(), np.broadcast_to(want, (1, 2, 4, 4)))


def test_fused_conv_refuses_an_unknown_activation_and_a_z_of_another_shape():
    x, w = np.ones((1, 3, 4, 4), np.float32), np.ones((2, 3, 3, 3), np.float32)
    with pytest.raises(ValueError, match="activation"):
        devkit.run_op("FusedConv", [x, w], {"activation": "Tanh"})
    with pytest.raises(ValueError, match=r"Z has shape \(1, 2, 3, 2\); it must have the output's shape \(1, 2, 2, 2\)"):
        devkit.run_op("FusedConv", [x, w, None, np.ones((1, 2, 3, 2), np.float32)], {})
