"""The ONNX node tests, an external oracle, on the plugin under test.

The onnx package generates a model and reference data for every ONNX op
(onnx.backend.test.case.node.collect_testcases). Every test whose nodes are
all ops of the devkit set (Constant nodes fold on the host) runs here through
devkit.onnx.run_nodes, compared as ONNX's own backend runner does: with the
test's rtol/atol, NaN equal to NaN.

Two kinds of test do not run, each with its reason in the report:
- a tensor of a dtype outside devkit's set (string, float8, int16, ...), or
  a key input of a dtype the op spec does not list: skipped, naming it;
- a listed expected failure (onnx_node_expectations.py), with its reason,
  per plugin: it must still fail; one that passes fails the run so the list
  stays true.
"""

from __future__ import annotations

import functools
import warnings

import numpy as np
import pytest

from devkit import onnx as donnx
from devkit.onnx import UnsupportedNodeError

from .known_failures import run_expecting
from .onnx_node_expectations import EXPECTED_FAILURES


@functools.lru_cache(maxsize=1)
def node_tests() -> dict:
    from onnx.backend.test.case.node import collect_testcases

    with warnings.catch_warnings(), np.errstate(all="ignore"):
        warnings.simplefilter("ignore")
        cases = collect_testcases(None)
    selected = {}
    for case in cases:
        if case.kind != "node" or case.model is None:
            continue
        nodes = [node for node in case.model.graph.node if node.op_type != "Constant"]
        if nodes and all(_in_set(node) for node in nodes):
            selected[case.name] = case
    return selected


def _in_set(node) -> bool:
    try:
        donnx.check_node(node)
    except UnsupportedNodeError as exc:
        # An op of the set with an attribute outside it still runs (and fails, visibly).
        return "attribute" in str(exc)
    return True


def _outside_dtype_set(case) -> str | None:
    """Why a test's tensors fall outside devkit's dtypes, or None."""
    from devkit.ops import spec as _spec

    graph = case.model.graph
    types = {}
    for value in list(graph.input) + list(graph.output):
        if not value.type.HasField("tensor_type"):
            return f"'{value.name}' is not a tensor (sequence or optional types are outside the set)"
        try:
            types[value.name] = donnx.onnx_dtype(value.type.tensor_type.elem_type)
        except UnsupportedNodeError as exc:
            return f"'{value.name}': {exc}"
    for node in graph.node:
        if node.op_type == "Constant":
            continue
        spec = _spec.get(node.op_type)
        if isinstance(spec.key, int) and spec.key < len(node.input) and node.input[spec.key] in types:
            dtype = types[node.input[spec.key]]
            if dtype not in spec.dtypes:
                allowed = ", ".join(_spec.dtype_name(d) for d in spec.dtypes)
                return (f"{node.op_type} on {_spec.dtype_name(dtype)}: the op set v1 lists "
                        f"{allowed} for it")
    return None


@pytest.mark.parametrize("name", sorted(node_tests()))
def test_onnx_node(dev, name):
    case = node_tests()[name]
    if reason := _outside_dtype_set(case):
        pytest.skip(reason=f"outside devkit's dtype set: {reason}")
    run_expecting(EXPECTED_FAILURES, "conformance/onnx_node_expectations.py", dev.plugin.name, name,
                  lambda: _run_case(dev, case))


def _array(value) -> np.ndarray:
    """Test data as NumPy: newer tests store TensorProtos (Cast's, for dtypes NumPy lacks)."""
    from onnx import numpy_helper

    return numpy_helper.to_array(value) if hasattr(value, "data_type") else np.asarray(value)


def _run_case(dev, case) -> None:
    graph = case.model.graph
    initializer_names = {init.name for init in graph.initializer}
    from onnx import numpy_helper

    for inputs, outputs in case.data_sets:
        values = {init.name: numpy_helper.to_array(init) for init in graph.initializer}
        feed = [value for value in graph.input if value.name not in initializer_names]
        values.update({value.name: _array(array) for value, array in zip(feed, inputs)})
        env = donnx.run_nodes(graph.node, values, dev)
        for value, want in zip(graph.output, outputs):
            got = donnx.to_numpy(env[value.name])
            want = _array(want)
            assert got.shape == want.shape, f"output '{value.name}': shape {got.shape}, expected {want.shape}"
            assert got.dtype == want.dtype, f"output '{value.name}': dtype {got.dtype}, expected {want.dtype}"
            if got.dtype.kind in "biu":
                np.testing.assert_array_equal(got, want, err_msg=f"output '{value.name}'")
            else:
                np.testing.assert_allclose(got.astype(np.float64), want.astype(np.float64), rtol=case.rtol,
                                           atol=case.atol, equal_nan=True, err_msg=f"output '{value.name}'")
