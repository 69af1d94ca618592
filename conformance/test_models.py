"""Model regressions: whole ONNX models on the plugin under test, through
devkit.onnx.prepare, against references devkit did not write.

- light: the nine `light` models that ship in the onnx package (real
  architectures whose weights ConstantOfShape makes), fed as onnx's backend
  runner feeds them (Runner.generate_dummy_data) and compared with their stored
  outputs at the rtol/atol onnx's model test cases list for each;
- data: the onnx package's `simple`, `pytorch-converted` and
  `pytorch-operator` model tests whose ops are all in the devkit set, on their
  stored inputs and outputs, compared as onnx's runner compares them;
- zoo: devkit.onnx.zoo's models, compared with onnxruntime (its CPU execution
  provider) and with onnx.reference at ZOO_TOLERANCE.

Every model runs twice, as a plan (devkit.engine, unfused) and node by node
(``plan=False``), and the two must give identical outputs; the zoo models
also run fused (docs/fusion.md), within ZOO_TOLERANCE of the unfused plan
and of onnxruntime. Every case
records its measured error; zoo cases also record their latency next to
onnxruntime's. A test listed in model_expectations.py must fail on its
plugin (it is xfail); one that passes fails the run so the list stays true.
"""

from __future__ import annotations

import functools
import glob
import os
import statistics
import time

import numpy as np
import pytest

import devkit
from devkit import onnx as donnx
from devkit.engine import calls
from devkit.engine.plan import Plan
from devkit.onnx import zoo
from devkit.ops import spec as _spec

from .known_failures import run_expecting
from .model_expectations import EXPECTED_FAILURES, ORDER_DEPENDENT

DATA_KINDS = ("simple", "pytorch-converted", "pytorch-operator")
# The light models that take over a second on the cpu plugin (2 cores) run in
# the full profile only: vgg19 (~2.2 s), densenet121 (~1.9 s), inception_v2 (~1.2 s).
HEAVY_LIGHT_MODELS = ("test_vgg19", "test_densenet121", "test_inception_v2")
# float32 end to end: measured errors are at most ~2e-6 against either
# reference (outputs up to ~6 in magnitude).
ZOO_TOLERANCE = {"rtol": 1e-4, "atol": 1e-5}
TIMED_RUNS = 5


# -- collection ----------------------------------------------------------------------

@functools.lru_cache(maxsize=1)
def light_models() -> dict:
    """Test name -> the onnx package's model TestCase (model path in .url)."""
    from onnx.backend.test.case.model import collect_testcases

    return {case.name: case for case in collect_testcases() if case.kind == "real"}


@functools.lru_cache(maxsize=1)
def data_models() -> dict:
    """Test name -> TestCase of every on-disk model test whose ops are all in the set."""
    import onnx
    from onnx.backend.test.loader import load_model_tests

    selected = {}
    for kind in DATA_KINDS:
        for case in load_model_tests(kind=kind):
            model = onnx.load(os.path.join(case.model_dir, "model.onnx"), load_external_data=False)
            if all(_in_set(node) for node in model.graph.node):
                selected[case.name] = case
    return selected


def _in_set(node) -> bool:
    if node.op_type == "Constant":
        return True
    try:
        spec = _spec.get(node.op_type)
    except ValueError:
        return False
    return spec.domain == ("" if node.domain == "ai.onnx" else node.domain)


def _light_params():
    return [pytest.param(name, marks=[pytest.mark.full] if name in HEAVY_LIGHT_MODELS else [])
            for name in sorted(light_models())]


# -- helpers ---------------------------------------------------------------------------

def _run_expecting(dev, name: str, check) -> None:
    run_expecting(EXPECTED_FAILURES, "conformance/model_expectations.py", dev.plugin.name, name, check,
                  ORDER_DEPENDENT)


def _prepared_pair(model, dev):
    """The model as an unfused plan on its weights as given, and as the
    interpreter (a fused plan, and kernels on prepared weights, sum in another
    order: test_zoo_model_fused and test_zoo_model_prepared_weights compare
    them within tolerance)."""
    return donnx.prepare(model, dev, fuse=False, prepare_weights=False), donnx.prepare(model, dev, plan=False)


def _same_outputs(planned: list, interpreted: list) -> None:
    """The plan replays the interpreter's kernels on the same values: bit for bit."""
    assert len(planned) == len(interpreted)
    for i, (a, b) in enumerate(zip(planned, interpreted)):
        assert a.dtype == b.dtype and a.shape == b.shape, f"output {i}: plan and interpreter disagree"
        np.testing.assert_array_equal(a, b, err_msg=f"output {i}: plan vs interpreter")


def _errors(got: np.ndarray, want: np.ndarray) -> tuple[float, float]:
    """Max abs error, and it relative to the reference's largest magnitude."""
    got, want = got.astype(np.float64), want.astype(np.float64)
    if not want.size:
        return 0.0, 0.0
    error = float(np.max(np.abs(got - want)))
    scale = float(np.max(np.abs(want)))
    return error, error / scale if scale else error


def _record_errors(record_property, outputs, references) -> None:
    """The worst errors over the float outputs (shape mismatches fail later)."""
    worst_abs = worst_rel = 0.0
    for got, want in zip(outputs, references):
        if got.shape == want.shape and want.dtype.kind == "f":
            error, relative = _errors(got, want)
            worst_abs, worst_rel = max(worst_abs, error), max(worst_rel, relative)
    record_property("measured_error", worst_abs)
    record_property("max_rel_error", worst_rel)


def _load_tensor(path: str) -> np.ndarray:
    import onnx
    from onnx import numpy_helper

    tensor = onnx.TensorProto()
    with open(path, "rb") as f:
        tensor.ParseFromString(f.read())
    return numpy_helper.to_array(tensor)


def _numbered(directory: str, stem: str) -> list[np.ndarray]:
    count = len(glob.glob(os.path.join(directory, f"{stem}_*.pb")))
    return [_load_tensor(os.path.join(directory, f"{stem}_{i}.pb")) for i in range(count)]


# -- the light models -----------------------------------------------------------------------

@pytest.mark.parametrize("name", _light_params())
def test_light_model(dev, name, record_property):
    import onnx
    from onnx.backend.test.runner import Runner

    case = light_models()[name]
    path = os.path.join(os.path.dirname(os.path.dirname(onnx.__file__)), case.url)
    model = onnx.load(path)
    initializers = {init.name for init in model.graph.initializer}
    feeds = [Runner.generate_dummy_data(value, seed=0, name=case.model_name, random=False)
             for value in model.graph.input if value.name not in initializers]
    prefix = os.path.splitext(path)[0]
    references = [_load_tensor(f"{prefix}_output_{i}.pb") for i in range(len(model.graph.output))]
    record_property("tolerance", f"rtol {case.rtol:g} atol {case.atol:g}")

    def check():
        prepared, interpreted = _prepared_pair(model, dev)
        start = time.perf_counter()
        outputs = prepared.run(feeds)
        record_property("run_ms", (time.perf_counter() - start) * 1e3)
        _same_outputs(outputs, interpreted.run(feeds))
        _record_errors(record_property, outputs, references)
        Runner.assert_similar_outputs(references, outputs, rtol=case.rtol, atol=case.atol, model_dir=path)

    _run_expecting(dev, name, check)


# -- the onnx package's model tests ---------------------------------------------------------

@pytest.mark.parametrize("name", sorted(data_models()))
def test_onnx_model(dev, name, record_property):
    from onnx.backend.test.runner import Runner

    case = data_models()[name]
    data_sets = [(_numbered(directory, "input"), _numbered(directory, "output"))
                 for directory in sorted(glob.glob(os.path.join(case.model_dir, "test_data_set_*")))]
    assert data_sets, f"{case.model_dir} has no test data set"
    record_property("tolerance", f"rtol {case.rtol:g} atol {case.atol:g}")

    def check():
        prepared, interpreted = _prepared_pair(os.path.join(case.model_dir, "model.onnx"), dev)
        results = [(prepared.run(inputs), references) for inputs, references in data_sets]
        for (outputs, _), (inputs, _) in zip(results, data_sets):
            _same_outputs(outputs, interpreted.run(inputs))
        _record_errors(record_property, [o for outputs, _ in results for o in outputs],
                       [r for _, references in results for r in references])
        for outputs, references in results:
            Runner.assert_similar_outputs(references, outputs, rtol=case.rtol, atol=case.atol,
                                          model_dir=case.model_dir)

    _run_expecting(dev, name, check)


# -- the zoo ------------------------------------------------------------------------------

def _median_ms(run) -> float:
    """Median wall time of TIMED_RUNS calls, after the caller's first (warm-up) run:
    devkit folds constants and shapes, and onnxruntime plans, on the first run."""
    times = []
    for _ in range(TIMED_RUNS):
        start = time.perf_counter()
        run()
        times.append(time.perf_counter() - start)
    return statistics.median(times) * 1e3


@pytest.mark.parametrize("name", sorted(zoo.MODELS))
def test_zoo_model(dev, name, record_property):
    ort = pytest.importorskip("onnxruntime", reason="the zoo compares with onnxruntime: "
                                                    "pip install 'devkit[test]'")
    from onnx.reference import ReferenceEvaluator

    model, inputs = zoo.MODELS[name]()
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    (want,) = session.run(None, inputs)  # also onnxruntime's warm-up
    (reference,) = ReferenceEvaluator(model).run(None, inputs)
    record_property("tolerance", f"rtol {ZOO_TOLERANCE['rtol']:g} atol {ZOO_TOLERANCE['atol']:g}")
    record_property("onnxruntime_latency_ms", _median_ms(lambda: session.run(None, inputs)))

    def check():
        prepared, interpreted = _prepared_pair(model, dev)
        (got,) = prepared.run(inputs)  # also the warm-up (the plan's build)
        _same_outputs([got], interpreted.run(inputs))
        record_property("latency_ms", _median_ms(lambda: prepared.run(inputs)))
        record_property("interpreter_latency_ms", _median_ms(lambda: interpreted.run(inputs)))
        error, relative = _errors(got, want)
        record_property("measured_error", error)
        record_property("max_rel_error", relative)
        record_property("reference_error", _errors(got, reference)[0])
        assert got.shape == want.shape and got.dtype == want.dtype
        np.testing.assert_allclose(got, want, **ZOO_TOLERANCE, err_msg=f"{name} vs onnxruntime")
        np.testing.assert_allclose(got, reference, **ZOO_TOLERANCE, err_msg=f"{name} vs onnx.reference")

    _run_expecting(dev, name, check)


@pytest.mark.parametrize("name", sorted(zoo.MODELS))
def test_zoo_model_fused(dev, name, record_property):
    """The zoo model as a fused plan: within ZOO_TOLERANCE of the unfused plan and of onnxruntime."""
    if not dev.plugin.has_codegen:
        pytest.skip(reason=f"plugin '{dev.plugin.name}' has no codegen section: its plans run unfused")
    ort = pytest.importorskip("onnxruntime", reason="the zoo compares with onnxruntime: "
                                                    "pip install 'devkit[test]'")
    model, inputs = zoo.MODELS[name]()
    (want,) = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, inputs)

    def check():
        fused = donnx.prepare(model, dev, fuse=True)
        (got,) = fused.run(inputs)
        (unfused,) = donnx.prepare(model, dev, fuse=False).run(inputs)
        report = next(iter(fused.fusion.values()), {})
        record_property("fused_groups", report.get("groups", 0))
        record_property("kernels_saved", report.get("kernels_saved", 0))
        assert not report.get("fallbacks"), report
        record_property("measured_error", _errors(got, want)[0])
        assert got.shape == want.shape and got.dtype == want.dtype
        np.testing.assert_allclose(got, unfused, **ZOO_TOLERANCE, err_msg=f"{name}: fused vs unfused plan")
        np.testing.assert_allclose(got, want, **ZOO_TOLERANCE, err_msg=f"{name} fused vs onnxruntime")

    _run_expecting(dev, name, check)


@pytest.mark.parametrize("name", sorted(zoo.MODELS))
def test_zoo_model_prepared_weights(dev, name, record_property):
    """Prepared weights (ABI 1.4): where the plugin's kernels prepare constant
    inputs, the plan runs them on the prepared forms, within ZOO_TOLERANCE of
    the plan on the weights as given; only entries with a prepare are
    prepared; a plugin without the hook runs the weights as given. The
    prepared memory goes with the model (the suite's leak check)."""
    model, inputs = zoo.MODELS[name]()

    def check():
        prepared = donnx.prepare(model, dev, fuse=False)
        (got,) = prepared.run(inputs)
        (given,) = donnx.prepare(model, dev, fuse=False, prepare_weights=False).run(inputs)
        plan = next(iter(prepared.plans.values()))
        if isinstance(plan, Plan):  # else (a reason) the interpreter ran it: nothing is prepared
            preparing = {call.label() for call in plan.calls if calls.prepare_fn(call.entry) is not None}
            record_property("prepared_inputs", len(plan.prepared))
            assert {p.call for p in plan.prepared} <= preparing, plan.prepared
            assert all(p.nbytes > 0 for p in plan.prepared)
        assert got.shape == given.shape and got.dtype == given.dtype
        np.testing.assert_allclose(got, given, **ZOO_TOLERANCE, err_msg=f"{name}: prepared vs given weights")
        (again,) = prepared.run(inputs)  # a replay reads the same prepared forms
        np.testing.assert_array_equal(again, got)

    _run_expecting(dev, name, check)


# -- I/O binding: runs on devkit Arrays, into given arrays, and on NumPy in place ------------

def _io_model():
    """x (rows, 256) -> y = relu(x @ w + b), z = x + x: two outputs, large enough
    (rows 128: 128 KiB each) to be bound in place where the plugin registers host memory."""
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(7)
    w = (rng.standard_normal((256, 256)) * 0.05).astype(np.float32)
    b = rng.standard_normal(256).astype(np.float32)
    nodes = [helper.make_node("MatMul", ["x", "w"], ["h"]), helper.make_node("Add", ["h", "b"], ["hb"]),
             helper.make_node("Relu", ["hb"], ["y"]), helper.make_node("Add", ["x", "x"], ["z"])]
    graph = helper.make_graph(
        nodes, "io", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["rows", 256])],
        [helper.make_tensor_value_info(name, TensorProto.FLOAT, ["rows", 256]) for name in ("y", "z")],
        [numpy_helper.from_array(w, "w"), numpy_helper.from_array(b, "b")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])
    model.ir_version = 9
    return model


PLANNED = pytest.mark.parametrize("planned", [True, False], ids=["plan", "interpreter"])


@PLANNED
@pytest.mark.parametrize("rows", [4, 128])
def test_a_run_on_device_arrays_returns_device_arrays(dev, planned, rows):
    io_prepared = donnx.prepare(_io_model(), dev, plan=planned)
    x = np.random.default_rng(rows).standard_normal((rows, 256)).astype(np.float32)
    expected = io_prepared.run({"x": x})
    assert all(type(value) is np.ndarray for value in expected)
    results = io_prepared.run({"x": devkit.asarray(x, dev)})
    assert all(isinstance(value, devkit.Array) and value.device is dev for value in results)
    for got, want in zip(results, expected):
        np.testing.assert_array_equal(got.numpy(), want)  # the same kernels on the same data: bit for bit
    np.testing.assert_array_equal(expected[1], x + x)
    again = io_prepared.run({"x": devkit.asarray(x * 2, dev)})  # fresh outputs: the first ones keep their values
    np.testing.assert_array_equal(results[1].numpy(), x + x)
    np.testing.assert_array_equal(again[1].numpy(), 4 * x)


@PLANNED
@pytest.mark.parametrize("rows", [4, 128])
def test_a_run_writes_into_given_outputs(dev, planned, rows):
    io_prepared = donnx.prepare(_io_model(), dev, plan=planned)
    x = np.random.default_rng(rows).standard_normal((rows, 256)).astype(np.float32)
    expected = io_prepared.run({"x": x})
    host_y = np.full((rows, 256), np.nan, np.float32)
    device_z = devkit.asarray(np.full((rows, 256), np.nan, np.float32), dev)
    results = io_prepared.run({"x": x}, outputs=[host_y, device_z])
    assert results[0] is host_y and results[1] is device_z
    np.testing.assert_array_equal(host_y, expected[0])
    np.testing.assert_array_equal(device_z.numpy(), expected[1])
    only_z = np.zeros((rows, 256), np.float32)
    y, z = io_prepared.run({"x": devkit.asarray(x, dev)}, outputs=[None, only_z])
    assert z is only_z and isinstance(y, devkit.Array)
    np.testing.assert_array_equal(only_z, expected[1])
    np.testing.assert_array_equal(y.numpy(), expected[0])


def test_numpy_outputs_are_written_in_place_without_a_copy(dev, plugin):
    """On a plugin that registers host memory a planned run's large NumPy
    outputs are written by the kernels where they are returned: the plan's
    arena slots for them keep what they held (elsewhere they are staged)."""
    prepared = donnx.prepare(_io_model(), dev)
    x = np.random.default_rng(3).standard_normal((128, 256)).astype(np.float32)
    expected = prepared.run({"x": x})
    (plan,) = prepared.plans.values()
    sentinel = np.full((128, 256), np.nan, np.float32).reshape(-1).view(np.uint8)
    for slot in plan._outputs:
        slot.buffer.copy_from_host(sentinel)
    results = prepared.run({"x": x})
    for got, want in zip(results, expected):
        np.testing.assert_array_equal(got, want)
    untouched = [np.isnan(slot.numpy()).all() for slot in plan._outputs]
    assert untouched == [plugin.has_host_registration] * 2


def test_an_output_given_over_its_own_input_is_still_right(dev):
    """z = x + x written into x itself: the run must not let a kernel overwrite
    what it still reads, bound or not."""
    prepared = donnx.prepare(_io_model(), dev)
    x = np.random.default_rng(5).standard_normal((128, 256)).astype(np.float32)
    expected = prepared.run({"x": x.copy()})
    y, z = prepared.run({"x": x}, outputs=[None, x])
    assert z is x
    np.testing.assert_array_equal(y, expected[0])
    np.testing.assert_array_equal(x, expected[1])


@PLANNED
def test_io_binding_refuses_what_does_not_fit(dev, planned):
    io_prepared = donnx.prepare(_io_model(), dev, plan=planned)
    x = np.zeros((4, 256), np.float32)
    with pytest.raises(ValueError, match=r"output has shape \(4, 256\).*\(4, 255\)|output 0 has shape \(4, 255\)"):
        io_prepared.run({"x": x}, outputs=[np.zeros((4, 255), np.float32), None])
    with pytest.raises(ValueError, match="outputs: 1 given; the graph has 2"):
        io_prepared.run({"x": x}, outputs=[None])
    with pytest.raises(TypeError, match="input 'x' has dtype float64"):
        io_prepared.run({"x": devkit.asarray(x.astype(np.float64), dev)})
    other = devkit.device("cpu") if dev.plugin.name != "cpu" else None
    if other is not None:
        with pytest.raises(ValueError, match="input 'x' is on cpu:0; the model runs on"):
            io_prepared.run({"x": devkit.asarray(x, other)})
