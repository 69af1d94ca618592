"""devkit.codegen's rules and printers, and the engine's fusion pass, on the cpu plugin."""

from __future__ import annotations

import numpy as np
import pytest

import devkit
import devkit.onnx
from devkit import codegen
from devkit.codegen import printers
from devkit.bench import fusion as patterns
from devkit.engine import fusion
from devkit.ops import PRIMITIVES, fallback_report

F32 = np.dtype(np.float32)


def _cpu():
    dev = devkit.device("cpu:0")
    if not dev.plugin.has_codegen:
        pytest.skip(reason="no C compiler at run time: the cpu plugin has no codegen section")
    return dev


def _group(op: str, arity: int, attrs=None, shape=(3, 5)) -> codegen.Group:
    inputs = [codegen.TensorArg(shape, (shape[1], 1), F32) for _ in range(arity)]
    ops = [codegen.GroupOp(op, tuple(("in", k) for k in range(arity)), attrs or {}, (F32,) * arity, F32, shape)]
    return codegen.Group(shape, inputs, ops, [(0, codegen.TensorArg(shape, (shape[1], 1), F32))])


def test_every_elementwise_primitive_with_a_rule_renders_in_every_dialect():
    ruled = sorted(PRIMITIVES & set(codegen.RULES) - {"Where", "Equal", "Less", "Cast"})
    assert {"Add", "Mul", "Div", "Pow", "Exp", "Log", "Sqrt", "Erf"} <= set(ruled)
    for op in ruled:
        arity = 2 if op in ("Add", "Mul", "Div", "Pow") else 1
        sources = {d: codegen.render(_group(op, arity), codegen.printer(d)).source for d in codegen.PRINTERS}
        assert "get_global_id(0)" in sources["opencl-c"] and "__kernel" in sources["opencl-c"]
        assert "__global__" in sources["cuda-c"] and "void *const *args" in sources["c"]


def test_the_printer_picks_each_dialects_math_names_and_literals():
    c, cl, cuda = (codegen.printer(d) for d in ("c", "opencl-c", "cuda-c"))
    assert c.call("exp", F32, "x") == "dk_expf(x)" and c.call("exp", np.float64, "x") == "exp(x)"
    assert c.call("tanh", F32, "x") == "tanhf(x)"
    assert cl.call("exp", F32, "x") == "exp(x)"  # OpenCL C overloads
    assert cuda.call("tanh", F32, "x") == "tanhf(x)"
    assert c.literal(0.5, F32) == "0.5f" and c.literal(0.5, np.float64) == "0.5"
    assert cl.storage(np.float16) == "half" and cuda.storage(np.float16) == "__half" and \
        c.storage(np.float16) == "_Float16"
    assert "vload_half" in cl.load("p", "i", np.float16)
    # float32 sin, cos and atan through double, defined in each prologue (OpenCL: with fp64)
    for p in (c, cl, cuda):
        assert p.call("sin", F32, "x") == "dk_sinf(x)" and "(float)atan((double)x)" in p.prologue
    assert c.call("sin", np.float64, "x") == "sin(x)" and cl.call("cos", np.float64, "x") == "cos(x)"
    assert "#ifdef cl_khr_fp64" in cl.prologue and "#define dk_cosf cos" in cl.prologue


def test_an_unknown_dialect_is_named():
    with pytest.raises(NotImplementedError, match="no printer for dialect 'spirv'"):
        codegen.printer("spirv")


@pytest.mark.parametrize("op,arity,reference", [
    ("Sigmoid", 1, lambda x: 1 / (1 + np.exp(-x))),
    ("Tanh", 1, np.tanh),
    ("Relu", 1, lambda x: np.maximum(x, 0)),
    ("Max", 2, np.maximum),
    ("Sub", 2, np.subtract),
    ("Gelu", 1, lambda x: 0.5 * x * (1 + np.tanh(np.sqrt(2 / np.pi) * (x + 0.044715 * x ** 3)))),
])
def test_a_rendered_rule_computes_the_op(op, arity, reference):
    dev = _cpu()
    attrs = {"approximate": "tanh"} if op == "Gelu" else {}
    kernel = codegen.render(_group(op, arity, attrs), codegen.printer("c"))
    function = codegen.compile_module(dev, kernel.source).function(kernel.name, ["tensor"] * kernel.num_tensors)
    xs = [np.random.default_rng(k).standard_normal((3, 5)).astype(np.float32) for k in range(arity)]
    out = devkit.asarray(np.zeros((3, 5), np.float32), dev)
    function.launch([devkit.asarray(x, dev) for x in xs] + [out], (kernel.items,))
    np.testing.assert_allclose(out.numpy(), reference(*xs), rtol=2e-6, atol=1e-6)


def test_rmsnorm_is_one_kernel_and_matches_the_unfused_plan():
    dev = _cpu()
    model, feed = patterns.rmsnorm(4, 64)
    fused = devkit.onnx.prepare(model, dev)  # fusion is on by default where the section is
    assert fused.fuse
    got = fused.run(feed)[0]
    want = devkit.onnx.prepare(model, dev, fuse=False).run(feed)[0]
    np.testing.assert_allclose(got, want, rtol=2e-6, atol=1e-6)
    (report,) = fused.fusion.values()
    assert report["fused_ops"] == [["Mul", "ReduceMean", "Add", "Sqrt", "Div", "Mul"]]
    assert report["kernels_saved"] == 5 and report["fallbacks"] == []
    (plan,) = fused.plans.values()
    assert [call.op for call in plan.calls] == ["Fused"]


def test_a_fused_rmsnorm_runs_on_the_callers_arrays_without_a_copy():
    """The bench's 256 x 2048 RMSNorm (2 MiB in, 2 MiB out), fused: a run binds
    its NumPy input and output in place (the plan's arena slots for them keep a
    sentinel), and a run with ``outputs=`` writes into the given array."""
    dev = _cpu()
    model, feed = patterns.rmsnorm(256, 2048)
    fused = devkit.onnx.prepare(model, dev)
    want = devkit.onnx.prepare(model, dev, fuse=False).run(feed)[0]
    fused.run(feed)
    (plan,) = fused.plans.values()
    (_, input_slot), = plan._inputs
    (output_slot,) = plan._outputs
    sentinel = np.full((256, 2048), np.nan, np.float32).reshape(-1).view(np.uint8)
    for slot in (input_slot, output_slot):
        slot.buffer.copy_from_host(sentinel)
    (got,) = fused.run(feed)
    np.testing.assert_allclose(got, want, rtol=2e-6, atol=1e-6)
    given = np.zeros((256, 2048), np.float32)
    (written,) = fused.run(feed, outputs=[given])
    assert written is given
    np.testing.assert_array_equal(given, got)
    assert np.isnan(input_slot.numpy()).all() and np.isnan(output_slot.numpy()).all()


def test_ops_without_a_rule_fuse_through_their_decompositions():
    from onnx import TensorProto, helper

    dev = _cpu()
    assert "Elu" not in codegen.RULES and "Softsign" not in codegen.RULES
    nodes = [helper.make_node("Elu", ["x"], ["a"], alpha=0.7), helper.make_node("Softsign", ["a"], ["b"]),
             helper.make_node("Mul", ["b", "x"], ["y"])]
    model = helper.make_model(helper.make_graph(
        nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [8, 16])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [8, 16])]),
        opset_imports=[helper.make_opsetid("", 18)])
    x = np.random.default_rng(0).standard_normal((8, 16)).astype(np.float32)
    fused = devkit.onnx.prepare(model, dev, fuse=True)
    got = fused.run([x])[0]
    a = np.where(x < 0, 0.7 * np.expm1(x), x)
    np.testing.assert_allclose(got, a / (1 + np.abs(a)) * x, rtol=1e-5, atol=1e-6)
    assert next(iter(fused.fusion.values()))["fused_ops"] == [["Elu", "Softsign", "Mul"]]


def test_a_failed_compile_keeps_the_unfused_plan_and_is_counted(monkeypatch):
    dev = _cpu()
    real = codegen.render

    def broken(group, printer):
        kernel = real(group, printer)
        return codegen.Kernel(kernel.source + "\nthis is not C;\n", kernel.name, kernel.num_tensors,
                              kernel.items, kernel.grain)

    monkeypatch.setattr(fusion.codegen, "render", broken)
    fallback_report(reset=True)
    model, feed = patterns.swiglu(4, 32)
    prepared = devkit.onnx.prepare(model, dev, fuse=True)
    got = prepared.run(feed)[0]
    a, b = feed["a"], feed["b"]
    np.testing.assert_allclose(got, a / (1 + np.exp(-a)) * b, rtol=1e-5, atol=1e-6)
    (report,) = prepared.fusion.values()
    assert report["groups"] == 0 and len(report["fallbacks"]) == 1
    assert "does not compile" in report["fallbacks"][0]["reason"]
    assert {"plugin": "cpu", "op": "Fused(Mul+Exp+Add+Div+Mul)", "dtype": "-", "count": 1} in fallback_report()
    (plan,) = prepared.plans.values()
    assert len(plan.calls) == 5


def test_fuse_false_plans_are_untouched():
    dev = _cpu()
    model, feed = patterns.layernorm(4, 32)
    prepared = devkit.onnx.prepare(model, dev, fuse=False)
    prepared.run(feed)
    assert prepared.fusion == {}
    (plan,) = prepared.plans.values()
    assert plan.fusion is None and len(plan.calls) == 9


def test_cache_dir_follows_the_environment(monkeypatch, tmp_path):
    monkeypatch.setenv("DEVKIT_CACHE_DIR", str(tmp_path / "d"))
    assert codegen.cache_dir("cpu") == tmp_path / "d" / "codegen" / "cpu"
    monkeypatch.delenv("DEVKIT_CACHE_DIR")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "x"))
    assert codegen.cache_dir("opencl") == tmp_path / "x" / "devkit" / "codegen" / "opencl"


def test_a_fused_chain_keeps_only_its_input_and_output_in_the_arena():
    from tests.test_engine import relu_chain_model

    dev = _cpu()
    prepared = devkit.onnx.prepare(relu_chain_model(8, 1 << 12), dev, fuse=True)
    x = np.random.default_rng(4).standard_normal(1 << 12).astype(np.float32)
    np.testing.assert_array_equal(prepared.run([x])[0], np.maximum(x, 0))  # Relu is exact
    (plan,) = prepared.plans.values()
    assert [call.op for call in plan.calls] == ["Fused"]
    assert plan.memory.total_bytes == 2 * x.nbytes


def _model(nodes, inputs: dict, initializers: dict | None = None, opset: int = 23):
    from onnx import TensorProto, helper, numpy_helper

    graph = helper.make_graph(
        nodes, "g", [helper.make_tensor_value_info(n, TensorProto.FLOAT, list(s)) for n, s in inputs.items()],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
        [numpy_helper.from_array(np.asarray(v), k) for k, v in (initializers or {}).items()])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])


def _fused_and_unfused(model, feed):
    dev = _cpu()
    fused = devkit.onnx.prepare(model, dev, fuse=True)
    got = fused.run(feed)[0]
    want = devkit.onnx.prepare(model, dev, fuse=False).run(feed)[0]
    (report,) = fused.fusion.values()
    (plan,) = fused.plans.values()
    return got, want, report, [call.op for call in plan.calls]


def test_a_run_goes_on_past_a_step_that_reads_nothing_it_makes():
    """SwiGLU's gate and up projections: Sigmoid and Mul of the gate, the up
    MatMul, then the product: the MatMul moves ahead and one kernel does the rest."""
    from onnx import helper

    rng = np.random.default_rng(5)
    nodes = [helper.make_node("MatMul", ["x", "wg"], ["g"]), helper.make_node("Sigmoid", ["g"], ["s"]),
             helper.make_node("Mul", ["g", "s"], ["silu"]), helper.make_node("MatMul", ["x", "wu"], ["u"]),
             helper.make_node("Mul", ["silu", "u"], ["y"])]
    weights = {"wg": rng.standard_normal((16, 24)).astype(np.float32),
               "wu": rng.standard_normal((16, 24)).astype(np.float32)}
    x = rng.standard_normal((6, 16)).astype(np.float32)
    got, want, report, ops = _fused_and_unfused(_model(nodes, {"x": (6, 16)}, weights), {"x": x})
    assert report["fused_ops"] == [["Sigmoid", "Mul", "Mul"]]
    assert ops == ["MatMul", "MatMul", "Fused"]
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
    g, u = x @ weights["wg"], x @ weights["wu"]
    np.testing.assert_allclose(got, g / (1 + np.exp(-g)) * u, rtol=1e-4, atol=1e-4)


def test_a_decomposition_with_a_last_axis_reduction_joins_a_row_group():
    """The residual Add and RMSNormalization (a native op whose decomposition
    reduces over the last axis) become one row kernel."""
    from onnx import helper

    rng = np.random.default_rng(6)
    nodes = [helper.make_node("Add", ["x", "r"], ["h"]),
             helper.make_node("RMSNormalization", ["h", "w"], ["y"], axis=-1, epsilon=1e-5)]
    w = rng.standard_normal(48).astype(np.float32)
    feed = {"x": rng.standard_normal((5, 48)).astype(np.float32), "r": rng.standard_normal((5, 48)).astype(np.float32)}
    got, want, report, ops = _fused_and_unfused(_model(nodes, {"x": (5, 48), "r": (5, 48)}, {"w": w}), feed)
    assert report["fused_ops"] == [["Add", "RMSNormalization"]] and ops == ["Fused"]
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
    h = feed["x"] + feed["r"]
    np.testing.assert_allclose(got, h / np.sqrt((h * h).mean(-1, keepdims=True) + 1e-5) * w, rtol=1e-5, atol=1e-6)


def test_the_c_dialect_keeps_the_native_softmax():
    from onnx import helper

    nodes = [helper.make_node("Mul", ["x", "k"], ["s"]), helper.make_node("Add", ["s", "m"], ["t"]),
             helper.make_node("Softmax", ["t"], ["y"], axis=-1)]
    mask = np.triu(np.full((8, 8), -1e9, np.float32), k=1)
    x = np.random.default_rng(7).standard_normal((2, 8, 8)).astype(np.float32)
    got, want, report, ops = _fused_and_unfused(_model(nodes, {"x": (2, 8, 8)}, {"k": np.float32(0.5), "m": mask}),
                                                {"x": x})
    assert report["fused_ops"] == [["Mul", "Add"]] and ops == ["Fused", "Softmax"]
    np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-7)


def test_a_broadcast_elementwise_kernel_loops_rows_and_columns_from_any_chunk_start():
    """In C an input broadcast along the rows makes the kernel loop rows then
    columns (vectorisable); chunks that start and end inside rows still cover
    every element once."""
    dev = _cpu()
    shape = (4, 7)
    ops = [codegen.GroupOp("Add", (("in", 0), ("in", 1)), {}, (F32, F32), F32, shape),
           codegen.GroupOp("Gelu", (("op", 0),), {}, (F32,), F32, shape)]
    group = codegen.Group(shape, [codegen.TensorArg(shape, (7, 1), F32), codegen.TensorArg((7,), (1,), F32)], ops,
                          [(1, codegen.TensorArg(shape, (7, 1), F32))])
    kernel = codegen.render(group, codegen.printer("c"))
    assert "for (int64_t j = first; j < stop; j++)" in kernel.source and "in1[0 + j]" in kernel.source
    function = codegen.compile_module(dev, kernel.source).function(kernel.name, ["tensor"] * 3)
    rng = np.random.default_rng(8)
    x, b = rng.standard_normal(shape).astype(np.float32), rng.standard_normal(7).astype(np.float32)
    out = devkit.asarray(np.full(shape, np.nan, np.float32), dev)
    function.launch([devkit.asarray(x, dev), devkit.asarray(b, dev), out], (kernel.items,), (3,))  # chunks of 3
    from math import erf

    want = np.vectorize(lambda v: 0.5 * v * (1 + erf(v / np.sqrt(2))))(x.astype(np.float64) + b)
    np.testing.assert_allclose(out.numpy(), want, rtol=2e-6, atol=1e-6)


def test_the_c_exp_runs_a_checked_fast_path_and_reruns_a_flagged_block():
    """SwiGLU written as primitives: in C its float32 Exp is dk_expf_checked
    over blocks of 1024 items, and a block where an argument leaves the fast
    path's range (inf, NaN, +-100, +-1e30, here all in the second block)
    runs again with dk_expf. Every element, in the fast blocks and the
    rerun one, matches the ops computed one by one in float32 (Exp from
    float64, rounded): within 4 ulp (the Exp's ulp, then the Add, Div and
    Mul round after it)."""
    dev = _cpu()
    model, feed = patterns.swiglu(4, 1024)
    edges = np.array([np.inf, -np.inf, np.nan, -100, 100, 1e30, -1e30, 86.5, -86.5, 1e-40, -1e-40, 0.0, -0.0],
                     np.float32)
    feed["a"][1, :edges.size] = edges
    sources = []
    real = codegen.compile_module

    def spy(device, source, options=""):
        sources.append(source)
        return real(device, source, options)

    import unittest.mock

    with unittest.mock.patch.object(fusion.codegen, "compile_module", spy):
        got = devkit.onnx.prepare(model, dev, fuse=True).run(feed)[0]
    (source,) = sources
    assert "dk_expf_checked(v0, &slow)" in source and "if (slow) {" in source and "dk_expf(v0)" in source
    assert "checked" not in codegen.render(_group("Exp", 1), codegen.printer("opencl-c")).source
    a, b = feed["a"], feed["b"]
    with np.errstate(all="ignore"):
        e = np.exp(-a.astype(np.float64)).astype(np.float32)
        want = a / (e + np.float32(1)) * b
    np.testing.assert_allclose(got, want, rtol=4 * 2.0 ** -23, atol=0, equal_nan=True)
    np.testing.assert_array_equal(np.signbit(got[want == 0]), np.signbit(want[want == 0]))


def test_a_row_kernel_reads_a_compact_input_at_the_row_times_its_length():
    """Over several outer axes a compact input's row starts at r * n (no
    division and remainder per axis); a row of a broadcast input still
    indexes its own axes."""
    dev = _cpu()
    shape, row = (2, 3, 8), (2, 3, 1)
    ops = [codegen.GroupOp("ReduceSum", (("in", 0),), {"axes": (-1,), "keepdims": 1}, (F32,), F32, row),
           codegen.GroupOp("Sub", (("in", 0), ("op", 0)), {}, (F32, F32), F32, shape),
           codegen.GroupOp("Mul", (("op", 1), ("in", 1)), {}, (F32, F32), F32, shape)]
    group = codegen.Group(shape, [codegen.TensorArg(shape, (24, 8, 1), F32), codegen.TensorArg((3, 8), (8, 1), F32)],
                          ops, [(2, codegen.TensorArg(shape, (24, 8, 1), F32))])
    kernel = codegen.render(group, codegen.printer("c"))
    assert "in0[r * 8 + j]" in kernel.source and "in1[(r % 3) * 8 + j]" in kernel.source
    function = codegen.compile_module(dev, kernel.source).function(kernel.name, ["tensor"] * 3)
    rng = np.random.default_rng(9)
    x, g = rng.standard_normal(shape).astype(np.float32), rng.standard_normal((3, 8)).astype(np.float32)
    out = devkit.asarray(np.full(shape, np.nan, np.float32), dev)
    function.launch([devkit.asarray(x, dev), devkit.asarray(g, dev), out], (kernel.items,), (1,))
    np.testing.assert_allclose(out.numpy(), (x - x.sum(-1, keepdims=True)) * g, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("width", [127, 128, 200, 2048 + 5])
@pytest.mark.parametrize("op", ["ReduceSum", "ReduceMax", "ReduceMin"])
def test_a_c_row_reduction_folds_its_lanes_in_order(op, width):
    """The C dialect folds a long row into REDUCTION_LANES partial results
    (and a tail) before folding those: every column counts once, NaN
    propagates from any column (Max, Min), and a sum stays within float32
    rounding of the float64 one."""
    dev = _cpu()
    shape, row = (3, width), (3, 1)
    ops = [codegen.GroupOp("Mul", (("in", 0), ("in", 0)), {}, (F32, F32), F32, shape),
           codegen.GroupOp(op, (("op", 0),), {"axes": (-1,), "keepdims": 1}, (F32,), F32, row)]
    group = codegen.Group(shape, [codegen.TensorArg(shape, (width, 1), F32)], ops,
                          [(1, codegen.TensorArg(row, (1, 1), F32))])
    kernel = codegen.render(group, codegen.printer("c"))
    assert ("acc1_lanes" in kernel.source) == (width >= 2 * printers.REDUCTION_LANES)
    function = codegen.compile_module(dev, kernel.source).function(kernel.name, ["tensor"] * 2)
    x = np.random.default_rng(width).standard_normal(shape).astype(np.float32)
    x[1, width - 1] = np.nan  # in the tail where there is one
    x[2, 3] = np.nan  # in the first lane block
    out = devkit.asarray(np.full(row, -1, np.float32), dev)
    function.launch([devkit.asarray(x, dev), out], (kernel.items,), (1,))
    got, squares = out.numpy()[:, 0], (x * x).astype(np.float64)  # the squares rounded as the kernel's
    want = {"ReduceSum": np.sum, "ReduceMax": np.max, "ReduceMin": np.min}[op](squares, axis=-1)
    assert np.isnan(got[1:]).all()
    np.testing.assert_allclose(got[0], want[0], rtol=width * 2 ** -24 if op == "ReduceSum" else 0)


def test_a_row_kernel_divides_by_a_row_scalar_through_its_reciprocal():
    model, feed = patterns.rmsnorm(3, 40)
    sources = []
    real = codegen.compile_module

    def spy(device, source, options=""):
        sources.append(source)
        return real(device, source, options)

    dev = _cpu()
    import unittest.mock

    with unittest.mock.patch.object(fusion.codegen, "compile_module", spy):
        got = devkit.onnx.prepare(model, dev, fuse=True).run(feed)[0]
    (source,) = sources
    assert "r4 = 1.0f / (v3);" in source and "((x0) * r4)" in source and "/ (v3))" not in source
    x, w = feed["x"], patterns.rmsnorm(3, 40)[0].graph.initializer[0]
    from onnx import numpy_helper

    w = numpy_helper.to_array(w)
    np.testing.assert_allclose(got, x / np.sqrt((x * x).mean(-1, keepdims=True) + 1e-6) * w, rtol=2e-6, atol=1e-6)


def test_captured_graphs_keep_every_kernel_unless_fused_and_then_every_referenced_array_is_an_output():
    """A plain Stream.capture() records devkit.ops calls as they are made and
    keeps every kernel, its slots the calls' tensors in capture order. With
    fuse=True the host fuses the block when it ends: the Arrays still
    referenced then are outputs (t here), the others (u) are fused away, and
    the slots are renumbered over the fused calls (docs/fusion.md). A
    captured prepared plan is fused: its graph holds the generated kernel."""
    dev = _cpu()
    stream = dev.create_stream()
    x = devkit.asarray(np.linspace(-2, 2, 12, dtype=np.float32), dev)
    b = devkit.asarray(np.full(12, 0.5, np.float32), dev)
    for fuse in (False, True):
        with stream.capture(mode="host", fuse=fuse) as graph:
            t = devkit.ops.Add(x, b, stream=stream)
            u = devkit.ops.Mul(t, t, stream=stream)
            y = devkit.ops.Relu(u, stream=stream)
            del u
        graph.launch(stream)
        stream.synchronize()
        assert graph.num_slots == (4 if fuse else 8)  # fused: x, b; t, y. Else Add: x, b, t; Mul: t, t, u; Relu: u, y
        assert (graph.fusion.groups if fuse else graph.fusion) == ([["Add", "Mul", "Relu"]] if fuse else None)
        np.testing.assert_array_equal(t.numpy(), x.numpy() + 0.5)
        np.testing.assert_allclose(y.numpy(), (x.numpy() + 0.5) ** 2, rtol=1e-6)
        graph.destroy()

    model, feed = patterns.gelu(2, 16)
    prepared = devkit.onnx.prepare(model, dev, fuse=True)
    got = prepared.run(feed)[0]
    (plan,) = prepared.plans.values()
    assert [call.op for call in plan.calls] == ["Fused"]
    assert type(plan.launcher).__name__ == "StagedGraph"  # the run is one native graph launch
    np.testing.assert_allclose(got, devkit.onnx.prepare(model, dev, fuse=False).run(feed)[0], rtol=1e-5, atol=1e-6)


def test_the_fusion_bench_times_every_pattern_three_ways():
    _cpu()
    rows = patterns.run(["cpu"], rows=4, width=16, repeat=1, models=False)
    assert [row["benchmark"] for row in rows] == list(patterns.MODELS)
    for row in rows:
        assert row["groups"] == 1 and row["kernels_saved"] == row["ops_per_group"][0] - 1
        for what in patterns.TIMES:
            assert row[f"unfused_{what}_ms"] > 0 and row[f"fused_{what}_ms"] > 0
            assert row[f"speedup_{what}"] == row[f"unfused_{what}_ms"] / row[f"fused_{what}_ms"]
            assert 0 <= row[f"fused_wins_{what}"] <= 1
        assert row["load"] is None or row["load"] >= 0
    assert set(rows[0]) >= {f"fused_vs_native_{what}" for what in patterns.TIMES}


def test_the_fusion_bench_interleaves_the_contenders_in_every_repetition():
    """After one untimed pass of every timer, each repetition runs every
    timer once, contender after contender; a sample is what the timer returned."""
    order = []

    def timer(who, what):
        def fn():
            order.append(f"{who}_{what}")
            return len(order)  # its position in the order
        return fn

    contenders = {who: {what: timer(who, what) for what in patterns.TIMES} for who in ("unfused", "fused")}
    samples = patterns._samples(contenders, repeat=2)
    assert order == [f"{who}_{what}" for _ in range(3) for who in ("unfused", "fused") for what in patterns.TIMES]
    assert samples["unfused_kernels"] == [7, 13] and samples["fused_kernels"] == [10, 16]
    assert samples["fused_run"] == [12, 18]


def test_the_fusion_bench_counts_the_repetitions_fused_won():
    assert patterns._wins([1.0, 5.0, 2.0, 2.0], [2.0, 2.0, 3.0, 2.0]) == 0.5  # a tie is no win
